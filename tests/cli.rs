//! The `tollgate` client commands (`watch`, `approvals`, `approve`, `deny`, `runs`) as a user
//! runs them: the built binary (`target/debug/tollgate`, or
//! `$CARGO_TARGET_DIR/debug/tollgate`; `cargo build -p tollgate` builds it) against an
//! in-process server on the embedded store, or against a small fake server for what
//! the real one cannot be made to do on cue (a connection dropped mid-frame, a 503).
//! Every process has a deadline and is killed when the test ends.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode as AxumStatus};
use axum::response::{IntoResponse, Response};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tollgate_api::sse::SseConfig;
use tollgate_api::{GateConfig, Role};
use tollgate_tests::{store_for, Backend, TestServer};

/// Longest any one command may run.
const DEADLINE: Duration = Duration::from_secs(30);

const REQUEST_ID: &str = "5f0c7a2e-9d41-4c1b-8e3a-2b6d1f9e4a70";

fn tollgate_bin() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let bin = target.join("debug").join("tollgate");
    assert!(
        bin.is_file(),
        "{} is missing: build it first (`cargo build -p tollgate`)",
        bin.display()
    );
    bin
}

/// `tollgate ARGS` with `TOLLGATE_URL`/`TOLLGATE_TOKEN` set (and nothing else of ours).
fn tollgate(url: &str, token: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(tollgate_bin());
    cmd.args(args)
        .env("TOLLGATE_URL", url)
        .env("TOLLGATE_TOKEN", token)
        .env_remove("TOLLGATE_SECRET")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

#[derive(Debug)]
struct Output {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Output {
    fn lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }

    /// Neither stream shows the token.
    fn keeps_secret(&self, token: &str) {
        assert!(
            !self.stdout.contains(token) && !self.stderr.contains(token),
            "the token leaked: {self:?}"
        );
    }
}

/// Kills the process when dropped (a failing test leaves nothing running).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn drain(mut from: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = from.read_to_string(&mut s);
        s
    })
}

/// Runs the command to its end (at most `DEADLINE`), off the async runtime.
async fn run(mut cmd: Command) -> Output {
    tokio::task::spawn_blocking(move || {
        let mut child = Running(cmd.spawn().expect("tollgate starts"));
        let out = drain(child.0.stdout.take().unwrap());
        let err = drain(child.0.stderr.take().unwrap());
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.0.try_wait().unwrap() {
                break status;
            }
            assert!(
                started.elapsed() < DEADLINE,
                "tollgate did not finish within {DEADLINE:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        Output {
            code: status.code().expect("exited, not killed"),
            stdout: out.join().unwrap(),
            stderr: err.join().unwrap(),
        }
    })
    .await
    .unwrap()
}

/// A command left running: its stdout line by line as it comes.
struct Live {
    child: Running,
    lines: tokio::sync::mpsc::UnboundedReceiver<String>,
    stderr: Option<std::thread::JoinHandle<String>>,
    seen: Vec<String>,
}

impl Live {
    fn start(mut cmd: Command) -> Self {
        let mut child = Running(cmd.spawn().expect("tollgate starts"));
        let (tx, lines) = tokio::sync::mpsc::unbounded_channel();
        let stdout = child.0.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Some(drain(child.0.stderr.take().unwrap()));
        Self {
            child,
            lines,
            stderr,
            seen: Vec::new(),
        }
    }

    /// The next line (within 10 s).
    async fn line(&mut self) -> String {
        let line = tokio::time::timeout(Duration::from_secs(10), self.lines.recv())
            .await
            .unwrap_or_else(|_| panic!("no line within 10 s; so far {:?}", self.seen))
            .unwrap_or_else(|| panic!("stdout ended; so far {:?}", self.seen));
        self.seen.push(line.clone());
        line
    }

