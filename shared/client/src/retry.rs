//! When a request is tried again, and after how long.
//!
//! Every request this client sends is safe to repeat by the contract: creates carry a
//! `run_id` or `delivery_id`, appends carry an `event_id` per event, arms a
//! `request_id`, and `start`, `settle` and the terminal calls answer a repeat with the
//! same answer. A `dispatch` repeated after a lost answer is refused with `dispatched`
//! — the client then does not send (see [`crate::execution`]). So a transport error, a
//! 5xx or a 429 is retried, boundedly; any other 4xx is an answer and is never retried.

use std::time::Duration;

/// How many times, and how far apart, a request is tried.
///
/// The wait before retry `n` (1, 2, …) is drawn from `[cap/2, cap]` with
/// `cap = min(base_delay · 2^(n-1), max_delay)` (jitter, so many agents that failed
/// together do not retry together); a `Retry-After` the server sent raises it, up to
/// `max_retry_after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    pub max_attempts: u32,
    /// The cap of the first retry's wait.
    pub base_delay: Duration,
    /// The largest cap.
    pub max_delay: Duration,
    /// The longest `Retry-After` honoured.
    pub max_retry_after: Duration,
}

impl Default for RetryPolicy {
    /// 4 attempts, 200 ms doubling to 5 s, `Retry-After` up to 30 s.
    fn default() -> Self {
        Self {
            max_attempts: 4,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
            max_retry_after: Duration::from_secs(30),
        }
    }
}

/// The shortest wait before reopening a live stream, whatever the server's `retry:` hint.
pub(crate) const MIN_RECONNECT: Duration = Duration::from_millis(100);

/// The wait before reopening a live stream after `failures` (1, 2, …) failures in a row:
/// the server's `retry:` hint (at least [`MIN_RECONNECT`]), doubling, at most `max`.
pub(crate) fn reconnect_backoff(hint: Duration, failures: u32, max: Duration) -> Duration {
    let base = hint.clamp(MIN_RECONNECT, max);
    base.saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(max)
}

/// What one attempt came to, as far as retrying is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// The request could not be sent or the answer not read.
    TransportError,
    /// An answer with this status and `Retry-After`.
    Answered(u16, Option<Duration>),
}

/// What to do after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Next {
    /// Keep this outcome (success, a 4xx, or the attempts are used up).
    Stop,
    /// Try again after this long.
    RetryAfter(Duration),
}

impl RetryPolicy {
    /// No retries: one attempt.
    pub fn none() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }

    /// Whether an answer with this status is worth another attempt: 429 and the 5xx
    /// that mean "not now" (not 501 Not Implemented or 505).
    pub fn retryable_status(status: u16) -> bool {
        status == 429 || ((500..=599).contains(&status) && status != 501 && status != 505)
    }

    /// The upper bound of the wait before retry `retry` (1 for the first), before any
    /// `Retry-After`.
    pub fn backoff_cap(&self, retry: u32) -> Duration {
        let doublings = retry.saturating_sub(1).min(20);
        self.base_delay
            .saturating_mul(1u32 << doublings)
            .min(self.max_delay)
    }

    /// The wait before retry `retry`: jittered backoff, raised to the server's
    /// `Retry-After` (capped at `max_retry_after`).
    pub fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        let cap = self.backoff_cap(retry);
        let jittered = cap.mul_f64(0.5 + rand::random::<f64>() * 0.5);
        match retry_after {
            Some(hint) => jittered.max(hint.min(self.max_retry_after)),
            None => jittered,
        }
    }

    /// After attempt number `attempt` (1 for the first) came to `outcome`: stop or wait.
    pub(crate) fn next(&self, attempt: u32, outcome: Attempt) -> Next {
        let retry_after = match outcome {
            Attempt::TransportError => None,
            Attempt::Answered(status, retry_after) if Self::retryable_status(status) => retry_after,
            Attempt::Answered(..) => return Next::Stop,
        };
        if attempt >= self.max_attempts.max(1) {
            return Next::Stop;
        }
        Next::RetryAfter(self.delay(attempt, retry_after))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn only_transport_errors_429_and_5xx_are_retried() {
        let p = RetryPolicy::default();
        for status in [429, 500, 502, 503, 504] {
            assert!(
                matches!(
                    p.next(1, Attempt::Answered(status, None)),
                    Next::RetryAfter(_)
                ),
                "{status}"
            );
        }
        for status in [200, 201, 400, 401, 403, 404, 405, 409, 413, 501, 505] {
            assert_eq!(
                p.next(1, Attempt::Answered(status, None)),
                Next::Stop,
                "{status}"
            );
        }
        assert!(matches!(
            p.next(1, Attempt::TransportError),
            Next::RetryAfter(_)
        ));
    }

    #[test]
    fn attempts_are_bounded() {
        let p = RetryPolicy::default();
        assert!(matches!(
            p.next(3, Attempt::TransportError),
            Next::RetryAfter(_)
        ));
        assert_eq!(p.next(4, Attempt::TransportError), Next::Stop);
        assert_eq!(p.next(u32::MAX, Attempt::Answered(503, None)), Next::Stop);
        let none = RetryPolicy::none();
        assert_eq!(none.next(1, Attempt::TransportError), Next::Stop);
        let zero = RetryPolicy {
            max_attempts: 0,
            ..RetryPolicy::default()
        };
        assert_eq!(zero.next(1, Attempt::TransportError), Next::Stop);
    }

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter_below_it() {
        let p = RetryPolicy::default();
        assert_eq!(p.backoff_cap(1), MS(200));
        assert_eq!(p.backoff_cap(2), MS(400));
        assert_eq!(p.backoff_cap(4), MS(1600));
        assert_eq!(p.backoff_cap(6), Duration::from_secs(5));
        assert_eq!(p.backoff_cap(u32::MAX), Duration::from_secs(5));
        for retry in 1..8 {
            for _ in 0..50 {
                let d = p.delay(retry, None);
                let cap = p.backoff_cap(retry);
                assert!(d <= cap && d >= cap / 2, "{d:?} vs {cap:?}");
            }
        }
    }

    #[test]
    fn retry_after_raises_the_wait_up_to_its_bound() {
        let p = RetryPolicy::default();
        assert!(p.delay(1, Some(Duration::from_secs(2))) >= Duration::from_secs(2));
        assert_eq!(
            p.delay(1, Some(Duration::from_secs(3600))),
            Duration::from_secs(30)
        );
        // A hint shorter than the backoff does not shorten it.
        assert!(p.delay(3, Some(MS(1))) >= p.backoff_cap(3) / 2);
        match p.next(1, Attempt::Answered(503, Some(Duration::from_secs(3)))) {
            Next::RetryAfter(d) => assert!(d >= Duration::from_secs(3)),
            Next::Stop => panic!("503 with Retry-After is retried"),
        }
    }
}
