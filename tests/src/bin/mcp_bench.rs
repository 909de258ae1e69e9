//! `tollgate-mcp-bench` (`make bench`): what the MCP gateway adds to a tool call. One
//! process, one machine, the same small upstream (`tollgate-mcp-echo`) throughout:
//!
//! 1. baseline: an MCP client calling `echo` straight on the upstream;
//! 2. `allow`: the same calls through `tollgate mcp proxy` with an allow rule;
//! 3. `ask`, approved by a standing `tool` grant: the first call approved by an operator
//!    with scope `tool`, the rest approved by the grant at arm.
//!
//! Printed: per-call medians and means, each as a ratio of the baseline, and the Tollgate
//! requests each call cost, counted by a forwarding front between the proxy and the
//! server (the goal for a granted `ask`: at most 2). No timed assertions.

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::IntoResponse;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use rmcp::ServiceExt;
use serde_json::{json, Value};
use tollgate_api::Role;
use tollgate_tests::{Backend, TestServer};

const OWNER: &str = "bench-operator";

#[derive(Clone)]
struct Front {
    upstream: String,
    http: reqwest::Client,
    requests: Arc<AtomicU64>,
}

/// Forwards every request to the server, counting them.
async fn forward(
    State(front): State<Front>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> impl IntoResponse {
    front.requests.fetch_add(1, Ordering::SeqCst);
    let url = format!(
        "{}{}",
        front.upstream,
        uri.path_and_query().map_or("/", |p| p.as_str())
    );
    let mut req = front.http.request(method, url).body(body);
    for (k, v) in &headers {
        if k != "host" && k != "content-length" {
            req = req.header(k, v);
        }
    }
    match req.send().await {
        Ok(resp) => {
            let status = resp.status();
            let mut out = HeaderMap::new();
            for (k, v) in resp.headers() {
                if k != "transfer-encoding" && k != "content-length" {
                    out.insert(k.clone(), v.clone());
                }
            }
            let body = resp.bytes().await.unwrap_or_default();
            (status, out, body).into_response()
        }
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}

fn sibling(name: &str) -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("own path");
    exe.parent().expect("bin dir").join(name)
}

async fn connect(
    program: &std::path::Path,
    args: &[String],
    env: &[(&str, String)],
) -> RunningService<RoleClient, ()> {
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args).stderr(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    ().serve(TokioChildProcess::new(cmd).expect("spawn"))
        .await
        .expect("MCP handshake")
}

async fn echo(client: &RunningService<RoleClient, ()>, i: usize) -> Duration {
    let mut params = CallToolRequestParams::new("echo");
    params.arguments = Some(
        json!({"text": format!("call {i}")})
            .as_object()
            .unwrap()
            .clone(),
    );
    let started = Instant::now();
    let r = client.call_tool(params).await.expect("call");
    assert_ne!(r.is_error, Some(true), "{r:?}");
    started.elapsed()
}

struct Figures {
    median: Duration,
    mean: Duration,
}

async fn measure(client: &RunningService<RoleClient, ()>, calls: usize) -> Figures {
    for i in 0..10 {
        echo(client, i).await; // warm-up
    }
    let mut times = Vec::with_capacity(calls);
    for i in 0..calls {
        times.push(echo(client, i).await);
    }
    times.sort();
    Figures {
        median: times[times.len() / 2],
        mean: times.iter().sum::<Duration>() / calls as u32,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() {
    let calls: usize = std::env::var("MCP_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let tollgate = std::env::var("TOLLGATE_BIN")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| sibling("tollgate"));
    let upstream = sibling("tollgate-mcp-echo");
    let srv = TestServer::start(Backend::Memory).await;
    let front = Front {
        upstream: srv.base.clone(),
        http: reqwest::Client::new(),
        requests: Arc::new(AtomicU64::new(0)),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let front_url = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new()
        .fallback(forward)
        .with_state(front.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let env = [
        ("TOLLGATE_URL", front_url.clone()),
        ("TOLLGATE_TOKEN", srv.agent_token.clone()),
    ];
    println!(
        "mcp gateway: {calls} sequential echo calls each; proxy {}",
        tollgate.display()
    );

    let direct = connect(&upstream, &[], &[]).await;
    let base = measure(&direct, calls).await;
    let _ = direct.cancel().await;
    println!(
        "  baseline (straight to the upstream): median {}, mean {}",
        ms(base.median),
        ms(base.mean)
    );

    let dir = std::env::temp_dir().join(format!("tollgate-mcp-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let policy = dir.join("allow.toml");
    std::fs::write(&policy, "[[rule]]\ntool = \"echo\"\ndecision = \"allow\"\n").unwrap();
    let proxy_args = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = ["mcp", "proxy", "--name", "echo", "--owner", OWNER]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a.push("--".into());
        a.push(upstream.display().to_string());
        a
    };

    let allowed = connect(
        &tollgate,
        &proxy_args(&["--policy", policy.to_str().unwrap()]),
        &env,
    )
    .await;
    let before = front.requests.load(Ordering::SeqCst);
    let allow = measure(&allowed, calls).await;
    let allow_requests =
        (front.requests.load(Ordering::SeqCst) - before) as f64 / (calls + 10) as f64;
    let _ = allowed.cancel().await;
    println!(
        "  allow rule through the proxy: median {} ({:.2}× baseline), mean {} ({:.2}×), {:.2} Tollgate requests per call",
        ms(allow.median),
        allow.median.as_secs_f64() / base.median.as_secs_f64(),
        ms(allow.mean),
        allow.mean.as_secs_f64() / base.mean.as_secs_f64(),
        allow_requests
    );

    // Ask, approved once by an operator with scope `tool`; the rest by the grant.
    let asked = connect(&tollgate, &proxy_args(&[]), &env).await;
    let operator = srv.auth.mint_jwt(OWNER, Role::Operator, 600, None);
    let approver = {
        let http = srv.http.clone();
        let url = srv.base.clone();
        tokio::spawn(async move {
            for _ in 0..200 {
                let cards: Value = http
                    .get(format!("{url}/api/approvals"))
                    .bearer_auth(&operator)
                    .send()
                    .await
                    .unwrap()
                    .json()
                    .await
                    .unwrap();
                if let Some(card) = cards["approvals"].as_array().and_then(|a| a.first()) {
                    let body = json!({"request_id": card["request_id"], "scope": "tool"});
                    let answer: Value = http
                        .post(format!(
                            "{url}/api/runs/{}/tool-approvals",
                            card["run_id"].as_str().unwrap()
                        ))
                        .bearer_auth(&operator)
                        .json(&body)
                        .send()
                        .await
                        .unwrap()
                        .json()
                        .await
                        .unwrap();
                    assert_eq!(answer["state"], "approved", "{answer}");
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            panic!("no card to approve");
        })
    };
    echo(&asked, 0).await;
    approver.await.unwrap();
    let before = front.requests.load(Ordering::SeqCst);
    let granted = measure(&asked, calls).await;
    let granted_requests =
        (front.requests.load(Ordering::SeqCst) - before) as f64 / (calls + 10) as f64;
    let _ = asked.cancel().await;
    println!(
        "  ask approved by a tool grant: median {} ({:.2}× baseline, +{} per call), mean {} ({:.2}×), {:.2} Tollgate requests per call (goal ≤ 2)",
        ms(granted.median),
        granted.median.as_secs_f64() / base.median.as_secs_f64(),
        ms(granted.median.saturating_sub(base.median)),
        ms(granted.mean),
        granted.mean.as_secs_f64() / base.mean.as_secs_f64(),
        granted_requests
    );
    let _ = std::fs::remove_dir_all(&dir);
}
