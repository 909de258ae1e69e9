//! The DynamoDB adapter. Every state change is one `TransactWriteItems`: the head update
//! (conditioned on the `next_seq` we read and on the run still running) plus the event
//! items it announces. A lost race re-reads the head from the cancellation reason
//! (`ReturnValuesOnConditionCheckFailure = ALL_OLD`) and tries again with bounded,
//! jittered backoff; SDK errors are translated here into [`StoreError`] variants.
//!
//! Events table layout: partition `run_id`, sort `event_key` — `id#<event_id>` for an
//! event with an idempotency key, `seq#<sequence>` otherwise — plus the local secondary
//! index `by_sequence` (`run_id`, `sequence`) that replay reads with strong consistency.
//! Keying idempotent events by their id makes "same event_id twice" a failed
//! `attribute_not_exists` inside the same transaction, so a batch of 99 keyed events
//! still fits DynamoDB's 100-item transaction limit.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, CancellationReason, KeysAndAttributes, Put,
    ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use aws_sdk_dynamodb::Client;
use rand::Rng;
use serde_json::{Map, Value};
use tollgate_domain::{
    now_millis, render_event, EventDraft, NewRun, RunHead, RunKind, RunStatus, TerminalKind,
};

use crate::{
    check_batch, ended_run_answer, fill_page, CreateOutcome, EventPage, Finished, RunRef, RunStore,
    StoreError, StoredEvent,
};

/// Physical table names, read once at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tables {
    pub runs: String,
    pub events: String,
}

impl Tables {
    /// `TOLLGATE_RUNS_TABLE` / `TOLLGATE_EVENTS_TABLE`, or `<TOLLGATE_TABLE_PREFIX>runs`
    /// and `…events` (prefix default `tollgate-`).
    pub fn from_env() -> Self {
        let prefix = std::env::var("TOLLGATE_TABLE_PREFIX").unwrap_or_else(|_| "tollgate-".into());
        let pick = |var: &str, suffix: &str| {
            std::env::var(var)
                .ok()
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| format!("{prefix}{suffix}"))
        };
        Self {
            runs: pick("TOLLGATE_RUNS_TABLE", "runs"),
            events: pick("TOLLGATE_EVENTS_TABLE", "events"),
        }
    }

    pub fn with_prefix(prefix: &str) -> Self {
        Self {
            runs: format!("{prefix}runs"),
            events: format!("{prefix}events"),
        }
    }
}

pub const BY_SEQUENCE_INDEX: &str = "by_sequence";

/// SDK timeouts for every DynamoDB call: a hung connection or answer becomes an error
/// (and so a 503) within seconds instead of holding the function until its timeout.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(2);
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(3);

/// A DynamoDB client from the shared SDK configuration, with Tollgate's timeouts.
pub fn client(sdk: &aws_config::SdkConfig) -> Client {
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .operation_attempt_timeout(ATTEMPT_TIMEOUT)
        .operation_timeout(OPERATION_TIMEOUT)
        .build();
    Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(sdk)
            .timeout_config(timeouts)
            .build(),
    )
}

const AMBIGUOUS: &str = "outcome unknown";

/// How long one transaction attempt keeps resending after answers that leave its outcome
/// unknown before it gives up as `Unavailable`.
const AMBIGUITY_BUDGET: Duration = Duration::from_secs(4);

/// How long one call keeps retrying lost races and throttling. With the ambiguity budget
/// and one SDK operation timeout (3 s, set where the client is built) a call ends within
/// about 15 s, well inside the functions' 25 s timeout, so a client always gets an answer.
pub const CONTENTION_BUDGET: Duration = Duration::from_secs(8);

#[derive(Clone)]
pub struct DynamoStore {
    client: Client,
    tables: Tables,
    /// Items expire this long after they are written (DynamoDB TTL); `None` keeps them.
    retention: Option<Duration>,
    /// How long one call may keep retrying lost races and throttling before it gives up
    /// with `Unavailable` (nothing written by the failed attempts).
    contention_budget: Duration,
    /// Per-run write lanes inside this process (see [`RunLanes`]); `None` lets every
    /// call race on the head, as separate processes do.
    lanes: Option<std::sync::Arc<RunLanes>>,
}

/// Appends to one run from one process go through a lane instead of racing each other
/// on the head's condition. Waiting appends queue up, and whoever holds the lane writes
/// the queue's head requests together in one transaction (group commit: whole requests,
/// at most 99 events, no `event_id` twice), so N concurrent writers cost far fewer than
/// N transactions. The lane also remembers the head it last wrote, so a queued append
/// skips the read: a stale head only fails the condition, which returns the current
/// head. The conditional head update still decides between processes (Lambda
/// instances), so correctness never rests on the lane.
#[derive(Default)]
struct RunLanes(std::sync::Mutex<HashMap<String, std::sync::Weak<LaneState>>>);

