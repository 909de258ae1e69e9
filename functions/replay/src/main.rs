//! `replay`: sequenced replay of a run's event stream (HTTP API and Function URL).

use tollgate_api::lambda::{serve, Error, Response};

#[tokio::main]
async fn main() -> Result<(), Error> {
    serve(tollgate_api::replay_router, Response::Buffered).await
}
