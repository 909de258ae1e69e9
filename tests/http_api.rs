//! Tollgate through HTTP, the way a client sees it: every scenario runs against the
//! embedded store and against DynamoDB (the `dynamo::` tests need an endpoint; `make
//! test` starts DynamoDB Local). Assertions are on responses and on the replayed stream.

use reqwest::StatusCode;
use serde_json::{json, Value};
use tollgate_tests::{sequences, Backend, TestServer};

/// GIVEN a new run WHEN a client appends, replays and completes THEN the stream tells it.
async fn tour(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (run_id, token) = srv
        .create_run(json!({"channel_id": "C1", "owner": "alice"}))
        .await;
    let seqs = srv
        .append(
            &run_id,
            &token,
            json!([
                {"type": "agent.message", "text": "hello"},
                {"type": "tool.call", "event_id": "call-1", "tool": "web_fetch"}
            ]),
        )
        .await;
    assert_eq!(seqs, vec![2, 3]);
    let (status, done) = srv
        .post(
            &format!("/api/runs/{run_id}/complete"),
            &token,
            &json!({"summary": "ok"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(done["sequence"], 4);
    assert_eq!(done["status"], "completed");

    let (status, page) = srv
        .get(
            &format!("/api/runs/{run_id}/events?after=0"),
            &srv.operator_token,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["run_id"], json!(run_id));
    assert_eq!(page["has_more"], false);
    assert_eq!(page["terminal"], true);
    assert_eq!(page["next_after"], 4);
    let events = page["events"].as_array().unwrap();
    let types: Vec<_> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        ["run_started", "agent.message", "tool.call", "run_completed"]
    );
    for e in events {
        assert_eq!(e["protocol_version"], "v2");
        assert_eq!(e["run_id"], json!(run_id));
        assert_eq!(e["channel_id"], "C1");
        assert!(e["timestamp_utc"].as_str().unwrap().ends_with('Z'));
    }
    assert_eq!(events[2]["event_id"], "call-1");
    assert_eq!(events[3]["summary"], "ok");
    // The run's own token reads it too; the creating agent too.
    assert_eq!(srv.replay_all(&run_id, &token, 2).await, events.clone());
    assert_eq!(
        srv.replay_all(&run_id, &srv.agent_token, 100).await,
        events.clone()
    );
}

/// 8 writers × 250 appends to one run, each retried once with the same `event_id`:
/// sequences exactly 1..=2001, nothing added by the retries.
async fn concurrent_writers(backend: Backend) {
    let srv = std::sync::Arc::new(TestServer::start(backend).await);
    let (run_id, token) = srv.create_run(json!({})).await;
    let writers: Vec<_> = (0..8)
        .map(|w| {
            let (srv, run_id, token) = (srv.clone(), run_id.clone(), token.clone());
            tokio::spawn(async move {
                let mut got = Vec::new();
                for i in 0..250 {
                    let event =
                        json!([{"type": "agent.message", "event_id": format!("w{w}-{i}"), "i": i}]);
                    let first = srv.append(&run_id, &token, event.clone()).await;
                    let retry = srv.append(&run_id, &token, event).await;
                    assert_eq!(
                        first, retry,
                        "a retried event_id answers its original sequence"
                    );
                    got.extend(first);
                }
                got
            })
        })
        .collect();
    let mut all = Vec::new();
    for w in writers {
        all.extend(w.await.unwrap());
    }
    all.sort_unstable();
    assert_eq!(all, (2..=2001).collect::<Vec<u64>>());
    let events = srv.replay_all(&run_id, &token, 1000).await;
    assert_eq!(
        sequences(&events),
        (1..=2001).collect::<Vec<u64>>(),
        "no gap, no duplicate"
    );
    let ids: std::collections::HashSet<_> = events[1..]
        .iter()
        .map(|e| e["event_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 2000);
}

/// After `complete`, appends get 409 run_terminal; a second `complete` answers the same
/// sequence; appends racing the end never land after it.
async fn terminal_fencing(backend: Backend) {
    let srv = std::sync::Arc::new(TestServer::start(backend).await);
    let (run_id, token) = srv.create_run(json!({})).await;
    srv.append(&run_id, &token, json!([{"type": "agent.message"}]))
        .await;
    let racers: Vec<_> = (0..4)
        .map(|w| {
            let (srv, run_id, token) = (srv.clone(), run_id.clone(), token.clone());
            tokio::spawn(async move {
                for i in 0..30 {
                    let (status, v) = srv
                        .post_until_served(&format!("/api/runs/{run_id}/events"), &token,
                              &json!({"events": [{"type": "agent.message", "event_id": format!("r{w}-{i}")}]}))
                        .await;
                    match status {
                        StatusCode::OK => {}
                        StatusCode::CONFLICT => {
                            assert_eq!(v["state"], "run_terminal");
                            return;
                        }
                        other => panic!("unexpected {other}: {v}"),
                    }
                }
            })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    // The racers and the end contend for one head: a 503 `unavailable` (nothing
    // written) is sent again, as a client would.
    let (status, first) = srv
        .post_until_served(&format!("/api/runs/{run_id}/complete"), &token, &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{first}");
    for r in racers {
        r.await.unwrap();
    }
    let (status, second) = srv
        .post(&format!("/api/runs/{run_id}/complete"), &token, &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        second["sequence"], first["sequence"],
        "complete is idempotent"
    );
    let (status, late) = srv
        .post(
            &format!("/api/runs/{run_id}/events"),
            &token,
            &json!({"events": [{"type": "agent.message"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(late["state"], "run_terminal");
    let (status, other_end) = srv
        .post(&format!("/api/runs/{run_id}/fail"), &token, &json!({}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(other_end["state"], "run_terminal");
    let events = srv.replay_all(&run_id, &token, 1000).await;
    let last = events.last().unwrap();
    assert_eq!(last["type"], "run_completed");
    assert_eq!(last["sequence"], first["sequence"]);
    assert_eq!(
        sequences(&events),
        (1..=first["sequence"].as_u64().unwrap()).collect::<Vec<_>>()
    );
    assert_eq!(
        events
            .iter()
            .filter(|e| e["type"] == "run_completed")
            .count(),
        1
    );
}

/// `after=N` returns exactly the events after N; 10,000 events page without loss or
/// repetition; unknown runs 404; bad `after`/`limit` 400.
async fn replay_paging(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    let mut n = 1u64;
    while n < 10_000 {
        let k = (10_000 - n).min(99);
        let batch: Vec<Value> = (0..k)
            .map(|i| json!({"type": "agent.message", "n": n + i + 1}))
            .collect();
        let seqs = srv.append(&run_id, &token, Value::Array(batch)).await;
        assert_eq!(seqs, (n + 1..=n + k).collect::<Vec<_>>());
        n += k;
    }
    for limit in [1000, 333] {
        let events = srv.replay_all(&run_id, &token, limit).await;
        assert_eq!(
            sequences(&events),
            (1..=10_000).collect::<Vec<u64>>(),
            "limit {limit}"
        );
        for e in &events[1..] {
            assert_eq!(e["n"], e["sequence"], "payload stayed with its event");
        }
    }
    let (status, page) = srv
        .get(
            &format!("/api/runs/{run_id}/events?after=9990&limit=5"),
            &token,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        sequences(page["events"].as_array().unwrap()),
        vec![9991, 9992, 9993, 9994, 9995]
    );
    assert_eq!(page["next_after"], 9995);
    assert_eq!(page["has_more"], true);
    assert_eq!(page["terminal"], false);
    let (status, page) = srv
        .get(&format!("/api/runs/{run_id}/events?after=10000"), &token)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["events"], json!([]));
    assert_eq!(page["next_after"], 10000);
    assert_eq!(page["has_more"], false);

    let (status, v) = srv
        .get("/api/runs/run-does-not-exist/events", &srv.operator_token)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    assert!(v["error"].is_string());
    for bad in [
        "after=-1",
        "after=abc",
        "after=",
        "limit=0",
        "limit=1001",
        "limit=x",
    ] {
        let (status, v) = srv
            .get(&format!("/api/runs/{run_id}/events?{bad}"), &token)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {v}");
        assert!(v["error"].as_str().unwrap().len() > 5);
    }
}

/// Bad input gets a clear 4xx JSON error, and the stream is unchanged afterwards.
async fn bad_input_writes_nothing(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    let (other_run, other_token) = srv.create_run(json!({})).await;
    srv.append(
        &run_id,
        &token,
        json!([{"type": "agent.message", "event_id": "keep"}]),
    )
    .await;
    let before = srv.replay_all(&run_id, &srv.operator_token, 100).await;
    let events_url = srv.url(&format!("/api/runs/{run_id}/events"));
    let raw = |body: String, auth: Option<&str>| {
        let mut r = srv
            .http
            .post(&events_url)
            .header("content-type", "application/json")
            .body(body);
        if let Some(t) = auth {
            r = r.header("authorization", t.to_owned());
        }
        r
    };
    let big = format!(
        r#"{{"events":[{{"type":"agent.message","text":"{}"}}]}}"#,
        "x".repeat(300 * 1024)
    );
    let just_over = format!(
        r#"{{"events":[{{"type":"agent.message","pad":"{}"}}]}}"#,
        "x".repeat(256 * 1024)
    );
    let bearer = format!("Bearer {token}");
    let cases: Vec<(&str, reqwest::RequestBuilder, StatusCode)> = vec![
        (
            "malformed JSON",
            raw("{\"events\": [".into(), Some(&bearer)),
            StatusCode::BAD_REQUEST,
        ),
        (
            "not an object",
            raw("[1,2]".into(), Some(&bearer)),
            StatusCode::BAD_REQUEST,
        ),
        (
            "no events field",
            raw("{}".into(), Some(&bearer)),
            StatusCode::BAD_REQUEST,
        ),
        (
            "empty batch",
            raw(r#"{"events":[]}"#.into(), Some(&bearer)),
            StatusCode::BAD_REQUEST,
        ),
        (
            "body over 256 KiB",
            raw(big, Some(&bearer)),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        (
            "body just over 256 KiB",
            raw(just_over, Some(&bearer)),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        (
            "server-owned type",
            raw(
                r#"{"events":[{"type":"run_completed"}]}"#.into(),
                Some(&bearer),
            ),
            StatusCode::BAD_REQUEST,
        ),
        (
            "server-owned among good",
            raw(
                r#"{"events":[{"type":"agent.message"},{"type":"tool.approval_resolved"}]}"#.into(),
                Some(&bearer),
            ),
            StatusCode::BAD_REQUEST,
        ),
        (
            "bad type",
            raw(r#"{"events":[{"type":"Bad Type"}]}"#.into(), Some(&bearer)),
            StatusCode::BAD_REQUEST,
        ),
        (
            "forged envelope",
            raw(
                r#"{"events":[{"type":"agent.message","sequence":99}]}"#.into(),
                Some(&bearer),
            ),
            StatusCode::BAD_REQUEST,
        ),
        (
            "duplicate event_id in batch",
            raw(
                r#"{"events":[{"type":"a","event_id":"d"},{"type":"a","event_id":"d"}]}"#.into(),
                Some(&bearer),
            ),
            StatusCode::BAD_REQUEST,
        ),
        (
            "100 events",
            raw(
                json!({"events": vec![json!({"type":"a"}); 100]}).to_string(),
                Some(&bearer),
            ),
            StatusCode::BAD_REQUEST,
        ),
        (
            "missing token",
            raw(r#"{"events":[{"type":"a"}]}"#.into(), None),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "invalid token",
            raw(
                r#"{"events":[{"type":"a"}]}"#.into(),
                Some("Bearer not-a-token"),
            ),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "not bearer",
            raw(
                r#"{"events":[{"type":"a"}]}"#.into(),
                Some(&format!("Basic {token}")),
            ),
            StatusCode::UNAUTHORIZED,
        ),
        (
            "other run's token",
            raw(
                r#"{"events":[{"type":"a"}]}"#.into(),
                Some(&format!("Bearer {other_token}")),
            ),
            StatusCode::FORBIDDEN,
        ),
        (
            "operator JWT on a producer route",
            raw(
                r#"{"events":[{"type":"a"}]}"#.into(),
                Some(&format!("Bearer {}", srv.operator_token)),
            ),
            StatusCode::FORBIDDEN,
        ),
    ];
    for (what, req, expected) in cases {
        let (status, v) = srv.send(req).await;
        assert_eq!(status, expected, "{what}: {v}");
        assert!(
            v["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{what}: clear error, got {v}"
        );
    }
    // Terminal calls and creation refuse bad input too.
    let (status, _) = srv
        .post(
            &format!("/api/runs/{run_id}/complete"),
            &other_token,
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = srv
        .post(
            &format!("/api/runs/{run_id}/fail"),
            &token,
            &json!({"run_id": "forged"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = srv.post("/api/runs", &srv.operator_token, &json!({})).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "creating runs needs the agent role"
    );
    let (status, _) = srv.post("/api/runs", &token, &json!({})).await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "a run token cannot create runs"
    );
    let (status, v) = srv
        .post("/api/runs", &srv.agent_token, &json!({"run_id": "bad/id"}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let (status, v) = srv
        .post("/api/runs", &srv.agent_token, &json!({"colour": "red"}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    // Another agent naming a taken run id (the creator's own retry is a 200 receipt).
    let intruder = srv
        .auth
        .mint_jwt("intruder", tollgate_api::Role::Agent, 60, None);
    let (status, v) = srv
        .post("/api/runs", &intruder, &json!({"run_id": run_id}))
        .await;
    assert_eq!(
        (status, v["state"].clone()),
        (StatusCode::CONFLICT, json!("run_exists"))
    );
    // Reading needs a token for this run (or an operator).
    let (status, _) = srv
        .get(&format!("/api/runs/{run_id}/events"), &other_token)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let stranger = srv
        .auth
        .mint_jwt("another-agent", tollgate_api::Role::Agent, 60, None);
    let (status, _) = srv
        .get(&format!("/api/runs/{run_id}/events"), &stranger)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = srv
        .send(srv.http.get(srv.url(&format!("/api/runs/{run_id}/events"))))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    assert_eq!(
        srv.replay_all(&run_id, &srv.operator_token, 100).await,
        before,
        "stream unchanged"
    );
    let other = srv.replay_all(&other_run, &srv.operator_token, 100).await;
    assert_eq!(other.len(), 1, "the other run is untouched too");
}

/// A redelivered create (same `delivery_id`) answers 200 with the same run.
async fn create_receipts(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let agent = srv.auth.mint_jwt(
        "test-agent",
        tollgate_api::Role::Agent,
        60,
        Some("p1".into()),
    );
    let delivery = format!("delivery-{}", uuid::Uuid::new_v4());
    let body = json!({"delivery_id": delivery, "kind": "coordinator", "project_id": "p1"});
    let (s1, first) = srv.post("/api/runs", &agent, &body).await;
    let (s2, second) = srv.post("/api/runs", &agent, &body).await;
    assert_eq!((s1, s2), (StatusCode::CREATED, StatusCode::OK));
    assert_eq!(first, second, "the receipt repeats the first answer");
    let run_id = first["run_id"].as_str().unwrap();
    let events = srv.replay_all(run_id, &srv.operator_token, 10).await;
    assert_eq!(events.len(), 1, "one run_started, not two");
    assert_eq!(events[0]["kind"], "coordinator");
    // Another agent's identical delivery id is a different run.
    let other_agent = srv.auth.mint_jwt(
        "other-agent",
        tollgate_api::Role::Agent,
        60,
        Some("p1".into()),
    );
    let (s3, third) = srv.post("/api/runs", &other_agent, &body).await;
    assert_eq!(s3, StatusCode::CREATED);
    assert_ne!(third["run_id"], first["run_id"]);
    // A child names its coordinator.
    let (status, child) = srv
        .post(
            "/api/runs",
            &agent,
            &json!({"kind": "child", "parent_run_id": run_id, "subtask_id": 3}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{child}");
    let (status, v) = srv
        .post(
            "/api/runs",
            &srv.agent_token,
            &json!({"kind": "child", "parent_run_id": "run-nope"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
}

/// Unknown routes and wrong methods answer JSON 404/405.
async fn routing_errors(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let (status, v) = srv.get("/api/nothing-here", &srv.operator_token).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    let (status, v) = srv
        .send(
            srv.http
                .delete(srv.url("/api/runs"))
                .bearer_auth(&srv.agent_token),
        )
        .await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{v}");
}

/// GIVEN JWTs signed with the right secret WHEN one is not valid yet (`nbf` ahead), was
/// issued in the future (`iat` ahead), or lives longer than the maximum (a day by
/// default; `exp - iat`, or `exp - now` without `iat`) THEN 401 JSON naming why, and
/// no run is created; a token within all of them creates its run.
async fn jwt_times_are_checked(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let key = tollgate_api::jwt::Hs256Key::new(tollgate_tests::TEST_SECRET.as_bytes());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let token = |extra: Value| {
        let mut claims = json!({"sub": "test-agent", "role": "agent", "exp": now + 600});
        for (k, v) in extra.as_object().unwrap() {
            claims[k] = v.clone();
        }
        tollgate_api::jwt::encode(&key, &claims).unwrap()
    };
    let day = 86_400;
    for (extra, why) in [
        (json!({"nbf": now + 3600}), "not valid yet"),
        (json!({"iat": now + 3600}), "issued in the future"),
        (json!({"iat": now, "exp": now + day + 3600}), "lifetime"),
        (json!({"exp": now + 2 * day}), "lifetime"),
        (json!({"iat": now - 2 * day, "exp": now + 60}), "lifetime"),
        // Storage keys "no project" as `-`: such a claim would read another tenant's.
        (json!({"project_id": "-"}), "project_id"),
        (json!({"project_id": ""}), "project_id"),
    ] {
        let run_id = format!("jwt-times-{}", uuid::Uuid::new_v4());
        let (status, body) = srv
            .post(
                "/api/runs",
                &token(extra.clone()),
                &json!({"run_id": run_id}),
            )
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{extra}: {body}");
        assert!(
            body["error"].as_str().unwrap().contains(why),
            "{extra}: {body}"
        );
        let (status, _) = srv
            .get(&format!("/api/runs/{run_id}/events"), &srv.operator_token)
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "nothing written for {extra}");
    }
    let ok = token(json!({"iat": now, "nbf": now, "exp": now + day}));
    let (status, body) = srv.post("/api/runs", &ok, &json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

macro_rules! for_backend {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn tour() {
                super::tour($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn concurrent_writers() {
                super::concurrent_writers($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn terminal_fencing() {
                super::terminal_fencing($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn replay_paging() {
                super::replay_paging($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn bad_input_writes_nothing() {
                super::bad_input_writes_nothing($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn create_receipts() {
                super::create_receipts($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn routing_errors() {
                super::routing_errors($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn jwt_times_are_checked() {
                super::jwt_times_are_checked($backend).await
            }
        }
    };
}

for_backend!(memory, Backend::Memory);
for_backend!(dynamo, Backend::Dynamo);

/// GIVEN DynamoDB is unreachable WHEN clients call THEN they get 503 JSON with
/// `Retry-After` and no internals, never a success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_outage_answers_503_and_fails_closed() {
    // A loopback port with nothing listening stands for an outage.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let sdk = tollgate_store::dynamo::sdk_config_loader()
        .endpoint_url(format!("http://127.0.0.1:{port}"))
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb::config::Credentials::new(
            "t", "t", None, None, "test",
        ))
        .load()
        .await;
    let store = tollgate_store::dynamo::DynamoStore::new(
        aws_sdk_dynamodb::Client::new(&sdk),
        tollgate_store::dynamo::Tables::with_prefix("outage-"),
    );
    let srv = TestServer::with_store(std::sync::Arc::new(store)).await;
    let (status, v) = srv.post("/api/runs", &srv.agent_token, &json!({})).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{v}");
    assert_eq!(v["state"], "unavailable");
    let token = srv.auth.run_token("run-1", "0123456789abcdef");
    let resp = srv
        .http
        .post(srv.url("/api/runs/run-1/events"))
        .bearer_auth(&token)
        .json(&json!({"events": [{"type": "agent.message"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(resp.headers()["retry-after"], "1");
    let body: Value = resp.json().await.unwrap();
    assert!(
        !body["error"].as_str().unwrap().contains("127.0.0.1"),
        "no internals leak: {body}"
    );
    let (status, _) = srv.get("/api/runs/run-1/events", &token).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
}
