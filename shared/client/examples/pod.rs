//! An AgentHost pod serving Tollgate's forwarded decisions on a loopback port.
//!
//! It holds one card for `web_fetch` in its [`PodGate`], waits for the decision that
//! arrives on `POST /tool-approvals` or `POST /tool-denials`, then arms a second
//! `web_fetch` card to show the in-pod bridge (a `tool`, `run` or `always` approval
//! approves it at once).
//!
//! ```text
//! POD_CREDENTIAL=s3cret cargo run -p tollgate-client --example pod
//! curl -X POST http://127.0.0.1:PORT/tool-approvals -H 'Authorization: Bearer s3cret' \
//!   -H 'content-type: application/json' \
//!   -d '{"runId": "pod-demo-run", "requestId": "REQUEST", "scope": "tool"}'
//! ```
//!
//! `POD_CREDENTIAL` (default: a random one, printed), `POD_PORT` (default: any free
//! port), `RUN_ID` (default `pod-demo-run`). With `TOLLGATE_URL` and `RUN_TOKEN` (the
//! run's token) set too, the pod announces its cards on the run's stream, as a pod
//! runtime does: operators then see them in `tollgate approvals` and the console.

use std::time::Duration;

use tokio::net::TcpListener;
use tollgate_client::pod::{PodArm, PodDecision, PodGate};

/// Serves the gate's routes on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, gate: PodGate) -> std::io::Result<()> {
    axum::serve(listener, gate.routes()).await
}

/// The pod's agent: asks for one `web_fetch`, then for a second one. Returns both
/// decisions.
pub async fn demo(
    gate: &PodGate,
    run_id: &str,
    timeout: Duration,
    on_pending: impl Fn(&str),
) -> (PodDecision, PodDecision) {
    let first_id = uuid::Uuid::new_v4().to_string();
    let first = gate.arm(
        PodArm::new(first_id.as_str(), run_id, "web_fetch")
            .url("https://example.com/docs")
            .message("The agent wants to fetch a URL. Operator approval required.")
            .timeout(timeout),
    );
    on_pending(&first_id);
    let first = first.await;
    let second_id = uuid::Uuid::new_v4().to_string();
    let second = gate.arm(
        PodArm::new(second_id.as_str(), run_id, "web_fetch")
            .url("https://example.com/more")
            .timeout(timeout),
    );
    if second.decided().is_none() {
        on_pending(&second_id);
    }
    (first, second.await)
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let credential = env("POD_CREDENTIAL").unwrap_or_else(|| {
        let c = uuid::Uuid::new_v4().simple().to_string();
        println!("POD_CREDENTIAL={c}");
        c
    });
    let run_id = env("RUN_ID").unwrap_or_else(|| "pod-demo-run".into());
    let port = env("POD_PORT").unwrap_or_else(|| "0".into());
    let listener = TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    let origin = format!("http://{}", listener.local_addr()?);
    println!("pod serving on {origin}");
    let gate = PodGate::new(&credential);
    if let (Some(url), Some(token)) = (env("TOLLGATE_URL"), env("RUN_TOKEN")) {
        // Only the run token is used: the agent JWT is not needed to act for one run.
        let client = tollgate_client::Client::new(&url, "-")
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        gate.announce_through(client.run(run_id.as_str(), token));
        println!("announcing cards on {run_id} at {url}");
    }
    tokio::spawn(serve(listener, gate.clone()));
    let (first, second) = demo(&gate, &run_id, Duration::from_secs(300), |request_id| {
        println!(
            "pending {request_id}: curl -X POST {origin}/tool-approvals \
             -H 'Authorization: Bearer …' -H 'content-type: application/json' \
             -d '{{\"runId\": \"{run_id}\", \"requestId\": \"{request_id}\", \"scope\": \"tool\"}}'"
        )
    })
    .await;
    println!("first web_fetch: {first:?}");
    println!("second web_fetch: {second:?}");
    Ok(())
}
