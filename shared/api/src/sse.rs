//! The live stream (seed 003's SSE contract, docs/architecture.md §5): `GET /api/runs/{id}/stream`, or
//! `GET /api/runs/{id}/events` with `Accept: text/event-stream`.
//!
//! Frames: `retry: <ms>` first; then one frame per event — `id: <sequence>`,
//! `event: <type>`, `data: <the event JSON replay serves>`; a `: keep-alive` comment
//! after every `keepalive` without a frame; after the terminal event a final
//! `event: done` frame with no id, then the end. Otherwise the response ends cleanly
//! after a bounded window and the client resumes with `Last-Event-ID` (or `?after=`).
//!
//! The stream is the replay pages one after the other (the gap-safe
//! [`tollgate_store::read_page`], through [`RunLog::page`]: a page ends at the first
//! sequence not yet visible), so catch-up and live tail are the same loop and their
//! boundary has no gap and no duplicate. Between pages it waits: on the embedded store
//! for the store's write signal ([`RunLog::appended`]); on DynamoDB it polls the run's
//! head (one eventually consistent `GetItem`, half the read units of a strong one),
//! backing off from `poll_min` to `poll_max` while nothing arrives, and once a poll sees
//! the head moved it reads the head strongly, then the events.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use tokio::sync::mpsc;
use tollgate_app::runs::RunLog;
use tollgate_domain::RunHead;
use tollgate_protocol::events::StreamEnd;
use tracing::instrument;

use crate::auth::Credentials;
use crate::request::{query_param, token_run_id, RunId};
use crate::{ApiError, ConfigError, Deps};
use tollgate_app::ErrorState;

/// Live streams one process holds open at most for operators, and as many again for
/// agents and run tokens; one more is 503 with `Retry-After`.
pub const MAX_OPEN_STREAMS: usize = 500;

/// The places for open streams: operators' apart from everyone else's, and inside
/// everyone else's, caps per run, per agent and per tenant ([`StreamCaps`]) so that one
/// run token or one agent cannot take every place and lock the others out.
pub struct StreamSlots {
    pub(crate) operators: Arc<tokio::sync::Semaphore>,
    pub(crate) others: Arc<tokio::sync::Semaphore>,
    /// Open non-operator streams per holder key (`run:…`, `agent:…`, `tenant:…`); a key
    /// is removed when its count returns to 0, so the map holds only live holders.
    held: Mutex<HashMap<String, usize>>,
}

/// Live streams one holder may keep open at once in this process (agents and run
/// tokens; operators have their own pool and no caps). Beyond a cap: 429 with
/// `Retry-After`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamCaps {
    /// `TOLLGATE_STREAMS_PER_RUN` (default 8): streams opened with one run's token.
    pub per_run: usize,
    /// `TOLLGATE_STREAMS_PER_AGENT` (default 64): streams opened with one agent's JWTs
    /// (its `sub`).
    pub per_agent: usize,
    /// `TOLLGATE_STREAMS_PER_PROJECT` (default 250): streams of agents and run tokens on
    /// one project's runs (a run without a project: its creating agent's runs).
    pub per_project: usize,
}

impl Default for StreamCaps {
    fn default() -> Self {
        Self {
            per_run: 8,
            per_agent: 64,
            per_project: 250,
        }
    }
}

/// Holds a non-operator stream's places; gives them back when dropped (the stream's
/// task ends, however it ends).
pub(crate) struct HeldPlaces {
    slots: Arc<StreamSlots>,
    keys: Vec<String>,
}

impl Drop for HeldPlaces {
    fn drop(&mut self) {
        let mut held = self.slots.held.lock().unwrap_or_else(|p| p.into_inner());
        for key in &self.keys {
            if let Some(n) = held.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    held.remove(key);
                }
            }
        }
    }
}

impl StreamSlots {
    pub fn new(each: usize) -> Self {
        Self {
            operators: Arc::new(tokio::sync::Semaphore::new(each)),
            others: Arc::new(tokio::sync::Semaphore::new(each)),
            held: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one place under each `(key, cap)`, all or none. `Err` names the first cap
    /// that is full.
    pub(crate) fn hold(
        self: &Arc<Self>,
        wanted: Vec<(String, usize, &'static str)>,
    ) -> Result<HeldPlaces, &'static str> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        for (key, cap, what) in &wanted {
            if held.get(key).copied().unwrap_or(0) >= *cap {
                return Err(what);
            }
        }
        let mut keys = Vec::with_capacity(wanted.len());
        for (key, _, _) in wanted {
            *held.entry(key.clone()).or_insert(0) += 1;
            keys.push(key);
        }
        Ok(HeldPlaces {
            slots: self.clone(),
            keys,
        })
    }
}

/// Events per page read while streaming.
const PAGE: usize = 500;

/// How the live stream paces itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseConfig {
    /// `TOLLGATE_SSE_WINDOW_SECONDS` (default 300): how long one response stays open
    /// (less when the function's deadline comes first) before it ends cleanly.
    pub window: Duration,
    /// A `: keep-alive` comment after this long without a frame (seed 003: 15 s).
    pub keepalive: Duration,
    /// The `retry:` hint: how soon a client reconnects after the end of a window.
    pub retry: Duration,
    /// Polling (stores without a write signal): the first wait after a change …
    pub poll_min: Duration,
    /// … doubling while idle, up to this.
    pub poll_max: Duration,
    /// Open streams per run, agent and project ([`StreamCaps`]).
    pub caps: StreamCaps,
}

