//! Cards an AgentHost pod holds and announces itself (seed 003, docs/architecture.md §8).
//!
//! On a pod-per-run run (`execution_mode: "pod"`) the card lives in the pod's memory and
//! the pod runtime puts it on the run's stream: with its run token it appends
//!
//! - `tool.approval_required` `{requestId, toolName, url?, intention?, message?,
//!   toolCallId?, approvalId?, argumentsHash?, timeoutSeconds?}` (`displayId` and other
//!   fields are ignored) — Tollgate records a **pod-held card** in the same transaction
//!   as the event: listed with `held_by: "pod"`, mirrored on a coordinator
//!   (`coordinator.child_approval_required` and its route), counted in its project's open
//!   cards, and the stall guard's reason to wait. No policy is looked up (the pod asks a
//!   human only when its own bridges did not cover the call) and Tollgate sends no
//!   heartbeats for it; its expiry is a backstop, [`pod_expiry_grace`] after the pod's own
//!   timeout (within the deployment's timeout cap), for a pod that dies.
//! - `tool.approval_pending` `{requestId}` — a heartbeat for a card it announced, appended
//!   while the card is pending; one for a card that has ended is **dropped** (nothing is
//!   written; the answer says `dropped` with reason `card_resolved`), as is a second one
//!   in the same half heartbeat interval (time slots counted from the card's recording:
//!   `too_soon`).
//! - `tool.approval_resolved` `{requestId, expired: true}` — the pod's own timeout: the
//!   card expires (one `tool.approval_resolved` on the run, one
//!   `coordinator.child_approval_resolved`); for a card that has ended already it is
//!   dropped. Decisions never come this way: they are posted to the approval routes and
//!   forwarded to the pod.
//!
//! Each such event is appended alone (one per request; a batch mixing it with others is
//! refused, so nothing in a batch is dropped silently); an `event_id` on it is ignored
//! (the card's `requestId` is its key). Inline runs keep refusing these types.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{Map, Value};
use tollgate_app::pod_cards::{pod_expiry_grace, PodCardStep};
use tollgate_app::ArmOutcome;
use tollgate_domain::approval::{
    valid_id, DEFAULT_TIMEOUT_SECONDS, MAX_HASH, MAX_TEXT, MAX_TOOL_NAME, MAX_URL,
};
use tollgate_domain::event::types as ev;
use tollgate_domain::{now_millis, ApprovalRequest, ApprovalState};
use tollgate_protocol::runs::{Appended, Dropped};
use tollgate_store::Armed;

use crate::{ApiError, Deps};
use tollgate_app::ErrorState;

pub use tollgate_app::pod_cards::{is_pod_card_event, POD_CARD_EVENTS};

fn bad(message: impl Into<String>) -> ApiError {
    ApiError::bad_request(message.into())
}

/// A payload text field: absent, or 1 to `max` bytes.
fn text(payload: &Map<String, Value>, key: &str, max: usize) -> Result<Option<String>, ApiError> {
    match payload.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() && s.len() <= max => Ok(Some(s.clone())),
        Some(_) => Err(bad(format!("{key} must be a string of 1 to {max} bytes"))),
    }
}

/// A payload id field: absent, or an id (`[A-Za-z0-9_.:-]`, 1–128).
fn id(payload: &Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    match payload.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if valid_id(s) => Ok(Some(s.clone())),
        Some(_) => Err(bad(format!(
            "{key} must be 1 to 128 characters of A-Z a-z 0-9 _ . : - (not . or ..)"
        ))),
    }
}

fn request_id(payload: &Map<String, Value>) -> Result<String, ApiError> {
    id(payload, "requestId")?.ok_or_else(|| bad("requestId is required"))
}

