//! Pod-per-run forwarding (docs/architecture.md §8) through Tollgate's HTTP routes, with a real
//! AgentHost pod on loopback: the pod side of `tollgate-client` (`PodGate` and its routes)
//! or, for the broken-pod rows, a pod that answers badly on purpose. Every row of the
//! outcome table asserts the HTTP answer, the run's stream and the stored policies — on
//! the embedded store and on DynamoDB (`dynamo::`, needs an endpoint; `make test` starts
//! DynamoDB Local). The same decision forwarded by two `tollgate serve` processes is in
//! `serve_processes.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tollgate_api::GateConfig;
use tollgate_client::pod::{PodArm, PodDecision, PodGate};
use tollgate_client::Scope;
use tollgate_tests::pods::{decide, listen, policies, request_id, serve};
use tollgate_tests::{store_for, until_served, Backend, TestServer};

/// A server whose pods may live on loopback, forwarding with `timeout`.
async fn server(backend: Backend, timeout: Duration) -> TestServer {
    TestServer::with_deps(TestServer::deps(
        store_for(backend).await,
        GateConfig {
            allow_loopback_origins: true,
            forward_timeout: timeout,
            ..GateConfig::default()
        },
    ))
    .await
}

struct PodRun {
    run_id: String,
    run_token: String,
    credential: String,
}

/// A pod run owned by `owner` at `origin`, with the credential Tollgate hands its pod.
async fn pod_run(srv: &TestServer, origin: &str, owner: &str) -> PodRun {
    let (status, created) = srv
        .post(
            "/api/runs",
            &srv.agent_token,
            &json!({"execution_mode": "pod", "agenthost_origin": origin, "owner": owner}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let credential = created["agenthost_credential"]
        .as_str()
        .expect("a pod run's creation hands out the pod credential")
        .to_owned();
    assert_eq!(credential.len(), 64, "{credential}");
    PodRun {
        run_id: created["run_id"].as_str().unwrap().to_owned(),
        run_token: created["run_token"].as_str().unwrap().to_owned(),
        credential,
    }
}

/// A `PodGate` pod serving on `listener` with the run's credential.
fn pod(listener: TcpListener, credential: &str) -> (PodGate, tokio::task::JoinHandle<()>) {
    let gate = PodGate::new(credential);
    let task = serve(listener, gate.routes());
    (gate, task)
}

/// `who` approves card `rid` of `run_id` with `scope` through Tollgate.
async fn approve(
    srv: &TestServer,
    run_id: &str,
    who: &str,
    rid: &str,
    scope: &str,
) -> (StatusCode, Value) {
    let mut body = json!({"request_id": rid, "scope": scope});
    if scope != "once" {
        body["tool_name"] = "web_fetch".into();
    }
    decide(srv, "tool-approvals", run_id, who, body).await
}

/// The run's `tool.approval_resolved` events.
async fn resolved(srv: &TestServer, run_id: &str) -> Vec<Value> {
    srv.replay_all(run_id, &srv.operator_token, 100)
        .await
        .into_iter()
        .filter(|e| e["type"] == "tool.approval_resolved")
        .collect()
}

async fn decided(pending: tollgate_client::pod::PendingApproval) -> PodDecision {
    tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("the pod's waiting call resumes")
}

/// Pod 200, applied: an owner's `tool` approval → 200, the waiting call resumes approved,
/// one `tool.approval_resolved` by that operator, one durable `tool` policy; the same
/// decision forwarded again answers the same and writes nothing more.
async fn applied_approval(backend: Backend) {
    let srv = server(backend, Duration::from_secs(10)).await;
    let (listener, origin) = listen().await;
    let run = pod_run(&srv, &origin, "alice").await;
    let (gate, _pod) = pod(listener, &run.credential);
    let rid = request_id();
    let pending = gate.arm(PodArm::new(&rid, &run.run_id, "web_fetch"));
    let (status, answer) = approve(&srv, &run.run_id, "alice", &rid, "tool").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer,
        json!({"run_id": run.run_id, "request_id": rid, "approved": true, "resolved": true,
               "state": "approved", "expired": false, "decided_by": "alice", "scope": "tool",
               "grant": {"tool_name": "web_fetch", "scope": "tool"}})
    );
    assert_eq!(
        decided(pending).await,
        PodDecision::Approved {
            scope: Scope::Tool,
            auto: false
        }
    );
    for _ in 0..2 {
        let (status, again) = approve(&srv, &run.run_id, "alice", &rid, "tool").await;
        assert_eq!(status, StatusCode::OK, "{again}");
        assert_eq!(again["state"], "approved");
        assert_eq!(again["approved"], true);
    }
    let events = resolved(&srv, &run.run_id).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["requestId"], json!(rid));
    assert_eq!(events[0]["runId"], json!(run.run_id));
    assert_eq!(events[0]["approved"], true);
    assert_eq!(events[0]["expired"], false);
    assert_eq!(events[0]["decidedBy"], "alice");
    assert_eq!(events[0]["scope"], "tool");
    let granted = policies(&srv, &run.run_id).await;
    assert_eq!(granted.len(), 1, "{granted:#?}");
    assert_eq!(granted[0]["tool_name"], "web_fetch");
    assert_eq!(granted[0]["scope"], "tool");
    assert_eq!(granted[0]["granted_by"], "alice");
}

