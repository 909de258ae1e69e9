//! [`CountingTimers`] / [`CountingHandler`]: the timer port and its consumer, counted by
//! kind of message.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tollgate_timers::{TimerError, TimerHandler, TimerMessage, TimerQueue};

/// The timer messages of a scenario, by kind (`TimerMessage::kind`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimerTally {
    /// `schedule` calls: SQS `SendMessage`s.
    pub sent: BTreeMap<&'static str, u64>,
    /// Deliveries to the handler (a retry is another): `ReceiveMessage`s, and
    /// invocations of the `timers` function.
    pub delivered: BTreeMap<&'static str, u64>,
    /// Deliveries the handler acknowledged: `DeleteMessage`s.
    pub acked: BTreeMap<&'static str, u64>,
    /// Deliveries running now.
    pub in_flight: u64,
}

impl TimerTally {
    pub fn sent_total(&self) -> u64 {
        self.sent.values().sum()
    }
    pub fn delivered_total(&self) -> u64 {
        self.delivered.values().sum()
    }
    pub fn acked_total(&self) -> u64 {
        self.acked.values().sum()
    }

    /// Every message sent has been handled and acknowledged, and nothing is running.
    pub fn settled(&self) -> bool {
        self.in_flight == 0 && self.sent_total() == self.acked_total()
    }
}

/// Shared by a [`CountingTimers`] and its [`CountingHandler`].
#[derive(Debug)]
pub struct TimerCounts {
    pub(super) tally: tokio::sync::watch::Sender<TimerTally>,
}

impl Default for TimerCounts {
    fn default() -> Self {
        Self {
            tally: tokio::sync::watch::Sender::new(TimerTally::default()),
        }
    }
}

impl TimerCounts {
    pub fn tally(&self) -> TimerTally {
        self.tally.borrow().clone()
    }

    /// Waits (at most `timeout`) until `done` holds for the tally; whether it did.
    pub async fn wait_for(&self, timeout: Duration, done: impl FnMut(&TimerTally) -> bool) -> bool {
        let mut rx = self.tally.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(done))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    fn sent(&self, kind: &'static str) {
        self.tally
            .send_modify(|t| *t.sent.entry(kind).or_insert(0) += 1);
    }
}

/// A [`TimerQueue`] that counts what it schedules (one SQS `SendMessage` each) and
/// hands it on to `inner`.
pub struct CountingTimers<Q> {
    inner: Q,
    counts: Arc<TimerCounts>,
}

impl<Q: TimerQueue> CountingTimers<Q> {
    pub fn new(inner: Q, counts: Arc<TimerCounts>) -> Self {
        Self { inner, counts }
    }
}

#[async_trait::async_trait]
impl<Q: TimerQueue> TimerQueue for CountingTimers<Q> {
    async fn schedule(&self, message: &TimerMessage, delay: Duration) -> Result<(), TimerError> {
        self.counts.sent(message.kind());
        self.inner.schedule(message, delay).await
    }
}

/// A [`TimerHandler`] that counts each delivery (one `ReceiveMessage` and one `timers`
/// invocation) and each acknowledgement (one `DeleteMessage`) around `inner`.
pub struct CountingHandler {
    inner: Arc<dyn TimerHandler>,
    counts: Arc<TimerCounts>,
}

impl CountingHandler {
    pub fn new(inner: Arc<dyn TimerHandler>, counts: Arc<TimerCounts>) -> Self {
        Self { inner, counts }
    }
}

#[async_trait::async_trait]
impl TimerHandler for CountingHandler {
    async fn handle(&self, message: TimerMessage) -> Result<(), TimerError> {
        let kind = message.kind();
        self.counts.tally.send_modify(|t| {
            *t.delivered.entry(kind).or_insert(0) += 1;
            t.in_flight += 1;
        });
        let result = self.inner.handle(message).await;
        self.counts.tally.send_modify(|t| {
            if result.is_ok() {
                *t.acked.entry(kind).or_insert(0) += 1;
            }
            t.in_flight -= 1;
        });
        result
    }
}