    /// Waits for the exit (within `DEADLINE`): the code and stderr.
    async fn finish(mut self) -> (i32, String, Vec<String>) {
        let started = Instant::now();
        let code = loop {
            if let Some(status) = self.child.0.try_wait().unwrap() {
                break status.code().expect("exited, not killed");
            }
            assert!(started.elapsed() < DEADLINE, "tollgate did not exit");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        while let Ok(Some(line)) =
            tokio::time::timeout(Duration::from_secs(5), self.lines.recv()).await
        {
            self.seen.push(line);
        }
        let stderr = self.stderr.take().unwrap().join().unwrap();
        (code, stderr, std::mem::take(&mut self.seen))
    }
}

async fn server(sse: SseConfig) -> TestServer {
    let mut deps = TestServer::deps(store_for(Backend::Memory).await, GateConfig::default());
    deps.sse = sse;
    TestServer::with_deps(deps).await
}

async fn arm(srv: &TestServer, run_id: &str, token: &str, body: Value) -> Value {
    let (status, v) = srv
        .post(
            &format!("/api/runs/{run_id}/approval-requests"),
            token,
            &body,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "arm: {v}");
    v
}

/// A finished run: message, tool call, an approved card, completed.
async fn finished_run(srv: &TestServer) -> (String, String) {
    let (run_id, token) = srv
        .create_run(json!({"channel_id": "C1", "owner": "alice"}))
        .await;
    srv.append(
        &run_id,
        &token,
        json!([{"type": "agent.message", "text": "looking this up"},
               {"type": "tool.call", "event_id": "call-1", "tool": "web_fetch"}]),
    )
    .await;
    arm(
        srv,
        &run_id,
        &token,
        json!({"request_id": REQUEST_ID, "tool_name": "web_fetch",
               "url": "https://example.com/docs"}),
    )
    .await;
    let (status, v) = srv
        .post(
            &format!("/api/runs/{run_id}/tool-approvals"),
            &srv.operator_token,
            &json!({"request_id": REQUEST_ID, "scope": "once"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, _) = srv
        .post(&format!("/api/runs/{run_id}/complete"), &token, &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    (run_id, token)
}

/// GIVEN a finished run WHEN `tollgate watch RUN` THEN one line per event
/// (`#SEQ TIMESTAMP TYPE …`, the approval events in words), then `done`, exit 0;
/// `--after N` starts after N; the token may come from `--token`/`--url` as well.
#[tokio::test(flavor = "multi_thread")]
async fn watch_prints_each_event_and_exits_at_done() {
    let srv = server(SseConfig::default()).await;
    let (run_id, _) = finished_run(&srv).await;
    let events = srv.replay_all(&run_id, &srv.operator_token, 100).await;
    assert_eq!(events.len(), 6);

    let out = run(tollgate(
        &srv.base,
        &srv.operator_token,
        &["watch", &run_id],
    ))
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stderr, "");
    out.keeps_secret(&srv.operator_token);
    let lines = out.lines();
    assert_eq!(lines.len(), events.len() + 1, "{lines:#?}");
    for (line, e) in lines.iter().zip(&events) {
        let head = format!(
            "#{} {} {}",
            e["sequence"],
            e["timestamp_utc"].as_str().unwrap(),
            e["type"].as_str().unwrap()
        );
        assert!(line.starts_with(&head), "{line:?} vs {head:?}");
    }
    assert!(
        lines[0].ends_with("run_started kind=single owner=alice"),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].ends_with(r#"agent.message "looking this up""#),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].ends_with("tool.call event_id=call-1 tool=web_fetch"),
        "{}",
        lines[2]
    );
    assert!(
        lines[3].ends_with(
            "tool.approval_required web_fetch https://example.com/docs (request 5f0c7a2e…)"
        ),
        "{}",
        lines[3]
    );
    assert!(
        lines[4].ends_with(
            "tool.approval_resolved approved (scope once) by test-operator (request 5f0c7a2e…)"
        ),
        "{}",
        lines[4]
    );
    assert!(lines[5].ends_with(" run_completed"), "{}", lines[5]);
    assert_eq!(lines[6], "done: the run ended at #6");

    // --after, and the flags instead of the environment.
    let mut cmd = tollgate("", "", &["watch", &run_id, "--after", "4"]);
    cmd.env_remove("TOLLGATE_URL")
        .env_remove("TOLLGATE_TOKEN")
        .args(["--url", &srv.base, "--token", &srv.operator_token]);
    let out = run(cmd).await;
    assert_eq!(out.code, 0, "{out:?}");
    let lines = out.lines();
    assert_eq!(lines.len(), 3, "{lines:#?}");
    assert!(lines[0].starts_with("#5 "));
    assert!(lines[1].starts_with("#6 "));
    assert_eq!(lines[2], "done: the run ended at #6");
}

/// `--json`: exactly the replayed events, one JSON object per line, nothing else.
#[tokio::test(flavor = "multi_thread")]
async fn watch_json_prints_the_replayed_events() {
    let srv = server(SseConfig::default()).await;
    let (run_id, run_token) = finished_run(&srv).await;
    let events = srv.replay_all(&run_id, &run_token, 100).await;
    // The run's own token reads its stream too.
    let out = run(tollgate(
        &srv.base,
        &run_token,
        &["watch", &run_id, "--json"],
    ))
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stderr, "");
    let printed: Vec<Value> = out
        .lines()
        .iter()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_eq!(printed, events);
}

/// GIVEN a live run and a server whose responses end after 300 ms WHEN events arrive
/// across several windows THEN `watch` resumes by itself (silently, after the `retry:`
/// hint) and prints every event once, in order, then exits 0 at `done`.
#[tokio::test(flavor = "multi_thread")]
async fn watch_follows_live_and_resumes_after_each_window() {
    let srv = server(SseConfig {
        window: Duration::from_millis(300),
        retry: Duration::from_millis(50),
        ..SseConfig::default()
    })
    .await;
    let (run_id, token) = srv.create_run(json!({})).await;
    let mut live = Live::start(tollgate(
        &srv.base,
        &srv.operator_token,
        &["watch", &run_id],
    ));
    assert!(live.line().await.starts_with("#1 "));
    for i in 0..4u64 {
        // Longer than a window: the response that was open has ended by now.
        tokio::time::sleep(Duration::from_millis(700)).await;
        srv.append(
            &run_id,
            &token,
            json!([{"type": "agent.message", "text": format!("step {i}")}]),
        )
        .await;
        let line = live.line().await;
        assert!(line.starts_with(&format!("#{} ", i + 2)), "{line}");
        assert!(
            line.ends_with(&format!(r#"agent.message "step {i}""#)),
            "{line}"
        );
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (status, _) = srv
        .post(&format!("/api/runs/{run_id}/complete"), &token, &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (code, stderr, lines) = live.finish().await;
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(stderr, "", "clean window ends are silent");
    let seqs: Vec<&str> = lines.iter().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(
        seqs,
        ["#1", "#2", "#3", "#4", "#5", "#6", "done:"],
        "{lines:#?}"
    );
}

/// What the fake stream server saw and serves.
#[derive(Default)]
struct Fake {
    last_event_ids: Mutex<Vec<Option<String>>>,
    accepts: Mutex<Vec<Option<String>>>,
}

fn frame(seq: u64, ty: &str) -> String {
    let data = json!({"protocol_version": "v2", "run_id": "run-x", "sequence": seq,
                      "type": ty, "timestamp_utc": "2026-11-30T12:00:00.000Z"});
    format!("id: {seq}\nevent: {ty}\ndata: {data}\n\n")
}

/// 1st request: event 1, then half of event 2 and the connection breaks; 2nd: 503;
/// 3rd: events 2 and 3, then `done`.
async fn fake_stream(
    axum::extract::State(fake): axum::extract::State<Arc<Fake>>,
    headers: HeaderMap,
) -> Response {
    let header = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
    fake.accepts.lock().unwrap().push(header("accept"));
    let n = {
        let mut seen = fake.last_event_ids.lock().unwrap();
        seen.push(header("last-event-id"));
        seen.len()
    };
    let sse = [("content-type", "text/event-stream")];
    match n {
        1 => {
            let half = frame(2, "agent.message");
            let parts: Vec<Result<Bytes, std::io::Error>> = vec![
                Ok(Bytes::from(format!(
                    "retry: 50\n\n{}",
                    frame(1, "run_started")
                ))),
                Ok(Bytes::from(half[..half.len() / 2].to_owned())),
                Err(std::io::Error::other("dropped")),
            ];
            // Each part after a pause, so the server flushes what precedes the break.
            let parts = futures::StreamExt::then(futures::stream::iter(parts), |p| async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                p
            });
            (sse, Body::from_stream(parts)).into_response()
        }
        2 => (
            AxumStatus::SERVICE_UNAVAILABLE,
            axum::Json(json!({"error": "storage is unavailable; retry", "state": "unavailable"})),
        )
            .into_response(),
        _ => (
            sse,
            format!(
                "retry: 50\n\n{}{}: keep-alive\n\nevent: done\ndata: {}\n\n",
                frame(2, "agent.message"),
                frame(3, "run_completed"),
                json!({"run_id": "run-x", "terminal_sequence": 3})
            ),
        )
            .into_response(),
    }
}

/// 503 with the agent host's state, for every decision.
async fn fake_unreachable() -> Response {
    (
        AxumStatus::SERVICE_UNAVAILABLE,
        axum::Json(json!({"error": "agent host unreachable", "state": "agenthost_unreachable"})),
    )
        .into_response()
}

/// The live stream only at `/events` (the path the HTTP API routes too).
async fn fake_server(fake: Arc<Fake>) -> String {
    let app = axum::Router::new()
        .route("/api/runs/{id}/events", axum::routing::get(fake_stream))
        .route(
            "/api/runs/{id}/tool-approvals",
            axum::routing::post(fake_unreachable),
        )
        .with_state(fake);
    serve(app).await
}

/// Serves `app` on a loopback port: its base URL.
async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

/// GIVEN a connection that breaks mid-frame, then a 503 WHEN watching THEN the half
/// frame is dropped, the command says it reconnects, resumes with `Last-Event-ID` of
/// the last event printed, and prints every event once.
#[tokio::test(flavor = "multi_thread")]
async fn watch_resumes_after_a_dropped_connection_and_errors() {
    let fake = Arc::new(Fake::default());
    let base = fake_server(fake.clone()).await;
    let out = run(tollgate(
        &base,
        "fake-token-0123456789",
        &["watch", "run-x"],
    ))
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    let seqs: Vec<&str> = out
        .lines()
        .iter()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(seqs, ["#1", "#2", "#3", "done:"], "{out:?}");
    assert_eq!(
        *fake.last_event_ids.lock().unwrap(),
        [Some("0".into()), Some("1".into()), Some("1".into())]
    );
    // `GET /api/runs/RUN/events` asking for the event stream (the fake routes no other).
    assert_eq!(
        *fake.accepts.lock().unwrap(),
        vec![Some("text/event-stream".to_owned()); 3]
    );
    let reconnects: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(reconnects.len(), 2, "{}", out.stderr);
    assert!(reconnects[0].contains("the stream broke"), "{}", out.stderr);
    assert!(
        reconnects[1].contains("503") && reconnects[1].contains("reconnecting after #1"),
        "{}",
        out.stderr
    );
    out.keeps_secret("fake-token-0123456789");
}

/// An unknown run, a bad token, another agent's token: a clear message, exit 1, and
/// never the token.
#[tokio::test(flavor = "multi_thread")]
async fn watch_refusals_are_clear() {
    let srv = server(SseConfig::default()).await;
    let (run_id, _) = srv.create_run(json!({})).await;

    let out = run(tollgate(
        &srv.base,
        &srv.operator_token,
        &["watch", "no-such-run"],
    ))
    .await;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.starts_with("tollgate: no such run"), "{out:?}");
    assert_eq!(out.stdout, "");

    let bad = "not-a-valid-token-SECRET-42";
    let out = run(tollgate(&srv.base, bad, &["watch", &run_id])).await;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains("the token was refused (401"), "{out:?}");
    out.keeps_secret(bad);

    let other = srv.auth.mint_jwt("other-agent", Role::Agent, 600, None);
    let out = run(tollgate(&srv.base, &other, &["watch", &run_id])).await;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains("not allowed (403"), "{out:?}");
    out.keeps_secret(&other);

    let out = run(tollgate(&srv.base, "", &["watch", &run_id])).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(out.stderr.contains("no token"), "{out:?}");
}

/// GIVEN armed cards on two runs WHEN `tollgate approvals` (all, or `--run`) THEN a
/// table: run, display id, tool, url or intention, expires in, the request id.
#[tokio::test(flavor = "multi_thread")]
async fn approvals_lists_armed_cards() {
    let srv = server(SseConfig::default()).await;
    let out = run(tollgate(&srv.base, &srv.operator_token, &["approvals"])).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "no pending approvals\n"),
        "{out:?}"
    );

