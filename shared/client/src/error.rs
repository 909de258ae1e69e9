//! The one error type of the crate: what went wrong, in the contract's words.
//!
//! Server refusals are mapped by status and by the body's `state` (docs/architecture.md §5): a 409
//! `{state: "outcome_unknown"}` is [`Error::OutcomeUnknown`], never a string to parse.

use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tollgate_protocol::ErrorBody;

/// Everything a call of this crate can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The base URL, a token or an argument cannot be used (nothing was sent).
    #[error("invalid client configuration: {0}")]
    Config(String),

    /// An event given to [`crate::Run::append`] is not a JSON object with a `type`.
    #[error("invalid event: {0}")]
    InvalidEvent(String),

    /// The request could not be sent or its answer not read, after every retry the
    /// [`crate::RetryPolicy`] allows.
    #[error("transport failure: {0}")]
    Transport(String),

    /// 400 or 413: the server refused the request as malformed (nothing was written).
    #[error("bad request ({status}): {message}")]
    BadRequest {
        /// The HTTP status (400 or 413).
        status: u16,
        /// The server's `error`.
        message: String,
        /// The body's `code` (what the refusal means, for a program), when the server
        /// sends one.
        code: Option<String>,
        /// The body's `request_id` (the server's id of the request, for its logs), when
        /// the server sends one.
        request_id: Option<String>,
    },

    /// 401: the token is missing, invalid or expired.
    #[error("unauthorized: {message}")]
    Unauthorized {
        /// The server's `error`.
        message: String,
        /// The body's `code` (what the refusal means, for a program), when the server
        /// sends one.
        code: Option<String>,
        /// The body's `request_id` (the server's id of the request, for its logs), when
        /// the server sends one.
        request_id: Option<String>,
    },

    /// 403: wrong role, another run's token, another project.
    #[error("forbidden: {message}")]
    Forbidden {
        /// The server's `error`.
        message: String,
        /// The body's `code` (what the refusal means, for a program), when the server
        /// sends one.
        code: Option<String>,
        /// The body's `request_id` (the server's id of the request, for its logs), when
        /// the server sends one.
        request_id: Option<String>,
    },

    /// 404: no such run, card, receipt or mutation attempt (`state: "unknown"` when the
    /// server says so).
    #[error("not found: {message}")]
    NotFound {
        /// The body's `state`, e.g. `unknown`.
        state: Option<String>,
        /// The server's `error`.
        message: String,
        /// The body's `code` (what the refusal means, for a program), when the server
        /// sends one.
        code: Option<String>,
        /// The body's `request_id` (the server's id of the request, for its logs), when
        /// the server sends one.
        request_id: Option<String>,
    },

    /// 409 `run_terminal`: the run has ended; nothing more can be appended.
    #[error("the run has ended (run_terminal): {message}")]
    RunTerminal {
        /// The server's `error`.
        message: String,
        /// The body's `code` (what the refusal means, for a program), when the server
        /// sends one.
        code: Option<String>,
        /// The body's `request_id` (the server's id of the request, for its logs), when
        /// the server sends one.
        request_id: Option<String>,
    },

    /// 409 `run_exists`: a run with this id exists with other fields or another creator.
    #[error("a run with this id already exists (run_exists): {message}")]
    RunExists {
        /// The server's `error`.
        message: String,
        /// The body's `code` (what the refusal means, for a program), when the server
        /// sends one.
        code: Option<String>,
        /// The body's `request_id` (the server's id of the request, for its logs), when
        /// the server sends one.
        request_id: Option<String>,
    },

    /// 409 `pending`: the approval card still waits for a human (e.g. `start` before the
    /// decision).
    #[error("the approval is still pending: {message}")]
    ApprovalPending {
        /// The server's `error`.
        message: String,
        /// The body's `code` (what the refusal means, for a program), when the server
        /// sends one.
        code: Option<String>,
        /// The body's `request_id` (the server's id of the request, for its logs), when
        /// the server sends one.
        request_id: Option<String>,
    },

    /// 409 `not_executed`: the call was refused or settled as not executed (`reason`:
    /// `no_budget`, `tool_not_in_budget`, `budget_exhausted`, `call_ceiling_reached`,
    /// `approval_denied`, `approval_expired`, `run_not_running`, `unsent`, …). A new
    /// attempt needs a fresh approval.
    #[error("not executed ({}): {message}", reason.as_deref().unwrap_or("no reason given"))]
    NotExecuted {
        /// The body's `reason`.
        reason: Option<String>,
        /// The server's `error`.
        message: String,
        /// The body's `code` (what the refusal means, for a program), when the server
        /// sends one.
        code: Option<String>,
        /// The body's `request_id` (the server's id of the request, for its logs), when
        /// the server sends one.
        request_id: Option<String>,
    },

    /// 409 `outcome_unknown`: an earlier attempt of this tool call was dispatched and its
    /// outcome is unknown; nothing may start it again until an operator reconciles it.
    #[error("outcome_unknown: {message}")]
    OutcomeUnknown {
        /// The blocking attempt's `approval_id`, when another attempt blocks.
        approval_id: Option<String>,
        /// The server's `error`.
        message: String,
        /// The body's `code` (what the refusal means, for a program), when the server
        /// sends one.
        code: Option<String>,
        /// The body's `request_id` (the server's id of the request, for its logs), when
        /// the server sends one.
        request_id: Option<String>,
    },

    /// 409 `dispatched` (or a repeated `start` answering `dispatched`): the attempt was
    /// already dispatched — by an earlier request whose answer was lost, or by another
    /// holder. Do not send; see [`crate::execution`] for why the client does not settle it.
    #[error("dispatched: the call was already dispatched; do not send ({message})")]
    Dispatched {
        /// The attempt's `approval_id`, when the server names it.
        approval_id: Option<String>,
        /// The server's `error`.
        message: String,
        /// The body's `code` (what the refusal means, for a program), when the server
        /// sends one.
        code: Option<String>,
        /// The body's `request_id` (the server's id of the request, for its logs), when
        /// the server sends one.
        request_id: Option<String>,
    },

    /// Any other 409 (e.g. another attempt `intent` or `completed`, a contradicting
    /// settlement), with the body's `state`.
    #[error("conflict ({}): {message}", state.as_deref().unwrap_or("no state"))]
    Conflict {
        /// The body's `state`.
        state: Option<String>,
        /// The body's `approval_id`, when given.
        approval_id: Option<String>,
        /// The server's `error`.
        message: String,
        /// The body's `code` (what the refusal means, for a program), when the server
        /// sends one.
        code: Option<String>,
        /// The body's `request_id` (the server's id of the request, for its logs), when
        /// the server sends one.
        request_id: Option<String>,
    },

    /// 5xx or 429 on every attempt the retry policy allowed.
    #[error("the server is unavailable ({status}): {message}")]
    Unavailable {
        /// The last HTTP status.
        status: u16,
        /// The server's `error`.
        message: String,
        /// The last `Retry-After`.
        retry_after: Option<Duration>,
        /// The body's `code` (what the refusal means, for a program), when the server
        /// sends one.
        code: Option<String>,
        /// The body's `request_id` (the server's id of the request, for its logs), when
        /// the server sends one.
        request_id: Option<String>,
    },

    /// An answer this client does not expect (status, or a body without the fields the
    /// contract promises).
    #[error("unexpected answer ({status}): {message}")]
    Unexpected {
        /// The HTTP status.
        status: u16,
        /// What was wrong.
        message: String,
    },

    /// The run ended (its terminal event arrived) while a gate waited for its card.
    #[error("run {run_id} ended while waiting for approval request {request_id}")]
    RunEnded {
        /// The run.
        run_id: String,
        /// The card that was still pending.
        request_id: String,
    },

    /// The card neither resolved nor expired well past its deadline (the server's expiry
    /// timer and sweeper both failed to report it).
    #[error("gave up waiting for approval request {request_id} after {waited:?}")]
    WaitTimedOut {
        /// The card.
        request_id: String,
        /// How long the gate waited.
        waited: Duration,
    },
}

