//! The timer port: "deliver this message to the timer handler after about this delay".
//!
//! The approval gate uses it for server-side expiry of approval cards, the
//! `tool.approval_pending` heartbeats and (later) settlement deadlines. Two adapters:
//!
//! - [`EmbeddedTimers`]: an in-process delayed queue on tokio, for `tollgate serve` and
//!   tests. Any delay, retries a failed delivery a bounded number of times.
//! - [`SqsTimers`]: SQS delayed messages, for AWS. SQS caps a delay at 15 minutes
//!   ([`MAX_SQS_DELAY`]); a message can therefore arrive before the moment it stands for,
//!   and the handler re-schedules the remainder (see [`TimerMessage::remaining_delay`]).
//!
//! and the consumer side of SQS: [`lambda::handle_sqs_batch`] (feature `lambda`), which
//! a `timers` function runs under the Lambda runtime, and [`SqsConsumer`], a long-poll
//! loop in this process (`tollgate serve --backend aws`). Both decode and hand over each
//! record the same way.
//!
//! Delivery is at least once on every adapter: a [`TimerHandler`] must be idempotent (the
//! approval transitions are: a repeated one fails its condition, docs/architecture.md §1).

use std::time::Duration;

mod consumer;
mod embedded;
#[cfg(feature = "lambda")]
pub mod lambda;
mod sqs;

pub use consumer::{
    sqs_poll_client, ConsumerOptions, SqsConsumer, MAX_CONCURRENT_RECORDS, MAX_WAIT,
};
pub use embedded::{EmbeddedTimers, RetryPolicy, TimerLoop};
pub use sqs::{delay_seconds, ensure_queue, sqs_client, SqsTimers, MAX_SQS_DELAY};

/// One timer; serialized as the SQS message body (JSON, `kind` tag, snake_case).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TimerMessage {
    /// Expire the approval card `request_id` of `run_id` when `due_at_millis` has passed.
    ApprovalExpiry {
        run_id: String,
        request_id: String,
        due_at_millis: i64,
    },
    /// Emit one `tool.approval_pending` heartbeat for the card if it is still pending.
    ApprovalHeartbeat {
        run_id: String,
        request_id: String,
        /// The heartbeat's number (1, 2, …), the next one scheduled with `beat + 1`. A
        /// redelivered message carries the same number, which keeps the heartbeat
        /// idempotent: the store writes beat `n` of a card once.
        beat: u32,
    },
    /// Announce the revocation of policy `policy_id` on the streams it reached, if it is
    /// revoked (a backstop sent before the revocation: if the revoking call stops after
    /// revoking, this completes its announcements; if it never revoked, it does nothing).
    PolicyRevocation { policy_id: String },
    /// Settle the mutation attempt `(tool_call_id, approval_id)` of `run_id` at its
    /// settlement deadline `due_at_millis`, if nobody settled it before: an undispatched
    /// intent as `not_executed` (unsent), a dispatched one as `outcome_unknown`.
    SettlementDeadline {
        run_id: String,
        tool_call_id: String,
        approval_id: String,
        due_at_millis: i64,
    },
    /// Emit execution heartbeat number `beat` for the attempt if it is still dispatched
    /// and unsettled (the next one is scheduled with `beat + 1`; a redelivery carries the
    /// same number and writes nothing new).
    ExecutionHeartbeat {
        run_id: String,
        tool_call_id: String,
        approval_id: String,
        beat: u32,
    },
}

