//! What feeds the notifier in `tollgate serve` (docs/architecture.md §10): on the
//! embedded store, its write signal; on DynamoDB, this process's reader of the events
//! table's stream. Both also run the retry pass ([`Notifier::retry_due`]) on a tick.
//! Deployed, the `notifier` function is fed by the stream's event source mapping and a
//! schedule drives the retries ([`super::lambda`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tollgate_store::memory::MemoryStore;

use super::{Notifier, CARD_EVENT_TYPES};

/// How often due retries are looked for: the first retry's delay, at least 100 ms and
/// at most a second.
fn retry_tick(notifier: &Notifier) -> Duration {
    notifier
        .policy()
        .base_delay
        .clamp(Duration::from_millis(100), Duration::from_secs(1))
}

async fn retry_pass(notifier: &Notifier) {
    if let Err(e) = notifier.retry_due().await {
        tracing::warn!(error = %e, "notifications: the retry pass failed; trying again");
    }
}

/// The embedded store's feed: every write wakes it, and it hands the card events
/// appended since to the notifier; due retries on a tick. Runs until aborted.
pub fn spawn_embedded(
    notifier: Arc<Notifier>,
    store: Arc<MemoryStore>,
) -> tokio::task::JoinHandle<()> {
    use tollgate_store::RunStore;
    tokio::spawn(async move {
        let Some(mut appended) = store.appended() else {
            return;
        };
        let mut seen: HashMap<String, u64> = HashMap::new();
        let tick = retry_tick(&notifier);
        loop {
            for (run_id, event) in store.events_since(&CARD_EVENT_TYPES, &mut seen) {
                if let Err(e) = notifier.on_event(&run_id, &event).await {
                    tracing::warn!(error = %e, run_id, "notifications: a card event was not handled");
                }
            }
            retry_pass(&notifier).await;
            tokio::select! {
                changed = appended.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
                _ = tokio::time::sleep(tick) => {}
            }
        }
    })
}

/// Due retries only, on a tick (a process whose events reach the notifier elsewhere).
pub fn spawn_retries(notifier: Arc<Notifier>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let tick = retry_tick(&notifier);
        loop {
            retry_pass(&notifier).await;
            tokio::time::sleep(tick).await;
        }
    })
}

/// `tollgate serve --backend aws`: reads the events table's stream from its oldest
/// record (the last 24 hours: what a restart missed is seen again, and the delivery
/// records make it a no-op when it was handled) and hands each new card event to the
/// notifier; a record whose handling failed is handed again before the shard moves on.
/// Due retries on a tick. Several processes may do this on the same tables: the
/// delivery records decide who sends. Runs until aborted.
#[cfg(feature = "ws")]
pub fn spawn_stream(
    notifier: Arc<Notifier>,
    sdk: &aws_config::SdkConfig,
    events_table: String,
) -> tokio::task::JoinHandle<()> {
    let dynamo = tollgate_store::dynamo::client(sdk);
    let streams = crate::stream_reader::client(sdk);
    let retries = spawn_retries(notifier.clone());
    tokio::spawn(async move {
        let _retries = crate::AbortOnDrop(retries);
        loop {
            if let Err(e) = read_stream(&notifier, &dynamo, &streams, &events_table).await {
                tracing::warn!(error = %e, "notifications: the stream reader failed; starting again");
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    })
}

#[cfg(feature = "ws")]
async fn read_stream(
    notifier: &Notifier,
    dynamo: &aws_sdk_dynamodb::Client,
    streams: &aws_sdk_dynamodbstreams::Client,
    table: &str,
) -> Result<(), String> {
    use crate::stream_reader::{read_new_shards, stream_arn};
    use std::collections::HashSet;

    let arn = stream_arn(dynamo, table).await?;
    let mut known: HashSet<String> = HashSet::new();
    let mut iterators: HashMap<String, String> = HashMap::new();
    let mut refreshed: Option<tokio::time::Instant> = None;
    loop {
        if refreshed.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
            refreshed = Some(tokio::time::Instant::now());
            read_new_shards(streams, &arn, &mut known, &mut iterators).await?;
        }
        let mut any = false;
        let ids: Vec<String> = iterators.keys().cloned().collect();
        for id in ids {
            let Some(it) = iterators.remove(&id) else {
                continue;
            };
            let out = streams
                .get_records()
                .shard_iterator(it)
                .limit(1000)
                .send()
                .await
                .map_err(|e| {
                    format!(
                        "get records: {}",
                        aws_sdk_dynamodbstreams::error::DisplayErrorContext(e)
                    )
                })?;
            for record in out.records() {
                if record.event_name().map(|n| n.as_str()) != Some("INSERT") {
                    continue;
                }
                let Some(image) = record.dynamodb().and_then(|r| r.new_image()) else {
                    continue;
                };
                let item = image_item(image);
                let Ok(Some((run_id, event))) = tollgate_store::dynamo::event_from_item(&item)
                else {
                    continue;
                };
                if !CARD_EVENT_TYPES.contains(&event.event_type.as_str()) {
                    continue;
                }
                any = true;
                // Handed again until it is handled: a store failure must not lose it.
                let mut wait = Duration::from_millis(200);
                while let Err(e) = notifier.on_event(&run_id, &event).await {
                    tracing::warn!(error = %e, run_id, "notifications: a card event was not handled; again");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(10));
                }
            }
            any |= !out.records().is_empty();
            if let Some(next) = out.next_shard_iterator() {
                iterators.insert(id, next.to_owned());
            }
        }
        if !any {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// A stream image as the DynamoDB SDK's attribute values (strings and numbers: all an
/// event item is read from, by the store's own decoder).
#[cfg(feature = "ws")]
fn image_item(
    image: &HashMap<String, aws_sdk_dynamodbstreams::types::AttributeValue>,
) -> HashMap<String, aws_sdk_dynamodb::types::AttributeValue> {
    use aws_sdk_dynamodb::types::AttributeValue as Av;
    use aws_sdk_dynamodbstreams::types::AttributeValue as Sv;
    image
        .iter()
        .filter_map(|(k, v)| match v {
            Sv::S(s) => Some((k.clone(), Av::S(s.clone()))),
            Sv::N(n) => Some((k.clone(), Av::N(n.clone()))),
            _ => None,
        })
        .collect()
}
