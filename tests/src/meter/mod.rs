//! What a scenario costs on AWS: every DynamoDB, SQS and Lambda operation it makes,
//! counted where it happens and priced as AWS bills it on demand in us-east-1.
//!
//! - [`DynamoMeter`]: an SDK interceptor on a [`DynamoStore`]'s client. It logs every
//!   operation the store sends (by name, with what it names), asks for
//!   `ReturnConsumedCapacity=INDEXES` on every operation that takes it, and keeps what
//!   DynamoDB answered. [`MeterLog::bill_calls`] then bills each call with DynamoDB's own
//!   sizing rules ([`item_size`]) — writes 1 WRU per started KB per item and per index
//!   entry, transactional writes double (ConditionCheck items included), reads 1 RRU per
//!   started 4 KB strongly consistent, ½ eventually consistent, 2 per item in
//!   `TransactGetItems`, a `Query` on the total it read — and takes the larger of that
//!   model and the capacity DynamoDB reported for the call. The report alone is not
//!   enough: DynamoDB Local reports nothing for a read that finds nothing (AWS bills the
//!   minimum), and older versions of it do not double transactional writes.
//! - [`CountingTimers`] / [`CountingHandler`]: the timer port and its consumer, counted.
//!   A scheduled timer is one SQS `SendMessage`; a delivered one is one `ReceiveMessage`
//!   and one `DeleteMessage` (the event source mapping) and one invocation of the
//!   `timers` function.
//! - [`Meter`]: the three together plus the HTTP requests a client makes (one API
//!   Gateway HTTP API request and one Lambda invocation each); [`Meter::bill`] prices
//!   them into a [`Bill`].
//!
//! Prices are constants with their source date ([`prices`]); free tiers are ignored.
//!
//! The parts: `model` (DynamoDB's sizing rules, the tables' keys and indexes, what a
//! write costs), `calls` (the log of the calls a store sent, each billed), `interceptor`
//! (the SDK interceptor that fills that log), `timers` (the counted timer port and
//! consumer), `bill` (usage priced into a report) and [`prices`]; this module holds the
//! [`Meter`] over them all.

mod bill;
mod calls;
pub mod delivery;
mod interceptor;
mod model;
pub mod prices;
pub mod template;
mod timers;

pub use bill::*;
pub use calls::*;
pub use interceptor::*;
pub use model::*;
pub use timers::*;

use std::sync::{Arc, Mutex, PoisonError};

use tollgate_store::dynamo::DynamoStore;
use tollgate_timers::{TimerHandler, TimerQueue};

/// One HTTP request a client made: one API Gateway request, one Lambda invocation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct HttpRequest {
    /// The function that serves it (`ingress`, `approvals`, `settlement`, `replay`).
    pub function: &'static str,
    /// `POST /api/runs/{id}/tool-approvals`.
    pub route: String,
}

/// The function serving `route` (`METHOD /api/...` with placeholders), as the registry
/// in `tollgate_api::functions` splits the routes.
pub fn function_of(route: &str) -> &'static str {
    let (method, path) = route.split_once(' ').unwrap_or(("GET", route));
    if path.contains("/tool-calls/") || path.contains("/mutations") {
        "settlement"
    } else if path.ends_with("/tool-approvals")
        || path.ends_with("/tool-denials")
        || path.starts_with("/api/approvals")
        || path.starts_with("/api/policies")
        || (method == "GET" && path.ends_with("/approvals"))
    {
        "approvals"
    } else if method == "GET" && (path.contains("/events") || path.ends_with("/stream")) {
        "replay"
    } else {
        "ingress"
    }
}

/// Everything a scenario makes on AWS: DynamoDB calls through a metered store, timer
/// messages through a counting queue and handler, HTTP requests as the client reports
/// them. Cheap to clone; all clones are one meter.
#[derive(Clone)]
pub struct Meter {
    pub dynamo: DynamoMeter,
    pub timers: Arc<TimerCounts>,
    http: Arc<Mutex<Vec<HttpRequest>>>,
    /// The unmetered client, to read final images for the bill.
    plain: aws_sdk_dynamodb::Client,
    pub lambda: LambdaAssumption,
}

impl Meter {
    /// A meter and a store on `store`'s tables whose every DynamoDB call it meters.
    pub fn new(store: &DynamoStore) -> (Self, DynamoStore) {
        let dynamo = DynamoMeter::new(store.tables());
        let metered = dynamo.instrument(store);
        let meter = Self {
            dynamo,
            timers: Arc::default(),
            http: Arc::default(),
            plain: store.client().clone(),
            lambda: LambdaAssumption::default(),
        };
        (meter, metered)
    }

    /// `inner`, counting what it schedules.
    pub fn timer_queue<Q: TimerQueue>(&self, inner: Q) -> CountingTimers<Q> {
        CountingTimers::new(inner, self.timers.clone())
    }

    /// `inner`, counting what it is delivered.
    pub fn timer_handler(&self, inner: Arc<dyn TimerHandler>) -> Arc<dyn TimerHandler> {
        Arc::new(CountingHandler::new(inner, self.timers.clone()))
    }

    /// Records one HTTP request on `route` (`POST /api/runs/{id}/complete`).
    pub fn http_request(&self, route: &str) {
        self.http
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(HttpRequest {
                function: function_of(route),
                route: route.to_owned(),
            });
    }

    /// Forgets everything counted so far.
    pub fn reset(&self) {
        self.dynamo.take();
        self.http
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.timers.tally.send_replace(TimerTally::default());
    }

    /// What everything counted so far costs (reads the final image of every item
    /// written, through the unmetered client, to size updates nobody read back).
    pub async fn bill(&self) -> Bill {
        let log = self.dynamo.snapshot();
        let finals = self.dynamo.final_images(&self.plain, &log).await;
        let calls = log.bill_calls(self.dynamo.tables(), &finals);
        let usage = Usage {
            dynamo: DynamoUsage::from_calls(&calls),
            timers: self.timers.tally(),
            http: self
                .http
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        };
        Bill::price(&usage, self.lambda)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_map_to_their_functions() {
        assert_eq!(function_of("POST /api/runs"), "ingress");
        assert_eq!(
            function_of("POST /api/runs/{id}/approval-requests"),
            "ingress"
        );
        assert_eq!(
            function_of("POST /api/runs/{id}/tool-approvals"),
            "approvals"
        );
        assert_eq!(function_of("GET /api/approvals?state=pending"), "approvals");
        assert_eq!(
            function_of("POST /api/runs/{id}/tool-calls/{tool_call_id}/start"),
            "settlement"
        );
        assert_eq!(function_of("GET /api/runs/{id}/events?after=0"), "replay");
        assert_eq!(function_of("POST /api/runs/{id}/complete"), "ingress");
    }
}