#[derive(Default)]
struct LaneState {
    /// Appends waiting to be written, in arrival order.
    queue: std::sync::Mutex<std::collections::VecDeque<QueuedAppend>>,
    /// Held by whoever writes to the run from this process.
    writer: std::sync::Arc<tokio::sync::Mutex<Option<RunHead>>>,
}

struct QueuedAppend {
    /// The incarnation the caller's token names (`None`: any).
    incarnation: Option<String>,
    events: Vec<EventDraft>,
    /// Rough size of the events as stored (payload JSON plus envelope allowance).
    bytes: usize,
    reply: tokio::sync::oneshot::Sender<Result<Vec<u64>, StoreError>>,
}

/// A group stays well under DynamoDB's 4 MB transaction size (one request alone is at
/// most 256 KiB of body).
const MAX_GROUP_BYTES: usize = 3 * 1024 * 1024;

/// The right to write to one run from this process, with the head it last wrote.
struct Lane {
    state: std::sync::Arc<LaneState>,
    head: tokio::sync::OwnedMutexGuard<Option<RunHead>>,
}

impl RunLanes {
    fn state(&self, run_id: &str) -> std::sync::Arc<LaneState> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() > 1024 {
            map.retain(|_, weak| weak.strong_count() > 0);
        }
        match map.get(run_id).and_then(std::sync::Weak::upgrade) {
            Some(state) => state,
            None => {
                let state = std::sync::Arc::new(LaneState::default());
                map.insert(run_id.to_owned(), std::sync::Arc::downgrade(&state));
                state
            }
        }
    }
}

impl Lane {
    async fn enter(state: std::sync::Arc<LaneState>) -> Self {
        let head = state.writer.clone().lock_owned().await;
        Self { state, head }
    }

    /// The next group of queued appends: whole requests in arrival order, at most
    /// [`MAX_BATCH_EVENTS`] events, no `event_id` twice (a retry racing its original
    /// waits for the next group, where it finds the original's sequence).
    fn take_group(&self) -> Vec<QueuedAppend> {
        let mut queue = self.state.queue.lock().unwrap_or_else(|p| p.into_inner());
        let mut group: Vec<QueuedAppend> = Vec::new();
        let mut count = 0;
        let mut bytes = 0;
        let mut ids = std::collections::HashSet::new();
        // A caller that went away before its turn is not written: it was told nothing,
        // so its retry is the one that lands.
        queue.retain(|q| !q.reply.is_closed());
        let incarnation = queue.front().map(|q| q.incarnation.clone());
        while let Some(next) = queue.front() {
            let next_ids: Vec<&str> = next
                .events
                .iter()
                .filter_map(|e| e.event_id.as_deref())
                .collect();
            let fits = count + next.events.len() <= tollgate_domain::MAX_BATCH_EVENTS
                && bytes + next.bytes <= MAX_GROUP_BYTES
                && incarnation.as_ref() == Some(&next.incarnation)
                && next_ids.iter().all(|id| !ids.contains(*id));
            if !group.is_empty() && !fits {
                break;
            }
            ids.extend(next_ids.into_iter().map(str::to_owned));
            count += next.events.len();
            bytes += next.bytes;
            group.extend(queue.pop_front());
        }
        group
    }
}

impl DynamoStore {
    pub fn new(client: Client, tables: Tables) -> Self {
        Self {
            client,
            tables,
            retention: None,
            contention_budget: CONTENTION_BUDGET,
            lanes: Some(std::sync::Arc::new(RunLanes::default())),
        }
    }

    /// Every call races on the head's condition, with no in-process queue: how separate
    /// processes (Lambda instances) meet. Used to test the conditional writes alone.
    pub fn without_lanes(mut self) -> Self {
        self.lanes = None;
        self
    }

    async fn enter_lane(&self, run_id: &str) -> Option<Lane> {
        match &self.lanes {
            Some(lanes) => Some(Lane::enter(lanes.state(run_id)).await),
            None => None,
        }
    }

    /// The head to start from: the one this lane last wrote, else a strong read.
    async fn starting_head(
        &self,
        lane: &mut Option<&mut Lane>,
        run: RunRef<'_>,
    ) -> Result<RunHead, StoreError> {
        let head = match lane.as_mut().and_then(|l| l.head.take()) {
            Some(head) => head,
            None => self.live_head(run).await?,
        };
        run.check(&head)?;
        Ok(head)
    }

    /// A strong read of the head `run` names (`NotFound` if gone or another incarnation).
    async fn live_head(&self, run: RunRef<'_>) -> Result<RunHead, StoreError> {
        let head = self
            .get_head(run.run_id)
            .await?
            .ok_or(StoreError::NotFound)?;
        run.check(&head)?;
        Ok(head)
    }

