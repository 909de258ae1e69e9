//! `approvals`: operators approve (with a scope) or deny approval cards and list the
//! pending ones (HTTP API).

#[tokio::main]
async fn main() -> Result<(), tollgate_api::lambda::Error> {
    tollgate_api::lambda::serve_function(&tollgate_api::functions::APPROVALS).await
}
