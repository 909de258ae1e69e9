//! Operators' view of notifications (docs/architecture.md §10): a project's dead letters
//! and retrying one. Served by the `approvals` function's routes (operator routes).

use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use tollgate_domain::format_timestamp;
use tollgate_protocol::notifications::{DeadLetters, Delivery as WireDelivery};
use tollgate_store::{Delivery, DeliveryState};

use crate::auth::{Credentials, Role};
use crate::request::PathParams;
use crate::{ApiError, Deps};

/// Most dead letters one listing answers (`limit`).
pub const MAX_DEAD_LETTERS: usize = 1000;
const DEFAULT_DEAD_LETTERS: usize = 100;

pub fn routes() -> Router<Deps> {
    Router::new()
        .route("/api/notifications/dead-letters", get(list))
        .route(
            "/api/notifications/dead-letters/{delivery_id}/retry",
            post(retry),
        )
}

/// A delivery record as operators see it.
pub fn wire(d: &Delivery) -> WireDelivery {
    WireDelivery {
        delivery_id: d.delivery_id.clone(),
        sink: d.key.sink.clone(),
        kind: d.key.kind.clone(),
        project: (d.key.project != super::NO_PROJECT).then(|| d.key.project.clone()),
        run_id: d.key.run_id.clone(),
        request_id: d.key.request_id.clone(),
        sequence: d.sequence,
        state: d.state.as_str().into(),
        attempts: d.attempts,
        last_error: d.last_error.clone(),
        created_at: format_timestamp(d.created_at),
        updated_at: format_timestamp(d.updated_at),
        next_attempt_at: (d.state == DeliveryState::Pending)
            .then(|| format_timestamp(d.next_attempt_at)),
    }
}

/// The project an operator acts on: its token's, or (a token that names none) the
/// `project` query parameter, else runs without a project (`-`).
fn project_of(claim: Option<&str>, query: Option<&str>) -> Result<String, ApiError> {
    // Decoded (`%40`, `+`), as `GET /api/runs` reads its project.
    let asked = crate::request::project_param(query, "project");
    match (claim, asked) {
        (Some(own), Ok(Some(asked))) if asked != own => Err(ApiError::forbidden(
            "your token is limited to another project",
        )),
        // An empty or over-long project is not the token's either.
        (Some(_), Err(_)) => Err(ApiError::forbidden(
            "your token is limited to another project",
        )),
        (Some(own), _) => Ok(own.to_owned()),
        (None, Err(bad)) => Err(bad),
        (None, Ok(Some(asked))) => Ok(asked),
        (None, Ok(None)) => Ok(super::NO_PROJECT.to_owned()),
    }
}

async fn list(
    State(deps): State<Deps>,
    RawQuery(query): RawQuery,
    creds: Credentials,
) -> Result<Response, ApiError> {
    let claims = deps.auth.require_role(&creds, Role::Operator)?;
    let query = query.as_deref();
    let limit = crate::request::limit_param(query, DEFAULT_DEAD_LETTERS, MAX_DEAD_LETTERS)?;
    let project = project_of(claims.project_id.as_deref(), query)?;
    let letters = deps.notifier.dead_letters(&project, limit).await?;
    Ok(Json(DeadLetters {
        dead_letters: letters.iter().map(wire).collect(),
    })
    .into_response())
}

async fn retry(
    State(deps): State<Deps>,
    PathParams(delivery_id): PathParams<String>,
    RawQuery(query): RawQuery,
    creds: Credentials,
) -> Result<Response, ApiError> {
    let claims = deps.auth.require_role(&creds, Role::Operator)?;
    let project = project_of(claims.project_id.as_deref(), query.as_deref())?;
    let not_found = || ApiError::not_found("no such dead letter");
    if !delivery_id.starts_with("dlv_") || delivery_id.len() > 64 {
        return Err(not_found());
    }
    match deps.notifier.revive(&project, &delivery_id).await? {
        Some(d) => Ok(Json(wire(&d)).into_response()),
        None => Err(not_found()),
    }
}
