//! What live delivery adds to a lifecycle: the agent waiting on its card and one
//! operator console watching the run, for a given time, in each delivery mode —
//! (a) the live stream (SSE) held open on the `replay-stream` Lambda, (b) polling
//! `GET …/events?after=N` through API Gateway and the `replay` Lambda, (c) WebSocket push
//! (API Gateway WebSocket API, the `websocket` function's `$connect`/`subscribe`/
//! `$disconnect` and a `fanout` function fed by the events table's DynamoDB Stream).
//!
//! Every line is a count of operations times a price of [`prices`]. For (a) and (b) the
//! counts come from the lifecycle's own events ([`Watch::of_lifecycle`]) and the
//! per-operation figures below, each written into the bill's assumptions; for (c) they
//! are counted on the handlers themselves ([`WsCounts`], `crate::lifecycle::ws`).

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

/// What a lifecycle's WebSocket delivery made, counted on the deployed handlers
/// (`crate::lifecycle::ws`): messages through API Gateway, invocations of the functions
/// (with their measured durations), and the DynamoDB calls, billed as the meter bills
/// any call.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WsCounts {
    /// Client messages API Gateway received (`subscribe`, …).
    pub received: u64,
    /// Frames posted through `@connections` (each one message, all under 32 KB).
    pub sent: u64,
    /// Per route or function (`$connect`, `subscribe`, `fanout`, `$disconnect`): how
    /// many invocations, and their measured warm duration (ms: the median without the
    /// first invocation, which opened the connections).
    pub invocations: Vec<(&'static str, u64, f64)>,
    /// The registry's and the backlog reads' DynamoDB calls, one line per operation.
    pub dynamo: Vec<Line>,
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
    /// `MemorySize` of the `replay` and `replay-stream` functions (`infra/template.yaml`).
    pub http_memory_mb: u32,
    /// Billed duration of one `replay` invocation answering a poll.
    pub replay_ms: u32,
    /// `MemorySize` of the `websocket` and `fanout` functions (`infra/template.yaml`).
    pub ws_memory_mb: u32,
    /// Billed duration of each WebSocket invocation: `Some(ms)` one figure for all, `None`
    /// each its measured warm duration, rounded up to the millisecond (as Lambda bills).
    pub ws_billed_ms: Option<u32>,
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
}

