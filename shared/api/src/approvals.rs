//! The approval gate over HTTP (seed 003, docs/architecture.md §5): agents arm cards and read them
//! back (`ingress`); operators decide and list them (`approvals`). Answers follow the
//! seed's decision matrix exactly: a fresh or later decision is 200 with the real state,
//! an unknown request 404 `state: "unknown"`, a pending card on a run that is not running
//! 409 `state: "pending"`.

use std::time::Duration;

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::Value;
use tollgate_domain::approval::parse_policy_id;
use tollgate_domain::approval::{
    valid_id, DEFAULT_TIMEOUT_SECONDS, MAX_HASH, MAX_TEXT, MAX_TOOL_NAME, MAX_URL,
};
use tollgate_domain::{now_millis, ApprovalRequest, ApprovalState, Resolution, RunHead, Scope};
use tollgate_protocol::approvals::{self as wire, Card, CardPage, Decided, PolicyPage, RunCards};
use tollgate_protocol::limits::MAX_REASON;
use tollgate_store::{Armed, Located, Resolved};

use crate::gate::ArmOutcome;
use tollgate_app::{access, ErrorState};
use tracing::instrument;

use crate::auth::{Claims, Credentials, Role};
use crate::request::{query_param, JsonBody, PathParams, RunId};
use crate::{ApiError, Deps};

/// Routes of the `ingress` function: arm a gate, read a card.
pub fn arm_routes() -> Router<Deps> {
    Router::new()
        .route("/api/runs/{run_id}/approval-requests", post(arm))
        .route(
            "/api/runs/{run_id}/approval-requests/{request_id}",
            get(read_card),
        )
        .route(
            "/api/runs/{run_id}/approval-requests/{request_id}/withdraw",
            post(withdraw_card),
        )
}

/// Routes of the `approvals` function: decisions and the operator's listings.
pub fn decision_routes() -> Router<Deps> {
    Router::new()
        .route("/api/runs/{run_id}/tool-approvals", post(approve))
        .route("/api/runs/{run_id}/tool-denials", post(deny))
        .route("/api/runs/{run_id}/approvals", get(run_approvals))
        .route("/api/approvals", get(all_approvals))
        .route("/api/runs", get(list_runs))
        .route("/api/policies", get(list_policies))
        .route(
            "/api/policies/{policy_id}",
            axum::routing::delete(revoke_policy),
        )
        .merge(crate::slack::routes())
}

fn bounded(field: &str, value: &Option<String>, max: usize) -> Result<(), ApiError> {
    match value {
        Some(v) if v.is_empty() || v.len() > max => Err(ApiError::bad_request(format!(
            "{field} must be 1 to {max} bytes"
        ))),
        _ => Ok(()),
    }
}

/// A decision's `reason`: at most [`MAX_REASON`] characters, no control characters.
fn checked_reason(reason: &Option<String>) -> Result<(), ApiError> {
    let Some(reason) = reason else { return Ok(()) };
    if reason.chars().count() > MAX_REASON {
        return Err(ApiError::bad_request(format!(
            "reason must be at most {MAX_REASON} characters"
        )));
    }
    if reason.chars().any(char::is_control) {
        return Err(ApiError::bad_request(
            "reason must not contain control characters",
        ));
    }
    Ok(())
}

fn checked_id(field: &str, id: &str) -> Result<(), ApiError> {
    if valid_id(id) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "{field} must be 1 to 128 characters of A-Z a-z 0-9 _ . : - (not . or ..)"
        )))
    }
}

