//! Configuration, read once at cold start. A missing or bad value fails start-up with a
//! message naming the variable; endpoints come from the SDK's own `AWS_ENDPOINT_URL*`.

use std::sync::Arc;
use std::time::Duration;

use tollgate_store::dynamo::{DynamoStore, Tables};
use tollgate_store::memory::MemoryStore;
use tollgate_store::Store;
use tollgate_timers::{ensure_queue, sqs_client, SqsTimers, TimerError, TimerMessage, TimerQueue};

/// The timer queue of a function that has none configured.
struct NoTimers;

#[async_trait::async_trait]
impl TimerQueue for NoTimers {
    async fn schedule(&self, message: &TimerMessage, _delay: Duration) -> Result<(), TimerError> {
        Err(TimerError::Unavailable(format!(
            "no timer queue configured (TOLLGATE_TIMER_QUEUE_URL) for {}",
            message.kind()
        )))
    }
}

pub use tollgate_app::ConfigError;

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

    /// A third party's secret (a Slack bot token or signing secret): any length but
    /// empty, kept as opaquely as Tollgate's own.
    pub fn opaque(value: impl Into<Vec<u8>>) -> Option<Self> {
        let value = value.into();
        (!value.is_empty()).then_some(Self(value))
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
    /// (local and test use; deployed stacks own their tables). `tollgate serve` also
    /// creates its timer queue with it ([`Config::serve_timers`]).
    pub create_tables: bool,
    /// `TOLLGATE_TIMER_QUEUE_URL`: the SQS timer queue (card expiry, heartbeats).
    pub timer_queue_url: Option<String>,
    /// `TOLLGATE_TIMER_QUEUE_NAME` (default `tollgate-timers`): the queue `tollgate serve
    /// --backend aws --create-tables` creates when no URL is set.
    pub timer_queue_name: String,
}

/// The SQS timer queue's URL.
pub const TIMER_QUEUE_URL_VAR: &str = "TOLLGATE_TIMER_QUEUE_URL";
/// The name of the timer queue `tollgate serve --create-tables` creates.
pub const TIMER_QUEUE_NAME_VAR: &str = "TOLLGATE_TIMER_QUEUE_NAME";
pub const DEFAULT_TIMER_QUEUE_NAME: &str = "tollgate-timers";

/// Where `tollgate serve` runs its timers (approval expiry, heartbeats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServeTimers {
    /// On the embedded in-process queue: `--backend memory`, or `aws` without a queue.
    Embedded,
    /// On the SQS queue at this URL, consumed by an in-process loop.
    Sqs { queue_url: String },
}

/// What [`Config::serve_timers`] does, decided from the configuration alone.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ServeTimersPlan {
    Embedded,
    Url(String),
    Create(String),
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Where deployed functions find the signing secret: its Secrets Manager ARN (or name).
pub const SECRET_ARN_VAR: &str = "TOLLGATE_SECRET_ARN";

/// A hung or unreachable Secrets Manager endpoint fails start-up within seconds instead
/// of holding the cold start until the function's timeout (the DynamoDB client's
/// bounds).
const SECRETS_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const SECRETS_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
const SECRETS_OPERATION_TIMEOUT: Duration = Duration::from_secs(3);

/// The deployed functions' signing secret: one `GetSecretValue` of the secret named by
/// `TOLLGATE_SECRET_ARN` (its `SecretString`, at least [`Secret::MIN_LEN`] bytes).
///
/// `TOLLGATE_SECRET` is refused here, not just ignored: a secret in a function's
/// environment is readable by anyone allowed `lambda:GetFunctionConfiguration`. The
/// endpoint is the SDK's own (`AWS_ENDPOINT_URL_SECRETS_MANAGER`, `AWS_ENDPOINT_URL`),
/// so an emulator works unchanged. Errors name the ARN, never the value.
pub async fn signing_secret_from_secrets_manager() -> Result<Secret, ConfigError> {
    let secret_id = signing_secret_id(env)?;
    let value = secret_string(&secret_id, "the signing secret", SECRET_ARN_VAR).await?;
    Secret::new(value).map_err(|_| {
        ConfigError::Invalid(format!(
            "the signing secret {secret_id} ({SECRET_ARN_VAR}) must be at least {} bytes",
            Secret::MIN_LEN
        ))
    })
}

