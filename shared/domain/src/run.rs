//! The run head: the one item whose `next_seq` and `status` every append and terminal
//! transition is conditioned on.

use crate::event::types as ev;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::event::EventDraft;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RunStatus {
    Running,
    Completed,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => RunStatus::Running,
            "completed" => RunStatus::Completed,
            "failed" => RunStatus::Failed,
            "cancelled" => RunStatus::Cancelled,
            _ => return None,
        })
    }

    pub fn is_terminal(self) -> bool {
        self != RunStatus::Running
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RunKind {
    #[default]
    Single,
    Coordinator,
    Child,
}

impl RunKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::Single => "single",
            RunKind::Coordinator => "coordinator",
            RunKind::Child => "child",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "single" => RunKind::Single,
            "coordinator" => RunKind::Coordinator,
            "child" => RunKind::Child,
            _ => return None,
        })
    }
}

/// The three ways a run ends; each appends its own terminal event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TerminalKind {
    Complete,
    Fail,
    Cancel,
}

impl TerminalKind {
    pub fn status(self) -> RunStatus {
        match self {
            TerminalKind::Complete => RunStatus::Completed,
            TerminalKind::Fail => RunStatus::Failed,
            TerminalKind::Cancel => RunStatus::Cancelled,
        }
    }

    pub fn event_type(self) -> &'static str {
        match self {
            TerminalKind::Complete => ev::RUN_COMPLETED,
            TerminalKind::Fail => ev::RUN_FAILED,
            TerminalKind::Cancel => ev::RUN_CANCELLED,
        }
    }
}

/// A run's head as stored: identity, lifecycle and the next sequence to hand out.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunHead {
    pub run_id: String,
    pub status: RunStatus,
    /// The sequence the next appended event gets; the last event is `next_seq - 1`.
    pub next_seq: u64,
    pub kind: RunKind,
    pub parent_run_id: Option<String>,
    pub subtask_id: Option<Value>,
    pub owner: Option<String>,
    pub project_id: Option<String>,
    pub channel_id: Option<String>,
    /// The JWT subject that created the run.
    pub created_by: String,
    pub delivery_id: Option<String>,
    pub execution_mode: Option<String>,
    pub agenthost_origin: Option<String>,
    /// `{tools:{name:max_starts}, call_ceiling}` as given at creation (JSON).
    pub budget: Option<Value>,
    pub created_at: i64,
    pub last_event_at: i64,
    /// Sequence of the terminal event once the run has ended.
    pub terminal_seq: Option<u64>,
    /// Random per creation: run tokens are bound to it, so if retention ever lets a run
    /// id be created again, the old run's tokens do not open the new run.
    pub incarnation: String,
    /// The type of the latest event that is not a heartbeat (the stall guard's view).
    pub last_real_type: Option<String>,
    /// The `next_seq` at which a silence was already reported as a stall (so a silence
    /// is reported once; any new event moves `next_seq` and starts a new one).
    pub stall_reported_seq: Option<u64>,
    /// Pending approval cards on the run (counted by the store where it keeps a count;
    /// a run holds at most [`crate::approval::MAX_OPEN_CARDS_PER_RUN`]).
    #[serde(default)]
    pub open_cards: u64,
    /// What the run has used of its `budget` (`{"starts":{tool:n},"calls":n}`, see
    /// `execution::BudgetUsage`), written by each admitted start in the transaction that
    /// appends its `tool_execution_started`; `None` until the first admission.
    #[serde(default)]
    pub budget_used: Option<Value>,
}

/// Heartbeats keep a stream alive but are not "real" events to the stall guard.
pub fn is_heartbeat(event_type: &str) -> bool {
    matches!(event_type, ev::APPROVAL_PENDING | ev::HEARTBEAT)
}

/// The type the head records after appending events of these types, in order.
pub fn last_real_type<'a>(types: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    types.into_iter().filter(|t| !is_heartbeat(t)).last()
}

