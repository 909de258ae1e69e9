//! The deployed WebSocket push (docs/architecture.md §9): the API Gateway WebSocket API's
//! routes ([`Websocket`], the `websocket` function) and the fanout of new events from
//! the events table's DynamoDB Stream ([`Fanout`], the `fanout` function). No Lambda is
//! held per idle watcher: API Gateway holds the connections, the registry
//! ([`tollgate_store::dynamo::Connections`]) says who follows which run, and frames go
//! out through the `@connections` API ([`post::Poster`]).
//!
//! The wire protocol is `tollgate_protocol::ws`: the same messages and frames as
//! `tollgate serve`'s in-process WebSocket.

pub mod fanout;
pub mod lambda;
pub mod post;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};
use tollgate_app::runs::RunLog;
use tollgate_domain::RunHead;
use tollgate_protocol::events::StreamEnd;
use tollgate_protocol::ws::{
    self, ClientMessage, Frame, FRAME_DONE, FRAME_ERROR, FRAME_PONG, FRAME_SUBSCRIBED,
    FRAME_UNSUBSCRIBED,
};
use tollgate_store::dynamo::connections::{
    Cap, ConnectionRecord, Subscribed, Subscription, BY_HOLDER_INDEX, BY_TENANT_INDEX,
};
use tollgate_store::dynamo::Connections;
use tollgate_store::StoredEvent;

use crate::auth::{Auth, Caller, Claims, Credentials, Role};
use crate::sse::StreamCaps;
use crate::{ApiError, ErrorState};

pub use fanout::Fanout;
pub use post::{Posted, Poster};

/// API Gateway closes a WebSocket connection after two hours: nothing in the registry
/// outlives that.
pub const MAX_CONNECTION_SECS: u64 = 2 * 60 * 60;

/// Events per page while posting a subscription's backlog.
const PAGE: usize = 500;

/// How long one subscription posts its backlog at most before it stops with an `error`
/// frame telling the client where to resume (a Lambda invocation is bounded).
const BACKLOG_BUDGET: Duration = Duration::from_secs(15);

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// An event frame exactly as `Frame::event` would render it, with the stored body (the
/// event as replay serves it) embedded as is.
pub fn event_frame(run_id: &str, event: &StoredEvent) -> String {
    format!(
        "{{\"run_id\":{},\"id\":{},\"event\":{},\"data\":{}}}",
        serde_json::Value::from(run_id),
        event.sequence,
        serde_json::Value::from(event.event_type.as_str()),
        event.body
    )
}

/// A control frame as text.
pub fn control_frame(name: &str, run_id: Option<&str>, data: serde_json::Value) -> String {
    serde_json::to_string(&Frame::control(name, run_id, data)).unwrap_or_default()
}

/// The `done` frame after a run's terminal event.
pub fn done_frame(run_id: &str, terminal_sequence: u64) -> String {
    let end = StreamEnd {
        run_id: run_id.to_owned(),
        terminal_sequence,
    };
    control_frame(
        FRAME_DONE,
        Some(run_id),
        serde_json::to_value(end).unwrap_or_default(),
    )
}

/// An `error` frame carrying `err`'s [`tollgate_protocol::ErrorBody`].
pub fn error_frame(run_id: Option<&str>, err: ApiError, request_id: &str) -> String {
    let body = err.body(request_id);
    control_frame(
        FRAME_ERROR,
        run_id,
        serde_json::to_value(body).unwrap_or_default(),
    )
}

/// The credential of a WebSocket upgrade: `Sec-WebSocket-Protocol: tollgate.v1,
/// bearer.<token>` (then the answer names [`ws::SUBPROTOCOL`]), else
/// `?access_token=<token>`. `Err` (401) when the header offers protocols but not ours.
pub fn upgrade_credential<'a>(
    headers: &'a HeaderMap,
    access_token: Option<&'a str>,
) -> Result<(Option<&'a str>, bool), ApiError> {
    let offer = crate::auth::upgrade_offer(headers, access_token);
    if offer.protocols.is_empty() {
        return Ok((offer.token, false));
    }
    if !offer.protocols.contains(&ws::SUBPROTOCOL) {
        return Err(ApiError::unauthorized(format!(
            "Sec-WebSocket-Protocol must offer {}",
            ws::SUBPROTOCOL
        )));
    }
    Ok((offer.token, true))
}

/// The `websocket` function's routes over the registry and the run log.
#[derive(Clone)]
pub struct Websocket {
    pub runs: RunLog,
    pub auth: Arc<Auth>,
    pub registry: Connections,
    pub poster: Poster,
    /// The per-run-token, per-agent and per-project caps, counted in the registry.
    pub caps: StreamCaps,
}

