//! The `ingress` function: create runs, append producer events, end runs.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Map, Value};
use tollgate_domain::{RunHead, TerminalKind, MAX_BATCH_EVENTS};
use tollgate_protocol::runs::{Appended, RunEnded, RunReceipt};
use tollgate_store::RunRef;
use tracing::instrument;

use crate::auth::{Credentials, Role};
use crate::request::{JsonBody, RunId};
use crate::{ApiError, Deps};
use tollgate_app::runs;

pub fn routes() -> Router<Deps> {
    Router::new()
        .route("/api/runs", post(create_run))
        .route("/api/runs/{run_id}/events", post(append_events))
        .route("/api/runs/{run_id}/complete", post(complete_run))
        .route("/api/runs/{run_id}/fail", post(fail_run))
        .route("/api/runs/{run_id}/cancel", post(cancel_run))
}

#[instrument(skip_all, fields(run_id))]
async fn create_run(
    State(deps): State<Deps>,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let claims = deps.auth.require_role(&creds, Role::Agent)?;
    let body: tollgate_protocol::runs::CreateRun =
        serde_json::from_value(match body.value().await? {
            Value::Null => json!({}),
            other => other,
        })
        .map_err(|e| ApiError::bad_request(format!("invalid run: {e}")))?;
    // A run names only one of its project's Slack channels, when they are configured
    // (the run's project is its token's).
    if let (Some(channels), Some(channel)) = (&deps.slack_channels, &body.channel_id) {
        let project = claims.project_id.as_deref();
        if !channels.allows(project, channel) {
            return Err(ApiError::bad_request(format!(
                "channel_id {channel:?} is not one of {} Slack channels ({})",
                match project {
                    Some(p) => format!("project {p:?}'s"),
                    None => "the runs without a project's".to_owned(),
                },
                crate::slack::channels::CHANNELS_VAR
            )));
        }
    }
    let allow_loopback = deps.gate.config().allow_loopback_origins;
    let created = deps
        .runs
        .create(
            runs::Creator {
                sub: &claims.sub,
                project_id: claims.project_id.as_deref(),
            },
            runs::CreateRun {
                run_id: body.run_id,
                kind: body.kind,
                parent_run_id: body.parent_run_id,
                subtask_id: body.subtask_id,
                owner: body.owner,
                project_id: body.project_id,
                channel_id: body.channel_id,
                delivery_id: body.delivery_id,
                budget: body.budget,
                execution_mode: body.execution_mode,
                agenthost_origin: body.agenthost_origin,
            },
            |origin| {
                crate::forward::check_origin(origin, allow_loopback)
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            },
        )
        .await?;
    let (status, head) = match created {
        runs::Created::New(head) => (StatusCode::CREATED, head),
        runs::Created::Existing(head) => (StatusCode::OK, head),
    };
    Ok((status, Json(run_receipt(&deps, &head))).into_response())
}

/// What the creating agent gets for a run (at creation and from its receipt): the run's
/// token and, for a pod-per-run run, the credential its AgentHost checks on forwarded
/// decisions.
pub(crate) fn run_receipt(deps: &Deps, head: &RunHead) -> RunReceipt {
    RunReceipt {
        run_id: head.run_id.clone(),
        run_token: deps.auth.run_token(&head.run_id, &head.incarnation),
        sequence: 1,
        agenthost_credential: head
            .is_pod()
            .then(|| deps.auth.pod_credential(&head.run_id, &head.incarnation)),
        status: None,
    }
}

#[instrument(skip_all, fields(run_id = %run_id))]
async fn append_events(
    State(deps): State<Deps>,
    run_id: RunId,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
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
    let sequences = deps
        .runs
        .append(RunRef::exact(&run_id, &incarnation), raw)
        .await?;
    Ok(Json(Appended::sequences(run_id.into_string(), sequences)).into_response())
}

async fn finish(
    deps: Deps,
    run_id: RunId,
    creds: Credentials,
    body: JsonBody,
    kind: TerminalKind,
) -> Result<Response, ApiError> {
    let incarnation = deps.auth.require_run_token(&creds, &run_id)?;
    let payload: Map<String, Value> = body.object(true).await?;
    let finished = deps
        .gate
        .finish_run(RunRef::exact(&run_id, &incarnation), kind, payload)
        .await?;
    Ok(Json(RunEnded {
        run_id: run_id.into_string(),
        status: kind.status().as_str().into(),
        sequence: finished.sequence,
    })
    .into_response())
}

#[instrument(skip_all, fields(run_id = %run_id))]
async fn complete_run(
    State(deps): State<Deps>,
    run_id: RunId,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    finish(deps, run_id, creds, body, TerminalKind::Complete).await
}

#[instrument(skip_all, fields(run_id = %run_id))]
async fn fail_run(
    State(deps): State<Deps>,
    run_id: RunId,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    finish(deps, run_id, creds, body, TerminalKind::Fail).await
}

#[instrument(skip_all, fields(run_id = %run_id))]
async fn cancel_run(
    State(deps): State<Deps>,
    run_id: RunId,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    finish(deps, run_id, creds, body, TerminalKind::Cancel).await
}
