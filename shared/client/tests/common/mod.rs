//! Shared test support: the real server in-process (embedded store, loopback), a client
//! with short waits, an operator deciding over HTTP, and a proxy that can hide the live
//! stream or lose answers.

#![allow(dead_code)]

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tollgate_client::{Client, ClientConfig, RetryPolicy};
use tollgate_tests::{Backend, TestServer};

/// Every test's whole body runs within this.
pub const TEST_BOUND: Duration = Duration::from_secs(60);

pub async fn bounded<F: Future>(fut: F) -> F::Output {
    tokio::time::timeout(TEST_BOUND, fut)
        .await
        .expect("the test finished within its bound")
}

pub async fn server() -> TestServer {
    TestServer::start(Backend::Memory).await
}

/// Waits short enough for tests; retries quickly.
pub fn fast_config() -> ClientConfig {
    ClientConfig {
        retry: RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(20),
            max_delay: Duration::from_millis(200),
            max_retry_after: Duration::from_millis(200),
        },
        request_timeout: Duration::from_secs(10),
        connect_timeout: Duration::from_secs(2),
        stream_stall: Duration::from_secs(20),
        poll_interval: Duration::from_millis(100),
        expiry_grace: Duration::from_secs(15),
    }
}

pub fn client(base: &str, srv: &TestServer) -> Client {
    Client::with_config(base, &srv.agent_token, fast_config()).unwrap()
}

/// The operator decides a card over HTTP: `verb` is `tool-approvals` or `tool-denials`.
pub async fn decide(
    srv: &TestServer,
    run_id: &str,
    verb: &str,
    request_id: &str,
    scope: &str,
) -> (StatusCode, Value) {
    srv.post(
        &format!("/api/runs/{run_id}/{verb}"),
        &srv.operator_token,
        &json!({"request_id": request_id, "scope": scope}),
    )
    .await
}

/// A reverse proxy in front of the server.
pub struct Proxy {
    pub base: String,
    rules: Arc<Rules>,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

struct Rules {
    upstream: String,
    http: reqwest::Client,
    /// `GET …/stream` answers 405, as a gateway without the streaming route would.
    hide_stream: bool,
    /// `(method, path suffix)` → how many answers to lose: the request reaches the
    /// server, the client gets a 503 instead of its answer.
    lose: Mutex<HashMap<(Method, String), u32>>,
    /// Requests seen per `(method, path)`.
    hits: Mutex<HashMap<(Method, String), u32>>,
}

impl Proxy {
    pub async fn start(upstream: &str, hide_stream: bool) -> Self {
        let rules = Arc::new(Rules {
            upstream: upstream.to_owned(),
            http: reqwest::Client::new(),
            hide_stream,
            lose: Mutex::default(),
            hits: Mutex::default(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let app = axum::Router::new()
            .fallback(forward)
            .with_state(rules.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = rx.await;
                })
                .await
                .unwrap();
        });
        Self {
            base,
            rules,
            _shutdown: tx,
        }
    }

    /// Loses the next `n` answers to `method` requests whose path ends with `suffix`.
    pub fn lose(&self, method: Method, suffix: &str, n: u32) {
        self.rules
            .lose
            .lock()
            .unwrap()
            .insert((method, suffix.to_owned()), n);
    }

    /// How many `method` requests had a path ending with `suffix`.
    pub fn hits(&self, method: Method, suffix: &str) -> u32 {
        self.rules
            .hits
            .lock()
            .unwrap()
            .iter()
            .filter(|((m, p), _)| *m == method && p.ends_with(suffix))
            .map(|(_, n)| n)
            .sum()
    }
}

async fn forward(
    State(rules): State<Arc<Rules>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_owned();
    *rules
        .hits
        .lock()
        .unwrap()
        .entry((method.clone(), path.clone()))
        .or_default() += 1;
    if rules.hide_stream && path.ends_with("/stream") {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            axum::Json(json!({"error": "method not allowed"})),
        )
            .into_response();
    }
    let target = format!(
        "{}{}",
        rules.upstream,
        uri.path_and_query().map_or("/", |p| p.as_str())
    );
    let mut req = rules.http.request(method.clone(), target).body(body);
    for name in ["authorization", "content-type", "accept", "last-event-id"] {
        if let Some(v) = headers.get(name) {
            req = req.header(name, v.clone());
        }
    }
    let resp = match req.send().await {
        Ok(resp) => resp,
        Err(_) => return StatusCode::BAD_GATEWAY.into_response(),
    };
    let status = resp.status();
    let content_type = resp.headers().get("content-type").cloned();
    let bytes = resp.bytes().await.unwrap_or_default();
    let lost = {
        let mut lose = rules.lose.lock().unwrap();
        match lose
            .iter_mut()
            .find(|((m, suffix), n)| *m == method && path.ends_with(suffix.as_str()) && **n > 0)
        {
            Some((_, n)) => {
                *n -= 1;
                true
            }
            None => false,
        }
    };
    if lost {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [("retry-after", "0")],
            axum::Json(json!({"error": "the answer was lost on the way"})),
        )
            .into_response();
    }
    let mut out = (status, bytes).into_response();
    if let Some(ct) = content_type {
        out.headers_mut().insert("content-type", ct);
    }
    out
}

/// A TCP server that accepts connections and never answers (holding them open).
pub async fn black_hole() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    url
}

/// A page that answers `status` with a small body.
pub async fn page(status: u16) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    let status = StatusCode::from_u16(status).unwrap();
    let app = axum::Router::new().fallback(move || async move { (status, "page body") });
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    url
}
