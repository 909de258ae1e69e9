//! Approved execution and durable mutation outcomes (seed 000, docs/architecture.md §5 and §7) through
//! HTTP and the replayed stream only — on the embedded store and on DynamoDB (the
//! `dynamo::` tests need an endpoint; `make test` starts DynamoDB Local). Timers (card
//! expiry, settlement deadline, execution heartbeats) run on the embedded queue, as in
//! `tollgate serve`, with short settings so every test stays within seconds.
//!
//! The seed's three examples (success, pre-dispatch expiry, dispatched timeout) and a
//! fourth of ours (late settlement) are golden transcripts in
//! `fixtures/approved_execution_v2.json`, one key each, as seed 000's producer fixture
//! is: the lifecycle events of the
//! replayed stream (identities normalised, timestamps removed, a run of heartbeats
//! collapsed to one entry with its sequence offset removed), the HTTP answers of each
//! step and the durable `mutation_outcome/v1` record. Both stores must produce the same
//! transcript. `TOLLGATE_BLESS=1` writes the fixtures instead of comparing.
//!
//! By behaviour: `golden` (the transcripts), `start`, `settle` (the evidence table,
//! deadline fencing, terminal runs), `reconcile`, `budget` (refusals and receipts),
//! `input` (bad input) and `backstop` (lost timers); every test runs on both stores
//! through [`tollgate_tests::for_each_backend!`].

mod backstop;
mod budget;
mod golden;
mod input;
mod reconcile;
mod settle;
mod start;

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Map, Value};
use tollgate_api::{GateConfig, Role};
use tollgate_domain::execution::ExecutionSettings;
use tollgate_tests::{store_for, Backend, TestServer};

const TOOL: &str = "mcp__last9__create_dashboard";
/// The settlement deadline of the tests about it. Long enough that the few requests a
/// test sends before it (start, dispatch, a refused reconcile) land inside it on a loaded
/// machine; short enough that waiting past it keeps the tests quick.
const DEADLINE_MS: i64 = 3_000;
/// The settlement deadline of [`patient_server`]: far beyond any test, for the tests that
/// are not about the deadline (on a loaded machine a few requests on DynamoDB Local can
/// outlast [`DEADLINE_MS`], and the deadline would settle the attempt under them).
const PATIENT_DEADLINE_MS: i64 = 600_000;
const BEAT_MS: i64 = 300;
/// Bound of every poll.
const WAIT: Duration = Duration::from_secs(10);

/// A server whose attempts settle at [`DEADLINE_MS`]: for the tests about the deadline.
async fn server(backend: Backend) -> TestServer {
    server_with_deadline(backend, DEADLINE_MS).await
}

/// A server whose deadline never falls inside a test ([`PATIENT_DEADLINE_MS`]).
async fn patient_server(backend: Backend) -> TestServer {
    server_with_deadline(backend, PATIENT_DEADLINE_MS).await
}

async fn server_with_deadline(backend: Backend, deadline_ms: i64) -> TestServer {
    TestServer::with_deps(TestServer::deps(
        store_for(backend).await,
        GateConfig {
            // No approval heartbeats in these transcripts: cards are decided promptly.
            heartbeat_every: Duration::from_secs(60),
            execution: ExecutionSettings {
                settlement_deadline_ms: deadline_ms,
                heartbeat_interval_ms: BEAT_MS,
            },
            ..GateConfig::default()
        },
    ))
    .await
}

fn short_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

struct Run {
    id: String,
    token: String,
}

/// One approval attempt of a tool call: its card and its identity.
#[derive(Clone)]
struct Call {
    tool_name: String,
    tool_call_id: String,
    approval_id: String,
    request_id: String,
}

impl Call {
    fn new(tool_name: &str) -> Self {
        Self::of(tool_name, &format!("write-{}", short_id()))
    }

    /// A fresh approval attempt of the tool call `tool_call_id`.
    fn of(tool_name: &str, tool_call_id: &str) -> Self {
        Self {
            tool_name: tool_name.to_owned(),
            tool_call_id: tool_call_id.to_owned(),
            approval_id: format!("approval-{}", short_id()),
            request_id: format!("req-{}", short_id()),
        }
    }

