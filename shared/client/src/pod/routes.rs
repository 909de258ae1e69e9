//! The routes Tollgate forwards decisions to (`POST /tool-approvals`,
//! `POST /tool-denials`, `GET /tool-approvals/{requestId}`) and their bearer check.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::gate::Scope;

use super::*;

impl PodGate {
    /// Whether an `Authorization` header value carries this pod's credential (compared
    /// in constant time: digests of equal length, every byte looked at).
    pub fn is_authorized(&self, authorization: Option<&str>) -> bool {
        let Some(token) = authorization
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
        else {
            return false;
        };
        let given: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        given
            .iter()
            .zip(self.inner.credential.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }

    /// The routes Tollgate forwards decisions to, ready to merge into the pod's app:
    /// `POST /tool-approvals`, `POST /tool-denials`, `GET /tool-approvals/{requestId}`.
    pub fn routes(&self) -> Router {
        Router::new()
            .route("/tool-approvals", post(approve_route))
            .route("/tool-denials", post(deny_route))
            .route("/tool-approvals/{request_id}", get(card_route))
            .with_state(self.clone())
    }
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        Json(json!({"error": "missing or invalid bearer credential"})),
    )
        .into_response()
}

fn bad_request(message: &str) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({"error": message}))).into_response()
}

fn answer(a: PodAnswer) -> Response {
    let status = StatusCode::from_u16(a.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(a.body())).into_response()
}

fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
}

/// A decision request's `runId`, `requestId`, `scope`, `decisionId?` and `toolName?`.
struct DecisionFields {
    run_id: String,
    request_id: String,
    scope: Scope,
    decision_id: Option<String>,
    tool_name: Option<String>,
}

/// `{runId, requestId, scope?}` from a decision body, or why it is not one.
fn decision_body(body: &[u8]) -> Result<DecisionFields, String> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|_| "the body must be JSON {runId, requestId, scope?}".to_owned())?;
    let text = |k: &str| {
        value
            .get(k)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .ok_or_else(|| format!("{k} must be a non-empty string"))
    };
    let scope = Scope::parse(value.get("scope").and_then(Value::as_str));
    let decision_id = value
        .get("decisionId")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty() && s.len() <= 128)
        .map(str::to_owned);
    let tool_name = value
        .get("toolName")
        .and_then(Value::as_str)
        .map(str::to_owned);
    Ok(DecisionFields {
        run_id: text("runId")?,
        request_id: text("requestId")?,
        scope,
        decision_id,
        tool_name,
    })
}

async fn approve_route(State(gate): State<PodGate>, headers: HeaderMap, body: Bytes) -> Response {
    if !gate.is_authorized(authorization(&headers)) {
        return unauthorized();
    }
    match decision_body(&body) {
        Ok(d) => answer(gate.decide(
            &d.run_id,
            &d.request_id,
            Verb::Approve(d.scope),
            d.decision_id.as_deref(),
            d.tool_name.as_deref(),
        )),
        Err(why) => bad_request(&why),
    }
}

async fn deny_route(State(gate): State<PodGate>, headers: HeaderMap, body: Bytes) -> Response {
    if !gate.is_authorized(authorization(&headers)) {
        return unauthorized();
    }
    match decision_body(&body) {
        Ok(d) => answer(gate.decide(
            &d.run_id,
            &d.request_id,
            Verb::Deny,
            d.decision_id.as_deref(),
            d.tool_name.as_deref(),
        )),
        Err(why) => bad_request(&why),
    }
}

async fn card_route(
    State(gate): State<PodGate>,
    Path(request_id): Path<String>,
    headers: HeaderMap,
) -> Response {
    if !gate.is_authorized(authorization(&headers)) {
        return unauthorized();
    }
    match gate.card(&request_id) {
        Some(card) => Json(card).into_response(),
        None => answer(PodAnswer::Unknown),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_credentials_are_checked_exactly() {
        let gate = PodGate::new("s3cret");
        assert!(gate.is_authorized(Some("Bearer s3cret")));
        for bad in [
            None,
            Some(""),
            Some("Bearer "),
            Some("Bearer s3cre"),
            Some("Bearer s3cret2"),
            Some("Basic s3cret"),
            Some("s3cret"),
        ] {
            assert!(!gate.is_authorized(bad), "{bad:?}");
        }
        assert!(!PodGate::new("").is_authorized(Some("Bearer ")));
    }
}
