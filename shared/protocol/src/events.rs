//! The event envelope: one event of a run as replay and the live stream carry it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// A run's event: the envelope's fields, then the event's payload keys at the top level
/// (flat: one JSON object).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "schema", schemars(example = serde_json::json!({"protocol_version": "v2", "run_id": "run-5f0c7a2e", "sequence": 5, "type": "tool.approval_resolved", "timestamp_utc": "2026-12-02T10:01:12.345Z", "requestId": "req-1", "runId": "run-5f0c7a2e", "approved": true, "expired": false, "decidedBy": "alice", "scope": "once"})))]
pub struct Event {
    /// `v2`.
    pub protocol_version: String,
    pub run_id: String,
    /// 1, 2, 3, … per run, with no gap; the live stream's `id:`.
    pub sequence: u64,
    /// `run_started`, `tool.approval_required`, … (the README's event catalogue; the
    /// payload of each type Tollgate writes is the schema [`crate::payloads::PAYLOADS`]
    /// names).
    #[serde(rename = "type")]
    pub event_type: String,
    /// RFC 3339, milliseconds, `Z`.
    pub timestamp_utc: String,
    /// The payload's keys, beside the envelope's.
    #[serde(flatten)]
    pub payload: Map<String, Value>,
}

impl Event {
    /// The payload as the type of its event (e.g. [`crate::payloads::ApprovalResolved`]
    /// for `tool.approval_resolved`; [`crate::payloads::PAYLOADS`] names each); `None`
    /// when it is not one.
    pub fn payload_as<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        serde_json::from_value(Value::Object(self.payload.clone())).ok()
    }
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

pub use crate::payloads::{ApprovalRequired, ApprovalResolved};