/// One `GetSecretValue` of `secret_id` (named by the variable `var`, described as
/// `what` in errors): its `SecretString`. Errors name the id, never the value.
pub async fn secret_string(secret_id: &str, what: &str, var: &str) -> Result<String, ConfigError> {
    let sdk = tollgate_store::dynamo::sdk_config().await;
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(SECRETS_CONNECT_TIMEOUT)
        .operation_attempt_timeout(SECRETS_ATTEMPT_TIMEOUT)
        .operation_timeout(SECRETS_OPERATION_TIMEOUT)
        .build();
    let client = aws_sdk_secretsmanager::Client::from_conf(
        aws_sdk_secretsmanager::config::Builder::from(&sdk)
            .timeout_config(timeouts)
            .build(),
    );
    let answer = client
        .get_secret_value()
        .secret_id(secret_id)
        .send()
        .await
        .map_err(|e| {
            ConfigError::Invalid(format!(
                "cannot read {what} {secret_id} ({var}) from Secrets Manager: {}",
                aws_sdk_secretsmanager::error::DisplayErrorContext(&e)
            ))
        })?;
    answer.secret_string.ok_or_else(|| {
        ConfigError::Invalid(format!("{what} {secret_id} ({var}) has no SecretString"))
    })
}

/// The secret id from `TOLLGATE_SECRET_ARN`; refuses a `TOLLGATE_SECRET` in the
/// environment.
fn signing_secret_id(env: impl Fn(&str) -> Option<String>) -> Result<String, ConfigError> {
    if env("TOLLGATE_SECRET").is_some() {
        return Err(ConfigError::Invalid(format!(
            "TOLLGATE_SECRET is set in the environment; functions do not read it (it would be \
             readable by lambda:GetFunctionConfiguration): remove it and set {SECRET_ARN_VAR} \
             to the signing secret's Secrets Manager ARN"
        )));
    }
    env(SECRET_ARN_VAR).ok_or_else(|| {
        ConfigError::Invalid(format!(
            "{SECRET_ARN_VAR} is not set (the Secrets Manager ARN or name of the signing secret)"
        ))
    })
}