    /// Writes one group of queued appends (all naming one incarnation) and answers each.
    async fn write_group(&self, run_id: &str, group: Vec<QueuedAppend>, lane: &mut Lane) {
        let combined: Vec<EventDraft> = group
            .iter()
            .flat_map(|q| q.events.iter().cloned())
            .collect();
        let incarnation = group.first().and_then(|q| q.incarnation.clone());
        let run = RunRef {
            run_id,
            incarnation: incarnation.as_deref(),
        };
        match self.append_in_lane(run, combined, Some(lane)).await {
            Ok(sequences) => {
                let mut rest = sequences.as_slice();
                for q in group {
                    let (mine, tail) = rest.split_at(q.events.len());
                    rest = tail;
                    let _ = q.reply.send(Ok(mine.to_vec()));
                }
            }
            // On an ended run each request still deserves its own answer (a pure retry
            // of events that landed before the end gets their sequences).
            Err(StoreError::RunTerminal { .. }) if group.len() > 1 => {
                for q in group {
                    let answer = self.append_in_lane(run, q.events, Some(lane)).await;
                    let _ = q.reply.send(answer);
                }
            }
            Err(e) => {
                for q in group {
                    let _ = q.reply.send(Err(e.clone()));
                }
            }
        }
    }

    pub fn with_retention(mut self, retention: Option<Duration>) -> Self {
        self.retention = retention;
        self
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    fn expires_at(&self, now_millis: i64) -> Option<AttributeValue> {
        self.retention
            .map(|r| n(now_millis / 1000 + r.as_secs() as i64))
    }

    /// Whether any item of the run's partition is in the events table (one strongly
    /// consistent `Query` with `Limit 1`).
    async fn has_any_event(&self, run_id: &str) -> Result<bool, StoreError> {
        let out = self
            .client
            .query()
            .table_name(&self.tables.events)
            .consistent_read(true)
            .key_condition_expression("run_id = :r")
            .expression_attribute_values(":r", s(run_id))
            .projection_expression("run_id")
            .limit(1)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(out.count > 0)
    }

    async fn get_head(&self, run_id: &str) -> Result<Option<RunHead>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.tables.runs)
            .key("run_id", s(run_id))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        out.item.map(|item| head_from_item(&item)).transpose()
    }

    fn event_put(
        &self,
        head: &RunHead,
        sequence: u64,
        draft: &EventDraft,
        now: i64,
    ) -> Result<TransactWriteItem, StoreError> {
        let key = match &draft.event_id {
            Some(id) => format!("id#{id}"),
            None => format!("seq#{sequence:020}"),
        };
        let mut put = Put::builder()
            .table_name(&self.tables.events)
            .item("run_id", s(&head.run_id))
            .item("event_key", s(key))
            .item("sequence", n(sequence))
            .item("type", s(&draft.event_type))
            .item("body", s(render_event(head, sequence, draft, now)))
            // Invariant: one item per (run, event_id) and per sequence — a retried
            // event_id fails here and reports the stored sequence back (ALL_OLD).
            .condition_expression("attribute_not_exists(event_key)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if let Some(exp) = self.expires_at(now) {
            put = put.item("expires_at", exp);
        }
        Ok(TransactWriteItem::builder()
            .put(put.build().map_err(build_error)?)
            .build())
    }

    /// The head update every append and terminal transition carries.
    fn head_update(
        &self,
        head: &RunHead,
        new_next_seq: u64,
        now: i64,
        terminal: Option<(RunStatus, u64)>,
    ) -> Result<TransactWriteItem, StoreError> {
        let mut set = String::from("next_seq = :new, last_event_at = :now");
        // Keep the head alive as long as its newest events (TTL retention).
        let expires = self.expires_at(now);
        if expires.is_some() {
            set.push_str(", expires_at = :exp");
        }
        let mut update = Update::builder()
            .table_name(&self.tables.runs)
            .key("run_id", s(&head.run_id))
            // Invariant: gapless, single-writer sequences and no event after a terminal
            // event — the head must still be exactly as we read it (the same incarnation
            // of the run id), and running.
            .condition_expression("next_seq = :seen AND #status = :running AND incarnation = :inc")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":seen", n(head.next_seq))
            .expression_attribute_values(":inc", s(&head.incarnation))
            .expression_attribute_values(":running", s(RunStatus::Running.as_str()))
            .expression_attribute_values(":new", n(new_next_seq))
            .expression_attribute_values(":now", n(now))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if let Some(exp) = expires {
            update = update.expression_attribute_values(":exp", exp);
        }
        if let Some((status, seq)) = terminal {
            set.push_str(", #status = :terminal, terminal_seq = :tseq");
            update = update
                .expression_attribute_values(":terminal", s(status.as_str()))
                .expression_attribute_values(":tseq", n(seq));
        }
        update = update.update_expression(format!("SET {set}"));
        Ok(TransactWriteItem::builder()
            .update(update.build().map_err(build_error)?)
            .build())
    }

    /// One transaction attempt. Its client request token stays the same while we resend
    /// after an answer that leaves the outcome unknown (timeout, dispatch failure,
    /// `InternalServerError`, `TransactionInProgress`): DynamoDB answers a resend of a
    /// committed token with success and writes nothing, so an attempt never lands twice.
    /// If the outcome is still unknown after the ambiguity budget, fail closed.
    async fn transact(&self, items: Vec<TransactWriteItem>) -> Result<(), TxFailure> {
        let token = uuid::Uuid::new_v4().to_string();
        let give_up = Instant::now() + AMBIGUITY_BUDGET;
        let mut attempt = 0u32;
        let mut unknown = false;
        loop {
            let result = self
                .client
                .transact_write_items()
                .set_transact_items(Some(items.clone()))
                .client_request_token(&token)
                .send()
                .await;
            match result.map_err(classify_tx_error) {
                Ok(_) => return Ok(()),
                // Once an attempt's outcome is unknown, only this token may settle it: a
                // throttled or conflicting resend says nothing about the first attempt.
                Err(TxFailure::Ambiguous(why) | TxFailure::Retryable(why))
                    if unknown || why.starts_with(AMBIGUOUS) =>
                {
                    if Instant::now() >= give_up {
                        return Err(TxFailure::Fatal(format!("outcome unknown: {why}")));
                    }
                    unknown = true;
                    tracing::warn!(%why, "transaction outcome unknown; resending with the same token");
                    attempt += 1;
                    backoff(attempt + 3).await;
                }
                // A condition failure under the same token proves nothing committed
                // (a committed token answers success).
                Err(other) => return Err(other),
            }
        }
    }

    /// Sequences already stored for these event ids (used when a run has ended, to
    /// still answer a retried append with its original result).
    async fn existing_event_ids(
        &self,
        run_id: &str,
        ids: &[&str],
    ) -> Result<HashMap<String, u64>, StoreError> {
        let mut found = HashMap::new();
        for chunk in ids.chunks(100) {
            let keys = chunk
                .iter()
                .map(|id| {
                    HashMap::from([
                        ("run_id".to_string(), s(run_id)),
                        ("event_key".to_string(), s(format!("id#{id}"))),
                    ])
                })
                .collect();
            let mut request = Some(
                KeysAndAttributes::builder()
                    .set_keys(Some(keys))
                    .consistent_read(true)
                    .projection_expression("event_key, #seq")
                    .expression_attribute_names("#seq", "sequence")
                    .build()
                    .map_err(build_error)?,
            );
            let mut attempt = 0u32;
            while let Some(req) = request.take() {
                let out = self
                    .client
                    .batch_get_item()
                    .request_items(&self.tables.events, req)
                    .send()
                    .await
                    .map_err(unavailable)?;
                for item in out
                    .responses
                    .unwrap_or_default()
                    .remove(&self.tables.events)
                    .unwrap_or_default()
                {
                    let key = get_s(&item, "event_key")?;
                    found.insert(
                        key.strip_prefix("id#").unwrap_or(&key).to_owned(),
                        get_n(&item, "sequence")?,
                    );
                }
                request = out
                    .unprocessed_keys
                    .and_then(|mut u| u.remove(&self.tables.events));
                if request.is_some() {
                    attempt += 1;
                    if attempt > 10 {
                        return Err(StoreError::Unavailable(
                            "event lookups kept coming back unprocessed".into(),
                        ));
                    }
                    backoff(attempt).await;
                }
            }
        }
        Ok(found)
    }
}

