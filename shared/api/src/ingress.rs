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
    validate_run_id, NewRun, RunKind, TerminalKind, MAX_BATCH_EVENTS,
};
use tollgate_store::CreateOutcome;
use tracing::instrument;

use crate::auth::{Credentials, Role};
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

fn short_text(field: &str, value: &Option<String>, max: usize) -> Result<(), ApiError> {
    match value {
        Some(v) if v.is_empty() || v.chars().count() > max => Err(ApiError::bad_request(format!(
            "{field} must be 1 to {max} characters"
        ))),
        _ => Ok(()),
    }
}

fn validate_budget(budget: &Value) -> Result<(), ApiError> {
    let bad = || {
        ApiError::bad_request(
            "budget must be {\"tools\": {\"<tool>\": <max starts>}, \"call_ceiling\": <n>}",
        )
    };
    let obj = budget.as_object().ok_or_else(bad)?;
    if obj.keys().any(|k| k != "tools" && k != "call_ceiling") {
        return Err(bad());
    }
    if let Some(tools) = obj.get("tools") {
        let tools = tools.as_object().ok_or_else(bad)?;
        if tools.values().any(|v| v.as_u64().is_none()) {
            return Err(bad());
        }
    }
    if obj
        .get("call_ceiling")
        .is_some_and(|v| v.as_u64().is_none())
    {
        return Err(bad());
    }
    Ok(())
}

#[instrument(skip_all, fields(run_id))]
async fn create_run(
    State(deps): State<Deps>,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let claims = deps.auth.require_role(&creds, Role::Agent)?;
    let body: CreateRunBody = serde_json::from_value(match body.value().await? {
        Value::Null => json!({}),
        other => other,
    })
    .map_err(|e| ApiError::bad_request(format!("invalid run: {e}")))?;

    short_text("delivery_id", &body.delivery_id, 256)?;
    for (field, value) in [
        ("owner", &body.owner),
        ("project_id", &body.project_id),
        ("channel_id", &body.channel_id),
    ] {
        short_text(field, value, 256)?;
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
        (None, Some(delivery)) => delivery_run_id(&claims.sub, delivery),
        (None, None) => format!("run-{}", uuid::Uuid::new_v4().simple()),
    };
    if !validate_run_id(&run_id) {
        return Err(ApiError::bad_request(
            "run_id must be 1 to 128 characters of A-Z a-z 0-9 _ . : -",
        ));
    }
    tracing::Span::current().record("run_id", run_id.as_str());
    let kind = match body.kind.as_deref() {
        None => RunKind::Single,
        Some(k) => RunKind::parse(k)
            .ok_or_else(|| ApiError::bad_request("kind must be single, coordinator or child"))?,
    };
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
            let same_project =
                parent_head.project_id.is_some() && parent_head.project_id == claims.project_id;
            if parent_head.created_by != claims.sub && !same_project {
                return Err(ApiError::forbidden(
                    "a child run joins only a coordinator of the same agent or project",
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
    match body.execution_mode.as_deref() {
        None | Some("inline") => {}
        Some("pod") => {
            let origin = body.agenthost_origin.as_deref().unwrap_or_default();
            if !(origin.starts_with("http://") || origin.starts_with("https://")) {
                return Err(ApiError::bad_request(
                    "execution_mode pod needs an http(s) agenthost_origin",
                ));
            }
        }
        Some(_) => {
            return Err(ApiError::bad_request(
                "execution_mode must be inline or pod",
            ))
        }
    }
    if let Some(budget) = &body.budget {
        validate_budget(budget)?;
    }
    let project_id = match (&claims.project_id, body.project_id) {
        (Some(claimed), Some(asked)) if *claimed != asked => {
            return Err(ApiError::forbidden(
                "project_id differs from the token's project",
            ))
        }
        (claimed, asked) => asked.or_else(|| claimed.clone()),
    };
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
    let receipt = |status: StatusCode| {
        let token = deps.auth.run_token(&run_id);
        (
            status,
            Json(json!({"run_id": run_id, "run_token": token, "sequence": 1})),
        )
            .into_response()
    };
    match deps.store.create_run(new).await? {
        CreateOutcome::Created(_) => {
            tracing::info!("run created");
            Ok(receipt(StatusCode::CREATED))
        }
        // Same creator, same delivery: the receipt of the first create.
        CreateOutcome::Existing(head)
            if body.delivery_id.is_some()
                && head.delivery_id == body.delivery_id
                && head.created_by == claims.sub =>
        {
            Ok(receipt(StatusCode::OK))
        }
        CreateOutcome::Existing(_) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "a run with this run_id already exists",
        )
        .with_state("run_exists")),
    }
}

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
    deps.auth.require_run_token(&creds, &run_id)?;
    let mut body = body.object(false).await?;
    let Some(Value::Array(raw)) = body.remove("events") else {
        return Err(ApiError::bad_request("body must be {\"events\": [ … ]}"));
    };
    if raw.is_empty() || raw.len() > MAX_BATCH_EVENTS {
        return Err(ApiError::bad_request(format!(
            "events must hold 1 to {MAX_BATCH_EVENTS} events, got {}",
            raw.len()
        )));
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
    let sequences = deps.store.append_events(&run_id, drafts).await?;
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
    deps.auth.require_run_token(&creds, &run_id)?;
    let payload: Map<String, Value> = body.object(true).await?;
    validate_payload(&payload).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let finished = deps.store.finish_run(&run_id, kind, payload).await?;
    tracing::info!(
        sequence = finished.sequence,
        repeated = finished.already_finished,
        "run ended"
    );
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
