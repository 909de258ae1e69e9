//! The wire fixtures (`fixtures/wire/`) are what the server answers: each is compared,
//! shape for shape (the same keys, each value of the same JSON type), with the answer a
//! real server gives to the same request — on the embedded store. The client reads the
//! same fixtures through its types (`shared/client/tests/wire.rs`), so a change of the
//! server's answers that the client does not follow fails one of the two.

use std::path::Path;

use reqwest::StatusCode;
use serde_json::{json, Map, Value};
use tollgate_api::{GateConfig, Role};
use tollgate_tests::{store_for, Backend, TestServer};

fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/wire")
        .join(name);
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// A JSON value's shape: objects by key, arrays by their elements, leaves by type.
fn shape(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| (k.clone(), shape(v)))
                .collect::<Map<_, _>>(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(shape).collect()),
        Value::Null => "null".into(),
        Value::Bool(_) => "bool".into(),
        Value::Number(_) => "number".into(),
        Value::String(_) => "string".into(),
    }
}

fn assert_same_shape(name: &str, served: &Value) {
    assert_eq!(
        shape(served),
        shape(&fixture(name)),
        "{name}: the server answers {served:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fixtures_are_the_servers_answers() {
    let srv = TestServer::with_deps(TestServer::deps(
        store_for(Backend::Memory).await,
        GateConfig {
            allow_loopback_origins: true,
            ..GateConfig::default()
        },
    ))
    .await;
    // Run receipts: an inline run, a pod run.
    let (status, inline) = srv
        .post("/api/runs", &srv.agent_token, &json!({"owner": "alice"}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_same_shape("run_receipt.json", &inline);
    let (status, pod) = srv
        .post(
            "/api/runs",
            &srv.agent_token,
            &json!({"execution_mode": "pod", "agenthost_origin": "http://127.0.0.1:9"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    assert_same_shape("run_receipt_pod.json", &pod);

    // A page of pending cards: a card of an inline run; a pod-held card of a child.
    let (run, token) = (
        inline["run_id"].as_str().unwrap().to_owned(),
        inline["run_token"].as_str().unwrap().to_owned(),
    );
    let (status, v) = srv
        .post(
            &format!("/api/runs/{run}/approval-requests"),
            &token,
            &json!({"request_id": "req-1", "tool_name": "web_fetch", "url": "https://example.com/docs",
                    "intention": "read the docs", "arguments_hash": "3f8a0c1e"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let (coordinator, _) = srv.create_run(json!({"kind": "coordinator"})).await;
    let (status, child) = srv
        .post(
            "/api/runs",
            &srv.agent_token,
            &json!({"kind": "child", "parent_run_id": coordinator, "subtask_id": 3,
                    "execution_mode": "pod", "agenthost_origin": "http://127.0.0.1:9"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{child}");
    let (status, v) = srv
        .post(
            &format!("/api/runs/{}/events", child["run_id"].as_str().unwrap()),
            child["run_token"].as_str().unwrap(),
            &json!({"events": [{"type": "tool.approval_required", "requestId": "req-7",
                    "toolName": "shell", "toolCallId": "call-7", "intention": "list files",
                    "message": "in the build directory", "argumentsHash": "9c1d3e5f"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    // A third card expiring last (the listing is by deadline), so the page of two has
    // more.
    srv.post(
        &format!("/api/runs/{run}/approval-requests"),
        &token,
        &json!({"request_id": "req-9", "tool_name": "web_fetch", "timeout_seconds": 3600}),
    )
    .await;
    let (status, page) = srv
        .get("/api/approvals?state=pending&limit=2", &srv.operator_token)
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_same_shape("approvals_page.json", &page);

    // Decision answers: approved; a card of a run that ended.
    let alice = srv.auth.mint_jwt("alice", Role::Operator, 600, None);
    let (status, approved) = srv
        .post(
            &format!("/api/runs/{run}/tool-approvals"),
            &alice,
            &json!({"request_id": "req-1"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{approved}");
    assert_same_shape("decision_approved.json", &approved);
    let (status, _) = srv
        .post(&format!("/api/runs/{run}/complete"), &token, &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, ended) = srv
        .post(
            &format!("/api/runs/{run}/tool-approvals"),
            &alice,
            &json!({"request_id": "req-9"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{ended}");
    assert_same_shape("decision_expired_run_ended.json", &ended);
}

#[test]
fn shapes_tell_keys_and_types_apart() {
    assert_eq!(shape(&json!({"a": 1})), shape(&json!({"a": 2})));
    assert_ne!(shape(&json!({"a": 1})), shape(&json!({"a": "1"})));
    assert_ne!(shape(&json!({"a": 1})), shape(&json!({"a": 1, "b": null})));
}
