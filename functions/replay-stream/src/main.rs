//! `replay-stream`: the replay routes behind a Function URL with
//! `InvokeMode: RESPONSE_STREAM` (Lambda response streaming; SSE is served here).

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tollgate_api::telemetry::init(true);
    let deps = tollgate_api::Deps::from_env().await.inspect_err(|e| {
        tracing::error!(error = %e, "start-up failed");
    })?;
    tollgate_api::lambda::run_streaming(tollgate_api::replay_router(deps)).await
}
