//! Runs: creating one, appending to it, ending it, and its delivery receipt.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// The body of `POST /api/runs` (every field optional). Unknown fields are refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"owner": "alice", "channel_id": "C0123", "budget": {"tools": {"send_email": 3}, "call_ceiling": 5}})))]
pub struct CreateRun {
    /// The run's id (`[A-Za-z0-9_.:-]`, 1–128); generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("pattern" = crate::limits::ID_PATTERN)))]
    pub run_id: Option<String>,
    /// `single` (default), `coordinator` or `child`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("enum" = ["single", "coordinator", "child", null])))]
    pub kind: Option<String>,
    /// A child's coordinator (a run its own agent created).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("pattern" = crate::limits::ID_PATTERN)))]
    pub parent_run_id: Option<String>,
    /// A child's subtask, as the coordinator names it (any JSON value).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subtask_id: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = crate::limits::MAX_HEAD_TEXT)))]
    pub owner: Option<String>,
    /// The tenant; must equal the agent token's `project_id` when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = crate::limits::MAX_HEAD_TEXT)))]
    pub project_id: Option<String>,
    /// The Slack channel the run reports to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = crate::limits::MAX_HEAD_TEXT)))]
    pub channel_id: Option<String>,
    /// Makes the create idempotent: the same `delivery_id` answers the same run
    /// (`GET /api/receipts/{delivery_id}` reads it back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = crate::limits::MAX_HEAD_TEXT)))]
    pub delivery_id: Option<String>,
    /// Approved execution's budget: `{tools: {<tool>: <most starts>}, call_ceiling?}`
    /// (without one, the run admits no approved execution).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(schema_with = "budget_schema"))]
    pub budget: Option<Value>,
    /// `inline` (default: Tollgate holds the run's cards) or `pod` (an AgentHost pod
    /// holds them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(extend("enum" = ["inline", "pod", null])))]
    pub execution_mode: Option<String>,
    /// For `execution_mode: pod`: the pod's HTTPS origin, where decisions are forwarded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = crate::limits::MAX_ORIGIN)))]
    pub agenthost_origin: Option<String>,
}

#[cfg(feature = "schema")]
fn budget_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": ["object", "null"],
        "properties": {
            "tools": {
                "type": "object",
                "maxProperties": crate::limits::MAX_BUDGET_TOOLS,
                "propertyNames": {"minLength": 1, "maxLength": crate::limits::MAX_TOOL_NAME},
                "additionalProperties": {"type": "integer", "minimum": 0},
            },
            "call_ceiling": {"type": ["integer", "null"], "minimum": 0},
        },
        "additionalProperties": false,
    })
}

#[cfg(feature = "schema")]
fn events_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "minItems": 1,
        "maxItems": crate::limits::MAX_BATCH_EVENTS,
        "items": {
            "type": "object",
            "required": ["type"],
            "properties": {
                "type": {"type": "string", "pattern": crate::limits::EVENT_TYPE_PATTERN},
                "event_id": {
                    "type": ["string", "null"],
                    "minLength": 1,
                    "maxLength": crate::limits::MAX_EVENT_ID,
                },
            },
            "additionalProperties": true,
        },
    })
}

/// What `POST /api/runs` answers (201 created, 200 the run a retry names) and
/// `GET /api/receipts/{delivery_id}` reads back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"run_id": "run-5f0c7a2e", "run_token": "rt.4kq…", "sequence": 1})))]
pub struct RunReceipt {
    pub run_id: String,
    /// The run's bearer token: appends, arms, ending the run. A secret.
    pub run_token: String,
    /// The sequence of `run_started`.
    pub sequence: u64,
    /// For `execution_mode: pod`: what the pod presents to Tollgate. A secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agenthost_credential: Option<String>,
    /// On `GET /api/receipts/{delivery_id}`: the run's status now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
}

/// The body of `POST /api/runs/{run_id}/events`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"events": [{"type": "agent.note", "event_id": "note-1", "text": "looking up the docs"}]})))]
pub struct AppendEvents {
    /// 1 to 99 events, each `{type, event_id?, ...payload}`; server-owned types are refused.
    #[cfg_attr(feature = "schema", schemars(length(min = 1, max = crate::limits::MAX_BATCH_EVENTS), schema_with = "events_schema"))]
    pub events: Vec<Map<String, Value>>,
}

/// What an append answers: the sequence each event got, in order. A pod-per-run run's
/// card announcement (one `tool.approval_required`, `tool.approval_pending` or
/// `tool.approval_resolved {expired: true}`) also answers the card's `request_id` and
/// `state`, and lists in `dropped` an event that changed nothing (so `sequences` is empty).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"run_id": "run-5f0c7a2e", "sequences": [2, 3]})))]
pub struct Appended {
    pub run_id: String,
    pub sequences: Vec<u64>,
    /// A pod card's `requestId`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// A pod card's state now (`pending`, `approved`, `denied`, `expired`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// `pod` for a pod card just recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
    /// A pod card just recorded: when Tollgate expires it if the pod never reports back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// A pod's own expiry: the card is resolved now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<bool>,
    /// Events written as nothing, and why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped: Option<Vec<Dropped>>,
}

impl Appended {
    /// The sequences of a plain append.
    pub fn sequences(run_id: impl Into<String>, sequences: Vec<u64>) -> Self {
        Self {
            run_id: run_id.into(),
            sequences,
            request_id: None,
            state: None,
            held_by: None,
            expires_at: None,
            resolved: None,
            dropped: None,
        }
    }
}

/// An event of an append that was written as nothing.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Dropped {
    /// Its index in `events`.
    pub index: usize,
    #[serde(rename = "type")]
    pub event_type: String,
    /// `card_resolved`, `already_announced` or `too_soon`.
    pub reason: String,
}

/// What `complete`, `fail` and `cancel` answer (their body is the terminal event's payload,
/// any JSON object).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"run_id": "run-5f0c7a2e", "status": "completed", "sequence": 9})))]
pub struct RunEnded {
    pub run_id: String,
    /// `completed`, `failed` or `cancelled`.
    pub status: String,
    /// The terminal event's sequence.
    pub sequence: u64,
}

/// One run of `GET /api/runs`: the run head's listing fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"run_id": "run-5f0c7a2e", "kind": "single", "status": "completed", "owner": "alice", "project_id": "acme", "channel_id": "C0123", "created_at": 1767225600000_i64, "ended_at": 1767225661000_i64})))]
pub struct RunSummary {
    pub run_id: String,
    /// `single`, `coordinator` or `child`.
    pub kind: String,
    /// `running`, `completed`, `failed` or `cancelled`.
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel_id: Option<String>,
    /// Milliseconds since the epoch.
    pub created_at: i64,
    /// When the terminal event was written (milliseconds since the epoch); absent while
    /// the run is running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<i64>,
}

/// `GET /api/runs`: a page of one tenant's runs, newest first. A page may hold fewer
/// runs than `limit` (even none) while `has_more` is true: filters are applied to at most
/// `MAX_RUNS_EXAMINED` runs per page; follow `next_cursor` until `has_more` is false.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"runs": [{"run_id": "run-5f0c7a2e", "kind": "single", "status": "running", "owner": "alice", "project_id": "acme", "created_at": 1767225600000_i64}], "has_more": true, "next_cursor": "5b227275…"})))]
pub struct RunList {
    pub runs: Vec<RunSummary>,
    pub has_more: bool,
    /// Pass back as `after` for the next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}
