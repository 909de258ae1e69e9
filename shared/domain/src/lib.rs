//! Tollgate's pure domain: the run head, the flat event envelope, and the rules a
//! producer's event must obey. No AWS, HTTP or async types live here, so every adapter
//! and every function shares exactly one definition of what a valid stream looks like.

pub mod approval;
pub mod card;
pub mod event;
pub mod execution;
pub mod rules;
pub mod run;

pub use approval::{ApprovalRequest, ApprovalState, Policy, Reach, Resolution, Scope};
pub use event::{
    is_server_owned, render_event, validate_producer_event, EventDraft, EventError,
    MAX_BATCH_EVENTS, MAX_PAYLOAD_BYTES, PROTOCOL_VERSION, RESERVED_KEYS, SERVER_OWNED_TYPES,
};
pub use execution::{
    Budget, BudgetUsage, Decision, Evidence, ExecutionSettings, ExecutionStatus, MutationRecord,
    MutationState, Observed, Reason, Settlement, StartRefusal, StartRequest,
    MUTATION_OUTCOME_SCHEMA,
};
pub use run::{
    delivery_run_id, is_heartbeat, is_stalled, last_real_type, stall_detected_event,
    stall_failure_payload, validate_run_id, ExecutionMode, NewRun, RunHead, RunKind, RunStatus,
    StallAction, StallCheck, TerminalKind, STALL_FAILURE_REASON,
};

/// Milliseconds since the Unix epoch, the one clock representation stored on heads.
pub fn now_millis() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// `timestamp_utc` as the envelope carries it: RFC 3339, millisecond precision, `Z`.
pub fn format_timestamp(millis: i64) -> String {
    chrono::DateTime::from_timestamp_millis(millis)
        .unwrap_or_default()
        .format("%Y-%m-%dT%H:%M:%S%.3fZ")
        .to_string()
}

/// Milliseconds since the Unix epoch of an RFC 3339 timestamp ([`format_timestamp`]'s).
pub fn parse_timestamp(text: &str) -> Option<i64> {
    chrono::DateTime::parse_from_rfc3339(text)
        .ok()
        .map(|t| t.timestamp_millis())
}
