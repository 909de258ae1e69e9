//! The `ingress` function: create runs, append producer events, end runs.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tollgate_domain::{
    delivery_run_id, event::validate_payload, run::DELIVERY_RUN_PREFIX, validate_producer_event,
    validate_run_id, ExecutionMode, NewRun, RunHead, RunKind, TerminalKind, MAX_BATCH_EVENTS,
};
use tollgate_store::{CreateOutcome, RunRef};
use tracing::instrument;

use crate::auth::{Claims, Credentials, Role};
use crate::request::JsonBody;
use crate::{ApiError, Deps};

pub fn routes() -> Router<Deps> {
    Router::new()
        .route("/api/runs", post(create_run))
        .route("/api/runs/{run_id}/events", post(append_events))
        .route("/api/runs/{run_id}/complete", post(complete_run))
        .route("/api/runs/{run_id}/fail", post(fail_run))
        .route("/api/runs/{run_id}/cancel", post(cancel_run))
}

/// The body of `POST /api/runs`. Unknown fields are refused so typos surface as 400s.
#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct CreateRunBody {
    run_id: Option<String>,
    kind: Option<String>,
    parent_run_id: Option<String>,
    subtask_id: Option<Value>,
    owner: Option<String>,
    project_id: Option<String>,
    channel_id: Option<String>,
    delivery_id: Option<String>,
    budget: Option<Value>,
    execution_mode: Option<String>,
    agenthost_origin: Option<String>,
}

/// Every field stored in the run head is bounded: the head is rewritten by every append,
/// so its size is paid on each one (a 250 KB head would make every append cost ~500 WCU).
const MAX_HEAD_TEXT: usize = 256;
const MAX_ORIGIN: usize = 2048;
const MAX_SUBTASK_ID_BYTES: usize = 256;

fn short_text(field: &str, value: &Option<String>, max: usize) -> Result<(), ApiError> {
    match value {
        Some(v) if v.is_empty() || v.chars().count() > max => Err(ApiError::bad_request(format!(
            "{field} must be 1 to {max} characters"
        ))),
        _ => Ok(()),
    }
}

fn validate_subtask_id(subtask_id: &Value) -> Result<(), ApiError> {
    let fits = match subtask_id {
        Value::String(s) => !s.is_empty() && s.len() <= MAX_SUBTASK_ID_BYTES,
        Value::Number(_) => true,
        _ => false,
    };
    if fits {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "subtask_id must be a number or a string of 1 to {MAX_SUBTASK_ID_BYTES} bytes"
        )))
    }
}