/// What `$connect` answers: 200 (with the subprotocol to echo, if one was offered) or
/// the refusal.
#[derive(Debug, Clone, PartialEq)]
pub struct Connected {
    pub subprotocol: Option<&'static str>,
}

impl Websocket {
    /// `$connect`: the credential checked with the HTTP API's rules (a JWT fully; a run
    /// token against the run its `?run_id=` names, and again against a run at each
    /// subscribe), then the connection recorded with who holds it and when it expires
    /// (at most [`MAX_CONNECTION_SECS`], never past the JWT's `exp`). A refusal writes
    /// nothing.
    pub async fn connect(
        &self,
        connection_id: &str,
        headers: &HeaderMap,
        access_token: Option<&str>,
        run_id: Option<&str>,
    ) -> Result<Connected, ApiError> {
        let (token, with_subprotocol) = upgrade_credential(headers, access_token)?;
        let creds = Credentials::from_optional_token(token);
        // An identity provider's keys are fetched before its token is judged (the HTTP
        // API does this in its credentials layer).
        self.auth.ready(&creds).await;
        let now = now_secs();
        let mut record = ConnectionRecord {
            connection_id: connection_id.to_owned(),
            kind: String::new(),
            sub: None,
            project_id: None,
            incarnation: None,
            token_digest: None,
            expires_at: now + MAX_CONNECTION_SECS,
            runs: Vec::new(),
            holder: None,
            tenant: None,
        };
        let caller;
        let mut run_head = None;
        if creds.is_jwt() {
            let Caller::Jwt(claims) = self.auth.caller(&creds, None)? else {
                return Err(ApiError::unauthorized("invalid token"));
            };
            record.kind = match claims.role {
                Role::Agent => "agent".into(),
                Role::Operator => "operator".into(),
            };
            if claims.exp > 0 {
                record.expires_at = record.expires_at.min(claims.exp);
            }
            record.sub = Some(claims.sub.clone());
            record.project_id = claims.project_id.clone();
            caller = Caller::Jwt(claims);
        } else {
            // A run token is a MAC over its run: the connection names the run, so a forged
            // token is refused here and holds no connection.
            let run_id = run_id.ok_or_else(|| {
                ApiError::unauthorized(format!(
                    "a run token connects with ?{}=<its run>",
                    ws::RUN_QUERY
                ))
            })?;
            let run_caller = match self.auth.caller(&creds, Some(run_id)) {
                Ok(c @ Caller::Run { .. }) => c,
                _ => return Err(ApiError::unauthorized("invalid token")),
            };
            // A run token connects while its run lives: an ended run's token holds no
            // place (409 `run_terminal`; replay still reads the run).
            let head = self
                .runs
                .readable_head(run_id, &run_caller.viewer())
                .await?;
            if head.status.is_terminal() {
                return Err(ApiError::from(tollgate_store::StoreError::RunTerminal {
                    status: head.status,
                    terminal_seq: head.terminal_seq.unwrap_or(head.last_sequence()),
                }));
            }
            let (incarnation, digest) = self.auth.unbound_run_token(&creds)?;
            record.kind = "run".into();
            record.incarnation = Some(incarnation);
            record.token_digest = Some(digest);
            caller = run_caller;
            run_head = Some(head);
        }
        // Agents and run tokens: the connection itself takes a place under its holder
        // (a run token's run, an agent) and its tenant, as on `tollgate serve`, whether
        // or not it ever follows a run. Operators are not capped.
        if record.kind != "operator" {
            let caps = Self::caps(crate::sse::connection_keys(
                &caller,
                run_head.as_ref(),
                &self.caps,
            ));
            if let Some(what) = self.registry.full_cap(&caps).await? {
                return Err(ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!(
                        "too many open live connections for this {what}; close one or retry later"
                    ),
                )
                .with_state(ErrorState::TooManyStreams));
            }
            record.holder = caps
                .iter()
                .find(|c| c.index == BY_HOLDER_INDEX)
                .map(|c| c.key.clone());
            record.tenant = caps
                .iter()
                .find(|c| c.index == BY_TENANT_INDEX)
                .map(|c| c.key.clone());
        }
        self.registry.put_connection(&record).await?;
        Ok(Connected {
            subprotocol: with_subprotocol.then_some(ws::SUBPROTOCOL),
        })
    }

    /// `$disconnect`: the connection and its subscriptions deleted.
    pub async fn disconnect(&self, connection_id: &str) -> Result<(), ApiError> {
        self.registry.remove_connection(connection_id).await?;
        Ok(())
    }

    /// A client message (`subscribe`, `unsubscribe`, `ping`, or anything else on
    /// `$default`): answered with frames posted to the connection. Only a storage
    /// failure is an `Err` (the invocation fails; the client sees no answer and retries).
    pub async fn message(
        &self,
        endpoint: &str,
        connection_id: &str,
        body: Option<&str>,
        request_id: &str,
    ) -> Result<(), ApiError> {
        let post = |frame: String| async move {
            self.poster
                .post(endpoint, connection_id, frame.into_bytes())
                .await
        };
        let body = body.unwrap_or("");
        if body.len() > ws::MAX_CLIENT_MESSAGE_BYTES {
            let err = ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!(
                    "a message is at most {} bytes",
                    ws::MAX_CLIENT_MESSAGE_BYTES
                ),
            );
            post(error_frame(None, err, request_id)).await;
            return Ok(());
        }
        let message = match serde_json::from_str::<ClientMessage>(body) {
            Ok(m) => m,
            Err(e) => {
                let err = ApiError::bad_request(format!(
                    "a message is {{\"action\": \"subscribe\"|\"unsubscribe\"|\"ping\", …}}: {e}"
                ));
                post(error_frame(None, err, request_id)).await;
                return Ok(());
            }
        };
        match message {
            ClientMessage::Ping {} => {
                post(control_frame(FRAME_PONG, None, serde_json::json!({}))).await;
                Ok(())
            }
            ClientMessage::Unsubscribe { run_id } => {
                self.registry.unsubscribe(connection_id, &run_id).await?;
                post(control_frame(
                    FRAME_UNSUBSCRIBED,
                    Some(&run_id),
                    serde_json::json!({ "run_id": run_id }),
                ))
                .await;
                Ok(())
            }
            ClientMessage::Subscribe { run_id, after } => {
                let outcome = self
                    .subscribe(endpoint, connection_id, &run_id, after.unwrap_or(0))
                    .await;
                match outcome {
                    Ok(()) => Ok(()),
                    Err(err) if err.status.is_server_error() => Err(err),
                    Err(err) => {
                        post(error_frame(Some(&run_id), err, request_id)).await;
                        Ok(())
                    }
                }
            }
        }
    }

    /// The caller a connection stands for on `run_id`: a JWT's claims as verified at
    /// `$connect`; a run token only on its own run (403 on any other).
    fn caller_on(&self, connection: &ConnectionRecord, run_id: &str) -> Result<Caller, ApiError> {
        match connection.kind.as_str() {
            "run" => {
                let incarnation = connection.incarnation.clone().unwrap_or_default();
                let digest = connection.token_digest.as_deref().unwrap_or("");
                if self
                    .auth
                    .run_token_digest_matches(digest, run_id, &incarnation)
                {
                    Ok(Caller::Run {
                        run_id: run_id.to_owned(),
                        incarnation,
                    })
                } else {
                    Err(ApiError::forbidden("token is not valid for this run"))
                }
            }
            kind => Ok(Caller::Jwt(Claims {
                sub: connection.sub.clone().unwrap_or_default(),
                role: if kind == "operator" {
                    Role::Operator
                } else {
                    Role::Agent
                },
                exp: connection.expires_at,
                project_id: connection.project_id.clone(),
            })),
        }
    }

    /// `subscribe`: authorized exactly as replay is (`RunLog::readable_head`), recorded
    /// in the registry (unless the run has ended: nothing more can come), then the
    /// `subscribed` frame, the backlog after `after` from the gap-safe pages, and `done`
    /// if the run has ended. The subscription is recorded *before* the backlog is read,
    /// so an event committed after that read reaches the fanout with the subscription
    /// already there: between backlog and live nothing is lost (a duplicate may come,
    /// which the client drops).
    async fn subscribe(
        &self,
        endpoint: &str,
        connection_id: &str,
        run_id: &str,
        after: u64,
    ) -> Result<(), ApiError> {
        let connection = self
            .registry
            .get_connection(connection_id)
            .await?
            .ok_or_else(|| ApiError::unauthorized("the connection has expired; connect again"))?;
        if !tollgate_domain::run::validate_run_id(run_id) {
            return Err(ApiError::not_found("run not found"));
        }
        let caller = self.caller_on(&connection, run_id)?;
        let head = self.runs.readable_head(run_id, &caller.viewer()).await?;
        if after > head.last_sequence() {
            return Err(ApiError::bad_request(format!(
                "after {after} is past the run's last event ({})",
                head.last_sequence()
            )));
        }
        let recorded = !head.status.is_terminal();
        if recorded {
            let caps = self.caps_for(&caller, &head);
            let sub = Subscription {
                run_id: run_id.to_owned(),
                connection_id: connection_id.to_owned(),
                holder: caps
                    .iter()
                    .find(|c| c.index == BY_HOLDER_INDEX)
                    .map(|c| c.key.clone()),
                tenant: caps
                    .iter()
                    .find(|c| c.index == BY_TENANT_INDEX)
                    .map(|c| c.key.clone()),
                expires_at: connection.expires_at,
            };
            let too_many = |what: &str| {
                ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    format!("too many live subscriptions for this {what}; unsubscribe one or retry later"),
                )
                .with_state(ErrorState::TooManyStreams)
            };
            match self
                .registry
                .subscribe(
                    &connection,
                    &sub,
                    ws::MAX_SUBSCRIPTIONS_PER_CONNECTION,
                    &caps,
                )
                .await?
            {
                Subscribed::Recorded => {}
                Subscribed::TooManyOnConnection => return Err(too_many("connection")),
                Subscribed::CapFull(what) => return Err(too_many(what)),
                Subscribed::NoConnection => {
                    return Err(ApiError::unauthorized(
                        "the connection has expired; connect again",
                    ))
                }
            }
        }
        let subscribed = serde_json::to_value(ws::Subscribed {
            run_id: run_id.to_owned(),
            after,
        })
        .unwrap_or_default();
        let post = |frame: String| {
            self.poster
                .post(endpoint, connection_id, frame.into_bytes())
        };
        if !self
            .deliverable(
                connection_id,
                post(control_frame(FRAME_SUBSCRIBED, Some(run_id), subscribed)).await,
            )
            .await?
        {
            return Ok(());
        }
        self.backlog(endpoint, connection_id, head, after, recorded)
            .await
    }

    /// Posts the backlog page by page; `done` after the terminal event (and the
    /// subscription dropped, if `recorded`).
    async fn backlog(
        &self,
        endpoint: &str,
        connection_id: &str,
        mut head: RunHead,
        mut after: u64,
        recorded: bool,
    ) -> Result<(), ApiError> {
        let run_id = head.run_id.clone();
        let started = Instant::now();
        let post = |frame: String| {
            self.poster
                .post(endpoint, connection_id, frame.into_bytes())
        };
        loop {
            let page = self.runs.page(&head, after, PAGE).await?;
            for e in &page.events {
                if !self
                    .deliverable(connection_id, post(event_frame(&run_id, e)).await)
                    .await?
                {
                    return Ok(());
                }
            }
            after = page.next_after;
            if page.terminal {
                self.deliverable(connection_id, post(done_frame(&run_id, after)).await)
                    .await?;
                if recorded {
                    self.registry.unsubscribe(connection_id, &run_id).await?;
                }
                return Ok(());
            }
            // Stopped at a hole (a commit becoming visible) or the end: whatever commits
            // from now on is fanned out to the subscription recorded above.
            if page.events.is_empty() || !page.has_more {
                return Ok(());
            }
            if started.elapsed() > BACKLOG_BUDGET {
                let err = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    format!(
                        "the backlog is longer than one answer; subscribe again with after={after}"
                    ),
                );
                post(error_frame(Some(&run_id), err, "")).await;
                return Ok(());
            }
            head = self
                .runs
                .head(&run_id)
                .await?
                .ok_or_else(|| ApiError::not_found("run not found"))?;
        }
    }

    /// Whether to go on posting to a connection after `posted`: a connection gone
    /// (410) is removed from the registry; any other failure is logged and the rest is
    /// skipped (the client resumes with `after`).
    async fn deliverable(&self, connection_id: &str, posted: Posted) -> Result<bool, ApiError> {
        match posted {
            Posted::Sent => Ok(true),
            Posted::Gone => {
                self.registry.remove_connection(connection_id).await?;
                Ok(false)
            }
            Posted::Failed => Ok(false),
        }
    }

    /// The caps a subscription counts against, as a `tollgate serve` subscription's:
    /// none for operators; else one place under the run's tenant (the connection holds
    /// its holder's place already).
    fn caps_for(&self, caller: &Caller, head: &RunHead) -> Vec<Cap> {
        if matches!(caller, Caller::Jwt(c) if c.role == Role::Operator) {
            return Vec::new();
        }
        let (key, max, what) = crate::sse::tenant_key(head, &self.caps);
        vec![Cap {
            index: BY_TENANT_INDEX,
            key,
            max,
            what,
        }]
    }

    /// The registry's caps for a connection's keys ([`crate::sse::connection_keys`]):
    /// the run token's run or the agent under `by_holder`, the tenant under
    /// `by_tenant`. (A run token's connection counts against its run and its tenant
    /// here; against the creating agent only on `tollgate serve`.)
    fn caps(keys: Vec<(String, usize, &'static str)>) -> Vec<Cap> {
        let mut keys = keys.into_iter();
        let holder = keys.next().map(|(key, max, what)| Cap {
            index: BY_HOLDER_INDEX,
            key,
            max,
            what,
        });
        let tenant = keys
            .find(|(key, _, _)| key.starts_with("project:") || key.starts_with("creator:"))
            .map(|(key, max, what)| Cap {
                index: BY_TENANT_INDEX,
                key,
                max,
                what,
            });
        holder.into_iter().chain(tenant).collect()
    }
}
