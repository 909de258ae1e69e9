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

use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Map, Value};
use tollgate_api::{GateConfig, Role};
use tollgate_domain::execution::ExecutionSettings;
use tollgate_tests::{store_for, Backend, TestServer};

const TOOL: &str = "mcp__last9__create_dashboard";
const DEADLINE_MS: i64 = 1_500;
const BEAT_MS: i64 = 300;
/// Bound of every poll.
const WAIT: Duration = Duration::from_secs(10);

async fn server(backend: Backend) -> TestServer {
    TestServer::with_deps(TestServer::deps(
        store_for(backend).await,
        GateConfig {
            // No approval heartbeats in these transcripts: cards are decided promptly.
            heartbeat_every: Duration::from_secs(60),
            execution: ExecutionSettings {
                settlement_deadline_ms: DEADLINE_MS,
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
    srv.post(
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
    srv.post(
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
    srv.post(
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

// ---------------------------------------------------------------------------------------
// Golden transcripts
// ---------------------------------------------------------------------------------------

/// Event types a transcript keeps (the lifecycle of an approved call and of its run).
const LIFECYCLE: &[&str] = &[
    "run_started",
    "tool.approval_required",
    "tool.approval_resolved",
    "tool.auto_approved",
    "tool_execution_started",
    "heartbeat",
    "tool_execution",
    "tool_execution_reconciled",
    "tool_execution_updated",
    "run_completed",
    "run_failed",
    "run_cancelled",
];

/// Fields a transcript keeps of each kept event (timestamps and display ids are not).
const FIELDS: &[&str] = &[
    "protocol_version",
    "sequence",
    "run_id",
    "channel_id",
    "type",
    "requestId",
    "runId",
    "toolName",
    "tool_name",
    "tool_call_id",
    "approval_id",
    "approved",
    "expired",
    "decidedBy",
    "execution_status",
    "mutation_outcome",
    "previous_outcome",
    "evidence",
    "result",
    "error",
    "reason",
    "observed",
    "reconciled_by",
];

/// Real identities → stable names.
struct Names(Vec<(String, String)>);

impl Names {
    fn new(run: &Run, calls: &[&Call]) -> Self {
        let mut names = vec![(run.id.clone(), "run-1".to_owned())];
        for (i, c) in calls.iter().enumerate() {
            let n = i + 1;
            names.push((c.request_id.clone(), format!("request-{n}")));
            names.push((c.approval_id.clone(), format!("approval-{n}")));
            if !names.iter().any(|(real, _)| *real == c.tool_call_id) {
                names.push((c.tool_call_id.clone(), format!("write-{n}")));
            }
        }
        Self(names)
    }

    fn apply(&self, v: &Value) -> Value {
        match v {
            Value::String(s) => self
                .0
                .iter()
                .find(|(real, _)| real == s)
                .map_or_else(|| v.clone(), |(_, name)| Value::String(name.clone())),
            Value::Array(a) => Value::Array(a.iter().map(|x| self.apply(x)).collect()),
            Value::Object(o) => Value::Object(
                o.iter()
                    .map(|(k, x)| (k.clone(), self.apply(x)))
                    .collect::<Map<_, _>>(),
            ),
            other => other.clone(),
        }
    }
}

/// The lifecycle projection of a replayed stream: lifecycle events only (sequence gaps
/// keep omitted events), lifecycle fields only, identities normalised, each run of
/// consecutive heartbeats one `heartbeat` entry, later sequences without the offset the
/// extra heartbeats made.
fn lifecycle(events: &[Value], names: &Names) -> Vec<Value> {
    let mut out = Vec::new();
    let mut offset = 0u64;
    let mut in_beats = false;
    for e in events {
        let ty = e["type"].as_str().unwrap();
        if ty == "heartbeat" {
            if in_beats {
                offset += 1;
                continue;
            }
            in_beats = true;
        } else {
            in_beats = false;
        }
        if !LIFECYCLE.contains(&ty) {
            continue;
        }
        let mut kept = Map::new();
        for f in FIELDS {
            if let Some(v) = e.get(*f) {
                kept.insert((*f).to_owned(), v.clone());
            }
        }
        kept.insert("sequence".into(), json!(seq(e) - offset));
        out.push(names.apply(&Value::Object(kept)));
    }
    out
}

/// The HTTP answers of a transcript, in order.
#[derive(Default)]
struct Answers(Vec<Value>);

impl Answers {
    fn push(&mut self, step: &str, (status, body): &(StatusCode, Value)) {
        self.0
            .push(json!({"step": step, "status": status.as_u16(), "body": body}));
    }
}

/// The producer fixture, at seed 000's shape: one file, one transcript per scenario.
fn fixture_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/approved_execution_v2.json")
}

/// Compares `transcript` with the scenario `name` of the fixture (or writes it there with
/// `TOLLGATE_BLESS=1`; tests run as processes of their own, so the file is locked while
/// one of them rewrites its scenario).
fn golden(name: &str, transcript: Value) {
    let path = fixture_path();
    if std::env::var("TOLLGATE_BLESS").as_deref() == Ok("1") {
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.with_extension("lock"))
            .unwrap();
        lock.lock().unwrap();
        let mut all: serde_json::Map<String, Value> = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        all.insert(name.to_owned(), transcript);
        let text = serde_json::to_string_pretty(&Value::Object(all)).unwrap() + "\n";
        std::fs::write(&path, text).unwrap();
        let _ = std::fs::remove_file(path.with_extension("lock"));
        return;
    }
    let stored = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (TOLLGATE_BLESS=1 writes it)", path.display()));
    let stored: Value = serde_json::from_str(&stored).unwrap();
    let text = serde_json::to_string_pretty(&transcript).unwrap();
    assert_eq!(
        &transcript,
        &stored[name],
        "scenario {name} differs from {}; produced:\n{text}",
        path.display()
    );
}

/// Seed example "success": arm, approve, start, dispatch, settle confirmed with a
/// result, complete the run.
async fn golden_success(backend: Backend) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 1})).await;
    let call = Call::new(TOOL);
    let mut answers = Answers::default();
    let mut body = call.arm_body();
    body["arguments_hash"] = json!("sha256:abc");
    let (status, armed) = arm_with(&srv, &run, body).await;
    assert_eq!(status, StatusCode::CREATED, "{armed}");
    approve(&srv, &run, &call).await;
    let mut start_body = call.start_body();
    start_body["arguments_hash"] = json!("sha256:abc");
    let started = start_with(&srv, &run, &call.tool_call_id, start_body).await;
    assert_eq!(started.0, StatusCode::OK, "{}", started.1);
    answers.push("start", &started);
    answers.push("dispatch", &dispatch(&srv, &run, &call).await);
    answers.push(
        "settle confirmed",
        &settle(
            &srv,
            &run,
            &call,
            json!({"evidence": "confirmed",
                   "result": {"dashboard_id": "dash-42", "title": "Checkout latency"}}),
        )
        .await,
    );
    let done = finish(&srv, &run, "complete").await;
    answers.push("complete", &(StatusCode::OK, done));

    let evs = events(&srv, &run).await;
    assert_gapless(&evs);
    let names = Names::new(&run, &[&call]);
    golden(
        "success",
        json!({
            "scenario": "success",
            "events": lifecycle(&evs, &names),
            "answers": names.apply(&Value::Array(answers.0)),
            "mutation_outcome": names.apply(&record(&srv, &run, &call).await),
        }),
    );
}

/// Seed example "pre-dispatch expiry": started, never dispatched; the settlement
/// deadline settles it `not_executed` (unsent); a dispatch then answers 409 — the agent
/// must not send.
async fn golden_pre_dispatch_expiry(backend: Backend) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 1})).await;
    let call = approved(&srv, &run, TOOL).await;
    let mut answers = Answers::default();
    let started = start(&srv, &run, &call).await;
    assert_eq!(started.0, StatusCode::OK, "{}", started.1);
    answers.push("start", &started);
    // The deadline timer, not the dispatch, settles it.
    let settled = wait_record(&srv, &run, &call, "the deadline", |r| {
        r["state"] == "not_executed"
    })
    .await;
    let dispatched = dispatch(&srv, &run, &call).await;
    assert_eq!(dispatched.0, StatusCode::CONFLICT, "{}", dispatched.1);
    answers.push("dispatch after the deadline", &dispatched);
    // And nothing the agent claims afterwards makes it sent.
    answers.push(
        "settle confirmed after the deadline",
        &settle(
            &srv,
            &run,
            &call,
            json!({"evidence": "confirmed", "result": {"dashboard_id": "dash-42"}}),
        )
        .await,
    );
    answers.push(
        "settle not_sent after the deadline",
        &settle(&srv, &run, &call, json!({"evidence": "not_sent"})).await,
    );
    let evs = events(&srv, &run).await;
    assert_gapless(&evs);
    let after = record(&srv, &run, &call).await;
    assert_eq!(
        after, settled,
        "the record stays as the deadline settled it"
    );
    let names = Names::new(&run, &[&call]);
    golden(
        "pre_dispatch_expiry",
        json!({
            "scenario": "pre_dispatch_expiry",
            "events": lifecycle(&evs, &names),
            "answers": names.apply(&Value::Array(answers.0)),
            "mutation_outcome": names.apply(&after),
        }),
    );
}

