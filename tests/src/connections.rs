//! A fake API Gateway `@connections` endpoint on loopback (docs/architecture.md §9): it
//! records the frames posted to each connection, in order, and answers 410 Gone, as API
//! Gateway does, for the connections marked gone; a `DELETE` (the server closing a
//! connection) is recorded and leaves it gone. The deployed push's tests and the
//! lifecycle meter post through it with the real `Poster`.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde_json::Value;

/// What the endpoint was posted, per connection, in order; and the connections gone.
#[derive(Clone, Default)]
pub struct Endpoint {
    posts: Arc<Mutex<BTreeMap<String, Vec<Value>>>>,
    gone: Arc<Mutex<HashSet<String>>>,
    closed: Arc<Mutex<Vec<String>>>,
}

async fn delete_connection(
    State(ep): State<Endpoint>,
    Path(id): Path<String>,
) -> axum::response::Response {
    if !ep.gone.lock().unwrap().insert(id.clone()) {
        return (
            StatusCode::GONE,
            [("x-amzn-errortype", "GoneException")],
            r#"{"message":"gone"}"#,
        )
            .into_response();
    }
    ep.closed.lock().unwrap().push(id);
    StatusCode::NO_CONTENT.into_response()
}

async fn post_to_connection(
    State(ep): State<Endpoint>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> axum::response::Response {
    if ep.gone.lock().unwrap().contains(&id) {
        return (
            StatusCode::GONE,
            [("x-amzn-errortype", "GoneException")],
            r#"{"message":"gone"}"#,
        )
            .into_response();
    }
    let frame: Value = serde_json::from_slice(&body).expect("every frame is JSON");
    ep.posts.lock().unwrap().entry(id).or_default().push(frame);
    StatusCode::OK.into_response()
}

impl Endpoint {
    /// A fresh endpoint serving on loopback, and its URL (the stage's, `…/live`).
    pub async fn start() -> (Self, String) {
        let ep = Endpoint::default();
        let app = axum::Router::new()
            .route(
                "/live/@connections/{id}",
                axum::routing::post(post_to_connection).delete(delete_connection),
            )
            .with_state(ep.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/live", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (ep, url)
    }

    /// `connection` hangs up: every post to it answers 410 Gone from now on.
    pub fn hang_up(&self, connection: &str) {
        self.gone.lock().unwrap().insert(connection.to_owned());
    }

    /// The connections the server closed (`DELETE`), in order.
    pub fn closed(&self) -> Vec<String> {
        self.closed.lock().unwrap().clone()
    }

    /// Everything `connection` was sent so far, taken out.
    pub fn take(&self, connection: &str) -> Vec<Value> {
        self.posts
            .lock()
            .unwrap()
            .remove(connection)
            .unwrap_or_default()
    }

    /// Everything `connection` was sent so far, left in place.
    pub fn sent(&self, connection: &str) -> Vec<Value> {
        self.posts
            .lock()
            .unwrap()
            .get(connection)
            .cloned()
            .unwrap_or_default()
    }

    /// How many frames were posted in all (to connections not gone).
    pub fn total(&self) -> u64 {
        self.posts
            .lock()
            .unwrap()
            .values()
            .map(|f| f.len() as u64)
            .sum()
    }
}
