//! The one registry of Tollgate's Lambda functions. `tollgate serve` mounts the HTTP
//! functions' routes from it, the function mains start from it, and the template tests
//! hold `infra/template.yaml` and the Makefile's `FUNCTIONS :=` list to it — adding a
//! function starts here.

use axum::Router;

use crate::{approvals, console, ingress, replay, settlement, ConfigError, Deps};

/// What invokes a function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// API Gateway HTTP API routes or a Function URL; `streaming`: answered in Lambda's
    /// response-streaming mode (a Function URL with `InvokeMode: RESPONSE_STREAM`).
    Http { streaming: bool },
    /// An SQS event source mapping that reports partial batch failures.
    Sqs,
    /// An EventBridge schedule.
    Schedule,
}

/// A set of HTTP routes. Two functions may serve the same set (`replay` buffered behind
/// the HTTP API, `replay-stream` streaming behind the Function URL); `tollgate serve`
/// mounts each set once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routes {
    /// Create runs, append, end runs; arm and read approval cards; delivery receipts.
    Ingress,
    /// Operator decisions and pending listings.
    Approvals,
    /// Approved execution: start, dispatch, settle, mutation records, reconciliation.
    Settlement,
    /// Sequenced replay and the live stream; the operator console (`/console`, its
    /// script and `/api/console/config`).
    Replay,
}

impl Routes {
    /// The routes alone (no state, no fallbacks), for merging.
    pub fn routes(self) -> Router<Deps> {
        match self {
            Routes::Ingress => ingress::routes()
                .merge(approvals::arm_routes())
                .merge(settlement::receipt_routes()),
            Routes::Approvals => approvals::decision_routes(),
            Routes::Settlement => settlement::routes(),
            Routes::Replay => replay::routes().merge(console::routes()),
        }
    }

    /// A whole function's router: these routes, JSON 404/405 for anything else, the
    /// access log.
    pub fn router(self, deps: Deps) -> Router {
        let routes = self.routes().with_state(deps.clone());
        crate::with_fallbacks(routes, &deps)
    }
}

/// Whose requests an HTTP function answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Callers {
    /// Every caller its routes admit.
    #[default]
    Anyone,
    /// Operator tokens only, on every route: no token is 401, any other 403, before
    /// anything is read or even the path parsed. A function of its own (with its own
    /// reserved concurrency) for operators' live streams, so agents waiting on their
    /// cards cannot hold every place on the streaming endpoint.
    Operators,
}

/// One Lambda function: a crate `functions/<name>` whose binary is `<name>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Function {
    /// The binary (and crate, and `BuildProperties.Binary` in the template).
    pub name: &'static str,
    pub trigger: Trigger,
    /// The `AWS::Serverless::Function` resource in `infra/template.yaml`.
    pub logical_id: &'static str,
    /// What an HTTP function serves; `None` for the others.
    pub routes: Option<Routes>,
    /// Whose requests it answers.
    pub callers: Callers,
}

impl Function {
    /// The router of an HTTP function (`None` for SQS and schedule functions).
    pub fn router(&self, deps: Deps) -> Option<Router> {
        let deps = deps.with_callers(self.callers);
        self.routes.map(|routes| routes.router(deps))
    }
}

/// Every function, in the order they are listed everywhere else.
pub static FUNCTIONS: &[Function] = &[
    Function {
        name: "ingress",
        trigger: Trigger::Http { streaming: false },
        logical_id: "IngressFunction",
        routes: Some(Routes::Ingress),
        callers: Callers::Anyone,
    },
    Function {
        name: "approvals",
        trigger: Trigger::Http { streaming: false },
        logical_id: "ApprovalsFunction",
        routes: Some(Routes::Approvals),
        callers: Callers::Anyone,
    },
    Function {
        name: "settlement",
        trigger: Trigger::Http { streaming: false },
        logical_id: "SettlementFunction",
        routes: Some(Routes::Settlement),
        callers: Callers::Anyone,
    },
    Function {
        name: "timers",
        trigger: Trigger::Sqs,
        logical_id: "TimersFunction",
        routes: None,
        callers: Callers::Anyone,
    },
    Function {
        name: "stall-watch",
        trigger: Trigger::Schedule,
        logical_id: "StallWatchFunction",
        routes: None,
        callers: Callers::Anyone,
    },
    Function {
        name: "replay",
        trigger: Trigger::Http { streaming: false },
        logical_id: "ReplayFunction",
        routes: Some(Routes::Replay),
        callers: Callers::Anyone,
    },
    Function {
        name: "replay-stream",
        trigger: Trigger::Http { streaming: true },
        logical_id: "ReplayStreamFunction",
        routes: Some(Routes::Replay),
        callers: Callers::Anyone,
    },
    Function {
        name: "operator-stream",
        trigger: Trigger::Http { streaming: true },
        logical_id: "OperatorStreamFunction",
        routes: Some(Routes::Replay),
        callers: Callers::Operators,
    },
];

/// The function called `name`.
pub fn function(name: &str) -> Option<&'static Function> {
    FUNCTIONS.iter().find(|f| f.name == name)
}

/// The function whose template resource is `logical_id`.
pub fn by_logical_id(logical_id: &str) -> Option<&'static Function> {
    FUNCTIONS.iter().find(|f| f.logical_id == logical_id)
}

/// Every HTTP route set, each once, in registry order.
pub fn route_sets() -> Vec<Routes> {
    let mut sets: Vec<Routes> = Vec::new();
    for routes in FUNCTIONS.iter().filter_map(|f| f.routes) {
        if !sets.contains(&routes) {
            sets.push(routes);
        }
    }
    sets
}

/// Every route of every HTTP function (each set once), without state or fallbacks.
pub fn all_routes() -> Router<Deps> {
    route_sets()
        .into_iter()
        .fold(Router::new(), |app, routes| app.merge(routes.routes()))
}

/// The one-time wiring every function `main` starts with: JSON logs, then [`Deps`] from
/// the environment (`Deps::from_env`), failing start-up with a clear log line. `name`
/// must be in [`FUNCTIONS`].
pub async fn start(name: &str) -> Result<(&'static Function, Deps), ConfigError> {
    crate::telemetry::init(true);
    let result = match function(name) {
        Some(f) => Deps::from_env().await.map(|deps| (f, deps)),
        None => Err(ConfigError::Invalid(format!(
            "{name} is not a Tollgate function (see tollgate_api::functions::FUNCTIONS)"
        ))),
    };
    result.inspect_err(|e| tracing::error!(function = name, error = %e, "start-up failed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_logical_ids_are_unique_and_http_functions_have_routes() {
        for (i, f) in FUNCTIONS.iter().enumerate() {
            for g in &FUNCTIONS[i + 1..] {
                assert_ne!(f.name, g.name);
                assert_ne!(f.logical_id, g.logical_id);
            }
            assert_eq!(
                f.routes.is_some(),
                matches!(f.trigger, Trigger::Http { .. }),
                "{}",
                f.name
            );
            assert_eq!(function(f.name), Some(f));
            assert_eq!(by_logical_id(f.logical_id), Some(f));
        }
        assert_eq!(
            route_sets(),
            [
                Routes::Ingress,
                Routes::Approvals,
                Routes::Settlement,
                Routes::Replay
            ]
        );
    }

    #[test]
    fn every_route_set_merges_into_one_app() {
        // Merging panics on a route mounted twice.
        let _ = all_routes();
    }
}
