//! `tool_execution_started`: once after a human approval, under concurrent starts and
//! dispatches, and never for auto-approved, `human__ask`, denied or expired calls.

use super::*;

/// Exactly once per human-approved call, after `tool.approval_resolved`, before the
/// dispatch; a retried start answers the same and appends nothing.
pub(super) async fn started_once_after_approval(backend: Backend) {
    let srv = patient_server(backend).await;
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
pub(super) async fn concurrent_starts_and_dispatches(backend: Backend) {
    let srv = patient_server(backend).await;
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
pub(super) async fn no_start_for_auto_approved(backend: Backend) {
    let srv = patient_server(backend).await;
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
pub(super) async fn no_start_for_human_ask(backend: Backend) {
    let srv = patient_server(backend).await;
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
pub(super) async fn no_start_for_denied(backend: Backend) {
    let srv = patient_server(backend).await;
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
pub(super) async fn no_start_for_expired(backend: Backend) {
    let srv = patient_server(backend).await;
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
