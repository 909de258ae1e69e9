//! Tollgate's use-cases, one home for every rule an entry point applies (docs/architecture.md
//! §2): the run log ([`runs`], read back in [`replay`]), the approval gate
//! ([`approvals`], its records read back in [`reads`]), the cards an AgentHost pod holds
//! ([`pod_cards`]), approved execution ([`settlement`]) and who may do what
//! ([`access`]). They take narrow ports — the [`tollgate_store::Store`] and a
//! [`tollgate_timers::TimerQueue`] — and answer domain outcomes or an [`AppError`]; no
//! HTTP or AWS types. `shared/api` maps both to HTTP in one place; the HTTP handlers,
//! the timer queue's handler and the schedule all call them.

pub mod access;
pub mod approvals;
pub mod pod_cards;
pub mod reads;
pub mod replay;
pub mod runs;
pub mod settlement;

pub use approvals::{ArmOutcome, Gate, GateConfig};

use tollgate_store::StoreError;

/// A start-up setting that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{0}")]
    Invalid(String),
    #[error("storage: {0}")]
    Store(#[from] tollgate_store::StoreError),
}

/// Why a use-case did nothing: each maps to one HTTP answer (`shared/api/src/error.rs`).
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// Nothing by that name (or nothing the caller may see): 404, with `state` when the
    /// contract names one (`unknown`).
    #[error("{message}")]
    NotFound {
        message: String,
        state: Option<ErrorState>,
    },
    /// The caller may not do this: 403.
    #[error("{0}")]
    Forbidden(String),
    /// The request cannot be acted on as asked: 400.
    #[error("{0}")]
    Invalid(String),
    /// The state stands in the way: 409 with `state`.
    #[error("{message}")]
    Conflict {
        message: String,
        state: Option<ErrorState>,
    },
    /// The store answered an error (its own mapping: 404, 409, 429, 503…).
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl AppError {
    /// 404 `run not found`.
    pub fn run_not_found() -> Self {
        AppError::NotFound {
            message: "run not found".into(),
            state: None,
        }
    }

    /// 404 `{state: "unknown"}` for a mutation attempt nobody started.
    pub fn unknown_attempt() -> Self {
        AppError::NotFound {
            message: "no such mutation attempt".into(),
            state: Some(ErrorState::Unknown),
        }
    }
}

/// What an error answer's `state` says (docs/architecture.md §5: errors are JSON
/// `{error, state?}`): the one word a client branches on, each spelled once here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorState {
    /// Nothing by that name: no such card, attempt or delivery (404).
    Unknown,
    /// The card stays pending: its run is not active, or its pod cannot decide it now (409).
    Pending,
    /// A create named a run id taken by another run (409).
    RunExists,
    /// The run has ended (409, with its status and terminal sequence).
    RunTerminal,
    /// A tenant's cap is reached (429).
    LimitReached,
    /// The store cannot answer now; retry (503).
    Unavailable,
    /// A card's timeout beyond the deployment's cap (400).
    TimeoutTooLong,
    /// An arm's `request_id` names a card for another call (409).
    RequestIdInUse,
    /// A pod-per-run run's AgentHost did not answer a forwarded decision (503).
    AgenthostUnreachable,
    /// A holder has as many live streams open as it may (429).
    TooManyStreams,
}

impl ErrorState {
    /// Every state, for tests and documentation.
    pub const ALL: [ErrorState; 10] = [
        ErrorState::Unknown,
        ErrorState::Pending,
        ErrorState::RunExists,
        ErrorState::RunTerminal,
        ErrorState::LimitReached,
        ErrorState::Unavailable,
        ErrorState::TimeoutTooLong,
        ErrorState::RequestIdInUse,
        ErrorState::AgenthostUnreachable,
        ErrorState::TooManyStreams,
    ];

    /// As the wire spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorState::Unknown => "unknown",
            ErrorState::Pending => "pending",
            ErrorState::RunExists => "run_exists",
            ErrorState::RunTerminal => "run_terminal",
            ErrorState::LimitReached => "limit_reached",
            ErrorState::Unavailable => "unavailable",
            ErrorState::TimeoutTooLong => "timeout_too_long",
            ErrorState::RequestIdInUse => "request_id_in_use",
            ErrorState::AgenthostUnreachable => "agenthost_unreachable",
            ErrorState::TooManyStreams => "too_many_streams",
        }
    }
}

impl std::fmt::Display for ErrorState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorState;

    #[test]
    fn error_states_are_spelled_as_clients_read_them() {
        let spelled: Vec<&str> = ErrorState::ALL.iter().map(|s| s.as_str()).collect();
        assert_eq!(
            spelled,
            [
                "unknown",
                "pending",
                "run_exists",
                "run_terminal",
                "limit_reached",
                "unavailable",
                "timeout_too_long",
                "request_id_in_use",
                "agenthost_unreachable",
                "too_many_streams",
            ]
        );
    }
}
