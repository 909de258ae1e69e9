//! The operator console (`GET /console`) in headless Chromium, driven through WebDriver
//! (fantoccini → a chromedriver this test starts on a free loopback port and kills at
//! the end), against an in-process `TestServer` on the embedded store with a short
//! heartbeat and a short stream window (so the console's streams end and resume).
//!
//! Seed 003's card lifecycle as an operator sees it: a card appears when a gate is
//! armed (timed), Approve hides it and the run's stream records who decided, an expiry
//! removes a card nobody clicked, a reload reattaches, two sessions on one card stay in
//! step, and the decision answers `404 unknown` / `503 agenthost_unreachable` hide the
//! card / offer a retry. The security review's cases: agent text with markup and
//! bidi / zero-width characters is shown as text with those characters marked and the
//! URL's real host apart; a stream answer that is not `text/event-stream`, or whose line
//! never ends, backs off; a listing that is not JSON keeps the cards. Each test is
//! bounded (`BUDGET`).
//!
//! `TOLLGATE_SCREENSHOTS=1` also writes `docs/console-pending.png` and
//! `docs/console-resolved.png`. Needs `chromium` and `chromedriver` on `PATH` (or
//! `TOLLGATE_CHROMIUM` / `TOLLGATE_CHROMEDRIVER`): `tests/harness/browser.sh`.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fantoccini::wd::Capabilities;
use fantoccini::{Client, ClientBuilder, Locator};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tollgate_api::oidc::{ConsoleClient, Oidc, OidcProjects};
use tollgate_api::{GateConfig, Role};
use tollgate_store::memory::MemoryStore;
use tollgate_tests::idp::{Idp, SigningKey, AUDIENCE, OPERATORS};
use tollgate_tests::TestServer;

/// Wall-clock bound of each test.
const BUDGET: Duration = Duration::from_secs(30);

/// How long a resolved card stays on screen (the console's `RESOLVED_LINGER_MS`).
const LINGER: Duration = Duration::from_secs(4);

/// The console's poll interval of `GET /api/approvals?state=pending`.
const POLL: Duration = Duration::from_millis(750);

// ---- chromedriver and Chromium ---------------------------------------------------------

/// `$var`, else `name` found on `PATH`; a clear failure when neither exists.
fn tool(var: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{name} not found on PATH (nor ${var}): the browser tests need Debian's \
                 chromium and chromium-driver — run tests/harness/browser.sh (as root it \
                 installs them)"
            )
        })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A chromedriver in its own process group; dropping it kills the group (the driver and
/// the browsers it started), also when a test fails.
struct Driver {
    child: Child,
    url: String,
    chromium: PathBuf,
}

impl Driver {
    async fn start() -> Self {
        let chromedriver = tool("TOLLGATE_CHROMEDRIVER", "chromedriver");
        let chromium = tool("TOLLGATE_CHROMIUM", "chromium");
        let http = reqwest::Client::new();
        for _ in 0..3 {
            let port = free_port();
            let child = Command::new(&chromedriver)
                .arg(format!("--port={port}"))
                .arg("--allowed-ips=127.0.0.1")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("starting {}: {e}", chromedriver.display()));
            let driver = Driver {
                child,
                url: format!("http://127.0.0.1:{port}"),
                chromium: chromium.clone(),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                let ready = http
                    .get(format!("{}/status", driver.url))
                    .send()
                    .await
                    .ok()
                    .map(|r| r.json::<Value>());
                if let Some(body) = ready {
                    if body.await.is_ok_and(|v| v["value"]["ready"] == true) {
                        return driver;
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            drop(driver); // (the port may have been taken meanwhile: another one)
        }
        panic!("chromedriver did not become ready on loopback");
    }

    /// A new headless Chromium session (its own fresh profile).
    async fn browser(&self) -> Client {
        let mut caps = Capabilities::new();
        caps.insert("browserName".into(), json!("chrome"));
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": self.chromium,
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--disable-extensions",
                    "--window-size=1280,900", "--force-device-scale-factor=1",
                    "--lang=en-US",
                ],
            }),
        );
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&self.url)
            .await
            .expect("a Chromium session through chromedriver")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill")
            .args(["-KILL", "--", &group])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- The server ---------------------------------------------------------------------------

/// The full app on the embedded store: heartbeats every 500 ms, streams that end after
/// 3 s (the console resumes them with `Last-Event-ID`).
async fn server(always_eligible: &[&str]) -> TestServer {
    let gate = GateConfig {
        heartbeat_every: Duration::from_millis(500),
        always_eligible: always_eligible.iter().map(|s| s.to_string()).collect(),
        ..GateConfig::default()
    };
    let mut deps = TestServer::deps(Arc::new(MemoryStore::new()), gate);
    deps.sse.window = Duration::from_secs(3);
    TestServer::with_deps(deps).await
}

fn operator(server: &TestServer, sub: &str) -> String {
    server.auth.mint_jwt(sub, Role::Operator, 3600, None)
}

