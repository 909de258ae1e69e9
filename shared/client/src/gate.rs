//! Approval gates: arm a card before a tool call and wait for a human's decision.
//!
//! [`Run::gate`] arms a card (`POST /api/runs/{id}/approval-requests`, a fresh UUID as
//! `request_id`) and returns at once when a durable policy auto-approved it. Otherwise
//! it waits for the card's `tool.approval_resolved` on the run's live stream
//! (`GET /api/runs/{id}/stream`, resumed with `Last-Event-ID` after each window or drop),
//! reading the card itself (`GET …/approval-requests/{request_id}`) after every
//! reconnect as a cheap safety net. When the stream is unavailable (404/405, or an answer
//! that is not `text/event-stream` — e.g. an API Gateway without the streaming route) it
//! polls `GET /api/runs/{id}/events?after=N` instead. The run ending first is
//! [`Error::RunEnded`]; a card neither decided nor expired well past its deadline
//! ([`crate::ClientConfig::expiry_grace`]) is [`Error::WaitTimedOut`].

use std::time::Duration;

use reqwest::Method;
use serde_json::Value;
use tokio::time::Instant;

use tollgate_protocol::approvals::{self as wire, ArmApproval, Card};
use tollgate_protocol::events::{ApprovalResolved, Event};

use crate::execution::ApprovedCall;
use crate::hash::arguments_hash;
use crate::http::{describe, is_event_stream, read};
use crate::retry::reconnect_backoff;
use crate::sse::{SseItem, SseParser, MAX_LINE};
use crate::{Error, Run};

/// The server's default card timeout.
pub const DEFAULT_GATE_TIMEOUT: Duration = Duration::from_secs(300);
/// The longest card timeout any server accepts (7 days). A deployment caps it lower with
/// `TOLLGATE_MAX_CARD_TIMEOUT_SECONDS` (default 24 h): beyond its cap the arm answers
/// 400 (`state: "timeout_too_long"`), an [`Error`] from [`Run::arm`].
pub const MAX_GATE_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
/// The event that announces a card's resolution.
pub const APPROVAL_RESOLVED: &str = "tool.approval_resolved";

/// Longest wait between reconnects after errors.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(30);

/// What an approval covers. The strings are exact and case-sensitive; anything else
/// means `once`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Scope {
    /// This call only.
    #[default]
    Once,
    /// Durable: this tool on this run and, when the coordinator has the same owner, on
    /// its sibling runs.
    Run,
    /// Durable: this tool on this run.
    Tool,
    /// Durable: this tool on the owner's runs within the project (always-eligible tools
    /// only).
    Always,
}

impl Scope {
    /// `once`, `run`, `tool` or `always`; anything else (or nothing) is `once`.
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("run") => Scope::Run,
            Some("tool") => Scope::Tool,
            Some("always") => Scope::Always,
            _ => Scope::Once,
        }
    }

    /// The wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Once => "once",
            Scope::Run => "run",
            Scope::Tool => "tool",
            Scope::Always => "always",
        }
    }
}

/// A gate to arm before a tool call: what the human will see, and the call's arguments
/// (hashed into the card's `arguments_hash`, so the approval binds exactly them).
#[derive(Debug, Clone, PartialEq)]
pub struct GateRequest {
    /// The tool about to be called.
    pub tool_name: String,
    /// The call's arguments; only their hash leaves the process.
    pub arguments: Value,
    /// What the human is shown of the arguments, when the agent chooses to show any
    /// (display only: the hash binds the call). The server replaces values under
    /// secret-looking keys with `"[redacted]"` and bounds it (4 KiB, 4 levels, long
    /// strings cut) — still, put nothing here the operators should not read.
    pub arguments_preview: Option<serde_json::Map<String, Value>>,
    /// The card's id; a fresh UUID when `None`. Give the same one again to find the same
    /// card (e.g. after a restart).
    pub request_id: Option<String>,
    /// The tool call's id (defaults to the `request_id`).
    pub tool_call_id: Option<String>,
    /// The approval attempt's id (defaults to the `request_id`).
    pub approval_id: Option<String>,
    /// The URL the call will reach, shown on the card.
    pub url: Option<String>,
    /// Why the agent wants the call, shown on the card.
    pub intention: Option<String>,
    /// A message for the human.
    pub message: Option<String>,
    /// How long the card waits before it expires (whole seconds, rounded up; 1 s to 7
    /// days; the server's default is 300 s).
    pub timeout: Option<Duration>,
}

