//! The gateway between one agent (MCP client) and one upstream MCP server.
//!
//! Every message passes through unchanged except `tools/call`: the agent's
//! `initialize` opens the upstream session with the agent's own client info and
//! capabilities and answers with the upstream's, so the agent sees the same server;
//! requests, results and notifications in both directions are relayed (progress tokens
//! mapped back to the agent's). A `tools/call` is decided by the policy, and an `ask`
//! waits for an operator on a Tollgate card; an approved call runs through the
//! execution ledger (docs/architecture.md §7).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, CancelledNotificationParam,
    ClientConfig, ClientNotification, ClientRequest, ClientResult, ContentBlock, ErrorData,
    ProgressNotificationParam, ProgressToken, ServerConfig, ServerNotification, ServerRequest,
    ServerResult, Tool,
};
use rmcp::service::{
    NotificationContext, Peer, PeerRequestOptions, RequestContext, RoleClient, RoleServer,
    RunningService, Service, ServiceError,
};
use serde_json::{json, Map, Value};
use tokio::sync::{watch, OnceCell};
use tokio_util::sync::CancellationToken;
use tollgate_client::{
    arguments_hash, Budget, CallOutcome, Client, Decision, GateRequest, MutationState, Reply, Run,
    RunSpec, TransportError,
};
use tollgate_domain::rules::Outcome;

use crate::policy::Policy;
use crate::upstream::Upstream;

/// The most tools a run's budget names (the server's bound).
const MAX_BUDGET_TOOLS: usize = 64;

/// What the agent sees of a call it may not retry.
pub const OUTCOME_UNKNOWN: &str = "outcome_unknown";

/// How the gateway runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The upstream server's name in tool names (`mcp__<name>__<tool>`) and on cards.
    pub name: String,
    /// The human the session's run acts for.
    pub owner: Option<String>,
    /// The channel the run reports to.
    pub channel_id: Option<String>,
    /// The policy (`ask` for every call when empty).
    pub policy: Policy,
    /// How long a card waits for an operator (300 s by default).
    pub card_timeout: Duration,
    /// How long an approved call may take upstream after dispatch before its outcome is
    /// unknown (120 s by default).
    pub call_timeout: Duration,
    /// How often a waiting call sends `notifications/progress` (when the agent gave a
    /// progress token).
    pub progress_every: Duration,
    /// The run's budget: how many approved calls of each upstream tool may start (the
    /// ledger refuses more, `budget_exhausted`).
    pub max_calls_per_tool: u64,
    /// The run's budget: how many approved calls may start in all.
    pub call_ceiling: u64,
}

impl Options {
    /// Defaults for the server named `name`.
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            owner: None,
            channel_id: None,
            policy: Policy::default(),
            card_timeout: Duration::from_secs(300),
            call_timeout: Duration::from_secs(120),
            progress_every: Duration::from_secs(5),
            max_calls_per_tool: 100,
            call_ceiling: 1000,
        }
    }
}

/// The MCP service the agent talks to (one per agent session).
#[derive(Clone)]
pub struct Gateway {
    inner: Arc<Inner>,
}

struct Inner {
    options: Options,
    tollgate: Client,
    upstream: Upstream,
    session: OnceCell<Session>,
    /// Set when the upstream's session ended (it exited, or its transport closed).
    upstream_gone: CancellationToken,
    /// Cancels the upstream session when the agent's ends.
    stop: CancellationToken,
    /// How many approved calls are between the ledger's start and their settlement:
    /// [`Gateway::finish`] waits for them before it ends the run.
    executing: Arc<watch::Sender<usize>>,
}

/// How long [`Gateway::finish`] waits for approved calls in flight to be settled (the
/// upstream is closed first, so each fails at once and is settled `outcome_unknown`).
const SETTLE_GRACE: Duration = Duration::from_secs(10);

/// One approved call between the ledger's start and its settlement (counted while held).
struct Executing(Arc<watch::Sender<usize>>);

impl Executing {
    fn new(count: &Arc<watch::Sender<usize>>) -> Self {
        count.send_modify(|n| *n += 1);
        Self(count.clone())
    }
}

