//! What a replay page may promise. Every reader of a run's stream — JSON replay now,
//! the SSE tail later — goes through [`read_page`], so none of them can skip an event.
//!
//! DynamoDB's `Query` is read-committed against transactions: while a batch commits, a
//! read can see sequence 7 without 5, and a head read first can already say `completed`
//! while `run_completed` is not yet visible. A client following `next_after` past such a
//! hole would lose events for good, so a page ends at the first hole after `after`
//! (`has_more: true`: read again) and says `terminal` only when it holds the terminal
//! event (or the client is already past it).
//!
//! A hole is transient only while the commit that left it is fresh: a visible event can
//! only have been committed after every lower sequence (each append is conditioned on
//! the head's `next_seq`), so an event behind a hole that is older than
//! [`SETTLED_HOLE`] means the missing ones were removed (retention TTL), not that they
//! are still committing. Such a hole is stepped over, or a replay of a long-lived run
//! whose oldest events have expired would never progress.

use std::time::Duration;
use tollgate_domain::event::types as ev;

use tollgate_domain::RunHead;

use crate::{RunStore, StoreError, StoredEvent};

/// A buffered Lambda response is at most 6 MB (6,291,456 bytes) *as Lambda sends it*: the
/// page is a JSON string inside the response JSON, so every `"` and `\` of it is sent
/// escaped. A page stops before its events would pass this, measured that way
/// ([`lambda_escaped_len`]); the rest of the response fits in the margin.
pub const MAX_RESPONSE_BYTES: usize = 5 * 1024 * 1024;

/// How old the event after a hole must be before the hole counts as permanent.
pub const SETTLED_HOLE: Duration = Duration::from_secs(30);

/// The terminal event types; a run's terminal event is always its last.
pub const TERMINAL_TYPES: &[&str] = ev::TERMINAL;

/// One page of a run's stream as served to a client.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplayPage {
    pub events: Vec<StoredEvent>,
    /// The sequence to ask after next: the last event served, else the `after` asked.
    pub next_after: u64,
    /// Read again at once: the page stopped at its limit, its byte bound or a hole.
    pub has_more: bool,
    /// The run's terminal event is in this page, or the client is already past it.
    pub terminal: bool,
}

