//! The SQS-triggered Lambda side of the timers (feature `lambda`).
//!
//! The event source mapping must have `FunctionResponseTypes: [ReportBatchItemFailures]`:
//! the answer lists the `messageId` of each record to retry, and only those go back to
//! the queue (a malformed one ends in the dead-letter queue after `maxReceiveCount`).

use std::convert::Infallible;
use std::sync::Arc;

use aws_lambda_events::event::sqs::{SqsBatchResponse, SqsEvent, SqsMessage};
use futures::StreamExt;
use lambda_runtime::{service_fn, LambdaEvent};

use crate::consumer::{handle_record, NotDone};
use crate::TimerHandler;

pub use crate::consumer::MAX_CONCURRENT_RECORDS;

/// Handles one SQS batch: each record's body parsed as a [`TimerMessage`] and given to
/// `handler`, up to [`MAX_CONCURRENT_RECORDS`] at once. A record whose body does not parse,
/// or whose handling fails (`Err` or a panic), is listed in `batchItemFailures` (in
/// record order); the others are acked.
///
/// A failing record without a `messageId` (never sent by SQS) is listed with an empty
/// identifier, which makes Lambda retry the whole batch: safe, as handlers are idempotent.
pub async fn handle_sqs_batch(handler: &dyn TimerHandler, event: SqsEvent) -> SqsBatchResponse {
    let failed: Vec<String> = futures::stream::iter(event.records)
        .map(|record| handle_lambda_record(handler, record))
        .buffered(MAX_CONCURRENT_RECORDS)
        .filter_map(|failed| async move { failed })
        .collect()
        .await;
    let mut response = SqsBatchResponse::default();
    response.set_failures(failed);
    response
}

/// `None` when the record is done, else the identifier to report as failed. The
/// decoding and handling are [`handle_record`]'s, as in [`SqsConsumer`](crate::SqsConsumer).
async fn handle_lambda_record(handler: &dyn TimerHandler, record: SqsMessage) -> Option<String> {
    let message_id = record.message_id.unwrap_or_default();
    let receive_count = record
        .attributes
        .get("ApproximateReceiveCount")
        .map(String::as_str)
        .unwrap_or("");
    let body = record.body.as_deref().unwrap_or("");
    match handle_record(handler, &message_id, receive_count, body).await {
        Ok(()) => None,
        Err(NotDone::Malformed) => Some(message_id),
        Err(NotDone::Failed) => {
            if message_id.is_empty() {
                tracing::error!(
                    "timer record without a messageId failed; the whole batch is retried"
                );
            }
            Some(message_id)
        }
    }
}

/// A whole `timers` function after its one-time wiring (telemetry, configuration, the
/// handler with its store and [`SqsTimers`](crate::SqsTimers)): SQS batches from the
/// Lambda Runtime API through [`handle_sqs_batch`]. Returns only if the runtime fails.
pub async fn run_sqs_function(handler: Arc<dyn TimerHandler>) -> Result<(), lambda_runtime::Error> {
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| {
        let handler = Arc::clone(&handler);
        async move { Ok::<_, Infallible>(handle_sqs_batch(handler.as_ref(), event.payload).await) }
    }))
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TimerError, TimerMessage};
    use std::sync::Mutex;

    const FIXTURE: &str = include_str!(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/sqs/timer-batch-one-malformed.json"
    ));
    const MALFORMED_ID: &str = "5a1c9e0b-7d2f-4c83-9e61-2b7f0d4a8c13";

    /// Records what it handles; fails (or panics on) the messages of one `request_id`.
    #[derive(Default)]
    struct Handler {
        seen: Mutex<Vec<TimerMessage>>,
        fail_request: Option<&'static str>,
        panic_instead: bool,
    }

    #[async_trait::async_trait]
    impl TimerHandler for Handler {
        async fn handle(&self, message: TimerMessage) -> Result<(), TimerError> {
            self.seen.lock().unwrap().push(message.clone());
            if self.fail_request == Some(message.request_id()) {
                if self.panic_instead {
                    panic!("handler panics on purpose");
                }
                return Err(TimerError::Unavailable("store is down".into()));
            }
            Ok(())
        }
    }

    fn fixture() -> SqsEvent {
        serde_json::from_str(FIXTURE).expect("the fixture is an SqsEvent")
    }

    fn failed_ids(response: &SqsBatchResponse) -> Vec<&str> {
        response
            .batch_item_failures
            .iter()
            .map(|f| f.item_identifier.as_str())
            .collect()
    }

    #[tokio::test]
    async fn only_the_malformed_record_of_the_fixture_is_retried() {
        // GIVEN the fixture batch (3 records, the second truncated) and a handler that succeeds
        let handler = Handler::default();

        // WHEN it is handled
        let response = handle_sqs_batch(&handler, fixture()).await;

        // THEN exactly the malformed record is reported, and the others were handled
        assert_eq!(failed_ids(&response), [MALFORMED_ID]);
        let json = serde_json::to_value(&response).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"batchItemFailures": [{"itemIdentifier": MALFORMED_ID}]})
        );
        let mut seen = handler.seen.lock().unwrap().clone();
        seen.sort_by(|a, b| a.run_id().cmp(b.run_id()));
        assert_eq!(
            seen,
            [
                TimerMessage::ApprovalExpiry {
                    run_id: "run-timer-fixture-1".into(),
                    request_id: "appr-7f3c21".into(),
                    due_at_millis: 1_795_989_600_000,
                },
                TimerMessage::ApprovalHeartbeat {
                    run_id: "run-timer-fixture-3".into(),
                    request_id: "appr-9b1e04".into(),
                    beat: 2,
                },
            ]
        );
    }

    #[test]
    fn the_fixture_bodies_are_what_sqs_timers_sends() {
        let event = fixture();
        for record in &event.records {
            let body = record.body.as_deref().unwrap();
            let Ok(message) = serde_json::from_str::<TimerMessage>(body) else {
                assert_eq!(record.message_id.as_deref(), Some(MALFORMED_ID));
                continue;
            };
            assert_eq!(serde_json::to_string(&message).unwrap(), body);
            let kind = &record.message_attributes["timer_kind"];
            assert_eq!(kind.string_value.as_deref(), Some(message.kind()));
        }
    }

    #[tokio::test]
    async fn a_failing_or_panicking_handler_fails_only_its_record() {
        for panic_instead in [false, true] {
            let handler = Handler {
                fail_request: Some("appr-9b1e04"),
                panic_instead,
                ..Handler::default()
            };
            let response = handle_sqs_batch(&handler, fixture()).await;
            assert_eq!(
                failed_ids(&response),
                [MALFORMED_ID, "c83d5f12-96a4-4b0e-8f7d-1e2a9b6c4d05"],
                "panic_instead: {panic_instead}"
            );
        }
    }

    #[tokio::test]
    async fn an_empty_batch_fails_nothing() {
        let handler = Handler::default();
        let response = handle_sqs_batch(&handler, SqsEvent::default()).await;
        assert!(response.batch_item_failures.is_empty());
        assert_eq!(
            serde_json::to_value(&response).unwrap(),
            serde_json::json!({"batchItemFailures": []})
        );
    }
}
