//! In-process timers on tokio, for `tollgate serve` and tests.
//!
//! The handler needs the queue (a heartbeat schedules the next one, an early expiry
//! schedules the rest) and the queue needs the handler, so the two are wired in two
//! steps and no `Arc` cycle is ever formed:
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use tollgate_timers::{EmbeddedTimers, TimerHandler, TimerQueue};
//! # fn approval_use_cases(queue: Arc<dyn TimerQueue>) -> Arc<dyn TimerHandler> { unimplemented!() }
//! # async fn wire() {
//! let timers = EmbeddedTimers::new();                       // a TimerQueue already
//! let handler = approval_use_cases(Arc::new(timers.clone())); // holds the queue
//! let timer_loop = timers.attach(handler);                   // the loop holds the handler
//! // ... serve ...
//! timer_loop.shutdown().await;                               // or drop it
//! # }
//! ```
//!
//! The queue's state holds messages only; the handler lives in the delivery task that
//! [`EmbeddedTimers::attach`] spawns, and that task ends when its [`TimerLoop`] is shut
//! down or dropped, releasing the handler (and with it the handler's queue handle).

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::{TimerError, TimerHandler, TimerMessage, TimerQueue};

/// Deliveries running at once; the rest wait (late, never lost) for a slot.
const MAX_IN_FLIGHT: usize = 16;

/// How long a shutdown waits for deliveries already running before aborting them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A delay no process lives to see; keeps `now + delay` from overflowing.
const FAR_FUTURE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// How a failed delivery (`Err` or a panic in the handler) is retried: after
/// `first_backoff`, doubling up to `max_backoff`, until `max_attempts` deliveries in all
/// have failed; then the message is dropped with an error log (SQS would move it to the
/// dead-letter queue).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub max_attempts: u32,
    pub first_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// Five deliveries, as the timer queue's `maxReceiveCount` in `infra/template.yaml`.
    fn default() -> Self {
        Self {
            max_attempts: 5,
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait after the `failed_attempt`-th delivery (1-based) failed.
    fn backoff(&self, failed_attempt: u32) -> Duration {
        let doublings = failed_attempt.saturating_sub(1).min(20);
        self.first_backoff
            .saturating_mul(1 << doublings)
            .min(self.max_backoff)
    }
}

/// The in-process [`TimerQueue`]. Cheap to clone; all clones are one queue.
///
/// Messages scheduled before [`attach`](Self::attach) wait for it; after the loop has
/// stopped, [`schedule`](TimerQueue::schedule) answers [`TimerError::Unavailable`].
#[derive(Clone)]
pub struct EmbeddedTimers {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for EmbeddedTimers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.shared.lock();
        f.debug_struct("EmbeddedTimers")
            .field("phase", &state.phase)
            .field("pending", &state.pending.len())
            .finish()
    }
}

struct Shared {
    state: Mutex<State>,
    /// Wakes the loop: a new message (maybe due sooner than what it sleeps for) or a stop.
    wake: Notify,
    retry: RetryPolicy,
}

struct State {
    pending: BinaryHeap<Reverse<Pending>>,
    /// Ties on the due instant go in scheduling order.
    next_seq: u64,
    phase: Phase,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No handler attached yet: messages wait.
    Waiting,
    Running,
    Stopped,
}

struct Pending {
    due: Instant,
    seq: u64,
    /// 1-based number of this delivery.
    attempt: u32,
    message: TimerMessage,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Pending {}
impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Pending {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.due, self.seq).cmp(&(other.due, other.seq))
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No critical section can panic half-way, so a poisoned state is still whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn push(&self, message: TimerMessage, delay: Duration, attempt: u32) -> Result<(), TimerError> {
        let now = Instant::now();
        let due = now.checked_add(delay).unwrap_or_else(|| now + FAR_FUTURE);
        {
            let mut state = self.lock();
            if state.phase == Phase::Stopped {
                return Err(TimerError::Unavailable(
                    "the embedded timer loop has stopped".into(),
                ));
            }
            let seq = state.next_seq;
            state.next_seq += 1;
            state.pending.push(Reverse(Pending {
                due,
                seq,
                attempt,
                message,
            }));
        }
        // Stores a permit when the loop is not waiting yet, so no wake-up is lost.
        self.wake.notify_one();
        Ok(())
    }

