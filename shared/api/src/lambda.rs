//! The Lambda entry point every HTTP function shares: the same router as `tollgate
//! serve`, behind `lambda_http`, which turns API Gateway HTTP API (payload 2.0) and
//! Function URL events into plain HTTP requests.
//!
//! - `TOLLGATE_TRUST_GATEWAY_CLAIMS=1`: claims verified by an API Gateway JWT authorizer
//!   (`requestContext.authorizer.jwt.claims`) stand in for our own HS256 JWT; the role
//!   comes from the claim named by `TOLLGATE_ROLE_CLAIM` (default `role`).
//!
//! [`run`] answers buffered (API Gateway, `BUFFERED` Function URLs); [`run_streaming`]
//! answers in Lambda's response-streaming mode (a Function URL with
//! `InvokeMode: RESPONSE_STREAM`).

use std::sync::OnceLock;

use axum::extract::Request;
use axum::Router;
use lambda_http::request::RequestContext;
use lambda_http::RequestExt;

pub use lambda_http::Error;

use crate::auth::{claims_from_gateway, GatewayClaims};

fn flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1" || v == "true")
}

fn role_claim() -> &'static str {
    static ROLE_CLAIM: OnceLock<String> = OnceLock::new();
    ROLE_CLAIM
        .get_or_init(|| std::env::var("TOLLGATE_ROLE_CLAIM").unwrap_or_else(|_| "role".into()))
}

async fn insert_gateway_claims(mut req: Request) -> Request {
    let claims = match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx)) => ctx
            .authorizer
            .as_ref()
            .and_then(|a| a.jwt.as_ref())
            .and_then(|jwt| claims_from_gateway(&jwt.claims, role_claim())),
        _ => None,
    };
    if let Some(claims) = claims {
        req.extensions_mut().insert(GatewayClaims(claims));
    }
    req
}

fn with_gateway_claims(router: Router) -> Router {
    if flag("TOLLGATE_TRUST_GATEWAY_CLAIMS") {
        router.layer(axum::middleware::map_request(insert_gateway_claims))
    } else {
        router
    }
}

/// How a function answers: buffered, or in Lambda's response-streaming mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Response {
    Buffered,
    Streaming,
}

/// A whole function's `main`: JSON logs, configuration and store from the environment
/// (failing start-up with a clear log line), then the router under the Runtime API.
pub async fn serve(
    router: fn(crate::Deps) -> Router,
    response: Response,
) -> Result<(), lambda_http::Error> {
    crate::telemetry::init(true);
    let deps = crate::Deps::from_env().await.inspect_err(|e| {
        tracing::error!(error = %e, "start-up failed");
    })?;
    match response {
        Response::Buffered => run(router(deps)).await,
        Response::Streaming => run_streaming(router(deps)).await,
    }
}

pub async fn run(router: Router) -> Result<(), lambda_http::Error> {
    lambda_http::run(with_gateway_claims(router)).await
}

pub async fn run_streaming(router: Router) -> Result<(), lambda_http::Error> {
    lambda_http::run_with_streaming_response(with_gateway_claims(router)).await
}