/// Pod 200, applied denial → 200 `denied`, one resolved event (not approved), no policy.
async fn applied_denial(backend: Backend) {
    let srv = server(backend, Duration::from_secs(10)).await;
    let (listener, origin) = listen().await;
    let run = pod_run(&srv, &origin, "alice").await;
    let (gate, _pod) = pod(listener, &run.credential);
    let rid = request_id();
    let pending = gate.arm(PodArm::new(&rid, &run.run_id, "web_fetch"));
    let (status, answer) = decide(
        &srv,
        "tool-denials",
        &run.run_id,
        "bob",
        json!({"request_id": rid}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer,
        json!({"run_id": run.run_id, "request_id": rid, "denied": true, "resolved": true,
               "state": "denied", "expired": false, "decided_by": "bob"})
    );
    assert_eq!(decided(pending).await, PodDecision::Denied);
    let events = resolved(&srv, &run.run_id).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(
        (&events[0]["approved"], &events[0]["decidedBy"]),
        (&json!(false), &json!("bob"))
    );
    assert!(policies(&srv, &run.run_id).await.is_empty());
}

/// Pod 200, not applied (the card had expired in the pod) → 200 `expired`, one resolved
/// event saying so, no policy, although the click asked for `tool`.
async fn ended_in_the_pod(backend: Backend) {
    let srv = server(backend, Duration::from_secs(10)).await;
    let (listener, origin) = listen().await;
    let run = pod_run(&srv, &origin, "alice").await;
    let (gate, _pod) = pod(listener, &run.credential);
    let rid = request_id();
    let pending =
        gate.arm(PodArm::new(&rid, &run.run_id, "web_fetch").timeout(Duration::from_millis(50)));
    assert_eq!(decided(pending).await, PodDecision::Expired);
    let (status, answer) = approve(&srv, &run.run_id, "alice", &rid, "tool").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        (&answer["state"], &answer["approved"], &answer["expired"]),
        (&json!("expired"), &json!(false), &json!(true))
    );
    assert!(answer.get("decided_by").is_none(), "{answer}");
    let events = resolved(&srv, &run.run_id).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(
        (&events[0]["approved"], &events[0]["expired"]),
        (&json!(false), &json!(true))
    );
    assert!(policies(&srv, &run.run_id).await.is_empty());
}

/// Pod 404 → 404 `unknown`; pod 409 `pending` (its run ended) → 409 `pending`; a pod 409
/// saying anything else → 503 `agenthost_unreachable`; none writes.
async fn unknown_and_pending(backend: Backend) {
    let srv = server(backend, Duration::from_secs(10)).await;
    let (listener, origin) = listen().await;
    let run = pod_run(&srv, &origin, "alice").await;
    let (gate, _pod) = pod(listener, &run.credential);
    let (status, answer) = decide(
        &srv,
        "tool-approvals",
        &run.run_id,
        "alice",
        json!({"request_id": request_id(), "scope": "once"}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert_eq!(answer["state"], "unknown");

    let rid = request_id();
    let pending = gate.arm(PodArm::new(&rid, &run.run_id, "web_fetch"));
    gate.end_run(&run.run_id);
    for verb in ["tool-approvals", "tool-denials"] {
        let (status, answer) =
            decide(&srv, verb, &run.run_id, "alice", json!({"request_id": rid})).await;
        assert_eq!(status, StatusCode::CONFLICT, "{answer}");
        assert_eq!(answer["state"], "pending");
    }
    assert_eq!(gate.card(&rid).unwrap()["state"], "pending");
    assert!(resolved(&srv, &run.run_id).await.is_empty());
    assert!(policies(&srv, &run.run_id).await.is_empty());
    drop(pending);

    // A 409 that is not `pending` (AgentHost's `run_mismatch`: a misrouted decision) is
    // an answer nothing can be done with: 503 `agenthost_unreachable`, nothing written.
    for body in [
        r#"{"state":"run_mismatch","error":"run_mismatch"}"#,
        "{}",
        "not json",
    ] {
        let (listener, origin) = listen().await;
        let run = pod_run(&srv, &origin, "alice").await;
        let (hits, _pod) = broken_pod(listener, 409, body, Duration::ZERO);
        let (status, answer) = decide(
            &srv,
            "tool-denials",
            &run.run_id,
            "alice",
            json!({"request_id": request_id()}),
        )
        .await;
        assert_eq!(
            (status, answer["state"].as_str()),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Some("agenthost_unreachable")
            ),
            "{body}: {answer}"
        );
        assert_eq!(hits.load(Ordering::SeqCst), 1);
        assert!(resolved(&srv, &run.run_id).await.is_empty());
    }
}

/// A pod that answers every decision with `status` and `body` after `delay`, counting
/// the decisions it got; it serves every card's context as a `web_fetch` card.
fn broken_pod(
    listener: TcpListener,
    status: u16,
    body: impl Into<String>,
    delay: Duration,
) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    broken_pod_of(listener, status, body, delay, Some("web_fetch"))
}

