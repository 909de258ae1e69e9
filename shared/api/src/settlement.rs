//! Approved execution over HTTP (seed 000, docs/architecture.md §5 and §7) — the `settlement`
//! function: an agent starts, dispatches and settles a human-approved mutating call;
//! anyone who may read the run reads its `mutation_outcome/v1` records; an operator
//! reconciles an unknown outcome. Every transition is one read–decide–commit of
//! [`decide_mutation`]: the domain decides ([`tollgate_domain::execution`]) and the store
//! writes the record with its event in one transaction. The settlement deadline and the
//! execution heartbeats run on the timer queue ([`Gate`]'s timer handler calls
//! [`Gate::settlement_deadline`] and [`Gate::execution_beat`]).
//!
//! Receipts (`GET /api/receipts/{delivery_id}`) are here too, served by `ingress`.

use axum::extract::{RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::Value;
use tollgate_domain::approval::valid_id;
use tollgate_domain::execution::{Answer, Observed, Settlement, StartRequest, Verdict};
use tollgate_domain::RunHead;
use tollgate_store::MAX_MUTATIONS_LISTED;
use tracing::instrument;

use crate::auth::{Credentials, Role};
use crate::error::{ErrorCode, ExecutionRefusal};
use tollgate_protocol::execution::{ExecutionAnswer, MutationList};
use crate::request::{query_param, JsonBody, PathParams, RunId};
use crate::{ApiError, Deps};
use tollgate_app::ErrorState;

/// Routes of the `settlement` function.
pub fn routes() -> Router<Deps> {
    Router::new()
        .route(
            "/api/runs/{run_id}/tool-calls/{tool_call_id}/start",
            post(start),
        )
        .route(
            "/api/runs/{run_id}/tool-calls/{tool_call_id}/dispatch",
            post(dispatch),
        )
        .route(
            "/api/runs/{run_id}/tool-calls/{tool_call_id}/settle",
            post(settle),
        )
        .route("/api/runs/{run_id}/mutations", get(list))
        .route(
            "/api/runs/{run_id}/mutations/{tool_call_id}/{approval_id}",
            get(read_one),
        )
        .route(
            "/api/runs/{run_id}/mutations/{tool_call_id}/{approval_id}/reconcile",
            post(reconcile),
        )
}

/// The receipt route (served by `ingress`, which creates runs).
pub fn receipt_routes() -> Router<Deps> {
    Router::new().route("/api/receipts/{delivery_id}", get(receipt))
}

/// A listing answers at most this many bytes of records (under Lambda's 6 MB answer).
const MAX_LISTING_BYTES: usize = 5 * 1024 * 1024;

/// Listed records per answer unless `?limit=` says otherwise.
const DEFAULT_LISTED: usize = 100;

fn unknown_attempt() -> ApiError {
    ApiError::not_found("no such mutation attempt").with_state(ErrorState::Unknown)
}

fn run_not_found() -> ApiError {
    ApiError::not_found("run not found")
}

/// A domain answer as HTTP: 200 `ExecutionAnswer`, or a 409 or 400 error body with the
/// attempt's state (its `code` is `approval_pending` for a card still pending, else the
/// status's).
fn respond(answer: Answer) -> Result<Response, ApiError> {
    let status = match answer.verdict {
        Verdict::Ok => {
            let body = ExecutionAnswer {
                state: answer.state.unwrap_or_default().into(),
                sequence: answer.sequence,
                reason: answer.reason.map(Into::into),
            };
            return Ok(Json(body).into_response());
        }
        Verdict::Conflict => StatusCode::CONFLICT,
        Verdict::Invalid => StatusCode::BAD_REQUEST,
    };
    let mut refusal = ApiError::new(status, answer.error.unwrap_or_default());
    if let Some(state) = answer.state {
        if state == "pending" {
            refusal.code = ErrorCode::ApprovalPending;
        }
        refusal.execution = Some(ExecutionRefusal {
            state,
            reason: answer.reason,
            approval_id: answer.approval_id,
        });
    }
    Err(refusal)
}

/// Path ids the store keys records by: anything else names no attempt (404).
fn checked_ids(ids: &[&str]) -> Result<(), ApiError> {
    if ids.iter().all(|id| valid_id(id)) {
        Ok(())
    } else {
        Err(unknown_attempt())
    }
}

fn parse<T: serde::de::DeserializeOwned>(value: Value, what: &str) -> Result<T, ApiError> {
    serde_json::from_value(value).map_err(|e| ApiError::bad_request(format!("invalid {what}: {e}")))
}

/// An agent's call on its run: the run token's incarnation, the body parsed.
async fn agent_call<T: serde::de::DeserializeOwned>(
    deps: &Deps,
    run_id: &RunId,
    creds: &Credentials,
    body: JsonBody,
    what: &str,
) -> Result<(String, T), ApiError> {
    let incarnation = deps.auth.require_run_token(creds, run_id)?;
    Ok((incarnation, parse(body.value().await?, what)?))
}

#[instrument(skip_all, fields(run_id = %run_id, tool_call_id = %tool_call_id))]
async fn start(
    State(deps): State<Deps>,
    run_id: RunId,
    PathParams((_, tool_call_id)): PathParams<(String, String)>,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let (incarnation, body): (String, tollgate_protocol::execution::Start) =
        agent_call(&deps, &run_id, &creds, body, "start").await?;
    let req = StartRequest {
        run_id: run_id.into_string(),
        tool_call_id,
        request_id: body.request_id,
        approval_id: body.approval_id,
        tool_name: body.tool_name,
        arguments_hash: body.arguments_hash,
    };
    if let Err(refusal) = req.validate() {
        return respond(refusal.answer());
    }
    let card = deps
        .gate
        .card(&req.run_id, &req.request_id)
        .await?
        .ok_or_else(|| {
            ApiError::not_found("no such approval request").with_state(ErrorState::Unknown)
        })?;
    respond(deps.gate.start_execution(&req, &card, &incarnation).await?)
}

#[instrument(skip_all, fields(run_id = %run_id, tool_call_id = %tool_call_id))]
async fn dispatch(
    State(deps): State<Deps>,
    run_id: RunId,
    PathParams((_, tool_call_id)): PathParams<(String, String)>,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let (incarnation, body): (String, tollgate_protocol::execution::Dispatch) =
        agent_call(&deps, &run_id, &creds, body, "dispatch").await?;
    checked_ids(&[&tool_call_id, &body.approval_id])?;
    let answer = deps
        .gate
        .dispatch_execution(&run_id, &tool_call_id, &body.approval_id, &incarnation)
        .await?;
    respond(answer)
}

#[instrument(skip_all, fields(run_id = %run_id, tool_call_id = %tool_call_id))]
async fn settle(
    State(deps): State<Deps>,
    run_id: RunId,
    PathParams((_, tool_call_id)): PathParams<(String, String)>,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let (incarnation, body): (String, tollgate_protocol::execution::Settle) =
        agent_call(&deps, &run_id, &creds, body, "settlement").await?;
    let settlement = Settlement::new(&body.evidence, body.result, body.error)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    checked_ids(&[&tool_call_id, &body.approval_id])?;
    let answer = deps
        .gate
        .settle_execution(
            &run_id,
            &tool_call_id,
            &body.approval_id,
            &incarnation,
            &settlement,
        )
        .await?;
    respond(answer)
}

#[instrument(skip_all, fields(run_id, tool_call_id, approval_id))]
async fn reconcile(
    State(deps): State<Deps>,
    run_id: Result<RunId, ApiError>,
    ids: Result<PathParams<(String, String, String)>, ApiError>,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let claims = deps.auth.require_role(&creds, Role::Operator)?;
    let body: tollgate_protocol::execution::Reconcile =
        parse(body.value().await?, "reconciliation")?;
    let observed = Observed::parse(&body.observed)
        .ok_or_else(|| ApiError::bad_request("observed must be applied or not_applied"))?;
    let run_id = run_id?;
    let PathParams((_, tool_call_id, approval_id)) = ids?;
    let span = tracing::Span::current();
    span.record("run_id", run_id.as_str());
    checked_ids(&[&tool_call_id, &approval_id])?;
    span.record("tool_call_id", tool_call_id.as_str());
    span.record("approval_id", approval_id.as_str());
    // An operator of one project reconciles only that project's runs.
    let head = deps
        .runs
        .head_in_project(&run_id, claims.project_id.as_deref())
        .await?
        .ok_or_else(run_not_found)?;
    let answer = deps
        .gate
        .reconcile_execution(
            &head.run_id,
            &tool_call_id,
            &approval_id,
            observed,
            &claims.sub,
        )
        .await?;
    respond(answer)
}

/// The head of a run the caller may read (404 otherwise, as replay answers).
async fn readable_head(
    deps: &Deps,
    creds: &Credentials,
    run_id: &RunId,
) -> Result<RunHead, ApiError> {
    let caller = deps.auth.caller(creds, Some(run_id))?;
    Ok(deps.runs.readable_head(run_id, &caller.viewer()).await?)
}

#[instrument(skip_all, fields(run_id))]
async fn list(
    State(deps): State<Deps>,
    run_id: Result<RunId, ApiError>,
    RawQuery(query): RawQuery,
    creds: Credentials,
) -> Result<Response, ApiError> {
    let limit = match query_param(query.as_deref(), "limit") {
        None => DEFAULT_LISTED,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|l| (1..=MAX_MUTATIONS_LISTED).contains(l))
            .ok_or_else(|| {
                ApiError::bad_request(format!("limit must be 1 to {MAX_MUTATIONS_LISTED}"))
            })?,
    };
    let run_id = run_id?;
    tracing::Span::current().record("run_id", run_id.as_str());
    let head = readable_head(&deps, &creds, &run_id).await?;
    let records = deps.gate.mutations(&head.run_id, limit + 1).await?;
    let mut has_more = records.len() > limit;
    let mut bytes = 0;
    let mut listed = Vec::new();
    for record in records.iter().take(limit) {
        let record = crate::wire::mutation(record);
        bytes += serde_json::to_vec(&record).map_or(0, |b| b.len()) + 1;
        if bytes > MAX_LISTING_BYTES {
            has_more = true;
            break;
        }
        listed.push(record);
    }
    Ok(Json(MutationList {
        run_id: head.run_id,
        mutations: listed,
        has_more,
    })
    .into_response())
}