impl GateRequest {
    /// A gate for `tool_name` called with `arguments`.
    pub fn new(tool_name: impl Into<String>, arguments: Value) -> Self {
        Self {
            tool_name: tool_name.into(),
            arguments,
            arguments_preview: None,
            request_id: None,
            tool_call_id: None,
            approval_id: None,
            url: None,
            intention: None,
            message: None,
            timeout: None,
        }
    }

    /// Sets the card's `request_id`.
    pub fn request_id(mut self, id: impl Into<String>) -> Self {
        self.request_id = Some(id.into());
        self
    }

    /// Sets the tool call's id.
    pub fn tool_call_id(mut self, id: impl Into<String>) -> Self {
        self.tool_call_id = Some(id.into());
        self
    }

    /// Sets the approval attempt's id.
    pub fn approval_id(mut self, id: impl Into<String>) -> Self {
        self.approval_id = Some(id.into());
        self
    }

    /// Sets the URL shown on the card.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// Sets the argument preview shown on the card ([`GateRequest::arguments_preview`]).
    pub fn arguments_preview(mut self, preview: serde_json::Map<String, Value>) -> Self {
        self.arguments_preview = Some(preview);
        self
    }

    /// Sets the intention shown on the card.
    pub fn intention(mut self, text: impl Into<String>) -> Self {
        self.intention = Some(text.into());
        self
    }

    /// Sets the message shown on the card.
    pub fn message(mut self, text: impl Into<String>) -> Self {
        self.message = Some(text.into());
        self
    }

    /// Sets the card's timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }
}

/// How a gate ended.
#[derive(Debug)]
pub enum Decision {
    /// Approved: by a human (`auto: false`, `decided_by` the operator) or by a durable
    /// policy (`auto: true`, `decided_by` `policy:<policy_id>`). `call` is what
    /// [`Run::execute`] / [`Run::start`] take to run it under the execution guard.
    Approved {
        /// The scope the approval was given with (a policy's scope when `auto`).
        scope: Scope,
        /// Who decided.
        decided_by: Option<String>,
        /// Whether a policy approved it without a card.
        auto: bool,
        /// The approved call.
        call: ApprovedCall,
    },
    /// Denied by an operator.
    Denied {
        /// Who denied.
        decided_by: Option<String>,
    },
    /// Nobody decided before the card's deadline.
    Expired,
}

impl Decision {
    /// Whether the call may go ahead.
    pub fn is_approved(&self) -> bool {
        matches!(self, Decision::Approved { .. })
    }

    /// The approved call, if approved.
    pub fn into_call(self) -> Option<ApprovedCall> {
        match self {
            Decision::Approved { call, .. } => Some(call),
            _ => None,
        }
    }
}

/// A decision without the call it is about (what the wire says).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    Approved {
        scope: Scope,
        decided_by: Option<String>,
        auto: bool,
    },
    Denied {
        decided_by: Option<String>,
    },
    Expired,
}

impl Verdict {
    fn into_decision(self, mut call: ApprovedCall) -> Decision {
        match self {
            Verdict::Approved {
                scope,
                decided_by,
                auto,
            } => {
                call.auto = auto;
                Decision::Approved {
                    scope,
                    decided_by,
                    auto,
                    call,
                }
            }
            Verdict::Denied { decided_by } => Decision::Denied { decided_by },
            Verdict::Expired => Decision::Expired,
        }
    }

    /// From a `tool.approval_resolved` payload (`approved`, `expired`, `decidedBy`,
    /// `scope`).
    pub(crate) fn from_resolved_event(data: &ApprovalResolved) -> Self {
        let decided_by = data.decided_by.clone();
        if data.approved {
            Verdict::Approved {
                scope: Scope::parse(data.scope.as_deref()),
                decided_by,
                auto: false,
            }
        } else if data.expired {
            Verdict::Expired
        } else {
            Verdict::Denied { decided_by }
        }
    }

    /// From a card as `GET …/approval-requests/{request_id}` answers it; `None` while it
    /// is pending.
    pub(crate) fn from_card(card: &Card) -> Option<Self> {
        let decided_by = card.decided_by.clone();
        match card.state.as_str() {
            "approved" => Some(Verdict::Approved {
                scope: Scope::parse(card.scope.as_deref()),
                // Only the card's own word: a `decided_by` is a name, not a marker.
                auto: card.auto_approved == Some(true),
                decided_by,
            }),
            "denied" => Some(Verdict::Denied { decided_by }),
            "expired" => Some(Verdict::Expired),
            _ => None,
        }
    }
}

