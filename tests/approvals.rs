//! The approval gate (seed 003) through HTTP and the streams, as an agent, an operator
//! console and a coordinator see it — on the embedded store and on DynamoDB (the
//! `dynamo::` tests need an endpoint; `make test` starts DynamoDB Local). Timers run on
//! the embedded queue, as in `tollgate serve`.

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tollgate_api::{GateConfig, Role};
use tollgate_tests::{store_for, Backend, TestServer};

fn gate(heartbeat_ms: u64) -> GateConfig {
    GateConfig {
        heartbeat_every: Duration::from_millis(heartbeat_ms),
        ..GateConfig::default()
    }
}

async fn server(backend: Backend, heartbeat_ms: u64) -> TestServer {
    TestServer::with_deps(TestServer::deps(
        store_for(backend).await,
        gate(heartbeat_ms),
    ))
    .await
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

fn request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

struct Family {
    coordinator: String,
    child: String,
    child_token: String,
}

/// A coordinator owned by `owner` and one child (subtask 3) of the same owner.
async fn family(srv: &TestServer, owner: &str) -> Family {
    let (coordinator, _) = srv
        .create_run(json!({"kind": "coordinator", "owner": owner}))
        .await;
    let (child, child_token) = srv
        .create_run(
            json!({"kind": "child", "parent_run_id": coordinator, "subtask_id": 3, "owner": owner}),
        )
        .await;
    Family {
        coordinator,
        child,
        child_token,
    }
}

/// Arms a card. Here and in [`decide`] a 503 `unavailable` (the store gave up on a
/// contended or slow write, nothing written) is sent again, as a client would: these
/// tests race clicks and arms on one run.
async fn arm(srv: &TestServer, run_id: &str, token: &str, body: Value) -> (StatusCode, Value) {
    srv.post_until_served(
        &format!("/api/runs/{run_id}/approval-requests"),
        token,
        &body,
    )
    .await
}

async fn decide(
    srv: &TestServer,
    verb: &str,
    run_id: &str,
    token: &str,
    body: Value,
) -> (StatusCode, Value) {
    srv.post_until_served(&format!("/api/runs/{run_id}/{verb}"), token, &body)
        .await
}

fn operator(srv: &TestServer, sub: &str) -> String {
    srv.auth.mint_jwt(sub, Role::Operator, 600, None)
}

/// GIVEN a child waiting on a card WHEN the operator approves promptly THEN child and
/// coordinator streams read exactly as seed 003 says, with no heartbeat.
async fn approve_transcript(backend: Backend) {
    let srv = server(backend, 60_000).await;
    let f = family(&srv, "alice").await;
    let rid = request_id();
    let (status, armed) = arm(
        &srv,
        &f.child,
        &f.child_token,
        json!({"request_id": rid, "tool_name": "web_fetch", "url": "https://api.github.com/search/issues?q=x",
               "intention": "find the issue", "message": "The agent wants to fetch a URL. Operator approval required."}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{armed}");
    assert_eq!(armed["display_id"], json!(&rid[..8]));
    assert_eq!(armed["state"], "pending");
    // Posting to the coordinator resolves the child; run_id is the owning child.
    let (status, answer) = decide(
        &srv,
        "tool-approvals",
        &f.coordinator,
        &operator(&srv, "op-1"),
        json!({"request_id": rid, "scope": "once"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer,
        json!({"run_id": f.child, "request_id": rid, "approved": true, "resolved": true,
               "state": "approved", "expired": false, "decided_by": "op-1", "scope": "once"})
    );
    let child = srv.replay_all(&f.child, &srv.operator_token, 100).await;
    assert_eq!(
        types(&child),
        [
            "run_started",
            "tool.approval_required",
            "tool.approval_resolved"
        ]
    );
    assert_eq!(child[1]["requestId"], json!(rid));
    assert_eq!(child[1]["toolName"], "web_fetch");
    assert_eq!(child[1]["intention"], "find the issue");
    assert_eq!(child[2]["runId"], json!(f.child));
    assert_eq!(
        (
            child[2]["approved"].as_bool(),
            child[2]["expired"].as_bool()
        ),
        (Some(true), Some(false))
    );
    assert_eq!(child[2]["decidedBy"], "op-1");
    let coord = srv
        .replay_all(&f.coordinator, &srv.operator_token, 100)
        .await;
    assert_eq!(
        types(&coord),
        [
            "run_started",
            "coordinator.child_approval_required",
            "coordinator.child_approval_resolved"
        ]
    );
    assert_eq!(coord[1]["childRunId"], json!(f.child));
    assert_eq!(coord[1]["subtaskId"], 3);
    assert_eq!(coord[1]["url"], "https://api.github.com/search/issues?q=x");
    assert_eq!(coord[2]["approved"], true);
    // The agent reads its card back.
    let (status, card) = srv
        .get(
            &format!("/api/runs/{}/approval-requests/{rid}", f.child),
            &f.child_token,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (card["state"].as_str(), card["decided_by"].as_str()),
        (Some("approved"), Some("op-1"))
    );
}

/// Deny, then every later click: 200 with the real state; unknown ids 404 `unknown`.
async fn decision_matrix(backend: Backend) {
    let srv = server(backend, 60_000).await;
    let f = family(&srv, "alice").await;
    let op = operator(&srv, "op-2");
    let rid = request_id();
    arm(
        &srv,
        &f.child,
        &f.child_token,
        json!({"request_id": rid, "tool_name": "shell"}),
    )
    .await;
    let (status, answer) = decide(
        &srv,
        "tool-denials",
        &f.child,
        &op,
        json!({"request_id": rid}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        answer,
        json!({"run_id": f.child, "request_id": rid, "denied": true, "resolved": true,
               "state": "denied", "expired": false, "decided_by": "op-2"})
    );
    let (status, again) = decide(
        &srv,
        "tool-approvals",
        &f.child,
        &op,
        json!({"request_id": rid}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (again["approved"].as_bool(), again["state"].as_str()),
        (Some(false), Some("denied"))
    );
    // Unknown request, wrong run, unrelated coordinator: 404 unknown.
    let (other_coord, _) = srv.create_run(json!({"kind": "coordinator"})).await;
    for (run, r) in [
        (f.child.as_str(), "no-such-request"),
        (other_coord.as_str(), rid.as_str()),
        ("no-such-run", rid.as_str()),
    ] {
        let (status, v) = decide(&srv, "tool-approvals", run, &op, json!({"request_id": r})).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{run} {r}: {v}");
        assert_eq!(v["state"], "unknown");
    }
    // Bad input and bad callers write nothing.
    let (status, _) = decide(
        &srv,
        "tool-approvals",
        &f.child,
        &op,
        json!({"scope": "once"}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = decide(
        &srv,
        "tool-approvals",
        &f.child,
        &srv.agent_token,
        json!({"request_id": rid}),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = decide(
        &srv,
        "tool-approvals",
        &f.child,
        &f.child_token,
        json!({"request_id": rid}),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = srv
        .send(
            srv.http
                .post(srv.url(&format!("/api/runs/{}/tool-approvals", f.child)))
                .json(&json!({"request_id": rid})),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let child = srv.replay_all(&f.child, &srv.operator_token, 100).await;
    assert_eq!(
        types(&child),
        [
            "run_started",
            "tool.approval_required",
            "tool.approval_resolved"
        ]
    );
    assert_eq!(child[2]["approved"], false);
    // A pending card on a run that ended: 409, still pending.
    let rid2 = request_id();
    arm(
        &srv,
        &f.child,
        &f.child_token,
        json!({"request_id": rid2, "tool_name": "shell"}),
    )
    .await;
    srv.post(
        &format!("/api/runs/{}/complete", f.child),
        &f.child_token,
        &json!({}),
    )
    .await;
    let (status, v) = decide(
        &srv,
        "tool-approvals",
        &f.child,
        &op,
        json!({"request_id": rid2}),
    )
    .await;
    // Ending the run ended its card: a decision answers its real end, never "retry".
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (
            v["resolved"].as_bool(),
            v["state"].as_str(),
            v["approved"].as_bool(),
            v["reason"].as_str()
        ),
        (Some(true), Some("expired"), Some(false), Some("run_ended"))
    );
    // Arming on an ended run is refused.
    let (status, v) = arm(
        &srv,
        &f.child,
        &f.child_token,
        json!({"request_id": request_id(), "tool_name": "x"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
}

/// Nobody answers: the server's timer expires the card; heartbeats came first and none
/// after; a click afterwards reports `expired` and never approves.
async fn expire_transcript(backend: Backend) {
    let srv = server(backend, 300).await;
    let f = family(&srv, "alice").await;
    let rid = request_id();
    let (status, _) = arm(
        &srv,
        &f.child,
        &f.child_token,
        json!({"request_id": rid, "tool_name": "web_fetch", "timeout_seconds": 2}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let mut child = Vec::new();
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        child = srv.replay_all(&f.child, &srv.operator_token, 100).await;
        if types(&child).contains(&"tool.approval_resolved") {
            break;
        }
    }
    let kinds = types(&child);
    let resolved = kinds
        .iter()
        .position(|t| *t == "tool.approval_resolved")
        .expect("the timer expired the card");
    assert_eq!(child[resolved]["expired"], true);
    assert_eq!(child[resolved]["approved"], false);
    let beats = kinds[..resolved]
        .iter()
        .filter(|t| **t == "tool.approval_pending")
        .count();
    assert!(beats >= 2, "a wait of 2 s with 0.3 s heartbeats: {kinds:?}");
    assert!(child[2..resolved]
        .iter()
        .all(|e| e["type"] == "tool.approval_pending"));
    assert_eq!(child[2]["requestId"], json!(rid));
    assert_eq!(child[2]["displayId"], json!(&rid[..8]));
    // Let any heartbeat in flight land, then check none followed the resolution.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let after = srv.replay_all(&f.child, &srv.operator_token, 100).await;
    assert_eq!(
        after.len(),
        resolved + 1,
        "nothing after the resolution: {:?}",
        types(&after)
    );
    let (status, v) = decide(
        &srv,
        "tool-approvals",
        &f.coordinator,
        &operator(&srv, "late-op"),
        json!({"request_id": rid}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (
            v["state"].as_str(),
            v["approved"].as_bool(),
            v["expired"].as_bool()
        ),
        (Some("expired"), Some(false), Some(true))
    );
    let coord = srv
        .replay_all(&f.coordinator, &srv.operator_token, 100)
        .await;
    assert_eq!(
        coord.last().unwrap()["type"],
        "coordinator.child_approval_resolved"
    );
    assert_eq!(coord.last().unwrap()["expired"], true);
}

/// Scopes beyond `once` are the owner's; anything unexact is `once`; `always` only for
/// always-eligible tools. A refused scope leaves the card pending.
async fn scope_rules(backend: Backend) {
    let srv = server(backend, 60_000).await;
    let f = family(&srv, "alice").await;
    let rid = request_id();
    arm(
        &srv,
        &f.child,
        &f.child_token,
        json!({"request_id": rid, "tool_name": "shell"}),
    )
    .await;
    let (status, v) = decide(
        &srv,
        "tool-approvals",
        &f.child,
        &operator(&srv, "mallory"),
        json!({"request_id": rid, "scope": "run"}),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    let (status, v) = decide(
        &srv,
        "tool-approvals",
        &f.child,
        &operator(&srv, "alice"),
        json!({"request_id": rid, "scope": "always"}),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "shell is not always-eligible: {v}"
    );
    let (status, card) = srv
        .get(
            &format!("/api/runs/{}/approval-requests/{rid}", f.child),
            &f.child_token,
        )
        .await;
    assert_eq!(
        (status, card["state"].as_str()),
        (StatusCode::OK, Some("pending"))
    );
    // "Always" is not "always": it means once, which anyone may grant.
    let (status, v) = decide(
        &srv,
        "tool-approvals",
        &f.child,
        &operator(&srv, "mallory"),
        json!({"request_id": rid, "scope": "Always"}),
    )
    .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("approved"))
    );
    let events = srv.replay_all(&f.child, &srv.operator_token, 100).await;
    assert_eq!(events.last().unwrap()["scope"], "once");
}

/// The console reattaches: pending cards per run and overall (project-limited).
async fn pending_listings(backend: Backend) {
    let srv = server(backend, 60_000).await;
    let agent_p = srv
        .auth
        .mint_jwt("agent-p", Role::Agent, 600, Some("proj-list".into()));
    let (status, run) = srv.post("/api/runs", &agent_p, &json!({})).await;
    assert_eq!(status, StatusCode::CREATED);
    let (run_id, token) = (
        run["run_id"].as_str().unwrap().to_owned(),
        run["run_token"].as_str().unwrap().to_owned(),
    );
    let rids: Vec<String> = (0..3).map(|_| request_id()).collect();
    for rid in &rids {
        let (status, _) = arm(
            &srv,
            &run_id,
            &token,
            json!({"request_id": rid, "tool_name": "web_fetch"}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let op = operator(&srv, "op-list");
    decide(
        &srv,
        "tool-denials",
        &run_id,
        &op,
        json!({"request_id": rids[0]}),
    )
    .await;
    let (status, v) = srv
        .get(&format!("/api/runs/{run_id}/approvals?state=pending"), &op)
        .await;
    assert_eq!(status, StatusCode::OK);
    let listed: Vec<&str> = v["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["request_id"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), 2);
    assert!(listed.contains(&rids[1].as_str()) && listed.contains(&rids[2].as_str()));
    let project_op = srv
        .auth
        .mint_jwt("op-p", Role::Operator, 600, Some("proj-list".into()));
    let other_op = srv
        .auth
        .mint_jwt("op-q", Role::Operator, 600, Some("proj-other".into()));
    // The overall list (the index behind it may lag a moment on DynamoDB).
    let mut seen = Vec::new();
    for _ in 0..50 {
        let (status, v) = srv.get("/api/approvals?state=pending", &project_op).await;
        assert_eq!(status, StatusCode::OK);
        seen = v["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["request_id"].as_str().unwrap().to_owned())
            .collect();
        if seen.contains(&rids[1]) && seen.contains(&rids[2]) && !seen.contains(&rids[0]) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        seen.contains(&rids[1]) && seen.contains(&rids[2]) && !seen.contains(&rids[0]),
        "{seen:?}"
    );
    let (_, v) = srv.get("/api/approvals?state=pending", &other_op).await;
    assert!(v["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| !rids.contains(&c["request_id"].as_str().unwrap().to_owned())));
    let (status, _) = srv
        .get(
            &format!("/api/runs/{run_id}/approvals?state=pending"),
            &other_op,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = decide(
        &srv,
        "tool-approvals",
        &run_id,
        &other_op,
        json!({"request_id": rids[1]}),
    )
    .await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "another project's operator cannot decide"
    );
    let (status, _) = srv.get("/api/approvals?state=approved", &op).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// Arming is idempotent and validated.
async fn arming_input(backend: Backend) {
    let srv = server(backend, 60_000).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    let rid = request_id();
    let body = json!({"request_id": rid, "tool_name": "web_fetch", "tool_call_id": "call-1", "approval_id": "appr-1", "arguments_hash": "sha256:00ff"});
    let (s1, first) = arm(&srv, &run_id, &token, body.clone()).await;
    let (s2, second) = arm(&srv, &run_id, &token, body).await;
    assert_eq!((s1, s2), (StatusCode::CREATED, StatusCode::OK));
    assert_eq!(first["expires_at"], second["expires_at"]);
    let events = srv.replay_all(&run_id, &token, 100).await;
    assert_eq!(types(&events), ["run_started", "tool.approval_required"]);
    assert_eq!(events[1]["tool_call_id"], "call-1");
    assert_eq!(events[1]["approval_id"], "appr-1");
    for bad in [
        json!({"tool_name": "x"}),
        json!({"request_id": "a/b", "tool_name": "x"}),
        json!({"request_id": "ok", "tool_name": ""}),
        json!({"request_id": "ok", "tool_name": "x", "timeout_seconds": 0}),
        json!({"request_id": "ok", "tool_name": "x", "colour": "red"}),
        json!({"request_id": "ok", "tool_name": "x", "url": "u".repeat(3000)}),
    ] {
        let (status, v) = arm(&srv, &run_id, &token, bad.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
    let (status, _) = arm(
        &srv,
        &run_id,
        &srv.agent_token,
        json!({"request_id": "ok", "tool_name": "x"}),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, v) = srv
        .get(
            &format!("/api/runs/{run_id}/approval-requests/nope"),
            &token,
        )
        .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown"))
    );
    assert_eq!(
        srv.replay_all(&run_id, &token, 100).await.len(),
        2,
        "nothing written"
    );
}

/// Each scope's reach, through HTTP: `tool` this run; `run` this run and its siblings of
/// the same owner; `always` the owner's runs within the project. A covered gate answers
/// 200 `auto_approved` with `tool.auto_approved` and no card; a revocation is announced
/// and ends the cover.
async fn scope_reach(backend: Backend) {
    let srv = server(backend, 60_000).await;
    // An owner of its own: `tool` and `always` grants reach every run of their owner, so
    // other tests on the same tables must not share it.
    let owner = format!("alice-{}", &request_id()[..8]);
    let alice = operator(&srv, &owner);
    let f = family(&srv, &owner).await;
    let (sibling, sibling_token) = srv
        .create_run(json!({"kind": "child", "parent_run_id": f.coordinator, "owner": owner}))
        .await;
    let (stranger, stranger_token) = srv
        .create_run(json!({"kind": "child", "parent_run_id": f.coordinator, "owner": "bob"}))
        .await;
    let gate = |run: &str, token: &str, tool: &str| {
        let (run, token, tool) = (run.to_owned(), token.to_owned(), tool.to_owned());
        let srv = &srv;
        async move {
            arm(
                srv,
                &run,
                &token,
                json!({"request_id": request_id(), "tool_name": tool}),
            )
            .await
        }
    };
    // `run` on the child: its siblings of the same owner are covered for that tool.
    let (_, first) = gate(&f.child, &f.child_token, "web_fetch").await;
    let (status, v) = decide(
        &srv,
        "tool-approvals",
        &f.child,
        &alice,
        json!({"request_id": first["request_id"], "scope": "run"}),
    )
    .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("approved")),
        "{v}"
    );
    let (status, auto) = gate(&sibling, &sibling_token, "web_fetch").await;
    assert_eq!(status, StatusCode::OK, "{auto}");
    assert_eq!(
        (auto["state"].as_str(), auto["auto_approved"].as_bool()),
        (Some("approved"), Some(true))
    );
    let (status, _) = gate(&f.child, &f.child_token, "web_fetch").await;
    assert_eq!(status, StatusCode::OK, "the run itself is covered");
    for (run, token, tool) in [
        (stranger.as_str(), stranger_token.as_str(), "web_fetch"),
        (sibling.as_str(), sibling_token.as_str(), "shell"),
    ] {
        let (status, v) = gate(run, token, tool).await;
        assert_eq!(
            status,
            StatusCode::CREATED,
            "{run} {tool}: not covered: {v}"
        );
    }
    let sibling_events = srv.replay_all(&sibling, &srv.operator_token, 100).await;
    assert_eq!(
        types(&sibling_events),
        [
            "run_started",
            "tool.auto_approved",
            "tool.approval_required"
        ]
    );
    assert_eq!(sibling_events[1]["scope"], "run");
    // Revoke: announced on the streams it reached; new gates need a human again.
    let (status, listed) = srv.get("/api/policies", &alice).await;
    assert_eq!(status, StatusCode::OK);
    let policy = listed["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["origin_run_id"] == json!(f.child))
        .expect("listed")
        .clone();
    let id = policy["policy_id"].as_str().unwrap();
    let (status, revoked) = srv
        .send(
            srv.http
                .delete(srv.url(&format!("/api/policies/{id}")))
                .bearer_auth(&alice),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{revoked}");
    assert_eq!(revoked["revoked_by"], json!(owner));
    let (status, _) = gate(&sibling, &sibling_token, "web_fetch").await;
    assert_eq!(status, StatusCode::CREATED, "no cover after the revocation");
    for run in [&f.child, &sibling] {
        let events = srv.replay_all(run, &srv.operator_token, 100).await;
        assert_eq!(
            types(&events)
                .iter()
                .filter(|t| **t == "tool.policy_revoked")
                .count(),
            1,
            "{run}: {:?}",
            types(&events)
        );
    }
    let (status, _) = srv
        .send(
            srv.http
                .delete(srv.url("/api/policies/zz"))
                .bearer_auth(&alice),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // `always`: the owner's runs in the same project, never another project's.
    let agent = |project: &str| {
        srv.auth
            .mint_jwt("agent", Role::Agent, 600, Some(project.into()))
    };
    let run_in = |project: &str| {
        let token = agent(project);
        let (srv, owner) = (&srv, owner.clone());
        async move {
            let (status, v) = srv
                .post("/api/runs", &token, &json!({"owner": owner}))
                .await;
            assert_eq!(status, StatusCode::CREATED);
            (
                v["run_id"].as_str().unwrap().to_owned(),
                v["run_token"].as_str().unwrap().to_owned(),
            )
        }
    };
    // Projects of their own: grants from earlier runs on the same tables stay apart.
    let p_always = format!("p-always-{}", &request_id()[..8]);
    let q_elsewhere = format!("q-elsewhere-{}", &request_id()[..8]);
    let (p1, p1_token) = run_in(&p_always).await;
    let (_, card) = gate(&p1, &p1_token, "web_fetch").await;
    let (status, v) = decide(
        &srv,
        "tool-approvals",
        &p1,
        &alice,
        json!({"request_id": card["request_id"], "scope": "always"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (p1b, p1b_token) = run_in(&p_always).await;
    let (status, v) = gate(&p1b, &p1b_token, "web_fetch").await;
    assert_eq!(
        (status, v["auto_approved"].as_bool()),
        (StatusCode::OK, Some(true)),
        "{v}"
    );
    let (q, q_token) = run_in(&q_elsewhere).await;
    let (status, _) = gate(&q, &q_token, "web_fetch").await;
    assert_eq!(status, StatusCode::CREATED, "never across projects");
}

/// A `once` click racing an `always` click: whichever wins, a policy exists exactly
/// when `always` won.
async fn once_racing_always(backend: Backend, trials: usize) {
    let srv = Arc::new(server(backend, 60_000).await);
    // An owner of its own: an `always` grant here must not cover other tests' gates on
    // the same tables.
    let owner = format!("alice-{}", &request_id()[..8]);
    let alice = operator(&srv, &owner);
    let (run_id, token) = srv.create_run(json!({"owner": owner})).await;
    for _ in 0..trials {
        let rid = request_id();
        arm(
            &srv,
            &run_id,
            &token,
            json!({"request_id": rid, "tool_name": "web_fetch"}),
        )
        .await;
        let clicks: Vec<_> = ["once", "always"]
            .into_iter()
            .map(|scope| {
                let (srv, alice, run_id, rid) =
                    (srv.clone(), alice.clone(), run_id.clone(), rid.clone());
                tokio::spawn(async move {
                    decide(
                        &srv,
                        "tool-approvals",
                        &run_id,
                        &alice,
                        json!({"request_id": rid, "scope": scope}),
                    )
                    .await
                })
            })
            .collect();
        for c in clicks {
            let (status, v) = c.await.unwrap();
            assert_eq!(status, StatusCode::OK, "{v}");
        }
        let events = srv.replay_all(&run_id, &token, 1000).await;
        let resolved = events
            .iter()
            .find(|e| e["type"] == "tool.approval_resolved" && e["requestId"] == json!(rid))
            .expect("resolved");
        let (_, listed) = srv.get("/api/policies", &alice).await;
        let live = listed["policies"].as_array().unwrap().iter().any(|p| {
            p["origin_run_id"] == json!(run_id)
                && p["request_id"] == json!(rid)
                && p["revoked_at"].is_null()
        });
        assert_eq!(
            live,
            resolved["scope"] == "always",
            "policy iff always won: {resolved}"
        );
        if live {
            // Revoke it so the next trial's gate gets a card again.
            let id = listed["policies"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["request_id"] == json!(rid))
                .unwrap()["policy_id"]
                .as_str()
                .unwrap()
                .to_owned();
            srv.send(
                srv.http
                    .delete(srv.url(&format!("/api/policies/{id}")))
                    .bearer_auth(&alice),
            )
            .await;
        }
    }
}

/// A timer queue that accepts every message and delivers none (a lost SQS message).
struct LostTimers;

#[async_trait::async_trait]
impl tollgate_timers::TimerQueue for LostTimers {
    async fn schedule(
        &self,
        _message: &tollgate_timers::TimerMessage,
        _delay: Duration,
    ) -> Result<(), tollgate_timers::TimerError> {
        Ok(())
    }
}

/// GIVEN a card whose expiry timer was lost WHEN its deadline passes THEN the sweeper
/// expires it within one sweep, announced like any expiry.
async fn lost_timer_is_swept(backend: Backend) {
    let config = GateConfig {
        sweep_every: Duration::from_millis(250),
        ..gate(60_000)
    };
    let deps = tollgate_api::Deps::new(
        store_for(backend).await,
        Arc::new(LostTimers),
        config,
        tollgate_api::Auth::new(tollgate_tests::TEST_SECRET.as_bytes()),
    )
    .with_sweeper();
    let srv = TestServer::with_deps(deps).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    let rid = request_id();
    arm(
        &srv,
        &run_id,
        &token,
        json!({"request_id": rid, "tool_name": "web_fetch", "timeout_seconds": 1}),
    )
    .await;
    let mut events = Vec::new();
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        events = srv.replay_all(&run_id, &token, 100).await;
        if events.len() >= 3 {
            break;
        }
    }
    assert_eq!(
        types(&events),
        [
            "run_started",
            "tool.approval_required",
            "tool.approval_resolved"
        ]
    );
    assert_eq!(events[2]["expired"], true);
    let resolved_at = chrono_millis(events[2]["timestamp_utc"].as_str().unwrap());
    let armed_at = chrono_millis(events[1]["timestamp_utc"].as_str().unwrap());
    assert!(resolved_at - armed_at >= 1000, "never before the deadline");
}

fn chrono_millis(ts: &str) -> i64 {
    chrono::DateTime::parse_from_rfc3339(ts)
        .expect("timestamp_utc is RFC 3339")
        .timestamp_millis()
}

/// Seed 003's stall guard through the streams: a child waiting on a card (heartbeats or
/// not) is never declared stalled; a child that emitted `tool.approval_required`, then
/// `tool.error`, then went silent is — once.
async fn stall_guard(backend: Backend) {
    // Heartbeats every 300 ms keep the waiting child well inside a 2 s stall timeout,
    // also on a loaded machine.
    let config = GateConfig {
        sweep_every: Duration::from_millis(200),
        stall_timeout: Duration::from_millis(2000),
        ..gate(300)
    };
    let srv = TestServer::with_deps(TestServer::deps(store_for(backend).await, config)).await;
    let f = family(&srv, "alice").await;
    // The waiting child: a card with heartbeats, for longer than the stall timeout.
    arm(
        &srv,
        &f.child,
        &f.child_token,
        json!({"request_id": request_id(), "tool_name": "web_fetch", "timeout_seconds": 30}),
    )
    .await;
    // The talker: armed a card, then said something else, then silence — still waiting
    // on a human, so never stalled.
    let (talker, talker_token) = srv
        .create_run(json!({"kind": "child", "parent_run_id": f.coordinator, "subtask_id": 5}))
        .await;
    arm(
        &srv,
        &talker,
        &talker_token,
        json!({"request_id": request_id(), "tool_name": "web_fetch", "timeout_seconds": 30}),
    )
    .await;
    srv.append(
        &talker,
        &talker_token,
        json!([{"type": "agent.message", "text": "waiting for a human"}]),
    )
    .await;
    // The quitter: its wait ended with an error, then silence. Created right before it
    // arms: on a loaded machine the others' setup can outlast the stall timeout, which
    // would fail a quitter created first before it ever armed.
    let (quitter, quitter_token) = srv
        .create_run(json!({"kind": "child", "parent_run_id": f.coordinator, "subtask_id": 4}))
        .await;
    let rid = request_id();
    let (status, v) = arm(
        &srv,
        &quitter,
        &quitter_token,
        json!({"request_id": rid, "tool_name": "shell"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let (status, v) = decide(
        &srv,
        "tool-denials",
        &quitter,
        &operator(&srv, "op"),
        json!({"request_id": rid}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    srv.append(
        &quitter,
        &quitter_token,
        json!([{"type": "tool.error", "error": "denied"}]),
    )
    .await;
    // Until the quitter is reported (bounded), then a few more sweeps: once only.
    let stalled = |events: &[Value]| {
        events
            .iter()
            .any(|e| e["type"] == "coordinator.child_stall_detected")
    };
    let mut coord = Vec::new();
    for _ in 0..150 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        coord = srv
            .replay_all(&f.coordinator, &srv.operator_token, 1000)
            .await;
        if stalled(&coord) {
            break;
        }
    }
    assert!(stalled(&coord), "{:?}", types(&coord));
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let coord = srv
        .replay_all(&f.coordinator, &srv.operator_token, 1000)
        .await;
    let stalls: Vec<&Value> = coord
        .iter()
        .filter(|e| e["type"] == "coordinator.child_stall_detected")
        .collect();
    assert_eq!(stalls.len(), 1, "{:?}", types(&coord));
    assert_eq!(stalls[0]["childRunId"], json!(quitter));
    assert_eq!(stalls[0]["subtaskId"], 4);
    assert_eq!(stalls[0]["lastEventType"], "tool.error");
    assert_eq!(stalls[0]["stallTimeoutSeconds"], 2);
    assert!(stalls[0]["staleSinceUtc"].is_string(), "{}", stalls[0]);
    // Seed 003: the silent child is failed as agent_stall_timeout, in the same step.
    let quitter_events = srv.replay_all(&quitter, &srv.operator_token, 1000).await;
    let last = quitter_events.last().unwrap();
    assert_eq!(
        (last["type"].as_str(), last["reason"].as_str()),
        (Some("run_failed"), Some("agent_stall_timeout")),
        "{:?}",
        types(&quitter_events)
    );
    assert_eq!(
        stalls[0]["lastEventSequence"],
        json!(last["sequence"].as_u64().unwrap() - 1)
    );
    // The talker holds a pending card: never failed.
    let talker_events = srv.replay_all(&talker, &srv.operator_token, 1000).await;
    assert!(
        !types(&talker_events).contains(&"run_failed"),
        "{:?}",
        types(&talker_events)
    );
    let child = srv.replay_all(&f.child, &srv.operator_token, 1000).await;
    assert!(
        types(&child)
            .iter()
            .filter(|t| **t == "tool.approval_pending")
            .count()
            >= 3
    );
}

/// A timer queue that keeps what it is given, for a test to deliver by hand.
#[derive(Default)]
struct RecordedTimers(std::sync::Mutex<Vec<tollgate_timers::TimerMessage>>);

#[async_trait::async_trait]
impl tollgate_timers::TimerQueue for RecordedTimers {
    async fn schedule(
        &self,
        message: &tollgate_timers::TimerMessage,
        _delay: Duration,
    ) -> Result<(), tollgate_timers::TimerError> {
        self.0.lock().unwrap().push(message.clone());
        Ok(())
    }
}

impl RecordedTimers {
    fn take(&self) -> Vec<tollgate_timers::TimerMessage> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// GIVEN a waiting card WHEN every timer message is delivered three times (SQS is at
/// least once), concurrently THEN no event is written twice: one heartbeat per beat, one
/// resolution.
async fn timers_delivered_three_times(backend: Backend) {
    use tollgate_timers::{TimerHandler, TimerMessage};
    let timers = Arc::new(RecordedTimers::default());
    let deps = tollgate_api::Deps::new(
        store_for(backend).await,
        timers.clone(),
        gate(1),
        tollgate_api::Auth::new(tollgate_tests::TEST_SECRET.as_bytes()),
    );
    let gate = deps.gate.clone();
    let srv = TestServer::with_deps(deps).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    arm(
        &srv,
        &run_id,
        &token,
        json!({"request_id": request_id(), "tool_name": "web_fetch", "timeout_seconds": 1}),
    )
    .await;
    let deliver_thrice = |messages: Vec<TimerMessage>| {
        let gate = gate.clone();
        async move {
            let mut handles = Vec::new();
            for m in messages {
                for _ in 0..3 {
                    let (gate, m) = (gate.clone(), m.clone());
                    handles.push(tokio::spawn(async move { gate.handle(m).await }));
                }
            }
            for h in handles {
                h.await.unwrap().unwrap();
            }
        }
    };
    // Two rounds of heartbeats (each round's three deliveries schedule the next beat
    // three times), then the expiry once it is due.
    let mut expiry = Vec::new();
    for _ in 0..2 {
        let (beats, rest): (Vec<_>, Vec<_>) = timers
            .take()
            .into_iter()
            .partition(|m| matches!(m, TimerMessage::ApprovalHeartbeat { .. }));
        expiry.extend(rest);
        let mut unique = beats;
        unique.dedup();
        deliver_thrice(unique).await;
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    expiry.extend(
        timers
            .take()
            .into_iter()
            .filter(|m| matches!(m, TimerMessage::ApprovalExpiry { .. })),
    );
    expiry.dedup();
    assert_eq!(expiry.len(), 1);
    deliver_thrice(expiry).await;
    let events = srv.replay_all(&run_id, &token, 100).await;
    assert_eq!(
        types(&events),
        [
            "run_started",
            "tool.approval_required",
            "tool.approval_pending",
            "tool.approval_pending",
            "tool.approval_resolved"
        ],
        "one event per timer, however often it was delivered"
    );
    assert_eq!(events[4]["expired"], true);
}

/// GIVEN a run with more open cards than one Lambda answer can carry (each with its text
/// fields at their limits, all quotes, so escaping doubles them twice) WHEN an operator
/// lists them THEN the answer stays under 5 MiB as Lambda sends it, soonest deadline
/// first, and says `has_more`; once cards are decided the rest are listed.
async fn listings_fit_one_lambda_answer(backend: Backend) {
    let srv = server(backend, 60_000).await;
    let project = format!("proj-{}", &request_id()[..8]);
    let agent = srv
        .auth
        .mint_jwt("agent-big", Role::Agent, 600, Some(project.clone()));
    let (status, run) = srv.post("/api/runs", &agent, &json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    let (run_id, token) = (
        run["run_id"].as_str().unwrap().to_owned(),
        run["run_token"].as_str().unwrap().to_owned(),
    );
    let text = "\"".repeat(4096);
    let url = "\"".repeat(2048);
    let armed = 140;
    for i in 0..armed {
        let (status, body) = arm(
            &srv,
            &run_id,
            &token,
            json!({"request_id": format!("big-{i:03}"), "tool_name": "web_fetch",
                   "intention": text, "message": text, "url": url,
                   "timeout_seconds": 600 + i}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    let op = srv
        .auth
        .mint_jwt("op-big", Role::Operator, 600, Some(project.clone()));
    for path in [
        format!("/api/runs/{run_id}/approvals?state=pending"),
        "/api/approvals?state=pending".to_owned(),
    ] {
        let (status, listed) = srv.get(&path, &op).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        let cards = listed["approvals"].as_array().unwrap();
        assert!(
            !cards.is_empty() && cards.len() < armed,
            "{path}: {} cards",
            cards.len()
        );
        assert_eq!(listed["has_more"], true, "{path}");
        let escaped = tollgate_store::page::lambda_escaped_len(&listed.to_string());
        assert!(
            escaped <= tollgate_store::page::MAX_RESPONSE_BYTES,
            "{path}: {escaped} bytes escaped"
        );
        let ids: Vec<&str> = cards
            .iter()
            .map(|c| c["request_id"].as_str().unwrap())
            .collect();
        let expected: Vec<String> = (0..cards.len()).map(|i| format!("big-{i:03}")).collect();
        assert_eq!(ids, expected, "{path}: soonest deadline first");
    }
    // Deciding the listed ones makes room for the rest.
    for i in 0..armed - 20 {
        let (status, _) = decide(
            &srv,
            "tool-denials",
            &run_id,
            &op,
            json!({"request_id": format!("big-{i:03}")}),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    let (_, listed) = srv
        .get(&format!("/api/runs/{run_id}/approvals?state=pending"), &op)
        .await;
    assert_eq!(listed["approvals"].as_array().unwrap().len(), 20);
    assert_eq!(listed["has_more"], false);
}

/// A timer queue that is down for its first `down` calls, then records what it is given.
struct FlakyTimers {
    down: std::sync::atomic::AtomicUsize,
    sent: std::sync::Mutex<Vec<tollgate_timers::TimerMessage>>,
}

#[async_trait::async_trait]
impl tollgate_timers::TimerQueue for FlakyTimers {
    async fn schedule(
        &self,
        message: &tollgate_timers::TimerMessage,
        _delay: Duration,
    ) -> Result<(), tollgate_timers::TimerError> {
        use std::sync::atomic::Ordering;
        if self
            .down
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(tollgate_timers::TimerError::Unavailable("down".into()));
        }
        self.sent.lock().unwrap().push(message.clone());
        Ok(())
    }
}

/// GIVEN the timer queue is down when a card is armed (the arm stands) WHEN the agent
/// retries the arm THEN the expiry is sent again — but no second heartbeat chain.
async fn retried_arm_sends_the_expiry_again(backend: Backend) {
    let timers = Arc::new(FlakyTimers {
        down: 2.into(),
        sent: Default::default(),
    });
    let deps = tollgate_api::Deps::new(
        store_for(backend).await,
        timers.clone(),
        gate(1_000),
        tollgate_api::Auth::new(tollgate_tests::TEST_SECRET.as_bytes()),
    );
    let srv = TestServer::with_deps(deps).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    let body = json!({"request_id": request_id(), "tool_name": "web_fetch", "timeout_seconds": 60});
    let (status, first) = arm(&srv, &run_id, &token, body.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert!(timers.sent.lock().unwrap().is_empty(), "the queue was down");
    let (status, again) = arm(&srv, &run_id, &token, body).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["state"], "pending");
    let sent = timers.sent.lock().unwrap().clone();
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert!(
        matches!(&sent[0], tollgate_timers::TimerMessage::ApprovalExpiry { request_id, .. } if *request_id == first["request_id"]),
        "{sent:?}"
    );
}

/// GIVEN three scoped grants in a project WHEN its operator lists them two at a time
/// THEN a page of 2 with `has_more` and a `next_cursor`, then the last one without; each
/// grant once, newest first; a cursor or limit that is not valid is 400 JSON.
async fn policies_page_through_http(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let project = format!("proj-{}", uuid::Uuid::new_v4());
    let agent = srv
        .auth
        .mint_jwt("pager-agent", Role::Agent, 600, Some(project.clone()));
    let op = srv
        .auth
        .mint_jwt("pager-op", Role::Operator, 600, Some(project.clone()));
    let (status, created) = srv
        .post("/api/runs", &agent, &json!({"owner": "pager-op"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let run_id = created["run_id"].as_str().unwrap().to_owned();
    let token = created["run_token"].as_str().unwrap().to_owned();
    for tool in ["alpha", "beta", "gamma"] {
        let request_id = format!("pg-{tool}");
        let (status, v) = srv
            .post(
                &format!("/api/runs/{run_id}/approval-requests"),
                &token,
                &json!({"request_id": request_id, "tool_name": tool}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        let (status, v) = srv
            .post(
                &format!("/api/runs/{run_id}/tool-approvals"),
                &op,
                &json!({"request_id": request_id, "scope": "tool"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
    }
    let (status, first) = srv.get("/api/policies?limit=2", &op).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["has_more"], true);
    let cursor = first["next_cursor"].as_str().expect("a cursor").to_owned();
    let (status, second) = srv
        .get(&format!("/api/policies?limit=2&cursor={cursor}"), &op)
        .await;
    assert_eq!(status, StatusCode::OK, "{second}");
    let tools: Vec<&str> = first["policies"]
        .as_array()
        .unwrap()
        .iter()
        .chain(second["policies"].as_array().unwrap())
        .map(|p| p["tool_name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["gamma", "beta", "alpha"]);
    if second["has_more"] == true {
        let next = second["next_cursor"].as_str().unwrap();
        let (_, rest) = srv
            .get(&format!("/api/policies?limit=2&cursor={next}"), &op)
            .await;
        assert_eq!(rest["policies"], json!([]));
        assert_eq!(rest["has_more"], false);
    } else {
        assert!(second.get("next_cursor").is_none());
    }
    for bad in [
        "limit=0",
        "limit=501",
        "limit=x",
        "cursor=zz",
        "cursor=7b7d",
    ] {
        let (status, v) = srv.get(&format!("/api/policies?{bad}"), &op).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {v}");
        assert!(v["error"].is_string(), "{v}");
    }
}

/// GIVEN a child arming a card with an argument preview that holds secrets and a long
/// string WHEN an operator approves it with a reason, and again with another reason
/// THEN the card, both runs' events and the answers carry the redacted preview and the
/// first reason; no secret reaches the events; the repeat writes nothing.
async fn reasons_and_previews(backend: Backend) {
    let srv = server(backend, 60_000).await;
    let f = family(&srv, "alice").await;
    let rid = request_id();
    let long = "x".repeat(300);
    let preview = json!({
        "to": "ops@example.com",
        "api_key": "sk-live-SECRET-1",
        "headers": {"Authorization": "Bearer SECRET-2", "Accept": "text/plain"},
        "attachments": [{"name": "a.txt", "db_password": "SECRET-3"}],
        "body": long,
    });
    let (status, armed) = arm(
        &srv,
        &f.child,
        &f.child_token,
        json!({"request_id": rid, "tool_name": "send_email", "arguments_hash": "ab12",
               "arguments_preview": preview}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{armed}");
    let stored = json!({
        "to": "ops@example.com",
        "api_key": "[redacted]",
        "headers": {"Authorization": "[redacted]", "Accept": "text/plain"},
        "attachments": [{"name": "a.txt", "db_password": "[redacted]"}],
        "body": format!("{}…[truncated]", "x".repeat(256)),
    });
    let card_path = format!("/api/runs/{}/approval-requests/{rid}", f.child);
    let (_, card) = srv.get(&card_path, &f.child_token).await;
    assert_eq!(card["arguments_preview"], stored, "{card}");
    assert_eq!(card["arguments_hash"], "ab12");
    // The operators' listing shows it too.
    let (_, listed) = srv
        .get(
            &format!("/api/runs/{}/approvals", f.child),
            &srv.operator_token,
        )
        .await;
    assert_eq!(listed["approvals"][0]["arguments_preview"], stored);
    let (status, answer) = decide(
        &srv,
        "tool-approvals",
        &f.child,
        &operator(&srv, "op-r"),
        json!({"request_id": rid, "reason": "Recipient is on the allow list ✓"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer["decision_reason"],
        "Recipient is on the allow list ✓"
    );
    let before = srv.replay_all(&f.child, &srv.operator_token, 100).await;
    // A repeat with another reason (and the other verb) answers what stands.
    for verb in ["tool-approvals", "tool-denials"] {
        let (status, again) = decide(
            &srv,
            verb,
            &f.child,
            &operator(&srv, "op-s"),
            json!({"request_id": rid, "reason": "changed my mind"}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{again}");
        assert_eq!(again["decision_reason"], "Recipient is on the allow list ✓");
        assert_eq!(again["decided_by"], "op-r");
    }
    let child = srv.replay_all(&f.child, &srv.operator_token, 100).await;
    assert_eq!(child, before, "a repeated decision writes nothing");
    assert_eq!(
        types(&child),
        [
            "run_started",
            "tool.approval_required",
            "tool.approval_resolved"
        ]
    );
    assert_eq!(child[1]["argumentsPreview"], stored);
    assert_eq!(
        child[2]["decisionReason"],
        "Recipient is on the allow list ✓"
    );
    let coord = srv
        .replay_all(&f.coordinator, &srv.operator_token, 100)
        .await;
    assert_eq!(coord[1]["type"], "coordinator.child_approval_required");
    assert_eq!(coord[1]["argumentsPreview"], stored);
    assert_eq!(coord[2]["type"], "coordinator.child_approval_resolved");
    assert_eq!(
        coord[2]["decisionReason"],
        "Recipient is on the allow list ✓"
    );
    let everything = format!("{child:?}{coord:?}");
    for secret in ["SECRET-1", "SECRET-2", "SECRET-3"] {
        assert!(!everything.contains(secret), "{secret} leaked");
    }
    let (_, card) = srv.get(&card_path, &f.child_token).await;
    assert_eq!(card["decision_reason"], "Recipient is on the allow list ✓");
    // A denial with a reason reads the same way.
    let rid = request_id();
    arm(
        &srv,
        &f.child,
        &f.child_token,
        json!({"request_id": rid, "tool_name": "shell"}),
    )
    .await;
    let (_, denied) = decide(
        &srv,
        "tool-denials",
        &f.child,
        &operator(&srv, "op-r"),
        json!({"request_id": rid, "reason": "not during the freeze"}),
    )
    .await;
    assert_eq!(
        (denied["state"].as_str(), denied["decision_reason"].as_str()),
        (Some("denied"), Some("not during the freeze"))
    );
    let child = srv.replay_all(&f.child, &srv.operator_token, 100).await;
    let last = child.last().unwrap();
    assert_eq!(
        (last["approved"].as_bool(), last["decisionReason"].as_str()),
        (Some(false), Some("not during the freeze"))
    );
    assert!(
        child[3].get("argumentsPreview").is_none(),
        "no preview, no field"
    );
}

/// Bad reasons and previews are 400 with a JSON error, and write nothing.
async fn reason_and_preview_input(backend: Backend) {
    let srv = server(backend, 60_000).await;
    let (run, token) = srv.create_run(json!({"owner": "alice"})).await;
    let rid = request_id();
    let (status, _) = arm(
        &srv,
        &run,
        &token,
        json!({"request_id": rid, "tool_name": "shell"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let before = srv.replay_all(&run, &srv.operator_token, 100).await;
    let op = operator(&srv, "op-bad");
    for reason in [
        json!("r".repeat(1025)),
        json!(42),
        json!(["no"]),
        json!("line\nbreak"),
        json!("bell\u{7}"),
    ] {
        for verb in ["tool-approvals", "tool-denials"] {
            let (status, v) = decide(
                &srv,
                verb,
                &run,
                &op,
                json!({"request_id": rid, "reason": reason}),
            )
            .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{reason}: {v}");
            assert!(v["error"].is_string(), "{v}");
        }
    }
    let card_path = format!("/api/runs/{run}/approval-requests/{rid}");
    let (_, card) = srv.get(&card_path, &token).await;
    assert_eq!(card["state"], "pending");
    let deep = json!({"a": {"b": {"c": {"d": {"e": 1}}}}});
    let wide: serde_json::Map<String, Value> = (0..40)
        .map(|i| (format!("k{i}"), json!("y".repeat(200))))
        .collect();
    for preview in [
        json!(["a"]),
        json!("text"),
        json!(7),
        deep,
        Value::Object(wide),
    ] {
        let (status, v) = arm(
            &srv,
            &run,
            &token,
            json!({"request_id": request_id(), "tool_name": "shell", "arguments_preview": preview}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{preview}: {v}");
        assert!(v["error"].is_string(), "{v}");
    }
    assert_eq!(srv.replay_all(&run, &srv.operator_token, 100).await, before);
    // At the edge: a reason of 1024 characters, a preview four levels deep.
    let (status, _) = arm(
        &srv,
        &run,
        &token,
        json!({"request_id": "edge", "tool_name": "shell",
               "arguments_preview": {"a": {"b": {"c": {"d": 1}}}}}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, v) = decide(
        &srv,
        "tool-approvals",
        &run,
        &op,
        json!({"request_id": "edge", "reason": "é".repeat(1024)}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["decision_reason"], json!("é".repeat(1024)));
    // The preview is display only: a retried arm that shows another preview is the same
    // call and answers the card as it stands.
    let (status, v) = arm(
        &srv,
        &run,
        &token,
        json!({"request_id": "edge", "tool_name": "shell",
               "arguments_preview": {"a": 2}}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["state"], "approved", "{v}");
}

/// GIVEN a pending card WHEN its agent withdraws it (the call was cancelled) THEN it ends
/// `expired` with reason `withdrawn`, announced once on the run and its coordinator; an
/// approval after that approves nothing; a repeat answers the same; another run's token,
/// an unknown card and a bad id are refused, writing nothing.
async fn withdrawn_card(backend: Backend) {
    let srv = server(backend, 60_000).await;
    let f = family(&srv, "alice").await;
    let rid = request_id();
    let (status, armed) = arm(
        &srv,
        &f.child,
        &f.child_token,
        json!({"request_id": rid, "tool_name": "mcp__git__git_commit"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{armed}");
    let path = format!("/api/runs/{}/approval-requests/{rid}/withdraw", f.child);
    // Another run's token may not withdraw this run's card.
    let (_, other_token) = srv.create_run(json!({"owner": "bob"})).await;
    let (status, refused) = srv.post(&path, &other_token, &json!({})).await;
    assert!(status.is_client_error(), "{status} {refused}");
    let (status, refused) = srv
        .post(
            &format!("/api/runs/{}/approval-requests/nope/withdraw", f.child),
            &f.child_token,
            &json!({}),
        )
        .await;
    assert_eq!(
        (status, refused["state"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown"))
    );
    let (status, refused) = srv
        .post(
            &format!("/api/runs/{}/approval-requests/a%20b/withdraw", f.child),
            &f.child_token,
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    let (status, card) = srv.post(&path, &f.child_token, &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{card}");
    assert_eq!(
        (card["state"].as_str(), card["reason"].as_str()),
        (Some("expired"), Some("withdrawn")),
        "{card}"
    );
    // A repeat answers the card as it stands; nothing more is announced.
    let (status, again) = srv.post(&path, &f.child_token, &json!({})).await;
    assert_eq!(
        (status, again["state"].as_str()),
        (StatusCode::OK, Some("expired"))
    );
    // A click after the withdrawal approves nothing.
    let (status, late) = decide(
        &srv,
        "tool-approvals",
        &f.child,
        &operator(&srv, "op-1"),
        json!({"request_id": rid, "scope": "tool"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{late}");
    assert_eq!(
        (late["approved"].as_bool(), late["state"].as_str()),
        (Some(false), Some("expired"))
    );
    let child = srv.replay_all(&f.child, &srv.operator_token, 100).await;
    assert_eq!(
        types(&child),
        [
            "run_started",
            "tool.approval_required",
            "tool.approval_resolved"
        ]
    );
    assert_eq!(
        (
            child[2]["expired"].as_bool(),
            child[2]["approved"].as_bool(),
            child[2]["reason"].as_str()
        ),
        (Some(true), Some(false), Some("withdrawn"))
    );
    let coord = srv
        .replay_all(&f.coordinator, &srv.operator_token, 100)
        .await;
    assert_eq!(
        types(&coord),
        [
            "run_started",
            "coordinator.child_approval_required",
            "coordinator.child_approval_resolved"
        ]
    );
    let (status, policies) = srv.get("/api/policies", &operator(&srv, "op-1")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !policies["policies"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["request_id"] == json!(rid)),
        "no grant from a late click: {policies}"
    );
    assert!(late.get("grant").is_none(), "{late}");
}

macro_rules! for_backend {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn withdrawn_card() {
                super::withdrawn_card($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn approve_transcript() {
                super::approve_transcript($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn decision_matrix() {
                super::decision_matrix($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn expire_transcript() {
                super::expire_transcript($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn scope_rules() {
                super::scope_rules($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn pending_listings() {
                super::pending_listings($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn policies_page_through_http() {
                super::policies_page_through_http($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn scope_reach() {
                super::scope_reach($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn once_racing_always() {
                super::once_racing_always($backend, 100).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn lost_timer_is_swept() {
                super::lost_timer_is_swept($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn stall_guard() {
                super::stall_guard($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn timers_delivered_three_times() {
                super::timers_delivered_three_times($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn listings_fit_one_lambda_answer() {
                super::listings_fit_one_lambda_answer($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn retried_arm_sends_the_expiry_again() {
                super::retried_arm_sends_the_expiry_again($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn arming_input() {
                super::arming_input($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn reasons_and_previews() {
                super::reasons_and_previews($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn reason_and_preview_input() {
                super::reason_and_preview_input($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn auto_approved_gate_retried_after_revocation() {
                super::auto_approved_gate_retried_after_revocation($backend).await
            }
        }
    };
}

for_backend!(memory, Backend::Memory);
for_backend!(dynamo, Backend::Dynamo);

/// GIVEN one card WHEN 50 operators click at once (approve and deny mixed) through four
/// servers, each with its own store instance on the same tables (four Lambda instances)
/// THEN exactly one `tool.approval_resolved`, every answer 200 with the same final state
/// — and the same decider and reason (each click gave its own): the winner's, as the
/// events record it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_fifty_clicks_across_four_servers() {
    let mut servers = Vec::new();
    for _ in 0..4 {
        let store = Arc::new(tollgate_tests::dynamo_store().await.without_lanes());
        servers.push(Arc::new(
            TestServer::with_deps(TestServer::deps(store, gate(60_000))).await,
        ));
    }
    let f = family(&servers[0], "alice").await;
    let rid = request_id();
    arm(
        &servers[0],
        &f.child,
        &f.child_token,
        json!({"request_id": rid, "tool_name": "web_fetch"}),
    )
    .await;
    let clicks: Vec<_> = (0..50)
        .map(|i| {
            let srv = servers[i % 4].clone();
            let (run, rid) = (
                if i % 3 == 0 {
                    f.coordinator.clone()
                } else {
                    f.child.clone()
                },
                rid.clone(),
            );
            tokio::spawn(async move {
                let verb = if i % 2 == 0 {
                    "tool-approvals"
                } else {
                    "tool-denials"
                };
                let op = operator(&srv, &format!("op-{i}"));
                let body = json!({"request_id": rid, "reason": format!("reason of op-{i}")});
                decide(&srv, verb, &run, &op, body).await
            })
        })
        .collect();
    let mut states = std::collections::HashSet::new();
    let mut deciders = std::collections::HashSet::new();
    for c in clicks {
        let (status, v) = c.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["run_id"], json!(f.child));
        states.insert(v["state"].as_str().unwrap().to_owned());
        deciders.insert((v["decided_by"].clone(), v["decision_reason"].clone()));
    }
    assert_eq!(states.len(), 1, "{states:?}");
    assert_eq!(deciders.len(), 1, "{deciders:?}");
    let (by, reason) = deciders.into_iter().next().unwrap();
    assert_eq!(reason, json!(format!("reason of {}", by.as_str().unwrap())));
    let child = servers[1]
        .replay_all(&f.child, &servers[1].operator_token, 100)
        .await;
    let resolved: Vec<&Value> = child
        .iter()
        .filter(|e| e["type"] == "tool.approval_resolved")
        .collect();
    assert_eq!(resolved.len(), 1);
    assert_eq!(
        (&resolved[0]["decidedBy"], &resolved[0]["decisionReason"]),
        (&by, &reason)
    );
    let coord = servers[2]
        .replay_all(&f.coordinator, &servers[2].operator_token, 100)
        .await;
    let mirrored: Vec<&Value> = coord
        .iter()
        .filter(|e| e["type"] == "coordinator.child_approval_resolved")
        .collect();
    assert_eq!(mirrored.len(), 1);
    assert_eq!(mirrored[0]["decisionReason"], reason);
}

/// GIVEN a gate a live `tool` policy auto-approved WHEN the agent retries the arm after
/// the policy was revoked THEN it gets the first answer again — no pending card, no
/// second event — and reads the card back: 200, approved, decided by the policy.
async fn auto_approved_gate_retried_after_revocation(backend: Backend) {
    let srv = server(backend, 60_000).await;
    let alice = operator(&srv, "alice");
    let (run_id, token) = srv.create_run(json!({"owner": "alice"})).await;
    let (_, first) = arm(
        &srv,
        &run_id,
        &token,
        json!({"request_id": request_id(), "tool_name": "web_fetch"}),
    )
    .await;
    let (status, v) = decide(
        &srv,
        "tool-approvals",
        &run_id,
        &alice,
        json!({"request_id": first["request_id"], "scope": "tool"}),
    )
    .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("approved")),
        "{v}"
    );
    let rid = request_id();
    let body = json!({"request_id": rid, "tool_name": "web_fetch", "url": "https://example.com"});
    let (status, auto) = arm(&srv, &run_id, &token, body.clone()).await;
    assert_eq!(status, StatusCode::OK, "{auto}");
    assert_eq!(
        (auto["state"].as_str(), auto["auto_approved"].as_bool()),
        (Some("approved"), Some(true)),
        "{auto}"
    );
    let policy_id = auto["policy_id"].as_str().unwrap().to_owned();
    let (status, revoked) = srv
        .send(
            srv.http
                .delete(srv.url(&format!("/api/policies/{policy_id}")))
                .bearer_auth(&alice),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{revoked}");
    // The retry: the same answer, byte for byte.
    let (status, again) = arm(&srv, &run_id, &token, body).await;
    assert_eq!((status, &again), (StatusCode::OK, &auto));
    let (status, card) = srv
        .get(
            &format!("/api/runs/{run_id}/approval-requests/{rid}"),
            &token,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{card}");
    assert_eq!(card["state"], "approved");
    assert_eq!(card["scope"], "tool");
    assert_eq!(card["decided_by"], json!(format!("policy:{policy_id}")));
    assert_eq!(card["auto_approved"], true);
    assert_eq!(card["policy_id"], json!(policy_id));
    let (status, listed) = srv
        .get(
            &format!("/api/runs/{run_id}/approvals?state=pending"),
            &alice,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{listed}");
    assert!(
        listed["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["request_id"] != json!(rid)),
        "never pending: {listed}"
    );
    let events = srv.replay_all(&run_id, &srv.operator_token, 100).await;
    let about: Vec<&str> = events
        .iter()
        .filter(|e| e["requestId"] == json!(rid))
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(about, ["tool.auto_approved"]);
    assert_eq!(
        types(&events)
            .iter()
            .filter(|t| **t == "tool.policy_revoked")
            .count(),
        1
    );
}

/// GIVEN a revocation whose call stopped right after revoking (the policy item is revoked,
/// no stream was told) WHEN the backstop timer the call sent first arrives (twice: SQS
/// delivers at least once) THEN the reached stream gets exactly one `tool.policy_revoked`;
/// a backstop for a policy that is still live writes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_revocation_backstop_completes_announcements() {
    use tollgate_timers::{TimerHandler, TimerMessage};
    let store = tollgate_tests::dynamo_store().await;
    let (client, tables) = (store.client().clone(), store.tables().clone());
    let deps = TestServer::deps(Arc::new(store), gate(60_000));
    let gate_handle = deps.gate.clone();
    let srv = TestServer::with_deps(deps).await;
    let owner = format!("alice-{}", &request_id()[..8]);
    let alice = operator(&srv, &owner);
    let (run_id, token) = srv.create_run(json!({"owner": owner})).await;
    let rid = request_id();
    let (status, _) = arm(
        &srv,
        &run_id,
        &token,
        json!({"request_id": rid, "tool_name": "shell"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, v) = decide(
        &srv,
        "tool-approvals",
        &run_id,
        &alice,
        json!({"request_id": rid, "scope": "tool"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (_, listed) = srv.get("/api/policies", &alice).await;
    let policy = listed["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["origin_run_id"] == json!(run_id))
        .expect("the tool grant is listed")
        .clone();
    let policy_id = policy["policy_id"].as_str().unwrap().to_owned();
    let backstop = TimerMessage::PolicyRevocation {
        policy_id: policy_id.clone(),
    };
    let revoked_count = |events: &[Value]| {
        types(events)
            .iter()
            .filter(|t| **t == "tool.policy_revoked")
            .count()
    };
    // Still live: the backstop leaves it alone.
    gate_handle.handle(backstop.clone()).await.unwrap();
    let events = srv.replay_all(&run_id, &token, 100).await;
    assert_eq!(revoked_count(&events), 0);
    let (_, listed) = srv.get("/api/policies", &alice).await;
    assert!(listed["policies"]
        .as_array()
        .unwrap()
        .iter()
        .any(|p| p["policy_id"] == json!(policy_id) && p["revoked_at"].is_null()));
    // The revoking call's own write, and nothing after it.
    let (scope_key, tool_name) =
        tollgate_domain::approval::parse_policy_id(&policy_id).expect("a policy id");
    client
        .update_item()
        .table_name(&tables.policies)
        .key(
            "scope_key",
            aws_sdk_dynamodb::types::AttributeValue::S(scope_key),
        )
        .key(
            "tool_name",
            aws_sdk_dynamodb::types::AttributeValue::S(tool_name),
        )
        .update_expression("SET revoked_by = :by, revoked_at = :at")
        .expression_attribute_values(
            ":by",
            aws_sdk_dynamodb::types::AttributeValue::S(owner.clone()),
        )
        .expression_attribute_values(
            ":at",
            aws_sdk_dynamodb::types::AttributeValue::N(tollgate_domain::now_millis().to_string()),
        )
        .send()
        .await
        .unwrap();
    for _ in 0..2 {
        gate_handle.handle(backstop.clone()).await.unwrap();
    }
    let events = srv.replay_all(&run_id, &token, 100).await;
    assert_eq!(revoked_count(&events), 1, "{:?}", types(&events));
    // A new gate of the tool needs a human again.
    let (status, _) = arm(
        &srv,
        &run_id,
        &token,
        json!({"request_id": request_id(), "tool_name": "shell"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
}

/// GIVEN one server armed a child's card (so it holds its coordinator's head from moments
/// ago) WHEN another instance moves the coordinator on (appends; in the second trial, ends
/// it) and the first server then decides THEN the decision lands once, the coordinator's
/// stream stays gapless with its mirror right after the other writes — and nothing
/// follows an ended coordinator's terminal event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_a_stale_coordinator_head_is_never_written_on() {
    let a = TestServer::with_deps(TestServer::deps(
        Arc::new(tollgate_tests::dynamo_store().await.without_lanes()),
        gate(60_000),
    ))
    .await;
    let b = TestServer::with_deps(TestServer::deps(
        Arc::new(tollgate_tests::dynamo_store().await.without_lanes()),
        gate(60_000),
    ))
    .await;
    for end_coordinator in [false, true] {
        let (coordinator, coordinator_token) = a.create_run(json!({"kind": "coordinator"})).await;
        let (child, child_token) = a
            .create_run(json!({"kind": "child", "parent_run_id": coordinator, "subtask_id": 1}))
            .await;
        let rid = request_id();
        let (status, _) = arm(
            &a,
            &child,
            &child_token,
            json!({"request_id": rid, "tool_name": "shell"}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
        b.append(
            &coordinator,
            &coordinator_token,
            json!([{"type": "agent.message"}, {"type": "agent.message"}]),
        )
        .await;
        if end_coordinator {
            let (status, _) = b
                .post(
                    &format!("/api/runs/{coordinator}/complete"),
                    &coordinator_token,
                    &json!({}),
                )
                .await;
            assert_eq!(status, StatusCode::OK);
        }
        let (status, v) = decide(
            &a,
            "tool-approvals",
            &child,
            &operator(&a, "op"),
            json!({"request_id": rid}),
        )
        .await;
        assert_eq!(
            (status, v["state"].as_str()),
            (StatusCode::OK, Some("approved")),
            "{v}"
        );
        let events = a.replay_all(&coordinator, &a.operator_token, 100).await;
        let seqs: Vec<u64> = events
            .iter()
            .map(|e| e["sequence"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "gapless");
        let expected: Vec<&str> = if end_coordinator {
            vec![
                "run_started",
                "coordinator.child_approval_required",
                "agent.message",
                "agent.message",
                "run_completed",
            ]
        } else {
            vec![
                "run_started",
                "coordinator.child_approval_required",
                "agent.message",
                "agent.message",
                "coordinator.child_approval_resolved",
            ]
        };
        assert_eq!(types(&events), expected);
        let child_events = a.replay_all(&child, &child_token, 100).await;
        assert_eq!(
            types(&child_events)
                .iter()
                .filter(|t| **t == "tool.approval_resolved")
                .count(),
            1
        );
    }
}

/// Two servers, each with its own store instance on the same tables (two Lambda
/// instances); the first has armed a card, so it remembers the card pending.
async fn two_instances() -> (TestServer, TestServer) {
    let server = || async {
        TestServer::with_deps(TestServer::deps(
            Arc::new(tollgate_tests::dynamo_store().await.without_lanes()),
            gate(60_000),
        ))
        .await
    };
    (server().await, server().await)
}

/// GIVEN server A armed a card (it remembers it pending) and server B approved it (once)
/// WHEN an operator who does not own the run approves it on A with scope `run` (which
/// only the owner may grant on a pending card) — and the same click goes to B
/// THEN A answers as B, which reads the card fresh: 200, approved by B's click, nothing
/// written again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_a_click_on_a_card_decided_elsewhere_answers_as_a_fresh_read() {
    let (a, b) = two_instances().await;
    let f = family(&a, "alice").await;
    let rid = request_id();
    let (status, _) = arm(
        &a,
        &f.child,
        &f.child_token,
        json!({"request_id": rid, "tool_name": "shell"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, first) = decide(
        &b,
        "tool-approvals",
        &f.child,
        &operator(&b, "bob"),
        json!({"request_id": rid}),
    )
    .await;
    assert_eq!(
        (status, first["state"].as_str()),
        (StatusCode::OK, Some("approved"))
    );
    let click = json!({"request_id": rid, "scope": "run"});
    let (status_b, on_b) = decide(
        &b,
        "tool-approvals",
        &f.child,
        &operator(&b, "mallory"),
        click.clone(),
    )
    .await;
    let (status_a, on_a) = decide(
        &a,
        "tool-approvals",
        &f.child,
        &operator(&a, "mallory"),
        click,
    )
    .await;
    assert_eq!(status_b, StatusCode::OK, "a fresh read: {on_b}");
    assert_eq!((status_a, &on_a), (status_b, &on_b), "A answers as B");
    assert_eq!(on_a["decided_by"], "bob", "{on_a}");
    let events = b.replay_all(&f.child, &b.operator_token, 100).await;
    let resolved = events
        .iter()
        .filter(|e| e["type"] == "tool.approval_resolved")
        .count();
    assert_eq!(resolved, 1, "{events:?}");
}

/// Deletes every item of `run_id` from the runs, events and approvals tables, as TTL
/// does once its retention is over.
async fn delete_run_items(store: &tollgate_store::dynamo::DynamoStore, run_id: &str) {
    use aws_sdk_dynamodb::types::AttributeValue;
    let client = store.client();
    let tables = store.tables();
    for (table, sort) in [
        (&tables.runs, None),
        (&tables.events, Some("event_key")),
        (&tables.approvals, Some("item_key")),
    ] {
        let items = client
            .query()
            .table_name(table)
            .key_condition_expression("run_id = :r")
            .expression_attribute_values(":r", AttributeValue::S(run_id.to_owned()))
            .consistent_read(true)
            .send()
            .await
            .expect("query by hand")
            .items
            .unwrap_or_default();
        for item in items {
            let mut delete = client
                .delete_item()
                .table_name(table)
                .key("run_id", AttributeValue::S(run_id.to_owned()));
            if let Some(sort) = sort {
                delete = delete.key(sort, item[sort].clone());
            }
            delete.send().await.expect("delete by hand");
        }
    }
}

/// GIVEN server A armed card R on run X (it remembers the card pending and X's head)
/// AND every item of X expired (TTL), then X was created again on server B with a new
/// card R (other arguments)
/// WHEN an operator approves R on A
/// THEN the new card is the one decided — its arguments stay the new run's, its
/// resolution is on the new run's stream — never A's remembered card written over it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_a_remembered_card_never_pairs_with_a_recreated_run() {
    let (a, b) = two_instances().await;
    let run_id = format!("again-{}", uuid::Uuid::new_v4().simple());
    let body = json!({"run_id": run_id});
    let (status, old) = a.post("/api/runs", &a.agent_token, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{old}");
    let rid = request_id();
    let old_hash = format!("sha256:{:064x}", 1);
    let (status, _) = arm(
        &a,
        &run_id,
        old["run_token"].as_str().unwrap(),
        json!({"request_id": rid, "tool_name": "shell", "arguments_hash": old_hash}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    delete_run_items(&tollgate_tests::dynamo_store().await, &run_id).await;
    let (status, new) = b.post("/api/runs", &b.agent_token, &body).await;
    assert_eq!(status, StatusCode::CREATED, "created again: {new}");
    let new_token = new["run_token"].as_str().unwrap();
    let new_hash = format!("sha256:{:064x}", 2);
    let (status, _) = arm(
        &b,
        &run_id,
        new_token,
        json!({"request_id": rid, "tool_name": "web_fetch", "arguments_hash": new_hash}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, v) = decide(
        &a,
        "tool-approvals",
        &run_id,
        &operator(&a, "bob"),
        json!({"request_id": rid}),
    )
    .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("approved")),
        "{v}"
    );
    let (status, card) = b
        .get(
            &format!("/api/runs/{run_id}/approval-requests/{rid}"),
            new_token,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{card}");
    assert_eq!(
        (
            card["state"].as_str(),
            card["tool_name"].as_str(),
            card["arguments_hash"].as_str()
        ),
        (Some("approved"), Some("web_fetch"), Some(new_hash.as_str())),
        "the new card, decided: {card}"
    );
    let events = b.replay_all(&run_id, &b.operator_token, 100).await;
    assert_eq!(
        types(&events),
        [
            "run_started",
            "tool.approval_required",
            "tool.approval_resolved"
        ],
        "{events:?}"
    );
}
