//! Test support: start Tollgate's full HTTP app on a loopback port against either the
//! embedded store or DynamoDB (DynamoDB Local from `make test`, or whatever
//! `AWS_ENDPOINT_URL*` points at), and talk to it the way a client does.

pub mod chaos;
pub mod connections;
pub mod frontend;
pub mod idp;
pub mod lifecycle;
pub mod meter;
pub mod pods;
pub mod routes;
pub mod serve;

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tollgate_api::{Auth, Deps, GateConfig, Role};
use tollgate_store::memory::MemoryStore;
use tollgate_store::{RunStore, Store};

pub const TEST_SECRET: &str = "integration-test-secret-0123456789abcdef";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Dynamo,
}

pub use tollgate_store::contract::{aws_endpoint_configured, dynamo_test_store as dynamo_store};

pub async fn store_for(backend: Backend) -> Arc<dyn Store> {
    match backend {
        Backend::Memory => Arc::new(MemoryStore::new()),
        Backend::Dynamo => Arc::new(dynamo_store().await),
    }
}

/// Instantiates test bodies `async fn(Backend, …)` once per store, at the top of a test
/// binary: `mod memory` on the embedded store and `mod dynamo` on DynamoDB (the tests that
/// need an endpoint are selected by that `dynamo::` prefix). Each entry
/// `name => module::body, extra, args;` becomes `#[tokio::test] async fn name` in both,
/// calling `module::body(backend, extra, args)`; the bodies are resolved from the
/// invoking module.
#[macro_export]
macro_rules! for_each_backend {
    (@tests $backend:expr; $($name:ident => $body:path $(, $arg:expr)*;)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                $body($backend $(, $arg)*).await
            }
        )*
    };
    ($($name:ident => $body:path $(, $arg:expr)*;)*) => {
        mod memory {
            use super::*;
            $crate::for_each_backend!(@tests $crate::Backend::Memory; $($name => $body $(, $arg)*;)*);
        }
        mod dynamo {
            use super::*;
            $crate::for_each_backend!(@tests $crate::Backend::Dynamo; $($name => $body $(, $arg)*;)*);
        }
    };
}

/// A running server plus a client and the means to mint tokens.
pub struct TestServer {
    pub base: String,
    pub http: reqwest::Client,
    pub auth: Arc<Auth>,
    pub agent_token: String,
    pub operator_token: String,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl TestServer {
    pub async fn start(backend: Backend) -> Self {
        Self::with_store(store_for(backend).await).await
    }

    pub async fn with_store(store: Arc<dyn Store>) -> Self {
        Self::with_deps(Self::deps(store, GateConfig::default())).await
    }

    /// The run log served from `runs` (e.g. a wrapper), the gate on `store`.
    pub async fn with_run_store(runs: Arc<dyn RunStore>, store: Arc<dyn Store>) -> Self {
        Self::with_deps(Self::deps(store, GateConfig::default()).with_run_store(runs)).await
    }

    /// Deps as `tollgate serve` builds them (embedded timers), with the test secret.
    pub fn deps(store: Arc<dyn Store>, gate: GateConfig) -> Deps {
        Deps::embedded(store, gate, Auth::new(TEST_SECRET.as_bytes()))
    }

    pub async fn with_deps(deps: Deps) -> Self {
        let auth = deps.auth.clone();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, tollgate_api::app(deps))
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
        Self {
            base,
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(32)
                .build()
                .unwrap(),
            agent_token: auth.mint_jwt("test-agent", Role::Agent, 3600, None),
            operator_token: auth.mint_jwt("test-operator", Role::Operator, 3600, None),
            auth,
            _shutdown: tx,
        }
    }