    let (run_a, token_a) = srv.create_run(json!({})).await;
    let (run_b, token_b) = srv.create_run(json!({})).await;
    arm(
        &srv,
        &run_a,
        &token_a,
        json!({"request_id": REQUEST_ID, "tool_name": "web_fetch",
               "url": "https://example.com/docs"}),
    )
    .await;
    arm(
        &srv,
        &run_b,
        &token_b,
        json!({"request_id": "b-request-0001", "tool_name": "shell",
               "intention": "list the files", "timeout_seconds": 7200}),
    )
    .await;

    let out = run(tollgate(&srv.base, &srv.operator_token, &["approvals"])).await;
    assert_eq!(out.code, 0, "{out:?}");
    out.keeps_secret(&srv.operator_token);
    let lines = out.lines();
    assert_eq!(lines.len(), 3, "{}", out.stdout);
    let cells = |line: &str| -> Vec<String> {
        line.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(
        cells(lines[0]),
        [
            "RUN",
            "ID",
            "TOOL",
            "URL / INTENTION",
            "EXPIRES IN",
            "REQUEST"
        ]
    );
    // Soonest deadline first.
    let a = cells(lines[1]);
    assert_eq!(
        [&a[0], &a[1], &a[2], &a[3], &a[5]],
        [
            &run_a,
            "5f0c7a2e",
            "web_fetch",
            "https://example.com/docs",
            REQUEST_ID
        ]
    );
    assert!(a[4].starts_with("4m ") || a[4] == "5m 0s", "{}", a[4]);
    let b = cells(lines[2]);
    assert_eq!(
        [&b[0], &b[1], &b[2], &b[3], &b[5]],
        [
            &run_b,
            "b-reques",
            "shell",
            "list the files",
            "b-request-0001"
        ]
    );
    assert!(b[4] == "1h 59m" || b[4] == "2h 0m", "{}", b[4]);

    let out = run(tollgate(
        &srv.base,
        &srv.operator_token,
        &["approvals", "--run", &run_b],
    ))
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.lines().len(), 2, "{}", out.stdout);
    assert!(out.lines()[1].starts_with(&run_b));