#[instrument(skip_all, fields(run_id = %run_id, request_id))]
async fn arm(
    State(deps): State<Deps>,
    run_id: RunId,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let incarnation = deps.auth.require_run_token(&creds, &run_id)?;
    let body: tollgate_protocol::approvals::ArmApproval =
        serde_json::from_value(body.value().await?)
            .map_err(|e| ApiError::bad_request(format!("invalid approval request: {e}")))?;
    checked_id("request_id", &body.request_id)?;
    tracing::Span::current().record("request_id", body.request_id.as_str());
    for (field, id) in [
        ("tool_call_id", &body.tool_call_id),
        ("approval_id", &body.approval_id),
    ] {
        if let Some(id) = id {
            checked_id(field, id)?;
        }
    }
    let tool_name = Some(body.tool_name.clone());
    bounded("tool_name", &tool_name, MAX_TOOL_NAME)?;
    bounded("url", &body.url, MAX_URL)?;
    bounded("intention", &body.intention, MAX_TEXT)?;
    bounded("message", &body.message, MAX_TEXT)?;
    bounded("arguments_hash", &body.arguments_hash, MAX_HASH)?;
    let arguments_preview = body
        .arguments_preview
        .map(crate::preview::sanitize)
        .transpose()?;
    // The deployment's cap (TOLLGATE_MAX_CARD_TIMEOUT_SECONDS, default 24 h) bounds how
    // long any card can hold its timers and a place in its project's count. Beyond it is a
    // 400, not a 429: the same request never succeeds later.
    let max_timeout = deps.gate.config().max_timeout_seconds;
    let timeout = body
        .timeout_seconds
        .unwrap_or(DEFAULT_TIMEOUT_SECONDS.min(max_timeout));
    if !(1..=max_timeout).contains(&timeout) {
        return Err(ApiError::bad_request(format!(
            "timeout_seconds must be 1 to {max_timeout} (TOLLGATE_MAX_CARD_TIMEOUT_SECONDS)"
        ))
        .with_state(ErrorState::TimeoutTooLong));
    }
    let head = deps.runs.own_head(&run_id, &incarnation).await?;
    let now = now_millis();
    let explicit_ids = body.tool_call_id.is_some() || body.approval_id.is_some();
    let card = ApprovalRequest {
        run_id: run_id.to_string(),
        tool_call_id: body.tool_call_id.unwrap_or_else(|| body.request_id.clone()),
        approval_id: body.approval_id.unwrap_or_else(|| body.request_id.clone()),
        request_id: body.request_id,
        tool_name: body.tool_name,
        explicit_ids,
        url: body.url,
        intention: body.intention,
        message: body.message,
        arguments_hash: body.arguments_hash,
        arguments_preview,
        state: ApprovalState::Pending,
        scope: None,
        decided_by: None,
        decision_reason: None,
        decided_at: None,
        created_at: now,
        expires_at: now + (timeout as i64) * 1000,
        coordinator_run_id: None,
        subtask_id: None,
        project_id: None,
        end_reason: None,
        auto_approval: None,
        held_by_pod: false,
    };
    // A gate a live policy covered: `tool.auto_approved` on the stream and its card stored
    // `approved`. The first answer and a retry's (from the stored card) are the same.
    let auto_approved = |scope: Option<Scope>, policy_id: &str, sequence: u64| {
        Json(wire::Armed {
            run_id: head.run_id.clone(),
            request_id: card.request_id.clone(),
            display_id: card.display_id().into(),
            state: ApprovalState::Approved.as_str().into(),
            expires_at: None,
            sequence: Some(sequence),
            auto_approved: Some(true),
            scope: scope.map(|s| s.as_str().into()),
            policy_id: Some(policy_id.into()),
        })
        .into_response()
    };
    // Armed in a task of its own: a client that hangs up after the card is committed
    // cannot cut its timers off (the handler's future would be dropped between the
    // commit and the send, leaving a card whose mark says its timers were sent).
    let armed = {
        let (gate, head, incarnation, card) = (
            deps.gate.clone(),
            head.clone(),
            incarnation.clone(),
            card.clone(),
        );
        tokio::spawn(async move { gate.arm(&head, &incarnation, card).await })
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "arming task failed");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the card could not be armed; retry",
                )
            })??
    };
    let (status, card, sequence) = match armed {
        ArmOutcome::Card(Armed::Created { card, sequence }) => {
            (StatusCode::CREATED, card, Some(sequence))
        }
        // A retried arm: the card as it stands (it may have been decided meanwhile) — the
        // first answer again when a policy approved it, even if revoked since.
        ArmOutcome::OtherCall(_) => return Err(request_id_in_use()),
        // (Another arm of the same id may have won a race: the same check.)
        ArmOutcome::Card(Armed::Existing(existing)) if !existing.same_call_as(&card) => {
            return Err(request_id_in_use())
        }
        ArmOutcome::Card(Armed::Existing(existing)) => match &existing.auto_approval {
            Some(auto) => {
                return Ok(auto_approved(
                    existing.scope,
                    &auto.policy_id,
                    auto.sequence,
                ))
            }
            None => (StatusCode::OK, existing, None),
        },
        ArmOutcome::AutoApproved { sequence, policy } => {
            return Ok(auto_approved(Some(policy.scope), &policy.id(), sequence))
        }
    };
    let answer = wire::Armed {
        run_id: card.run_id.clone(),
        request_id: card.request_id.clone(),
        display_id: card.display_id().into(),
        state: card.state.as_str().into(),
        expires_at: Some(tollgate_domain::format_timestamp(card.expires_at)),
        sequence,
        auto_approved: None,
        scope: None,
        policy_id: None,
    };
    Ok((status, Json(answer)).into_response())
}

/// 409 for an arm whose `request_id` names a card for another call.
fn request_id_in_use() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "request_id is taken by a card for another call (tool, ids, arguments, url or text differ); use a new request_id",
    )
    .with_state(ErrorState::RequestIdInUse)
}

#[instrument(skip_all, fields(run_id = %run_id, request_id = %request_id))]
async fn read_card(
    State(deps): State<Deps>,
    run_id: RunId,
    PathParams((_, request_id)): PathParams<(String, String)>,
    creds: Credentials,
) -> Result<Response, ApiError> {
    let incarnation = deps.auth.require_run_token(&creds, &run_id)?;
    let head = deps.runs.own_head(&run_id, &incarnation).await?;
    match deps.gate.card(&head.run_id, &request_id).await? {
        Some(card) => Ok(Json(crate::wire::card(&card)).into_response()),
        None => {
            Err(ApiError::not_found("no such approval request").with_state(ErrorState::Unknown))
        }
    }
}

/// The agent withdraws a card it armed and no longer needs (its caller cancelled the
/// call): 200 with the card as it ends (`expired`, `end_reason: "withdrawn"`, announced on
/// the stream), or as it stands when it had already ended; 404 `unknown` for no such
/// card; 409 for a card the run's pod holds (the pod ends its own cards).
#[instrument(skip_all, fields(run_id = %run_id, request_id))]
async fn withdraw_card(
    State(deps): State<Deps>,
    run_id: RunId,
    PathParams((_, request_id)): PathParams<(String, String)>,
    creds: Credentials,
) -> Result<Response, ApiError> {
    let incarnation = deps.auth.require_run_token(&creds, &run_id)?;
    checked_id("request_id", &request_id)?;
    tracing::Span::current().record("request_id", request_id.as_str());
    let head = deps.runs.own_head(&run_id, &incarnation).await?;
    let unknown =
        || ApiError::not_found("no such approval request").with_state(ErrorState::Unknown);
    let card = deps
        .gate
        .card(&head.run_id, &request_id)
        .await?
        .ok_or_else(unknown)?;
    if card.held_by_pod {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "the run's pod holds this card; the pod ends it",
        )
        .with_state(ErrorState::Pending));
    }
    let card = match deps.gate.withdraw(&head.run_id, &request_id).await? {
        Some(Resolved::Fresh(card) | Resolved::Already(card)) => card,
        None => return Err(unknown()),
    };
    Ok(Json(crate::wire::card(&card)).into_response())
}