impl Drop for Executing {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// One agent session: its run and its upstream session.
struct Session {
    run: Run,
    peer: Peer<RoleClient>,
    info: ServerConfig,
    /// The upstream's tools as last listed (annotations shown on cards, read-only hints).
    tools: Mutex<HashMap<String, Tool>>,
    /// Upstream progress token → the agent's, for requests relayed with one.
    progress: Arc<Mutex<HashMap<ProgressToken, ProgressToken>>>,
    /// Calls whose outcome is unknown: `(tool_name, arguments_hash)` → the ledger's record.
    unknown: Mutex<HashMap<(String, String), (String, String)>>,
}

impl Gateway {
    /// A gateway to `upstream`, deciding with `tollgate` (an agent's client).
    pub fn new(options: Options, tollgate: Client, upstream: Upstream) -> Self {
        Self {
            inner: Arc::new(Inner {
                options,
                tollgate,
                upstream,
                session: OnceCell::new(),
                upstream_gone: CancellationToken::new(),
                stop: CancellationToken::new(),
                executing: Arc::new(watch::channel(0).0),
            }),
        }
    }

    /// Resolves when the upstream's session has ended.
    pub async fn upstream_gone(&self) {
        self.inner.upstream_gone.cancelled().await
    }

    /// The session's run, once the agent's first request opened it.
    pub fn run(&self) -> Option<&Run> {
        self.inner.session.get().map(|s| &s.run)
    }

    /// Ends the session: the upstream's is closed, and the run completes (`failed`
    /// when the upstream died first). Waits for a pending card's end to be recorded.
    pub async fn finish(&self, failure: Option<&str>) -> Result<(), tollgate_client::Error> {
        self.inner.stop.cancel();
        let Some(session) = self.inner.session.get() else {
            return Ok(());
        };
        // An approved call still in flight fails now that the upstream is closed, and is
        // settled (`outcome_unknown`) before the run ends: after the run's end its
        // stream takes no `tool_execution`, and an unsettled record stays `dispatched`.
        let mut executing = self.inner.executing.subscribe();
        if tokio::time::timeout(SETTLE_GRACE, executing.wait_for(|n| *n == 0))
            .await
            .is_err()
        {
            tracing::warn!(
                calls = *executing.borrow(),
                "approved calls in flight were not settled in time; their records settle on the server's deadline"
            );
        }
        let ended = match failure {
            None => session.run.complete(None).await,
            Some(why) => {
                session
                    .run
                    .fail(Some(json!({"reason": "mcp_upstream_ended", "detail": why})))
                    .await
            }
        };
        match ended {
            Ok(_) => Ok(()),
            // Already ended (a repeat, or an operator ended it): nothing more to say.
            Err(e) if e.state() == Some("run_terminal") => Ok(()),
            Err(e) => Err(e),
        }
    }

    async fn session(
        &self,
        client_info: ClientConfig,
        agent: Peer<RoleServer>,
    ) -> Result<&Session, ErrorData> {
        self.inner
            .session
            .get_or_try_init(|| self.open(client_info, agent))
            .await
    }