    let out = run(tollgate(&srv.base, &token_a, &["approvals"])).await;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains("(403"), "{out:?}");
    out.keeps_secret(&token_a);
}

/// `approve` / `deny`: a fresh decision in words (exit 0), the same click again (the
/// card is as asked: exit 0), the opposite click on a decided card (`already resolved:
/// …`, exit 1); a scope beyond `once` from the owner, and refused from anyone else.
#[tokio::test(flavor = "multi_thread")]
async fn approve_and_deny_answer_in_words() {
    let srv = server(SseConfig::default()).await;
    let (run_id, token) = srv.create_run(json!({"owner": "test-operator"})).await;
    for rid in ["card-one", "card-two", "card-three"] {
        arm(
            &srv,
            &run_id,
            &token,
            json!({"request_id": rid, "tool_name": "web_fetch"}),
        )
        .await;
    }
    let op = &srv.operator_token;
    let click = |args: Vec<&str>| run(tollgate(&srv.base, op, &args));

    let out = click(vec!["approve", &run_id, "card-one"]).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "approved (scope once) by test-operator\n"),
        "{out:?}"
    );
    out.keeps_secret(op);
    let out = click(vec!["approve", &run_id, "card-one"]).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "approved (scope once) by test-operator\n"),
        "{out:?}"
    );
    let out = click(vec!["deny", &run_id, "card-one"]).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (
            1,
            "already resolved: approved (scope once) by test-operator\n"
        ),
        "{out:?}"
    );

    let out = click(vec!["deny", &run_id, "card-two"]).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "denied by test-operator\n"),
        "{out:?}"
    );
    let out = click(vec!["approve", &run_id, "card-two"]).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (1, "already resolved: denied by test-operator\n"),
        "{out:?}"
    );

    // Scope beyond once: refused for someone who does not own the run (card stays
    // pending), granted for the owner.
    let alice = srv.auth.mint_jwt("alice", Role::Operator, 600, None);
    let out = run(tollgate(
        &srv.base,
        &alice,
        &["approve", &run_id, "card-three", "--scope", "tool"],
    ))
    .await;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains("not allowed (403"), "{out:?}");
    assert!(out.stderr.contains("needs the run's owner"), "{out:?}");
    out.keeps_secret(&alice);
    let out = click(vec!["approve", &run_id, "card-three", "--scope", "tool"]).await;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (
            0,
            "approved (scope tool) by test-operator; standing grant: web_fetch within scope tool\n"
        ),
        "{out:?}"
    );

    let out = click(vec!["approve", &run_id, "card-three", "--scope", "forever"]).await;
    assert_eq!(out.code, 2, "clap refuses an unknown scope: {out:?}");
}

