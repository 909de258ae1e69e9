//! One DynamoDB Streams reader per `tollgate serve --backend aws` process
//! (docs/architecture.md §5): it reads the events table's stream (`NEW_IMAGE`, as the
//! deployed WebSocket fan-out does) and wakes this process's live tails of each run a
//! new event item names ([`Wakes::wake`]). So a subscriber on one process sees events
//! another process (or a Lambda function) appended, and an idle watcher costs no polling.
//!
//! A record only wakes: the tail then reads the gap-safe page from the store. A record
//! lost or late delays an event (until the tail's safety poll), never skips one. When
//! the reader fails it logs it, waits, starts again from the stream's newest records and,
//! once reading, wakes every followed run (records of the gap may be lost); a shard
//! whose iterator lapsed (trimmed records, an expired iterator) is read anew the same
//! way without stopping the others.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use aws_sdk_dynamodbstreams::Client;

use crate::live::Wakes;

/// Pause between reads while the stream has nothing new.
const IDLE_READ: Duration = Duration::from_millis(250);
/// How often the shard list is read again (shards split and close over time).
const SHARD_REFRESH: Duration = Duration::from_secs(10);
/// Wait before starting again after a failure.
const RETRY_AFTER: Duration = Duration::from_secs(2);

/// The streams client: its endpoint is `AWS_ENDPOINT_URL_DYNAMODB_STREAMS` or
/// `AWS_ENDPOINT_URL` as the SDK reads them, else the DynamoDB endpoint when one is set
/// (DynamoDB Local serves both on one port).
pub fn client(sdk: &aws_config::SdkConfig) -> Client {
    let mut conf = aws_sdk_dynamodbstreams::config::Builder::from(sdk).timeout_config(
        aws_config::timeout::TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(2))
            .operation_timeout(Duration::from_secs(10))
            .build(),
    );
    let set = |v: &str| std::env::var(v).ok().filter(|v| !v.is_empty());
    if set("AWS_ENDPOINT_URL_DYNAMODB_STREAMS").is_none() && set("AWS_ENDPOINT_URL").is_none() {
        if let Some(ddb) = set("AWS_ENDPOINT_URL_DYNAMODB") {
            conf = conf.endpoint_url(ddb);
        }
    }
    Client::from_conf(conf.build())
}

/// Starts the reader of `events_table`'s stream; it runs until the handle is dropped
/// (aborted).
pub fn spawn(
    sdk: &aws_config::SdkConfig,
    events_table: String,
    wakes: Arc<Wakes>,
) -> tokio::task::JoinHandle<()> {
    let dynamo = tollgate_store::dynamo::client(sdk);
    let streams = client(sdk);
    tokio::spawn(async move {
        loop {
            match read(&dynamo, &streams, &events_table, &wakes).await {
                Ok(()) => {}
                Err(e) => {
                    wakes.set_failure(e.clone());
                    tracing::warn!(
                        error = %e,
                        "live delivery: the DynamoDB Streams reader failed; live tails fall back to \
                         their safety poll (every {} s) until it is back",
                        wakes.safety_poll().as_secs()
                    )
                }
            }
            tokio::time::sleep(RETRY_AFTER).await;
        }
    })
}

