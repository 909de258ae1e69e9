//! Pod-held cards (docs/architecture.md §8) through Tollgate's HTTP routes: an AgentHost
//! pod announces the cards it holds on its run's stream — `tool.approval_required`, its
//! `tool.approval_pending` heartbeats, `tool.approval_resolved {expired}` for its own
//! timeout — and Tollgate lists them (`held_by: "pod"`), mirrors them on a coordinator,
//! keeps the stall guard off the waiting child and forwards decisions to the pod with the
//! card's tool. Shown with the client's `PodGate` on loopback (announcing by itself) and
//! with a plain fake AgentHost speaking seed 003's shapes over raw HTTP — on the embedded
//! store and on DynamoDB (`dynamo::`, needs an endpoint; `make test` starts DynamoDB
//! Local).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tollgate_api::GateConfig;
use tollgate_client::pod::{PodArm, PodDecision, PodGate};
use tollgate_client::Scope;
use tollgate_tests::pods::{decide, listen, policies, request_id, serve};
use tollgate_tests::{store_for, Backend, TestServer};

/// A server whose pods live on loopback, with `heartbeat` as its heartbeat interval (a
/// pod's heartbeat within half of it of the last is dropped), `stall` as the stall
/// timeout, sweeping every 200 ms.
async fn server(backend: Backend, heartbeat: Duration, stall: Duration) -> TestServer {
    TestServer::with_deps(TestServer::deps(
        store_for(backend).await,
        GateConfig {
            allow_loopback_origins: true,
            forward_timeout: Duration::from_secs(5),
            heartbeat_every: heartbeat,
            stall_timeout: stall,
            sweep_every: Duration::from_millis(200),
            ..GateConfig::default()
        },
    ))
    .await
}

struct Run {
    id: String,
    token: String,
    credential: Option<String>,
}

async fn create(srv: &TestServer, body: Value) -> Run {
    let (status, created) = srv.post("/api/runs", &srv.agent_token, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    Run {
        id: created["run_id"].as_str().unwrap().to_owned(),
        token: created["run_token"].as_str().unwrap().to_owned(),
        credential: created["agenthost_credential"].as_str().map(str::to_owned),
    }
}

/// A `PodGate` pod for `run`, serving on `listener`, announcing through the run.
fn pod_gate(srv: &TestServer, listener: TcpListener, run: &Run, every: Duration) -> PodGate {
    let gate = PodGate::new(run.credential.as_deref().unwrap());
    let client = tollgate_client::Client::new(&srv.base, &srv.agent_token).unwrap();
    gate.announce_through(client.run(&run.id, &run.token))
        .heartbeat_every(every);
    serve(listener, gate.routes());
    gate
}

async fn events(srv: &TestServer, run_id: &str) -> Vec<Value> {
    srv.replay_all(run_id, &srv.operator_token, 1000).await
}

fn of_type<'a>(events: &'a [Value], t: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == t).collect()
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().filter_map(|e| e["type"].as_str()).collect()
}

