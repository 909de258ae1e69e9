//! `replay`: sequenced replay of a run's event stream (HTTP API and Function URL).

#[tokio::main]
async fn main() -> Result<(), tollgate_api::lambda::Error> {
    tollgate_api::lambda::serve_function(&tollgate_api::functions::REPLAY).await
}