/// Seed example "dispatched timeout": dispatched, then the transport times out — the
/// agent settles `ambiguous` with its error facts: `executed` + `outcome_unknown`, which
/// blocks a fresh approval of the same tool call until an operator reconciles it.
async fn golden_dispatched_timeout(backend: Backend) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 2})).await;
    let call = approved(&srv, &run, TOOL).await;
    let mut answers = Answers::default();
    answers.push("start", &start(&srv, &run, &call).await);
    let dispatched = dispatch(&srv, &run, &call).await;
    assert_eq!(dispatched.0, StatusCode::OK, "{}", dispatched.1);
    answers.push("dispatch", &dispatched);
    let settled = settle(
        &srv,
        &run,
        &call,
        json!({"evidence": "ambiguous",
               "error": {"code": "timeout", "message": "no response within 30 s"}}),
    )
    .await;
    assert_eq!(settled.0, StatusCode::OK, "{}", settled.1);
    answers.push("settle ambiguous", &settled);
    let again = Call::of(TOOL, &call.tool_call_id);
    arm(&srv, &run, &again).await;
    approve(&srv, &run, &again).await;
    let blocked = start(&srv, &run, &again).await;
    assert_eq!(blocked.0, StatusCode::CONFLICT, "{}", blocked.1);
    answers.push("start a fresh approval of the same call", &blocked);
    let evs = events(&srv, &run).await;
    assert_gapless(&evs);
    let names = Names::new(&run, &[&call, &again]);
    golden(
        "dispatched_timeout",
        json!({
            "scenario": "dispatched_timeout",
            "events": lifecycle(&evs, &names),
            "answers": names.apply(&Value::Array(answers.0)),
            "mutation_outcome": names.apply(&record(&srv, &run, &call).await),
        }),
    );
}

/// Ours, after seed 000's "response received but settlement wait expires": dispatched,
/// heartbeats while it waits, the deadline settles it `executed` + `outcome_unknown`; the
/// late confirmed settlement then records the actual result durably, with no second
/// terminal event but a `tool_execution_updated`.
async fn golden_late_settlement(backend: Backend) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 2})).await;
    let call = approved(&srv, &run, TOOL).await;
    let mut answers = Answers::default();
    answers.push("start", &start(&srv, &run, &call).await);
    let dispatched = dispatch(&srv, &run, &call).await;
    assert_eq!(dispatched.0, StatusCode::OK, "{}", dispatched.1);
    answers.push("dispatch", &dispatched);
    let at_deadline = wait_record(&srv, &run, &call, "the deadline", |r| {
        r["state"] == "outcome_unknown"
    })
    .await;
    let raw = events(&srv, &run).await;
    let beats = raw.iter().filter(|e| e["type"] == "heartbeat").count();
    assert!(
        beats >= 1,
        "execution heartbeats while dispatched: {:?}",
        types(&raw)
    );
    // A retried start of the same attempt answers the unknown outcome.
    answers.push("start again", &start(&srv, &run, &call).await);
    let late = settle(
        &srv,
        &run,
        &call,
        json!({"evidence": "confirmed", "result": {"dashboard_id": "dash-42"}}),
    )
    .await;
    assert_eq!(late.0, StatusCode::OK, "{}", late.1);
    answers.push("late settle confirmed", &late);
    let evs = events(&srv, &run).await;
    // No second terminal event, but the change of the durable record is announced.
    assert_eq!(&evs[..raw.len()], &raw[..]);
    assert_eq!(types(&evs[raw.len()..]), ["tool_execution_updated"]);
    assert_gapless(&evs);
    let names = Names::new(&run, &[&call]);
    golden(
        "late_settlement",
        json!({
            "scenario": "late_settlement",
            "events": lifecycle(&evs, &names),
            "answers": names.apply(&Value::Array(answers.0)),
            "mutation_outcome_at_deadline": names.apply(&at_deadline),
            "mutation_outcome": names.apply(&record(&srv, &run, &call).await),
        }),
    );

    // A fresh approval of the same tool call: the completed attempt blocks it (running
    // the same tool call again would duplicate the mutation); an operator cannot
    // "reconcile" a completed attempt.
    let again = Call::of(TOOL, &call.tool_call_id);
    arm(&srv, &run, &again).await;
    approve(&srv, &run, &again).await;
    let before = events(&srv, &run).await;
    let (status, v) = start(&srv, &run, &again).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(
        (v["state"].as_str(), v["approval_id"].as_str()),
        (Some("completed"), Some(call.approval_id.as_str())),
        "{v}"
    );
    let (status, v) = reconcile(
        &srv,
        &run,
        &call,
        &srv.operator_token,
        json!({"observed": "not_applied"}),
    )
    .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::CONFLICT, Some("completed")),
        "{v}"
    );
    assert_eq!(events(&srv, &run).await, before, "nothing written");
    assert_eq!(listing(&srv, &run).await.len(), 1, "no second attempt");
}

// ---------------------------------------------------------------------------------------
// tool_execution_started
// ---------------------------------------------------------------------------------------

/// Exactly once per human-approved call, after `tool.approval_resolved`, before the
/// dispatch; a retried start answers the same and appends nothing.
async fn started_once_after_approval(backend: Backend) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 1})).await;
    let call = approved(&srv, &run, TOOL).await;
    let (status, first) = start(&srv, &run, &call).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["state"], "intent");
    let before = events(&srv, &run).await;
    assert_eq!(
        first["sequence"],
        json!(before.len()),
        "the start event is the head"
    );
    for _ in 0..3 {
        let again = start(&srv, &run, &call).await;
        assert_eq!(again, (StatusCode::OK, first.clone()), "a retried start");
    }
    assert_eq!(events(&srv, &run).await, before, "a retry appends nothing");

    let started = of_call(&before, &call, "tool_execution_started");
    assert_eq!(started.len(), 1, "{:?}", types(&before));
    let started = started[0];
    // Exactly the seed's fields: no arguments, credentials or claimed outcome.
    let mut keys: Vec<&str> = started
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "approval_id",
            "channel_id",
            "protocol_version",
            "run_id",
            "sequence",
            "timestamp_utc",
            "tool_call_id",
            "tool_name",
            "type"
        ],
        "{started}"
    );
    assert_eq!(started["sequence"], first["sequence"]);
    assert_eq!(started["protocol_version"], "v2");
    let resolved = of_call(&before, &call, "tool.approval_resolved");
    assert_eq!(resolved.len(), 1, "{:?}", types(&before));
    assert_eq!(resolved[0]["approved"], true);
    assert!(seq(resolved[0]) < seq(started), "after the approval");

    // Dispatch and settle: still exactly one start event, and it precedes them all.
    assert_eq!(dispatch(&srv, &run, &call).await.0, StatusCode::OK);
    let (status, v) = start(&srv, &run, &call).await;
    assert_eq!(
        (status, v["state"].as_str(), &v["sequence"]),
        (StatusCode::OK, Some("dispatched"), &first["sequence"]),
        "{v}"
    );
    let (status, v) = settle(&srv, &run, &call, json!({"evidence": "confirmed"})).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let evs = events(&srv, &run).await;
    assert_eq!(of_call(&evs, &call, "tool_execution_started").len(), 1);
    let terminal = of_call(&evs, &call, "tool_execution");
    assert!(seq(terminal[0]) > seq(started));
    assert!(evs
        .iter()
        .filter(|e| e["type"] == "heartbeat")
        .all(|e| seq(e) > seq(started)));
    assert_gapless(&evs);
}

/// Concurrent starts of one attempt: one event, one answer; concurrent fresh approvals
/// of one tool call: exactly one attempt admitted, the others blocked by it (409 with its
/// state); concurrent dispatches: exactly one 200 — two transports must never send.
async fn concurrent_starts_and_dispatches(backend: Backend) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 10})).await;
    let call = approved(&srv, &run, TOOL).await;
    let answers = futures::future::join_all((0..8).map(|_| start(&srv, &run, &call))).await;
    let first = answers[0].clone();
    assert_eq!(first.0, StatusCode::OK, "{}", first.1);
    assert!(answers.iter().all(|a| *a == first), "{answers:?}");
    let evs = events(&srv, &run).await;
    assert_eq!(of_call(&evs, &call, "tool_execution_started").len(), 1);

    // Fresh approvals of the call while it is an intent, then while dispatched.
    let fresh = Call::of(TOOL, &call.tool_call_id);
    arm(&srv, &run, &fresh).await;
    approve(&srv, &run, &fresh).await;
    let (status, v) = start(&srv, &run, &fresh).await;
    assert_eq!(
        (status, v["state"].as_str(), v["approval_id"].as_str()),
        (
            StatusCode::CONFLICT,
            Some("intent"),
            Some(call.approval_id.as_str())
        ),
        "{v}"
    );
    let dispatches = futures::future::join_all((0..8).map(|_| dispatch(&srv, &run, &call))).await;
    let ok = dispatches
        .iter()
        .filter(|(s, _)| *s == StatusCode::OK)
        .count();
    assert_eq!(ok, 1, "exactly one dispatch is admitted: {dispatches:?}");
    for (status, v) in &dispatches {
        if *status != StatusCode::OK {
            assert_eq!(
                (*status, v["state"].as_str()),
                (StatusCode::CONFLICT, Some("dispatched")),
                "{v}"
            );
        }
    }
    let (status, v) = start(&srv, &run, &fresh).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::CONFLICT, Some("dispatched")),
        "{v}"
    );
    settle(&srv, &run, &call, json!({"evidence": "not_sent"})).await;

    // Five fresh approvals of another tool call, started at once: one attempt only.
    let tool_call_id = format!("write-{}", short_id());
    let mut attempts = Vec::new();
    for _ in 0..5 {
        let c = Call::of(TOOL, &tool_call_id);
        arm(&srv, &run, &c).await;
        approve(&srv, &run, &c).await;
        attempts.push(c);
    }
    let before = events(&srv, &run).await;
    let answers = futures::future::join_all(attempts.iter().map(|c| start(&srv, &run, c))).await;
    let admitted: Vec<usize> = answers
        .iter()
        .enumerate()
        .filter(|(_, (s, _))| *s == StatusCode::OK)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(admitted.len(), 1, "{answers:?}");
    let winner = &attempts[admitted[0]];
    for (status, v) in answers.iter().filter(|(s, _)| *s != StatusCode::OK) {
        assert_eq!(
            (*status, v["state"].as_str(), v["approval_id"].as_str()),
            (
                StatusCode::CONFLICT,
                Some("intent"),
                Some(winner.approval_id.as_str())
            ),
            "{v}"
        );
    }
    let evs = events(&srv, &run).await;
    assert_eq!(evs.len(), before.len() + 1, "{:?}", types(&evs));
    assert_eq!(of_call(&evs, winner, "tool_execution_started").len(), 1);
    assert_gapless(&evs);
}

