//! `stall-watch`: invoked by an EventBridge schedule (every minute). Each tick expires
//! the pending approval cards whose deadline has passed but whose expiry timer message
//! was lost (`Gate::sweep`), then runs the coordinator stall guard (`Gate::stall_guard`:
//! one `coordinator.child_stall_detected` per silent child not waiting on a card), and
//! settles the execution attempts past their settlement deadline whose timer was lost
//! (`Gate::sweep_settlements`, as the timer would).
//! Answers `{"expired": n, "stalled": m, "settled": k}`; a storage outage fails the
//! invocation (after every step was tried), and the next tick tries again.

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde_json::{json, Value};
use tollgate_api::Deps;

/// Most cards (and children) one tick handles; the rest wait for the next minute.
const TICK_LIMIT: usize = 500;

/// One tick. The event is EventBridge's `Scheduled Event`; nothing in it is needed
/// beyond its id for the log, so any JSON is accepted.
async fn tick(deps: &Deps, event: LambdaEvent<Value>) -> Result<Value, Error> {
    let event_id = event
        .payload
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or("");
    let request_id = event.context.request_id.as_str();
    // Every step runs even if one fails: a broken sweep must not starve the others.
    let expired = deps.gate.sweep(TICK_LIMIT).await;
    let stalled = deps.gate.stall_guard(TICK_LIMIT).await;
    let settled = deps.gate.sweep_settlements(TICK_LIMIT).await;
    match (expired, stalled, settled) {
        (Ok(expired), Ok(stalled), Ok(settled)) => {
            tracing::info!(
                event_id,
                request_id,
                expired,
                stalled,
                settled,
                "stall-watch tick"
            );
            Ok(json!({ "expired": expired, "stalled": stalled, "settled": settled }))
        }
        (expired, stalled, settled) => {
            let errors: Vec<String> = [
                ("sweep", expired.err()),
                ("stall guard", stalled.err()),
                ("settlement sweep", settled.err()),
            ]
            .into_iter()
            .filter_map(|(step, e)| e.map(|e| format!("{step}: {e}")))
            .collect();
            tracing::error!(event_id, request_id, errors = ?errors, "stall-watch tick failed");
            Err(errors.join("; ").into())
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let deps = tollgate_api::functions::start(&tollgate_api::functions::STALL_WATCH).await?;
    let deps = &deps;
    lambda_runtime::run(service_fn(move |event| tick(deps, event))).await
}
