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
    /// An API Gateway WebSocket API's routes (docs/architecture.md §9).
    WebSocket,
    /// A DynamoDB Stream event source mapping that reports partial batch failures.
    Stream,
}

/// A set of HTTP routes. Two functions may serve the same set (`replay` buffered behind
/// the HTTP API, `replay-stream` streaming behind the Function URL); `tollgate serve`
/// mounts each set once.
///
/// A set is its name and the function that builds it — not a `match` over every set — so
/// a function binary links only its own handlers: its `main` names its own [`Function`]
/// constant, and the linker drops the other sets' code (each zip carries one set, not the
/// whole API).
#[derive(Clone, Copy)]
pub struct Routes {
    /// The set's name (for logs and comparisons).
    pub name: &'static str,
    build: fn() -> Router<Deps>,
}

impl PartialEq for Routes {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Routes {}

impl std::fmt::Debug for Routes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Routes").field(&self.name).finish()
    }
}

fn ingress_routes() -> Router<Deps> {
    ingress::routes()
        .merge(crate::live::routes())
        .merge(approvals::arm_routes())
        .merge(settlement::receipt_routes())
}

fn approvals_routes() -> Router<Deps> {
    approvals::decision_routes().merge(crate::notify::routes::routes())
}

fn replay_routes() -> Router<Deps> {
    replay::routes().merge(console::routes())
}

impl Routes {
    /// Create runs, append, end runs; arm and read approval cards; delivery receipts; the
    /// live endpoints (`GET /api/live`).
    pub const INGRESS: Routes = Routes {
        name: "ingress",
        build: ingress_routes,
    };
    /// Operator decisions and pending listings.
    pub const APPROVALS: Routes = Routes {
        name: "approvals",
        build: approvals_routes,
    };
    /// Approved execution: start, dispatch, settle, mutation records, reconciliation.
    pub const SETTLEMENT: Routes = Routes {
        name: "settlement",
        build: settlement::routes,
    };
    /// Sequenced replay and the live stream; the operator console (`/console`, its
    /// script and `/api/console/config`).
    pub const REPLAY: Routes = Routes {
        name: "replay",
        build: replay_routes,
    };

    /// The routes alone (no state, no fallbacks), for merging.
    pub fn routes(self) -> Router<Deps> {
        (self.build)()
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

/// `ingress`: Runs, appends, arming, receipts (HTTP API).
pub const INGRESS: Function = Function {
    name: "ingress",
    trigger: Trigger::Http { streaming: false },
    logical_id: "IngressFunction",
    routes: Some(Routes::INGRESS),
    callers: Callers::Anyone,
};

/// `approvals`: Operator decisions and listings (HTTP API).
pub const APPROVALS: Function = Function {
    name: "approvals",
    trigger: Trigger::Http { streaming: false },
    logical_id: "ApprovalsFunction",
    routes: Some(Routes::APPROVALS),
    callers: Callers::Anyone,
};

/// `settlement`: Approved execution (HTTP API).
pub const SETTLEMENT: Function = Function {
    name: "settlement",
    trigger: Trigger::Http { streaming: false },
    logical_id: "SettlementFunction",
    routes: Some(Routes::SETTLEMENT),
    callers: Callers::Anyone,
};

/// `timers`: Timer messages from SQS.
pub const TIMERS: Function = Function {
    name: "timers",
    trigger: Trigger::Sqs,
    logical_id: "TimersFunction",
    routes: None,
    callers: Callers::Anyone,
};

/// `stall-watch`: The per-minute sweep (EventBridge schedule).
pub const STALL_WATCH: Function = Function {
    name: "stall-watch",
    trigger: Trigger::Schedule,
    logical_id: "StallWatchFunction",
    routes: None,
    callers: Callers::Anyone,
};

/// `replay`: Replay, buffered (HTTP API).
pub const REPLAY: Function = Function {
    name: "replay",
    trigger: Trigger::Http { streaming: false },
    logical_id: "ReplayFunction",
    routes: Some(Routes::REPLAY),
    callers: Callers::Anyone,
};

/// `replay-stream`: Replay and the live stream (streaming Function URL).
pub const REPLAY_STREAM: Function = Function {
    name: "replay-stream",
    trigger: Trigger::Http { streaming: true },
    logical_id: "ReplayStreamFunction",
    routes: Some(Routes::REPLAY),
    callers: Callers::Anyone,
};

/// `operator-stream`: Operators' live streams (streaming Function URL of its own).
pub const OPERATOR_STREAM: Function = Function {
    name: "operator-stream",
    trigger: Trigger::Http { streaming: true },
    logical_id: "OperatorStreamFunction",
    routes: Some(Routes::REPLAY),
    callers: Callers::Operators,
};

/// `websocket`: The WebSocket API's routes (API Gateway WebSocket API).
pub const WEBSOCKET: Function = Function {
    name: "websocket",
    trigger: Trigger::WebSocket,
    logical_id: "WebSocketFunction",
    routes: None,
    callers: Callers::Anyone,
};

/// `fanout`: New events to WebSocket subscribers (the events table's DynamoDB Stream).
pub const FANOUT: Function = Function {
    name: "fanout",
    trigger: Trigger::Stream,
    logical_id: "FanoutFunction",
    routes: None,
    callers: Callers::Anyone,
};

/// `notifier`: Card events to notification sinks (the events table's DynamoDB Stream,
/// filtered to card events) and their retries (a schedule, every minute).
pub const NOTIFIER: Function = Function {
    name: "notifier",
    trigger: Trigger::Stream,
    logical_id: "NotifierFunction",
    routes: None,
    callers: Callers::Anyone,
};

/// Every function, in the order they are listed everywhere else. A function's `main`
/// names its own constant instead, so that it links only its own routes.
pub static FUNCTIONS: &[Function] = &[
    INGRESS,
    APPROVALS,
    SETTLEMENT,
    TIMERS,
    STALL_WATCH,
    REPLAY,
    REPLAY_STREAM,
    OPERATOR_STREAM,
    WEBSOCKET,
    FANOUT,
    NOTIFIER,
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
/// the environment (`Deps::from_env`), failing start-up with a clear log line.
pub async fn start(function: &Function) -> Result<Deps, ConfigError> {
    crate::telemetry::init(true);
    Deps::from_env()
        .await
        .inspect_err(|e| tracing::error!(function = function.name, error = %e, "start-up failed"))
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
                Routes::INGRESS,
                Routes::APPROVALS,
                Routes::SETTLEMENT,
                Routes::REPLAY
            ]
        );
    }

    #[test]
    fn only_the_operator_stream_is_for_operators_only() {
        for f in FUNCTIONS {
            let expected = match f.name {
                "operator-stream" => Callers::Operators,
                _ => Callers::Anyone,
            };
            assert_eq!(f.callers, expected, "{}", f.name);
        }
        assert_eq!(OPERATOR_STREAM.callers, Callers::Operators);
    }

    #[test]
    fn every_route_set_merges_into_one_app() {
        // Merging panics on a route mounted twice.
        let _ = all_routes();
    }
}
