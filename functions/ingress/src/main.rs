//! `ingress`: create runs, append producer events, end runs (HTTP API and Function URL).

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    tollgate_api::telemetry::init(true);
    let deps = tollgate_api::Deps::from_env().await.inspect_err(|e| {
        tracing::error!(error = %e, "start-up failed");
    })?;
    lambda_http::run(tollgate_api::ingress_router(deps)).await
}
