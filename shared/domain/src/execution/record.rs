//! The durable mutation record kept per `(run_id, tool_call_id, approval_id)`
//! (docs/architecture.md §7): its states, execution statuses, reasons, evidence and
//! observations with their exact wire strings, the `mutation_outcome/v1` projection and
//! the events that announce each change of it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{
    ExecutionSettings, EXECUTION_RECONCILED_TYPE, EXECUTION_STARTED_TYPE, EXECUTION_UPDATED_TYPE,
    HEARTBEAT_TYPE, MUTATION_OUTCOME_SCHEMA, TOOL_EXECUTION_TYPE,
};
use crate::event::EventDraft;

/// `state` of a durable mutation record (docs/architecture.md §7, exact wire strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MutationState {
    /// Admitted: `tool_execution_started` was appended; nothing has been sent yet.
    Intent,
    /// The agent declared it is about to send; from here the outcome may be real.
    Dispatched,
    /// A remote response was confirmed (or an operator observed the change applied).
    Completed,
    /// Sent, but nobody knows whether it took effect. Blocks replay until reconciled.
    OutcomeUnknown,
    /// Known not to have taken effect.
    NotExecuted,
}

impl MutationState {
    pub fn as_str(self) -> &'static str {
        match self {
            MutationState::Intent => "intent",
            MutationState::Dispatched => "dispatched",
            MutationState::Completed => "completed",
            MutationState::OutcomeUnknown => "outcome_unknown",
            MutationState::NotExecuted => "not_executed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "intent" => MutationState::Intent,
            "dispatched" => MutationState::Dispatched,
            "completed" => MutationState::Completed,
            "outcome_unknown" => MutationState::OutcomeUnknown,
            "not_executed" => MutationState::NotExecuted,
            _ => return None,
        })
    }

    /// The terminal `tool_execution` decision has been taken (or the call was refused).
    pub fn is_settled(self) -> bool {
        !matches!(self, MutationState::Intent | MutationState::Dispatched)
    }
}

/// `execution_status` of `tool_execution` (seed 000: "execution_status: \"executed\"
/// alone is not a successful mutation").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    Executed,
    NotExecuted,
}

impl ExecutionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionStatus::Executed => "executed",
            ExecutionStatus::NotExecuted => "not_executed",
        }
    }
}

/// Why a record is in its state: every `not_executed` has one, and so do the outcomes
/// that were not the agent's own confirmed evidence. Served as `reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The run was created without a `budget`: it admits no approved execution.
    NoBudget,
    /// The tool is not listed in the run's `budget.tools`.
    ToolNotInBudget,
    /// The tool's `max_starts` are used up (approval grants no extra allowance).
    BudgetExhausted,
    /// The run's `call_ceiling` is reached.
    CallCeilingReached,
    /// The run is cancelled, completed or failed.
    RunNotRunning,
    /// The card expired before a human decided.
    ApprovalExpired,
    /// A human denied the card.
    ApprovalDenied,
    /// The settlement deadline passed before dispatch (seed: "settles as unsent").
    Unsent,
    /// The agent's evidence: the request never left.
    NotSent,
    /// The settlement deadline passed after dispatch with no settlement.
    SettlementDeadline,
    /// The agent's evidence: a timeout or transport failure after dispatch.
    Ambiguous,
    /// An operator observed the change applied.
    ReconciledApplied,
    /// An operator observed the change not applied.
    ReconciledNotApplied,
    /// A confirmed response arrived after an operator found the change not applied.
    Contested,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NoBudget => "no_budget",
            Reason::ToolNotInBudget => "tool_not_in_budget",
            Reason::BudgetExhausted => "budget_exhausted",
            Reason::CallCeilingReached => "call_ceiling_reached",
            Reason::RunNotRunning => "run_not_running",
            Reason::ApprovalExpired => "approval_expired",
            Reason::ApprovalDenied => "approval_denied",
            Reason::Unsent => "unsent",
            Reason::NotSent => "not_sent",
            Reason::SettlementDeadline => "settlement_deadline",
            Reason::Ambiguous => "ambiguous",
            Reason::ReconciledApplied => "reconciled_applied",
            Reason::ReconciledNotApplied => "reconciled_not_applied",
            Reason::Contested => "contested",
        }
    }
}