/// [`broken_pod`] whose `GET /tool-approvals/{id}` names `context_tool` (or no tool).
fn broken_pod_of(
    listener: TcpListener,
    status: u16,
    body: impl Into<String>,
    delay: Duration,
    context_tool: Option<&str>,
) -> (Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let context = match context_tool {
        Some(tool) => json!({"state": "pending", "toolName": tool}),
        None => json!({"state": "pending"}),
    };
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let body: String = body.into();
    let answer = move || {
        let (counter, body) = (counter.clone(), body.clone());
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(delay).await;
            (
                axum::http::StatusCode::from_u16(status).unwrap(),
                [("content-type", "application/json")],
                body,
            )
        }
    };
    let app = axum::Router::new()
        .route("/tool-approvals", post(answer.clone()))
        .route("/tool-denials", post(answer))
        .route(
            "/tool-approvals/{request_id}",
            axum::routing::get(move || {
                let context = context.clone();
                async move { axum::Json(context) }
            }),
        );
    (hits, serve(listener, app))
}

/// Asserts a 503 `agenthost_unreachable` answer and that nothing was written.
async fn assert_unreachable(srv: &TestServer, run_id: &str, rid: &str, row: &str) {
    for (verb, body) in [
        (
            "tool-approvals",
            json!({"request_id": rid, "scope": "tool", "tool_name": "web_fetch"}),
        ),
        ("tool-denials", json!({"request_id": rid})),
    ] {
        let (status, answer) = decide(srv, verb, run_id, "alice", body).await;
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{row} ({verb}): {answer}"
        );
        assert_eq!(answer["state"], "agenthost_unreachable", "{row}: {answer}");
        assert!(answer["error"].as_str().is_some(), "{row}: {answer}");
    }
    assert!(resolved(srv, run_id).await.is_empty(), "{row}");
    assert!(policies(srv, run_id).await.is_empty(), "{row}");
}

