//! The golden transcripts: the seed's three examples (success, pre-dispatch expiry,
//! dispatched timeout) and a late settlement, compared with
//! `fixtures/approved_execution_v2.json`.

use super::*;

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
pub(super) async fn golden_success(backend: Backend) {
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
pub(super) async fn golden_pre_dispatch_expiry(backend: Backend) {
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
pub(super) async fn golden_dispatched_timeout(backend: Backend) {
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
pub(super) async fn golden_late_settlement(backend: Backend) {
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
