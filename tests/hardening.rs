//! The event log's edges, tried the way an attacker or a long-running client would:
//! replay that cannot skip, tenancy, run ids that are never reused, bounded input and
//! bounded waits. Each scenario runs on the embedded store and on DynamoDB (the
//! `dynamo::` tests need an endpoint; `make test` starts DynamoDB Local).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use reqwest::StatusCode;
use serde_json::{json, Map, Value};
use tollgate_api::Role;
use tollgate_domain::{EventDraft, NewRun, RunHead, RunStatus, TerminalKind};
use tollgate_store::{CreateOutcome, EventPage, Finished, RunRef, RunStore, StoreError};
use tollgate_tests::{sequences, store_for, Backend, TestServer};

/// A store that reads like DynamoDB under a committing transaction: the first reads of
/// the events miss sequence `hidden` (a page with a hole), and the head read says the
/// run has ended before its terminal event is visible.
struct ReadCommitted {
    inner: Arc<dyn tollgate_store::Store>,
    hidden: u64,
    /// How many more event reads hide `hidden`.
    hide_reads: Mutex<u32>,
    /// Until the terminal event becomes visible, the head claims the run ended already.
    head_ahead: Mutex<Option<u64>>,
}

#[async_trait]
impl RunStore for ReadCommitted {
    async fn create_run(&self, new: NewRun) -> Result<CreateOutcome, StoreError> {
        self.inner.create_run(new).await
    }
    async fn append_events(
        &self,
        run: RunRef<'_>,
        events: Vec<EventDraft>,
    ) -> Result<Vec<u64>, StoreError> {
        self.inner.append_events(run, events).await
    }
    async fn finish_run(
        &self,
        run: RunRef<'_>,
        kind: TerminalKind,
        payload: Map<String, Value>,
    ) -> Result<Finished, StoreError> {
        self.inner.finish_run(run, kind, payload).await
    }
    async fn read_head(&self, run_id: &str) -> Result<Option<RunHead>, StoreError> {
        let mut head = self.inner.read_head(run_id).await?;
        if let (Some(h), Some(terminal)) = (head.as_mut(), *self.head_ahead.lock().unwrap()) {
            h.status = RunStatus::Completed;
            h.terminal_seq = Some(terminal);
            h.next_seq = terminal + 1;
        }
        Ok(head)
    }
    async fn read_events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<EventPage, StoreError> {
        let mut page = self.inner.read_events(run_id, after, limit).await?;
        let mut hide = self.hide_reads.lock().unwrap();
        if *hide > 0 && page.events.iter().any(|e| e.sequence == self.hidden) {
            *hide -= 1;
            page.events.retain(|e| e.sequence != self.hidden);
        }
        Ok(page)
    }
    async fn list_runs(
        &self,
        project_id: Option<&str>,
        filter: &tollgate_store::RunFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<tollgate_store::RunPage, StoreError> {
        self.inner
            .list_runs(project_id, filter, cursor, limit)
            .await
    }
}

/// GIVEN reads that see sequence 7 without 5 and a head that says `completed` before
/// `run_completed` is visible WHEN a client follows `next_after` THEN it receives every
/// event exactly once, in order, and `terminal` only with the terminal event.
async fn replay_never_skips(backend: Backend) {
    let inner = store_for(backend).await;
    let store = Arc::new(ReadCommitted {
        inner: inner.clone(),
        hidden: 5,
        hide_reads: Mutex::new(0),
        head_ahead: Mutex::new(None),
    });
    let srv = TestServer::with_run_store(store.clone(), inner.clone()).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    let batch: Vec<Value> = (0..8)
        .map(|i| json!({"type": "agent.message", "i": i}))
        .collect();
    srv.append(&run_id, &token, Value::Array(batch)).await; // 2..=9
    *store.hide_reads.lock().unwrap() = 2;
    *store.head_ahead.lock().unwrap() = Some(10);

    let page_url = |after: u64| format!("/api/runs/{run_id}/events?after={after}&limit=100");
    let (status, page) = srv.get(&page_url(0), &token).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        sequences(page["events"].as_array().unwrap()),
        vec![1, 2, 3, 4]
    );
    assert_eq!(page["next_after"], 4);
    assert_eq!(
        page["has_more"], true,
        "a page ending at a hole says read again"
    );
    assert_eq!(
        page["terminal"], false,
        "the head alone never ends the stream"
    );
    // Still hidden: nothing past the hole is served, and the client is told to wait a
    // moment rather than spin.
    let resp = srv
        .http
        .get(srv.url(&page_url(4)))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["retry-after"], "1");
    let page: Value = resp.json().await.unwrap();
    assert_eq!(page["events"].as_array().unwrap().len(), 0);
    assert_eq!(
        (page["next_after"].as_u64(), page["has_more"].as_bool()),
        (Some(4), Some(true))
    );
    // Visible now; the run's head still claims an end whose event is not there.
    let (_, page) = srv.get(&page_url(4), &token).await;
    assert_eq!(
        sequences(page["events"].as_array().unwrap()),
        (5..=9).collect::<Vec<_>>()
    );
    assert_eq!(page["terminal"], false, "run_completed is not in this page");
    let (_, page) = srv.get(&page_url(9), &token).await;
    assert_eq!(page["terminal"], false);
    // The end lands; the page holding it says terminal.
    let (status, _) = srv
        .post(&format!("/api/runs/{run_id}/complete"), &token, &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (_, page) = srv.get(&page_url(9), &token).await;
    assert_eq!(sequences(page["events"].as_array().unwrap()), vec![10]);
    assert_eq!(
        (page["terminal"].as_bool(), page["has_more"].as_bool()),
        (Some(true), Some(false))
    );
    let all = srv.replay_all(&run_id, &token, 3).await;
    assert_eq!(sequences(&all), (1..=10).collect::<Vec<_>>());
}

