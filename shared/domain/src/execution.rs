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

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::approval::POLICY_DECIDER_PREFIX;
use crate::approval::{valid_id, ApprovalRequest, ApprovalState, MAX_HASH, MAX_TOOL_NAME};
use crate::event::EventDraft;
use crate::run::{RunHead, RunStatus};

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
/// not applied): every change to a record is announced, so the stream and
/// `mutation_outcome/v1` never disagree. Tollgate's own type.
pub const EXECUTION_UPDATED_TYPE: &str = crate::event::types::EXECUTION_UPDATED;

/// `TOLLGATE_SETTLEMENT_DEADLINE_SECONDS` when unset.
pub const DEFAULT_SETTLEMENT_DEADLINE_SECONDS: u64 = 60;
/// `TOLLGATE_EXECUTION_HEARTBEAT_SECONDS` when unset.
pub const DEFAULT_EXECUTION_HEARTBEAT_SECONDS: u64 = 15;

/// Result and error facts of one settlement together: they are stored on the mutation
/// item and repeated in the terminal `tool_execution` event, whose payload is bounded by
/// [`crate::MAX_PAYLOAD_BYTES`]; half of it leaves room for the ids and the envelope.
pub const MAX_FACTS_BYTES: usize = 32 * 1024;

/// Limits a run's budget may name (the head is rewritten by every append, so it stays
/// small; the same limits `POST /api/runs` enforces).
pub const MAX_BUDGET_TOOLS: usize = 64;

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
    fn outcome(self) -> MutationState {
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
    fn facts_into(&self, m: &mut Map<String, Value>) {
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
    fn ids(&self) -> Map<String, Value> {
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
    fn settled(
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

// ---------------------------------------------------------------------------------------
// Budget
// ---------------------------------------------------------------------------------------

/// A run's `budget` (`{tools:{name:max_starts}, call_ceiling}`) as a typed value. Seed
/// 000: "hosts must still explicitly select tools using ApprovedMutationBudget … receive
/// no extra allowance merely because their calls are approved."
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Budget {
    /// Approved-execution starts allowed per tool over the run's life.
    pub tools: BTreeMap<String, u64>,
    /// Admitted approved executions allowed over the run's life, all tools together;
    /// `None`: only the per-tool allowances bound them.
    pub call_ceiling: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("budget must be {{\"tools\": {{\"<tool>\": <max starts>}}, \"call_ceiling\": <n>}} with at most 64 tools named in 1 to 128 characters")]
pub struct BudgetError;

impl Budget {
    /// Parses the JSON stored on the head, with the rules `POST /api/runs` applies.
    pub fn parse(value: &Value) -> Result<Self, BudgetError> {
        let obj = value.as_object().ok_or(BudgetError)?;
        if obj.keys().any(|k| k != "tools" && k != "call_ceiling") {
            return Err(BudgetError);
        }
        let mut tools = BTreeMap::new();
        if let Some(listed) = obj.get("tools") {
            let listed = listed.as_object().ok_or(BudgetError)?;
            if listed.len() > MAX_BUDGET_TOOLS {
                return Err(BudgetError);
            }
            for (name, max) in listed {
                if name.is_empty() || name.chars().count() > MAX_TOOL_NAME {
                    return Err(BudgetError);
                }
                tools.insert(name.clone(), max.as_u64().ok_or(BudgetError)?);
            }
        }
        let call_ceiling = match obj.get("call_ceiling") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_u64().ok_or(BudgetError)?),
        };
        Ok(Self {
            tools,
            call_ceiling,
        })
    }

    /// The budget a run was created with. `None` when it has none — or one that no
    /// longer parses, which must admit nothing either (fail closed).
    pub fn of_run(head: &RunHead) -> Option<Self> {
        head.budget.as_ref().and_then(|v| Self::parse(v).ok())
    }

    /// Starts of `tool` still allowed (0 for a tool the budget does not list).
    pub fn starts_left(&self, usage: &BudgetUsage, tool: &str) -> u64 {
        self.tools
            .get(tool)
            .map_or(0, |max| max.saturating_sub(usage.starts_of(tool)))
    }

    /// Admitted calls still allowed by the ceiling (`None`: no ceiling).
    pub fn calls_left(&self, usage: &BudgetUsage) -> Option<u64> {
        self.call_ceiling
            .map(|ceiling| ceiling.saturating_sub(usage.calls))
    }

    /// Admits one start of `tool`: the usage to store on the head in the same
    /// transaction as the intent, or why not. Checked in the order the issue names them:
    /// listed, starts left, then the run-wide ceiling.
    pub fn admit(&self, usage: &BudgetUsage, tool: &str) -> Result<BudgetUsage, Reason> {
        if !self.tools.contains_key(tool) {
            return Err(Reason::ToolNotInBudget);
        }
        if self.starts_left(usage, tool) == 0 {
            return Err(Reason::BudgetExhausted);
        }
        if self.calls_left(usage) == Some(0) {
            return Err(Reason::CallCeilingReached);
        }
        let mut next = usage.clone();
        *next.starts.entry(tool.to_owned()).or_default() += 1;
        next.calls += 1;
        Ok(next)
    }
}

/// Admission against a run's budget, where a run without one admits nothing.
pub fn admit(
    budget: Option<&Budget>,
    usage: &BudgetUsage,
    tool: &str,
) -> Result<BudgetUsage, Reason> {
    budget.ok_or(Reason::NoBudget)?.admit(usage, tool)
}

/// What a run has used of its budget; kept on the run head (docs/architecture.md §3 "budget, calls
/// used") so that admission is conditioned on the same item as the sequence. Starts are
/// consumed at admission and never given back: a call that ended `not_executed` needs a
/// fresh approval, and that approval grants no extra allowance.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct BudgetUsage {
    /// Admitted starts per tool.
    pub starts: BTreeMap<String, u64>,
    /// Admitted starts over all tools (what `call_ceiling` bounds).
    pub calls: u64,
}

impl BudgetUsage {
    pub fn starts_of(&self, tool: &str) -> u64 {
        self.starts.get(tool).copied().unwrap_or(0)
    }

    /// `{"starts": {"<tool>": n}, "calls": n}`.
    pub fn to_json(&self) -> Value {
        json!({"starts": self.starts, "calls": self.calls})
    }

    /// The stored usage; nothing stored is nothing used.
    pub fn from_json(value: Option<&Value>) -> Result<Self, serde_json::Error> {
        match value {
            None | Some(Value::Null) => Ok(Self::default()),
            Some(v) => serde_json::from_value(v.clone()),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Decisions
// ---------------------------------------------------------------------------------------

/// How the API answers: 200, 409 (with the current state) or 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    Conflict,
    Invalid,
}

/// An answer's verdict and JSON body (errors carry `error`, docs/architecture.md §5).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub verdict: Verdict,
    pub body: Value,
}

/// What a transition decided. When `changed`, the store writes `record` — conditioned
/// on the stored record still being as read — together with `events` (and `usage` on
/// the head, for an admission) in one transaction; otherwise it writes nothing and
/// answers from `record`.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub record: MutationRecord,
    /// Empty when nothing is announced — always when the run is no longer running.
    pub events: Vec<EventDraft>,
    pub changed: bool,
    /// Admission only: the run's budget usage after this start.
    pub usage: Option<BudgetUsage>,
    /// Why the request was refused (409); `None` when it was accepted (200).
    pub refusal: Option<String>,
    /// Answer with `sequence` (of `tool_execution_started`): `start` answers do.
    answers_sequence: bool,
}

impl Decision {
    fn same(record: &MutationRecord, refusal: Option<String>) -> Self {
        Self {
            record: record.clone(),
            events: Vec::new(),
            changed: false,
            usage: None,
            refusal,
            answers_sequence: false,
        }
    }

    /// `record` written, with `events` only while the run is running: seed 000 "No late
    /// worker emits after run_completed or run_failed" (and nothing follows a cancel).
    fn write(record: MutationRecord, events: Vec<EventDraft>, run: RunStatus) -> Self {
        Self {
            record,
            events: if run.is_terminal() {
                Vec::new()
            } else {
                events
            },
            changed: true,
            usage: None,
            refusal: None,
            answers_sequence: false,
        }
    }

    fn refused(mut self, why: impl Into<String>) -> Self {
        self.refusal = Some(why.into());
        self
    }

    pub fn accepted(&self) -> bool {
        self.refusal.is_none()
    }

    /// 200 `{state, sequence?, reason?}` or 409 `{error, state, reason?}`; `reason` only
    /// for `not_executed`, `sequence` only on `start` answers.
    pub fn answer(&self) -> Answer {
        let mut body = Map::new();
        if let Some(why) = &self.refusal {
            body.insert("error".into(), why.clone().into());
        }
        body.insert("state".into(), self.record.state.as_str().into());
        if self.answers_sequence && self.accepted() {
            if let Some(seq) = self.record.started_sequence {
                body.insert("sequence".into(), seq.into());
            }
        }
        if self.record.state == MutationState::NotExecuted {
            if let Some(reason) = self.record.reason {
                body.insert("reason".into(), reason.as_str().into());
            }
        }
        Answer {
            verdict: if self.accepted() {
                Verdict::Ok
            } else {
                Verdict::Conflict
            },
            body: Value::Object(body),
        }
    }
}

/// `POST /api/runs/{id}/tool-calls/{tool_call_id}/start`: `{request_id, approval_id,
/// tool_name, arguments_hash?}` plus the path's run and tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartRequest {
    pub run_id: String,
    pub tool_call_id: String,
    pub request_id: String,
    pub approval_id: String,
    pub tool_name: String,
    pub arguments_hash: Option<String>,
}

impl StartRequest {
    /// Shape checks before anything is read: ids as URL/key-safe as the card's.
    pub fn validate(&self) -> Result<(), StartRefusal> {
        for (field, id) in [
            ("tool_call_id", &self.tool_call_id),
            ("request_id", &self.request_id),
            ("approval_id", &self.approval_id),
        ] {
            if !valid_id(id) {
                return Err(StartRefusal::Invalid(format!(
                    "{field} must be 1 to 128 of [A-Za-z0-9_.:-]"
                )));
            }
        }
        if self.tool_name.is_empty() || self.tool_name.chars().count() > MAX_TOOL_NAME {
            return Err(StartRefusal::Invalid(format!(
                "tool_name must be 1 to {MAX_TOOL_NAME} characters"
            )));
        }
        if self
            .arguments_hash
            .as_ref()
            .is_some_and(|h| h.is_empty() || h.chars().count() > MAX_HASH)
        {
            return Err(StartRefusal::Invalid(format!(
                "arguments_hash must be 1 to {MAX_HASH} characters"
            )));
        }
        Ok(())
    }
}