/// GIVEN a card armed with `timeout_seconds: 1` WHEN a click comes after its deadline,
/// and a second one THEN both print `already resolved: expired` (exit 1).
#[tokio::test(flavor = "multi_thread")]
async fn clicks_on_an_expired_card() {
    let srv = server(SseConfig::default()).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    arm(
        &srv,
        &run_id,
        &token,
        json!({"request_id": "short-lived", "tool_name": "web_fetch", "timeout_seconds": 1}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for verb in ["approve", "deny", "approve"] {
        let out = run(tollgate(
            &srv.base,
            &srv.operator_token,
            &[verb, &run_id, "short-lived"],
        ))
        .await;
        assert_eq!(
            (out.code, out.stdout.as_str()),
            (1, "already resolved: expired\n"),
            "{verb}: {out:?}"
        );
    }
    let (status, card) = srv
        .get(
            &format!("/api/runs/{run_id}/approval-requests/short-lived"),
            &token,
        )
        .await;
    assert_eq!(
        (status, card["state"].as_str()),
        (StatusCode::OK, Some("expired"))
    );
}

/// Unknown request or run: `no such pending request` (exit 1); a pending card of an
/// ended run: `run is not active` (exit 1); the agent host down: exit 2; no server:
/// exit 2. Never the token.
#[tokio::test(flavor = "multi_thread")]
async fn decision_failures() {
    let srv = server(SseConfig::default()).await;
    let op = &srv.operator_token;
    let (run_id, token) = srv.create_run(json!({})).await;

    for args in [
        vec!["approve", run_id.as_str(), "no-such-request"],
        vec!["deny", run_id.as_str(), "no-such-request"],
        vec!["approve", "no-such-run", "no-such-request"],
    ] {
        let out = run(tollgate(&srv.base, op, &args)).await;
        assert_eq!(out.code, 1, "{args:?}: {out:?}");
        assert_eq!(out.stderr, "tollgate: no such pending request\n", "{out:?}");
        assert_eq!(out.stdout, "");
        out.keeps_secret(op);
    }

    arm(
        &srv,
        &run_id,
        &token,
        json!({"request_id": "left-pending", "tool_name": "web_fetch"}),
    )
    .await;
    let (status, _) = srv
        .post(&format!("/api/runs/{run_id}/cancel"), &token, &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let out = run(tollgate(
        &srv.base,
        op,
        &["approve", &run_id, "left-pending"],
    ))
    .await;
    // Cancelling the run ended its card: the click reports that, exit 1.
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (1, "already resolved: expired (the run ended)\n", ""),
        "{out:?}"
    );

    let base = fake_server(Arc::new(Fake::default())).await;
    let out = run(tollgate(
        &base,
        "fake-token-0123456789",
        &["approve", "run-x", "req"],
    ))
    .await;
    assert_eq!(
        (out.code, out.stderr.as_str()),
        (2, "tollgate: the agent host is unreachable; retry\n"),
        "{out:?}"
    );

    // Nothing listens there any more.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let out = run(tollgate(&closed, op, &["deny", "run-x", "req"])).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stderr.starts_with("tollgate: cannot reach the server"),
        "{out:?}"
    );
    out.keeps_secret(op);
}

/// Cancels a run (its terminal event), asserting 200.
async fn cancel(srv: &TestServer, run_id: &str, token: &str) {
    let (status, v) = srv
        .post(&format!("/api/runs/{run_id}/cancel"), token, &json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "cancel: {v}");
}

/// GIVEN cards whose URL starts like a trusted site but goes elsewhere (user info, a
/// long path) WHEN `tollgate approvals` and `tollgate watch` show them THEN the parsed
/// host and the URL's end are shown, the middle shortened.
#[tokio::test(flavor = "multi_thread")]
async fn urls_show_their_real_host_and_their_end() {
    let srv = server(SseConfig::default()).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    let pad = "a".repeat(300);
    let spoof = format!("https://docs.example.com.{pad}@evil.example/payload.sh");
    let long = format!("https://docs.example.com/{pad}/evil.example/payload.sh");
    for (rid, url) in [("card-spoof", &spoof), ("card-long", &long)] {
        arm(
            &srv,
            &run_id,
            &token,
            json!({"request_id": rid, "tool_name": "web_fetch", "url": url}),
        )
        .await;
    }

    let out = run(tollgate(&srv.base, &srv.operator_token, &["approvals"])).await;
    assert_eq!(out.code, 0, "{out:?}");
    let row = |rid: &str| -> String {
        out.lines()
            .into_iter()
            .find(|l| l.ends_with(rid))
            .unwrap_or_else(|| panic!("no row for {rid}: {}", out.stdout))
            .to_owned()
    };
    let spoof_row = row("card-spoof");
    assert!(
        spoof_row.contains(" https://…@evil.example/payload.sh "),
        "{spoof_row}"
    );
    assert!(!spoof_row.contains("docs.example.com"), "{spoof_row}");
    let long_row = row("card-long");
    let cell = long_row
        .split("  ")
        .map(str::trim)
        .find(|c| c.starts_with("https://"))
        .unwrap();
    assert!(cell.starts_with("https://docs.example.com/aaa"), "{cell}");
    assert!(cell.contains('…'), "{cell}");
    assert!(cell.ends_with("example/payload.sh"), "{cell}");
    assert_eq!(cell.chars().count(), 60, "{cell}");

    cancel(&srv, &run_id, &token).await;
    let out = run(tollgate(
        &srv.base,
        &srv.operator_token,
        &["watch", &run_id],
    ))
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    let required: Vec<&str> = out
        .lines()
        .into_iter()
        .filter(|l| l.contains("tool.approval_required"))
        .collect();
    assert_eq!(required.len(), 2, "{}", out.stdout);
    assert!(
        required[0].ends_with("web_fetch https://…@evil.example/payload.sh (request card-spo…)"),
        "{}",
        required[0]
    );
    assert!(
        required[1].contains("web_fetch https://docs.example.com/aaa")
            && required[1].ends_with("/evil.example/payload.sh (request card-lon…)"),
        "{}",
        required[1]
    );
}

/// What may not reach a terminal from an agent's text: C0/C1 controls, DEL, bidi
/// overrides and isolates, zero-width characters.
const HOSTILE: &str = "pay \u{202E}gpj.exe\u{202C} \u{2066}x\u{2069} zero\u{200B}width\u{FEFF} \
                       \u{1b}[2J\u{7f} \u{9b}31m \u{1b}]0;title\u{7}";

/// No control character but the line end, and nothing invisible.
fn terminal_safe(text: &str) -> bool {
    !text.chars().any(|c| {
        (c.is_control() && c != '\n')
            || matches!(c, '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2060}'..='\u{2069}' | '\u{FEFF}')
    })
}

/// GIVEN events whose text carries terminal controls and invisible characters WHEN
/// `tollgate watch` prints them THEN C0 and DEL read as spaces and C1, bidi and
/// zero-width characters as `<U+XXXX>`; with `--json` each is a `\uXXXX` escape: the
/// same JSON, nothing a terminal obeys.
#[tokio::test(flavor = "multi_thread")]
async fn watch_never_prints_controls_or_invisible_characters() {
    let srv = server(SseConfig::default()).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    srv.append(
        &run_id,
        &token,
        json!([{"type": "agent.message", "text": HOSTILE},
               {"type": "tool.call", "tool": HOSTILE, "note": "a\u{85}b\u{2067}c"}]),
    )
    .await;
    cancel(&srv, &run_id, &token).await;
    let events = srv.replay_all(&run_id, &token, 100).await;

    let out = run(tollgate(
        &srv.base,
        &srv.operator_token,
        &["watch", &run_id],
    ))
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(terminal_safe(&out.stdout), "{:?}", out.stdout);
    let lines = out.lines();
    assert!(
        lines[1].ends_with(
            r#"agent.message "pay <U+202E>gpj.exe<U+202C> <U+2066>x<U+2069> zero<U+200B>width<U+FEFF>  [2J  <U+009B>31m  ]0;title ""#
        ),
        "{}",
        lines[1]
    );
    assert!(lines[2].contains("<U+202E>"), "{}", lines[2]);
    assert!(
        lines[2].ends_with(r#"note="a<U+0085>b<U+2067>c""#),
        "{}",
        lines[2]
    );

    let out = run(tollgate(
        &srv.base,
        &srv.operator_token,
        &["watch", &run_id, "--json"],
    ))
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(terminal_safe(&out.stdout), "{:?}", out.stdout);
    assert!(out.stdout.contains(r"\u202e") && out.stdout.contains(r"\u009b"));
    let printed: Vec<Value> = out
        .lines()
        .iter()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_eq!(printed, events);
}

/// Each request a server sees: when, and its `Last-Event-ID`.
#[derive(Default)]
struct Hits(Mutex<Vec<(Instant, Option<String>)>>);

impl Hits {
    /// Records one; its number (1, 2, …).
    fn record(&self, headers: &HeaderMap) -> usize {
        let mut hits = self.0.lock().unwrap();
        hits.push((
            Instant::now(),
            headers
                .get("last-event-id")
                .map(|v| v.to_str().unwrap().to_owned()),
        ));
        hits.len()
    }

    fn last_event_ids(&self) -> Vec<Option<String>> {
        self.0.lock().unwrap().iter().map(|h| h.1.clone()).collect()
    }
}

/// A server whose `GET /api/runs/{id}/events` answers the n-th request (1, 2, …) with
/// `answer(n)`.
async fn scripted<F, Fut>(hits: Arc<Hits>, answer: F) -> String
where
    F: Fn(usize) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response> + Send + 'static,
{
    let app = axum::Router::new().route(
        "/api/runs/{id}/events",
        axum::routing::get(move |headers: HeaderMap| {
            let n = hits.record(&headers);
            answer(n)
        }),
    );
    serve(app).await
}

/// An event stream of `text`, all at once.
fn sse_answer(text: String) -> Response {
    ([("content-type", "text/event-stream")], text).into_response()
}

/// Events 1..=n of run-x, then `done`.
fn sse_to_done(from: u64, to: u64) -> Response {
    let frames: String = (from..=to).map(|s| frame(s, "agent.message")).collect();
    sse_answer(format!(
        "retry: 50\n\n{frames}event: done\ndata: {}\n\n",
        json!({"run_id": "run-x", "terminal_sequence": to})
    ))
}

/// GIVEN a server that accepts the connection and never answers, then one that sends a
/// 503's headers and never its body WHEN watching (answer timeout shortened to 300 ms)
/// THEN each is a transient error: the command says so, reconnects, and ends at `done`.
#[tokio::test(flavor = "multi_thread")]
async fn watch_gives_up_on_a_server_that_does_not_answer() {
    let hits = Arc::new(Hits::default());
    let base = scripted(hits.clone(), |n| async move {
        match n {
            1 => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                unreachable!()
            }
            2 => (
                AxumStatus::SERVICE_UNAVAILABLE,
                [("content-type", "application/json")],
                Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>()),
            )
                .into_response(),
            _ => sse_to_done(1, 2),
        }
    })
    .await;
    let mut cmd = tollgate(&base, "fake-token-0123456789", &["watch", "run-x"]);
    cmd.env("TOLLGATE_WATCH_ANSWER_TIMEOUT_MS", "300");
    let out = run(cmd).await;
    assert_eq!(out.code, 0, "{out:?}");
    let seqs: Vec<&str> = out
        .lines()
        .iter()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(seqs, ["#1", "#2", "done:"], "{out:?}");
    let reconnects: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(reconnects.len(), 2, "{}", out.stderr);
    for line in reconnects {
        assert!(
            line.contains("no answer from the server within 0.3s")
                && line.contains("reconnecting after #0"),
            "{}",
            out.stderr
        );
    }
    assert_eq!(hits.last_event_ids().len(), 3);
    out.keeps_secret("fake-token-0123456789");

    // A bad value is refused rather than ignored.
    let mut cmd = tollgate(&base, "fake-token-0123456789", &["watch", "run-x"]);
    cmd.env("TOLLGATE_WATCH_ANSWER_TIMEOUT_MS", "soon");
    let out = run(cmd).await;
    assert_eq!(out.code, 2, "{out:?}");
    assert!(
        out.stderr.contains("TOLLGATE_WATCH_ANSWER_TIMEOUT_MS"),
        "{out:?}"
    );
}