/// Where a run's cards live (`execution_mode` at creation; stored as given).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionMode {
    /// Tollgate holds the cards (the default).
    Inline,
    /// The run's AgentHost pod holds them (docs/architecture.md §8).
    Pod,
}

impl ExecutionMode {
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "inline" => Some(ExecutionMode::Inline),
            "pod" => Some(ExecutionMode::Pod),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionMode::Inline => "inline",
            ExecutionMode::Pod => "pod",
        }
    }
}

impl RunHead {
    pub fn last_sequence(&self) -> u64 {
        self.next_seq.saturating_sub(1)
    }

    /// The run's execution mode (a run created without one, or with a value this build
    /// does not know, is inline: its cards are Tollgate's).
    pub fn execution_mode(&self) -> ExecutionMode {
        match self
            .execution_mode
            .as_deref()
            .and_then(ExecutionMode::parse)
        {
            Some(mode) => mode,
            None => ExecutionMode::Inline,
        }
    }

    /// Whether the run's AgentHost pod holds its cards.
    pub fn is_pod(&self) -> bool {
        self.execution_mode() == ExecutionMode::Pod
    }

    /// What appending events of `types` at `now` changes on the head besides `next_seq`.
    pub fn record<'a>(&mut self, types: impl IntoIterator<Item = &'a str>, now: i64) {
        self.last_event_at = now;
        if let Some(t) = last_real_type(types) {
            self.last_real_type = Some(t.to_owned());
        }
    }

    #[doc(hidden)]
    pub fn new_for_test(run_id: &str, channel_id: Option<&str>) -> Self {
        NewRun {
            run_id: run_id.into(),
            channel_id: channel_id.map(Into::into),
            ..NewRun::default()
        }
        .head(0)
    }
}

/// What a creator asks for; the store turns it into a head plus `run_started`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NewRun {
    pub run_id: String,
    pub kind: RunKind,
    pub parent_run_id: Option<String>,
    pub subtask_id: Option<Value>,
    pub owner: Option<String>,
    pub project_id: Option<String>,
    pub channel_id: Option<String>,
    pub created_by: String,
    pub delivery_id: Option<String>,
    pub execution_mode: Option<String>,
    pub agenthost_origin: Option<String>,
    pub budget: Option<Value>,
}

impl NewRun {
    /// True when `head` is what this request would have created: a retried create
    /// (same creator, same fields) answers with the stored run instead of a conflict.
    pub fn matches(&self, head: &RunHead) -> bool {
        head.run_id == self.run_id
            && head.created_by == self.created_by
            && head.kind == self.kind
            && head.parent_run_id == self.parent_run_id
            && head.subtask_id == self.subtask_id
            && head.owner == self.owner
            && head.project_id == self.project_id
            && head.channel_id == self.channel_id
            && head.delivery_id == self.delivery_id
            && head.execution_mode == self.execution_mode
            && head.agenthost_origin == self.agenthost_origin
            && head.budget == self.budget
    }

    /// The head as it is right after creation: `run_started` holds sequence 1. Each call
    /// draws a fresh incarnation.
    pub fn head(&self, now_millis: i64) -> RunHead {
        RunHead {
            run_id: self.run_id.clone(),
            status: RunStatus::Running,
            next_seq: 2,
            kind: self.kind,
            parent_run_id: self.parent_run_id.clone(),
            subtask_id: self.subtask_id.clone(),
            owner: self.owner.clone(),
            project_id: self.project_id.clone(),
            channel_id: self.channel_id.clone(),
            created_by: self.created_by.clone(),
            delivery_id: self.delivery_id.clone(),
            execution_mode: self.execution_mode.clone(),
            agenthost_origin: self.agenthost_origin.clone(),
            budget: self.budget.clone(),
            created_at: now_millis,
            last_event_at: now_millis,
            terminal_seq: None,
            incarnation: hex::encode(rand::random::<[u8; 8]>()),
            last_real_type: Some(ev::RUN_STARTED.into()),
            stall_reported_seq: None,
            open_cards: 0,
            budget_used: None,
        }
    }

