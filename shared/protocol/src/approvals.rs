//! Approval cards: arming one, deciding one, listing them, and the policies approvals grant.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The body of `POST /api/runs/{run_id}/approval-requests` (run token). Unknown fields
/// are refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"request_id": "req-1", "tool_name": "web_fetch", "url": "https://example.com/docs", "intention": "read the docs", "timeout_seconds": 300})))]
pub struct ArmApproval {
    /// The card's id on the run (an id: `[A-Za-z0-9_.:-]`, 1–128); a retry with the same
    /// id and the same call answers the same card.
    #[cfg_attr(feature = "schema", schemars(extend("pattern" = crate::limits::ID_PATTERN)))]
    pub request_id: String,
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = crate::limits::MAX_TOOL_NAME)))]
    pub tool_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("pattern" = crate::limits::ID_PATTERN)))]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("pattern" = crate::limits::ID_PATTERN)))]
    pub approval_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = crate::limits::MAX_URL)))]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = crate::limits::MAX_TEXT)))]
    pub intention: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = crate::limits::MAX_TEXT)))]
    pub message: Option<String>,
    /// Hex SHA-256 of the call's canonical arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = crate::limits::MAX_HASH)))]
    pub arguments_hash: Option<String>,
    /// What the operator is shown of the call's arguments: a JSON object, display only
    /// (the `arguments_hash` binds the call). Before storing, the server replaces with
    /// `"[redacted]"`, at any depth, the value under a secret key (the README's redaction
    /// rule: the key lower-cased without non-alphanumerics contains `password`, `secret`,
    /// `token`, `apikey`, `cookie`, `credential` and the like, or begins or ends with `auth`),
    /// the value paired with one (`{"name": "Authorization", "value": …}`,
    /// `["DB_PASSWORD", …]`), and the secrets inside strings (URL userinfo, secret query
    /// parameters, `Bearer`/`Basic` credentials, JWTs, well-known key prefixes); then it cuts
    /// strings longer than `MAX_PREVIEW_STRING` characters, marking the cut with
    /// `…[truncated]`. At most `MAX_PREVIEW_DEPTH` levels deep and `MAX_PREVIEW_BYTES`
    /// serialized after that (else 400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_preview: Option<serde_json::Map<String, Value>>,
    /// Seconds until the card expires (default 300, at most the deployment's cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = crate::limits::MAX_TIMEOUT_SECONDS)))]
    pub timeout_seconds: Option<u64>,
}

/// What arming answers: 201 a new card, 200 the card a retry names (or one a live policy
/// approved at once: `auto_approved`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"run_id": "run-5f0c7a2e", "request_id": "req-1", "display_id": "req-1", "state": "pending", "expires_at": "2026-12-02T10:05:00.000Z", "sequence": 4})))]
pub struct Armed {
    pub run_id: String,
    pub request_id: String,
    pub display_id: String,
    /// `pending`, or where the card stands on a retry.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// The sequence of `tool.approval_required` (or `tool.auto_approved`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_approved: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_id: Option<String>,
}

/// The body of `POST /api/runs/{run_id}/tool-approvals` and `…/tool-denials` (operator).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"request_id": "req-1", "scope": "once"})))]
pub struct Decide {
    #[cfg_attr(feature = "schema", schemars(extend("pattern" = crate::limits::ID_PATTERN)))]
    pub request_id: String,
    /// `once` (default), `run`, `tool` or `always` (approvals only); any other value
    /// means `once`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Value>,
    /// The tool the operator means to decide (a mismatch is refused; needed for a scope
    /// beyond `once` on a pod-held card).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = crate::limits::MAX_TOOL_NAME)))]
    pub tool_name: Option<String>,
    /// Why the operator decided so (at most `MAX_REASON` characters, no control
    /// characters): recorded on the card and in `tool.approval_resolved`
    /// (`decisionReason`). A decision repeated with another reason answers the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(length(max = crate::limits::MAX_REASON), extend("pattern" = crate::limits::REASON_PATTERN)))]
    pub reason: Option<String>,
}

/// What a decision answers: the card's real state after it (a late click reads
/// `expired`). `approved` on the approval route, `denied` on the denial route.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"run_id": "run-5f0c7a2e", "request_id": "req-1", "approved": true, "resolved": true, "state": "approved", "expired": false, "decided_by": "alice", "scope": "once"})))]
pub struct Decided {
    /// The run that owns the card (a child, when decided through its coordinator).
    pub run_id: String,
    pub request_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denied: Option<bool>,
    pub resolved: bool,
    /// `approved`, `denied` or `expired`.
    pub state: String,
    pub expired: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<String>,
    /// An approved card's scope (this click's, or the earlier decision's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// `run_ended` when the card expired because its run ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The reason the deciding operator gave (the first decision's, on a repeat).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_reason: Option<String>,
    /// On a pod-held card: the pod applied this decision, though the card had ended
    /// otherwise meanwhile (the answer's `state` is how it ended).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_applied: Option<bool>,
    /// The standing grant this card's approval made: which tool, for which scope (`run`,
    /// `tool`, `always`); absent when it made none (`once`, a denial, an expiry, or an
    /// approval its agent host applied before this decision).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<Grant>,
}

/// What a standing grant covers: later cards for `tool_name` within `scope`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Grant {
    pub tool_name: String,
    /// `run`, `tool` or `always`.
    pub scope: String,
}

/// An approval card as listed and read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Card {
    pub run_id: String,
    pub request_id: String,
    /// The first 8 characters of `request_id`.
    pub display_id: String,
    pub tool_name: String,
    pub tool_call_id: String,
    pub approval_id: String,
    pub url: Option<String>,
    pub intention: Option<String>,
    pub message: Option<String>,
    pub arguments_hash: Option<String>,
    /// The call's argument preview as stored (redacted and bounded; display only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_preview: Option<serde_json::Map<String, Value>>,
    /// `pending`, `approved`, `denied` or `expired`.
    pub state: String,
    pub scope: Option<String>,
    pub decided_by: Option<String>,
    pub decided_at: Option<String>,
    pub created_at: String,
    pub expires_at: String,
    pub coordinator_run_id: Option<String>,
    pub subtask_id: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The reason the deciding operator gave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_approved: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_id: Option<String>,
    /// `pod` when the run's AgentHost pod holds the card.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
}

/// `GET /api/approvals?state=pending`: the project's open cards, soonest deadline first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CardPage {
    pub approvals: Vec<Card>,
    pub has_more: bool,
    /// The `after` of the next page, when `has_more`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<String>,
}

/// `GET /api/runs/{run_id}/approvals?state=pending`: one run's open cards.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RunCards {
    pub run_id: String,
    pub approvals: Vec<Card>,
    pub has_more: bool,
}

/// A standing grant an approval with scope `run`, `tool` or `always` made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Policy {
    pub policy_id: String,
    pub scope: String,
    pub tool_name: String,
    pub owner: Option<String>,
    pub project_id: Option<String>,
    pub origin_run_id: String,
    pub request_id: String,
    pub granted_by: String,
    pub granted_at: String,
    pub revoked_by: Option<String>,
    pub revoked_at: Option<String>,
    /// A grant of an older key form, which covers nothing.
    pub covers_nothing: bool,
}

/// `GET /api/policies`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct PolicyPage {
    pub policies: Vec<Policy>,
    pub has_more: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}
