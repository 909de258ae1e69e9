//! Bad input: 400/404/409 JSON, and nothing written.

use super::*;

/// Unknown fields, bad evidence, ids with `#` or spaces, mismatches, pending and unknown
/// cards: 400/404/409 JSON, and nothing written.
pub(super) async fn bad_input_writes_nothing(backend: Backend) {
    let with = |base: &Value, k: &str, v: Value| {
        let mut b = base.clone();
        b[k] = v;
        b
    };
    let srv = patient_server(backend).await;
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