/// Tenancy: a run's project is its creator's claim; children live in their
/// coordinator's project; operator tokens with a project see only that project.
async fn tenancy(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let agent = |sub: &str, project: Option<&str>| {
        srv.auth
            .mint_jwt(sub, Role::Agent, 600, project.map(str::to_owned))
    };
    let (a1, a2, bare) = (
        agent("a1", Some("p1")),
        agent("a2", Some("p2")),
        agent("a3", None),
    );
    // A body project other than the claim, or any project without a claim: 403.
    for (token, body) in [
        (&a1, json!({"project_id": "p2"})),
        (&bare, json!({"project_id": "p1"})),
    ] {
        let (status, v) = srv.post("/api/runs", token, &body).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body} {v}");
    }
    // The claim is the project, said or not.
    let (status, run) = srv
        .post("/api/runs", &a1, &json!({"kind": "coordinator"}))
        .await;
    assert_eq!(status, StatusCode::CREATED);
    let coordinator = run["run_id"].as_str().unwrap().to_owned();
    let started = &srv.replay_all(&coordinator, &srv.operator_token, 10).await[0];
    assert_eq!(started["project_id"], "p1");
    // Children: the coordinator's own agent joins; another agent of the same project,
    // other projects and no project do not (`run` grants reach siblings).
    let same_project = agent("a1b", Some("p1"));
    let child = json!({"kind": "child", "parent_run_id": coordinator});
    let (status, v) = srv.post("/api/runs", &a1, &child).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    for token in [&same_project, &a2, &bare] {
        let (status, v) = srv.post("/api/runs", token, &child).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    }
    // One agent in two projects has two delivery spaces: the same delivery id from its
    // p2 token is another run, never the p1 run's receipt (or token).
    let bot_p1 = agent("bot", Some("p1"));
    let bot_p2 = agent("bot", Some("p2"));
    let delivery = json!({"delivery_id": format!("d-{}", uuid::Uuid::new_v4())});
    let (status, in_p1) = srv.post("/api/runs", &bot_p1, &delivery).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, in_p2) = srv.post("/api/runs", &bot_p2, &delivery).await;
    assert_eq!(status, StatusCode::CREATED, "{in_p2}");
    assert_ne!(in_p1["run_id"], in_p2["run_id"]);
    assert_ne!(in_p1["run_token"], in_p2["run_token"]);
    let with_id = json!({"run_id": in_p1["run_id"], "delivery_id": delivery["delivery_id"]});
    let (status, v) = srv.post("/api/runs", &bot_p2, &with_id).await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "delivery run ids are reserved: {v}"
    );
    // Without projects, only the coordinator's creator attaches children.
    let (_, lone) = srv
        .post("/api/runs", &bare, &json!({"kind": "coordinator"}))
        .await;
    let lone_child = json!({"kind": "child", "parent_run_id": lone["run_id"]});
    let (status, _) = srv.post("/api/runs", &bare, &lone_child).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _) = srv.post("/api/runs", &agent("a4", None), &lone_child).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    // Reads: a global operator and p1's operator read the p1 run; p2's does not, and
    // is not told it exists; an agent of another project neither.
    let op = |project: Option<&str>| {
        srv.auth
            .mint_jwt("op", Role::Operator, 600, project.map(str::to_owned))
    };
    let events = format!("/api/runs/{coordinator}/events");
    for (token, want) in [
        (op(None), StatusCode::OK),
        (op(Some("p1")), StatusCode::OK),
        (op(Some("p2")), StatusCode::NOT_FOUND),
        (a1.clone(), StatusCode::OK),
        (agent("a1", Some("p2")), StatusCode::NOT_FOUND),
        (a2.clone(), StatusCode::NOT_FOUND),
    ] {
        let (status, v) = srv.get(&events, &token).await;
        assert_eq!(status, want, "{v}");
    }
    let (status, _) = srv
        .get(
            &format!("/api/runs/{}/events", lone["run_id"].as_str().unwrap()),
            &op(Some("p1")),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "a project operator sees no unprojected run"
    );
}

