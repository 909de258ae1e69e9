//! The error body every failed request answers.

use serde::{Deserialize, Serialize};

/// What an error means, for a program: the `code` of every error body. A closed set,
/// spelled in snake_case; a code keeps its meaning once published (a new meaning is a
/// new code). Where a `state` applies, the code follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// 400: the request is malformed (JSON, a field, a query parameter, a cursor) or
    /// names something the target does not match; the same request never succeeds.
    InvalidRequest,
    /// 400: a card's `timeout_seconds` is over the deployment's cap.
    TimeoutTooLong,
    /// 401: no token, or one that is not valid (signature, expiry, lifetime).
    Unauthorized,
    /// 403: a valid token that may not do this (role, another run, another project).
    Forbidden,
    /// 404: no such route, run, card, attempt, policy or receipt (for the caller).
    NotFound,
    /// 405: the route exists, the method does not.
    MethodNotAllowed,
    /// 409: what stands refuses the request (`state` says what stands: a mutation
    /// attempt's state, a run holding too many pending cards, …).
    Conflict,
    /// 409: a create named a run id another run holds.
    RunExists,
    /// 409: the run has ended (`status`, `terminal_sequence` say how).
    RunTerminal,
    /// 409: an arm's `request_id` names a card for another call.
    RequestIdInUse,
    /// 409: the card is still pending and the request needs it decided (a start
    /// before the approval, a decision its pod or ended run cannot take now).
    ApprovalPending,
    /// 413: the request body is over 256 KiB.
    PayloadTooLarge,
    /// 429: a tenant's cap is reached (open cards per project); retry after some end.
    LimitReached,
    /// 429: the holder has as many live streams open as it may.
    TooManyStreams,
    /// 500: the server failed; nothing is known to be written.
    Internal,
    /// 503: storage, or this process's capacity, cannot answer now; retry
    /// (`Retry-After`).
    Unavailable,
    /// 503: the run's agent host did not answer a forwarded decision; retry.
    AgenthostUnreachable,
}

impl ErrorCode {
    /// Every code, in the order the README lists them.
    pub const ALL: [ErrorCode; 17] = [
        ErrorCode::InvalidRequest,
        ErrorCode::TimeoutTooLong,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::Conflict,
        ErrorCode::RunExists,
        ErrorCode::RunTerminal,
        ErrorCode::RequestIdInUse,
        ErrorCode::ApprovalPending,
        ErrorCode::PayloadTooLarge,
        ErrorCode::LimitReached,
        ErrorCode::TooManyStreams,
        ErrorCode::Internal,
        ErrorCode::Unavailable,
        ErrorCode::AgenthostUnreachable,
    ];

    /// As the wire spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::TimeoutTooLong => "timeout_too_long",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::Conflict => "conflict",
            ErrorCode::RunExists => "run_exists",
            ErrorCode::RunTerminal => "run_terminal",
            ErrorCode::RequestIdInUse => "request_id_in_use",
            ErrorCode::ApprovalPending => "approval_pending",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::LimitReached => "limit_reached",
            ErrorCode::TooManyStreams => "too_many_streams",
            ErrorCode::Internal => "internal",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::AgenthostUnreachable => "agenthost_unreachable",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(feature = "schema")]
fn code_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "enum": ErrorCode::ALL.map(ErrorCode::as_str),
        "description": "A stable machine-readable code (the README lists them)."
    })
}

/// `{error, code, state?, request_id}` (and, for a run that has ended, its `status` and
/// `terminal_sequence`; for a refused execution step, `reason?` and `approval_id?`). `error` is for people; `code` and `state` are for programs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"error": "run has ended (completed)", "code": "run_terminal", "state": "run_terminal", "request_id": "3f9c2a7d1e8b4c60", "status": "completed", "terminal_sequence": 9})))]
pub struct ErrorBody {
    /// What went wrong, in words.
    pub error: String,
    /// A stable machine-readable code ([`ErrorCode`]: `invalid_request`, `not_found`,
    /// `conflict`, …; the README lists them).
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

impl ErrorCode {
    /// The code a body's `code` names; `None` for one this version does not know.
    pub fn parse(code: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == code)
    }
}