/// `evidence` of a settlement (seed 000's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Evidence {
    /// A remote response arrived; its result or error facts are kept.
    Confirmed,
    /// A timeout or transport failure after dispatch.
    Ambiguous,
    /// The request never left.
    NotSent,
}

impl Evidence {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "confirmed" => Evidence::Confirmed,
            "ambiguous" => Evidence::Ambiguous,
            "not_sent" => Evidence::NotSent,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Evidence::Confirmed => "confirmed",
            Evidence::Ambiguous => "ambiguous",
            Evidence::NotSent => "not_sent",
        }
    }

    /// The state this evidence settles a sent (dispatched) call in.
    pub(super) fn outcome(self) -> MutationState {
        match self {
            Evidence::Confirmed => MutationState::Completed,
            Evidence::Ambiguous => MutationState::OutcomeUnknown,
            Evidence::NotSent => MutationState::NotExecuted,
        }
    }
}

/// `observed` of an operator's reconciliation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Observed {
    Applied,
    NotApplied,
}

impl Observed {
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "applied" => Observed::Applied,
            "not_applied" => Observed::NotApplied,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Observed::Applied => "applied",
            Observed::NotApplied => "not_applied",
        }
    }
}

/// Who settled the record: it decides whether a later settlement may still replace it
/// (only the deadline's conservative guess gives way to the agent's real evidence).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SettledBy {
    /// Refused at start or at dispatch (budget, ceiling, run, card).
    Admission,
    /// The agent's `settle` with evidence.
    Agent,
    /// The settlement-deadline timer.
    Deadline,
    /// An operator's reconciliation.
    Operator,
}

/// An operator's authoritative answer for an `outcome_unknown` mutation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reconciliation {
    pub observed: Observed,
    pub by: String,
    pub at: i64,
}

/// One durable mutation intent/outcome, keyed `(run_id, tool_call_id#approval_id)`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MutationRecord {
    pub run_id: String,
    pub tool_call_id: String,
    pub approval_id: String,
    /// The card that approved it.
    pub request_id: String,
    pub tool_name: String,
    /// The card's `arguments_hash`, or the one `start` named when the card had none:
    /// the arguments this attempt is bound to.
    pub arguments_hash: Option<String>,
    pub state: MutationState,
    /// Set once the terminal decision is taken.
    pub execution_status: Option<ExecutionStatus>,
    pub result: Option<Value>,
    pub error: Option<Value>,
    pub reason: Option<Reason>,
    /// The evidence of the agent's settlement, when it settled the record.
    pub evidence: Option<Evidence>,
    pub settled_by: Option<SettledBy>,
    /// Sequence of `tool_execution_started` (admitted attempts only).
    pub started_sequence: Option<u64>,
    /// Milliseconds since the epoch: admission (or the refusal that recorded it).
    pub created_at: i64,
    pub dispatched_at: Option<i64>,
    pub settled_at: Option<i64>,
    /// `created_at` + the settlement deadline: an unsettled record is settled then.
    pub settlement_deadline_at: i64,
    pub reconciliation: Option<Reconciliation>,
}