/// An armed card, not yet waited for ([`Run::arm`], then [`Run::wait`]).
#[derive(Debug)]
pub struct Armed {
    request_id: String,
    display_id: Option<String>,
    call: ApprovedCall,
    state: ArmedState,
}

#[derive(Debug)]
enum ArmedState {
    /// Waiting: the resolution comes after sequence `after`.
    Pending { after: u64, timeout: Duration },
    /// Already decided when armed (auto-approved, or a repeated arm of a decided card).
    Decided(Verdict),
}

impl Armed {
    /// The card's `request_id`.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// The card's short id as operators see it.
    pub fn display_id(&self) -> Option<&str> {
        self.display_id.as_deref()
    }

    /// Whether the card waits for a human (false when a policy approved it at once, or a
    /// repeated arm found it decided).
    pub fn is_pending(&self) -> bool {
        matches!(self.state, ArmedState::Pending { .. })
    }
}

impl Run {
    /// Arms a gate and waits for its decision: [`Run::arm`] then [`Run::wait`].
    pub async fn gate(&self, request: GateRequest) -> Result<Decision, Error> {
        let armed = self.arm(request).await?;
        self.wait(armed).await
    }

    /// Arms a card (`POST /api/runs/{id}/approval-requests`) without waiting for it.
    pub async fn arm(&self, request: GateRequest) -> Result<Armed, Error> {
        let timeout = request.timeout.unwrap_or(DEFAULT_GATE_TIMEOUT);
        if timeout.is_zero() || timeout > MAX_GATE_TIMEOUT {
            return Err(Error::Config(
                "a gate's timeout must be 1 s to 7 days".into(),
            ));
        }
        let timeout_seconds = timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0);
        let request_id = request
            .request_id
            .clone()
            .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        let hash = arguments_hash(&request.arguments);
        let body = ArmApproval {
            request_id: request_id.clone(),
            tool_name: request.tool_name.clone(),
            tool_call_id: request.tool_call_id.clone(),
            approval_id: request.approval_id.clone(),
            url: request.url.clone(),
            intention: request.intention.clone(),
            message: request.message.clone(),
            arguments_hash: Some(hash.clone()),
            arguments_preview: request.arguments_preview.clone(),
            timeout_seconds: Some(timeout_seconds),
        };
        let body = serde_json::to_value(body).map_err(|e| Error::Config(e.to_string()))?;
        let answer = self
            .call(Method::POST, &["approval-requests"], Some(&body))
            .await?;
        let status = answer.status;
        let body: wire::Armed = answer.parse(&[200, 201])?;
        let call = ApprovedCall {
            tool_call_id: request
                .tool_call_id
                .clone()
                .unwrap_or_else(|| request_id.clone()),
            approval_id: request
                .approval_id
                .clone()
                .unwrap_or_else(|| request_id.clone()),
            request_id: request_id.clone(),
            tool_name: request.tool_name,
            arguments_hash: Some(hash),
            auto: false,
        };
        let display_id = Some(body.display_id);
        let state = match body.state.as_str() {
            "approved" if body.auto_approved == Some(true) => {
                ArmedState::Decided(Verdict::Approved {
                    scope: Scope::parse(body.scope.as_deref()),
                    decided_by: body.policy_id.map(|p| format!("policy:{p}")),
                    auto: true,
                })
            }
            "pending" => ArmedState::Pending {
                // A fresh card's resolution follows its `tool.approval_required`; a repeated
                // arm (200) does not say where that is, so the wait reads from the start.
                after: body.sequence.unwrap_or(0),
                timeout,
            },
            // A repeated arm of a card decided meanwhile: the card says by whom.
            "approved" | "denied" | "expired" => {
                let card = self.approval(&request_id).await?;
                ArmedState::Decided(
                    Verdict::from_card(&card)
                        .ok_or_else(|| Error::malformed(200, "a decided card's state"))?,
                )
            }
            _ => return Err(Error::malformed(status, "the card's state")),
        };
        Ok(Armed {
            request_id,
            display_id,
            call,
            state,
        })
    }

    /// Waits for an armed card's decision (see the module docs for how).
    pub async fn wait(&self, armed: Armed) -> Result<Decision, Error> {
        let Armed {
            request_id,
            call,
            state,
            ..
        } = armed;
        let (after, timeout) = match state {
            ArmedState::Decided(v) => return Ok(v.into_decision(call)),
            ArmedState::Pending { after, timeout } => (after, timeout),
        };
        let started = Instant::now();
        let give_up_at = started + timeout + self.client().config().expiry_grace;
        // Over WebSocket when the server advertises one, else the SSE stream.
        let ws = self.client().http().live_websocket().await.map(|url| {
            crate::ws::WsFollow::new(
                url,
                self.token(),
                self.id(),
                after,
                self.client().config().stream_stall,
            )
        });
        let mut watch = Watch {
            run: self,
            request_id: &request_id,
            after,
            streaming: true,
            retry_hint: Duration::from_secs(1),
            ws,
        };
        let verdict = watch.until_resolved(started, give_up_at).await?;
        Ok(verdict.into_decision(call))
    }

    /// Withdraws a pending card the agent no longer needs
    /// (`POST /api/runs/{id}/approval-requests/{request_id}/withdraw`): it ends
    /// `expired` with reason `withdrawn`, announced on the stream, and nothing it asked
    /// for may run. A card already decided answers its state unchanged.
    pub async fn withdraw(&self, request_id: &str) -> Result<Card, Error> {
        self.call(
            Method::POST,
            &["approval-requests", request_id, "withdraw"],
            Some(&serde_json::json!({})),
        )
        .await?
        .parse(&[200])
    }

    /// The card `request_id` as the server holds it
    /// (`GET /api/runs/{id}/approval-requests/{request_id}`): `state`, `scope`,
    /// `decided_by`, … ([`Error::NotFound`] with state `unknown` when there is none).
    pub async fn approval(&self, request_id: &str) -> Result<Card, Error> {
        self.call(Method::GET, &["approval-requests", request_id], None)
            .await?
            .parse(&[200])
    }
}