/// The domain's one parser decides what a budget is (the same one admission reads it
/// with, so a budget accepted here is never refused there).
fn validate_budget(budget: &Value) -> Result<(), ApiError> {
    tollgate_domain::execution::Budget::parse(budget)
        .map(|_| ())
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// The run's project is its creator's `project_id` claim: a body naming another (or
/// any, when the token has none) is refused, so a token cannot place runs in a tenant
/// it does not belong to.
fn run_project(claims: &Claims, asked: Option<String>) -> Result<Option<String>, ApiError> {
    match (&claims.project_id, asked) {
        (claimed, Some(asked)) if claimed.as_deref() != Some(asked.as_str()) => Err(
            ApiError::forbidden("project_id must be the token's project_id claim"),
        ),
        (claimed, _) => Ok(claimed.clone()),
    }
}

#[instrument(skip_all, fields(run_id))]
async fn create_run(
    State(deps): State<Deps>,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let claims = deps.auth.require_role(&creds, Role::Agent)?;
    // Claims become head fields too (the creator, the project): bounded like the body's.
    if claims.sub.is_empty()
        || claims.sub.chars().count() > MAX_HEAD_TEXT
        || claims
            .project_id
            .as_ref()
            .is_some_and(|p| p.is_empty() || p.chars().count() > MAX_HEAD_TEXT)
    {
        return Err(ApiError::bad_request(format!(
            "the token's sub and project_id must be 1 to {MAX_HEAD_TEXT} characters"
        )));
    }
    let body: CreateRunBody = serde_json::from_value(match body.value().await? {
        Value::Null => json!({}),
        other => other,
    })
    .map_err(|e| ApiError::bad_request(format!("invalid run: {e}")))?;

    for (field, value) in [
        ("delivery_id", &body.delivery_id),
        ("owner", &body.owner),
        ("project_id", &body.project_id),
        ("channel_id", &body.channel_id),
        ("execution_mode", &body.execution_mode),
    ] {
        short_text(field, value, MAX_HEAD_TEXT)?;
    }
    short_text("agenthost_origin", &body.agenthost_origin, MAX_ORIGIN)?;
    if let Some(subtask_id) = &body.subtask_id {
        validate_subtask_id(subtask_id)?;
    }
    let run_id = match (&body.run_id, &body.delivery_id) {
        // The derived namespace is reserved, so nobody can take another agent's
        // delivery id's run in advance.
        (Some(id), _) if id.starts_with(DELIVERY_RUN_PREFIX) => {
            return Err(ApiError::bad_request(format!(
                "run ids starting with {DELIVERY_RUN_PREFIX:?} are reserved for delivery_id runs"
            )))
        }
        (Some(id), _) => id.clone(),
        (None, Some(delivery)) => {
            delivery_run_id(&claims.sub, claims.project_id.as_deref(), delivery)
        }
        (None, None) => format!("run-{}", uuid::Uuid::new_v4().simple()),
    };
    if !validate_run_id(&run_id) {
        return Err(ApiError::bad_request(RUN_ID_RULE));
    }
    tracing::Span::current().record("run_id", run_id.as_str());
    let kind = match body.kind.as_deref() {
        None => RunKind::Single,
        Some(k) => RunKind::parse(k)
            .ok_or_else(|| ApiError::bad_request("kind must be single, coordinator or child"))?,
    };
    if let Some(parent) = &body.parent_run_id {
        if !validate_run_id(parent) {
            return Err(ApiError::bad_request(format!(
                "parent_run_id: {RUN_ID_RULE}"
            )));
        }
    }
    let mode = match body.execution_mode.as_deref() {
        None => ExecutionMode::Inline,
        Some(given) => ExecutionMode::parse(given)
            .ok_or_else(|| ApiError::bad_request("execution_mode must be inline or pod"))?,
    };
    match mode {
        ExecutionMode::Inline if body.agenthost_origin.is_some() => {
            return Err(ApiError::bad_request(
                "agenthost_origin is for execution_mode pod only",
            ))
        }
        ExecutionMode::Inline => {}
        ExecutionMode::Pod => {
            let origin = body.agenthost_origin.as_deref().ok_or_else(|| {
                ApiError::bad_request("execution_mode pod needs an agenthost_origin")
            })?;
            crate::forward::check_origin(origin, deps.gate.config().allow_loopback_origins)
                .map_err(|e| ApiError::bad_request(e.to_string()))?;
        }
    }
    if let Some(budget) = &body.budget {
        validate_budget(budget)?;
    }
    let project_id = run_project(&claims, body.project_id)?;
    match (kind, &body.parent_run_id) {
        (RunKind::Child, None) => {
            return Err(ApiError::bad_request("a child run needs parent_run_id"))
        }
        (RunKind::Child, Some(parent)) => {
            let parent_head = deps
                .store
                .read_head(parent)
                .await?
                .ok_or_else(|| ApiError::bad_request("parent_run_id names no run"))?;
            if parent_head.kind != RunKind::Coordinator {
                return Err(ApiError::bad_request(
                    "parent_run_id must name a coordinator run",
                ));
            }
            // A child lives in its coordinator's project and joins only a coordinator
            // its own agent principal created: `run` grants reach siblings, so another
            // agent of the project must not be able to place a run among them.
            let joins =
                parent_head.project_id == project_id && parent_head.created_by == claims.sub;
            if !joins {
                return Err(ApiError::forbidden(
                    "a child run joins only a coordinator its own agent created, in its project",
                ));
            }
        }
        (_, Some(_)) => {
            return Err(ApiError::bad_request(
                "only a child run has a parent_run_id",
            ))
        }
        _ => {}
    }
    let new = NewRun {
        run_id: run_id.clone(),
        kind,
        parent_run_id: body.parent_run_id,
        subtask_id: body.subtask_id,
        owner: body.owner,
        project_id,
        channel_id: body.channel_id,
        created_by: claims.sub.clone(),
        delivery_id: body.delivery_id.clone(),
        execution_mode: body.execution_mode,
        agenthost_origin: body.agenthost_origin,
        budget: body.budget,
    };
    let receipt = |status: StatusCode, head: &RunHead| {
        (status, Json(run_receipt(&deps, head))).into_response()
    };
    match deps.store.create_run(new.clone()).await? {
        CreateOutcome::Created(head) => {
            tracing::info!("run created");
            Ok(receipt(StatusCode::CREATED, &head))
        }
        // Same creator, same delivery: the receipt of the first create.
        CreateOutcome::Existing(head)
            if body.delivery_id.is_some()
                && head.delivery_id == body.delivery_id
                && head.created_by == claims.sub
                && head.project_id == claims.project_id =>
        {
            Ok(receipt(StatusCode::OK, &head))
        }
        // The same agent retrying the same create (its first answer was lost): the run
        // it made. Anyone else, or different fields, is a conflict.
        CreateOutcome::Existing(head) if new.matches(&head) => Ok(receipt(StatusCode::OK, &head)),
        CreateOutcome::Existing(_) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "a run with this run_id already exists",
        )
        .with_state("run_exists")),
    }
}

