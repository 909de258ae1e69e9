//! `fanout`: batches of the events table's DynamoDB Stream; each new event posted to its
//! run's WebSocket subscribers (docs/architecture.md §9).

#[tokio::main]
async fn main() -> Result<(), tollgate_api::push::lambda::Error> {
    tollgate_api::push::lambda::run_fanout(&tollgate_api::functions::FANOUT).await
}