/// A call a `tool` policy approved: start → 400, nothing written.
async fn no_start_for_auto_approved(backend: Backend) {
    let srv = server(backend).await;
    let owner = format!("alice-{}", short_id());
    let alice = srv.auth.mint_jwt(&owner, Role::Operator, 600, None);
    let run = new_run(
        &srv,
        json!({"owner": owner, "budget": {"tools": {TOOL: 5}, "call_ceiling": 5}}),
    )
    .await;
    let first = Call::new(TOOL);
    arm(&srv, &run, &first).await;
    let (status, v) = srv
        .post(
            &format!("/api/runs/{}/tool-approvals", run.id),
            &alice,
            &json!({"request_id": first.request_id, "scope": "tool"}),
        )
        .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("approved")),
        "{v}"
    );
    let auto = Call::new(TOOL);
    let (status, v) = arm_with(&srv, &run, auto.arm_body()).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (v["state"].as_str(), v["auto_approved"].as_bool()),
        (Some("approved"), Some(true)),
        "{v}"
    );
    let before = events(&srv, &run).await;
    assert_eq!(
        before
            .iter()
            .filter(
                |e| e["type"] == "tool.auto_approved" && e["requestId"] == json!(auto.request_id)
            )
            .count(),
        1,
        "{:?}",
        types(&before)
    );
    for _ in 0..2 {
        let (status, v) = start(&srv, &run, &auto).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
        assert!(
            v["error"].as_str().unwrap().contains("automatically"),
            "{v}"
        );
    }
    let evs = events(&srv, &run).await;
    assert_eq!(evs, before, "nothing written");
    assert!(
        !types(&evs).contains(&"tool_execution_started"),
        "{:?}",
        types(&evs)
    );
    assert!(listing(&srv, &run).await.is_empty());
    // The human-approved first call still starts.
    let (status, v) = start(&srv, &run, &first).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("intent")),
        "{v}"
    );
}

/// Seed 000: "Automatic approval, denied/expired approval, and human__ask do not
/// produce" `tool_execution_started` — not even when a (misconfigured) budget lists
/// `human__ask` and a human approved the card: asking a human is no execution.
async fn no_start_for_human_ask(backend: Backend) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({"human__ask": 3})).await;
    let call = approved(&srv, &run, "human__ask").await;
    let (status, v) = start(&srv, &run, &call).await;
    let evs = events(&srv, &run).await;
    assert!(
        of_call(&evs, &call, "tool_execution_started").is_empty(),
        "human__ask produced tool_execution_started (start answered {status} {v}): {:?}",
        types(&evs)
    );
    assert!(status.is_client_error(), "{status} {v}");
}

/// A denied call: start → 409 `not_executed` (`approval_denied`), a terminal
/// `tool_execution` and never `tool_execution_started`.
async fn no_start_for_denied(backend: Backend) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 1})).await;
    let call = Call::new(TOOL);
    arm(&srv, &run, &call).await;
    let (status, v) = decide(
        &srv,
        &run,
        "tool-denials",
        json!({"request_id": call.request_id}),
    )
    .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("denied")),
        "{v}"
    );
    let (status, v) = start(&srv, &run, &call).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(
        (v["state"].as_str(), v["reason"].as_str()),
        (Some("not_executed"), Some("approval_denied")),
        "{v}"
    );
    let after_first = events(&srv, &run).await;
    assert_eq!(start(&srv, &run, &call).await, (status, v), "a retry");
    let evs = events(&srv, &run).await;
    assert_eq!(evs, after_first, "a retry appends nothing");
    assert!(of_call(&evs, &call, "tool_execution_started").is_empty());
    assert_terminal(
        &evs,
        &call,
        json!({"execution_status": "not_executed", "mutation_outcome": "not_executed",
               "reason": "approval_denied"}),
        &["result", "error"],
    );
    assert_record(
        &record(&srv, &run, &call).await,
        &run,
        &call,
        json!({"state": "not_executed", "execution_status": "not_executed",
               "reason": "approval_denied"}),
    );
    // A denial uses no budget: a human-approved call of the tool still starts.
    let ok = approved(&srv, &run, TOOL).await;
    let (status, v) = start(&srv, &run, &ok).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("intent")),
        "{v}"
    );
}

/// A card that expired (1 s) before anyone decided: start → 409 `not_executed`
/// (`approval_expired`), never `tool_execution_started`.
async fn no_start_for_expired(backend: Backend) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 1})).await;
    let call = Call::new(TOOL);
    let mut body = call.arm_body();
    body["timeout_seconds"] = json!(1);
    let (status, v) = arm_with(&srv, &run, body).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    wait_events(&srv, &run, "the card's expiry", |evs| {
        evs.iter()
            .any(|e| e["type"] == "tool.approval_resolved" && e["expired"] == true)
    })
    .await;
    let (status, v) = start(&srv, &run, &call).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(
        (v["state"].as_str(), v["reason"].as_str()),
        (Some("not_executed"), Some("approval_expired")),
        "{v}"
    );
    let evs = events(&srv, &run).await;
    assert!(of_call(&evs, &call, "tool_execution_started").is_empty());
    assert_terminal(
        &evs,
        &call,
        json!({"execution_status": "not_executed", "mutation_outcome": "not_executed",
               "reason": "approval_expired"}),
        &["result", "error"],
    );
    // A click after the expiry changes nothing.
    let (status, v) = decide(
        &srv,
        &run,
        "tool-approvals",
        json!({"request_id": call.request_id, "scope": "once"}),
    )
    .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("expired")),
        "{v}"
    );
    assert_eq!(start(&srv, &run, &call).await.0, StatusCode::CONFLICT);
    assert_eq!(events(&srv, &run).await, evs);
    assert_gapless(&evs);
}

// ---------------------------------------------------------------------------------------
// The evidence table
// ---------------------------------------------------------------------------------------

/// Cancelled before dispatch: the dispatch is refused, the record settles `not_executed`,
/// nothing follows `run_cancelled` (not even the deadline's settlement).
async fn cancelled_before_dispatch(backend: Backend) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 2})).await;
    let call = approved(&srv, &run, TOOL).await;
    let idle = approved(&srv, &run, TOOL).await;
    assert_eq!(start(&srv, &run, &call).await.0, StatusCode::OK);
    assert_eq!(start(&srv, &run, &idle).await.0, StatusCode::OK);
    finish(&srv, &run, "cancel").await;
    let cancelled = events(&srv, &run).await;
    assert_eq!(types(&cancelled).last(), Some(&"run_cancelled"));
    let (status, v) = dispatch(&srv, &run, &call).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(
        (v["state"].as_str(), v["reason"].as_str()),
        (Some("not_executed"), Some("run_not_running")),
        "{v}"
    );
    assert_record(
        &record(&srv, &run, &call).await,
        &run,
        &call,
        json!({"state": "not_executed", "execution_status": "not_executed",
               "reason": "run_not_running"}),
    );
    // The other intent is settled by its deadline, durably only.
    let r = wait_record(&srv, &run, &idle, "the deadline", |r| {
        r["state"] != "intent"
    })
    .await;
    assert_record(
        &r,
        &run,
        &idle,
        json!({"state": "not_executed", "execution_status": "not_executed", "reason": "unsent"}),
    );
    tokio::time::sleep(Duration::from_millis(3 * BEAT_MS as u64)).await;
    assert_eq!(
        events(&srv, &run).await,
        cancelled,
        "nothing after run_cancelled"
    );
    // Retried starts answer the settled refusals, still without an event.
    for c in [&call, &idle] {
        let (status, v) = start(&srv, &run, c).await;
        assert_eq!(
            (status, v["state"].as_str()),
            (StatusCode::CONFLICT, Some("not_executed")),
            "{v}"
        );
    }
    assert_eq!(events(&srv, &run).await, cancelled);
}

