//! Notifications through a signed webhook (docs/architecture.md §10), as a receiver sees
//! them: real `tollgate serve` processes on the embedded store and on DynamoDB Local
//! (`dynamo::` and `dynamo_only_` tests need the emulators: `make test`), posting to a
//! loopback receiver that can fail on purpose.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode as AxumStatus};
use hmac::{Hmac, Mac};
use reqwest::StatusCode;
use serde_json::{json, Value};
use sha2::Sha256;
use tollgate_api::{Auth, Role};
use tollgate_tests::pods::{listen, request_id, serve};
use tollgate_tests::serve::{tollgate_bin, ServeProcess, Start};
use tollgate_tests::{Backend, TestServer, TEST_SECRET};

const WEBHOOK_SECRET: &str = "whsec-test-0123456789abcdef";

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    delivery_id: String,
    signature: String,
    body: String,
    accepted: bool,
    at: Instant,
}

/// A loopback webhook receiver: answers `fail_with` to the first `failures` requests of
/// each delivery id, then 204.
#[derive(Clone)]
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<Received>>>,
}

impl Receiver {
    async fn start(failures: usize, fail_with: u16) -> Self {
        Self::start_asking(failures, fail_with, None).await
    }

    /// As [`Receiver::start`], each failure answered with `Retry-After: retry_after`.
    async fn start_asking(failures: usize, fail_with: u16, retry_after: Option<u64>) -> Self {
        let (listener, origin) = listen().await;
        let got: Arc<Mutex<Vec<Received>>> = Arc::default();
        let log = got.clone();
        let app = axum::Router::new().route(
            "/hooks/tollgate",
            axum::routing::post(move |headers: HeaderMap, body: String| {
                let log = log.clone();
                async move {
                    let header = |n: &str| {
                        headers
                            .get(n)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_owned()
                    };
                    let delivery_id = header("tollgate-delivery");
                    let mut log = log.lock().unwrap();
                    let before = log.iter().filter(|r| r.delivery_id == delivery_id).count();
                    let accepted = before >= failures;
                    log.push(Received {
                        delivery_id,
                        signature: header("tollgate-signature"),
                        body,
                        accepted,
                        at: Instant::now(),
                    });
                    let mut answer = HeaderMap::new();
                    if accepted {
                        return (AxumStatus::NO_CONTENT, answer);
                    }
                    if let Some(after) = retry_after {
                        answer.insert("retry-after", after.into());
                    }
                    (AxumStatus::from_u16(fail_with).unwrap(), answer)
                }
            }),
        );
        serve(listener, app);
        Self {
            url: format!("{origin}/hooks/tollgate"),
            got,
        }
    }

    fn all(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }

