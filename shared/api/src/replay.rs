//! The `replay` function: sequenced replay of a run's stream as JSON pages, or as the
//! live event stream ([`crate::sse`]) for `Accept: text/event-stream`.

use axum::extract::{RawQuery, State};
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tracing::instrument;

use crate::auth::Credentials;
use crate::request::{query_param, token_run_id, RunId};
use crate::{ApiError, Deps};

pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1000;

pub fn routes() -> Router<Deps> {
    Router::new()
        .route("/api/runs/{run_id}/events", get(replay_events))
        .route("/api/runs/{run_id}/stream", get(crate::sse::stream))
}

/// `?after=`: 0 when absent; anything but a sequence number is 400 (public for the
/// fuzz targets, `fuzz/`).
pub fn parse_after(query: Option<&str>) -> Result<u64, ApiError> {
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

#[instrument(skip_all, fields(run_id))]
async fn replay_events(
    State(deps): State<Deps>,
    run_id: Result<RunId, ApiError>,
    RawQuery(query): RawQuery,
    headers: axum::http::HeaderMap,
    budget: Option<axum::Extension<crate::sse::ResponseBudget>>,
    creds: Credentials,
) -> Result<Response, ApiError> {
    if crate::sse::wants_stream(&headers) {
        let budget = budget.map(|axum::Extension(b)| b);
        return crate::sse::open(deps, run_id, query.as_deref(), &headers, budget, &creds).await;
    }
    let caller = deps.auth.caller(&creds, Some(token_run_id(&run_id)))?;
    let after = parse_after(query.as_deref())?;
    let limit = parse_limit(query.as_deref())?;
    let run_id = run_id?;
    tracing::Span::current().record("run_id", run_id.as_str());
    // The head is read before the events (read_page's rules rely on that order).
    let head = deps.runs.readable_head(&run_id, &caller.viewer()).await?;
    let page = deps.runs.page(&head, after, limit).await?;
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