    fn arm_body(&self) -> Value {
        json!({"request_id": self.request_id, "tool_name": self.tool_name,
               "tool_call_id": self.tool_call_id, "approval_id": self.approval_id})
    }

    fn start_body(&self) -> Value {
        json!({"request_id": self.request_id, "approval_id": self.approval_id,
               "tool_name": self.tool_name})
    }
}

async fn new_run(srv: &TestServer, body: Value) -> Run {
    let (id, token) = srv.create_run(body).await;
    Run { id, token }
}

/// A run whose budget lists `tools` (max starts each) with a ceiling of 10.
async fn budget_run(srv: &TestServer, tools: Value) -> Run {
    new_run(
        srv,
        json!({"channel_id": "C1", "budget": {"tools": tools, "call_ceiling": 10}}),
    )
    .await
}

async fn arm_with(srv: &TestServer, run: &Run, body: Value) -> (StatusCode, Value) {
    srv.post(
        &format!("/api/runs/{}/approval-requests", run.id),
        &run.token,
        &body,
    )
    .await
}

async fn arm(srv: &TestServer, run: &Run, call: &Call) -> Value {
    let (status, v) = arm_with(srv, run, call.arm_body()).await;
    assert_eq!(status, StatusCode::CREATED, "arm: {v}");
    assert_eq!(v["state"], "pending", "{v}");
    v
}

async fn decide(srv: &TestServer, run: &Run, verb: &str, body: Value) -> (StatusCode, Value) {
    srv.post_until_served(
        &format!("/api/runs/{}/{verb}", run.id),
        &srv.operator_token,
        &body,
    )
    .await
}

async fn approve(srv: &TestServer, run: &Run, call: &Call) -> Value {
    let (status, v) = decide(
        srv,
        run,
        "tool-approvals",
        json!({"request_id": call.request_id, "scope": "once"}),
    )
    .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("approved")),
        "approve: {v}"
    );
    v
}

/// Arms and approves (once, by a human) a new call of `tool`.
async fn approved(srv: &TestServer, run: &Run, tool: &str) -> Call {
    let call = Call::new(tool);
    arm(srv, run, &call).await;
    approve(srv, run, &call).await;
    call
}

async fn start(srv: &TestServer, run: &Run, call: &Call) -> (StatusCode, Value) {
    start_with(srv, run, &call.tool_call_id, call.start_body()).await
}

async fn start_with(
    srv: &TestServer,
    run: &Run,
    tool_call_id: &str,
    body: Value,
) -> (StatusCode, Value) {
    srv.post_until_served(
        &format!("/api/runs/{}/tool-calls/{tool_call_id}/start", run.id),
        &run.token,
        &body,
    )
    .await
}

async fn call_verb(
    srv: &TestServer,
    run: &Run,
    tool_call_id: &str,
    verb: &str,
    body: Value,
) -> (StatusCode, Value) {
    srv.post_until_served(
        &format!("/api/runs/{}/tool-calls/{tool_call_id}/{verb}", run.id),
        &run.token,
        &body,
    )
    .await
}

async fn dispatch(srv: &TestServer, run: &Run, call: &Call) -> (StatusCode, Value) {
    call_verb(
        srv,
        run,
        &call.tool_call_id,
        "dispatch",
        json!({"approval_id": call.approval_id}),
    )
    .await
}

/// `settle` with `facts` (`evidence`, `result`, `error`) beside the approval id.
async fn settle(srv: &TestServer, run: &Run, call: &Call, facts: Value) -> (StatusCode, Value) {
    let mut body = facts.as_object().unwrap().clone();
    body.insert("approval_id".into(), call.approval_id.clone().into());
    call_verb(srv, run, &call.tool_call_id, "settle", Value::Object(body)).await
}

async fn reconcile(
    srv: &TestServer,
    run: &Run,
    call: &Call,
    token: &str,
    body: Value,
) -> (StatusCode, Value) {
    srv.post(
        &format!(
            "/api/runs/{}/mutations/{}/{}/reconcile",
            run.id, call.tool_call_id, call.approval_id
        ),
        token,
        &body,
    )
    .await
}

