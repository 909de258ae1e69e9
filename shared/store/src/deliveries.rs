//! Delivery records of notifications (docs/architecture.md §10): one per (sink, project,
//! run, card, kind), written by the notifier before and after it delivers. The record is
//! what makes a notification go out once: it is created or claimed with a conditional
//! write ([`DeliveryStore::put_delivery`] on the version read), so two notifier
//! instances, or a redelivered stream record, find it claimed or done and send nothing.
//! A pending retry lives in the record (`next_attempt_at`), so it survives a restart.

use async_trait::async_trait;
use sha2::{Digest, Sha256};

use crate::StoreError;

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    /// Not delivered yet: being sent (while `leased_until` is ahead) or due again at
    /// `next_attempt_at`.
    Pending,
    /// Delivered.
    Sent,
    /// Given up (too many attempts, or a permanent refusal): kept for operators.
    Dead,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Sent => "sent",
            DeliveryState::Dead => "dead",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(DeliveryState::Pending),
            "sent" => Some(DeliveryState::Sent),
            "dead" => Some(DeliveryState::Dead),
            _ => None,
        }
    }
}

/// What a delivery is of: its sink and the card event, within one project.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeliveryKey {
    pub sink: String,
    /// The run's project (`-` for a run without one, as storage keys it).
    pub project: String,
    pub run_id: String,
    pub request_id: String,
    /// `armed` or `resolved`.
    pub kind: String,
}

impl DeliveryKey {
    /// The delivery's id: the same for the same key in every process (receivers dedupe
    /// on it), and different across projects.
    pub fn delivery_id(&self) -> String {
        let mut h = Sha256::new();
        for part in [
            &self.sink,
            &self.project,
            &self.run_id,
            &self.request_id,
            &self.kind,
        ] {
            h.update(part.as_bytes());
            h.update([0]);
        }
        format!("dlv_{}", &hex::encode(h.finalize())[..32])
    }
}

/// One delivery record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub key: DeliveryKey,
    /// [`DeliveryKey::delivery_id`].
    pub delivery_id: String,
    /// The sequence of the event that caused it.
    pub sequence: u64,
    pub state: DeliveryState,
    /// Attempts made so far.
    pub attempts: u32,
    /// When the next attempt is due (ms since the epoch; pending only).
    pub next_attempt_at: i64,
    /// A notifier is sending it until then (ms); nobody else claims it before.
    pub leased_until: i64,
    /// Why the last attempt failed (never a secret).
    pub last_error: Option<String>,
    /// What the sink returned for it (e.g. the message it posted).
    pub memo: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    /// Bumped by every write; a write is conditioned on the version it read.
    pub version: u64,
}

impl Delivery {
    /// A new record for `key`, due now, not yet claimed (version 0: not stored).
    pub fn new(key: DeliveryKey, sequence: u64, now: i64) -> Self {
        Self {
            delivery_id: key.delivery_id(),
            key,
            sequence,
            state: DeliveryState::Pending,
            attempts: 0,
            next_attempt_at: now,
            leased_until: 0,
            last_error: None,
            memo: None,
            created_at: now,
            updated_at: now,
            version: 0,
        }
    }
}

/// How long a sent delivery record is kept (it answers a redelivered stream record,
/// which comes within the stream's 24 hours).
pub const SENT_RETENTION_MS: i64 = 7 * 86_400_000;
/// How long a dead letter is kept for operators.
pub const DEAD_RETENTION_MS: i64 = 30 * 86_400_000;

/// When a record may be deleted (DynamoDB TTL, seconds): sent and dead records expire,
/// pending ones never.
pub fn expires_at(d: &Delivery) -> Option<i64> {
    match d.state {
        DeliveryState::Pending => None,
        DeliveryState::Sent => Some((d.updated_at + SENT_RETENTION_MS) / 1000),
        DeliveryState::Dead => Some((d.updated_at + DEAD_RETENTION_MS) / 1000),
    }
}