impl Default for SseConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(300),
            keepalive: Duration::from_secs(15),
            retry: Duration::from_secs(1),
            poll_min: Duration::from_millis(100),
            poll_max: Duration::from_secs(1),
            caps: StreamCaps::default(),
        }
    }
}

impl SseConfig {
    pub fn from_env() -> Result<Self, ConfigError> {
        let mut config = Self::default();
        if let Some(v) = std::env::var("TOLLGATE_SSE_WINDOW_SECONDS")
            .ok()
            .filter(|v| !v.is_empty())
        {
            let secs: u64 = v
                .parse()
                .ok()
                .filter(|s| (1..=86_400).contains(s))
                .ok_or_else(|| {
                    ConfigError::Invalid(
                        "TOLLGATE_SSE_WINDOW_SECONDS must be a whole number of seconds, 1 to 86400"
                            .into(),
                    )
                })?;
            config.window = Duration::from_secs(secs);
        }
        for (var, field) in [
            ("TOLLGATE_STREAMS_PER_RUN", &mut config.caps.per_run),
            ("TOLLGATE_STREAMS_PER_AGENT", &mut config.caps.per_agent),
            ("TOLLGATE_STREAMS_PER_PROJECT", &mut config.caps.per_project),
        ] {
            if let Some(v) = std::env::var(var).ok().filter(|v| !v.is_empty()) {
                *field = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_OPEN_STREAMS).contains(n))
                    .ok_or_else(|| {
                        ConfigError::Invalid(format!(
                            "{var} must be a whole number, 1 to {MAX_OPEN_STREAMS}"
                        ))
                    })?;
            }
        }
        Ok(config)
    }
}

/// How long the response that serves this request may stay open, set by the runtime
/// in front of the router: `Some(d)` a Lambda invocation's remaining time (less a
/// margin); `Some(ZERO)` a buffered answer (API Gateway): what is there now, then the
/// end — the client resumes as with any window. Absent (`tollgate serve`): the window.
#[derive(Debug, Clone, Copy)]
pub struct ResponseBudget(pub Duration);

/// Where the stream starts: `Last-Event-ID` (what an `EventSource` sends when it
/// reconnects) wins over `?after=`; neither is 0. Anything but a sequence number is 400.
/// (Public for the fuzz targets, `fuzz/`.)
pub fn start_after(headers: &HeaderMap, query: Option<&str>) -> Result<u64, ApiError> {
    if let Some(v) = headers.get("last-event-id") {
        return v
            .to_str()
            .ok()
            .map(str::trim)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| ApiError::bad_request("Last-Event-ID must be a sequence number ≥ 0"));
    }
    match query_param(query, "after") {
        None => Ok(0),
        Some(v) => v
            .parse::<u64>()
            .map_err(|_| ApiError::bad_request("after must be a sequence number ≥ 0")),
    }
}