/// The durable record of `call` (200 asserted).
async fn record(srv: &TestServer, run: &Run, call: &Call) -> Value {
    let (status, v) = srv
        .get(
            &format!(
                "/api/runs/{}/mutations/{}/{}",
                run.id, call.tool_call_id, call.approval_id
            ),
            &run.token,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "read record: {v}");
    v
}

/// The run's `mutation_outcome/v1` listing.
async fn listing(srv: &TestServer, run: &Run) -> Vec<Value> {
    let (status, v) = srv
        .get(&format!("/api/runs/{}/mutations", run.id), &run.token)
        .await;
    assert_eq!(status, StatusCode::OK, "list: {v}");
    assert_eq!(v["run_id"], json!(run.id));
    assert_eq!(v["has_more"], false);
    v["mutations"].as_array().unwrap().clone()
}

async fn events(srv: &TestServer, run: &Run) -> Vec<Value> {
    srv.replay_all(&run.id, &srv.operator_token, 1000).await
}

/// Polls the durable record of `call` until `done` holds (bounded by [`WAIT`]).
async fn wait_record(
    srv: &TestServer,
    run: &Run,
    call: &Call,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let until = Instant::now() + WAIT;
    loop {
        let r = record(srv, run, call).await;
        if done(&r) {
            return r;
        }
        assert!(Instant::now() < until, "waited {WAIT:?} for {what}: {r}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls the stream until `done` holds (bounded by [`WAIT`]).
async fn wait_events(
    srv: &TestServer,
    run: &Run,
    what: &str,
    done: impl Fn(&[Value]) -> bool,
) -> Vec<Value> {
    let until = Instant::now() + WAIT;
    loop {
        let evs = events(srv, run).await;
        if done(&evs) {
            return evs;
        }
        assert!(
            Instant::now() < until,
            "waited {WAIT:?} for {what}: {:?}",
            types(&evs)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Events about `call` (by tool call and approval id), of type `ty`.
fn of_call<'a>(events: &'a [Value], call: &Call, ty: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| {
            e["type"] == ty
                && e["tool_call_id"] == json!(call.tool_call_id)
                && e["approval_id"] == json!(call.approval_id)
        })
        .collect()
}

fn seq(e: &Value) -> u64 {
    e["sequence"].as_u64().unwrap()
}

fn assert_gapless(events: &[Value]) {
    let seqs: Vec<u64> = events.iter().map(seq).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "gapless: {:?}",
        types(events)
    );
}

async fn finish(srv: &TestServer, run: &Run, verb: &str) -> Value {
    let (status, v) = srv
        .post(
            &format!("/api/runs/{}/{verb}", run.id),
            &run.token,
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{verb}: {v}");
    v
}

/// Asserts the terminal `tool_execution` of `call` (exactly one) has these fields, and
/// none of `absent`.
fn assert_terminal(events: &[Value], call: &Call, expected: Value, absent: &[&str]) -> Value {
    let terminal = of_call(events, call, "tool_execution");
    assert_eq!(terminal.len(), 1, "one terminal event: {:?}", types(events));
    let e = terminal[0].clone();
    assert_eq!(e["tool_name"], json!(call.tool_name));
    for (k, v) in expected.as_object().unwrap() {
        assert_eq!(&e[k], v, "tool_execution.{k}: {e}");
    }
    for k in absent {
        assert!(e.get(*k).is_none(), "tool_execution has no {k}: {e}");
    }
    e
}

/// Asserts the durable record of `call` is exactly `schema` + identity + `fields`.
fn assert_record(r: &Value, run: &Run, call: &Call, fields: Value) {
    let mut expected = json!({"schema": "mutation_outcome/v1", "run_id": run.id,
        "tool_call_id": call.tool_call_id, "approval_id": call.approval_id,
        "tool_name": call.tool_name});
    for (k, v) in fields.as_object().unwrap() {
        expected[k] = v.clone();
    }
    assert_eq!(r, &expected, "durable record");
}

/// DynamoDB: GIVEN a run whose head, events and cards expired (TTL) while a mutation
/// record is left WHEN anyone creates a run with the same id THEN it is refused (409) —
/// nobody inherits another run's mutation records.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_a_run_id_with_leftover_mutation_records_is_not_created_again() {
    let store = tollgate_tests::dynamo_store().await;
    let tables = store.tables().clone();
    let client = aws_sdk_dynamodb::Client::new(&aws_config::load_from_env().await);
    let srv = TestServer::with_deps(TestServer::deps(
        std::sync::Arc::new(store),
        GateConfig::default(),
    ))
    .await;
    let id = format!("leftover-{}", short_id());
    let (status, v) = srv
        .post(
            "/api/runs",
            &srv.agent_token,
            &json!({"run_id": id, "budget": {"tools": {TOOL: 1}}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let run = Run {
        id: id.clone(),
        token: v["run_token"].as_str().unwrap().to_owned(),
    };
    let call = approved(&srv, &run, TOOL).await;
    assert_eq!(start(&srv, &run, &call).await.0, StatusCode::OK);
    // As TTL would: everything of the run but the mutation record.
    use aws_sdk_dynamodb::types::AttributeValue;
    for (table, sort) in [
        (&tables.runs, None),
        (&tables.events, Some("event_key")),
        (&tables.approvals, Some("item_key")),
    ] {
        let items = client
            .query()
            .table_name(table)
            .key_condition_expression("run_id = :r")
            .expression_attribute_values(":r", AttributeValue::S(id.clone()))
            .send()
            .await
            .unwrap()
            .items
            .unwrap_or_default();
        for item in items {
            let mut del = client
                .delete_item()
                .table_name(table)
                .key("run_id", AttributeValue::S(id.clone()));
            if let Some(k) = sort {
                del = del.key(k, item[k].clone());
            }
            del.send().await.unwrap();
        }
    }
    let (status, v) = srv
        .post("/api/runs", &srv.agent_token, &json!({"run_id": id}))
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "leftover records refuse the id: {v}"
    );
    assert!(v.get("run_token").is_none());
}

tollgate_tests::for_each_backend! {
    golden_success => golden::golden_success;
    golden_pre_dispatch_expiry => golden::golden_pre_dispatch_expiry;
    golden_dispatched_timeout => golden::golden_dispatched_timeout;
    golden_late_settlement => golden::golden_late_settlement;
    deadline_outcome_unknown_stands => settle::deadline_outcome_unknown_stands;
    started_once_after_approval => start::started_once_after_approval;
    concurrent_starts_and_dispatches => start::concurrent_starts_and_dispatches;
    no_start_for_auto_approved => start::no_start_for_auto_approved;
    no_start_for_human_ask => start::no_start_for_human_ask;
    no_start_for_denied => start::no_start_for_denied;
    no_start_for_expired => start::no_start_for_expired;
    cancelled_before_dispatch => settle::cancelled_before_dispatch;
    confirmed_completes => settle::confirmed_completes;
    ambiguous_is_unknown => settle::ambiguous_is_unknown;
    not_sent_is_not_executed => settle::not_sent_is_not_executed;
    deadline_fences => settle::deadline_fences;
    nothing_after_run_completed => settle::nothing_after_terminal, "complete", "run_completed";
    nothing_after_run_failed => settle::nothing_after_terminal, "fail", "run_failed";
    unknown_blocks_until_reconciled => reconcile::unknown_blocks_until_reconciled;
    budget_refusals => budget::budget_refusals;
    receipts => budget::receipts;
    lost_deadline_timers_are_backstopped => backstop::lost_deadline_timers_are_backstopped;
    the_sweeper_settles_attempts_whose_deadline_timer_was_lost =>
        backstop::the_sweeper_settles_attempts_whose_deadline_timer_was_lost;
    a_late_response_contests_not_applied => reconcile::a_late_response_contests_not_applied;
    bad_input_writes_nothing => input::bad_input_writes_nothing;
}