/// One wait's position and mode.
struct Watch<'a> {
    run: &'a Run,
    request_id: &'a str,
    /// The last sequence seen.
    after: u64,
    /// Live stream (true) or polling the JSON pages.
    streaming: bool,
    /// The server's `retry:` hint.
    retry_hint: Duration,
    /// The WebSocket follower, when the server advertises an endpoint.
    ws: Option<crate::ws::WsFollow>,
}

/// How one stream response or one polling round ended.
enum Step {
    /// The card's resolution arrived.
    Resolved(Verdict),
    /// The run's terminal event arrived first.
    RunEnded,
    /// Read again after this long (end of a window, or nothing new while polling).
    Again(Duration),
    /// The live stream is not offered here: poll instead.
    Fallback,
    /// A transient failure: back off and try again.
    Failed {
        error: Error,
        retry_after: Option<Duration>,
    },
}

/// What this card's `tool.approval_resolved` means to the waiting call: its decision or
/// expiry — or, when the run's end closed it (`reason: run_ended`, announced just before
/// the terminal event), the run's end.
fn resolved_step(data: &ApprovalResolved) -> Step {
    if data.expired && data.reason.as_deref() == Some("run_ended") {
        Step::RunEnded
    } else {
        Step::Resolved(Verdict::from_resolved_event(data))
    }
}

