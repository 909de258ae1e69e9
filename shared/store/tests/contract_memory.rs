//! The store contract against the embedded adapter.
use std::sync::Arc;

tollgate_store::contract_suite!(async {
    Arc::new(tollgate_store::memory::MemoryStore::new()) as tollgate_store::contract::Store
});
