//! Tollgate's HTTP surface. Each Lambda function mounts its own router from here, and
//! `tollgate serve` mounts all of them on one port: the handlers are the same code in
//! both places. Handlers are thin — parse, authorize, call the store, map the answer.

pub mod auth;
pub mod config;
pub mod error;
pub mod ingress;
pub mod jwt;
#[cfg(feature = "lambda")]
pub mod lambda;
pub mod replay;
pub mod request;
pub mod telemetry;

use std::sync::Arc;

use axum::Router;
use tollgate_store::RunStore;

pub use auth::{Auth, Claims, Role};
pub use config::{Backend, Config, ConfigError};
pub use error::ApiError;

/// What every handler needs, built once at cold start.
#[derive(Clone)]
pub struct Deps {
    pub store: Arc<dyn RunStore>,
    pub auth: Arc<Auth>,
}

impl Deps {
    pub fn new(store: Arc<dyn RunStore>, auth: Auth) -> Self {
        Self {
            store,
            auth: Arc::new(auth),
        }
    }

    /// Reads [`Config`] from the environment and connects the configured store.
    pub async fn from_env() -> Result<Self, ConfigError> {
        let config = Config::from_env().await?;
        let store = config.connect_store().await?;
        Ok(Self::new(store, Auth::new(config.secret.expose())))
    }
}

/// JSON 404/405 for anything no route claims, so every answer is JSON; one access-log
/// line per request.
fn with_fallbacks(router: Router) -> Router {
    router
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(axum::middleware::from_fn(access_log))
}

/// Method, route template (never the raw path's query or any header), status, latency.
async fn access_log(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
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

/// The `ingress` function's routes.
pub fn ingress_router(deps: Deps) -> Router {
    with_fallbacks(ingress::routes().with_state(deps))
}

/// The `replay` function's routes.
pub fn replay_router(deps: Deps) -> Router {
    with_fallbacks(replay::routes().with_state(deps))
}

/// Every route of every function, for `tollgate serve`.
pub fn app(deps: Deps) -> Router {
    with_fallbacks(ingress::routes().merge(replay::routes()).with_state(deps))
}