/// A create whose answer was lost, retried by the same agent with the same explicit
/// `run_id` and body, answers 200 with the run and its token; anyone else gets 409.
async fn create_retry_is_safe(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let run_id = format!("retry-{}", uuid::Uuid::new_v4().simple());
    let body = json!({"run_id": run_id, "owner": "alice", "channel_id": "C1"});
    let (s1, first) = srv.post("/api/runs", &srv.agent_token, &body).await;
    let (s2, second) = srv.post("/api/runs", &srv.agent_token, &body).await;
    assert_eq!((s1, s2), (StatusCode::CREATED, StatusCode::OK), "{second}");
    assert_eq!(first, second);
    let token = first["run_token"].as_str().unwrap();
    srv.append(&run_id, token, json!([{"type": "agent.message"}]))
        .await;
    let other = srv.auth.mint_jwt("someone-else", Role::Agent, 60, None);
    let (status, v) = srv.post("/api/runs", &other, &body).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["state"], "run_exists");
    assert!(v.get("run_token").is_none());
    let changed = json!({"run_id": run_id, "owner": "mallory", "channel_id": "C1"});
    let (status, _) = srv.post("/api/runs", &srv.agent_token, &changed).await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "a different body is not a retry"
    );
    let events = srv.replay_all(&run_id, token, 10).await;
    assert_eq!(sequences(&events), vec![1, 2], "one run_started");
}

