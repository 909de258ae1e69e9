//! Live delivery over WebSocket (`GET /api/ws`) as a client sees it, on the embedded
//! store and on DynamoDB (where the process's DynamoDB Streams reader wakes the
//! subscriptions): the backlog, live events and `done`; refusals at the upgrade and at
//! subscribe; bad messages; caps; a subscriber dropped 20 times during 1,000 appends that
//! still sees every sequence once, in order; two `serve` processes on the same tables
//! pushing each other's events; the Rust client and `tollgate watch` following over
//! WebSocket, and over SSE where none is advertised.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use rand::Rng;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::Message;
use tollgate_api::live::Wakes;
use tollgate_api::sse::SseConfig;
use tollgate_api::{Deps, GateConfig, Role};
use tollgate_protocol::ws::{MAX_SUBSCRIPTIONS_PER_CONNECTION, WS_PATH};
use tollgate_store::memory::MemoryStore;
use tollgate_tests::{dynamo_store, Backend, TestServer};

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Bound on any one wait for a frame (a failure, not a timing claim).
const WAIT: Duration = Duration::from_secs(60);

/// The deps of a server on `backend`: on DynamoDB with a stream reader whose safety poll
/// is an hour, so that what arrives within a test was pushed by the stream.
async fn deps(backend: Backend) -> Deps {
    let mut deps = match backend {
        Backend::Memory => TestServer::deps(Arc::new(MemoryStore::new()), GateConfig::default()),
        Backend::Dynamo => {
            let store = dynamo_store().await;
            let events = store.tables().events.clone();
            let sdk = tollgate_store::dynamo::sdk_config().await;
            let wakes = Arc::new(Wakes::new(Duration::from_secs(3600)));
            let deps = TestServer::deps(Arc::new(store), GateConfig::default())
                .with_wakes(wakes.clone())
                .with_stream_reader(&sdk, events);
            if tokio::time::timeout(WAIT, wakes.reading()).await.is_err() {
                panic!(
                    "the stream reader does not read the events table's stream: {:?}",
                    wakes.failure()
                );
            }
            deps
        }
    };
    deps.websocket_url = Some(WS_PATH.into());
    deps
}

async fn server(backend: Backend) -> TestServer {
    TestServer::with_deps(deps(backend).await).await
}

fn ws_url(base: &str) -> String {
    format!("{}{WS_PATH}", base.replacen("http://", "ws://", 1))
}

/// Connects with `token` in `Sec-WebSocket-Protocol` (and `query` appended); the socket,
/// or the refusal's status and JSON body.
async fn connect(base: &str, token: Option<&str>, query: &str) -> Result<Socket, (u16, Value)> {
    let mut req = format!("{}{query}", ws_url(base))
        .into_client_request()
        .unwrap();
    let protocols = match token {
        Some(t) => format!("tollgate.v1, bearer.{t}"),
        None => "tollgate.v1".into(),
    };
    req.headers_mut()
        .insert("sec-websocket-protocol", protocols.parse().unwrap());
    match tokio_tungstenite::connect_async(req).await {
        Ok((socket, resp)) => {
            assert_eq!(
                resp.headers()["sec-websocket-protocol"].to_str().unwrap(),
                "tollgate.v1"
            );
            Ok(socket)
        }
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => {
            let body = resp
                .body()
                .as_deref()
                .map(|b| serde_json::from_slice(b).expect("a refusal is JSON"))
                .unwrap_or(Value::Null);
            Err((resp.status().as_u16(), body))
        }
        Err(e) => panic!("connect failed: {e}"),
    }
}

async fn open(base: &str, token: &str, query: &str) -> Socket {
    connect(base, Some(token), query)
        .await
        .unwrap_or_else(|(s, b)| panic!("refused {s}: {b}"))
}

async fn send(ws: &mut Socket, msg: Value) {
    ws.send(Message::Text(msg.to_string().into()))
        .await
        .unwrap();
}

async fn subscribe(ws: &mut Socket, run_id: &str, after: u64) {
    send(
        ws,
        json!({"action": "subscribe", "run_id": run_id, "after": after}),
    )
    .await;
}

