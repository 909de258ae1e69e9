//! The operator side: an [`Operator`] with an operator JWT lists the pending approval
//! cards, approves or denies them, and follows a run's live stream.
//!
//! - [`Operator::pending`]: `GET /api/approvals?state=pending` (every run the token may
//!   see, soonest deadline first, paged with `next_after`) or
//!   `GET /api/runs/{id}/approvals?state=pending` (one run's).
//! - [`Operator::approve`] / [`Operator::deny`]: `POST /api/runs/{id}/tool-approvals`
//!   or `/tool-denials` with `{request_id, scope?, tool_name?}`. Repeating a decision is
//!   safe: a later click answers 200 with the card's real state.
//! - [`Operator::list_runs`]: `GET /api/runs` (one project's runs, newest first, paged
//!   with a cursor, narrowed by status, owner and run-id prefix).
//! - [`Operator::follow`]: `GET /api/runs/{id}/events` with `Accept: text/event-stream`,
//!   resumed with `Last-Event-ID` after every window or break, each event handed out
//!   once, in order, until the run's `done` frame.
//!
//! Failures are an [`OperatorError`]: it tells a decision that was never sent
//! ([`OperatorError::Unreachable`]) from one that may have been recorded
//! ([`OperatorError::NoAnswer`], [`OperatorError::Unreadable`]), and keeps a refusal as
//! the server answered it ([`Refusal`]; [`Refusal::to_error`] is its meaning as the
//! crate's [`Error`]).

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use reqwest::Method;
use serde_json::Value;
use tokio::time::Instant;
use tollgate_protocol::approvals as wire;

use crate::http::{describe, is_event_stream, read, Answer, Http, Lost};
use crate::retry::reconnect_backoff;
use crate::sse::{SseItem, SseParser};
use crate::{ClientConfig, Error, RetryPolicy, Scope};

/// The reconnect delay until the server sends its `retry:` hint (the SSE default).
const DEFAULT_RETRY: Duration = Duration::from_secs(1);
/// Longest wait between attempts after errors.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The longest wait after a window that ended at once with nothing new.
const QUIET_MAX: Duration = Duration::from_secs(5);
/// The shortest wait a server's `retry:` hint may ask for.
const MIN_RETRY: Duration = crate::retry::MIN_RECONNECT;
/// The longest wait a server's `Retry-After` may ask for.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// A window that ends sooner than this without a new event counts as a failure.
const QUICK_WINDOW: Duration = Duration::from_secs(1);

/// How an [`Operator`] talks to the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorConfig {
    /// Retries of transport errors, 5xx and 429 on listings and decisions (a repeated
    /// decision is safe: the server answers it with the card's real state).
    pub retry: RetryPolicy,
    /// How long one listing or decision may take.
    pub request_timeout: Duration,
    /// How long connecting may take.
    pub connect_timeout: Duration,
    /// How long the server may take to answer a [`Operator::follow`] request (status and
    /// headers, and a refusal's body).
    pub answer_timeout: Duration,
    /// A live stream that sends nothing this long is broken (the server sends a
    /// keep-alive every 15 s).
    pub stream_stall: Duration,
    /// The `User-Agent` sent.
    pub user_agent: String,
}

impl Default for OperatorConfig {
    /// Default retries, 30 s requests, 10 s connects, 30 s answers, 45 s stream stall.
    fn default() -> Self {
        Self {
            retry: RetryPolicy::default(),
            request_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            answer_timeout: Duration::from_secs(30),
            stream_stall: Duration::from_secs(45),
            user_agent: crate::http::USER_AGENT.to_owned(),
        }
    }
}

/// A refusal as the server answered it: the status, and the body's `error`, `code`,
/// `state` and `request_id` when it is JSON with them (servers before `code` and
/// `request_id` send neither).
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The HTTP status.
    pub status: u16,
    /// The body's `error`.
    pub error: Option<String>,
    /// The body's `code`: what the refusal means, for a program (`not_found`,
    /// `run_terminal`, …).
    pub code: Option<String>,
    /// The body's `state`.
    pub state: Option<String>,
    /// The request's id: the body's `request_id`, else the `x-request-id` header.
    pub request_id: Option<String>,
    /// `Retry-After` in seconds, when given.
    pub retry_after: Option<Duration>,
    /// The body (`Null` when it was not JSON).
    pub body: Value,
}

