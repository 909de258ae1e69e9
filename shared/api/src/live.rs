//! Live delivery's plumbing (docs/architecture.md §5): `GET /api/live` (which live
//! endpoints serve here), and the per-run wake-ups a process's live tails wait on when
//! its store has no write signal of its own — fed by the process's DynamoDB Streams
//! reader ([`crate::stream_reader`], `tollgate serve --backend aws`).
//!
//! A wake-up only says "read this run's head again": every tail then reads the gap-safe
//! page from the store, so a wake-up lost, late or repeated delays an event at most (the
//! tail's safety poll, [`Wakes::safety_poll`]), never skips or repeats one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use tokio::sync::watch;
use tollgate_protocol::ws::LiveEndpoints;

use crate::Deps;

/// How often a tail woken by the stream reader reads its run's head anyway (the reader
/// may have failed or fallen behind).
pub const SAFETY_POLL: Duration = Duration::from_secs(30);

/// The environment variable naming the WebSocket endpoint `GET /api/live` advertises
/// (the deployed API Gateway WebSocket URL).
pub const WEBSOCKET_URL_VAR: &str = "TOLLGATE_WEBSOCKET_URL";

/// `TOLLGATE_WEBSOCKET_URL`, when set and not empty.
pub fn websocket_url_from_env() -> Option<String> {
    std::env::var(WEBSOCKET_URL_VAR)
        .ok()
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// `TOLLGATE_LIVE_SAFETY_POLL_SECONDS` (1 to 86400; default [`SAFETY_POLL`]).
pub fn safety_poll_from_env() -> Result<Duration, crate::ConfigError> {
    match std::env::var("TOLLGATE_LIVE_SAFETY_POLL_SECONDS")
        .ok()
        .filter(|v| !v.trim().is_empty())
    {
        None => Ok(SAFETY_POLL),
        Some(v) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|s| (1..=86_400).contains(s))
            .map(Duration::from_secs)
            .ok_or_else(|| {
                crate::ConfigError::Invalid(
                    "TOLLGATE_LIVE_SAFETY_POLL_SECONDS must be a whole number of seconds, 1 to 86400"
                        .into(),
                )
            }),
    }
}

/// `GET /api/live`: public, like the console's configuration.
pub fn routes() -> Router<Deps> {
    // The path is `tollgate_protocol::ws::LIVE_PATH` (spelled out: the route lists read it).
    Router::new().route("/api/live", get(live_endpoints))
}

async fn live_endpoints(State(deps): State<Deps>) -> Json<LiveEndpoints> {
    Json(LiveEndpoints {
        websocket_url: deps.websocket_url.clone(),
        sse: true,
    })
}

/// Per-run wake-ups: a watch channel per run that some tail in this process follows.
/// Cheap to wake a run nobody follows (a map look-up).
pub struct Wakes {
    runs: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// Calls to [`Wakes::watch`], to prune the map of runs nobody follows any more.
    watches: AtomicU64,
    safety: Duration,
    /// Set once a stream reader feeding these wake-ups reads the stream.
    reading: watch::Sender<bool>,
    /// The stream reader's last failure, if any (for diagnosis).
    failure: Mutex<Option<String>>,
}

impl Default for Wakes {
    fn default() -> Self {
        Self::new(SAFETY_POLL)
    }
}

impl Wakes {
    pub fn new(safety: Duration) -> Self {
        Self {
            runs: Mutex::new(HashMap::new()),
            watches: AtomicU64::new(0),
            safety,
            reading: watch::Sender::new(false),
            failure: Mutex::new(None),
        }
    }

    /// Marks that a stream reader reads the stream now (its shard iterators are set).
    pub fn set_reading(&self) {
        self.reading.send_replace(true);
    }

    /// Records the stream reader's failure.
    pub fn set_failure(&self, failure: String) {
        self.reading.send_replace(false);
        *self.failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(failure);
    }

    /// The stream reader's last failure, if any.
    pub fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Waits until a stream reader feeding these wake-ups reads the stream: writes
    /// after that wake their followers without waiting for the safety poll.
    pub async fn reading(&self) {
        let mut rx = self.reading.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    /// How often a tail reads the head even when nothing woke it.
    pub fn safety_poll(&self) -> Duration {
        self.safety
    }

    /// A receiver that changes whenever `run_id` is woken.
    pub fn watch(&self, run_id: &str) -> watch::Receiver<u64> {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        if self.watches.fetch_add(1, Ordering::Relaxed) % 256 == 255 {
            runs.retain(|_, tx| tx.receiver_count() > 0);
        }
        runs.entry(run_id.to_owned())
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe()
    }

    /// Wakes the tails of `run_id` in this process, if any.
    pub fn wake(&self, run_id: &str) {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = runs.get(run_id) {
            if tx.receiver_count() == 0 {
                runs.remove(run_id);
            } else {
                tx.send_modify(|v| *v = v.wrapping_add(1));
            }
        }
    }

    /// Wakes every followed run (the stream reader restarted: records may have been
    /// missed in between).
    pub fn wake_all(&self) {
        let runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        for tx in runs.values() {
            tx.send_modify(|v| *v = v.wrapping_add(1));
        }
    }

    /// Runs followed now (for tests and metrics).
    pub fn followed(&self) -> usize {
        let runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        runs.values().filter(|tx| tx.receiver_count() > 0).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wake_reaches_the_runs_watchers_only() {
        let wakes = Wakes::default();
        let mut a = wakes.watch("a");
        let b = wakes.watch("b");
        wakes.wake("a");
        assert!(a.has_changed().unwrap());
        assert!(!b.has_changed().unwrap());
        a.mark_unchanged();
        wakes.wake_all();
        assert!(a.has_changed().unwrap() && b.has_changed().unwrap());
        drop(b);
        wakes.wake("b");
        assert_eq!(wakes.followed(), 1);
    }
}
