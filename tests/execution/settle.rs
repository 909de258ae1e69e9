//! The evidence table, deadline fencing, the deadline's `outcome_unknown` standing, and
//! nothing after a terminal run.

use super::*;

/// Cancelled before dispatch: the dispatch is refused, the record settles `not_executed`,
/// nothing follows `run_cancelled` (not even the deadline's settlement).
pub(super) async fn cancelled_before_dispatch(backend: Backend) {
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
pub(super) async fn confirmed_completes(backend: Backend) {
    let srv = patient_server(backend).await;
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
pub(super) async fn ambiguous_is_unknown(backend: Backend) {
    let srv = patient_server(backend).await;
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
pub(super) async fn not_sent_is_not_executed(backend: Backend) {
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

/// Dispatch after the deadline is refused 409; a late settlement with real evidence of a
/// dispatched call the deadline settled keeps its actual result, without a second
/// terminal event; a settlement never dispatched cannot claim a result.
pub(super) async fn deadline_fences(backend: Backend) {
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
pub(super) async fn nothing_after_terminal(backend: Backend, verb: &str, terminal: &str) {
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

/// The deadline's `outcome_unknown` stands: start → dispatch → the deadline records
/// `outcome_unknown` → a late `not_sent` is 409 with the state and writes nothing (it
/// would free the call for a fresh approval to run again); a fresh approval of the same
/// tool call stays blocked; a late `confirmed` replaces the guess and is announced, so
/// the stream and `mutation_outcome/v1` agree at every step.
pub(super) async fn deadline_outcome_unknown_stands(backend: Backend) {
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
