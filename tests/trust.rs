//! Trust at the edges, through HTTP and the replayed stream only, on the embedded store
//! and on DynamoDB (the `dynamo::` tests need an endpoint; `make test` starts DynamoDB
//! Local):
//! - a grant covers only runs created by the same authenticated agent principal (JWT
//!   `sub`), never a run another agent created claiming the same `owner`;
//! - a child joins only a coordinator its own agent created;
//! - ending a run ends its pending cards (`expired`, reason `run_ended`), each announced
//!   with its `tool.approval_resolved` (and its coordinator's mirror) before the terminal
//!   event: a frontend following seed 003's card rules keeps no live card; they leave the
//!   pending listings, nothing follows the terminal event, a decision answers their end.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tollgate_api::{GateConfig, Role};
use tollgate_tests::frontend::CardBoard;
use tollgate_tests::{store_for, Backend, TestServer};

async fn server(backend: Backend) -> TestServer {
    TestServer::with_deps(TestServer::deps(
        store_for(backend).await,
        GateConfig {
            // No heartbeats in these transcripts.
            heartbeat_every: Duration::from_secs(60),
            ..GateConfig::default()
        },
    ))
    .await
}

fn request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn agent(srv: &TestServer, sub: &str, project: Option<&str>) -> String {
    srv.auth
        .mint_jwt(sub, Role::Agent, 600, project.map(str::to_owned))
}

fn operator(srv: &TestServer, sub: &str, project: Option<&str>) -> String {
    srv.auth
        .mint_jwt(sub, Role::Operator, 600, project.map(str::to_owned))
}

/// Creates a run with `token` (201 asserted): its id and run token.
async fn create(srv: &TestServer, token: &str, body: Value) -> (String, String) {
    let (status, v) = srv.post("/api/runs", token, &body).await;
    assert_eq!(status, StatusCode::CREATED, "create {body}: {v}");
    (
        v["run_id"].as_str().unwrap().to_owned(),
        v["run_token"].as_str().unwrap().to_owned(),
    )
}

/// Arms a card. Here and in [`approve`] a 503 `unavailable` (the store gave up on a
/// contended write, nothing written) is sent again, as a client would.
async fn arm(srv: &TestServer, run_id: &str, token: &str, tool: &str) -> (StatusCode, Value) {
    srv.post_until_served(
        &format!("/api/runs/{run_id}/approval-requests"),
        token,
        &json!({"request_id": request_id(), "tool_name": tool,
                "url": "https://attacker.example/x"}),
    )
    .await
}

async fn approve(
    srv: &TestServer,
    run_id: &str,
    request_id: &str,
    token: &str,
    scope: &str,
) -> (StatusCode, Value) {
    srv.post_until_served(
        &format!("/api/runs/{run_id}/tool-approvals"),
        token,
        &json!({"request_id": request_id, "scope": scope}),
    )
    .await
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// GIVEN alice granted `always` for `web_fetch` on agent A's run WHEN agent B (same
/// project) creates a run claiming `owner: alice` and arms `web_fetch` THEN B's card is
/// pending for a human — while A's own next run is still auto-approved.
async fn claimed_owner_rides_no_always_grant(backend: Backend) {
    let srv = server(backend).await;
    // A project of its own: the `always` grant lasts in the tables the DynamoDB tests
    // share, and must not reach a later run of this test or another one's cards.
    let project = format!("p1-{}", uuid::Uuid::new_v4().simple());
    let a = agent(&srv, "agent-a", Some(&project));
    let b = agent(&srv, "agent-b", Some(&project));
    let alice = operator(&srv, "alice", Some(&project));
    let (run_a, token_a) = create(&srv, &a, json!({"owner": "alice"})).await;
    let (status, card) = arm(&srv, &run_a, &token_a, "web_fetch").await;
    assert_eq!(status, StatusCode::CREATED, "{card}");
    let (status, v) = approve(
        &srv,
        &run_a,
        card["request_id"].as_str().unwrap(),
        &alice,
        "always",
    )
    .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("approved"))
    );

    // A's next run: the grant covers it (the control).
    let (run_a2, token_a2) = create(&srv, &a, json!({"owner": "alice"})).await;
    let (status, v) = arm(&srv, &run_a2, &token_a2, "web_fetch").await;
    assert_eq!(
        (status, v["state"].as_str(), v["auto_approved"].as_bool()),
        (StatusCode::OK, Some("approved"), Some(true)),
        "{v}"
    );

    // B claims alice: a human decides.
    let (run_b, token_b) = create(&srv, &b, json!({"owner": "alice"})).await;
    let (status, v) = arm(&srv, &run_b, &token_b, "web_fetch").await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::CREATED, Some("pending")),
        "a claimed owner rides no grant: {v}"
    );
    assert!(v.get("auto_approved").is_none(), "{v}");
    let events = srv.replay_all(&run_b, &srv.operator_token, 100).await;
    assert!(
        !types(&events).contains(&"tool.auto_approved"),
        "{:?}",
        types(&events)
    );
}