impl MutationRecord {
    /// The `mutation_outcome/v1` projection (docs/architecture.md §7, exact): `{schema, run_id,
    /// tool_call_id, approval_id, tool_name, state, execution_status?, result?, error?,
    /// reason?}` — the optional fields are absent, not null, until they are known.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("schema".into(), MUTATION_OUTCOME_SCHEMA.into());
        m.insert("run_id".into(), self.run_id.clone().into());
        m.insert("tool_call_id".into(), self.tool_call_id.clone().into());
        m.insert("approval_id".into(), self.approval_id.clone().into());
        m.insert("tool_name".into(), self.tool_name.clone().into());
        m.insert("state".into(), self.state.as_str().into());
        self.facts_into(&mut m);
        Value::Object(m)
    }

    /// `execution_status`, `result`, `error`, `reason` — each only when known.
    pub(super) fn facts_into(&self, m: &mut Map<String, Value>) {
        if let Some(status) = self.execution_status {
            m.insert("execution_status".into(), status.as_str().into());
        }
        if let Some(result) = &self.result {
            m.insert("result".into(), result.clone());
        }
        if let Some(error) = &self.error {
            m.insert("error".into(), error.clone());
        }
        if let Some(reason) = self.reason {
            m.insert("reason".into(), reason.as_str().into());
        }
    }

    /// The identity every execution event carries, in the seed's order.
    pub(super) fn ids(&self) -> Map<String, Value> {
        let mut p = Map::new();
        p.insert("tool_name".into(), self.tool_name.clone().into());
        p.insert("tool_call_id".into(), self.tool_call_id.clone().into());
        p.insert("approval_id".into(), self.approval_id.clone().into());
        p
    }

    /// `tool_execution_started`: exactly `tool_name`, `tool_call_id`, `approval_id`
    /// beside the envelope. Seed 000: "The start event carries no arguments,
    /// credentials, or claimed resource outcome."
    pub fn started_event(&self) -> EventDraft {
        EventDraft::server(EXECUTION_STARTED_TYPE, self.ids())
    }

    /// The terminal `tool_execution`: the ids, `execution_status`, `mutation_outcome`
    /// (the record's state) and the facts (`result`, `error`, `reason` when known).
    pub fn execution_event(&self) -> EventDraft {
        let mut p = self.ids();
        let status = self
            .execution_status
            .unwrap_or(ExecutionStatus::NotExecuted);
        p.insert("execution_status".into(), status.as_str().into());
        p.insert("mutation_outcome".into(), self.state.as_str().into());
        if let Some(result) = &self.result {
            p.insert("result".into(), result.clone());
        }
        if let Some(error) = &self.error {
            p.insert("error".into(), error.clone());
        }
        if let Some(reason) = self.reason {
            p.insert("reason".into(), reason.as_str().into());
        }
        EventDraft::server(TOOL_EXECUTION_TYPE, p)
    }

    /// Heartbeat number `beat` while dispatched. Keyed, so a redelivered timer writes
    /// the same heartbeat at most once.
    pub fn heartbeat_event(&self, beat: u32) -> EventDraft {
        let mut draft = EventDraft::server(HEARTBEAT_TYPE, self.ids());
        draft.event_id = Some(execution_heartbeat_event_id(
            &self.tool_call_id,
            &self.approval_id,
            beat,
        ));
        draft
    }

    /// `tool_execution_reconciled`: the ids, `observed`, the new `mutation_outcome`
    /// and who reconciled it.
    pub fn reconciled_event(&self) -> Option<EventDraft> {
        let rec = self.reconciliation.as_ref()?;
        let mut p = self.ids();
        p.insert("observed".into(), rec.observed.as_str().into());
        p.insert("mutation_outcome".into(), self.state.as_str().into());
        p.insert("reconciled_by".into(), rec.by.clone().into());
        Some(EventDraft::server(EXECUTION_RECONCILED_TYPE, p))
    }

    /// `tool_execution_updated`: the ids, the new `mutation_outcome`, the one it replaces
    /// (`previous_outcome`), the `evidence` that changed it, the facts kept and `reason`.
    pub fn updated_event(&self, previous: MutationState) -> EventDraft {
        let mut p = self.ids();
        p.insert("mutation_outcome".into(), self.state.as_str().into());
        p.insert("previous_outcome".into(), previous.as_str().into());
        if let Some(evidence) = self.evidence {
            p.insert("evidence".into(), evidence.as_str().into());
        }
        self.facts_into(&mut p);
        EventDraft::server(EXECUTION_UPDATED_TYPE, p)
    }

    /// When heartbeat number `beat` (1, 2, …) of a dispatched record is due.
    pub fn heartbeat_due_at(&self, beat: u32, settings: &ExecutionSettings) -> Option<i64> {
        self.dispatched_at
            .map(|at| at + i64::from(beat) * settings.heartbeat_interval_ms)
    }

    /// This record with its terminal decision taken.
    pub(super) fn settled(
        &self,
        state: MutationState,
        status: ExecutionStatus,
        reason: Option<Reason>,
        by: SettledBy,
        now: i64,
    ) -> Self {
        let mut r = self.clone();
        r.state = state;
        r.execution_status = Some(status);
        r.reason = reason;
        r.settled_by = Some(by);
        r.settled_at = Some(now);
        r
    }
}

