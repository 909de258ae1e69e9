//! The payloads of the events Tollgate writes itself (the README's event catalogue):
//! one type per event type, its keys beside the envelope's in [`crate::Event`]. Keys
//! are camelCase for the approval events and snake_case for the run and execution events,
//! as the catalogue has them; `tool_call_id` and `approval_id` ride on an approval event
//! when its card was armed with them. A terminal event's payload is what the agent sent
//! (any JSON object). `tests/payloads.rs` holds every event the server builds to these
//! types, key for key.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Every server-written event type with a typed payload, and its schema's name in the
/// document.
pub const PAYLOADS: &[(&str, &str)] = &[
    ("run_started", "RunStarted"),
    ("tool.approval_required", "ApprovalRequired"),
    ("tool.approval_pending", "ApprovalPending"),
    ("tool.approval_resolved", "ApprovalResolved"),
    ("tool.auto_approved", "AutoApproved"),
    ("tool.policy_revoked", "PolicyRevoked"),
    (
        "coordinator.child_approval_required",
        "ChildApprovalRequired",
    ),
    (
        "coordinator.child_approval_resolved",
        "ChildApprovalResolved",
    ),
    ("coordinator.child_stall_detected", "ChildStallDetected"),
    ("tool_execution_started", "ExecutionIds"),
    ("tool_execution", "ToolExecution"),
    ("tool_execution_reconciled", "ExecutionReconciled"),
    ("tool_execution_updated", "ExecutionUpdated"),
    ("heartbeat", "ExecutionIds"),
];

/// `run_started` (sequence 1): the run's shape, never its secrets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RunStarted {
    /// `single`, `coordinator` or `child`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subtask_id: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    /// `inline` or `pod`, when the create named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_mode: Option<String>,
}

/// `tool.approval_required`: a card waits for a human.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequired {
    pub request_id: String,
    /// The first 8 characters of `requestId`.
    pub display_id: String,
    pub tool_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intention: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// What the agent showed of the call's arguments, as stored (redacted and bounded;
    /// display only: the `arguments_hash` binds the call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_preview: Option<serde_json::Map<String, Value>>,
    #[serde(
        default,
        rename = "tool_call_id",
        skip_serializing_if = "Option::is_none"
    )]
    pub tool_call_id: Option<String>,
    #[serde(
        default,
        rename = "approval_id",
        skip_serializing_if = "Option::is_none"
    )]
    pub approval_id: Option<String>,
}

/// `tool.approval_pending`: a heartbeat while a card waits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApprovalPending {
    pub request_id: String,
    pub display_id: String,
    pub tool_name: String,
}

/// `tool.approval_resolved`: how a card ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApprovalResolved {
    pub request_id: String,
    /// The card's run.
    pub run_id: String,
    pub approved: bool,
    pub expired: bool,
    /// Who decided (`policy:<id>` for a standing grant); absent for an expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// An approval's scope: `once`, `run`, `tool` or `always`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Why an expired card ended (`run_ended`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The operator's reason for the decision, when they gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_reason: Option<String>,
    #[serde(
        default,
        rename = "tool_call_id",
        skip_serializing_if = "Option::is_none"
    )]
    pub tool_call_id: Option<String>,
    #[serde(
        default,
        rename = "approval_id",
        skip_serializing_if = "Option::is_none"
    )]
    pub approval_id: Option<String>,
}

/// `coordinator.child_approval_resolved`: a child's card ended, told on its coordinator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ChildApprovalResolved {
    pub child_run_id: String,
    /// The child's subtask (`null` when none).
    pub subtask_id: Value,
    pub request_id: String,
    pub approved: bool,
    pub expired: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// `run_ended` when the child's end closed the card.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The operator's reason for the decision, when they gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_reason: Option<String>,
    #[serde(
        default,
        rename = "tool_call_id",
        skip_serializing_if = "Option::is_none"
    )]
    pub tool_call_id: Option<String>,
    #[serde(
        default,
        rename = "approval_id",
        skip_serializing_if = "Option::is_none"
    )]
    pub approval_id: Option<String>,
}

/// `tool.auto_approved`: a live standing grant approved a gate without a human.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct AutoApproved {
    pub request_id: String,
    pub display_id: String,
    pub tool_name: String,
    /// The grant's scope.
    pub scope: String,
    pub policy_id: String,
    #[serde(
        default,
        rename = "tool_call_id",
        skip_serializing_if = "Option::is_none"
    )]
    pub tool_call_id: Option<String>,
    #[serde(
        default,
        rename = "approval_id",
        skip_serializing_if = "Option::is_none"
    )]
    pub approval_id: Option<String>,
}

/// `tool.policy_revoked`: a grant this run relied on was revoked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct PolicyRevoked {
    pub policy_id: String,
    pub scope: String,
    pub tool_name: String,
    pub revoked_by: Option<String>,
}

/// `coordinator.child_approval_required`: a child's card, mirrored on its coordinator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ChildApprovalRequired {
    pub child_run_id: String,
    /// The child's subtask (`null` when none).
    pub subtask_id: Value,
    pub request_id: String,
    pub tool_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The child card's argument preview (see `ApprovalRequired`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_preview: Option<serde_json::Map<String, Value>>,
    #[serde(
        default,
        rename = "tool_call_id",
        skip_serializing_if = "Option::is_none"
    )]
    pub tool_call_id: Option<String>,
    #[serde(
        default,
        rename = "approval_id",
        skip_serializing_if = "Option::is_none"
    )]
    pub approval_id: Option<String>,
}

/// `coordinator.child_stall_detected`: a child went silent past the stall timeout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ChildStallDetected {
    pub child_run_id: String,
    pub subtask_id: Value,
    pub silent_seconds: i64,
    /// RFC 3339: the child's last event.
    pub stale_since_utc: String,
    pub stall_timeout_seconds: i64,
    pub last_event_sequence: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_event_type: Option<String>,
    /// `failed` when the child was failed with it (its `run_failed` carries
    /// `reason: agent_stall_timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
}

/// `tool_execution_started` and `heartbeat`: an approved call's ids, nothing else.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecutionIds {
    pub tool_name: String,
    pub tool_call_id: String,
    pub approval_id: String,
}

/// `tool_execution`: the terminal execution decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ToolExecution {
    pub tool_name: String,
    pub tool_call_id: String,
    pub approval_id: String,
    /// `executed` or `not_executed`.
    pub execution_status: String,
    /// The record's state: `completed`, `not_executed` or `outcome_unknown`.
    pub mutation_outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `tool_execution_reconciled`: an operator settled an unknown outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecutionReconciled {
    pub tool_name: String,
    pub tool_call_id: String,
    pub approval_id: String,
    /// `applied` or `not_applied`.
    pub observed: String,
    pub mutation_outcome: String,
    pub reconciled_by: String,
}

/// `tool_execution_updated`: a durable record changed after its `tool_execution`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ExecutionUpdated {
    pub tool_name: String,
    pub tool_call_id: String,
    pub approval_id: String,
    pub mutation_outcome: String,
    pub previous_outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub execution_status: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}