/// Arms a gate; returns its request id.
async fn arm(server: &TestServer, run: &str, token: &str, extra: Value) -> String {
    let request_id = uuid::Uuid::new_v4().to_string();
    let mut body = json!({
        "request_id": request_id,
        "tool_name": "web_fetch",
        "url": "https://example.com/docs/page",
        "message": "The agent wants to fetch a URL. Operator approval required.",
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (status, v) = server
        .post(&format!("/api/runs/{run}/approval-requests"), token, &body)
        .await;
    assert_eq!(status, StatusCode::CREATED, "arm: {v}");
    request_id
}

/// The run's `tool.approval_resolved` for `request_id`, replayed over HTTP.
async fn resolution(server: &TestServer, run: &str, request_id: &str) -> Option<Value> {
    server
        .replay_all(run, &server.operator_token, 1000)
        .await
        .into_iter()
        .find(|e| e["type"] == "tool.approval_resolved" && e["requestId"] == request_id)
}

// ---- The page -------------------------------------------------------------------------------

/// A card as the page shows it: `null` when absent, else its state, text, buttons,
/// scope options and whether its run's stream is connected.
const CARD_JS: &str = r#"
const card = [...document.querySelectorAll('li.card')].find(n => n.dataset.requestId === arguments[0]);
if (!card) return null;
return {
  state: card.dataset.state,
  live: card.dataset.stream === 'live',
  text: card.innerText,
  outcome: card.querySelector('.outcome').textContent,
  buttons: [...card.querySelectorAll('button')].map(b => b.textContent),
  scopes: [...card.querySelectorAll('select.scope option')].map(o => o.value),
};
"#;

async fn card(client: &Client, request_id: &str) -> Value {
    client
        .execute(CARD_JS, vec![json!(request_id)])
        .await
        .expect("the page answers")
}

/// Polls the card every 10 ms until `ready` holds; the card and how long it took. Fails
/// after `within`.
async fn wait_card(
    client: &Client,
    request_id: &str,
    within: Duration,
    what: &str,
    ready: impl Fn(&Value) -> bool,
) -> (Value, Duration) {
    let started = Instant::now();
    loop {
        let c = card(client, request_id).await;
        if ready(&c) {
            return (c, started.elapsed());
        }
        assert!(
            started.elapsed() < within,
            "card {request_id}: not {what} within {within:?}; it is {c}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn wait_js(client: &Client, script: &str, within: Duration, what: &str) {
    let started = Instant::now();
    loop {
        if client
            .execute(script, vec![])
            .await
            .expect("the page answers")
            == json!(true)
        {
            return;
        }
        assert!(started.elapsed() < within, "not {what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Opens the console and pastes `token` (as an operator would); waits until it is in.
async fn open_console(client: &Client, server: &TestServer, token: &str) {
    load_console(client, server).await;
    sign_in(client, server, token).await;
}

/// Opens the console (not signed in yet).
async fn load_console(client: &Client, server: &TestServer) {
    client.goto(&server.url("/console")).await.unwrap();
    // The inline style passed the page's CSP (it is allowed by hash, nothing else is).
    let css = client
        .execute(
            "return getComputedStyle(document.documentElement).getPropertyValue('--console-css').trim()",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        css,
        json!("loaded"),
        "the inline style applies under the CSP"
    );
}

/// Pastes `token` into the loaded console; waits until it is in.
async fn sign_in(client: &Client, server: &TestServer, token: &str) {
    let input = client.find(Locator::Id("token")).await.unwrap();
    input.send_keys(token).await.unwrap();
    client
        .find(Locator::Css("#token-form button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_js(
        client,
        "return !document.getElementById('session').hidden && \
         getComputedStyle(document.getElementById('token-form')).display === 'none'",
        Duration::from_secs(5),
        "signed in",
    )
    .await;
    // The token went to sessionStorage, never into the address.
    let url = client.current_url().await.unwrap();
    assert_eq!(url.as_str(), server.url("/console"));
}

async fn click(client: &Client, request_id: &str, button: &str) {
    let css = format!("li.card[data-request-id=\"{request_id}\"] button.{button}");
    client
        .find(Locator::Css(&css))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

fn pending(c: &Value) -> bool {
    c["state"] == "pending"
}

fn screenshots() -> bool {
    std::env::var("TOLLGATE_SCREENSHOTS").is_ok_and(|v| v == "1")
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.unwrap();
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docs")
        .join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, png).unwrap();
    println!("screenshot: {}", path.display());
}

async fn bounded(test: impl std::future::Future<Output = ()>) {
    tokio::time::timeout(BUDGET, test)
        .await
        .unwrap_or_else(|_| panic!("the test took longer than {BUDGET:?}"));
}

// ---- The tests ----------------------------------------------------------------------------

/// The page, its script and its settings route, as a client sees them: a strict policy
/// with no external origin and no inline script, `no-store` everywhere, and the settings
/// only for operators.
#[tokio::test]
async fn the_console_is_served_with_a_strict_policy() {
    let server = server(&["web_fetch", "search"]).await;
    let page = server
        .http
        .get(server.url("/console"))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let h = page.headers().clone();
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    assert_eq!(h["cache-control"], "no-store");
    assert_eq!(h["x-content-type-options"], "nosniff");
    let csp = h["content-security-policy"].to_str().unwrap().to_owned();
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
        "style-src 'sha256-",
        "form-action 'none'",
        "frame-ancestors 'none'",
        "require-trusted-types-for 'script'",
    ] {
        assert!(csp.contains(directive), "{directive} in {csp}");
    }
    assert!(!csp.contains("unsafe") && !csp.contains("http"), "{csp}");
    let html = page.text().await.unwrap();
    assert!(html.contains(r#"<script src="console.js" defer></script>"#));

    let script = server
        .http
        .get(server.url("/console.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(script.status(), StatusCode::OK);
    assert_eq!(
        script.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );
    assert_eq!(script.headers()["cache-control"], "no-store");

    let (status, v) = server
        .send(server.http.get(server.url("/api/console/config")))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{v}");
    let (status, v) = server.get("/api/console/config", &server.agent_token).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    let (status, v) = server
        .get("/api/console/config", &operator(&server, "alice"))
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["sub"], "alice");
    assert_eq!(v["always_eligible"], json!(["web_fetch", "search"]));
}

/// (a) A card appears within 1 s of arming on a run the console follows (its live
/// stream), also after a stream window ended and was resumed; a new run's first card
/// arrives with the 750 ms poll.
#[tokio::test]
async fn a_card_appears_within_a_second_of_arming() {
    bounded(async {
        let server = server(&["web_fetch"]).await;
        let driver = Driver::start().await;
        let client = driver.browser().await;
        open_console(&client, &server, &operator(&server, "alice")).await;
        let (run, token) = server.create_run(json!({"owner": "alice"})).await;

        // A new run: the poll finds it.
        let started = Instant::now();
        let first = arm(&server, &run, &token, json!({})).await;
        wait_card(&client, &first, POLL * 2, "shown", pending).await;
        let via_poll = started.elapsed();
        assert!(via_poll < POLL + Duration::from_secs(1), "{via_poll:?}");
        wait_card(&client, &first, Duration::from_secs(3), "live", |c| {
            c["live"] == true
        })
        .await;

        // The run is followed now: its next cards come over its stream.
        let mut followed = Vec::new();
        for _ in 0..3 {
            let started = Instant::now();
            let id = arm(&server, &run, &token, json!({"tool_name": "search"})).await;
            let (c, _) = wait_card(&client, &id, Duration::from_secs(1), "shown", pending).await;
            followed.push(started.elapsed());
            assert_eq!(c["buttons"], json!(["Approve", "Deny"]), "{c}");
            assert!(c["text"].as_str().unwrap().contains("search"), "{c}");
        }
        // Past the end of a stream window (3 s): the console resumed it.
        tokio::time::sleep(Duration::from_millis(3500)).await;
        let started = Instant::now();
        let late = arm(&server, &run, &token, json!({})).await;
        wait_card(&client, &late, Duration::from_secs(1), "shown", pending).await;
        let after_window = started.elapsed();

        let worst = followed.iter().chain([&after_window]).max().unwrap();
        println!(
            "card latency (arm → card on screen): followed run {:?}, after a stream window \
             ended {:?}; a new run's first card (750 ms poll) {:?}",
            followed, after_window, via_poll
        );
        assert!(*worst < Duration::from_secs(1), "{worst:?}");

        // New cards are announced to screen readers.
        let announced = client
            .execute(
                "return document.getElementById('announcer').textContent",
                vec![],
            )
            .await
            .unwrap();
        assert!(
            announced.as_str().unwrap().contains("New approval request"),
            "{announced}"
        );
        let count = client
            .execute(
                "return document.getElementById('count').textContent",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(count, json!("(5)"));
        client.close().await.unwrap();
    })
    .await;
}

/// (b) Approve hides the card; the run's stream (replayed over HTTP) records
/// `tool.approval_resolved` decided by that operator with the chosen scope. The scope
/// picker offers beyond `once` only on the operator's own runs, `always` only for
/// always-eligible tools. The audit view shows the run's events in order.
#[tokio::test]
async fn approve_hides_the_card_and_the_stream_records_the_operator() {
    bounded(async {
        let server = server(&["web_fetch"]).await;
        let driver = Driver::start().await;
        let client = driver.browser().await;
        let (own_run, own_token) = server
            .create_run(json!({"owner": "alice", "channel_id": "C-ops"}))
            .await;
        let (other_run, other_token) = server.create_run(json!({"owner": "bob"})).await;
        let mine = arm(
            &server,
            &own_run,
            &own_token,
            json!({"intention": "Read the deployment guide before editing the config."}),
        )
        .await;
        let theirs = arm(
            &server,
            &other_run,
            &other_token,
            json!({"tool_name": "github_create_issue", "url": null,
                   "message": "The agent wants to open an issue in acme/infra."}),
        )
        .await;
        open_console(&client, &server, &operator(&server, "alice")).await;

        // Reattached on load; the owners come from run_started.
        let (c, _) = wait_card(&client, &mine, Duration::from_secs(3), "owned", |c| {
            c["scopes"].as_array().is_some_and(|s| s.len() > 1)
        })
        .await;
        assert_eq!(c["scopes"], json!(["once", "tool", "run", "always"]), "{c}");
        let (c, _) = wait_card(&client, &theirs, Duration::from_secs(3), "owned", |c| {
            c["text"].as_str().is_some_and(|t| t.contains("bob"))
        })
        .await;
        assert_eq!(c["scopes"], json!(["once"]), "{c}");
        assert!(
            c["text"]
                .as_str()
                .unwrap()
                .contains("Only the run’s owner (bob)"),
            "{c}"
        );
        if screenshots() {
            screenshot(&client, "console-pending.png").await;
        }

        let scope = client
            .find(Locator::Css(&format!(
                "li.card[data-request-id=\"{mine}\"] select.scope"
            )))
            .await
            .unwrap();
        scope.select_by_value("tool").await.unwrap();
        let clicked = Instant::now();
        click(&client, &mine, "approve").await;
        let (c, took) = wait_card(&client, &mine, Duration::from_secs(2), "approved", |c| {
            c["state"] == "approved"
        })
        .await;
        println!("approve → card resolved on screen: {took:?}");
        assert_eq!(c["buttons"], json!([]), "no buttons once decided: {c}");
        assert_eq!(c["outcome"], "Approved by alice (scope tool)", "{c}");
        if screenshots() {
            screenshot(&client, "console-resolved.png").await;
        }
        // Shown briefly, then removed; the other card stays.
        let started = Instant::now();
        wait_card(
            &client,
            &mine,
            LINGER + Duration::from_secs(2),
            "removed",
            |c| c.is_null(),
        )
        .await;
        assert!(clicked.elapsed() >= LINGER - Duration::from_millis(100));
        println!("resolved card removed after {:?}", started.elapsed());
        assert!(pending(&card(&client, &theirs).await));

        let resolved = resolution(&server, &own_run, &mine)
            .await
            .expect("tool.approval_resolved on the run's stream");
        assert_eq!(resolved["approved"], true, "{resolved}");
        assert_eq!(resolved["expired"], false, "{resolved}");
        assert_eq!(resolved["decidedBy"], "alice", "{resolved}");
        assert_eq!(resolved["scope"], "tool", "{resolved}");
        let (_, listed) = server
            .get("/api/approvals?state=pending", &server.operator_token)
            .await;
        let open: Vec<&Value> = listed["approvals"].as_array().unwrap().iter().collect();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0]["request_id"], theirs.as_str());

        // The audit view: the run's events, in order, as replay serves them.
        let input = client.find(Locator::Id("audit-run")).await.unwrap();
        input.send_keys(&own_run).await.unwrap();
        client
            .find(Locator::Css("#audit-form button[type=submit]"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let events = server
            .replay_all(&own_run, &server.operator_token, 1000)
            .await;
        let expected: Vec<Value> = events
            .iter()
            .map(|e| json!([e["sequence"].to_string(), e["type"]]))
            .collect();
        let rows_js = "return [...document.querySelectorAll('#audit-events tr')]\
                       .map(r => [r.cells[0].textContent, r.cells[1].textContent])";
        let started = Instant::now();
        loop {
            let rows = client.execute(rows_js, vec![]).await.unwrap();
            if rows.as_array().unwrap().len() >= expected.len() {
                assert_eq!(rows, json!(expected));
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "audit rows {rows}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
        assert_eq!(types.first(), Some(&"run_started"));
        assert!(types.contains(&"tool.approval_required"));
        assert_eq!(types.last(), Some(&"tool.approval_resolved"));
        client.close().await.unwrap();
    })
    .await;
}

/// The card shows the argument preview as the server stored it (secrets redacted there,
/// markup as text), and the reason the operator types goes with the decision: on the
/// card's outcome and in `tool.approval_resolved`.
#[tokio::test]
async fn a_card_shows_its_argument_preview_and_records_the_reason() {
    bounded(async {
        let server = server(&[]).await;
        let driver = Driver::start().await;
        let client = driver.browser().await;
        let (run, token) = server.create_run(json!({"owner": "alice"})).await;
        let rid = arm(
            &server,
            &run,
            &token,
            json!({"tool_name": "send_email", "url": null,
                   "arguments_preview": {"to": "ops@example.com", "subject": IMG,
                                         "smtp": {"password": "hunter2-SECRET"}}}),
        )
        .await;
        open_console(&client, &server, &operator(&server, "alice")).await;
        wait_card(&client, &rid, Duration::from_secs(3), "shown", pending).await;
        let shown = client
            .execute(
                "const card = [...document.querySelectorAll('li.card')].find(n => n.dataset.requestId === arguments[0]);\n\
                 const pre = card.querySelector('pre.arguments');\n\
                 return pre ? JSON.parse(pre.textContent) : null;",
                vec![json!(rid)],
            )
            .await
            .unwrap();
        assert_eq!(
            shown,
            json!({"to": "ops@example.com", "subject": IMG, "smtp": {"password": "[redacted]"}})
        );
        let clean = client.execute(CLEAN_JS, vec![]).await.unwrap();
        assert_eq!((clean["pwned"].clone(), clean["imgs"].clone()), (json!(null), json!(0)));
        let page = client
            .execute("return document.body.innerText", vec![])
            .await
            .unwrap();
        assert!(!page.as_str().unwrap().contains("hunter2"), "{page}");
        if screenshots() {
            screenshot(&client, "console-arguments.png").await;
        }
        let reason = client
            .find(Locator::Css(&format!(
                "li.card[data-request-id=\"{rid}\"] input.reason"
            )))
            .await
            .unwrap();
        reason.send_keys("Known recipient; ticket OPS-12").await.unwrap();
        click(&client, &rid, "deny").await;
        let (c, _) = wait_card(&client, &rid, Duration::from_secs(2), "denied", |c| {
            c["state"] == "denied"
        })
        .await;
        assert_eq!(
            c["outcome"],
            "Denied by alice: “Known recipient; ticket OPS-12”",
            "{c}"
        );
        let resolved = resolution(&server, &run, &rid)
            .await
            .expect("tool.approval_resolved on the run's stream");
        assert_eq!(resolved["decisionReason"], "Known recipient; ticket OPS-12");
        client.close().await.unwrap();
    })
    .await;
}

/// (c) A card nobody clicks expires (`timeout_seconds: 1`): the console shows it
/// expired, then removes it.
#[tokio::test]
async fn an_expired_card_is_removed_without_a_click() {
    bounded(async {
        let server = server(&["web_fetch"]).await;
        let driver = Driver::start().await;
        let client = driver.browser().await;
        open_console(&client, &server, &operator(&server, "alice")).await;
        let (run, token) = server.create_run(json!({"owner": "alice"})).await;
        let keep = arm(&server, &run, &token, json!({})).await;
        wait_card(&client, &keep, Duration::from_secs(4), "live", |c| {
            c["live"] == true
        })
        .await;

        let armed = Instant::now();
        let short = arm(&server, &run, &token, json!({"timeout_seconds": 1})).await;
        let (_, shown) = wait_card(&client, &short, Duration::from_secs(1), "shown", |c| {
            !c.is_null()
        })
        .await;
        let (c, _) = wait_card(&client, &short, Duration::from_secs(4), "expired", |c| {
            c["state"] == "expired"
        })
        .await;
        let expired_after = armed.elapsed();
        assert!(
            expired_after >= Duration::from_millis(900),
            "{expired_after:?}"
        );
        assert_eq!(c["buttons"], json!([]), "{c}");
        assert!(c["outcome"].as_str().unwrap().starts_with("Expired"), "{c}");
        wait_card(
            &client,
            &short,
            LINGER + Duration::from_secs(2),
            "removed",
            |c| c.is_null(),
        )
        .await;
        println!("expiring card: shown after {shown:?}, expired on screen after {expired_after:?}");

        let resolved = resolution(&server, &run, &short).await.expect("resolved");
        assert_eq!(resolved["expired"], true, "{resolved}");
        assert_eq!(resolved["approved"], false, "{resolved}");
        assert!(pending(&card(&client, &keep).await), "the other card stays");
        client.close().await.unwrap();
    })
    .await;
}

/// (d) A reload reattaches: the token survives in sessionStorage (not in the address),
/// the pending card is shown again and still decides.
#[tokio::test]
async fn a_reload_reattaches() {
    bounded(async {
        let server = server(&["web_fetch"]).await;
        let driver = Driver::start().await;
        let client = driver.browser().await;
        let (run, token) = server.create_run(json!({"owner": "alice"})).await;
        let id = arm(&server, &run, &token, json!({})).await;
        open_console(&client, &server, &server.operator_token).await;
        wait_card(&client, &id, Duration::from_secs(3), "shown", pending).await;

        client.refresh().await.unwrap();
        let started = Instant::now();
        let (c, _) = wait_card(&client, &id, Duration::from_secs(3), "shown again", pending).await;
        println!("after a reload the card is back in {:?}", started.elapsed());
        assert_eq!(c["buttons"], json!(["Approve", "Deny"]), "{c}");
        let signed_in = client
            .execute(
                "return [getComputedStyle(document.getElementById('token-form')).display, \
                 document.getElementById('me').textContent]",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(signed_in, json!(["none", "test-operator"]));
        assert_eq!(
            client.current_url().await.unwrap().as_str(),
            server.url("/console")
        );

        click(&client, &id, "deny").await;
        let (c, _) = wait_card(&client, &id, Duration::from_secs(2), "denied", |c| {
            c["state"] == "denied"
        })
        .await;
        assert_eq!(c["outcome"], "Denied by test-operator", "{c}");
        let resolved = resolution(&server, &run, &id).await.expect("resolved");
        assert_eq!(resolved["approved"], false, "{resolved}");
        assert_eq!(resolved["decidedBy"], "test-operator", "{resolved}");
        client.close().await.unwrap();
    })
    .await;
}

/// (e) Two sessions on one card: one operator approves, the other's card shows who did
/// and disappears.
#[tokio::test]
async fn two_sessions_one_card() {
    bounded(async {
        let server = server(&["web_fetch"]).await;
        let driver = Driver::start().await;
        let alice = driver.browser().await;
        let bob = driver.browser().await;
        let (run, token) = server.create_run(json!({"owner": "alice"})).await;
        let id = arm(&server, &run, &token, json!({})).await;
        open_console(&alice, &server, &operator(&server, "alice")).await;
        open_console(&bob, &server, &operator(&server, "bob")).await;
        wait_card(&alice, &id, Duration::from_secs(3), "shown", pending).await;
        wait_card(&bob, &id, Duration::from_secs(4), "live", |c| {
            pending(c) && c["live"] == true
        })
        .await;

        let clicked = Instant::now();
        click(&alice, &id, "approve").await;
        let (c, _) = wait_card(&bob, &id, Duration::from_secs(1), "resolved", |c| {
            c["state"] == "approved"
        })
        .await;
        println!(
            "the other session saw the decision after {:?}",
            clicked.elapsed()
        );
        assert_eq!(c["outcome"], "Approved by alice (scope once)", "{c}");
        assert_eq!(c["buttons"], json!([]), "{c}");
        wait_card(&bob, &id, LINGER + Duration::from_secs(2), "removed", |c| {
            c.is_null()
        })
        .await;
        wait_card(&alice, &id, Duration::from_secs(2), "removed", |c| {
            c.is_null()
        })
        .await;
        let resolved = resolution(&server, &run, &id).await.expect("resolved");
        assert_eq!(resolved["decidedBy"], "alice", "{resolved}");
        alice.close().await.unwrap();
        bob.close().await.unwrap();
    })
    .await;
}

/// Seed 003's other answers: `503 agenthost_unreachable` offers a retry (the card stays
/// pending, the retry decides it); `404 unknown` hides the card. (The page's `fetch` is
/// wrapped for one decision each: the embedded store never answers those.)
#[tokio::test]
async fn unreachable_offers_a_retry_and_unknown_hides_the_card() {
    bounded(async {
        let server = server(&["web_fetch"]).await;
        let driver = Driver::start().await;
        let client = driver.browser().await;
        let (run, token) = server.create_run(json!({"owner": "alice"})).await;
        let retried = arm(&server, &run, &token, json!({})).await;
        let unknown = arm(&server, &run, &token, json!({})).await;
        open_console(&client, &server, &operator(&server, "alice")).await;
        wait_card(&client, &retried, Duration::from_secs(3), "shown", pending).await;
        wait_card(&client, &unknown, Duration::from_secs(3), "shown", pending).await;

        // The next decision answers as the seed's pod forwarding would.
        let fake = r#"
            const [status, body] = arguments;
            const real = window.fetch;
            window.fetch = (input, init) => {
              if (init && init.method === 'POST') {
                window.fetch = real;
                return Promise.resolve(new Response(JSON.stringify(body),
                  {status, headers: {'content-type': 'application/json'}}));
              }
              return real(input, init);
            };
            return true;
        "#;
        client
            .execute(
                fake,
                vec![
                    json!(503),
                    json!({"error": "agent host unreachable", "state": "agenthost_unreachable"}),
                ],
            )
            .await
            .unwrap();
        click(&client, &retried, "approve").await;
        let (c, _) = wait_card(&client, &retried, Duration::from_secs(2), "retry", |c| {
            c["buttons"]
                .as_array()
                .is_some_and(|b| b.iter().any(|b| b == "Retry approve"))
        })
        .await;
        assert!(pending(&c), "{c}");
        assert!(
            c["outcome"].as_str().unwrap().contains("unreachable"),
            "{c}"
        );
        click(&client, &retried, "retry").await;
        let (c, _) = wait_card(&client, &retried, Duration::from_secs(2), "approved", |c| {
            c["state"] == "approved"
        })
        .await;
        assert_eq!(c["outcome"], "Approved by alice (scope once)", "{c}");

        client
            .execute(
                fake,
                vec![
                    json!(404),
                    json!({"error": "no such approval request", "state": "unknown"}),
                ],
            )
            .await
            .unwrap();
        click(&client, &unknown, "deny").await;
        wait_card(&client, &unknown, Duration::from_secs(1), "hidden", |c| {
            c.is_null()
        })
        .await;
        // Hidden for good: the next polls (it is still pending on the server) do not
        // bring it back.
        tokio::time::sleep(POLL + Duration::from_millis(500)).await;
        assert!(card(&client, &unknown).await.is_null());
        let (_, listed) = server
            .get(
                &format!("/api/runs/{run}/approvals?state=pending"),
                &server.operator_token,
            )
            .await;
        assert_eq!(listed["approvals"][0]["request_id"], unknown.as_str());
        client.close().await.unwrap();
    })
    .await;
}

// ---- Hostile text and broken answers --------------------------------------------------------

/// Markup an agent might put in its text: shown as text, it runs nothing.
const IMG: &str = "<img src=x onerror=window.__pwned=1>";

/// What the page shows of a card's agent-written text.
const SHOWN_JS: &str = r#"
const card = [...document.querySelectorAll('li.card')].find(n => n.dataset.requestId === arguments[0]);
if (!card) return null;
const text = (sel) => { const n = card.querySelector(sel); return n ? n.textContent : null; };
return {
  tool: text('h3 .tool'),
  host: text('dd.host'),
  hostName: text('dd.host .url-host'),
  url: text('code.url'),
  whole: text('details.full-url code'),
  intention: text('dd.intention'),
  message: text('.message'),
  outcome: text('.outcome'),
  markers: [...card.querySelectorAll('.hidden-char')].map(n => n.textContent),
  hostRow: card.querySelector('dl dt') && card.querySelector('dl dt').textContent,
};
"#;

/// The page as a whole: nothing ran, no element came from agent text, and no hidden
/// character is shown raw anywhere.
const CLEAN_JS: &str = r#"
const hidden = /[\u200B-\u200F\u202A-\u202E\u2060\u2066-\u2069\uFEFF]/u;
return {
  pwned: window.__pwned === undefined ? null : String(window.__pwned),
  imgs: document.querySelectorAll('img').length,
  raw_hidden: hidden.test(document.body.textContent),
  announced: document.getElementById('announcer').textContent,
};
"#;

/// Security review (1): an agent's tool name, URL, intention and message (and an
/// operator name) holding markup and bidi / zero-width characters are shown as text, each
/// hidden character as a visible `<U+…>` marker — on the card, in its outcome, in the
/// announcements and in the audit view — nothing runs, and the URL's parsed host is shown
/// apart: a URL that only starts like `docs.example.com` shows the host it reaches, a
/// shortened long URL keeps its host, and a URL that does not parse says so. The decision
/// still sends the tool name as the agent wrote it (the server refuses another).
#[tokio::test]
async fn agent_text_is_shown_as_text_with_hidden_characters_marked() {
    bounded(async {
        let server = server(&["web_fetch"]).await;
        let driver = Driver::start().await;
        let client = driver.browser().await;
        let (run, token) = server.create_run(json!({"owner": "alice"})).await;
        let padding = "a".repeat(200);
        let long_url = format!("https://docs.example.com{padding}\u{202E}{IMG}@evil.example/guide");
        let tool = format!("web_fetch{IMG}\u{202E}exe");
        let spoof = arm(
            &server,
            &run,
            &token,
            json!({
                "tool_name": tool,
                "url": long_url,
                "intention": format!("Read the guide \u{202E}{IMG} then \u{200B}stop"),
                "message": format!("{IMG}\u{2066}msg\u{FEFF}"),
            }),
        )
        .await;
        let short_url = format!("https://evil.example/\u{202E}moc.elpmaxe.scod{IMG}");
        let short = arm(&server, &run, &token, json!({ "url": short_url })).await;
        let broken_url = format!("docs.example.com/{IMG}");
        let broken = arm(&server, &run, &token, json!({ "url": broken_url })).await;
        let sub = format!("alice\u{202E}{IMG}");
        open_console(&client, &server, &operator(&server, &sub)).await;
        for id in [&spoof, &short, &broken] {
            wait_card(&client, id, Duration::from_secs(3), "shown", pending).await;
        }
        let marked = |s: &str| s.replace('\u{202E}', "<U+202E>");
        let shown = |id: &str| {
            let client = client.clone();
            let id = id.to_owned();
            async move { client.execute(SHOWN_JS, vec![json!(id)]).await.unwrap() }
        };

        let c = shown(&spoof).await;
        assert_eq!(c["tool"], marked(&tool), "{c}");
        assert_eq!(
            c["intention"],
            format!("Read the guide <U+202E>{IMG} then <U+200B>stop"),
            "{c}"
        );
        assert_eq!(c["message"], format!("{IMG}<U+2066>msg<U+FEFF>"), "{c}");
        // The host the URL reaches, first on the card, with a word on the user info.
        assert_eq!(c["hostRow"], "Host", "{c}");
        assert_eq!(c["hostName"], "evil.example", "{c}");
        assert!(c["host"].as_str().unwrap().contains("user info"), "{c}");
        // Shortened, yet with its host; the whole URL (marked) one click away.
        let url = c["url"].as_str().unwrap();
        assert!(url.starts_with("https://docs.example.com"), "{c}");
        assert!(url.contains("@evil.example/guide"), "{c}");
        assert!(url.contains('…') && url.chars().count() < 160, "{c}");
        assert_eq!(c["whole"], marked(&long_url), "{c}");
        assert!(c["markers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m == "<U+202E>"));

        let c = shown(&short).await;
        assert_eq!(c["hostName"], "evil.example", "{c}");
        assert_eq!(c["url"], marked(&short_url), "{c}");
        assert_eq!(c["whole"], Value::Null, "not shortened: {c}");

        let c = shown(&broken).await;
        assert_eq!(c["hostName"], Value::Null, "{c}");
        assert!(
            c["host"].as_str().unwrap().contains("does not parse"),
            "{c}"
        );
        assert_eq!(c["url"], broken_url, "{c}");

        let me = client
            .execute("return document.getElementById('me').textContent", vec![])
            .await
            .unwrap();
        assert_eq!(me, marked(&sub));

        // Deny the spoofing card: the decision names the tool exactly as armed (else the
        // server would refuse it), the outcome names the operator marked.
        click(&client, &spoof, "deny").await;
        wait_card(&client, &spoof, Duration::from_secs(2), "denied", |c| {
            c["state"] == "denied"
        })
        .await;
        let c = shown(&spoof).await;
        assert_eq!(c["outcome"], format!("Denied by {}", marked(&sub)), "{c}");
        let resolved = resolution(&server, &run, &spoof).await.expect("resolved");
        assert_eq!(resolved["approved"], false, "{resolved}");
        assert_eq!(resolved["decidedBy"], sub.as_str(), "{resolved}");

        // The audit view shows the same text marked.
        let input = client.find(Locator::Id("audit-run")).await.unwrap();
        input.send_keys(&run).await.unwrap();
        client
            .find(Locator::Css("#audit-form button[type=submit]"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        wait_js(
            &client,
            "return [...document.querySelectorAll('#audit-events tr')]\
             .some(r => r.cells[1].textContent === 'tool.approval_resolved')",
            Duration::from_secs(3),
            "the decision in the audit view",
        )
        .await;
        let details = client
            .execute(
                "return [...document.querySelectorAll('#audit-events tr')]\
                 .map(r => r.cells[3].textContent).join('\\n')",
                vec![],
            )
            .await
            .unwrap();
        let details = details.as_str().unwrap();
        assert!(
            details.contains(&format!("web_fetch{IMG}<U+202E>exe")),
            "{details}"
        );
        assert!(
            details.contains(&format!("alice<U+202E>{IMG}")),
            "{details}"
        );

        let page = client.execute(CLEAN_JS, vec![]).await.unwrap();
        assert_eq!(page["pwned"], Value::Null, "{page}");
        assert_eq!(page["imgs"], 0, "{page}");
        assert_eq!(page["raw_hidden"], false, "{page}");
        let announced = page["announced"].as_str().unwrap();
        assert!(announced.contains("<U+202E>"), "{page}");
        client.close().await.unwrap();
    })
    .await;
}

/// Wraps the page's `fetch`: while `window.__fake` is set, the run streams it asks for
/// (`Accept: text/event-stream`) get a made-up answer — `html`: a proxy's `200` HTML
/// page; `huge`: an event stream whose first line never ends (256 KiB a read, up to
/// 8 MiB, then it stalls) — and JSON `GET`s get the HTML page when it is `html-json`.
/// Each faked stream's time is in `window.__streams`, its cancellations in
/// `window.__cancelled`.
const FAKE_FETCH_JS: &str = r#"
window.__streams = [];
window.__cancelled = 0;
window.__fake = arguments[0];
const real = window.fetch;
const html = () => new Response('<!doctype html><title>Sign in</title><p>Proxy</p>',
  {status: 200, headers: {'content-type': 'text/html; charset=utf-8'}});
window.fetch = (input, init) => {
  const accept = init && init.headers && init.headers.Accept;
  const get = !init || !init.method || init.method === 'GET';
  if (window.__fake === 'html-json' && accept === 'application/json' && get) {
    return Promise.resolve(html());
  }
  if (window.__fake && window.__fake !== 'html-json' && accept === 'text/event-stream') {
    window.__streams.push(performance.now());
    if (window.__fake === 'html') return Promise.resolve(html());
    const enc = new TextEncoder();
    const chunk = enc.encode('x'.repeat(256 * 1024));
    let sent = 0;
    const body = new ReadableStream({
      start(c) { c.enqueue(enc.encode('data: ')); },
      pull(c) {
        if (sent++ < 32) c.enqueue(chunk);
        else return new Promise(() => {});
      },
      cancel() { window.__cancelled++; },
    });
    return Promise.resolve(new Response(body,
      {status: 200, headers: {'content-type': 'text/event-stream'}}));
  }
  return real(input, init);
};
return true;
"#;

/// The times (ms) of the faked stream requests so far.
async fn faked_streams(client: &Client) -> Vec<f64> {
    let v = client
        .execute("return window.__streams", vec![])
        .await
        .unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_f64().unwrap())
        .collect()
}

/// Waits for three faked stream requests; asserts they came after a growing backoff
/// (1 s, then 2 s), not once a second.
async fn assert_backs_off(client: &Client, what: &str) {
    let started = Instant::now();
    let times = loop {
        let times = faked_streams(client).await;
        if times.len() >= 3 {
            break times;
        }
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "{what}: three stream requests expected, got {times:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    println!("{what}: stream requests {gaps:?} ms apart");
    assert!(gaps[0] >= 900.0, "{what}: {gaps:?}");
    assert!(gaps[1] >= 1800.0, "{what}: the backoff grows: {gaps:?}");
}

/// Security review (2): a `200` answer to the stream request that is not
/// `text/event-stream` (a proxy's HTML page) is a failure: the console retries after a
/// growing backoff instead of once a second, the card is not shown live meanwhile, and
/// once the real stream answers again the card is live.
#[tokio::test]
async fn a_stream_answer_that_is_not_an_event_stream_backs_off() {
    bounded(async {
        let server = server(&["web_fetch"]).await;
        let driver = Driver::start().await;
        let client = driver.browser().await;
        let (run, token) = server.create_run(json!({"owner": "alice"})).await;
        let id = arm(&server, &run, &token, json!({})).await;
        load_console(&client, &server).await;
        client
            .execute(FAKE_FETCH_JS, vec![json!("html")])
            .await
            .unwrap();
        sign_in(&client, &server, &operator(&server, "alice")).await;
        wait_card(&client, &id, Duration::from_secs(3), "shown", pending).await;
        assert_backs_off(&client, "HTML answers").await;
        let c = card(&client, &id).await;
        assert!(pending(&c) && c["live"] == false, "{c}");

        client
            .execute("window.__fake = null; return true", vec![])
            .await
            .unwrap();
        wait_card(&client, &id, Duration::from_secs(6), "live", |c| {
            c["live"] == true
        })
        .await;
        client.close().await.unwrap();
    })
    .await;
}

/// Security review (3): an event stream whose line never ends is dropped once the line
/// passes 1 MiB (the response is cancelled, not buffered without end) and resumed after
/// a growing backoff.
#[tokio::test]
async fn an_oversized_stream_line_is_a_broken_stream() {
    bounded(async {
        let server = server(&["web_fetch"]).await;
        let driver = Driver::start().await;
        let client = driver.browser().await;
        let (run, token) = server.create_run(json!({"owner": "alice"})).await;
        let id = arm(&server, &run, &token, json!({})).await;
        load_console(&client, &server).await;
        client
            .execute(FAKE_FETCH_JS, vec![json!("huge")])
            .await
            .unwrap();
        sign_in(&client, &server, &operator(&server, "alice")).await;
        wait_card(&client, &id, Duration::from_secs(3), "shown", pending).await;
        assert_backs_off(&client, "endless lines").await;
        let cancelled = client
            .execute("return window.__cancelled", vec![])
            .await
            .unwrap();
        assert!(cancelled.as_u64().unwrap() >= 2, "cancelled {cancelled}");
        assert!(pending(&card(&client, &id).await));
        client.close().await.unwrap();
    })
    .await;
}

/// Wraps the page's `fetch`: the first run stream it asks for with a `Last-Event-ID`
/// gets the server's answer to a resume past the run's last event (`400`, what a run id
/// created anew after its old events expired answers); every request of a run's events
/// is logged in `window.__log` (`stream:<Last-Event-ID or none>` or `replay:<after>`).
const RESUME_PAST_THE_END_JS: &str = r#"
window.__log = [];
let faked = false;
const real = window.fetch;
window.fetch = (input, init) => {
  const url = new URL(String(input), location.href);
  const accept = init && init.headers && init.headers.Accept;
  if (/\/api\/runs\/[^/]+\/events$/.test(url.pathname)) {
    if (accept === 'text/event-stream') {
      const last = init.headers['Last-Event-ID'];
      window.__log.push('stream:' + (last || 'none'));
      if (last && !faked) {
        faked = true;
        return Promise.resolve(new Response(
          JSON.stringify({error: 'Last-Event-ID/after ' + last + " is past the run's last event (1)"}),
          {status: 400, headers: {'content-type': 'application/json'}}));
      }
    } else {
      window.__log.push('replay:' + url.searchParams.get('after'));
    }
  }
  return real(input, init);
};
return true;
"#;

/// A resume answered `400` (the run id names a run created anew: the console's last
/// sequence is past its end) starts the run over from sequence 0 — a replay from the
/// start, then a stream — instead of resuming the dead cursor for ever; the card stays
/// and goes live again.
#[tokio::test]
async fn a_resume_past_the_end_starts_the_run_over() {
    bounded(async {
        let server = server(&["web_fetch"]).await;
        let driver = Driver::start().await;
        let client = driver.browser().await;
        let (run, token) = server.create_run(json!({"owner": "alice"})).await;
        let id = arm(&server, &run, &token, json!({})).await;
        load_console(&client, &server).await;
        client
            .execute(RESUME_PAST_THE_END_JS, vec![])
            .await
            .unwrap();
        sign_in(&client, &server, &operator(&server, "alice")).await;
        wait_card(&client, &id, Duration::from_secs(3), "shown", pending).await;
        let started = Instant::now();
        let log = loop {
            let v = client.execute("return window.__log", vec![]).await.unwrap();
            let log: Vec<String> = serde_json::from_value(v).unwrap();
            let refused = log
                .iter()
                .position(|e| e.starts_with("stream:") && e != "stream:none");
            if let Some(i) = refused {
                // After the refused resume: a replay from 0, then a stream resuming from
                // what that replay read.
                let rest = &log[i + 1..];
                let replay = rest.iter().position(|e| e == "replay:0");
                if let Some(j) = replay {
                    if rest[j + 1..].iter().any(|e| e.starts_with("stream:")) {
                        assert!(
                            !rest[..j].iter().any(|e| e.starts_with("stream:")),
                            "no resume of the old cursor before starting over: {log:?}"
                        );
                        break log;
                    }
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the run was not started over: {log:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        println!("requests of the run's events: {log:?}");
        wait_card(&client, &id, Duration::from_secs(6), "live again", |c| {
            pending(c) && c["live"] == true
        })
        .await;
        // And it follows the run live from there: a new card shows without a reload.
        let second = arm(&server, &run, &token, json!({})).await;
        wait_card(
            &client,
            &second,
            Duration::from_secs(3),
            "shown live",
            pending,
        )
        .await;
        client.close().await.unwrap();
    })
    .await;
}

/// A `200` HTML page where the console expects JSON (the open-cards listing, a run's
/// events) is no answer: the open card stays (it is not taken for ended), the header
/// says Tollgate is not answering, and the next real answer clears it.
#[tokio::test]
async fn a_listing_that_is_not_json_keeps_the_cards() {
    bounded(async {
        let server = server(&["web_fetch"]).await;
        let driver = Driver::start().await;
        let client = driver.browser().await;
        let (run, token) = server.create_run(json!({"owner": "alice"})).await;
        let id = arm(&server, &run, &token, json!({})).await;
        open_console(&client, &server, &operator(&server, "alice")).await;
        wait_card(&client, &id, Duration::from_secs(3), "shown", pending).await;

        client
            .execute(FAKE_FETCH_JS, vec![json!("html-json")])
            .await
            .unwrap();
        wait_js(
            &client,
            "return document.getElementById('connection').dataset.level === 'warn'",
            POLL * 2,
            "a warning in the header",
        )
        .await;
        tokio::time::sleep(POLL * 2).await;
        assert!(pending(&card(&client, &id).await), "the card stays");

        client
            .execute("window.__fake = null; return true", vec![])
            .await
            .unwrap();
        wait_js(
            &client,
            "return document.getElementById('connection').dataset.level === undefined",
            POLL * 2,
            "the warning cleared",
        )
        .await;
        assert!(pending(&card(&client, &id).await));
        client.close().await.unwrap();
    })
    .await;
}

// ---- Sign-in with the identity provider ---------------------------------------------------

/// The app configured for operators of the test IdP, with the console's sign-in; the
/// IdP's token endpoint answers the console's origin (CORS).
async fn oidc_server(idp: &Idp) -> TestServer {
    let mut config = idp.config(OidcProjects::All);
    config.console = Some(ConsoleClient::new(AUDIENCE, &idp.issuer));
    let mut deps = TestServer::deps(Arc::new(MemoryStore::new()), GateConfig::default());
    deps.auth = Arc::new(
        tollgate_api::Auth::new(tollgate_tests::TEST_SECRET.as_bytes())
            .with_oidc(Oidc::new(config)),
    );
    let server = TestServer::with_deps(deps).await;
    idp.allow_console(&server.url(""));
    server
}

/// Clicks "Sign in with …" once it is offered.
async fn click_oidc_sign_in(client: &Client, provider: &str) {
    wait_js(
        client,
        "return !document.getElementById('oidc-sign-in').hidden",
        Duration::from_secs(5),
        "the provider's sign-in offered",
    )
    .await;
    let button = client.find(Locator::Id("oidc-sign-in")).await.unwrap();
    assert_eq!(
        button.text().await.unwrap(),
        format!("Sign in with {provider}")
    );
    button.click().await.unwrap();
}

/// GIVEN the console configured for the identity provider WHEN the operator clicks
/// "Sign in with …" THEN the authorization code flow with PKCE brings them back signed
/// in as `oidc:<subject>` (the address without `code`/`state`, the ID token in
/// sessionStorage only), and a card they approve is decided by `oidc:<subject>` as the
/// API records it; signing out forgets the token.
#[tokio::test]
async fn signs_in_with_the_identity_provider_and_decides_as_its_subject() {
    bounded(async {
        let idp = Idp::start_login(SigningKey::ec("login"), "grace", json!([OPERATORS])).await;
        let server = oidc_server(&idp).await;
        let driver = Driver::start().await;
        let client = driver.browser().await;
        let (run, run_token) = server.create_run(json!({})).await;
        let request_id = arm(&server, &run, &run_token, json!({})).await;
        load_console(&client, &server).await;
        click_oidc_sign_in(&client, "127.0.0.1").await;
        wait_js(
            &client,
            "return !document.getElementById('session').hidden",
            Duration::from_secs(10),
            "signed in through the provider",
        )
        .await;
        assert_eq!(idp.issued(), 1);
        // Back on the console's own address: no code, no state.
        let url = client.current_url().await.unwrap();
        assert_eq!(url.as_str(), server.url("/console"));
        let me = client.find(Locator::Id("me")).await.unwrap();
        assert_eq!(me.text().await.unwrap(), "oidc:grace");
        let stored = client
            .execute(
                "return [sessionStorage.getItem('tollgate.operatorToken'), localStorage.length, \
                 sessionStorage.getItem('tollgate.oidcPending')]",
                vec![],
            )
            .await
            .unwrap();
        let token = stored[0].as_str().expect("the ID token in sessionStorage");
        assert_eq!((&stored[1], &stored[2]), (&json!(0), &Value::Null));
        let (status, v) = server.get("/api/console/config", token).await;
        assert_eq!(
            (status, v["sub"].as_str()),
            (StatusCode::OK, Some("oidc:grace"))
        );

        wait_card(
            &client,
            &request_id,
            Duration::from_secs(3),
            "shown",
            pending,
        )
        .await;
        click(&client, &request_id, "approve").await;
        wait_card(
            &client,
            &request_id,
            Duration::from_secs(3),
            "approved",
            |c| c["state"] == "approved",
        )
        .await;
        let resolved = resolution(&server, &run, &request_id)
            .await
            .expect("the decision is recorded");
        assert_eq!(resolved["decidedBy"], "oidc:grace", "{resolved}");
        assert_eq!(resolved["approved"], true, "{resolved}");

        client
            .find(Locator::Id("sign-out"))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        let gone = client
            .execute(
                "return sessionStorage.getItem('tollgate.operatorToken')",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(gone, Value::Null);
        // Back to the sign-in: the provider's button offered again.
        let button = client.find(Locator::Id("oidc-sign-in")).await.unwrap();
        assert!(button.is_displayed().await.unwrap());
    })
    .await;
}

/// GIVEN the provider's answer carries another `state` than the sign-in sent WHEN the
/// browser comes back THEN the console exchanges no code, is not signed in and says why;
/// the pasted token still works.
#[tokio::test]
async fn a_tampered_state_signs_nobody_in() {
    bounded(async {
        let idp = Idp::start_login(SigningKey::ec("login"), "mallory", json!([OPERATORS])).await;
        let server = oidc_server(&idp).await;
        idp.tamper_state();
        let driver = Driver::start().await;
        let client = driver.browser().await;
        load_console(&client, &server).await;
        click_oidc_sign_in(&client, "127.0.0.1").await;
        wait_js(
            &client,
            "return document.getElementById('token-error').textContent.includes('state')",
            Duration::from_secs(10),
            "the state refused",
        )
        .await;
        let error = client.find(Locator::Id("token-error")).await.unwrap();
        assert_eq!(
            error.text().await.unwrap(),
            "Sign-in with the identity provider failed: the answer's state is not this tab's \
             sign-in. Not signed in."
        );
        let signed_in = client
            .execute(
                "return [document.getElementById('session').hidden, \
                 sessionStorage.getItem('tollgate.operatorToken'), location.search]",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(signed_in, json!([true, null, ""]));
        assert_eq!(idp.issued(), 0, "no code was exchanged");
        // The pasted token stays available.
        sign_in(&client, &server, &operator(&server, "local-op")).await;
        let me = client.find(Locator::Id("me")).await.unwrap();
        assert_eq!(me.text().await.unwrap(), "local-op");
    })
    .await;
}

/// GIVEN an ID token valid for a few seconds WHEN it expires THEN the console signs out by
/// itself, forgets the token and offers the sign-in again, saying why.
#[tokio::test]
async fn an_expired_sign_in_goes_back_to_the_sign_in() {
    bounded(async {
        let idp = Idp::start_login(SigningKey::ec("login"), "heidi", json!([OPERATORS])).await;
        idp.token_lifetime(3);
        let server = oidc_server(&idp).await;
        let driver = Driver::start().await;
        let client = driver.browser().await;
        load_console(&client, &server).await;
        click_oidc_sign_in(&client, "127.0.0.1").await;
        wait_js(
            &client,
            "return !document.getElementById('session').hidden",
            Duration::from_secs(10),
            "signed in through the provider",
        )
        .await;
        wait_js(
            &client,
            "return document.getElementById('session').hidden && \
             !document.getElementById('oidc-sign-in').hidden && \
             sessionStorage.getItem('tollgate.operatorToken') === null",
            Duration::from_secs(15),
            "signed out at the token's expiry",
        )
        .await;
        let error = client.find(Locator::Id("token-error")).await.unwrap();
        assert_eq!(
            error.text().await.unwrap(),
            "Your sign-in has expired. Sign in again."
        );
    })
    .await;
}

// ---- The runs, policies and reconcile screens ---------------------------------------------

/// An agent token of `project`.
fn agent_of(server: &TestServer, sub: &str, project: &str) -> String {
    server
        .auth
        .mint_jwt(sub, Role::Agent, 3600, Some(project.to_owned()))
}

/// An operator token of `project`.
fn operator_of(server: &TestServer, sub: &str, project: &str) -> String {
    server
        .auth
        .mint_jwt(sub, Role::Operator, 3600, Some(project.to_owned()))
}

/// Creates a run with `token` (an agent JWT); its id and run token.
async fn create_run_as(server: &TestServer, token: &str, body: Value) -> (String, String) {
    let (status, v) = server.post("/api/runs", token, &body).await;
    assert_eq!(status, StatusCode::CREATED, "create run: {v}");
    (
        v["run_id"].as_str().unwrap().to_owned(),
        v["run_token"].as_str().unwrap().to_owned(),
    )
}

/// Clicks the element `css` names.
async fn click_css(client: &Client, css: &str) {
    client
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap();
}

/// Shows screen `name` with the tab bar.
async fn show_screen(client: &Client, name: &str) {
    click_css(client, &format!("#screens button[data-screen=\"{name}\"]")).await;
    wait_js(
        client,
        &format!(
            "return !document.querySelector('section[data-screen=\"{name}\"]').hidden && \
             document.querySelector('#screens button[data-screen=\"{name}\"]').getAttribute('aria-current') === 'page'"
        ),
        Duration::from_secs(2),
        "the screen shown",
    )
    .await;
}

/// The runs table's run ids, in order.
async fn listed_runs(client: &Client) -> Vec<String> {
    let v = client
        .execute(
            "return [...document.querySelectorAll('#runs-rows tr')].map(r => r.dataset.runId)",
            vec![],
        )
        .await
        .unwrap();
    serde_json::from_value(v).unwrap()
}

/// Waits until the runs screen has answered the request it made last (its message is no
/// longer "Loading…") and returns the run ids it lists.
async fn runs_after_load(client: &Client) -> Vec<String> {
    wait_js(
        client,
        "const m = document.getElementById('runs-message').textContent; \
         return m !== '' && !m.startsWith('Loading')",
        Duration::from_secs(3),
        "the runs loaded",
    )
    .await;
    listed_runs(client).await
}

/// Replaces the text of input `id` with `text`.
async fn type_into(client: &Client, id: &str, text: &str) {
    let input = client.find(Locator::Id(id)).await.unwrap();
    input.clear().await.unwrap();
    if !text.is_empty() {
        input.send_keys(text).await.unwrap();
    }
}

/// Submits the runs screen's search; waits until it lists `rows` runs and has answered.
async fn search_runs(client: &Client, rows: usize, what: &str) -> Vec<String> {
    click_css(client, "#runs-form button[type=submit]").await;
    wait_js(
        client,
        &format!("return document.querySelectorAll('#runs-rows tr').length === {rows}"),
        Duration::from_secs(3),
        what,
    )
    .await;
    runs_after_load(client).await
}

/// Every run the API lists for `token` with `query`, following the cursor.
async fn api_runs(server: &TestServer, token: &str, query: &str) -> Vec<String> {
    let mut all = Vec::new();
    let mut after = String::new();
    loop {
        let (status, v) = server
            .get(&format!("/api/runs?limit=200{query}{after}"), token)
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        for r in v["runs"].as_array().unwrap() {
            all.push(r["run_id"].as_str().unwrap().to_owned());
        }
        match v["next_cursor"].as_str() {
            Some(c) if v["has_more"] == true => after = format!("&after={c}"),
            _ => return all,
        }
    }
}

/// The runs screen lists exactly the runs the API created in the operator's project,
/// newest first and never another project's; "More runs" pages through them with the
/// API's cursor; the status, owner and run-id filters narrow the list to what the API
/// answers for them; clicking a run shows its replayed events; text from agents (an
/// owner with markup) is shown as text; an API refusal is shown as text.
#[tokio::test]
async fn the_runs_screen_lists_filters_and_pages_one_projects_runs() {
    bounded(async {
        let server = server(&[]).await;
        let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_owned();
        let acme = agent_of(&server, "agent-acme", "acme");
        let other = agent_of(&server, "agent-other", "other");
        let mut created = Vec::new();
        let mut tokens = Vec::new();
        for i in 0..52 {
            let owner = if i % 4 == 0 { "alice" } else { "bob" };
            let (run_id, token) = create_run_as(
                &server,
                &acme,
                json!({"run_id": format!("run-{tag}-{i:02}"), "owner": owner,
                       "project_id": "acme", "channel_id": "C-ops"}),
            )
            .await;
            created.push(run_id);
            tokens.push(token);
        }
        let marked_up = "<img src=x id=injected>";
        let (odd_run, _) = create_run_as(
            &server,
            &acme,
            json!({"run_id": format!("odd-{tag}"), "owner": marked_up, "project_id": "acme"}),
        )
        .await;
        created.push(odd_run.clone());
        let done_run = created[7].clone();
        let (status, v) = server
            .post(
                &format!("/api/runs/{done_run}/complete"),
                &tokens[7],
                &json!({}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{v}");
        let mut theirs = Vec::new();
        for i in 0..3 {
            let (run_id, _) = create_run_as(
                &server,
                &other,
                json!({"run_id": format!("run-{tag}-other-{i}"), "owner": "alice",
                       "project_id": "other"}),
            )
            .await;
            theirs.push(run_id);
        }
        let ops = operator_of(&server, "olivia", "acme");
        let api_all = api_runs(&server, &ops, "").await;
        let mut expected_set = created.clone();
        expected_set.sort();
        let mut api_set = api_all.clone();
        api_set.sort();
        assert_eq!(api_set, expected_set, "the API lists the project's runs only");

        let driver = Driver::start().await;
        let client = driver.browser().await;
        open_console(&client, &server, &ops).await;
        show_screen(&client, "runs").await;
        let first = runs_after_load(&client).await;
        assert_eq!(first, api_all[..50], "the first page, newest first");
        let more_shown = client
            .execute("return !document.getElementById('runs-more').hidden", vec![])
            .await
            .unwrap();
        assert_eq!(more_shown, json!(true));
        click_css(&client, "#runs-more").await;
        wait_js(
            &client,
            "return document.querySelectorAll('#runs-rows tr').length === 53 && \
             document.getElementById('runs-more').hidden",
            Duration::from_secs(3),
            "the second page appended",
        )
        .await;
        let all = listed_runs(&client).await;
        assert_eq!(all, api_all, "both pages, each run once, in the API's order");
        for run in &theirs {
            assert!(!all.contains(run), "another project's run {run} is listed");
        }
        // The owner with markup is text: no element was made of it.
        let odd = client
            .execute(
                "const row = document.querySelector('#runs-rows tr[data-run-id=\"' + arguments[0] + '\"]'); \
                 return [row.cells[2].textContent, document.getElementById('injected') === null]",
                vec![json!(odd_run)],
            )
            .await
            .unwrap();
        assert_eq!(odd, json!([marked_up, true]));

        // Filters narrow to what the API answers for them.
        client
            .find(Locator::Id("runs-status"))
            .await
            .unwrap()
            .select_by_value("completed")
            .await
            .unwrap();
        assert_eq!(
            search_runs(&client, 1, "the status filter applied").await,
            std::slice::from_ref(&done_run)
        );
        assert_eq!(
            api_runs(&server, &ops, "&status=completed").await,
            std::slice::from_ref(&done_run)
        );
        client
            .find(Locator::Id("runs-status"))
            .await
            .unwrap()
            .select_by_value("")
            .await
            .unwrap();
        type_into(&client, "runs-owner", "alice").await;
        let alice = search_runs(&client, 13, "the owner filter applied").await;
        assert_eq!(alice, api_runs(&server, &ops, "&owner=alice").await);
        assert!(alice.iter().all(|r| {
            let i: usize = r.rsplit('-').next().unwrap().parse().unwrap();
            i.is_multiple_of(4)
        }));
        type_into(&client, "runs-owner", "").await;
        let prefix = format!("run-{tag}-1");
        type_into(&client, "runs-q", &prefix).await;
        let searched = search_runs(&client, 10, "the run id search applied").await;
        assert_eq!(
            searched,
            api_runs(&server, &ops, &format!("&q={prefix}")).await
        );
        assert!(searched.iter().all(|r| r.starts_with(&prefix)));

        // A run's detail: its events as replay answers them.
        let css = format!("#runs-rows tr[data-run-id=\"{}\"] button.run-link", searched[0]);
        click_css(&client, &css).await;
        let replayed = server.replay_all(&searched[0], &ops, 1000).await;
        wait_js(
            &client,
            &format!(
                "return document.querySelectorAll('#run-events tr').length === {} && \
                 document.getElementById('run-events-message').textContent.startsWith('{} event')",
                replayed.len(),
                replayed.len()
            ),
            Duration::from_secs(3),
            "the run's events shown",
        )
        .await;
        let types = client
            .execute(
                "return [...document.querySelectorAll('#run-events tr td.type')].map(t => t.textContent)",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(
            types,
            json!(replayed.iter().map(|e| e["type"].clone()).collect::<Vec<_>>())
        );

        // Another project's runs: the API's 403, as text, and the table left as it was.
        type_into(&client, "runs-project", "other").await;
        click_css(&client, "#runs-form button[type=submit]").await;
        wait_js(
            &client,
            "return document.getElementById('runs-message').textContent === \
             'Tollgate answered 403: an operator of a project lists only that project\\'s runs.'",
            Duration::from_secs(3),
            "the refusal shown",
        )
        .await;
        assert_eq!(listed_runs(&client).await, searched);

        // A refusal is shown as text: an operator of another project reading a run.
        show_screen(&client, "reconcile").await;
        type_into(&client, "reconcile-run", &theirs[0]).await;
        click_css(&client, "#reconcile-form button[type=submit]").await;
        wait_js(
            &client,
            &format!(
                "return document.getElementById('reconcile-message').textContent === \
                 'No run {} (or not visible to this token).'",
                theirs[0]
            ),
            Duration::from_secs(3),
            "another project's run refused",
        )
        .await;
    })
    .await;
}

/// The policies screen lists the grants of the operator's project only, and revokes one
/// only after a confirm step: Cancel leaves it standing (the API still lists it live),
/// Confirm revokes it (the API lists it revoked, by the operator) and the row says so;
/// another project's grant is not listed and stays live.
#[tokio::test]
async fn the_policies_screen_revokes_a_grant_after_a_confirm() {
    bounded(async {
        let server = server(&[]).await;
        let mut policy_of = Vec::new();
        for project in ["acme", "other"] {
            let agent = agent_of(&server, &format!("agent-{project}"), project);
            let (run_id, run_token) = create_run_as(
                &server,
                &agent,
                json!({"owner": "alice", "project_id": project}),
            )
            .await;
            let request_id = arm(
                &server,
                &run_id,
                &run_token,
                json!({"tool_name": format!("deploy_{project}")}),
            )
            .await;
            let (status, v) = server
                .post(
                    &format!("/api/runs/{run_id}/tool-approvals"),
                    &operator_of(&server, "alice", project),
                    &json!({"request_id": request_id, "scope": "tool"}),
                )
                .await;
            assert_eq!(
                (status, v["state"].as_str()),
                (StatusCode::OK, Some("approved")),
                "{v}"
            );
            let (_, page) = server
                .get("/api/policies", &operator_of(&server, "alice", project))
                .await;
            let policies = page["policies"].as_array().unwrap();
            assert_eq!(policies.len(), 1, "{page}");
            policy_of.push(policies[0]["policy_id"].as_str().unwrap().to_owned());
        }
        let (mine, theirs) = (policy_of[0].clone(), policy_of[1].clone());
        let ops = operator_of(&server, "olivia", "acme");
        let live = |page: &Value, id: &str| {
            page["policies"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["policy_id"] == id)
                .map(|p| p["revoked_at"].is_null())
        };

        let driver = Driver::start().await;
        let client = driver.browser().await;
        open_console(&client, &server, &ops).await;
        show_screen(&client, "policies").await;
        wait_js(
            &client,
            "return document.querySelectorAll('#policies-rows tr').length === 1",
            Duration::from_secs(3),
            "the project's grant listed",
        )
        .await;
        let row = client
            .execute(
                "const r = document.querySelector('#policies-rows tr'); \
                 return [r.dataset.policyId, [...r.cells].map(c => c.textContent)]",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(row[0], json!(mine), "only the project's grant: {row}");
        let cells = row[1].as_array().unwrap();
        assert_eq!(cells[0], "deploy_acme");
        assert_eq!(cells[1], "tool");
        assert_eq!(cells[3], "alice", "granted by");
        assert_eq!(cells[5], "none — until revoked");
        assert_eq!(cells[6], "Revoke");

        // Cancel: nothing is revoked.
        let row_css = format!("#policies-rows tr[data-policy-id=\"{mine}\"]");
        click_css(&client, &format!("{row_css} button.revoke")).await;
        let asked = client
            .execute(
                "return document.querySelector(arguments[0] + ' td.actions').textContent",
                vec![json!(row_css)],
            )
            .await
            .unwrap();
        assert_eq!(
            asked,
            json!("Revoke deploy_acme (scope tool)? Confirm revokeCancel")
        );
        click_css(&client, &format!("{row_css} button.cancel")).await;
        wait_js(
            &client,
            &format!("return document.querySelector('{row_css} button.revoke') !== null"),
            Duration::from_secs(2),
            "the revoke offered again",
        )
        .await;
        let (_, page) = server.get("/api/policies", &ops).await;
        assert_eq!(live(&page, &mine), Some(true), "cancel revokes nothing");

        // Confirm: revoked, and the API says so.
        click_css(&client, &format!("{row_css} button.revoke")).await;
        click_css(&client, &format!("{row_css} button.confirm")).await;
        wait_js(
            &client,
            &format!(
                "const r = document.querySelector('{row_css}'); \
                 return r.dataset.state === 'revoked' && r.querySelector('td.actions').textContent === 'Revoked'"
            ),
            Duration::from_secs(3),
            "the grant shown revoked",
        )
        .await;
        let (_, page) = server.get("/api/policies", &ops).await;
        assert_eq!(live(&page, &mine), Some(false), "{page}");
        assert_eq!(page["policies"][0]["revoked_by"], "olivia");
        let expiry = client
            .execute(
                "return document.querySelector(arguments[0] + ' td.expiry').textContent",
                vec![json!(row_css)],
            )
            .await
            .unwrap();
        assert!(
            expiry.as_str().unwrap().ends_with(" by olivia"),
            "{expiry}"
        );
        let (_, page) = server
            .get("/api/policies", &operator_of(&server, "x", "other"))
            .await;
        assert_eq!(live(&page, &theirs), Some(true), "the other project's stands");
    })
    .await;
}

/// Reconcile from the runs screen: a run with two calls whose outcome is unknown (each
/// settled `ambiguous`, as an agent does when its transport failed mid-call) shows both
/// records; "Reconcile this run" lists them; "Mark succeeded" and "Mark failed", each
/// after its confirm step, record `applied` and `not_applied`, the rows show the state
/// the API answered, and the API's records agree.
#[tokio::test]
async fn reconcile_settles_unknown_outcomes_through_the_console() {
    bounded(async {
        let server = server(&[]).await;
        let (run_id, run_token) = server
            .create_run(json!({"owner": "alice",
                               "budget": {"tools": {"send_email": 4}, "call_ceiling": 5}}))
            .await;
        let mut calls = Vec::new();
        for n in 0..2 {
            let tool_call_id = format!("call-{n}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
            let approval_id = format!("appr-{n}");
            let request_id = arm(
                &server,
                &run_id,
                &run_token,
                json!({"tool_name": "send_email", "url": null,
                       "tool_call_id": tool_call_id, "approval_id": approval_id}),
            )
            .await;
            let (status, v) = server
                .post(
                    &format!("/api/runs/{run_id}/tool-approvals"),
                    &server.operator_token,
                    &json!({"request_id": request_id, "scope": "once"}),
                )
                .await;
            assert_eq!(status, StatusCode::OK, "{v}");
            for (verb, body) in [
                (
                    "start",
                    json!({"request_id": request_id, "approval_id": approval_id,
                           "tool_name": "send_email"}),
                ),
                ("dispatch", json!({"approval_id": approval_id})),
                (
                    "settle",
                    json!({"approval_id": approval_id, "evidence": "ambiguous",
                           "error": {"kind": "timeout"}}),
                ),
            ] {
                let (status, v) = server
                    .post(
                        &format!("/api/runs/{run_id}/tool-calls/{tool_call_id}/{verb}"),
                        &run_token,
                        &body,
                    )
                    .await;
                assert_eq!(status, StatusCode::OK, "{verb}: {v}");
            }
            calls.push((tool_call_id, approval_id));
        }
        let records = |v: &Value| -> Vec<(String, String)> {
            v["mutations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| {
                    (
                        m["tool_call_id"].as_str().unwrap().to_owned(),
                        m["state"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        };
        let (_, v) = server
            .get(&format!("/api/runs/{run_id}/mutations"), &server.operator_token)
            .await;
        assert!(
            records(&v).iter().all(|(_, s)| s == "outcome_unknown"),
            "{v}"
        );

        let driver = Driver::start().await;
        let client = driver.browser().await;
        open_console(&client, &server, &operator(&server, "olivia")).await;
        show_screen(&client, "runs").await;
        runs_after_load(&client).await;
        click_css(
            &client,
            &format!("#runs-rows tr[data-run-id=\"{run_id}\"] button.run-link"),
        )
        .await;
        wait_js(
            &client,
            "return [...document.querySelectorAll('#run-mutations tr')].filter(r => r.dataset.state === 'outcome_unknown').length === 2",
            Duration::from_secs(3),
            "the run's records shown",
        )
        .await;
        click_css(&client, "#run-detail-reconcile").await;
        wait_js(
            &client,
            "return !document.getElementById('reconcile-screen').hidden && \
             document.querySelectorAll('#reconcile-rows tr').length === 2",
            Duration::from_secs(3),
            "the unknown outcomes listed",
        )
        .await;
        for ((tool_call_id, approval_id), (button, observed_state)) in calls
            .iter()
            .zip([("mark-succeeded", "completed"), ("mark-failed", "not_executed")])
        {
            let row_css = format!(
                "#reconcile-rows tr[data-tool-call-id=\"{tool_call_id}\"][data-approval-id=\"{approval_id}\"]"
            );
            click_css(&client, &format!("{row_css} button.{button}")).await;
            click_css(&client, &format!("{row_css} button.confirm")).await;
            wait_js(
                &client,
                &format!(
                    "const r = document.querySelector('{row_css}'); \
                     return r.dataset.state !== 'outcome_unknown' && \
                     r.querySelector('td.actions').textContent.startsWith('Recorded: now ')"
                ),
                Duration::from_secs(3),
                "the reconcile recorded",
            )
            .await;
            let shown = client
                .execute(
                    "return document.querySelector(arguments[0]).dataset.state",
                    vec![json!(row_css)],
                )
                .await
                .unwrap();
            let (_, v) = server
                .get(&format!("/api/runs/{run_id}/mutations"), &server.operator_token)
                .await;
            let state = records(&v)
                .into_iter()
                .find(|(id, _)| id == tool_call_id)
                .unwrap()
                .1;
            assert_eq!(state, observed_state, "{v}");
            assert_eq!(shown, json!(state), "the row shows the API's state");
        }
        // Asked again, the run has nothing left to reconcile.
        type_into(&client, "reconcile-run", &run_id).await;
        click_css(&client, "#reconcile-form button[type=submit]").await;
        wait_js(
            &client,
            &format!(
                "return document.getElementById('reconcile-message').textContent === \
                 'Run {run_id} has no call with an unknown outcome.'"
            ),
            Duration::from_secs(3),
            "nothing left to reconcile",
        )
        .await;
    })
    .await;
}
