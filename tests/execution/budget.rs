//! Budgets at admission (refusals with their reason) and the receipt of a budgeted run's
//! creation.

use super::*;

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

pub(super) async fn budget_refusals(backend: Backend) {
    let srv = patient_server(backend).await;
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

pub(super) async fn receipts(backend: Backend) {
    let srv = patient_server(backend).await;
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
