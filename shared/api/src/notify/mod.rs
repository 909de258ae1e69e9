//! Notifications: card events of the events log turned into deliveries to *sinks* — a
//! signed webhook, Slack — each delivered once per (sink, card, kind) with retries and
//! dead letters (docs/architecture.md §10).
//!
//! This module is the interface every sink implements ([`Sink`]) and what it is given
//! ([`CardNotice`]); the bookkeeping (claiming a delivery before sending it, retries,
//! dead letters, the per-card memo) is the notifier's, never a sink's.

use std::fmt;

/// What caused a notice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NoticeKind {
    /// `tool.approval_required`: a card was armed.
    Armed,
    /// `tool.approval_resolved`: a card was approved, denied or expired.
    Resolved,
}

impl NoticeKind {
    /// The name used in delivery records and on the wire (`armed`, `resolved`).
    pub fn as_str(self) -> &'static str {
        match self {
            NoticeKind::Armed => "armed",
            NoticeKind::Resolved => "resolved",
        }
    }

    /// The kind named by [`NoticeKind::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "armed" => Some(NoticeKind::Armed),
            "resolved" => Some(NoticeKind::Resolved),
            _ => None,
        }
    }
}

impl fmt::Display for NoticeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The project a notice and its delivery records name for a run of no project.
pub const NO_PROJECT: &str = "-";

/// One card event, as a sink sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct CardNotice {
    pub kind: NoticeKind,
    /// The run's project (the tenant).
    pub project: String,
    pub run_id: String,
    /// The card.
    pub request_id: String,
    /// The sequence of the event that caused the notice.
    pub sequence: u64,
    /// The card as `GET /api/runs/{run_id}/approvals` shows it, after the event.
    pub card: tollgate_protocol::approvals::Card,
    /// The run's `channel_id`.
    pub channel_id: Option<String>,
    /// The run's owner.
    pub owner: Option<String>,
    /// When what the event announces happened (ms): the card's arm for an Armed notice,
    /// its resolution for a Resolved one.
    pub at: i64,
    /// Whether the card could still be decided when the notice was made: pending, and
    /// not past its deadline.
    pub open: bool,
}

/// Why a delivery failed. The text never contains a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryError {
    /// Worth trying again later (a timeout, 5xx).
    Retry(String),
    /// Worth trying again, not before this long from now (the receiver's `Retry-After`).
    RetryAfter(String, std::time::Duration),
    /// The receiver is limiting how fast this sender posts (HTTP 429, Slack's
    /// `ratelimited`): not this delivery's failure. The sink is paused for this long (the
    /// receiver's `Retry-After`, else a second), and the attempt is not counted towards
    /// the dead letter (docs/architecture.md §10).
    Throttled(String, std::time::Duration),
    /// Will never succeed as configured (another 4xx): dead-lettered at once.
    Permanent(String),
}

impl fmt::Display for DeliveryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeliveryError::Retry(m) => write!(f, "retryable: {m}"),
            DeliveryError::RetryAfter(m, after) => {
                write!(f, "retryable after {} s: {m}", after.as_secs())
            }
            DeliveryError::Throttled(m, after) => {
                write!(f, "rate limited for {} s: {m}", after.as_secs())
            }
            DeliveryError::Permanent(m) => write!(f, "permanent: {m}"),
        }
    }
}

impl std::error::Error for DeliveryError {}

/// A receiver's `Retry-After`, in seconds (the HTTP-date form is not taken), at most an
/// hour: a retry is put off no sooner than the receiver asked.
pub(crate) fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<std::time::Duration> {
    retry_after_seconds(headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?)
        .map(std::time::Duration::from_secs)
}

/// How long a sink is paused after a [`DeliveryError::Throttled`] that named no time.
pub const THROTTLE_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);

/// [`retry_after`]'s value: whole seconds (digits only; too many for a `u64` is as many
/// as can be), at most an hour; anything else is not taken.
fn retry_after_seconds(value: &str) -> Option<u64> {
    let digits = value.trim();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(digits.parse::<u64>().unwrap_or(u64::MAX).min(3600))
}

#[cfg(test)]
mod tests {
    use super::retry_after_seconds;

    #[test]
    fn retry_after_takes_whole_seconds_up_to_an_hour() {
        for (value, taken) in [
            ("3", Some(3)),
            (" 120 ", Some(120)),
            ("0", Some(0)),
            ("3600", Some(3600)),
            ("3601", Some(3600)),
            ("99999999999999999999999", Some(3600)),
            ("", None),
            ("-5", None),
            ("+5", None),
            ("1.5", None),
            ("5s", None),
            ("Wed, 21 Oct 2015 07:28:00 GMT", None),
        ] {
            assert_eq!(retry_after_seconds(value), taken, "{value:?}");
        }
    }
}

/// Where notices go.
#[async_trait::async_trait]
pub trait Sink: Send + Sync {
    /// Stable name, part of the delivery record's key (`webhook`, `slack`).
    fn name(&self) -> &'static str;
    /// Whether this sink delivers this notice at all.
    fn wants(&self, notice: &CardNotice) -> bool;
    /// Delivers one notice. `memo` is what this sink returned for an earlier notice of the
    /// same card (e.g. the message an Armed notice posted, so Resolved can update it).
    /// `Ok(Some(memo))` replaces the card's memo for this sink.
    async fn deliver(
        &self,
        notice: &CardNotice,
        memo: Option<&str>,
    ) -> Result<Option<String>, DeliveryError>;
}

pub mod feed;
#[cfg(feature = "push")]
pub mod lambda;
pub mod notifier;
pub mod routes;
pub mod webhook;

pub use notifier::{Notifier, RetryPolicy, CARD_EVENT_TYPES};
pub use webhook::WebhookSink;

/// The delivery record's key of `notice` for the sink named `sink`.
pub fn delivery_key(notice: &CardNotice, sink: &str) -> tollgate_store::DeliveryKey {
    delivery_key_of(notice, sink, notice.kind)
}

/// The delivery record's key of `notice`'s card for `kind`.
pub fn delivery_key_of(
    notice: &CardNotice,
    sink: &str,
    kind: NoticeKind,
) -> tollgate_store::DeliveryKey {
    tollgate_store::DeliveryKey {
        sink: sink.to_owned(),
        project: notice.project.clone(),
        run_id: notice.run_id.clone(),
        request_id: notice.request_id.clone(),
        kind: kind.as_str().to_owned(),
    }
}

/// The sinks `tollgate serve` and the `notifier` function build from their environment
/// (`TOLLGATE_WEBHOOK_URL`, …), and the Slack sink when `slack` (the bot token's Web API
/// client) is configured (`serve`: `Slack::from_env`; the function:
/// `SlackClient::from_secrets_manager_env`, the bot token only);
/// a bad configuration fails start-up.
pub async fn sinks_from_env(
    slack: Option<crate::slack::SlackClient>,
) -> Result<Vec<std::sync::Arc<dyn Sink>>, crate::ConfigError> {
    let mut sinks: Vec<std::sync::Arc<dyn Sink>> = Vec::new();
    if let Some(webhook) = WebhookSink::from_env().await? {
        sinks.push(std::sync::Arc::new(webhook));
    }
    if let Some(slack) = slack {
        sinks.push(std::sync::Arc::new(crate::slack::SlackSink::new(slack)));
    }
    Ok(sinks)
}
