//! Approving from Slack, through HTTP against real `tollgate serve` processes and a fake
//! Slack on loopback that records every Web API call (docs/architecture.md §11): an armed
//! card on a run with a `channel_id` is posted once with both buttons; a signed click
//! decides it as the operator the Slack user is mapped to and the message is rewritten;
//! bad, stale or replayed signatures are 401 and decide nothing; concurrent clicks
//! resolve the card once; a card resolved over HTTP rewrites the message too; an
//! unmapped user, a tampered button or a non-owner's scope decide nothing; a click on a
//! pod-held card whose pod does not answer is answered without it, recording nothing.
//!
//! Each test runs on the embedded store (`memory::`) and on DynamoDB (`dynamo::`, under
//! the emulators: `tests/harness/emulators.sh with …`).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tollgate_api::slack::signature::sign;
use tollgate_api::Role;
use tollgate_tests::serve::{ServeProcess, Start};
use tollgate_tests::{pods, Backend, TestServer, TEST_SECRET};

const SIGNING_SECRET: &str = "slack-signing-secret-for-the-tests";
const BOT_TOKEN: &str = "xoxb-fake-bot-token-never-logged";
const PROJECT: &str = "proj-slack";
const CHANNEL: &str = "C0APPROVALS";
/// alice and bob act in [`PROJECT`]; carol in another project; dave in every project.
const USERS: &str =
    "U0ALICE=alice@proj-slack,U0BOB=bob@proj-slack,U0CAROL=carol@proj-other,U0DAVE=dave@*";

tollgate_tests::for_each_backend! {
    slack_posts_and_a_signed_click_approves => armed_card_is_posted_and_a_signed_click_approves_it;
    slack_refuses_bad_stale_and_replayed_signatures => bad_stale_or_replayed_signatures_decide_nothing;
    slack_concurrent_clicks_resolve_once => concurrent_clicks_resolve_the_card_once;
    slack_http_resolution_rewrites_the_message => a_card_resolved_over_http_rewrites_the_message;
    slack_unmapped_users_and_tampered_buttons => unmapped_users_and_tampered_buttons_decide_nothing;
    slack_only_the_owner_grants_beyond_once => only_the_owner_grants_beyond_once;
    slack_decides_a_card_of_a_run_of_no_project => a_card_of_a_run_of_no_project_is_decided_by_an_operator_of_every_project;
    slack_a_slow_pod_is_answered_in_time => a_click_on_a_slow_pods_card_is_answered_without_waiting_for_the_pod;
    slack_retry_after_is_honoured => a_rate_limited_post_is_retried_no_sooner_than_asked;
    slack_an_expired_card_is_told_everywhere => an_expired_card_rewrites_its_message_and_reaches_the_webhook;
    slack_channels_are_bounded_by_project => a_runs_channel_is_one_of_its_projects;
    slack_a_flooding_project_leaves_the_others_their_turn => a_flooding_project_leaves_anothers_notices_their_turn;
}

/// One Web API call the fake Slack received.
#[derive(Debug, Clone)]
struct Call {
    method: String,
    authorization: Option<String>,
    body: Value,
    /// What the fake answered.
    answer: Value,
    /// When it came.
    at: Instant,
}

/// A fake Slack Web API: answers `chat.postMessage` with a fresh `ts`, everything else
/// `ok`, and records every call; the first `limited` calls of `chat.postMessage` are
/// answered 429 `ratelimited` with `Retry-After: RATE_LIMIT_SECONDS`, and when paced, one
/// within the pace of the last accepted one 429 `ratelimited` with `Retry-After: 1`.
struct FakeSlack {
    base: String,
    calls: Arc<Mutex<Vec<Call>>>,
}

/// The `Retry-After` of a rate-limited call.
const RATE_LIMIT_SECONDS: u64 = 3;

/// How the fake limits `chat.postMessage`.
#[derive(Clone, Default)]
struct Limits {
    /// This many first calls are refused.
    limited: Arc<std::sync::atomic::AtomicUsize>,
    /// At most one accepted per this long.
    pace: Option<Duration>,
    last: Arc<Mutex<Option<Instant>>>,
}

impl Limits {
    /// Whether this call is refused, and the `Retry-After` it is told.
    fn refuse(&self) -> Option<u64> {
        use std::sync::atomic::Ordering::SeqCst;
        if self
            .limited
            .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Some(RATE_LIMIT_SECONDS);
        }
        let pace = self.pace?;
        let mut last = self.last.lock().unwrap();
        if last.is_some_and(|at| at.elapsed() < pace) {
            return Some(1);
        }
        *last = Some(Instant::now());
        None
    }
}

type FakeState = (Arc<Mutex<Vec<Call>>>, Limits);

async fn record(
    State((calls, limits)): State<FakeState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let mut calls = calls.lock().unwrap();
    let refused = if method == "chat.postMessage" {
        limits.refuse()
    } else {
        None
    };
    let throttled = refused.is_some();
    let answer = match method.as_str() {
        _ if throttled => json!({"ok": false, "error": "ratelimited"}),
        "chat.postMessage" => json!({
            "ok": true,
            "channel": body["channel"],
            "ts": format!("1700000000.{:06}", calls.len() + 1),
        }),
        _ => json!({"ok": true}),
    };
    calls.push(Call {
        method,
        authorization: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        body,
        answer: answer.clone(),
        at: Instant::now(),
    });
    if let Some(after) = refused {
        let after = [("retry-after", after.to_string())];
        return (
            axum::http::StatusCode::TOO_MANY_REQUESTS,
            after,
            Json(answer),
        )
            .into_response();
    }
    Json(answer).into_response()
}

impl FakeSlack {
    async fn start() -> Self {
        Self::start_limited(0).await
    }

    async fn start_limited(limited: usize) -> Self {
        Self::start_with(Limits {
            limited: Arc::new(limited.into()),
            ..Limits::default()
        })
        .await
    }

    /// A fake accepting at most one `chat.postMessage` per `pace`.
    async fn start_paced(pace: Duration) -> Self {
        Self::start_with(Limits {
            pace: Some(pace),
            ..Limits::default()
        })
        .await
    }

