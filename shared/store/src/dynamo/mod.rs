//! The DynamoDB adapter. Every state change is one `TransactWriteItems` planned and
//! written by the commit engine ([`commit`]): run heads conditioned on the `next_seq`
//! and incarnation we read and on the run still running, plus the events they announce
//! and any conditioned side items. A lost race reads the current head from the
//! cancellation reason (`ReturnValuesOnConditionCheckFailure = ALL_OLD`) and tries again
//! with bounded, jittered backoff; SDK errors are translated into [`StoreError`].
//!
//! Events table layout: partition `run_id`, sort `event_key` — `id#<event_id>` for an
//! event with an idempotency key, `seq#<sequence>` otherwise — plus the local secondary
//! index `by_sequence` (`run_id`, `sequence`) that replay reads with strong consistency.
//! Keying idempotent events by their id makes "same event_id twice" a failed
//! `attribute_not_exists` inside the same transaction, so a batch of 99 keyed events
//! still fits DynamoDB's 100-item transaction limit.
//!
//! Modules by job: [`tables`] (names, client), [`item`] (mapping, error translation),
//! [`commit`] (the engine), [`lanes`] (group commit in one process), [`runs`] (the
//! [`crate::RunStore`] port as plans), [`approvals`] (the [`crate::ApprovalStore`] port),
//! [`mutations`] (the [`crate::MutationStore`] port).

mod approvals;
mod commit;
pub mod connections;
mod deliveries;
mod item;
mod lanes;
mod mutations;
mod policies;
mod runs;
mod stall;
mod tables;

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::{AttributeValue, KeysAndAttributes};
use aws_sdk_dynamodb::Client;
use tollgate_domain::RunHead;

pub use commit::CONTENTION_BUDGET;
pub use tables::{
    client, sdk_config, sdk_config_loader, Tables, ATTEMPT_TIMEOUT, BY_SEQUENCE_INDEX,
    CONNECT_TIMEOUT, DUE_INDEX, OPERATION_TIMEOUT, PENDING_INDEX,
};

use commit::backoff;
use item::{build_error, get_n, get_s, head_from_item, n, s, unavailable};
use lanes::{Lane, RunLanes};

use crate::{fill_page, EventPage, RunRef, StoreError, StoredEvent};

pub use connections::Connections;
pub use deliveries::{DEAD_LETTERS_INDEX, DELIVERIES_DUE_INDEX};

/// An events-table item — a `Query` answer, or a DynamoDB Stream record's `NewImage` — as
/// its run id and the event replay serves; `None` for an item that is not an event (no
/// `event_key` of an event, or no body). The one decoder of stored events.
pub fn event_from_item(
    item: &HashMap<String, AttributeValue>,
) -> Result<Option<(String, StoredEvent)>, StoreError> {
    let is_event = matches!(
        item.get("event_key"),
        Some(AttributeValue::S(k)) if k.starts_with("seq#") || k.starts_with("id#")
    );
    if !is_event || !item.contains_key("body") {
        return Ok(None);
    }
    Ok(Some((
        get_s(item, "run_id")?,
        item::stored_event_from_item(item)?,
    )))
}

#[derive(Clone)]
pub struct DynamoStore {
    client: Client,
    tables: Tables,
    /// Items expire this long after they are written (DynamoDB TTL); `None` keeps them.
    retention: Option<Duration>,
    /// How long one call may keep retrying lost races and throttling before it gives up
    /// with `Unavailable` (nothing written by the failed attempts).
    contention_budget: Duration,
    /// Per-run write lanes inside this process (see [`lanes`]); `None` lets every call
    /// race on the head, as separate processes do.
    lanes: Option<std::sync::Arc<RunLanes>>,
    /// Heads this store read or wrote in the last seconds (see [`RecentHeads`]).
    recent: std::sync::Arc<RecentHeads>,
    /// Pending cards this store armed or read (see [`RecentCards`]).
    cards: std::sync::Arc<RecentCards>,
}