/// Every way a pod can fail → 503 `agenthost_unreachable`, nothing written: nobody
/// listening, no answer within the timeout, 5xx, a 200 that is not JSON, a 200 for
/// another run or request, one that says it is not resolved, and a pod that refuses the
/// credential (401).
async fn unreachable_rows(backend: Backend) {
    let srv = server(backend, Duration::from_millis(500)).await;
    let rid = request_id();

    // Nobody listens at the origin any more.
    let (listener, origin) = listen().await;
    let run = pod_run(&srv, &origin, "alice").await;
    drop(listener);
    assert_unreachable(&srv, &run.run_id, &rid, "nobody listening").await;

    // Bodies name RUN and REQ, replaced by the row's run and request: each row but the
    // one it tests is a well-formed terminal answer for this very card.
    let terminal = r#"{"runId":"RUN","requestId":"REQ","state":"approved","applied":true,"scope":"tool","toolName":"web_fetch"}"#;
    let rows: [(&str, u16, &str, Duration); 8] = [
        ("timeout", 200, terminal, Duration::from_secs(3)),
        ("500", 500, terminal, Duration::ZERO),
        ("502 empty", 502, "", Duration::ZERO),
        ("invalid JSON", 200, "approved!", Duration::ZERO),
        (
            "another run",
            200,
            r#"{"runId":"run-other","requestId":"REQ","state":"approved","applied":true,"scope":"tool","toolName":"web_fetch"}"#,
            Duration::ZERO,
        ),
        (
            "another request",
            200,
            r#"{"runId":"RUN","requestId":"other","state":"approved","applied":true,"scope":"tool","toolName":"web_fetch"}"#,
            Duration::ZERO,
        ),
        (
            "not resolved",
            200,
            r#"{"resolved":false,"state":"approved","applied":true,"scope":"tool","toolName":"web_fetch"}"#,
            Duration::ZERO,
        ),
        (
            "not terminal",
            200,
            r#"{"runId":"RUN","requestId":"REQ","state":"pending"}"#,
            Duration::ZERO,
        ),
    ];
    for (row, status, body, delay) in rows {
        let (listener, origin) = listen().await;
        let run = pod_run(&srv, &origin, "alice").await;
        let body = body.replace("RUN", &run.run_id).replace("REQ", &rid);
        let (hits, _pod) = broken_pod(listener, status, body, delay);
        assert_unreachable(&srv, &run.run_id, &rid, row).await;
        assert_eq!(hits.load(Ordering::SeqCst), 2, "{row}: the pod was asked");
    }

    // A pod that holds the card but not this run's credential: 401 → 503, card pending.
    let (listener, origin) = listen().await;
    let run = pod_run(&srv, &origin, "alice").await;
    let (gate, _pod) = pod(listener, "not-the-run-credential");
    let pending = gate.arm(PodArm::new(&rid, &run.run_id, "web_fetch"));
    assert_unreachable(&srv, &run.run_id, &rid, "401").await;
    assert_eq!(gate.card(&rid).unwrap()["state"], "pending");
    drop(pending);
}

/// A `once` approval applied first, then the owner's late `tool` approval of the same
/// card: both 200 `approved`, one resolved event (by the first operator), no policy.
/// Then the same two clicks concurrently, ten times: a policy exists exactly when the
/// pod applied the `tool` click.
async fn once_wins_over_a_late_scope(backend: Backend) {
    let srv = server(backend, Duration::from_secs(10)).await;
    let (listener, origin) = listen().await;
    let run = pod_run(&srv, &origin, "alice").await;
    let (gate, _pod) = pod(listener, &run.credential);
    let rid = request_id();
    let pending = gate.arm(PodArm::new(&rid, &run.run_id, "web_fetch"));
    let (status, first) = approve(&srv, &run.run_id, "bob", &rid, "once").await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let (status, late) = approve(&srv, &run.run_id, "alice", &rid, "tool").await;
    assert_eq!(status, StatusCode::OK, "{late}");
    assert_eq!(late["state"], "approved");
    assert_eq!(
        decided(pending).await,
        PodDecision::Approved {
            scope: Scope::Once,
            auto: false
        }
    );
    let events = resolved(&srv, &run.run_id).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["decidedBy"], "bob");
    assert!(policies(&srv, &run.run_id).await.is_empty());

    for _ in 0..10 {
        let (listener, origin) = listen().await;
        let run = pod_run(&srv, &origin, "alice").await;
        let (gate, _pod) = pod(listener, &run.credential);
        let rid = request_id();
        let pending = gate.arm(PodArm::new(&rid, &run.run_id, "web_fetch"));
        // Racing on one run, either may spend the store's contention budget (503
        // `unavailable`, nothing written): sent again, as a client would.
        let once = until_served("once", || {
            decide(
                &srv,
                "tool-approvals",
                &run.run_id,
                "bob",
                json!({"request_id": rid, "scope": "once"}),
            )
        });
        let tool = until_served("tool", || {
            decide(
                &srv,
                "tool-approvals",
                &run.run_id,
                "alice",
                json!({"request_id": rid, "scope": "tool", "tool_name": "web_fetch"}),
            )
        });
        let ((s1, a1), (s2, a2)) = tokio::join!(once, tool);
        assert_eq!((s1, s2), (StatusCode::OK, StatusCode::OK), "{a1} {a2}");
        let PodDecision::Approved { scope, .. } = decided(pending).await else {
            panic!("approved")
        };
        assert_eq!(resolved(&srv, &run.run_id).await.len(), 1);
        let granted = policies(&srv, &run.run_id).await;
        match scope {
            Scope::Once => assert!(granted.is_empty(), "{granted:#?}"),
            _ => {
                assert_eq!(granted.len(), 1, "{granted:#?}");
                assert_eq!(granted[0]["scope"], "tool");
            }
        }
    }
}