/// GIVEN a server that ends every response at once with nothing in it, asking for
/// `retry: 0` WHEN watching THEN the command waits at least 100 ms, then ever longer
/// (each such window counts as a failure), silently, and still ends at `done`.
#[tokio::test(flavor = "multi_thread")]
async fn watch_backs_off_from_windows_that_end_at_once() {
    const EMPTY: usize = 5;
    let hits = Arc::new(Hits::default());
    let base = scripted(hits.clone(), |n| async move {
        if n <= EMPTY {
            sse_answer("retry: 0\n\n".to_owned())
        } else {
            sse_to_done(1, 1)
        }
    })
    .await;
    let out = run(tollgate(
        &base,
        "fake-token-0123456789",
        &["watch", "run-x"],
    ))
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stderr, "", "empty windows are silent");
    assert_eq!(
        out.lines(),
        [
            "#1 2026-11-30T12:00:00.000Z agent.message",
            "done: the run ended at #1"
        ]
    );
    let at: Vec<Instant> = hits.0.lock().unwrap().iter().map(|h| h.0).collect();
    assert_eq!(at.len(), EMPTY + 1);
    let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
    // 100 ms (the hint's floor), then doubling: 200, 400, 800, 1600 ms (lower bounds:
    // a loaded machine only makes them longer).
    for (i, gap) in gaps.iter().enumerate() {
        let floor = Duration::from_millis(95 << i);
        assert!(*gap >= floor, "wait {i} is {gap:?} < {floor:?}: {gaps:?}");
    }
}

