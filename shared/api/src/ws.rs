//! Live delivery over WebSocket in `tollgate serve` (docs/architecture.md §5):
//! `GET /api/ws`, the protocol of [`tollgate_protocol::ws`] — the same one the deployed
//! API Gateway WebSocket API speaks.
//!
//! The upgrade is authenticated with the rules of replay and the SSE stream (a run token
//! opens its own run only, an agent JWT its own runs, an operator JWT its tenant's), and
//! refused before the upgrade (401/403 as JSON) without a credential that verifies. Each
//! subscription is checked as replay checks a read ([`crate::RunLog::readable_head`]) and
//! then runs the page loop SSE runs ([`crate::sse::follow`]): the backlog from the
//! gap-safe pages, live events as the process is woken, `done` after the terminal event.
//!
//! Caps: a connection takes a place in the process's pool of live streams (operators'
//! apart) and, for agents and run tokens, one under the per-agent / per-run cap
//! ([`crate::sse::StreamCaps`]), shared with SSE streams; each subscription takes one
//! under its run's per-project cap; at most
//! [`MAX_SUBSCRIPTIONS_PER_CONNECTION`] at once. The server pings every
//! [`PING_EVERY`] and drops a peer it has not heard from in two intervals.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use futures::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tollgate_app::ErrorState;
use tollgate_domain::validate_run_id;
use tollgate_protocol::events::StreamEnd;
use tollgate_protocol::ws::{
    ClientMessage, Frame, Subscribed, FRAME_DONE, FRAME_ERROR, FRAME_PONG, FRAME_SUBSCRIBED,
    FRAME_UNSUBSCRIBED, MAX_CLIENT_MESSAGE_BYTES, MAX_SUBSCRIPTIONS_PER_CONNECTION, RUN_QUERY,
    SUBPROTOCOL, TOKEN_QUERY,
};

use crate::auth::{Caller, Credentials, Role};
use crate::request::query_param;
use crate::request_id::RequestId;
use crate::sse::{connection_keys, follow, tenant_key, HeldPlaces, Sink, Stop, Wake};
use crate::{ApiError, Deps};

/// How often the server pings an open connection; a peer silent for two intervals is
/// dropped.
pub const PING_EVERY: Duration = Duration::from_secs(20);
/// How long a frame may wait for a peer that reads nothing before it is dropped.
const SEND_TIMEOUT: Duration = Duration::from_secs(30);
/// Close code: a message the server does not accept (binary, oversize) or an expired
/// token (RFC 6455 "policy violation").
pub const CLOSE_POLICY: u16 = 1008;
/// Close code: the server shuts down.
pub const CLOSE_GOING_AWAY: u16 = 1001;
/// Largest frame the socket layer reads at all; a text message over
/// [`MAX_CLIENT_MESSAGE_BYTES`] (and under this) is closed with [`CLOSE_POLICY`].
const MAX_READ_BYTES: usize = 64 * 1024;
/// Frames queued for one connection's writer.
const QUEUE: usize = 64;
/// Close code: a run token's run has ended (its `done` sent): the token holds nothing
/// more (RFC 6455 "normal closure").
pub const CLOSE_RUN_ENDED: u16 = 1000;

/// What a connection's writer is handed.
enum Out {
    /// A text frame.
    Frame(String),
    /// A run token's run has ended and its `done` is queued before this: close.
    RunEnded,
}

pub fn routes() -> Router<Deps> {
    // The path is `tollgate_protocol::ws::WS_PATH` (spelled out: the route lists read it).
    Router::new().route("/api/ws", get(upgrade))
}

/// The credential: `bearer.<token>` among the offered subprotocols, else
/// `?access_token=`, else `Authorization: Bearer`.
fn credentials(headers: &HeaderMap, query: Option<&str>) -> Credentials {
    match crate::auth::upgrade_offer(headers, query_param(query, TOKEN_QUERY)).token {
        Some(token) => Credentials::from_token(token),
        None => Credentials::from_headers(headers),
    }
}