impl Refusal {
    fn from_answer(answer: Answer) -> Self {
        let body = if answer.not_json.is_some() {
            Value::Null
        } else {
            answer.body
        };
        let text = |k: &str| body.get(k).and_then(Value::as_str).map(str::to_owned);
        Self {
            status: answer.status,
            error: text("error"),
            code: text("code"),
            state: text("state"),
            request_id: text("request_id").or(answer.request_id),
            retry_after: answer.retry_after,
            body,
        }
    }

    /// `401 Unauthorized` (the status and its reason phrase).
    pub fn status_text(&self) -> String {
        match reqwest::StatusCode::from_u16(self.status) {
            Ok(status) => status.to_string(),
            Err(_) => self.status.to_string(),
        }
    }

    /// Whether asking again later may succeed (5xx, 429, 408).
    pub fn is_transient(&self) -> bool {
        (500..=599).contains(&self.status) || matches!(self.status, 429 | 408)
    }

    /// What the refusal means, as the crate's [`Error`].
    pub fn to_error(&self) -> Error {
        Error::from_answer(self.status, &self.body, self.retry_after)
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.error {
            Some(e) => write!(f, "{}: {e}", self.status_text()),
            None => f.write_str(&self.status_text()),
        }
    }
}

/// What an operator call can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OperatorError {
    /// The base URL or the token cannot be used (nothing was sent).
    #[error("invalid client configuration: {0}")]
    Config(String),
    /// No connection: nothing was sent.
    #[error("cannot reach the server: {0}")]
    Unreachable(String),
    /// Sent, then no answer: a decision may have been recorded (repeating it is safe).
    #[error("no answer from the server: {0}")]
    NoAnswer(String),
    /// A success answer that broke off or is not JSON: the request was carried out.
    #[error("the answer could not be read: {message}")]
    Unreadable {
        /// The answer's status.
        status: u16,
        /// What was wrong.
        message: String,
    },
    /// Any other answer than the one hoped for.
    #[error("refused ({0})")]
    Refused(Box<Refusal>),
    /// [`Operator::follow`]: the answer is not `text/event-stream` (not a Tollgate
    /// server?).
    #[error("the server did not answer with an event stream")]
    NotAStream,
}

impl From<Lost> for OperatorError {
    fn from(lost: Lost) -> Self {
        match lost {
            Lost::Unreachable(m) => OperatorError::Unreachable(m),
            Lost::NoAnswer(m) => OperatorError::NoAnswer(m),
            Lost::Unreadable { status, message } => OperatorError::Unreadable { status, message },
        }
    }
}

impl From<Error> for OperatorError {
    fn from(e: Error) -> Self {
        match e {
            Error::Config(m) => OperatorError::Config(m),
            other => OperatorError::NoAnswer(other.to_string()),
        }
    }
}

/// A connection to one Tollgate server as one operator (its JWT). No `Debug` of the
/// token.
pub struct Operator {
    http: Http,
    token: String,
    me: Option<String>,
    config: OperatorConfig,
}

impl fmt::Debug for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Operator")
            .field("me", &self.me)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// One approval card, as `GET /api/approvals` lists it (the contract's `Card`).
pub use tollgate_protocol::approvals::Card;

/// One page of pending cards.
#[derive(Debug, Clone, PartialEq)]
pub struct CardPage {
    /// The cards, soonest deadline first.
    pub cards: Vec<Card>,
    /// More cards are pending than listed.
    pub has_more: bool,
    /// Where the next page of `GET /api/approvals` starts (give it to
    /// [`Operator::pending`] as `after`); `None` on the last page and on one run's list
    /// (which is not paged: deciding the first cards makes room).
    pub next_after: Option<String>,
}