/// Which decision an operator makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verb {
    Approve,
    Deny,
}

async fn approve(
    State(deps): State<Deps>,
    run_id: Result<RunId, ApiError>,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    decide(deps, run_id, creds, body, Verb::Approve).await
}

async fn deny(
    State(deps): State<Deps>,
    run_id: Result<RunId, ApiError>,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    decide(deps, run_id, creds, body, Verb::Deny).await
}

fn unknown() -> ApiError {
    ApiError::not_found("no such approval request").with_state(ErrorState::Unknown)
}

/// An operator token with a `project_id` sees and decides only that project's runs.
fn in_project(claims: &Claims, project_id: &Option<String>) -> bool {
    access::in_project(claims.project_id.as_deref(), project_id.as_deref())
}

async fn decide(
    deps: Deps,
    run_id: Result<RunId, ApiError>,
    creds: Credentials,
    body: JsonBody,
    verb: Verb,
) -> Result<Response, ApiError> {
    let claims = deps.auth.require_role(&creds, Role::Operator)?;
    let body: tollgate_protocol::approvals::Decide = serde_json::from_value(body.value().await?)
        .map_err(|e| ApiError::bad_request(format!("invalid decision: {e}")))?;
    let decided = decide_as(deps, claims, run_id, body, verb, None).await?;
    Ok(Json(decided.answer).into_response())
}

/// The operator decision use-case behind `POST /api/runs/{run_id}/tool-approvals` and
/// `…/tool-denials`, for an operator already identified as `claims` (its `sub` decides,
/// its `project_id` bounds what it reaches): the HTTP routes call it with a verified
/// operator token, the Slack interactivity endpoint with the operator its Slack user is
/// mapped to (docs/architecture.md §6). Answers what the HTTP routes answer, and
/// whether this call is the one that resolved the card. Each call to a run's pod may
/// take the configured forward timeout, so what a pod answers is recorded; `forwarding`
/// is told when the decision goes to the pod (a Slack click that must be answered sooner
/// then lets its decision go on in a task, §11).
#[instrument(skip_all, fields(run_id, request_id, verb = ?verb))]
pub(crate) async fn decide_as(
    deps: Deps,
    claims: Claims,
    run_id: Result<RunId, ApiError>,
    body: tollgate_protocol::approvals::Decide,
    verb: Verb,
    forwarding: Option<tokio::sync::oneshot::Sender<()>>,
) -> Result<Decision, ApiError> {
    tracing::Span::current().record("request_id", body.request_id.as_str());
    checked_reason(&body.reason)?;
    // A run id or request id the store keys nothing by names no card.
    let (Ok(run_id), true) = (run_id, valid_id(&body.request_id)) else {
        return Err(unknown());
    };
    tracing::Span::current().record("run_id", run_id.as_str());
    // One read (the card with the heads the decision writes), then one write.
    let located = match deps.gate.locate(&run_id, &body.request_id).await? {
        Some(l) if in_project(&claims, &l.card.project_id) => l,
        Some(_) => return Err(unknown()),
        // Unknown to the durable gate: a pod-per-run run's pod may hold it. Forwarded and
        // recorded in a task of its own, so a client that hangs up cannot cut the two
        // apart (the pod applied it, the resolved event must follow).
        None => {
            let permit = forward_permit(&deps)?;
            told_forwarding(forwarding);
            let (deps, claims) = (deps.clone(), claims.clone());
            return tokio::spawn(async move {
                let _permit = permit;
                forward_decision(&deps, &claims, &run_id, &body, verb).await
            })
            .await
            .map_err(forward_task_failed)?
            .map(Decision::forwarded);
        }
    };
    // A refusal judged on a card this process remembers is judged again on the stored
    // card: the remembered one may have been decided (or replaced) elsewhere meanwhile,
    // and the answer is a fresh read's (docs/architecture.md §6).
    let (located, resolution) = match judge(&deps, &claims, &located, &body, verb) {
        Ok(resolution) => (located, resolution),
        Err(_) => match deps.gate.locate_fresh(&run_id, &body.request_id).await? {
            Some(l) if in_project(&claims, &l.card.project_id) => {
                let resolution = judge(&deps, &claims, &l, &body, verb)?;
                (l, resolution)
            }
            _ => return Err(unknown()),
        },
    };
    let card = &located.card;
    // A pending card its run's pod holds: the pod decides, the card records what it did
    // (in a task of its own, like any forward).
    if card.held_by_pod && card.state == ApprovalState::Pending {
        let permit = forward_permit(&deps)?;
        told_forwarding(forwarding);
        return tokio::spawn(async move {
            let _permit = permit;
            decide_pod_card(&deps, located, resolution).await
        })
        .await
        .map_err(forward_task_failed)?
        .map(Decision::forwarded);
    }
    Ok(match deps.gate.resolve(located, resolution).await? {
        Resolved::Fresh(card) => Decision {
            answer: decision_answer(&card, verb),
            fresh: Some(true),
        },
        Resolved::Already(card) => Decision {
            answer: decision_answer(&card, verb),
            fresh: Some(false),
        },
    })
}

/// Tells a caller of [`decide_as`] that the run's pod decides this one (what may take up
/// to the forward timeout).
fn told_forwarding(forwarding: Option<tokio::sync::oneshot::Sender<()>>) {
    if let Some(tx) = forwarding {
        // The caller may have stopped listening; the decision goes on either way.
        let _ = tx.send(());
    }
}