/// Why one transaction attempt did not commit.
enum TxFailure {
    /// Conditions failed: one reason per item, in order, with the stored item (ALL_OLD).
    Cancelled(Vec<CancellationReason>),
    /// Rejected before it could commit (throttling, a conflicting transaction): safe
    /// to rebuild from a fresh read and try again.
    Retryable(String),
    /// It may or may not have committed: resend the same request (same token). The
    /// text starts with [`AMBIGUOUS`].
    Ambiguous(String),
    /// Anything else: fail closed.
    Fatal(String),
}

fn classify_tx_error(err: SdkError<TransactWriteItemsError>) -> TxFailure {
    match err {
        SdkError::ServiceError(ctx) => match ctx.into_err() {
            TransactWriteItemsError::TransactionCanceledException(e) => {
                let reasons = e.cancellation_reasons.unwrap_or_default();
                if reasons
                    .iter()
                    .any(|r| r.code() == Some("ConditionalCheckFailed"))
                {
                    TxFailure::Cancelled(reasons)
                } else {
                    // TransactionConflict, ThrottlingError, … on some item: transient.
                    let codes: Vec<_> = reasons.iter().filter_map(|r| r.code()).collect();
                    TxFailure::Retryable(format!("transaction cancelled: {codes:?}"))
                }
            }
            e @ (TransactWriteItemsError::ProvisionedThroughputExceededException(_)
            | TransactWriteItemsError::RequestLimitExceeded(_)
            | TransactWriteItemsError::ThrottlingException(_)) => {
                TxFailure::Retryable(e.code().unwrap_or("throttled").to_owned())
            }
            e @ (TransactWriteItemsError::TransactionInProgressException(_)
            | TransactWriteItemsError::InternalServerError(_)) => {
                TxFailure::Ambiguous(format!("{AMBIGUOUS}: {}", e.code().unwrap_or("transient")))
            }
            e => TxFailure::Fatal(format!(
                "{}: {}",
                e.code().unwrap_or("error"),
                e.message().unwrap_or("")
            )),
        },
        // Timeouts and dispatch failures (the SDK already retried): the request may have
        // reached DynamoDB and committed.
        other => TxFailure::Ambiguous(format!("{AMBIGUOUS}: {other}")),
    }
}

