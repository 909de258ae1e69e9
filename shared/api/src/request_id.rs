//! The request id: one per request, answered on every response as `x-request-id`, in
//! every error body as `request_id`, and on every log line the request writes (the
//! `request` span around it, the access log line included).
//!
//! The id is the caller's `x-request-id` when it is 1–64 characters of
//! `[A-Za-z0-9._-]` (so a client can follow its own id through), else the platform's id
//! for the request ([`PlatformRequestId`]: the API Gateway or Lambda request id,
//! deployed), else a new random one (32 hex digits). Anything else a caller sends as an
//! id — too long, control characters, spaces — is never echoed nor logged.

use axum::body::Body;
use axum::extract::Request;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use serde_json::{Map, Value};
use tracing::Instrument;

use crate::error::{ErrorCode, ErrorCodeFor};

/// The header a request id comes in and goes out in.
pub const HEADER: &str = "x-request-id";

/// Longest id taken from a caller.
pub const MAX_LEN: usize = 64;

/// Error bodies longer than this are passed on as they are (none of ours is).
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// This request's id, in the request's extensions for a handler that wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestId(pub String);

/// The id the platform gave the request (API Gateway's or Lambda's), used when the
/// caller sent no acceptable one; put in the request's extensions by the Lambda entry
/// point.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlatformRequestId(pub String);

/// Whether `id` may be taken as a request id: 1–64 characters of `[A-Za-z0-9._-]`.
pub fn is_acceptable(id: &str) -> bool {
    (1..=MAX_LEN).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A new id: 32 lowercase hex digits (a random UUID, simple form).
pub fn generate() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// The id of `req`: the caller's, the platform's, or a new one.
fn choose(req: &Request) -> String {
    req.headers()
        .get(HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|id| is_acceptable(id))
        .map(str::to_owned)
        .or_else(|| {
            req.extensions()
                .get::<PlatformRequestId>()
                .map(|p| p.0.clone())
                .filter(|id| is_acceptable(id))
        })
        .unwrap_or_else(generate)
}

/// The middleware every router goes through (`with_fallbacks`): chooses the id, runs
/// the request inside a `request` span carrying it, writes the access log line, and
/// answers the id in the header and in an error's body.
pub async fn middleware(mut req: Request, next: Next) -> Response {
    let id = choose(&req);
    req.extensions_mut().insert(RequestId(id.clone()));
    let span = tracing::info_span!("request", request_id = %id);
    let response = access_log(req, next).instrument(span).await;
    let mut response = if response.status().is_client_error() || response.status().is_server_error()
    {
        error_with_id(response, &id).await
    } else {
        response
    };
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(HEADER, value);
    }
    response
}

/// Method, route template (never the raw path's query or any header), status, latency;
/// the request id is the span's.
async fn access_log(req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".into());
    let started = std::time::Instant::now();
    let response = next.run(req).await;
    tracing::info!(
        %method,
        route,
        status = response.status().as_u16(),
        latency_ms = started.elapsed().as_secs_f64() * 1e3,
        "request"
    );
    response
}

/// An error response with `request_id` in its JSON body (and `code`, should it lack
/// one). A body that is not a JSON object — a framework's plain-text rejection — is
/// answered as JSON `{error, code, request_id}` instead, so every error is JSON.
async fn error_with_id(response: Response, id: &str) -> Response {
    let (parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, MAX_ERROR_BODY_BYTES).await else {
        // Too long or failed mid-way (none of ours): the status says what it can.
        tracing::warn!(
            status = parts.status.as_u16(),
            "an error body could not be read"
        );
        let body = object_for(parts.status, "");
        return rebuild(parts, body, id);
    };
    let body = match serde_json::from_slice::<Value>(&bytes) {
        Ok(Value::Object(map)) => map,
        _ => object_for(parts.status, &String::from_utf8_lossy(&bytes)),
    };
    rebuild(parts, body, id)
}

/// `{error, code}` for a status whose body said `text` (or nothing).
fn object_for(status: StatusCode, text: &str) -> Map<String, Value> {
    let text = text.trim();
    let error = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text.chars().take(1024).collect()
    };
    let mut map = Map::new();
    map.insert("error".into(), error.into());
    map.insert("code".into(), ErrorCode::for_status(status).as_str().into());
    map
}

fn rebuild(
    mut parts: axum::http::response::Parts,
    mut body: Map<String, Value>,
    id: &str,
) -> Response {
    if !body.contains_key("code") {
        body.insert(
            "code".into(),
            ErrorCode::for_status(parts.status).as_str().into(),
        );
    }
    body.insert("request_id".into(), id.into());
    let bytes = serde_json::to_vec(&Value::Object(body)).unwrap_or_default();
    parts.headers.remove(CONTENT_LENGTH);
    parts
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Response::from_parts(parts, Body::from(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_short_plain_ids_are_taken() {
        for ok in ["a", "req-1.2_3", &"x".repeat(MAX_LEN), "ABCdef0123456789"] {
            assert!(is_acceptable(ok), "{ok:?}");
        }
        for bad in [
            "",
            &"x".repeat(MAX_LEN + 1),
            "a b",
            "a\nb",
            "a\tb",
            "é",
            "a/b",
            "a:b",
            "<script>",
        ] {
            assert!(!is_acceptable(bad), "{bad:?}");
        }
        let new = generate();
        assert_eq!(new.len(), 32);
        assert!(is_acceptable(&new));
    }
}