    async fn open(
        &self,
        client_info: ClientConfig,
        agent: Peer<RoleServer>,
    ) -> Result<Session, ErrorData> {
        let o = &self.inner.options;
        let progress = Arc::new(Mutex::new(HashMap::new()));
        let relay = Relay {
            agent,
            client_info: client_info.clone(),
            progress: progress.clone(),
        };
        let running: RunningService<RoleClient, Relay> = self
            .inner
            .upstream
            .connect(relay, self.inner.stop.child_token())
            .await
            .map_err(|e| {
                ErrorData::internal_error(
                    format!("tollgate mcp: the upstream server could not be started: {e}"),
                    None,
                )
            })?;
        let peer = running.peer().clone();
        let upstream = peer.peer_info().ok_or_else(|| {
            ErrorData::internal_error(
                "tollgate mcp: the upstream server sent no initialize result",
                None,
            )
        })?;
        // What the agent is answered: the upstream's own initialize result.
        let mut info = ServerConfig::new(upstream.capabilities.clone());
        info.protocol_version = upstream.protocol_version.clone();
        if let Some(server) = &upstream.server_info {
            info.server_info = server.clone();
        }
        info.instructions = upstream.instructions.clone();
        info.meta = upstream.meta.clone();
        // The upstream's session ends → the gateway's ends.
        let gone = self.inner.upstream_gone.clone();
        tokio::spawn(async move {
            let reason = running.waiting().await;
            tracing::info!(?reason, "the upstream MCP session ended");
            gone.cancel();
        });
        // The upstream's tools, known before the agent asks: the run's budget names each
        // (the ledger starts only calls its budget names), and their annotations reach
        // the cards whether or not the agent lists them.
        let listed = if info.capabilities.tools.is_some() {
            peer.list_all_tools().await.map_err(|e| {
                ErrorData::internal_error(
                    format!("tollgate mcp: the upstream's tools/list failed: {e}"),
                    None,
                )
            })?
        } else {
            Vec::new()
        };
        let mut budget = Budget::new().call_ceiling(o.call_ceiling);
        let mut names: Vec<String> = listed
            .iter()
            .map(|t| format!("mcp__{}__{}", o.name, t.name))
            .filter(|n| n.len() <= 128)
            .collect();
        names.sort();
        if names.len() > MAX_BUDGET_TOOLS {
            tracing::warn!(
                tools = names.len(),
                "the upstream lists more tools than a run's budget holds; approved calls of the rest are refused (tool_not_in_budget)"
            );
        }
        for n in names.into_iter().take(MAX_BUDGET_TOOLS) {
            budget = budget.tool(n, o.max_calls_per_tool);
        }
        let run = self
            .inner
            .tollgate
            .create_run(RunSpec {
                owner: o.owner.clone(),
                channel_id: o.channel_id.clone(),
                budget: Some(budget),
                ..RunSpec::default()
            })
            .await
            .map_err(|e| {
                ErrorData::internal_error(
                    format!("tollgate mcp: Tollgate refused the session's run: {e}"),
                    None,
                )
            })?;
        let started = json!({
            "type": "mcp.session_started",
            "server": o.name,
            "upstream": {"name": info.server_info.name, "version": info.server_info.version},
            "client": {"name": client_info.client_info.name, "version": client_info.client_info.version},
        });
        if let Err(e) = run.append([started]).await {
            tracing::warn!(error = %e, "the session's start could not be recorded");
        }
        tracing::info!(run_id = run.id(), server = %o.name, "MCP session opened");
        Ok(Session {
            run,
            peer,
            info,
            tools: Mutex::new(
                listed
                    .into_iter()
                    .map(|t| (t.name.to_string(), t))
                    .collect(),
            ),
            progress,
            unknown: Mutex::new(HashMap::new()),
        })
    }

    /// Relays a request upstream, mapping the upstream's progress token to the agent's.
    async fn relay(
        session: &Session,
        request: ClientRequest,
        agent_progress: Option<ProgressToken>,
        ct: &CancellationToken,
        timeout: Option<Duration>,
    ) -> Result<ServerResult, ServiceError> {
        let options = match timeout {
            Some(t) => PeerRequestOptions::with_timeout(t),
            None => PeerRequestOptions::no_options(),
        };
        let handle = session
            .peer
            .send_request_with_option(request, options)
            .await?;
        let token = handle.progress_token.clone();
        if let Some(agent) = agent_progress {
            lock(&session.progress).insert(token.clone(), agent);
        }
        let id = handle.id.clone();
        let peer = handle.peer.clone();
        let answer = tokio::select! {
            answer = handle.await_response() => answer,
            _ = ct.cancelled() => {
                // The agent cancelled: tell the upstream, as the agent told us.
                let _ = peer
                    .send_notification(ClientNotification::CancelledNotification(
                        rmcp::model::CancelledNotification::new(CancelledNotificationParam::new(
                            Some(id),
                            Some("cancelled by the client".into()),
                        )),
                    ))
                    .await;
                Err(ServiceError::Cancelled { reason: Some("cancelled by the client".into()) })
            }
        };
        lock(&session.progress).remove(&token);
        answer
    }