/// A `start` refused without writing anything.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StartRefusal {
    /// 400: the request is malformed.
    #[error("{0}")]
    Invalid(String),
    /// 400: the request does not name what the card (or the stored attempt) approved.
    #[error("{field} does not match the approved call")]
    Mismatch { field: &'static str },
    /// 400: a policy approved the call, not a human; seed 000: "Automatic approval …
    /// do[es] not produce" `tool_execution_started`.
    #[error(
        "the call was approved automatically by a policy; start admits human-approved calls only"
    )]
    AutoApproved,
    /// 400: `human__ask` is a question to a human, not a mutation.
    #[error("human__ask is answered by a human, not executed; start admits tool calls only")]
    HumanAsk,
    /// 409: the card is still waiting for a human.
    #[error("the approval is still pending")]
    NotApproved(ApprovalState),
    /// 409: another attempt of this tool call blocks a new one (in flight, unknown
    /// until an operator reconciles, or already completed).
    #[error("another attempt of this tool call is {}", .0.state.as_str())]
    Blocked(Box<MutationRecord>),
}

impl StartRefusal {
    /// 400 `{error}` or 409 `{error, state}` (the card's or the blocking attempt's).
    pub fn answer(&self) -> Answer {
        let error = self.to_string();
        match self {
            StartRefusal::Invalid(_)
            | StartRefusal::Mismatch { .. }
            | StartRefusal::AutoApproved
            | StartRefusal::HumanAsk => Answer {
                verdict: Verdict::Invalid,
                body: json!({"error": error}),
            },
            StartRefusal::NotApproved(state) => Answer {
                verdict: Verdict::Conflict,
                body: json!({"error": error, "state": state.as_str()}),
            },
            StartRefusal::Blocked(other) => Answer {
                verdict: Verdict::Conflict,
                body: json!({"error": error, "state": other.state.as_str(),
                             "approval_id": other.approval_id}),
            },
        }
    }
}

/// A bound `arguments_hash` must be repeated exactly: a different one — or none — is
/// not the call that was approved.
fn hash_matches(bound: Option<&str>, given: Option<&str>) -> bool {
    bound.is_none_or(|b| given == Some(b))
}

/// Whether an attempt keeps a new attempt of the same tool call from starting, and how
/// strongly (the strongest blocker is the one answered).
fn blocking_rank(state: MutationState) -> Option<u8> {
    match state {
        // Seed 000: "Unknown outcomes require authoritative reconciliation".
        MutationState::OutcomeUnknown => Some(3),
        // In flight: two attempts of one call must never both reach the transport.
        MutationState::Dispatched => Some(2),
        MutationState::Intent => Some(1),
        // Done: running the same tool call again would be a duplicate mutation.
        MutationState::Completed => Some(0),
        // Seed 000: "confirmed non-execution still requires a fresh approval" — which
        // this attempt, having its own approval_id, is.
        MutationState::NotExecuted => None,
    }
}

/// `start` of an approved call (docs/architecture.md §7). `card` is the card `request_id` names;
/// `attempts` every stored record of `(run_id, tool_call_id)` (this `approval_id`'s
/// included, if any); `usage` the head's budget usage. The event of an admission takes
/// `head.next_seq`: the store commits it conditioned on that head, so the sequence the
/// answer reports is the one the event gets.
pub fn start(
    req: &StartRequest,
    card: &ApprovalRequest,
    head: &RunHead,
    usage: &BudgetUsage,
    attempts: &[MutationRecord],
    settings: &ExecutionSettings,
    now: i64,
) -> Result<Decision, StartRefusal> {
    req.validate()?;
    if req.tool_name == HUMAN_ASK_TOOL {
        return Err(StartRefusal::HumanAsk);
    }
    let attempts = attempts
        .iter()
        .filter(|a| a.run_id == req.run_id && a.tool_call_id == req.tool_call_id);
    let (mine, others): (Vec<_>, Vec<_>) = attempts.partition(|a| a.approval_id == req.approval_id);

    // A repeated start answers from the stored attempt, whatever happened since, and
    // appends nothing — provided it names the same call.
    if let Some(existing) = mine.first() {
        if existing.tool_name != req.tool_name {
            return Err(StartRefusal::Mismatch { field: "tool_name" });
        }
        if !hash_matches(
            existing.arguments_hash.as_deref(),
            req.arguments_hash.as_deref(),
        ) {
            return Err(StartRefusal::Mismatch {
                field: "arguments_hash",
            });
        }
        let mut d = Decision::same(existing, None);
        d.answers_sequence = true;
        if let Some(why) = start_refusal_for(existing) {
            d = d.refused(why);
        }
        return Ok(d);
    }

    // The card must be exactly the approved call.
    let identity = [
        ("run_id", card.run_id == req.run_id),
        ("request_id", card.request_id == req.request_id),
        ("tool_call_id", card.tool_call_id == req.tool_call_id),
        ("approval_id", card.approval_id == req.approval_id),
        ("tool_name", card.tool_name == req.tool_name),
        (
            "arguments_hash",
            hash_matches(
                card.arguments_hash.as_deref(),
                req.arguments_hash.as_deref(),
            ),
        ),
    ];
    if let Some((field, _)) = identity.iter().find(|(_, ok)| !ok) {
        return Err(StartRefusal::Mismatch { field });
    }
    let auto = card.auto_approval.is_some()
        || card
            .decided_by
            .as_deref()
            .is_some_and(|by| by.starts_with(POLICY_DECIDER_PREFIX));
    if auto {
        return Err(StartRefusal::AutoApproved);
    }
    if card.state == ApprovalState::Pending {
        return Err(StartRefusal::NotApproved(ApprovalState::Pending));
    }
    if let Some(blocker) = others
        .into_iter()
        .filter_map(|a| blocking_rank(a.state).map(|rank| (rank, a)))
        .max_by_key(|(rank, _)| *rank)
        .map(|(_, a)| a)
    {
        return Err(StartRefusal::Blocked(Box::new(blocker.clone())));
    }

    let intent = MutationRecord {
        run_id: req.run_id.clone(),
        tool_call_id: req.tool_call_id.clone(),
        approval_id: req.approval_id.clone(),
        request_id: req.request_id.clone(),
        tool_name: req.tool_name.clone(),
        arguments_hash: card
            .arguments_hash
            .clone()
            .or_else(|| req.arguments_hash.clone()),
        state: MutationState::Intent,
        execution_status: None,
        result: None,
        error: None,
        reason: None,
        evidence: None,
        settled_by: None,
        started_sequence: None,
        created_at: now,
        dispatched_at: None,
        settled_at: None,
        settlement_deadline_at: now + settings.settlement_deadline_ms,
        reconciliation: None,
    };

    // Refusals that settle this attempt durably as `not_executed`: a repeated start
    // then answers the same refusal, and another attempt needs a fresh approval.
    let refusal = if head.status.is_terminal() {
        Some(Reason::RunNotRunning)
    } else {
        match card.state {
            ApprovalState::Expired => Some(Reason::ApprovalExpired),
            ApprovalState::Denied => Some(Reason::ApprovalDenied),
            _ => None,
        }
    };
    // Seed 000: `tool_execution_started` comes once after the approval and *before*
    // post-approval admission ("local execution has started, including admission"): a
    // human-approved call announces its start even when admission then refuses it, and
    // the refusal's `tool_execution {not_executed}` follows it in the same transaction.
    // A card that was denied or expired approved nothing, so nothing started.
    let (admitted, started) = match refusal {
        Some(reason) => (Err(reason), false),
        None => (
            admit(Budget::of_run(head).as_ref(), usage, &req.tool_name),
            true,
        ),
    };
    match admitted {
        Err(reason) => {
            let mut record = intent.settled(
                MutationState::NotExecuted,
                ExecutionStatus::NotExecuted,
                Some(reason),
                SettledBy::Admission,
                now,
            );
            let mut events = Vec::new();
            if started {
                record.started_sequence = Some(head.next_seq);
                events.push(record.started_event());
            }
            events.push(record.execution_event());
            let why = start_refusal_for(&record);
            let mut d = Decision::write(record, events, head.status);
            d.answers_sequence = true;
            d.refusal = why;
            Ok(d)
        }
        Ok(next_usage) => {
            let mut record = intent;
            record.started_sequence = Some(head.next_seq);
            let event = record.started_event();
            let mut d = Decision::write(record, vec![event], head.status);
            d.usage = Some(next_usage);
            d.answers_sequence = true;
            Ok(d)
        }
    }
}

/// Which stored states a repeated `start` answers with 409 (docs/architecture.md §5: "refusal 409
/// {state:\"not_executed\", reason}; blocked 409 {state:\"outcome_unknown\"}").
fn start_refusal_for(record: &MutationRecord) -> Option<String> {
    match record.state {
        MutationState::NotExecuted => Some(format!(
            "the call was not executed ({}); a new attempt needs a fresh approval",
            record.reason.map_or("unknown", Reason::as_str)
        )),
        MutationState::OutcomeUnknown => {
            Some("the outcome is unknown; an operator must reconcile it first".into())
        }
        _ => None,
    }
}

/// `dispatch`: `intent → dispatched`, the fence before any transport. Seed 000 /
/// issue: "once a deadline has settled the intent it answers 409 with the state, so
/// the agent must not send". An intent whose deadline has passed (its timer not yet
/// run) is settled here as the timer would; one on a run no longer running is settled
/// `not_executed` (seed: "Cancelled/expired before dispatch → not_executed").
pub fn dispatch(record: &MutationRecord, run: RunStatus, now: i64) -> Decision {
    match record.state {
        MutationState::Intent if run.is_terminal() => {
            let r = record.settled(
                MutationState::NotExecuted,
                ExecutionStatus::NotExecuted,
                Some(Reason::RunNotRunning),
                SettledBy::Admission,
                now,
            );
            Decision::write(r, Vec::new(), run).refused("the run is not running; do not send")
        }
        MutationState::Intent if now >= record.settlement_deadline_at => {
            settle_unsent(record, run, now).refused("the settlement deadline passed; do not send")
        }
        MutationState::Intent => {
            let mut r = record.clone();
            r.state = MutationState::Dispatched;
            r.dispatched_at = Some(now);
            Decision::write(r, Vec::new(), run)
        }
        // docs/architecture.md §5: "409 {state:<current>} when not intent" — a repeated dispatch too:
        // answering 200 twice could let two transports send.
        state => Decision::same(record, None).refused(format!(
            "the call is {}; only an intent can be dispatched — do not send (if this call \
             was never sent, settle it with evidence not_sent)",
            state.as_str()
        )),
    }
}

/// The deadline's settlement of an undispatched intent: seed 000 "An abandoned intent
/// settles as unsent".
fn settle_unsent(record: &MutationRecord, run: RunStatus, now: i64) -> Decision {
    let r = record.settled(
        MutationState::NotExecuted,
        ExecutionStatus::NotExecuted,
        Some(Reason::Unsent),
        SettledBy::Deadline,
        now,
    );
    let event = r.execution_event();
    Decision::write(r, vec![event], run)
}

/// The body of `settle`: `{evidence, result?, error?}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Settlement {
    pub evidence: Evidence,
    pub result: Option<Value>,
    pub error: Option<Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettlementError {
    #[error("evidence must be confirmed, ambiguous or not_sent")]
    UnknownEvidence,
    #[error("result and error together are {0} bytes; the limit is 32768")]
    FactsTooLarge(usize),
    #[error("a not_sent settlement has no result: a result means a response arrived")]
    ResultWithoutSend,
}