fn reason_failed(r: &CancellationReason) -> bool {
    r.code() == Some("ConditionalCheckFailed")
}

fn approx_stored_bytes(events: &[EventDraft]) -> usize {
    events
        .iter()
        .map(|e| serde_json::to_vec(&e.payload).map_or(0, |v| v.len()) + 512)
        .sum()
}

async fn backoff(attempt: u32) {
    // Full jitter, 2 ms doubling to a 32 ms ceiling: a low ceiling keeps a writer that
    // lost several times from starving behind fresh arrivals.
    let cap = 2u64 << attempt.min(4);
    let ms = rand::rng().random_range(1..=cap);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

impl DynamoStore {
    /// One append, in one transaction (retried on lost races and throttling), holding
    /// the run's lane when there is one.
    async fn append_in_lane(
        &self,
        run: RunRef<'_>,
        events: Vec<EventDraft>,
        mut lane: Option<&mut Lane>,
    ) -> Result<Vec<u64>, StoreError> {
        let run_id = run.run_id;
        let deadline = Instant::now() + self.contention_budget;
        let mut sequences: Vec<Option<u64>> = vec![None; events.len()];
        let mut head = self.starting_head(&mut lane, run).await?;
        let mut attempt = 0u32;
        loop {
            let pending: Vec<usize> = (0..events.len())
                .filter(|i| sequences[*i].is_none())
                .collect();
            if pending.is_empty() {
                break;
            }
            if head.status.is_terminal() {
                // A retry of events that landed before the end still gets its answer.
                let ids: Vec<&str> = pending
                    .iter()
                    .filter_map(|i| events[*i].event_id.as_deref())
                    .collect();
                if ids.len() == pending.len() {
                    let found = self.existing_event_ids(run_id, &ids).await?;
                    for i in &pending {
                        let id = events[*i].event_id.as_deref().unwrap_or_default();
                        sequences[*i] = found.get(id).copied();
                    }
                    if sequences.iter().all(Option::is_some) {
                        break;
                    }
                }
                return Err(StoreError::RunTerminal {
                    status: head.status,
                    terminal_seq: head.terminal_seq.unwrap_or(head.last_sequence()),
                });
            }
            let now = now_millis();
            let first = head.next_seq;
            let mut items = Vec::with_capacity(pending.len() + 1);
            items.push(self.head_update(&head, first + pending.len() as u64, now, None)?);
            for (offset, i) in pending.iter().enumerate() {
                items.push(self.event_put(&head, first + offset as u64, &events[*i], now)?);
            }
            match self.transact(items).await {
                Ok(()) => {
                    for (offset, i) in pending.iter().enumerate() {
                        sequences[*i] = Some(first + offset as u64);
                    }
                    head.next_seq = first + pending.len() as u64;
                    head.last_event_at = now;
                    if let Some(lane) = lane.as_mut() {
                        *lane.head = Some(head);
                    }
                    break;
                }
                Err(TxFailure::Cancelled(reasons)) => {
                    // Keyed events already stored are duplicates: take their sequences.
                    let unanswered = pending.len();
                    for (offset, i) in pending.iter().enumerate() {
                        let Some(reason) = reasons.get(offset + 1) else {
                            continue;
                        };
                        if reason_failed(reason) && events[*i].event_id.is_some() {
                            if let Some(item) = reason.item() {
                                sequences[*i] = Some(get_n(item, "sequence")?);
                            }
                        }
                    }
                    match reasons.first() {
                        Some(r) if reason_failed(r) => {
                            head = match r.item() {
                                Some(item) => head_from_item(item)?,
                                None => return Err(StoreError::NotFound),
                            };
                            run.check(&head)?;
                        }
                        // Head held; only duplicates failed: retry the rest at once.
                        _ if sequences.iter().filter(|s| s.is_none()).count() < unanswered => {
                            continue
                        }
                        // Head held yet an event key was taken: the stored events are
                        // ahead of the head. Never guess a sequence; fail closed.
                        _ => {
                            return Err(StoreError::Unavailable(format!(
                                "run {run_id}: stored events are ahead of the run head"
                            )))
                        }
                    }
                }
                Err(TxFailure::Retryable(why)) => {
                    tracing::debug!(run_id, %why, "append retry");
                    head = self.live_head(run).await?;
                }
                Err(TxFailure::Fatal(why) | TxFailure::Ambiguous(why)) => {
                    return Err(StoreError::Unavailable(why))
                }
            }
            if Instant::now() >= deadline {
                return Err(StoreError::Unavailable(
                    "append kept losing to concurrent writers; retry".into(),
                ));
            }
            attempt += 1;
            backoff(attempt).await;
        }
        Ok(sequences.into_iter().flatten().collect())
    }
}

#[async_trait]
impl RunStore for DynamoStore {
    async fn create_run(&self, new: NewRun) -> Result<CreateOutcome, StoreError> {
        let now = now_millis();
        let head = new.head(now);
        let mut head_item = head_to_item(&head);
        if let Some(exp) = self.expires_at(now) {
            head_item.insert("expires_at".into(), exp);
        }
        let put_head = Put::builder()
            .table_name(&self.tables.runs)
            .set_item(Some(head_item))
            // Invariant: a run id names one run; a second create finds the first.
            .condition_expression("attribute_not_exists(run_id)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .map_err(build_error)?;
        let items = vec![
            TransactWriteItem::builder().put(put_head).build(),
            self.event_put(&head, 1, &new.started_event(), now)?,
        ];
        // Invariant: a run id is never created again over another run's leftovers (TTL
        // may delete a head before its events, or `run_started` before the rest). No
        // event can appear between this read and the transaction: every write but this
        // create needs the head.
        if self.has_any_event(&new.run_id).await? {
            return match self.get_head(&new.run_id).await? {
                Some(existing) => Ok(CreateOutcome::Existing(existing)),
                None => Err(StoreError::Conflict(
                    "run id has leftover events; choose another run id".into(),
                )),
            };
        }
        let deadline = Instant::now() + self.contention_budget;
        let mut attempt = 0;
        loop {
            match self.transact(items.clone()).await {
                Ok(()) => return Ok(CreateOutcome::Created(head)),
                Err(TxFailure::Cancelled(reasons)) => {
                    let existing = reasons
                        .first()
                        .filter(|r| reason_failed(r))
                        .and_then(|r| r.item());
                    if let Some(item) = existing {
                        return Ok(CreateOutcome::Existing(head_from_item(item)?));
                    }
                    // Only the `seq#1` event existed without a head: a half-deleted run
                    // (TTL removed the head first). Refuse rather than guess.
                    return Err(StoreError::Conflict(
                        "run id has leftover events; choose another run id".into(),
                    ));
                }
                Err(TxFailure::Retryable(why)) if Instant::now() < deadline => {
                    tracing::debug!(run_id = %new.run_id, %why, "create_run retry");
                    attempt += 1;
                    backoff(attempt).await;
                    if let Some(head) = self.get_head(&new.run_id).await? {
                        return Ok(CreateOutcome::Existing(head));
                    }
                }
                Err(
                    TxFailure::Retryable(why) | TxFailure::Fatal(why) | TxFailure::Ambiguous(why),
                ) => return Err(StoreError::Unavailable(why)),
            }
        }
    }

    async fn append_events(
        &self,
        run: RunRef<'_>,
        events: Vec<EventDraft>,
    ) -> Result<Vec<u64>, StoreError> {
        check_batch(&events)?;
        let Some(lanes) = &self.lanes else {
            return self.append_in_lane(run, events, None).await;
        };
        let state = lanes.state(run.run_id);
        let (reply, answer) = tokio::sync::oneshot::channel();
        state
            .queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(QueuedAppend {
                incarnation: run.incarnation.map(str::to_owned),
                bytes: approx_stored_bytes(&events),
                events,
                reply,
            });
        // The lane is drained by a task of its own, so a caller that goes away (a client
        // disconnecting drops its request future) cannot abandon a transaction half-way
        // or strand the appends grouped with its own.
        let store = self.clone();
        let run_id = run.run_id.to_owned();
        tokio::spawn(async move {
            // One group per turn on the lane: a waiting `finish_run` gets its turn between
            // groups instead of waiting for the queue to run dry.
            loop {
                let mut lane = Lane::enter(state.clone()).await;
                let group = lane.take_group();
                if group.is_empty() {
                    break;
                }
                store.write_group(&run_id, group, &mut lane).await;
            }
        });
        answer
            .await
            .unwrap_or_else(|_| Err(StoreError::Unavailable("append was dropped; retry".into())))
    }

    async fn finish_run(
        &self,
        run: RunRef<'_>,
        kind: TerminalKind,
        payload: Map<String, Value>,
    ) -> Result<Finished, StoreError> {
        let run_id = run.run_id;
        let mut lane = self.enter_lane(run_id).await;
        let mut lane = lane.as_mut();
        let deadline = Instant::now() + self.contention_budget;
        let draft = EventDraft::server(kind.event_type(), payload);
        let mut head = self.starting_head(&mut lane, run).await?;
        let mut attempt = 0u32;
        loop {
            if head.status.is_terminal() {
                return ended_run_answer(&head, kind);
            }
            let now = now_millis();
            let seq = head.next_seq;
            let items = vec![
                self.head_update(&head, seq + 1, now, Some((kind.status(), seq)))?,
                self.event_put(&head, seq, &draft, now)?,
            ];
            match self.transact(items).await {
                Ok(()) => {
                    head.next_seq = seq + 1;
                    head.status = kind.status();
                    head.terminal_seq = Some(seq);
                    head.last_event_at = now;
                    if let Some(lane) = lane.as_mut() {
                        *lane.head = Some(head);
                    }
                    return Ok(Finished {
                        sequence: seq,
                        already_finished: false,
                    });
                }
                Err(TxFailure::Cancelled(reasons)) => {
                    match reasons.first().and_then(|r| r.item()) {
                        Some(item) if reasons.first().is_some_and(reason_failed) => {
                            head = head_from_item(item)?;
                            run.check(&head)?;
                        }
                        _ => head = self.live_head(run).await?,
                    }
                }
                Err(TxFailure::Retryable(why)) => {
                    tracing::debug!(run_id, %why, "finish retry");
                    head = self.live_head(run).await?;
                }
                Err(TxFailure::Fatal(why) | TxFailure::Ambiguous(why)) => {
                    return Err(StoreError::Unavailable(why))
                }
            }
            if Instant::now() >= deadline {
                return Err(StoreError::Unavailable(
                    "terminal transition kept losing to concurrent writers; retry".into(),
                ));
            }
            attempt += 1;
            backoff(attempt).await;
        }
    }

    async fn read_head(&self, run_id: &str) -> Result<Option<RunHead>, StoreError> {
        self.get_head(run_id).await
    }

    async fn read_events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<EventPage, StoreError> {
        // One more than asked tells whether more remain; DynamoDB may also stop at 1 MB,
        // so keep querying until we have enough or the index is exhausted.
        let want = limit.saturating_add(1);
        let mut collected: Vec<StoredEvent> = Vec::new();
        let mut bytes = 0usize;
        let mut start_key = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.tables.events)
                .index_name(BY_SEQUENCE_INDEX)
                .consistent_read(true)
                .key_condition_expression("run_id = :r AND #seq > :after")
                .expression_attribute_names("#seq", "sequence")
                .expression_attribute_names("#type", "type")
                .expression_attribute_values(":r", s(run_id))
                .expression_attribute_values(":after", n(after))
                .projection_expression("#seq, #type, body")
                .limit((want - collected.len()).min(1000) as i32)
                .set_exclusive_start_key(start_key.take())
                .send()
                .await
                .map_err(unavailable)?;
            for item in out.items.unwrap_or_default() {
                let body = get_s(&item, "body")?;
                bytes += body.len();
                collected.push(StoredEvent {
                    sequence: get_n(&item, "sequence")?,
                    event_type: get_s(&item, "type")?,
                    body,
                });
            }
            start_key = out.last_evaluated_key;
            if start_key.is_none() || collected.len() >= want || bytes > crate::MAX_PAGE_BYTES {
                break;
            }
        }
        // Every run holds `run_started`, so events found prove the run exists; only an
        // empty page needs the head read to tell "past the end" from "no such run".
        if collected.is_empty() && self.get_head(run_id).await?.is_none() {
            return Err(StoreError::NotFound);
        }
        let reached_end = start_key.is_none() && collected.len() < want;
        let mut page = fill_page(collected.into_iter(), limit);
        page.has_more = page.has_more || !reached_end;
        Ok(page)
    }
}