/// GIVEN agent A's coordinator WHEN agent B of the same project creates a child under it
/// THEN 403 (a `run` grant reaches siblings); A's own children join, and a `run` grant on
/// one reaches the other.
async fn children_join_only_their_own_agents_coordinator(backend: Backend) {
    let srv = server(backend).await;
    let a = agent(&srv, "agent-a", Some("p1"));
    let b = agent(&srv, "agent-b", Some("p1"));
    let alice = operator(&srv, "alice", Some("p1"));
    let (coordinator, _) = create(&srv, &a, json!({"kind": "coordinator", "owner": "alice"})).await;
    let child = json!({"kind": "child", "parent_run_id": coordinator, "owner": "alice"});
    let (status, v) = srv.post("/api/runs", &b, &child).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    assert!(v["error"].is_string(), "{v}");

    let (c1, t1) = create(&srv, &a, child.clone()).await;
    let (c2, t2) = create(&srv, &a, child.clone()).await;
    let (status, card) = arm(&srv, &c1, &t1, "shell").await;
    assert_eq!(status, StatusCode::CREATED, "{card}");
    let (status, v) = approve(
        &srv,
        &coordinator,
        card["request_id"].as_str().unwrap(),
        &alice,
        "run",
    )
    .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("approved")),
        "{v}"
    );
    let (status, v) = arm(&srv, &c2, &t2, "shell").await;
    assert_eq!(
        (status, v["auto_approved"].as_bool()),
        (StatusCode::OK, Some(true)),
        "a sibling of the same agent is covered: {v}"
    );
    // B's own run claiming alice, same tool: not covered.
    let (run_b, token_b) = create(&srv, &b, json!({"owner": "alice"})).await;
    let (status, v) = arm(&srv, &run_b, &token_b, "shell").await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::CREATED, Some("pending")),
        "{v}"
    );
}

