//! Errors as a program reads them: every error class answers JSON with its stable
//! `code` and the request's `request_id`, the same id as the `x-request-id` header that
//! every answer carries — successes and live streams too. A caller's sane id is echoed;
//! anything else is replaced. Through the real app on a loopback port.

use std::sync::Arc;

use async_trait::async_trait;
use reqwest::header::HeaderValue;
use reqwest::StatusCode;
use serde_json::{json, Map, Value};
use tollgate_api::{ErrorCode, GateConfig, Role};
use tollgate_domain::{EventDraft, NewRun, RunHead, TerminalKind};
use tollgate_store::memory::MemoryStore;
use tollgate_store::{CreateOutcome, EventPage, Finished, RunRef, RunStore, StoreError};
use tollgate_tests::TestServer;

/// What came back: status, the `x-request-id` header, the body (JSON or `Null`).
struct Answer {
    status: StatusCode,
    id: String,
    body: Value,
}

async fn call(req: reqwest::RequestBuilder) -> Answer {
    let (status, id, body) = tollgate_tests::exchange(req).await;
    Answer {
        status,
        id,
        body: body.unwrap_or(Value::Null),
    }
}

/// Asserts an error answer: `status`, JSON `{error, code, request_id}` with `code` and
/// the id of the header.
#[track_caller]
fn refused(answer: &Answer, status: StatusCode, code: &str) {
    let known: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(answer.status, status, "{}", answer.body);
    assert!(answer.body["error"].is_string(), "{}", answer.body);
    assert_eq!(answer.body["code"], code, "{}", answer.body);
    assert!(known.contains(&code), "{code} is one of ErrorCode::ALL");
    assert_eq!(
        answer.body["request_id"],
        answer.id.as_str(),
        "{}",
        answer.body
    );
    assert!(tollgate_api::request_id::is_acceptable(&answer.id));
}

fn gate() -> GateConfig {
    GateConfig {
        max_open_cards_per_project: 1,
        max_timeout_seconds: 600,
        ..GateConfig::default()
    }
}

async fn server() -> TestServer {
    let mut deps = TestServer::deps(Arc::new(MemoryStore::new()), gate());
    deps.sse.caps.per_run = 1;
    TestServer::with_deps(deps).await
}

fn arm(request_id: &str, tool: &str) -> Value {
    json!({"request_id": request_id, "tool_name": tool, "tool_call_id": "c1",
           "approval_id": "a1", "timeout_seconds": 60})
}