    async fn call_tool(
        &self,
        session: &Session,
        request: CallToolRequest,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let o = &self.inner.options;
        let params: &CallToolRequestParams = &request.params;
        let tool = params.name.to_string();
        let arguments = Value::Object(params.arguments.clone().unwrap_or_default());
        let tool_name = format!("mcp__{}__{}", o.name, tool);
        let hash = arguments_hash(&arguments);
        let listed = lock(&session.tools).get(&tool).cloned();
        let read_only = listed
            .as_ref()
            .and_then(|t| t.annotations.as_ref())
            .and_then(|a| a.read_only_hint);
        let verdict = o.policy.decide(&tool, &arguments, read_only);
        let agent_progress = ctx.meta.get_progress_token();
        let record = |kind: &str| {
            json!({
                "type": kind,
                "server": o.name,
                "tool": tool,
                "tool_name": tool_name,
                "arguments_hash": hash,
                "rule": verdict.rule,
            })
        };
        match verdict.outcome {
            Outcome::Deny => {
                let mut event = record("mcp.call_denied");
                event["message"] = json!(verdict.message);
                if let Err(e) = session.run.append([event]).await {
                    tracing::warn!(error = %e, "a policy denial could not be recorded");
                }
                let why = verdict
                    .message
                    .as_deref()
                    .unwrap_or("the policy does not allow it");
                Ok(tool_error(format!(
                    "Denied by policy ({}): {why}. The call was not made.",
                    verdict.rule.as_deref().unwrap_or("policy")
                )))
            }
            Outcome::Allow => {
                // Recorded before it is made: a call Tollgate cannot record is not made.
                if let Err(e) = session.run.append([record("mcp.call_allowed")]).await {
                    return Ok(tool_error(format!(
                        "Tollgate could not record the call, so it was not made: {e}"
                    )));
                }
                self.forward(session, request, agent_progress, &ctx.ct, None)
                    .await
            }
            Outcome::Ask => {
                self.ask(
                    session, request, &tool, &tool_name, arguments, hash, listed, ctx,
                )
                .await
            }
        }
    }