/// Confirmed: `executed` + `completed`, the result facts in the event and the record.
async fn confirmed_completes(backend: Backend) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 2})).await;
    let call = approved(&srv, &run, TOOL).await;
    start(&srv, &run, &call).await;
    assert_eq!(dispatch(&srv, &run, &call).await.0, StatusCode::OK);
    let result = json!({"dashboard_id": "dash-7", "panels": [1, 2, 3]});
    let facts = json!({"evidence": "confirmed", "result": result});
    let (status, v) = settle(&srv, &run, &call, facts.clone()).await;
    assert_eq!(
        (status, &v),
        (StatusCode::OK, &json!({"state": "completed"}))
    );
    // The same settlement again: the same answer, nothing appended.
    let evs = events(&srv, &run).await;
    assert_eq!(settle(&srv, &run, &call, facts).await, (status, v));
    assert_eq!(events(&srv, &run).await, evs);
    assert_terminal(
        &evs,
        &call,
        json!({"execution_status": "executed", "mutation_outcome": "completed",
               "result": result}),
        &["error", "reason"],
    );
    assert_record(
        &record(&srv, &run, &call).await,
        &run,
        &call,
        json!({"state": "completed", "execution_status": "executed", "result": result}),
    );
    // A remote error answer is confirmed evidence too: its error facts are kept.
    let failed = approved(&srv, &run, TOOL).await;
    start(&srv, &run, &failed).await;
    dispatch(&srv, &run, &failed).await;
    let error = json!({"code": 422, "message": "panel limit"});
    let (status, v) = settle(
        &srv,
        &run,
        &failed,
        json!({"evidence": "confirmed", "error": error}),
    )
    .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("completed")),
        "{v}"
    );
    let evs = events(&srv, &run).await;
    assert_terminal(
        &evs,
        &failed,
        json!({"execution_status": "executed", "mutation_outcome": "completed",
               "error": error}),
        &["result"],
    );
    assert_record(
        &record(&srv, &run, &failed).await,
        &run,
        &failed,
        json!({"state": "completed", "execution_status": "executed", "error": error}),
    );
}

/// Ambiguous: `executed` + error facts + `outcome_unknown` (default facts when none).
async fn ambiguous_is_unknown(backend: Backend) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 3})).await;
    let call = approved(&srv, &run, TOOL).await;
    start(&srv, &run, &call).await;
    assert_eq!(dispatch(&srv, &run, &call).await.0, StatusCode::OK);
    let error = json!({"code": "timeout", "after_ms": 30000});
    let (status, v) = settle(
        &srv,
        &run,
        &call,
        json!({"evidence": "ambiguous", "error": error}),
    )
    .await;
    assert_eq!(
        (status, &v),
        (StatusCode::OK, &json!({"state": "outcome_unknown"}))
    );
    let bare = approved(&srv, &run, TOOL).await;
    start(&srv, &run, &bare).await;
    dispatch(&srv, &run, &bare).await;
    let (status, v) = settle(&srv, &run, &bare, json!({"evidence": "ambiguous"})).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("outcome_unknown")),
        "{v}"
    );
    let evs = events(&srv, &run).await;
    assert_terminal(
        &evs,
        &call,
        json!({"execution_status": "executed", "mutation_outcome": "outcome_unknown",
               "error": error, "reason": "ambiguous"}),
        &["result"],
    );
    assert_record(
        &record(&srv, &run, &call).await,
        &run,
        &call,
        json!({"state": "outcome_unknown", "execution_status": "executed",
               "error": error, "reason": "ambiguous"}),
    );
    let e = assert_terminal(
        &evs,
        &bare,
        json!({"execution_status": "executed", "mutation_outcome": "outcome_unknown",
               "reason": "ambiguous"}),
        &["result"],
    );
    assert!(e["error"].is_object(), "default error facts: {e}");
    assert_eq!(record(&srv, &run, &bare).await["error"], e["error"]);
    // Ambiguous (or confirmed) on an undispatched intent is refused: dispatch precedes
    // any transport.
    let intent = approved(&srv, &run, TOOL).await;
    assert_eq!(start(&srv, &run, &intent).await.0, StatusCode::OK);
    let before = events(&srv, &run).await;
    for evidence in ["ambiguous", "confirmed"] {
        let (status, v) = settle(&srv, &run, &intent, json!({"evidence": evidence})).await;
        assert_eq!(
            (status, v["state"].as_str()),
            (StatusCode::CONFLICT, Some("intent")),
            "{evidence}: {v}"
        );
    }
    assert_eq!(events(&srv, &run).await, before);
    assert_eq!(record(&srv, &run, &intent).await["state"], "intent");
}

/// not_sent: `not_executed` from an intent or from a dispatched call.
async fn not_sent_is_not_executed(backend: Backend) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 2})).await;
    let sent = approved(&srv, &run, TOOL).await;
    let unsent = approved(&srv, &run, TOOL).await;
    start(&srv, &run, &sent).await;
    start(&srv, &run, &unsent).await;
    assert_eq!(dispatch(&srv, &run, &sent).await.0, StatusCode::OK);
    let error = json!({"code": "ECONNREFUSED"});
    for (call, facts) in [
        (&sent, json!({"evidence": "not_sent", "error": error})),
        (&unsent, json!({"evidence": "not_sent"})),
    ] {
        let (status, v) = settle(&srv, &run, call, facts).await;
        assert_eq!(
            (status, &v),
            (
                StatusCode::OK,
                &json!({"state": "not_executed", "reason": "not_sent"})
            )
        );
    }
    let evs = events(&srv, &run).await;
    assert_terminal(
        &evs,
        &sent,
        json!({"execution_status": "not_executed", "mutation_outcome": "not_executed",
               "reason": "not_sent", "error": error}),
        &["result"],
    );
    assert_terminal(
        &evs,
        &unsent,
        json!({"execution_status": "not_executed", "mutation_outcome": "not_executed",
               "reason": "not_sent"}),
        &["result", "error"],
    );
    assert_record(
        &record(&srv, &run, &sent).await,
        &run,
        &sent,
        json!({"state": "not_executed", "execution_status": "not_executed",
               "reason": "not_sent", "error": error}),
    );
    assert_record(
        &record(&srv, &run, &unsent).await,
        &run,
        &unsent,
        json!({"state": "not_executed", "execution_status": "not_executed",
               "reason": "not_sent"}),
    );
    // Settled: a dispatch is refused, and a settlement with other evidence too.
    let (status, v) = dispatch(&srv, &run, &unsent).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::CONFLICT, Some("not_executed")),
        "{v}"
    );
    let (status, v) = settle(&srv, &run, &sent, json!({"evidence": "confirmed"})).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::CONFLICT, Some("not_executed")),
        "{v}"
    );
    assert_eq!(events(&srv, &run).await, evs, "refusals write nothing");
    // Wait past both deadlines: nothing changes.
    tokio::time::sleep(Duration::from_millis(DEADLINE_MS as u64 + 500)).await;
    assert_eq!(events(&srv, &run).await, evs);
}

// ---------------------------------------------------------------------------------------
// Deadline fencing and terminal runs
// ---------------------------------------------------------------------------------------

/// Dispatch after the deadline is refused 409; a late settlement with real evidence of a
/// dispatched call the deadline settled keeps its actual result, without a second
/// terminal event; a settlement never dispatched cannot claim a result.
async fn deadline_fences(backend: Backend) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 3})).await;
    let idle = approved(&srv, &run, TOOL).await;
    let sent = approved(&srv, &run, TOOL).await;
    start(&srv, &run, &idle).await;
    start(&srv, &run, &sent).await;
    assert_eq!(dispatch(&srv, &run, &sent).await.0, StatusCode::OK);
    // Past the deadline (whether or not its timer has run yet), dispatch is refused.
    tokio::time::sleep(Duration::from_millis(DEADLINE_MS as u64 + 100)).await;
    let (status, v) = dispatch(&srv, &run, &idle).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(
        (v["state"].as_str(), v["reason"].as_str()),
        (Some("not_executed"), Some("unsent")),
        "{v}"
    );
    let (status, v) = settle(
        &srv,
        &run,
        &idle,
        json!({"evidence": "confirmed", "result": {"id": 1}}),
    )
    .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::CONFLICT, Some("not_executed")),
        "{v}"
    );
    let deadline = wait_record(&srv, &run, &sent, "the deadline", |r| {
        r["state"] == "outcome_unknown"
    })
    .await;
    assert_eq!(deadline["reason"], "settlement_deadline", "{deadline}");
    assert_eq!(deadline["execution_status"], "executed");
    assert!(deadline["error"].is_object(), "{deadline}");
    let evs = events(&srv, &run).await;
    assert_terminal(
        &evs,
        &sent,
        json!({"execution_status": "executed", "mutation_outcome": "outcome_unknown",
               "reason": "settlement_deadline", "error": deadline["error"]}),
        &["result"],
    );
    assert_terminal(
        &evs,
        &idle,
        json!({"execution_status": "not_executed", "mutation_outcome": "not_executed",
               "reason": "unsent"}),
        &["result", "error"],
    );
    // The remote answer arrives late: an error answer, confirmed.
    let error = json!({"code": 409, "message": "dashboard exists"});
    let facts = json!({"evidence": "confirmed", "error": error});
    let (status, v) = settle(&srv, &run, &sent, facts.clone()).await;
    assert_eq!(
        (status, &v),
        (StatusCode::OK, &json!({"state": "completed"}))
    );
    assert_record(
        &record(&srv, &run, &sent).await,
        &run,
        &sent,
        json!({"state": "completed", "execution_status": "executed", "error": error}),
    );
    assert_eq!(
        settle(&srv, &run, &sent, facts).await,
        (status, v),
        "same again"
    );
    let (status, v) = settle(&srv, &run, &sent, json!({"evidence": "ambiguous"})).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::CONFLICT, Some("completed")),
        "{v}"
    );
    let (status, v) = dispatch(&srv, &run, &sent).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::CONFLICT, Some("completed")),
        "{v}"
    );
    // No second terminal event; the late result is announced once.
    let after = events(&srv, &run).await;
    assert_eq!(&after[..evs.len()], &evs[..]);
    assert_eq!(types(&after[evs.len()..]), ["tool_execution_updated"]);
    assert_eq!(after[evs.len()]["error"], error);
    assert_gapless(&after);
}

