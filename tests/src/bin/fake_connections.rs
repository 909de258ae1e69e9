//! A fake API Gateway `@connections` endpoint on loopback for the Lambda-runtime tier
//! (`tests/lambda/run.sh`): `POST /live/@connections/{id}` appends
//! `{"connection_id": id, "frame": <the posted JSON>}` as one line to the file named by
//! the first argument and answers 200; a connection id starting with `gone-` answers
//! 410 Gone (as API Gateway does for a closed connection) and is recorded with
//! `"gone": true`. Prints `http://127.0.0.1:<port>/live` (the endpoint) on its first
//! line, then serves until killed.

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;

type Log = Arc<Mutex<std::fs::File>>;

async fn post(
    State(log): State<Log>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> axum::response::Response {
    let frame: serde_json::Value =
        serde_json::from_slice(&body).unwrap_or_else(|_| String::from_utf8_lossy(&body).into());
    let gone = id.starts_with("gone-");
    let line = serde_json::json!({"connection_id": id, "frame": frame, "gone": gone});
    {
        let mut file = log.lock().unwrap_or_else(|p| p.into_inner());
        let _ = writeln!(file, "{line}");
        let _ = file.flush();
    }
    if gone {
        return (
            StatusCode::GONE,
            [("x-amzn-errortype", "GoneException")],
            r#"{"message":"gone"}"#,
        )
            .into_response();
    }
    StatusCode::OK.into_response()
}

#[tokio::main]
async fn main() {
    let path = std::env::args()
        .nth(1)
        .expect("usage: tollgate-fake-connections <posts.jsonl>");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .expect("the posts file opens");
    let app = axum::Router::new()
        .route("/live/@connections/{id}", axum::routing::post(post))
        .with_state(Arc::new(Mutex::new(file)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    println!("http://{}/live", listener.local_addr().unwrap());
    axum::serve(listener, app).await.unwrap();
}
