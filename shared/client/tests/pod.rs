//! The pod side over HTTP on a loopback port: every answer row Tollgate's forwarding
//! maps (seed 003 "Pod-per-run forwarding", docs/architecture.md §8), and the in-pod bridge.

mod common;

use std::time::Duration;

use serde_json::{json, Value};
use tollgate_client::pod::{PodArm, PodDecision, PodGate};
use tollgate_client::Scope;

use common::bounded;

const CREDENTIAL: &str = "per-run-credential-0123456789";

struct Pod {
    base: String,
    gate: PodGate,
    http: reqwest::Client,
}

impl Pod {
    async fn start() -> Self {
        let gate = PodGate::new(CREDENTIAL);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new().merge(gate.routes());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            base,
            gate,
            http: reqwest::Client::new(),
        }
    }

    async fn post_as(&self, token: Option<&str>, path: &str, body: Value) -> (u16, Value) {
        let mut req = self.http.post(format!("{}{path}", self.base)).json(&body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        self.post_as(Some(CREDENTIAL), path, body).await
    }

    async fn approve(&self, run_id: &str, request_id: &str, scope: &str) -> (u16, Value) {
        self.post(
            "/tool-approvals",
            json!({"runId": run_id, "requestId": request_id, "scope": scope}),
        )
        .await
    }

    async fn deny(&self, run_id: &str, request_id: &str) -> (u16, Value) {
        self.post(
            "/tool-denials",
            json!({"runId": run_id, "requestId": request_id}),
        )
        .await
    }

    async fn card(&self, request_id: &str) -> (u16, Value) {
        let resp = self
            .http
            .get(format!("{}/tool-approvals/{request_id}", self.base))
            .bearer_auth(CREDENTIAL)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap())
    }
}

/// GIVEN a pending card WHEN Tollgate forwards an approval THEN 200 applied:true with
/// the scope, and the waiting call resumes approved.
#[tokio::test]
async fn a_pending_card_approved_now_is_applied() {
    bounded(async {
        let pod = Pod::start().await;
        let pending = pod
            .gate
            .arm(PodArm::new("req-1", "run-1", "web_fetch").url("https://example.com"));
        let (status, body) = pod.approve("run-1", "req-1", "once").await;
        assert_eq!(status, 200);
        assert_eq!(
            body,
            json!({"runId": "run-1", "requestId": "req-1", "toolName": "web_fetch",
                   "state": "approved", "applied": true, "resolved": true, "expired": false,
                   "scope": "once"})
        );
        assert_eq!(
            pending.await,
            PodDecision::Approved {
                scope: Scope::Once,
                auto: false
            }
        );
        let (status, card) = pod.card("req-1").await;
        assert_eq!(status, 200);
        assert_eq!(card["state"], "approved");
        assert_eq!(card["toolName"], "web_fetch");
        assert_eq!(card["url"], "https://example.com");
    })
    .await
}

/// GIVEN a pending card WHEN a denial is forwarded THEN 200 denied, applied:true.
#[tokio::test]
async fn a_pending_card_denied_now_is_applied() {
    bounded(async {
        let pod = Pod::start().await;
        let pending = pod.gate.arm(PodArm::new("req-1", "run-1", "web_fetch"));
        let (status, body) = pod.deny("run-1", "req-1").await;
        assert_eq!(status, 200);
        assert_eq!(body["state"], "denied");
        assert_eq!(body["applied"], true);
        assert!(body.get("scope").is_none());
        assert_eq!(pending.await, PodDecision::Denied);
    })
    .await
}

/// GIVEN a card already ended (denied; expired) WHEN another decision is forwarded THEN
/// 200 with the real state and applied:false — never a second decision.
#[tokio::test]
async fn a_terminal_card_answers_its_state_unapplied() {
    bounded(async {
        let pod = Pod::start().await;
        let _waiting = pod.gate.arm(PodArm::new("req-1", "run-1", "web_fetch"));
        pod.deny("run-1", "req-1").await;
        let (status, body) = pod.approve("run-1", "req-1", "tool").await;
        assert_eq!(status, 200);
        assert_eq!(body["state"], "denied");
        assert_eq!(body["applied"], false);
        // Denied, so the tool scope installed nothing.
        assert_eq!(
            pod.gate
                .arm(PodArm::new("req-2", "run-1", "web_fetch"))
                .decided(),
            None
        );

        let short = pod
            .gate
            .arm(PodArm::new("req-3", "run-1", "web_fetch").timeout(Duration::from_millis(200)));
        assert_eq!(short.await, PodDecision::Expired);
        let (status, body) = pod.approve("run-1", "req-3", "once").await;
        assert_eq!(status, 200);
        assert_eq!(body["state"], "expired");
        assert_eq!(body["expired"], true);
        assert_eq!(body["applied"], false);
    })
    .await
}

