//! The store contract against DynamoDB: DynamoDB Local started by `make test`, or any
//! endpoint in `AWS_ENDPOINT_URL` / `AWS_ENDPOINT_URL_DYNAMODB` (or real AWS credentials).
use std::sync::Arc;

use tollgate_store::dynamo::DynamoStore;

/// With retention on (30 days), so that the suite also holds with TTLs written.
async fn dynamo_store() -> tollgate_store::contract::Store {
    let retention = std::time::Duration::from_secs(30 * 86_400);
    Arc::new(dynamo_store_raw().await.with_retention(Some(retention)))
}

async fn dynamo_store_raw() -> DynamoStore {
    tollgate_store::contract::dynamo_test_store().await
}

tollgate_store::contract_suite!(dynamo_store());

/// Two store instances without in-process lanes stand for two Lambda instances: only the
/// conditional head update keeps their appends gapless.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn separate_processes_race_only_on_the_head_condition() {
    use std::sync::Arc;
    let a = Arc::new(dynamo_store_raw().await.without_lanes()) as tollgate_store::contract::Store;
    let b = Arc::new(dynamo_store_raw().await.without_lanes()) as tollgate_store::contract::Store;
    tollgate_store::contract::concurrent_appends_across_stores(vec![a, b], 4, 15).await;
}

/// The same race across two processes (no shared lane).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_retries_land_once_across_processes() {
    let a = Arc::new(dynamo_store_raw().await.without_lanes());
    tollgate_store::contract::racing_retries_land_once(a).await;
}

/// One card decided by racing clicks on four store instances (four Lambda instances).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_resolution_wins_across_processes() {
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores
            .push(Arc::new(dynamo_store_raw().await.without_lanes())
                as tollgate_store::contract::Store);
    }
    tollgate_store::contract::one_resolution_wins(stores).await;
}

/// Expiry racing clicks at the deadline, the two on different store instances.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expiry_races_clicks_across_processes() {
    let a = Arc::new(dynamo_store_raw().await.without_lanes()) as tollgate_store::contract::Store;
    let b = Arc::new(dynamo_store_raw().await.without_lanes()) as tollgate_store::contract::Store;
    tollgate_store::contract::expiry_races_clicks_at_the_deadline(vec![a, b], 200).await;
}

/// Starts racing on two store instances (two Lambda instances) against one call ceiling:
/// only the head's condition keeps the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn starts_respect_the_ceiling_across_processes() {
    let a = Arc::new(dynamo_store_raw().await.without_lanes()) as tollgate_store::contract::Store;
    let b = Arc::new(dynamo_store_raw().await.without_lanes()) as tollgate_store::contract::Store;
    tollgate_store::contract::concurrent_starts_respect_the_call_ceiling(vec![a, b]).await;
}

/// With retention on, an ended run's mutation records get its head's final TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_ended_runs_records_expire_with_it() {
    let retention = std::time::Duration::from_secs(30 * 86_400);
    let store = dynamo_store_raw().await.with_retention(Some(retention));
    tollgate_store::contract::an_ended_runs_records_expire_with_it(store).await;
}

/// Two store instances (two Lambda instances), each remembering the heads it wrote: a
/// remembered head that moved on the other only loses its condition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn remembered_heads_follow_other_instances() {
    let a = Arc::new(dynamo_store_raw().await.without_lanes()) as tollgate_store::contract::Store;
    let b = Arc::new(dynamo_store_raw().await) as tollgate_store::contract::Store;
    tollgate_store::contract::remembered_heads_follow_other_instances(a, b).await;
}

/// Two store instances (two Lambda instances): the one that armed the cards remembers
/// them and their run's head; decisions from that memory lose to what the other did.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn remembered_cards_follow_other_instances() {
    let a = Arc::new(dynamo_store_raw().await) as tollgate_store::contract::Store;
    let b = Arc::new(dynamo_store_raw().await.without_lanes()) as tollgate_store::contract::Store;
    tollgate_store::contract::remembered_cards_follow_other_instances(a, b).await;
}
