//! The live event stream (SSE) as a client sees it, on the embedded store and on
//! DynamoDB: frames, `Last-Event-ID` resumption, the terminal `done` frame, keep-alives,
//! the bounded window, and a client dropped at random points while events are appended
//! that still receives every sequence exactly once, in order.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use reqwest::StatusCode;
use serde_json::{json, Value};
use tollgate_api::functions::Callers;
use tollgate_api::sse::SseConfig;
use tollgate_api::GateConfig;
use tollgate_tests::{store_for, Backend, TestServer};

/// One SSE frame as a client parses it.
#[derive(Debug, Clone, PartialEq)]
struct Frame {
    id: Option<u64>,
    event: Option<String>,
    data: Option<String>,
    retry: Option<u64>,
    comment: bool,
}

fn parse_frame(text: &str) -> Frame {
    let mut f = Frame {
        id: None,
        event: None,
        data: None,
        retry: None,
        comment: false,
    };
    for line in text.lines() {
        if line.starts_with(':') {
            f.comment = true;
        } else if let Some(v) = line.strip_prefix("id: ") {
            f.id = Some(v.parse().expect("numeric id"));
        } else if let Some(v) = line.strip_prefix("event: ") {
            f.event = Some(v.to_owned());
        } else if let Some(v) = line.strip_prefix("data: ") {
            f.data = Some(v.to_owned());
        } else if let Some(v) = line.strip_prefix("retry: ") {
            f.retry = Some(v.parse().expect("numeric retry"));
        } else {
            panic!("unexpected SSE line {line:?}");
        }
    }
    f
}

/// An open stream: frames as they arrive.
struct Stream {
    resp: reqwest::Response,
    buf: String,
}

impl Stream {
    /// The next frame, `None` when the server ended the response.
    async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let text: String = self.buf.drain(..end + 2).collect();
                return Some(parse_frame(text.trim_end_matches('\n')));
            }
            match self.resp.chunk().await.expect("the stream reads") {
                Some(chunk) => self.buf.push_str(std::str::from_utf8(&chunk).unwrap()),
                None => {
                    assert!(
                        self.buf.is_empty(),
                        "a partial frame at the end: {:?}",
                        self.buf
                    );
                    return None;
                }
            }
        }
    }
}

/// The frames until the server ends the response; `None` if it has not within 60 s (a
/// bound so that a regression fails instead of hanging for a long window).
async fn rest_of(stream: &mut Stream) -> Option<Vec<Frame>> {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut rest = Vec::new();
        while let Some(frame) = stream.next().await {
            rest.push(frame);
        }
        rest
    })
    .await
    .ok()
}

async fn server(backend: Backend, sse: SseConfig) -> TestServer {
    let mut deps = TestServer::deps(store_for(backend).await, GateConfig::default());
    deps.sse = sse;
    TestServer::with_deps(deps).await
}

