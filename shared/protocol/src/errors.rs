//! The error body every failed request answers.

use serde::{Deserialize, Serialize};

/// `{error, code, state?, request_id}` (and, for a run that has ended, its `status` and
/// `terminal_sequence`). `error` is for people; `code` and `state` are for programs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ErrorBody {
    /// What went wrong, in words.
    pub error: String,
    /// A stable machine-readable code (`invalid_request`, `not_found`, `conflict`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Where a card, attempt or run stands when that is the reason (`unknown`, `pending`,
    /// `run_terminal`, `limit_reached`, `unavailable`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The request's id, as answered in `x-request-id`: quote it when reporting a problem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// For `state: run_terminal`: how the run ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// For `state: run_terminal`: the sequence of the run's terminal event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal_sequence: Option<u64>,
}