/// GIVEN no such card, or a runId that is not the card's run THEN 404 unknown.
#[tokio::test]
async fn unknown_cards_and_other_runs_are_404_unknown() {
    bounded(async {
        let pod = Pod::start().await;
        let _waiting = pod.gate.arm(PodArm::new("req-1", "run-1", "web_fetch"));
        for (status, body) in [
            pod.approve("run-1", "nope", "once").await,
            pod.deny("run-1", "nope").await,
            pod.approve("run-2", "req-1", "once").await,
            pod.deny("run-2", "req-1").await,
            pod.card("nope").await,
        ] {
            assert_eq!(status, 404);
            assert_eq!(body["state"], "unknown");
        }
        // The card was not touched by the other run's decision.
        assert_eq!(pod.card("req-1").await.1["state"], "pending");
    })
    .await
}

/// GIVEN a pending card whose run has ended THEN 409 pending (Tollgate: retry later).
#[tokio::test]
async fn a_card_that_cannot_be_decided_now_is_409_pending() {
    bounded(async {
        let pod = Pod::start().await;
        let _waiting = pod.gate.arm(PodArm::new("req-1", "run-1", "web_fetch"));
        pod.gate.end_run("run-1");
        let (status, body) = pod.approve("run-1", "req-1", "once").await;
        assert_eq!(status, 409);
        assert_eq!(
            body,
            json!({"error": "Run is not active.", "state": "pending"})
        );
        assert_eq!(pod.deny("run-1", "req-1").await.0, 409);
        assert_eq!(pod.card("req-1").await.1["state"], "pending");
    })
    .await
}

/// GIVEN a missing or wrong bearer THEN 401 on every route, and nothing is decided.
#[tokio::test]
async fn bad_or_missing_bearer_is_401() {
    bounded(async {
        let pod = Pod::start().await;
        let _waiting = pod.gate.arm(PodArm::new("req-1", "run-1", "web_fetch"));
        let body = json!({"runId": "run-1", "requestId": "req-1", "scope": "once"});
        for token in [None, Some("wrong"), Some("per-run-credential-012345678")] {
            for path in ["/tool-approvals", "/tool-denials"] {
                let (status, _) = pod.post_as(token, path, body.clone()).await;
                assert_eq!(status, 401, "{token:?} {path}");
            }
        }
        let resp = pod
            .http
            .get(format!("{}/tool-approvals/req-1", pod.base))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 401);
        assert_eq!(pod.card("req-1").await.1["state"], "pending");
    })
    .await
}

/// GIVEN malformed bodies THEN 400.
#[tokio::test]
async fn malformed_bodies_are_400() {
    bounded(async {
        let pod = Pod::start().await;
        for body in [
            json!({"runId": "run-1"}),
            json!({"requestId": "r"}),
            json!([1]),
        ] {
            assert_eq!(pod.post("/tool-approvals", body).await.0, 400);
        }
        let resp = pod
            .http
            .post(format!("{}/tool-denials", pod.base))
            .bearer_auth(CREDENTIAL)
            .body("not json")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 400);
    })
    .await
}

/// GIVEN an approval with scope tool THEN the next arm of the same tool on the run is
/// approved at once (bridge), another tool still prompts; `always` reaches other runs
/// of the pod for the same tool.
#[tokio::test]
async fn scoped_approvals_install_the_in_pod_bridge() {
    bounded(async {
        let pod = Pod::start().await;
        let first = pod.gate.arm(PodArm::new("req-1", "run-1", "web_fetch"));
        let (_, body) = pod.approve("run-1", "req-1", "tool").await;
        assert_eq!(body["scope"], "tool");
        assert!(
            first.await
                == PodDecision::Approved {
                    scope: Scope::Tool,
                    auto: false
                }
        );

        let next = pod.gate.arm(PodArm::new("req-2", "run-1", "web_fetch"));
        assert_eq!(
            next.await,
            PodDecision::Approved {
                scope: Scope::Tool,
                auto: true
            }
        );
        let (_, card) = pod.card("req-2").await;
        assert_eq!(card["state"], "approved");
        assert_eq!(card["autoApproved"], true);
        // A later forward of the bridged card's decision is not applied.
        assert_eq!(
            pod.approve("run-1", "req-2", "once").await.1["applied"],
            false
        );

        let other_tool = pod.gate.arm(PodArm::new("req-3", "run-1", "shell"));
        assert_eq!(other_tool.decided(), None);

        let _w = pod.gate.arm(PodArm::new("req-4", "run-1", "search"));
        pod.approve("run-1", "req-4", "always").await;
        let elsewhere = pod.gate.arm(PodArm::new("req-5", "run-9", "search"));
        assert_eq!(
            elsewhere.await,
            PodDecision::Approved {
                scope: Scope::Always,
                auto: true
            }
        );
    })
    .await
}