// ---- item mapping ----------------------------------------------------------------

fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

fn get_s(item: &HashMap<String, AttributeValue>, key: &str) -> Result<String, StoreError> {
    match item.get(key) {
        Some(AttributeValue::S(v)) => Ok(v.clone()),
        _ => Err(corrupt(key)),
    }
}

fn opt_s(item: &HashMap<String, AttributeValue>, key: &str) -> Option<String> {
    match item.get(key) {
        Some(AttributeValue::S(v)) => Some(v.clone()),
        _ => None,
    }
}

fn get_n<T: std::str::FromStr>(
    item: &HashMap<String, AttributeValue>,
    key: &str,
) -> Result<T, StoreError> {
    match item.get(key) {
        Some(AttributeValue::N(v)) => v.parse().map_err(|_| corrupt(key)),
        _ => Err(corrupt(key)),
    }
}

fn opt_json(
    item: &HashMap<String, AttributeValue>,
    key: &str,
) -> Result<Option<Value>, StoreError> {
    opt_s(item, key)
        .map(|raw| serde_json::from_str(&raw).map_err(|_| corrupt(key)))
        .transpose()
}

fn corrupt(key: &str) -> StoreError {
    StoreError::Unavailable(format!("stored item has a missing or malformed {key:?}"))
}

