//! The fanout (docs/architecture.md §9): a batch of the events table's DynamoDB Stream
//! records (`NEW_IMAGE`), each new event posted to its run's subscribers.

use std::collections::HashMap;

use aws_lambda_events::dynamodb::{Event, EventRecord};
use aws_lambda_events::streams::{DynamoDbBatchItemFailure, DynamoDbEventResponse};
use aws_sdk_dynamodb::types::AttributeValue;
use futures::StreamExt;
use tollgate_store::dynamo::{event_from_item, Connections};
use tollgate_store::page::TERMINAL_TYPES;
use tollgate_store::StoredEvent;

use super::post::{Posted, Poster};
use super::{done_frame, event_frame};

/// Subscribers posted to at once.
const CONCURRENT_POSTS: usize = 16;

/// The `fanout` function over the registry.
#[derive(Clone)]
pub struct Fanout {
    pub registry: Connections,
    pub poster: Poster,
    /// The `@connections` endpoint.
    pub endpoint: String,
}

/// A stream image's attributes as the SDK's attribute values: strings and numbers, all
/// an event item is read from (the decoding itself is the store's, `event_from_item`).
pub(crate) fn image_item(record: &EventRecord) -> HashMap<String, AttributeValue> {
    let Ok(serde_json::Value::Object(image)) = serde_json::to_value(&record.change.new_image)
    else {
        return HashMap::new();
    };
    image
        .into_iter()
        .filter_map(|(name, value)| {
            let value = match (value.get("S"), value.get("N")) {
                (Some(serde_json::Value::String(v)), _) => AttributeValue::S(v.clone()),
                (_, Some(serde_json::Value::String(v))) => AttributeValue::N(v.clone()),
                _ => return None,
            };
            Some((name, value))
        })
        .collect()
}

/// One run's new events in a batch, by sequence, with the stream positions they came
/// from (reported back if the run's subscribers cannot be read).
struct RunBatch {
    events: Vec<StoredEvent>,
    positions: Vec<String>,
}

impl Fanout {
    /// Handles one batch: new event items (`INSERT`; a `MODIFY`, a `REMOVE` and any item
    /// that is not an event are skipped) grouped by run and sorted by sequence; each
    /// run's subscribers read once, and every event posted to each of them in order,
    /// then `done` after a terminal event (and the subscription dropped). A post
    /// answered 410 removes the connection; any other failed post is logged and skipped
    /// (the client heals the gap by resubscribing). Only a registry failure is
    /// reported back (`batchItemFailures`, that run's records), so the batch is retried
    /// from there.
    pub async fn handle(&self, event: Event) -> DynamoDbEventResponse {
        let mut runs: Vec<(String, RunBatch)> = Vec::new();
        for record in &event.records {
            if record.event_name != "INSERT" {
                continue;
            }
            let item = image_item(record);
            let (run_id, stored) = match event_from_item(&item) {
                Ok(Some(found)) => found,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "stream record is not a readable event; skipped");
                    continue;
                }
            };
            let position = record.change.sequence_number.clone().unwrap_or_default();
            match runs.iter_mut().find(|(r, _)| *r == run_id) {
                Some((_, batch)) => {
                    batch.events.push(stored);
                    batch.positions.push(position);
                }
                None => runs.push((
                    run_id,
                    RunBatch {
                        events: vec![stored],
                        positions: vec![position],
                    },
                )),
            }
        }
        let mut failures = Vec::new();
        for (run_id, mut batch) in runs {
            batch.events.sort_by_key(|e| e.sequence);
            batch.events.dedup_by_key(|e| e.sequence);
            if let Err(e) = self.fan_out(&run_id, &batch.events).await {
                tracing::error!(run_id, error = %e, "fanout: registry unavailable; records reported for retry");
                failures.extend(batch.positions);
            }
        }
        let mut response = DynamoDbEventResponse::default();
        response.batch_item_failures = failures
            .into_iter()
            .map(|position| {
                let mut failure = DynamoDbBatchItemFailure::default();
                failure.item_identifier = Some(position);
                failure
            })
            .collect();
        response
    }

    /// Posts `events` (one run's, in order) to each of its subscribers.
    async fn fan_out(
        &self,
        run_id: &str,
        events: &[StoredEvent],
    ) -> Result<(), tollgate_store::StoreError> {
        let ends = events
            .iter()
            .any(|e| TERMINAL_TYPES.contains(&e.event_type.as_str()));
        let subscribers = self.registry.subscribers(run_id).await?;
        if subscribers.is_empty() {
            if ends {
                self.close_run_token_connections(run_id).await;
            }
            return Ok(());
        }
        let frames: Vec<String> = events
            .iter()
            .flat_map(|e| {
                let mut frames = vec![event_frame(run_id, e)];
                if TERMINAL_TYPES.contains(&e.event_type.as_str()) {
                    frames.push(done_frame(run_id, e.sequence));
                }
                frames
            })
            .collect();
        let results: Vec<Result<(), tollgate_store::StoreError>> =
            futures::stream::iter(subscribers)
                .map(|sub| {
                    let frames = &frames;
                    async move {
                        for frame in frames {
                            match self
                                .poster
                                .post(
                                    &self.endpoint,
                                    &sub.connection_id,
                                    frame.clone().into_bytes(),
                                )
                                .await
                            {
                                Posted::Sent | Posted::Failed => {}
                                Posted::Gone => {
                                    self.registry.remove_connection(&sub.connection_id).await?;
                                    return Ok(());
                                }
                            }
                        }
                        if ends {
                            // Nothing follows a terminal event: the subscription ends.
                            self.registry
                                .unsubscribe(&sub.connection_id, run_id)
                                .await?;
                        }
                        Ok(())
                    }
                })
                .buffer_unordered(CONCURRENT_POSTS)
                .collect()
                .await;
        // A registry write that failed after the posts (a gone connection's removal, an
        // ended subscription's) is left to the TTL: logged, not retried (a retry would
        // post every frame again).
        for r in results {
            if let Err(e) = r {
                tracing::warn!(run_id, error = %e, "fanout: registry cleanup failed; left to the TTL");
            }
        }
        if ends {
            self.close_run_token_connections(run_id).await;
        }
        Ok(())
    }

    /// After a run's terminal event (and its `done`, posted above): every connection
    /// opened with the run's token is closed and removed, so a dead token holds no
    /// place. A registry read or a close that fails is logged and left to the
    /// connection's expiry (retrying the batch would post every frame again).
    async fn close_run_token_connections(&self, run_id: &str) {
        let ids = match self.registry.run_token_connections(run_id).await {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(run_id, error = %e, "fanout: an ended run's token connections not found; left to their expiry");
                return;
            }
        };
        for connection_id in ids {
            if let Posted::Sent | Posted::Gone =
                self.poster.close(&self.endpoint, &connection_id).await
            {
                if let Err(e) = self.registry.remove_connection(&connection_id).await {
                    tracing::warn!(run_id, error = %e, "fanout: a closed connection's record left to the TTL");
                }
            }
        }
    }
}