impl From<wire::CardPage> for CardPage {
    fn from(page: wire::CardPage) -> Self {
        Self {
            cards: page.approvals,
            has_more: page.has_more,
            next_after: page.next_after,
        }
    }
}

impl From<wire::RunCards> for CardPage {
    fn from(page: wire::RunCards) -> Self {
        Self {
            cards: page.approvals,
            has_more: page.has_more,
            next_after: None,
        }
    }
}

/// A page of runs (`GET /api/runs`; the contract's `RunList`).
pub use tollgate_protocol::runs::{RunList, RunSummary};

/// What [`Operator::list_runs`] asks for; every field is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunQuery {
    /// Most runs to answer (1–200; the server's default 50).
    pub limit: Option<u32>,
    /// The `next_cursor` of the page before.
    pub after: Option<String>,
    /// `running`, `completed`, `failed` or `cancelled`.
    pub status: Option<String>,
    /// Only this owner's runs (exact).
    pub owner: Option<String>,
    /// Only runs whose id starts with this.
    pub run_id_prefix: Option<String>,
    /// The project to list (an operator token without a project only).
    pub project_id: Option<String>,
}

/// What a decision asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// `tool-approvals`.
    Approve,
    /// `tool-denials`.
    Deny,
}

impl Verb {
    /// The card's state this decision asks for: `approved` or `denied`.
    pub fn state(self) -> &'static str {
        match self {
            Verb::Approve => "approved",
            Verb::Deny => "denied",
        }
    }
}

/// A decision's answer: the card's state now (this click's, or an earlier one's), as
/// the contract's `Decided`.
pub type DecisionAnswer = wire::Decided;

impl Operator {
    /// An operator of the server at `base_url` (a path prefix such as an API stage is
    /// kept) acting with the operator's JWT.
    pub fn new(base_url: &str, operator_jwt: &str) -> Result<Self, OperatorError> {
        Self::with_config(base_url, operator_jwt, OperatorConfig::default())
    }

    /// [`Operator::new`] with other timeouts, retries or `User-Agent`.
    pub fn with_config(
        base_url: &str,
        operator_jwt: &str,
        config: OperatorConfig,
    ) -> Result<Self, OperatorError> {
        let client_config = ClientConfig {
            retry: config.retry.clone(),
            request_timeout: config.request_timeout,
            connect_timeout: config.connect_timeout,
            stream_stall: config.stream_stall,
            ..ClientConfig::default()
        };
        let http = Http::new(base_url, client_config, &config.user_agent)?;
        let token = operator_jwt.trim().to_owned();
        if token.is_empty() {
            return Err(OperatorError::Config("the token is empty".into()));
        }
        crate::http::bearer(&token)?;
        Ok(Self {
            http,
            me: token_sub(&token),
            token,
            config,
        })
    }

    /// The `sub` the token names, read without verifying it (the server verifies): who
    /// "me" is when an answer says who decided. `None` for a token that is not a JWT.
    pub fn me(&self) -> Option<&str> {
        self.me.as_deref()
    }

    /// The configuration in use.
    pub fn config(&self) -> &OperatorConfig {
        &self.config
    }

    /// One page of the pending cards: of every run the token may see (`run: None`;
    /// `after` a previous page's [`CardPage::next_after`]), or of one run.
    pub async fn pending(
        &self,
        run: Option<&str>,
        after: Option<&str>,
    ) -> Result<CardPage, OperatorError> {
        let mut url = match run {
            Some(run) => self.http.endpoint(&["api", "runs", run, "approvals"]),
            None => self.http.endpoint(&["api", "approvals"]),
        };
        url.query_pairs_mut().append_pair("state", "pending");
        if let (None, Some(after)) = (run, after) {
            url.query_pairs_mut().append_pair("after", after);
        }
        let answer = self.ok(Method::GET, url, None).await?;
        let parsed = match run {
            Some(_) => serde_json::from_value::<wire::RunCards>(answer).map(CardPage::from),
            None => serde_json::from_value::<wire::CardPage>(answer).map(CardPage::from),
        };
        parsed.map_err(|e| OperatorError::Unreadable {
            status: 200,
            message: format!("not a page of cards ({e})"),
        })
    }

