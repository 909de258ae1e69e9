//! The event envelope of docs/architecture.md §4 and producer-type validation.

use serde_json::{Map, Value};

use crate::{format_timestamp, RunHead};

pub const PROTOCOL_VERSION: &str = "v2";

/// One append transaction holds the head update plus at most 99 events: DynamoDB's
/// `TransactWriteItems` limit is 100 items.
pub const MAX_BATCH_EVENTS: usize = 99;

/// A producer event's payload (everything beside the envelope) is at most 64 KiB.
pub const MAX_PAYLOAD_BYTES: usize = 64 * 1024;

/// Keys the envelope owns; a producer may not set them.
pub const RESERVED_KEYS: &[&str] = &[
    "protocol_version",
    "run_id",
    "sequence",
    "type",
    "timestamp_utc",
    "channel_id",
];

/// The catalogue of the event types Tollgate writes itself — the one place their names
/// are spelled. Constructors, the server-owned and terminal sets, the stall filter and
/// the renderers use these names (README *Event catalogue* says what each carries).
pub mod types {
    /// Sequence 1 of every run.
    pub const RUN_STARTED: &str = "run_started";
    /// A card is armed (Tollgate's, or one a pod announced).
    pub const APPROVAL_REQUIRED: &str = "tool.approval_required";
    /// A heartbeat while a card waits.
    pub const APPROVAL_PENDING: &str = "tool.approval_pending";
    /// A card ended: approved, denied or expired.
    pub const APPROVAL_RESOLVED: &str = "tool.approval_resolved";
    /// A live policy approved a gate without a human.
    pub const AUTO_APPROVED: &str = "tool.auto_approved";
    /// A policy this run relied on was revoked.
    pub const POLICY_REVOKED: &str = "tool.policy_revoked";
    /// A child's card, mirrored on its coordinator.
    pub const CHILD_APPROVAL_REQUIRED: &str = "coordinator.child_approval_required";
    /// A child's card ended, told on its coordinator.
    pub const CHILD_APPROVAL_RESOLVED: &str = "coordinator.child_approval_resolved";
    /// A child went silent past the stall timeout.
    pub const CHILD_STALL_DETECTED: &str = "coordinator.child_stall_detected";
    /// Seed 000: an approved call's local execution (admission included) started.
    pub const EXECUTION_STARTED: &str = "tool_execution_started";
    /// The terminal execution decision (`execution_status` `executed` | `not_executed`).
    pub const TOOL_EXECUTION: &str = "tool_execution";
    /// An operator reconciled an `outcome_unknown` mutation.
    pub const EXECUTION_RECONCILED: &str = "tool_execution_reconciled";
    /// A mutation record changed after its terminal `tool_execution`.
    pub const EXECUTION_UPDATED: &str = "tool_execution_updated";
    /// A sequenced heartbeat while a dispatched mutation waits for its settlement.
    pub const HEARTBEAT: &str = "heartbeat";
    /// The terminal events.
    pub const RUN_COMPLETED: &str = "run_completed";
    pub const RUN_FAILED: &str = "run_failed";
    pub const RUN_CANCELLED: &str = "run_cancelled";

    /// The terminal events: nothing follows one.
    pub const TERMINAL: &[&str] = &[RUN_COMPLETED, RUN_FAILED, RUN_CANCELLED];

    /// Events that say a run is alive without being news: a silence is measured past
    /// them (the stall guard).
    pub const HEARTBEATS: &[&str] = &[APPROVAL_PENDING, HEARTBEAT];
}

/// Types only Tollgate itself emits; a producer appending one gets 400.
pub const SERVER_OWNED_TYPES: &[&str] = &[
    types::RUN_STARTED,
    types::APPROVAL_REQUIRED,
    types::APPROVAL_PENDING,
    types::APPROVAL_RESOLVED,
    types::AUTO_APPROVED,
    types::POLICY_REVOKED,
    types::CHILD_APPROVAL_REQUIRED,
    types::CHILD_APPROVAL_RESOLVED,
    types::CHILD_STALL_DETECTED,
    types::EXECUTION_STARTED,
    types::TOOL_EXECUTION,
    types::EXECUTION_RECONCILED,
    types::EXECUTION_UPDATED,
    types::HEARTBEAT,
    types::RUN_COMPLETED,
    types::RUN_FAILED,
    types::RUN_CANCELLED,
];