impl Settlement {
    /// Checks the body (400 on error). JSON `null` facts are no facts.
    pub fn new(
        evidence: &str,
        result: Option<Value>,
        error: Option<Value>,
    ) -> Result<Self, SettlementError> {
        let evidence = Evidence::parse(evidence).ok_or(SettlementError::UnknownEvidence)?;
        let result = result.filter(|v| !v.is_null());
        let error = error.filter(|v| !v.is_null());
        if evidence == Evidence::NotSent && result.is_some() {
            return Err(SettlementError::ResultWithoutSend);
        }
        let size = [&result, &error]
            .iter()
            .filter_map(|v| v.as_ref())
            .map(|v| serde_json::to_vec(v).map_or(usize::MAX, |b| b.len()))
            .fold(0usize, usize::saturating_add);
        if size > MAX_FACTS_BYTES {
            return Err(SettlementError::FactsTooLarge(size));
        }
        Ok(Self {
            evidence,
            result,
            error,
        })
    }
}

/// Error facts of an ambiguous settlement that named none.
fn ambiguous_error() -> Value {
    json!({"code": "ambiguous", "message": "timeout or transport failure after dispatch"})
}

/// Error facts the deadline records for a dispatched call nobody settled.
fn deadline_error() -> Value {
    json!({"code": "settlement_deadline",
           "message": "dispatched, but not settled before the settlement deadline"})
}

/// The record `evidence` settles `record` in (the terminal decision of seed 000's table).
fn apply_evidence(record: &MutationRecord, s: &Settlement, now: i64) -> MutationRecord {
    let (status, reason) = match s.evidence {
        Evidence::Confirmed => (ExecutionStatus::Executed, None),
        Evidence::Ambiguous => (ExecutionStatus::Executed, Some(Reason::Ambiguous)),
        Evidence::NotSent => (ExecutionStatus::NotExecuted, Some(Reason::NotSent)),
    };
    let mut r = record.settled(s.evidence.outcome(), status, reason, SettledBy::Agent, now);
    r.evidence = Some(s.evidence);
    r.result = s.result.clone();
    r.error = match s.evidence {
        Evidence::Ambiguous => s.error.clone().or_else(|| Some(ambiguous_error())),
        _ => s.error.clone(),
    };
    r
}

/// `settle` with evidence (seed 000's table):
///
/// | evidence | from | terminal execution | record |
/// |---|---|---|---|
/// | `confirmed` | dispatched | `executed`, result/error facts | `completed` |
/// | `ambiguous` | dispatched | `executed`, error facts | `outcome_unknown` |
/// | `not_sent` | intent or dispatched | `not_executed` | `not_executed` (`not_sent`) |
///
/// `confirmed`/`ambiguous` on an intent are refused (dispatch must precede transport).
/// A record the *deadline* settled still takes the agent's real evidence (seed: "an
/// already dispatched call's settlement retains its actual result") without a second
/// terminal event — the stream already has the deadline's (seed: "A terminal stream may
/// therefore precede durable cleanup"). The same settlement again answers the same.
pub fn settle(record: &MutationRecord, s: &Settlement, run: RunStatus, now: i64) -> Decision {
    // `not_sent` past the deadline of a call not yet settled (the deadline's timer is
    // late or lost): the deadline's settlement comes first, as the timer would have
    // written it, and the evidence is judged against that — so a late `not_sent` can
    // never free a call the deadline would have judged possibly sent. Both in one
    // transaction. (A `confirmed` response or an `ambiguous` failure is itself a
    // terminal decision the deadline could only have guessed at: it stands alone.)
    if s.evidence == Evidence::NotSent
        && !record.state.is_settled()
        && now >= record.settlement_deadline_at
    {
        if let Some(deadline) = settle_at_deadline(record, run, now) {
            let mut d = settle(&deadline.record, s, run, now);
            if !d.changed {
                let mut out = deadline;
                out.refusal = d.refusal;
                return out;
            }
            let mut events = deadline.events;
            events.append(&mut d.events);
            d.events = events;
            return d;
        }
    }
    let outcome = s.evidence.outcome();
    match (record.state, record.settled_by) {
        (MutationState::Intent, _) if s.evidence != Evidence::NotSent => {
            Decision::same(record, None)
                .refused("the call was never dispatched; dispatch precedes any transport")
        }
        (MutationState::Intent | MutationState::Dispatched, _) => {
            let r = apply_evidence(record, s, now);
            let event = r.execution_event();
            Decision::write(r, vec![event], run)
        }
        // The agent settling again with the same evidence and facts: the same answer.
        // Other facts are refused: the first settlement's are the ones kept.
        (state, Some(SettledBy::Agent))
            if state == outcome && record.evidence == Some(s.evidence) =>
        {
            let again = apply_evidence(record, s, now);
            if (&again.result, &again.error) == (&record.result, &record.error) {
                Decision::same(record, None)
            } else {
                Decision::same(record, None).refused(format!(
                    "the call is already settled as {} with other facts; the first settlement's are kept",
                    state.as_str()
                ))
            }
        }
        // The deadline recorded `outcome_unknown` for a dispatched call, and that stands
        // until a real response or an operator says otherwise: a `confirmed` settlement
        // (a response was received) replaces it with the actual result, announced on the
        // stream; `ambiguous` agrees with it (nothing changes); `not_sent` cannot be
        // true any more once the deadline judged the call possibly sent — accepting it
        // would free the call for a fresh approval to run it again.
        (MutationState::OutcomeUnknown, Some(SettledBy::Deadline)) => match s.evidence {
            Evidence::Confirmed => {
                let r = apply_evidence(record, s, now);
                let event = r.updated_event(record.state);
                Decision::write(r, vec![event], run)
            }
            Evidence::Ambiguous => Decision::same(record, None),
            Evidence::NotSent => Decision::same(record, None).refused(
                "the settlement deadline recorded outcome_unknown; only a confirmed response or an operator's reconcile changes it",
            ),
        },
        // An intent the deadline settled unsent was never dispatched: only `not_sent`
        // agrees with it.
        (MutationState::NotExecuted, Some(SettledBy::Deadline))
            if s.evidence == Evidence::NotSent =>
        {
            Decision::same(record, None)
        }
        // An operator's reconciliation is authoritative; agreeing evidence answers it.
        (state, Some(SettledBy::Operator))
            if state == outcome && s.evidence != Evidence::Ambiguous =>
        {
            Decision::same(record, None)
        }
        // A remote response arriving after an operator found the change not applied: the
        // call may well have applied, and `not_executed` would let a fresh approval run it
        // again. The response's facts are kept and the record is `outcome_unknown` again
        // (blocking new starts) until an operator reconciles it once more.
        (MutationState::NotExecuted, Some(SettledBy::Operator))
            if s.evidence == Evidence::Confirmed =>
        {
            let mut r = apply_evidence(record, s, now);
            r.state = MutationState::OutcomeUnknown;
            r.execution_status = Some(ExecutionStatus::Executed);
            r.reason = Some(Reason::Contested);
            let event = r.updated_event(record.state);
            Decision::write(r, vec![event], run)
        }
        (state, _) => Decision::same(record, None)
            .refused(format!("the call is already settled as {}", state.as_str())),
    }
}

/// The settlement-deadline timer for `record` at `now`. `None`: not due yet (schedule
/// again for `settlement_deadline_at`). Otherwise: an undispatched intent settles as
/// `not_executed` (`unsent`); a dispatched, unsettled one as `executed` +
/// `outcome_unknown` with error facts; anything settled is left alone.
pub fn settle_at_deadline(record: &MutationRecord, run: RunStatus, now: i64) -> Option<Decision> {
    // A settled record needs no deadline, whenever the timer arrives.
    if now < record.settlement_deadline_at && !record.state.is_settled() {
        return None;
    }
    Some(match record.state {
        MutationState::Intent => settle_unsent(record, run, now),
        MutationState::Dispatched => {
            let mut r = record.settled(
                MutationState::OutcomeUnknown,
                ExecutionStatus::Executed,
                Some(Reason::SettlementDeadline),
                SettledBy::Deadline,
                now,
            );
            r.error = Some(deadline_error());
            let event = r.execution_event();
            Decision::write(r, vec![event], run)
        }
        _ => Decision::same(record, None),
    })
}

/// An operator's reconciliation of an `outcome_unknown` mutation (`{observed}`):
/// `applied` → `completed`, `not_applied` → `not_executed` (after which only a fresh
/// approval starts the call again). Only from `outcome_unknown`; the same observation
/// again answers the same; anything else is 409 with the state.
pub fn reconcile(
    record: &MutationRecord,
    observed: Observed,
    by: &str,
    run: RunStatus,
    now: i64,
) -> Decision {
    // Past its deadline but never settled (the deadline's timer was lost): settled here
    // as the timer would have — an intent `not_executed` (nothing to reconcile), a
    // dispatched call `outcome_unknown`, which this reconciliation then resolves, both
    // announced in the one transaction.
    if !record.state.is_settled() {
        if let Some(deadline) = settle_at_deadline(record, run, now) {
            if deadline.record.state != MutationState::OutcomeUnknown {
                return deadline;
            }
            let mut d = reconcile(&deadline.record, observed, by, run, now);
            let mut events = deadline.events;
            events.append(&mut d.events);
            d.events = events;
            return d;
        }
    }
    match (record.state, &record.reconciliation) {
        (MutationState::OutcomeUnknown, _) => {
            let (state, reason) = match observed {
                Observed::Applied => (MutationState::Completed, Reason::ReconciledApplied),
                Observed::NotApplied => (MutationState::NotExecuted, Reason::ReconciledNotApplied),
            };
            // It was sent: `executed` stays the execution decision; the state says
            // whether it took effect.
            let mut r = record.settled(
                state,
                ExecutionStatus::Executed,
                Some(reason),
                SettledBy::Operator,
                now,
            );
            r.reconciliation = Some(Reconciliation {
                observed,
                by: by.to_owned(),
                at: now,
            });
            let events = r.reconciled_event().into_iter().collect();
            Decision::write(r, events, run)
        }
        (_, Some(done)) if done.observed == observed => Decision::same(record, None),
        (state, _) => Decision::same(record, None).refused(format!(
            "the call is {}; only an outcome_unknown mutation is reconciled",
            state.as_str()
        )),
    }
}

