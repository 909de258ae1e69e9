//! Notification dead letters (`GET /api/notifications/dead-letters`, `POST
//! /api/notifications/dead-letters/{delivery_id}/retry`): deliveries to a sink (the
//! signed webhook, Slack) that were given up on.

use serde::{Deserialize, Serialize};

/// One delivery record as operators see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Delivery {
    /// Stable across retries: the `Tollgate-Delivery` header a webhook receiver saw.
    pub delivery_id: String,
    /// `webhook` or `slack`.
    pub sink: String,
    /// `armed` or `resolved`.
    pub kind: String,
    pub project: Option<String>,
    pub run_id: String,
    pub request_id: String,
    /// The sequence of the card event it announces.
    pub sequence: u64,
    /// `pending`, `sent` or `dead`.
    pub state: String,
    pub attempts: u32,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
    pub created_at: String,
    pub updated_at: String,
    /// When the next attempt is due (pending only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<String>,
}

/// `GET /api/notifications/dead-letters`: the project's dead letters, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct DeadLetters {
    pub dead_letters: Vec<Delivery>,
}
