//! `replay`: sequenced replay of a run's event stream (HTTP API and Function URL).

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    tollgate_api::telemetry::init(true);
    let deps = tollgate_api::Deps::from_env().await.inspect_err(|e| {
        tracing::error!(error = %e, "start-up failed");
    })?;
    tollgate_api::lambda::run(tollgate_api::replay_router(deps)).await
}