    /// `run_started`, always sequence 1. It names the run's shape, never its secrets.
    pub fn started_event(&self) -> EventDraft {
        let mut p = Map::new();
        p.insert("kind".into(), self.kind.as_str().into());
        let optional = [
            ("parent_run_id", self.parent_run_id.clone().map(Value::from)),
            ("subtask_id", self.subtask_id.clone()),
            ("owner", self.owner.clone().map(Value::from)),
            ("project_id", self.project_id.clone().map(Value::from)),
            (
                "execution_mode",
                self.execution_mode.clone().map(Value::from),
            ),
        ];
        for (k, v) in optional {
            if let Some(v) = v {
                p.insert(k.into(), v);
            }
        }
        EventDraft::server(ev::RUN_STARTED, p)
    }
}

/// Run ids travel in URL paths and DynamoDB keys: 1–128 of `[A-Za-z0-9_.:-]`, and
/// never `.` or `..` (a path segment a proxy or client library would rewrite).
pub fn validate_run_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id != "."
        && id != ".."
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'))
}

/// Run ids derived from a delivery id start with this; creators may not choose it.
pub const DELIVERY_RUN_PREFIX: &str = "dlv-";

/// The run id a `delivery_id` maps to when the creator names no run id. Deriving it
/// (instead of storing a separate receipt item) makes "same delivery, same run" a plain
/// conditional put on the head: a redelivered create finds the head already there.
/// Scoped by the creator's subject and project, so two agents — or one agent in two
/// projects — never share a delivery space.
pub fn delivery_run_id(created_by: &str, project_id: Option<&str>, delivery_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut digest = Sha256::new()
        .chain_update(b"tollgate-delivery\0")
        .chain_update(created_by.as_bytes())
        .chain_update(b"\0");
    if let Some(project) = project_id {
        digest = digest
            .chain_update(b"project\0")
            .chain_update(project.as_bytes())
            .chain_update(b"\0");
    }
    let digest = digest.chain_update(delivery_id.as_bytes()).finalize();
    format!("{DELIVERY_RUN_PREFIX}{}", hex::encode(&digest[..16]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_url_and_key_safe() {
        assert!(validate_run_id("run-1"));
        assert!(validate_run_id("a:b.c_d-E9"));
        for bad in ["", ".", "..", "a/b", "a#b", "a b", &"x".repeat(129)] {
            assert!(!validate_run_id(bad), "{bad}");
        }
    }

    #[test]
    fn delivery_ids_map_to_stable_per_subject_run_ids() {
        let a = delivery_run_id("agent-a", None, "d1");
        assert_eq!(a, delivery_run_id("agent-a", None, "d1"));
        assert_ne!(a, delivery_run_id("agent-b", None, "d1"));
        assert_ne!(a, delivery_run_id("agent-a", None, "d2"));
        assert_ne!(a, delivery_run_id("agent-a", Some("p1"), "d1"));
        assert_ne!(
            delivery_run_id("agent-a", Some("p1"), "d1"),
            delivery_run_id("agent-a", Some("p2"), "d1")
        );
        assert!(validate_run_id(&a));
    }

    #[test]
    fn new_run_starts_at_sequence_one() {
        let head = NewRun {
            run_id: "r".into(),
            ..Default::default()
        }
        .head(7);
        assert_eq!(head.next_seq, 2);
        assert_eq!(head.last_sequence(), 1);
        assert_eq!(head.status, RunStatus::Running);
    }
}

/// Seed 003's stall guard: a running child silent for `timeout_ms` is stalled — unless
/// its latest non-heartbeat event is `tool.approval_required` (a human-paced wait). Any
/// other real event clears that, so the guard cannot latch: a child that emitted
/// `tool.approval_required`, then `tool.error`, then went quiet is caught. A silence is
/// reported once (`stall_reported_seq`); any new event starts a new one.
pub fn is_stalled(head: &RunHead, now_millis: i64, timeout_ms: i64) -> bool {
    head.kind == RunKind::Child
        && !head.status.is_terminal()
        && now_millis - head.last_event_at >= timeout_ms
        && head.last_real_type.as_deref() != Some("tool.approval_required")
        && head.stall_reported_seq != Some(head.next_seq)
}

/// What the stall guard does with a silent child (`TOLLGATE_STALL_ACTION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StallAction {
    /// Seed 003: the coordinator "fails a child that emits no event within the stall
    /// timeout … as `agent_stall_timeout`": the report and the child's `run_failed` in
    /// one step.
    #[default]
    Fail,
    /// Only `coordinator.child_stall_detected`; the child runs on.
    Report,
}

impl StallAction {
    pub fn parse(v: &str) -> Option<Self> {
        match v {
            "fail" => Some(StallAction::Fail),
            "report" => Some(StallAction::Report),
            _ => None,
        }
    }
}

/// One run of the stall guard: when, how long a silence may last, and what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StallCheck {
    pub now: i64,
    pub timeout_ms: i64,
    pub action: StallAction,
}

