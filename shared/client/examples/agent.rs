//! An agent that asks before `web_fetch`.
//!
//! It creates a run with a budget for one `web_fetch`, arms an approval gate for the
//! fetch, waits for an operator, and on approval runs the fetch under the execution
//! guard (start → dispatch → the request, 10 s at most → settle with what happened),
//! then completes the run.
//!
//! ```text
//! make run                       # prints the export lines for TOLLGATE_URL, AGENT_TOKEN, …
//! cargo run -p tollgate-client --example agent
//! # meanwhile, in another shell:  tollgate approvals;  tollgate approve RUN REQUEST
//! ```
//!
//! `TOLLGATE_URL` and `AGENT_TOKEN` are required; `FETCH_URL` is the URL to fetch
//! (default: a stub this example serves itself on a loopback port).

use std::time::Duration;

use serde_json::json;
use tollgate_client::{
    Budget, CallOutcome, Client, Decision, Error, GateRequest, Reply, RunSpec, SendPermit,
    TransportError,
};

/// How the agent's run went.
#[derive(Debug)]
pub struct AgentReport {
    /// The run it created.
    pub run_id: String,
    /// `approved`, `denied` or `expired`.
    pub decision: &'static str,
    /// The durable mutation record's state after the fetch, when it ran on the ledger.
    pub mutation_state: Option<String>,
    /// The fetched page's HTTP status, when a response arrived.
    pub http_status: Option<u16>,
}

/// The agent: everything but reading the environment.
pub async fn run_agent(
    base_url: &str,
    agent_token: &str,
    fetch_url: &str,
    gate_timeout: Duration,
) -> Result<AgentReport, Error> {
    let client = Client::new(base_url, agent_token)?;
    let run = client
        .create_run(RunSpec {
            budget: Some(Budget::new().tool("web_fetch", 1).call_ceiling(5)),
            ..RunSpec::default()
        })
        .await?;
    println!("run {} created", run.id());
    run.append([
        json!({"type": "agent.message", "text": format!("I need to read {fetch_url}")}),
        json!({"type": "tool.call", "tool": "web_fetch", "url": fetch_url}),
    ])
    .await?;

    let armed = run
        .arm(
            GateRequest::new("web_fetch", json!({"url": fetch_url}))
                .url(fetch_url)
                .intention("read the page to answer the question")
                .message("The agent wants to fetch a URL. Operator approval required.")
                .timeout(gate_timeout),
        )
        .await?;
    if armed.is_pending() {
        println!(
            "waiting for approval: tollgate approve {} {}",
            run.id(),
            armed.request_id()
        );
    }
    let mut report = AgentReport {
        run_id: run.id().to_owned(),
        decision: "expired",
        mutation_state: None,
        http_status: None,
    };
    match run.wait(armed).await? {
        Decision::Approved {
            call, decided_by, ..
        } => {
            report.decision = "approved";
            println!("approved by {}", decided_by.as_deref().unwrap_or("?"));
            let http = reqwest::Client::new();
            let url = fetch_url.to_owned();
            let executed = run
                .execute(call, Duration::from_secs(10), |permit| {
                    fetch(http, url, permit)
                })
                .await?;
            report.mutation_state = executed.state().map(|s| s.as_str().to_owned());
            let event = match &executed.outcome {
                CallOutcome::Responded((status, bytes)) => {
                    report.http_status = Some(*status);
                    json!({"type": "tool.result", "tool": "web_fetch", "http_status": status, "bytes": bytes})
                }
                CallOutcome::Failed(e) | CallOutcome::NotSent(e) => {
                    json!({"type": "tool.error", "tool": "web_fetch", "error": e.message()})
                }
                CallOutcome::TimedOut(after) => {
                    json!({"type": "tool.error", "tool": "web_fetch",
                           "error": format!("no answer within {after:?}")})
                }
            };
            run.append([event]).await?;
        }
        Decision::Denied { decided_by } => {
            report.decision = "denied";
            println!("denied by {}", decided_by.as_deref().unwrap_or("?"));
            run.append([json!({"type": "tool.error", "tool": "web_fetch", "error": "denied"})])
                .await?;
        }
        Decision::Expired => {
            println!("nobody answered in time");
            run.append([json!({"type": "tool.error", "tool": "web_fetch", "error": "expired"})])
                .await?;
        }
    }
    run.complete(Some(json!({"decision": report.decision})))
        .await?;
    Ok(report)
}

/// The transport: one GET. A response (any status) is a reply; a connection that could
/// not even be opened certainly sent nothing; any other failure may have sent it.
async fn fetch(
    http: reqwest::Client,
    url: String,
    permit: SendPermit,
) -> Result<Reply<(u16, usize)>, TransportError> {
    let resp = http
        .get(&url)
        .header("Idempotency-Key", permit.idempotency_key())
        .send()
        .await
        .map_err(|e| {
            if e.is_connect() {
                TransportError::not_sent(format!("cannot connect: {}", e.without_url()))
            } else {
                TransportError::failed(e.without_url().to_string())
            }
        })?;
    let status = resp.status().as_u16();
    // The status arrived: whatever happens to the body, the remote side answered.
    let bytes = resp.bytes().await.map_or(0, |b| b.len());
    let facts = json!({"http_status": status, "bytes": bytes});
    Ok(if (200..300).contains(&status) {
        Reply::ok((status, bytes), facts)
    } else {
        Reply::error((status, bytes), facts)
    })
}

/// A page to fetch when `FETCH_URL` is not set: `http://127.0.0.1:<port>/`.
pub async fn serve_stub() -> std::io::Result<String> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/", listener.local_addr()?);
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(|| async { "hello from the stub page\n" }),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(url)
}

#[tokio::main]
async fn main() {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let (Some(base), Some(token)) = (env("TOLLGATE_URL"), env("AGENT_TOKEN")) else {
        eprintln!("set TOLLGATE_URL and AGENT_TOKEN (make run prints them)");
        std::process::exit(2);
    };
    let fetch_url = match env("FETCH_URL") {
        Some(url) => url,
        None => serve_stub().await.unwrap_or_else(|e| {
            eprintln!("cannot serve the stub page: {e}");
            std::process::exit(2)
        }),
    };
    match run_agent(&base, &token, &fetch_url, Duration::from_secs(300)).await {
        Ok(report) => println!("{report:?}"),
        Err(e) => {
            eprintln!("agent failed: {e}");
            std::process::exit(1);
        }
    }
}