    fn stop(&self) {
        self.lock().phase = Phase::Stopped;
        self.wake.notify_one();
    }
}

impl Default for EmbeddedTimers {
    fn default() -> Self {
        Self::new()
    }
}

impl EmbeddedTimers {
    /// A queue with the default [`RetryPolicy`]; nothing runs until [`attach`](Self::attach).
    pub fn new() -> Self {
        Self::with_retry(RetryPolicy::default())
    }

    pub fn with_retry(retry: RetryPolicy) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: Mutex::new(State {
                    pending: BinaryHeap::new(),
                    next_seq: 0,
                    phase: Phase::Waiting,
                }),
                wake: Notify::new(),
                retry,
            }),
        }
    }

    /// Starts delivering to `handler` on the current tokio runtime: each message once its
    /// delay has passed, earliest due first, up to 16 at once. The loop runs until the
    /// returned [`TimerLoop`] is shut down or dropped.
    ///
    /// # Panics
    /// Outside a tokio runtime, or when a handler was attached before (wiring errors).
    pub fn attach(&self, handler: Arc<dyn TimerHandler>) -> TimerLoop {
        {
            let mut state = self.shared.lock();
            assert!(
                state.phase == Phase::Waiting,
                "EmbeddedTimers::attach: a handler was already attached to this queue"
            );
            state.phase = Phase::Running;
        }
        let task = tokio::spawn(run_loop(Arc::clone(&self.shared), handler));
        TimerLoop {
            shared: Arc::clone(&self.shared),
            task: Some(task),
        }
    }

    /// Messages waiting for their due time or a retry (not those being delivered).
    pub fn pending(&self) -> usize {
        self.shared.lock().pending.len()
    }
}

#[async_trait::async_trait]
impl TimerQueue for EmbeddedTimers {
    async fn schedule(&self, message: &TimerMessage, delay: Duration) -> Result<(), TimerError> {
        self.shared.push(message.clone(), delay, 1)
    }
}

/// The running delivery loop of an [`EmbeddedTimers`]. Dropping it stops the loop too
/// (deliveries already running get up to 5 s to finish, in the background).
#[must_use = "dropping the TimerLoop stops the delivery of timers"]
pub struct TimerLoop {
    shared: Arc<Shared>,
    task: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for TimerLoop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimerLoop").finish_non_exhaustive()
    }
}

impl TimerLoop {
    /// Stops the loop: waiting messages are discarded, later `schedule` calls fail, and
    /// deliveries already running get up to 5 s to finish before they are aborted.
    /// Returns once the loop has ended and released the handler.
    pub async fn shutdown(mut self) {
        self.shared.stop();
        if let Some(task) = self.task.take() {
            if let Err(err) = task.await {
                tracing::error!(error = %err, "embedded timer loop ended abnormally");
            }
        }
    }
}

impl Drop for TimerLoop {
    fn drop(&mut self) {
        self.shared.stop();
    }
}

