//! Approved execution: start, dispatch and settle an approved call; read and reconcile
//! its durable record.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The body of `POST /api/runs/{run_id}/tool-calls/{tool_call_id}/start` (run token).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"request_id": "req-1", "approval_id": "req-1", "tool_name": "send_email"})))]
pub struct Start {
    /// The approved card.
    #[cfg_attr(feature = "schema", schemars(extend("pattern" = crate::limits::ID_PATTERN)))]
    pub request_id: String,
    #[cfg_attr(feature = "schema", schemars(extend("pattern" = crate::limits::ID_PATTERN)))]
    pub approval_id: String,
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = crate::limits::MAX_TOOL_NAME)))]
    pub tool_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = crate::limits::MAX_HASH)))]
    pub arguments_hash: Option<String>,
}

/// The body of `…/dispatch`: the call is about to leave for its transport.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"approval_id": "req-1"})))]
pub struct Dispatch {
    #[cfg_attr(feature = "schema", schemars(extend("pattern" = crate::limits::ID_PATTERN)))]
    pub approval_id: String,
}

/// The body of `…/settle`: what happened.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"approval_id": "req-1", "evidence": "confirmed", "result": {"message_id": "m-1"}})))]
pub struct Settle {
    #[cfg_attr(feature = "schema", schemars(extend("pattern" = crate::limits::ID_PATTERN)))]
    pub approval_id: String,
    /// `confirmed` (a response came), `not_sent` (it never left) or `ambiguous` (sent,
    /// no answer: recorded `outcome_unknown`, never retried).
    #[cfg_attr(feature = "schema", schemars(extend("enum" = ["confirmed", "not_sent", "ambiguous"])))]
    pub evidence: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}

/// The body of `POST /api/runs/{run_id}/mutations/{tool_call_id}/{approval_id}/reconcile`
/// (operator): what the operator observed of an unknown outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"observed": "applied"})))]
pub struct Reconcile {
    /// `applied` or `not_applied`.
    #[cfg_attr(feature = "schema", schemars(extend("enum" = ["applied", "not_applied"])))]
    pub observed: String,
}

/// What `start`, `dispatch`, `settle` and `reconcile` answer when they are accepted (200):
/// where the attempt stands now. A refusal (400, 409) is an [`crate::ErrorBody`] whose
/// `state` is the attempt's (or, before any attempt, the card's), with `reason` for a
/// `not_executed` attempt and `approval_id` for the attempt that blocks a new start.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"state": "intent", "sequence": 6})))]
pub struct ExecutionAnswer {
    /// `intent`, `dispatched`, `completed`, `not_executed` or `outcome_unknown`.
    pub state: String,
    /// Accepted starts: the sequence of `tool_execution_started`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    /// Why the attempt is `not_executed` (`not_sent`, `budget_exhausted`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A mutation record, `mutation_outcome/v1`: the durable outcome of one approved call,
/// as the record routes answer it. The optional fields are absent until known.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"schema": "mutation_outcome/v1", "run_id": "run-5f0c7a2e", "tool_call_id": "call-1", "approval_id": "req-1", "tool_name": "send_email", "state": "completed", "execution_status": "executed", "result": {"message_id": "m-1"}})))]
pub struct MutationRecord {
    /// `mutation_outcome/v1`.
    pub schema: String,
    pub run_id: String,
    pub tool_call_id: String,
    pub approval_id: String,
    pub tool_name: String,
    /// `intent`, `dispatched`, `completed`, `not_executed` or `outcome_unknown`.
    pub state: String,
    /// `executed` or `not_executed`, once the terminal decision is taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_status: Option<String>,
    /// What the tool answered (confirmed outcomes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    /// The tool's or the settlement's error facts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    /// Why it ended as it did (`not_sent`, `settlement_deadline`, `reconciled_applied`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `GET /api/runs/{run_id}/mutations`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct MutationList {
    pub run_id: String,
    pub mutations: Vec<MutationRecord>,
    pub has_more: bool,
}