    async fn forward(
        &self,
        session: &Session,
        request: CallToolRequest,
        agent_progress: Option<ProgressToken>,
        ct: &CancellationToken,
        timeout: Option<Duration>,
    ) -> Result<CallToolResult, ErrorData> {
        match Self::relay(
            session,
            ClientRequest::CallToolRequest(request),
            agent_progress,
            ct,
            timeout,
        )
        .await
        {
            Ok(ServerResult::CallToolResult(r)) => Ok(r),
            Ok(_) => Err(ErrorData::internal_error(
                "the upstream answered tools/call with another result",
                None,
            )),
            Err(ServiceError::McpError(e)) => Err(e),
            Err(e) => Err(ErrorData::internal_error(
                format!("the upstream server: {e}"),
                None,
            )),
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn ask(
        &self,
        session: &Session,
        request: CallToolRequest,
        tool: &str,
        tool_name: &str,
        arguments: Value,
        hash: String,
        listed: Option<Tool>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let o = &self.inner.options;
        let run = &session.run;
        if let Some(refusal) = self.unknown_outcome(session, tool_name, &hash).await {
            return Ok(tool_error(refusal));
        }
        let mut message = format!("MCP server {}: {tool}", o.name);
        if let Some(d) = listed.as_ref().and_then(|t| t.description.as_deref()) {
            message.push_str(" — ");
            message.extend(d.chars().take(200));
        }
        if let Some(a) = listed.as_ref().and_then(|t| t.annotations.as_ref()) {
            let hints: Vec<String> = [
                ("readOnly", a.read_only_hint),
                ("destructive", a.destructive_hint),
                ("idempotent", a.idempotent_hint),
                ("openWorld", a.open_world_hint),
            ]
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
            .collect();
            if !hints.is_empty() {
                message.push_str(&format!(
                    " (the server's unverified hints: {})",
                    hints.join(", ")
                ));
            }
        }
        let mut preview = Map::new();
        preview.insert("server".into(), json!(o.name));
        preview.insert("tool".into(), json!(tool));
        preview.insert("arguments".into(), arguments.clone());
        let gate = GateRequest::new(tool_name, arguments)
            .message(message)
            .arguments_preview(preview)
            .timeout(o.card_timeout);
        let armed = match run.arm(gate).await {
            Ok(a) => a,
            Err(e) => {
                return Ok(tool_error(format!(
                    "Tollgate could not arm an approval card, so the call was not made: {e}"
                )))
            }
        };
        let request_id = armed.request_id().to_owned();
        let display = armed.display_id().unwrap_or(&request_id).to_owned();
        let agent_progress = ctx.meta.get_progress_token();
        let ticker = match (&agent_progress, armed.is_pending()) {
            (Some(token), true) => Some(tokio::spawn(progress_ticker(
                ctx.peer.clone(),
                token.clone(),
                display.clone(),
                o.progress_every,
            ))),
            _ => None,
        };
        let decision = tokio::select! {
            d = run.wait(armed) => d,
            _ = ctx.ct.cancelled() => {
                if let Some(t) = ticker { t.abort(); }
                // Withdrawn: the card ends (announced), the call is never made.
                if let Err(e) = run.withdraw(&request_id).await {
                    tracing::warn!(error = %e, request_id, "a cancelled call's card could not be withdrawn; it expires on its timer");
                }
                return Err(ErrorData::internal_error("cancelled by the client", None));
            }
        };
        if let Some(t) = ticker {
            t.abort();
        }
        let decision = match decision {
            Ok(d) => d,
            Err(e) => {
                return Ok(tool_error(format!(
                    "Tollgate could not say how card {display} was decided, so the call was not made: {e}"
                )))
            }
        };
        match decision {
            Decision::Denied { decided_by } => {
                // The operator's reason, when they gave one, is on the card.
                let reason = run
                    .approval(&request_id)
                    .await
                    .ok()
                    .and_then(|card| card.decision_reason)
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default();
                Ok(tool_error(format!(
                    "Denied by {} (card {display}){reason}. The call was not made.",
                    decided_by.as_deref().unwrap_or("an operator")
                )))
            }
            Decision::Expired => Ok(tool_error(format!(
                "Nobody approved card {display} in time; it expired. The call was not made."
            ))),
            Decision::Approved { call, auto, .. } if auto => {
                // A standing grant approved it: no ledger record (the ledger admits
                // human-approved calls only); the card's tool.auto_approved records it.
                drop(call);
                self.forward(
                    session,
                    request,
                    agent_progress,
                    &ctx.ct,
                    Some(o.call_timeout),
                )
                .await
            }
            Decision::Approved { call, .. } => {
                let _executing = Executing::new(&self.inner.executing);
                let reference = call.reference();
                let started = match run.start(call).await {
                    Ok(s) => s,
                    Err(e) => {
                        return Ok(tool_error(format!(
                            "Approved, but the execution ledger refused to start the call, so it was not made: {e}"
                        )))
                    }
                };
                let dispatched = match started.dispatch().await {
                    Ok(d) => d,
                    Err(e) => {
                        return Ok(tool_error(format!(
                        "Approved, but the call could not be dispatched, so it was not made: {e}"
                    )))
                    }
                };
                let peer_ct = CancellationToken::new();
                let executed = dispatched
                    .send(o.call_timeout, |_permit| async {
                        // After dispatch the agent's cancellation changes nothing: the
                        // call runs to its answer (or its deadline) and is settled.
                        match Self::relay(
                            session,
                            ClientRequest::CallToolRequest(request),
                            agent_progress,
                            &peer_ct,
                            None,
                        )
                        .await
                        {
                            Ok(ServerResult::CallToolResult(r)) => Ok(settled_reply(Ok(r))),
                            Ok(_) => Ok(settled_reply(Err(ErrorData::internal_error(
                                "the upstream answered tools/call with another result",
                                None,
                            )))),
                            Err(ServiceError::McpError(e)) => Ok(settled_reply(Err(e))),
                            Err(e) => Err(TransportError::failed(e.to_string())),
                        }
                    })
                    .await;
                match executed.outcome {
                    CallOutcome::Responded(answer) => answer,
                    CallOutcome::NotSent(e) => Ok(tool_error(format!(
                        "The call was not made: {}",
                        e.message()
                    ))),
                    CallOutcome::Failed(_) | CallOutcome::TimedOut(_) => {
                        lock(&session.unknown).insert(
                            (tool_name.to_owned(), hash),
                            (
                                reference.tool_call_id.clone(),
                                reference.approval_id.clone(),
                            ),
                        );
                        Ok(tool_error(format!(
                            "The outcome of this call is unknown ({OUTCOME_UNKNOWN}): it was sent to the server, \
                             which did not answer. Do not retry it: the same call is refused until an operator \
                             reconciles record {} (tollgate reconcile {} {} {} --observed applied|not_applied).",
                            reference.tool_call_id,
                            run.id(),
                            reference.tool_call_id,
                            reference.approval_id,
                        )))
                    }
                }
            }
        }
    }

    /// A refusal when the same call's earlier outcome is still unknown on the ledger.
    async fn unknown_outcome(
        &self,
        session: &Session,
        tool_name: &str,
        hash: &str,
    ) -> Option<String> {
        let key = (tool_name.to_owned(), hash.to_owned());
        let (tool_call_id, approval_id) = lock(&session.unknown).get(&key).cloned()?;
        let state = match session.run.mutation(&tool_call_id, &approval_id).await {
            Ok(record) => MutationState::parse(&record.state),
            // Cannot tell: still refused (fail closed).
            Err(e) => {
                return Some(format!(
                    "An identical earlier call's outcome is unknown (record {tool_call_id}) and Tollgate \
                     could not be asked whether it was reconciled ({e}); not retried."
                ))
            }
        };
        if matches!(
            state,
            MutationState::OutcomeUnknown | MutationState::Dispatched | MutationState::Intent
        ) {
            return Some(format!(
                "Refused: an identical earlier call's outcome is unknown (record {tool_call_id} on run {}, \
                 {}). It must not be run twice; an operator reconciles it first.",
                session.run.id(),
                state.as_str()
            ));
        }
        // Reconciled: the next identical call asks afresh.
        lock(&session.unknown).remove(&key);
        None
    }
}

/// The answer of a dispatched call, as the ledger settles it.
fn settled_reply(
    answer: Result<CallToolResult, ErrorData>,
) -> Reply<Result<CallToolResult, ErrorData>> {
    match &answer {
        Ok(r) if r.is_error == Some(true) => {
            let text = text_of(&r.content);
            Reply::error(answer, json!({"code": "tool_error", "message": text}))
        }
        Ok(r) => {
            let text = text_of(&r.content);
            Reply::ok(answer, json!({"content": text}))
        }
        Err(e) => {
            let facts = json!({"code": "mcp_error", "mcp_code": e.code.0, "message": e.message});
            Reply::error(answer, facts)
        }
    }
}

/// The text blocks of a result, bounded (what the ledger keeps as facts).
fn text_of(content: &[ContentBlock]) -> String {
    let text: String = content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect::<Vec<_>>()
        .join("\n");
    text.chars().take(2000).collect()
}

fn tool_error(text: String) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(text)])
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

async fn progress_ticker(
    agent: Peer<RoleServer>,
    token: ProgressToken,
    display: String,
    every: Duration,
) {
    let mut n = 0.0;
    loop {
        n += 1.0;
        let mut p = ProgressNotificationParam::new(token.clone(), n);
        p.message = Some(format!("waiting for an operator to decide card {display}"));
        if agent.notify_progress(p).await.is_err() {
            return;
        }
        tokio::time::sleep(every).await;
    }
}

impl Service<RoleServer> for Gateway {
    async fn handle_request(
        &self,
        request: ClientRequest,
        ctx: RequestContext<RoleServer>,
    ) -> Result<ServerResult, ErrorData> {
        let request = match request {
            ClientRequest::InitializeRequest(init) => {
                let session = self.session(init.params.clone(), ctx.peer.clone()).await?;
                return Ok(ServerResult::InitializeResult(session.info.clone()));
            }
            other => other,
        };
        // A session opened without initialize (the stateless lifecycle): the gateway's
        // own client info upstream.
        let session = self
            .session(gateway_client_info(), ctx.peer.clone())
            .await?;
        match request {
            ClientRequest::CallToolRequest(call) => self
                .call_tool(session, call, ctx)
                .await
                .map(ServerResult::CallToolResult),
            ClientRequest::ListToolsRequest(list) => {
                let agent_progress = ctx.meta.get_progress_token();
                let answer = Self::relay(
                    session,
                    ClientRequest::ListToolsRequest(list),
                    agent_progress,
                    &ctx.ct,
                    None,
                )
                .await;
                let answer = answer.map_err(service_error)?;
                if let ServerResult::ListToolsResult(r) = &answer {
                    let mut tools = lock(&session.tools);
                    for t in &r.tools {
                        tools.insert(t.name.to_string(), t.clone());
                    }
                }
                Ok(answer)
            }
            other => {
                let agent_progress = ctx.meta.get_progress_token();
                Self::relay(session, other, agent_progress, &ctx.ct, None)
                    .await
                    .map_err(service_error)
            }
        }
    }