/// Bytes `body` takes inside a JSON string (the buffered Lambda response): `"` and `\`
/// become two bytes, other control characters six.
pub fn lambda_escaped_len(body: &str) -> usize {
    body.bytes()
        .map(|b| match b {
            b'"' | b'\\' => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum()
}

/// The page after `after` (at most `limit` events) of the run whose `head` the caller
/// read *before* calling this.
pub async fn read_page(
    store: &dyn RunStore,
    head: &RunHead,
    after: u64,
    limit: usize,
) -> Result<ReplayPage, StoreError> {
    let raw = store.read_events(&head.run_id, after, limit).await?;
    Ok(gapless(
        raw.events,
        raw.has_more,
        head,
        after,
        limit,
        tollgate_domain::now_millis(),
    ))
}

fn gapless(
    found: Vec<StoredEvent>,
    found_more: bool,
    head: &RunHead,
    after: u64,
    limit: usize,
    now_millis: i64,
) -> ReplayPage {
    let mut page = ReplayPage {
        next_after: after,
        ..ReplayPage::default()
    };
    let mut bytes = 0usize;
    let mut expected = after.saturating_add(1);
    let mut cut = false;
    for event in found {
        if event.sequence != expected && !settled(&event, now_millis) {
            cut = true;
            break;
        }
        let size = lambda_escaped_len(&event.body);
        if page.events.len() >= limit
            || (!page.events.is_empty() && bytes + size > MAX_RESPONSE_BYTES)
        {
            cut = true;
            break;
        }
        bytes += size;
        expected = event.sequence + 1;
        page.next_after = event.sequence;
        page.terminal |= TERMINAL_TYPES.contains(&event.event_type.as_str());
        page.events.push(event);
    }
    // The head (read first) may know of events not visible yet: while its last write is
    // fresh they are committing, so read again; long after it, they are gone (TTL).
    let head_settled = now_millis - head.last_event_at > SETTLED_HOLE.as_millis() as i64;
    page.has_more = cut || found_more || (head.last_sequence() > page.next_after && !head_settled);
    if page.events.is_empty() && !page.has_more {
        // Nothing after `after`: terminal if the client has already seen the end, or if
        // the run ended long ago and its terminal event is gone (retention).
        page.terminal = head.terminal_seq.is_some_and(|t| after >= t)
            || (head.status.is_terminal() && head_settled);
    }
    page
}

/// True when `event` was written so long ago that a hole before it cannot be a commit
/// still becoming visible.
fn settled(event: &StoredEvent, now_millis: i64) -> bool {
    #[derive(serde::Deserialize)]
    struct Stamp {
        timestamp_utc: String,
    }
    let Ok(stamp) = serde_json::from_str::<Stamp>(&event.body) else {
        return false;
    };
    let Ok(written) = chrono::DateTime::parse_from_rfc3339(&stamp.timestamp_utc) else {
        return false;
    };
    now_millis - written.timestamp_millis() > SETTLED_HOLE.as_millis() as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_domain::format_timestamp;

    const NOW: i64 = 1_800_000_000_000;

    fn event(sequence: u64, event_type: &str, at: i64) -> StoredEvent {
        StoredEvent {
            sequence,
            event_type: event_type.into(),
            body: format!(
                r#"{{"sequence":{sequence},"type":"{event_type}","timestamp_utc":"{}"}}"#,
                format_timestamp(at)
            ),
        }
    }

    fn seqs(page: &ReplayPage) -> Vec<u64> {
        page.events.iter().map(|e| e.sequence).collect()
    }

    fn head() -> RunHead {
        let mut head = RunHead::new_for_test("r", None);
        head.last_event_at = NOW;
        head
    }

    #[test]
    fn a_fresh_hole_ends_the_page() {
        let found = vec![event(5, "a", NOW), event(7, "a", NOW), event(8, "a", NOW)];
        let page = gapless(found, false, &head(), 4, 100, NOW);
        assert_eq!(seqs(&page), vec![5]);
        assert_eq!(page.next_after, 5);
        assert!(page.has_more && !page.terminal);
    }

    #[test]
    fn a_hole_right_after_after_serves_nothing_yet() {
        let page = gapless(vec![event(6, "a", NOW)], false, &head(), 4, 100, NOW);
        assert!(page.events.is_empty());
        assert_eq!(page.next_after, 4);
        assert!(page.has_more);
    }

    #[test]
    fn a_settled_hole_is_stepped_over() {
        let old = NOW - 60_000;
        let page = gapless(
            vec![event(9, "a", old), event(10, "a", old)],
            false,
            &head(),
            0,
            100,
            NOW,
        );
        assert_eq!(seqs(&page), vec![9, 10]);
        assert!(!page.has_more);
    }

    #[test]
    fn terminal_only_with_the_terminal_event() {
        let mut ended = head();
        ended.status = tollgate_domain::RunStatus::Completed;
        ended.terminal_seq = Some(4);
        ended.next_seq = 5;
        // The head, read first, knows sequence 4: the page says read again.
        let page = gapless(vec![event(2, "a", NOW)], false, &ended, 1, 100, NOW);
        assert!(page.has_more && !page.terminal);
        // The head says completed, but run_completed (4) is not visible yet.
        let page = gapless(
            vec![event(2, "a", NOW), event(3, "a", NOW)],
            false,
            &ended,
            1,
            100,
            NOW,
        );
        assert!(!page.terminal);
        let page = gapless(
            vec![event(3, "a", NOW), event(4, "run_completed", NOW)],
            false,
            &ended,
            2,
            100,
            NOW,
        );
        assert!(page.terminal && !page.has_more);
        let past = gapless(vec![], false, &ended, 4, 100, NOW);
        assert!(past.terminal);
        // Long after the end, a terminal event that is gone (TTL) no longer holds the
        // client: nothing more, terminal.
        let mut long_ago = ended.clone();
        long_ago.last_event_at = NOW - 120_000;
        let gone = gapless(vec![], false, &long_ago, 3, 100, NOW);
        assert!(gone.terminal && !gone.has_more);
        // The head read first may still say running while the page shows the end.
        let page = gapless(
            vec![event(2, "run_failed", NOW)],
            false,
            &head(),
            1,
            100,
            NOW,
        );
        assert!(page.terminal);
    }

    #[test]
    fn pages_are_bounded_by_their_escaped_size() {
        let quotes = format!(r#"{{"type":"a","x":"{}"}}"#, "\\\"".repeat(32 * 1024));
        let big = |s| StoredEvent {
            sequence: s,
            event_type: "a".into(),
            body: quotes.clone(),
        };
        assert!(lambda_escaped_len(&quotes) > 2 * quotes.len() - 100);
        let page = gapless((1..=64).map(big).collect(), false, &head(), 0, 1000, NOW);
        let sent: usize = page
            .events
            .iter()
            .map(|e| lambda_escaped_len(&e.body))
            .sum();
        assert!(sent <= MAX_RESPONSE_BYTES, "{sent}");
        assert!(page.has_more && page.events.len() < 64);
    }
}