/// Pending cards this store instance armed or read, at most [`RecentCards::MAX`]: a
/// decision on one of them, with its run's head remembered too, writes at once instead
/// of reading the card and head first. Never trusted for correctness
/// (docs/architecture.md §6): the decision's card write is conditioned on the card still
/// pending and each head on its `next_seq`, incarnation and status, so a card decided
/// elsewhere loses its condition and the stored card returned (`ALL_OLD`) is what the
/// decision then answers. Pod-held cards are never remembered (a decision on one is
/// forwarded to the pod on what was read).
/// A remembered card and its count shard.
type RecentCard = (tollgate_domain::ApprovalRequest, Option<u32>);

#[derive(Default)]
pub(crate) struct RecentCards {
    cards: std::sync::Mutex<HashMap<(String, String), RecentCard>>,
}

impl RecentCards {
    pub(crate) const MAX: usize = 4096;

    pub(crate) fn get(&self, run_id: &str, request_id: &str) -> Option<RecentCard> {
        let cards = self.cards.lock().unwrap_or_else(|p| p.into_inner());
        cards
            .get(&(run_id.to_owned(), request_id.to_owned()))
            .cloned()
    }

    /// Remembers `card` while it is pending and not held by a pod; forgets it otherwise.
    pub(crate) fn put(&self, card: &tollgate_domain::ApprovalRequest, shard: Option<u32>) {
        let key = (card.run_id.clone(), card.request_id.clone());
        let mut cards = self.cards.lock().unwrap_or_else(|p| p.into_inner());
        if card.state != tollgate_domain::ApprovalState::Pending || card.held_by_pod {
            cards.remove(&key);
            return;
        }
        if cards.len() >= Self::MAX {
            cards.clear();
        }
        cards.insert(key, (card.clone(), shard));
    }

    pub(crate) fn forget(&self, run_id: &str, request_id: &str) {
        let mut cards = self.cards.lock().unwrap_or_else(|p| p.into_inner());
        cards.remove(&(run_id.to_owned(), request_id.to_owned()));
    }
}

/// Run heads this store instance last wrote or read, at most [`RecentHeads::MAX`] runs
/// (the least recently used go first). An append starts from the remembered head instead
/// of reading it, so a lone writer makes one round trip; a decision on a child card takes
/// its coordinator's head from here when it was seen within [`RecentHeads::FRESH`].
/// Never trusted for correctness (docs/architecture.md §1): every write stays conditioned
/// on the head's `next_seq`, incarnation and `running` status, so a stale entry only loses
/// its condition, and the lost condition returns the stored head (`ALL_OLD`), which
/// replaces the entry before the retry. Nothing is ever answered from an entry alone: a
/// remembered head that is terminal or of another incarnation is read again.
#[derive(Default)]
pub(crate) struct RecentHeads {
    heads: std::sync::Mutex<RecentMap>,
}

#[derive(Default)]
struct RecentMap {
    entries: HashMap<String, RecentEntry>,
    /// Use counter: the entry used longest ago goes first.
    tick: u64,
}

struct RecentEntry {
    head: RunHead,
    at: std::time::Instant,
    used: u64,
}

impl RecentHeads {
    const FRESH: Duration = Duration::from_secs(5);
    pub(crate) const MAX: usize = 4096;

    fn lookup(&self, run_id: &str, fresh: bool) -> Option<RunHead> {
        let mut map = self.heads.lock().unwrap_or_else(|p| p.into_inner());
        map.tick += 1;
        let tick = map.tick;
        let entry = map.entries.get_mut(run_id)?;
        if fresh && entry.at.elapsed() >= Self::FRESH {
            return None;
        }
        entry.used = tick;
        Some(entry.head.clone())
    }

    /// The head last seen, of any age (what an append starts from).
    pub(crate) fn get(&self, run_id: &str) -> Option<RunHead> {
        self.lookup(run_id, false)
    }

    /// The head if seen within [`Self::FRESH`] (a coordinator's, for a child's decision).
    pub(crate) fn get_fresh(&self, run_id: &str) -> Option<RunHead> {
        self.lookup(run_id, true)
    }

