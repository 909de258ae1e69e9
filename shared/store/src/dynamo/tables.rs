//! Table names, the shared SDK configuration, and the SDK client with Tollgate's timeouts.

use std::time::Duration;

use aws_sdk_dynamodb::Client;

/// Physical table names, read once at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tables {
    pub runs: String,
    pub events: String,
    pub approvals: String,
    pub policies: String,
    /// Durable mutation records (seed 000, docs/architecture.md §7).
    pub mutations: String,
    /// The WebSocket connection registry (docs/architecture.md §9).
    pub connections: String,
    /// Notification delivery records (docs/architecture.md §10).
    pub deliveries: String,
}

impl Tables {
    /// `TOLLGATE_RUNS_TABLE` / `TOLLGATE_EVENTS_TABLE` / `TOLLGATE_APPROVALS_TABLE` /
    /// `TOLLGATE_POLICIES_TABLE` / `TOLLGATE_MUTATIONS_TABLE` /
    /// `TOLLGATE_CONNECTIONS_TABLE` / `TOLLGATE_DELIVERIES_TABLE`, or `<TOLLGATE_TABLE_PREFIX>runs`, `…events`,
    /// `…approvals`, `…policies`, `…mutations`, `…connections`, `…deliveries` (prefix default
    /// `tollgate-`).
    pub fn from_env() -> Self {
        let prefix = std::env::var("TOLLGATE_TABLE_PREFIX").unwrap_or_else(|_| "tollgate-".into());
        let pick = |var: &str, suffix: &str| {
            std::env::var(var)
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| format!("{prefix}{suffix}"))
        };
        Self {
            runs: pick("TOLLGATE_RUNS_TABLE", "runs"),
            events: pick("TOLLGATE_EVENTS_TABLE", "events"),
            approvals: pick("TOLLGATE_APPROVALS_TABLE", "approvals"),
            policies: pick("TOLLGATE_POLICIES_TABLE", "policies"),
            mutations: pick("TOLLGATE_MUTATIONS_TABLE", "mutations"),
            connections: pick("TOLLGATE_CONNECTIONS_TABLE", "connections"),
            deliveries: pick("TOLLGATE_DELIVERIES_TABLE", "deliveries"),
        }
    }

    pub fn with_prefix(prefix: &str) -> Self {
        Self {
            runs: format!("{prefix}runs"),
            events: format!("{prefix}events"),
            approvals: format!("{prefix}approvals"),
            policies: format!("{prefix}policies"),
            mutations: format!("{prefix}mutations"),
            connections: format!("{prefix}connections"),
            deliveries: format!("{prefix}deliveries"),
        }
    }
}

pub const BY_SEQUENCE_INDEX: &str = "by_sequence";

/// Sparse index of the approvals table: one project's pending cards by deadline
/// (`pending_key` = `<project>#<shard>`).
pub const PENDING_INDEX: &str = "pending_by_expiry";

/// Sparse index of the approvals table: every tenant's pending cards by deadline
/// (`due_key` = `due#<shard>`), for the sweeper and global operators.
pub const DUE_INDEX: &str = "pending_due";

/// SDK timeouts for every DynamoDB call: a hung connection or answer becomes an error
/// (and so a 503) within seconds instead of holding the function until its timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(3);

/// The shared SDK configuration loader: region, credentials and endpoints from the
/// environment as the SDK reads them (`AWS_ENDPOINT_URL`, `AWS_ENDPOINT_URL_DYNAMODB`, …),
/// with an HTTPS client on rustls + *ring*.
///
/// The SDK's own default client (rustls on aws-lc) is compiled out (workspace
/// `Cargo.toml`): aws-lc alone adds ~0.27 MB to every function's zip. The client is set on
/// the loader, so the credential providers (container, web identity, IMDS) use it too.
/// Like every explicitly built SDK client, it ignores `HTTP(S)_PROXY`.
pub fn sdk_config_loader() -> aws_config::ConfigLoader {
    use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
    let https = aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https();
    aws_config::defaults(aws_config::BehaviorVersion::latest()).http_client(https)
}

/// [`sdk_config_loader`], loaded: what every SDK client of Tollgate is built from.
pub async fn sdk_config() -> aws_config::SdkConfig {
    sdk_config_loader().load().await
}

/// A DynamoDB client from the shared SDK configuration, with Tollgate's timeouts.
pub fn client(sdk: &aws_config::SdkConfig) -> Client {
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .operation_attempt_timeout(ATTEMPT_TIMEOUT)
        .operation_timeout(OPERATION_TIMEOUT)
        .build();
    Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(sdk)
            .timeout_config(timeouts)
            .build(),
    )
}
