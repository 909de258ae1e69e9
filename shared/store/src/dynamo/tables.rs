//! Table names and the SDK client with Tollgate's timeouts.

use std::time::Duration;

use aws_sdk_dynamodb::Client;

/// Physical table names, read once at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tables {
    pub runs: String,
    pub events: String,
    pub approvals: String,
    pub policies: String,
}

impl Tables {
    /// `TOLLGATE_RUNS_TABLE` / `TOLLGATE_EVENTS_TABLE` / `TOLLGATE_APPROVALS_TABLE`, or
    /// `<TOLLGATE_TABLE_PREFIX>runs`, `…events`, `…approvals` (prefix default `tollgate-`).
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
        }
    }

    pub fn with_prefix(prefix: &str) -> Self {
        Self {
            runs: format!("{prefix}runs"),
            events: format!("{prefix}events"),
            approvals: format!("{prefix}approvals"),
            policies: format!("{prefix}policies"),
        }
    }
}

pub const BY_SEQUENCE_INDEX: &str = "by_sequence";

/// Sparse index of the approvals table: pending cards by deadline.
pub const PENDING_INDEX: &str = "pending_by_expiry";

/// SDK timeouts for every DynamoDB call: a hung connection or answer becomes an error
/// (and so a 503) within seconds instead of holding the function until its timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(3);

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