/// Event types the live stream (SSE) and its readers reserve; no run event has them.
pub const STREAM_RESERVED_TYPES: &[&str] = &["done", "error", "open", "message"];

pub fn is_server_owned(event_type: &str) -> bool {
    SERVER_OWNED_TYPES.contains(&event_type)
}

/// An event before the store gives it a sequence: its type, the producer's optional
/// idempotency key (served as `event_id` right after the envelope), and the payload
/// fields that sit beside the envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct EventDraft {
    pub event_type: String,
    pub event_id: Option<String>,
    pub payload: Map<String, Value>,
}

impl EventDraft {
    /// A server-owned event (no idempotency key).
    pub fn server(event_type: &str, payload: Map<String, Value>) -> Self {
        Self {
            event_type: event_type.to_owned(),
            event_id: None,
            payload,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    #[error("event is not a JSON object")]
    NotAnObject,
    #[error("event has no string field \"type\"")]
    MissingType,
    #[error("event type {0:?} does not match ^[a-z][a-z0-9_.]{{0,63}}$")]
    InvalidType(String),
    #[error("event type {0:?} is emitted by Tollgate only (or starts with such a type)")]
    ServerOwned(String),
    #[error("field {0:?} is part of the envelope and set by Tollgate")]
    ReservedKey(String),
    #[error("event_id must be a non-empty string of at most 128 characters")]
    InvalidEventId,
    #[error("event_id {0:?} starts with a prefix Tollgate keys its own events with")]
    ServerEventId(String),
    #[error("event payload is {0} bytes; the limit is 65536")]
    PayloadTooLarge(usize),
}

/// Prefixes of the `event_id`s Tollgate gives its own keyed events; producer ids may not
/// start with them.
pub const SERVER_EVENT_ID_PREFIXES: &[&str] = &[
    "approval_pending:",
    "auto_approved:",
    "policy_revoked:",
    "tollgate:",
];

fn valid_type(t: &str) -> bool {
    let bytes = t.as_bytes();
    (1..=64).contains(&bytes.len())
        && bytes[0].is_ascii_lowercase()
        && bytes[1..]
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'_' || *b == b'.')
}

/// Checks one producer event (`{type, event_id?, …payload}`) and splits it into a draft.
pub fn validate_producer_event(value: Value) -> Result<EventDraft, EventError> {
    let Value::Object(mut fields) = value else {
        return Err(EventError::NotAnObject);
    };
    let event_type = match fields.shift_remove("type") {
        Some(Value::String(t)) => t,
        _ => return Err(EventError::MissingType),
    };
    if !valid_type(&event_type) {
        return Err(EventError::InvalidType(event_type));
    }
    // Not only the exact names: `run_completed.x` or `tool.approval_resolved_` would
    // read as the server's own events to a client matching by prefix.
    if SERVER_OWNED_TYPES.iter().any(|t| event_type.starts_with(t)) {
        return Err(EventError::ServerOwned(event_type));
    }
    // Names a live stream's reader treats as the stream's own: `done` ends it, and an
    // EventSource dispatches `error`, `open` and `message` to its own handlers.
    if STREAM_RESERVED_TYPES.contains(&event_type.as_str()) {
        return Err(EventError::ServerOwned(event_type));
    }
    let event_id = match fields.shift_remove("event_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) if !id.is_empty() && id.chars().count() <= 128 => Some(id),
        Some(_) => return Err(EventError::InvalidEventId),
    };
    // A producer id must never take the key of an event Tollgate writes itself (a
    // heartbeat, an auto-approval, a revocation notice): that would suppress it.
    if let Some(id) = event_id
        .as_ref()
        .filter(|id| SERVER_EVENT_ID_PREFIXES.iter().any(|p| id.starts_with(p)))
    {
        return Err(EventError::ServerEventId(id.clone()));
    }
    validate_payload(&fields)?;
    Ok(EventDraft {
        event_type,
        event_id,
        payload: fields,
    })
}

/// Payload rules shared by producer events and the optional bodies of terminal calls.
pub fn validate_payload(fields: &Map<String, Value>) -> Result<(), EventError> {
    if let Some(key) = RESERVED_KEYS.iter().find(|k| fields.contains_key(**k)) {
        return Err(EventError::ReservedKey((*key).to_owned()));
    }
    let size = serde_json::to_vec(fields)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    if size > MAX_PAYLOAD_BYTES {
        return Err(EventError::PayloadTooLarge(size));
    }
    Ok(())
}

/// Renders the exact JSON a client will see for this event: the flat envelope first,
/// then the payload. The store keeps this string verbatim, so JSON replay and SSE serve
/// byte-identical events.
pub fn render_event(head: &RunHead, sequence: u64, draft: &EventDraft, at_millis: i64) -> String {
    let mut obj = Map::with_capacity(draft.payload.len() + 7);
    obj.insert("protocol_version".into(), PROTOCOL_VERSION.into());
    obj.insert("run_id".into(), head.run_id.clone().into());
    obj.insert("sequence".into(), sequence.into());
    obj.insert("type".into(), draft.event_type.clone().into());
    obj.insert("timestamp_utc".into(), format_timestamp(at_millis).into());
    if let Some(channel) = &head.channel_id {
        obj.insert("channel_id".into(), channel.clone().into());
    }
    if let Some(id) = &draft.event_id {
        obj.insert("event_id".into(), id.clone().into());
    }
    for (k, v) in &draft.payload {
        obj.insert(k.clone(), v.clone());
    }
    Value::Object(obj).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn producer_types_follow_the_pattern() {
        for ok in ["agent.message", "tool.call", "tool_started", "a", "x9.y_z"] {
            assert!(validate_producer_event(json!({"type": ok})).is_ok(), "{ok}");
        }
        for bad in ["", "Agent", "9x", "tool-call", "a b", &"a".repeat(65)] {
            assert!(
                matches!(
                    validate_producer_event(json!({"type": bad})),
                    Err(EventError::InvalidType(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn every_server_owned_type_is_refused() {
        for t in SERVER_OWNED_TYPES {
            assert_eq!(
                validate_producer_event(json!({"type": t})),
                Err(EventError::ServerOwned((*t).to_owned()))
            );
        }
    }

    #[test]
    fn producer_ids_cannot_take_a_server_key() {
        for id in [
            "approval_pending:r1:1",
            "auto_approved:r1",
            "policy_revoked:00ff",
            "tollgate:x",
        ] {
            assert_eq!(
                validate_producer_event(json!({"type": "agent.note", "event_id": id})),
                Err(EventError::ServerEventId(id.to_owned())),
                "{id}"
            );
        }
        // Only as a prefix: elsewhere in an id these words are the producer's own.
        assert!(validate_producer_event(
            json!({"type": "agent.note", "event_id": "my-auto_approved:1"})
        )
        .is_ok());
    }

    #[test]
    fn types_extending_a_server_owned_name_are_refused() {
        for t in [
            "run_completed.x",
            "tool.approval_resolved_",
            "heartbeat2",
            "run_started.v2",
        ] {
            assert_eq!(
                validate_producer_event(json!({"type": t})),
                Err(EventError::ServerOwned(t.to_owned())),
                "{t}"
            );
        }
        for ok in [
            "run.completed",
            "tool.approval",
            "tool_executor",
            "heart.beat",
        ] {
            assert!(validate_producer_event(json!({"type": ok})).is_ok(), "{ok}");
        }
    }

    #[test]
    fn envelope_keys_cannot_be_forged() {
        for k in RESERVED_KEYS.iter().filter(|k| **k != "type") {
            let mut v = json!({"type": "agent.message"});
            v[*k] = json!(1);
            assert_eq!(
                validate_producer_event(v),
                Err(EventError::ReservedKey((*k).to_owned()))
            );
        }
    }

    #[test]
    fn payload_limit_is_64_kib() {
        let big = "x".repeat(MAX_PAYLOAD_BYTES);
        assert!(matches!(
            validate_producer_event(json!({"type": "agent.message", "text": big})),
            Err(EventError::PayloadTooLarge(_))
        ));
        let fits = "x".repeat(MAX_PAYLOAD_BYTES - 20);
        assert!(validate_producer_event(json!({"type": "agent.message", "t": fits})).is_ok());
    }

    #[test]
    fn rendered_event_is_flat_with_envelope_first() {
        let head = RunHead::new_for_test("run-1", Some("C1"));
        let draft =
            validate_producer_event(json!({"type": "tool.call", "event_id": "e1", "tool": "x"}))
                .unwrap();
        let body = render_event(&head, 5, &draft, 0);
        assert_eq!(
            body,
            r#"{"protocol_version":"v2","run_id":"run-1","sequence":5,"type":"tool.call","timestamp_utc":"1970-01-01T00:00:00.000Z","channel_id":"C1","event_id":"e1","tool":"x"}"#
        );
    }
}
