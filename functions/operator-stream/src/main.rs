//! `operator-stream`: the replay routes (and so the live stream) for operator tokens
//! only, behind a Function URL of its own with `InvokeMode: RESPONSE_STREAM` and its own
//! reserved concurrency, so agents waiting on their cards on `replay-stream` cannot take
//! every place operators watch from.

#[tokio::main]
async fn main() -> Result<(), tollgate_api::lambda::Error> {
    tollgate_api::lambda::serve_function(&tollgate_api::functions::OPERATOR_STREAM).await
}