fn head_to_item(h: &RunHead) -> HashMap<String, AttributeValue> {
    let mut item = HashMap::from([
        ("run_id".to_string(), s(&h.run_id)),
        ("status".to_string(), s(h.status.as_str())),
        ("next_seq".to_string(), n(h.next_seq)),
        ("kind".to_string(), s(h.kind.as_str())),
        ("created_by".to_string(), s(&h.created_by)),
        ("created_at".to_string(), n(h.created_at)),
        ("last_event_at".to_string(), n(h.last_event_at)),
        ("incarnation".to_string(), s(&h.incarnation)),
    ]);
    let strings = [
        ("parent_run_id", &h.parent_run_id),
        ("owner", &h.owner),
        ("project_id", &h.project_id),
        ("channel_id", &h.channel_id),
        ("delivery_id", &h.delivery_id),
        ("execution_mode", &h.execution_mode),
        ("agenthost_origin", &h.agenthost_origin),
    ];
    for (k, v) in strings {
        if let Some(v) = v {
            item.insert(k.into(), s(v));
        }
    }
    for (k, v) in [("subtask_id", &h.subtask_id), ("budget", &h.budget)] {
        if let Some(v) = v {
            item.insert(k.into(), s(v.to_string()));
        }
    }
    if let Some(t) = h.terminal_seq {
        item.insert("terminal_seq".into(), n(t));
    }
    item
}

