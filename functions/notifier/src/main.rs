//! `notifier`: card events from the events table's DynamoDB Stream delivered to the
//! configured sinks, and (on its schedule) the retries that are due
//! (docs/architecture.md §10).

#[tokio::main]
async fn main() -> Result<(), tollgate_api::push::lambda::Error> {
    tollgate_api::notify::lambda::run_notifier(&tollgate_api::functions::NOTIFIER).await
}