    async fn handle_notification(
        &self,
        notification: ClientNotification,
        _ctx: NotificationContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let Some(session) = self.inner.session.get() else {
            return Ok(());
        };
        match notification {
            // rmcp cancels the request's context itself (the call's handler acts on it),
            // and the upstream sent its own `initialized` when the gateway connected.
            ClientNotification::CancelledNotification(_)
            | ClientNotification::InitializedNotification(_) => Ok(()),
            other => session
                .peer
                .send_notification(other)
                .await
                .map_err(service_error),
        }
    }

    fn get_info(&self) -> ServerConfig {
        self.inner
            .session
            .get()
            .map(|s| s.info.clone())
            .unwrap_or_default()
    }
}

fn service_error(e: ServiceError) -> ErrorData {
    match e {
        ServiceError::McpError(e) => e,
        other => ErrorData::internal_error(format!("the upstream server: {other}"), None),
    }
}

fn gateway_client_info() -> ClientConfig {
    let mut info = ClientConfig::default();
    info.client_info.name = "tollgate-mcp".into();
    info.client_info.version = env!("CARGO_PKG_VERSION").into();
    info
}

/// The upstream side: requests and notifications the upstream sends go to the agent.
#[derive(Clone)]
pub(crate) struct Relay {
    agent: Peer<RoleServer>,
    client_info: ClientConfig,
    progress: Arc<Mutex<HashMap<ProgressToken, ProgressToken>>>,
}

impl Service<RoleClient> for Relay {
    async fn handle_request(
        &self,
        request: ServerRequest,
        _ctx: RequestContext<RoleClient>,
    ) -> Result<ClientResult, ErrorData> {
        self.agent
            .send_request(request)
            .await
            .map_err(service_error)
    }

    async fn handle_notification(
        &self,
        notification: ServerNotification,
        _ctx: NotificationContext<RoleClient>,
    ) -> Result<(), ErrorData> {
        let notification = match notification {
            ServerNotification::ProgressNotification(mut n) => {
                let Some(agent) = lock(&self.progress).get(&n.params.progress_token).cloned()
                else {
                    // Progress for a request the agent gave no token (or one that ended).
                    return Ok(());
                };
                n.params.progress_token = agent;
                ServerNotification::ProgressNotification(n)
            }
            // The upstream's cancellation names its own request ids, not the agent's.
            ServerNotification::CancelledNotification(_) => return Ok(()),
            other => other,
        };
        self.agent
            .send_notification(notification)
            .await
            .map_err(service_error)
    }

    fn get_info(&self) -> ClientConfig {
        self.client_info.clone()
    }
}
