//! Tollgate's HTTP surface. Each Lambda function mounts its own router from here, and
//! `tollgate serve` mounts all of them on one port: the handlers are the same code in
//! both places. Handlers are thin — parse, authorize, call the store, map the answer.

pub mod auth;
pub mod config;
pub mod error;
pub mod ingress;
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
        let config = Config::from_env()?;
        let store = config.connect_store().await?;
        Ok(Self::new(store, Auth::new(config.secret.expose())))
    }
}

/// JSON 404/405 for anything no route claims, so every answer is JSON.
fn with_fallbacks(router: Router) -> Router {
    router
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
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