fn head_from_item(item: &HashMap<String, AttributeValue>) -> Result<RunHead, StoreError> {
    Ok(RunHead {
        run_id: get_s(item, "run_id")?,
        status: RunStatus::parse(&get_s(item, "status")?).ok_or_else(|| corrupt("status"))?,
        next_seq: get_n(item, "next_seq")?,
        kind: RunKind::parse(&get_s(item, "kind")?).ok_or_else(|| corrupt("kind"))?,
        parent_run_id: opt_s(item, "parent_run_id"),
        subtask_id: opt_json(item, "subtask_id")?,
        owner: opt_s(item, "owner"),
        project_id: opt_s(item, "project_id"),
        channel_id: opt_s(item, "channel_id"),
        created_by: get_s(item, "created_by")?,
        delivery_id: opt_s(item, "delivery_id"),
        execution_mode: opt_s(item, "execution_mode"),
        agenthost_origin: opt_s(item, "agenthost_origin"),
        budget: opt_json(item, "budget")?,
        created_at: get_n(item, "created_at")?,
        last_event_at: get_n(item, "last_event_at")?,
        terminal_seq: item
            .get("terminal_seq")
            .map(|_| get_n(item, "terminal_seq"))
            .transpose()?,
        incarnation: get_s(item, "incarnation")?,
    })
}

fn unavailable<E: ProvideErrorMetadata + std::error::Error + 'static, R: std::fmt::Debug>(
    err: SdkError<E, R>,
) -> StoreError {
    let detail = match &err {
        SdkError::ServiceError(ctx) => format!(
            "{}: {}",
            ctx.err().code().unwrap_or("error"),
            ctx.err().message().unwrap_or("")
        ),
        other => other.to_string(),
    };
    StoreError::Unavailable(detail)
}

fn build_error(err: aws_sdk_dynamodb::error::BuildError) -> StoreError {
    StoreError::Unavailable(format!("request build: {err}"))
}
