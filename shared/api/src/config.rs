//! Configuration, read once at cold start. A missing or bad value fails start-up with a
//! message naming the variable; endpoints come from the SDK's own `AWS_ENDPOINT_URL*`.

use std::sync::Arc;
use std::time::Duration;

use tollgate_store::dynamo::{DynamoStore, Tables};
use tollgate_store::memory::MemoryStore;
use tollgate_store::RunStore;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Invalid(String),
    #[error("storage: {0}")]
    Store(#[from] tollgate_store::StoreError),
}

/// The signing secret. Its `Debug` never shows the value.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl Secret {
    pub const MIN_LEN: usize = 32;

    pub fn new(value: impl Into<Vec<u8>>) -> Result<Self, ConfigError> {
        let value = value.into();
        if value.len() < Self::MIN_LEN {
            return Err(ConfigError::Invalid(format!(
                "TOLLGATE_SECRET must be at least {} bytes",
                Self::MIN_LEN
            )));
        }
        Ok(Self(value))
    }

    /// A fresh random secret (hex), for `tollgate serve` when none is configured.
    pub fn generate() -> Self {
        let bytes: [u8; 32] = rand::random();
        Self(hex::encode(bytes).into_bytes())
    }

    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The embedded in-process store (nothing to install; state is lost on exit).
    Memory,
    /// DynamoDB through the AWS SDK's normal endpoint and credential resolution.
    Aws,
}

impl std::str::FromStr for Backend {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "memory" => Ok(Backend::Memory),
            "aws" => Ok(Backend::Aws),
            other => Err(ConfigError::Invalid(format!(
                "backend must be memory or aws, not {other:?}"
            ))),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Config {
    pub secret: Secret,
    pub backend: Backend,
    pub tables: Tables,
    /// `TOLLGATE_RETENTION_DAYS`: DynamoDB TTL on runs and events; unset keeps them.
    pub retention_days: Option<u32>,
    /// `TOLLGATE_CREATE_TABLES=1`: create missing tables from the template at start-up
    /// (local and test use; deployed stacks own their tables).
    pub create_tables: bool,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

impl Config {
    /// The Lambda functions' configuration: `TOLLGATE_SECRET` is required and the
    /// backend defaults to `aws`.
    pub fn from_env() -> Result<Self, ConfigError> {
        let secret = env("TOLLGATE_SECRET")
            .ok_or_else(|| ConfigError::Invalid("TOLLGATE_SECRET is not set".into()))?;
        Self::from_env_with_secret(Secret::new(secret)?)
    }

    pub fn from_env_with_secret(secret: Secret) -> Result<Self, ConfigError> {
        let backend = env("TOLLGATE_BACKEND")
            .map(|b| b.parse())
            .transpose()?
            .unwrap_or(Backend::Aws);
        let retention_days = env("TOLLGATE_RETENTION_DAYS")
            .map(|d| {
                d.parse::<u32>().map_err(|_| {
                    ConfigError::Invalid("TOLLGATE_RETENTION_DAYS must be a whole number".into())
                })
            })
            .transpose()?
            .filter(|d| *d > 0);
        Ok(Self {
            secret,
            backend,
            tables: Tables::from_env(),
            retention_days,
            create_tables: env("TOLLGATE_CREATE_TABLES").is_some_and(|v| v == "1" || v == "true"),
        })
    }

    pub async fn connect_store(&self) -> Result<Arc<dyn RunStore>, ConfigError> {
        match self.backend {
            Backend::Memory => Ok(Arc::new(MemoryStore::new())),
            Backend::Aws => {
                let sdk = aws_config::load_from_env().await;
                let client = aws_sdk_dynamodb::Client::new(&sdk);
                if self.create_tables {
                    tollgate_store::schema::ensure_tables(&client, &self.tables).await?;
                }
                let retention = self
                    .retention_days
                    .map(|d| Duration::from_secs(u64::from(d) * 86_400));
                Ok(Arc::new(
                    DynamoStore::new(client, self.tables.clone()).with_retention(retention),
                ))
            }
        }
    }
}
