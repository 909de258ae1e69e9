//! The store contract against the embedded adapter.
use std::sync::Arc;

tollgate_store::contract_suite!(async {
    Arc::new(tollgate_store::memory::MemoryStore::new()) as tollgate_store::contract::Store
});

/// Two handles on one embedded store (the contract's two-instance case).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn remembered_heads_follow_other_instances() {
    let store =
        Arc::new(tollgate_store::memory::MemoryStore::new()) as tollgate_store::contract::Store;
    tollgate_store::contract::remembered_heads_follow_other_instances(store.clone(), store).await;
}

/// Two handles on one embedded store: cards remembered by neither change the answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn remembered_cards_follow_other_instances() {
    let store =
        Arc::new(tollgate_store::memory::MemoryStore::new()) as tollgate_store::contract::Store;
    tollgate_store::contract::remembered_cards_follow_other_instances(store.clone(), store).await;
}