/// Polls `run_id`'s stream (bounded, 10 s) until `done` holds; the last events read.
async fn until(srv: &TestServer, run_id: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let mut seen = Vec::new();
    for _ in 0..100 {
        seen = events(srv, run_id).await;
        if done(&seen) {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not reached on {run_id}: {:?}", types(&seen));
}

/// The pending cards an operator lists (all runs).
async fn pending(srv: &TestServer) -> Vec<Value> {
    let (status, v) = srv.get("/api/approvals", &srv.operator_token).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v["approvals"].as_array().cloned().unwrap_or_default()
}

async fn decided(pending: tollgate_client::pod::PendingApproval) -> PodDecision {
    tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("the pod's waiting call resumes")
}

/// The client's `PodGate`, announcing through its run: the card is on the stream and in
/// the operators' list (`held_by: "pod"`), heartbeats follow while it waits, an owner's
/// `tool` approval needs no `tool_name` (the card's tool is known), reaches the pod once,
/// writes one resolved event and the policy, and no heartbeat follows it. A second card
/// that times out in the pod ends `expired` with one resolved event.
async fn pod_gate_announces_its_cards(backend: Backend) {
    let srv = server(
        backend,
        Duration::from_millis(200),
        Duration::from_secs(300),
    )
    .await;
    let (listener, origin) = listen().await;
    let run = create(
        &srv,
        json!({"execution_mode": "pod", "agenthost_origin": origin, "owner": "alice"}),
    )
    .await;
    let gate = pod_gate(&srv, listener, &run, Duration::from_millis(150));
    let rid = request_id();
    let waiting = gate.arm(
        PodArm::new(&rid, &run.id, "web_fetch")
            .url("https://example.com/a")
            .message("The agent wants to fetch a URL."),
    );
    // Announced, then at least two heartbeats.
    let seen = until(&srv, &run.id, |e| {
        of_type(e, "tool.approval_pending").len() >= 2
    })
    .await;
    let required = of_type(&seen, "tool.approval_required");
    assert_eq!(required.len(), 1, "{:?}", types(&seen));
    assert_eq!(required[0]["requestId"], json!(rid));
    assert_eq!(required[0]["toolName"], "web_fetch");
    assert_eq!(required[0]["url"], "https://example.com/a");
    let listed: Vec<Value> = pending(&srv)
        .await
        .into_iter()
        .filter(|c| c["request_id"] == json!(rid))
        .collect();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["held_by"], "pod");
    assert_eq!(listed[0]["state"], "pending");

    let (status, answer) = decide(
        &srv,
        "tool-approvals",
        &run.id,
        "alice",
        json!({"request_id": rid, "scope": "tool"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["state"], "approved");
    assert_eq!(answer["decided_by"], "alice");
    assert_eq!(
        decided(waiting).await,
        PodDecision::Approved {
            scope: Scope::Tool,
            auto: false
        }
    );
    // The same click again: the card's answer, nothing forwarded or written.
    let (status, again) = decide(
        &srv,
        "tool-approvals",
        &run.id,
        "alice",
        json!({"request_id": rid, "scope": "tool"}),
    )
    .await;
    assert_eq!(
        (status, again["state"].as_str()),
        (StatusCode::OK, Some("approved"))
    );
    // Heartbeats had their chance to follow the resolution: none did.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let seen = events(&srv, &run.id).await;
    let resolved = of_type(&seen, "tool.approval_resolved");
    assert_eq!(resolved.len(), 1, "{:?}", types(&seen));
    assert_eq!(resolved[0]["approved"], true);
    assert_eq!(resolved[0]["decidedBy"], "alice");
    let resolved_at = resolved[0]["sequence"].as_u64().unwrap();
    assert!(
        of_type(&seen, "tool.approval_pending")
            .iter()
            .all(|e| e["sequence"].as_u64().unwrap() < resolved_at),
        "{:?}",
        types(&seen)
    );
    let granted = policies(&srv, &run.id).await;
    assert_eq!(granted.len(), 1, "{granted:?}");
    assert_eq!(
        (
            granted[0]["scope"].as_str(),
            granted[0]["tool_name"].as_str()
        ),
        (Some("tool"), Some("web_fetch"))
    );

    // The pod's own timeout: one resolved `expired`, the card expired.
    let rid2 = request_id();
    let waiting = gate.arm(PodArm::new(&rid2, &run.id, "shell").timeout(Duration::from_secs(1)));
    assert_eq!(decided(waiting).await, PodDecision::Expired);
    let seen = until(&srv, &run.id, |e| {
        e.iter()
            .any(|e| e["type"] == "tool.approval_resolved" && e["requestId"] == json!(rid2))
    })
    .await;
    let ended: Vec<&Value> = of_type(&seen, "tool.approval_resolved")
        .into_iter()
        .filter(|e| e["requestId"] == json!(rid2))
        .collect();
    assert_eq!(ended.len(), 1, "{:?}", types(&seen));
    assert_eq!(
        (
            ended[0]["expired"].as_bool(),
            ended[0]["approved"].as_bool()
        ),
        (Some(true), Some(false))
    );
    let (status, card) = srv
        .get(
            &format!("/api/runs/{}/approval-requests/{rid2}", run.id),
            &run.token,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{card}");
    assert_eq!(
        (card["state"].as_str(), card["held_by"].as_str()),
        (Some("expired"), Some("pod"))
    );
}

/// A plain AgentHost speaking seed 003 over raw HTTP: it appends the seed's payloads and
/// answers a forwarded decision `{resolved, applied, state, toolName, url}` (no ids).
async fn plain_agenthost(backend: Backend) {
    let srv = server(backend, Duration::from_secs(20), Duration::from_secs(300)).await;
    // The fake AgentHost: answers approvals as applied, records what it was sent.
    let (listener, origin) = listen().await;
    let sent: Arc<Mutex<Vec<Value>>> = Arc::default();
    let hits = Arc::new(AtomicUsize::new(0));
    let app = {
        let (sent, hits) = (sent.clone(), hits.clone());
        axum::Router::new().route(
            "/tool-approvals",
            axum::routing::post(move |axum::Json(body): axum::Json<Value>| {
                let (sent, hits) = (sent.clone(), hits.clone());
                async move {
                    hits.fetch_add(1, Ordering::SeqCst);
                    sent.lock().unwrap().push(body);
                    axum::Json(
                        json!({"resolved": true, "applied": true, "state": "approved",
                                      "toolName": "web_fetch", "url": "https://example.com/a"}),
                    )
                }
            }),
        )
    };
    serve(listener, app);
    let run = create(
        &srv,
        json!({"execution_mode": "pod", "agenthost_origin": origin, "owner": "alice"}),
    )
    .await;
    let append = |events: Value| {
        let (srv, run) = (&srv, &run);
        async move {
            srv.post(
                &format!("/api/runs/{}/events", run.id),
                &run.token,
                &json!({"events": events}),
            )
            .await
        }
    };
    let rid = request_id();
    let required = json!({"type": "tool.approval_required", "requestId": rid,
        "displayId": &rid[..8], "toolName": "web_fetch", "url": "https://example.com/a",
        "intention": "read the docs", "message": "The agent wants to fetch a URL. Operator approval required."});

    // Refused, nothing written: mixed into a batch, on an inline run, a malformed payload,
    // a resolution that is not the pod's timeout, a heartbeat for a card never announced.
    let before = events(&srv, &run.id).await.len();
    let (status, v) =
        append(json!([{"type": "agent.message", "text": "hi"}, required.clone()])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let (status, v) =
        append(json!([{"type": "tool.approval_required", "toolName": "web_fetch"}])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let (status, v) = append(json!([{"type": "tool.approval_resolved", "requestId": rid, "approved": true, "expired": false}])).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    let (status, v) = append(json!([{"type": "tool.approval_pending", "requestId": rid}])).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::NOT_FOUND, Some("unknown")),
        "{v}"
    );
    let inline = create(&srv, json!({"owner": "alice"})).await;
    let (status, v) = srv
        .post(
            &format!("/api/runs/{}/events", inline.id),
            &inline.token,
            &json!({"events": [required.clone()]}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(events(&srv, &run.id).await.len(), before);

    // Announced: recorded as a pod-held card with its event; a retry writes nothing.
    let (status, v) = append(json!([required.clone()])).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(
        (v["held_by"].as_str(), v["state"].as_str()),
        (Some("pod"), Some("pending"))
    );
    assert_eq!(v["sequences"].as_array().unwrap().len(), 1, "{v}");
    let (status, v) = append(json!([required.clone()])).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["dropped"][0]["reason"], "already_announced", "{v}");
    // The same requestId for another call: 409.
    let mut other = required.clone();
    other["toolName"] = "shell".into();
    let (status, v) = append(json!([other])).await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::CONFLICT, Some("request_id_in_use")),
        "{v}"
    );
    // A heartbeat: appended; one right after it: dropped as too soon.
    let beat = json!({"type": "tool.approval_pending", "requestId": rid, "displayId": &rid[..8], "toolName": "web_fetch"});
    let (status, v) = append(json!([beat.clone()])).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["sequences"].as_array().unwrap().len(), 1, "{v}");
    let (status, v) = append(json!([beat.clone()])).await;
    assert_eq!(
        (status, v["dropped"][0]["reason"].as_str()),
        (StatusCode::OK, Some("too_soon")),
        "{v}"
    );

    // An owner's `tool` approval with the seed's body (no tool_name): forwarded once with
    // the card's tool; one resolved event; the policy for that tool.
    let (status, answer) = decide(
        &srv,
        "tool-approvals",
        &run.id,
        "alice",
        json!({"request_id": rid, "scope": "tool"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        (answer["state"].as_str(), answer["approved"].as_bool()),
        (Some("approved"), Some(true))
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    let forwarded = sent.lock().unwrap()[0].clone();
    assert_eq!(
        (
            forwarded["requestId"].as_str(),
            forwarded["scope"].as_str(),
            forwarded["toolName"].as_str()
        ),
        (Some(rid.as_str()), Some("tool"), Some("web_fetch")),
        "{forwarded}"
    );
    let (status, _) = decide(
        &srv,
        "tool-approvals",
        &run.id,
        "bob",
        json!({"request_id": rid}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "an ended card is answered, not forwarded"
    );
    let granted = policies(&srv, &run.id).await;
    assert_eq!(granted.len(), 1, "{granted:?}");
    assert_eq!(granted[0]["tool_name"], "web_fetch");

    // After the resolution: the pod's heartbeat and its timeout are dropped, reported.
    let (status, v) = append(json!([beat.clone()])).await;
    assert_eq!(
        (status, v["dropped"][0]["reason"].as_str()),
        (StatusCode::OK, Some("card_resolved")),
        "{v}"
    );
    assert_eq!(v["state"], "approved");
    let expired = json!({"type": "tool.approval_resolved", "requestId": rid, "approved": false, "expired": true});
    let (status, v) = append(json!([expired])).await;
    assert_eq!(
        (status, v["dropped"][0]["reason"].as_str()),
        (StatusCode::OK, Some("card_resolved")),
        "{v}"
    );
    let seen = events(&srv, &run.id).await;
    assert_eq!(
        of_type(&seen, "tool.approval_resolved").len(),
        1,
        "{:?}",
        types(&seen)
    );
    assert_eq!(
        of_type(&seen, "tool.approval_pending").len(),
        1,
        "{:?}",
        types(&seen)
    );
    assert_eq!(
        of_type(&seen, "tool.approval_required").len(),
        1,
        "{:?}",
        types(&seen)
    );

    // A second card the pod expires itself: one resolved `expired`; a repeat is dropped.
    let rid2 = request_id();
    let mut required2 = required.clone();
    required2["requestId"] = rid2.clone().into();
    assert_eq!(append(json!([required2])).await.0, StatusCode::OK);
    let expired2 = json!({"type": "tool.approval_resolved", "requestId": rid2, "expired": true});
    let (status, v) = append(json!([expired2.clone()])).await;
    assert_eq!(
        (status, v["state"].as_str(), v["resolved"].as_bool()),
        (StatusCode::OK, Some("expired"), Some(true)),
        "{v}"
    );
    let (status, v) = append(json!([expired2])).await;
    assert_eq!(
        (status, v["dropped"][0]["reason"].as_str()),
        (StatusCode::OK, Some("card_resolved")),
        "{v}"
    );
    // A decision on it now answers its state; the pod is not asked.
    let (status, v) = decide(
        &srv,
        "tool-denials",
        &run.id,
        "alice",
        json!({"request_id": rid2}),
    )
    .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("expired")),
        "{v}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    let seen = events(&srv, &run.id).await;
    let ended: Vec<&Value> = of_type(&seen, "tool.approval_resolved")
        .into_iter()
        .filter(|e| e["requestId"] == json!(rid2))
        .collect::<Vec<_>>();
    assert_eq!(ended.len(), 1, "{:?}", types(&seen));
}

/// Seed 003 end to end: a coordinator with two pod children (each a `PodGate` announcing
/// through its run) and one inline child. Every card is on the coordinator's stream and
/// in the operators' list; decisions posted on the coordinator reach the right pod and
/// land once; the silent inline child is failed as `agent_stall_timeout`, the pod
/// children waiting on a human are not.
async fn coordinator_with_pod_children(backend: Backend) {
    let srv = server(
        backend,
        Duration::from_millis(300),
        Duration::from_millis(1500),
    )
    .await;
    let coordinator = create(&srv, json!({"kind": "coordinator", "owner": "alice"})).await;
    let mut pods = Vec::new();
    let mut waiting = Vec::new();
    let mut rids = Vec::new();
    // Each pod child arms right after it is created: on a loaded machine creating the
    // next ones can outlast the stall timeout, which would fail a pod child that was
    // not yet waiting on a human.
    for (subtask, tool) in [(1, "web_fetch"), (2, "shell")] {
        let (listener, origin) = listen().await;
        let child = create(
            &srv,
            json!({"kind": "child", "parent_run_id": coordinator.id, "subtask_id": subtask,
                   "execution_mode": "pod", "agenthost_origin": origin, "owner": "alice"}),
        )
        .await;
        let gate = pod_gate(&srv, listener, &child, Duration::from_millis(250));
        let rid = request_id();
        waiting.push(gate.arm(PodArm::new(&rid, &child.id, tool).timeout(Duration::from_secs(60))));
        rids.push(rid);
        pods.push((child, gate));
    }
    let inline = create(
        &srv,
        json!({"kind": "child", "parent_run_id": coordinator.id, "subtask_id": 3, "owner": "alice"}),
    )
    .await;
    // Both cards on the coordinator, each naming its child.
    let coord = until(&srv, &coordinator.id, |e| {
        of_type(e, "coordinator.child_approval_required").len() == 2
    })
    .await;
    for ((child, _), rid) in pods.iter().zip(&rids) {
        let mirror: Vec<&Value> = of_type(&coord, "coordinator.child_approval_required")
            .into_iter()
            .filter(|e| e["requestId"] == json!(rid))
            .collect::<Vec<_>>();
        assert_eq!(mirror.len(), 1, "{:?}", types(&coord));
        assert_eq!(mirror[0]["childRunId"], json!(child.id));
    }
    let listed = pending(&srv).await;
    for rid in &rids {
        assert!(
            listed
                .iter()
                .any(|c| c["request_id"] == json!(rid) && c["held_by"] == "pod"),
            "{listed:?}"
        );
    }
    // Past the stall timeout: the inline child is failed, the pod children are not.
    let failed = until(&srv, &inline.id, |e| {
        e.iter().any(|e| e["type"] == "run_failed")
    })
    .await;
    let last = failed.last().unwrap();
    assert_eq!(
        (last["type"].as_str(), last["reason"].as_str()),
        (Some("run_failed"), Some("agent_stall_timeout"))
    );
    tokio::time::sleep(Duration::from_millis(2000)).await;
    for (child, _) in &pods {
        let seen = events(&srv, &child.id).await;
        assert!(!types(&seen).contains(&"run_failed"), "{:?}", types(&seen));
    }
    let coord = events(&srv, &coordinator.id).await;
    let stalls = of_type(&coord, "coordinator.child_stall_detected");
    assert_eq!(stalls.len(), 1, "{:?}", types(&coord));
    assert_eq!(stalls[0]["childRunId"], json!(inline.id));

    // Decisions posted on the coordinator: each lands on its pod, once, however often sent.
    let asked = [
        ("tool-approvals", "alice", "approved"),
        ("tool-denials", "bob", "denied"),
    ];
    for _ in 0..2 {
        for (((verb, who, state), rid), (child, _)) in asked.iter().zip(&rids).zip(&pods) {
            let (status, v) =
                decide(&srv, verb, &coordinator.id, who, json!({"request_id": rid})).await;
            assert_eq!(
                (status, v["state"].as_str()),
                (StatusCode::OK, Some(*state)),
                "{v}"
            );
            assert_eq!(v["run_id"], json!(child.id));
        }
    }
    let mut outcomes = Vec::new();
    for w in waiting {
        outcomes.push(decided(w).await);
    }
    assert_eq!(
        outcomes,
        vec![
            PodDecision::Approved {
                scope: Scope::Once,
                auto: false
            },
            PodDecision::Denied
        ]
    );
    for ((child, _), rid) in pods.iter().zip(&rids) {
        let seen = events(&srv, &child.id).await;
        let resolved = of_type(&seen, "tool.approval_resolved");
        assert_eq!(resolved.len(), 1, "{:?}", types(&seen));
        assert_eq!(resolved[0]["requestId"], json!(rid));
    }
    let coord = events(&srv, &coordinator.id).await;
    let mirrored = of_type(&coord, "coordinator.child_approval_resolved");
    assert_eq!(mirrored.len(), 2, "{:?}", types(&coord));
    assert!(pending(&srv)
        .await
        .iter()
        .all(|c| !rids.contains(&c["request_id"].as_str().unwrap_or_default().to_owned())));
}

/// The pod's word alone grants nothing: an approval it reports but this forward did not
/// apply (a late or repeated forward; its earlier decision won) is 200 with the pod's
/// terminal state, attributed to nobody Tollgate knows (`agenthost`), announced once and
/// with no policy, on an announced card and on one Tollgate never saw. A decision
/// forwarded on a card Tollgate never saw keeps the card as it ended, so the pod's late
/// announcement of it (and its heartbeats) write nothing.
async fn the_pods_word_alone_approves_nothing(backend: Backend) {
    let srv = server(backend, Duration::from_secs(20), Duration::from_secs(300)).await;
    // A pod that answers every decision "approved earlier, not by you".
    let (listener, origin) = listen().await;
    let hits = Arc::new(AtomicUsize::new(0));
    let app = {
        let hits = hits.clone();
        let answer = move || {
            let hits = hits.clone();
            async move {
                hits.fetch_add(1, Ordering::SeqCst);
                axum::Json(
                    json!({"resolved": true, "applied": false, "state": "approved",
                                  "toolName": "wire_transfer"}),
                )
            }
        };
        axum::Router::new()
            .route("/tool-approvals", axum::routing::post(answer.clone()))
            .route("/tool-denials", axum::routing::post(answer))
    };
    serve(listener, app);
    let run = create(
        &srv,
        json!({"execution_mode": "pod", "agenthost_origin": origin, "owner": "alice"}),
    )
    .await;
    let append = |event: Value| {
        let (srv, run) = (&srv, &run);
        async move {
            srv.post(
                &format!("/api/runs/{}/events", run.id),
                &run.token,
                &json!({"events": [event]}),
            )
            .await
        }
    };
    // An announced card, denied by an operator: the pod says "approved" without having
    // applied it — the pod's terminal state is recorded, by nobody Tollgate knows, with
    // no policy; the repeat answers the same and announces nothing more.
    let rid = request_id();
    let (status, v) = append(json!({"type": "tool.approval_required", "requestId": rid,
                                    "toolName": "wire_transfer"}))
    .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    for (verb, scope) in [("tool-denials", None), ("tool-approvals", Some("tool"))] {
        let mut body = json!({"request_id": rid});
        if let Some(scope) = scope {
            body["scope"] = scope.into();
        }
        let (status, v) = decide(&srv, verb, &run.id, "alice", body).await;
        assert_eq!(
            (status, v["state"].as_str(), v["decided_by"].as_str()),
            (StatusCode::OK, Some("approved"), Some("agenthost")),
            "{verb}: {v}"
        );
        assert!(v.get("grant").is_none(), "{verb}: no standing grant: {v}");
    }
    // The repeat found the card ended: only the first was forwarded.
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    let (status, card) = srv
        .get(
            &format!("/api/runs/{}/approval-requests/{rid}", run.id),
            &run.token,
        )
        .await;
    assert_eq!(
        (status, card["state"].as_str()),
        (StatusCode::OK, Some("approved")),
        "{card}"
    );
    // A card Tollgate never saw: the same, recorded as the pod's state.
    let unseen = request_id();
    for _ in 0..2 {
        let (status, v) = decide(
            &srv,
            "tool-approvals",
            &run.id,
            "alice",
            json!({"request_id": unseen}),
        )
        .await;
        assert_eq!(
            (status, v["state"].as_str()),
            (StatusCode::OK, Some("approved")),
            "{v}"
        );
        assert!(v.get("grant").is_none(), "{v}");
    }
    let seen = events(&srv, &run.id).await;
    let resolved = of_type(&seen, "tool.approval_resolved");
    assert_eq!(
        resolved
            .iter()
            .filter(|e| e["requestId"] == json!(rid))
            .count(),
        1,
        "{:?}",
        types(&seen)
    );
    assert_eq!(
        resolved
            .iter()
            .filter(|e| e["requestId"] == json!(unseen))
            .count(),
        1,
        "{:?}",
        types(&seen)
    );
    let (status, policies) = srv.get("/api/policies", &srv.operator_token).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !policies["policies"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["origin_run_id"] == json!(run.id)),
        "the pod's word wrote no policy: {policies}"
    );

    // A real pod (the client's, not announcing): a denial forwarded on a card Tollgate
    // never saw is kept as the card ended; the pod's late announcement of it, and a
    // heartbeat, write nothing.
    let (listener, origin) = listen().await;
    let run = create(
        &srv,
        json!({"execution_mode": "pod", "agenthost_origin": origin, "owner": "alice"}),
    )
    .await;
    let gate = PodGate::new(run.credential.as_deref().unwrap());
    serve(listener, gate.routes());
    let rid = request_id();
    let waiting = gate.arm(PodArm::new(&rid, &run.id, "web_fetch"));
    let (status, v) = decide(
        &srv,
        "tool-denials",
        &run.id,
        "bob",
        json!({"request_id": rid}),
    )
    .await;
    assert_eq!(
        (status, v["state"].as_str()),
        (StatusCode::OK, Some("denied")),
        "{v}"
    );
    assert_eq!(decided(waiting).await, PodDecision::Denied);
    for (event, reason) in [
        (
            json!({"type": "tool.approval_required", "requestId": rid, "toolName": "web_fetch",
                "url": "https://example.com"}),
            "card_resolved",
        ),
        (
            json!({"type": "tool.approval_pending", "requestId": rid}),
            "card_resolved",
        ),
    ] {
        let (status, v) = srv
            .post(
                &format!("/api/runs/{}/events", run.id),
                &run.token,
                &json!({"events": [event]}),
            )
            .await;
        assert_eq!(
            (
                status,
                v["dropped"][0]["reason"].as_str(),
                v["state"].as_str()
            ),
            (StatusCode::OK, Some(reason), Some("denied")),
            "{v}"
        );
    }
    let seen = events(&srv, &run.id).await;
    assert_eq!(
        of_type(&seen, "tool.approval_resolved").len(),
        1,
        "{:?}",
        types(&seen)
    );
    assert!(
        of_type(&seen, "tool.approval_required").is_empty(),
        "{:?}",
        types(&seen)
    );
    assert!(pending(&srv)
        .await
        .iter()
        .all(|c| c["request_id"] != json!(rid)));
}

macro_rules! for_backend {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn pod_gate_announces_its_cards() {
                super::pod_gate_announces_its_cards($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn the_pods_word_alone_approves_nothing() {
                super::the_pods_word_alone_approves_nothing($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn plain_agenthost() {
                super::plain_agenthost($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn coordinator_with_pod_children() {
                super::coordinator_with_pod_children($backend).await
            }
        }
    };
}

for_backend!(memory, Backend::Memory);
for_backend!(dynamo, Backend::Dynamo);