/// GIVEN a response that sends a line over 1 MiB (and then nothing) WHEN watching THEN
/// the command drops it as a broken connection and resumes after the last event it
/// printed.
#[tokio::test(flavor = "multi_thread")]
async fn watch_drops_a_response_with_an_endless_line() {
    let hits = Arc::new(Hits::default());
    let base = scripted(hits.clone(), |n| async move {
        if n == 1 {
            let head = format!("retry: 50\n\n{}data: ", frame(1, "run_started"));
            let parts: Vec<Result<Bytes, std::io::Error>> = vec![
                Ok(Bytes::from(head)),
                Ok(Bytes::from(vec![b'a'; 1_100_000])),
            ];
            let body =
                futures::StreamExt::chain(futures::stream::iter(parts), futures::stream::pending());
            (
                [("content-type", "text/event-stream")],
                Body::from_stream(body),
            )
                .into_response()
        } else {
            sse_to_done(2, 2)
        }
    })
    .await;
    let out = run(tollgate(
        &base,
        "fake-token-0123456789",
        &["watch", "run-x"],
    ))
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    let seqs: Vec<&str> = out
        .lines()
        .iter()
        .map(|l| l.split(' ').next().unwrap())
        .collect();
    assert_eq!(seqs, ["#1", "#2", "done:"], "{out:?}");
    let reconnects: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(reconnects.len(), 1, "{}", out.stderr);
    assert!(
        reconnects[0].contains("a line over 1 MiB")
            && reconnects[0].contains("reconnecting after #1"),
        "{}",
        out.stderr
    );
    assert_eq!(
        hits.last_event_ids(),
        [Some("0".to_owned()), Some("1".to_owned())]
    );
}

/// A raw HTTP server: reads each request up to its JSON body, then `respond(n, socket)`
/// (n = 1, 2, …) and closes the connection.
async fn raw_server<F, Fut>(respond: F) -> String
where
    F: Fn(usize, tokio::net::TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((mut socket, _)) = listener.accept().await {
            n += 1;
            let mut seen = Vec::new();
            let mut buf = [0u8; 4096];
            // Until the body's end (the decision is in), or the client gives up.
            while !seen.ends_with(b"}") {
                match tokio::time::timeout(Duration::from_secs(5), socket.read(&mut buf)).await {
                    Ok(Ok(k)) if k > 0 => seen.extend_from_slice(&buf[..k]),
                    _ => break,
                }
            }
            tokio::spawn(respond(n, socket));
        }
    });
    base
}

/// GIVEN a decision that reaches the server but whose answer is lost (the connection
/// closed before an answer; an answer that breaks off) WHEN approving or denying THEN
/// exit 2, saying the decision may have been recorded and that running the command
/// again is safe; a server that cannot be reached is still `cannot reach the server`.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_answer_says_running_again_is_safe() {
    use tokio::io::AsyncWriteExt;
    let base = raw_server(|n, mut socket| async move {
        if n % 2 == 0 {
            let _ = socket
                .write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                      content-length: 200\r\n\r\n{\"state\": \"appr",
                )
                .await;
            let _ = socket.flush().await;
        }
        // n odd: closed without a word.
    })
    .await;
    for verb in ["approve", "deny"] {
        // The server closes the 1st, 3rd … connection unanswered, breaks off the others.
        for first in [
            "tollgate: no answer from the server (",
            "tollgate: the answer could not be read (",
        ] {
            let out = run(tollgate(
                &base,
                "fake-token-0123456789",
                &[verb, "run-x", "req"],
            ))
            .await;
            assert_eq!((out.code, out.stdout.as_str()), (2, ""), "{out:?}");
            assert!(out.stderr.starts_with(first), "{out:?}");
            assert!(
                out.stderr.contains("the decision may have been recorded")
                    && out
                        .stderr
                        .contains("running the same command again is safe"),
                "{out:?}"
            );
            out.keeps_secret("fake-token-0123456789");
        }
    }
}

