//! Live delivery over WebSocket (`docs/architecture.md` §5): the messages a client sends
//! and the frames it receives, the same on `tollgate serve` (`GET /api/ws`) and on the
//! deployed API Gateway WebSocket API.
//!
//! **Connecting.** The credential — a run token, an agent JWT or an operator JWT — goes
//! in the `Sec-WebSocket-Protocol` header as two protocols, [`SUBPROTOCOL`] and
//! `bearer.<token>` (the server answers [`SUBPROTOCOL`]); or, where a client cannot set
//! that header, in the query as `?access_token=<token>` (which access logs may record).
//! A missing or invalid credential refuses the upgrade (401).
//!
//! **Subscribing.** One connection may follow several runs. A client sends
//! [`ClientMessage::Subscribe`] `{"action":"subscribe","run_id":…,"after":N}`; the server
//! answers a [`FRAME_SUBSCRIBED`] frame, then every event with a sequence above `after`
//! (the backlog, from the same gap-safe pages as replay), then live events as they
//! commit. Each event is a frame with `id` = its sequence, `event` = its type and `data`
//! = the event exactly as replay serves it. After a run's terminal event comes one
//! [`FRAME_DONE`] frame (no `id`, `data` a [`crate::events::StreamEnd`]) and the
//! subscription ends. A refused subscription (forbidden, no such run, too many) is an
//! [`FRAME_ERROR`] frame whose `data` is an [`crate::ErrorBody`].
//!
//! **Delivery.** Per run, frames are meant to arrive in sequence order and once; a client
//! keeps the last sequence it delivered, drops a frame at or below it, and when a frame
//! skips ahead (a lost frame, a reconnect) holds it and resubscribes with
//! `after` = that last sequence. A dropped connection resumes the same way. So a client
//! sees every sequence exactly once and in order, whatever the transport loses.
//!
//! Frames without an `id` are control frames; every event frame has one.
//!
//! **Run tokens.** A run token opens one run only, and is checked against it: a client
//! connecting with a run token also names that run in the query, `?run_id=<run>` (a
//! connection with a run token and no `run_id` is refused, 401). Agent and operator JWTs
//! need no `run_id`; their subscriptions are checked run by run as replay checks them.
//!
//! **Closing.** The server closes a connection with code 1008 (policy) for a binary
//! frame, a message over [`MAX_CLIENT_MESSAGE_BYTES`] or a JWT that expired, and with
//! 1001 (going away) when it shuts down; a peer that answers no ping is dropped. A
//! client reconnects and resubscribes with `after` (the delivery rule above).
//!
//! **Finding the endpoint.** `GET /api/live` ([`LIVE_PATH`], no credential) answers
//! [`LiveEndpoints`]: the WebSocket URL (absolute, or a path on the same server that a
//! client resolves against its base URL, `http`→`ws`, `https`→`wss`), or none where
//! only the SSE stream serves.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The subprotocol a client offers and the server answers.
pub const SUBPROTOCOL: &str = "tollgate.v1";
/// Prefix of the subprotocol entry that carries the credential: `bearer.<token>`.
pub const BEARER_PREFIX: &str = "bearer.";
/// The query parameter that may carry the credential instead.
pub const TOKEN_QUERY: &str = "access_token";

/// The query parameter naming the run a run token is for (connecting with a run token).
pub const RUN_QUERY: &str = "run_id";
/// `tollgate serve`'s WebSocket endpoint.
pub const WS_PATH: &str = "/api/ws";
/// Where a client learns the live endpoints ([`LiveEndpoints`]).
pub const LIVE_PATH: &str = "/api/live";

/// `GET /api/live`: how to follow runs live here.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct LiveEndpoints {
    /// The WebSocket endpoint: an absolute `ws://`/`wss://` URL (the deployed WebSocket
    /// API), or a path on this server (`/api/ws`) to resolve against the base URL with
    /// `http`→`ws`; `null` where no WebSocket endpoint serves (use SSE).
    pub websocket_url: Option<String>,
    /// Whether the SSE stream (`GET /api/runs/{run_id}/stream`) serves here (always).
    pub sse: bool,
}

