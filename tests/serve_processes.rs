//! Four real `tollgate serve --backend aws` processes on one set of DynamoDB tables and one
//! SQS timer queue, as four machines of a deployment would share them: clicks spread over
//! the processes decide a card exactly once, and a card nobody answers is expired by the
//! SQS timer (consumed by one of the processes), not by the in-process sweeper.
//!
//! Needs DynamoDB and SQS endpoints (`make test` starts DynamoDB Local and LocalStack; or
//! `AWS_ENDPOINT_URL*`): without them the tests fail. The Makefile's `AWS_TESTS` filter
//! selects them by their `dynamo_only_` names. They run the workspace's
//! `target/debug/tollgate` (or `$CARGO_TARGET_DIR/debug/tollgate`), which
//! `cargo build --workspace` builds. Every process listens on its own free loopback port
//! and is killed when the test ends, also when it fails.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};
use tollgate_api::{Auth, Role};
use tollgate_tests::frontend::CardBoard;
use tollgate_tests::serve::{ServeProcess, Start};
use tollgate_tests::{aws_endpoint_configured, TEST_SECRET};

/// How long one process may take to print its URL (the first one creates the tables).
const START_TIMEOUT: Duration = Duration::from_secs(60);

fn sqs_endpoint_configured() -> bool {
    [
        "AWS_ENDPOINT_URL_SQS",
        "AWS_ENDPOINT_URL",
        "TOLLGATE_TEST_REAL_AWS",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

/// What the processes of one test share.
struct Setup {
    /// Unique to the test: fresh tables.
    table_prefix: String,
    /// Unique to the test: a fresh timer queue.
    queue_name: String,
    extra_env: Vec<(&'static str, String)>,
}

/// One running `tollgate serve`.
struct Serve {
    base: String,
    queue_url: String,
}

/// The running processes; kills them all when dropped (the test ended or panicked).
struct Fleet {
    children: Vec<ServeProcess>,
    servers: Vec<Serve>,
    http: reqwest::Client,
    auth: Auth,
    setup: Setup,
}

impl Fleet {
    /// Starts `n` processes: the first with `--create-tables` (it creates the tables and
    /// the queue named `TOLLGATE_TIMER_QUEUE_NAME`), the others with the queue's URL from
    /// its banner in `TOLLGATE_TIMER_QUEUE_URL`.
    fn start(n: usize, extra_env: &[(&'static str, &str)]) -> Self {
        assert!(
            aws_endpoint_configured(),
            "no DynamoDB endpoint: run `make test` (it starts DynamoDB Local) or set AWS_ENDPOINT_URL"
        );
        assert!(
            sqs_endpoint_configured(),
            "no SQS endpoint: run `make test` (it starts LocalStack) or set AWS_ENDPOINT_URL_SQS / AWS_ENDPOINT_URL"
        );
        let unique = uuid::Uuid::new_v4().simple().to_string();
        let mut fleet = Self {
            children: Vec::new(),
            servers: Vec::new(),
            http: reqwest::Client::builder()
                .no_proxy()
                .pool_max_idle_per_host(64)
                .timeout(Duration::from_secs(30))
                .build()
                .unwrap(),
            auth: Auth::new(TEST_SECRET.as_bytes()),
            setup: Setup {
                table_prefix: format!("tollgate-serve-{}-", &unique[..12]),
                queue_name: format!("tollgate-serve-timers-{unique}"),
                extra_env: extra_env
                    .iter()
                    .map(|(k, v)| (*k, (*v).to_owned()))
                    .collect(),
            },
        };
        for i in 0..n {
            let queue_url = fleet.servers.first().map(|s| s.queue_url.clone());
            let serve = fleet.spawn(i, queue_url.as_deref());
            fleet.servers.push(serve);
        }
        let first = &fleet.servers[0].queue_url;
        assert!(
            first.ends_with(&fleet.setup.queue_name),
            "the queue serve created: {first}"
        );
        for s in &fleet.servers {
            assert_eq!(&s.queue_url, first, "every process consumes the same queue");
        }
        fleet
    }

    /// Starts process `i` and waits for its banner; its output goes to this test's stderr.
    fn spawn(&mut self, i: usize, queue_url: Option<&str>) -> Serve {
        let mut env = vec![
            ("TOLLGATE_TABLE_PREFIX", self.setup.table_prefix.clone()),
            ("TOLLGATE_TIMER_QUEUE_NAME", self.setup.queue_name.clone()),
        ];
        env.extend(self.setup.extra_env.iter().cloned());
        let mut args = vec!["--backend", "aws"];
        match queue_url {
            Some(url) => env.push(("TOLLGATE_TIMER_QUEUE_URL", url.to_owned())),
            None => args.push("--create-tables"),
        }
        let process = ServeProcess::start_with(Start {
            args,
            env,
            remove: vec![
                "TOLLGATE_RUNS_TABLE",
                "TOLLGATE_EVENTS_TABLE",
                "TOLLGATE_APPROVALS_TABLE",
                "TOLLGATE_POLICIES_TABLE",
                "TOLLGATE_MUTATIONS_TABLE",
                "TOLLGATE_SWEEP_SECONDS",
                "TOLLGATE_HEARTBEAT_SECONDS",
            ],
            secret: Some(TEST_SECRET),
            log: Some("info"),
            echo: Some(format!("[serve {i}]")),
            wait: Some(START_TIMEOUT),
        });
        let base = process.base.clone();
        assert!(base.starts_with("http://127.0.0.1:"), "{base}");
        let queue_url = process.queue_url().unwrap_or_else(|| {
            panic!(
                "serve {i} does not say which SQS timer queue it uses (an old build? run \
                 `cargo build -p tollgate`); it printed {:#?}",
                process.seen()
            )
        });
        self.children.push(process);
        Serve { base, queue_url }
    }

    fn base(&self, i: usize) -> &str {
        &self.servers[i % self.servers.len()].base
    }

    fn agent_token(&self) -> String {
        self.auth.mint_jwt("test-agent", Role::Agent, 3600, None)
    }

    fn operator_token(&self, sub: &str) -> String {
        self.auth.mint_jwt(sub, Role::Operator, 3600, None)
    }

    async fn post(&self, i: usize, path: &str, token: &str, body: &Value) -> (StatusCode, Value) {
        let req = self
            .http
            .post(format!("{}{path}", self.base(i)))
            .bearer_auth(token)
            .json(body);
        send(req).await
    }

    /// `post`, sent again (to the next process) while it answers 503 `unavailable`, at
    /// most five times, as a client retries a request that wrote nothing (a 503 with
    /// another code, e.g. `agenthost_unreachable`, is an answer).
    async fn post_until_served(
        &self,
        i: usize,
        path: &str,
        token: &str,
        body: &Value,
    ) -> (StatusCode, Value) {
        let mut answer = self.post(i, path, token, body).await;
        for attempt in 1..5 {
            if !tollgate_tests::is_unavailable(answer.0, &answer.1) {
                break;
            }
            eprintln!(
                "{path}: 503 on attempt {attempt}, sending again: {}",
                answer.1
            );
            tokio::time::sleep(Duration::from_millis(200 * attempt as u64)).await;
            answer = self.post(i + attempt, path, token, body).await;
        }
        answer
    }

    async fn get(&self, i: usize, path: &str, token: &str) -> (StatusCode, Value) {
        send(
            self.http
                .get(format!("{}{path}", self.base(i)))
                .bearer_auth(token),
        )
        .await
    }

    /// Creates a run on process `i`: `(run_id, run_token)`.
    async fn create_run(&self, i: usize) -> (String, String) {
        let (status, v) = self
            .post(
                i,
                "/api/runs",
                &self.agent_token(),
                &json!({"owner": "alice", "channel_id": "C1"}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "create run: {v}");
        (
            v["run_id"].as_str().unwrap().to_owned(),
            v["run_token"].as_str().unwrap().to_owned(),
        )
    }

    /// Arms a card on process `i`; answers its request id.
    async fn arm(&self, i: usize, run_id: &str, token: &str, extra: Value) -> String {
        let request_id = uuid::Uuid::new_v4().to_string();
        let mut body = json!({"request_id": request_id, "tool_name": "web_fetch",
                              "url": "https://example.com/docs"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let (status, v) = self
            .post(
                i,
                &format!("/api/runs/{run_id}/approval-requests"),
                token,
                &body,
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "arm: {v}");
        assert_eq!(v["state"], "pending", "{v}");
        request_id
    }

    /// The whole stream through process `i`, page after page.
    async fn replay_all(&self, i: usize, run_id: &str, token: &str) -> Vec<Value> {
        let mut events = Vec::new();
        let mut after = 0u64;
        loop {
            let (status, page) = self
                .get(
                    i,
                    &format!("/api/runs/{run_id}/events?after={after}&limit=100"),
                    token,
                )
                .await;
            assert_eq!(status, StatusCode::OK, "replay: {page}");
            events.extend(page["events"].as_array().unwrap().iter().cloned());
            if !page["has_more"].as_bool().unwrap() {
                return events;
            }
            let next = page["next_after"].as_u64().unwrap();
            assert!(next > after, "has_more must make progress");
            after = next;
        }
    }

    /// Best-effort removal of the test's tables and queue, once the processes are gone.
    async fn clean_up(mut self) {
        for child in &mut self.children {
            child.kill();
        }
        let sdk = aws_config::load_from_env().await;
        let sqs = aws_sdk_sqs::Client::new(&sdk);
        let _ = sqs
            .delete_queue()
            .queue_url(&self.servers[0].queue_url)
            .send()
            .await;
        let dynamo = aws_sdk_dynamodb::Client::new(&sdk);
        let tables = tollgate_store::dynamo::Tables::with_prefix(&self.setup.table_prefix);
        for table in [
            &tables.runs,
            &tables.events,
            &tables.approvals,
            &tables.policies,
            &tables.mutations,
        ] {
            let _ = dynamo.delete_table().table_name(table).send().await;
        }
    }
}

async fn send(req: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let resp = req.send().await.expect("request reaches the server");
    let status = resp.status();
    let text = resp.text().await.unwrap();
    let body = serde_json::from_str(&text)
        .unwrap_or_else(|_| panic!("every answer is JSON; got {status} {text:?}"));
    (status, body)
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// GIVEN one card WHEN 50 operators click at once, approve and deny mixed, spread over
/// four `tollgate serve` processes on the same tables THEN every answer is 200 with the
/// same final state, and the stream has exactly one `tool.approval_resolved`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_fifty_clicks_over_four_serve_processes() {
    let fleet = Arc::new(Fleet::start(4, &[("TOLLGATE_HEARTBEAT_SECONDS", "60")]));
    let (run_id, run_token) = fleet.create_run(0).await;
    let request_id = fleet.arm(0, &run_id, &run_token, json!({})).await;

    let clicks: Vec<_> = (0..50)
        .map(|i| {
            let fleet = Arc::clone(&fleet);
            let (run_id, request_id) = (run_id.clone(), request_id.clone());
            tokio::spawn(async move {
                let verb = if i % 2 == 0 {
                    "tool-approvals"
                } else {
                    "tool-denials"
                };
                let op = fleet.operator_token(&format!("op-{i}"));
                fleet
                    .post_until_served(
                        i,
                        &format!("/api/runs/{run_id}/{verb}"),
                        &op,
                        &json!({"request_id": request_id}),
                    )
                    .await
            })
        })
        .collect();
    let mut states = HashSet::new();
    for click in clicks {
        let (status, v) = click.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["run_id"], json!(run_id), "{v}");
        assert_eq!(v["resolved"], true, "{v}");
        states.insert(v["state"].as_str().unwrap().to_owned());
    }
    assert_eq!(states.len(), 1, "one final state for all: {states:?}");
    let state = states.into_iter().next().unwrap();
    assert!(state == "approved" || state == "denied", "{state}");

    let events = fleet.replay_all(3, &run_id, &run_token).await;
    let resolved: Vec<_> = events
        .iter()
        .filter(|e| e["type"] == "tool.approval_resolved")
        .collect();
    assert_eq!(resolved.len(), 1, "{:?}", types(&events));
    assert_eq!(resolved[0]["requestId"], json!(request_id));
    assert_eq!(resolved[0]["approved"], json!(state == "approved"));
    assert_eq!(resolved[0]["expired"], false);

    match Arc::try_unwrap(fleet) {
        Ok(fleet) => fleet.clean_up().await,
        Err(_) => panic!("a click task still holds the fleet"),
    }
}

/// GIVEN four processes whose sweeper would wait an hour WHEN a card with a 3 s timeout
/// waits unanswered THEN the SQS timers (consumed by the processes) send heartbeats and
/// expire it: the card reads `expired`, the stream has heartbeats, then exactly one
/// `tool.approval_resolved` (expired), then nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_serve_expires_through_sqs() {
    let fleet = Fleet::start(
        4,
        &[
            ("TOLLGATE_SWEEP_SECONDS", "3600"),
            ("TOLLGATE_HEARTBEAT_SECONDS", "1"),
        ],
    );
    let (run_id, run_token) = fleet.create_run(2).await;
    let armed_at = Instant::now();
    let request_id = fleet
        .arm(1, &run_id, &run_token, json!({"timeout_seconds": 3}))
        .await;

    // The card reads `expired` within a bounded wait, from any process.
    let deadline = armed_at + Duration::from_secs(30);
    let mut polls = 0usize;
    let card = loop {
        let (status, card) = fleet
            .get(
                polls,
                &format!("/api/runs/{run_id}/approval-requests/{request_id}"),
                &run_token,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{card}");
        polls += 1;
        if card["state"] != "pending" {
            break card;
        }
        assert!(
            Instant::now() < deadline,
            "still pending {:?} after arming: the SQS timer did not expire it",
            armed_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(card["state"], "expired", "{card}");
    eprintln!("expired {:?} after arming", armed_at.elapsed());
    assert!(
        armed_at.elapsed() >= Duration::from_millis(2_500),
        "expired after {:?}, before its 3 s timeout",
        armed_at.elapsed()
    );

    // Let heartbeats in flight land, then read the stream.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let events = fleet.replay_all(0, &run_id, &run_token).await;
    let kinds = types(&events);
    eprintln!("the stream: {kinds:?}");
    let resolved: Vec<usize> = kinds
        .iter()
        .enumerate()
        .filter(|(_, t)| **t == "tool.approval_resolved")
        .map(|(i, _)| i)
        .collect();
    assert_eq!(resolved.len(), 1, "one resolution: {kinds:?}");
    let at = resolved[0];
    assert_eq!(events[at]["expired"], true, "{}", events[at]);
    assert_eq!(events[at]["approved"], false, "{}", events[at]);
    assert_eq!(events[at]["requestId"], json!(request_id));
    assert_eq!(kinds[..2], ["run_started", "tool.approval_required"]);
    let beats = kinds[..at]
        .iter()
        .filter(|t| **t == "tool.approval_pending")
        .count();
    assert!(
        beats >= 1,
        "heartbeats every 1 s for 3 s, through SQS: {kinds:?}"
    );
    assert!(
        kinds[2..at].iter().all(|t| *t == "tool.approval_pending"),
        "{kinds:?}"
    );
    assert_eq!(
        at,
        events.len() - 1,
        "nothing after the resolution: {kinds:?}"
    );

    fleet.clean_up().await;
}

/// GIVEN a run whose budget allows 20 starts of the tool but whose call ceiling is 5, and
/// 20 human-approved calls WHEN the agent starts all 20 at once, spread over four
/// `tollgate serve` processes on the same tables THEN exactly 5 are admitted (200
/// `intent`) and 15 refused (409 `not_executed`, `call_ceiling_reached`); the stream has
/// 20 `tool_execution_started` (seed 000: before admission) and 15 refusals, and the
/// durable records say the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_twenty_starts_over_four_serve_processes_respect_the_ceiling() {
    let fleet = Arc::new(Fleet::start(4, &[("TOLLGATE_HEARTBEAT_SECONDS", "60")]));
    let (status, run) = fleet
        .post(
            0,
            "/api/runs",
            &fleet.agent_token(),
            &json!({"owner": "alice",
                    "budget": {"tools": {"create_dashboard": 20}, "call_ceiling": 5}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let run_token = run["run_token"].as_str().unwrap().to_owned();
    let op = fleet.operator_token("op");
    let mut calls = Vec::new();
    for i in 0..20 {
        let call = format!("write-{i}");
        let request_id = fleet
            .arm(
                i,
                &run_id,
                &run_token,
                json!({"tool_name": "create_dashboard", "tool_call_id": call,
                       "approval_id": format!("approval-{i}")}),
            )
            .await;
        let (status, v) = fleet
            .post(
                i + 1,
                &format!("/api/runs/{run_id}/tool-approvals"),
                &op,
                &json!({"request_id": request_id, "scope": "once"}),
            )
            .await;
        assert_eq!(
            (status, &v["state"]),
            (StatusCode::OK, &json!("approved")),
            "{v}"
        );
        calls.push((call, request_id, format!("approval-{i}")));
    }
    let starts: Vec<_> = calls
        .iter()
        .enumerate()
        .map(|(i, (call, request_id, approval_id))| {
            let fleet = Arc::clone(&fleet);
            let path = format!("/api/runs/{run_id}/tool-calls/{call}/start");
            let body = json!({"request_id": request_id, "approval_id": approval_id,
                              "tool_name": "create_dashboard"});
            let token = run_token.clone();
            // A start that keeps losing the run's head to the others for the contention
            // budget answers 503 with nothing written; a client sends it again, as here.
            tokio::spawn(async move { fleet.post_until_served(i, &path, &token, &body).await })
        })
        .collect();
    let (mut admitted, mut refused) = (0, 0);
    for start in starts {
        let (status, v) = start.await.unwrap();
        match status {
            StatusCode::OK => {
                assert_eq!(v["state"], "intent", "{v}");
                assert!(v["sequence"].as_u64().is_some(), "{v}");
                admitted += 1;
            }
            StatusCode::CONFLICT => {
                assert_eq!(v["state"], "not_executed", "{v}");
                assert_eq!(v["reason"], "call_ceiling_reached", "{v}");
                refused += 1;
            }
            other => panic!("start answered {other}: {v}"),
        }
    }
    assert_eq!((admitted, refused), (5, 15));

    let events = fleet.replay_all(2, &run_id, &run_token).await;
    let count = |ty: &str, status: Option<&str>| {
        events
            .iter()
            .filter(|e| e["type"] == ty)
            .filter(|e| status.is_none_or(|s| e["execution_status"] == s))
            .count()
    };
    assert_eq!(
        count("tool_execution_started", None),
        20,
        "{:?}",
        types(&events)
    );
    assert_eq!(count("tool_execution", Some("not_executed")), 15);
    let seqs: Vec<u64> = events
        .iter()
        .map(|e| e["sequence"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "gapless");
    let (status, listing) = fleet
        .get(3, &format!("/api/runs/{run_id}/mutations"), &run_token)
        .await;
    assert_eq!(status, StatusCode::OK, "{listing}");
    let states: Vec<&str> = listing["mutations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["state"].as_str().unwrap())
        .collect();
    assert_eq!(states.len(), 20);
    assert_eq!(states.iter().filter(|s| **s == "intent").count(), 5);
    assert_eq!(states.iter().filter(|s| **s == "not_executed").count(), 15);

    match Arc::try_unwrap(fleet) {
        Ok(fleet) => fleet.clean_up().await,
        Err(_) => panic!("a start task still holds the fleet"),
    }
}

/// GIVEN a pod-per-run run whose AgentHost (the client crate's pod side) holds one card
/// WHEN the owner's `tool` approval of it is forwarded 20 times at once, spread over two
/// `tollgate serve` processes on the same tables THEN every answer is 200 `approved`, the
/// pod applied it once, the run's stream has exactly one `tool.approval_resolved`, and
/// exactly one `tool` policy exists for the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_twenty_forwards_over_two_serve_processes_resolve_once() {
    use tollgate_client::pod::{PodArm, PodDecision, PodGate};

    let fleet = Arc::new(Fleet::start(2, &[("TOLLGATE_ALLOW_LOOPBACK_ORIGINS", "1")]));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    let (status, run) = fleet
        .post(
            0,
            "/api/runs",
            &fleet.agent_token(),
            &json!({"owner": "alice", "execution_mode": "pod", "agenthost_origin": origin}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let gate = PodGate::new(run["agenthost_credential"].as_str().unwrap());
    let routes = gate.routes();
    tokio::spawn(async move { axum::serve(listener, routes).await });
    let request_id = uuid::Uuid::new_v4().to_string();
    let pending = gate.arm(PodArm::new(&request_id, &run_id, "web_fetch"));
    let op = fleet.operator_token("alice");
    let clicks: Vec<_> = (0..20)
        .map(|i| {
            let fleet = Arc::clone(&fleet);
            let path = format!("/api/runs/{run_id}/tool-approvals");
            let body = json!({"request_id": request_id, "scope": "tool",
                              "tool_name": "web_fetch"});
            let op = op.clone();
            tokio::spawn(async move { fleet.post_until_served(i, &path, &op, &body).await })
        })
        .collect();
    for click in clicks {
        let (status, v) = click.await.unwrap();
        assert_eq!(status, StatusCode::OK, "{v}");
        assert_eq!(v["state"], "approved", "{v}");
    }
    let decision = tokio::time::timeout(Duration::from_secs(5), pending)
        .await
        .expect("the pod's call resumes");
    assert_eq!(
        decision,
        PodDecision::Approved {
            scope: tollgate_client::Scope::Tool,
            auto: false
        }
    );
    let events = fleet
        .replay_all(1, &run_id, &fleet.operator_token("alice"))
        .await;
    let resolved: Vec<_> = events
        .iter()
        .filter(|e| e["type"] == "tool.approval_resolved")
        .collect();
    assert_eq!(resolved.len(), 1, "{:?}", types(&events));
    assert_eq!(resolved[0]["requestId"], json!(request_id));
    assert_eq!(resolved[0]["approved"], true);
    let (status, listing) = fleet
        .get(1, "/api/policies", &fleet.operator_token("alice"))
        .await;
    assert_eq!(status, StatusCode::OK, "{listing}");
    let policies: Vec<_> = listing["policies"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["origin_run_id"] == json!(run_id))
        .collect();
    assert_eq!(policies.len(), 1, "{listing}");
    assert_eq!(policies[0]["scope"], "tool");
    match Arc::try_unwrap(fleet) {
        Ok(fleet) => fleet.clean_up().await,
        Err(_) => panic!("every click finished"),
    }
}

/// GIVEN a child run (under a coordinator) holding 3 pending cards WHEN it completes on
/// one `tollgate serve` process while an operator decides its cards on the other (on the
/// child and through the coordinator), five times over THEN on both streams a frontend
/// keeping cards by seed 003's rules has no live card left: every card's end (a decision
/// that won, or `run_ended`) is announced exactly once, before the terminal event, which
/// is last, and no card of the run is pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_run_end_racing_decisions_over_two_serve_processes_leaves_no_live_card() {
    let fleet = Arc::new(Fleet::start(2, &[("TOLLGATE_HEARTBEAT_SECONDS", "60")]));
    let agent = fleet.agent_token();
    let op = fleet.operator_token("alice");
    for trial in 0..5 {
        let (status, coord) = fleet
            .post(
                0,
                "/api/runs",
                &agent,
                &json!({"kind": "coordinator", "owner": "alice"}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{coord}");
        let coordinator = coord["run_id"].as_str().unwrap().to_owned();
        let (status, child) = fleet
            .post(
                1,
                "/api/runs",
                &agent,
                &json!({"kind": "child", "parent_run_id": coordinator, "owner": "alice",
                        "subtask_id": trial}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{child}");
        let child_id = child["run_id"].as_str().unwrap().to_owned();
        let token = child["run_token"].as_str().unwrap().to_owned();
        let mut cards = Vec::new();
        for i in 0..3 {
            cards.push(fleet.arm(i, &child_id, &token, json!({})).await);
        }
        // Card 0 decided on the child, cards 1 and 2 through the coordinator; the end is
        // sent at once, to the other process.
        let decisions: Vec<_> = cards
            .iter()
            .enumerate()
            .map(|(i, rid)| {
                let fleet = Arc::clone(&fleet);
                let on = if i == 0 { &child_id } else { &coordinator };
                let verb = if i == 1 {
                    "tool-denials"
                } else {
                    "tool-approvals"
                };
                let path = format!("/api/runs/{on}/{verb}");
                let body = json!({"request_id": rid});
                let op = op.clone();
                tokio::spawn(async move { fleet.post_until_served(1, &path, &op, &body).await })
            })
            .collect();
        let (status, ended) = fleet
            .post_until_served(
                0,
                &format!("/api/runs/{child_id}/complete"),
                &token,
                &json!({}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{ended}");
        let terminal = ended["sequence"].as_u64().unwrap();
        let mut states = Vec::new();
        for decision in decisions {
            let (status, v) = decision.await.unwrap();
            assert_eq!(status, StatusCode::OK, "{v}");
            states.push(v["state"].as_str().unwrap().to_owned());
        }
        let events = fleet.replay_all(0, &child_id, &op).await;
        assert_eq!(
            events.last().unwrap()["type"],
            "run_completed",
            "{:?}",
            types(&events)
        );
        assert_eq!(events.last().unwrap()["sequence"], json!(terminal));
        for (rid, state) in cards.iter().zip(&states) {
            let resolved: Vec<_> = events
                .iter()
                .filter(|e| e["type"] == "tool.approval_resolved" && e["requestId"] == json!(rid))
                .collect();
            assert_eq!(resolved.len(), 1, "{rid}: {:?}", types(&events));
            assert!(resolved[0]["sequence"].as_u64().unwrap() < terminal);
            // What the decision answered is what the stream announced.
            let announced = match (
                resolved[0]["approved"].as_bool(),
                resolved[0]["expired"].as_bool(),
            ) {
                (Some(true), _) => "approved",
                (_, Some(true)) => {
                    assert_eq!(resolved[0]["reason"], "run_ended", "{}", resolved[0]);
                    "expired"
                }
                _ => "denied",
            };
            assert_eq!(announced, state, "{}", resolved[0]);
        }
        let coord_events = fleet.replay_all(1, &coordinator, &op).await;
        for (stream, run) in [(&events, &child_id), (&coord_events, &coordinator)] {
            let board = CardBoard::replay(stream);
            assert!(
                board.live.is_empty(),
                "{run}: live cards left {:?}",
                board.live
            );
            assert!(board.violations.is_empty(), "{run}: {:?}", board.violations);
            for rid in &cards {
                assert!(board.resolved.contains(rid), "{run}: {rid} never resolved");
            }
        }
        let (status, pending) = fleet
            .get(
                1,
                &format!("/api/runs/{child_id}/approvals?state=pending"),
                &op,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{pending}");
        assert_eq!(pending["approvals"], json!([]), "{pending}");
        eprintln!("trial {trial}: decisions answered {states:?}");
    }
    match Arc::try_unwrap(fleet) {
        Ok(fleet) => fleet.clean_up().await,
        Err(_) => panic!("every decision finished"),
    }
}