/// GIVEN a run with pending cards (one mirrored on its coordinator) WHEN it completes
/// THEN its cards leave every pending listing, end `expired` with reason `run_ended`,
/// each announced on the child and the coordinator before `run_completed`, which is
/// last (no live card on a seed-003 frontend's board), and a decision answers 200
/// `{resolved: true, state: "expired"}` (never the 409 "retry").
async fn ending_a_run_ends_its_cards(backend: Backend) {
    let srv = server(backend).await;
    let a = agent(&srv, "agent-a", None);
    let (coordinator, _) = create(&srv, &a, json!({"kind": "coordinator", "owner": "ops"})).await;
    let (child, child_token) = create(
        &srv,
        &a,
        json!({"kind": "child", "parent_run_id": coordinator, "owner": "ops", "subtask_id": 1}),
    )
    .await;
    let mut cards = Vec::new();
    for tool in ["shell", "web_fetch", "deploy"] {
        let (status, v) = arm(&srv, &child, &child_token, tool).await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        cards.push(v["request_id"].as_str().unwrap().to_owned());
    }
    let listed = |v: &Value| -> Vec<String> {
        v["approvals"]
            .as_array()
            .unwrap_or_else(|| panic!("{v}"))
            .iter()
            .filter(|c| c["run_id"] == json!(child))
            .map(|c| c["request_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let (status, v) = srv
        .get("/api/approvals?state=pending", &srv.operator_token)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed(&v).len(), 3, "{v}");

    let (status, v) = srv
        .post(
            &format!("/api/runs/{child}/complete"),
            &child_token,
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let terminal = v["sequence"].as_u64().unwrap();

    let (status, v) = srv
        .get("/api/approvals?state=pending", &srv.operator_token)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(listed(&v).is_empty(), "ended run's cards still listed: {v}");
    let (status, v) = srv
        .get(
            &format!("/api/runs/{child}/approvals?state=pending"),
            &srv.operator_token,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert!(listed(&v).is_empty(), "{v}");
    for rid in &cards {
        let (status, v) = srv
            .get(
                &format!("/api/runs/{child}/approval-requests/{rid}"),
                &child_token,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(
            (
                v["state"].as_str(),
                v["reason"].as_str(),
                v["decided_by"].as_str()
            ),
            (Some("expired"), Some("run_ended"), None),
            "{v}"
        );
    }
    // A decision (on the child or through the coordinator) answers the card's end.
    for (posted_on, rid) in [(&child, &cards[0]), (&coordinator, &cards[1])] {
        let (status, v) = approve(&srv, posted_on, rid, &srv.operator_token, "once").await;
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(
            (
                v["resolved"].as_bool(),
                v["state"].as_str(),
                v["approved"].as_bool(),
                v["expired"].as_bool(),
                v["run_id"].as_str()
            ),
            (
                Some(true),
                Some("expired"),
                Some(false),
                Some(true),
                Some(child.as_str())
            ),
            "{v}"
        );
    }
    let (status, v) = srv
        .post(
            &format!("/api/runs/{child}/tool-denials"),
            &srv.operator_token,
            &json!({"request_id": cards[2]}),
        )
        .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("expired")),
        "{v}"
    );

    // Each card's end was announced before the terminal event, which is last; a
    // frontend keeping cards by seed 003's rules has none left on either stream.
    let events = srv.replay_all(&child, &srv.operator_token, 100).await;
    assert_eq!(events.last().unwrap()["type"], "run_completed");
    assert_eq!(events.last().unwrap()["sequence"], json!(terminal));
    for rid in &cards {
        let resolved: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "tool.approval_resolved" && e["requestId"] == json!(rid))
            .collect();
        assert_eq!(resolved.len(), 1, "{:?}", types(&events));
        assert_eq!(
            (
                resolved[0]["expired"].as_bool(),
                resolved[0]["approved"].as_bool(),
                resolved[0]["reason"].as_str()
            ),
            (Some(true), Some(false), Some("run_ended")),
            "{}",
            resolved[0]
        );
        assert!(resolved[0]["sequence"].as_u64().unwrap() < terminal);
    }
    let board = CardBoard::replay(&events);
    assert!(board.live.is_empty(), "live cards left: {:?}", board.live);
    assert!(board.violations.is_empty(), "{:?}", board.violations);
    let coord = srv.replay_all(&coordinator, &srv.operator_token, 100).await;
    let resolved: Vec<&Value> = coord
        .iter()
        .filter(|e| e["type"] == "coordinator.child_approval_resolved")
        .collect();
    assert_eq!(resolved.len(), 3, "{:?}", types(&coord));
    let board = CardBoard::replay(&coord);
    assert!(board.live.is_empty(), "live cards left: {:?}", board.live);
    assert!(board.violations.is_empty(), "{:?}", board.violations);
    for e in resolved {
        assert_eq!(
            (
                e["expired"].as_bool(),
                e["approved"].as_bool(),
                e["reason"].as_str()
            ),
            (Some(true), Some(false), Some("run_ended")),
            "{e}"
        );
    }
    // Repeating the terminal call is still idempotent and writes nothing more.
    let (status, _) = srv
        .post(
            &format!("/api/runs/{child}/complete"),
            &child_token,
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        srv.replay_all(&coordinator, &srv.operator_token, 100).await,
        coord
    );
}

/// Two servers on the same tables (separate store instances on DynamoDB, as two Lambda
/// instances would be): a run completing on one while operators approve its cards on the
/// other. Every card ends once, announced before the terminal event — approved, or
/// `run_ended` — none stays pending or live on a seed-003 frontend's board, nothing
/// follows the terminal event, and the coordinator is told exactly once per card.
async fn decisions_racing_the_run_end(backend: Backend) {
    let store = store_for(backend).await;
    let second = match backend {
        Backend::Memory => store.clone(),
        Backend::Dynamo => store_for(backend).await,
    };
    let gate = || GateConfig {
        heartbeat_every: Duration::from_secs(60),
        ..GateConfig::default()
    };
    let ending = TestServer::with_deps(TestServer::deps(store, gate())).await;
    let deciding =
        std::sync::Arc::new(TestServer::with_deps(TestServer::deps(second, gate())).await);
    let a = agent(&ending, "agent-a", None);
    let (coordinator, _) =
        create(&ending, &a, json!({"kind": "coordinator", "owner": "ops"})).await;
    let (child, child_token) = create(
        &ending,
        &a,
        json!({"kind": "child", "parent_run_id": coordinator, "owner": "ops", "subtask_id": 2}),
    )
    .await;
    let mut cards = Vec::new();
    for _ in 0..12 {
        let (status, v) = arm(&ending, &child, &child_token, "shell").await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        cards.push(v["request_id"].as_str().unwrap().to_owned());
    }
    let clicks: Vec<_> = cards
        .iter()
        .enumerate()
        .map(|(i, rid)| {
            let srv = deciding.clone();
            let posted_on = if i % 2 == 0 {
                child.clone()
            } else {
                coordinator.clone()
            };
            let rid = rid.clone();
            tokio::spawn(async move {
                let token = srv.operator_token.clone();
                approve(&srv, &posted_on, &rid, &token, "once").await
            })
        })
        .collect();
    // The end is sent once the first click has landed, so the others race it.
    let mut clicks = clicks.into_iter();
    let first = clicks.next().unwrap().await.unwrap();
    assert_eq!(first.0, StatusCode::OK, "{}", first.1);
    let (status, v) = ending
        .post_until_served(
            &format!("/api/runs/{child}/complete"),
            &child_token,
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let terminal = v["sequence"].as_u64().unwrap();
    for click in clicks {
        let (status, v) = click.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{v}");
        assert!(
            matches!(v["state"].as_str(), Some("approved") | Some("expired")),
            "{v}"
        );
    }
    let events = ending
        .replay_all(&child, &ending.operator_token, 1000)
        .await;
    assert_eq!(events.last().unwrap()["type"], "run_completed");
    assert_eq!(events.last().unwrap()["sequence"], json!(terminal));
    let mut approved = 0;
    for rid in &cards {
        let (status, card) = ending
            .get(
                &format!("/api/runs/{child}/approval-requests/{rid}"),
                &child_token,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{card}");
        let resolved: Vec<&Value> = events
            .iter()
            .filter(|e| e["type"] == "tool.approval_resolved" && e["requestId"] == json!(rid))
            .collect();
        match card["state"].as_str() {
            Some("approved") => {
                approved += 1;
                assert_eq!(resolved.len(), 1, "{card}");
                assert!(resolved[0]["sequence"].as_u64().unwrap() < terminal);
            }
            Some("expired") => {
                assert_eq!(card["reason"], "run_ended", "{card}");
                assert_eq!(resolved.len(), 1, "{card}");
                assert_eq!(resolved[0]["reason"], "run_ended", "{}", resolved[0]);
                assert_eq!(resolved[0]["expired"], true, "{}", resolved[0]);
                assert!(resolved[0]["sequence"].as_u64().unwrap() < terminal);
            }
            other => panic!("card left {other:?}: {card}"),
        }
    }
    let board = CardBoard::replay(&events);
    assert!(board.live.is_empty(), "live cards left: {:?}", board.live);
    assert!(board.violations.is_empty(), "{:?}", board.violations);
    let coord = ending
        .replay_all(&coordinator, &ending.operator_token, 1000)
        .await;
    let board = CardBoard::replay(&coord);
    assert!(board.live.is_empty(), "live cards left: {:?}", board.live);
    assert!(board.violations.is_empty(), "{:?}", board.violations);
    for rid in &cards {
        let told = coord
            .iter()
            .filter(|e| {
                e["type"] == "coordinator.child_approval_resolved" && e["requestId"] == json!(rid)
            })
            .count();
        assert_eq!(told, 1, "coordinator told once about {rid}");
    }
    let (status, v) = ending
        .get("/api/approvals?state=pending", &ending.operator_token)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !v["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["run_id"] == json!(child)),
        "{v}"
    );
    assert!(approved >= 1, "the first click landed before the end");
    eprintln!("{approved} of {} approved before the end", cards.len());
}

/// GIVEN a card approved for one call WHEN the agent arms the same `request_id` for
/// another call (another tool, URL or arguments) THEN 409 `request_id_in_use` and
/// nothing written — the human approved the first call, not this one; the same arm
/// A token whose `sub` looks like a standing grant's marker (`policy:<id>`, what a card a
/// policy approved records as `decided_by`) is refused outright: an operator so named
/// could otherwise make a human approval read as an automatic one. The card stays
/// pending and nothing is written.
async fn a_sub_named_like_a_policy_is_refused(backend: Backend) {
    let srv = server(backend).await;
    let (run_id, run_token) =
        create(&srv, &agent(&srv, "bot", None), json!({"owner": "alice"})).await;
    let (status, armed) = arm(&srv, &run_id, &run_token, "web_fetch").await;
    assert_eq!(status, StatusCode::CREATED, "{armed}");
    let request_id = armed["request_id"].as_str().unwrap().to_owned();
    for sub in ["policy:evil", "policy:"] {
        let (status, answer) = approve(
            &srv,
            &run_id,
            &request_id,
            &operator(&srv, sub, None),
            "once",
        )
        .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{sub}: {answer}");
        assert_eq!(answer["code"], "unauthorized", "{answer}");
        let (status, answer) = srv
            .post("/api/runs", &agent(&srv, sub, None), &json!({}))
            .await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{sub}: {answer}");
    }
    let (status, card) = srv
        .get(
            &format!("/api/runs/{run_id}/approval-requests/{request_id}"),
            &run_token,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{card}");
    assert_eq!(card["state"], "pending");
    // A sub that merely contains the marker is someone's name.
    let (status, answer) = approve(
        &srv,
        &run_id,
        &request_id,
        &operator(&srv, "ops-policy:x", None),
        "once",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["decided_by"], "ops-policy:x");
}

/// repeated still answers the card.
async fn a_request_id_answers_only_its_own_call(backend: Backend) {
    let srv = server(backend).await;
    let a = agent(&srv, "agent-a", None);
    let (run, token) = create(&srv, &a, json!({"owner": "alice"})).await;
    let first = json!({"request_id": "r-1", "tool_name": "web_fetch",
                       "url": "https://example.com/docs", "arguments_hash": "h1"});
    let (status, v) = srv
        .post(
            &format!("/api/runs/{run}/approval-requests"),
            &token,
            &first,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let (status, v) = approve(&srv, &run, "r-1", &srv.operator_token, "once").await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("approved"))
    );
    let before = srv.replay_all(&run, &srv.operator_token, 100).await;
    for other in [
        json!({"request_id": "r-1", "tool_name": "delete_db",
               "url": "https://example.com/docs", "arguments_hash": "h1"}),
        json!({"request_id": "r-1", "tool_name": "web_fetch",
               "url": "https://attacker.example/x", "arguments_hash": "h1"}),
        json!({"request_id": "r-1", "tool_name": "web_fetch",
               "url": "https://example.com/docs", "arguments_hash": "h2"}),
    ] {
        let (status, v) = srv
            .post(
                &format!("/api/runs/{run}/approval-requests"),
                &token,
                &other,
            )
            .await;
        assert_eq!(
            (status, v["state"].as_str()),
            (StatusCode::CONFLICT, Some("request_id_in_use")),
            "{other}: {v}"
        );
    }
    let (status, v) = srv
        .post(
            &format!("/api/runs/{run}/approval-requests"),
            &token,
            &first,
        )
        .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("approved")),
        "{v}"
    );
    assert_eq!(srv.replay_all(&run, &srv.operator_token, 100).await, before);
}

macro_rules! for_backend {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn claimed_owner_rides_no_always_grant() {
                super::claimed_owner_rides_no_always_grant($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn children_join_only_their_own_agents_coordinator() {
                super::children_join_only_their_own_agents_coordinator($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_sub_named_like_a_policy_is_refused() {
                super::a_sub_named_like_a_policy_is_refused($backend).await
            }
            #[tokio::test]
            async fn a_request_id_answers_only_its_own_call() {
                super::a_request_id_answers_only_its_own_call($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn ending_a_run_ends_its_cards() {
                super::ending_a_run_ends_its_cards($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn decisions_racing_the_run_end() {
                super::decisions_racing_the_run_end($backend).await
            }
        }
    };
}

for_backend!(memory, Backend::Memory);
for_backend!(dynamo, Backend::Dynamo);