/// GIVEN each way a request can be refused WHEN it is sent THEN its answer carries its
/// stable code and the request id of its header.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_class_answers_its_code_and_request_id() {
    let s = server().await;
    let (run, token) = s.create_run(json!({"run_id": "err-run"})).await;
    let post = |path: &str, token: &str| s.http.post(s.url(path)).bearer_auth(token.to_owned());
    let get = |path: &str, token: &str| s.http.get(s.url(path)).bearer_auth(token.to_owned());

    // 400: malformed JSON, a missing field, a path that does not decode.
    let a = call(
        post(&format!("/api/runs/{run}/events"), &token)
            .header("content-type", "application/json")
            .body("{not json"),
    )
    .await;
    refused(&a, StatusCode::BAD_REQUEST, "invalid_request");
    let a = call(post(&format!("/api/runs/{run}/events"), &token).json(&json!({}))).await;
    refused(&a, StatusCode::BAD_REQUEST, "invalid_request");
    // (The framework's own refusal of a path that is not UTF-8, answered as JSON too.)
    let a = call(
        s.http
            .delete(s.url("/api/policies/%FF"))
            .bearer_auth(&s.operator_token),
    )
    .await;
    refused(&a, StatusCode::BAD_REQUEST, "invalid_request");
    // 400 with a state: a card's timeout over the cap.
    let mut long = arm("r-long", "web_fetch");
    long["timeout_seconds"] = json!(601);
    let a = call(post(&format!("/api/runs/{run}/approval-requests"), &token).json(&long)).await;
    refused(&a, StatusCode::BAD_REQUEST, "timeout_too_long");
    assert_eq!(a.body["state"], "timeout_too_long");

    // 401, 403.
    let a = call(s.http.get(s.url(&format!("/api/runs/{run}/events")))).await;
    refused(&a, StatusCode::UNAUTHORIZED, "unauthorized");
    let a = call(get(&format!("/api/runs/{run}/events"), "not-a-token")).await;
    refused(&a, StatusCode::UNAUTHORIZED, "unauthorized");
    let a = call(get("/api/approvals?state=pending", &s.agent_token)).await;
    refused(&a, StatusCode::FORBIDDEN, "forbidden");

    // 404: no route, no run, no card (with its state).
    let a = call(get("/api/nothing-here", &token)).await;
    refused(&a, StatusCode::NOT_FOUND, "not_found");
    let a = call(get("/api/runs/no-such-run/events", &s.operator_token)).await;
    refused(&a, StatusCode::NOT_FOUND, "not_found");
    let a = call(get(
        &format!("/api/runs/{run}/approval-requests/nope"),
        &token,
    ))
    .await;
    refused(&a, StatusCode::NOT_FOUND, "not_found");
    assert_eq!(a.body["state"], "unknown");

    // 405.
    let a = call(
        s.http
            .delete(s.url("/api/runs"))
            .bearer_auth(&s.agent_token),
    )
    .await;
    refused(&a, StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed");

    // 413.
    let big = "x".repeat(300 * 1024);
    let a = call(
        post(&format!("/api/runs/{run}/events"), &token)
            .header("content-type", "application/json")
            .body(big),
    )
    .await;
    refused(&a, StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large");

    // 409: run exists, request id in use, approval pending (a start before the
    // decision), another conflict (a dispatch of no started attempt), run terminal.
    let a = call(
        post("/api/runs", &s.agent_token).json(&json!({"run_id": run, "owner": "someone-else"})),
    )
    .await;
    refused(&a, StatusCode::CONFLICT, "run_exists");
    let a = call(
        post(&format!("/api/runs/{run}/approval-requests"), &token).json(&arm("r1", "web_fetch")),
    )
    .await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.body);
    let a =
        call(post(&format!("/api/runs/{run}/approval-requests"), &token).json(&arm("r1", "shell")))
            .await;
    refused(&a, StatusCode::CONFLICT, "request_id_in_use");
    let start = json!({"request_id": "r1", "approval_id": "a1", "tool_name": "web_fetch"});
    let a = call(post(&format!("/api/runs/{run}/tool-calls/c1/start"), &token).json(&start)).await;
    refused(&a, StatusCode::CONFLICT, "approval_pending");
    assert_eq!(a.body["state"], "pending");

    // 429: the project's open cards (1 here) are taken.
    let (run2, token2) = s.create_run(json!({"run_id": "err-run-2"})).await;
    let a = call(
        post(&format!("/api/runs/{run2}/approval-requests"), &token2).json(&arm("r2", "web_fetch")),
    )
    .await;
    refused(&a, StatusCode::TOO_MANY_REQUESTS, "limit_reached");
    assert_eq!(a.body["state"], "limit_reached");

    // 429: the run token's live streams (1 here) are taken.
    let open = s
        .http
        .get(s.url(&format!("/api/runs/{run}/stream")))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(open.status(), StatusCode::OK);
    assert!(
        open.headers().contains_key("x-request-id"),
        "a stream carries the id"
    );
    let a = call(get(&format!("/api/runs/{run}/stream"), &token)).await;
    refused(&a, StatusCode::TOO_MANY_REQUESTS, "too_many_streams");
    drop(open);

    let a = call(post(&format!("/api/runs/{run}/complete"), &token).json(&json!({}))).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.body);
    let a = call(
        post(&format!("/api/runs/{run}/events"), &token)
            .json(&json!({"events": [{"type": "x.y"}]})),
    )
    .await;
    refused(&a, StatusCode::CONFLICT, "run_terminal");
    assert_eq!(a.body["state"], "run_terminal");
    assert!(a.body["terminal_sequence"].is_u64(), "{}", a.body);
    let a = call(
        post(&format!("/api/runs/{run}/tool-calls/c9/dispatch"), &token)
            .json(&json!({"approval_id": "a9"})),
    )
    .await;
    assert!(a.status.is_client_error(), "{}", a.body);
    assert!(
        a.body["code"].is_string() && a.body["request_id"] == a.id.as_str(),
        "{}",
        a.body
    );
}

/// A run log whose storage is down.
struct Down;

#[async_trait]
impl RunStore for Down {
    async fn create_run(&self, _: NewRun) -> Result<CreateOutcome, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn append_events(
        &self,
        _: RunRef<'_>,
        _: Vec<EventDraft>,
    ) -> Result<Vec<u64>, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn finish_run(
        &self,
        _: RunRef<'_>,
        _: TerminalKind,
        _: Map<String, Value>,
    ) -> Result<Finished, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn read_head(&self, _: &str) -> Result<Option<RunHead>, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn read_events(&self, _: &str, _: u64, _: usize) -> Result<EventPage, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
    async fn list_runs(
        &self,
        _: Option<&str>,
        _: &tollgate_store::RunFilter,
        _: Option<&str>,
        _: usize,
    ) -> Result<tollgate_store::RunPage, StoreError> {
        Err(StoreError::Unavailable("down".into()))
    }
}

/// GIVEN storage that is down WHEN a client calls THEN 503 `unavailable` with the id.
#[tokio::test]
async fn an_outage_answers_unavailable_with_the_request_id() {
    let s = TestServer::with_run_store(Arc::new(Down), Arc::new(MemoryStore::new())).await;
    let a = call(
        s.http
            .post(s.url("/api/runs"))
            .bearer_auth(&s.agent_token)
            .json(&json!({})),
    )
    .await;
    refused(&a, StatusCode::SERVICE_UNAVAILABLE, "unavailable");
    assert_eq!(a.body["state"], "unavailable");
}