impl Config {
    /// The Lambda functions' configuration: the signing secret comes from Secrets
    /// Manager ([`signing_secret_from_secrets_manager`], `TOLLGATE_SECRET_ARN`), never
    /// from the environment — read once at cold start, the process keeps it; the backend
    /// defaults to `aws`.
    pub async fn from_env() -> Result<Self, ConfigError> {
        Self::from_env_with_secret(signing_secret_from_secrets_manager().await?)
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
            timer_queue_url: env(TIMER_QUEUE_URL_VAR),
            timer_queue_name: env(TIMER_QUEUE_NAME_VAR)
                .unwrap_or_else(|| DEFAULT_TIMER_QUEUE_NAME.to_owned()),
        })
    }

    /// The timer queue of a deployed function: SQS at `TOLLGATE_TIMER_QUEUE_URL`. Without
    /// one, scheduling fails (logged): expiry still happens through the sweeper, but no
    /// heartbeats are sent.
    pub async fn connect_timers(&self) -> Arc<dyn TimerQueue> {
        match &self.timer_queue_url {
            Some(url) => {
                let sdk = tollgate_store::dynamo::sdk_config().await;
                Arc::new(SqsTimers::new(sqs_client(&sdk), url.clone()))
            }
            None => Arc::new(NoTimers),
        }
    }

    fn serve_timers_plan(&self) -> ServeTimersPlan {
        match (self.backend, &self.timer_queue_url) {
            (Backend::Memory, _) => ServeTimersPlan::Embedded,
            (Backend::Aws, Some(url)) => ServeTimersPlan::Url(url.clone()),
            (Backend::Aws, None) if self.create_tables => {
                ServeTimersPlan::Create(self.timer_queue_name.clone())
            }
            (Backend::Aws, None) => ServeTimersPlan::Embedded,
        }
    }

    /// Where `tollgate serve` runs its timers: with the `aws` backend on SQS, at
    /// `TOLLGATE_TIMER_QUEUE_URL`, or with `create_tables` on the queue named
    /// `TOLLGATE_TIMER_QUEUE_NAME` (created when missing; an existing one is used as it
    /// is); otherwise in this process. A queue that cannot be created fails start-up.
    pub async fn serve_timers(&self) -> Result<ServeTimers, ConfigError> {
        match self.serve_timers_plan() {
            ServeTimersPlan::Embedded => Ok(ServeTimers::Embedded),
            ServeTimersPlan::Url(queue_url) => Ok(ServeTimers::Sqs { queue_url }),
            ServeTimersPlan::Create(name) => {
                let sdk = tollgate_store::dynamo::sdk_config().await;
                let queue_url = ensure_queue(&sqs_client(&sdk), &name).await.map_err(|e| {
                    ConfigError::Invalid(format!(
                        "cannot create the timer queue {name} ({TIMER_QUEUE_NAME_VAR}): {e}"
                    ))
                })?;
                Ok(ServeTimers::Sqs { queue_url })
            }
        }
    }

    pub async fn connect_store(&self) -> Result<Arc<dyn Store>, ConfigError> {
        match self.backend {
            Backend::Memory => Ok(Arc::new(MemoryStore::new())),
            Backend::Aws => {
                let sdk = tollgate_store::dynamo::sdk_config().await;
                let client = tollgate_store::dynamo::client(&sdk);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    fn config(backend: Backend, url: Option<&str>, create_tables: bool) -> Config {
        Config {
            secret: Secret::generate(),
            backend,
            tables: Tables::with_prefix("t-"),
            retention_days: None,
            create_tables,
            timer_queue_url: url.map(str::to_owned),
            timer_queue_name: "q-name".into(),
        }
    }

    #[test]
    fn serve_runs_timers_on_sqs_only_with_the_aws_backend_and_a_queue() {
        let url = "http://127.0.0.1:4566/000000000000/timers";
        let cases = [
            (Backend::Memory, Some(url), true, ServeTimersPlan::Embedded),
            (Backend::Memory, None, true, ServeTimersPlan::Embedded),
            (
                Backend::Aws,
                Some(url),
                true,
                ServeTimersPlan::Url(url.into()),
            ),
            (
                Backend::Aws,
                Some(url),
                false,
                ServeTimersPlan::Url(url.into()),
            ),
            (
                Backend::Aws,
                None,
                true,
                ServeTimersPlan::Create("q-name".into()),
            ),
            (Backend::Aws, None, false, ServeTimersPlan::Embedded),
        ];
        for (backend, url, create, plan) in cases {
            assert_eq!(
                config(backend, url, create).serve_timers_plan(),
                plan,
                "{backend:?} {url:?} {create}"
            );
        }
    }

    #[test]
    fn functions_need_the_secret_arn() {
        let err = signing_secret_id(lookup(&[])).unwrap_err().to_string();
        assert!(err.contains("TOLLGATE_SECRET_ARN is not set"), "{err}");
        let arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:s-AbCdEf";
        assert_eq!(
            signing_secret_id(lookup(&[("TOLLGATE_SECRET_ARN", arn)])).unwrap(),
            arn
        );
    }

    #[test]
    fn functions_refuse_a_secret_in_their_environment() {
        let value = "a-secret-that-must-never-appear-in-an-error-message";
        for vars in [
            &[("TOLLGATE_SECRET", value)][..],
            &[("TOLLGATE_SECRET", value), ("TOLLGATE_SECRET_ARN", "s")][..],
        ] {
            let err = signing_secret_id(lookup(vars)).unwrap_err().to_string();
            assert!(err.contains("TOLLGATE_SECRET_ARN"), "{err}");
            assert!(!err.contains(value), "{err}");
        }
    }
}