/// The next JSON frame (pings skipped); `None` once the connection closed.
async fn next(ws: &mut Socket) -> Option<Value> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .expect("a frame within the bound")?;
        match msg.ok()? {
            Message::Text(t) => return Some(serde_json::from_str(t.as_str()).unwrap()),
            Message::Close(_) => return None,
            _ => continue,
        }
    }
}

/// The close frame's code once the server closes.
async fn closed_with(ws: &mut Socket) -> Option<CloseCode> {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let msg = tokio::time::timeout_at(deadline, ws.next())
            .await
            .expect("closed within the bound")?;
        match msg {
            Ok(Message::Close(frame)) => return frame.map(|f| f.code),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

async fn append(srv: &TestServer, run_id: &str, token: &str, n: usize) {
    let events: Vec<Value> = (0..n)
        .map(|i| json!({"type": "agent.message", "n": i}))
        .collect();
    srv.append(run_id, token, json!(events)).await;
}

/// Event frames (and the `done`) until `done`; panics on anything else.
async fn events_until_done(ws: &mut Socket) -> (Vec<Value>, Value) {
    let mut events = Vec::new();
    loop {
        let f = next(ws).await.expect("open until done");
        match f["event"].as_str().unwrap() {
            "done" => return (events, f),
            _ if f.get("id").is_some() => events.push(f),
            other => panic!("unexpected frame {other}: {f}"),
        }
    }
}

/// GIVEN a run with events WHEN a client subscribes (after 0, and with the run token
/// through `?access_token=` after 8) THEN `subscribed`, every event after `after` with
/// `id` = sequence, `event` = type and `data` exactly as replay serves it, the events
/// appended while subscribed, and after the terminal event one `done` frame; `ping` is
/// answered with `pong`.
async fn backlog_live_and_done(backend: Backend) {
    let srv = server(backend).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    append(&srv, &run_id, &token, 5).await;
    let mut ws = open(&srv.base, &srv.agent_token, "").await;
    send(&mut ws, json!({"action": "ping"})).await;
    let pong = next(&mut ws).await.unwrap();
    assert_eq!(pong, json!({"event": "pong", "data": {}}));
    subscribe(&mut ws, &run_id, 0).await;
    let f = next(&mut ws).await.unwrap();
    assert_eq!(
        f,
        json!({"run_id": run_id, "event": "subscribed", "data": {"run_id": run_id, "after": 0}})
    );
    let mut frames = Vec::new();
    for _ in 0..6 {
        frames.push(next(&mut ws).await.unwrap());
    }
    // Live: appended while subscribed.
    append(&srv, &run_id, &token, 3).await;
    for _ in 0..3 {
        frames.push(next(&mut ws).await.unwrap());
    }
    // The run token, in the query, connected while the run lives.
    let mut by_token = connect(
        &srv.base,
        None,
        &format!("?access_token={token}&run_id={run_id}"),
    )
    .await
    .unwrap();
    let (status, _) = srv
        .post(&format!("/api/runs/{run_id}/complete"), &token, &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (rest, done) = events_until_done(&mut ws).await;
    frames.extend(rest);
    let replayed = srv.replay_all(&run_id, &token, 100).await;
    assert_eq!(frames.len(), 10);
    assert_eq!(replayed.len(), 10);
    for (f, e) in frames.iter().zip(&replayed) {
        assert_eq!(f["run_id"], json!(run_id));
        assert_eq!(f["id"], e["sequence"]);
        assert_eq!(f["event"], e["type"]);
        assert_eq!(&f["data"], e, "data is the replayed event");
    }
    assert_eq!(
        done,
        json!({"run_id": run_id, "event": "done", "data": {"run_id": run_id, "terminal_sequence": 10}})
    );
    // The run token resuming after 8 once the run has ended: the rest and `done`, then
    // the connection closes.
    subscribe(&mut by_token, &run_id, 8).await;
    assert_eq!(next(&mut by_token).await.unwrap()["event"], "subscribed");
    let (events, _) = events_until_done(&mut by_token).await;
    let ids: Vec<u64> = events.iter().map(|f| f["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![9, 10]);
    assert_eq!(closed_with(&mut by_token).await, Some(CloseCode::Normal));
}

/// A subscription to `run` is refused with an `error` frame of `code`; the connection
/// stays open.
async fn refused(ws: &mut Socket, run: &str, code: &str) {
    subscribe(ws, run, 0).await;
    let f = next(ws).await.expect("the connection stays open");
    assert_eq!(f["event"], "error", "{f}");
    assert_eq!(f["run_id"], json!(run));
    assert_eq!(f["data"]["code"], code, "{f}");
    assert!(f.get("id").is_none());
    send(ws, json!({"action": "ping"})).await;
    assert_eq!(next(ws).await.unwrap()["event"], "pong");
}

/// GIVEN runs of two agents in two projects WHEN clients connect without a token, with a
/// bad one, with a run token naming another run (or none), and subscribe where they may
/// not THEN the upgrade is refused with 401/403 JSON, and a refused subscription is an
/// `error` frame (`forbidden`, `not_found`) on a connection that stays open.
async fn refusals_at_upgrade_and_subscribe(backend: Backend) {
    let srv = server(backend).await;
    let agent_a = srv
        .auth
        .mint_jwt("agent-a", Role::Agent, 3600, Some("p1".into()));
    let agent_b = srv
        .auth
        .mint_jwt("agent-b", Role::Agent, 3600, Some("p1".into()));
    let operator_p2 = srv
        .auth
        .mint_jwt("op-2", Role::Operator, 3600, Some("p2".into()));
    let operator_p1 = srv
        .auth
        .mint_jwt("op-1", Role::Operator, 3600, Some("p1".into()));
    let create = |token: String| {
        let srv = &srv;
        async move {
            let (status, body) = srv.post("/api/runs", &token, &json!({})).await;
            assert_eq!(status, StatusCode::CREATED, "{body}");
            (
                body["run_id"].as_str().unwrap().to_owned(),
                body["run_token"].as_str().unwrap().to_owned(),
            )
        }
    };
    let (run_a, token_a) = create(agent_a.clone()).await;
    let (run_b, _) = create(agent_b.clone()).await;

    // At the upgrade.
    let (status, body) = connect(&srv.base, None, "").await.err().unwrap();
    assert_eq!((status, body["code"].as_str()), (401, Some("unauthorized")));
    assert!(body["request_id"].is_string());
    let (status, _) = connect(&srv.base, Some("not-a-token"), "")
        .await
        .err()
        .unwrap();
    assert_eq!(status, 401);
    let forged = srv.auth.mint_jwt("x", Role::Operator, 3600, None);
    let forged = format!("{}x", &forged[..forged.len() - 1]);
    let (status, _) = connect(&srv.base, Some(&forged), "").await.err().unwrap();
    assert_eq!(status, 401);
    let (status, body) = connect(&srv.base, Some(&token_a), "").await.err().unwrap();
    assert_eq!(status, 401, "a run token without run_id: {body}");
    let (status, body) = connect(&srv.base, Some(&token_a), &format!("?run_id={run_b}"))
        .await
        .err()
        .unwrap();
    assert_eq!((status, body["code"].as_str()), (403, Some("forbidden")));
    // Not an upgrade at all: JSON too.
    let resp = srv
        .http
        .get(srv.url("/api/ws"))
        .bearer_auth(&agent_a)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["code"], "invalid_request");

    // At subscribe: the run token on another run; an agent on another agent's run; an
    // operator of another tenant; a run that does not exist.
    let mut ws = open(&srv.base, &token_a, &format!("?run_id={run_a}")).await;
    refused(&mut ws, &run_b, "forbidden").await;
    let mut ws = open(&srv.base, &agent_b, "").await;
    refused(&mut ws, &run_a, "forbidden").await;
    let mut ws = open(&srv.base, &operator_p2, "").await;
    refused(&mut ws, &run_a, "not_found").await;
    refused(&mut ws, "no-such-run", "not_found").await;
    // And the ones that may: the operator of the run's tenant, the run's own agent.
    for token in [&operator_p1, &agent_a] {
        let mut ws = open(&srv.base, token, "").await;
        subscribe(&mut ws, &run_a, 0).await;
        assert_eq!(next(&mut ws).await.unwrap()["event"], "subscribed");
        assert_eq!(next(&mut ws).await.unwrap()["id"], 1);
    }
}

/// GIVEN an open connection WHEN it sends what is not a message of the protocol THEN an
/// `error` frame (`invalid_request`) and the connection stays open; a binary frame or a
/// text over 4 KiB closes it with 1008 (policy).
async fn bad_messages(backend: Backend) {
    let srv = server(backend).await;
    let (run_id, _) = srv.create_run(json!({})).await;
    let mut ws = open(&srv.base, &srv.operator_token, "").await;
    for bad in [
        "not json".to_owned(),
        json!({"action": "subscribe"}).to_string(),
        json!({"action": "dance", "run_id": run_id}).to_string(),
        json!({"action": "subscribe", "run_id": run_id, "after": -1}).to_string(),
        json!({"action": "subscribe", "run_id": run_id, "extra": 1}).to_string(),
        json!({"action": "subscribe", "run_id": "../etc"}).to_string(),
        json!({"action": "subscribe", "run_id": run_id, "after": 99}).to_string(),
    ] {
        ws.send(Message::Text(bad.clone().into())).await.unwrap();
        let f = next(&mut ws).await.expect("open after a bad message");
        assert_eq!(f["event"], "error", "{bad}: {f}");
        assert_eq!(f["data"]["code"], "invalid_request", "{bad}: {f}");
    }
    send(&mut ws, json!({"action": "ping"})).await;
    assert_eq!(next(&mut ws).await.unwrap()["event"], "pong");
    ws.send(Message::Binary(vec![1, 2, 3].into()))
        .await
        .unwrap();
    assert_eq!(closed_with(&mut ws).await, Some(CloseCode::Policy));
    let mut ws = open(&srv.base, &srv.operator_token, "").await;
    let big = json!({"action": "subscribe", "run_id": "x".repeat(5000)}).to_string();
    ws.send(Message::Text(big.into())).await.unwrap();
    assert_eq!(closed_with(&mut ws).await, Some(CloseCode::Policy));
}

/// Connects, retrying while refused 429 (a place given back is seen once the server
/// noticed the close); panics on any other refusal or past the bound.
async fn open_once_free(base: &str, token: &str, query: &str) -> Socket {
    let deadline = Instant::now() + WAIT;
    loop {
        match connect(base, Some(token), query).await {
            Ok(ws) => return ws,
            Err((429, _)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("the place was not given back: {e:?}"),
        }
    }
}

/// GIVEN caps of 2 streams per run token and 3 per project WHEN a run token opens a
/// third connection, an agent's connections and subscriptions reach its tenant's cap,
/// or a connection subscribes to one run more than it may THEN 429 `too_many_streams`
/// at the upgrade, an `error` frame `too_many_streams` at subscribe; a connection takes
/// its place whether or not it follows anything; a place freed is taken again.
async fn caps(backend: Backend) {
    let mut deps = deps(backend).await;
    deps.sse = SseConfig {
        caps: tollgate_api::sse::StreamCaps {
            per_run: 2,
            per_agent: 64,
            per_project: 3,
        },
        ..SseConfig::default()
    };
    let srv = TestServer::with_deps(deps).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    let q = format!("?run_id={run_id}");
    let first = open(&srv.base, &token, &q).await;
    let second = open(&srv.base, &token, &q).await;
    let (status, body) = connect(&srv.base, Some(&token), &q).await.err().unwrap();
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["code"], "too_many_streams");
    drop(first);
    let third = open_once_free(&srv.base, &token, &q).await;
    // Per project (here: the creating agent's runs): the two idle run token connections
    // hold two of its three places, so the agent's own connection is the last one.
    let mut ws = open(&srv.base, &srv.agent_token, "").await;
    let (status, body) = connect(&srv.base, Some(&srv.agent_token), "")
        .await
        .err()
        .unwrap();
    assert_eq!(
        (status, body["code"].as_str()),
        (429, Some("too_many_streams")),
        "{body}"
    );
    drop((second, third));
    // Freed: the connection holds one place, each subscription one more.
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(srv.create_run(json!({})).await.0);
    }
    let deadline = Instant::now() + WAIT;
    for run in &runs[..2] {
        loop {
            subscribe(&mut ws, run, 0).await;
            let f = next(&mut ws).await.unwrap();
            if f["event"] == "subscribed" {
                break;
            }
            assert_eq!(f["data"]["code"], "too_many_streams", "{f}");
            assert!(Instant::now() < deadline, "the places were not given back");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(next(&mut ws).await.unwrap()["id"], 1);
    }
    subscribe(&mut ws, &runs[2], 0).await;
    let f = next(&mut ws).await.unwrap();
    assert_eq!(
        (f["event"].as_str(), f["data"]["code"].as_str()),
        (Some("error"), Some("too_many_streams")),
        "{f}"
    );
    send(&mut ws, json!({"action": "unsubscribe", "run_id": runs[0]})).await;
    assert_eq!(next(&mut ws).await.unwrap()["event"], "unsubscribed");
    subscribe(&mut ws, &runs[2], 0).await;
    assert_eq!(next(&mut ws).await.unwrap()["event"], "subscribed");
    // Per connection: an operator (no tenant caps) up to the protocol's bound.
    let mut ws = open(&srv.base, &srv.operator_token, "").await;
    for i in 0..MAX_SUBSCRIPTIONS_PER_CONNECTION {
        let run = srv.create_run(json!({})).await.0;
        subscribe(&mut ws, &run, 0).await;
        assert_eq!(next(&mut ws).await.unwrap()["event"], "subscribed", "#{i}");
        assert_eq!(next(&mut ws).await.unwrap()["id"], 1);
    }
    let run = srv.create_run(json!({})).await.0;
    subscribe(&mut ws, &run, 0).await;
    let f = next(&mut ws).await.unwrap();
    assert_eq!(f["data"]["code"], "too_many_streams", "{f}");
}

/// A run of an agent of `project`: `(run_id, run_token)`.
async fn project_run(srv: &TestServer, agent: &str) -> (String, String) {
    let (status, v) = srv.post("/api/runs", agent, &json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    (
        v["run_id"].as_str().unwrap().to_owned(),
        v["run_token"].as_str().unwrap().to_owned(),
    )
}

/// GIVEN the default caps and pool WHEN eight agents of one project each create 8 runs
/// and open 8 idle WebSocket connections with each run's token (512 attempts: runs cost
/// nothing) THEN each agent gets at most its 64 places and the project exactly its 250,
/// every other attempt is 429 `too_many_streams`; and another tenant's run token still
/// connects, subscribes and receives its events, its SSE stream opens, and an operator
/// still connects.
async fn one_projects_idle_connections_leave_the_others_streaming(backend: Backend) {
    let srv = server(backend).await;
    let id = uuid::Uuid::new_v4().simple().to_string();
    let flooders: Vec<String> = (0..8)
        .map(|i| {
            srv.auth.mint_jwt(
                &format!("flood-{i}"),
                Role::Agent,
                3600,
                Some(format!("flood-{id}")),
            )
        })
        .collect();
    let quiet = srv
        .auth
        .mint_jwt("quiet", Role::Agent, 3600, Some(format!("quiet-{id}")));
    let mut held = Vec::new();
    let mut refused = 0;
    for flood in flooders.iter().flat_map(|f| std::iter::repeat_n(f, 8)) {
        let (run_id, token) = project_run(&srv, flood).await;
        let q = format!("?run_id={run_id}");
        for _ in 0..8 {
            match connect(&srv.base, Some(&token), &q).await {
                Ok(ws) => held.push(ws),
                Err((429, body)) => {
                    assert_eq!(body["code"], "too_many_streams", "{body}");
                    refused += 1;
                }
                Err(other) => panic!("refused otherwise: {other:?}"),
            }
        }
    }
    let defaults = tollgate_api::sse::StreamCaps::default();
    assert_eq!(held.len(), defaults.per_project, "{refused} refused");
    assert_eq!(held.len() + refused, 8 * 8 * 8);
    // Another tenant streams.
    let (run_id, token) = project_run(&srv, &quiet).await;
    append(&srv, &run_id, &token, 2).await;
    let mut ws = open(&srv.base, &token, &format!("?run_id={run_id}")).await;
    subscribe(&mut ws, &run_id, 0).await;
    assert_eq!(next(&mut ws).await.unwrap()["event"], "subscribed");
    let ids: Vec<u64> = [next(&mut ws).await.unwrap(), next(&mut ws).await.unwrap()]
        .iter()
        .map(|f| f["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [1, 2]);
    let sse = srv
        .http
        .get(srv.url(&format!("/api/runs/{run_id}/stream")))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(sse.status(), StatusCode::OK);
    drop(sse);
    let _operator = open(&srv.base, &srv.operator_token, "").await;
    drop(held);
}

/// GIVEN a live run with two connections opened with its token (one following the run,
/// one following nothing) and an agent's connection following it WHEN the run completes
/// THEN the follower gets `done` and both run token connections are closed (normal
/// closure) — the idle one at the next ping at the latest; the agent's connection stays
/// open (answers a ping); the ended run's token is refused at the upgrade with 409
/// `run_terminal`, while replay still reads the run with it.
async fn an_ended_runs_token_holds_no_connection(backend: Backend) {
    let srv = server(backend).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    let q = format!("?run_id={run_id}");
    let mut follows = open(&srv.base, &token, &q).await;
    let mut idle = open(&srv.base, &token, &q).await;
    let mut agent = open(&srv.base, &srv.agent_token, "").await;
    for ws in [&mut follows, &mut agent] {
        subscribe(ws, &run_id, 0).await;
        assert_eq!(next(ws).await.unwrap()["event"], "subscribed");
        assert_eq!(next(ws).await.unwrap()["id"], 1);
    }
    let (status, v) = srv
        .post(&format!("/api/runs/{run_id}/complete"), &token, &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    for ws in [&mut follows, &mut agent] {
        let (_, done) = events_until_done(ws).await;
        assert_eq!(done["data"]["run_id"], run_id.as_str());
    }
    assert_eq!(closed_with(&mut follows).await, Some(CloseCode::Normal));
    assert_eq!(closed_with(&mut idle).await, Some(CloseCode::Normal));
    send(&mut agent, json!({"action": "ping"})).await;
    assert_eq!(next(&mut agent).await.unwrap()["event"], "pong");
    let (status, body) = connect(&srv.base, Some(&token), &q).await.err().unwrap();
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("run_terminal")),
        "{body}"
    );
    let events = srv.replay_all(&run_id, &token, 100).await;
    assert_eq!(events.last().unwrap()["type"], "run_completed");
}

/// GIVEN at least 1,000 events appended in small batches (more until the subscriber has
/// dropped 20 times) WHEN a WebSocket subscriber is dropped 20 times at random points
/// and each time reconnects and subscribes with `after` = its last sequence THEN it
/// receives every sequence exactly once, in order, and ends at `done`.
async fn dropped_twenty_times_misses_nothing(backend: Backend) {
    let srv = Arc::new(server(backend).await);
    let (run_id, token) = srv.create_run(json!({})).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    let dropped = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (srv, run_id, token) = (srv.clone(), run_id.clone(), token.clone());
        let dropped = dropped.clone();
        tokio::spawn(async move {
            let mut batches = 0u64;
            while batches < 100
                || (dropped.load(Ordering::SeqCst) < 20 && Instant::now() < deadline)
            {
                append(&srv, &run_id, &token, 10).await;
                batches += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let (status, _) = srv
                .post(&format!("/api/runs/{run_id}/complete"), &token, &json!({}))
                .await;
            assert_eq!(status, StatusCode::OK);
            batches
        })
    };
    let mut seen: Vec<u64> = Vec::new();
    let mut drops = 0;
    'outer: loop {
        assert!(
            Instant::now() < deadline,
            "took too long: {} seen",
            seen.len()
        );
        let mut ws = open(&srv.base, &srv.agent_token, "").await;
        subscribe(&mut ws, &run_id, seen.last().copied().unwrap_or(0)).await;
        let cut_after = if drops < 20 {
            rand::rng().random_range(1..=80)
        } else {
            usize::MAX
        };
        let mut read = 0;
        while let Some(f) = next(&mut ws).await {
            match f["event"].as_str().unwrap() {
                "done" => break 'outer,
                "subscribed" => continue,
                _ => {}
            }
            let id = f["id"].as_u64().expect("an event frame");
            seen.push(id);
            read += 1;
            if read >= cut_after {
                drops += 1;
                dropped.store(drops, Ordering::SeqCst);
                drop(ws);
                continue 'outer;
            }
        }
        panic!("the connection closed before done");
    }
    let batches = writer.await.unwrap();
    assert_eq!(drops, 20);
    assert_eq!(
        seen,
        (1..=batches * 10 + 2).collect::<Vec<u64>>(),
        "every sequence once, in order"
    );
}

/// GIVEN a server advertising its WebSocket endpoint, and one advertising none WHEN the
/// Rust client's operator follow reads a run that gets events and ends THEN it goes over
/// WebSocket on the first and SSE on the second, and hands out every event once, then
/// `Done`.
async fn client_follows_over_websocket_or_sse(backend: Backend) {
    for advertised in [true, false] {
        let mut deps = deps(backend).await;
        if !advertised {
            deps.websocket_url = None;
        }
        let srv = Arc::new(TestServer::with_deps(deps).await);
        let (run_id, token) = srv.create_run(json!({})).await;
        append(&srv, &run_id, &token, 3).await;
        let live: Value = srv
            .http
            .get(srv.url("/api/live"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(
            live,
            json!({"websocket_url": if advertised { json!("/api/ws") } else { Value::Null }, "sse": true})
        );
        let operator =
            tollgate_client::operator::Operator::new(&srv.base, &srv.operator_token).unwrap();
        let mut follow = operator.follow(&run_id, 0);
        let mut seqs = Vec::new();
        let writer = {
            let (srv, run_id, token) = (srv.clone(), run_id.clone(), token.clone());
            tokio::spawn(async move {
                append(&srv, &run_id, &token, 3).await;
                srv.post(&format!("/api/runs/{run_id}/complete"), &token, &json!({}))
                    .await
            })
        };
        loop {
            match tokio::time::timeout(WAIT, follow.next())
                .await
                .unwrap()
                .unwrap()
            {
                tollgate_client::operator::FollowItem::Event { sequence, .. } => {
                    seqs.push(sequence.unwrap())
                }
                tollgate_client::operator::FollowItem::Done { data } => {
                    let end: Value = serde_json::from_str(&data).unwrap();
                    assert_eq!(end["terminal_sequence"], 8);
                    break;
                }
                _ => {}
            }
        }
        assert_eq!(writer.await.unwrap().0, StatusCode::OK);
        assert_eq!(seqs, (1..=8).collect::<Vec<u64>>());
        assert_eq!(
            follow.transport(),
            if advertised { "websocket" } else { "sse" }
        );
    }
}

/// GIVEN a card armed on a run of a server advertising WebSocket WHEN the gate waits for
/// it and an operator approves THEN the gate's wait ends approved (delivered over the
/// WebSocket follower).
async fn gate_waits_over_websocket(backend: Backend) {
    let srv = Arc::new(server(backend).await);
    let client = tollgate_client::Client::new(&srv.base, &srv.agent_token).unwrap();
    let run = client
        .create_run(tollgate_client::RunSpec::default())
        .await
        .unwrap();
    let armed = run
        .arm(
            tollgate_client::GateRequest::new("deploy", json!({"env": "prod"})).request_id("req-1"),
        )
        .await
        .unwrap();
    assert!(armed.is_pending());
    let decider = {
        let srv = srv.clone();
        let run_id = run.id().to_owned();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(200)).await;
            srv.post(
                &format!("/api/runs/{run_id}/tool-approvals"),
                &srv.operator_token,
                &json!({"request_id": "req-1"}),
            )
            .await
        })
    };
    let decision = tokio::time::timeout(WAIT, run.wait(armed))
        .await
        .unwrap()
        .unwrap();
    assert!(decision.is_approved());
    assert_eq!(decider.await.unwrap().0, StatusCode::OK);
}

tollgate_tests::for_each_backend! {
    backlog_live_and_done => super::backlog_live_and_done;
    refusals_at_upgrade_and_subscribe => super::refusals_at_upgrade_and_subscribe;
    bad_messages => super::bad_messages;
    caps => super::caps;
    one_projects_idle_connections_leave_the_others_streaming => super::one_projects_idle_connections_leave_the_others_streaming;
    an_ended_runs_token_holds_no_connection => super::an_ended_runs_token_holds_no_connection;
    dropped_twenty_times_misses_nothing => super::dropped_twenty_times_misses_nothing;
    client_follows_over_websocket_or_sse => super::client_follows_over_websocket_or_sse;
    gate_waits_over_websocket => super::gate_waits_over_websocket;
}

/// GIVEN two `tollgate serve --backend aws` processes on the same DynamoDB tables (live
/// tails' safety poll an hour: only the stream reader can wake them in time) WHEN a
/// WebSocket subscriber on process A follows a run that is created, appended to and ended
/// through process B THEN it sees every event B appended, in order, then `done`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_a_subscriber_on_one_process_sees_appends_through_another() {
    let prefix = format!("ws-{}-", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    // The tables first (with their stream), so neither process creates a timer queue.
    let sdk = tollgate_store::dynamo::sdk_config().await;
    tollgate_store::schema::ensure_tables(
        &tollgate_store::dynamo::client(&sdk),
        &tollgate_store::dynamo::Tables::with_prefix(&prefix),
    )
    .await
    .unwrap();
    let env = [
        ("TOLLGATE_BACKEND", "aws"),
        ("TOLLGATE_TABLE_PREFIX", prefix.as_str()),
        ("TOLLGATE_LIVE_SAFETY_POLL_SECONDS", "3600"),
    ];
    let a = tollgate_tests::serve::ServeProcess::start(&env);
    let b = tollgate_tests::serve::ServeProcess::start(&env);
    let on_b = TestServer::remote(&b.base);
    let (run_id, token) = on_b.create_run(json!({})).await;
    let mut ws = open(&a.base, &on_b.agent_token, "").await;
    subscribe(&mut ws, &run_id, 0).await;
    assert_eq!(next(&mut ws).await.unwrap()["event"], "subscribed");
    assert_eq!(next(&mut ws).await.unwrap()["id"], 1);
    let mut seen = vec![1];
    for round in 0..5 {
        append(&on_b, &run_id, &token, 4).await;
        for _ in 0..4 {
            let f = next(&mut ws)
                .await
                .unwrap_or_else(|| panic!("closed in round {round}"));
            seen.push(f["id"].as_u64().unwrap());
        }
    }
    let (status, _) = on_b
        .post(&format!("/api/runs/{run_id}/complete"), &token, &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (rest, done) = events_until_done(&mut ws).await;
    seen.extend(rest.iter().map(|f| f["id"].as_u64().unwrap()));
    assert_eq!(seen, (1..=22).collect::<Vec<u64>>());
    assert_eq!(done["data"]["terminal_sequence"], 22);
}

/// GIVEN `tollgate serve` (embedded store), which advertises its WebSocket endpoint WHEN
/// `tollgate watch RUN` follows a run that gets events and ends THEN it prints every
/// event and the end, and says it follows over WebSocket; against a server that
/// advertises none it prints the same over SSE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_over_websocket_and_falls_back_to_sse() {
    let serve = tollgate_tests::serve::ServeProcess::start(&[]);
    let sse_only = TestServer::with_deps(TestServer::deps(
        Arc::new(MemoryStore::new()),
        GateConfig::default(),
    ))
    .await;
    for (base, websocket) in [(serve.base.clone(), true), (sse_only.base.clone(), false)] {
        let srv = TestServer::remote(&base);
        let (run_id, token) = srv.create_run(json!({})).await;
        append(&srv, &run_id, &token, 2).await;
        let child = std::process::Command::new(tollgate_tests::serve::tollgate_bin())
            .args(["watch", &run_id])
            .env("TOLLGATE_URL", &base)
            .env("TOLLGATE_TOKEN", &srv.operator_token)
            .env_remove("TOLLGATE_SECRET")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        append(&srv, &run_id, &token, 2).await;
        let (status, _) = srv
            .post(&format!("/api/runs/{run_id}/complete"), &token, &json!({}))
            .await;
        assert_eq!(status, StatusCode::OK);
        let out = tokio::time::timeout(
            WAIT,
            tokio::task::spawn_blocking(move || child.wait_with_output()),
        )
        .await
        .expect("watch ends at done")
        .unwrap()
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stdout}\n{stderr}");
        let lines: Vec<&str> = stdout.lines().collect();
        assert_eq!(lines.len(), 7, "{stdout}");
        for (i, line) in lines[..6].iter().enumerate() {
            assert!(line.starts_with(&format!("#{} ", i + 1)), "{line}");
        }
        assert_eq!(lines[6], "done: the run ended at #6");
        assert_eq!(
            stderr.contains("following live over WebSocket"),
            websocket,
            "{stderr}"
        );
    }
}
