//! Issue 8's lifecycle cost: what one reference lifecycle costs on AWS on demand in
//! us-east-1, counted operation by operation on DynamoDB Local (needs an endpoint; `make
//! test` starts one).
//!
//! The reference lifecycle, as a client drives it over HTTP: a run is created with a
//! budget for one `create_dashboard` call; the agent arms a card; the card waits through
//! 60 s of `tool.approval_pending` heartbeats at 20 s intervals — three beats, here 1 s
//! apart — and an operator approves it (scope once); the agent starts, dispatches and
//! settles (confirmed) the mutation, then completes the run; every timer still queued
//! (the card's expiry, the fourth heartbeat, the settlement deadline, the first
//! execution heartbeat) arrives and finds nothing to do. The card's timeout and the
//! execution timers are shortened with it; the messages sent are the same as with the
//! defaults (300 s expiry, one message under SQS's 15-minute delay cap; 60 s deadline;
//! 15 s execution heartbeat, after which a prompt settlement has happened).
//!
//! Every DynamoDB call goes through a metered client ([`Meter`]), every timer through a
//! counting queue and handler, every HTTP request is counted by the client. The bill is
//! printed; the test holds it to the goal (≤ $0.0001) and runs the lifecycle twice to
//! hold the counts to being deterministic.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tollgate_api::{Auth, Deps, GateConfig};
use tollgate_domain::execution::ExecutionSettings;
use tollgate_tests::meter::{Bill, Meter};
use tollgate_tests::{aws_endpoint_configured, dynamo_store, TestServer, TEST_SECRET};
use tollgate_timers::EmbeddedTimers;

/// Issue 8's goal for one reference lifecycle.
const GOAL_USD: f64 = 0.0001;
const TOOL: &str = "create_dashboard";
/// 60 s of heartbeats at 20 s intervals.
const BEATS: u64 = 3;
/// Bound of every wait.
const WAIT: Duration = Duration::from_secs(30);

/// What the lifecycle makes, call by call (`Bill::counts` without the units). The
/// DynamoDB calls are the store's as it stands: a change that saves (or adds) a call
/// changes them here on purpose. By step — create run: 3 Query (leftovers of an earlier
/// run of the id: events, cards, mutation records) + 1 TransactWriteItems;
/// arm: 4 GetItem + 1 BatchGetItem + 1 TransactWriteItems; each heartbeat: 1
/// TransactGetItems + 1 TransactWriteItems; approve: 1 BatchGetItem + 1
/// TransactWriteItems; start: 1 GetItem + 1 TransactGetItems + 1 Query + 1
/// TransactWriteItems; dispatch and settle: 1 TransactGetItems + 1 Query + 1
/// TransactWriteItems each; complete: 1 GetItem + 1 TransactWriteItems; the timers that
/// find nothing to do (fourth heartbeat, execution heartbeat, deadline, expiry): 3
/// TransactGetItems + 1 Query + 1 BatchGetItem.
const EXPECTED: &[(&str, u64)] = &[
    ("API Gateway HTTP API requests", 7),
    ("DynamoDB BatchGetItem", 3),
    ("DynamoDB GetItem", 6),
    ("DynamoDB Query", 8),
    ("DynamoDB TransactGetItems", 10),
    ("DynamoDB TransactWriteItems", 10),
    ("Lambda approvals invocations", 1),
    ("Lambda ingress invocations", 3),
    ("Lambda settlement invocations", 3),
    // expiry 1, approval heartbeats 4 (3 written, the fourth finds the card decided),
    // settlement deadline 1, execution heartbeat 1
    ("Lambda timers invocations", 7),
    ("SQS DeleteMessage", 7),
    ("SQS ReceiveMessage", 7),
    ("SQS SendMessage", 7),
];

/// The reference lifecycle's settings, shortened, with seconds of margin around every
/// step so a loaded machine does not add a beat: beats 2 s apart, the card expires 10 s
/// after arming (after the approval at ~6 s and the fourth beat at ~8 s), an execution
/// heartbeat 3 s after dispatch and the settlement deadline 5 s after start (both after
/// the prompt settlement).
fn gate() -> GateConfig {
    GateConfig {
        heartbeat_every: Duration::from_secs(2),
        execution: ExecutionSettings {
            settlement_deadline_ms: 5_000,
            heartbeat_interval_ms: 3_000,
        },
        ..GateConfig::default()
    }
}
const CARD_TIMEOUT_SECONDS: u64 = 10;

/// What one lifecycle cost, and the DynamoDB operations of each step.
struct Lifecycle {
    bill: Bill,
    steps: Vec<(&'static str, BTreeMap<String, u64>)>,
    events: Vec<String>,
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

async fn lifecycle() -> Lifecycle {
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

/// GIVEN the reference lifecycle driven over HTTP on DynamoDB, every operation counted
/// WHEN it is priced at us-east-1 on-demand prices
/// THEN it costs at most $0.0001, and a second run counts exactly the same operations.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_reference_lifecycle_costs_at_most_a_hundredth_of_a_cent() {
    if !aws_endpoint_configured() {
        println!("skipped: no DynamoDB endpoint (set AWS_ENDPOINT_URL_DYNAMODB; `make test` starts DynamoDB Local)");
        return;
    }
    let first = lifecycle().await;
    assert_eq!(
        first.events,
        [
            "run_started",
            "tool.approval_required",
            "tool.approval_pending",
            "tool.approval_pending",
            "tool.approval_pending",
            "tool.approval_resolved",
            "tool_execution_started",
            "tool_execution",
            "run_completed",
        ],
        "the lifecycle as the stream tells it"
    );
    println!("DynamoDB operations per step of the lifecycle:");
    for (step, ops) in &first.steps {
        let ops: Vec<String> = ops.iter().map(|(op, n)| format!("{op} ×{n}")).collect();
        println!("  {step:<24} {}", ops.join(", "));
    }
    println!(
        "\nReference lifecycle, us-east-1 on demand:\n{}",
        first.bill.render()
    );
    let total = first.bill.total_usd();
    println!(
        "total ${total:.8} per lifecycle = {:.1}% of the ${GOAL_USD} goal; {:.0} lifecycles per dollar",
        100.0 * total / GOAL_USD,
        1.0 / total
    );

    let counted: BTreeMap<String, u64> = first
        .bill
        .counts()
        .into_iter()
        .filter(|(what, _)| !what.ends_with("×10"))
        .collect();
    let expected: BTreeMap<String, u64> =
        EXPECTED.iter().map(|(w, n)| (w.to_string(), *n)).collect();
    assert_eq!(
        counted, expected,
        "the operations of the reference lifecycle"
    );

    let second = lifecycle().await;
    assert_eq!(second.events, first.events);
    assert_eq!(
        second.bill.counts(),
        first.bill.counts(),
        "two runs of the lifecycle count the same operations and units"
    );
    assert!(
        total <= GOAL_USD,
        "the reference lifecycle costs ${total:.8}, over the ${GOAL_USD} goal"
    );
}
