//! Tollgate's use-cases, one home for every rule an entry point applies (docs/architecture.md
//! §2): the approval gate ([`approvals`]), the cards an AgentHost pod holds
//! ([`pod_cards`]), approved execution ([`settlement`]) and who may do what
//! ([`access`]). They take narrow ports — the [`tollgate_store::Store`] and a
//! [`tollgate_timers::TimerQueue`] — and answer domain outcomes or an [`AppError`]; no
//! HTTP or AWS types. `shared/api` maps both to HTTP in one place; the HTTP handlers,
//! the timer queue's handler and the schedule all call them.

pub mod access;
pub mod approvals;
pub mod pod_cards;
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
        state: Option<&'static str>,
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
        state: Option<&'static str>,
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
            state: Some("unknown"),
        }
    }
}
