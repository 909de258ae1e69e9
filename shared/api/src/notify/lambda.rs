//! The `notifier` function (docs/architecture.md §10): invoked by the events table's
//! stream (an event source mapping filtered to the two card event types) and by a
//! schedule (every minute: the retry pass, [`Notifier::retry_due`]).
//!
//! A stream record whose handling failed on the store is reported back
//! (`ReportBatchItemFailures`): the batch is retried from it, bisected, and after bounded
//! retries sent to the dead-letter queue. A redelivered record finds its delivery record
//! and sends nothing.

use std::sync::Arc;

use aws_lambda_events::dynamodb::Event;
use aws_lambda_events::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::{json, Value};
use tollgate_store::dynamo::{event_from_item, DynamoStore, Tables};

use super::{Notifier, RetryPolicy};

/// One stream batch: its card events handed to the notifier in order, up to the first
/// that could not be handled, whose position is reported back.
pub async fn handle_stream(notifier: &Notifier, event: Event) -> DynamoDbEventResponse {
    let mut response = DynamoDbEventResponse::default();
    for record in &event.records {
        if record.event_name != "INSERT" {
            continue;
        }
        let item = crate::push::fanout::image_item(record);
        let (run_id, stored) = match event_from_item(&item) {
            Ok(Some(found)) => found,
            Ok(None) => continue,
            Err(e) => {
                // Retrying cannot mend it; skipping it must not be silent.
                tracing::error!(
                    sequence_number = record.change.sequence_number.as_deref().unwrap_or(""),
                    error = %e,
                    "notifier: a stream record is not an event this version reads; skipped"
                );
                continue;
            }
        };
        if let Err(e) = notifier.on_event(&run_id, &stored).await {
            tracing::error!(run_id, error = %e, "notifier: a card event was not handled; reported for retry");
            // Stop here: Lambda retries the batch from this record, so a card's resolution
            // is never handled before its arm that failed.
            let mut failure = DynamoDbBatchItemFailure::default();
            failure.item_identifier = record.change.sequence_number.clone();
            response.batch_item_failures.push(failure);
            break;
        }
    }
    response
}

/// One invocation: a stream batch (it has `Records`) or a scheduled tick (anything else).
pub async fn handle(notifier: &Notifier, payload: Value) -> Result<Value, Error> {
    if payload.get("Records").is_some() {
        let event: Event = serde_json::from_value(payload)?;
        return Ok(serde_json::to_value(handle_stream(notifier, event).await)?);
    }
    let retried = notifier.retry_due().await?;
    tracing::info!(retried, "notifier: retry pass");
    Ok(json!({ "retried": retried }))
}

/// The whole `notifier` function: JSON logs, the store (its tables from the
/// environment), the sinks from the environment (`TOLLGATE_WEBHOOK_URL`,
/// `TOLLGATE_WEBHOOK_SECRET_ARN`), then invocations from the Runtime API.
pub async fn run_notifier(function: &crate::functions::Function) -> Result<(), Error> {
    crate::telemetry::init(true);
    let started = async {
        let slack = crate::slack::SlackClient::from_secrets_manager_env().await?;
        let sinks = super::sinks_from_env(slack).await?;
        let policy = RetryPolicy::from_env()?;
        Ok::<_, crate::ConfigError>((sinks, policy))
    }
    .await;
    let (sinks, policy) = started.inspect_err(
        |e| tracing::error!(function = function.name, error = %e, "start-up failed"),
    )?;
    let sdk = tollgate_store::dynamo::sdk_config().await;
    let store = DynamoStore::new(tollgate_store::dynamo::client(&sdk), Tables::from_env());
    let notifier = Notifier::new(Arc::new(store), sinks).with_policy(policy);
    // Each sink's first enabling, recorded at the first cold start (the schedule's tick
    // starts one within minutes of a deploy); failing here, the first card event does it.
    if let Err(e) = notifier.enable_sinks().await {
        tracing::warn!(error = %e, "notifier: the sinks' first enabling was not recorded at start-up");
    }
    let notifier = &notifier;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<Value>| async move {
        handle(notifier, event.payload).await
    }))
    .await
}