/// Whether a request asks for the event stream.
pub fn wants_stream(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

/// `GET /api/runs/{id}/stream`.
#[instrument(skip_all, fields(run_id))]
pub async fn stream(
    State(deps): State<Deps>,
    run_id: Result<RunId, ApiError>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    budget: Option<axum::Extension<ResponseBudget>>,
    creds: Credentials,
) -> Result<Response, ApiError> {
    let budget = budget.map(|axum::Extension(b)| b);
    open(deps, run_id, query.as_deref(), &headers, budget, &creds).await
}

/// Checks the caller and the starting point, then answers with the stream. Errors
/// before the first byte are JSON answers; later ones end the stream (the client
/// resumes from its last id).
pub(crate) async fn open(
    deps: Deps,
    run_id: Result<RunId, ApiError>,
    query: Option<&str>,
    headers: &HeaderMap,
    budget: Option<ResponseBudget>,
    creds: &Credentials,
) -> Result<Response, ApiError> {
    let caller = deps.auth.caller(creds, Some(token_run_id(&run_id)))?;
    let after = start_after(headers, query)?;
    let run_id = run_id?;
    tracing::Span::current().record("run_id", run_id.as_str());
    let head = deps.runs.readable_head(&run_id, &caller.viewer()).await?;
    // A client can only have seen sequences that exist (the head is read strongly
    // consistent and moves with the events): anything past it is not this run's stream.
    if after > head.last_sequence() {
        return Err(ApiError::bad_request(format!(
            "Last-Event-ID/after {after} is past the run's last event ({})",
            head.last_sequence()
        )));
    }
    let config = deps.sse;
    let mut window = match budget {
        Some(ResponseBudget(left)) => config.window.min(left),
        None => config.window,
    };
    // A stream never outlives the token that opened it (the client resumes with a
    // fresh one).
    if let crate::auth::Caller::Jwt(claims) = &caller {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        if claims.exp > 0 {
            window = window.min(Duration::from_secs(claims.exp.saturating_sub(now)));
        }
    }
    // Operators have their own pool. Everyone else is capped per holder first (429: this
    // holder has enough open; the others still get theirs), then by the shared pool (503).
    let places = match &caller {
        crate::auth::Caller::Jwt(c) if c.role == crate::auth::Role::Operator => None,
        _ => Some(
            deps.streams
                .hold(holder_keys(&caller, &head, &config.caps))
                .map_err(|what| {
                    ApiError::new(
                        axum::http::StatusCode::TOO_MANY_REQUESTS,
                        format!(
                            "too many open live streams for this {what}; close one or retry later"
                        ),
                    )
                    .with_state(ErrorState::TooManyStreams)
                })?,
        ),
    };
    let slots = if places.is_none() {
        &deps.streams.operators
    } else {
        &deps.streams.others
    };
    let permit = slots.clone().try_acquire_owned().map_err(|_| {
        ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "too many open live streams here; retry",
        )
    })?;
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let log = deps.runs.clone();
    let closing = deps.closing();
    tokio::spawn(async move {
        // Both given back when this task ends, however the stream ends.
        let _permit = permit;
        let _places = places;
        let tail = Tail {
            log: &log,
            tx,
            closing,
            config,
            ends_at: Instant::now() + window,
            last_sent: Instant::now(),
        };
        tail.run(head, after).await;
    });
    let body = Body::from_stream(futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    }));
    Ok((
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            (
                header::HeaderName::from_static("x-accel-buffering"),
                HeaderValue::from_static("no"),
            ),
        ],
        body,
    )
        .into_response())
}

/// The caps a non-operator stream counts against: a run token's run, an agent's `sub`,
/// and the run's tenant (its project, or without one, the agent that created it).
pub(crate) fn holder_keys(
    caller: &crate::auth::Caller,
    head: &RunHead,
    caps: &StreamCaps,
) -> Vec<(String, usize, &'static str)> {
    let mut keys = Vec::with_capacity(2);
    match caller {
        crate::auth::Caller::Run { run_id, .. } => {
            keys.push((format!("run:{run_id}"), caps.per_run, "run token"));
        }
        crate::auth::Caller::Jwt(c) => {
            // The same `sub` in two projects is two agents (quoted: no `sub` or project
            // can make two keys meet).
            keys.push((
                format!("agent:{:?}:{:?}", c.project_id, c.sub),
                caps.per_agent,
                "agent",
            ));
        }
    }
    let tenant = match &head.project_id {
        Some(p) => format!("project:{p:?}"),
        None => format!("creator:{:?}", head.created_by),
    };
    keys.push((tenant, caps.per_project, "project"));
    keys
}

/// One response's loop: pages while there are events, waits while there are none.
struct Tail<'a> {
    log: &'a RunLog,
    tx: mpsc::Sender<Bytes>,
    /// True once the process shuts down: the stream ends as at the end of its window.
    closing: tokio::sync::watch::Receiver<bool>,
    config: SseConfig,
    ends_at: Instant,
    last_sent: Instant,
}

/// Why a stream stopped sending.
enum Stop {
    /// The client went away.
    Gone,
    /// The store failed: end the response; the client resumes.
    Store,
}