    /// One page of the runs the token's project holds (`GET /api/runs`), newest first:
    /// `query` narrows it (status, owner, run-id prefix) and names the page (`after`, a
    /// previous page's `next_cursor`). A page may hold fewer runs than `limit`, even
    /// none, while `has_more` is true: follow `next_cursor` until it is false.
    pub async fn list_runs(&self, query: &RunQuery) -> Result<RunList, OperatorError> {
        let mut url = self.http.endpoint(&["api", "runs"]);
        {
            let mut pairs = url.query_pairs_mut();
            if let Some(limit) = query.limit {
                pairs.append_pair("limit", &limit.to_string());
            }
            for (name, value) in [
                ("after", &query.after),
                ("status", &query.status),
                ("owner", &query.owner),
                ("q", &query.run_id_prefix),
                ("project_id", &query.project_id),
            ] {
                if let Some(value) = value {
                    pairs.append_pair(name, value);
                }
            }
        }
        let answer = self.ok(Method::GET, url, None).await?;
        serde_json::from_value(answer).map_err(|e| OperatorError::Unreadable {
            status: 200,
            message: format!("not a page of runs ({e})"),
        })
    }

    /// Approves the card `request_id` of `run` (the child's, or its coordinator's) with
    /// `scope`; `tool_name`, when given, is a check (refused if the card is for another
    /// tool).
    pub async fn approve(
        &self,
        run: &str,
        request_id: &str,
        scope: Scope,
        tool_name: Option<&str>,
    ) -> Result<DecisionAnswer, OperatorError> {
        self.decide(run, request_id, Verb::Approve, Some(scope), tool_name)
            .await
    }

    /// Denies the card `request_id` of `run`.
    pub async fn deny(
        &self,
        run: &str,
        request_id: &str,
        tool_name: Option<&str>,
    ) -> Result<DecisionAnswer, OperatorError> {
        self.decide(run, request_id, Verb::Deny, None, tool_name)
            .await
    }

    /// One decision: `POST /api/runs/{run}/tool-approvals` (with `scope`, `once` when
    /// `None`) or `/tool-denials`.
    pub async fn decide(
        &self,
        run: &str,
        request_id: &str,
        verb: Verb,
        scope: Option<Scope>,
        tool_name: Option<&str>,
    ) -> Result<DecisionAnswer, OperatorError> {
        self.decide_with_reason(run, request_id, verb, scope, tool_name, None)
            .await
    }

    /// [`Operator::decide`], saying why: `reason` (at most 1024 characters, no control
    /// characters) is recorded on the card and in its resolution events.
    pub async fn decide_with_reason(
        &self,
        run: &str,
        request_id: &str,
        verb: Verb,
        scope: Option<Scope>,
        tool_name: Option<&str>,
        reason: Option<&str>,
    ) -> Result<DecisionAnswer, OperatorError> {
        let (route, scope) = match verb {
            Verb::Approve => ("tool-approvals", Some(scope.unwrap_or_default().as_str())),
            Verb::Deny => ("tool-denials", None),
        };
        let body = wire::Decide {
            request_id: request_id.into(),
            scope: scope.map(Value::from),
            tool_name: tool_name.map(str::to_owned),
            reason: reason.map(str::to_owned),
        };
        let body = serde_json::to_value(body).map_err(|e| OperatorError::Config(e.to_string()))?;
        let url = self.http.endpoint(&["api", "runs", run, route]);
        let answer = self.ok(Method::POST, url, Some(&body)).await?;
        serde_json::from_value(answer).map_err(|e| OperatorError::Unreadable {
            status: 200,
            message: format!("not a decision's answer ({e})"),
        })
    }

