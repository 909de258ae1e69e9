//! `settlement`: agents start, dispatch and settle human-approved mutating calls; anyone
//! who may read a run reads its `mutation_outcome/v1` records; operators reconcile
//! unknown outcomes (HTTP API).

#[tokio::main]
async fn main() -> Result<(), tollgate_api::lambda::Error> {
    tollgate_api::lambda::serve_function(&tollgate_api::functions::SETTLEMENT).await
}
