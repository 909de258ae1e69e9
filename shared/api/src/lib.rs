//! Tollgate's HTTP surface. Each Lambda function mounts its own router from here, and
//! `tollgate serve` mounts all of them on one port: the handlers are the same code in
//! both places. Handlers are thin — parse, authenticate, call a use-case
//! (`tollgate_app`), render its answer; none reaches the store (docs/architecture.md §2).

pub mod approvals;
pub mod auth;
pub mod config;
pub mod console;
pub mod error;
pub mod forward;
pub mod functions;
pub mod ingress;
pub mod jwt;
#[cfg(feature = "lambda")]
pub mod lambda;
pub mod live;
pub mod notify;
pub mod oidc;
pub mod pod_cards;
pub mod preview;
#[cfg(feature = "push")]
pub mod push;
pub mod replay;
pub mod request;
pub mod request_id;
pub mod settlement;
pub mod slack;
pub mod sse;
#[cfg(feature = "ws")]
pub mod stream_reader;
pub mod telemetry;
pub mod wire;
#[cfg(feature = "ws")]
pub mod ws;

use std::sync::Arc;

use axum::Router;
use tollgate_store::{RunStore, Store};
use tollgate_timers::{sqs_client, EmbeddedTimers, SqsConsumer, SqsTimers, TimerLoop, TimerQueue};

pub use auth::{Auth, Claims, Role};
pub use config::{Backend, Config, ConfigError, ServeTimers};
pub use error::{ApiError, ErrorCode, ErrorCodeFor};
/// The approval gate's use-cases (`tollgate_app::approvals`), under the name the
/// handlers use.
pub use tollgate_app::approvals as gate;
pub use tollgate_app::runs::RunLog;
pub use tollgate_app::{AppError, ErrorState, Gate, GateConfig};

/// What every handler needs, built once at cold start.
#[derive(Clone)]
pub struct Deps {
    /// The run log (creates, appends and replay read and write here).
    pub runs: RunLog,
    /// The approval gate (cards, decisions, timers) over the same backend.
    pub gate: Arc<Gate>,
    pub auth: Arc<Auth>,
    /// How live streams pace themselves.
    pub sse: sse::SseConfig,
    /// The in-process timer loop, when timers are embedded: it lives as long as the deps.
    _timers: Option<Arc<TimerLoop>>,
    /// The in-process consumer of the SQS timer queue ([`Deps::sqs`]): it lives as long
    /// as the deps, or until [`Deps::shutdown`].
    consumer: Option<Arc<SqsConsumer>>,
    /// The in-process sweeper (stops when the deps are dropped).
    _sweeper: Option<Arc<AbortOnDrop>>,
    /// Set once the process is shutting down: open live streams end cleanly (their
    /// clients resume elsewhere with `Last-Event-ID`) instead of holding the shutdown.
    closing: Arc<tokio::sync::watch::Sender<bool>>,
    /// Live streams this process holds open at most ([`sse::MAX_OPEN_STREAMS`] for
    /// operators, as many again for agents and run tokens, so agents cannot crowd
    /// operators out); one more is 503 (a deployed function serves one request per
    /// instance anyway).
    pub(crate) streams: Arc<sse::StreamSlots>,
    /// Decisions being forwarded to pods at once, at most [`forward::MAX_IN_FLIGHT`]; one
    /// more is 503 (each may wait for its pod up to the forward timeout).
    pub(crate) forwards: Arc<tokio::sync::Semaphore>,
    /// Whose requests the replay routes answer here ([`functions::Callers`]): everyone's
    /// in `tollgate serve`; operators' only in the `operator-stream` function.
    pub(crate) callers: functions::Callers,
    /// What `GET /api/live` advertises as the WebSocket endpoint (`TOLLGATE_WEBSOCKET_URL`,
    /// or `/api/ws` in `tollgate serve`); `None`: SSE only.
    pub websocket_url: Option<String>,
    /// Per-run wake-ups for live tails where the store has no write signal
    /// ([`live::Wakes`], fed by the process's DynamoDB Streams reader).
    pub(crate) wakes: Option<Arc<live::Wakes>>,
    /// The stream reader feeding [`Deps::wakes`] (stops when the deps are dropped).
    _stream_reader: Option<Arc<AbortOnDrop>>,
    /// The Slack channels each project's runs may name (`TOLLGATE_SLACK_CHANNELS`);
    /// `None`: any.
    pub slack_channels: Option<Arc<slack::channels::SlackChannels>>,
    /// Slack, when configured: the interactivity endpoint's signing secret and user
    /// mapping, the Web API client (docs/architecture.md §11).
    pub slack: Option<Arc<slack::Slack>>,
    /// Notifications (docs/architecture.md §10): the dead-letter routes read through it
    /// (without sinks unless [`Deps::with_notifier`] gave one that has them).
    pub(crate) notifier: Arc<notify::Notifier>,
    /// The task feeding [`Deps::notifier`] in this process, if any.
    _notify_feed: Option<Arc<AbortOnDrop>>,
}

