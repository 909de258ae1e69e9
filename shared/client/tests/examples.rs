//! The examples, run against a real `tollgate serve` process (embedded store; the
//! workspace's `target/debug/tollgate`, which `make test` builds first):
//! `examples/agent.rs` with an operator approving over HTTP, and `examples/pod.rs`
//! serving the decisions Tollgate forwards to it on a loopback port.

mod common;

use std::time::Duration;

use serde_json::{json, Value};
use tollgate_client::pod::{PodDecision, PodGate};
use tollgate_client::Scope;

use common::bounded;
use tollgate_tests::serve::ServeProcess;
use tollgate_tests::TestServer;

/// `tollgate serve` with `env`, and a client of it.
fn serve(env: &[(&str, &str)]) -> (ServeProcess, TestServer) {
    let process = ServeProcess::start(env);
    let srv = TestServer::remote(&process.base);
    (process, srv)
}

#[allow(dead_code)]
#[path = "../examples/agent.rs"]
mod agent;

#[allow(dead_code)]
#[path = "../examples/pod.rs"]
mod pod;

/// An operator that approves every pending card it sees (once) until stopped.
fn approve_everything(srv: &tollgate_tests::TestServer) -> tokio::task::JoinHandle<()> {
    let (base, token) = (srv.base.clone(), srv.operator_token.clone());
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        loop {
            let listing: Value = http
                .get(format!("{base}/api/approvals?state=pending"))
                .bearer_auth(&token)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            for card in listing["approvals"].as_array().unwrap() {
                http.post(format!(
                    "{base}/api/runs/{}/tool-approvals",
                    card["run_id"].as_str().unwrap()
                ))
                .bearer_auth(&token)
                .json(&json!({"request_id": card["request_id"], "scope": "once"}))
                .send()
                .await
                .unwrap();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
}

/// GIVEN the agent example and an operator who approves WHEN it runs against a stub
/// page THEN the fetch ran under the guard (record `completed`) and the run completed.
#[tokio::test]
async fn the_agent_example_asks_fetches_settles_and_completes() {
    bounded(async {
        let (_serve, srv) = serve(&[]);
        let operator = approve_everything(&srv);
        let url = agent::serve_stub().await.unwrap();
        let report = agent::run_agent(&srv.base, &srv.agent_token, &url, Duration::from_secs(30))
            .await
            .unwrap();
        operator.abort();
        assert_eq!(report.decision, "approved");
        assert_eq!(report.mutation_state.as_deref(), Some("completed"));
        assert_eq!(report.http_status, Some(200));
        let events = srv
            .replay_all(&report.run_id, &srv.operator_token, 100)
            .await;
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "run_started",
                "agent.message",
                "tool.call",
                "tool.approval_required",
                "tool.approval_resolved",
                "tool_execution_started",
                "tool_execution",
                "tool.result",
                "run_completed"
            ]
        );
    })
    .await
}

/// GIVEN the agent example and nobody answering THEN the card expires and the run still
/// completes, without any execution.
#[tokio::test]
async fn the_agent_example_handles_expiry() {
    bounded(async {
        let (_serve, srv) = serve(&[]);
        let report = agent::run_agent(
            &srv.base,
            &srv.agent_token,
            "http://127.0.0.1:9/",
            Duration::from_secs(1),
        )
        .await
        .unwrap();
        assert_eq!(report.decision, "expired");
        assert_eq!(report.mutation_state, None);
    })
    .await
}

/// GIVEN the pod example serving on a loopback port for a pod-per-run run WHEN the
/// operator approves its card through Tollgate (which knows nothing of it and forwards
/// the decision with the run's pod credential) with scope tool THEN the first call
/// resumes approved, the second is bridged, and the run's stream tells the decision once.
#[tokio::test]
async fn the_pod_example_serves_forwarded_decisions() {
    bounded(async {
        let (_serve, srv) = serve(&[("TOLLGATE_ALLOW_LOOPBACK_ORIGINS", "1")]);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://{}", listener.local_addr().unwrap());
        let (status, run) = srv
            .post(
                "/api/runs",
                &srv.agent_token,
                &json!({"execution_mode": "pod", "agenthost_origin": origin, "owner": "alice"}),
            )
            .await;
        assert_eq!(status.as_u16(), 201, "{run}");
        let run_id = run["run_id"].as_str().unwrap().to_owned();
        let gate = PodGate::new(run["agenthost_credential"].as_str().unwrap());
        tokio::spawn(pod::serve(listener, gate.clone()));
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        let demo = {
            let (gate, run_id) = (gate.clone(), run_id.clone());
            tokio::spawn(async move {
                pod::demo(&gate, &run_id, Duration::from_secs(30), move |rid| {
                    let _ = tx.send(rid.to_owned());
                })
                .await
            })
        };
        let request_id = rx.recv().await.unwrap();
        let alice = srv
            .auth
            .mint_jwt("alice", tollgate_api::Role::Operator, 600, None);
        let (status, answer) = srv
            .post(
                &format!("/api/runs/{run_id}/tool-approvals"),
                &alice,
                &json!({"request_id": request_id, "scope": "tool", "tool_name": "web_fetch"}),
            )
            .await;
        assert_eq!(status.as_u16(), 200, "{answer}");
        assert_eq!(answer["state"], "approved");
        assert_eq!(answer["decided_by"], "alice");
        let (first, second) = demo.await.unwrap();
        assert_eq!(
            first,
            PodDecision::Approved {
                scope: Scope::Tool,
                auto: false
            }
        );
        assert_eq!(
            second,
            PodDecision::Approved {
                scope: Scope::Tool,
                auto: true
            }
        );
        let events = srv.replay_all(&run_id, &srv.operator_token, 100).await;
        let resolved: Vec<_> = events
            .iter()
            .filter(|e| e["type"] == "tool.approval_resolved")
            .collect();
        assert_eq!(resolved.len(), 1, "{events:?}");
        assert_eq!(resolved[0]["requestId"], json!(request_id));
    })
    .await
}
