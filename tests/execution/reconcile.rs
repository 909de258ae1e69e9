//! Reconciliation: `outcome_unknown` blocks new starts until an operator reconciles it,
//! and a late response contests `not_applied`.

use super::*;

/// `outcome_unknown` blocks any new start of the tool call (fresh approval included)
/// until an operator reconciles; `not_applied` then lets the fresh approval start it;
/// reconciling needs an operator.
pub(super) async fn unknown_blocks_until_reconciled(backend: Backend) {
    let srv = patient_server(backend).await;
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

/// GIVEN an operator found an unknown outcome not applied WHEN the remote's confirmed
/// response arrives after all THEN the record is `outcome_unknown` again (`contested`,
/// with the response's facts) and blocks a fresh attempt until an operator reconciles it
/// once more — the call is never run twice on a guess.
pub(super) async fn a_late_response_contests_not_applied(backend: Backend) {
    let srv = patient_server(backend).await;
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
