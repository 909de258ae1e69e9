//! `ingress`: create runs, append producer events, end runs, arm and read approval cards
//! (HTTP API and Function URL).

#[tokio::main]
async fn main() -> Result<(), tollgate_api::lambda::Error> {
    tollgate_api::lambda::serve_function(&tollgate_api::functions::INGRESS).await
}