    async fn start_with(limits: Limits) -> Self {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let (listener, base) = pods::listen().await;
        let app = Router::new()
            .route("/api/{method}", post(record))
            .with_state((calls.clone(), limits));
        pods::serve(listener, app);
        Self {
            base: format!("{base}/api"),
            calls,
        }
    }

    fn calls(&self, method: &str) -> Vec<Call> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.method == method)
            .cloned()
            .collect()
    }

    /// The calls of `method` about card `rid` (its id appears in the message).
    fn about(&self, method: &str, rid: &str) -> Vec<Call> {
        self.calls(method)
            .into_iter()
            .filter(|c| c.body.to_string().contains(rid))
            .collect()
    }

    /// Waits (bounded) until `method` has been called about `rid` `n` times.
    async fn wait_for(&self, method: &str, rid: &str, n: usize) -> Vec<Call> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let calls = self.about(method, rid);
            if calls.len() >= n {
                return calls;
            }
            assert!(
                Instant::now() < deadline,
                "no {n} {method} about {rid}; calls so far: {:#?}",
                self.calls.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (bounded) for an ephemeral message to `user`.
    async fn wait_ephemeral(&self, user: &str, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let texts: Vec<String> = self
                .calls("chat.postEphemeral")
                .into_iter()
                .filter(|c| c.body["user"] == user)
                .map(|c| c.body["text"].as_str().unwrap_or_default().to_owned())
                .collect();
            if texts.len() >= n {
                return texts;
            }
            assert!(Instant::now() < deadline, "no ephemeral message to {user}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// One `tollgate serve` with Slack configured against `slack`, and a client of it.
struct Setup {
    _serve: ServeProcess,
    srv: TestServer,
    slack: FakeSlack,
}

async fn setup(backend: Backend) -> Setup {
    setup_with(backend, Vec::new()).await
}

/// [`setup`], `serve` given `extra` in its environment too.
async fn setup_with(backend: Backend, extra: Vec<(&'static str, String)>) -> Setup {
    setup_against(backend, FakeSlack::start().await, extra).await
}

/// [`setup_with`] against `slack`.
async fn setup_against(
    backend: Backend,
    slack: FakeSlack,
    extra: Vec<(&'static str, String)>,
) -> Setup {
    let unique = uuid::Uuid::new_v4().simple().to_string();
    let mut env = vec![
        ("TOLLGATE_SLACK_API_URL", slack.base.clone()),
        ("TOLLGATE_SLACK_BOT_TOKEN", BOT_TOKEN.to_owned()),
        ("TOLLGATE_SLACK_SIGNING_SECRET", SIGNING_SECRET.to_owned()),
        ("TOLLGATE_SLACK_USERS", USERS.to_owned()),
        ("TOLLGATE_ALWAYS_ELIGIBLE_TOOLS", "web_fetch".to_owned()),
    ];
    env.extend(extra);
    let mut args = Vec::new();
    if backend == Backend::Dynamo {
        assert!(
            tollgate_tests::aws_endpoint_configured(),
            "no DynamoDB endpoint: run under tests/harness/emulators.sh"
        );
        args = vec!["--backend", "aws", "--create-tables"];
        if !env.iter().any(|(k, _)| *k == "TOLLGATE_TABLE_PREFIX") {
            env.push(("TOLLGATE_TABLE_PREFIX", format!("slack-{unique}-")));
        }
        env.push(("TOLLGATE_TIMER_QUEUE_NAME", format!("slack-{unique}")));
    }
    let serve = tokio::task::spawn_blocking(move || {
        ServeProcess::start_with(Start {
            args,
            env,
            secret: Some(TEST_SECRET),
            echo: Some("[serve]".into()),
            ..Start::default()
        })
    })
    .await
    .unwrap();
    let srv = TestServer::remote(&serve.base);
    Setup {
        _serve: serve,
        srv,
        slack,
    }
}

/// A run of [`PROJECT`] owned by `owner`, reporting to [`CHANNEL`]: `(run_id, run_token)`.
async fn run(srv: &TestServer, owner: &str) -> (String, String) {
    run_with(srv, json!({"owner": owner})).await
}

/// A run of [`PROJECT`] reporting to [`CHANNEL`], created with `body`'s fields too.
async fn run_with(srv: &TestServer, mut body: Value) -> (String, String) {
    let agent = srv
        .auth
        .mint_jwt("agent-slack", Role::Agent, 3600, Some(PROJECT.into()));
    body["project_id"] = json!(PROJECT);
    body["channel_id"] = json!(CHANNEL);
    let (status, v) = srv.post("/api/runs", &agent, &body).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    (
        v["run_id"].as_str().unwrap().to_owned(),
        v["run_token"].as_str().unwrap().to_owned(),
    )
}

/// Arms a card for `tool` and returns its request id.
async fn arm(srv: &TestServer, run_id: &str, token: &str, tool: &str) -> String {
    arm_for(srv, run_id, token, tool, 600).await
}

/// Arms a card for `tool` that expires after `timeout` seconds; its request id.
async fn arm_for(srv: &TestServer, run_id: &str, token: &str, tool: &str, timeout: u64) -> String {
    let rid = pods::request_id();
    let (status, v) = srv
        .post(
            &format!("/api/runs/{run_id}/approval-requests"),
            token,
            &json!({
                "request_id": rid, "tool_name": tool, "url": "https://example.com/a",
                "intention": "fetch the page", "message": "please allow",
                "arguments_preview": {"path": "/a", "api_key": "sk-should-be-redacted"},
                "timeout_seconds": timeout,
            }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    rid
}

/// The card as its agent reads it.
async fn card(srv: &TestServer, run_id: &str, token: &str, rid: &str) -> Value {
    let (status, v) = srv
        .get(
            &format!("/api/runs/{run_id}/approval-requests/{rid}"),
            token,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

/// The `tool.approval_resolved` events of the run.
async fn resolutions(srv: &TestServer, run_id: &str, token: &str) -> Vec<Value> {
    srv.replay_all(run_id, token, 100)
        .await
        .into_iter()
        .filter(|e| e["type"] == "tool.approval_resolved")
        .collect()
}

/// The interactive elements of a posted message, by `action_id`.
fn element(message: &Value, action_id: &str) -> Value {
    message["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "actions")
        .flat_map(|b| b["elements"].as_array().unwrap().iter())
        .find(|e| e["action_id"] == action_id)
        .cloned()
        .unwrap_or_else(|| panic!("no {action_id} in {message}"))
}

fn has_actions(message: &Value) -> bool {
    message["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|b| b["type"] == "actions")
}

/// The body Slack sends for a click on the button `action_id` (with `value`) by `user`,
/// the scope menu showing `scope`.
fn click_body(user: &str, action_id: &str, value: &str, scope: Option<&str>) -> String {
    let payload = json!({
        "type": "block_actions",
        "team": {"id": "T0TEAM"},
        "user": {"id": user, "username": user.to_lowercase()},
        "channel": {"id": CHANNEL},
        "container": {"type": "message", "channel_id": CHANNEL, "message_ts": "1700000000.000001"},
        "response_url": "https://hooks.slack.invalid/actions/x",
        "actions": [{"type": "button", "block_id": "tollgate.decide", "action_id": action_id, "value": value, "action_ts": "1700000001.1"}],
        "state": {"values": {"tollgate.decide": {"tollgate.scope": {
            "type": "static_select",
            "selected_option": scope.map(|s| json!({"text": {"type": "plain_text", "text": s}, "value": s})),
        }}}},
    });
    url::form_urlencoded::Serializer::new(String::new())
        .append_pair("payload", &payload.to_string())
        .finish()
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Posts `body` to the interactivity endpoint signed with `secret` at `ts`.
async fn post_signed(srv: &TestServer, body: &str, secret: &str, ts: i64) -> (StatusCode, Value) {
    let ts = ts.to_string();
    let signature = sign(secret.as_bytes(), &ts, body.as_bytes());
    post_raw(srv, body, Some(&ts), Some(&signature)).await
}

async fn post_raw(
    srv: &TestServer,
    body: &str,
    ts: Option<&str>,
    signature: Option<&str>,
) -> (StatusCode, Value) {
    let mut req = srv
        .http
        .post(srv.url("/api/slack/interactions"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body.to_owned());
    if let Some(ts) = ts {
        req = req.header("x-slack-request-timestamp", ts);
    }
    if let Some(signature) = signature {
        req = req.header("x-slack-signature", signature);
    }
    srv.send(req).await
}

/// A click as Slack sends it, signed now.
async fn click(
    srv: &TestServer,
    user: &str,
    button: &Value,
    scope: Option<&str>,
) -> (StatusCode, Value) {
    let body = click_body(
        user,
        button["action_id"].as_str().unwrap(),
        button["value"].as_str().unwrap(),
        scope,
    );
    post_signed(srv, &body, SIGNING_SECRET, now()).await
}

/// The message posted for card `rid` (exactly one).
async fn posted(slack: &FakeSlack, rid: &str) -> Value {
    let posts = slack.wait_for("chat.postMessage", rid, 1).await;
    assert_eq!(posts.len(), 1, "one message per card: {posts:#?}");
    posts[0].body.clone()
}

/// A run of alice's with a card for `tool` armed on it, and the message posted for the
/// card: `(run_id, run_token, request_id, message)`.
async fn armed(srv: &TestServer, slack: &FakeSlack, tool: &str) -> (String, String, String, Value) {
    let (run_id, token) = run(srv, "alice").await;
    let rid = arm(srv, &run_id, &token, tool).await;
    let message = posted(slack, &rid).await;
    (run_id, token, rid, message)
}

async fn armed_card_is_posted_and_a_signed_click_approves_it(backend: Backend) {
    let Setup { _serve, srv, slack } = setup(backend).await;
    let (run_id, token) = run(&srv, "alice").await;
    let rid = arm(&srv, &run_id, &token, "web_fetch").await;

    let message = posted(&slack, &rid).await;
    let call = slack.about("chat.postMessage", &rid).remove(0);
    assert_eq!(
        call.authorization.as_deref(),
        Some(format!("Bearer {BOT_TOKEN}").as_str())
    );
    assert_eq!(message["channel"], CHANNEL);
    let approve = element(&message, "tollgate.approve");
    let deny = element(&message, "tollgate.deny");
    assert_eq!(
        (approve["type"].as_str(), deny["type"].as_str()),
        (Some("button"), Some("button"))
    );
    let menu = element(&message, "tollgate.scope");
    let scopes: Vec<&str> = menu["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["value"].as_str().unwrap())
        .collect();
    assert_eq!(scopes, ["once", "run", "tool", "always"]);
    let text = message.to_string();
    for shown in [
        "web_fetch",
        "https://example.com/a",
        "fetch the page",
        "please allow",
        "<!date^",
    ] {
        assert!(text.contains(shown), "the message shows {shown}: {text}");
    }
    assert!(
        !text.contains("sk-should-be-redacted"),
        "the preview is the redacted one: {text}"
    );

    // alice clicks Approve with scope `run` (she owns the run).
    let (status, answer) = click(&srv, "U0ALICE", &approve, Some("run")).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["outcome"], "decided", "{answer}");
    let c = card(&srv, &run_id, &token, &rid).await;
    assert_eq!(
        (
            c["state"].as_str(),
            c["decided_by"].as_str(),
            c["scope"].as_str()
        ),
        (Some("approved"), Some("alice"), Some("run"))
    );
    let resolved = resolutions(&srv, &run_id, &token).await;
    assert_eq!(resolved.len(), 1);

    // The message is rewritten: who approved it, no buttons.
    let updates = slack.wait_for("chat.update", &rid, 1).await;
    let update = &updates.last().unwrap().body;
    assert_eq!(update["channel"], CHANNEL);
    assert_eq!(
        update["ts"], call.answer["ts"],
        "the posted message is the one updated"
    );
    assert!(
        update.to_string().contains("Approved by alice (scope run)"),
        "{update}"
    );
    assert!(!has_actions(update), "{update}");
    // No secret reached Slack's message bodies.
    assert!(!slack.calls.lock().unwrap().iter().any(|c| c
        .body
        .to_string()
        .contains(SIGNING_SECRET)
        || c.body.to_string().contains(BOT_TOKEN)));
}

async fn bad_stale_or_replayed_signatures_decide_nothing(backend: Backend) {
    let Setup { _serve, srv, slack } = setup(backend).await;
    let (run_id, token, rid, message) = armed(&srv, &slack, "web_fetch").await;
    let approve = element(&message, "tollgate.approve");
    let body = click_body(
        "U0ALICE",
        "tollgate.approve",
        approve["value"].as_str().unwrap(),
        None,
    );

    let ts = now().to_string();
    let good = sign(SIGNING_SECRET.as_bytes(), &ts, body.as_bytes());
    let wrong_key = sign(b"another-secret", &ts, body.as_bytes());
    let tampered_body = body.replace("U0ALICE", "U0BOBBY");
    for (label, b, t, s) in [
        ("no signature", body.as_str(), Some(ts.as_str()), None),
        ("no timestamp", body.as_str(), None, Some(good.as_str())),
        (
            "wrong key",
            body.as_str(),
            Some(ts.as_str()),
            Some(wrong_key.as_str()),
        ),
        (
            "body changed after signing",
            tampered_body.as_str(),
            Some(ts.as_str()),
            Some(good.as_str()),
        ),
        ("garbage", body.as_str(), Some(ts.as_str()), Some("v0=zz")),
    ] {
        let (status, v) = post_raw(&srv, b, t, s).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{label}: {v}");
        assert_eq!(v["code"], "unauthorized", "{label}: {v}");
    }
    // Stale: signed correctly, but more than five minutes ago (a replay of an old click).
    let (status, v) = post_signed(&srv, &body, SIGNING_SECRET, now() - 301).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");
    // A replay: the very bytes and headers of a click signed six minutes ago.
    let old = (now() - 360).to_string();
    let old_sig = sign(SIGNING_SECRET.as_bytes(), &old, body.as_bytes());
    let (status, _) = post_raw(&srv, &body, Some(&old), Some(&old_sig)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    let c = card(&srv, &run_id, &token, &rid).await;
    assert_eq!(c["state"], "pending", "{c}");
    assert!(resolutions(&srv, &run_id, &token).await.is_empty());
    assert!(slack.about("chat.update", &rid).is_empty());
    assert!(slack.calls("chat.postEphemeral").is_empty());
}

async fn concurrent_clicks_resolve_the_card_once(backend: Backend) {
    let Setup { _serve, srv, slack } = setup(backend).await;
    let (run_id, token, rid, message) = armed(&srv, &slack, "web_fetch").await;
    let approve = element(&message, "tollgate.approve");
    let deny = element(&message, "tollgate.deny");
    let srv = Arc::new(srv);
    let clicks = (0..20).map(|i| {
        let (srv, approve, deny) = (srv.clone(), approve.clone(), deny.clone());
        tokio::spawn(async move {
            let (user, button) = match i % 4 {
                0 => ("U0ALICE", &approve),
                1 => ("U0BOB", &approve),
                2 => ("U0ALICE", &deny),
                _ => ("U0DAVE", &deny),
            };
            click(&srv, user, button, None).await
        })
    });
    let answers: Vec<(StatusCode, Value)> = futures::future::join_all(clicks)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert!(
        answers.iter().all(|(s, _)| *s == StatusCode::OK),
        "{answers:#?}"
    );
    let decided: Vec<&Value> = answers
        .iter()
        .map(|(_, v)| v)
        .filter(|v| v["outcome"] == "decided")
        .collect();
    assert_eq!(decided.len(), 1, "exactly one click decides: {answers:#?}");
    let c = card(&srv, &run_id, &token, &rid).await;
    assert_eq!(c["state"], decided[0]["state"]);
    assert_eq!(c["decided_by"], decided[0]["decided_by"]);
    for (_, v) in &answers {
        assert!(
            v["outcome"] == "decided" || v["outcome"] == "already",
            "{v}"
        );
        assert_eq!(
            v["state"], c["state"],
            "every answer reads the one resolution: {v}"
        );
    }
    assert_eq!(resolutions(&srv, &run_id, &token).await.len(), 1);
    let updates = slack.wait_for("chat.update", &rid, 1).await;
    assert!(!has_actions(&updates[0].body));
}

async fn a_card_resolved_over_http_rewrites_the_message(backend: Backend) {
    let Setup { _serve, srv, slack } = setup(backend).await;
    let (run_id, token, rid, message) = armed(&srv, &slack, "shell").await;
    assert!(has_actions(&message));
    let bob = srv
        .auth
        .mint_jwt("bob", Role::Operator, 600, Some(PROJECT.into()));
    let (status, v) = srv
        .post(
            &format!("/api/runs/{run_id}/tool-denials"),
            &bob,
            &json!({"request_id": rid, "reason": "not on a Friday"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let updates = slack.wait_for("chat.update", &rid, 1).await;
    let update = &updates[0].body;
    assert!(
        update
            .to_string()
            .contains("Denied by bob: not on a Friday"),
        "{update}"
    );
    assert!(!has_actions(update), "{update}");
    // A late click on the old message decides nothing more.
    let approve = element(&message, "tollgate.approve");
    let (status, answer) = click(&srv, "U0ALICE", &approve, None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["outcome"], "already", "{answer}");
    assert_eq!(answer["state"], "denied");
    assert_eq!(resolutions(&srv, &run_id, &token).await.len(), 1);
    assert_eq!(slack.about("chat.postMessage", &rid).len(), 1);
}

async fn unmapped_users_and_tampered_buttons_decide_nothing(backend: Backend) {
    let Setup { _serve, srv, slack } = setup(backend).await;
    let (run_id, token, rid, message) = armed(&srv, &slack, "web_fetch").await;
    let approve = element(&message, "tollgate.approve");

    // A Slack user nobody mapped.
    let (status, v) = click(&srv, "U0MALLORY", &approve, None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["outcome"], "refused", "{v}");
    let told = slack.wait_ephemeral("U0MALLORY", 1).await;
    assert!(told[0].contains("Not allowed"), "{told:?}");

    // A user of another project.
    let (_, v) = click(&srv, "U0CAROL", &approve, None).await;
    assert_eq!(v["outcome"], "refused", "{v}");

    // A button naming another project than the card's: refused for a user of that
    // project, and for a user of every project (the card is not in the project named).
    let mut value: Value = serde_json::from_str(approve["value"].as_str().unwrap()).unwrap();
    value["p"] = json!("proj-other");
    let other = json!({"action_id": "tollgate.approve", "value": value.to_string()});
    for user in ["U0CAROL", "U0DAVE"] {
        let (status, v) = click(&srv, user, &other, None).await;
        assert_eq!(
            (status, v["outcome"].as_str()),
            (StatusCode::OK, Some("refused")),
            "{user}: {v}"
        );
    }
    // A button whose value is not one Tollgate writes: 400.
    for bad in [
        json!({"action_id": "tollgate.approve", "value": "not json"}),
        json!({"action_id": "tollgate.approve", "value": json!({"v": 1, "p": PROJECT, "r": run_id, "q": rid, "d": "deny"}).to_string()}),
        json!({"action_id": "tollgate.approve", "value": json!({"v": 1, "p": PROJECT, "r": run_id, "q": rid, "d": "approve", "by": "alice"}).to_string()}),
        json!({"action_id": "tollgate.deny", "value": json!({"v": 1, "p": PROJECT, "r": "../x", "q": rid, "d": "deny"}).to_string()}),
    ] {
        let (status, v) = click(&srv, "U0ALICE", &bad, None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {v}");
    }
    let c = card(&srv, &run_id, &token, &rid).await;
    assert_eq!(c["state"], "pending", "{c}");
    assert!(resolutions(&srv, &run_id, &token).await.is_empty());
    assert!(slack.about("chat.update", &rid).is_empty());
}

async fn only_the_owner_grants_beyond_once(backend: Backend) {
    let Setup { _serve, srv, slack } = setup(backend).await;
    let (run_id, token, rid, message) = armed(&srv, &slack, "web_fetch").await;
    let approve = element(&message, "tollgate.approve");

    // bob does not own the run: `always` is refused, visibly, and the card stays pending.
    let (status, v) = click(&srv, "U0BOB", &approve, Some("always")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["outcome"], "refused", "{v}");
    let told = slack.wait_ephemeral("U0BOB", 1).await;
    assert!(told[0].contains("owner"), "{told:?}");
    assert_eq!(card(&srv, &run_id, &token, &rid).await["state"], "pending");
    assert!(pods::policies(&srv, &run_id).await.is_empty());

    // bob may still approve it once.
    let (_, v) = click(&srv, "U0BOB", &approve, Some("once")).await;
    assert_eq!(v["outcome"], "decided", "{v}");
    let c = card(&srv, &run_id, &token, &rid).await;
    assert_eq!(
        (c["decided_by"].as_str(), c["scope"].as_str()),
        (Some("bob"), Some("once"))
    );
    assert!(pods::policies(&srv, &run_id).await.is_empty());
}

/// A run of no project: its buttons name no project, so an operator of every project
/// (dave) decides it; an operator of one project (alice) is refused.
async fn a_card_of_a_run_of_no_project_is_decided_by_an_operator_of_every_project(
    backend: Backend,
) {
    let Setup { _serve, srv, slack } = setup(backend).await;
    let agent = srv.auth.mint_jwt("agent-slack", Role::Agent, 3600, None);
    let (status, v) = srv
        .post(
            "/api/runs",
            &agent,
            &json!({"owner": "dave", "channel_id": CHANNEL}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let run_id = v["run_id"].as_str().unwrap().to_owned();
    let token = v["run_token"].as_str().unwrap().to_owned();
    let rid = arm(&srv, &run_id, &token, "web_fetch").await;
    let message = posted(&slack, &rid).await;
    let approve = element(&message, "tollgate.approve");
    assert!(
        !approve["value"].as_str().unwrap().contains("\"p\":\"-\""),
        "the button names no project: {approve}"
    );

    let (status, v) = click(&srv, "U0ALICE", &approve, Some("once")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["outcome"], "refused", "{v}");
    assert_eq!(card(&srv, &run_id, &token, &rid).await["state"], "pending");

    let (status, v) = click(&srv, "U0DAVE", &approve, Some("once")).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["outcome"], "decided", "{v}");
    let c = card(&srv, &run_id, &token, &rid).await;
    assert_eq!(
        (c["state"].as_str(), c["decided_by"].as_str()),
        (Some("approved"), Some("dave"))
    );
}

/// A pod that holds its answer to a forwarded decision until the test lets it go: it
/// applies the decision when it arrives (a real pod may apply it and then be slow to
/// say so) and answers a repeat of it at once, `applied` again.
struct SlowPod {
    origin: String,
    /// Forwarded decisions received.
    hits: Arc<std::sync::atomic::AtomicUsize>,
    /// Whether the first answer has been let go.
    release: Arc<tokio::sync::watch::Sender<bool>>,
}

impl SlowPod {
    async fn start() -> Self {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (listener, origin) = pods::listen().await;
        let hits = Arc::new(AtomicUsize::new(0));
        let release = Arc::new(tokio::sync::watch::channel(false).0);
        let app = {
            let (hits, release) = (hits.clone(), release.clone());
            Router::new().route(
                "/tool-approvals",
                post(move |Json(_): Json<Value>| {
                    let (hits, mut released) = (hits.clone(), release.subscribe());
                    async move {
                        if hits.fetch_add(1, Ordering::SeqCst) == 0 {
                            // The first answer waits until the test lets it go.
                            let _ = released.wait_for(|r| *r).await;
                        }
                        Json(
                            json!({"resolved": true, "applied": true, "state": "approved",
                                    "toolName": "web_fetch", "url": "https://example.com/a"}),
                        )
                    }
                }),
            )
        };
        pods::serve(listener, app);
        Self {
            origin,
            hits,
            release,
        }
    }

    fn hits(&self) -> usize {
        self.hits.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// Slack shows its user an error when a click is not answered within 3 s, and a decision
/// on a pod-held card waits on the run's pod: `serve` answers the click `pending` while
/// the pod still holds its answer (nothing recorded yet, the message keeps its buttons,
/// the user told), and the decision goes on: when the pod answers it is recorded once, by
/// the clicking operator, and the message rewritten. A second click finds it decided.
async fn a_click_on_a_slow_pods_card_is_answered_without_waiting_for_the_pod(backend: Backend) {
    let Setup { _serve, srv, slack } = setup_with(
        backend,
        vec![
            ("TOLLGATE_ALLOW_LOOPBACK_ORIGINS", "1".to_owned()),
            // An HTTP decision would wait this long on the pod: a click must not.
            ("TOLLGATE_AGENTHOST_TIMEOUT_SECONDS", "600".to_owned()),
        ],
    )
    .await;
    let pod = SlowPod::start().await;
    let (run_id, token) = run_with(
        &srv,
        json!({"owner": "alice", "execution_mode": "pod", "agenthost_origin": pod.origin}),
    )
    .await;
    // The pod announces its card; the card's message is posted.
    let rid = pods::request_id();
    let (status, v) = srv
        .post(
            &format!("/api/runs/{run_id}/events"),
            &token,
            &json!({"events": [{"type": "tool.approval_required", "requestId": rid,
                "displayId": &rid[..8], "toolName": "web_fetch", "url": "https://example.com/a",
                "intention": "read the docs", "message": "The agent wants to fetch a URL."}]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let message = posted(&slack, &rid).await;
    let approve = element(&message, "tollgate.approve");

    // alice approves; the pod takes the decision and holds its answer.
    let (status, answer) = click(&srv, "U0ALICE", &approve, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(
        !*pod.release.borrow(),
        "answered while the pod still holds its answer"
    );
    assert_eq!(pod.hits(), 1, "the decision reached the pod");
    assert_eq!(answer["outcome"], "pending", "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("has not answered yet"),
        "{answer}"
    );
    let told = slack.wait_ephemeral("U0ALICE", 1).await;
    assert!(told[0].contains("Deciding"), "{told:?}");
    // Nothing recorded yet: the card is pending, no resolution, the message not rewritten.
    let c = card(&srv, &run_id, &token, &rid).await;
    assert_eq!(c["state"], "pending", "{c}");
    assert!(resolutions(&srv, &run_id, &token).await.is_empty());
    assert!(slack.about("chat.update", &rid).is_empty());

    // The pod answers: the click's decision, still going on, is recorded once, by alice,
    // and the message rewritten, with no second click.
    pod.release.send_replace(true);
    let updates = slack.wait_for("chat.update", &rid, 1).await;
    let update = &updates.last().unwrap().body;
    assert!(update.to_string().contains("Approved by alice"), "{update}");
    assert!(!has_actions(update), "{update}");
    let c = card(&srv, &run_id, &token, &rid).await;
    assert_eq!(
        (c["state"].as_str(), c["decided_by"].as_str()),
        (Some("approved"), Some("alice")),
        "{c}"
    );
    assert_eq!(resolutions(&srv, &run_id, &token).await.len(), 1);
    assert_eq!(pod.hits(), 1, "the pod was asked once");

    // Clicked again: already approved by alice, nothing new recorded.
    let (status, answer) = click(&srv, "U0ALICE", &approve, None).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        (answer["outcome"].as_str(), answer["state"].as_str()),
        (Some("already"), Some("approved")),
        "{answer}"
    );
    assert_eq!(resolutions(&srv, &run_id, &token).await.len(), 1);
}

/// Slack answers the card's first `chat.postMessage` 429 `ratelimited` with
/// `Retry-After: 3`, while the notifier's own backoff would try again after 100 ms: the
/// message is posted again no sooner than Slack asked, once, and nothing is a dead letter.
async fn a_rate_limited_post_is_retried_no_sooner_than_asked(backend: Backend) {
    let Setup { _serve, srv, slack } = setup_against(
        backend,
        FakeSlack::start_limited(1).await,
        vec![("TOLLGATE_NOTIFY_RETRY_BASE_MS", "100".to_owned())],
    )
    .await;
    let (run_id, token) = run(&srv, "alice").await;
    let rid = arm(&srv, &run_id, &token, "web_fetch").await;
    let posts = slack.wait_for("chat.postMessage", &rid, 2).await;
    assert_eq!(posts[0].answer["error"], "ratelimited", "{posts:#?}");
    assert_eq!(posts[1].answer["ok"], true, "{posts:#?}");
    let waited = posts[1].at.duration_since(posts[0].at);
    assert!(
        waited >= Duration::from_secs(RATE_LIMIT_SECONDS),
        "posted again after {waited:?}, sooner than Retry-After"
    );
    // Decided: the posted message is the one updated, and no post came a third time.
    let approve = element(&posts[1].body, "tollgate.approve");
    let (status, answer) = click(&srv, "U0ALICE", &approve, None).await;
    assert_eq!(
        (status, answer["outcome"].as_str()),
        (StatusCode::OK, Some("decided"))
    );
    let updates = slack.wait_for("chat.update", &rid, 1).await;
    assert_eq!(updates[0].body["ts"], posts[1].answer["ts"]);
    assert_eq!(slack.about("chat.postMessage", &rid).len(), 2);
    let operator = srv
        .auth
        .mint_jwt("ops", Role::Operator, 600, Some(PROJECT.into()));
    let (status, dead) = srv.get("/api/notifications/dead-letters", &operator).await;
    assert_eq!(status, StatusCode::OK, "{dead}");
    assert!(
        dead.to_string().find(&rid).is_none(),
        "no dead letter: {dead}"
    );
}

/// A card nobody decides expires (its timer, in `serve`): its Slack message is rewritten
/// to say so, without buttons, and a webhook configured beside Slack gets the card's
/// `card.resolved` with `state: expired` — once each.
async fn an_expired_card_rewrites_its_message_and_reaches_the_webhook(backend: Backend) {
    let (listener, origin) = pods::listen().await;
    let hooks: Arc<Mutex<Vec<Value>>> = Arc::default();
    let log = hooks.clone();
    pods::serve(
        listener,
        Router::new().route(
            "/hook",
            post(move |Json(body): Json<Value>| {
                let log = log.clone();
                async move {
                    log.lock().unwrap().push(body);
                    axum::http::StatusCode::NO_CONTENT
                }
            }),
        ),
    );
    let Setup { _serve, srv, slack } = setup_with(
        backend,
        vec![
            ("TOLLGATE_WEBHOOK_URL", format!("{origin}/hook")),
            (
                "TOLLGATE_WEBHOOK_SECRET",
                "whsec-slack-tests-0123456789".to_owned(),
            ),
            ("TOLLGATE_ALLOW_LOOPBACK_ORIGINS", "1".to_owned()),
        ],
    )
    .await;
    let (run_id, token) = run(&srv, "alice").await;
    // Long enough for the message to be posted while the card is open (with buttons) on
    // a loaded machine; one past its deadline is posted without them.
    let rid = arm_for(&srv, &run_id, &token, "web_fetch", 8).await;
    let message = posted(&slack, &rid).await;
    assert!(has_actions(&message), "{message}");
    let updates = slack.wait_for("chat.update", &rid, 1).await;
    let update = &updates[0].body;
    assert!(update.to_string().contains("Expired"), "{update}");
    assert!(!has_actions(update), "{update}");
    let c = card(&srv, &run_id, &token, &rid).await;
    assert_eq!(c["state"], "expired", "{c}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let resolved = loop {
        let resolved: Vec<Value> = hooks
            .lock()
            .unwrap()
            .iter()
            .filter(|h| h["request_id"] == json!(rid) && h["type"] == "card.resolved")
            .cloned()
            .collect();
        if !resolved.is_empty() {
            break resolved;
        }
        assert!(Instant::now() < deadline, "no card.resolved for {rid}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(resolved[0]["card"]["state"], "expired", "{resolved:?}");
    // Once each: nothing more comes for the card.
    let armed = hooks
        .lock()
        .unwrap()
        .iter()
        .filter(|h| h["request_id"] == json!(rid) && h["type"] == "card.armed")
        .count();
    assert_eq!((armed, resolved.len()), (1, 1));
    assert_eq!(slack.about("chat.update", &rid).len(), 1);
    assert_eq!(resolutions(&srv, &run_id, &token).await.len(), 1);
}

/// On DynamoDB reached through a proxy that holds every request 1 s: a click on a card the
/// store decides takes longer than the 1.8 s `serve` gives a decision the run's pod makes
/// (its remembered head is stale — another writer appended — so its first transaction
/// loses and it writes again), and is still waited for: decided, never answered
/// `pending`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_a_slow_store_decision_is_waited_for_not_answered_pending() {
    use tollgate_tests::chaos::proxy::{FaultProxy, Service};
    let upstream = std::env::var("AWS_ENDPOINT_URL_DYNAMODB")
        .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
        .expect("no DynamoDB endpoint: run under tests/harness/emulators.sh");
    let proxy = FaultProxy::start(Service::Dynamo, &upstream).await.unwrap();
    let prefix = format!("slack-slow-{}-", uuid::Uuid::new_v4().simple());
    let Setup { _serve, srv, slack } = setup_with(
        Backend::Dynamo,
        vec![
            ("AWS_ENDPOINT_URL_DYNAMODB", proxy.url()),
            ("TOLLGATE_TABLE_PREFIX", prefix.clone()),
        ],
    )
    .await;
    let (run_id, token, rid, message) = armed(&srv, &slack, "web_fetch").await;
    // Another writer on the run (a store of its own, straight to DynamoDB).
    let sdk = tollgate_store::dynamo::sdk_config().await;
    let other = tollgate_store::dynamo::DynamoStore::new(
        tollgate_store::dynamo::client(&sdk),
        tollgate_store::dynamo::Tables::with_prefix(&prefix),
    );
    let mut payload = serde_json::Map::new();
    payload.insert("text".into(), json!("another writer"));
    tollgate_store::RunStore::append_events(
        &other,
        tollgate_store::RunRef::any(&run_id),
        vec![tollgate_domain::EventDraft {
            event_type: "agent.message".into(),
            event_id: None,
            payload,
        }],
    )
    .await
    .unwrap();
    proxy.slow_down(Some(Duration::from_secs(1)));
    let started = Instant::now();
    let (status, answer) = click(
        &srv,
        "U0ALICE",
        &element(&message, "tollgate.approve"),
        None,
    )
    .await;
    let took = started.elapsed();
    proxy.slow_down(None);
    assert_eq!(
        (status, answer["outcome"].as_str(), answer["state"].as_str()),
        (StatusCode::OK, Some("decided"), Some("approved")),
        "{answer}"
    );
    // The premise: the store took longer than the budget a pod's decision gets.
    assert!(
        took > tollgate_api::slack::FORWARD_BUDGET,
        "the store answered within the budget ({took:?}): nothing was tested"
    );
    let card = card(&srv, &run_id, &token, &rid).await;
    assert_eq!(card["state"], "approved", "{card}");
}

/// With `TOLLGATE_SLACK_CHANNELS` set, a run names only one of its project's channels:
/// another project's channel, or a project's channel named by a run of no project, is
/// refused at creation (400, nothing written); the posted message names the project;
/// an interaction body past 64 KiB is refused (413) before its signature is looked at,
/// and decides nothing.
async fn a_runs_channel_is_one_of_its_projects(backend: Backend) {
    const OPEN: &str = "C0OPENLAB";
    let Setup { _serve, srv, slack } = setup_with(
        backend,
        vec![(
            "TOLLGATE_SLACK_CHANNELS",
            format!("{CHANNEL}@{PROJECT},{OPEN}@-"),
        )],
    )
    .await;
    let create = |token: String, body: Value| {
        let srv = &srv;
        async move { srv.post("/api/runs", &token, &body).await }
    };
    let other = srv
        .auth
        .mint_jwt("agent-other", Role::Agent, 3600, Some("proj-other".into()));
    let none = srv.auth.mint_jwt("agent-none", Role::Agent, 3600, None);
    let ours = srv
        .auth
        .mint_jwt("agent-slack", Role::Agent, 3600, Some(PROJECT.into()));
    for (token, channel, who) in [
        (&other, CHANNEL, "another project's run"),
        (&none, CHANNEL, "a run of no project"),
        (&ours, OPEN, "our project's run, the project-less channel"),
    ] {
        let run_id = format!("run-{}", uuid::Uuid::new_v4().simple());
        let (status, v) = create(
            token.clone(),
            json!({"run_id": run_id, "owner": "alice", "channel_id": channel}),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{who}: {v}");
        assert_eq!(v["code"], "invalid_request", "{who}: {v}");
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("TOLLGATE_SLACK_CHANNELS"),
            "{v}"
        );
        let (status, _) = srv
            .get(&format!("/api/runs/{run_id}"), &srv.operator_token)
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{who}: nothing was written");
    }
    let (status, v) = create(none.clone(), json!({"owner": "dave", "channel_id": OPEN})).await;
    assert_eq!(status, StatusCode::CREATED, "the project-less channel: {v}");
    let (status, v) = create(other.clone(), json!({"owner": "alice"})).await;
    assert_eq!(status, StatusCode::CREATED, "no channel named: {v}");

    // Our project's run in our channel: posted, naming the project.
    let (run_id, token) = run(&srv, "alice").await;
    let rid = arm(&srv, &run_id, &token, "web_fetch").await;
    let message = posted(&slack, &rid).await;
    assert_eq!(message["channel"], CHANNEL, "{message}");
    assert!(
        message["blocks"].to_string().contains(PROJECT),
        "the message names the project: {message}"
    );

    // A body past the bound: 413, whatever it carries, and the card stays pending.
    let approve = element(&message, "tollgate.approve");
    let mut body = click_body(
        "U0BOB",
        approve["action_id"].as_str().unwrap(),
        approve["value"].as_str().unwrap(),
        Some("once"),
    );
    body.push_str("&pad=");
    body.push_str(&"x".repeat(70 * 1024));
    let (status, v) = post_signed(&srv, &body, SIGNING_SECRET, now()).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{v}");
    assert!(v["error"].as_str().unwrap().contains("64 KiB"), "{v}");
    assert_eq!(card(&srv, &run_id, &token, &rid).await["state"], "pending");
}

/// One project floods (20 cards at once) a Slack that takes one post per 200 ms and
/// answers the rest 429 `ratelimited`, `Retry-After: 1` (so about one post a second gets
/// through); another project arms 3 cards just after, with
/// `TOLLGATE_NOTIFY_MAX_ATTEMPTS=2` (a rate limit counting as an attempt would bury most
/// of the flood and maybe the others): the other project's 3 are posted among the first
/// accepted posts after they were armed, not behind the flood; every card of both is
/// posted exactly once, and neither project has a dead letter.
async fn a_flooding_project_leaves_anothers_notices_their_turn(backend: Backend) {
    const FLOOD: usize = 20;
    const OTHER: &str = "proj-quiet";
    let Setup { _serve, srv, slack } = setup_against(
        backend,
        FakeSlack::start_paced(Duration::from_millis(200)).await,
        vec![
            ("TOLLGATE_NOTIFY_RETRY_BASE_MS", "100".to_owned()),
            ("TOLLGATE_NOTIFY_MAX_ATTEMPTS", "2".to_owned()),
        ],
    )
    .await;
    // All at once (a slow store must not drain the flood before the others arm).
    let flood: Vec<String> = futures::future::join_all((0..FLOOD).map(|_| async {
        let (run_id, token) = run(&srv, "alice").await;
        arm(&srv, &run_id, &token, "web_fetch").await
    }))
    .await;
    let quiet_agent = srv
        .auth
        .mint_jwt("agent-quiet", Role::Agent, 3600, Some(OTHER.into()));
    let armed_at = Instant::now();
    let mut quiet = Vec::new();
    for _ in 0..3 {
        let (status, v) = srv
            .post(
                "/api/runs",
                &quiet_agent,
                &json!({"owner": "erin", "project_id": OTHER, "channel_id": "C0QUIET"}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        let (run_id, token) = (
            v["run_id"].as_str().unwrap().to_owned(),
            v["run_token"].as_str().unwrap().to_owned(),
        );
        quiet.push(arm(&srv, &run_id, &token, "web_fetch").await);
    }
    let accepted = |rid: &str| -> Vec<Call> {
        slack
            .about("chat.postMessage", rid)
            .into_iter()
            .filter(|c| c.answer["ok"] == true)
            .collect()
    };
    // Every card of both projects is posted (bounded: about one a second gets through).
    let deadline = Instant::now() + Duration::from_secs(120);
    while !flood
        .iter()
        .chain(&quiet)
        .all(|rid| !accepted(rid).is_empty())
    {
        assert!(
            Instant::now() < deadline,
            "not every card was posted: {} of the flood, {} of the others",
            flood.iter().filter(|r| !accepted(r).is_empty()).count(),
            quiet.iter().filter(|r| !accepted(r).is_empty()).count()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for rid in flood.iter().chain(&quiet) {
        assert_eq!(accepted(rid).len(), 1, "card {rid} posted once");
    }
    // Their turn: the accepted posts after the others armed, in order; the others' 3
    // come among the first few, while most of the flood is still waiting.
    let after: Vec<Call> = slack
        .calls("chat.postMessage")
        .into_iter()
        .filter(|c| c.answer["ok"] == true && c.at >= armed_at)
        .collect();
    let positions: Vec<usize> = quiet
        .iter()
        .map(|rid| {
            after
                .iter()
                .position(|c| c.body.to_string().contains(rid.as_str()))
                .expect("posted after it was armed")
        })
        .collect();
    let flood_after = after.len() - quiet.len();
    eprintln!(
        "the others' posts came at {positions:?} of {} accepted after they armed",
        after.len()
    );
    assert!(
        flood_after >= 10,
        "the flood was still being posted when the others armed ({flood_after} after)"
    );
    assert!(
        positions.iter().all(|p| *p < 8),
        "the others' posts came at {positions:?} of {} accepted after they armed",
        after.len()
    );
    let throttled = slack
        .calls("chat.postMessage")
        .iter()
        .filter(|c| c.answer["error"] == "ratelimited")
        .count();
    assert!(throttled > 0, "Slack did rate limit");
    for project in [PROJECT, OTHER] {
        let operator = srv
            .auth
            .mint_jwt("ops", Role::Operator, 600, Some(project.into()));
        let (status, dead) = srv.get("/api/notifications/dead-letters", &operator).await;
        assert_eq!(status, StatusCode::OK, "{dead}");
        let letters = dead["dead_letters"].as_array().cloned().unwrap_or_default();
        assert!(
            letters.is_empty() && dead.to_string().find("dlv_").is_none(),
            "{project}: no dead letter: {dead}"
        );
    }
}
