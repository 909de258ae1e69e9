//! `ingress`: create runs, append producer events, end runs (HTTP API and Function URL).

use tollgate_api::lambda::{serve, Error, Response};

#[tokio::main]
async fn main() -> Result<(), Error> {
    serve(tollgate_api::ingress_router, Response::Buffered).await
}