/// `reason` of the `run_failed` the stall guard appends on a silent child (seed 003).
pub const STALL_FAILURE_REASON: &str = "agent_stall_timeout";

/// `coordinator.child_stall_detected` on the coordinator of a stalled child: who, how
/// long silent, since when, after which event, and the timeout it broke.
pub fn stall_detected_event(child: &RunHead, check: &StallCheck) -> EventDraft {
    let mut p = Map::new();
    p.insert("childRunId".into(), child.run_id.clone().into());
    p.insert(
        "subtaskId".into(),
        child.subtask_id.clone().unwrap_or(Value::Null),
    );
    p.insert(
        "silentSeconds".into(),
        ((check.now - child.last_event_at).max(0) / 1000).into(),
    );
    p.insert(
        "staleSinceUtc".into(),
        crate::format_timestamp(child.last_event_at).into(),
    );
    p.insert(
        "stallTimeoutSeconds".into(),
        (check.timeout_ms / 1000).into(),
    );
    p.insert(
        "lastEventSequence".into(),
        child.next_seq.saturating_sub(1).into(),
    );
    if let Some(t) = &child.last_real_type {
        p.insert("lastEventType".into(), t.clone().into());
    }
    if check.action == StallAction::Fail {
        p.insert("action".into(), "failed".into());
    }
    EventDraft::server("coordinator.child_stall_detected", p)
}

/// The payload of the `run_failed` that ends a stalled child.
pub fn stall_failure_payload(check: &StallCheck) -> Map<String, Value> {
    let mut p = Map::new();
    p.insert("reason".into(), STALL_FAILURE_REASON.into());
    p.insert(
        "stallTimeoutSeconds".into(),
        (check.timeout_ms / 1000).into(),
    );
    p
}

#[cfg(test)]
mod stall_tests {
    use super::*;

    #[test]
    fn the_guard_waits_for_humans_and_cannot_latch() {
        let mut child = NewRun {
            run_id: "c".into(),
            kind: RunKind::Child,
            ..NewRun::default()
        }
        .head(0);
        assert!(!is_stalled(&child, 1_000, 5_000), "not silent long enough");
        assert!(is_stalled(&child, 5_000, 5_000));
        child.record(["tool.approval_required", "tool.approval_pending"], 10_000);
        assert!(!is_stalled(&child, 100_000, 5_000), "waiting on a card");
        child.record(["tool.error"], 20_000);
        assert!(
            is_stalled(&child, 100_000, 5_000),
            "the wait ended; silence is a stall"
        );
        child.stall_reported_seq = Some(child.next_seq);
        assert!(
            !is_stalled(&child, 200_000, 5_000),
            "reported once per silence"
        );
        child.next_seq += 1;
        child.record(["agent.message"], 300_000);
        assert!(is_stalled(&child, 400_000, 5_000));
    }
}
