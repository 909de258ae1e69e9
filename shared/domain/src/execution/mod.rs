//! Approved execution and durable mutation outcomes (seed 000, docs/architecture.md §7): the mutation
//! record kept per `(run_id, tool_call_id, approval_id)`, the run's budget accounting,
//! and every transition of an approved call — start, dispatch, settle, the settlement
//! deadline, operator reconciliation, execution heartbeats — as pure decisions. Each
//! decision names the record to write and the events to append; the store commits both
//! in one transaction (docs/architecture.md §1) or not at all.
//!
//! The rules that make it safe to put in front of tools that change the world:
//! - `tool_execution_started` only for a call a *human* approved, once per attempt.
//! - `dispatch` is the fence before any transport: once a deadline has settled the
//!   intent, dispatch is refused and the agent must not send.
//! - An ambiguous outcome (`outcome_unknown`) blocks every new start of that tool call
//!   until an operator reconciles; a confirmed `not_executed` needs a fresh approval
//!   (a new `approval_id`) before another attempt. Nothing here ever retries.
//! - No event on a run that is no longer running: the durable record still changes, so
//!   "query durable mutation state again" (seed 000) always has the answer.
//!
//! The module's parts: `record` holds the durable mutation record and its wire strings,
//! `budget` a run's budget and its usage, `decision` what every transition decides
//! and how the API answers it, `start` the admission of an approved call, `settle`
//! dispatch, settlement, the settlement deadline and execution heartbeats, and
//! `reconcile` an operator's answer for an `outcome_unknown` mutation.

mod budget;
mod decision;
#[cfg(test)]
mod fixtures;
mod reconcile;
mod record;
mod settle;
mod start;

pub use budget::{admit, Budget, BudgetError, BudgetUsage, MAX_BUDGET_TOOLS};
pub use decision::{Answer, Decision, Verdict};
pub use reconcile::reconcile;
pub use record::{
    execution_heartbeat_event_id, Evidence, ExecutionStatus, MutationRecord, MutationState,
    Observed, Reason, Reconciliation, SettledBy,
};
pub use settle::{
    dispatch, execution_heartbeat, settle, settle_at_deadline, Settlement, SettlementError,
};
pub use start::{start, StartRefusal, StartRequest};

/// `schema` of every durable mutation record the API serves.
pub const MUTATION_OUTCOME_SCHEMA: &str = "mutation_outcome/v1";

/// The tool that asks a human a question: answered, never executed (seed 000:
/// "human__ask do[es] not produce" `tool_execution_started`).
pub const HUMAN_ASK_TOOL: &str = "human__ask";

/// Seed 000: "A human-approved call emits tool_execution_started once after
/// approval_resolved and before post-approval admission …".
pub const EXECUTION_STARTED_TYPE: &str = crate::event::types::EXECUTION_STARTED;
/// The terminal execution decision (`execution_status` `executed` | `not_executed`).
pub const TOOL_EXECUTION_TYPE: &str = crate::event::types::TOOL_EXECUTION;
/// A sequenced heartbeat while a dispatched mutation waits for its settlement.
pub const HEARTBEAT_TYPE: &str = crate::event::types::HEARTBEAT;
/// An operator's reconciliation of an `outcome_unknown` mutation, announced on a running
/// run's stream. Tollgate's own: seed 000 names no event for reconciliation.
pub const EXECUTION_RECONCILED_TYPE: &str = crate::event::types::EXECUTION_RECONCILED;
/// A durable mutation record changed after its terminal `tool_execution` (a response
/// that arrived after the settlement deadline, or after an operator found the change
/// not applied): every change to a record is announced while its run is running, so the
/// stream and `mutation_outcome/v1` agree; after the run ended, the record alone changes.
/// Tollgate's own type.
pub const EXECUTION_UPDATED_TYPE: &str = crate::event::types::EXECUTION_UPDATED;

/// `TOLLGATE_SETTLEMENT_DEADLINE_SECONDS` when unset.
pub const DEFAULT_SETTLEMENT_DEADLINE_SECONDS: u64 = 60;
/// `TOLLGATE_EXECUTION_HEARTBEAT_SECONDS` when unset.
pub const DEFAULT_EXECUTION_HEARTBEAT_SECONDS: u64 = 15;

/// Result and error facts of one settlement together: they are stored on the mutation
/// item and repeated in the terminal `tool_execution` event, whose payload is bounded by
/// [`crate::MAX_PAYLOAD_BYTES`]; half of it leaves room for the ids and the envelope.
pub const MAX_FACTS_BYTES: usize = 32 * 1024;

/// The two timings of docs/architecture.md §7, read from the environment by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecutionSettings {
    /// `TOLLGATE_SETTLEMENT_DEADLINE_SECONDS`, in milliseconds.
    pub settlement_deadline_ms: i64,
    /// `TOLLGATE_EXECUTION_HEARTBEAT_SECONDS`, in milliseconds.
    pub heartbeat_interval_ms: i64,
}

impl Default for ExecutionSettings {
    fn default() -> Self {
        Self {
            settlement_deadline_ms: DEFAULT_SETTLEMENT_DEADLINE_SECONDS as i64 * 1000,
            heartbeat_interval_ms: DEFAULT_EXECUTION_HEARTBEAT_SECONDS as i64 * 1000,
        }
    }
}