/// Nothing follows `run_completed` / `run_failed`, not even a late deadline or heartbeat;
/// the durable records still settle.
async fn nothing_after_terminal(backend: Backend, verb: &str, terminal: &str) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 2})).await;
    let sent = approved(&srv, &run, TOOL).await;
    let idle = approved(&srv, &run, TOOL).await;
    start(&srv, &run, &sent).await;
    start(&srv, &run, &idle).await;
    assert_eq!(dispatch(&srv, &run, &sent).await.0, StatusCode::OK);
    finish(&srv, &run, verb).await;
    let ended = events(&srv, &run).await;
    assert_eq!(types(&ended).last(), Some(&terminal), "{:?}", types(&ended));
    // Past the deadline and several heartbeat intervals.
    tokio::time::sleep(Duration::from_millis((DEADLINE_MS + 4 * BEAT_MS) as u64)).await;
    let r = wait_record(&srv, &run, &sent, "the deadline", |r| {
        r["state"] != "dispatched"
    })
    .await;
    assert_eq!(r["state"], "outcome_unknown", "{r}");
    let r = wait_record(&srv, &run, &idle, "the deadline", |r| {
        r["state"] != "intent"
    })
    .await;
    assert_eq!(
        (r["state"].as_str(), r["reason"].as_str()),
        (Some("not_executed"), Some("unsent")),
        "{r}"
    );
    // The agent's late settlement is recorded durably, still without an event.
    let (status, v) = settle(&srv, &run, &sent, json!({"evidence": "confirmed"})).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("completed")),
        "{v}"
    );
    let evs = events(&srv, &run).await;
    assert_eq!(evs, ended, "nothing after {terminal}");
    assert_eq!(types(&evs).last(), Some(&terminal));
}

// ---------------------------------------------------------------------------------------
// Reconciliation
// ---------------------------------------------------------------------------------------

/// `outcome_unknown` blocks any new start of the tool call (fresh approval included)
/// until an operator reconciles; `not_applied` then lets the fresh approval start it;
/// reconciling needs an operator.
async fn unknown_blocks_until_reconciled(backend: Backend) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 4})).await;
    let call = approved(&srv, &run, TOOL).await;
    start(&srv, &run, &call).await;
    dispatch(&srv, &run, &call).await;
    let (status, _) = settle(&srv, &run, &call, json!({"evidence": "ambiguous"})).await;
    assert_eq!(status, StatusCode::OK);
    // The same attempt again: 409 outcome_unknown.
    let (status, v) = start(&srv, &run, &call).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::CONFLICT, Some("outcome_unknown")),
        "{v}"
    );
    // A fresh approval of the same tool call: blocked too.
    let fresh = Call::of(TOOL, &call.tool_call_id);
    arm(&srv, &run, &fresh).await;
    approve(&srv, &run, &fresh).await;
    let before = events(&srv, &run).await;
    for _ in 0..2 {
        let (status, v) = start(&srv, &run, &fresh).await;
        assert_eq!(status, StatusCode::CONFLICT, "{v}");
        assert_eq!(
            (v["state"].as_str(), v["approval_id"].as_str()),
            (Some("outcome_unknown"), Some(call.approval_id.as_str())),
            "{v}"
        );
    }
    assert_eq!(
        events(&srv, &run).await,
        before,
        "a blocked start writes nothing"
    );
    assert_eq!(listing(&srv, &run).await.len(), 1);

    // Only an operator reconciles.
    let agent = srv.agent_token.clone();
    let other_agent = srv.auth.mint_jwt("someone", Role::Agent, 600, None);
    for (who, token, expected) in [
        ("agent JWT", agent.as_str(), StatusCode::FORBIDDEN),
        ("another agent", other_agent.as_str(), StatusCode::FORBIDDEN),
        ("run token", run.token.as_str(), StatusCode::FORBIDDEN),
        ("garbage", "not-a-token", StatusCode::UNAUTHORIZED),
    ] {
        let (status, v) =
            reconcile(&srv, &run, &call, token, json!({"observed": "not_applied"})).await;
        assert_eq!(status, expected, "{who}: {v}");
        assert!(v["error"].is_string(), "{v}");
    }
    let (status, v) = srv
        .send(
            srv.http
                .post(srv.url(&format!(
                    "/api/runs/{}/mutations/{}/{}/reconcile",
                    run.id, call.tool_call_id, call.approval_id
                )))
                .json(&json!({"observed": "not_applied"})),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "no token: {v}");
    assert_eq!(
        events(&srv, &run).await,
        before,
        "refused reconciliations write nothing"
    );
    assert_eq!(record(&srv, &run, &call).await["state"], "outcome_unknown");

    let (status, v) = reconcile(
        &srv,
        &run,
        &call,
        &srv.operator_token,
        json!({"observed": "not_applied"}),
    )
    .await;
    assert_eq!(
        (status, &v),
        (
            StatusCode::OK,
            &json!({"state": "not_executed", "reason": "reconciled_not_applied"})
        )
    );
    // Again: the same answer, nothing more.
    let after = events(&srv, &run).await;
    assert_eq!(
        reconcile(
            &srv,
            &run,
            &call,
            &srv.operator_token,
            json!({"observed": "not_applied"}),
        )
        .await,
        (status, v)
    );
    assert_eq!(events(&srv, &run).await, after);
    let reconciled = of_call(&after, &call, "tool_execution_reconciled");
    assert_eq!(reconciled.len(), 1, "{:?}", types(&after));
    assert_eq!(reconciled[0]["observed"], "not_applied");
    assert_eq!(reconciled[0]["mutation_outcome"], "not_executed");
    assert_eq!(reconciled[0]["reconciled_by"], "test-operator");
    let r = record(&srv, &run, &call).await;
    assert!(
        r["error"].is_object(),
        "the ambiguous error facts stay: {r}"
    );
    assert_record(
        &r,
        &run,
        &call,
        json!({"state": "not_executed", "execution_status": "executed",
               "reason": "reconciled_not_applied", "error": r["error"]}),
    );
    // Confirmed non-execution: the old approval stays refused; the fresh one starts.
    let (status, v) = start(&srv, &run, &call).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::CONFLICT, Some("not_executed")),
        "{v}"
    );
    let (status, v) = start(&srv, &run, &fresh).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("intent")),
        "{v}"
    );
    let evs = events(&srv, &run).await;
    assert_eq!(of_call(&evs, &fresh, "tool_execution_started").len(), 1);

    // `applied`: the call is done; a further fresh approval is blocked as completed.
    dispatch(&srv, &run, &fresh).await;
    settle(&srv, &run, &fresh, json!({"evidence": "ambiguous"})).await;
    let (status, v) = reconcile(
        &srv,
        &run,
        &fresh,
        &srv.operator_token,
        json!({"observed": "applied"}),
    )
    .await;
    assert_eq!(
        (status, &v),
        (StatusCode::OK, &json!({"state": "completed"}))
    );
    let third = Call::of(TOOL, &call.tool_call_id);
    arm(&srv, &run, &third).await;
    approve(&srv, &run, &third).await;
    let (status, v) = start(&srv, &run, &third).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::CONFLICT, Some("completed")),
        "{v}"
    );
    // A conflicting reconciliation of a reconciled attempt is refused.
    let (status, v) = reconcile(
        &srv,
        &run,
        &fresh,
        &srv.operator_token,
        json!({"observed": "not_applied"}),
    )
    .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::CONFLICT, Some("completed")),
        "{v}"
    );
}

// ---------------------------------------------------------------------------------------
// Budget
// ---------------------------------------------------------------------------------------

/// Asserts `call`'s start is refused at admission: 409 `not_executed` with `reason`, and
/// on the stream `tool_execution_started` (seed 000: it comes before post-approval
/// admission) followed at once by the terminal `tool_execution`.
async fn assert_refused(srv: &TestServer, run: &Run, call: &Call, reason: &str) {
    let before = events(srv, run).await;
    let (status, v) = start(srv, run, call).await;
    assert_eq!(status, StatusCode::CONFLICT, "{reason}: {v}");
    assert_eq!(
        (v["state"].as_str(), v["reason"].as_str()),
        (Some("not_executed"), Some(reason)),
        "{v}"
    );
    assert!(v["error"].is_string(), "{v}");
    assert!(v.get("sequence").is_none(), "{v}");
    let evs = events(srv, run).await;
    assert_eq!(
        evs.len(),
        before.len() + 2,
        "the start, then its terminal event"
    );
    let started = of_call(&evs, call, "tool_execution_started");
    assert_eq!(started.len(), 1);
    assert_eq!(started[0], &evs[before.len()]);
    assert_eq!(
        started[0].as_object().unwrap().len(),
        8,
        "envelope and the ids only: {}",
        started[0]
    );
    let e = assert_terminal(
        &evs,
        call,
        json!({"execution_status": "not_executed", "mutation_outcome": "not_executed",
               "reason": reason}),
        &["result", "error"],
    );
    assert_eq!(evs.last(), Some(&e));
    assert_record(
        &record(srv, run, call).await,
        run,
        call,
        json!({"state": "not_executed", "execution_status": "not_executed", "reason": reason}),
    );
    // A retry answers the same refusal, appending nothing.
    assert_eq!(start(srv, run, call).await, (status, v));
    assert_eq!(events(srv, run).await, evs);
}