impl Tail<'_> {
    async fn send(&mut self, frame: String) -> Result<(), Stop> {
        self.last_sent = Instant::now();
        // A reader that takes nothing for a keep-alive interval past the window is gone.
        let give_up = self.ends_at.max(Instant::now()) + self.config.keepalive;
        let mut closing = self.closing.clone();
        tokio::select! {
            sent = tokio::time::timeout_at(give_up.into(), self.tx.send(Bytes::from(frame))) => {
                match sent {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(_)) | Err(_) => Err(Stop::Gone),
                }
            }
            // Shutting down: a reader that does not take this frame is not waited for.
            _ = closing.wait_for(|c| *c) => Err(Stop::Gone),
        }
    }

    async fn run(mut self, head: RunHead, after: u64) {
        let retry = format!("retry: {}\n\n", self.config.retry.as_millis());
        if self.send(retry).await.is_ok() {
            match self.follow(head, after).await {
                Ok(()) | Err(Stop::Gone) => {}
                Err(Stop::Store) => {
                    tracing::warn!("live stream ended early: storage");
                    // Ask the client to come back later than usual, not in a tight loop.
                    let _ = self.send("retry: 5000\n\n".into()).await;
                }
            }
        }
    }

    async fn follow(&mut self, mut head: RunHead, mut after: u64) -> Result<(), Stop> {
        let run_id = head.run_id.clone();
        let mut signal = self.log.appended();
        let mut idle = self.config.poll_min;
        loop {
            let page = self
                .log
                .page(&head, after, PAGE)
                .await
                .map_err(|_| Stop::Store)?;
            let progressed = !page.events.is_empty();
            for e in &page.events {
                let frame = format!(
                    "id: {}\nevent: {}\ndata: {}\n\n",
                    e.sequence, e.event_type, e.body
                );
                self.send(frame).await?;
            }
            after = page.next_after;
            if page.terminal {
                let done = StreamEnd {
                    run_id: run_id.to_string(),
                    terminal_sequence: after,
                };
                let done = serde_json::to_string(&done).unwrap_or_default();
                return self.send(format!("event: done\ndata: {done}\n\n")).await;
            }
            if progressed {
                idle = self.config.poll_min;
                if page.has_more {
                    // A buffered answer (no time left) is one page: the client resumes.
                    if Instant::now() >= self.ends_at || *self.closing.borrow() {
                        return Ok(());
                    }
                    head = self.head(&run_id).await?;
                    continue;
                }
            }
            // Nothing (more) to send now: wait for the head to move past `after`.
            loop {
                let now = Instant::now();
                if now >= self.ends_at || *self.closing.borrow() {
                    return Ok(());
                }
                let keepalive_at = self.last_sent + self.config.keepalive;
                if now >= keepalive_at {
                    self.send(": keep-alive\n\n".into()).await?;
                    continue;
                }
                let until = keepalive_at.min(self.ends_at);
                let woken = match signal.as_mut() {
                    Some(rx) => {
                        tokio::select! {
                            changed = rx.changed() => changed.is_ok(),
                            _ = tokio::time::sleep_until(until.into()) => false,
                            _ = self.tx.closed() => return Err(Stop::Gone),
                            // A closed sender (the deps are gone) is a shutdown too.
                            closed = self.closing.changed() => match closed {
                                Ok(()) => continue,
                                Err(_) => return Ok(()),
                            },
                        }
                    }
                    None => {
                        let nap = idle.min(until.saturating_duration_since(now));
                        tokio::select! {
                            _ = tokio::time::sleep(nap) => {}
                            _ = self.tx.closed() => return Err(Stop::Gone),
                            // A closed sender (the deps are gone) is a shutdown too.
                            closed = self.closing.changed() => match closed {
                                Ok(()) => continue,
                                Err(_) => return Ok(()),
                            },
                        }
                        idle = (idle * 2).min(self.config.poll_max);
                        true
                    }
                };
                if !woken {
                    continue;
                }
                // Polling (no write signal), the wait reads the head eventually
                // consistently: a lagging answer only delays the frame to the next poll.
                // Once it shows a change, the head the page is read against is read
                // strongly (docs/architecture.md §2).
                let moved = |h: &RunHead| h.next_seq > after.saturating_add(1) || page.has_more;
                if signal.is_none() && !page.has_more {
                    let seen = self.lagging_head(&run_id).await?;
                    if !seen.as_ref().is_some_and(moved) && seen.is_some() {
                        continue;
                    }
                }
                head = self.head(&run_id).await?;
                // Past `after` (or the run ended with nothing new — the terminal event
                // is after `after` then, so this holds): read the page.
                if moved(&head) {
                    break;
                }
            }
        }
    }

    /// `None` when the lagging read found no head (read strongly to tell).
    async fn lagging_head(&self, run_id: &str) -> Result<Option<RunHead>, Stop> {
        self.log.lagging_head(run_id).await.map_err(|_| Stop::Store)
    }

    async fn head(&self, run_id: &str) -> Result<RunHead, Stop> {
        self.log
            .head(run_id)
            .await
            .ok()
            .flatten()
            .ok_or(Stop::Store)
    }
}
