//! `websocket`: the API Gateway WebSocket API's routes (`$connect`, `$disconnect`,
//! `subscribe`, `unsubscribe`, `ping`, `$default`), docs/architecture.md §9.

#[tokio::main]
async fn main() -> Result<(), tollgate_api::push::lambda::Error> {
    tollgate_api::push::lambda::run_websocket(&tollgate_api::functions::WEBSOCKET).await
}
