//! The event envelope: one event of a run as replay and the live stream carry it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A run's event: the envelope's fields, then the event's payload keys at the top level
/// (flat, as seed 000 has it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Event {
    /// `v2`.
    pub protocol_version: String,
    pub run_id: String,
    /// 1, 2, 3, … per run, with no gap; the live stream's `id:`.
    pub sequence: u64,
    /// `run_started`, `tool.approval_required`, … (the README's event catalogue).
    #[serde(rename = "type")]
    pub event_type: String,
    /// RFC 3339, milliseconds, `Z`.
    pub timestamp_utc: String,
    /// The payload's keys, beside the envelope's.
    #[serde(flatten)]
    pub payload: Map<String, Value>,
}

impl Event {
    /// The payload as the type of its event (e.g. [`ApprovalResolved`] for
    /// `tool.approval_resolved`); `None` when it is not one.
    pub fn payload_as<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_value(Value::Object(self.payload.clone())).ok()
    }
}

/// The payload of `tool.approval_resolved` (and, with `childRunId` and `subtaskId`, of
/// `coordinator.child_approval_resolved`): how a card ended. Keys in camelCase, as the
/// event catalogue has them; `tool_call_id` and `approval_id` when the card was armed
/// with them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApprovalResolved {
    pub request_id: String,
    /// The card's run (`tool.approval_resolved`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The child run (`coordinator.child_approval_resolved`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub child_run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subtask_id: Option<Value>,
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
    #[serde(default, rename = "tool_call_id", skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, rename = "approval_id", skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
}

/// The payload of `tool.approval_required` (and of the `tool.approval_pending`
/// heartbeats, which carry its first three keys): a card waits for a human.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequired {
    pub request_id: String,
    pub display_id: String,
    pub tool_name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intention: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, rename = "tool_call_id", skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, rename = "approval_id", skip_serializing_if = "Option::is_none")]
    pub approval_id: Option<String>,
}

/// A page of `GET /api/runs/{run_id}/events` (JSON).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct EventPage {
    pub run_id: String,
    /// In sequence order, from `after + 1`, with no gap.
    pub events: Vec<Event>,
    /// The `after` of the next page.
    pub next_after: u64,
    /// More events are stored after this page.
    pub has_more: bool,
    /// The run has ended and this page holds its terminal event (nothing follows).
    pub terminal: bool,
}

/// The data of the live stream's last frame, `event: done`: the run has ended and every
/// event up to its terminal one was sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct StreamEnd {
    pub run_id: String,
    pub terminal_sequence: u64,
}