async fn budget_refusals(backend: Backend) {
    let srv = server(backend).await;
    // No budget: nothing is admitted (fail closed).
    let bare = new_run(&srv, json!({})).await;
    let call = approved(&srv, &bare, TOOL).await;
    assert_refused(&srv, &bare, &call, "no_budget").await;

    // A tool the budget does not list; one whose max_starts are used up; the ceiling.
    let run = new_run(
        &srv,
        json!({"budget": {"tools": {TOOL: 1, "web_search": 0, "create_kpi": 5},
                          "call_ceiling": 2}}),
    )
    .await;
    let unlisted = approved(&srv, &run, "create_alert_from_chart").await;
    assert_refused(&srv, &run, &unlisted, "tool_not_in_budget").await;
    let zero = approved(&srv, &run, "web_search").await;
    assert_refused(&srv, &run, &zero, "budget_exhausted").await;
    let first = approved(&srv, &run, TOOL).await;
    let second = approved(&srv, &run, TOOL).await;
    let (status, v) = start(&srv, &run, &first).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("intent")),
        "{v}"
    );
    // The first attempt ended not_sent: its start is not given back.
    dispatch(&srv, &run, &first).await;
    settle(&srv, &run, &first, json!({"evidence": "not_sent"})).await;
    assert_refused(&srv, &run, &second, "budget_exhausted").await;
    let kpi = approved(&srv, &run, "create_kpi").await;
    assert_eq!(start(&srv, &run, &kpi).await.0, StatusCode::OK);
    let over = approved(&srv, &run, "create_kpi").await;
    assert_refused(&srv, &run, &over, "call_ceiling_reached").await;
    let evs = events(&srv, &run).await;
    assert_eq!(
        types(&evs)
            .iter()
            .filter(|t| **t == "tool_execution_started")
            .count(),
        6,
        "every human-approved call started once, admitted (2) or not (4): {:?}",
        types(&evs)
    );
    assert_gapless(&evs);
}

// ---------------------------------------------------------------------------------------
// Receipts
// ---------------------------------------------------------------------------------------

