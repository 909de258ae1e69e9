//! The reference lifecycle, driven over HTTP on DynamoDB with every operation counted
//! (docs/architecture.md §6, §7): a run is created with a budget for one
//! `create_dashboard` call; the agent arms a card; the card waits through 60 s of
//! `tool.approval_pending` heartbeats at 20 s intervals — three beats, here 2 s apart —
//! and an operator approves it (scope once); the agent starts, dispatches and settles
//! (confirmed) the mutation, then completes the run; every timer still queued (the
//! card's expiry, the fourth heartbeat, the settlement deadline, the first execution
//! heartbeat) arrives and finds nothing to do. The card's timeout and the execution
//! timers are shortened with it; the messages sent are the same as with the defaults
//! (300 s expiry, one message under SQS's 15-minute delay cap; 60 s deadline; 15 s
//! execution heartbeat, after which a prompt settlement has happened).
//!
//! Every DynamoDB call goes through a metered client ([`Meter`]), every timer through a
//! counting queue and handler, every HTTP request is counted by the client.
//! `tests/lifecycle_cost.rs` holds its bill to the goal; `make bench` prices it with
//! each live-delivery mode ([`crate::meter::delivery`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tollgate_api::{Auth, Deps, GateConfig};
use tollgate_domain::execution::ExecutionSettings;
use tollgate_timers::EmbeddedTimers;

use crate::meter::{Bill, Meter};
use crate::{dynamo_store, TestServer, TEST_SECRET};

const TOOL: &str = "create_dashboard";
/// 60 s of heartbeats at 20 s intervals.
pub const BEATS: u64 = 3;
/// Bound of every wait.
const WAIT: Duration = Duration::from_secs(30);

/// The reference lifecycle's settings, shortened, with seconds of margin around every
/// step so a loaded machine does not add a beat: beats 2 s apart, the card expires 10 s
/// after arming (after the approval at ~6 s and the fourth beat at ~8 s), an execution
/// heartbeat 3 s after dispatch and the settlement deadline 5 s after start (both after
/// the prompt settlement).
pub fn gate() -> GateConfig {
    GateConfig {
        heartbeat_every: Duration::from_secs(2),
        execution: ExecutionSettings {
            settlement_deadline_ms: 5_000,
            heartbeat_interval_ms: 3_000,
        },
        ..GateConfig::default()
    }
}
pub const CARD_TIMEOUT_SECONDS: u64 = 10;

/// What one lifecycle cost, and the DynamoDB operations of each step.
pub struct Lifecycle {
    pub bill: Bill,
    /// DynamoDB operations per step.
    pub steps: Vec<(&'static str, BTreeMap<String, u64>)>,
    /// The run's event types as the stream tells them, in order.
    pub events: Vec<String>,
}

/// The client side: each request counted on the meter before it is sent.
struct Client<'a> {
    srv: &'a TestServer,
    meter: &'a Meter,
}

impl Client<'_> {
    async fn post(&self, route: &str, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.meter.http_request(route);
        self.srv.post(path, token, &body).await
    }
}

/// DynamoDB calls per operation since `before` (a snapshot of the cumulative counts).
fn since(meter: &Meter, before: &mut BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let now = meter.dynamo.snapshot().operations();
    let diff = now
        .iter()
        .filter_map(|(op, n)| {
            let d = n - before.get(op).copied().unwrap_or(0);
            (d > 0).then(|| (op.clone(), d))
        })
        .collect();
    *before = now;
    diff
}