/// `GET /api/ws`.
async fn upgrade(
    State(deps): State<Deps>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    request_id: Option<axum::Extension<RequestId>>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let creds = credentials(&headers, query.as_deref());
    let run = query_param(query.as_deref(), RUN_QUERY).map(str::to_owned);
    let caller = match deps.auth.caller(&creds, run.as_deref()) {
        Err(e) if run.is_none() && e.status == StatusCode::FORBIDDEN => {
            return Err(ApiError::unauthorized(format!(
                "a run token connects with ?{RUN_QUERY}=<its run>"
            )))
        }
        other => other?,
    };
    let operator = matches!(&caller, Caller::Jwt(c) if c.role == Role::Operator);
    // A run token connects while its run lives: an ended run's token holds no place.
    let run_head = match &caller {
        Caller::Run { run_id, .. } => {
            let head = deps.runs.readable_head(run_id, &caller.viewer()).await?;
            if head.status.is_terminal() {
                // 409 `run_terminal`, as any write with the token is: replay still
                // reads the run's events.
                return Err(ApiError::from(tollgate_store::StoreError::RunTerminal {
                    status: head.status,
                    terminal_seq: head.terminal_seq.unwrap_or(head.last_sequence()),
                }));
            }
            Some(head)
        }
        Caller::Jwt(_) => None,
    };
    // Agents and run tokens: one place per connection under each of their caps (shared
    // with SSE streams: the run token's run, the agent, the tenant), then the pool's.
    let places = if operator {
        None
    } else {
        Some(
            deps.streams
                .hold(connection_keys(&caller, run_head.as_ref(), &deps.sse.caps))
                .map_err(|what| too_many(StatusCode::TOO_MANY_REQUESTS, what))?,
        )
    };
    let pool = if operator {
        &deps.streams.operators
    } else {
        &deps.streams.others
    };
    let permit = pool.clone().try_acquire_owned().map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many open live streams here; retry",
        )
    })?;
    let ws = ws.map_err(|_| {
        ApiError::bad_request("GET /api/ws takes a WebSocket upgrade (Upgrade: websocket)")
    })?;
    // A connection never outlives the JWT that opened it.
    let expires_at = match &caller {
        Caller::Jwt(c) if c.exp > 0 => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            Some(Instant::now() + Duration::from_secs(c.exp.saturating_sub(now)))
        }
        _ => None,
    };
    let request_id = request_id
        .map(|axum::Extension(RequestId(id))| id)
        .unwrap_or_default();
    Ok(ws
        .protocols([SUBPROTOCOL])
        // Small socket buffers: an idle connection should cost little (the defaults
        // reserve 128 KiB to read into).
        .read_buffer_size(8 * 1024)
        .write_buffer_size(8 * 1024)
        .max_message_size(MAX_READ_BYTES)
        .max_frame_size(MAX_READ_BYTES)
        .on_upgrade(move |socket| async move {
            let _permit = permit;
            let conn = Connection {
                deps,
                caller,
                request_id,
                _places: places,
                subs: HashMap::new(),
            };
            conn.run(socket, expires_at).await;
        }))
}

fn too_many(status: StatusCode, what: &str) -> ApiError {
    ApiError::new(
        status,
        format!("too many open live streams for this {what}; close one or retry later"),
    )
    .with_state(ErrorState::TooManyStreams)
}

/// One subscription: its task, and its place under the run's tenant cap.
struct Subscription {
    task: tokio::task::JoinHandle<()>,
    _places: Option<HeldPlaces>,
}

/// One open connection.
struct Connection {
    deps: Deps,
    caller: Caller,
    request_id: String,
    /// The connection's place under its caller's cap (dropped with it).
    _places: Option<HeldPlaces>,
    subs: HashMap<String, Subscription>,
}

fn text(frame: &Frame) -> String {
    serde_json::to_string(frame).unwrap_or_default()
}

fn close(code: u16, reason: &'static str) -> Message {
    Message::Close(Some(CloseFrame {
        code,
        reason: reason.into(),
    }))
}

