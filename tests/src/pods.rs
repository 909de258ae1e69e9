//! Helpers of the pod-per-run tests (`forwarding.rs`, `pod_cards.rs`): loopback pods, the
//! operator's decisions and what they wrote.

use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tollgate_api::Role;

use crate::TestServer;

/// A loopback listener and the origin that names it.
pub async fn listen() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    (listener, origin)
}

/// Serves `app` on `listener` until the task is dropped with the runtime.
pub fn serve(listener: TcpListener, app: axum::Router) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    })
}

/// An operator token for `sub`.
pub fn operator(srv: &TestServer, sub: &str) -> String {
    srv.auth.mint_jwt(sub, Role::Operator, 600, None)
}

/// `who` posts `body` to `/api/runs/{run_id}/{verb}` (`tool-approvals` or `tool-denials`).
pub async fn decide(
    srv: &TestServer,
    verb: &str,
    run_id: &str,
    who: &str,
    body: Value,
) -> (StatusCode, Value) {
    srv.post(
        &format!("/api/runs/{run_id}/{verb}"),
        &operator(srv, who),
        &body,
    )
    .await
}

/// The policies whose origin is `run_id`.
pub async fn policies(srv: &TestServer, run_id: &str) -> Vec<Value> {
    let (status, v) = srv.get("/api/policies", &srv.operator_token).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v["policies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["origin_run_id"] == json!(run_id))
        .cloned()
        .collect()
}

/// A fresh request id (a UUID, as seed 003's are).
pub fn request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}
