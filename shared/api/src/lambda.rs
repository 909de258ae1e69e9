//! The Lambda entry point every HTTP function shares: the same router as `tollgate
//! serve`, behind `lambda_http`, which turns API Gateway HTTP API (payload 2.0) and
//! Function URL events into plain HTTP requests.
//!
//! - `TOLLGATE_TRUST_GATEWAY_CLAIMS=1`: claims verified by an API Gateway JWT authorizer
//!   (`requestContext.authorizer.jwt.claims`) stand in for our own HS256 JWT; the role
//!   comes from the claim named by `TOLLGATE_ROLE_CLAIM` (default `role`).
//!
//! [`serve_function`] is an HTTP function's whole `main`, from the registry
//! ([`crate::functions`]). [`run`] answers buffered (API Gateway, `BUFFERED` Function
//! URLs); [`run_streaming`] answers in Lambda's response-streaming mode (a Function URL
//! with `InvokeMode: RESPONSE_STREAM`).

use std::sync::OnceLock;

use axum::extract::Request;
use axum::Router;
use lambda_http::request::RequestContext;
use lambda_http::RequestExt;

pub use lambda_http::Error;

use std::time::Duration;

use crate::auth::{claims_from_gateway, GatewayClaims};
use crate::functions::{Function, Trigger};
use crate::sse::ResponseBudget;

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

/// The platform's id for the request — API Gateway's (`requestContext.requestId`, also a
/// Function URL's), else the invocation's — for the request id when the caller sent no
/// acceptable one ([`crate::request_id`]).
async fn insert_platform_request_id(mut req: Request) -> Request {
    let gateway = match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(ctx)) => ctx.request_id.clone(),
        _ => None,
    };
    let id = gateway.or_else(|| req.lambda_context_ref().map(|ctx| ctx.request_id.clone()));
    if let Some(id) = id.filter(|id| crate::request_id::is_acceptable(id)) {
        req.extensions_mut()
            .insert(crate::request_id::PlatformRequestId(id));
    }
    req
}

/// The platform's request id always; the gateway's claims when trusted.
fn with_lambda_context(router: Router) -> Router {
    let router = router.layer(axum::middleware::map_request(insert_platform_request_id));
    if flag("TOLLGATE_TRUST_GATEWAY_CLAIMS") {
        router.layer(axum::middleware::map_request(insert_gateway_claims))
    } else {
        router
    }
}

/// A whole HTTP function's `main`: [`crate::functions::start`] (JSON logs, configuration
/// and store from the environment, failing start-up with a clear log line), then the
/// function's router under the Runtime API, buffered or streaming as the registry says.
/// `function` is the function's own constant (`functions::APPROVALS`, …), so that its
/// binary links its own routes only.
pub async fn serve_function(function: &Function) -> Result<(), lambda_http::Error> {
    let deps = crate::functions::start(function).await?;
    let name = function.name;
    let streaming = match function.trigger {
        Trigger::Http { streaming } => streaming,
        other => {
            let why = format!("{name} is not an HTTP function (trigger {other:?})");
            tracing::error!(function = name, error = %why, "start-up failed");
            return Err(why.into());
        }
    };
    let router = function
        .router(deps)
        .ok_or_else(|| format!("{name} has no routes"))?;
    if streaming {
        run_streaming(router).await
    } else {
        run(router).await
    }
}

pub async fn run(router: Router) -> Result<(), lambda_http::Error> {
    // A buffered answer is sent when it is complete: a live stream answers what is
    // there now and ends (the client resumes from its last id).
    let router = router.layer(axum::Extension(ResponseBudget(Duration::ZERO)));
    lambda_http::run(with_lambda_context(router)).await
}

pub async fn run_streaming(router: Router) -> Result<(), lambda_http::Error> {
    let router = router.layer(axum::middleware::map_request(insert_deadline));
    // A client that drops its stream can break the runtime's connection while the
    // response is being streamed, and the runtime loop then stops with an error: the
    // process would exit and the next invocation pay a cold start (or, under a local
    // Runtime API, find no process at all). The loop is started again instead; only
    // failures that keep coming at once (the Runtime API itself gone) end the process.
    let mut quick_failures = 0u32;
    loop {
        let started = std::time::Instant::now();
        match lambda_http::run_with_streaming_response(with_lambda_context(router.clone())).await {
            Ok(()) => return Ok(()),
            Err(e) => {
                quick_failures = if started.elapsed() < Duration::from_secs(1) {
                    quick_failures + 1
                } else {
                    1
                };
                if quick_failures >= 5 {
                    return Err(e);
                }
                tracing::warn!(error = %e, "the runtime loop stopped mid-stream; starting it again");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// How long before the invocation's deadline a live stream ends, so that it ends
/// cleanly (its last frames flushed) rather than being cut off by the runtime.
const DEADLINE_MARGIN: Duration = Duration::from_secs(3);

/// The invocation's remaining time, less the margin, as the live stream's budget.
async fn insert_deadline(mut req: Request) -> Request {
    let left = req.lambda_context_ref().map(|ctx| {
        let deadline = std::time::UNIX_EPOCH + Duration::from_millis(ctx.deadline);
        deadline
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default()
            .saturating_sub(DEADLINE_MARGIN)
    });
    if let Some(left) = left {
        req.extensions_mut().insert(ResponseBudget(left));
    }
    req
}
