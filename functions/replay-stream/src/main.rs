//! `replay-stream`: the replay routes behind a Function URL with
//! `InvokeMode: RESPONSE_STREAM` (Lambda response streaming; SSE is served here).

use tollgate_api::lambda::{serve, Error, Response};

#[tokio::main]
async fn main() -> Result<(), Error> {
    serve(tollgate_api::replay_router, Response::Streaming).await
}
