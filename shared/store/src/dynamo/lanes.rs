//! Per-run write lanes inside one process (group commit).

use std::collections::HashMap;

use tollgate_domain::{EventDraft, RunHead};

use crate::StoreError;

/// Appends to one run from one process go through a lane instead of racing each other
/// on the head's condition. Waiting appends queue up, and whoever holds the lane writes
/// the queue's head requests together in one transaction (group commit: whole requests,
/// at most 99 events, no `event_id` twice), so N concurrent writers cost far fewer than
/// N transactions. The lane also remembers the head it last wrote, so a queued append
/// skips the read: a stale head only fails the condition, which returns the current
/// head. The conditional head update still decides between processes (Lambda
/// instances), so correctness never rests on the lane.
#[derive(Default)]
pub(crate) struct RunLanes(std::sync::Mutex<HashMap<String, std::sync::Weak<LaneState>>>);

#[derive(Default)]
pub(crate) struct LaneState {
    /// Appends waiting to be written, in arrival order.
    pub(crate) queue: std::sync::Mutex<std::collections::VecDeque<QueuedAppend>>,
    /// Held by whoever writes to the run from this process.
    pub(crate) writer: std::sync::Arc<tokio::sync::Mutex<Option<RunHead>>>,
}

pub(crate) struct QueuedAppend {
    /// The incarnation the caller's token names (`None`: any).
    pub(crate) incarnation: Option<String>,
    pub(crate) events: Vec<EventDraft>,
    /// Rough size of the events as stored (payload JSON plus envelope allowance).
    pub(crate) bytes: usize,
    pub(crate) reply: tokio::sync::oneshot::Sender<Result<Vec<u64>, StoreError>>,
}

/// A group stays well under DynamoDB's 4 MB transaction size (one request alone is at
/// most 256 KiB of body).
const MAX_GROUP_BYTES: usize = 3 * 1024 * 1024;

/// The right to write to one run from this process, with the head it last wrote.
pub(crate) struct Lane {
    pub(crate) state: std::sync::Arc<LaneState>,
    pub(crate) head: tokio::sync::OwnedMutexGuard<Option<RunHead>>,
}

impl RunLanes {
    pub(crate) fn state(&self, run_id: &str) -> std::sync::Arc<LaneState> {
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
    pub(crate) async fn enter(state: std::sync::Arc<LaneState>) -> Self {
        let head = state.writer.clone().lock_owned().await;
        Self { state, head }
    }

    /// The next group of queued appends: whole requests in arrival order, at most
    /// [`MAX_BATCH_EVENTS`] events, no `event_id` twice (a retry racing its original
    /// waits for the next group, where it finds the original's sequence).
    pub(crate) fn take_group(&self) -> Vec<QueuedAppend> {
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

/// Rough size of events as stored (payload JSON plus an envelope allowance).
pub(crate) fn approx_stored_bytes(events: &[EventDraft]) -> usize {
    events
        .iter()
        .map(|e| serde_json::to_vec(&e.payload).map_or(0, |v| v.len()) + 512)
        .sum()
}
