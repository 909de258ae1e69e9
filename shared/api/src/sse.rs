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
//! sequence not yet visible), so catch-up and live tail are the same loop ([`follow`],
//! which the WebSocket subscriptions run too) and their boundary has no gap and no
//! duplicate. Between pages it waits ([`Wake`]): on the embedded store for the store's
//! write signal ([`RunLog::appended`]); in `tollgate serve --backend aws` for the run's
//! wake-ups from the process's DynamoDB Streams reader ([`crate::live`]), with a slow
//! safety poll; in a Lambda function it polls the run's head (one eventually consistent
//! `GetItem`, half the read units of a strong one), backing off from `poll_min` to
//! `poll_max` while nothing arrives, and once a poll sees the head moved it reads the
//! head strongly, then the events. Either way it reads events only once the head moved.

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
    let wake = Wake::for_run(&deps, &run_id);
    tokio::spawn(async move {
        // Both given back when this task ends, however the stream ends.
        let _permit = permit;
        let _places = places;
        let tail = Tail {
            tx,
            closing,
            config,
            ends_at: Instant::now() + window,
            last_sent: Instant::now(),
        };
        tail.run(log, wake, head, after).await;
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

/// The caps a non-operator SSE stream counts against: those of its caller
/// ([`connection_keys`]) and, should the run be another tenant's than the caller's own,
/// the run's tenant too.
pub(crate) fn holder_keys(
    caller: &crate::auth::Caller,
    head: &RunHead,
    caps: &StreamCaps,
) -> Vec<(String, usize, &'static str)> {
    let mut keys = connection_keys(caller, Some(head), caps);
    let tenant = tenant_key(head, caps);
    if !keys.iter().any(|(k, _, _)| *k == tenant.0) {
        keys.push(tenant);
    }
    keys
}

/// The caps one non-operator connection (a WebSocket connection, an SSE stream) counts
/// against, whether or not it follows anything: a run token's run, the agent that
/// created that run and the run's tenant (so that runs, which cost nothing to create,
/// buy no more places: every run token of a project shares the project's); an agent
/// JWT's agent (its `sub` in its project) and its own tenant (its project, or without
/// one, itself). `head` is the run token's run (unused for a JWT).
pub(crate) fn connection_keys(
    caller: &crate::auth::Caller,
    head: Option<&RunHead>,
    caps: &StreamCaps,
) -> Vec<(String, usize, &'static str)> {
    let mut keys = Vec::with_capacity(3);
    match caller {
        crate::auth::Caller::Run { run_id, .. } => {
            keys.push((format!("run:{run_id}"), caps.per_run, "run token"));
            if let Some(head) = head {
                keys.push((
                    agent_key(head.project_id.as_deref(), &head.created_by),
                    caps.per_agent,
                    "agent",
                ));
                keys.push(tenant_key(head, caps));
            }
        }
        crate::auth::Caller::Jwt(c) => {
            keys.push((
                agent_key(c.project_id.as_deref(), &c.sub),
                caps.per_agent,
                "agent",
            ));
            let tenant = match &c.project_id {
                Some(p) => format!("project:{p:?}"),
                None => format!("creator:{:?}", c.sub),
            };
            keys.push((tenant, caps.per_project, "project"));
        }
    }
    keys
}

/// The key of an agent: its `sub` in its project. The same `sub` in two projects is two
/// agents (quoted: no `sub` or project can make two keys meet).
fn agent_key(project_id: Option<&str>, sub: &str) -> String {
    format!(
        "agent:{:?}:{:?}",
        project_id.map(str::to_owned),
        sub.to_owned()
    )
}

/// The cap of the run's tenant (its project, or without one, the agent that created it).
pub(crate) fn tenant_key(head: &RunHead, caps: &StreamCaps) -> (String, usize, &'static str) {
    let tenant = match &head.project_id {
        Some(p) => format!("project:{p:?}"),
        None => format!("creator:{:?}", head.created_by),
    };
    (tenant, caps.per_project, "project")
}

/// Why a tail stopped sending.
pub(crate) enum Stop {
    /// The client went away.
    Gone,
    /// The store failed: end the response (the client resumes).
    Store,
}

/// What a tail sends into: an SSE response or a WebSocket subscription. The page loop
/// ([`follow`]) is the same for both.
pub(crate) trait Sink: Send {
    /// One event, as replay serves it.
    fn event(
        &mut self,
        event: &tollgate_store::StoredEvent,
    ) -> impl std::future::Future<Output = Result<(), Stop>> + Send;
    /// After the run's terminal event.
    fn done(
        &mut self,
        end: StreamEnd,
    ) -> impl std::future::Future<Output = Result<(), Stop>> + Send;
    /// When [`Sink::tick`] is due (a keep-alive), if ever.
    fn tick_at(&self) -> Option<Instant>;
    fn tick(&mut self) -> impl std::future::Future<Output = Result<(), Stop>> + Send;
    /// Resolves once the reader is gone.
    fn closed(&self) -> impl std::future::Future<Output = ()> + Send;
}

/// What a tail waits on between pages (docs/architecture.md §5).
pub(crate) enum Wake {
    /// The embedded store's write signal: changes after every write of this process.
    Signal(tokio::sync::watch::Receiver<u64>),
    /// This run's wake-ups from the process's DynamoDB Streams reader
    /// ([`crate::live::Wakes`]), and a slow safety poll in case the reader falls behind
    /// or fails: a lost stream record delays an event, never skips it.
    Run {
        rx: tokio::sync::watch::Receiver<u64>,
        safety: Duration,
    },
    /// Nothing tells this process of writes (a Lambda instance): poll the head, backing
    /// off from `min` to `max` while nothing arrives.
    Poll {
        idle: Duration,
        min: Duration,
        max: Duration,
    },
}

impl Wake {
    /// How a tail of `run_id` waits here: the store's signal, else the stream reader's
    /// wake-ups, else polling.
    pub(crate) fn for_run(deps: &Deps, run_id: &str) -> Self {
        if let Some(rx) = deps.runs.appended() {
            return Wake::Signal(rx);
        }
        if let Some(wakes) = &deps.wakes {
            return Wake::Run {
                rx: wakes.watch(run_id),
                safety: wakes.safety_poll(),
            };
        }
        Wake::Poll {
            idle: deps.sse.poll_min,
            min: deps.sse.poll_min,
            max: deps.sse.poll_max,
        }
    }

    /// Whether this wait polls the head (nothing tells the process of writes).
    fn polls(&self) -> bool {
        matches!(self, Wake::Poll { .. })
    }

    /// Something arrived: poll eagerly again.
    fn progressed(&mut self) {
        if let Wake::Poll { idle, min, .. } = self {
            *idle = *min;
        }
    }

    /// Waits for a reason to read the head again (`true`), or until `until` (`false`).
    async fn wait(&mut self, until: Option<Instant>) -> bool {
        let sleep_until = |at: Option<Instant>| async move {
            match at {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        match self {
            Wake::Signal(rx) => {
                tokio::select! {
                    changed = rx.changed() => {
                        if changed.is_err() {
                            // The store is gone (shutting down): nothing more will come.
                            sleep_until(until).await;
                            return false;
                        }
                        true
                    }
                    _ = sleep_until(until) => false,
                }
            }
            Wake::Run { rx, safety } => {
                let poll_at = Instant::now() + *safety;
                let at = until.map_or(poll_at, |u| u.min(poll_at));
                tokio::select! {
                    changed = rx.changed() => {
                        if changed.is_err() {
                            tokio::time::sleep_until(at.into()).await;
                        }
                        changed.is_ok() || at == poll_at
                    }
                    _ = tokio::time::sleep_until(at.into()) => {
                        if at == poll_at {
                            tracing::debug!("live tail: safety poll");
                        }
                        at == poll_at
                    }
                }
            }
            Wake::Poll { idle, max, .. } => {
                let now = Instant::now();
                let nap = match until {
                    Some(u) => (*idle).min(u.saturating_duration_since(now)),
                    None => *idle,
                };
                tokio::time::sleep(nap).await;
                *idle = (*idle * 2).min(*max);
                true
            }
        }
    }
}

/// The page loop every live tail runs (SSE responses and WebSocket subscriptions): the
/// gap-safe replay pages one after the other ([`RunLog::page`]), so catch-up and live
/// tail are one loop with no gap and no duplicate at their boundary; between pages it
/// waits on `wake`. Ends after the terminal event (`done` sent), at `ends_at`, or when
/// the process closes.
pub(crate) async fn follow<S: Sink>(
    log: &RunLog,
    sink: &mut S,
    wake: &mut Wake,
    closing: &mut tokio::sync::watch::Receiver<bool>,
    ends_at: Option<Instant>,
    mut head: RunHead,
    mut after: u64,
) -> Result<(), Stop> {
    let run_id = head.run_id.clone();
    let ended = |closing: &tokio::sync::watch::Receiver<bool>| {
        ends_at.is_some_and(|e| Instant::now() >= e) || *closing.borrow()
    };
    loop {
        let page = log
            .page(&head, after, PAGE)
            .await
            .map_err(|_| Stop::Store)?;
        let progressed = !page.events.is_empty();
        for e in &page.events {
            sink.event(e).await?;
        }
        after = page.next_after;
        if page.terminal {
            return sink
                .done(StreamEnd {
                    run_id: run_id.to_string(),
                    terminal_sequence: after,
                })
                .await;
        }
        if progressed {
            wake.progressed();
            if page.has_more {
                // A buffered answer (no time left) is one page: the client resumes.
                if ended(closing) {
                    return Ok(());
                }
                head = read_head(log, &run_id).await?;
                continue;
            }
        }
        // Nothing (more) to send now: wait for the head to move past `after`.
        loop {
            if ended(closing) {
                return Ok(());
            }
            let tick_at = sink.tick_at();
            if tick_at.is_some_and(|t| Instant::now() >= t) {
                sink.tick().await?;
                continue;
            }
            let until = match (tick_at, ends_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let woken = tokio::select! {
                woken = wake.wait(until) => woken,
                _ = sink.closed() => return Err(Stop::Gone),
                // A closed sender (the deps are gone) is a shutdown too.
                closed = closing.changed() => match closed {
                    Ok(()) => continue,
                    Err(_) => return Ok(()),
                },
            };
            if !woken {
                continue;
            }
            let moved = |h: &RunHead| h.next_seq > after.saturating_add(1) || page.has_more;
            // Polling, the wait reads the head eventually consistently: a lagging answer
            // only delays the frame to the next poll. Once it shows a change, the head the
            // page is read against is read strongly (docs/architecture.md §2).
            if wake.polls() && !page.has_more {
                let seen = log.lagging_head(&run_id).await.map_err(|_| Stop::Store)?;
                if seen.as_ref().is_some_and(|h| !moved(h)) {
                    continue;
                }
            }
            head = read_head(log, &run_id).await?;
            // Past `after` (or the run ended with nothing new — the terminal event is
            // after `after` then, so this holds): read the page.
            if moved(&head) {
                break;
            }
        }
    }
}

async fn read_head(log: &RunLog, run_id: &str) -> Result<RunHead, Stop> {
    log.head(run_id).await.ok().flatten().ok_or(Stop::Store)
}

/// One SSE response: its frames go to the response body.
struct Tail {
    tx: mpsc::Sender<Bytes>,
    /// True once the process shuts down: the stream ends as at the end of its window.
    closing: tokio::sync::watch::Receiver<bool>,
    config: SseConfig,
    ends_at: Instant,
    last_sent: Instant,
}

impl Tail {
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

    async fn run(mut self, log: RunLog, mut wake: Wake, head: RunHead, after: u64) {
        let retry = format!("retry: {}\n\n", self.config.retry.as_millis());
        if self.send(retry).await.is_ok() {
            let mut closing = self.closing.clone();
            let ends_at = Some(self.ends_at);
            match follow(
                &log,
                &mut self,
                &mut wake,
                &mut closing,
                ends_at,
                head,
                after,
            )
            .await
            {
                Ok(()) | Err(Stop::Gone) => {}
                Err(Stop::Store) => {
                    tracing::warn!("live stream ended early: storage");
                    // Ask the client to come back later than usual, not in a tight loop.
                    let _ = self.send("retry: 5000\n\n".into()).await;
                }
            }
        }
    }
}

impl Sink for Tail {
    async fn event(&mut self, e: &tollgate_store::StoredEvent) -> Result<(), Stop> {
        let frame = format!(
            "id: {}\nevent: {}\ndata: {}\n\n",
            e.sequence, e.event_type, e.body
        );
        self.send(frame).await
    }

    async fn done(&mut self, end: StreamEnd) -> Result<(), Stop> {
        let done = serde_json::to_string(&end).unwrap_or_default();
        self.send(format!("event: done\ndata: {done}\n\n")).await
    }

    fn tick_at(&self) -> Option<Instant> {
        Some(self.last_sent + self.config.keepalive)
    }

    async fn tick(&mut self) -> Result<(), Stop> {
        self.send(": keep-alive\n\n".into()).await
    }

    async fn closed(&self) {
        self.tx.closed().await
    }
}