impl Connection {
    async fn run(mut self, socket: WebSocket, expires_at: Option<Instant>) {
        let (mut sink, mut stream) = socket.split();
        let (tx, mut rx) = mpsc::channel::<Out>(QUEUE);
        let mut closing = self.deps.closing();
        let mut ping =
            tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
        let mut heard = Instant::now();
        let expiry = async move {
            match expires_at {
                Some(at) => tokio::time::sleep_until(at.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expiry);
        let mut closed_with: Option<Message> = None;
        loop {
            tokio::select! {
                msg = stream.next() => match msg {
                    None | Some(Err(_)) => break,
                    Some(Ok(Message::Text(t))) => {
                        heard = Instant::now();
                        if t.len() > MAX_CLIENT_MESSAGE_BYTES {
                            closed_with = Some(close(CLOSE_POLICY, "message over 4096 bytes"));
                            break;
                        }
                        if let Some(frame) = self.handle(t.as_str(), &tx).await {
                            if send(&mut sink, Message::Text(text(&frame).into())).await.is_err() {
                                break;
                            }
                        }
                    }
                    Some(Ok(Message::Binary(_))) => {
                        closed_with = Some(close(CLOSE_POLICY, "binary messages are not accepted"));
                        break;
                    }
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => heard = Instant::now(),
                    Some(Ok(Message::Close(_))) => break,
                },
                Some(out) = rx.recv() => match out {
                    Out::Frame(frame) => {
                        if send(&mut sink, Message::Text(frame.into())).await.is_err() {
                            break;
                        }
                    }
                    Out::RunEnded => {
                        closed_with = Some(close(CLOSE_RUN_ENDED, "the run has ended"));
                        break;
                    }
                },
                _ = ping.tick() => {
                    // Finished subscriptions (`done` sent) give their places back.
                    self.subs.retain(|_, s| !s.task.is_finished());
                    // A run token following nothing still goes once its run has ended.
                    if self.run_has_ended().await {
                        closed_with = Some(close(CLOSE_RUN_ENDED, "the run has ended"));
                        break;
                    }
                    if heard.elapsed() > PING_EVERY * 2 {
                        tracing::debug!("live socket: peer silent, dropped");
                        break;
                    }
                    if send(&mut sink, Message::Ping(Default::default())).await.is_err() {
                        break;
                    }
                }
                _ = &mut expiry => {
                    closed_with = Some(close(CLOSE_POLICY, "token expired"));
                    break;
                }
                _ = async { drop(closing.wait_for(|c| *c).await) } => {
                    closed_with = Some(close(CLOSE_GOING_AWAY, "server shutting down"));
                    break;
                }
            }
        }
        for sub in self.subs.values() {
            sub.task.abort();
        }
        if let Some(msg) = closed_with {
            let _ = send(&mut sink, msg).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(1), sink.close()).await;
    }

    /// Whether this is a run token's connection whose run has ended (a read that fails
    /// says no: the next tick asks again).
    async fn run_has_ended(&self) -> bool {
        let Caller::Run { run_id, .. } = &self.caller else {
            return false;
        };
        matches!(self.deps.runs.head(run_id).await, Ok(Some(h)) if h.status.is_terminal())
    }

    fn error(&self, run_id: Option<&str>, e: ApiError) -> Frame {
        let body = e.body(&self.request_id);
        Frame::control(
            FRAME_ERROR,
            run_id,
            serde_json::to_value(body).unwrap_or_default(),
        )
    }

    /// One client message; the frame to answer at once, if any (a subscription's own
    /// frames go through `tx`, after its `subscribed`, which is answered here).
    async fn handle(&mut self, text: &str, tx: &mpsc::Sender<Out>) -> Option<Frame> {
        let msg: ClientMessage = match serde_json::from_str(text) {
            Ok(m) => m,
            Err(e) => {
                let run_id = serde_json::from_str::<serde_json::Value>(text)
                    .ok()
                    .and_then(|v| v.get("run_id").and_then(|r| r.as_str()).map(str::to_owned))
                    .filter(|r| validate_run_id(r));
                return Some(self.error(
                    run_id.as_deref(),
                    ApiError::bad_request(format!(
                        "not a message of tollgate.v1 (subscribe, unsubscribe, ping): {e}"
                    )),
                ));
            }
        };
        match msg {
            ClientMessage::Ping {} => Some(Frame::control(FRAME_PONG, None, serde_json::json!({}))),
            ClientMessage::Unsubscribe { run_id } => {
                if let Some(sub) = self.subs.remove(&run_id) {
                    sub.task.abort();
                }
                let run = validate_run_id(&run_id).then_some(run_id.as_str());
                Some(Frame::control(
                    FRAME_UNSUBSCRIBED,
                    run,
                    serde_json::json!({ "run_id": run_id }),
                ))
            }
            ClientMessage::Subscribe { run_id, after } => {
                match self.subscribe(&run_id, after.unwrap_or(0), tx).await {
                    Ok(subscribed) => Some(subscribed),
                    Err(e) => {
                        let run = validate_run_id(&run_id).then_some(run_id.as_str());
                        Some(self.error(run, e))
                    }
                }
            }
        }
    }

    async fn subscribe(
        &mut self,
        run_id: &str,
        after: u64,
        tx: &mpsc::Sender<Out>,
    ) -> Result<Frame, ApiError> {
        if !validate_run_id(run_id) {
            return Err(ApiError::bad_request(tollgate_app::runs::RUN_ID_RULE));
        }
        // Subscribing again to a run replaces the subscription (a client resubscribes
        // with a new `after` after a gap).
        if let Some(old) = self.subs.remove(run_id) {
            old.task.abort();
        }
        self.subs.retain(|_, s| !s.task.is_finished());
        if self.subs.len() >= MAX_SUBSCRIPTIONS_PER_CONNECTION {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "a connection follows at most {MAX_SUBSCRIPTIONS_PER_CONNECTION} runs at once; \
                     unsubscribe one first"
                ),
            )
            .with_state(ErrorState::TooManyStreams));
        }
        // Replay's rules: a run token reads its own run only; the others as `may_read`.
        if let Caller::Run { run_id: own, .. } = &self.caller {
            if own != run_id {
                return Err(ApiError::forbidden("token is not valid for this run"));
            }
        }
        let head = self
            .deps
            .runs
            .readable_head(run_id, &self.caller.viewer())
            .await?;
        if after > head.last_sequence() {
            return Err(ApiError::bad_request(format!(
                "after {after} is past the run's last event ({})",
                head.last_sequence()
            )));
        }
        let operator = matches!(&self.caller, Caller::Jwt(c) if c.role == Role::Operator);
        let places = if operator {
            None
        } else {
            Some(
                self.deps
                    .streams
                    .hold(vec![tenant_key(&head, &self.deps.sse.caps)])
                    .map_err(|what| too_many(StatusCode::TOO_MANY_REQUESTS, what))?,
            )
        };
        let subscribed = Frame::control(
            FRAME_SUBSCRIBED,
            Some(run_id),
            serde_json::to_value(Subscribed {
                run_id: run_id.to_owned(),
                after,
            })
            .unwrap_or_default(),
        );
        let deps = self.deps.clone();
        let mut wake = Wake::for_run(&deps, run_id);
        let mut sink = Subscriber {
            tx: tx.clone(),
            run_id: run_id.to_owned(),
            run_json: serde_json::Value::from(run_id).to_string(),
            // A run token follows its own run only: after its `done`, the connection goes.
            ends_connection: matches!(self.caller, Caller::Run { .. }),
        };
        let request_id = self.request_id.clone();
        let task = tokio::spawn(async move {
            let mut closing = deps.closing();
            let run_id = sink.run_id.clone();
            match follow(
                &deps.runs,
                &mut sink,
                &mut wake,
                &mut closing,
                None,
                head,
                after,
            )
            .await
            {
                Ok(()) | Err(Stop::Gone) => {}
                Err(Stop::Store) => {
                    tracing::warn!("live subscription ended early: storage");
                    let e = ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "storage is unavailable; subscribe again with after = your last sequence",
                    )
                    .with_state(ErrorState::Unavailable);
                    let frame = Frame::control(
                        FRAME_ERROR,
                        Some(&run_id),
                        serde_json::to_value(e.body(&request_id)).unwrap_or_default(),
                    );
                    let _ = sink.tx.send(Out::Frame(text(&frame))).await;
                }
            }
        });
        self.subs.insert(
            run_id.to_owned(),
            Subscription {
                task,
                _places: places,
            },
        );
        // Written by the connection's loop before anything the task queued (the loop
        // drains the queue only after this): `subscribed` comes first. Nothing here
        // waits on the queue, which only that loop drains.
        Ok(subscribed)
    }
}