impl Default for Assumptions {
    fn default() -> Self {
        Self {
            http_memory_mb: super::template::max_memory_mb(&["replay", "replay-stream"]),
            replay_ms: 50,
            ws_memory_mb: super::template::max_memory_mb(&["websocket", "fanout"]),
            ws_billed_ms: None,
            stream_window_s: 57,
            sse_polls_per_min: 60.0,
            sse_poll_rru: 0.5,
            page_rru: 2.0,
            poll_interval_s: 1.0,
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
pub fn price(mode: Mode, watch: &Watch, a: &Assumptions, ws: &WsCounts) -> Bill {
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
            let messages = ws.received + ws.sent;
            lines.push(line(
                "API Gateway",
                "WebSocket messages",
                messages,
                messages as f64,
                "messages",
                API_GATEWAY_WS_MESSAGE_USD,
                format!(
                    "{} received (subscribe) + {} frames sent (each under 32 KB), counted",
                    ws.received, ws.sent
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
            let billed = |ms: f64| a.ws_billed_ms.unwrap_or(ms.ceil().max(1.0) as u32);
            let count: u64 = ws.invocations.iter().map(|(_, n, _)| n).sum();
            let gbs: f64 = ws
                .invocations
                .iter()
                .map(|(_, n, ms)| *n as f64 * gb_s(a.ws_memory_mb, billed(*ms) as f64))
                .sum();
            lines.push(line(
                "Lambda",
                "WebSocket invocations",
                count,
                count as f64,
                "requests",
                LAMBDA_REQUEST_USD,
                ws.invocations
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
                    ws.invocations
                        .iter()
                        .map(|(f, _, ms)| format!("{f} {} ms", billed(*ms)))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
            for l in &ws.dynamo {
                lines.push(Line {
                    item: format!("{} (WebSocket)", l.item),
                    ..l.clone()
                });
            }
            lines.push(line(
                "DynamoDB",
                "Streams GetRecords",
                watch.live_events(),
                0.0,
                "-",
                0.0,
                "made by the Lambda event source mapping: free".into(),
            ));
            assumptions.push(format!(
                "WebSocket: the `websocket` and `fanout` handlers run on DynamoDB Local for this \
                 lifecycle, every message, invocation and DynamoDB call counted; API Gateway \
                 ${}/million messages (32 KB units; sent and received) and ${}/million \
                 connection-minutes; `$connect`/`$disconnect` are no messages; functions at {} \
                 MB, x86_64, billed {}; one stream batch per event; the agent stays connected \
                 for the whole wait",
                API_GATEWAY_WS_MESSAGE_USD * 1e6,
                API_GATEWAY_WS_CONNECTION_MINUTE_USD * 1e6,
                a.ws_memory_mb,
                match a.ws_billed_ms {
                    Some(ms) => format!("{ms} ms each (assumed)"),
                    None => "their warm durations as measured here (DynamoDB Local on this \
                             machine, not AWS), rounded up to the ms"
                        .into(),
                }
            ));
        }
    }
    assumptions.push(format!(
        "watch: the agent waits {} s on its card, one console watches the run for as long; \
         the console subscribes after `run_started` ({} backlog, {} live events), the agent \
         after its card ({} events to the resolution)",
        watch.seconds, watch.console_backlog, watch.console_live, watch.agent_live
    ));
    Bill {
        lines,
        assumptions,
        writes: Default::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference() -> Watch {
        let events = crate::lifecycle::EVENTS.map(String::from);
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

    fn counted() -> WsCounts {
        WsCounts {
            received: 2,
            sent: 13,
            invocations: vec![("$connect", 2, 3.2), ("fanout", 8, 0.4)],
            dynamo: vec![Line {
                service: "DynamoDB",
                item: "PutItem".into(),
                count: 4,
                units: 4.0,
                unit: "WRU",
                usd_per_unit: prices::DYNAMODB_WRU_USD,
                note: String::new(),
            }],
        }
    }

    #[test]
    fn websocket_prices_what_was_counted() {
        let a = Assumptions::default();
        let bill = price(Mode::WebSocket, &reference(), &a, &counted());
        let line = |item: &str| {
            bill.lines
                .iter()
                .find(|l| l.item == item)
                .unwrap_or_else(|| panic!("{item}"))
                .clone()
        };
        assert_eq!(line("WebSocket messages").units, 15.0);
        assert_eq!(line("WebSocket connection-minutes").units, 10.0);
        assert_eq!(line("WebSocket invocations").units, 10.0);
        // Billed per invocation rounded up to the ms: 2 × 4 ms + 8 × 1 ms.
        let gb = a.ws_memory_mb as f64 / 1024.0;
        let gbs = line("WebSocket compute").units;
        assert!((gbs - gb * 16.0 / 1000.0).abs() < 1e-12, "{gbs}");
        assert_eq!(line("PutItem (WebSocket)").units, 4.0);
        let fixed = Assumptions {
            ws_billed_ms: Some(10),
            ..a
        };
        let bill = price(Mode::WebSocket, &reference(), &fixed, &counted());
        let gbs = bill
            .lines
            .iter()
            .find(|l| l.item == "WebSocket compute")
            .unwrap()
            .units;
        assert!((gbs - gb * 100.0 / 1000.0).abs() < 1e-12, "{gbs}");
    }

    #[test]
    fn a_held_stream_costs_its_whole_wait() {
        let bill = price(Mode::Sse, &reference(), &Assumptions::default(), &counted());
        let held = &bill.lines[0];
        assert_eq!(held.units, 2.0 * 300.0 * 0.25);
        assert!(
            bill.total_usd()
                > price(
                    Mode::WebSocket,
                    &reference(),
                    &Assumptions::default(),
                    &counted()
                )
                .total_usd()
        );
    }
}