/// The card a `tool.approval_required` payload announces.
fn announced_card(
    payload: &Map<String, Value>,
    run_id: &str,
    deps: &Deps,
) -> Result<ApprovalRequest, ApiError> {
    let request_id = request_id(payload)?;
    let tool_name =
        text(payload, "toolName", MAX_TOOL_NAME)?.ok_or_else(|| bad("toolName is required"))?;
    let tool_call_id = id(payload, "toolCallId")?;
    let approval_id = id(payload, "approvalId")?;
    let max_timeout = deps.gate.config().max_timeout_seconds;
    let timeout = match payload.get("timeoutSeconds") {
        None | Some(Value::Null) => DEFAULT_TIMEOUT_SECONDS.min(max_timeout),
        Some(v) => v
            .as_u64()
            .filter(|t| (1..=max_timeout).contains(t))
            .ok_or_else(|| {
                bad(format!(
                    "timeoutSeconds must be 1 to {max_timeout} (TOLLGATE_MAX_CARD_TIMEOUT_SECONDS)"
                ))
                .with_state(ErrorState::TimeoutTooLong)
            })?,
    };
    let now = now_millis();
    // The backstop: the pod's timeout and a grace, within the deployment's cap.
    let backstop = ((timeout * 1000) as i64 + pod_expiry_grace(&deps.gate).as_millis() as i64)
        .min((max_timeout * 1000) as i64);
    Ok(ApprovalRequest {
        run_id: run_id.to_owned(),
        explicit_ids: tool_call_id.is_some() || approval_id.is_some(),
        tool_call_id: tool_call_id.unwrap_or_else(|| request_id.clone()),
        approval_id: approval_id.unwrap_or_else(|| request_id.clone()),
        request_id,
        tool_name,
        url: text(payload, "url", MAX_URL)?,
        intention: text(payload, "intention", MAX_TEXT)?,
        message: text(payload, "message", MAX_TEXT)?,
        arguments_hash: text(payload, "argumentsHash", MAX_HASH)?,
        state: ApprovalState::Pending,
        scope: None,
        decided_by: None,
        decided_at: None,
        created_at: now,
        expires_at: now + backstop,
        coordinator_run_id: None,
        subtask_id: None,
        project_id: None,
        end_reason: None,
        auto_approval: None,
        arguments_preview: None,
        decision_reason: None,
        held_by_pod: true,
    })
}

fn dropped(
    run_id: &str,
    event_type: &str,
    request_id: &str,
    reason: &str,
    state: ApprovalState,
) -> Response {
    Json(Appended {
        request_id: Some(request_id.into()),
        state: Some(state.as_str().into()),
        dropped: Some(vec![Dropped {
            index: 0,
            event_type: event_type.into(),
            reason: reason.into(),
        }]),
        ..Appended::sequences(run_id, Vec::new())
    })
    .into_response()
}

fn unknown() -> ApiError {
    ApiError::not_found("no card this run's pod announced has that requestId")
        .with_state(ErrorState::Unknown)
}