async fn send(
    sink: &mut futures::stream::SplitSink<WebSocket, Message>,
    msg: Message,
) -> Result<(), ()> {
    match tokio::time::timeout(SEND_TIMEOUT, sink.send(msg)).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(()),
    }
}

/// A subscription's frames, queued for the connection's writer.
struct Subscriber {
    tx: mpsc::Sender<Out>,
    run_id: String,
    /// `run_id` as a JSON string.
    run_json: String,
    /// Close the connection after `done` (a run token's).
    ends_connection: bool,
}

impl Sink for Subscriber {
    async fn event(&mut self, e: &tollgate_store::StoredEvent) -> Result<(), Stop> {
        // `data` is the stored body verbatim: exactly what replay serves.
        let frame = format!(
            "{{\"run_id\":{},\"id\":{},\"event\":{},\"data\":{}}}",
            self.run_json,
            e.sequence,
            serde_json::Value::from(e.event_type.as_str()),
            e.body
        );
        self.tx
            .send(Out::Frame(frame))
            .await
            .map_err(|_| Stop::Gone)
    }

    async fn done(&mut self, end: StreamEnd) -> Result<(), Stop> {
        let frame = Frame::control(
            FRAME_DONE,
            Some(&self.run_id),
            serde_json::to_value(end).unwrap_or_default(),
        );
        self.tx
            .send(Out::Frame(text(&frame)))
            .await
            .map_err(|_| Stop::Gone)?;
        if self.ends_connection {
            self.tx.send(Out::RunEnded).await.map_err(|_| Stop::Gone)?;
        }
        Ok(())
    }

    fn tick_at(&self) -> Option<Instant> {
        None
    }

    async fn tick(&mut self) -> Result<(), Stop> {
        Ok(())
    }

    async fn closed(&self) {
        self.tx.closed().await
    }
}
