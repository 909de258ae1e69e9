//! Request-body, query and path parsing with the contract's limits and JSON errors.

use axum::body::Body;
use axum::extract::{FromRequest, FromRequestParts, RawPathParams};
use axum::http::request::Parts;
use axum::http::Request;
use serde_json::Value;
use tollgate_domain::validate_run_id;

use crate::ApiError;

/// Bodies over 256 KiB are refused with 413 before they are parsed.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// Beyond this a body is not even read to the end (the connection is closed).
const DRAIN_LIMIT_BYTES: usize = 8 * 1024 * 1024;

/// A request body, read only when the handler asks — after it has checked the caller,
/// so an unauthenticated request never makes the server buffer or parse its body.
/// Empty bodies read as `Value::Null`; malformed JSON is a 400 naming the position;
/// oversized bodies a 413.
pub struct JsonBody(Body);

impl<S: Send + Sync> FromRequest<S> for JsonBody {
    type Rejection = std::convert::Infallible;

    async fn from_request(req: Request<Body>, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(JsonBody(req.into_body()))
    }
}

impl JsonBody {
    /// The raw body, at most [`MAX_BODY_BYTES`] (else 413).
    pub async fn bytes(self) -> Result<axum::body::Bytes, ApiError> {
        // Read (and discard) oversized bodies up to a bound before answering 413, so a
        // client still sending is not cut off mid-request with a connection reset.
        let bytes = axum::body::to_bytes(self.0, DRAIN_LIMIT_BYTES)
            .await
            .map_err(|_| ApiError::payload_too_large())?;
        if bytes.len() > MAX_BODY_BYTES {
            return Err(ApiError::payload_too_large());
        }
        Ok(bytes)
    }

    /// The raw body when it is at most `limit` bytes; past that 413 at once, reading no
    /// further (for unauthenticated callers whose bodies are small, as Slack's clicks).
    pub async fn bytes_within(self, limit: usize) -> Result<axum::body::Bytes, ApiError> {
        axum::body::to_bytes(self.0, limit).await.map_err(|_| {
            ApiError::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body is over {} KiB", limit / 1024),
            )
        })
    }

    pub async fn value(self) -> Result<Value, ApiError> {
        let bytes = self.bytes().await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::bad_request(format!("malformed JSON: {e}")))
    }

    /// The body as an object (`null`/empty allowed when `optional`).
    pub async fn object(self, optional: bool) -> Result<serde_json::Map<String, Value>, ApiError> {
        match self.value().await? {
            Value::Object(map) => Ok(map),
            Value::Null if optional => Ok(serde_json::Map::new()),
            _ => Err(ApiError::bad_request("request body must be a JSON object")),
        }
    }
}

/// Parses `key=value` pairs of a query string (percent-decoding is not needed for the
/// numeric parameters we read).
pub fn query_param<'a>(query: Option<&'a str>, key: &str) -> Option<&'a str> {
    query?
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// The route's `{run_id}`, checked against the run id rule (`validate_run_id`): a path
/// naming something else names no run, and answers 404 `run not found` as JSON
/// (docs/architecture.md §5), as does one that does not decode. A handler that checks
/// the caller first takes `Result<RunId, ApiError>` and answers the refusal there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunId(String);

impl RunId {
    /// A run id from anywhere but the path (`None` when the run id rule refuses it).
    pub fn parse(id: &str) -> Option<Self> {
        validate_run_id(id).then(|| RunId(id.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl std::ops::Deref for RunId {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for RunId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let not_found = || ApiError::not_found("run not found");
        let params = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|_| undecodable_path())?;
        params
            .iter()
            .find(|(name, _)| *name == "run_id")
            .map(|(_, id)| id)
            .filter(|id| validate_run_id(id))
            .map(|id| RunId(id.to_owned()))
            .ok_or_else(not_found)
    }
}

/// A path whose segments do not decode (percent-escapes that are not UTF-8): 400, JSON.
fn undecodable_path() -> ApiError {
    ApiError::bad_request("the path does not decode (percent-escapes must be UTF-8)")
}

/// The route's parameters after `{run_id}` (`axum::extract::Path`, the same
/// deserialisation), answering a path that does not decode with our JSON 400 instead of
/// axum's plain text. A handler that checks its caller first takes
/// `Result<PathParams<T>, ApiError>` and answers the refusal after that check.
#[derive(Debug, Clone)]
pub struct PathParams<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> FromRequestParts<S> for PathParams<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(t)| PathParams(t))
            .map_err(|_| undecodable_path())
    }
}