/// Drives one reference lifecycle on the DynamoDB endpoint configured (needs one).
pub async fn lifecycle() -> Lifecycle {
    let (meter, store) = Meter::new(&dynamo_store().await);
    let queue = EmbeddedTimers::new();
    let deps = Deps::new(
        Arc::new(store),
        Arc::new(meter.timer_queue(queue.clone())),
        gate(),
        Auth::new(TEST_SECRET.as_bytes()),
    );
    // Timers in this process as `Deps::embedded` wires them, with each delivery counted
    // (no sweeper: deployed, it is the `stall-watch` schedule, not part of a lifecycle).
    let timer_loop = queue.attach(meter.timer_handler(deps.gate.clone()));
    let srv = TestServer::with_deps(deps).await;
    let client = Client {
        srv: &srv,
        meter: &meter,
    };
    let mut seen = BTreeMap::new();
    let mut steps = Vec::new();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (request_id, tool_call_id, approval_id) = (
        format!("req-{}", &id[..12]),
        format!("call-{}", &id[..12]),
        format!("approval-{}", &id[..12]),
    );

    // GIVEN a run with a budget for one create_dashboard call
    let (status, run) = client
        .post(
            "POST /api/runs",
            "/api/runs",
            &srv.agent_token,
            json!({"budget": {"tools": {TOOL: 1}, "call_ceiling": 1}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "create: {run}");
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let token = run["run_token"].as_str().unwrap().to_owned();
    steps.push(("create run", since(&meter, &mut seen)));

    // WHEN the agent arms a card
    let (status, card) = client
        .post(
            "POST /api/runs/{id}/approval-requests",
            &format!("/api/runs/{run_id}/approval-requests"),
            &token,
            json!({"request_id": request_id, "tool_name": TOOL, "tool_call_id": tool_call_id,
                   "approval_id": approval_id, "arguments_hash": format!("sha256:{:064x}", 7),
                   "message": "The agent wants to create a dashboard.",
                   "timeout_seconds": CARD_TIMEOUT_SECONDS}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "arm: {card}");
    steps.push(("arm card", since(&meter, &mut seen)));

    // AND it waits through three heartbeats
    assert!(
        meter
            .timers
            .wait_for(WAIT, |t| t.acked.get("approval_heartbeat") >= Some(&BEATS))
            .await,
        "three heartbeats: {:?}",
        meter.timers.tally()
    );
    steps.push(("3 heartbeats (timers)", since(&meter, &mut seen)));

    // AND an operator approves it, once
    let (status, decision) = client
        .post(
            "POST /api/runs/{id}/tool-approvals",
            &format!("/api/runs/{run_id}/tool-approvals"),
            &srv.operator_token,
            json!({"request_id": request_id, "scope": "once"}),
        )
        .await;
    assert_eq!(
        (status, decision["state"].as_str()),
        (StatusCode::OK, Some("approved")),
        "approve: {decision}"
    );
    steps.push(("approve", since(&meter, &mut seen)));

    // AND the agent starts, dispatches and settles the call, then completes the run
    let call = format!("/api/runs/{run_id}/tool-calls/{tool_call_id}");
    let (status, started) = client
        .post(
            "POST /api/runs/{id}/tool-calls/{tool_call_id}/start",
            &format!("{call}/start"),
            &token,
            json!({"request_id": request_id, "approval_id": approval_id, "tool_name": TOOL,
                   "arguments_hash": format!("sha256:{:064x}", 7)}),
        )
        .await;
    assert_eq!(
        (status, started["state"].as_str()),
        (StatusCode::OK, Some("intent")),
        "start: {started}"
    );
    assert!(started["sequence"].is_u64(), "start: {started}");
    steps.push(("start", since(&meter, &mut seen)));
    let (status, dispatched) = client
        .post(
            "POST /api/runs/{id}/tool-calls/{tool_call_id}/dispatch",
            &format!("{call}/dispatch"),
            &token,
            json!({"approval_id": approval_id}),
        )
        .await;
    assert_eq!(
        (status, dispatched["state"].as_str()),
        (StatusCode::OK, Some("dispatched")),
        "dispatch: {dispatched}"
    );
    steps.push(("dispatch", since(&meter, &mut seen)));
    let (status, settled) = client
        .post(
            "POST /api/runs/{id}/tool-calls/{tool_call_id}/settle",
            &format!("{call}/settle"),
            &token,
            json!({"approval_id": approval_id, "evidence": "confirmed",
                   "result": {"dashboard_id": "dash-1", "url": "https://example.com/d/dash-1"}}),
        )
        .await;
    assert_eq!(
        (status, settled["state"].as_str()),
        (StatusCode::OK, Some("completed")),
        "settle: {settled}"
    );
    steps.push(("settle", since(&meter, &mut seen)));
    let (status, completed) = client
        .post(
            "POST /api/runs/{id}/complete",
            &format!("/api/runs/{run_id}/complete"),
            &token,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "complete: {completed}");
    steps.push(("complete run", since(&meter, &mut seen)));

    // AND every timer still queued arrives and is acknowledged
    assert!(
        meter.timers.wait_for(WAIT, |t| t.settled()).await,
        "every timer handled: {:?}",
        meter.timers.tally()
    );
    steps.push(("remaining timers", since(&meter, &mut seen)));
    let bill = meter.bill().await;
    timer_loop.shutdown().await;

    // THEN the stream tells the lifecycle (read after billing: not part of it)
    let events: Vec<String> = srv
        .replay_all(&run_id, &srv.operator_token, 100)
        .await
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect();
    Lifecycle {
        bill,
        steps,
        events,
    }
}
