//! The `replay` function: sequenced replay of a run's stream as JSON pages, or as the
//! live event stream ([`crate::sse`]) for `Accept: text/event-stream`.

use axum::extract::{Path, RawQuery, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tollgate_domain::{validate_run_id, RunHead};
use tollgate_store::read_page;
use tracing::instrument;

use crate::auth::{Caller, Credentials, Role};
use crate::request::query_param;
use crate::{ApiError, Deps};

pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1000;

pub fn routes() -> Router<Deps> {
    Router::new()
        .route("/api/runs/{run_id}/events", get(replay_events))
        .route("/api/runs/{run_id}/stream", get(crate::sse::stream))
}

fn parse_after(query: Option<&str>) -> Result<u64, ApiError> {
    match query_param(query, "after") {
        None => Ok(0),
        Some(v) => v
            .parse::<u64>()
            .map_err(|_| ApiError::bad_request("after must be a sequence number ≥ 0")),
    }
}

fn parse_limit(query: Option<&str>) -> Result<usize, ApiError> {
    match query_param(query, "limit") {
        None => Ok(DEFAULT_LIMIT),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
            _ => Err(ApiError::bad_request(format!(
                "limit must be 1 to {MAX_LIMIT}"
            ))),
        },
    }
}

#[instrument(skip_all, fields(run_id = %run_id))]
async fn replay_events(
    State(deps): State<Deps>,
    Path(run_id): Path<String>,
    RawQuery(query): RawQuery,
    headers: axum::http::HeaderMap,
    budget: Option<axum::Extension<crate::sse::ResponseBudget>>,
    creds: Credentials,
) -> Result<Response, ApiError> {
    if crate::sse::wants_stream(&headers) {
        let budget = budget.map(|axum::Extension(b)| b);
        return crate::sse::open(deps, run_id, query.as_deref(), &headers, budget, &creds).await;
    }
    let caller = deps.auth.caller(&creds, Some(&run_id))?;
    let after = parse_after(query.as_deref())?;
    let limit = parse_limit(query.as_deref())?;
    if !validate_run_id(&run_id) {
        return Err(ApiError::not_found("run not found"));
    }
    // The head is read before the events (read_page's rules rely on that order).
    let head = deps
        .store
        .read_head(&run_id)
        .await?
        .ok_or_else(|| ApiError::not_found("run not found"))?;
    authorize_read(&caller, &head)?;
    let page = read_page(deps.store.as_ref(), &head, after, limit).await?;
    // Bodies are served exactly as stored: assemble the page around them.
    let mut out =
        String::with_capacity(page.events.iter().map(|e| e.body.len() + 1).sum::<usize>() + 128);
    out.push_str("{\"run_id\":");
    out.push_str(&serde_json::Value::from(run_id.as_str()).to_string());
    out.push_str(",\"events\":[");
    for (i, e) in page.events.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&e.body);
    }
    out.push_str(&format!(
        "],\"next_after\":{},\"has_more\":{},\"terminal\":{}}}",
        page.next_after, page.has_more, page.terminal
    ));
    let mut response = (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        out,
    )
        .into_response();
    if page.events.is_empty() && page.has_more {
        // Events after `after` are still becoming visible: a moment, not a hot loop.
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    Ok(response)
}

/// Who may read a run: its own token (of this incarnation), the creating agent, an
/// operator — limited to one project when the token carries a `project_id`. A run
/// outside the caller's project answers as if it did not exist.
pub(crate) fn authorize_read(caller: &Caller, head: &RunHead) -> Result<(), ApiError> {
    let in_project = |claim: &Option<String>| {
        tollgate_app::access::in_project(claim.as_deref(), head.project_id.as_deref())
    };
    match caller {
        Caller::Run { incarnation, .. } if *incarnation == head.incarnation => Ok(()),
        Caller::Run { .. } => Err(ApiError::not_found("run not found")),
        Caller::Jwt(c) if !in_project(&c.project_id) => Err(ApiError::not_found("run not found")),
        Caller::Jwt(c) if c.role == Role::Operator => Ok(()),
        Caller::Jwt(c) if c.sub == head.created_by => Ok(()),
        Caller::Jwt(_) => Err(ApiError::forbidden(
            "an agent token reads only the runs it created",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn after_and_limit_are_validated() {
        assert_eq!(parse_after(None).unwrap(), 0);
        assert_eq!(parse_after(Some("after=7&limit=2")).unwrap(), 7);
        for bad in ["after=-1", "after=abc", "after=", "after=1.5"] {
            assert_eq!(parse_after(Some(bad)).unwrap_err().status, 400, "{bad}");
        }
        assert_eq!(parse_limit(Some("limit=1000")).unwrap(), 1000);
        for bad in ["limit=0", "limit=1001", "limit=x"] {
            assert_eq!(parse_limit(Some(bad)).unwrap_err().status, 400, "{bad}");
        }
    }
}