async fn receipts(backend: Backend) {
    let srv = server(backend).await;
    let delivery = format!("delivery-{}", short_id());
    let body = json!({"delivery_id": delivery, "budget": {"tools": {TOOL: 1}}});
    let (status, created) = srv.post("/api/runs", &srv.agent_token, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let (status, again) = srv.post("/api/runs", &srv.agent_token, &body).await;
    assert_eq!((status, &again), (StatusCode::OK, &created), "the same run");
    let path = format!("/api/receipts/{delivery}");
    let (status, receipt) = srv.get(&path, &srv.agent_token).await;
    assert_eq!(status, StatusCode::OK, "{receipt}");
    assert_eq!(
        receipt,
        json!({"run_id": created["run_id"], "run_token": created["run_token"],
               "sequence": 1, "status": "running"})
    );
    // The receipt's token works on the run.
    let run = Run {
        id: receipt["run_id"].as_str().unwrap().to_owned(),
        token: receipt["run_token"].as_str().unwrap().to_owned(),
    };
    let evs = srv.replay_all(&run.id, &run.token, 100).await;
    assert_eq!(types(&evs), ["run_started"]);
    finish(&srv, &run, "complete").await;
    let (status, receipt) = srv.get(&path, &srv.agent_token).await;
    assert_eq!(
        (status, receipt["status"].as_str()),
        (StatusCode::OK, Some("completed")),
        "{receipt}"
    );

    // Another agent, another project, an operator, an unknown delivery.
    let other = srv.auth.mint_jwt("other-agent", Role::Agent, 600, None);
    let (status, v) = srv.get(&path, &other).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert!(v.get("run_id").is_none(), "{v}");
    let projected = srv
        .auth
        .mint_jwt("test-agent", Role::Agent, 600, Some("proj-x".into()));
    let (status, v) = srv.get(&path, &projected).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    let (status, v) = srv.get(&path, &srv.operator_token).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    let (status, v) = srv.get(&path, &run.token).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    let (status, v) = srv
        .get(
            &format!("/api/receipts/delivery-{}", short_id()),
            &srv.agent_token,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
}

// ---------------------------------------------------------------------------------------
// Bad input
// ---------------------------------------------------------------------------------------

/// Unknown fields, bad evidence, ids with `#` or spaces, mismatches, pending and unknown
/// cards: 400/404/409 JSON, and nothing written.
async fn bad_input_writes_nothing(backend: Backend) {
    let with = |base: &Value, k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 2})).await;
    let call = approved(&srv, &run, TOOL).await;
    let (status, _) = start(&srv, &run, &call).await;
    assert_eq!(status, StatusCode::OK);
    // A card bound to its arguments.
    let other = Call::new(TOOL);
    let (status, v) = arm_with(
        &srv,
        &run,
        with(&other.arm_body(), "arguments_hash", json!("sha256:abc")),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    approve(&srv, &run, &other).await;
    let pending = Call::new(TOOL);
    arm(&srv, &run, &pending).await;
    let before = events(&srv, &run).await;
    let listed = listing(&srv, &run).await;

    let tc = call.tool_call_id.clone();
    let ap = call.approval_id.clone();
    let start_ok = call.start_body();
    // (what, verb, tool_call_id in the path, body, expected status)
    let cases: Vec<(&str, &str, String, Value, StatusCode)> = vec![
        (
            "start: unknown field",
            "start",
            tc.clone(),
            with(&start_ok, "retry", json!(true)),
            StatusCode::BAD_REQUEST,
        ),
        (
            "start: missing field",
            "start",
            tc.clone(),
            json!({"request_id": call.request_id, "tool_name": TOOL}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "start: # in approval_id",
            "start",
            tc.clone(),
            with(&start_ok, "approval_id", json!(format!("{ap}#x"))),
            StatusCode::BAD_REQUEST,
        ),
        (
            "start: space in request_id",
            "start",
            tc.clone(),
            with(&start_ok, "request_id", json!("req 1")),
            StatusCode::BAD_REQUEST,
        ),
        (
            "start: # in the path",
            "start",
            format!("{tc}%23x"),
            start_ok.clone(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "start: space in the path",
            "start",
            format!("{tc}%20x"),
            start_ok.clone(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "start: another tool",
            "start",
            other.tool_call_id.clone(),
            with(&other.start_body(), "tool_name", json!("web_fetch")),
            StatusCode::BAD_REQUEST,
        ),
        (
            "start: another card's call",
            "start",
            other.tool_call_id.clone(),
            with(&other.start_body(), "approval_id", json!(ap)),
            StatusCode::BAD_REQUEST,
        ),
        (
            "start: another arguments hash",
            "start",
            other.tool_call_id.clone(),
            with(&other.start_body(), "arguments_hash", json!("sha256:other")),
            StatusCode::BAD_REQUEST,
        ),
        (
            "start: no arguments hash",
            "start",
            other.tool_call_id.clone(),
            other.start_body(),
            StatusCode::BAD_REQUEST,
        ),
        (
            "start: pending card",
            "start",
            pending.tool_call_id.clone(),
            pending.start_body(),
            StatusCode::CONFLICT,
        ),
        (
            "start: unknown card",
            "start",
            tc.clone(),
            with(&start_ok, "request_id", json!("req-unknown")),
            StatusCode::NOT_FOUND,
        ),
        (
            "dispatch: unknown field",
            "dispatch",
            tc.clone(),
            json!({"approval_id": ap, "force": true}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "dispatch: missing approval_id",
            "dispatch",
            tc.clone(),
            json!({}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "dispatch: # in approval_id",
            "dispatch",
            tc.clone(),
            json!({"approval_id": format!("{ap}#x")}),
            StatusCode::NOT_FOUND,
        ),
        (
            "dispatch: space in the path",
            "dispatch",
            format!("{tc}%20x"),
            json!({"approval_id": ap}),
            StatusCode::NOT_FOUND,
        ),
        (
            "dispatch: unknown attempt",
            "dispatch",
            tc.clone(),
            json!({"approval_id": other.approval_id}),
            StatusCode::NOT_FOUND,
        ),
        (
            "settle: bad evidence",
            "settle",
            tc.clone(),
            json!({"approval_id": ap, "evidence": "maybe"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "settle: evidence case",
            "settle",
            tc.clone(),
            json!({"approval_id": ap, "evidence": "Not_Sent"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "settle: unknown field",
            "settle",
            tc.clone(),
            json!({"approval_id": ap, "evidence": "not_sent", "why": "x"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "settle: not_sent with a result",
            "settle",
            tc.clone(),
            json!({"approval_id": ap, "evidence": "not_sent", "result": {"id": 1}}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "settle: # in the path",
            "settle",
            format!("{tc}%23x"),
            json!({"approval_id": ap, "evidence": "not_sent"}),
            StatusCode::NOT_FOUND,
        ),
        (
            "settle: space in approval_id",
            "settle",
            tc.clone(),
            json!({"approval_id": "a b", "evidence": "not_sent"}),
            StatusCode::NOT_FOUND,
        ),
        (
            "settle: confirmed before dispatch",
            "settle",
            tc.clone(),
            json!({"approval_id": ap, "evidence": "confirmed"}),
            StatusCode::CONFLICT,
        ),
    ];
    for (what, verb, path_tc, body, expected) in cases {
        let (status, v) = call_verb(&srv, &run, &path_tc, verb, body).await;
        assert_eq!(status, expected, "{what}: {v}");
        assert!(v["error"].is_string(), "{what}: {v}");
    }
    // Malformed JSON.
    for verb in ["start", "dispatch", "settle"] {
        let (status, v) = srv
            .send(
                srv.http
                    .post(srv.url(&format!("/api/runs/{}/tool-calls/{tc}/{verb}", run.id)))
                    .bearer_auth(&run.token)
                    .header("content-type", "application/json")
                    .body("{\"approval_id\": "),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{verb}: {v}");
    }
    // Reconcile and read with bad ids or bodies.
    let base = format!("/api/runs/{}/mutations", run.id);
    for (what, path, body, expected) in [
        (
            "reconcile: bad observed",
            format!("{base}/{tc}/{ap}/reconcile"),
            json!({"observed": "yes"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "reconcile: unknown field",
            format!("{base}/{tc}/{ap}/reconcile"),
            json!({"observed": "applied", "note": "x"}),
            StatusCode::BAD_REQUEST,
        ),
        (
            "reconcile: # in the path",
            format!("{base}/{tc}%23x/{ap}/reconcile"),
            json!({"observed": "applied"}),
            StatusCode::NOT_FOUND,
        ),
        (
            "reconcile: space in the path",
            format!("{base}/{tc}/a%20b/reconcile"),
            json!({"observed": "applied"}),
            StatusCode::NOT_FOUND,
        ),
        (
            "reconcile: an intent",
            format!("{base}/{tc}/{ap}/reconcile"),
            json!({"observed": "applied"}),
            StatusCode::CONFLICT,
        ),
    ] {
        let (status, v) = srv.post(&path, &srv.operator_token, &body).await;
        assert_eq!(status, expected, "{what}: {v}");
        assert!(v["error"].is_string(), "{what}: {v}");
    }
    for path in [
        format!("{base}/{tc}%23x/{ap}"),
        format!("{base}/{tc}/{ap}%20x"),
        format!("{base}/{tc}/unknown-approval"),
    ] {
        let (status, v) = srv.get(&path, &run.token).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}: {v}");
    }
    // Unknown run; another run's token.
    let elsewhere = budget_run(&srv, json!({TOOL: 1})).await;
    let (status, v) = srv
        .post(
            &format!("/api/runs/{}/tool-calls/{tc}/start", run.id),
            &elsewhere.token,
            &start_ok,
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    let (status, v) = srv
        .post(
            &format!("/api/runs/run-{}/tool-calls/{tc}/dispatch", short_id()),
            &srv.operator_token,
            &json!({"approval_id": ap}),
        )
        .await;
    assert!(
        status == StatusCode::FORBIDDEN || status == StatusCode::NOT_FOUND,
        "{status} {v}"
    );

    assert_eq!(events(&srv, &run).await, before, "the stream is unchanged");
    assert_eq!(
        listing(&srv, &run).await,
        listed,
        "the records are unchanged"
    );
    assert_record(
        &record(&srv, &run, &call).await,
        &run,
        &call,
        json!({"state": "intent"}),
    );
    // And the attempt still works.
    let (status, v) = dispatch(&srv, &run, &call).await;
    assert_eq!(
        (status, &v),
        (StatusCode::OK, &json!({"state": "dispatched"}))
    );
}

/// A timer queue that loses every message of the kinds in `lose` (a failed SendMessage,
/// a purged or dead-lettered message) and delivers the others in this process.
struct Losing {
    inner: tollgate_timers::EmbeddedTimers,
    lose: &'static [&'static str],
}

#[async_trait::async_trait]
impl tollgate_timers::TimerQueue for Losing {
    async fn schedule(
        &self,
        message: &tollgate_timers::TimerMessage,
        delay: Duration,
    ) -> Result<(), tollgate_timers::TimerError> {
        if self.lose.contains(&message.kind()) {
            return Ok(());
        }
        self.inner.schedule(message, delay).await
    }
}

/// A server whose timer queue loses the kinds in `lose`; keep the loop while it runs.
async fn losing_server(
    backend: Backend,
    lose: &'static [&'static str],
) -> (TestServer, tollgate_timers::TimerLoop) {
    let inner = tollgate_timers::EmbeddedTimers::new();
    let deps = tollgate_api::Deps::new(
        store_for(backend).await,
        std::sync::Arc::new(Losing {
            inner: inner.clone(),
            lose,
        }),
        GateConfig {
            heartbeat_every: Duration::from_secs(60),
            execution: ExecutionSettings {
                settlement_deadline_ms: DEADLINE_MS,
                heartbeat_interval_ms: BEAT_MS,
            },
            ..GateConfig::default()
        },
        tollgate_api::Auth::new(tollgate_tests::TEST_SECRET.as_bytes()),
    );
    let timers = inner.attach(deps.gate.clone());
    (TestServer::with_deps(deps).await, timers)
}

/// GIVEN a dispatched call whose settlement-deadline message was lost WHEN nobody
/// settles it THEN the end of its heartbeat chain settles it at the deadline
/// (`outcome_unknown`, the terminal `tool_execution` on the stream) — and with every
/// timer lost, an operator can still reconcile it once its deadline has passed.
async fn lost_deadline_timers_are_backstopped(backend: Backend) {
    let (srv, _timers) = losing_server(backend, &["settlement_deadline"]).await;
    let run = budget_run(&srv, json!({TOOL: 2})).await;
    let call = approved(&srv, &run, TOOL).await;
    assert_eq!(start(&srv, &run, &call).await.0, StatusCode::OK);
    assert_eq!(dispatch(&srv, &run, &call).await.0, StatusCode::OK);
    let r = wait_record(&srv, &run, &call, "the heartbeat chain's backstop", |r| {
        r["state"] == "outcome_unknown"
    })
    .await;
    assert_eq!(r["reason"], "settlement_deadline", "{r}");
    let evs = events(&srv, &run).await;
    assert_terminal(
        &evs,
        &call,
        json!({"execution_status": "executed", "mutation_outcome": "outcome_unknown"}),
        &["result"],
    );
    assert!(
        !of_call(&evs, &call, "heartbeat").is_empty(),
        "{:?}",
        types(&evs)
    );

    let (srv, _timers) =
        losing_server(backend, &["settlement_deadline", "execution_heartbeat"]).await;
    let run = budget_run(&srv, json!({TOOL: 2})).await;
    let call = approved(&srv, &run, TOOL).await;
    assert_eq!(start(&srv, &run, &call).await.0, StatusCode::OK);
    assert_eq!(dispatch(&srv, &run, &call).await.0, StatusCode::OK);
    let (status, v) = reconcile(
        &srv,
        &run,
        &call,
        &srv.operator_token,
        json!({"observed": "applied"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "not before the deadline: {v}");
    assert_eq!(v["state"], "dispatched");
    tokio::time::sleep(Duration::from_millis(DEADLINE_MS as u64 + 200)).await;
    assert_eq!(
        record(&srv, &run, &call).await["state"],
        "dispatched",
        "no timer ran"
    );
    let (status, v) = reconcile(
        &srv,
        &run,
        &call,
        &srv.operator_token,
        json!({"observed": "not_applied"}),
    )
    .await;
    assert_eq!(
        (status, &v["state"]),
        (StatusCode::OK, &json!("not_executed")),
        "{v}"
    );
    let evs = events(&srv, &run).await;
    let tail: Vec<&str> = types(&evs).into_iter().rev().take(2).collect();
    assert_eq!(tail, ["tool_execution_reconciled", "tool_execution"]);
    // Not applied: a fresh approval may run the call.
    let fresh = Call::of(TOOL, &call.tool_call_id);
    arm(&srv, &run, &fresh).await;
    approve(&srv, &run, &fresh).await;
    assert_eq!(start(&srv, &run, &fresh).await.0, StatusCode::OK);
}

/// GIVEN a server that loses every settlement-deadline and execution-heartbeat timer,
/// with its sweeper running, and two started calls — one never dispatched, one
/// dispatched — that nobody settles WHEN their deadline passes THEN the sweeper settles
/// them exactly as the deadline timer would: the intent `not_executed` (`unsent`,
/// `tool_execution` not_executed), the dispatched one `outcome_unknown`
/// (`settlement_deadline`, `tool_execution` executed), each announced once; a dispatch
/// after that is refused.
async fn the_sweeper_settles_attempts_whose_deadline_timer_was_lost(backend: Backend) {
    let inner = tollgate_timers::EmbeddedTimers::new();
    let deps = tollgate_api::Deps::new(
        store_for(backend).await,
        std::sync::Arc::new(Losing {
            inner: inner.clone(),
            lose: &["settlement_deadline", "execution_heartbeat"],
        }),
        GateConfig {
            heartbeat_every: Duration::from_secs(60),
            sweep_every: Duration::from_millis(250),
            execution: ExecutionSettings {
                settlement_deadline_ms: DEADLINE_MS,
                heartbeat_interval_ms: BEAT_MS,
            },
            ..GateConfig::default()
        },
        tollgate_api::Auth::new(tollgate_tests::TEST_SECRET.as_bytes()),
    )
    .with_sweeper();
    let _timers = inner.attach(deps.gate.clone());
    let srv = TestServer::with_deps(deps).await;
    let run = budget_run(&srv, json!({TOOL: 3})).await;
    let unsent = approved(&srv, &run, TOOL).await;
    let sent = approved(&srv, &run, TOOL).await;
    assert_eq!(start(&srv, &run, &unsent).await.0, StatusCode::OK);
    assert_eq!(start(&srv, &run, &sent).await.0, StatusCode::OK);
    assert_eq!(dispatch(&srv, &run, &sent).await.0, StatusCode::OK);

    let r = wait_record(&srv, &run, &unsent, "the sweeper (intent)", |r| {
        r["state"] != "intent"
    })
    .await;
    assert_eq!(
        (&r["state"], &r["reason"]),
        (&json!("not_executed"), &json!("unsent")),
        "{r}"
    );
    let r = wait_record(&srv, &run, &sent, "the sweeper (dispatched)", |r| {
        r["state"] != "dispatched"
    })
    .await;
    assert_eq!(
        (&r["state"], &r["reason"]),
        (&json!("outcome_unknown"), &json!("settlement_deadline")),
        "{r}"
    );
    let evs = events(&srv, &run).await;
    assert_terminal(
        &evs,
        &unsent,
        json!({"execution_status": "not_executed", "mutation_outcome": "not_executed"}),
        &["result"],
    );
    assert_terminal(
        &evs,
        &sent,
        json!({"execution_status": "executed", "mutation_outcome": "outcome_unknown"}),
        &["result"],
    );
    let (status, v) = dispatch(&srv, &run, &unsent).await;
    assert_eq!(
        (status, &v["state"]),
        (StatusCode::CONFLICT, &json!("not_executed")),
        "{v}"
    );
}

/// GIVEN an operator found an unknown outcome not applied WHEN the remote's confirmed
/// response arrives after all THEN the record is `outcome_unknown` again (`contested`,
/// with the response's facts) and blocks a fresh attempt until an operator reconciles it
/// once more — the call is never run twice on a guess.
async fn a_late_response_contests_not_applied(backend: Backend) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 3})).await;
    let call = approved(&srv, &run, TOOL).await;
    assert_eq!(start(&srv, &run, &call).await.0, StatusCode::OK);
    assert_eq!(dispatch(&srv, &run, &call).await.0, StatusCode::OK);
    let (status, _) = settle(&srv, &run, &call, json!({"evidence": "ambiguous"})).await;
    assert_eq!(status, StatusCode::OK);
    let (status, v) = reconcile(
        &srv,
        &run,
        &call,
        &srv.operator_token,
        json!({"observed": "not_applied"}),
    )
    .await;
    assert_eq!(
        (status, &v["state"]),
        (StatusCode::OK, &json!("not_executed"))
    );
    let before = events(&srv, &run).await;
    let (status, v) = settle(
        &srv,
        &run,
        &call,
        json!({"evidence": "confirmed", "result": {"dashboard_id": "d-9"}}),
    )
    .await;
    assert_eq!(
        (status, &v["state"]),
        (StatusCode::OK, &json!("outcome_unknown")),
        "{v}"
    );
    // The record changes and the stream says so, in the same step.
    let after = events(&srv, &run).await;
    assert_eq!(&after[..before.len()], &before[..]);
    assert_eq!(types(&after[before.len()..]), ["tool_execution_updated"]);
    assert_eq!(
        (
            &after[before.len()]["previous_outcome"],
            &after[before.len()]["mutation_outcome"],
            &after[before.len()]["reason"]
        ),
        (
            &json!("not_executed"),
            &json!("outcome_unknown"),
            &json!("contested")
        )
    );
    let r = record(&srv, &run, &call).await;
    assert_eq!(
        (&r["state"], &r["reason"], &r["result"]),
        (
            &json!("outcome_unknown"),
            &json!("contested"),
            &json!({"dashboard_id": "d-9"})
        )
    );
    let fresh = Call::of(TOOL, &call.tool_call_id);
    arm(&srv, &run, &fresh).await;
    approve(&srv, &run, &fresh).await;
    let (status, v) = start(&srv, &run, &fresh).await;
    assert_eq!(
        (status, &v["state"]),
        (StatusCode::CONFLICT, &json!("outcome_unknown")),
        "{v}"
    );
    let (status, v) = reconcile(
        &srv,
        &run,
        &call,
        &srv.operator_token,
        json!({"observed": "applied"}),
    )
    .await;
    assert_eq!(
        (status, &v["state"]),
        (StatusCode::OK, &json!("completed")),
        "{v}"
    );
    let (status, v) = start(&srv, &run, &fresh).await;
    assert_eq!(
        (status, &v["state"]),
        (StatusCode::CONFLICT, &json!("completed")),
        "{v}"
    );
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

/// The deadline's `outcome_unknown` stands: start → dispatch → the deadline records
/// `outcome_unknown` → a late `not_sent` is 409 with the state and writes nothing (it
/// would free the call for a fresh approval to run again); a fresh approval of the same
/// tool call stays blocked; a late `confirmed` replaces the guess and is announced, so
/// the stream and `mutation_outcome/v1` agree at every step.
async fn deadline_outcome_unknown_stands(backend: Backend) {
    let srv = server(backend).await;
    let run = budget_run(&srv, json!({TOOL: 3})).await;
    let call = approved(&srv, &run, TOOL).await;
    assert_eq!(start(&srv, &run, &call).await.0, StatusCode::OK);
    assert_eq!(dispatch(&srv, &run, &call).await.0, StatusCode::OK);
    let unknown = wait_record(&srv, &run, &call, "the deadline", |r| {
        r["state"] == "outcome_unknown"
    })
    .await;
    let before = events(&srv, &run).await;
    let (status, v) = settle(&srv, &run, &call, json!({"evidence": "not_sent"})).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::CONFLICT, Some("outcome_unknown")),
        "{v}"
    );
    assert_eq!(
        record(&srv, &run, &call).await,
        unknown,
        "the record stands"
    );
    // An ambiguous settlement agrees with it: 200, nothing changes.
    let (status, v) = settle(&srv, &run, &call, json!({"evidence": "ambiguous"})).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("outcome_unknown")),
        "{v}"
    );
    assert_eq!(record(&srv, &run, &call).await, unknown);
    let heartbeats_only = |evs: &[Value]| {
        evs.iter()
            .filter(|e| e["type"] != "heartbeat")
            .cloned()
            .collect::<Vec<_>>()
    };
    assert_eq!(
        heartbeats_only(&events(&srv, &run).await),
        heartbeats_only(&before),
        "nothing announced for evidence that changed nothing"
    );
    // A fresh approval of the same tool call is still blocked.
    let again = Call::of(TOOL, &call.tool_call_id);
    arm(&srv, &run, &again).await;
    approve(&srv, &run, &again).await;
    let (status, v) = start(&srv, &run, &again).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::CONFLICT, Some("outcome_unknown")),
        "{v}"
    );
    // A real response replaces the guess, announced in the same step.
    let (status, v) = settle(
        &srv,
        &run,
        &call,
        json!({"evidence": "confirmed", "result": {"id": 9}}),
    )
    .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("completed")),
        "{v}"
    );
    let evs = events(&srv, &run).await;
    assert_gapless(&evs);
    let mine: Vec<&Value> = evs
        .iter()
        .filter(|e| {
            e["tool_call_id"] == json!(call.tool_call_id)
                && e["approval_id"] == json!(call.approval_id)
        })
        .filter(|e| e["type"] == "tool_execution" || e["type"] == "tool_execution_updated")
        .collect();
    assert_eq!(mine.len(), 2, "{mine:?}");
    assert_eq!(mine[0]["mutation_outcome"], "outcome_unknown");
    assert_eq!(mine[1]["type"], "tool_execution_updated");
    assert_eq!(mine[1]["previous_outcome"], "outcome_unknown");
    assert_eq!(mine[1]["mutation_outcome"], "completed");
    assert_eq!(mine[1]["result"], json!({"id": 9}));
    let now = record(&srv, &run, &call).await;
    assert_eq!(
        now["state"], mine[1]["mutation_outcome"],
        "stream and record agree"
    );
}

macro_rules! for_backend {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn golden_success() {
                super::golden_success($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn golden_pre_dispatch_expiry() {
                super::golden_pre_dispatch_expiry($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn golden_dispatched_timeout() {
                super::golden_dispatched_timeout($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn golden_late_settlement() {
                super::golden_late_settlement($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn deadline_outcome_unknown_stands() {
                super::deadline_outcome_unknown_stands($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn started_once_after_approval() {
                super::started_once_after_approval($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn concurrent_starts_and_dispatches() {
                super::concurrent_starts_and_dispatches($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn no_start_for_auto_approved() {
                super::no_start_for_auto_approved($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn no_start_for_human_ask() {
                super::no_start_for_human_ask($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn no_start_for_denied() {
                super::no_start_for_denied($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn no_start_for_expired() {
                super::no_start_for_expired($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn cancelled_before_dispatch() {
                super::cancelled_before_dispatch($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn confirmed_completes() {
                super::confirmed_completes($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn ambiguous_is_unknown() {
                super::ambiguous_is_unknown($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn not_sent_is_not_executed() {
                super::not_sent_is_not_executed($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn deadline_fences() {
                super::deadline_fences($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn nothing_after_run_completed() {
                super::nothing_after_terminal($backend, "complete", "run_completed").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn nothing_after_run_failed() {
                super::nothing_after_terminal($backend, "fail", "run_failed").await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn unknown_blocks_until_reconciled() {
                super::unknown_blocks_until_reconciled($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn budget_refusals() {
                super::budget_refusals($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn receipts() {
                super::receipts($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn lost_deadline_timers_are_backstopped() {
                super::lost_deadline_timers_are_backstopped($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn the_sweeper_settles_attempts_whose_deadline_timer_was_lost() {
                super::the_sweeper_settles_attempts_whose_deadline_timer_was_lost($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_late_response_contests_not_applied() {
                super::a_late_response_contests_not_applied($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn bad_input_writes_nothing() {
                super::bad_input_writes_nothing($backend).await
            }
        }
    };
}

for_backend!(memory, Backend::Memory);
for_backend!(dynamo, Backend::Dynamo);