async fn open(srv: &TestServer, path: &str, token: &str, last_event_id: Option<&str>) -> Stream {
    let mut req = srv
        .http
        .get(srv.url(path))
        .bearer_auth(token)
        .header("accept", "text/event-stream");
    if let Some(id) = last_event_id {
        req = req.header("last-event-id", id);
    }
    let resp = req.send().await.expect("request reaches the server");
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(
        resp.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    Stream {
        resp,
        buf: String::new(),
    }
}

async fn append(srv: &TestServer, run_id: &str, token: &str, n: usize) {
    let events: Vec<Value> = (0..n)
        .map(|i| json!({"type": "agent.message", "n": i}))
        .collect();
    srv.append(run_id, token, json!(events)).await;
}

/// GIVEN a run with events WHEN a client streams it (via `/events` with `Accept:
/// text/event-stream` and via `/stream`) THEN a `retry:` hint, then one frame per event
/// with `id` = sequence, `event` = type and `data` = exactly the replayed JSON; after the
/// terminal event a `done` frame without id, then the end. `Last-Event-ID: N` starts
/// after N (and wins over `?after=`); a bad one is 400.
async fn frames_resume_and_done(backend: Backend) {
    let srv = server(backend, SseConfig::default()).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    append(&srv, &run_id, &token, 5).await;
    let replayed = srv.replay_all(&run_id, &token, 100).await;
    let (status, _) = srv
        .post(&format!("/api/runs/{run_id}/complete"), &token, &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let all = srv.replay_all(&run_id, &token, 100).await;
    assert_eq!(all.len(), 7);

    for path in [
        format!("/api/runs/{run_id}/events"),
        format!("/api/runs/{run_id}/stream"),
    ] {
        let mut s = open(&srv, &path, &token, None).await;
        let first = s.next().await.unwrap();
        assert_eq!(first.retry, Some(1000), "{first:?}");
        for (i, event) in all.iter().enumerate() {
            let f = s.next().await.unwrap();
            assert_eq!(f.id, Some(i as u64 + 1));
            assert_eq!(f.event.as_deref(), event["type"].as_str());
            let data: Value = serde_json::from_str(f.data.as_deref().unwrap()).unwrap();
            assert_eq!(&data, event, "data is the replayed event");
        }
        let done = s.next().await.unwrap();
        assert_eq!((done.id, done.event.as_deref()), (None, Some("done")));
        let body: Value = serde_json::from_str(done.data.as_deref().unwrap()).unwrap();
        assert_eq!(body, json!({"run_id": run_id, "terminal_sequence": 7}));
        assert_eq!(s.next().await, None, "the response ends after done");
    }
    // The replayed events before the end are a prefix of the stream.
    assert_eq!(&all[..replayed.len()], &replayed[..]);

    // Last-Event-ID: exactly the events after it, and it wins over ?after=.
    let mut s = open(
        &srv,
        &format!("/api/runs/{run_id}/stream?after=1"),
        &token,
        Some("4"),
    )
    .await;
    assert!(s.next().await.unwrap().retry.is_some());
    let ids: Vec<Option<u64>> = [s.next().await, s.next().await, s.next().await]
        .into_iter()
        .map(|f| f.unwrap().id)
        .collect();
    assert_eq!(ids, [Some(5), Some(6), Some(7)]);
    assert_eq!(s.next().await.unwrap().event.as_deref(), Some("done"));
    // Past the end: only done.
    let mut s = open(
        &srv,
        &format!("/api/runs/{run_id}/stream"),
        &token,
        Some("7"),
    )
    .await;
    assert!(s.next().await.unwrap().retry.is_some());
    assert_eq!(s.next().await.unwrap().event.as_deref(), Some("done"));

    // Past the run's last event: not a sequence this run's stream ever had.
    let past = u64::MAX.to_string();
    for bad in ["x", "-1", "1.5", "", "8", past.as_str()] {
        let (status, body) = srv
            .send(
                srv.http
                    .get(srv.url(&format!("/api/runs/{run_id}/stream")))
                    .bearer_auth(&token)
                    .header("last-event-id", bad),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad:?}: {body}");
        assert!(body["error"].as_str().unwrap().contains("Last-Event-ID"));
    }
    let (status, _) = srv
        .send(
            srv.http
                .get(srv.url(&format!("/api/runs/{run_id}/stream")))
                .bearer_auth(srv.agent_token.replace('.', "")),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let other = srv
        .auth
        .mint_jwt("other-agent", tollgate_api::Role::Agent, 60, None);
    let (status, _) = srv
        .send(
            srv.http
                .get(srv.url(&format!("/api/runs/{run_id}/stream")))
                .bearer_auth(&other),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "another agent's run");
    // The names the stream and EventSource reserve are not run events.
    let (run2, token2) = srv.create_run(json!({})).await;
    for reserved in ["done", "error", "open", "message"] {
        let (status, body) = srv
            .post(
                &format!("/api/runs/{run2}/events"),
                &token2,
                &json!({"events": [{"type": reserved}]}),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{reserved}: {body}");
    }
}

/// GIVEN a running run nobody appends to WHEN a client follows it THEN keep-alive
/// comments arrive while it waits, the response ends cleanly (no `done`) when the window
/// is over, and an event appended during the window arrives live.
async fn keepalive_live_and_window(backend: Backend) {
    let srv = server(
        backend,
        SseConfig {
            window: Duration::from_millis(2500),
            keepalive: Duration::from_millis(400),
            ..SseConfig::default()
        },
    )
    .await;
    let (run_id, token) = srv.create_run(json!({})).await;
    let mut s = open(&srv, &format!("/api/runs/{run_id}/stream"), &token, None).await;
    assert!(s.next().await.unwrap().retry.is_some());
    assert_eq!(s.next().await.unwrap().id, Some(1), "run_started");
    let mut frames = Vec::new();
    let appended_at = Instant::now();
    append(&srv, &run_id, &token, 1).await;
    let mut live_after = None;
    let started = Instant::now();
    while let Some(f) = s.next().await {
        if f.id == Some(2) {
            live_after = Some(appended_at.elapsed());
        }
        frames.push(f);
    }
    let open_for = started.elapsed();
    assert!(
        live_after.is_some(),
        "the appended event arrived: {frames:?}"
    );
    assert!(
        frames.iter().filter(|f| f.comment).count() >= 2,
        "keep-alives while idle: {frames:?}"
    );
    assert!(
        frames.iter().all(|f| f.event.as_deref() != Some("done")),
        "no done before the run ends"
    );
    assert!(
        open_for < Duration::from_secs(10),
        "the window ended the response"
    );
}

/// GIVEN at least 1,000 events appended in small batches (more until the client has
/// dropped 20 times) WHEN a client is dropped 20 times at random points and resumes each
/// time with `Last-Event-ID` THEN it receives every sequence exactly once, in order, and
/// ends at `done`.
async fn dropped_twenty_times_misses_nothing(backend: Backend) {
    let srv = Arc::new(server(backend, SseConfig::default()).await);
    let (run_id, token) = srv.create_run(json!({})).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    // The reader's drops so far: the writer goes on appending (past its 100 batches) until
    // the reader has dropped 20 times, so a fast writer cannot end the run first.
    let dropped = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let writer = {
        let (srv, run_id, token) = (srv.clone(), run_id.clone(), token.clone());
        let dropped = dropped.clone();
        tokio::spawn(async move {
            let mut batches = 0u64;
            while batches < 100
                || (dropped.load(std::sync::atomic::Ordering::SeqCst) < 20
                    && Instant::now() < deadline)
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
        let last = seen.last().map(|s| s.to_string());
        let mut s = open(
            &srv,
            &format!("/api/runs/{run_id}/stream"),
            &token,
            last.as_deref(),
        )
        .await;
        let cut_after = if drops < 20 {
            rand::rng().random_range(1..=80)
        } else {
            usize::MAX
        };
        let mut read = 0;
        while let Some(f) = s.next().await {
            if f.event.as_deref() == Some("done") {
                break 'outer;
            }
            if let Some(id) = f.id {
                seen.push(id);
                read += 1;
                if read >= cut_after {
                    drops += 1;
                    dropped.store(drops, std::sync::atomic::Ordering::SeqCst);
                    drop(s);
                    continue 'outer;
                }
            }
        }
    }
    let batches = writer.await.unwrap();
    assert_eq!(drops, 20);
    // run_started, the appended events, run_completed.
    assert_eq!(
        seen,
        (1..=batches * 10 + 2).collect::<Vec<u64>>(),
        "every sequence once, in order"
    );
}

/// GIVEN the function that serves operators only (`operator-stream`) on the same store
/// as one that serves everyone WHEN the run's creating agent, its run token and an
/// operator ask it for the run's live stream and its replay THEN the agent and the run
/// token get 403 as JSON (for the stream and for the replay, nothing streamed; every other
/// route too, and 401 without a token), and the operator gets every frame, then `done`.
async fn operator_stream_serves_operators_only(backend: Backend) {
    let store = store_for(backend).await;
    let everyone = TestServer::with_store(store.clone()).await;
    let operators = TestServer::with_deps(
        TestServer::deps(store, GateConfig::default()).with_callers(Callers::Operators),
    )
    .await;
    let (run_id, token) = everyone.create_run(json!({})).await;
    append(&everyone, &run_id, &token, 2).await;
    let (status, _) = everyone
        .post(&format!("/api/runs/{run_id}/complete"), &token, &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let stream = format!("/api/runs/{run_id}/stream");
    let replay = format!("/api/runs/{run_id}/events");
    for who in [&everyone.agent_token, &token] {
        // Still readable where everyone is served.
        let _ = open(&everyone, &stream, who, None).await;
        for path in [&stream, &replay] {
            let resp = operators
                .http
                .get(operators.url(path))
                .bearer_auth(who)
                .header("accept", "text/event-stream")
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::FORBIDDEN, "{path}");
            assert!(resp.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/json"));
            let body: Value = resp.json().await.unwrap();
            assert!(
                body["error"]
                    .as_str()
                    .unwrap()
                    .contains("operator tokens only"),
                "{body}"
            );
        }
        let (status, body) = operators.get(&replay, who).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    }
    // Every route of that function, the console and unknown paths included, and before
    // the path is even parsed: no token is 401, any other token 403, as JSON.
    for (path, token, want) in [
        (
            "/console",
            Some(everyone.agent_token.as_str()),
            StatusCode::FORBIDDEN,
        ),
        ("/console", None, StatusCode::UNAUTHORIZED),
        (stream.as_str(), None, StatusCode::UNAUTHORIZED),
        ("/api/runs/%FF/stream", None, StatusCode::UNAUTHORIZED),
        (
            "/no/such/route",
            Some(token.as_str()),
            StatusCode::FORBIDDEN,
        ),
    ] {
        let mut req = operators.http.get(operators.url(path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let (status, body) = operators.send(req).await;
        assert_eq!(status, want, "{path}: {body}");
        assert!(body["error"].is_string(), "{path}: {body}");
    }
    let page = operators
        .http
        .get(operators.url("/console"))
        .bearer_auth(&operators.operator_token)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let mut s = open(&operators, &stream, &operators.operator_token, None).await;
    let frames = rest_of(&mut s).await.expect("the stream ends after done");
    let ids: Vec<u64> = frames.iter().filter_map(|f| f.id).collect();
    assert_eq!(ids, [1, 2, 3, 4]);
    let last = frames.last().unwrap();
    assert_eq!((last.event.as_deref(), last.id), (Some("done"), None));
    let (status, body) = operators.get(&replay, &operators.operator_token).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["events"].as_array().unwrap().len(), 4);
}

/// GIVEN a server whose caps are 2 streams per run token, 3 per agent and 4 per project
/// WHEN one run token opens a third stream THEN 429 JSON with `Retry-After` (before any
/// stream byte), while another agent's run token and an operator still get streams; the
/// creating agent's JWT streams and its runs' token streams together stop at the
/// agent's cap (3: runs, which cost nothing, buy no more places); once a stream closes,
/// its place is free again.
async fn streams_are_capped_per_run_agent_and_project(backend: Backend) {
    let sse = SseConfig {
        caps: tollgate_api::sse::StreamCaps {
            per_run: 2,
            per_agent: 3,
            per_project: 4,
        },
        ..SseConfig::default()
    };
    let srv = server(backend, sse).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    let path = format!("/api/runs/{run_id}/stream");
    let refused = |resp: reqwest::Response| async move {
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(resp.headers().contains_key("retry-after"));
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json"));
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["state"], "too_many_streams", "{body}");
        body["error"].as_str().unwrap().to_owned()
    };
    let get = |path: String, token: String| {
        let req = srv.http.get(srv.url(&path)).bearer_auth(token);
        async move { req.send().await.unwrap() }
    };
    let a = open(&srv, &path, &token, None).await;
    let _b = open(&srv, &path, &token, None).await;
    let error = refused(get(path.clone(), token.clone()).await).await;
    assert!(error.contains("run token"), "{error}");
    // Another agent's run still gets a stream; so does an operator.
    let other_agent = srv
        .auth
        .mint_jwt("other-agent", tollgate_api::Role::Agent, 600, None);
    let (status, created) = srv.post("/api/runs", &other_agent, &json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let other_path = format!("/api/runs/{}/stream", created["run_id"].as_str().unwrap());
    let other_token = created["run_token"].as_str().unwrap();
    let _other = open(&srv, &other_path, other_token, None).await;
    let _op = open(&srv, &path, &srv.operator_token, None).await;
    let _op2 = open(&srv, &path, &srv.operator_token, None).await;
    let _op3 = open(&srv, &path, &srv.operator_token, None).await;
    // The creating agent's own JWT shares its cap (3) with its runs' token streams.
    let _j1 = open(&srv, &path, &srv.agent_token, None).await;
    let error = refused(get(path.clone(), srv.agent_token.clone()).await).await;
    assert!(error.contains("agent"), "{error}");
    // A place freed by a closed stream is free again (the server notices the close).
    drop(a);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let resp = get(path.clone(), token.clone()).await;
        if resp.status() == StatusCode::OK {
            break;
        }
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert!(Instant::now() < deadline, "a place was freed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A run log whose lagging head read (`read_head_lagging`) answers the head as it was
/// `lag` reads ago, and which gives no write signal (so a stream polls, as on DynamoDB).
struct LaggingHead {
    inner: Arc<dyn tollgate_store::Store>,
    lag: usize,
    seen: std::sync::Mutex<std::collections::VecDeque<tollgate_domain::RunHead>>,
    lagging_reads: std::sync::atomic::AtomicUsize,
}

#[async_trait::async_trait]
impl tollgate_store::RunStore for LaggingHead {
    async fn create_run(
        &self,
        new: tollgate_domain::NewRun,
    ) -> Result<tollgate_store::CreateOutcome, tollgate_store::StoreError> {
        self.inner.create_run(new).await
    }
    async fn append_events(
        &self,
        run: tollgate_store::RunRef<'_>,
        events: Vec<tollgate_domain::EventDraft>,
    ) -> Result<Vec<u64>, tollgate_store::StoreError> {
        self.inner.append_events(run, events).await
    }
    async fn finish_run(
        &self,
        run: tollgate_store::RunRef<'_>,
        kind: tollgate_domain::TerminalKind,
        payload: serde_json::Map<String, Value>,
    ) -> Result<tollgate_store::Finished, tollgate_store::StoreError> {
        self.inner.finish_run(run, kind, payload).await
    }
    async fn read_head(
        &self,
        run_id: &str,
    ) -> Result<Option<tollgate_domain::RunHead>, tollgate_store::StoreError> {
        self.inner.read_head(run_id).await
    }
    async fn read_head_lagging(
        &self,
        run_id: &str,
    ) -> Result<Option<tollgate_domain::RunHead>, tollgate_store::StoreError> {
        self.lagging_reads
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let Some(now) = self.inner.read_head(run_id).await? else {
            return Ok(None);
        };
        let mut seen = self.seen.lock().unwrap();
        seen.push_back(now);
        let old = if seen.len() > self.lag {
            seen.pop_front()
        } else {
            seen.front().cloned()
        };
        Ok(old)
    }
    async fn read_events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<tollgate_store::EventPage, tollgate_store::StoreError> {
        self.inner.read_events(run_id, after, limit).await
    }
    async fn list_runs(
        &self,
        project_id: Option<&str>,
        filter: &tollgate_store::RunFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<tollgate_store::RunPage, tollgate_store::StoreError> {
        self.inner
            .list_runs(project_id, filter, cursor, limit)
            .await
    }
}

/// GIVEN a stream that waits by polling a head read that lags several polls behind the
/// writes (an eventually consistent read) WHEN events are appended one by one and the
/// run completes THEN the stream still delivers every event exactly once, in order, each
/// against a strong read of the head, and ends at `done`: a lagging poll only delays.
async fn lagging_head_polls_only_delay(backend: Backend) {
    let inner = store_for(backend).await;
    let lagging = Arc::new(LaggingHead {
        inner: inner.clone(),
        lag: 3,
        seen: Default::default(),
        lagging_reads: Default::default(),
    });
    let mut deps = TestServer::deps(inner, GateConfig::default()).with_run_store(lagging.clone());
    deps.sse = SseConfig {
        poll_min: Duration::from_millis(20),
        poll_max: Duration::from_millis(40),
        ..SseConfig::default()
    };
    let srv = TestServer::with_deps(deps).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    let mut s = open(&srv, &format!("/api/runs/{run_id}/stream"), &token, None).await;
    assert!(s.next().await.unwrap().retry.is_some());
    assert_eq!(s.next().await.unwrap().id, Some(1), "run_started");
    for i in 0..5 {
        append(&srv, &run_id, &token, 1).await;
        let f = tokio::time::timeout(Duration::from_secs(10), s.next())
            .await
            .expect("the event arrives despite the lag")
            .unwrap();
        assert_eq!(f.id, Some(2 + i), "in order, once");
    }
    let (status, _) = srv
        .post(&format!("/api/runs/{run_id}/complete"), &token, &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let rest = rest_of(&mut s).await.expect("the stream ends");
    let ids: Vec<u64> = rest.iter().filter_map(|f| f.id).collect();
    assert_eq!(ids, vec![7], "the terminal event, once");
    assert_eq!(rest.last().unwrap().event.as_deref(), Some("done"));
    assert!(
        lagging
            .lagging_reads
            .load(std::sync::atomic::Ordering::SeqCst)
            > 5,
        "the waits polled the lagging read"
    );
}

macro_rules! on_both_stores {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::Backend::Memory).await
                }
            )*
        }
        mod dynamo {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(super::Backend::Dynamo).await
                }
            )*
        }
    };
}

on_both_stores!(
    frames_resume_and_done,
    keepalive_live_and_window,
    dropped_twenty_times_misses_nothing,
    operator_stream_serves_operators_only,
    streams_are_capped_per_run_agent_and_project,
    lagging_head_polls_only_delay,
);

/// GIVEN a real `tollgate serve` (window of an hour) with a live stream open WHEN the
/// process gets SIGTERM THEN the stream ends cleanly (whole frames, no `done`: the client
/// resumes elsewhere) and the process exits by itself instead of waiting out the window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_ends_open_streams_on_sigterm() {
    use tollgate_tests::serve::ServeProcess;
    let mut serve = ServeProcess::start(&[("TOLLGATE_SSE_WINDOW_SECONDS", "3600")]);
    let auth = tollgate_api::Auth::new(tollgate_tests::TEST_SECRET.as_bytes());
    let agent = auth.mint_jwt("test-agent", tollgate_api::Role::Agent, 600, None);
    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{}/api/runs", serve.base))
        .bearer_auth(&agent)
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run_id = created["run_id"].as_str().unwrap();
    let resp = http
        .get(format!("{}/api/runs/{run_id}/stream", serve.base))
        .bearer_auth(created["run_token"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut stream = Stream {
        resp,
        buf: String::new(),
    };
    assert!(stream.next().await.unwrap().retry.is_some());
    assert_eq!(stream.next().await.unwrap().id, Some(1));
    serve.terminate();
    // Bounded so a regression fails instead of hanging for the hour-long window.
    let rest = rest_of(&mut stream)
        .await
        .expect("the stream ended when the process was stopped");
    assert!(
        rest.iter().all(|f| f.comment && f.event.is_none()),
        "nothing but keep-alives after the stop, no done: {rest:?}"
    );
    let status = tokio::task::spawn_blocking(move || serve.wait_exit(Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("serve exited after SIGTERM");
    assert!(status.success(), "{status:?}");
}

/// GIVEN an operator token that expires in 2 s and an hour-long window WHEN it follows a
/// run THEN the stream ends cleanly (no `done`) when the token does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ends_when_its_token_does() {
    let srv = server(
        Backend::Memory,
        SseConfig {
            window: Duration::from_secs(3600),
            ..SseConfig::default()
        },
    )
    .await;
    let (run_id, _) = srv.create_run(json!({})).await;
    let short = srv
        .auth
        .mint_jwt("test-operator", tollgate_api::Role::Operator, 2, None);
    let mut s = open(&srv, &format!("/api/runs/{run_id}/stream"), &short, None).await;
    assert!(s.next().await.unwrap().retry.is_some());
    assert_eq!(s.next().await.unwrap().id, Some(1));
    let rest = rest_of(&mut s)
        .await
        .expect("the stream ended with its token");
    assert!(rest.iter().all(|f| f.comment), "{rest:?}");
}

/// GIVEN a server that holds at most 2 live streams per class WHEN a third run-token
/// stream opens THEN 503 with `Retry-After` (JSON, before any stream byte) while an
/// operator's still opens; once one closes, a new one opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_streams_are_bounded() {
    let deps = TestServer::deps(store_for(Backend::Memory).await, GateConfig::default())
        .with_stream_limit(2);
    let srv = TestServer::with_deps(deps).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    let path = format!("/api/runs/{run_id}/stream");
    let a = open(&srv, &path, &token, None).await;
    let _b = open(&srv, &path, &token, None).await;
    let resp = srv
        .http
        .get(srv.url(&path))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(resp.headers().contains_key("retry-after"));
    let body: Value = resp.json().await.unwrap();
    assert!(body["error"].as_str().unwrap().contains("live streams"));
    // Operators have places of their own: the agent's streams do not lock them out.
    let _op = open(&srv, &path, &srv.operator_token, None).await;
    drop(a);
    // The server notices the closed connection and frees its place.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let resp = srv
            .http
            .get(srv.url(&path))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap();
        if resp.status() == StatusCode::OK {
            break;
        }
        assert!(Instant::now() < deadline, "a place was freed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