/// Heartbeat number `beat` for a dispatched mutation awaiting its settlement: the event
/// to append, or `None` once it is settled (seed: none after settlement), past its
/// deadline (the deadline settles it instead), or on a run that is no longer running.
pub fn execution_heartbeat(
    record: &MutationRecord,
    beat: u32,
    run: RunStatus,
    now: i64,
) -> Option<EventDraft> {
    (record.state == MutationState::Dispatched
        && !run.is_terminal()
        && now < record.settlement_deadline_at)
        .then(|| record.heartbeat_event(beat))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approval::{AutoApproval, Resolution, Scope};
    use crate::run::NewRun;

    const T0: i64 = 1_000_000;

    fn settings() -> ExecutionSettings {
        ExecutionSettings::default()
    }

    fn head_with(budget: Option<Value>) -> RunHead {
        let mut head = NewRun {
            run_id: "run-1".into(),
            channel_id: Some("C1".into()),
            budget,
            ..NewRun::default()
        }
        .head(0);
        head.next_seq = 5;
        head
    }

    fn head() -> RunHead {
        head_with(Some(
            json!({"tools": {"mcp__last9__create_dashboard": 2, "web_fetch": 1}, "call_ceiling": 5}),
        ))
    }

    fn pending_card() -> ApprovalRequest {
        ApprovalRequest {
            run_id: "run-1".into(),
            request_id: "req-1".into(),
            tool_name: "mcp__last9__create_dashboard".into(),
            tool_call_id: "write-1".into(),
            approval_id: "approval-1".into(),
            explicit_ids: true,
            url: None,
            intention: None,
            message: None,
            arguments_hash: Some("sha256:abc".into()),
            state: ApprovalState::Pending,
            scope: None,
            decided_by: None,
            decided_at: None,
            created_at: 0,
            expires_at: 300_000,
            coordinator_run_id: None,
            subtask_id: None,
            project_id: None,
            end_reason: None,
            auto_approval: None,
            held_by_pod: false,
        }
    }

    fn card() -> ApprovalRequest {
        pending_card().resolved(
            &Resolution::Approved {
                scope: Scope::Once,
                by: "alice".into(),
            },
            10,
        )
    }

    fn req() -> StartRequest {
        StartRequest {
            run_id: "run-1".into(),
            tool_call_id: "write-1".into(),
            request_id: "req-1".into(),
            approval_id: "approval-1".into(),
            tool_name: "mcp__last9__create_dashboard".into(),
            arguments_hash: Some("sha256:abc".into()),
        }
    }

    fn started() -> Decision {
        start(
            &req(),
            &card(),
            &head(),
            &BudgetUsage::default(),
            &[],
            &settings(),
            T0,
        )
        .unwrap()
    }

    fn intent() -> MutationRecord {
        started().record
    }

    fn dispatched() -> MutationRecord {
        dispatch(&intent(), RunStatus::Running, T0 + 1_000).record
    }

    fn confirmed(result: Value) -> Settlement {
        Settlement::new("confirmed", Some(result), None).unwrap()
    }

    fn ambiguous() -> Settlement {
        Settlement::new("ambiguous", None, Some(json!({"code": "timeout"}))).unwrap()
    }

    fn not_sent() -> Settlement {
        Settlement::new("not_sent", None, None).unwrap()
    }

    fn payload(d: &EventDraft) -> String {
        Value::Object(d.payload.clone()).to_string()
    }

    type Change = Box<dyn Fn(&mut StartRequest)>;

    // --- start ---------------------------------------------------------------------

    #[test]
    fn a_human_approved_call_starts_once_with_the_seed_event() {
        // GIVEN a human-approved card and a budget that lists the tool
        // WHEN the agent starts the call
        let d = started();
        // THEN an intent is written with tool_execution_started at the head's next sequence
        assert!(d.changed && d.accepted());
        assert_eq!(d.record.state, MutationState::Intent);
        assert_eq!(d.record.started_sequence, Some(5));
        assert_eq!(d.record.arguments_hash.as_deref(), Some("sha256:abc"));
        assert_eq!(d.record.settlement_deadline_at, T0 + 60_000);
        assert_eq!(d.events.len(), 1);
        assert_eq!(d.events[0].event_type, "tool_execution_started");
        assert_eq!(d.events[0].event_id, None);
        // Exactly the seed's payload, in the seed's order.
        assert_eq!(
            payload(&d.events[0]),
            r#"{"tool_name":"mcp__last9__create_dashboard","tool_call_id":"write-1","approval_id":"approval-1"}"#
        );
        // And the rendered event is the seed's line plus the envelope's timestamp.
        let body: Value =
            serde_json::from_str(&crate::render_event(&head(), 5, &d.events[0], 0)).unwrap();
        assert_eq!(
            body,
            json!({"protocol_version":"v2","sequence":5,"run_id":"run-1","channel_id":"C1",
                   "type":"tool_execution_started","tool_name":"mcp__last9__create_dashboard",
                   "tool_call_id":"write-1","approval_id":"approval-1",
                   "timestamp_utc":"1970-01-01T00:00:00.000Z"})
        );
        // The budget use is written with it.
        let usage = d.usage.clone().unwrap();
        assert_eq!(usage.starts_of("mcp__last9__create_dashboard"), 1);
        assert_eq!(usage.calls, 1);
        assert_eq!(
            d.answer(),
            Answer {
                verdict: Verdict::Ok,
                body: json!({"state": "intent", "sequence": 5})
            }
        );
    }

    #[test]
    fn a_repeated_start_answers_the_same_without_an_event() {
        let first = started();
        let again = start(
            &req(),
            &card(),
            &head_with(None),
            &first.usage.clone().unwrap(),
            std::slice::from_ref(&first.record),
            &settings(),
            T0 + 5,
        )
        .unwrap();
        assert!(!again.changed);
        assert!(again.events.is_empty());
        assert_eq!(again.usage, None, "no second start is counted");
        assert_eq!(again.record, first.record);
        assert_eq!(again.answer(), first.answer());
        // Later, after dispatch, the repeat still answers 200 with the original sequence.
        let later = start(
            &req(),
            &card(),
            &head(),
            &BudgetUsage::default(),
            &[dispatched()],
            &settings(),
            T0 + 9,
        )
        .unwrap();
        assert!(!later.changed && later.events.is_empty());
        assert_eq!(
            later.answer().body,
            json!({"state": "dispatched", "sequence": 5})
        );
    }

    #[test]
    fn a_repeat_naming_another_call_is_refused() {
        let stored = intent();
        let mut other_hash = req();
        other_hash.arguments_hash = Some("sha256:zzz".into());
        assert_eq!(
            start(
                &other_hash,
                &card(),
                &head(),
                &BudgetUsage::default(),
                std::slice::from_ref(&stored),
                &settings(),
                T0
            ),
            Err(StartRefusal::Mismatch {
                field: "arguments_hash"
            })
        );
        let mut other_tool = req();
        other_tool.tool_name = "web_fetch".into();
        assert_eq!(
            start(
                &other_tool,
                &card(),
                &head(),
                &BudgetUsage::default(),
                &[stored],
                &settings(),
                T0
            ),
            Err(StartRefusal::Mismatch { field: "tool_name" })
        );
    }

    #[test]
    fn the_card_must_be_the_approved_call() {
        let cases: Vec<(&str, Change)> = vec![
            (
                "tool_call_id",
                Box::new(|r| r.tool_call_id = "write-2".into()),
            ),
            (
                "approval_id",
                Box::new(|r| r.approval_id = "approval-2".into()),
            ),
            ("tool_name", Box::new(|r| r.tool_name = "web_fetch".into())),
            (
                "arguments_hash",
                Box::new(|r| r.arguments_hash = Some("sha256:other".into())),
            ),
            ("arguments_hash", Box::new(|r| r.arguments_hash = None)),
            ("run_id", Box::new(|r| r.run_id = "run-2".into())),
            ("request_id", Box::new(|r| r.request_id = "req-2".into())),
        ];
        for (field, change) in cases {
            let mut r = req();
            change(&mut r);
            let refusal = start(
                &r,
                &card(),
                &head(),
                &BudgetUsage::default(),
                &[],
                &settings(),
                T0,
            )
            .unwrap_err();
            assert_eq!(refusal, StartRefusal::Mismatch { field }, "{field}");
            assert_eq!(refusal.answer().verdict, Verdict::Invalid);
        }
        // A card without a hash binds the one start names.
        let mut unhashed = card();
        unhashed.arguments_hash = None;
        let mut r = req();
        r.arguments_hash = Some("sha256:given".into());
        let d = start(
            &r,
            &unhashed,
            &head(),
            &BudgetUsage::default(),
            &[],
            &settings(),
            T0,
        )
        .unwrap();
        assert_eq!(d.record.arguments_hash.as_deref(), Some("sha256:given"));
        r.arguments_hash = None;
        let d = start(
            &r,
            &unhashed,
            &head(),
            &BudgetUsage::default(),
            &[],
            &settings(),
            T0,
        )
        .unwrap();
        assert!(d.accepted());
        assert_eq!(d.record.arguments_hash, None);
    }

    #[test]
    fn malformed_requests_are_invalid() {
        for change in [
            |r: &mut StartRequest| r.tool_call_id = "a/b".into(),
            |r: &mut StartRequest| r.approval_id = String::new(),
            |r: &mut StartRequest| r.tool_name = String::new(),
            |r: &mut StartRequest| r.arguments_hash = Some("h".repeat(MAX_HASH + 1)),
        ] {
            let mut r = req();
            change(&mut r);
            let refusal = start(
                &r,
                &card(),
                &head(),
                &BudgetUsage::default(),
                &[],
                &settings(),
                T0,
            )
            .unwrap_err();
            assert!(matches!(refusal, StartRefusal::Invalid(_)), "{refusal:?}");
        }
    }

    #[test]
    fn human_ask_never_starts() {
        let mut ask = card();
        ask.tool_name = HUMAN_ASK_TOOL.into();
        let mut r = req();
        r.tool_name = HUMAN_ASK_TOOL.into();
        let head = head_with(Some(json!({"tools": {"human__ask": 5}})));
        let refusal = start(
            &r,
            &ask,
            &head,
            &BudgetUsage::default(),
            &[],
            &settings(),
            T0,
        )
        .unwrap_err();
        assert_eq!(refusal, StartRefusal::HumanAsk);
        assert_eq!(refusal.answer().verdict, Verdict::Invalid);
    }

    #[test]
    fn auto_approved_calls_never_start() {
        let mut auto = card();
        auto.auto_approval = Some(AutoApproval {
            policy_id: "p".into(),
            sequence: 3,
        });
        let refusal = start(
            &req(),
            &auto,
            &head(),
            &BudgetUsage::default(),
            &[],
            &settings(),
            T0,
        )
        .unwrap_err();
        assert_eq!(refusal, StartRefusal::AutoApproved);
        assert_eq!(refusal.answer().verdict, Verdict::Invalid);
        // Recognised by its decider as well, should the marker be missing.
        let mut by_policy = card();
        by_policy.decided_by = Some(format!("{POLICY_DECIDER_PREFIX}abc"));
        assert_eq!(
            start(
                &req(),
                &by_policy,
                &head(),
                &BudgetUsage::default(),
                &[],
                &settings(),
                T0
            ),
            Err(StartRefusal::AutoApproved)
        );
    }

    #[test]
    fn a_pending_card_is_refused_without_burning_the_approval() {
        let refusal = start(
            &req(),
            &pending_card(),
            &head(),
            &BudgetUsage::default(),
            &[],
            &settings(),
            T0,
        )
        .unwrap_err();
        assert_eq!(refusal, StartRefusal::NotApproved(ApprovalState::Pending));
        let a = refusal.answer();
        assert_eq!(a.verdict, Verdict::Conflict);
        assert_eq!(a.body["state"], "pending");
        assert!(a.body["error"].is_string());
    }

    #[test]
    fn expired_and_denied_cards_are_recorded_not_executed_without_a_start_event() {
        for (resolution, reason) in [
            (Resolution::Expired, "approval_expired"),
            (Resolution::Denied { by: "bob".into() }, "approval_denied"),
        ] {
            let c = pending_card().resolved(&resolution, 10);
            let d = start(
                &req(),
                &c,
                &head(),
                &BudgetUsage::default(),
                &[],
                &settings(),
                T0,
            )
            .unwrap();
            assert!(d.changed && !d.accepted());
            assert_eq!(d.usage, None);
            assert_eq!(d.record.state, MutationState::NotExecuted);
            assert_eq!(d.events.len(), 1);
            assert_eq!(d.events[0].event_type, "tool_execution");
            assert!(d
                .events
                .iter()
                .all(|e| e.event_type != "tool_execution_started"));
            assert_eq!(
                Value::Object(d.events[0].payload.clone()),
                json!({"tool_name":"mcp__last9__create_dashboard","tool_call_id":"write-1",
                       "approval_id":"approval-1","execution_status":"not_executed",
                       "mutation_outcome":"not_executed","reason":reason})
            );
            let a = d.answer();
            assert_eq!(a.verdict, Verdict::Conflict);
            assert_eq!(a.body["state"], "not_executed");
            assert_eq!(a.body["reason"], reason);
            assert_eq!(a.body.get("sequence"), None);
        }
    }

    #[test]
    fn budget_refusals_are_recorded_with_their_reason() {
        let tool = "mcp__last9__create_dashboard";
        let used = |starts: u64, calls: u64| BudgetUsage {
            starts: [(tool.to_owned(), starts)].into(),
            calls,
        };
        let cases = [
            (head_with(None), used(0, 0), "no_budget"),
            (
                head_with(Some(json!({"tools": {"web_fetch": 3}}))),
                used(0, 0),
                "tool_not_in_budget",
            ),
            (head_with(Some(json!({}))), used(0, 0), "tool_not_in_budget"),
            (head(), used(2, 2), "budget_exhausted"),
            (
                head_with(Some(json!({"tools": {tool: 0}}))),
                used(0, 0),
                "budget_exhausted",
            ),
            (head(), used(1, 5), "call_ceiling_reached"),
            (
                head_with(Some(json!({"tools": {tool: 9}, "call_ceiling": 0}))),
                used(0, 0),
                "call_ceiling_reached",
            ),
            // A stored budget that no longer parses admits nothing.
            (
                head_with(Some(json!({"tools": {tool: "many"}}))),
                used(0, 0),
                "no_budget",
            ),
        ];
        for (h, usage, reason) in cases {
            let d = start(&req(), &card(), &h, &usage, &[], &settings(), T0).unwrap();
            assert_eq!(d.record.state, MutationState::NotExecuted, "{reason}");
            assert_eq!(d.record.reason.map(Reason::as_str), Some(reason));
            assert_eq!(d.record.settled_by, Some(SettledBy::Admission));
            assert_eq!(d.usage, None, "a refusal uses nothing");
            // Seed 000: the start comes before admission, the refusal right after it.
            assert_eq!(d.events.len(), 2);
            assert_eq!(d.events[0].event_type, "tool_execution_started");
            assert_eq!(d.record.started_sequence, Some(h.next_seq));
            assert_eq!(d.events[1].payload["execution_status"], "not_executed");
            assert_eq!(d.events[1].payload["reason"], reason);
            assert_eq!(d.answer().body["reason"], reason);
            // A repeat answers the same refusal without a new event.
            let again = start(
                &req(),
                &card(),
                &h,
                &usage,
                std::slice::from_ref(&d.record),
                &settings(),
                T0 + 1,
            )
            .unwrap();
            assert!(!again.changed && again.events.is_empty());
            assert_eq!(again.answer(), d.answer());
        }
    }

    #[test]
    fn a_start_on_an_ended_run_is_recorded_but_announces_nothing() {
        for status in [
            RunStatus::Cancelled,
            RunStatus::Completed,
            RunStatus::Failed,
        ] {
            let mut h = head();
            h.status = status;
            let d = start(
                &req(),
                &card(),
                &h,
                &BudgetUsage::default(),
                &[],
                &settings(),
                T0,
            )
            .unwrap();
            assert!(d.changed);
            assert_eq!(d.record.reason, Some(Reason::RunNotRunning));
            assert!(
                d.events.is_empty(),
                "no event after the run's terminal event"
            );
            assert_eq!(d.answer().body["reason"], "run_not_running");
        }
    }

    #[test]
    fn outcome_unknown_blocks_new_starts_until_reconciled() {
        let unknown = settle(&dispatched(), &ambiguous(), RunStatus::Running, T0 + 2_000).record;
        let mut fresh = req();
        fresh.approval_id = "approval-2".into();
        fresh.request_id = "req-2".into();
        let mut fresh_card = card();
        fresh_card.approval_id = "approval-2".into();
        fresh_card.request_id = "req-2".into();
        let refusal = start(
            &fresh,
            &fresh_card,
            &head(),
            &BudgetUsage::default(),
            std::slice::from_ref(&unknown),
            &settings(),
            T0 + 3_000,
        )
        .unwrap_err();
        assert!(
            matches!(&refusal, StartRefusal::Blocked(r) if r.state == MutationState::OutcomeUnknown)
        );
        assert_eq!(refusal.answer().verdict, Verdict::Conflict);
        assert_eq!(refusal.answer().body["state"], "outcome_unknown");
        // The same attempt repeated is blocked too (409 outcome_unknown, nothing written).
        let same = start(
            &req(),
            &card(),
            &head(),
            &BudgetUsage::default(),
            std::slice::from_ref(&unknown),
            &settings(),
            T0 + 3_000,
        )
        .unwrap();
        assert!(!same.changed);
        assert_eq!(same.answer().verdict, Verdict::Conflict);
        assert_eq!(same.answer().body["state"], "outcome_unknown");
        // Reconciled not applied: a fresh approval may start it again.
        let not_applied = reconcile(
            &unknown,
            Observed::NotApplied,
            "op",
            RunStatus::Running,
            T0 + 4_000,
        )
        .record;
        let d = start(
            &fresh,
            &fresh_card,
            &head(),
            &BudgetUsage::default(),
            std::slice::from_ref(&not_applied),
            &settings(),
            T0 + 5_000,
        )
        .unwrap();
        assert!(d.accepted() && d.changed);
        assert_eq!(d.events[0].event_type, "tool_execution_started");
        // Reconciled applied: it happened, so the same tool call is not run again.
        let applied = reconcile(
            &unknown,
            Observed::Applied,
            "op",
            RunStatus::Running,
            T0 + 4_000,
        )
        .record;
        assert!(matches!(
            start(&fresh, &fresh_card, &head(), &BudgetUsage::default(), &[applied], &settings(), T0 + 5_000),
            Err(StartRefusal::Blocked(r)) if r.state == MutationState::Completed
        ));
    }

    #[test]
    fn confirmed_non_execution_needs_a_fresh_approval() {
        let not_executed = settle(&intent(), &not_sent(), RunStatus::Running, T0 + 1).record;
        // The same approval again: the refusal it already has.
        let again = start(
            &req(),
            &card(),
            &head(),
            &BudgetUsage::default(),
            std::slice::from_ref(&not_executed),
            &settings(),
            T0 + 2,
        )
        .unwrap();
        assert!(!again.changed && !again.accepted());
        assert_eq!(
            again.answer().body,
            json!({"error": again.refusal.clone().unwrap(), "state": "not_executed", "reason": "not_sent"})
        );
        // A fresh approval (new approval_id) is a new attempt.
        let mut fresh = req();
        fresh.approval_id = "approval-2".into();
        let mut fresh_card = card();
        fresh_card.approval_id = "approval-2".into();
        let d = start(
            &fresh,
            &fresh_card,
            &head(),
            &BudgetUsage::default(),
            &[not_executed],
            &settings(),
            T0 + 3,
        )
        .unwrap();
        assert_eq!(d.record.state, MutationState::Intent);
        assert_eq!(d.record.approval_id, "approval-2");
    }

    #[test]
    fn an_attempt_in_flight_blocks_another() {
        let mut fresh = req();
        fresh.approval_id = "approval-2".into();
        let mut fresh_card = card();
        fresh_card.approval_id = "approval-2".into();
        for (stored, state) in [(intent(), "intent"), (dispatched(), "dispatched")] {
            let refusal = start(
                &fresh,
                &fresh_card,
                &head(),
                &BudgetUsage::default(),
                &[stored],
                &settings(),
                T0,
            )
            .unwrap_err();
            assert_eq!(refusal.answer().body["state"], state);
            assert_eq!(refusal.answer().body["approval_id"], "approval-1");
        }
        // The strongest blocker is the one answered.
        let unknown = settle_at_deadline(&dispatched(), RunStatus::Running, T0 + 60_000)
            .unwrap()
            .record;
        let mut third = intent();
        third.approval_id = "approval-0".into();
        let refusal = start(
            &fresh,
            &fresh_card,
            &head(),
            &BudgetUsage::default(),
            &[third, unknown],
            &settings(),
            T0,
        )
        .unwrap_err();
        assert_eq!(refusal.answer().body["state"], "outcome_unknown");
        // Attempts of other tool calls do not block.
        let mut elsewhere = dispatched();
        elsewhere.tool_call_id = "write-9".into();
        assert!(start(
            &fresh,
            &fresh_card,
            &head(),
            &BudgetUsage::default(),
            &[elsewhere],
            &settings(),
            T0
        )
        .is_ok());
    }

    // --- dispatch ------------------------------------------------------------------

    #[test]
    fn dispatch_moves_intent_to_dispatched_without_an_event() {
        let d = dispatch(&intent(), RunStatus::Running, T0 + 1_000);
        assert!(d.changed && d.accepted());
        assert!(d.events.is_empty());
        assert_eq!(d.record.state, MutationState::Dispatched);
        assert_eq!(d.record.dispatched_at, Some(T0 + 1_000));
        assert_eq!(
            d.answer(),
            Answer {
                verdict: Verdict::Ok,
                body: json!({"state": "dispatched"})
            }
        );
    }

    #[test]
    fn a_repeated_dispatch_is_refused_with_the_state() {
        let d = dispatch(&dispatched(), RunStatus::Running, T0 + 2_000);
        assert!(!d.changed && !d.accepted());
        assert_eq!(d.answer().verdict, Verdict::Conflict);
        assert_eq!(d.answer().body["state"], "dispatched");
        for settled in [
            settle(
                &dispatched(),
                &confirmed(json!({"id": 1})),
                RunStatus::Running,
                T0 + 2_000,
            )
            .record,
            settle(&dispatched(), &ambiguous(), RunStatus::Running, T0 + 2_000).record,
        ] {
            let d = dispatch(&settled, RunStatus::Running, T0 + 3_000);
            assert!(!d.changed);
            assert_eq!(d.answer().body["state"], settled.state.as_str());
        }
    }

    #[test]
    fn dispatch_after_the_deadline_settled_the_intent_is_refused() {
        // GIVEN the deadline timer settled the intent as unsent
        let unsent = settle_at_deadline(&intent(), RunStatus::Running, T0 + 60_000)
            .unwrap()
            .record;
        // WHEN the agent dispatches late THEN 409 with the state; nothing written
        let d = dispatch(&unsent, RunStatus::Running, T0 + 61_000);
        assert!(!d.changed && !d.accepted());
        assert_eq!(d.answer().body["state"], "not_executed");
        assert_eq!(d.answer().body["reason"], "unsent");
    }

    #[test]
    fn dispatch_past_the_deadline_settles_as_the_timer_would() {
        // GIVEN the deadline passed but its timer has not run yet
        let d = dispatch(&intent(), RunStatus::Running, T0 + 60_000);
        // THEN the intent settles unsent now, announced, and the agent must not send
        assert!(d.changed && !d.accepted());
        assert_eq!(d.record.reason, Some(Reason::Unsent));
        assert_eq!(d.record.settled_by, Some(SettledBy::Deadline));
        assert_eq!(d.events.len(), 1);
        assert_eq!(d.events[0].payload["mutation_outcome"], "not_executed");
        // and the timer, when it runs, finds nothing to do
        let late_timer = settle_at_deadline(&d.record, RunStatus::Running, T0 + 61_000).unwrap();
        assert!(!late_timer.changed && late_timer.events.is_empty());
    }

    #[test]
    fn dispatch_on_an_ended_run_settles_not_executed_silently() {
        let d = dispatch(&intent(), RunStatus::Cancelled, T0 + 1_000);
        assert!(d.changed && !d.accepted());
        assert!(d.events.is_empty());
        assert_eq!(d.record.state, MutationState::NotExecuted);
        assert_eq!(d.answer().body["reason"], "run_not_running");
    }

    // --- settle: one test per row of the seed's evidence table -----------------------

    #[test]
    fn confirmed_response_completes_with_its_result_facts() {
        let d = settle(
            &dispatched(),
            &confirmed(json!({"dashboard_id": "d-1"})),
            RunStatus::Running,
            T0 + 2_000,
        );
        assert!(d.changed && d.accepted());
        assert_eq!(d.record.state, MutationState::Completed);
        assert_eq!(d.events.len(), 1);
        assert_eq!(
            payload(&d.events[0]),
            r#"{"tool_name":"mcp__last9__create_dashboard","tool_call_id":"write-1","approval_id":"approval-1","execution_status":"executed","mutation_outcome":"completed","result":{"dashboard_id":"d-1"}}"#
        );
        assert_eq!(
            d.record.to_json(),
            json!({"schema":"mutation_outcome/v1","run_id":"run-1","tool_call_id":"write-1",
                   "approval_id":"approval-1","tool_name":"mcp__last9__create_dashboard",
                   "state":"completed","execution_status":"executed",
                   "result":{"dashboard_id":"d-1"}})
        );
        assert_eq!(
            d.answer(),
            Answer {
                verdict: Verdict::Ok,
                body: json!({"state": "completed"})
            }
        );
        // A remote error response is confirmed too: its error facts are kept.
        let err = Settlement::new("confirmed", None, Some(json!({"status": 422}))).unwrap();
        let d = settle(&dispatched(), &err, RunStatus::Running, T0 + 2_000);
        assert_eq!(d.record.state, MutationState::Completed);
        assert_eq!(d.record.to_json()["error"], json!({"status": 422}));
        assert_eq!(d.events[0].payload["error"], json!({"status": 422}));
    }

    #[test]
    fn dispatched_timeout_is_executed_with_error_facts_and_outcome_unknown() {
        let d = settle(&dispatched(), &ambiguous(), RunStatus::Running, T0 + 2_000);
        assert!(d.changed && d.accepted());
        assert_eq!(
            Value::Object(d.events[0].payload.clone()),
            json!({"tool_name":"mcp__last9__create_dashboard","tool_call_id":"write-1",
                   "approval_id":"approval-1","execution_status":"executed",
                   "mutation_outcome":"outcome_unknown","error":{"code":"timeout"},
                   "reason":"ambiguous"})
        );
        assert_eq!(
            d.record.to_json(),
            json!({"schema":"mutation_outcome/v1","run_id":"run-1","tool_call_id":"write-1",
                   "approval_id":"approval-1","tool_name":"mcp__last9__create_dashboard",
                   "state":"outcome_unknown","execution_status":"executed",
                   "error":{"code":"timeout"},"reason":"ambiguous"})
        );
        // Without error facts from the agent, the record still carries some.
        let bare = Settlement::new("ambiguous", None, None).unwrap();
        let d = settle(&dispatched(), &bare, RunStatus::Running, T0 + 2_000);
        assert_eq!(d.record.error.as_ref().unwrap()["code"], "ambiguous");
    }

    #[test]
    fn not_sent_is_not_executed_before_or_after_dispatch() {
        for from in [intent(), dispatched()] {
            let d = settle(&from, &not_sent(), RunStatus::Running, T0 + 2_000);
            assert!(d.changed && d.accepted());
            assert_eq!(
                d.record.to_json(),
                json!({"schema":"mutation_outcome/v1","run_id":"run-1","tool_call_id":"write-1",
                       "approval_id":"approval-1","tool_name":"mcp__last9__create_dashboard",
                       "state":"not_executed","execution_status":"not_executed",
                       "reason":"not_sent"})
            );
            assert_eq!(d.events[0].payload["execution_status"], "not_executed");
            assert_eq!(
                d.answer().body,
                json!({"state": "not_executed", "reason": "not_sent"})
            );
        }
    }

    #[test]
    fn response_received_but_deadline_first_stays_unresolved_until_the_settlement_lands() {
        // Seed row 4: the deadline fires first → outcome_unknown, announced once …
        let by_deadline =
            settle_at_deadline(&dispatched(), RunStatus::Running, T0 + 60_000).unwrap();
        assert_eq!(by_deadline.record.state, MutationState::OutcomeUnknown);
        assert_eq!(by_deadline.events.len(), 1);
        assert_eq!(
            Value::Object(by_deadline.events[0].payload.clone()),
            json!({"tool_name":"mcp__last9__create_dashboard","tool_call_id":"write-1",
                   "approval_id":"approval-1","execution_status":"executed",
                   "mutation_outcome":"outcome_unknown",
                   "error":{"code":"settlement_deadline",
                            "message":"dispatched, but not settled before the settlement deadline"},
                   "reason":"settlement_deadline"})
        );
        // … then the late settlement records the actual result: no second terminal event,
        // but the change is announced (`tool_execution_updated`), so the stream and the
        // record agree.
        let late = settle(
            &by_deadline.record,
            &confirmed(json!({"ok": true})),
            RunStatus::Running,
            T0 + 70_000,
        );
        assert!(late.changed && late.accepted());
        assert_eq!(late.events.len(), 1);
        assert_eq!(late.events[0].event_type, "tool_execution_updated");
        assert_eq!(
            Value::Object(late.events[0].payload.clone()),
            json!({"tool_name":"mcp__last9__create_dashboard","tool_call_id":"write-1",
                   "approval_id":"approval-1","mutation_outcome":"completed",
                   "previous_outcome":"outcome_unknown","evidence":"confirmed",
                   "execution_status":"executed","result":{"ok":true}})
        );
        // On an ended run the record still takes the response, silently.
        let ended = settle(
            &by_deadline.record,
            &confirmed(json!({"ok": true})),
            RunStatus::Completed,
            T0 + 70_000,
        );
        assert!(ended.changed && ended.events.is_empty());
        assert_eq!(late.record.state, MutationState::Completed);
        assert_eq!(late.record.result, Some(json!({"ok": true})));
        assert_eq!(late.record.error, None, "the deadline's guess is replaced");
        assert_eq!(late.record.reason, None);
        assert_eq!(late.record.settled_by, Some(SettledBy::Agent));
        // A late ambiguous settlement agrees with the deadline: nothing changes.
        let late = settle(
            &by_deadline.record,
            &ambiguous(),
            RunStatus::Running,
            T0 + 70_000,
        );
        assert!(!late.changed && late.accepted() && late.events.is_empty());
        assert_eq!(late.record, by_deadline.record);
        // A late not_sent cannot overwrite the recorded outcome_unknown (it would free
        // the call for a fresh approval to run again): 409 with the state, nothing written.
        let late = settle(
            &by_deadline.record,
            &not_sent(),
            RunStatus::Running,
            T0 + 70_000,
        );
        assert!(!late.changed && !late.accepted());
        assert_eq!(late.record.state, MutationState::OutcomeUnknown);
        assert_eq!(late.answer().body["state"], "outcome_unknown");
        // After a late settlement, only the same settlement answers the same.
        let done = settle(
            &by_deadline.record,
            &confirmed(json!({"ok": true})),
            RunStatus::Running,
            T0 + 70_000,
        )
        .record;
        assert!(
            !settle(
                &done,
                &confirmed(json!({"ok": true})),
                RunStatus::Running,
                T0 + 80_000
            )
            .changed
        );
        assert!(!settle(&done, &ambiguous(), RunStatus::Running, T0 + 80_000).accepted());
    }

    #[test]
    fn settling_before_the_timer_runs_beats_the_deadline() {
        // GIVEN the deadline instant passed but its timer has not run
        let d = settle(
            &dispatched(),
            &confirmed(json!(1)),
            RunStatus::Running,
            T0 + 65_000,
        );
        // THEN the agent's evidence is the terminal decision, announced
        assert_eq!(d.record.state, MutationState::Completed);
        assert_eq!(d.events.len(), 1);
        // and the timer finds it settled
        let timer = settle_at_deadline(&d.record, RunStatus::Running, T0 + 66_000).unwrap();
        assert!(!timer.changed && timer.events.is_empty());
        assert_eq!(timer.record.state, MutationState::Completed);
    }

    #[test]
    fn an_intent_cannot_be_settled_as_sent() {
        for s in [confirmed(json!(1)), ambiguous()] {
            let d = settle(&intent(), &s, RunStatus::Running, T0 + 1);
            assert!(!d.changed && !d.accepted());
            assert_eq!(d.answer().body["state"], "intent");
        }
        // Nor an intent the deadline settled unsent (it was never dispatched).
        let unsent = settle_at_deadline(&intent(), RunStatus::Running, T0 + 60_000)
            .unwrap()
            .record;
        let d = settle(
            &unsent,
            &confirmed(json!(1)),
            RunStatus::Running,
            T0 + 61_000,
        );
        assert!(!d.changed && !d.accepted());
        assert_eq!(d.answer().body["state"], "not_executed");
        let d = settle(&unsent, &not_sent(), RunStatus::Running, T0 + 61_000);
        assert!(!d.changed && d.accepted());
    }

    #[test]
    fn settling_again_answers_the_same_and_contradictions_are_refused() {
        let done = settle(
            &dispatched(),
            &confirmed(json!({"id": 1})),
            RunStatus::Running,
            T0 + 2_000,
        )
        .record;
        let again = settle(
            &done,
            &confirmed(json!({"id": 1})),
            RunStatus::Running,
            T0 + 3_000,
        );
        assert!(!again.changed && again.accepted() && again.events.is_empty());
        assert_eq!(again.answer().body, json!({"state": "completed"}));
        let contra = settle(&done, &not_sent(), RunStatus::Running, T0 + 3_000);
        assert!(!contra.changed && !contra.accepted());
        assert_eq!(contra.answer().body["state"], "completed");
        // The same evidence with other facts is not the same settlement.
        let other = settle(
            &done,
            &confirmed(json!({"id": 2})),
            RunStatus::Running,
            T0 + 3_000,
        );
        assert!(!other.changed && !other.accepted());
        assert_eq!(
            other.record.result,
            Some(json!({"id": 1})),
            "the first facts are kept"
        );
        // The agent's own ambiguous outcome is not its to overturn: only an operator.
        let unknown = settle(&dispatched(), &ambiguous(), RunStatus::Running, T0 + 2_000).record;
        let d = settle(
            &unknown,
            &confirmed(json!(1)),
            RunStatus::Running,
            T0 + 3_000,
        );
        assert!(!d.changed && !d.accepted());
        assert_eq!(d.answer().body["state"], "outcome_unknown");
        assert!(settle(&unknown, &ambiguous(), RunStatus::Running, T0 + 3_000).accepted());
    }

    #[test]
    fn settling_on_an_ended_run_records_without_an_event() {
        let d = settle(
            &dispatched(),
            &confirmed(json!(1)),
            RunStatus::Completed,
            T0 + 2_000,
        );
        assert!(d.changed && d.accepted());
        assert!(d.events.is_empty());
        assert_eq!(d.record.state, MutationState::Completed);
    }

    #[test]
    fn settlement_bodies_are_checked() {
        assert_eq!(
            Settlement::new("done", None, None),
            Err(SettlementError::UnknownEvidence)
        );
        assert_eq!(
            Settlement::new("Confirmed", None, None),
            Err(SettlementError::UnknownEvidence)
        );
        assert_eq!(
            Settlement::new("not_sent", Some(json!({"id": 1})), None),
            Err(SettlementError::ResultWithoutSend)
        );
        assert!(Settlement::new("not_sent", Some(Value::Null), Some(json!("refused"))).is_ok());
        let big = "x".repeat(MAX_FACTS_BYTES);
        assert!(matches!(
            Settlement::new("confirmed", Some(json!(big)), None),
            Err(SettlementError::FactsTooLarge(_))
        ));
        let half = "x".repeat(MAX_FACTS_BYTES / 2);
        assert!(matches!(
            Settlement::new("confirmed", Some(json!(half)), Some(json!(half))),
            Err(SettlementError::FactsTooLarge(_))
        ));
        let s = Settlement::new("confirmed", Some(Value::Null), None).unwrap();
        assert_eq!(s.result, None);
    }

    // --- deadline ------------------------------------------------------------------

    #[test]
    fn the_deadline_waits_until_due() {
        assert_eq!(
            settle_at_deadline(&intent(), RunStatus::Running, T0 + 59_999),
            None
        );
        assert_eq!(
            settle_at_deadline(&dispatched(), RunStatus::Running, T0 + 59_999),
            None
        );
        // A settled record is done with its deadline: an early timer is not sent again.
        let done = settle(
            &dispatched(),
            &confirmed(json!(1)),
            RunStatus::Running,
            T0 + 2_000,
        );
        let early = settle_at_deadline(&done.record, RunStatus::Running, T0 + 3_000).unwrap();
        assert!(!early.changed && early.events.is_empty());
        assert_eq!(early.record, done.record);
    }

    #[test]
    fn the_deadline_settles_an_undispatched_intent_unsent() {
        let d = settle_at_deadline(&intent(), RunStatus::Running, T0 + 60_000).unwrap();
        assert!(d.changed);
        assert_eq!(
            d.record.to_json(),
            json!({"schema":"mutation_outcome/v1","run_id":"run-1","tool_call_id":"write-1",
                   "approval_id":"approval-1","tool_name":"mcp__last9__create_dashboard",
                   "state":"not_executed","execution_status":"not_executed","reason":"unsent"})
        );
        assert_eq!(
            Value::Object(d.events[0].payload.clone()),
            json!({"tool_name":"mcp__last9__create_dashboard","tool_call_id":"write-1",
                   "approval_id":"approval-1","execution_status":"not_executed",
                   "mutation_outcome":"not_executed","reason":"unsent"})
        );
        // A redelivered timer writes nothing more.
        let again = settle_at_deadline(&d.record, RunStatus::Running, T0 + 61_000).unwrap();
        assert!(!again.changed && again.events.is_empty());
    }

    #[test]
    fn late_timers_after_the_run_ended_announce_nothing() {
        for status in [RunStatus::Completed, RunStatus::Failed] {
            let d = settle_at_deadline(&dispatched(), status, T0 + 60_000).unwrap();
            assert!(d.changed);
            assert_eq!(d.record.state, MutationState::OutcomeUnknown);
            assert!(d.events.is_empty());
            let d = settle_at_deadline(&intent(), status, T0 + 60_000).unwrap();
            assert_eq!(d.record.reason, Some(Reason::Unsent));
            assert!(d.events.is_empty());
        }
    }

    // --- reconcile -----------------------------------------------------------------

    #[test]
    fn an_operator_reconciles_outcome_unknown() {
        let unknown = settle_at_deadline(&dispatched(), RunStatus::Running, T0 + 60_000)
            .unwrap()
            .record;
        let d = reconcile(
            &unknown,
            Observed::Applied,
            "ops-alice",
            RunStatus::Running,
            T0 + 90_000,
        );
        assert!(d.changed && d.accepted());
        assert_eq!(d.record.state, MutationState::Completed);
        assert_eq!(
            d.record.reconciliation,
            Some(Reconciliation {
                observed: Observed::Applied,
                by: "ops-alice".into(),
                at: T0 + 90_000
            })
        );
        assert_eq!(d.events.len(), 1);
        assert_eq!(d.events[0].event_type, "tool_execution_reconciled");
        assert_eq!(
            payload(&d.events[0]),
            r#"{"tool_name":"mcp__last9__create_dashboard","tool_call_id":"write-1","approval_id":"approval-1","observed":"applied","mutation_outcome":"completed","reconciled_by":"ops-alice"}"#
        );
        assert_eq!(d.record.to_json()["reason"], "reconciled_applied");
        assert_eq!(
            d.answer(),
            Answer {
                verdict: Verdict::Ok,
                body: json!({"state": "completed"})
            }
        );

        let d = reconcile(
            &unknown,
            Observed::NotApplied,
            "ops-alice",
            RunStatus::Running,
            T0 + 90_000,
        );
        assert_eq!(
            d.record.to_json(),
            json!({"schema":"mutation_outcome/v1","run_id":"run-1","tool_call_id":"write-1",
                   "approval_id":"approval-1","tool_name":"mcp__last9__create_dashboard",
                   "state":"not_executed","execution_status":"executed",
                   "error":{"code":"settlement_deadline",
                            "message":"dispatched, but not settled before the settlement deadline"},
                   "reason":"reconciled_not_applied"})
        );
        assert_eq!(d.events[0].payload["mutation_outcome"], "not_executed");
        // Same observation again: same answer, nothing written.
        let again = reconcile(
            &d.record,
            Observed::NotApplied,
            "ops-bob",
            RunStatus::Running,
            T0 + 95_000,
        );
        assert!(!again.changed && again.accepted() && again.events.is_empty());
        assert_eq!(
            again.record.reconciliation.as_ref().unwrap().by,
            "ops-alice"
        );
        // The other observation: 409 with the state.
        let contra = reconcile(
            &d.record,
            Observed::Applied,
            "ops-bob",
            RunStatus::Running,
            T0 + 95_000,
        );
        assert!(!contra.changed && !contra.accepted());
        assert_eq!(contra.answer().body["state"], "not_executed");
        let agrees = settle(&d.record, &not_sent(), RunStatus::Running, T0 + 96_000);
        assert!(!agrees.changed && agrees.accepted());
        // A remote response after the operator's "not applied" contests it: the record is
        // outcome_unknown again (blocking new starts) with the response's facts, and an
        // operator reconciles it once more.
        let late = settle(
            &d.record,
            &confirmed(json!({"id": 7})),
            RunStatus::Running,
            T0 + 96_000,
        );
        assert!(late.changed && late.accepted());
        assert_eq!(late.events.len(), 1, "the change is announced");
        assert_eq!(late.events[0].event_type, "tool_execution_updated");
        assert_eq!(late.events[0].payload["previous_outcome"], "not_executed");
        assert_eq!(
            late.events[0].payload["mutation_outcome"],
            "outcome_unknown"
        );
        assert_eq!(late.events[0].payload["reason"], "contested");
        assert_eq!(late.record.state, MutationState::OutcomeUnknown);
        assert_eq!(late.record.result, Some(json!({"id": 7})));
        assert_eq!(late.record.to_json()["reason"], "contested");
        assert_eq!(late.answer().body, json!({"state": "outcome_unknown"}));
        let again = reconcile(
            &late.record,
            Observed::Applied,
            "ops-carol",
            RunStatus::Running,
            T0 + 97_000,
        );
        assert!(again.changed && again.accepted());
        assert_eq!(again.record.state, MutationState::Completed);
    }

    #[test]
    fn a_record_whose_deadline_timer_was_lost_is_reconciled_past_its_deadline() {
        // Dispatched, never settled, no deadline timer ran: the operator's reconciliation
        // settles it as the deadline would, then resolves it — both announced.
        let d = reconcile(
            &dispatched(),
            Observed::NotApplied,
            "ops-alice",
            RunStatus::Running,
            T0 + 60_000,
        );
        assert!(d.changed && d.accepted());
        assert_eq!(d.record.state, MutationState::NotExecuted);
        assert_eq!(d.record.to_json()["reason"], "reconciled_not_applied");
        let types: Vec<&str> = d.events.iter().map(|e| e.event_type.as_str()).collect();
        assert_eq!(types, ["tool_execution", "tool_execution_reconciled"]);
        assert_eq!(d.events[0].payload["mutation_outcome"], "outcome_unknown");
        // An intent past its deadline was never sent: it settles unsent, whatever the
        // operator observed.
        let d = reconcile(
            &intent(),
            Observed::Applied,
            "ops-alice",
            RunStatus::Running,
            T0 + 60_000,
        );
        assert!(d.changed && d.accepted());
        assert_eq!(d.record.state, MutationState::NotExecuted);
        assert_eq!(d.record.to_json()["reason"], "unsent");
        // Before the deadline, nothing to reconcile yet.
        let d = reconcile(
            &dispatched(),
            Observed::Applied,
            "ops-alice",
            RunStatus::Running,
            T0 + 59_000,
        );
        assert!(!d.changed && !d.accepted());
        assert_eq!(d.answer().body["state"], "dispatched");
    }

    #[test]
    fn only_outcome_unknown_is_reconciled() {
        for record in [
            intent(),
            dispatched(),
            settle(
                &dispatched(),
                &confirmed(json!(1)),
                RunStatus::Running,
                T0 + 2,
            )
            .record,
            settle(&intent(), &not_sent(), RunStatus::Running, T0 + 2).record,
        ] {
            let d = reconcile(&record, Observed::Applied, "op", RunStatus::Running, T0 + 3);
            assert!(!d.changed && !d.accepted(), "{:?}", record.state);
            assert_eq!(d.answer().verdict, Verdict::Conflict);
            assert_eq!(d.answer().body["state"], record.state.as_str());
        }
    }

    #[test]
    fn reconciling_on_an_ended_run_is_durable_but_silent() {
        let unknown = settle(&dispatched(), &ambiguous(), RunStatus::Running, T0 + 2).record;
        let d = reconcile(
            &unknown,
            Observed::Applied,
            "op",
            RunStatus::Completed,
            T0 + 3,
        );
        assert!(d.changed && d.events.is_empty());
        assert_eq!(d.record.state, MutationState::Completed);
    }

    // --- heartbeats ----------------------------------------------------------------

    #[test]
    fn heartbeats_only_while_dispatched_and_unsettled() {
        let s = settings();
        let rec = dispatched();
        assert_eq!(rec.heartbeat_due_at(1, &s), Some(T0 + 1_000 + 15_000));
        assert_eq!(rec.heartbeat_due_at(3, &s), Some(T0 + 1_000 + 45_000));
        assert_eq!(intent().heartbeat_due_at(1, &s), None);
        let beat = execution_heartbeat(&rec, 1, RunStatus::Running, T0 + 16_000).unwrap();
        assert_eq!(beat.event_type, "heartbeat");
        assert_eq!(
            payload(&beat),
            r#"{"tool_name":"mcp__last9__create_dashboard","tool_call_id":"write-1","approval_id":"approval-1"}"#
        );
        // Keyed per attempt and beat: a redelivered timer dedupes, another beat does not.
        let id = beat.event_id.clone().unwrap();
        assert!(id.starts_with("tollgate:execution_heartbeat:") && id.ends_with(":1"));
        assert!(crate::event::SERVER_EVENT_ID_PREFIXES
            .iter()
            .any(|p| id.starts_with(p)));
        assert_eq!(
            execution_heartbeat(&rec, 1, RunStatus::Running, T0 + 17_000)
                .unwrap()
                .event_id,
            Some(id.clone())
        );
        assert_ne!(
            execution_heartbeat(&rec, 2, RunStatus::Running, T0 + 31_000)
                .unwrap()
                .event_id,
            Some(id)
        );
        assert_ne!(
            execution_heartbeat_event_id("a:b", "c", 1),
            execution_heartbeat_event_id("a", "b:c", 1)
        );
        // None before dispatch, after settlement, past the deadline, or on an ended run.
        assert_eq!(
            execution_heartbeat(&intent(), 1, RunStatus::Running, T0 + 16_000),
            None
        );
        let done = settle(&rec, &confirmed(json!(1)), RunStatus::Running, T0 + 20_000).record;
        assert_eq!(
            execution_heartbeat(&done, 2, RunStatus::Running, T0 + 31_000),
            None
        );
        let unknown = settle_at_deadline(&rec, RunStatus::Running, T0 + 60_000)
            .unwrap()
            .record;
        assert_eq!(
            execution_heartbeat(&unknown, 4, RunStatus::Running, T0 + 61_000),
            None
        );
        assert_eq!(
            execution_heartbeat(&rec, 4, RunStatus::Running, T0 + 60_000),
            None
        );
        assert_eq!(
            execution_heartbeat(&rec, 1, RunStatus::Cancelled, T0 + 16_000),
            None
        );
    }

    // --- the seed's three scenarios, end to end ------------------------------------

    #[test]
    fn the_seeds_three_scenarios() {
        // Success: started → dispatched → completed.
        let d = started();
        let r = dispatch(&d.record, RunStatus::Running, T0 + 1).record;
        let done = settle(
            &r,
            &confirmed(json!({"id": "d-1"})),
            RunStatus::Running,
            T0 + 2,
        );
        let types: Vec<_> = d
            .events
            .iter()
            .chain(&done.events)
            .map(|e| e.event_type.as_str())
            .collect();
        assert_eq!(types, ["tool_execution_started", "tool_execution"]);
        assert_eq!(done.record.to_json()["state"], "completed");
        // Pre-dispatch expiry: started → deadline → not_executed; dispatch then refused.
        let expired = settle_at_deadline(&d.record, RunStatus::Running, T0 + 60_000).unwrap();
        assert_eq!(
            expired.events[0].payload["execution_status"],
            "not_executed"
        );
        assert!(!dispatch(&expired.record, RunStatus::Running, T0 + 60_001).accepted());
        // Dispatched timeout: started → dispatched → ambiguous → outcome_unknown, and
        // no new attempt until reconciled.
        let unknown = settle(&r, &ambiguous(), RunStatus::Running, T0 + 3);
        assert_eq!(unknown.events[0].payload["execution_status"], "executed");
        assert_eq!(
            unknown.events[0].payload["mutation_outcome"],
            "outcome_unknown"
        );
        assert_eq!(unknown.record.to_json()["state"], "outcome_unknown");
    }

    // --- budget --------------------------------------------------------------------

    #[test]
    fn budgets_parse_like_run_creation_and_fail_closed() {
        let b = Budget::parse(&json!({"tools": {"a": 2, "b": 0}, "call_ceiling": 3})).unwrap();
        assert_eq!(b.tools.get("a"), Some(&2));
        assert_eq!(b.call_ceiling, Some(3));
        assert_eq!(Budget::parse(&json!({})).unwrap(), Budget::default());
        assert_eq!(
            Budget::parse(&json!({"tools": {"a": 1}, "call_ceiling": null}))
                .unwrap()
                .call_ceiling,
            None
        );
        for bad in [
            json!([]),
            json!({"tool": {}}),
            json!({"tools": []}),
            json!({"tools": {"a": -1}}),
            json!({"tools": {"a": 1.5}}),
            json!({"tools": {"": 1}}),
            json!({"tools": {"t".repeat(129): 1}}),
            json!({"call_ceiling": "5"}),
            json!({"tools": (0..65).map(|i| (format!("t{i}"), json!(1))).collect::<Map<_, _>>()}),
        ] {
            assert_eq!(Budget::parse(&bad), Err(BudgetError), "{bad}");
        }
        assert_eq!(Budget::of_run(&head_with(None)), None);
        assert_eq!(Budget::of_run(&head_with(Some(json!({"tools": 1})))), None);
        assert_eq!(Budget::of_run(&head()).unwrap().call_ceiling, Some(5));
    }

    #[test]
    fn admission_counts_starts_per_tool_and_calls_against_the_ceiling() {
        let b = Budget::parse(&json!({"tools": {"a": 2, "b": 5}, "call_ceiling": 3})).unwrap();
        let mut usage = BudgetUsage::default();
        assert_eq!(admit(None, &usage, "a"), Err(Reason::NoBudget));
        assert_eq!(b.starts_left(&usage, "a"), 2);
        assert_eq!(b.calls_left(&usage), Some(3));
        usage = b.admit(&usage, "a").unwrap();
        usage = admit(Some(&b), &usage, "a").unwrap();
        assert_eq!(b.starts_left(&usage, "a"), 0);
        assert_eq!(b.admit(&usage, "a"), Err(Reason::BudgetExhausted));
        usage = b.admit(&usage, "b").unwrap();
        assert_eq!(usage.calls, 3);
        assert_eq!(b.calls_left(&usage), Some(0));
        assert_eq!(b.admit(&usage, "b"), Err(Reason::CallCeilingReached));
        assert_eq!(b.admit(&usage, "c"), Err(Reason::ToolNotInBudget));
        assert_eq!(b.starts_left(&usage, "c"), 0);
        // No ceiling: only the per-tool allowances bound it.
        let open = Budget::parse(&json!({"tools": {"a": 100}})).unwrap();
        assert_eq!(open.calls_left(&usage), None);
        assert!(open.admit(&usage, "a").is_ok());
        // Five of twenty admitted against a ceiling of five, whatever the order.
        let b = Budget::parse(&json!({"tools": {"w": 100}, "call_ceiling": 5})).unwrap();
        let mut usage = BudgetUsage::default();
        let admitted = (0..20).filter(|_| match b.admit(&usage, "w") {
            Ok(next) => {
                usage = next;
                true
            }
            Err(_) => false,
        });
        assert_eq!(admitted.count(), 5);
    }

    #[test]
    fn usage_round_trips_through_json() {
        let usage = BudgetUsage {
            starts: [("a".to_owned(), 2), ("b".to_owned(), 1)].into(),
            calls: 3,
        };
        let v = usage.to_json();
        assert_eq!(v, json!({"starts": {"a": 2, "b": 1}, "calls": 3}));
        assert_eq!(BudgetUsage::from_json(Some(&v)).unwrap(), usage);
        assert_eq!(
            BudgetUsage::from_json(None).unwrap(),
            BudgetUsage::default()
        );
        assert_eq!(
            BudgetUsage::from_json(Some(&Value::Null)).unwrap(),
            BudgetUsage::default()
        );
        assert!(BudgetUsage::from_json(Some(&json!({"starts": 1}))).is_err());
    }

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

    #[test]
    fn a_late_not_sent_cannot_beat_a_late_deadline_timer() {
        // Dispatched; the deadline passed but its timer has not run: `not_sent` now is
        // judged against the deadline's `outcome_unknown` and refused; nothing is freed.
        let late = settle(&dispatched(), &not_sent(), RunStatus::Running, T0 + 60_000);
        assert!(late.changed, "the deadline's settlement is written");
        assert!(!late.accepted());
        assert_eq!(late.record.state, MutationState::OutcomeUnknown);
        assert_eq!(late.events.len(), 1);
        assert_eq!(
            late.events[0].payload["mutation_outcome"],
            "outcome_unknown"
        );
        // An undispatched intent past its deadline: `not_sent` agrees with the deadline's
        // `unsent`, written as the timer would.
        let unsent = settle(&intent(), &not_sent(), RunStatus::Running, T0 + 60_000);
        assert!(unsent.changed && unsent.accepted());
        assert_eq!(unsent.record.state, MutationState::NotExecuted);
        assert_eq!(unsent.events.len(), 1);
    }
}