pub(crate) async fn stream_arn(
    dynamo: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Result<String, String> {
    let out = dynamo
        .describe_table()
        .table_name(table)
        .send()
        .await
        .map_err(|e| {
            format!(
                "describe {table}: {}",
                aws_sdk_dynamodb::error::DisplayErrorContext(e)
            )
        })?;
    out.table.and_then(|t| t.latest_stream_arn).ok_or_else(|| {
        format!(
            "{table} has no stream (StreamSpecification NEW_IMAGE; `--create-tables` enables it)"
        )
    })
}

/// Every shard of the stream: `(id, open)`.
async fn shards(streams: &Client, arn: &str) -> Result<Vec<(String, bool)>, String> {
    let mut all = Vec::new();
    let mut start: Option<String> = None;
    loop {
        let out = streams
            .describe_stream()
            .stream_arn(arn)
            .set_exclusive_start_shard_id(start.clone())
            .send()
            .await
            .map_err(|e| {
                format!(
                    "describe stream: {}",
                    aws_sdk_dynamodbstreams::error::DisplayErrorContext(e)
                )
            })?;
        let Some(desc) = out.stream_description() else {
            break;
        };
        for shard in desc.shards() {
            if let Some(id) = shard.shard_id() {
                let open = shard
                    .sequence_number_range()
                    .and_then(|r| r.ending_sequence_number())
                    .is_none();
                all.push((id.to_owned(), open));
            }
        }
        // The last page has no `LastEvaluatedShardId` (DynamoDB Local may repeat the
        // last one on an empty page: stop there too).
        match desc.last_evaluated_shard_id() {
            Some(last) if !desc.shards().is_empty() && start.as_deref() != Some(last) => {
                start = Some(last.to_owned())
            }
            _ => break,
        }
    }
    Ok(all)
}

async fn iterator(
    streams: &Client,
    arn: &str,
    shard: &str,
    kind: ShardIteratorType,
) -> Result<Option<String>, String> {
    let out = streams
        .get_shard_iterator()
        .stream_arn(arn)
        .shard_id(shard)
        .shard_iterator_type(kind)
        .send()
        .await
        .map_err(|e| {
            format!(
                "shard iterator: {}",
                aws_sdk_dynamodbstreams::error::DisplayErrorContext(e)
            )
        })?;
    Ok(out.shard_iterator().map(str::to_owned))
}

/// Shards of the stream not in `known` yet: each is remembered, and its iterator from its
/// oldest record put in `iterators`.
pub(crate) async fn read_new_shards(
    streams: &Client,
    arn: &str,
    known: &mut HashSet<String>,
    iterators: &mut HashMap<String, String>,
) -> Result<(), String> {
    for (id, _) in shards(streams, arn).await? {
        if known.insert(id.clone()) {
            if let Some(it) = iterator(streams, arn, &id, ShardIteratorType::TrimHorizon).await? {
                iterators.insert(id, it);
            }
        }
    }
    Ok(())
}

/// Reads the stream until an error: the open shards from their newest record on, shards
/// that appear later from their start.
async fn read(
    dynamo: &aws_sdk_dynamodb::Client,
    streams: &Client,
    table: &str,
    wakes: &Wakes,
) -> Result<(), String> {
    let arn = stream_arn(dynamo, table).await?;
    let mut known: HashSet<String> = HashSet::new();
    let mut iterators: HashMap<String, String> = HashMap::new();
    for (id, open) in shards(streams, &arn).await? {
        if open {
            if let Some(it) = iterator(streams, &arn, &id, ShardIteratorType::Latest).await? {
                iterators.insert(id.clone(), it);
            }
        }
        known.insert(id);
    }
    tracing::info!(
        shards = iterators.len(),
        "live delivery: reading the events table's stream"
    );
    wakes.set_reading();
    // Only now that every open shard is read from here on: records written before (while
    // the reader was down, or starting) were not seen, so every followed run reads its
    // page again. (Woken earlier, a write between that page and these iterators would
    // wait for the safety poll.)
    wakes.wake_all();
    let mut refreshed = Instant::now();
    loop {
        if refreshed.elapsed() >= SHARD_REFRESH {
            refreshed = Instant::now();
            read_new_shards(streams, &arn, &mut known, &mut iterators).await?;
        }
        let mut any = false;
        let ids: Vec<String> = iterators.keys().cloned().collect();
        for id in ids {
            let Some(it) = iterators.remove(&id) else {
                continue;
            };
            let out = match streams
                .get_records()
                .shard_iterator(it)
                .limit(1000)
                .send()
                .await
            {
                Ok(out) => out,
                // The shard's records behind the iterator were trimmed, or the iterator
                // expired: read that shard from its newest record again, and have every
                // followed run read its page (what lay between may be unseen).
                Err(e)
                    if e.as_service_error().is_some_and(|se| {
                        se.is_trimmed_data_access_exception() || se.is_expired_iterator_exception()
                    }) =>
                {
                    tracing::info!(
                        shard = %id,
                        "live delivery: a shard iterator lapsed; reading that shard anew"
                    );
                    if let Some(it) =
                        iterator(streams, &arn, &id, ShardIteratorType::Latest).await?
                    {
                        iterators.insert(id, it);
                    }
                    wakes.wake_all();
                    continue;
                }
                Err(e) => {
                    return Err(format!(
                        "get records: {}",
                        aws_sdk_dynamodbstreams::error::DisplayErrorContext(e)
                    ))
                }
            };
            let mut runs: HashSet<&str> = HashSet::new();
            for record in out.records() {
                let run = record
                    .dynamodb()
                    .and_then(|r| r.keys())
                    .and_then(|k| k.get("run_id"))
                    .and_then(|v| v.as_s().ok());
                if let Some(run) = run {
                    runs.insert(run.as_str());
                }
            }
            any |= !out.records().is_empty();
            for run in runs {
                wakes.wake(run);
            }
            // A closed shard's last page has no next iterator: it is done.
            if let Some(next) = out.next_shard_iterator() {
                iterators.insert(id, next.to_owned());
            }
        }
        if !any {
            tokio::time::sleep(IDLE_READ).await;
        }
    }
}