async fn run_loop(shared: Arc<Shared>, handler: Arc<dyn TimerHandler>) {
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let mut in_flight = JoinSet::new();
    loop {
        while let Some(done) = in_flight.try_join_next() {
            if let Err(err) = done {
                tracing::error!(error = %err, "timer delivery task failed");
            }
        }
        let next_due = {
            let state = shared.lock();
            if state.phase == Phase::Stopped {
                break;
            }
            state.pending.peek().map(|Reverse(p)| p.due)
        };
        match next_due {
            None => shared.wake.notified().await,
            Some(due) if due > Instant::now() => {
                tokio::select! {
                    _ = tokio::time::sleep_until(due) => {}
                    _ = shared.wake.notified() => {}
                }
            }
            Some(_) => {
                let slot = tokio::select! {
                    slot = Arc::clone(&slots).acquire_owned() => slot,
                    // A stop (or a new message) while all slots are busy: look again.
                    _ = shared.wake.notified() => continue,
                };
                let Ok(slot) = slot else { break }; // never closed
                let next = {
                    let mut state = shared.lock();
                    if state.phase == Phase::Stopped {
                        break;
                    }
                    match state.pending.peek() {
                        Some(Reverse(p)) if p.due <= Instant::now() => state.pending.pop(),
                        _ => None,
                    }
                };
                if let Some(Reverse(pending)) = next {
                    in_flight.spawn(deliver(
                        Arc::clone(&shared),
                        Arc::clone(&handler),
                        pending,
                        slot,
                    ));
                }
            }
        }
    }
    let discarded = {
        let mut state = shared.lock();
        let n = state.pending.len();
        state.pending.clear();
        n
    };
    if discarded > 0 {
        tracing::info!(
            discarded,
            "embedded timer loop stopped; waiting timers discarded"
        );
    }
    let drain = async { while in_flight.join_next().await.is_some() {} };
    if tokio::time::timeout(SHUTDOWN_GRACE, drain).await.is_err() {
        tracing::warn!(
            running = in_flight.len(),
            "embedded timer deliveries still running at shutdown; aborting them"
        );
        in_flight.abort_all();
    }
}