/// GIVEN `tollgate serve` started with a `TOLLGATE_SECRET` WHEN it starts THEN it prints
/// no token (nothing JWT-shaped, no `AGENT_TOKEN`/`OPERATOR_TOKEN`) and says how to mint
/// one with `tollgate token`, and a token so minted works (one longer than the maximum
/// lifetime is refused by `tollgate token` itself); GIVEN no secret THEN it
/// prints an agent and an operator token for the secret it made up, and they work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_prints_tokens_only_for_a_secret_it_made_up() {
    use tollgate_tests::serve::ServeProcess;
    let http = reqwest::Client::new();
    let works = |base: String, token: String, path: &'static str| {
        let req = http.get(format!("{base}{path}")).bearer_auth(token);
        async move { req.send().await.unwrap().status() }
    };

    let secret = "a-secret-given-to-serve-0123456789abcdef";
    let mut given = ServeProcess::start_signing(Some(secret), &[]);
    let banner = given.banner();
    let text = banner.join("\n");
    assert!(
        !text.contains("AGENT_TOKEN") && !text.contains("OPERATOR_TOKEN") && !text.contains("eyJ"),
        "no token for a given secret: {text}"
    );
    assert!(text.contains("tollgate token"), "{text}");
    let minted = std::process::Command::new(tollgate_tests::serve::tollgate_bin())
        .args(["token", "--sub", "alice", "--role", "operator"])
        .env("TOLLGATE_SECRET", secret)
        .env_remove("TOLLGATE_MAX_TOKEN_LIFETIME_SECONDS")
        .output()
        .unwrap();
    assert!(minted.status.success(), "{minted:?}");
    let operator = String::from_utf8(minted.stdout).unwrap().trim().to_owned();
    let status = works(given.base.clone(), operator, "/api/approvals?state=pending").await;
    assert_eq!(status, StatusCode::OK);
    // A token the servers would refuse (longer than the maximum lifetime) is not minted.
    let too_long = std::process::Command::new(tollgate_tests::serve::tollgate_bin())
        .args([
            "token", "--sub", "alice", "--role", "operator", "--ttl", "90000",
        ])
        .env("TOLLGATE_SECRET", secret)
        .env_remove("TOLLGATE_MAX_TOKEN_LIFETIME_SECONDS")
        .output()
        .unwrap();
    assert_eq!(too_long.status.code(), Some(2), "{too_long:?}");
    assert!(too_long.stdout.is_empty(), "{too_long:?}");
    let said = String::from_utf8_lossy(&too_long.stderr);
    assert!(
        said.contains("TOLLGATE_MAX_TOKEN_LIFETIME_SECONDS"),
        "{said}"
    );

    let mut made_up = ServeProcess::start_signing(None, &[]);
    let banner = made_up.banner();
    let export = |name: &str| {
        banner
            .iter()
            .find_map(|l| l.strip_prefix(&format!("export {name}=")))
            .unwrap_or_else(|| panic!("{name} printed: {banner:#?}"))
            .to_owned()
    };
    let (agent, operator) = (export("AGENT_TOKEN"), export("OPERATOR_TOKEN"));
    let status = works(
        made_up.base.clone(),
        operator,
        "/api/approvals?state=pending",
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let created = http
        .post(format!("{}/api/runs", made_up.base))
        .bearer_auth(agent)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
}

/// GIVEN three runs (one completed) WHEN `tollgate runs` (a page of two, then `--after`
/// the cursor it printed, then `--status completed`) THEN tables of the runs newest first,
/// each run once, the next page's command, and the filter narrowing to the completed run.
#[tokio::test(flavor = "multi_thread")]
async fn runs_lists_pages_and_filters() {
    let srv = server(SseConfig::default()).await;
    let owner = format!("owner-{}", &uuid::Uuid::new_v4().simple().to_string()[..10]);
    let mut ids = Vec::new();
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let (id, token) = srv.create_run(json!({"owner": owner})).await;
        ids.push(id);
        tokens.push(token);
    }
    let (status, v) = srv
        .post(
            &format!("/api/runs/{}/complete", ids[1]),
            &tokens[1],
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let listed = |stdout: &str| -> Vec<String> {
        stdout
            .lines()
            .skip(1)
            .filter(|l| !l.starts_with('('))
            .map(|l| l.split_whitespace().next().unwrap().to_owned())
            .collect()
    };
    let out = run(tollgate(
        &srv.base,
        &srv.operator_token,
        &["runs", "--owner", &owner, "--limit", "2"],
    ))
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stdout.starts_with("RUN "), "{out:?}");
    let first = listed(&out.stdout);
    assert_eq!(first.len(), 2, "{out:?}");
    let cursor = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("(more: the same command with --after "))
        .and_then(|l| l.strip_suffix(')'))
        .expect("the next page's cursor")
        .to_owned();
    let out = run(tollgate(
        &srv.base,
        &srv.operator_token,
        &[
            "runs", "--owner", &owner, "--limit", "2", "--after", &cursor,
        ],
    ))
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    let mut all = first.clone();
    all.extend(listed(&out.stdout));
    let mut sorted = all.clone();
    sorted.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(sorted, expected, "each run once: {all:?}");
    let out = run(tollgate(
        &srv.base,
        &srv.operator_token,
        &["runs", "--owner", &owner, "--status", "completed"],
    ))
    .await;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(listed(&out.stdout), [ids[1].clone()], "{out:?}");
    assert!(out.stdout.contains(" completed "), "{out:?}");
    let out = run(tollgate(&srv.base, &srv.agent_token, &["runs"])).await;
    assert_eq!(out.code, 1, "an agent token is refused: {out:?}");
}