/// One decision forwarded 20 times at once: every answer 200 `approved`, the pod applied
/// it once, one resolved event, and the one `tool` policy the applying forward carried —
/// also when a forward that did not apply it wrote the event first.
async fn twenty_forwards_resolve_once(backend: Backend) {
    let srv = Arc::new(server(backend, Duration::from_secs(10)).await);
    let (listener, origin) = listen().await;
    let run = pod_run(&srv, &origin, "alice").await;
    let (gate, _pod) = pod(listener, &run.credential);
    let rid = request_id();
    let pending = gate.arm(PodArm::new(&rid, &run.run_id, "web_fetch"));
    let mut clicks = Vec::new();
    for _ in 0..20 {
        let (srv, run_id, rid) = (srv.clone(), run.run_id.clone(), rid.clone());
        clicks.push(tokio::spawn(async move {
            // A forward that spent the contention budget (503 `unavailable`, nothing
            // written) is sent again, as a client would.
            until_served("forward", || {
                decide(
                    &srv,
                    "tool-approvals",
                    &run_id,
                    "alice",
                    json!({"request_id": rid, "scope": "tool", "tool_name": "web_fetch"}),
                )
            })
            .await
        }));
    }
    for click in clicks {
        let (status, answer) = click.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["state"], "approved", "{answer}");
    }
    assert_eq!(
        decided(pending).await,
        PodDecision::Approved {
            scope: Scope::Tool,
            auto: false
        }
    );
    let events = resolved(&srv, &run.run_id).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["approved"], true);
    let granted = policies(&srv, &run.run_id).await;
    assert_eq!(granted.len(), 1, "{granted:#?}");
    assert_eq!(granted[0]["scope"], "tool");
}