/// Appends one of [`POD_CARD_EVENTS`] (`event`, alone in its request) to a run, which the
/// caller authenticated with its run token of `incarnation`.
pub async fn append(
    deps: &Deps,
    run_id: &str,
    incarnation: &str,
    event: Value,
) -> Result<Response, ApiError> {
    let Value::Object(mut payload) = event else {
        return Err(bad("events[0]: an event must be a JSON object"));
    };
    let event_type = match payload.shift_remove("type") {
        Some(Value::String(t)) => t,
        _ => return Err(bad("events[0]: type is required")),
    };
    payload.shift_remove("event_id");
    let head = deps.runs.own_head(run_id, incarnation).await?;
    if !head.is_pod() {
        return Err(bad(format!(
            "events[0]: {event_type} is written by the server; only an execution_mode pod run's pod appends it, for the cards it holds"
        )));
    }
    match event_type.as_str() {
        ev::APPROVAL_REQUIRED => {
            let card =
                announced_card(&payload, run_id, deps).map_err(|e| e.prefixed("events[0]: "))?;
            let asked = card.clone();
            // In a task of its own, as an arm: a client hanging up cannot cut the card
            // off from its backstop timer.
            let (gate, owned_head, incarnation) =
                (deps.gate.clone(), head.clone(), incarnation.to_owned());
            let outcome = tokio::spawn(async move {
                gate.announce_pod_card(&owned_head, &incarnation, card)
                    .await
            })
            .await
            .map_err(|e| {
                tracing::error!(error = %e, "pod card task failed");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the card could not be recorded; retry",
                )
            })??;
            match outcome {
                ArmOutcome::Card(Armed::Created { card, sequence }) => {
                    tracing::info!(request_id = %card.request_id, "pod card recorded");
                    Ok(Json(Appended {
                        request_id: Some(card.request_id.clone()),
                        state: Some(card.state.as_str().into()),
                        held_by: Some("pod".into()),
                        expires_at: Some(tollgate_domain::format_timestamp(card.expires_at)),
                        ..Appended::sequences(run_id, vec![sequence])
                    })
                    .into_response())
                }
                // Ended already (a decision forwarded before the announcement arrived, or
                // the id reused after a pod restart): nothing more is written for it.
                ArmOutcome::Card(Armed::Existing(card)) | ArmOutcome::OtherCall(card)
                    if card.held_by_pod && card.state != ApprovalState::Pending =>
                {
                    Ok(dropped(
                        run_id,
                        &event_type,
                        &card.request_id,
                        "card_resolved",
                        card.state,
                    ))
                }
                ArmOutcome::Card(Armed::Existing(card)) if card.same_call_as(&asked) => {
                    Ok(dropped(
                        run_id,
                        &event_type,
                        &card.request_id,
                        "already_announced",
                        card.state,
                    ))
                }
                ArmOutcome::Card(Armed::Existing(_)) | ArmOutcome::OtherCall(_) => {
                    Err(ApiError::new(
                        StatusCode::CONFLICT,
                        "requestId is taken by a card for another call; use a new requestId",
                    )
                    .with_state(ErrorState::RequestIdInUse))
                }
                // Not looked up for pod cards; should a store answer it, it is no pod card.
                ArmOutcome::AutoApproved { .. } => Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "requestId is taken by an approved card",
                )
                .with_state(ErrorState::RequestIdInUse)),
            }
        }
        ev::APPROVAL_PENDING => {
            let request_id = request_id(&payload).map_err(|e| e.prefixed("events[0]: "))?;
            match deps.gate.pod_heartbeat(run_id, &request_id).await? {
                PodCardStep::Appended(sequence) => {
                    Ok(Json(Appended::sequences(run_id, vec![sequence])).into_response())
                }
                PodCardStep::Dropped { reason, state } => {
                    Ok(dropped(run_id, &event_type, &request_id, reason, state))
                }
                PodCardStep::Ended(_) | PodCardStep::Unknown => Err(unknown()),
            }
        }
        _ => {
            let request_id = request_id(&payload).map_err(|e| e.prefixed("events[0]: "))?;
            if payload.get("expired") != Some(&Value::Bool(true)) {
                return Err(bad(
                    "events[0]: a pod appends tool.approval_resolved only for its own timeout (expired: true); decisions are posted to the approval routes",
                ));
            }
            match deps.gate.pod_expired(run_id, &request_id).await? {
                PodCardStep::Ended(card) => Ok(Json(Appended {
                    request_id: Some(card.request_id.clone()),
                    state: Some(card.state.as_str().into()),
                    resolved: Some(true),
                    ..Appended::sequences(run_id, Vec::new())
                })
                .into_response()),
                PodCardStep::Dropped { reason, state } => {
                    Ok(dropped(run_id, &event_type, &request_id, reason, state))
                }
                PodCardStep::Appended(_) | PodCardStep::Unknown => Err(unknown()),
            }
        }
    }
}