/// `tollgate:execution_heartbeat:<32 hex>:<beat>`: a digest of the attempt's identity
/// (ids may contain `:` and be 128 characters each; a digest keeps the key short and
/// unambiguous) and the beat number. The `tollgate:` prefix is one producers may not use.
pub fn execution_heartbeat_event_id(tool_call_id: &str, approval_id: &str, beat: u32) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(b"tollgate-execution-heartbeat\0")
        .chain_update(tool_call_id.as_bytes())
        .chain_update(b"\0")
        .chain_update(approval_id.as_bytes())
        .finalize();
    format!(
        "tollgate:execution_heartbeat:{}:{beat}",
        hex::encode(&digest[..16])
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::execution::fixtures::*;
    use crate::execution::*;
    use crate::run::RunStatus;
    use serde_json::json;

    // --- wire strings and storage --------------------------------------------------

    #[test]
    fn wire_strings_are_exact() {
        for s in [
            MutationState::Intent,
            MutationState::Dispatched,
            MutationState::Completed,
            MutationState::OutcomeUnknown,
            MutationState::NotExecuted,
        ] {
            assert_eq!(MutationState::parse(s.as_str()), Some(s));
            assert_eq!(serde_json::to_value(s).unwrap(), json!(s.as_str()));
        }
        assert_eq!(
            [MutationState::Intent, MutationState::Dispatched].map(MutationState::is_settled),
            [false, false]
        );
        assert_eq!(MutationState::parse("Completed"), None);
        for e in ["confirmed", "ambiguous", "not_sent"] {
            assert_eq!(Evidence::parse(e).unwrap().as_str(), e);
        }
        for o in ["applied", "not_applied"] {
            assert_eq!(Observed::parse(o).unwrap().as_str(), o);
        }
        assert_eq!(Observed::parse("Applied"), None);
        for r in [
            Reason::NoBudget,
            Reason::ToolNotInBudget,
            Reason::BudgetExhausted,
            Reason::CallCeilingReached,
            Reason::RunNotRunning,
            Reason::ApprovalExpired,
            Reason::ApprovalDenied,
            Reason::Unsent,
            Reason::NotSent,
            Reason::SettlementDeadline,
            Reason::Ambiguous,
            Reason::ReconciledApplied,
            Reason::ReconciledNotApplied,
        ] {
            assert_eq!(serde_json::to_value(r).unwrap(), json!(r.as_str()));
        }
        assert_eq!(ExecutionStatus::Executed.as_str(), "executed");
        assert_eq!(ExecutionStatus::NotExecuted.as_str(), "not_executed");
    }

    #[test]
    fn intent_and_dispatched_records_project_without_facts() {
        assert_eq!(
            intent().to_json(),
            json!({"schema":"mutation_outcome/v1","run_id":"run-1","tool_call_id":"write-1",
                   "approval_id":"approval-1","tool_name":"mcp__last9__create_dashboard",
                   "state":"intent"})
        );
        let d = dispatched().to_json();
        assert_eq!(d["state"], "dispatched");
        assert_eq!(d.get("execution_status"), None);
        // Key order is the documented one.
        assert_eq!(
            intent()
                .to_json()
                .as_object()
                .unwrap()
                .keys()
                .collect::<Vec<_>>(),
            [
                "schema",
                "run_id",
                "tool_call_id",
                "approval_id",
                "tool_name",
                "state"
            ]
        );
    }

    #[test]
    fn records_round_trip_through_storage_json() {
        let unknown = settle_at_deadline(&dispatched(), RunStatus::Running, T0 + 60_000)
            .unwrap()
            .record;
        let done = reconcile(
            &unknown,
            Observed::Applied,
            "op",
            RunStatus::Running,
            T0 + 61_000,
        )
        .record;
        let stored = serde_json::to_value(&done).unwrap();
        assert_eq!(stored["state"], "completed");
        assert_eq!(stored["settled_by"], "operator");
        let back: MutationRecord = serde_json::from_value(stored).unwrap();
        assert_eq!(back, done);
    }
}
