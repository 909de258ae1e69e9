//! What live delivery adds to a lifecycle: the agent waiting on its card and one
//! operator console watching the run, for a given time, in each delivery mode —
//! (a) the live stream (SSE) held open on the `replay-stream` Lambda, (b) polling
//! `GET …/events?after=N` through API Gateway and the `replay` Lambda, (c) WebSocket push
//! (API Gateway WebSocket API, the `$connect`/`subscribe`/`$disconnect` functions and a
//! `fanout` function fed by the events table's DynamoDB Stream).
//!
//! Every line is a count of operations times a price of [`prices`]; the counts come from
//! the lifecycle's own events ([`Watch::of_lifecycle`]) and the per-operation counts
//! below, each written into the bill's assumptions. Pure arithmetic: the same watch
//! always prices the same.

use super::bill::{Bill, Line};
use super::prices;

/// Who watches what, and for how long.
#[derive(Debug, Clone, PartialEq)]
pub struct Watch {
    /// How long the agent waits on its card and the console watches the run (s).
    pub seconds: u64,
    /// Events already stored when the console subscribes (sent from the backlog).
    pub console_backlog: u64,
    /// Events written while the console watches (each pushed to it).
    pub console_live: u64,
    /// Events the agent receives: written after its card, up to and with the card's
    /// resolution (then it stops watching).
    pub agent_live: u64,
}

impl Watch {
    /// The watch of a lifecycle whose stream told `events` (types in order): the console
    /// subscribes right after the run started (`run_started` is its backlog) and sees
    /// every later event; the agent subscribes after arming its card
    /// (`tool.approval_required`) and sees the events up to the resolution.
    pub fn of_lifecycle(events: &[String], seconds: u64) -> Self {
        let armed = events
            .iter()
            .position(|t| t == "tool.approval_required")
            .expect("the lifecycle arms a card");
        let resolved = events
            .iter()
            .position(|t| t == "tool.approval_resolved")
            .expect("the lifecycle resolves its card");
        Self {
            seconds,
            console_backlog: 1,
            console_live: events.len() as u64 - 1,
            agent_live: (resolved - armed) as u64,
        }
    }

    /// Events written while anyone watches (each one DynamoDB Stream record).
    pub fn live_events(&self) -> u64 {
        self.console_live.max(self.agent_live)
    }

    fn minutes(&self) -> f64 {
        self.seconds as f64 / 60.0
    }
}

/// The three modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// SSE on the `replay-stream` Lambda (Function URL, response streaming).
    Sse,
    /// `GET …/events?after=N` polled by the clients.
    Polling,
    /// API Gateway WebSocket push.
    WebSocket,
}

impl Mode {
    pub const ALL: [Mode; 3] = [Mode::Sse, Mode::Polling, Mode::WebSocket];

    pub fn name(self) -> &'static str {
        match self {
            Mode::Sse => "(a) SSE on Lambda",
            Mode::Polling => "(b) replay polling",
            Mode::WebSocket => "(c) WebSocket push",
        }
    }
}

/// The per-operation figures a mode is priced with (what was not counted here).
#[derive(Debug, Clone, PartialEq)]
pub struct Assumptions {
    /// `MemorySize` of the HTTP functions (`infra/template.yaml` Globals).
    pub http_memory_mb: u32,
    /// Billed duration of one `replay` invocation answering a poll.
    pub replay_ms: u32,
    /// `MemorySize` of the WebSocket functions.
    pub ws_memory_mb: u32,
    /// Billed durations of the WebSocket functions' invocations.
    pub connect_ms: u32,
    pub subscribe_ms: u32,
    pub fanout_ms: u32,
    pub disconnect_ms: u32,
    /// How long one `replay-stream` invocation holds a stream (its timeout less the
    /// margin it keeps).
    pub stream_window_s: u64,
    /// A watcher's idle head polls per minute and the read units of each (SSE; the
    /// head `GetItem`, eventually consistent).
    pub sse_polls_per_min: f64,
    pub sse_poll_rru: f64,
    /// Read units of one page read (head `GetItem` + events `Query`, strong) — SSE per
    /// event seen and per window opened, polling per request, WebSocket per backlog.
    pub page_rru: f64,
    /// Clients' poll interval while nothing arrives (s).
    pub poll_interval_s: f64,
    /// Read units of one `Query` of a run's subscribers (fanout, strong, under 4 KB).
    pub subscribers_rru: f64,
    /// Write units of one connection or subscription item put or deleted (under 1 KB).
    pub ws_item_wru: f64,
}