/// Stops a background task when the last holder goes.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Deps {
    /// Everything on one backend; timers go to `timers` (SQS in AWS).
    pub fn new(
        store: Arc<dyn Store>,
        timers: Arc<dyn TimerQueue>,
        gate: GateConfig,
        auth: Auth,
    ) -> Self {
        Self {
            notifier: Arc::new(notify::Notifier::new(store.clone(), Vec::new())),
            _notify_feed: None,
            slack_channels: None,
            runs: RunLog::new(store.clone()),
            gate: Arc::new(Gate::new(store, timers, gate)),
            auth: Arc::new(auth),
            sse: sse::SseConfig::default(),
            _timers: None,
            consumer: None,
            _sweeper: None,
            closing: Arc::new(tokio::sync::watch::channel(false).0),
            streams: Arc::new(sse::StreamSlots::new(sse::MAX_OPEN_STREAMS)),
            forwards: Arc::new(tokio::sync::Semaphore::new(forward::MAX_IN_FLIGHT)),
            callers: functions::Callers::Anyone,
            websocket_url: None,
            wakes: None,
            _stream_reader: None,
            slack: None,
        }
    }

    /// Timers in this process (`tollgate serve`, tests): the gate consumes its own
    /// embedded delayed queue. Needs a tokio runtime.
    pub fn embedded(store: Arc<dyn Store>, gate: GateConfig, auth: Auth) -> Self {
        let queue = EmbeddedTimers::new();
        let mut deps = Self::new(store, Arc::new(queue.clone()), gate, auth);
        deps._timers = Some(Arc::new(queue.attach(deps.gate.clone())));
        deps.with_sweeper()
    }

    /// Timers on the SQS queue at `queue_url`, consumed in this process (`tollgate serve
    /// --backend aws` with a timer queue): the gate schedules with [`SqsTimers`] and an
    /// [`SqsConsumer`] long-polls the queue and hands each message to the gate, as the
    /// `timers` function does deployed. Several processes may share one queue; each
    /// message is handled by one of them (at least once). The sweeper runs here too.
    /// Needs a tokio runtime.
    pub fn sqs(
        store: Arc<dyn Store>,
        sdk: &aws_config::SdkConfig,
        queue_url: String,
        gate: GateConfig,
        auth: Auth,
    ) -> Self {
        let timers = SqsTimers::new(sqs_client(sdk), queue_url.clone());
        let mut deps = Self::new(store, Arc::new(timers), gate, auth);
        let handler = deps.gate.clone();
        deps.consumer = Some(Arc::new(SqsConsumer::spawn(sdk, queue_url, handler)));
        deps.with_sweeper()
    }

    /// The deps of `tollgate serve`: timers where [`Config::serve_timers`] put them —
    /// embedded ([`Deps::embedded`]) or on SQS with an in-process consumer
    /// ([`Deps::sqs`], the SDK configuration loaded as for the store).
    pub async fn serve(
        store: Arc<dyn Store>,
        timers: &ServeTimers,
        gate: GateConfig,
        auth: Auth,
    ) -> Self {
        match timers {
            ServeTimers::Embedded => Self::embedded(store, gate, auth),
            ServeTimers::Sqs { queue_url } => {
                let sdk = tollgate_store::dynamo::sdk_config().await;
                Self::sqs(store, &sdk, queue_url.clone(), gate, auth)
            }
        }
    }

    /// Stops consuming the SQS timer queue (the batch in hand is finished and deleted
    /// first) and returns once that is done; nothing to do for other deps. For a
    /// graceful shutdown of `tollgate serve`.
    /// Ends the open live streams (each sends what it has and closes) and makes new ones
    /// end after their catch-up: the first step of a graceful shutdown, which would
    /// otherwise wait for every stream's window.
    pub fn close_streams(&self) {
        self.closing.send_replace(true);
    }

    /// Whether [`Deps::close_streams`] was called, as a receiver a stream can wait on.
    pub fn closing(&self) -> tokio::sync::watch::Receiver<bool> {
        self.closing.subscribe()
    }

    pub async fn shutdown(&self) {
        if let Some(consumer) = &self.consumer {
            consumer.shutdown().await;
        }
    }

    /// Expires overdue cards (lost timers) in this process every `sweep_every`.
    pub fn with_sweeper(mut self) -> Self {
        self._sweeper = Some(Arc::new(AbortOnDrop(self.gate.spawn_sweeper())));
        self
    }

    /// Holds at most `n` live streams open at once for operators and `n` for everyone
    /// else (default [`sse::MAX_OPEN_STREAMS`] each).
    pub fn with_stream_limit(mut self, n: usize) -> Self {
        self.streams = Arc::new(sse::StreamSlots::new(n));
        self
    }

    /// Answers the replay routes (replay and the live stream) for `callers` only.
    pub fn with_callers(mut self, callers: functions::Callers) -> Self {
        self.callers = callers;
        self
    }

    /// Live tails wait on `wakes` (when the store has no write signal) instead of
    /// polling; whoever holds `wakes` wakes them ([`live::Wakes::wake`]).
    pub fn with_wakes(mut self, wakes: Arc<live::Wakes>) -> Self {
        self.wakes = Some(wakes);
        self
    }

    /// The per-run wake-ups, if any ([`Deps::with_wakes`]).
    pub fn wakes(&self) -> Option<Arc<live::Wakes>> {
        self.wakes.clone()
    }

    /// Reads the DynamoDB Streams of `events_table` in this process and wakes the live
    /// tails of the runs its records name ([`stream_reader`]): `tollgate serve --backend
    /// aws`, so that processes sharing the tables push each other's events.
    #[cfg(feature = "ws")]
    pub fn with_stream_reader(self, sdk: &aws_config::SdkConfig, events_table: String) -> Self {
        let wakes = self.wakes.clone().unwrap_or_default();
        let task = stream_reader::spawn(sdk, events_table, wakes.clone());
        let mut deps = self.with_wakes(wakes);
        deps._stream_reader = Some(Arc::new(AbortOnDrop(task)));
        deps
    }

    /// Answers Slack's interactions (`POST /api/slack/interactions`) with `slack`.
    pub fn with_slack(mut self, slack: Option<Arc<slack::Slack>>) -> Self {
        self.slack = slack;
        self
    }

    /// Notifications through `notifier` (its sinks), fed in this process by `feed` (a
    /// task of [`notify::feed`], stopped when the deps are dropped).
    pub fn with_notifier(
        mut self,
        notifier: Arc<notify::Notifier>,
        feed: Option<tokio::task::JoinHandle<()>>,
    ) -> Self {
        self.notifier = notifier;
        self._notify_feed = feed.map(|f| Arc::new(AbortOnDrop(f)));
        self
    }

    /// Serves the run log from `store` instead (a wrapper in tests).
    pub fn with_run_store(mut self, store: Arc<dyn RunStore>) -> Self {
        self.runs = RunLog::new(store);
        self
    }

    /// Reads [`Config`] from the environment and connects the configured store and, with
    /// `TOLLGATE_TIMER_QUEUE_URL`, the SQS timer queue.
    pub async fn from_env() -> Result<Self, ConfigError> {
        let config = Config::from_env().await?;
        let store = config.connect_store().await?;
        let timers = config.connect_timers().await;
        let mut deps = Self::new(
            store,
            timers,
            GateConfig::from_env()?,
            Auth::new(config.secret.expose())
                .with_max_token_lifetime(Auth::max_token_lifetime_from_env()?)
                .with_oidc_from_env()?,
        );
        deps.sse = sse::SseConfig::from_env()?;
        deps.websocket_url = live::websocket_url_from_env();
        deps.slack_channels = slack::channels::SlackChannels::from_env()?.map(Arc::new);
        deps.slack = slack::Slack::from_secrets_manager_env()
            .await?
            .map(Arc::new);
        Ok(deps)
    }
}