    /// Waits (at most 90 s) until `done` holds for what was received.
    async fn until(&self, what: &str, done: impl Fn(&[Received]) -> bool) -> Vec<Received> {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let all = self.all();
            if done(&all) {
                return all;
            }
            assert!(
                Instant::now() < deadline,
                "waited for {what}; received {all:#?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn body_of(r: &Received) -> Value {
    serde_json::from_str(&r.body).expect("the body is JSON")
}

/// The signature header is `t=<unix>,v1=<hex hmac_sha256(secret, "<t>.<body>")>`.
fn signature_valid(r: &Received) -> bool {
    let Some((t, v1)) = r
        .signature
        .split_once(',')
        .and_then(|(t, v)| Some((t.strip_prefix("t=")?, v.strip_prefix("v1=")?)))
    else {
        return false;
    };
    let mut mac = Hmac::<Sha256>::new_from_slice(WEBHOOK_SECRET.as_bytes()).unwrap();
    mac.update(format!("{t}.{}", r.body).as_bytes());
    mac.verify_slice(&hex::decode(v1).unwrap_or_default())
        .is_ok()
}

/// The environment of a process posting to `receiver`.
fn webhook_env(receiver: &Receiver, extra: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("TOLLGATE_WEBHOOK_URL", receiver.url.clone()),
        ("TOLLGATE_WEBHOOK_SECRET", WEBHOOK_SECRET.to_owned()),
        ("TOLLGATE_ALLOW_LOOPBACK_ORIGINS", "1".to_owned()),
        ("TOLLGATE_NOTIFY_RETRY_BASE_MS", "100".to_owned()),
    ];
    env.extend(extra.iter().map(|(k, v)| (*k, (*v).to_owned())));
    env
}

/// Tables (and a timer queue) of one DynamoDB test.
fn aws_setup() -> (String, String) {
    let unique = uuid::Uuid::new_v4().simple().to_string();
    (
        format!("tollgate-notify-{}-", &unique[..12]),
        format!("tollgate-notify-timers-{unique}"),
    )
}

const TABLE_VARS: [&str; 7] = [
    "TOLLGATE_RUNS_TABLE",
    "TOLLGATE_EVENTS_TABLE",
    "TOLLGATE_APPROVALS_TABLE",
    "TOLLGATE_POLICIES_TABLE",
    "TOLLGATE_MUTATIONS_TABLE",
    "TOLLGATE_CONNECTIONS_TABLE",
    "TOLLGATE_DELIVERIES_TABLE",
];

/// One `tollgate serve` on `backend` with `env`; on DynamoDB, `shared` names the tables
/// and queue (and the queue's URL once a first process created it).
fn start(
    backend: Backend,
    env: Vec<(&'static str, String)>,
    shared: Option<&(String, String)>,
    queue_url: Option<&str>,
    label: &str,
) -> ServeProcess {
    let mut env = env;
    let mut args = Vec::new();
    if backend == Backend::Dynamo {
        let (prefix, queue) = shared.expect("tables for DynamoDB");
        env.push(("TOLLGATE_TABLE_PREFIX", prefix.clone()));
        env.push(("TOLLGATE_TIMER_QUEUE_NAME", queue.clone()));
        args.extend(["--backend", "aws"]);
        match queue_url {
            Some(url) => env.push(("TOLLGATE_TIMER_QUEUE_URL", url.to_owned())),
            None => args.push("--create-tables"),
        }
    }
    ServeProcess::start_with(Start {
        args,
        env,
        remove: TABLE_VARS.to_vec(),
        secret: Some(TEST_SECRET),
        log: Some("info"),
        echo: Some(format!("[{label}]")),
        wait: Some(Duration::from_secs(90)),
    })
}

/// One `tollgate serve` on `backend` posting to `receiver` (its own tables on DynamoDB),
/// and a client of it for `project`.
fn serve_posting_to(
    backend: Backend,
    receiver: &Receiver,
    project: &str,
) -> (ServeProcess, TestServer) {
    let setup = aws_setup();
    let process = start(
        backend,
        webhook_env(receiver, &[]),
        Some(&setup),
        None,
        "serve",
    );
    let srv = client(&process.base, project);
    (process, srv)
}

/// A client of `base` whose agent and operator tokens name `project`.
fn client(base: &str, project: &str) -> TestServer {
    let mut srv = TestServer::remote(base);
    let auth = Auth::new(TEST_SECRET.as_bytes());
    srv.agent_token = auth.mint_jwt("notify-agent", Role::Agent, 3600, Some(project.into()));
    srv.operator_token = auth.mint_jwt(
        "notify-operator",
        Role::Operator,
        3600,
        Some(project.into()),
    );
    srv
}

/// Arms one card on a new run; `(run_id, request_id)`.
async fn arm_card(srv: &TestServer) -> (String, String) {
    let (run_id, token) = srv.create_run(json!({"owner": "alice"})).await;
    let rid = request_id();
    let (status, v) = srv
        .post(
            &format!("/api/runs/{run_id}/approval-requests"),
            &token,
            &json!({"request_id": rid, "tool_name": "web_fetch", "url": "https://example.com/x"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    (run_id, rid)
}

async fn approve(srv: &TestServer, run_id: &str, rid: &str) {
    let (status, v) = srv
        .post(
            &format!("/api/runs/{run_id}/tool-approvals"),
            &srv.operator_token,
            &json!({"request_id": rid, "scope": "once"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
}

fn of_card<'a>(all: &'a [Received], rid: &str, kind: &str) -> Vec<&'a Received> {
    all.iter()
        .filter(|r| {
            let b = body_of(r);
            b["request_id"] == json!(rid) && b["type"] == json!(kind)
        })
        .collect()
}

fn accepted(all: &[Received], rid: &str, kind: &str) -> usize {
    of_card(all, rid, kind)
        .iter()
        .filter(|r| r.accepted)
        .count()
}

/// A receiver that fails the first 3 posts of every delivery: each card's armed and
/// resolved notices arrive once accepted, after 3 retries with the same delivery id,
/// every one signed; nothing is sent again afterwards.
async fn survives_three_failures(backend: Backend) {
    let receiver = Receiver::start(3, 503).await;
    let (_process, srv) = serve_posting_to(backend, &receiver, "p-notify");
    let (run_id, rid) = arm_card(&srv).await;
    receiver
        .until("the armed notice accepted", |all| {
            accepted(all, &rid, "card.armed") == 1
        })
        .await;
    approve(&srv, &run_id, &rid).await;
    receiver
        .until("the resolved notice accepted", |all| {
            accepted(all, &rid, "card.resolved") == 1
        })
        .await;
    // A later card's notices are handed over only after this card's were: once they are
    // in, anything this card's could still cause would have been sent.
    let (run2, rid2) = arm_card(&srv).await;
    approve(&srv, &run2, &rid2).await;
    let all = receiver
        .until("the later card's notices", |all| {
            accepted(all, &rid2, "card.resolved") == 1 && accepted(all, &rid2, "card.armed") == 1
        })
        .await;
    for kind in ["card.armed", "card.resolved"] {
        let posts = of_card(&all, &rid, kind);
        assert_eq!(
            posts.len(),
            4,
            "{kind}: 3 failures, then the one accepted: {posts:#?}"
        );
        assert_eq!(posts.iter().filter(|r| r.accepted).count(), 1);
        assert!(posts[3].accepted, "the accepted one is the last");
        let id = &posts[0].delivery_id;
        assert!(id.starts_with("dlv_"), "{id}");
        for p in &posts {
            assert_eq!(&p.delivery_id, id, "the same delivery id on every retry");
            assert!(signature_valid(p), "signed: {p:#?}");
            let b = body_of(p);
            assert_eq!(b["delivery_id"], json!(id));
            assert_eq!(b["run_id"], json!(run_id));
            assert_eq!(b["project"], json!("p-notify"));
        }
    }
    let armed = body_of(of_card(&all, &rid, "card.armed")[3]);
    assert_eq!(armed["sequence"], 2);
    assert_eq!(armed["card"]["request_id"], json!(rid));
    assert_eq!(armed["card"]["tool_name"], "web_fetch");
    let resolved = body_of(of_card(&all, &rid, "card.resolved")[3]);
    assert_eq!(resolved["sequence"], 3);
    assert_eq!(resolved["card"]["state"], "approved");
    assert_eq!(resolved["card"]["decided_by"], "notify-operator");
    assert_ne!(
        of_card(&all, &rid, "card.armed")[0].delivery_id,
        of_card(&all, &rid, "card.resolved")[0].delivery_id
    );
    // Nothing went to the dead letters.
    let (status, v) = srv
        .get("/api/notifications/dead-letters", &srv.operator_token)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["dead_letters"], json!([]));
}

/// A receiver that answers a card's first `card.armed` 429 with `Retry-After: 3`, while
/// the notifier's own backoff would try again after 100 ms: posted again no sooner than
/// asked, accepted then, once, and nothing is a dead letter.
async fn retry_after_is_honoured(backend: Backend) {
    const ASKED: u64 = 3;
    let receiver = Receiver::start_asking(1, 429, Some(ASKED)).await;
    let (_process, srv) = serve_posting_to(backend, &receiver, "p-notify");
    let (_run_id, rid) = arm_card(&srv).await;
    let all = receiver
        .until("the armed notice accepted", |all| {
            accepted(all, &rid, "card.armed") == 1
        })
        .await;
    let posts = of_card(&all, &rid, "card.armed");
    assert_eq!(posts.len(), 2, "one 429, then the one accepted: {posts:#?}");
    assert!(!posts[0].accepted && posts[1].accepted, "{posts:#?}");
    let waited = posts[1].at.duration_since(posts[0].at);
    assert!(
        waited >= Duration::from_secs(ASKED),
        "posted again after {waited:?}, sooner than Retry-After"
    );
    let (status, v) = srv
        .get("/api/notifications/dead-letters", &srv.operator_token)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["dead_letters"], json!([]));
}

/// A receiver that always fails: the delivery is tried `TOLLGATE_NOTIFY_MAX_ATTEMPTS`
/// times, then listed as a dead letter of its project (of no other); an operator's retry
/// sends it again (same delivery id) until it is dead again. A 4xx answer is permanent:
/// dead after one attempt.
async fn dead_letters_are_kept_and_retried(backend: Backend) {
    let receiver = Receiver::start(usize::MAX, 500).await;
    let setup = aws_setup();
    let env = webhook_env(&receiver, &[("TOLLGATE_NOTIFY_MAX_ATTEMPTS", "3")]);
    let process = start(backend, env, Some(&setup), None, "serve");
    let srv = client(&process.base, "p-dead");
    let (run_id, rid) = arm_card(&srv).await;
    let letter = wait_dead_letter(&srv, &rid, 3).await;
    assert_eq!(letter["sink"], "webhook");
    assert_eq!(letter["kind"], "armed");
    assert_eq!(letter["run_id"], json!(run_id));
    assert_eq!(letter["project"], "p-dead");
    assert_eq!(letter["state"], "dead");
    assert_eq!(letter["last_error"], "the receiver answered 500");
    let id = letter["delivery_id"].as_str().unwrap().to_owned();
    let posts = receiver.all();
    assert_eq!(posts.iter().filter(|r| r.delivery_id == id).count(), 3);

    // Another project's operator sees none of it, nor can retry it.
    let other = client(&process.base, "p-other");
    let (status, v) = other
        .get("/api/notifications/dead-letters", &other.operator_token)
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["dead_letters"], json!([]));
    let (status, v) = other
        .post(
            &format!("/api/notifications/dead-letters/{id}/retry"),
            &other.operator_token,
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{v}");
    // An agent may not list them.
    let (status, _) = srv
        .get("/api/notifications/dead-letters", &srv.agent_token)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    let (status, v) = srv
        .post(
            &format!("/api/notifications/dead-letters/{id}/retry"),
            &srv.operator_token,
            &json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["delivery_id"], json!(id));
    receiver
        .until("three more attempts after the retry", |all| {
            all.iter().filter(|r| r.delivery_id == id).count() == 6
        })
        .await;
    let again = wait_dead_letter(&srv, &rid, 3).await;
    assert_eq!(again["delivery_id"], json!(id));
    assert_eq!(
        receiver
            .all()
            .iter()
            .filter(|r| r.delivery_id == id)
            .count(),
        6,
        "dead again after exactly 3 more attempts"
    );
}

/// Polls the dead letters until `rid`'s armed delivery is there with `attempts`.
async fn wait_dead_letter(srv: &TestServer, rid: &str, attempts: u32) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (status, v) = srv
            .get("/api/notifications/dead-letters", &srv.operator_token)
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        if let Some(letter) = v["dead_letters"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["request_id"] == json!(rid) && d["attempts"] == json!(attempts))
        {
            return letter.clone();
        }
        assert!(Instant::now() < deadline, "no dead letter for {rid}: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A receiver answering 400: permanent, a dead letter after one attempt.
async fn refusals_are_permanent(backend: Backend) {
    let receiver = Receiver::start(usize::MAX, 400).await;
    let (_process, srv) = serve_posting_to(backend, &receiver, "p-refused");
    let (_, rid) = arm_card(&srv).await;
    let letter = wait_dead_letter(&srv, &rid, 1).await;
    assert_eq!(letter["last_error"], "the receiver answered 400");
    let id = letter["delivery_id"].as_str().unwrap();
    assert_eq!(
        receiver
            .all()
            .iter()
            .filter(|r| r.delivery_id == id)
            .count(),
        1
    );
}

tollgate_tests::for_each_backend! {
    a_sink_nobody_has_is_put_off_then_dead_lettered => strays_are_put_off_then_dead;
    a_sink_first_enabled_by_an_open_old_arm_posts_it_and_records_the_enabling => open_old_arm_records_the_enabling;
    a_receiver_failing_three_times_gets_each_notice_once => survives_three_failures;
    a_receivers_retry_after_is_honoured => retry_after_is_honoured;
    dead_letters_are_listed_per_project_and_retried => dead_letters_are_kept_and_retried;
    a_4xx_answer_is_a_dead_letter_at_once => refusals_are_permanent;
}

/// Two `serve --backend aws` processes on the same tables, both reading the events
/// table's stream: every card's armed and resolved notices reach the receiver exactly
/// once, whichever process armed or decided it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_two_processes_send_each_notice_once() {
    let receiver = Receiver::start(0, 500).await;
    let setup = aws_setup();
    let a = start(
        Backend::Dynamo,
        webhook_env(&receiver, &[]),
        Some(&setup),
        None,
        "serve a",
    );
    let queue = a
        .queue_url()
        .expect("the first process names its timer queue");
    let b = start(
        Backend::Dynamo,
        webhook_env(&receiver, &[]),
        Some(&setup),
        Some(&queue),
        "serve b",
    );
    let servers = [client(&a.base, "p-two"), client(&b.base, "p-two")];
    let mut cards = Vec::new();
    for i in 0..6 {
        let (run_id, rid) = arm_card(&servers[i % 2]).await;
        approve(&servers[(i + 1) % 2], &run_id, &rid).await;
        cards.push(rid);
    }
    // A last card, handed over after the others on both readers.
    let (run_id, last) = arm_card(&servers[0]).await;
    approve(&servers[1], &run_id, &last).await;
    let all = receiver
        .until("every notice", |all| {
            cards.iter().chain([&last]).all(|rid| {
                accepted(all, rid, "card.armed") >= 1 && accepted(all, rid, "card.resolved") >= 1
            })
        })
        .await;
    let mut per_id: HashMap<&str, usize> = HashMap::new();
    for r in &all {
        *per_id.entry(r.delivery_id.as_str()).or_default() += 1;
        assert!(signature_valid(r));
    }
    assert_eq!(
        per_id.len(),
        14,
        "one delivery per card and kind: {per_id:#?}"
    );
    assert!(
        per_id.values().all(|n| *n == 1),
        "no notice sent twice: {per_id:#?}"
    );
}

/// A `serve --backend aws` killed (SIGKILL) while a delivery waits for its next attempt
/// (the receiver failed the first): a fresh process on the same tables finds the
/// delivery in its record and finishes it — the receiver accepts each of the card's
/// notices exactly once, every post with the same delivery id, nothing after the
/// accepted one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_a_killed_process_retry_is_finished_once_by_the_next() {
    let receiver = Receiver::start(2, 503).await;
    let setup = aws_setup();
    // Retries 1.5 to 3 s apart: the kill comes between two attempts.
    let slow = [("TOLLGATE_NOTIFY_RETRY_BASE_MS", "3000")];
    let mut a = start(
        Backend::Dynamo,
        webhook_env(&receiver, &slow),
        Some(&setup),
        None,
        "killed",
    );
    let queue = a
        .queue_url()
        .expect("the first process names its timer queue");
    let (run_id, rid) = arm_card(&client(&a.base, "p-kill")).await;
    receiver
        .until("the first attempt", |all| {
            !of_card(all, &rid, "card.armed").is_empty()
        })
        .await;
    a.kill();
    let b = start(
        Backend::Dynamo,
        webhook_env(&receiver, &slow),
        Some(&setup),
        Some(&queue),
        "next",
    );
    let srv = client(&b.base, "p-kill");
    approve(&srv, &run_id, &rid).await;
    let all = receiver
        .until("both notices accepted", |all| {
            accepted(all, &rid, "card.armed") >= 1 && accepted(all, &rid, "card.resolved") >= 1
        })
        .await;
    for kind in ["card.armed", "card.resolved"] {
        let posts = of_card(&all, &rid, kind);
        assert_eq!(accepted(&all, &rid, kind), 1, "{kind}: {posts:#?}");
        assert!(
            posts.last().unwrap().accepted,
            "nothing after the accepted one: {posts:#?}"
        );
        assert!(
            posts
                .iter()
                .all(|p| p.delivery_id == posts[0].delivery_id && signature_valid(p)),
            "{posts:#?}"
        );
    }
}

/// A webhook enabled for the first time on tables that already hold card events (the
/// stream is read from its oldest record): the backlog of cards armed and decided before
/// is not notified, while a card still pending is (an operator can still decide it), and
/// so is what happens after: the pending card's resolution, and a new card's two notices.
/// The sink's first enabling is recorded once and stands for a process started later.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_a_sink_enabled_later_does_not_notify_the_backlog() {
    let receiver = Receiver::start(0, 500).await;
    let setup = aws_setup();
    let a = start(Backend::Dynamo, Vec::new(), Some(&setup), None, "no sink");
    let queue = a
        .queue_url()
        .expect("the first process names its timer queue");
    let before = client(&a.base, "p-backlog");
    let mut backlog = Vec::new();
    for _ in 0..3 {
        let (run_id, rid) = arm_card(&before).await;
        approve(&before, &run_id, &rid).await;
        backlog.push(rid);
    }
    let (waiting_run, waiting) = arm_card(&before).await;

    let b = start(
        Backend::Dynamo,
        webhook_env(&receiver, &[]),
        Some(&setup),
        Some(&queue),
        "sink",
    );
    let after = client(&b.base, "p-backlog");
    // The card still pending is posted though armed before the sink was enabled.
    receiver
        .until("the pending card from before the sink", |all| {
            accepted(all, &waiting, "card.armed") >= 1
        })
        .await;
    approve(&after, &waiting_run, &waiting).await;
    let (run_id, fresh) = arm_card(&after).await;
    approve(&after, &run_id, &fresh).await;
    // A second process with the sink, started later: the first enabling stands for it.
    let c = start(
        Backend::Dynamo,
        webhook_env(&receiver, &[]),
        Some(&setup),
        Some(&queue),
        "sink, later",
    );
    let later = client(&c.base, "p-backlog");
    let (run_id, last) = arm_card(&later).await;
    approve(&later, &run_id, &last).await;
    let all = receiver
        .until("the notices after the sink was enabled", |all| {
            [&fresh, &last].iter().all(|rid| {
                accepted(all, rid, "card.armed") >= 1 && accepted(all, rid, "card.resolved") >= 1
            }) && accepted(all, &waiting, "card.resolved") >= 1
        })
        .await;
    for rid in &backlog {
        assert!(
            all.iter().all(|r| body_of(r)["request_id"] != json!(rid)),
            "the backlog is not notified: {all:#?}"
        );
    }
    for (rid, kind) in [
        (&waiting, "card.armed"),
        (&fresh, "card.armed"),
        (&fresh, "card.resolved"),
        (&last, "card.armed"),
        (&last, "card.resolved"),
        (&waiting, "card.resolved"),
    ] {
        assert_eq!(of_card(&all, rid, kind).len(), 1, "{rid} {kind}: {all:#?}");
    }
}

/// What `tollgate serve` says and does with a bad webhook configuration: it does not
/// start, and its output never shows the secret.
fn refused_startup(env: &[(&str, &str)]) -> String {
    let out = std::process::Command::new(tollgate_bin())
        .args(["serve", "--port", "0", "--host", "127.0.0.1"])
        .env("TOLLGATE_SECRET", TEST_SECRET)
        .env_remove("TOLLGATE_ALLOW_LOOPBACK_ORIGINS")
        .env_remove("TOLLGATE_WEBHOOK_URL")
        .env_remove("TOLLGATE_WEBHOOK_SECRET")
        .env_remove("TOLLGATE_WEBHOOK_SECRET_ARN")
        .envs(env.iter().copied())
        .stdin(std::process::Stdio::null())
        .output()
        .expect("tollgate runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "it started: {text}");
    assert!(!text.contains("Tollgate is listening"), "{text}");
    text
}

#[test]
fn a_bad_webhook_configuration_stops_startup() {
    let text = refused_startup(&[("TOLLGATE_WEBHOOK_URL", "https://example.com/hook")]);
    assert!(text.contains("TOLLGATE_WEBHOOK_SECRET"), "{text}");
    let text = refused_startup(&[
        ("TOLLGATE_WEBHOOK_URL", "https://example.com/hook"),
        ("TOLLGATE_WEBHOOK_SECRET", "short-s3cr"),
    ]);
    assert!(text.contains("at least 16 bytes"), "{text}");
    assert!(
        !text.contains("short-s3cr"),
        "the secret is never shown: {text}"
    );
    let text = refused_startup(&[("TOLLGATE_WEBHOOK_SECRET", WEBHOOK_SECRET)]);
    assert!(text.contains("TOLLGATE_WEBHOOK_URL"), "{text}");
    assert!(!text.contains(WEBHOOK_SECRET), "{text}");
}

#[test]
fn private_and_metadata_targets_are_refused() {
    for url in [
        "https://169.254.169.254/latest/meta-data",
        "https://10.0.0.7/hook",
        "https://192.168.1.10/hook",
        "https://[fd00::1]/hook",
        "https://metadata.google.internal/hook",
        "http://example.com/hook",
        "http://127.0.0.1:9/hook",
        "https://user:pw@example.com/hook",
    ] {
        let text = refused_startup(&[
            ("TOLLGATE_WEBHOOK_URL", url),
            ("TOLLGATE_WEBHOOK_SECRET", WEBHOOK_SECRET),
        ]);
        assert!(text.contains("TOLLGATE_WEBHOOK_URL"), "{url}: {text}");
        assert!(!text.contains(WEBHOOK_SECRET), "{text}");
    }
}

/// A store of its own (on DynamoDB, tables of its own: the retry pass reads every
/// project's due deliveries).
async fn own_store(backend: Backend) -> Arc<dyn tollgate_store::Store> {
    match backend {
        Backend::Memory => Arc::new(tollgate_store::memory::MemoryStore::new()),
        Backend::Dynamo => {
            assert!(
                tollgate_tests::aws_endpoint_configured(),
                "no DynamoDB endpoint"
            );
            let sdk = tollgate_store::dynamo::sdk_config().await;
            let client = tollgate_store::dynamo::client(&sdk);
            let (prefix, _) = aws_setup();
            let tables = tollgate_store::dynamo::Tables::with_prefix(&prefix);
            tollgate_store::schema::ensure_tables(&client, &tables)
                .await
                .expect("tables");
            Arc::new(tollgate_store::dynamo::DynamoStore::new(client, tables))
        }
    }
}

/// A sink that records what it is asked to deliver and delivers it.
struct Recording(&'static str, Arc<Mutex<Vec<String>>>);

#[async_trait::async_trait]
impl tollgate_api::notify::Sink for Recording {
    fn name(&self) -> &'static str {
        self.0
    }
    fn wants(&self, _: &tollgate_api::notify::CardNotice) -> bool {
        true
    }
    async fn deliver(
        &self,
        notice: &tollgate_api::notify::CardNotice,
        _: Option<&str>,
    ) -> Result<Option<String>, tollgate_api::notify::DeliveryError> {
        self.1.lock().unwrap().push(notice.request_id.clone());
        Ok(None)
    }
}

/// Pending deliveries of a sink (`slack`) the notifier running the retry pass does not
/// have (it has `webhook` only): one just due is left to the processes that have the
/// sink; one overdue past the grace is put off (still pending, out of the due ones); one
/// older than the horizon is a dead letter saying why, listed for its project. Another
/// pass touches none of them; a process that has the sink then delivers the one put off.
async fn strays_are_put_off_then_dead(backend: Backend) {
    use tollgate_store::{Delivery, DeliveryKey, DeliveryState};
    let store = own_store(backend).await;
    let policy = tollgate_api::notify::RetryPolicy {
        stray_after: Duration::from_secs(3600),
        ..Default::default()
    };
    let grace = policy.stray_grace().as_millis() as i64;
    let window = policy.stray_window().as_millis() as i64;
    assert!(window < grace, "{window} < {grace}");
    let now = tollgate_domain::now_millis();
    let pending = |rid: &str, created_at: i64, next_attempt_at: i64| {
        let key = DeliveryKey {
            sink: "slack".into(),
            project: "p-stray".into(),
            run_id: "run-stray".into(),
            request_id: rid.into(),
            kind: "armed".into(),
        };
        let mut d = Delivery::new(key, 3, created_at);
        d.version = 2;
        d.attempts = 1;
        d.next_attempt_at = next_attempt_at;
        d
    };
    let just_due = pending("just-due", now - 1_000, now);
    // Put off once, then claimed (the mark cleared) or written again since less than a
    // grace ago: still the sink's processes' to take.
    let mut touched = pending("touched", now - 2 * grace, now - 1);
    touched.last_error = Some("put off: no notifier here has the sink slack configured".into());
    touched.updated_at = now - 1_000;
    let overdue = pending("overdue", now - 2 * grace, now - 2 * grace);
    let old = pending("old", now - 3_601_000, now - 2 * grace);
    for d in [&just_due, &touched, &overdue, &old] {
        assert!(store.put_delivery(d, 0).await.unwrap());
    }
    let delivered: Arc<Mutex<Vec<String>>> = Arc::default();
    let without = tollgate_api::notify::Notifier::new(
        store.clone(),
        vec![Arc::new(Recording("webhook", delivered.clone()))],
    )
    .with_policy(policy);
    for _ in 0..2 {
        assert_eq!(without.retry_due().await.unwrap(), 0);
    }
    let read = |d: &Delivery| {
        let (store, id) = (store.clone(), d.delivery_id.clone());
        async move { store.read_delivery(&id).await.unwrap().unwrap() }
    };
    assert_eq!(
        read(&just_due).await,
        just_due,
        "left to the sink's processes"
    );
    assert_eq!(
        read(&touched).await,
        touched,
        "written less than a grace ago: left to the sink's processes"
    );
    let put_off = read(&overdue).await;
    assert_eq!(
        (put_off.state, put_off.attempts, put_off.version),
        (DeliveryState::Pending, 1, 3),
        "{put_off:?}"
    );
    assert!(put_off.next_attempt_at > now, "{put_off:?}");
    // Due again with nobody having claimed it in a whole grace (the clock moved on, as
    // written here): left to the sink's processes for the window, not another grace...
    let rewrite = |d: &Delivery, updated_at: i64, next_attempt_at: i64| {
        let (store, mut next) = (store.clone(), d.clone());
        (next.updated_at, next.next_attempt_at) = (updated_at, next_attempt_at);
        next.version += 1;
        async move {
            assert!(store.put_delivery(&next, next.version - 1).await.unwrap());
            next
        }
    };
    let later = tollgate_domain::now_millis();
    let due_again = rewrite(&put_off, later - grace - 1, later - 1).await;
    assert_eq!(without.retry_due().await.unwrap(), 0);
    assert_eq!(
        read(&overdue).await,
        due_again,
        "within the window: left alone"
    );
    // ...then put off again.
    let due_again = rewrite(&due_again, later - grace - 1, later - window - 1).await;
    assert_eq!(without.retry_due().await.unwrap(), 0);
    let put_off = read(&overdue).await;
    assert_eq!(
        (put_off.state, put_off.attempts, put_off.version),
        (DeliveryState::Pending, 1, due_again.version + 1),
        "{put_off:?}"
    );
    assert!(
        put_off.next_attempt_at > tollgate_domain::now_millis(),
        "{put_off:?}"
    );
    let dead = read(&old).await;
    assert_eq!(
        (dead.state, dead.attempts),
        (DeliveryState::Dead, 1),
        "{dead:?}"
    );
    let why = dead.last_error.clone().unwrap_or_default();
    assert!(why.contains("no notifier has the sink slack"), "{why}");
    let listed = without.dead_letters("p-stray", 10).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].delivery_id, old.delivery_id);
    assert!(delivered.lock().unwrap().is_empty());

    // A process with the sink claims the one put off once it is due again (its run is
    // gone here, so it is settled as such — by the process that has the sink).
    let with = tollgate_api::notify::Notifier::new(
        store.clone(),
        vec![Arc::new(Recording("slack", delivered.clone()))],
    )
    .with_policy(policy);
    let now = tollgate_domain::now_millis();
    rewrite(&put_off, put_off.updated_at, now - 1).await;
    with.retry_due().await.unwrap();
    let d = read(&overdue).await;
    assert_eq!(
        (d.state, d.last_error.as_deref()),
        (
            DeliveryState::Dead,
            Some("the run or its card no longer exists")
        ),
        "claimed by the process with the sink: {d:?}"
    );
}

/// A sink's first card event is the arm of a card from before its enabling, still open:
/// it is posted, and the sink's enabling is recorded by it all the same (a later event of
/// a card decided before then is backlog); the arm of a card decided before the enabling
/// is not posted.
async fn open_old_arm_records_the_enabling(backend: Backend) {
    let store = own_store(backend).await;
    let srv = TestServer::with_store(store.clone()).await;
    let (open_run, open) = arm_card(&srv).await;
    let (decided_run, decided) = arm_card(&srv).await;
    approve(&srv, &decided_run, &decided).await;
    // A sink of its own, first enabled now: both cards were armed before (a few ms
    // before, so that neither shares the enabling's millisecond).
    tokio::time::sleep(Duration::from_millis(10)).await;
    let sink: &'static str =
        Box::leak(format!("rec-{}", uuid::Uuid::new_v4().simple()).into_boxed_str());
    let delivered: Arc<Mutex<Vec<String>>> = Arc::default();
    let notifier = tollgate_api::notify::Notifier::new(
        store.clone(),
        vec![Arc::new(Recording(sink, delivered.clone()))],
    )
    .with_backlog_grace(Duration::ZERO);
    let arm_of = |run_id: String| {
        let store = store.clone();
        async move {
            let page = store.read_events(&run_id, 0, 10).await.unwrap();
            page.events
                .into_iter()
                .find(|e| e.event_type == "tool.approval_required")
                .expect("the arm event")
        }
    };
    notifier
        .on_event(&open_run, &arm_of(open_run.clone()).await)
        .await
        .unwrap();
    assert_eq!(
        *delivered.lock().unwrap(),
        vec![open.clone()],
        "the open card is posted"
    );
    let enabled = store.sink_enabled_at(sink, i64::MAX).await.unwrap();
    assert!(enabled < i64::MAX, "the enabling was recorded: {enabled}");
    notifier
        .on_event(&decided_run, &arm_of(decided_run.clone()).await)
        .await
        .unwrap();
    assert_eq!(
        *delivered.lock().unwrap(),
        vec![open],
        "a card decided before the enabling is backlog"
    );
}