impl Default for Assumptions {
    fn default() -> Self {
        Self {
            http_memory_mb: 256,
            replay_ms: 50,
            ws_memory_mb: 128,
            connect_ms: 20,
            subscribe_ms: 40,
            fanout_ms: 30,
            disconnect_ms: 20,
            stream_window_s: 57,
            sse_polls_per_min: 60.0,
            sse_poll_rru: 0.5,
            page_rru: 2.0,
            poll_interval_s: 1.0,
            subscribers_rru: 1.0,
            ws_item_wru: 1.0,
        }
    }
}

fn gb_s(memory_mb: u32, ms: f64) -> f64 {
    memory_mb as f64 / 1024.0 * ms / 1000.0
}

fn line(
    service: &'static str,
    item: &str,
    count: u64,
    units: f64,
    unit: &'static str,
    usd: f64,
    note: String,
) -> Line {
    Line {
        service,
        item: item.into(),
        count,
        units,
        unit,
        usd_per_unit: usd,
        note,
    }
}

/// What delivering `watch` costs in `mode`, line by line, with its assumptions.
pub fn price(mode: Mode, watch: &Watch, a: &Assumptions) -> Bill {
    use prices::*;
    let watchers = 2u64;
    let mut lines = Vec::new();
    let mut assumptions = Vec::new();
    match mode {
        Mode::Sse => {
            let held_s = watchers as f64 * watch.seconds as f64;
            let invocations = watchers * watch.seconds.div_ceil(a.stream_window_s);
            lines.push(line(
                "Lambda",
                "replay-stream held",
                invocations,
                gb_s(a.http_memory_mb, held_s * 1000.0),
                "GB-s",
                LAMBDA_GB_SECOND_USD,
                format!(
                    "2 watchers × {} s at {} MB (a streaming invocation is billed while it is \
                     open)",
                    watch.seconds, a.http_memory_mb
                ),
            ));
            lines.push(line(
                "Lambda",
                "replay-stream invocations",
                invocations,
                invocations as f64,
                "requests",
                LAMBDA_REQUEST_USD,
                format!("one per {} s window per watcher", a.stream_window_s),
            ));
            let polls = (held_s / 60.0 * a.sse_polls_per_min).round() as u64;
            lines.push(line(
                "DynamoDB",
                "GetItem (head polls)",
                polls,
                polls as f64 * a.sse_poll_rru,
                "RRU",
                DYNAMODB_RRU_USD,
                format!(
                    "{:.1}/min per idle watcher × {} RRU",
                    a.sse_polls_per_min, a.sse_poll_rru
                ),
            ));
            let pages = watch.console_live + watch.agent_live + invocations;
            lines.push(line(
                "DynamoDB",
                "page reads",
                pages,
                pages as f64 * a.page_rru,
                "RRU",
                DYNAMODB_RRU_USD,
                format!(
                    "one per event seen and per window opened × {} RRU",
                    a.page_rru
                ),
            ));
            assumptions.push(format!(
                "SSE: each watcher holds a replay-stream invocation ({} MB, x86_64) for the \
                 whole wait, in {} s windows; {:.1}/min idle head polls of {} RRU (measured by \
                 `make bench`), one page read ({} RRU) per event and per window",
                a.http_memory_mb,
                a.stream_window_s,
                a.sse_polls_per_min,
                a.sse_poll_rru,
                a.page_rru
            ));
        }
        Mode::Polling => {
            let per_watcher = (watch.seconds as f64 / a.poll_interval_s).round() as u64;
            let requests = watchers * per_watcher;
            lines.push(line(
                "API Gateway",
                "HTTP API requests (polls)",
                requests,
                requests as f64,
                "requests",
                HTTP_API_REQUEST_USD,
                format!("2 watchers × one per {} s", a.poll_interval_s),
            ));
            lines.push(line(
                "Lambda",
                "replay invocations",
                requests,
                requests as f64,
                "requests",
                LAMBDA_REQUEST_USD,
                "one per poll".into(),
            ));
            lines.push(line(
                "Lambda",
                "replay compute",
                requests,
                requests as f64 * gb_s(a.http_memory_mb, a.replay_ms as f64),
                "GB-s",
                LAMBDA_GB_SECOND_USD,
                format!(
                    "{} MB × {} ms per poll (assumed)",
                    a.http_memory_mb, a.replay_ms
                ),
            ));
            lines.push(line(
                "DynamoDB",
                "page reads (polls)",
                requests,
                requests as f64 * a.page_rru,
                "RRU",
                DYNAMODB_RRU_USD,
                format!("{} RRU per poll", a.page_rru),
            ));
            assumptions.push(format!(
                "polling: the clients (Rust `shared/client`, Python, TypeScript) poll every \
                 {} s while nothing arrives (their backoff applies only after errors); each \
                 poll is one API Gateway request, one replay invocation ({} MB × {} ms) and \
                 {} RRU",
                a.poll_interval_s, a.http_memory_mb, a.replay_ms, a.page_rru
            ));
        }
        Mode::WebSocket => {
            let backlog = watch.console_backlog;
            let pushed = watch.console_live + watch.agent_live;
            // Received: one `subscribe` per watcher; sent: every frame.
            let messages = watchers + backlog + pushed;
            lines.push(line(
                "API Gateway",
                "WebSocket messages",
                messages,
                messages as f64,
                "messages",
                API_GATEWAY_WS_MESSAGE_USD,
                format!(
                    "{watchers} subscribe + {backlog} backlog + {pushed} pushed frames (each \
                     under 32 KB)"
                ),
            ));
            let minutes = watchers as f64 * watch.minutes().ceil();
            lines.push(line(
                "API Gateway",
                "WebSocket connection-minutes",
                watchers,
                minutes,
                "minutes",
                API_GATEWAY_WS_CONNECTION_MINUTE_USD,
                format!(
                    "2 connections × {} min (the agent's held for the whole wait)",
                    watch.minutes().ceil()
                ),
            ));
            let batches = watch.live_events();
            let invocations = [
                ("$connect", watchers, a.connect_ms),
                ("subscribe", watchers, a.subscribe_ms),
                ("fanout", batches, a.fanout_ms),
                ("$disconnect", watchers, a.disconnect_ms),
            ];
            let count: u64 = invocations.iter().map(|(_, n, _)| n).sum();
            let gbs: f64 = invocations
                .iter()
                .map(|(_, n, ms)| *n as f64 * gb_s(a.ws_memory_mb, *ms as f64))
                .sum();
            lines.push(line(
                "Lambda",
                "WebSocket invocations",
                count,
                count as f64,
                "requests",
                LAMBDA_REQUEST_USD,
                invocations
                    .iter()
                    .map(|(f, n, _)| format!("{f} ×{n}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ));
            lines.push(line(
                "Lambda",
                "WebSocket compute",
                count,
                gbs,
                "GB-s",
                LAMBDA_GB_SECOND_USD,
                format!(
                    "{} MB × ({})",
                    a.ws_memory_mb,
                    invocations
                        .iter()
                        .map(|(f, _, ms)| format!("{f} {ms} ms"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
            let (puts, deletes) = (2 * watchers, 2 * watchers);
            lines.push(line(
                "DynamoDB",
                "PutItem (connection, subscription)",
                puts,
                puts as f64 * a.ws_item_wru,
                "WRU",
                DYNAMODB_WRU_USD,
                format!(
                    "$connect 1 + subscribe 1 per watcher × {} WRU",
                    a.ws_item_wru
                ),
            ));
            lines.push(line(
                "DynamoDB",
                "DeleteItem (connection, subscription)",
                deletes,
                deletes as f64 * a.ws_item_wru,
                "WRU",
                DYNAMODB_WRU_USD,
                format!("$disconnect: 2 per watcher × {} WRU", a.ws_item_wru),
            ));
            lines.push(line(
                "DynamoDB",
                "backlog page reads",
                watchers,
                watchers as f64 * a.page_rru,
                "RRU",
                DYNAMODB_RRU_USD,
                format!("one replay page per subscribe × {} RRU", a.page_rru),
            ));
            lines.push(line(
                "DynamoDB",
                "Query (subscribers)",
                batches,
                batches as f64 * a.subscribers_rru,
                "RRU",
                DYNAMODB_RRU_USD,
                format!(
                    "one per stream batch, one batch per event (no batching window) × {} RRU",
                    a.subscribers_rru
                ),
            ));
            lines.push(line(
                "DynamoDB",
                "Streams GetRecords",
                batches,
                0.0,
                "-",
                0.0,
                "made by the Lambda event source mapping: free".into(),
            ));
            assumptions.push(format!(
                "WebSocket: API Gateway ${}/million messages (32 KB units; sent and received) \
                 and ${}/million connection-minutes; `$connect`/`$disconnect` are no messages; \
                 functions at {} MB, x86_64, billed {} / {} / {} / {} ms ($connect / \
                 subscribe / fanout per batch / $disconnect; assumed, not measured); one \
                 stream batch per event; the agent stays connected for the whole wait",
                API_GATEWAY_WS_MESSAGE_USD * 1e6,
                API_GATEWAY_WS_CONNECTION_MINUTE_USD * 1e6,
                a.ws_memory_mb,
                a.connect_ms,
                a.subscribe_ms,
                a.fanout_ms,
                a.disconnect_ms
            ));
        }
    }
    assumptions.push(format!(
        "watch: the agent waits {} s on its card, one console watches the run for as long; \
         the console subscribes after `run_started` ({} backlog, {} live events), the agent \
         after its card ({} events to the resolution)",
        watch.seconds, watch.console_backlog, watch.console_live, watch.agent_live
    ));
    Bill { lines, assumptions }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference() -> Watch {
        let events = [
            "run_started",
            "tool.approval_required",
            "tool.approval_pending",
            "tool.approval_pending",
            "tool.approval_pending",
            "tool.approval_resolved",
            "tool_execution_started",
            "tool_execution",
            "run_completed",
        ]
        .map(String::from);
        Watch::of_lifecycle(&events, 300)
    }

    #[test]
    fn the_watch_follows_the_lifecycles_events() {
        assert_eq!(
            reference(),
            Watch {
                seconds: 300,
                console_backlog: 1,
                console_live: 8,
                agent_live: 4
            }
        );
    }

    #[test]
    fn websocket_counts_follow_the_watch() {
        let bill = price(Mode::WebSocket, &reference(), &Assumptions::default());
        let count = |item: &str| {
            bill.lines
                .iter()
                .find(|l| l.item == item)
                .unwrap_or_else(|| panic!("{item}"))
                .units
        };
        assert_eq!(count("WebSocket messages"), 2.0 + 1.0 + 12.0);
        assert_eq!(count("WebSocket connection-minutes"), 10.0);
        assert_eq!(count("WebSocket invocations"), 2.0 + 2.0 + 8.0 + 2.0);
        assert_eq!(count("Query (subscribers)"), 8.0);
    }

    #[test]
    fn a_held_stream_costs_its_whole_wait() {
        let bill = price(Mode::Sse, &reference(), &Assumptions::default());
        let held = &bill.lines[0];
        assert_eq!(held.units, 2.0 * 300.0 * 0.25);
        assert!(
            bill.total_usd()
                > price(Mode::WebSocket, &reference(), &Assumptions::default()).total_usd()
        );
    }
}