/// The run a token is checked against on a route that checks its caller before its
/// `{run_id}`: the id, or for a malformed one the empty id — no run token is valid for
/// either, so the caller hears the same as before the path is answered.
pub fn token_run_id(run_id: &Result<RunId, ApiError>) -> &str {
    run_id.as_ref().map_or("", RunId::as_str)
}

/// A query parameter percent-decoded (`%40`, `+`: owners, projects and run ids are
/// matched as written), `None` when absent.
pub fn decoded_param(query: Option<&str>, key: &str) -> Option<String> {
    url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
}

/// The project an operator names in the query under `key` (`project_id` on the runs
/// listing, `project` on the dead letters), decoded: `None` when absent, 400 when empty
/// or over [`tollgate_protocol::limits::MAX_RUN_FILTER`] characters (as a run's project
/// is bounded at creation).
pub fn project_param(query: Option<&str>, key: &str) -> Result<Option<String>, crate::ApiError> {
    let max = tollgate_protocol::limits::MAX_RUN_FILTER;
    match decoded_param(query, key) {
        Some(p) if p.is_empty() || p.chars().count() > max => Err(crate::ApiError::bad_request(
            format!("{key} must be 1 to {max} characters"),
        )),
        project => Ok(project),
    }
}

/// The `limit` query parameter: `default` when absent, else a whole number from 1 to
/// `max` (anything else is 400).
pub fn limit_param(
    query: Option<&str>,
    default: usize,
    max: usize,
) -> Result<usize, crate::ApiError> {
    match query_param(query, "limit") {
        None => Ok(default),
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|l| (1..=max).contains(l))
            .ok_or_else(|| {
                crate::ApiError::bad_request(format!("limit must be a whole number, 1 to {max}"))
            }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;
    use tower::ServiceExt;

    /// GIVEN a query naming a project percent-encoded, empty, too long or not at all
    /// WHEN its project is read THEN it is decoded, 400, 400 and absent.
    #[test]
    fn a_project_is_decoded_and_bounded() {
        let q = Some("limit=2&project_id=team%40acme+eu");
        assert_eq!(
            project_param(q, "project_id").unwrap().as_deref(),
            Some("team@acme eu")
        );
        assert_eq!(project_param(q, "project").unwrap(), None);
        let err = project_param(Some("project="), "project").unwrap_err();
        assert_eq!(err.status.as_u16(), 400);
        let long = format!("project_id={}", "p".repeat(257));
        assert!(project_param(Some(&long), "project_id").is_err());
        assert_eq!(project_param(None, "project_id").unwrap(), None);
    }

    /// What a route taking a `RunId` answers `path`: status and body.
    async fn answer(path: &str) -> (u16, String) {
        // (Not a route of the product: called as a function, `tests/template.rs` skips it.)
        let app = axum::Router::route(
            axum::Router::new(),
            "/runs/{run_id}/calls/{call_id}",
            get(|run_id: RunId| async move { run_id.into_string() }),
        );
        let request = Request::builder().uri(path).body(Body::empty()).unwrap();
        let response = app.oneshot(request).await.unwrap();
        let status = response.status().as_u16();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn a_run_id_in_the_path_is_checked_and_refused_as_json() {
        assert_eq!(
            answer("/runs/a:b.c_d-E9/calls/c1").await,
            (200, "a:b.c_d-E9".to_owned())
        );
        for bad in [
            "/runs/a%2Fb/calls/c1",
            "/runs/%2E%2E/calls/c1",
            "/runs/a%20b/calls/c1",
        ] {
            assert_eq!(
                answer(bad).await,
                (
                    404,
                    // (The request-id layer, not mounted here, fills in `request_id`.)
                    r#"{"error":"run not found","code":"not_found","request_id":""}"#.to_owned()
                ),
                "{bad}"
            );
        }
        // A path that does not decode (here or in a later segment) is a bad request, not
        // a missing run.
        for bad in ["/runs/%FF/calls/c1", "/runs/a:b/calls/%FF"] {
            let (status, body) = answer(bad).await;
            assert_eq!(status, 400, "{bad}");
            assert!(body.contains("does not decode"), "{bad}: {body}");
        }
    }
}