/// One delivery; a failure goes back into the queue after the backoff, so a stop also
/// ends pending retries.
async fn deliver(
    shared: Arc<Shared>,
    handler: Arc<dyn TimerHandler>,
    pending: Pending,
    _slot: OwnedSemaphorePermit,
) {
    let Pending {
        attempt, message, ..
    } = pending;
    let outcome = AssertUnwindSafe(handler.handle(message.clone()))
        .catch_unwind()
        .await;
    let error = match outcome {
        Ok(Ok(())) => return,
        Ok(Err(err)) => err.to_string(),
        Err(_) => "the handler panicked".to_owned(),
    };
    let retry = shared.retry;
    if attempt >= retry.max_attempts {
        tracing::error!(
            kind = message.kind(),
            run_id = message.run_id(),
            request_id = message.request_id(),
            attempt,
            %error,
            "timer failed on every attempt; dropped"
        );
        return;
    }
    let backoff = retry.backoff(attempt);
    tracing::warn!(
        kind = message.kind(),
        run_id = message.run_id(),
        request_id = message.request_id(),
        attempt,
        retry_in_ms = u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX),
        %error,
        "timer failed; retrying"
    );
    // Fails only when the loop has stopped, which discards waiting timers anyway.
    let _ = shared.push(message, backoff, attempt + 1);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering as AtomicOrdering};
    use tokio::sync::mpsc;

    fn beat(request_id: &str) -> TimerMessage {
        TimerMessage::ApprovalHeartbeat {
            run_id: "run-embedded".into(),
            request_id: request_id.into(),
            beat: 1,
        }
    }

    /// Records each delivery (message, time since the test's start) on a channel and
    /// fails the first `failures` deliveries.
    struct Recorder {
        start: Instant,
        tx: mpsc::UnboundedSender<(TimerMessage, Duration)>,
        failures: AtomicU32,
        panic_instead: bool,
    }

    #[async_trait::async_trait]
    impl TimerHandler for Recorder {
        async fn handle(&self, message: TimerMessage) -> Result<(), TimerError> {
            let _ = self.tx.send((message, self.start.elapsed()));
            let left = self.failures.load(AtomicOrdering::SeqCst);
            if left > 0 {
                self.failures.store(left - 1, AtomicOrdering::SeqCst);
                if self.panic_instead {
                    panic!("handler panics on purpose");
                }
                return Err(TimerError::Unavailable("store is down".into()));
            }
            Ok(())
        }
    }

    fn recorder(
        failures: u32,
    ) -> (
        Arc<Recorder>,
        mpsc::UnboundedReceiver<(TimerMessage, Duration)>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let handler = Arc::new(Recorder {
            start: Instant::now(),
            tx,
            failures: AtomicU32::new(failures),
            panic_instead: false,
        });
        (handler, rx)
    }

    /// Lets every ready task run and the paused clock move past everything due by then.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_delivered_before_its_delay() {
        // GIVEN a timer due in 10 s
        let timers = EmbeddedTimers::new();
        let (handler, mut rx) = recorder(0);
        let _loop = timers.attach(handler);
        timers
            .schedule(&beat("q-1"), Duration::from_secs(10))
            .await
            .unwrap();

        // WHEN 9.9 s pass THEN nothing has been delivered
        tokio::time::sleep(Duration::from_millis(9_900)).await;
        settle().await;
        assert!(rx.try_recv().is_err(), "delivered early");
        assert_eq!(timers.pending(), 1);

        // WHEN the delay has passed THEN it is delivered once, at 10 s
        let (message, at) = rx.recv().await.unwrap();
        assert_eq!(message, beat("q-1"));
        assert_eq!(at, Duration::from_secs(10));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(rx.try_recv().is_err(), "delivered twice");
        assert_eq!(timers.pending(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn delivery_follows_due_time_not_scheduling_order() {
        // GIVEN timers scheduled out of order, one far beyond SQS's 15 minutes
        let timers = EmbeddedTimers::new();
        let (handler, mut rx) = recorder(0);
        let _loop = timers.attach(handler);
        for (id, secs) in [("c", 3_600), ("a", 10), ("b", 20), ("a2", 10)] {
            timers
                .schedule(&beat(id), Duration::from_secs(secs))
                .await
                .unwrap();
        }

        // THEN they arrive by due time, ties in scheduling order, each at its due time
        let mut seen = Vec::new();
        for _ in 0..4 {
            let (message, at) = rx.recv().await.unwrap();
            seen.push((message.request_id().to_owned(), at.as_secs()));
        }
        assert_eq!(
            seen,
            [
                ("a".to_owned(), 10),
                ("a2".to_owned(), 10),
                ("b".to_owned(), 20),
                ("c".to_owned(), 3_600)
            ]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_message_due_sooner_than_the_one_slept_for_wakes_the_loop() {
        let timers = EmbeddedTimers::new();
        let (handler, mut rx) = recorder(0);
        let _loop = timers.attach(handler);
        timers
            .schedule(&beat("late"), Duration::from_secs(600))
            .await
            .unwrap();
        settle().await; // the loop now sleeps until 600 s
        timers
            .schedule(&beat("soon"), Duration::from_secs(5))
            .await
            .unwrap();
        let (message, at) = rx.recv().await.unwrap();
        assert_eq!((message.request_id(), at), ("soon", Duration::from_secs(5)));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_delivery_is_retried_with_backoff() {
        // GIVEN a handler that fails twice
        let timers = EmbeddedTimers::new();
        let (handler, mut rx) = recorder(2);
        let _loop = timers.attach(handler);
        timers.schedule(&beat("q"), Duration::ZERO).await.unwrap();

        // THEN it is delivered at 0 s, 1 s (backoff 1 s) and 3 s (backoff 2 s), then not again
        let mut at = Vec::new();
        for _ in 0..3 {
            at.push(rx.recv().await.unwrap().1.as_secs());
        }
        assert_eq!(at, [0, 1, 3]);
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn retries_are_bounded_and_a_panic_counts_as_a_failure() {
        // GIVEN a handler that panics on every delivery, and 3 attempts allowed
        let retry = RetryPolicy {
            max_attempts: 3,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(150),
        };
        let timers = EmbeddedTimers::with_retry(retry);
        let (tx, mut rx) = mpsc::unbounded_channel();
        let handler = Arc::new(Recorder {
            start: Instant::now(),
            tx,
            failures: AtomicU32::new(u32::MAX),
            panic_instead: true,
        });
        let _loop = timers.attach(handler);
        timers.schedule(&beat("q"), Duration::ZERO).await.unwrap();

        // THEN exactly 3 deliveries (backoffs 100 ms, then 150 ms capped), then it is dropped
        let mut at = Vec::new();
        for _ in 0..3 {
            at.push(rx.recv().await.unwrap().1.as_millis());
        }
        assert_eq!(at, [0, 100, 250]);
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert!(rx.try_recv().is_err());
        assert_eq!(timers.pending(), 0);
    }

    #[test]
    fn backoff_doubles_up_to_its_cap() {
        let retry = RetryPolicy::default();
        let secs: Vec<u64> = (1..=7).map(|n| retry.backoff(n).as_secs()).collect();
        assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30]);
        assert_eq!(retry.backoff(u32::MAX), Duration::from_secs(30));
    }

    /// The heartbeat shape: the handler holds the queue and schedules its own follow-up.
    struct Heartbeats {
        queue: Arc<dyn TimerQueue>,
        start: Instant,
        tx: mpsc::UnboundedSender<(u32, Duration)>,
    }

    #[async_trait::async_trait]
    impl TimerHandler for Heartbeats {
        async fn handle(&self, message: TimerMessage) -> Result<(), TimerError> {
            let TimerMessage::ApprovalHeartbeat {
                run_id,
                request_id,
                beat,
            } = message
            else {
                return Ok(());
            };
            let _ = self.tx.send((beat, self.start.elapsed()));
            if self.start.elapsed() < Duration::from_secs(60) {
                let next = TimerMessage::ApprovalHeartbeat {
                    run_id,
                    request_id,
                    beat: beat + 1,
                };
                self.queue.schedule(&next, Duration::from_secs(20)).await?;
            }
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_handler_holding_the_queue_schedules_follow_ups_and_is_released_on_shutdown() {
        // GIVEN a handler wired to the queue it is attached to
        let timers = EmbeddedTimers::new();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let handler = Arc::new(Heartbeats {
            queue: Arc::new(timers.clone()),
            start: Instant::now(),
            tx,
        });
        // a message scheduled before attach waits for it
        timers
            .schedule(&beat("q"), Duration::from_secs(20))
            .await
            .unwrap();
        let timer_loop = timers.attach(Arc::clone(&handler) as Arc<dyn TimerHandler>);

        // THEN the heartbeats come every 20 s until the handler stops re-scheduling
        let mut beats = Vec::new();
        for _ in 0..3 {
            let (beat, at) = rx.recv().await.unwrap();
            beats.push((beat, at.as_secs()));
        }
        assert_eq!(beats, [(1, 20), (2, 40), (3, 60)]);

        // WHEN the loop shuts down THEN it lets go of the handler (no cycle is left) and
        // the queue refuses new timers
        timers
            .schedule(&beat("never"), Duration::from_secs(1))
            .await
            .unwrap();
        timer_loop.shutdown().await;
        assert_eq!(Arc::strong_count(&handler), 1);
        assert_eq!(timers.pending(), 0);
        let refused = timers.schedule(&beat("after"), Duration::ZERO).await;
        assert!(matches!(refused, Err(TimerError::Unavailable(_))));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(rx.try_recv().is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_loop_stops_delivery() {
        let timers = EmbeddedTimers::new();
        let (handler, mut rx) = recorder(0);
        let timer_loop = timers.attach(Arc::clone(&handler) as Arc<dyn TimerHandler>);
        timers
            .schedule(&beat("q"), Duration::from_secs(10))
            .await
            .unwrap();
        drop(timer_loop);
        tokio::time::sleep(Duration::from_secs(30)).await;
        settle().await;
        assert!(rx.try_recv().is_err());
        assert_eq!(Arc::strong_count(&handler), 1);
    }

    #[tokio::test]
    #[should_panic(expected = "already attached")]
    async fn attaching_twice_is_a_wiring_error() {
        let timers = EmbeddedTimers::new();
        let (handler, _rx) = recorder(0);
        let _first = timers.attach(Arc::clone(&handler) as Arc<dyn TimerHandler>);
        let _second = timers.attach(handler);
    }
}