/// What [`decide_as`] answers: the decision routes' answer, and whether this call
/// resolved the card (`None` when the run's pod decided: not known here).
pub(crate) struct Decision {
    pub answer: Decided,
    pub fresh: Option<bool>,
}

impl Decision {
    fn forwarded(answer: Decided) -> Self {
        Self {
            answer,
            fresh: None,
        }
    }
}

/// A place among the decisions this process forwards at once ([`crate::forward::MAX_IN_FLIGHT`]).
fn forward_permit(deps: &Deps) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    deps.forwards.clone().try_acquire_owned().map_err(|_| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many decisions are being forwarded; retry",
        )
        .with_state(ErrorState::AgenthostUnreachable)
    })
}

fn forward_task_failed(e: tokio::task::JoinError) -> ApiError {
    tracing::error!(error = %e, "forwarded decision task failed");
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the decision could not be forwarded; retry",
    )
    .with_state(ErrorState::AgenthostUnreachable)
}

fn agenthost_unreachable(why: &str) -> ApiError {
    tracing::warn!(why, "decision not forwarded to the agent host");
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "the run's agent host is unreachable; retry",
    )
    .with_state(ErrorState::AgenthostUnreachable)
}

/// What a run's pod did with a forwarded decision, checked against what was sent.
enum PodVerdict {
    /// A terminal state: `applied` when this forward ended the card.
    Terminal {
        state: ApprovalState,
        applied: bool,
        scope: Option<Scope>,
        tool_name: Option<String>,
    },
    /// The pod knows no such card.
    Unknown,
}

/// Forwards `verb` (with `scope`, for the card of `tool`, when known) on card
/// `request_id` of `head`'s run to its pod and checks the answer: a pod that says it
/// applied the decision answers with the decision's own state, scope and tool, else it is
/// not an answer (503, nothing written); pod 409 → 409 `pending`; anything but a
/// terminal state or 404 → 503 `agenthost_unreachable`.
async fn ask_pod(
    deps: &Deps,
    head: &RunHead,
    request_id: &str,
    (verb, scope): (Verb, Scope),
    tool: Option<&str>,
    by: &str,
) -> Result<PodVerdict, ApiError> {
    let Some(origin) = head.agenthost_origin.as_deref() else {
        return Err(agenthost_unreachable("the run has no agenthost_origin"));
    };
    let answer = crate::forward::forward(
        origin,
        &deps.auth.pod_credential(&head.run_id, &head.incarnation),
        crate::forward::Decision {
            verb: match verb {
                Verb::Approve => crate::forward::Verb::Approve,
                Verb::Deny => crate::forward::Verb::Deny,
            },
            run_id: &head.run_id,
            request_id,
            scope,
            tool_name: tool,
            decision_id: &deps.auth.pod_decision_id(&[
                &head.run_id,
                request_id,
                match verb {
                    Verb::Approve => "approve",
                    Verb::Deny => "deny",
                },
                scope.as_str(),
                by,
            ]),
        },
        pod_reach(deps),
    )
    .await;
    let (state, applied, pod_scope, tool_name) = match answer {
        crate::forward::PodAnswer::Terminal {
            state,
            applied,
            scope,
            tool_name,
            ..
        } => (state, applied, scope, tool_name),
        crate::forward::PodAnswer::Unknown => return Ok(PodVerdict::Unknown),
        crate::forward::PodAnswer::Pending => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "the agent host holds the request pending but cannot decide it now",
            )
            .with_state(ErrorState::Pending))
        }
        crate::forward::PodAnswer::Unreachable(why) => return Err(agenthost_unreachable(&why)),
    };
    let expected = match verb {
        Verb::Approve => ApprovalState::Approved,
        Verb::Deny => ApprovalState::Denied,
    };
    if applied && state != expected {
        return Err(agenthost_unreachable(
            "the pod applied another decision than the one sent",
        ));
    }
    if applied && verb == Verb::Approve && pod_scope.is_some_and(|s| s != scope) {
        return Err(agenthost_unreachable(
            "the pod applied another scope than the one sent",
        ));
    }
    // The pod's tool name, when it is one; a decision sent for a tool is applied to it.
    let tool_name = tool_name.filter(|t| !t.is_empty() && t.chars().count() <= MAX_TOOL_NAME);
    if applied && tool.is_some() && tool_name.as_deref().is_some_and(|t| Some(t) != tool) {
        return Err(agenthost_unreachable(
            "the pod applied the decision to a card for another tool",
        ));
    }
    Ok(PodVerdict::Terminal {
        state,
        applied,
        scope: pod_scope,
        tool_name,
    })
}

fn pod_reach(deps: &Deps) -> crate::forward::Reach {
    crate::forward::Reach {
        timeout: deps.gate.config().forward_timeout,
        allow_loopback: deps.gate.config().allow_loopback_origins,
    }
}