impl Watch<'_> {
    async fn until_resolved(
        &mut self,
        started: Instant,
        give_up_at: Instant,
    ) -> Result<Verdict, Error> {
        let mut failures: u32 = 0;
        let mut first = true;
        loop {
            if Instant::now() >= give_up_at {
                // One last look at the card itself before giving up.
                return match self.card_verdict().await {
                    Ok(Some(v)) => Ok(v),
                    _ => Err(Error::WaitTimedOut {
                        request_id: self.request_id.to_owned(),
                        waited: started.elapsed(),
                    }),
                };
            }
            if self.streaming && !first {
                // The safety net: after every reconnect, the card itself.
                match self.card_verdict().await {
                    Ok(Some(v)) => return Ok(v),
                    Ok(None) => {}
                    Err(e) if e.is_transient() => {}
                    Err(e) => return Err(e),
                }
            }
            first = false;
            let step = if self.ws.is_some() {
                self.ws_once(give_up_at).await?
            } else if self.streaming {
                self.stream_once(give_up_at).await?
            } else {
                self.poll_once().await?
            };
            let wait = match step {
                Step::Resolved(v) => return Ok(v),
                Step::RunEnded => {
                    return match self.card_verdict().await {
                        Ok(Some(v)) => Ok(v),
                        _ => Err(Error::RunEnded {
                            run_id: self.run.id().to_owned(),
                            request_id: self.request_id.to_owned(),
                        }),
                    }
                }
                Step::Again(wait) => {
                    failures = 0;
                    wait
                }
                Step::Fallback => {
                    tracing::debug!(
                        run_id = self.run.id(),
                        "live stream unavailable; polling the event pages"
                    );
                    self.streaming = false;
                    Duration::ZERO
                }
                Step::Failed { error, retry_after } => {
                    failures = failures.saturating_add(1);
                    let wait = reconnect_delay(self.retry_hint, failures, retry_after);
                    tracing::debug!(
                        run_id = self.run.id(),
                        error = %error,
                        wait_ms = wait.as_millis() as u64,
                        "waiting for the card: reconnecting"
                    );
                    wait
                }
            };
            let left = give_up_at.saturating_duration_since(Instant::now());
            tokio::time::sleep(wait.min(left)).await;
        }
    }

    /// The card's verdict now (`None` while pending).
    async fn card_verdict(&self) -> Result<Option<Verdict>, Error> {
        let card = self.run.approval(self.request_id).await?;
        // A card the run's end closed (`reason: run_ended`) was never decided: the run
        // ending is the answer.
        if card.reason.as_deref() == Some("run_ended") {
            return Ok(None);
        }
        Ok(Verdict::from_card(&card))
    }

    /// Whether `event` (type, JSON text or value) is this card's resolution.
    fn resolution(&self, event_type: &str, data: Option<ApprovalResolved>) -> Option<Step> {
        if event_type != APPROVAL_RESOLVED {
            return None;
        }
        data.filter(|d| d.request_id == self.request_id)
            .map(|d| resolved_step(&d))
    }

    /// Frames from the WebSocket follower until the card resolves, the run ends, the
    /// connection gives out (the follower reconnects on the next call, after its own
    /// backoff) or it is time to give up.
    async fn ws_once(&mut self, give_up_at: Instant) -> Result<Step, Error> {
        use crate::ws::WsItem;
        let request_id = self.request_id;
        let Some(ws) = self.ws.as_mut() else {
            return Ok(Step::Fallback);
        };
        loop {
            let left = give_up_at.saturating_duration_since(Instant::now());
            let item = match tokio::time::timeout(left, ws.next()).await {
                Err(_) => return Ok(Step::Again(Duration::ZERO)),
                Ok(Ok(item)) => item,
                Ok(Err(refused)) => {
                    return match Error::from_answer(refused.status, &refused.body, None) {
                        // Reconnecting with the run token after the run ended (its
                        // connection is refused then): the card as the run left it.
                        Error::RunTerminal { .. } => Ok(Step::RunEnded),
                        e => Err(e),
                    };
                }
            };
            self.after = ws.last();
            match item {
                WsItem::Event { event, data, .. } => {
                    if event == APPROVAL_RESOLVED {
                        let data: Option<ApprovalResolved> = serde_json::from_str::<Event>(&data)
                            .ok()
                            .and_then(|e| e.payload_as());
                        // As `resolution` reads it (`self` is borrowed by the follower).
                        if let Some(d) = data.filter(|d| d.request_id == request_id) {
                            return Ok(resolved_step(&d));
                        }
                    }
                }
                WsItem::Done { .. } => return Ok(Step::RunEnded),
                // The follower waits its backoff itself on the next call; the card is
                // looked at in between (the safety net after every reconnect).
                WsItem::Reconnecting { .. } => return Ok(Step::Again(Duration::ZERO)),
            }
        }
    }

    /// One live-stream response from `after`.
    async fn stream_once(&mut self, give_up_at: Instant) -> Result<Step, Error> {
        let http = self.run.client().http();
        let config = self.run.client().config();
        let request =
            http.stream_request(self.run.endpoint(&["stream"]), self.run.token(), self.after)?;
        let opened = tokio::time::timeout(config.request_timeout, request.send()).await;
        let mut resp = match opened {
            Err(_) => {
                return Ok(Step::Failed {
                    error: Error::Transport("opening the live stream timed out".into()),
                    retry_after: None,
                })
            }
            Ok(Err(e)) => {
                return Ok(Step::Failed {
                    error: Error::Transport(describe(e)),
                    retry_after: None,
                })
            }
            Ok(Ok(resp)) => resp,
        };
        let status = resp.status().as_u16();
        if status != 200 {
            if matches!(status, 404 | 405) {
                return Ok(Step::Fallback);
            }
            let answer = read(resp).await.map_err(|lost| lost.into_error())?;
            let error = Error::from_answer(status, &answer.body, answer.retry_after);
            return if error.is_transient() {
                Ok(Step::Failed {
                    error,
                    retry_after: answer.retry_after,
                })
            } else {
                Err(error)
            };
        }
        if !is_event_stream(&resp) {
            return Ok(Step::Fallback);
        }
        let mut parser = SseParser::new();
        loop {
            if parser.overflowed() {
                // A line or frame over its cap: the response is broken; resume.
                return Ok(Step::Failed {
                    error: Error::Transport(format!(
                        "the live stream broke (a line over {} MiB)",
                        MAX_LINE >> 20
                    )),
                    retry_after: None,
                });
            }
            let left = give_up_at.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(Step::Again(Duration::ZERO));
            }
            let chunk = match tokio::time::timeout(config.stream_stall.min(left), resp.chunk())
                .await
            {
                Err(_) if Instant::now() >= give_up_at => return Ok(Step::Again(Duration::ZERO)),
                Err(_) => {
                    return Ok(Step::Failed {
                        error: Error::Transport(format!(
                            "nothing received on the live stream for {:?}",
                            config.stream_stall
                        )),
                        retry_after: None,
                    })
                }
                Ok(Err(e)) => {
                    return Ok(Step::Failed {
                        error: Error::Transport(describe(e)),
                        retry_after: None,
                    })
                }
                // The end of a window: resume after the server's hint.
                Ok(Ok(None)) => return Ok(Step::Again(self.retry_hint)),
                Ok(Ok(Some(chunk))) => chunk,
            };
            for item in parser.feed(&chunk) {
                let frame = match item {
                    SseItem::Retry(ms) => {
                        self.retry_hint = Duration::from_millis(ms).min(MAX_RECONNECT_DELAY);
                        continue;
                    }
                    SseItem::Frame(frame) => frame,
                };
                if frame.is_done() {
                    return Ok(Step::RunEnded);
                }
                match frame.sequence() {
                    Some(seq) if seq <= self.after => continue, // seen already
                    Some(seq) => self.after = seq,
                    None => {}
                }
                if frame.event == APPROVAL_RESOLVED {
                    let data = serde_json::from_str::<Event>(&frame.data)
                        .ok()
                        .and_then(|e| e.payload_as());
                    if let Some(step) = self.resolution(&frame.event, data) {
                        return Ok(step);
                    }
                }
            }
        }
    }

    /// One polling round: pages from `after` until none has more.
    async fn poll_once(&mut self) -> Result<Step, Error> {
        let poll = self.run.client().config().poll_interval;
        loop {
            let page = match self.run.events(self.after, Some(1000)).await {
                Ok(page) => page,
                Err(e) if e.is_transient() => {
                    let retry_after = match &e {
                        Error::Unavailable { retry_after, .. } => *retry_after,
                        _ => None,
                    };
                    return Ok(Step::Failed {
                        error: e,
                        retry_after,
                    });
                }
                Err(e) => return Err(e),
            };
            for event in &page.events {
                if event.sequence <= self.after {
                    continue;
                }
                self.after = event.sequence;
                // Only a resolution's payload is read (and copied) into its type.
                if event.event_type == APPROVAL_RESOLVED {
                    if let Some(step) = self.resolution(&event.event_type, event.payload_as()) {
                        return Ok(step);
                    }
                }
            }
            self.after = self.after.max(page.next_after);
            if page.terminal {
                return Ok(Step::RunEnded);
            }
            if !page.has_more || page.events.is_empty() {
                return Ok(Step::Again(poll));
            }
        }
    }
}