    /// Reconciles an attempt whose outcome is unknown with what was observed at the tool
    /// (`POST /api/runs/{run}/mutations/{tool_call_id}/{approval_id}/reconcile`,
    /// `observed` `applied` or `not_applied`): the record's state it answers
    /// (`completed` or `not_executed`).
    pub async fn reconcile(
        &self,
        run: &str,
        tool_call_id: &str,
        approval_id: &str,
        applied: bool,
    ) -> Result<String, OperatorError> {
        let body = serde_json::json!({"observed": if applied { "applied" } else { "not_applied" }});
        let url = self.http.endpoint(&[
            "api",
            "runs",
            run,
            "mutations",
            tool_call_id,
            approval_id,
            "reconcile",
        ]);
        let answer = self.ok(Method::POST, url, Some(&body)).await?;
        answer["state"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| OperatorError::Unreadable {
                status: 200,
                message: "a reconciliation's answer without its state".into(),
            })
    }

    /// Follows `run`'s live stream from after sequence `after` (0: from the start).
    pub fn follow(&self, run: &str, after: u64) -> Follow<'_> {
        Follow {
            operator: self,
            run: run.to_owned(),
            live: Live::Unknown,
            url: self.http.endpoint(&["api", "runs", run, "events"]),
            last: after,
            retry: DEFAULT_RETRY,
            failures: 0,
            progressed: false,
            opened: Instant::now(),
            wait: None,
            resp: None,
            parser: SseParser::new(),
            queue: VecDeque::new(),
            broken: None,
            done: None,
        }
    }

    /// A JSON answer with status 200, or why there is none.
    async fn ok(
        &self,
        method: Method,
        url: reqwest::Url,
        body: Option<&Value>,
    ) -> Result<Value, OperatorError> {
        let answer = self.http.exchange(method, url, &self.token, body).await??;
        if answer.status != 200 {
            return Err(OperatorError::Refused(Box::new(Refusal::from_answer(
                answer,
            ))));
        }
        match answer.not_json {
            Some(message) => Err(OperatorError::Unreadable {
                status: answer.status,
                message,
            }),
            None => Ok(answer.body),
        }
    }
}

/// The `sub` claim of a JWT, unverified; `None` for anything else (a run token).
fn token_sub(token: &str) -> Option<String> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("sub")?.as_str().map(str::to_owned)
}

/// Why a live-stream response gave out (the follow reconnects).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Interruption {
    /// No answer (status and headers, or a refusal's body) within the answer timeout.
    NoAnswer(Duration),
    /// The request could not be sent, or no answer came (as a transport error reads).
    SendFailed(String),
    /// Nothing received for this long (not even a keep-alive).
    Stalled(Duration),
    /// The stream broke (as a transport error reads).
    Broke(String),
    /// A line over [`crate::sse::MAX_LINE`] (or a frame over
    /// [`crate::sse::MAX_FRAME_DATA`]): the response was dropped.
    Overflow,
    /// A refusal worth asking again (5xx, 429, 408).
    Refused(Refusal),
}

/// What [`Follow::next`] hands out.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum FollowItem {
    /// One event, once, in order.
    Event {
        /// The frame's `id:` as a sequence.
        sequence: Option<u64>,
        /// The frame's `event:` (the event's type).
        event: String,
        /// The event's JSON as the server stores it.
        data: String,
    },
    /// The run ended and every event was handed out; the `done` frame's data
    /// (`{run_id, terminal_sequence}`). Asking again answers this again.
    Done {
        /// The frame's data.
        data: String,
    },
    /// The response gave out: the follow resumes after `after` once `delay` has passed
    /// (the next call waits it).
    Reconnecting {
        /// Why.
        why: Interruption,
        /// The last sequence handed out (sent as `Last-Event-ID`).
        after: u64,
        /// How long the next call waits before reconnecting.
        delay: Duration,
    },
}