/// The card as the forward that applied an approval recorded it: when two decisions
/// race to the pod, the one it did not apply waits (briefly, bounded) for the other's
/// record and answers from it. `None`: nothing recorded it in that time.
async fn recorded_by_the_applying_forward(
    deps: &Deps,
    run_id: &str,
    request_id: &str,
) -> Result<Option<ApprovalRequest>, ApiError> {
    let wait = deps
        .gate
        .config()
        .forward_timeout
        .min(Duration::from_secs(2));
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        if let Some(l) = deps.gate.locate(run_id, request_id).await? {
            if l.card.state != ApprovalState::Pending {
                return Ok(Some(l.card));
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Who decided, for a card a pod reports ended by something other than this forward:
/// the pod's word about who decided is not evidence.
const DECIDED_IN_POD: &str = "agenthost";

/// A decision on a pending card the run's pod announced (docs/architecture.md §8): the
/// decision is forwarded to the pod with the card's tool, and the card records what the
/// pod did — what this forward applied (with its policy, when scoped), or the pod's
/// earlier end (no policy). A pod that no longer knows the card ends it `expired`
/// (nothing can approve it any more). On a run that has ended, or when the card's
/// backstop is too near for a forward to finish before it, nothing is forwarded and the
/// card ends as that says.
async fn decide_pod_card(
    deps: &Deps,
    located: Located,
    resolution: Resolution,
) -> Result<Decided, ApiError> {
    let verb = match resolution {
        Resolution::Denied { .. } => Verb::Deny,
        _ => Verb::Approve,
    };
    let card = located.card.clone();
    let (scope, by) = match &resolution {
        Resolution::Approved { scope, by, .. } => (*scope, by.clone()),
        Resolution::Denied { by, .. } => (Scope::Once, by.clone()),
        // Decisions only come here.
        _ => return Err(unknown()),
    };
    let head = located
        .head
        .clone()
        .filter(|h| h.run_id == card.run_id && !h.status.is_terminal());
    let backstop_due =
        now_millis() + deps.gate.config().forward_timeout.as_millis() as i64 >= card.expires_at;
    match head {
        Some(head) if !backstop_due => {
            let verdict = ask_pod(
                deps,
                &head,
                &card.request_id,
                (verb, scope),
                Some(&card.tool_name),
                &by,
            )
            .await?;
            record_verdict(deps, located, verdict, resolution, verb).await
        }
        // The run has ended (the store ends the card `run_ended`) or the backstop is due.
        _ => {
            let ended = deps
                .gate
                .resolve_without_grant(located, Resolution::Expired)
                .await?;
            let (Resolved::Fresh(card) | Resolved::Already(card)) = ended;
            Ok(decision_answer(&card, verb))
        }
    }
}

/// Records on a stored pod-held card what its pod did with a decision forwarded to it:
/// - applied → the decision (`resolution`, with its scope's policy) — should the card
///   have ended otherwise meanwhile (its run ended, the pod's expiry came first), the
///   answer says so and adds `pod_applied: true`;
/// - the pod had denied or expired it before → that, attributed to nobody, no policy;
/// - the pod had **approved** it before, but not by this forward → nothing is written and
///   the answer is 409 `pending`: an approval is recorded only from the forward that
///   applied it (sent again, it answers `applied` again), never on the pod's word alone;
/// - the pod knows no such card → `expired` (nothing can approve it any more).
async fn record_verdict(
    deps: &Deps,
    located: Located,
    verdict: PodVerdict,
    resolution: Resolution,
    verb: Verb,
) -> Result<Decided, ApiError> {
    let asked = resolution.state();
    let (ended, applied) = match verdict {
        PodVerdict::Terminal { applied: true, .. } => {
            (deps.gate.resolve(located, resolution).await?, true)
        }
        PodVerdict::Terminal {
            state: ApprovalState::Approved,
            ..
        } => {
            let card = &located.card;
            if let Some(card) =
                recorded_by_the_applying_forward(deps, &card.run_id, &card.request_id).await?
            {
                return Ok(decision_answer(&card, verb));
            }
            // The pod's earlier decision won (a late or repeated forward): its terminal
            // state, attributed to nobody, with no policy (a standing grant comes only
            // from the forward that applied an approval).
            let earlier = Resolution::Approved {
                scope: Scope::Once,
                by: DECIDED_IN_POD.into(),
                reason: None,
            };
            (
                deps.gate.resolve_without_grant(located, earlier).await?,
                false,
            )
        }
        PodVerdict::Terminal {
            state: ApprovalState::Denied,
            ..
        } => {
            let earlier = Resolution::Denied {
                by: DECIDED_IN_POD.into(),
                reason: None,
            };
            (
                deps.gate.resolve_without_grant(located, earlier).await?,
                false,
            )
        }
        PodVerdict::Terminal { .. } | PodVerdict::Unknown => (
            deps.gate
                .resolve_without_grant(located, Resolution::Expired)
                .await?,
            false,
        ),
    };
    let (Resolved::Fresh(card) | Resolved::Already(card)) = ended;
    let mut answer = decision_answer(&card, verb);
    if applied && card.state != asked {
        tracing::warn!(
            request_id = %card.request_id,
            state = card.state.as_str(),
            "the pod applied a decision on a card that had ended otherwise meanwhile"
        );
        answer.pod_applied = Some(true);
    }
    Ok(answer)
}

/// A decision on a card the durable gate does not know, for a pod-per-run run: forwarded
/// to the run's AgentHost pod (docs/architecture.md §8). Its terminal answer is 200 and one
/// `tool.approval_resolved` on the run (however often the decision is forwarded); a
/// scoped policy is written with it only when this forward applied an approval; pod
/// 404 → 404 `unknown`, pod 409 → 409 `pending`, anything else 503
/// `agenthost_unreachable` (retryable while the run and its pod are active). A scope
/// beyond `once` needs the card's tool, which Tollgate reads from the pod's
/// server-captured context (`GET {origin}/tool-approvals/{requestId}`): without it, only
/// `once` can be decided.
async fn forward_decision(
    deps: &Deps,
    claims: &Claims,
    run_id: &str,
    body: &tollgate_protocol::approvals::Decide,
    verb: Verb,
) -> Result<Decided, ApiError> {
    let head = deps
        .runs
        .head_in_project(run_id, claims.project_id.as_deref())
        .await?
        .filter(RunHead::is_pod)
        .ok_or_else(unknown)?;
    if head.status.is_terminal() {
        return Err(ApiError::new(StatusCode::CONFLICT, "Run is not active.")
            .with_state(ErrorState::Pending));
    }
    let scope = match verb {
        Verb::Approve => Scope::parse(body.scope.as_ref().and_then(Value::as_str)),
        Verb::Deny => Scope::Once,
    };
    access::owners_scope(scope, head.owner.as_deref(), &claims.sub)?;
    bounded("tool_name", &body.tool_name, MAX_TOOL_NAME)?;
    // The tool a scoped grant is for: the card's, as its pod captured it — never one the
    // operator or the pod's decision answer merely names.
    let asked_tool = match scope {
        Scope::Once => body.tool_name.clone(),
        // A standing grant on a card Tollgate never saw is for the tool the operator names,
        // and only when the pod's own context agrees: the pod is an origin the agent named,
        // so its word alone never chooses what later calls are approved without a human.
        _ if body.tool_name.is_none() => {
            return Err(ApiError::bad_request(format!(
                "scope {} on a card Tollgate has not seen needs tool_name: the tool the grant is for, as the card shows it",
                scope.as_str()
            ))
            )
        }
        _ => {
            let Some(origin) = head.agenthost_origin.as_deref() else {
                return Err(agenthost_unreachable("the run has no agenthost_origin"));
            };
            let context = crate::forward::card_context(
                origin,
                &deps.auth.pod_credential(&head.run_id, &head.incarnation),
                &head.run_id,
                &body.request_id,
                pod_reach(deps),
            )
            .await;
            let tool = match context {
                crate::forward::CardContext::Known {
                    tool_name: Some(tool),
                } if tool.chars().count() <= MAX_TOOL_NAME => tool,
                crate::forward::CardContext::Known { .. } => {
                    return Err(ApiError::bad_request(format!(
                        "scope {} needs the card's tool and its agent host does not name it; only once can be decided",
                        scope.as_str()
                    )))
                }
                crate::forward::CardContext::Unknown => return Err(unknown()),
                crate::forward::CardContext::Unreachable(why) => {
                    return Err(agenthost_unreachable(&why))
                }
            };
            if body.tool_name.as_ref().is_some_and(|t| *t != tool) {
                return Err(ApiError::bad_request(format!(
                    "tool_name does not match the card (it is for {tool})"
                )));
            }
            access::eligible_scope(scope, &tool, &deps.gate.config().always_eligible)?;
            Some(tool)
        }
    };
    let verdict = ask_pod(
        deps,
        &head,
        &body.request_id,
        (verb, scope),
        asked_tool.as_deref(),
        &claims.sub,
    )
    .await?;
    let PodVerdict::Terminal {
        state,
        applied,
        scope: pod_scope,
        tool_name,
    } = verdict
    else {
        return Err(unknown());
    };
    // An approval this forward did not apply (the pod's earlier decision won): a card the
    // applying forward recorded meanwhile answers as it stands; otherwise the pod's
    // terminal state is recorded as it is — approved, by nobody Tollgate knows, with no
    // policy (only the forward that applied a scoped approval writes one).
    if state == ApprovalState::Approved && !applied {
        if let Some(card) =
            recorded_by_the_applying_forward(deps, &head.run_id, &body.request_id).await?
        {
            return Ok(decision_answer(&card, verb));
        }
    }
    let now = tollgate_domain::now_millis();
    let card = ApprovalRequest {
        run_id: head.run_id.clone(),
        tool_call_id: body.request_id.clone(),
        approval_id: body.request_id.clone(),
        request_id: body.request_id.clone(),
        tool_name: asked_tool
            .clone()
            .or_else(|| tool_name.clone())
            .unwrap_or_default(),
        explicit_ids: false,
        url: None,
        intention: None,
        message: None,
        arguments_hash: None,
        state,
        // What this forward applied is what the operator asked; an earlier denial or
        // expiry is attributed to nobody (the pod's word about who decided is not
        // evidence).
        scope: (state == ApprovalState::Approved).then_some(if applied {
            scope
        } else {
            Scope::Once
        }),
        decided_by: applied.then(|| claims.sub.clone()),
        decided_at: Some(now),
        created_at: now,
        expires_at: now,
        coordinator_run_id: None,
        subtask_id: head.subtask_id.clone(),
        project_id: head.project_id.clone(),
        end_reason: None,
        auto_approval: None,
        arguments_preview: None,
        decision_reason: applied.then(|| body.reason.clone()).flatten(),
        held_by_pod: false,
    };
    // The durable policy, only for the forward that applied this approval with the scope
    // asked for, for the card's own tool (which the pod, when it names one, confirmed).
    let grant = match (&asked_tool, state, applied) {
        (Some(_), ApprovalState::Approved, true) if scope != Scope::Once => {
            Some((scope, claims.sub.as_str()))
        }
        _ => None,
    };
    let recorded = deps
        .gate
        .record_forwarded_decision(&head, &card, grant)
        .await?;
    if recorded == tollgate_store::Forwarded::CardExists {
        // Its pod announced the card while the decision was on its way: the decision is
        // recorded on that card, as for any announced card.
        let located = deps
            .gate
            .locate(&head.run_id, &body.request_id)
            .await?
            .ok_or_else(unknown)?;
        let resolution = match verb {
            Verb::Approve => Resolution::Approved {
                scope,
                by: claims.sub.clone(),
                reason: body.reason.clone(),
            },
            Verb::Deny => Resolution::Denied {
                by: claims.sub.clone(),
                reason: body.reason.clone(),
            },
        };
        let verdict = PodVerdict::Terminal {
            state,
            applied,
            scope: pod_scope,
            tool_name,
        };
        return record_verdict(deps, located, verdict, resolution, verb).await;
    }
    tracing::info!(
        state = state.as_str(),
        applied,
        recorded = ?recorded,
        "decision forwarded to the agent host"
    );
    Ok(decision_answer(&card, verb))
}

/// What a decision on `located` asks for, or why it is refused (the tool named is not
/// the card's; a scope the caller may not grant on a pending card).
fn judge(
    deps: &Deps,
    claims: &Claims,
    located: &Located,
    body: &tollgate_protocol::approvals::Decide,
    verb: Verb,
) -> Result<Resolution, ApiError> {
    let card = &located.card;
    // (A card recorded from a forwarded `once` decision may not know its tool.)
    if body
        .tool_name
        .as_ref()
        .is_some_and(|t| !card.tool_name.is_empty() && *t != card.tool_name)
    {
        return Err(ApiError::bad_request(format!(
            "tool_name does not match the card (it is for {})",
            card.tool_name
        )));
    }
    Ok(match verb {
        Verb::Deny => Resolution::Denied {
            by: claims.sub.clone(),
            reason: body.reason.clone(),
        },
        Verb::Approve => {
            let scope = Scope::parse(body.scope.as_ref().and_then(Value::as_str));
            if card.state == ApprovalState::Pending && scope != Scope::Once {
                check_scope(deps, claims, located, scope)?;
            }
            Resolution::Approved {
                scope,
                by: claims.sub.clone(),
                reason: body.reason.clone(),
            }
        }
    })
}

/// A scope beyond `once` is the run owner's to grant (the card stays pending otherwise),
/// and `always` only for the always-eligible tools.
fn check_scope(
    deps: &Deps,
    claims: &Claims,
    located: &Located,
    scope: Scope,
) -> Result<(), ApiError> {
    let card = &located.card;
    let owner = located
        .head
        .as_ref()
        .filter(|h| h.run_id == card.run_id)
        .and_then(|h| h.owner.as_deref());
    Ok(access::may_grant(
        scope,
        owner,
        &claims.sub,
        &card.tool_name,
        &deps.gate.config().always_eligible,
    )?)
}

/// Seed 003's answer: `run_id` is the owning (child) run; `approved` on the approval
/// route, `denied` on the denial route, reporting the card's real state.
fn decision_answer(card: &ApprovalRequest, verb: Verb) -> Decided {
    let (approved, denied) = match verb {
        Verb::Approve => (Some(card.state == ApprovalState::Approved), None),
        Verb::Deny => (None, Some(card.state == ApprovalState::Denied)),
    };
    Decided {
        run_id: card.run_id.clone(),
        request_id: card.request_id.clone(),
        approved,
        denied,
        resolved: true,
        state: card.state.as_str().into(),
        expired: card.state == ApprovalState::Expired,
        decided_by: card.decided_by.clone(),
        scope: card.scope.map(|s| s.as_str().into()),
        reason: card.end_reason.clone(),
        decision_reason: card.decision_reason.clone(),
        pod_applied: None,
        grant: grant_made(card),
    }
}

/// The standing grant an approved card's decision made: a scope beyond `once` given by
/// an operator (never by a policy, and never on its agent host's word).
fn grant_made(card: &ApprovalRequest) -> Option<wire::Grant> {
    let scope = card.scope.filter(|s| *s != Scope::Once)?;
    let by_operator = card.decided_by.as_deref().is_some_and(|by| {
        by != DECIDED_IN_POD && !by.starts_with(tollgate_domain::approval::POLICY_DECIDER_PREFIX)
    });
    (card.state == ApprovalState::Approved
        && by_operator
        && card.auto_approval.is_none()
        && !card.tool_name.is_empty())
    .then(|| wire::Grant {
        tool_name: card.tool_name.clone(),
        scope: scope.as_str().into(),
    })
}

fn pending_only(query: Option<&str>) -> Result<(), ApiError> {
    match query_param(query, "state") {
        None | Some("pending") => Ok(()),
        Some(_) => Err(ApiError::bad_request("state must be pending")),
    }
}

#[instrument(skip_all, fields(run_id))]
async fn run_approvals(
    State(deps): State<Deps>,
    run_id: Result<RunId, ApiError>,
    RawQuery(query): RawQuery,
    creds: Credentials,
) -> Result<Response, ApiError> {
    let claims = deps.auth.require_role(&creds, Role::Operator)?;
    pending_only(query.as_deref())?;
    let run_id = run_id?;
    tracing::Span::current().record("run_id", run_id.as_str());
    let head = deps
        .runs
        .head_in_project(&run_id, claims.project_id.as_deref())
        .await?
        .ok_or_else(|| ApiError::not_found("run not found"))?;
    let pending = deps.gate.pending_cards_of(&head.run_id).await?;
    let (approvals, has_more) = cards_within_limit(&pending.cards);
    Ok(Json(RunCards {
        run_id: head.run_id,
        approvals,
        has_more: has_more || pending.capped,
    })
    .into_response())
}

/// The cards as JSON, soonest first, as many as fit in one answer under Lambda's 6 MB
/// response limit (measured as Lambda sends them, escaped); `true` when some were left
/// off (they are still pending: deciding or expiring the first ones makes room).
fn cards_within_limit(cards: &[ApprovalRequest]) -> (Vec<Card>, bool) {
    let mut out = Vec::with_capacity(cards.len());
    let mut size = 0;
    for card in cards {
        let json = crate::wire::card(card);
        let text = serde_json::to_string(&json).unwrap_or_default();
        size += tollgate_store::page::lambda_escaped_len(&text) + 1;
        if size > tollgate_store::page::MAX_RESPONSE_BYTES {
            return (out, true);
        }
        out.push(json);
    }
    (out, false)
}

/// Most cards `GET /api/approvals` answers with.
pub const MAX_OPEN_CARDS: usize = 500;

#[instrument(skip_all)]
async fn all_approvals(
    State(deps): State<Deps>,
    RawQuery(query): RawQuery,
    creds: Credentials,
) -> Result<Response, ApiError> {
    let claims = deps.auth.require_role(&creds, Role::Operator)?;
    pending_only(query.as_deref())?;
    let limit = match query_param(query.as_deref(), "limit") {
        None => MAX_OPEN_CARDS,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_OPEN_CARDS).contains(n))
            .ok_or_else(|| ApiError::bad_request(format!("limit must be 1 to {MAX_OPEN_CARDS}")))?,
    };
    let after = query_param(query.as_deref(), "after")
        .map(|v| {
            tollgate_store::ListingCursor::parse(v)
                .ok_or_else(|| ApiError::bad_request("after must be a next_after of a listing"))
        })
        .transpose()?;
    let cards = deps
        .gate
        .open_cards(claims.project_id.as_deref(), after.as_ref(), limit)
        .await?;
    let (approvals, cut) = cards_within_limit(&cards);
    let has_more = cut || cards.len() >= limit;
    // Where the next page starts: just after the last card answered (soonest deadline
    // first, so cards armed meanwhile with a later deadline are still ahead).
    let next_after = match has_more {
        true => cards
            .get(approvals.len().wrapping_sub(1))
            .map(|last| tollgate_store::ListingCursor::of(last).to_string()),
        false => None,
    };
    Ok(Json(CardPage {
        approvals,
        has_more,
        next_after,
    })
    .into_response())
}

/// Most policies one page of `GET /api/policies` holds (`limit`, also the default).
pub const MAX_POLICIES: usize = 500;
const DEFAULT_POLICIES: usize = MAX_POLICIES;

/// `GET /api/policies?cursor=…&limit=…`: a page of the grants the operator may see and
/// the cursor of the next (`has_more`). A bad `limit` or `cursor` is 400.
#[instrument(skip_all)]
async fn list_policies(
    State(deps): State<Deps>,
    RawQuery(query): RawQuery,
    creds: Credentials,
) -> Result<Response, ApiError> {
    let claims = deps.auth.require_role(&creds, Role::Operator)?;
    let query = query.as_deref();
    let limit = crate::request::limit_param(query, DEFAULT_POLICIES, MAX_POLICIES)?;
    let cursor = crate::request::query_param(query, "cursor");
    let page = deps
        .gate
        .policies(claims.project_id.as_deref(), cursor, limit)
        .await?;
    Ok(Json(PolicyPage {
        policies: page.policies.iter().map(crate::wire::policy).collect(),
        has_more: page.next_cursor.is_some(),
        next_cursor: page.next_cursor,
    })
    .into_response())
}

/// Most runs one page of `GET /api/runs` holds (`limit`).
pub const MAX_RUNS: usize = 200;
const DEFAULT_RUNS: usize = 50;

/// `GET /api/runs?limit=…&after=…&status=…&owner=…&q=…&project_id=…`: a page of one
/// tenant's runs, newest first (docs/architecture.md invariant 9). `status` and `owner`
/// match exactly, `q` is a prefix of the run id; the filters are applied to at most
/// [`tollgate_store::MAX_RUNS_EXAMINED`] runs a page, so a page may be short with
/// `has_more`. A bad parameter or cursor is 400; another project is 403.
#[instrument(skip_all)]
async fn list_runs(
    State(deps): State<Deps>,
    RawQuery(query): RawQuery,
    creds: Credentials,
) -> Result<Response, ApiError> {
    let claims = deps.auth.require_role(&creds, Role::Operator)?;
    let query = query.as_deref();
    let limit = crate::request::limit_param(query, DEFAULT_RUNS, MAX_RUNS)?;
    let status = match crate::request::decoded_param(query, "status") {
        None => None,
        Some(v) => Some(tollgate_domain::RunStatus::parse(&v).ok_or_else(|| {
            ApiError::bad_request("status must be running, completed, failed or cancelled")
        })?),
    };
    let text = |name: &str| -> Result<Option<String>, ApiError> {
        let value = crate::request::decoded_param(query, name);
        bounded(name, &value, tollgate_protocol::limits::MAX_RUN_FILTER)?;
        Ok(value)
    };
    let filter = tollgate_store::RunFilter {
        status,
        owner: text("owner")?,
        run_id_prefix: text("q")?,
    };
    let project = crate::request::project_param(query, "project_id")?;
    let after = crate::request::decoded_param(query, "after");
    let page = deps
        .runs
        .list(
            claims.project_id.as_deref(),
            project.as_deref(),
            &filter,
            after.as_deref(),
            limit,
        )
        .await?;
    Ok(Json(tollgate_protocol::runs::RunList {
        runs: page.runs.iter().map(crate::wire::run_summary).collect(),
        has_more: page.next_cursor.is_some(),
        next_cursor: page.next_cursor,
    })
    .into_response())
}

/// Revokes a grant; the revocation is announced on the running streams it reached.
#[instrument(skip_all)]
async fn revoke_policy(
    State(deps): State<Deps>,
    PathParams(policy_id): PathParams<String>,
    creds: Credentials,
) -> Result<Response, ApiError> {
    let claims = deps.auth.require_role(&creds, Role::Operator)?;
    let not_found = || ApiError::not_found("no such policy");
    let (scope_key, tool_name) = parse_policy_id(&policy_id).ok_or_else(not_found)?;
    // A project operator revokes only its project's grants (others do not exist for it).
    deps.gate
        .visible_policy(&scope_key, &tool_name, claims.project_id.as_deref())
        .await?
        .ok_or_else(not_found)?;
    let revoked = deps
        .gate
        .revoke(&scope_key, &tool_name, &claims.sub)
        .await?
        .ok_or_else(not_found)?;
    Ok(Json(crate::wire::policy(&revoked)).into_response())
}