/// Small input gaps: each answers 400 and writes nothing.
async fn small_input_gaps(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (run_id, token) = srv.create_run(json!({"kind": "coordinator"})).await;
    let creates = [
        json!({"kind": "child", "parent_run_id": "a/b"}),
        json!({"kind": "child", "parent_run_id": ""}),
        json!({"kind": "child", "parent_run_id": "x".repeat(300)}),
        json!({"run_id": "."}),
        json!({"run_id": ".."}),
        json!({"subtask_id": "s".repeat(300)}),
        json!({"subtask_id": {"nested": [1, 2, 3]}}),
        json!({"agenthost_origin": format!("https://{}", "h".repeat(3000)), "execution_mode": "pod"}),
        json!({"execution_mode": "x".repeat(300)}),
        json!({"budget": {"tools": (0..65).map(|i| (format!("t{i}"), json!(1))).collect::<Map<_, _>>()}}),
        json!({"budget": {"tools": {"t".repeat(200): 1}}}),
        json!({"owner": "o".repeat(257)}),
        json!({"budget": {"tools": {"a": 1}, "call_ceiling": "5"}}),
        json!({"budget": {"tools": {"a": -1}}}),
        json!({"budget": []}),
    ];
    for body in creates {
        let (status, v) = srv.post("/api/runs", &srv.agent_token, &body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {v}");
        assert!(v["error"].is_string());
    }
    // One budget parser for creation and admission: what admission reads as "no
    // ceiling" (`call_ceiling: null`) is a budget creation takes.
    let (status, v) = srv
        .post(
            "/api/runs",
            &srv.agent_token,
            &json!({"budget": {"tools": {"a": 1}, "call_ceiling": null}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    for t in [
        "run_completed.x",
        "tool.approval_resolved_",
        "heartbeat.late",
    ] {
        let (status, v) = srv
            .post(
                &format!("/api/runs/{run_id}/events"),
                &token,
                &json!({"events": [{"type": t}]}),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{t}: {v}");
    }
    for end in ["complete", "fail", "cancel"] {
        let (status, v) = srv
            .post(
                &format!("/api/runs/{run_id}/{end}"),
                &token,
                &json!({"event_id": "e1"}),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{end}: {v}");
    }
    let events = srv.replay_all(&run_id, &token, 10).await;
    assert_eq!(sequences(&events), vec![1], "nothing was written");
}

macro_rules! for_backend {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn replay_never_skips() {
                super::replay_never_skips($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn tenancy() {
                super::tenancy($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn create_retry_is_safe() {
                super::create_retry_is_safe($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn small_input_gaps() {
                super::small_input_gaps($backend).await
            }
        }
    };
}

for_backend!(memory, Backend::Memory);
for_backend!(dynamo, Backend::Dynamo);

/// GIVEN retention (TTL) deleted a run's head and `run_started` but not its other events
/// WHEN the id is created again THEN creation is refused; once every item is gone the id
/// can be created again, but the old run's token opens nothing of the new run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_run_ids_are_never_reused() {
    let store = tollgate_tests::dynamo_store().await;
    let client = store.client().clone();
    let tables = store.tables().clone();
    let srv = TestServer::with_store(Arc::new(store)).await;
    let run_id = format!("reuse-{}", uuid::Uuid::new_v4().simple());
    let body = json!({"run_id": run_id});
    let (status, first) = srv.post("/api/runs", &srv.agent_token, &body).await;
    assert_eq!(status, StatusCode::CREATED);
    let old_token = first["run_token"].as_str().unwrap().to_owned();
    srv.append(
        &run_id,
        &old_token,
        json!([{"type": "agent.message", "secret_plan": "old run"}]),
    )
    .await;
    let delete = |table: String, key: Vec<(&'static str, String)>| {
        let client = client.clone();
        async move {
            let mut req = client.delete_item().table_name(table);
            for (k, v) in key {
                req = req.key(k, aws_sdk_dynamodb::types::AttributeValue::S(v));
            }
            req.send().await.expect("delete by hand");
        }
    };
    // As TTL would: the head and run_started go first.
    delete(tables.runs.clone(), vec![("run_id", run_id.clone())]).await;
    delete(
        tables.events.clone(),
        vec![
            ("run_id", run_id.clone()),
            ("event_key", format!("seq#{:020}", 1)),
        ],
    )
    .await;
    let (status, v) = srv.post("/api/runs", &srv.agent_token, &body).await;
    assert_eq!(status, StatusCode::CONFLICT, "leftovers refuse the id: {v}");
    assert!(v.get("run_token").is_none());
    // Then the rest.
    delete(
        tables.events.clone(),
        vec![
            ("run_id", run_id.clone()),
            ("event_key", format!("seq#{:020}", 2)),
        ],
    )
    .await;
    let (status, again) = srv.post("/api/runs", &srv.agent_token, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    let new_token = again["run_token"].as_str().unwrap();
    assert_ne!(new_token, old_token, "a new incarnation, a new token");
    let (status, _) = srv
        .post(
            &format!("/api/runs/{run_id}/events"),
            &old_token,
            &json!({"events": [{"type": "agent.message", "from": "old holder"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "the old token's run is gone");
    let (status, _) = srv
        .post(
            &format!("/api/runs/{run_id}/complete"),
            &old_token,
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = srv
        .get(&format!("/api/runs/{run_id}/events"), &old_token)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let events = srv.replay_all(&run_id, new_token, 10).await;
    assert_eq!(sequences(&events), vec![1]);
    assert!(events.iter().all(|e| e.get("secret_plan").is_none()));
}

/// GIVEN a storage endpoint that accepts connections and never answers WHEN clients
/// create, append and replay THEN each gets 503 JSON within 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_storage_answers_503_within_seconds() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = Arc::new(Mutex::new(Vec::new()));
    let holder = held.clone();
    tokio::spawn(async move {
        while let Ok((conn, _)) = listener.accept().await {
            holder.lock().unwrap().push(conn); // accepted, never answered
        }
    });
    let sdk = tollgate_store::dynamo::sdk_config_loader()
        .endpoint_url(format!("http://127.0.0.1:{port}"))
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "t", "t", None, None, "test",
        ))
        .load()
        .await;
    let store = tollgate_store::dynamo::DynamoStore::new(
        tollgate_store::dynamo::client(&sdk),
        tollgate_store::dynamo::Tables::with_prefix("hung-"),
    );
    let srv = TestServer::with_store(Arc::new(store)).await;
    let token = srv.auth.run_token("run-1", "0123456789abcdef");
    let calls = [
        srv.http
            .post(srv.url("/api/runs"))
            .bearer_auth(&srv.agent_token)
            .json(&json!({})),
        srv.http
            .post(srv.url("/api/runs/run-1/events"))
            .bearer_auth(&token)
            .json(&json!({"events": [{"type": "agent.message"}]})),
        srv.http
            .post(srv.url("/api/runs/run-1/complete"))
            .bearer_auth(&token)
            .json(&json!({})),
        srv.http
            .get(srv.url("/api/runs/run-1/events"))
            .bearer_auth(&token),
    ];
    for call in calls {
        let started = std::time::Instant::now();
        let resp = call
            .timeout(std::time::Duration::from_secs(30))
            .send()
            .await
            .expect("an answer, not a hang");
        let waited = started.elapsed();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["state"], "unavailable");
        assert!(
            waited < std::time::Duration::from_secs(10),
            "answered after {waited:?}"
        );
    }
    assert!(
        !held.lock().unwrap().is_empty(),
        "the calls did reach the endpoint"
    );
}

/// A malformed path — an id outside the id rule, or percent-escapes that do not decode,
/// in any segment — answers a JSON 4xx on every route and for every caller, never a 5xx
/// or axum's plain text; on the routes that check their caller before the path
/// (reconcile, receipts), a caller without a credential hears 401.
#[tokio::test]
async fn malformed_paths_answer_json_4xx_on_every_route() {
    let s = TestServer::start(Backend::Memory).await;
    let (run, run_token) = s.create_run(json!({})).await;
    let long = "x".repeat(300);
    let ids = [
        run.as_str(),
        "%FF",
        "a%2Fb",
        "%2E%2E",
        "a%20b",
        long.as_str(),
    ];
    let mut bad = Vec::new();
    for rid in ids {
        for sec in ["c1", "%FF"] {
            let routes = [
                ("POST", format!("/api/runs/{rid}/events")),
                ("POST", format!("/api/runs/{rid}/complete")),
                ("POST", format!("/api/runs/{rid}/approval-requests")),
                ("GET", format!("/api/runs/{rid}/approval-requests/{sec}")),
                ("POST", format!("/api/runs/{rid}/tool-approvals")),
                ("GET", format!("/api/runs/{rid}/approvals")),
                ("GET", format!("/api/runs/{rid}/events")),
                ("POST", format!("/api/runs/{rid}/tool-calls/{sec}/start")),
                ("POST", format!("/api/runs/{rid}/tool-calls/{sec}/settle")),
                ("GET", format!("/api/runs/{rid}/mutations/{sec}/{sec}")),
                (
                    "POST",
                    format!("/api/runs/{rid}/mutations/{sec}/{sec}/reconcile"),
                ),
                ("GET", format!("/api/receipts/{sec}")),
            ];
            for (method, path) in routes {
                for token in [None, Some(&s.operator_token), Some(&run_token)] {
                    let url = s.url(&path);
                    let mut req = match method {
                        "GET" => s.http.get(url),
                        _ => s
                            .http
                            .post(url)
                            .json(&json!({"request_id": "r1", "observed": "applied"})),
                    };
                    if let Some(t) = token {
                        req = req.bearer_auth(t);
                    }
                    let resp = req.send().await.unwrap();
                    let status = resp.status();
                    let json = resp
                        .headers()
                        .get("content-type")
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|ct| ct.starts_with("application/json"));
                    let body = resp.text().await.unwrap_or_default();
                    // (A `..` segment is resolved by the client's URL parser: another route.)
                    let caller_first = (path.ends_with("/reconcile") && rid != "%2E%2E")
                        || path.starts_with("/api/receipts/");
                    let unauthenticated_not_401 =
                        caller_first && token.is_none() && status != StatusCode::UNAUTHORIZED;
                    if status.is_server_error()
                        || (!status.is_success() && !json)
                        || unauthenticated_not_401
                    {
                        bad.push(format!(
                            "{method} {path} [{}] -> {status} {body:.100}",
                            token.is_some()
                        ));
                    }
                }
            }
        }
    }
    assert!(bad.is_empty(), "{} answers: {bad:#?}", bad.len());
}