    pub(crate) fn put(&self, head: &RunHead) {
        let mut map = self.heads.lock().unwrap_or_else(|p| p.into_inner());
        map.tick += 1;
        let tick = map.tick;
        // A slower reader's older head never replaces a newer one of the same run.
        if let Some(old) = map.entries.get(&head.run_id) {
            if old.head.incarnation == head.incarnation
                && (old.head.next_seq > head.next_seq
                    || (old.head.status.is_terminal() && !head.status.is_terminal()))
            {
                return;
            }
        }
        if map.entries.len() >= Self::MAX && !map.entries.contains_key(&head.run_id) {
            // Drop the least recently used half: amortised, one sort per MAX/2 inserts.
            let mut used: Vec<u64> = map.entries.values().map(|e| e.used).collect();
            used.sort_unstable();
            let cut = used[used.len() / 2];
            map.entries.retain(|_, e| e.used > cut);
        }
        map.entries.insert(
            head.run_id.clone(),
            RecentEntry {
                head: head.clone(),
                at: std::time::Instant::now(),
                used: tick,
            },
        );
    }

    pub(crate) fn forget(&self, run_id: &str) {
        let mut map = self.heads.lock().unwrap_or_else(|p| p.into_inner());
        map.entries.remove(run_id);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.heads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entries
            .len()
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
            recent: Default::default(),
            cards: Default::default(),
        }
    }

    /// Every call races on the head's condition, with no in-process queue: how separate
    /// processes (Lambda instances) meet. Used to test the conditional writes alone.
    pub fn without_lanes(mut self) -> Self {
        self.lanes = None;
        self
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

    /// The head an append starts from: the lane's, else the one this instance last wrote
    /// or read (see [`RecentHeads`]), else a strong read. A remembered head is used only
    /// while it is running and of the incarnation asked for; anything else is read again,
    /// so no answer (ended, not found) ever comes from memory alone.
    async fn append_head(
        &self,
        lane: &mut Option<&mut Lane>,
        run: RunRef<'_>,
    ) -> Result<RunHead, StoreError> {
        if let Some(head) = lane.as_mut().and_then(|l| l.head.take()) {
            run.check(&head)?;
            return Ok(head);
        }
        if let Some(head) = self.recent.get(run.run_id) {
            if !head.status.is_terminal() && run.check(&head).is_ok() {
                return Ok(head);
            }
        }
        self.live_head(run).await
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

    /// Whether the run id has left anything behind: an event, or an approval card or
    /// route (strongly consistent `Query`s with `Limit 1`, the second only when needed).
    async fn has_any_item(&self, run_id: &str) -> Result<bool, StoreError> {
        for table in [
            &self.tables.events,
            &self.tables.approvals,
            &self.tables.mutations,
        ] {
            let out = self
                .client
                .query()
                .table_name(table)
                .consistent_read(true)
                .key_condition_expression("run_id = :r")
                .expression_attribute_values(":r", s(run_id))
                .projection_expression("run_id")
                .limit(1)
                .send()
                .await
                .map_err(unavailable)?;
            if out.count > 0 {
                return Ok(true);
            }
        }
        Ok(false)
    }

    async fn get_head(&self, run_id: &str) -> Result<Option<RunHead>, StoreError> {
        let head = self.head_read(run_id, true).await?;
        match &head {
            Some(h) => self.recent.put(h),
            None => self.recent.forget(run_id),
        }
        Ok(head)
    }

    /// One `GetItem` of the head, strongly or eventually consistent.
    async fn head_read(&self, run_id: &str, strong: bool) -> Result<Option<RunHead>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.tables.runs)
            .key("run_id", s(run_id))
            .consistent_read(strong)
            .send()
            .await
            .map_err(unavailable)?;
        out.item.map(|item| head_from_item(&item)).transpose()
    }

    /// An eventually consistent read of the head (½ the read units): only for waiting
    /// on a change, never for a write's condition nor remembered (see
    /// [`crate::RunStore::read_head_lagging`]).
    async fn get_head_eventually(&self, run_id: &str) -> Result<Option<RunHead>, StoreError> {
        self.head_read(run_id, false).await
    }

    /// `run_id`'s head and the item `key` of `table` as one serializable snapshot
    /// (`TransactGetItems`): a transaction that writes both is seen whole or not at all.
    /// `None` when a transaction in flight cancelled the read (read again).
    pub(crate) async fn head_with_item(
        &self,
        run_id: &str,
        table: &str,
        key: item::Item,
    ) -> Result<Option<(Option<RunHead>, Option<item::Item>)>, StoreError> {
        use aws_sdk_dynamodb::error::SdkError;
        use aws_sdk_dynamodb::operation::transact_get_items::TransactGetItemsError;
        use aws_sdk_dynamodb::types::{Get, TransactGetItem};
        let get = |table: &str, key: item::Item| -> Result<TransactGetItem, StoreError> {
            Ok(TransactGetItem::builder()
                .get(
                    Get::builder()
                        .table_name(table)
                        .set_key(Some(key))
                        .build()
                        .map_err(build_error)?,
                )
                .build())
        };
        let head_key = HashMap::from([("run_id".to_owned(), s(run_id))]);
        let result = self
            .client
            .transact_get_items()
            .transact_items(get(&self.tables.runs, head_key)?)
            .transact_items(get(table, key)?)
            .send()
            .await;
        let out = match result {
            Ok(out) => out,
            Err(SdkError::ServiceError(ctx))
                if matches!(
                    ctx.err(),
                    TransactGetItemsError::TransactionCanceledException(_)
                ) =>
            {
                return Ok(None)
            }
            Err(e) => return Err(unavailable(e)),
        };
        let mut responses = out.responses.unwrap_or_default().into_iter();
        let head = responses
            .next()
            .and_then(|r| r.item)
            .map(|i| head_from_item(&i))
            .transpose()?;
        let other = responses.next().and_then(|r| r.item);
        Ok(Some((head, other)))
    }

    /// `run_id`'s head as this process last saw it within seconds, else a strong read.
    /// Only for heads a write is then conditioned on (see [`RecentHeads`]).
    async fn recent_head(&self, run_id: &str) -> Result<Option<RunHead>, StoreError> {
        match self.recent.get_fresh(run_id) {
            Some(head) => Ok(Some(head)),
            None => self.get_head(run_id).await,
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

    async fn query_events(
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
                let event = item::stored_event_from_item(&item)?;
                bytes += event.body.len();
                collected.push(event);
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

#[cfg(test)]
mod tests {
    use super::RecentHeads;
    use tollgate_domain::RunHead;

    fn head(run_id: &str, next_seq: u64) -> RunHead {
        let mut h = RunHead::new_for_test(run_id, None);
        h.next_seq = next_seq;
        h.incarnation = "first".into();
        h
    }

    #[test]
    fn remembered_heads_are_bounded_and_keep_the_recently_used() {
        let recent = RecentHeads::default();
        recent.put(&head("kept", 2));
        for i in 0..RecentHeads::MAX * 2 {
            recent.put(&head(&format!("r{i}"), 2));
            // `kept` is used all along, so it outlives every eviction.
            assert!(recent.get("kept").is_some(), "after {i} puts");
        }
        assert!(recent.len() <= RecentHeads::MAX);
        assert!(
            recent.get("r0").is_none(),
            "the least recently used went first"
        );
        assert!(recent
            .get(&format!("r{}", RecentHeads::MAX * 2 - 1))
            .is_some());
    }

    #[test]
    fn an_older_head_never_replaces_a_newer_one() {
        let recent = RecentHeads::default();
        recent.put(&head("r", 9));
        recent.put(&head("r", 4));
        assert_eq!(recent.get("r").map(|h| h.next_seq), Some(9));
        let mut other = head("r", 2);
        other.incarnation = "another".into();
        recent.put(&other);
        assert_eq!(
            recent.get("r").map(|h| h.incarnation),
            Some("another".into())
        );
    }
}