#[instrument(skip_all, fields(run_id = %run_id, tool_call_id = %tool_call_id, approval_id = %approval_id))]
async fn read_one(
    State(deps): State<Deps>,
    run_id: RunId,
    PathParams((_, tool_call_id, approval_id)): PathParams<(String, String, String)>,
    creds: Credentials,
) -> Result<Response, ApiError> {
    let head = readable_head(&deps, &creds, &run_id).await?;
    checked_ids(&[&tool_call_id, &approval_id])?;
    let record = deps
        .gate
        .mutation(&head.run_id, &tool_call_id, &approval_id)
        .await?
        .ok_or_else(unknown_attempt)?;
    Ok(Json(crate::wire::mutation(&record)).into_response())
}

/// The run a delivery created, for the agent that created it (seed 000: "use the
/// original delivery identity to find its later receipt").
#[instrument(skip_all)]
async fn receipt(
    State(deps): State<Deps>,
    delivery_id: Result<PathParams<String>, ApiError>,
    creds: Credentials,
) -> Result<Response, ApiError> {
    let claims = deps.auth.require_role(&creds, Role::Agent)?;
    let PathParams(delivery_id) = delivery_id?;
    let creator = tollgate_app::runs::Creator {
        sub: &claims.sub,
        project_id: claims.project_id.as_deref(),
    };
    let head = deps
        .runs
        .delivered(creator, &delivery_id)
        .await?
        .ok_or_else(|| {
            ApiError::not_found("no run was created for this delivery")
                .with_state(ErrorState::Unknown)
        })?;
    let mut answer = crate::ingress::run_receipt(&deps, &head);
    answer.status = Some(head.status.as_str().into());
    Ok(Json(answer).into_response())
}
