//! `timers`: SQS batches of timer messages (approval expiry, `tool.approval_pending`
//! heartbeats) handed to the approval gate; only the records that fail are reported back
//! (`ReportBatchItemFailures`), so SQS redelivers just those.

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    let deps = tollgate_api::functions::start(&tollgate_api::functions::TIMERS).await?;
    tollgate_timers::lambda::run_sqs_function(deps.gate.clone()).await
}