/// What an endpoint that serves operators only answers anyone else.
pub const OPERATORS_ONLY: &str =
    "this endpoint serves operator tokens only; agents and run tokens use the replay stream \
     endpoint";

/// `router` as [`Deps::callers`] says: with [`functions::Callers::Operators`], every
/// request (every route, the fallbacks too) is checked for an operator token before
/// anything else runs — 401 without a valid token, 403 for any other token, as JSON.
fn with_callers(router: Router, deps: &Deps) -> Router {
    match deps.callers {
        functions::Callers::Anyone => router,
        functions::Callers::Operators => router.layer(axum::middleware::from_fn_with_state(
            deps.clone(),
            operators_only,
        )),
    }
}

async fn operators_only(
    axum::extract::State(deps): axum::extract::State<Deps>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::extract::FromRequestParts;
    use axum::response::IntoResponse;
    let (mut parts, body) = req.into_parts();
    let creds = match auth::Credentials::from_request_parts(&mut parts, &()).await {
        Ok(creds) => creds,
        Err(never) => match never {},
    };
    match deps.auth.caller(&creds, None) {
        Ok(auth::Caller::Jwt(c)) if c.role == Role::Operator => {
            next.run(axum::extract::Request::from_parts(parts, body))
                .await
        }
        Err(e) if e.status == axum::http::StatusCode::UNAUTHORIZED => e.into_response(),
        _ => ApiError::forbidden(OPERATORS_ONLY).into_response(),
    }
}