impl TimerMessage {
    /// The `kind` tag of the message body (also sent as the `timer_kind` SQS attribute).
    pub fn kind(&self) -> &'static str {
        match self {
            TimerMessage::ApprovalExpiry { .. } => "approval_expiry",
            TimerMessage::ApprovalHeartbeat { .. } => "approval_heartbeat",
            TimerMessage::PolicyRevocation { .. } => "policy_revocation",
            TimerMessage::SettlementDeadline { .. } => "settlement_deadline",
            TimerMessage::ExecutionHeartbeat { .. } => "execution_heartbeat",
        }
    }

    /// The run the timer is about (empty for a policy's).
    pub fn run_id(&self) -> &str {
        match self {
            TimerMessage::ApprovalExpiry { run_id, .. }
            | TimerMessage::ApprovalHeartbeat { run_id, .. }
            | TimerMessage::SettlementDeadline { run_id, .. }
            | TimerMessage::ExecutionHeartbeat { run_id, .. } => run_id,
            TimerMessage::PolicyRevocation { .. } => "",
        }
    }

    /// The card the timer is about (the policy id for a policy's, the approval id for a
    /// mutation attempt's).
    pub fn request_id(&self) -> &str {
        match self {
            TimerMessage::ApprovalExpiry { request_id, .. }
            | TimerMessage::ApprovalHeartbeat { request_id, .. } => request_id,
            TimerMessage::PolicyRevocation { policy_id } => policy_id,
            TimerMessage::SettlementDeadline { approval_id, .. }
            | TimerMessage::ExecutionHeartbeat { approval_id, .. } => approval_id,
        }
    }

    /// How long until the moment this message stands for, if it has not come yet at
    /// `now_millis` (Unix epoch milliseconds); `None` when it is due.
    ///
    /// SQS delivers a message after at most 15 minutes, so an expiry further away arrives
    /// early: the handler then schedules the same message again with this delay (and
    /// acks) instead of expiring the card. A heartbeat is always due when it arrives.
    pub fn remaining_delay(&self, now_millis: i64) -> Option<Duration> {
        match self {
            TimerMessage::ApprovalExpiry { due_at_millis, .. }
            | TimerMessage::SettlementDeadline { due_at_millis, .. }
                if *due_at_millis > now_millis =>
            {
                let millis = due_at_millis.saturating_sub(now_millis);
                Some(Duration::from_millis(
                    u64::try_from(millis).unwrap_or(u64::MAX),
                ))
            }
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TimerError {
    /// The queue (or what the handler needs) could not be reached; retry later. The text
    /// names the operation and an error code, never the queue URL (that is only logged).
    #[error("timer queue unavailable: {0}")]
    Unavailable(String),
}

/// The port: deliver `message` to the timer handler after about `delay`.
///
/// "About": never before `delay` on [`EmbeddedTimers`]; on [`SqsTimers`] after
/// `min(delay, 15 min)` rounded up to whole seconds (the handler re-schedules the rest).
#[async_trait::async_trait]
pub trait TimerQueue: Send + Sync + 'static {
    async fn schedule(&self, message: &TimerMessage, delay: Duration) -> Result<(), TimerError>;
}

/// What consumes timers (the approval use-cases implement it). `Ok` = done (ack);
/// `Err` = retry later (the message is redelivered). Must be idempotent: SQS delivers at least once.
#[async_trait::async_trait]
pub trait TimerHandler: Send + Sync + 'static {
    async fn handle(&self, message: TimerMessage) -> Result<(), TimerError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expiry(due_at_millis: i64) -> TimerMessage {
        TimerMessage::ApprovalExpiry {
            run_id: "run-1".into(),
            request_id: "req-1".into(),
            due_at_millis,
        }
    }

    #[test]
    fn messages_serialize_with_a_snake_case_kind_tag() {
        assert_eq!(
            serde_json::to_string(&expiry(1_795_989_600_000)).unwrap(),
            r#"{"kind":"approval_expiry","run_id":"run-1","request_id":"req-1","due_at_millis":1795989600000}"#
        );
        let beat = TimerMessage::ApprovalHeartbeat {
            run_id: "run-1".into(),
            request_id: "req-1".into(),
            beat: 3,
        };
        let json = serde_json::to_string(&beat).unwrap();
        assert_eq!(
            json,
            r#"{"kind":"approval_heartbeat","run_id":"run-1","request_id":"req-1","beat":3}"#
        );
        assert_eq!(serde_json::from_str::<TimerMessage>(&json).unwrap(), beat);
        assert_eq!(beat.kind(), "approval_heartbeat");
        assert_eq!(expiry(0).kind(), "approval_expiry");
    }

    #[test]
    fn unknown_kinds_and_missing_fields_do_not_parse() {
        for body in [
            r#"{"kind":"heartbeat_check","run_id":"r","request_id":"q","beat":1}"#,
            r#"{"kind":"approval_heartbeat","run_id":"r","request_id":"q"}"#,
            r#"{"kind":"approval_heartbeat","run_id":"r","request_id":"q","beat":-1}"#,
            r#"{"kind":"approval_expiry","run_id":"r","request_id":"q"}"#,
            r#"{"run_id":"r","request_id":"q"}"#,
            "",
        ] {
            assert!(
                serde_json::from_str::<TimerMessage>(body).is_err(),
                "{body}"
            );
        }
    }

    #[test]
    fn remaining_delay_is_only_for_an_expiry_still_ahead() {
        assert_eq!(
            expiry(10_000).remaining_delay(4_000),
            Some(Duration::from_secs(6))
        );
        assert_eq!(expiry(10_000).remaining_delay(10_000), None);
        assert_eq!(expiry(10_000).remaining_delay(20_000), None);
        let beat = TimerMessage::ApprovalHeartbeat {
            run_id: "r".into(),
            request_id: "q".into(),
            beat: 1,
        };
        assert_eq!(beat.remaining_delay(0), None);
        let deadline = TimerMessage::SettlementDeadline {
            run_id: "r".into(),
            tool_call_id: "t".into(),
            approval_id: "a".into(),
            due_at_millis: 10_000,
        };
        assert_eq!(
            deadline.remaining_delay(9_000),
            Some(Duration::from_secs(1))
        );
        assert_eq!(deadline.remaining_delay(10_000), None);
    }

    #[test]
    fn execution_timers_round_trip() {
        for message in [
            TimerMessage::SettlementDeadline {
                run_id: "run-1".into(),
                tool_call_id: "write-1".into(),
                approval_id: "approval-1".into(),
                due_at_millis: 1_795_989_600_000,
            },
            TimerMessage::ExecutionHeartbeat {
                run_id: "run-1".into(),
                tool_call_id: "write-1".into(),
                approval_id: "approval-1".into(),
                beat: 2,
            },
        ] {
            let json = serde_json::to_string(&message).unwrap();
            assert!(
                json.starts_with(&format!(r#"{{"kind":"{}""#, message.kind())),
                "{json}"
            );
            assert_eq!(
                serde_json::from_str::<TimerMessage>(&json).unwrap(),
                message
            );
            assert_eq!(
                (message.run_id(), message.request_id()),
                ("run-1", "approval-1")
            );
        }
    }
}