/// A run's live stream, followed across windows and breaks: see [`Operator::follow`].
///
/// A response ends cleanly after the server's window, or breaks; either way the follow
/// reconnects with `Last-Event-ID` = the last sequence it handed out. After a clean end
/// it waits the server's `retry:` hint (at least 100 ms); after an error it backs off
/// (the hint, doubling, at most 30 s, or the server's `Retry-After` when longer, up to
/// 60 s). A window that ends within a second without a new event counts as an error
/// for the backoff (silently, at most 5 s), so a server that ends every response at
/// once is not asked again and again. 400/401/403/404 and any other refusal that is not
/// transient end it ([`OperatorError::Refused`]).
pub struct Follow<'a> {
    operator: &'a Operator,
    run: String,
    /// Over WebSocket when the server advertises one (`GET /api/live`), else SSE.
    live: Live,
    url: reqwest::Url,
    /// The last sequence handed out.
    last: u64,
    /// The server's `retry:` hint.
    retry: Duration,
    failures: u32,
    /// Whether the current response delivered an event.
    progressed: bool,
    opened: Instant,
    /// Wait this long before the next request.
    wait: Option<Duration>,
    resp: Option<reqwest::Response>,
    parser: SseParser,
    queue: VecDeque<SseItem>,
    /// Raised once the queue is drained.
    broken: Option<Interruption>,
    done: Option<String>,
}

impl fmt::Debug for Follow<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Follow")
            .field("last", &self.last)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

/// How a [`Follow`] receives its run.
enum Live {
    /// Not asked yet (`GET /api/live` on the first call).
    Unknown,
    Sse,
    WebSocket(Box<crate::ws::WsFollow>),
}