#[async_trait]
pub trait DeliveryStore: Send + Sync + 'static {
    /// Writes `record` (its `version` already the new one) only if the stored record's
    /// version is `expected` (`0`: only if there is none). `false`: the condition
    /// failed and nothing was written.
    async fn put_delivery(&self, record: &Delivery, expected: u64) -> Result<bool, StoreError>;

    async fn read_delivery(&self, delivery_id: &str) -> Result<Option<Delivery>, StoreError>;

    /// Pending deliveries due at `now` (every project: the notifier's retry loop), at
    /// most `limit`, shared out by [`fair_share`]: each project's earliest first, the
    /// projects taking turns, so one project with many due takes no more than its share
    /// while another has some (docs/architecture.md §10). DynamoDB chooses among the
    /// earliest [`DUE_WINDOW`] times `limit` due.
    async fn due_deliveries(&self, now: i64, limit: usize) -> Result<Vec<Delivery>, StoreError>;

    /// One project's dead letters, newest first, at most `limit`.
    async fn dead_letters(&self, project: &str, limit: usize) -> Result<Vec<Delivery>, StoreError>;

    /// When the sink named `sink` was first enabled (ms): the time stored, or `at` when
    /// none is — written then with a conditional write, so of several first writers one
    /// wins and every one answers its time. Kept for good: a notifier skips card events
    /// older than it (what a sink enabled for the first time finds in a stream's backlog,
    /// docs/architecture.md §10).
    async fn sink_enabled_at(&self, sink: &str, at: i64) -> Result<i64, StoreError>;
}

/// How many times `limit` of the earliest due deliveries
/// [`DeliveryStore::due_deliveries`] chooses from on DynamoDB (the index holds keys only:
/// each of those records is read).
pub const DUE_WINDOW: usize = 3;

/// At most `limit` of `items`, shared between projects: each project's items in order of
/// `at` (earliest first), and the projects taking turns, one item each per round, the
/// project whose earliest item is earliest going first. With `k` projects having items,
/// none gets more than `ceil(limit / k)` while the others still have some.
pub fn fair_share<T>(
    mut items: Vec<T>,
    limit: usize,
    project: impl Fn(&T) -> &str,
    at: impl Fn(&T) -> i64,
) -> Vec<T> {
    items.sort_by_key(&at);
    let mut queues: Vec<(String, std::collections::VecDeque<T>)> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for item in items {
        let p = project(&item).to_owned();
        let i = *index.entry(p.clone()).or_insert_with(|| {
            queues.push((p, std::collections::VecDeque::new()));
            queues.len() - 1
        });
        queues[i].1.push_back(item);
    }
    let mut chosen = Vec::with_capacity(limit);
    while chosen.len() < limit {
        let mut any = false;
        for (_, queue) in queues.iter_mut() {
            if chosen.len() == limit {
                break;
            }
            if let Some(item) = queue.pop_front() {
                chosen.push(item);
                any = true;
            }
        }
        if !any {
            break;
        }
    }
    chosen
}

/// The key under which [`DeliveryStore::sink_enabled_at`] is kept, beside the delivery
/// records (whose ids start `dlv_`).
pub fn sink_marker_id(sink: &str) -> String {
    format!("sink#{sink}")
}

#[cfg(test)]
mod tests {
    use super::fair_share;

    #[test]
    fn projects_take_turns_earliest_first() {
        // a floods (10, all earlier), b has 2, c has 1: a limit of 6 takes b's and c's.
        let mut items: Vec<(&str, i64)> = (0..10).map(|i| ("a", i)).collect();
        items.extend([("b", 100), ("c", 150), ("b", 200)]);
        let chosen = fair_share(items, 6, |(p, _)| p, |(_, at)| *at);
        assert_eq!(
            chosen,
            vec![
                ("a", 0),
                ("b", 100),
                ("c", 150),
                ("a", 1),
                ("b", 200),
                ("a", 2)
            ]
        );
        // Fewer than the limit: all of them, each project's in order.
        let all = fair_share(vec![("a", 3), ("a", 1)], 5, |(p, _)| p, |(_, at)| *at);
        assert_eq!(all, vec![("a", 1), ("a", 3)]);
        assert!(fair_share(vec![("a", 1)], 0, |(p, _)| p, |(_, at)| *at).is_empty());
    }
}
