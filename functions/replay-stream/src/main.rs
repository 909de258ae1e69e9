//! `replay-stream`: the replay routes behind a Function URL with
//! `InvokeMode: RESPONSE_STREAM` (Lambda response streaming; SSE is served here).

#[tokio::main]
async fn main() -> Result<(), tollgate_api::lambda::Error> {
    tollgate_api::lambda::serve_function(&tollgate_api::functions::REPLAY_STREAM).await
}
