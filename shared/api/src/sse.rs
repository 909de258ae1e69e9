//! The live stream (seed 003's SSE contract, DESIGN §5): `GET /api/runs/{id}/stream`, or
//! `GET /api/runs/{id}/events` with `Accept: text/event-stream`.
//!
//! Frames: `retry: <ms>` first; then one frame per event — `id: <sequence>`,
//! `event: <type>`, `data: <the event JSON replay serves>`; a `: keep-alive` comment
//! after every `keepalive` without a frame; after the terminal event a final
//! `event: done` frame with no id, then the end. Otherwise the response ends cleanly
//! after a bounded window and the client resumes with `Last-Event-ID` (or `?after=`).
//!
//! The stream is the replay pages one after the other (the gap-safe
//! [`read_page`]: a page ends at the first sequence not yet visible), so catch-up and
//! live tail are the same loop and their boundary has no gap and no duplicate. Between
//! pages it waits: on the embedded store for the store's write signal; on DynamoDB it
//! polls the run's head (one `GetItem`), backing off from `poll_min` to `poll_max` while
//! nothing arrives, and reads events only once the head moved.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::mpsc;
use tollgate_domain::{validate_run_id, RunHead};
use tollgate_store::{read_page, RunStore};
use tracing::instrument;

use crate::auth::Credentials;
use crate::replay::authorize_read;
use crate::request::query_param;
use crate::{ApiError, ConfigError, Deps};

/// Live streams one process holds open at most for operators, and as many again for
/// agents and run tokens; one more is 503 with `Retry-After`.
pub const MAX_OPEN_STREAMS: usize = 500;

/// The places for open streams: operators' apart from everyone else's.
pub struct StreamSlots {
    operators: std::sync::Arc<tokio::sync::Semaphore>,
    others: std::sync::Arc<tokio::sync::Semaphore>,
}

impl StreamSlots {
    pub fn new(each: usize) -> Self {
        Self {
            operators: std::sync::Arc::new(tokio::sync::Semaphore::new(each)),
            others: std::sync::Arc::new(tokio::sync::Semaphore::new(each)),
        }
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
}

impl Default for SseConfig {
    fn default() -> Self {
        Self {
            window: Duration::from_secs(300),
            keepalive: Duration::from_secs(15),
            retry: Duration::from_secs(1),
            poll_min: Duration::from_millis(100),
            poll_max: Duration::from_secs(1),
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
fn start_after(headers: &HeaderMap, query: Option<&str>) -> Result<u64, ApiError> {
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
#[instrument(skip_all, fields(run_id = %run_id))]
pub async fn stream(
    State(deps): State<Deps>,
    Path(run_id): Path<String>,
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
    run_id: String,
    query: Option<&str>,
    headers: &HeaderMap,
    budget: Option<ResponseBudget>,
    creds: &Credentials,
) -> Result<Response, ApiError> {
    let caller = deps.auth.caller(creds, Some(&run_id))?;
    let after = start_after(headers, query)?;
    if !validate_run_id(&run_id) {
        return Err(ApiError::not_found("run not found"));
    }
    let head = deps
        .store
        .read_head(&run_id)
        .await?
        .ok_or_else(|| ApiError::not_found("run not found"))?;
    authorize_read(&caller, &head)?;
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
    let slots = match &caller {
        crate::auth::Caller::Jwt(c) if c.role == crate::auth::Role::Operator => {
            &deps.streams.operators
        }
        _ => &deps.streams.others,
    };
    let permit = slots.clone().try_acquire_owned().map_err(|_| {
        ApiError::new(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "too many open live streams here; retry",
        )
    })?;
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let store = deps.store.clone();
    let closing = deps.closing();
    tokio::spawn(async move {
        let _permit = permit;
        let tail = Tail {
            store: store.as_ref(),
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

/// One response's loop: pages while there are events, waits while there are none.
struct Tail<'a> {
    store: &'a dyn RunStore,
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
        let mut signal = self.store.appended();
        let mut idle = self.config.poll_min;
        loop {
            let page = read_page(self.store, &head, after, PAGE)
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
                let done = json!({"run_id": run_id, "terminal_sequence": after});
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
                head = self.head(&run_id).await?;
                // Past `after` (or the run ended with nothing new — the terminal event
                // is after `after` then, so this holds): read the page.
                if head.next_seq > after.saturating_add(1) || page.has_more {
                    break;
                }
            }
        }
    }

    async fn head(&self, run_id: &str) -> Result<RunHead, Stop> {
        self.store
            .read_head(run_id)
            .await
            .ok()
            .flatten()
            .ok_or(Stop::Store)
    }
}