impl Follow<'_> {
    /// The last sequence handed out.
    pub fn last(&self) -> u64 {
        self.last
    }

    /// How the run is followed: `"websocket"`, `"sse"`, or `"unknown"` before the first
    /// call.
    pub fn transport(&self) -> &'static str {
        match self.live {
            Live::Unknown => "unknown",
            Live::Sse => "sse",
            Live::WebSocket(_) => "websocket",
        }
    }

    /// The next event, the run's end, or a reconnect about to happen. Over WebSocket when
    /// `GET /api/live` advertises an endpoint ([`crate::ws::WsFollow`]), else over SSE;
    /// the items are the same either way.
    pub async fn next(&mut self) -> Result<FollowItem, OperatorError> {
        if let Some(data) = &self.done {
            return Ok(FollowItem::Done { data: data.clone() });
        }
        if matches!(self.live, Live::Unknown) {
            let op = self.operator;
            self.live = match op.http.live_websocket().await {
                Some(url) => Live::WebSocket(Box::new(crate::ws::WsFollow::new(
                    url,
                    &op.token,
                    &self.run,
                    self.last,
                    op.config.stream_stall,
                ))),
                None => Live::Sse,
            };
        }
        if let Live::WebSocket(ws) = &mut self.live {
            use crate::ws::WsItem;
            return match ws.next().await {
                Ok(WsItem::Event {
                    sequence,
                    event,
                    data,
                }) => {
                    self.last = sequence;
                    Ok(FollowItem::Event {
                        sequence: Some(sequence),
                        event,
                        data,
                    })
                }
                Ok(WsItem::Done { data }) => {
                    self.done = Some(data.clone());
                    Ok(FollowItem::Done { data })
                }
                Ok(WsItem::Reconnecting { why, after, delay }) => Ok(FollowItem::Reconnecting {
                    why: Interruption::Broke(why),
                    after,
                    delay,
                }),
                Err(refused) => Err(OperatorError::Refused(Box::new(Refusal::from_answer(
                    Answer {
                        status: refused.status,
                        body: refused.body,
                        retry_after: None,
                        not_json: None,
                        request_id: None,
                    },
                )))),
            };
        }
        loop {
            while let Some(item) = self.queue.pop_front() {
                match item {
                    SseItem::Retry(ms) => {
                        self.retry = Duration::from_millis(ms).clamp(MIN_RETRY, MAX_BACKOFF)
                    }
                    SseItem::Frame(frame) => {
                        if frame.is_done() {
                            self.resp = None;
                            self.done = Some(frame.data.clone());
                            return Ok(FollowItem::Done { data: frame.data });
                        }
                        let sequence = frame.sequence();
                        if let Some(seq) = sequence {
                            if seq <= self.last {
                                continue; // handed out already
                            }
                            self.last = seq;
                            self.progressed = true;
                        }
                        return Ok(FollowItem::Event {
                            sequence,
                            event: frame.event,
                            data: frame.data,
                        });
                    }
                }
            }
            if let Some(why) = self.broken.take() {
                return Ok(self.interrupted(why, None));
            }
            let Some(resp) = self.resp.as_mut() else {
                if let Err(why) = self.open().await? {
                    let retry_after = match &why {
                        Interruption::Refused(r) => r.retry_after,
                        _ => None,
                    };
                    return Ok(self.interrupted(why, retry_after));
                }
                continue;
            };
            let stall = self.operator.config.stream_stall;
            let chunk = match tokio::time::timeout(stall, resp.chunk()).await {
                Err(_) => return Ok(self.interrupted(Interruption::Stalled(stall), None)),
                Ok(Err(e)) => {
                    return Ok(self.interrupted(Interruption::Broke(describe(e)), None));
                }
                Ok(Ok(None)) => {
                    self.window_ended();
                    continue;
                }
                Ok(Ok(Some(chunk))) => chunk,
            };
            self.queue.extend(self.parser.feed(&chunk));
            if self.parser.overflowed() {
                self.broken = Some(Interruption::Overflow);
            }
        }
    }

    /// The end of a window: resume silently, after the hint (or a backoff when the
    /// window was quick and empty).
    fn window_ended(&mut self) {
        self.resp = None;
        if self.progressed {
            self.failures = 0;
        }
        let wait = if !self.progressed && self.opened.elapsed() < QUICK_WINDOW {
            // Nothing new, and over at once: as if it had failed, so a server that ends
            // each response straight away is asked ever less often. At most 5 s: through
            // a buffered HTTP API every response of an idle run is empty and quick, and a
            // new event should not wait 30 s.
            self.failures = self.failures.saturating_add(1);
            backoff(self.retry, self.failures).min(QUIET_MAX)
        } else {
            self.failures = 0;
            self.retry
        };
        self.wait = Some(wait);
    }

    /// A transient failure: the reconnect it leads to.
    fn interrupted(&mut self, why: Interruption, retry_after: Option<Duration>) -> FollowItem {
        self.resp = None;
        self.queue.clear();
        if self.progressed {
            self.failures = 0;
        }
        self.failures = self.failures.saturating_add(1);
        let delay = error_delay(self.retry, self.failures, retry_after);
        self.wait = Some(delay);
        FollowItem::Reconnecting {
            why,
            after: self.last,
            delay,
        }
    }

    /// Opens a response from `last` (after the wait due): `Ok(Ok(()))` when it is an
    /// event stream, `Ok(Err(_))` a transient failure, `Err(_)` the end.
    async fn open(&mut self) -> Result<Result<(), Interruption>, OperatorError> {
        if let Some(wait) = self.wait.take() {
            tokio::time::sleep(wait).await;
        }
        self.progressed = false;
        self.opened = Instant::now();
        self.parser = SseParser::new();
        let timeout = self.operator.config.answer_timeout;
        // The answer (and a refusal's body) within the timeout: a server that accepts
        // the connection and then says nothing would otherwise hold the follow forever.
        let resp = match tokio::time::timeout(timeout, self.request()).await {
            Err(_) => return Ok(Err(Interruption::NoAnswer(timeout))),
            Ok(Err(outcome)) => return outcome.map(Err),
            Ok(Ok(resp)) => resp,
        };
        if !is_event_stream(&resp) {
            return Err(OperatorError::NotAStream);
        }
        self.resp = Some(resp);
        Ok(Ok(()))
    }

    /// The request; a 200 response, or what else came.
    async fn request(&self) -> Result<reqwest::Response, Result<Interruption, OperatorError>> {
        let op = self.operator;
        let request = op
            .http
            .stream_request(self.url.clone(), &op.token, self.last)
            .map_err(|e| Err(e.into()))?;
        let resp = request
            .send()
            .await
            .map_err(|e| Ok(Interruption::SendFailed(describe(e))))?;
        let status = resp.status().as_u16();
        if status == 200 {
            return Ok(resp);
        }
        let refusal = match read(resp).await {
            Ok(answer) => Refusal::from_answer(answer),
            Err(_) => Refusal {
                status,
                error: None,
                code: None,
                state: None,
                request_id: None,
                retry_after: None,
                body: Value::Null,
            },
        };
        Err(if refusal.is_transient() {
            Ok(Interruption::Refused(refusal))
        } else {
            Err(OperatorError::Refused(Box::new(refusal)))
        })
    }
}

