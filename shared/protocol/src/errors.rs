//! The error body every failed request answers.

use serde::{Deserialize, Serialize};

/// Every `code` an error body may carry (the server's `ErrorCode`, held to this list by
/// `tests/openapi.rs`). A code keeps its meaning once published.
pub const CODES: &[&str] = &[
    "invalid_request",
    "timeout_too_long",
    "unauthorized",
    "forbidden",
    "not_found",
    "method_not_allowed",
    "conflict",
    "run_exists",
    "run_terminal",
    "request_id_in_use",
    "approval_pending",
    "payload_too_large",
    "limit_reached",
    "too_many_streams",
    "internal",
    "unavailable",
    "agenthost_unreachable",
];

#[cfg(feature = "schema")]
fn code_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "enum": CODES,
        "description": "A stable machine-readable code (the README lists them)."
    })
}

/// `{error, code, state?, request_id}` (and, for a run that has ended, its `status` and
/// `terminal_sequence`; for a refused execution step, `reason?` and `approval_id?`). `error` is for people; `code` and `state` are for programs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ErrorBody {
    /// What went wrong, in words.
    pub error: String,
    /// A stable machine-readable code (`invalid_request`, `not_found`, `conflict`, …;
    /// the README lists them).
    #[cfg_attr(feature = "schema", schemars(schema_with = "code_schema"))]
    pub code: String,
    /// Where a card, attempt or run stands when that is the reason (`unknown`, `pending`,
    /// `run_terminal`, `limit_reached`, `unavailable`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The request's id, as answered in `x-request-id`: quote it when reporting a problem.
    pub request_id: String,
    /// For `state: run_terminal`: how the run ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// For `state: run_terminal`: the sequence of the run's terminal event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminal_sequence: Option<u64>,
    /// A refused execution step on a `not_executed` attempt: why it did not execute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A start refused because another attempt of the call blocks it: that attempt's
    /// `approval_id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
}