/// The wait before reconnect attempt `failures` (1, 2, …) after errors: the server's
/// hint doubling, at most 30 s, at least its `Retry-After`.
fn reconnect_delay(hint: Duration, failures: u32, retry_after: Option<Duration>) -> Duration {
    reconnect_backoff(hint, failures, MAX_RECONNECT_DELAY)
        .max(retry_after.unwrap_or_default().min(MAX_RECONNECT_DELAY))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A `tool.approval_resolved` payload as the server writes it.
    fn resolved(request_id: &str, approved: bool, expired: bool) -> ApprovalResolved {
        payload(
            json!({"requestId": request_id, "runId": "run-1", "approved": approved,
               "expired": expired, "decidedBy": "alice", "scope": "tool"}),
        )
    }

    fn payload(v: Value) -> ApprovalResolved {
        serde_json::from_value(v).unwrap()
    }

    /// A card: `fields` over a pending one.
    fn card(fields: Value) -> Card {
        let mut card = json!({"run_id": "r", "request_id": "q", "display_id": "d",
            "tool_name": "t", "tool_call_id": "q", "approval_id": "q", "url": null,
            "intention": null, "message": null, "arguments_hash": null,
            "state": "pending", "scope": null, "decided_by": null, "decided_at": null,
            "created_at": "2026-11-30T11:00:00.000Z", "expires_at": "2026-11-30T12:05:00.000Z",
            "coordinator_run_id": null, "subtask_id": null});
        card.as_object_mut()
            .unwrap()
            .extend(fields.as_object().unwrap().clone());
        serde_json::from_value(card).unwrap()
    }

    #[test]
    fn scopes_are_exact_strings() {
        for s in [Scope::Once, Scope::Run, Scope::Tool, Scope::Always] {
            assert_eq!(Scope::parse(Some(s.as_str())), s);
        }
        for other in ["Tool", "ALWAYS", "", "forever"] {
            assert_eq!(Scope::parse(Some(other)), Scope::Once, "{other}");
        }
        assert_eq!(Scope::parse(None), Scope::Once);
    }

    #[test]
    fn resolved_events_read_as_verdicts() {
        assert_eq!(
            Verdict::from_resolved_event(&resolved("r", true, false)),
            Verdict::Approved {
                scope: Scope::Tool,
                decided_by: Some("alice".into()),
                auto: false
            }
        );
        assert_eq!(
            Verdict::from_resolved_event(&resolved("r", false, false)),
            Verdict::Denied {
                decided_by: Some("alice".into())
            }
        );
        assert_eq!(
            Verdict::from_resolved_event(&payload(
                json!({"requestId": "r", "runId": "run-1", "approved": false, "expired": true})
            )),
            Verdict::Expired
        );
    }

    #[test]
    fn cards_read_as_verdicts_unless_pending() {
        assert_eq!(Verdict::from_card(&card(json!({"state": "pending"}))), None);
        assert_eq!(
            Verdict::from_card(&card(
                json!({"state": "approved", "scope": "once", "decided_by": "bob"})
            )),
            Some(Verdict::Approved {
                scope: Scope::Once,
                decided_by: Some("bob".into()),
                auto: false
            })
        );
        assert_eq!(
            Verdict::from_card(&card(
                json!({"state": "approved", "scope": "tool", "decided_by": "policy:abc",
                       "auto_approved": true, "policy_id": "abc"})
            )),
            Some(Verdict::Approved {
                scope: Scope::Tool,
                decided_by: Some("policy:abc".into()),
                auto: true
            })
        );
        // A name is not a marker: only `auto_approved` says a policy approved it.
        assert_eq!(
            Verdict::from_card(&card(
                json!({"state": "approved", "scope": "once", "decided_by": "policy:evil"})
            )),
            Some(Verdict::Approved {
                scope: Scope::Once,
                decided_by: Some("policy:evil".into()),
                auto: false
            })
        );
        assert_eq!(
            Verdict::from_card(&card(json!({"state": "expired"}))),
            Some(Verdict::Expired)
        );
        assert_eq!(
            Verdict::from_card(&card(json!({"state": "denied", "decided_by": null}))),
            Some(Verdict::Denied { decided_by: None })
        );
    }

    #[test]
    fn reconnects_back_off_and_honour_retry_after() {
        let s = Duration::from_secs;
        assert_eq!(reconnect_delay(s(1), 1, None), s(1));
        assert_eq!(reconnect_delay(s(1), 3, None), s(4));
        assert_eq!(reconnect_delay(s(1), 40, None), MAX_RECONNECT_DELAY);
        assert_eq!(reconnect_delay(s(1), 1, Some(s(5))), s(5));
        assert_eq!(reconnect_delay(s(1), 1, Some(s(500))), MAX_RECONNECT_DELAY);
        assert_eq!(
            reconnect_delay(Duration::ZERO, 1, None),
            Duration::from_millis(100)
        );
    }
}