/// JSON 404/405 for anything no route claims, so every answer is JSON; the callers'
/// check ([`with_callers`]); the request id and one access-log line per request
/// ([`request_id::middleware`]), outermost so that every answer carries the id.
fn with_fallbacks(router: Router, deps: &Deps) -> Router {
    let router = router
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() });
    with_callers(router, deps)
        .layer(axum::middleware::from_fn_with_state(
            deps.clone(),
            credentials_ready,
        ))
        .layer(axum::middleware::from_fn(request_id::middleware))
}

/// Before anything checks a credential: brings what verifying it needs and cannot wait
/// for inside a handler (an identity provider's keys, [`Auth::ready`]). Looks wherever a
/// request may carry a token — `Authorization`, a WebSocket subprotocol `bearer.<token>`,
/// the `access_token` query — and only warms caches: it admits and refuses nothing.
async fn credentials_ready(
    axum::extract::State(deps): axum::extract::State<Deps>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    if deps.auth.has_oidc() {
        for token in presented_tokens(&req) {
            deps.auth
                .ready(&auth::Credentials::from_token(&token))
                .await;
        }
    }
    next.run(req).await
}

fn presented_tokens(req: &axum::extract::Request) -> Vec<String> {
    let headers = req.headers();
    let mut tokens: Vec<String> = Vec::new();
    if let Some(Ok(token)) = auth::Credentials::from_headers(headers).bearer_token() {
        tokens.push(token.to_owned());
    }
    let query = request::query_param(req.uri().query(), tollgate_protocol::ws::TOKEN_QUERY);
    if let Some(token) = auth::upgrade_offer(headers, query).token {
        tokens.push(token.to_owned());
    }
    tokens.truncate(3);
    tokens
}

/// The `ingress` function's routes.
pub fn ingress_router(deps: Deps) -> Router {
    functions::Routes::INGRESS.router(deps)
}

/// The `approvals` function's routes.
pub fn approvals_router(deps: Deps) -> Router {
    functions::Routes::APPROVALS.router(deps)
}

/// The `settlement` function's routes.
pub fn settlement_router(deps: Deps) -> Router {
    functions::Routes::SETTLEMENT.router(deps)
}

/// The `replay` (and `replay-stream`) function's routes.
pub fn replay_router(deps: Deps) -> Router {
    functions::Routes::REPLAY.router(deps)
}

/// Every route of every HTTP function in [`functions::FUNCTIONS`], each set once, for
/// `tollgate serve` — with the `ws` feature, the WebSocket endpoint `GET /api/ws`
/// ([`ws`]) — and the contract's OpenAPI document at `GET /api/openapi.json`
/// (the committed `openapi.json`, which `tests/openapi.rs` holds equal to the one
/// `tollgate-protocol` generates; the deployed functions do not serve it).
pub fn app(deps: Deps) -> Router {
    let routes = functions::all_routes().route("/api/openapi.json", axum::routing::get(openapi));
    #[cfg(feature = "ws")]
    let routes = routes.merge(ws::routes());
    with_fallbacks(routes.with_state(deps.clone()), &deps)
}

/// The OpenAPI 3.1 document of the HTTP contract.
pub const OPENAPI_JSON: &str = include_str!("../../../openapi.json");

async fn openapi() -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        OPENAPI_JSON,
    )
        .into_response()
}