    /// A client of a server running elsewhere (e.g. a [`serve::ServeProcess`]) that
    /// signs with [`TEST_SECRET`].
    pub fn remote(base: &str) -> Self {
        let auth = Arc::new(Auth::new(TEST_SECRET.as_bytes()));
        Self {
            base: base.to_owned(),
            http: reqwest::Client::builder()
                .pool_max_idle_per_host(32)
                .build()
                .unwrap(),
            agent_token: auth.mint_jwt("test-agent", Role::Agent, 3600, None),
            operator_token: auth.mint_jwt("test-operator", Role::Operator, 3600, None),
            auth,
            _shutdown: tokio::sync::oneshot::channel().0,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// Creates a run and returns `(run_id, run_token)`.
    pub async fn create_run(&self, body: Value) -> (String, String) {
        let (status, v) = self.post("/api/runs", &self.agent_token, &body).await;
        assert_eq!(status, StatusCode::CREATED, "create run: {v}");
        assert_eq!(v["sequence"], 1);
        (
            v["run_id"].as_str().unwrap().to_owned(),
            v["run_token"].as_str().unwrap().to_owned(),
        )
    }

    pub async fn post(&self, path: &str, token: &str, body: &Value) -> (StatusCode, Value) {
        self.send(self.http.post(self.url(path)).bearer_auth(token).json(body))
            .await
    }

    /// `post`, sent again while it answers 503 `unavailable` — the store gave up on a
    /// contended or slow write and wrote nothing (`docs/architecture.md` §1) — at most
    /// [`SERVED_ATTEMPTS`] times with a growing pause, as a client retries. For tests
    /// about something else whose requests race on one run: under load (DynamoDB Local on
    /// a busy machine) any of them may spend the store's contention budget. Each retry is
    /// logged; the last answer is returned whatever it is.
    pub async fn post_until_served(
        &self,
        path: &str,
        token: &str,
        body: &Value,
    ) -> (StatusCode, Value) {
        until_served(path, || self.post(path, token, body)).await
    }

    pub async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        self.send(self.http.get(self.url(path)).bearer_auth(token))
            .await
    }

    /// Sends `req`: every answer is JSON and carries `x-request-id`; an error's body
    /// names the same id as `request_id`, which is taken out of the body returned (each
    /// request has its own, so that repeated answers compare equal).
    pub async fn send(&self, req: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let (status, request_id, body) = exchange(req).await;
        let mut body =
            body.unwrap_or_else(|text| panic!("every answer is JSON; got {status} {text:?}"));
        if status.is_client_error() || status.is_server_error() {
            assert!(
                body["code"].is_string(),
                "an error carries its code: {body}"
            );
            assert_eq!(
                body["request_id"].as_str(),
                Some(request_id.as_str()),
                "an error names its request id: {body}"
            );
            body.as_object_mut().unwrap().remove("request_id");
        }
        (status, body)
    }

    /// Appends events, returning their sequences (asserting 200); a 503 `unavailable`
    /// (nothing written) is sent again, as [`Self::post_until_served`] says.
    pub async fn append(&self, run_id: &str, token: &str, events: Value) -> Vec<u64> {
        let (status, v) = self
            .post_until_served(
                &format!("/api/runs/{run_id}/events"),
                token,
                &json!({ "events": events }),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "append: {v}");
        v["sequences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_u64().unwrap())
            .collect()
    }

    /// Replays the whole stream in pages of `limit`, checking page invariants on the way.
    pub async fn replay_all(&self, run_id: &str, token: &str, limit: usize) -> Vec<Value> {
        let mut events = Vec::new();
        let mut after = 0u64;
        loop {
            let (status, page) = self
                .get(
                    &format!("/api/runs/{run_id}/events?after={after}&limit={limit}"),
                    token,
                )
                .await;
            assert_eq!(status, StatusCode::OK, "replay: {page}");
            let batch = page["events"].as_array().unwrap();
            assert!(batch.len() <= limit);
            for e in batch {
                assert!(
                    e["sequence"].as_u64().unwrap() > after,
                    "only events after `after`"
                );
            }
            events.extend(batch.iter().cloned());
            let next = page["next_after"].as_u64().unwrap();
            if !page["has_more"].as_bool().unwrap() {
                return events;
            }
            assert!(next > after, "has_more must make progress");
            after = next;
        }
    }
}

/// How many times [`TestServer::post_until_served`] and [`until_served`] send a request
/// that keeps answering 503 `unavailable`.
pub const SERVED_ATTEMPTS: u32 = 6;

/// Whether an answer is the store's retryable refusal: 503 `unavailable`, nothing written
/// (other 503s, e.g. `agenthost_unreachable`, are answers in their own right).
pub fn is_unavailable(status: StatusCode, body: &Value) -> bool {
    status == StatusCode::SERVICE_UNAVAILABLE && body["code"] == "unavailable"
}

/// Calls `send` again while it answers 503 `unavailable`, at most [`SERVED_ATTEMPTS`]
/// times, pausing 250 ms × attempt between tries and logging each retry under `what`;
/// answers the last answer. A client's retry of a request that wrote nothing.
pub async fn until_served<F, Fut>(what: &str, mut send: F) -> (StatusCode, Value)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = (StatusCode, Value)>,
{
    let mut answer = send().await;
    for attempt in 1..SERVED_ATTEMPTS {
        if !is_unavailable(answer.0, &answer.1) {
            break;
        }
        eprintln!(
            "{what}: 503 unavailable on attempt {attempt}, sending again: {}",
            answer.1
        );
        tokio::time::sleep(std::time::Duration::from_millis(250 * u64::from(attempt))).await;
        answer = send().await;
    }
    answer
}

/// Sends `req` and reads the whole answer: its status, its `x-request-id` (asserted
/// present: every answer carries one) and its body, parsed when the answer says JSON
/// (else its text).
pub async fn exchange(req: reqwest::RequestBuilder) -> (StatusCode, String, Result<Value, String>) {
    let resp = req.send().await.expect("request reaches the server");
    let status = resp.status();
    let request_id = resp
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("every answer carries x-request-id ({status})"));
    let is_json = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    let text = resp.text().await.unwrap();
    let body = if is_json {
        Ok(serde_json::from_str(&text).expect("a JSON answer parses"))
    } else {
        Err(text)
    };
    (status, request_id, body)
}

pub fn sequences(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .map(|e| e["sequence"].as_u64().unwrap())
        .collect()
}