impl Error {
    /// The server's `state` for a refusal that carries one.
    pub fn state(&self) -> Option<&str> {
        match self {
            Error::NotFound { state, .. } | Error::Conflict { state, .. } => state.as_deref(),
            Error::RunTerminal { .. } => Some("run_terminal"),
            Error::RunExists { .. } => Some("run_exists"),
            Error::ApprovalPending { .. } => Some("pending"),
            Error::NotExecuted { .. } => Some("not_executed"),
            Error::OutcomeUnknown { .. } => Some("outcome_unknown"),
            Error::Dispatched { .. } => Some("dispatched"),
            _ => None,
        }
    }

    /// Whether trying the same call later may succeed (transport, unavailable).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Transport(_) | Error::Unavailable { .. })
    }

    /// A refusal answer as the error it means. `body` is the answer's JSON (or `Null`).
    pub(crate) fn from_answer(status: u16, body: &Value, retry_after: Option<Duration>) -> Self {
        let text = |k: &str| body.get(k).and_then(Value::as_str).map(str::to_owned);
        let (message, state, approval_id, reason, code, request_id) =
            match ErrorBody::deserialize(body) {
                Ok(b) => (
                    b.error,
                    b.state,
                    b.approval_id,
                    b.reason,
                    Some(b.code),
                    Some(b.request_id),
                ),
                // Not Tollgate's error body (a proxy's, a gateway's): what can be read.
                Err(_) => (
                    text("error").unwrap_or_else(|| format!("HTTP {status}")),
                    text("state"),
                    text("approval_id"),
                    text("reason"),
                    text("code"),
                    text("request_id"),
                ),
            };
        match status {
            400 | 413 => Error::BadRequest {
                status,
                message,
                code,
                request_id,
            },
            401 => Error::Unauthorized {
                message,
                code,
                request_id,
            },
            403 => Error::Forbidden {
                message,
                code,
                request_id,
            },
            404 => Error::NotFound {
                state,
                message,
                code,
                request_id,
            },
            409 => Self::refused(
                state,
                approval_id,
                reason,
                message,
                code,
                request_id,
            ),
            429 | 500..=599 => Error::Unavailable {
                status,
                message,
                retry_after,
                code,
                request_id,
            },
            _ => Error::Unexpected { status, message },
        }
    }

    /// The body's `code` and `request_id`, for a refusal the server answered.
    fn said(&self) -> Option<(&Option<String>, &Option<String>)> {
        match self {
            Error::BadRequest {
                code, request_id, ..
            }
            | Error::Unauthorized {
                code, request_id, ..
            }
            | Error::Forbidden {
                code, request_id, ..
            }
            | Error::NotFound {
                code, request_id, ..
            }
            | Error::RunTerminal {
                code, request_id, ..
            }
            | Error::RunExists {
                code, request_id, ..
            }
            | Error::ApprovalPending {
                code, request_id, ..
            }
            | Error::NotExecuted {
                code, request_id, ..
            }
            | Error::OutcomeUnknown {
                code, request_id, ..
            }
            | Error::Dispatched {
                code, request_id, ..
            }
            | Error::Conflict {
                code, request_id, ..
            }
            | Error::Unavailable {
                code, request_id, ..
            } => Some((code, request_id)),
            _ => None,
        }
    }

    /// The server's `code` for a refusal (`not_found`, `run_terminal`, …; see the
    /// README's *HTTP API*), when it sent one.
    pub fn code(&self) -> Option<&str> {
        self.said().and_then(|(code, _)| code.as_deref())
    }

    /// The server's id of the request that was refused (`x-request-id`; quote it when
    /// asking about a failure), when it sent one.
    pub fn request_id(&self) -> Option<&str> {
        self.said().and_then(|(_, id)| id.as_deref())
    }

    /// A 409 (or a 200 naming a state the caller cannot go on from) by its `state`.
    pub(crate) fn conflict(
        state: Option<String>,
        approval_id: Option<String>,
        reason: Option<String>,
        message: String,
    ) -> Self {
        Self::refused(state, approval_id, reason, message, None, None)
    }

    /// [`Error::conflict`] with what the server said of it.
    fn refused(
        state: Option<String>,
        approval_id: Option<String>,
        reason: Option<String>,
        message: String,
        code: Option<String>,
        request_id: Option<String>,
    ) -> Self {
        match state.as_deref() {
            Some("run_terminal") => Error::RunTerminal {
                message,
                code,
                request_id,
            },
            Some("run_exists") => Error::RunExists {
                message,
                code,
                request_id,
            },
            Some("pending") => Error::ApprovalPending {
                message,
                code,
                request_id,
            },
            Some("not_executed") => Error::NotExecuted {
                reason,
                message,
                code,
                request_id,
            },
            Some("outcome_unknown") => Error::OutcomeUnknown {
                approval_id,
                message,
                code,
                request_id,
            },
            Some("dispatched") => Error::Dispatched {
                approval_id,
                message,
                code,
                request_id,
            },
            _ => Error::Conflict {
                state,
                approval_id,
                message,
                code,
                request_id,
            },
        }
    }

    /// A 2xx answer without what the contract promises.
    pub(crate) fn malformed(status: u16, what: &str) -> Self {
        Error::Unexpected {
            status,
            message: format!("the answer lacks {what}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn refusals_map_by_status_and_state() {
        let e = Error::from_answer(
            409,
            &json!({"error": "x", "state": "not_executed", "reason": "no_budget"}),
            None,
        );
        assert!(matches!(&e, Error::NotExecuted { reason: Some(r), .. } if r == "no_budget"));
        assert_eq!(e.state(), Some("not_executed"));
        let e = Error::from_answer(
            409,
            &json!({"error": "x", "state": "outcome_unknown", "approval_id": "a-1"}),
            None,
        );
        assert!(
            matches!(&e, Error::OutcomeUnknown { approval_id: Some(a), .. } if a == "a-1"),
            "{e}"
        );
        assert!(e.to_string().contains("outcome_unknown"));
        assert!(matches!(
            Error::from_answer(409, &json!({"state": "dispatched"}), None),
            Error::Dispatched { .. }
        ));
        assert!(matches!(
            Error::from_answer(409, &json!({"state": "run_terminal"}), None),
            Error::RunTerminal { .. }
        ));
        assert!(matches!(
            Error::from_answer(409, &json!({"state": "completed"}), None),
            Error::Conflict { state: Some(s), .. } if s == "completed"
        ));
        assert!(matches!(
            Error::from_answer(404, &json!({"state": "unknown"}), None),
            Error::NotFound { state: Some(s), .. } if s == "unknown"
        ));
        assert!(matches!(
            Error::from_answer(401, &Value::Null, None),
            Error::Unauthorized { .. }
        ));
        let e = Error::from_answer(503, &json!({"error": "down"}), Some(Duration::from_secs(2)));
        assert!(e.is_transient());
        assert!(matches!(
            e,
            Error::Unavailable {
                status: 503,
                retry_after: Some(_),
                ..
            }
        ));
        let e = Error::from_answer(
            409,
            &json!({"error": "x", "code": "run_terminal", "state": "run_terminal",
                    "request_id": "r-1"}),
            None,
        );
        assert!(matches!(e, Error::RunTerminal { .. }));
        assert_eq!(
            (e.code(), e.request_id()),
            (Some("run_terminal"), Some("r-1"))
        );
        // A server that sends neither (before both existed) still reads.
        let e = Error::from_answer(404, &json!({"error": "x"}), None);
        assert_eq!((e.code(), e.request_id()), (None, None));
        assert!(matches!(
            Error::from_answer(302, &Value::Null, None),
            Error::Unexpected { status: 302, .. }
        ));
    }
}