/// What is never forwarded: a scope beyond `once` from someone who is not the run's
/// owner (403, the pod is not asked), a decision on an ended run (409), and an unknown
/// card on a run that has no pod (404).
async fn not_forwarded(backend: Backend) {
    let srv = server(backend, Duration::from_secs(10)).await;
    let (listener, origin) = listen().await;
    let run = pod_run(&srv, &origin, "alice").await;
    let (hits, _pod) = broken_pod(listener, 500, "{}", Duration::ZERO);
    let rid = request_id();
    let (status, answer) = approve(&srv, &run.run_id, "bob", &rid, "tool").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    let (inline_run, _) = srv.create_run(json!({"owner": "alice"})).await;
    let (status, answer) = decide(
        &srv,
        "tool-approvals",
        &inline_run,
        "alice",
        json!({"request_id": rid}),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert_eq!(answer["state"], "unknown");
    let (status, done) = srv
        .post(
            &format!("/api/runs/{}/cancel", run.run_id),
            &run.run_token,
            &json!({"reason": "test"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    let (status, answer) = decide(
        &srv,
        "tool-approvals",
        &run.run_id,
        "alice",
        json!({"request_id": rid}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert_eq!(hits.load(Ordering::SeqCst), 0, "the pod was never asked");
    assert!(resolved(&srv, &run.run_id).await.is_empty());
}

/// GIVEN the pod applied the owner's `tool` approval but its answer came too late (the
/// forward timed out: 503, nothing recorded) WHEN the owner clicks again THEN the pod
/// knows that very decision (its `decisionId`) and answers it applied, so Tollgate records
/// one resolved event by the owner and the `tool` policy; another operator's later click
/// changes nothing.
async fn a_lost_answer_is_recovered_by_the_retry(backend: Backend) {
    let srv = server(backend, Duration::from_millis(500)).await;
    let (pod_listener, pod_origin) = listen().await;
    let (proxy_listener, proxy_origin) = listen().await;
    // Tollgate knows the proxy; the proxy passes every request to the pod and holds the
    // first answer back past the forward's timeout.
    let run = pod_run(&srv, &proxy_origin, "alice").await;
    let (gate, _pod) = pod(pod_listener, &run.credential);
    let seen = Arc::new(AtomicUsize::new(0));
    let proxy = {
        let seen = seen.clone();
        axum::Router::new().fallback(
            move |method: axum::http::Method,
                  uri: axum::http::Uri,
                  headers: axum::http::HeaderMap,
                  body: axum::body::Bytes| {
                let (seen, pod_origin) = (seen.clone(), pod_origin.clone());
                async move {
                    let decision = method == axum::http::Method::POST;
                    let url = format!("{pod_origin}{}", uri.path());
                    let mut req = match decision {
                        true => reqwest::Client::new()
                            .post(url)
                            .header("content-type", "application/json")
                            .body(body),
                        false => reqwest::Client::new().get(url),
                    };
                    if let Some(auth) = headers.get("authorization") {
                        req = req.header("authorization", auth.to_str().unwrap());
                    }
                    let resp = req.send().await.unwrap();
                    let status = resp.status().as_u16();
                    let text = resp.text().await.unwrap();
                    // The first decision's answer is held back (reading a card's context
                    // is not).
                    if decision && seen.fetch_add(1, Ordering::SeqCst) == 0 {
                        tokio::time::sleep(Duration::from_secs(2)).await;
                    }
                    (axum::http::StatusCode::from_u16(status).unwrap(), text)
                }
            },
        )
    };
    let _proxy = serve(proxy_listener, proxy);
    let rid = request_id();
    let pending = gate.arm(PodArm::new(&rid, &run.run_id, "web_fetch"));
    let (status, lost) = approve(&srv, &run.run_id, "alice", &rid, "tool").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{lost}");
    assert_eq!(
        decided(pending).await,
        PodDecision::Approved {
            scope: Scope::Tool,
            auto: false
        },
        "the pod applied it"
    );
    assert!(resolved(&srv, &run.run_id).await.is_empty());
    let (status, again) = approve(&srv, &run.run_id, "alice", &rid, "tool").await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["state"], "approved");
    assert_eq!(again["decided_by"], "alice");
    let (status, late) = approve(&srv, &run.run_id, "bob", &rid, "once").await;
    assert_eq!(status, StatusCode::OK, "{late}");
    let events = resolved(&srv, &run.run_id).await;
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0]["decidedBy"], "alice");
    assert_eq!(events[0]["scope"], "tool");
    let granted = policies(&srv, &run.run_id).await;
    assert_eq!(granted.len(), 1, "{granted:#?}");
    assert_eq!(granted[0]["scope"], "tool");
    // Bob's late click is answered from the card the retry recorded: not forwarded.
    assert_eq!(seen.load(Ordering::SeqCst), 2);
}

/// What a pod says is believed no further than the decision sent: a scope beyond `once`
/// needs the card's tool from the pod's context (400 without one or for another tool,
/// 403 for `always` on a tool not eligible; the decision is not sent), a pod that "applied" something else than what was sent is unreachable (503,
/// nothing written), and a pod that applied a scoped approval for another tool than the
/// operator named is unreachable too, and the client's pod refuses a decision naming
/// another tool than its card's (409, nothing applied).
async fn pod_answers_are_held_to_the_decision(backend: Backend) {
    let srv = server(backend, Duration::from_secs(10)).await;
    let rid = request_id();
    let approved = |tool: &str, scope: &str| {
        format!(
            r#"{{"runId":"RUN","requestId":"REQ","state":"approved","applied":true,"scope":"{scope}","toolName":"{tool}"}}"#
        )
    };
    let asked = |run_id: &str, scope: &str, tool: Option<&str>| {
        let mut body = json!({"request_id": rid, "scope": scope});
        if let Some(t) = tool {
            body["tool_name"] = t.into();
        }
        let run_id = run_id.to_owned();
        let srv = &srv;
        async move { decide(srv, "tool-approvals", &run_id, "alice", body).await }
    };

    // Not asked at all: a scope beyond `once` on a card whose context names no tool
    // (400), for another tool than the card's (400), `always` for a tool that is not
    // eligible (403), an empty tool name (400).
    let (listener, origin) = listen().await;
    let run = pod_run(&srv, &origin, "alice").await;
    let (hits, _pod) = broken_pod_of(listener, 200, "{}", Duration::ZERO, None);
    // No tool named by the operator: a standing grant's tool is never the pod's choice.
    let (status, answer) = asked(&run.run_id, "tool", None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("needs tool_name"),
        "{answer}"
    );
    let (status, answer) = asked(&run.run_id, "tool", Some("web_fetch")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert!(
        answer["error"].as_str().unwrap().contains("only once"),
        "{answer}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 0);
    let (listener, origin) = listen().await;
    let run = pod_run(&srv, &origin, "alice").await;
    let (hits, _pod) = broken_pod_of(listener, 200, "{}", Duration::ZERO, Some("shell"));
    let (status, answer) = asked(&run.run_id, "tool", Some("web_fetch")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    let (status, answer) = asked(&run.run_id, "always", Some("shell")).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    let (status, answer) = asked(&run.run_id, "tool", Some("")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(hits.load(Ordering::SeqCst), 0);

    // Answers that do not hold to what was sent: 503, nothing written.
    for (row, verb, body, pod_body) in [
        (
            "a denial answered as approved",
            "tool-denials",
            json!({"request_id": rid}),
            approved("web_fetch", "always"),
        ),
        (
            "another scope applied",
            "tool-approvals",
            json!({"request_id": rid, "scope": "tool", "tool_name": "web_fetch"}),
            approved("web_fetch", "always"),
        ),
        (
            "an approval answered as denied",
            "tool-approvals",
            json!({"request_id": rid, "scope": "once"}),
            r#"{"runId":"RUN","requestId":"REQ","state":"denied","applied":true}"#.to_owned(),
        ),
    ] {
        let (listener, origin) = listen().await;
        let run = pod_run(&srv, &origin, "alice").await;
        let pod_body = pod_body.replace("RUN", &run.run_id).replace("REQ", &rid);
        let (hits, _pod) = broken_pod(listener, 200, pod_body, Duration::ZERO);
        let (status, answer) = decide(&srv, verb, &run.run_id, "alice", body).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{row}: {answer}");
        assert_eq!(answer["state"], "agenthost_unreachable", "{row}");
        assert_eq!(hits.load(Ordering::SeqCst), 1, "{row}");
        assert!(resolved(&srv, &run.run_id).await.is_empty(), "{row}");
        assert!(policies(&srv, &run.run_id).await.is_empty(), "{row}");
    }

    // A pod that says it applied the `tool` approval to a card for another tool than the
    // operator named: 503, nothing written.
    let (listener, origin) = listen().await;
    let run = pod_run(&srv, &origin, "alice").await;
    let pod_body = approved("shell_exec", "tool")
        .replace("RUN", &run.run_id)
        .replace("REQ", &rid);
    let (_hits, _pod) = broken_pod(listener, 200, pod_body, Duration::ZERO);
    let (status, answer) = asked(&run.run_id, "always", Some("web_fetch")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert!(resolved(&srv, &run.run_id).await.is_empty());
    assert!(policies(&srv, &run.run_id).await.is_empty());

    // An honest pod (the client's) holding a `shell` card: a scoped approval naming
    // `web_fetch` is refused against the card's context (400) and applies nothing there;
    // sent to the pod anyway (`once`, naming the tool), the pod refuses it (409 pending).
    // No bridge, no policy, no event.
    let (listener, origin) = listen().await;
    let run = pod_run(&srv, &origin, "alice").await;
    let (gate, _pod) = pod(listener, &run.credential);
    let pending = gate.arm(PodArm::new(&rid, &run.run_id, "shell"));
    let (status, answer) = asked(&run.run_id, "always", Some("web_fetch")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(gate.card(&rid).unwrap()["state"], "pending");
    let (status, answer) = asked(&run.run_id, "once", Some("web_fetch")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert_eq!(answer["state"], "pending");
    assert_eq!(gate.card(&rid).unwrap()["state"], "pending");
    assert!(resolved(&srv, &run.run_id).await.is_empty());
    assert!(policies(&srv, &run.run_id).await.is_empty());
    drop(pending);
}

/// Origins that would make the API a proxy into the network are refused at creation with
/// a 400 that writes nothing: plain http anywhere but loopback, loopback unless allowed,
/// link-local and metadata addresses, private ranges, credentials, paths and queries.
async fn origins_refused_at_creation(backend: Backend) {
    let strict = TestServer::with_deps(TestServer::deps(
        store_for(backend).await,
        GateConfig::default(),
    ))
    .await;
    let lenient = server(backend, Duration::from_secs(10)).await;
    let refused_everywhere = [
        "http://pods.example.com",
        "http://10.0.0.7:8080",
        "https://10.0.0.7",
        "https://192.168.1.20",
        "https://172.16.4.4",
        "https://169.254.169.254",
        "http://169.254.169.254/latest/meta-data",
        "https://[fd00::1]",
        "https://[fe80::1]",
        "https://[::ffff:169.254.169.254]",
        "https://metadata.google.internal",
        "https://metadata.google.internal.",
        "https://100.100.100.200",
        "https://0.0.0.0",
        "https://user:secret@pods.example.com",
        "https://pods.example.com/path",
        "https://pods.example.com?x=1",
        "ftp://pods.example.com",
        "pods.example.com",
        "",
    ];
    for (srv, origins) in [
        (&strict, &refused_everywhere[..]),
        (&lenient, &refused_everywhere[..]),
        (
            &strict,
            &[
                "http://127.0.0.1:8080",
                "http://localhost:8080",
                "https://localhost.",
            ][..],
        ),
    ] {
        for origin in origins {
            let run_id = format!("run-{}", uuid::Uuid::new_v4().simple());
            let (status, answer) = srv
                .post(
                    "/api/runs",
                    &srv.agent_token,
                    &json!({"run_id": run_id, "execution_mode": "pod", "agenthost_origin": origin}),
                )
                .await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{origin}: {answer}");
            assert!(answer["error"].as_str().is_some(), "{origin}: {answer}");
            let (status, _) = srv
                .get(&format!("/api/runs/{run_id}/events"), &srv.operator_token)
                .await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{origin}: nothing written");
        }
    }
    let (status, answer) = strict
        .post(
            "/api/runs",
            &strict.agent_token,
            &json!({"execution_mode": "pod"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "no origin: {answer}");
    let (status, answer) = strict
        .post(
            "/api/runs",
            &strict.agent_token,
            &json!({"execution_mode": "pod", "agenthost_origin": "https://pods.example.com:8443"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let (status, answer) = lenient
        .post(
            "/api/runs",
            &lenient.agent_token,
            &json!({"execution_mode": "pod", "agenthost_origin": "http://127.0.0.1:9"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    let (status, answer) = strict
        .post(
            "/api/runs",
            &strict.agent_token,
            &json!({"agenthost_origin": "https://pods.example.com"}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "an origin without pod mode: {answer}"
    );
    // An inline run gets no pod credential.
    let (status, answer) = strict
        .post("/api/runs", &strict.agent_token, &json!({}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{answer}");
    assert!(answer.get("agenthost_credential").is_none(), "{answer}");
}

/// A plain AgentHost answering as seed 003's pods do: `{resolved, applied, state,
/// toolName, url}`, no ids echoed. Its terminal answer is 200 with one
/// `tool.approval_resolved`; one contradicting the verb while `applied` stays 503 and
/// writes nothing.
async fn agenthost_answers_as_they_are(backend: Backend) {
    let srv = server(backend, Duration::from_secs(5)).await;
    let rid = request_id();
    let (listener, origin) = listen().await;
    let run = pod_run(&srv, &origin, "alice").await;
    let (hits, _pod) = broken_pod(
        listener,
        200,
        r#"{"resolved":true,"applied":true,"state":"denied","toolName":"web_fetch","url":"https://example.com/a"}"#.to_owned(),
        Duration::ZERO,
    );
    let (status, answer) = decide(
        &srv,
        "tool-denials",
        &run.run_id,
        "alice",
        json!({"request_id": rid}),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        (
            answer["state"].as_str(),
            answer["denied"].as_bool(),
            answer["resolved"].as_bool()
        ),
        (Some("denied"), Some(true), Some(true)),
        "{answer}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    let events = resolved(&srv, &run.run_id).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0]["requestId"], json!(rid));
    // The same decision again: answered, still one event.
    let (status, _) = decide(
        &srv,
        "tool-denials",
        &run.run_id,
        "alice",
        json!({"request_id": rid}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(resolved(&srv, &run.run_id).await.len(), 1);

    // The same shape contradicting the verb: an approval the pod says it applied as a
    // denial is not believed.
    let (listener, origin) = listen().await;
    let run = pod_run(&srv, &origin, "alice").await;
    let (_hits, _pod) = broken_pod(
        listener,
        200,
        r#"{"resolved":true,"applied":true,"state":"denied","toolName":"web_fetch"}"#.to_owned(),
        Duration::ZERO,
    );
    let (status, answer) = decide(
        &srv,
        "tool-approvals",
        &run.run_id,
        "alice",
        json!({"request_id": rid, "scope": "once"}),
    )
    .await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{answer}");
    assert!(resolved(&srv, &run.run_id).await.is_empty());
}

macro_rules! for_backend {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn applied_approval() {
                super::applied_approval($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn applied_denial() {
                super::applied_denial($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn agenthost_answers_as_they_are() {
                super::agenthost_answers_as_they_are($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn ended_in_the_pod() {
                super::ended_in_the_pod($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn unknown_and_pending() {
                super::unknown_and_pending($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn unreachable_rows() {
                super::unreachable_rows($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn once_wins_over_a_late_scope() {
                super::once_wins_over_a_late_scope($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn twenty_forwards_resolve_once() {
                super::twenty_forwards_resolve_once($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn not_forwarded() {
                super::not_forwarded($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn pod_answers_are_held_to_the_decision() {
                super::pod_answers_are_held_to_the_decision($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_lost_answer_is_recovered_by_the_retry() {
                super::a_lost_answer_is_recovered_by_the_retry($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn origins_refused_at_creation() {
                super::origins_refused_at_creation($backend).await
            }
        }
    };
}

for_backend!(memory, Backend::Memory);
for_backend!(dynamo, Backend::Dynamo);