/// Runs one connection may follow at once; one more subscription is refused with an
/// [`FRAME_ERROR`] frame (`too_many_streams`).
pub const MAX_SUBSCRIPTIONS_PER_CONNECTION: usize = 16;
/// Largest client message the server reads, in bytes.
pub const MAX_CLIENT_MESSAGE_BYTES: usize = 4096;

/// The control frame answering a subscribe: `data` is a [`Subscribed`].
pub const FRAME_SUBSCRIBED: &str = "subscribed";
/// The control frame answering an unsubscribe: `data` is `{"run_id": …}`.
pub const FRAME_UNSUBSCRIBED: &str = "unsubscribed";
/// The control frame after a run's terminal event: `data` is a
/// [`crate::events::StreamEnd`].
pub const FRAME_DONE: &str = "done";
/// The control frame for a refused message or subscription: `data` is an
/// [`crate::ErrorBody`].
pub const FRAME_ERROR: &str = "error";
/// The answer to a ping: `data` is `{}`.
pub const FRAME_PONG: &str = "pong";

/// A message a client sends (one JSON text frame). API Gateway routes on `action`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum ClientMessage {
    /// Follow a run from the sequence after `after` (0 or absent: from the start).
    Subscribe {
        run_id: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<u64>,
    },
    /// Stop following a run.
    Unsubscribe { run_id: String },
    /// Ask for a `pong` frame (keeps idle intermediaries from closing the connection).
    Ping {},
}

/// A frame the server sends (one JSON text frame): an event (`id` set) or a control
/// frame (`id` absent; `event` one of the `FRAME_*` names).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Frame {
    /// The run the frame is about (absent only on a `pong` and on an `error` about a
    /// message that named no run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The event's sequence; absent on control frames.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u64>,
    /// The event's type, or the control frame's name.
    pub event: String,
    /// The event as replay serves it ([`crate::Event`]), or the control frame's body.
    pub data: Value,
}

/// `data` of a [`FRAME_SUBSCRIBED`] frame.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Subscribed {
    pub run_id: String,
    /// The sequence the backlog starts after.
    pub after: u64,
}

impl Frame {
    /// An event frame.
    pub fn event(event: &crate::Event) -> Self {
        Self {
            run_id: Some(event.run_id.clone()),
            id: Some(event.sequence),
            event: event.event_type.clone(),
            data: serde_json::to_value(event).unwrap_or(Value::Null),
        }
    }

    /// A control frame.
    pub fn control(name: &str, run_id: Option<&str>, data: Value) -> Self {
        Self {
            run_id: run_id.map(str::to_owned),
            id: None,
            event: name.to_owned(),
            data,
        }
    }

    /// Whether this is an event frame.
    pub fn is_event(&self) -> bool {
        self.id.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_read_as_documented() {
        let m: ClientMessage =
            serde_json::from_str(r#"{"action":"subscribe","run_id":"run-1","after":4}"#).unwrap();
        assert_eq!(
            m,
            ClientMessage::Subscribe {
                run_id: "run-1".into(),
                after: Some(4)
            }
        );
        let m: ClientMessage = serde_json::from_str(r#"{"action":"ping"}"#).unwrap();
        assert_eq!(m, ClientMessage::Ping {});
        assert!(serde_json::from_str::<ClientMessage>(r#"{"action":"subscribe"}"#).is_err());
        assert!(serde_json::from_str::<ClientMessage>(
            r#"{"action":"subscribe","run_id":"r","after":1,"x":1}"#
        )
        .is_err());
        assert!(serde_json::from_str::<ClientMessage>(r#"{"action":"nope"}"#).is_err());
    }

    #[test]
    fn control_frames_have_no_id() {
        let f = Frame::control(FRAME_DONE, Some("run-1"), serde_json::json!({}));
        let text = serde_json::to_string(&f).unwrap();
        assert!(!text.contains("\"id\""), "{text}");
        assert!(!f.is_event());
    }
}