/// The wait before attempt `failures` (1, 2, …) after errors: the hint, doubling, ≤ 30 s.
fn backoff(hint: Duration, failures: u32) -> Duration {
    reconnect_backoff(hint, failures, MAX_BACKOFF)
}

/// The wait after an error: the backoff, or the server's `Retry-After` when longer (at
/// most 60 s).
fn error_delay(hint: Duration, failures: u32, retry_after: Option<Duration>) -> Duration {
    backoff(hint, failures).max(retry_after.unwrap_or_default().min(MAX_RETRY_AFTER))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn backoff_doubles_and_is_bounded() {
        let s = Duration::from_secs;
        assert_eq!(backoff(s(1), 1), s(1));
        assert_eq!(backoff(s(1), 2), s(2));
        assert_eq!(backoff(s(1), 4), s(8));
        assert_eq!(backoff(s(1), 9), MAX_BACKOFF);
        assert_eq!(backoff(s(1), u32::MAX), MAX_BACKOFF);
        assert_eq!(backoff(Duration::ZERO, 1), Duration::from_millis(100));
    }

    #[test]
    fn retry_after_is_honoured_up_to_a_minute() {
        let s = Duration::from_secs;
        assert_eq!(error_delay(s(1), 1, None), s(1));
        assert_eq!(error_delay(s(1), 1, Some(s(5))), s(5));
        assert_eq!(error_delay(s(1), 4, Some(s(5))), s(8));
        assert_eq!(error_delay(s(1), 1, Some(s(86_400))), MAX_RETRY_AFTER);
        assert_eq!(error_delay(s(1), 1, Some(Duration::MAX)), MAX_RETRY_AFTER);
    }

    #[test]
    fn token_subjects_are_read_without_trusting_them() {
        assert_eq!(
            token_sub("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSIsInJvbGUiOiJvcGVyYXRvciJ9.x"),
            Some("alice".into())
        );
        assert_eq!(token_sub("0123abcd"), None);
        let op = Operator::new(
            "http://127.0.0.1:1",
            " eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSIsInJvbGUiOiJvcGVyYXRvciJ9.x ",
        )
        .unwrap();
        assert_eq!(op.me(), Some("alice"));
        assert!(!format!("{op:?}").contains("eyJ"));
    }

    #[test]
    fn configuration_is_checked_before_anything_is_sent() {
        for (url, token) in [
            ("not a url", "t"),
            ("ftp://x", "t"),
            ("http://127.0.0.1:1", " "),
            ("http://127.0.0.1:1", "a\nb"),
        ] {
            assert!(
                matches!(Operator::new(url, token), Err(OperatorError::Config(_))),
                "{url} {token:?}"
            );
        }
    }

    #[test]
    fn refusals_read_as_sent() {
        let r = Refusal::from_answer(Answer {
            status: 401,
            body: json!({"error": "bad token", "state": "x"}),
            retry_after: None,
            not_json: None,
            request_id: Some("h-1".into()),
        });
        assert_eq!(r.to_string(), "401 Unauthorized: bad token");
        assert_eq!(r.state.as_deref(), Some("x"));
        // No `request_id` in the body (an older server): the header's.
        assert_eq!(r.request_id.as_deref(), Some("h-1"));
        assert!(matches!(r.to_error(), Error::Unauthorized { .. }));
        assert!(!r.is_transient());
        let r = Refusal::from_answer(Answer {
            status: 503,
            body: json!({"error": "<html>"}),
            retry_after: Some(Duration::from_secs(2)),
            not_json: Some("the answer broke off: x".into()),
            request_id: None,
        });
        assert_eq!(r.to_string(), "503 Service Unavailable");
        assert!(r.is_transient());
    }
}