/// What the creating agent gets for a run (at creation and from its receipt): the run's
/// token and, for a pod-per-run run, the credential its AgentHost checks on forwarded
/// decisions.
pub(crate) fn run_receipt(deps: &Deps, head: &RunHead) -> Value {
    let mut receipt = json!({
        "run_id": head.run_id,
        "run_token": deps.auth.run_token(&head.run_id, &head.incarnation),
        "sequence": 1,
    });
    if head.is_pod() {
        receipt["agenthost_credential"] = deps
            .auth
            .pod_credential(&head.run_id, &head.incarnation)
            .into();
    }
    receipt
}

const RUN_ID_RULE: &str =
    "run_id must be 1 to 128 characters of A-Z a-z 0-9 _ . : - (and not . or ..)";

fn checked_run_id(run_id: &str) -> Result<(), ApiError> {
    if validate_run_id(run_id) {
        Ok(())
    } else {
        Err(ApiError::not_found("run not found"))
    }
}

#[instrument(skip_all, fields(run_id = %run_id))]
async fn append_events(
    State(deps): State<Deps>,
    Path(run_id): Path<String>,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    checked_run_id(&run_id)?;
    let incarnation = deps.auth.require_run_token(&creds, &run_id)?;
    let mut body = body.object(false).await?;
    let Some(Value::Array(mut raw)) = body.remove("events") else {
        return Err(ApiError::bad_request("body must be {\"events\": [ … ]}"));
    };
    if raw.is_empty() || raw.len() > MAX_BATCH_EVENTS {
        return Err(ApiError::bad_request(format!(
            "events must hold 1 to {MAX_BATCH_EVENTS} events, got {}",
            raw.len()
        )));
    }
    // A pod's events for the cards it holds are recorded through the gate, one per
    // request (docs/architecture.md §8).
    if let Some(i) = raw
        .iter()
        .position(|e| crate::pod_cards::is_pod_card_event(e.get("type").and_then(Value::as_str)))
    {
        if raw.len() > 1 {
            return Err(ApiError::bad_request(format!(
                "events[{i}]: {} is appended alone (one per request), and only by an execution_mode pod run's pod",
                raw[i]["type"].as_str().unwrap_or_default()
            )));
        }
        return crate::pod_cards::append(&deps, &run_id, &incarnation, raw.remove(0)).await;
    }
    let drafts = raw
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            validate_producer_event(v)
                .map_err(|e| ApiError::bad_request(format!("events[{i}]: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    tollgate_store::check_batch(&drafts).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let sequences = deps
        .store
        .append_events(RunRef::exact(&run_id, &incarnation), drafts)
        .await?;
    Ok(Json(json!({ "run_id": run_id, "sequences": sequences })).into_response())
}

async fn finish(
    deps: Deps,
    run_id: String,
    creds: Credentials,
    body: JsonBody,
    kind: TerminalKind,
) -> Result<Response, ApiError> {
    checked_run_id(&run_id)?;
    let incarnation = deps.auth.require_run_token(&creds, &run_id)?;
    let payload: Map<String, Value> = body.object(true).await?;
    // A terminal call is idempotent by itself; an `event_id` here would read as a
    // producer idempotency key that nothing honours.
    if payload.contains_key("event_id") {
        return Err(ApiError::bad_request(
            "a terminal body has no event_id (complete, fail and cancel are idempotent)",
        ));
    }
    validate_payload(&payload).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let finished = deps
        .store
        .finish_run(RunRef::exact(&run_id, &incarnation), kind, payload)
        .await?;
    tracing::info!(
        sequence = finished.sequence,
        repeated = finished.already_finished,
        "run ended"
    );
    // Its pending cards end with it (on a repeat too: it completes what a crash between
    // the two steps left). The run has ended either way; a card left here cannot be
    // approved, so a failure is logged, not answered.
    if finished.open_cards > 0 {
        if let Err(e) = deps.gate.end_cards_of(&run_id).await {
            tracing::warn!(error = %e, "pending cards of the ended run not all ended");
        }
    }
    Ok(Json(json!({
        "run_id": run_id,
        "status": kind.status().as_str(),
        "sequence": finished.sequence,
    }))
    .into_response())
}

#[instrument(skip_all, fields(run_id = %run_id))]
async fn complete_run(
    State(deps): State<Deps>,
    Path(run_id): Path<String>,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    finish(deps, run_id, creds, body, TerminalKind::Complete).await
}

#[instrument(skip_all, fields(run_id = %run_id))]
async fn fail_run(
    State(deps): State<Deps>,
    Path(run_id): Path<String>,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    finish(deps, run_id, creds, body, TerminalKind::Fail).await
}

#[instrument(skip_all, fields(run_id = %run_id))]
async fn cancel_run(
    State(deps): State<Deps>,
    Path(run_id): Path<String>,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    finish(deps, run_id, creds, body, TerminalKind::Cancel).await
}
