//! Talking to a Tollgate server (`watch`, `approvals`, `approve`, `deny`) through
//! [`tollgate_client::operator`]: the base URL from `--url`/`TOLLGATE_URL`, the bearer
//! token from `--token`/`TOLLGATE_TOKEN`. What is left here is the command's words for
//! what the client reports, and its exit codes.
//!
//! The token goes only into the `Authorization` header (marked sensitive, never sent
//! along a redirect) and never into any message: errors name what failed, not the
//! request, and transport errors are stripped of their URL.

use std::time::Duration;

use clap::Args;
use tollgate_client::operator::{Operator, OperatorConfig, OperatorError, Refusal};
use tollgate_client::RetryPolicy;

use crate::render::clean;

/// Where the server is and who is asking. No `Debug`: it holds the token.
#[derive(Args, Clone)]
pub struct Conn {
    /// The server's base URL, e.g. http://127.0.0.1:8080 (a path prefix such as an API
    /// stage is kept).
    #[arg(long, env = "TOLLGATE_URL", value_name = "URL")]
    pub url: Option<String>,
    /// Bearer token: an operator JWT (`watch` also takes the run's token or the creating
    /// agent's JWT). Prefer the environment variable: arguments show in `ps`.
    #[arg(
        long,
        env = "TOLLGATE_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
}

/// What ends a command: a message for stderr and the exit code.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub code: i32,
}

impl Failure {
    /// Refused, unknown, not active: exit 1.
    pub fn refused(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: 1,
        }
    }

    /// Configuration, transport or an unavailable server (retry later): exit 2.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: 2,
        }
    }
}

/// The client for `conn`: one attempt per request (the command is run again, not
/// retried behind the operator's back); `answer_timeout` bounds how long `watch` waits
/// for each answer.
pub fn connect(conn: Conn, answer_timeout: Option<Duration>) -> Result<Operator, Failure> {
    let url = conn
        .url
        .filter(|u| !u.trim().is_empty())
        .ok_or_else(|| Failure::unavailable("no server: set TOLLGATE_URL or pass --url"))?;
    let token = conn
        .token
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| Failure::unavailable("no token: set TOLLGATE_TOKEN or pass --token"))?;
    let mut config = OperatorConfig {
        retry: RetryPolicy::none(),
        user_agent: concat!("tollgate-cli/", env!("CARGO_PKG_VERSION")).to_owned(),
        ..OperatorConfig::default()
    };
    if let Some(timeout) = answer_timeout {
        config.answer_timeout = timeout;
    }
    Operator::with_config(&url, &token, config).map_err(|e| match e {
        OperatorError::Config(message) => Failure::unavailable(message),
        other => Failure::unavailable(other.to_string()),
    })
}

/// `401 Unauthorized: <the server's error>; request <id>` (the id when the server sent
/// one, to quote when asking about the failure).
pub fn summary(refusal: &Refusal) -> String {
    let said = match &refusal.error {
        Some(e) => format!("{}: {}", refusal.status_text(), clean(e)),
        None => refusal.status_text(),
    };
    match &refusal.request_id {
        Some(id) => format!("{said}; request {}", clean(id)),
        None => said,
    }
}

/// The common cases: 401, 403, 400, 5xx; `None` for the ones the caller words itself.
pub fn common(refusal: &Refusal) -> Option<Failure> {
    match refusal.status {
        401 => Some(Failure::refused(format!(
            "the token was refused ({})",
            summary(refusal)
        ))),
        403 => Some(Failure::refused(format!(
            "not allowed ({})",
            summary(refusal)
        ))),
        400 => Some(Failure::refused(format!(
            "bad request ({})",
            summary(refusal)
        ))),
        503 if refusal.state.as_deref() == Some("agenthost_unreachable") => {
            Some(Failure::unavailable("the agent host is unreachable; retry"))
        }
        s if (500..=599).contains(&s) || s == 429 => Some(Failure::unavailable(format!(
            "the server is unavailable ({}); retry",
            summary(refusal)
        ))),
        _ => None,
    }
}

/// A refusal: the common words, else `unexpected answer (…)`.
pub fn refusal(refusal: &Refusal) -> Failure {
    common(refusal)
        .unwrap_or_else(|| Failure::refused(format!("unexpected answer ({})", summary(refusal))))
}