/// GIVEN the operators-only function WHEN an agent or nobody calls THEN 403 / 401 with
/// codes and ids, before anything else.
#[tokio::test]
async fn the_operators_only_function_refuses_with_codes() {
    let deps = TestServer::deps(Arc::new(MemoryStore::new()), GateConfig::default());
    let router = tollgate_api::functions::OPERATOR_STREAM
        .router(deps.clone())
        .expect("an HTTP function");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let http = reqwest::Client::new();
    let agent = deps.auth.mint_jwt("an-agent", Role::Agent, 600, None);
    let a = call(http.get(format!("{base}/api/runs/r/stream"))).await;
    refused(&a, StatusCode::UNAUTHORIZED, "unauthorized");
    let a = call(
        http.get(format!("{base}/api/runs/r/stream"))
            .bearer_auth(agent),
    )
    .await;
    refused(&a, StatusCode::FORBIDDEN, "forbidden");
}

/// GIVEN ids a client sends WHEN the server answers THEN a sane one (1–64 characters
/// of `[A-Za-z0-9._-]`) is echoed on success and error alike, and anything else is
/// replaced by a fresh id — never echoed.
#[tokio::test]
async fn a_sane_request_id_is_echoed_and_any_other_replaced() {
    let s = server().await;
    let (run, token) = s.create_run(json!({})).await;
    let events = s.url(&format!("/api/runs/{run}/events"));
    for sane in ["abc", "req-1.2_3", &"A".repeat(64)] {
        let a = call(
            s.http
                .get(&events)
                .bearer_auth(&token)
                .header("x-request-id", sane),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.id, sane);
        let a = call(s.http.get(&events).header("x-request-id", sane)).await;
        refused(&a, StatusCode::UNAUTHORIZED, "unauthorized");
        assert_eq!(a.id, sane);
    }
    let insane: Vec<HeaderValue> = vec![
        HeaderValue::from_str(&"A".repeat(65)).unwrap(),
        HeaderValue::from_static("has spaces"),
        HeaderValue::from_static("tab\there"),
        HeaderValue::from_static("a/b"),
        HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap(),
        HeaderValue::from_static(""),
    ];
    let mut seen = Vec::new();
    for bad in insane {
        let a = call(
            s.http
                .get(&events)
                .bearer_auth(&token)
                .header("x-request-id", bad.clone()),
        )
        .await;
        assert_eq!(a.status, StatusCode::OK);
        assert_ne!(a.id.as_bytes(), bad.as_bytes());
        assert!(tollgate_api::request_id::is_acceptable(&a.id), "{}", a.id);
        let a = call(s.http.get(&events).header("x-request-id", bad.clone())).await;
        refused(&a, StatusCode::UNAUTHORIZED, "unauthorized");
        assert_ne!(a.id.as_bytes(), bad.as_bytes());
        seen.push(a.id);
    }
    // A newline cannot reach a header value over HTTP/1.1; a raw request with one is
    // refused by the HTTP layer before any route, or its id replaced.
    let raw = raw_request(
        &s.base,
        &format!(
            "GET /api/runs/{run}/events HTTP/1.1\r\nHost: x\r\nx-request-id: a\nb\r\n\
             Connection: close\r\n\r\n"
        ),
    )
    .await;
    assert!(!raw.contains("x-request-id: a\n"), "{raw}");
    // Without one, each request gets its own.
    let a = call(s.http.get(&events).bearer_auth(&token)).await;
    let b = call(s.http.get(&events).bearer_auth(&token)).await;
    assert_ne!(a.id, b.id);
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 6, "every replacement is fresh");
}

async fn raw_request(base: &str, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        conn.read_to_end(&mut out),
    )
    .await;
    String::from_utf8_lossy(&out).into_owned()
}

/// GIVEN a live stream WHEN it is opened THEN its answer carries the id too.
#[tokio::test]
async fn live_streams_carry_the_request_id() {
    let s = server().await;
    let (run, token) = s.create_run(json!({})).await;
    let resp = s
        .http
        .get(s.url(&format!("/api/runs/{run}/events")))
        .bearer_auth(&token)
        .header("accept", "text/event-stream")
        .header("x-request-id", "stream-1")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(resp
        .headers()
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap().starts_with("text/event-stream")));
    assert_eq!(resp.headers()["x-request-id"], "stream-1");
}

/// The codes are a closed set, each spelled once, in snake_case.
#[test]
fn codes_are_spelled_once_in_snake_case() {
    let mut spelled: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    for code in &spelled {
        assert!(
            code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
            "{code}"
        );
    }
    let n = spelled.len();
    spelled.sort();
    spelled.dedup();
    assert_eq!(spelled.len(), n);
    // The README lists each.
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    for code in ErrorCode::ALL {
        assert!(
            readme.contains(&format!("`{code}`")),
            "README lists `{code}`"
        );
    }
}
