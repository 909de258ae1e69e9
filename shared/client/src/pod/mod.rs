//! The pod side of pod-per-run approvals (seed 003 "Pod-per-run forwarding", docs/architecture.md §8).
//!
//! A run created with `execution_mode: "pod"` keeps its pending cards in the AgentHost
//! pod's memory: here, a [`PodGate`]. The agent arms a card with [`PodGate::arm`] and
//! awaits the returned [`PendingApproval`]; Tollgate, which knows nothing of the card,
//! forwards an operator's decision to the pod's routes ([`PodGate::routes`]):
//!
//! - `POST /tool-approvals` `{runId, requestId, scope, decisionId?}` and
//!   `POST /tool-denials` `{runId, requestId, decisionId?}` (either may name the card's
//!   `toolName`: a card for another tool is refused, 409, and nothing applies), and
//!   `GET /tool-approvals/{requestId}` (the card). Tollgate sends a `decisionId` (one per
//!   operator, card, verb and scope): the same decision sent again after its answer was
//!   lost is answered `applied: true` again ([`PodGate::decide_once`]);
//! - every route needs `Authorization: Bearer <credential>`, the per-run credential
//!   Tollgate holds for this pod (compared in constant time); missing or wrong → 401.
//!
//! Answers, as Tollgate's forwarding maps them:
//!
//! | answer | when |
//! |---|---|
//! | 200 `{runId, requestId, toolName, state: "approved"\|"denied", applied: true, scope, resolved: true, expired: false}` | a pending card decided by this request (`scope` on approvals only) |
//! | 200 `{runId, requestId, toolName, state, applied: false, scope?, resolved: true, expired}` | the card had already ended (`approved`, `denied` or `expired`; a click at or after its deadline expires it) |
//! | 404 `{state: "unknown"}` | no such card, or the `runId` is not the card's run |
//! | 409 `{error: "Run is not active.", state: "pending"}` | the card is pending but its run has ended ([`PodGate::end_run`]) |
//! | 409 `{error: "the card is for another tool", state: "pending"}` | the request names a `toolName` that is not the card's (nothing applied) |
//! | 401 | missing or wrong bearer credential |
//! | 400 | a body that is not `{runId, requestId, scope?}` JSON |
//!
//! Tollgate persists a durable scope policy only for `approved` with `applied: true`.
//!
//! **The in-pod bridge.** An approval applied with scope `tool`, `run` or `always` is
//! installed in this pod before the waiting call resumes, so the next arm it covers is
//! approved at once ([`PodDecision::Approved`] with `auto: true`, no prompt) while
//! Tollgate persists the durable policy. A bridge never reaches further than that durable
//! policy does — every Tollgate policy is for one tool:
//!
//! - `tool` and `run`: later arms of **the same tool on the same run** in this pod (a
//!   pod holds one run; the sibling runs a durable `run` policy also covers live in
//!   other pods, which Tollgate's policy reaches);
//! - `always`: later arms of **the same tool on any run** armed in this pod;
//! - `once`: nothing.
//!
//! Other tools always prompt. Bridges live as long as the [`PodGate`].
//!
//! A card nobody waits for any more (every [`PendingApproval`] for it dropped) expires at
//! once, so a decision can never apply to a call that no longer waits.
//!
//! **Announcing through the run.** Given the run's handle ([`PodGate::announce_through`]),
//! the gate puts each card it holds for that run on the run's stream by itself, as seed
//! 003's pod runtime does: `tool.approval_required` when it arms (not for a call a bridge
//! approved), `tool.approval_pending` every [`PodGate::heartbeat_every`] (20 s) while it
//! waits, and `tool.approval_resolved` `{expired: true}` when it expires in the pod (its
//! deadline, or nobody waiting any more). Tollgate then lists the card (`held_by: "pod"`),
//! mirrors it on a coordinator, keeps the stall guard off the waiting run and forwards
//! decisions with the card's tool; decisions it forwards are recorded by Tollgate, so
//! the gate appends nothing for them. Without a handle nothing is announced (Tollgate
//! still forwards decisions on cards it never saw).
//!
//! The parts: `cards` holds the cards, the bridges and the future of a decision,
//! `announce` puts a card on its run's stream, and `routes` serves the decision routes.

mod announce;
mod cards;
mod routes;

use announce::announce;
pub use cards::PendingApproval;
use cards::{Card, Cards, Inner, Verb};

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::gate::{Scope, DEFAULT_GATE_TIMEOUT};
use crate::Run;

/// Default of [`PodGate::heartbeat_every`]: seed 003's `ApprovalHeartbeatInterval`.
pub const DEFAULT_POD_HEARTBEAT: Duration = Duration::from_secs(20);

/// A card to hold in the pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodArm {
    /// The card's id (what Tollgate forwards as `requestId`).
    pub request_id: String,
    /// The run the card belongs to.
    pub run_id: String,
    /// The tool about to be called.
    pub tool_name: String,
    /// The tool call's id (defaults to `request_id`).
    pub tool_call_id: Option<String>,
    /// The approval attempt's id (defaults to `request_id`).
    pub approval_id: Option<String>,
    /// The URL shown on the card.
    pub url: Option<String>,
    /// The intention shown on the card.
    pub intention: Option<String>,
    /// The message shown on the card.
    pub message: Option<String>,
    /// How long the card waits before it expires (default 300 s).
    pub timeout: Duration,
}

impl PodArm {
    /// A card `request_id` of `run_id` for `tool_name`, expiring after 300 s.
    pub fn new(
        request_id: impl Into<String>,
        run_id: impl Into<String>,
        tool_name: impl Into<String>,
    ) -> Self {
        Self {
            request_id: request_id.into(),
            run_id: run_id.into(),
            tool_name: tool_name.into(),
            tool_call_id: None,
            approval_id: None,
            url: None,
            intention: None,
            message: None,
            timeout: DEFAULT_GATE_TIMEOUT,
        }
    }

    /// Sets the tool call's id.
    pub fn tool_call_id(mut self, id: impl Into<String>) -> Self {
        self.tool_call_id = Some(id.into());
        self
    }

    /// Sets the approval attempt's id.
    pub fn approval_id(mut self, id: impl Into<String>) -> Self {
        self.approval_id = Some(id.into());
        self
    }

    /// Sets the URL shown on the card.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// Sets the intention shown on the card.
    pub fn intention(mut self, text: impl Into<String>) -> Self {
        self.intention = Some(text.into());
        self
    }

    /// Sets the message shown on the card.
    pub fn message(mut self, text: impl Into<String>) -> Self {
        self.message = Some(text.into());
        self
    }

    /// Sets the timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }
}

/// How a pod card ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodDecision {
    /// Approved: by an operator (`auto: false`) or by an in-pod bridge (`auto: true`).
    Approved {
        /// The scope.
        scope: Scope,
        /// Whether a bridge approved it without a prompt.
        auto: bool,
    },
    /// Denied by an operator.
    Denied,
    /// Nobody decided before the deadline (or nobody waited any more).
    Expired,
}

impl PodDecision {
    /// `approved`, `denied` or `expired`.
    pub fn state(&self) -> &'static str {
        match self {
            PodDecision::Approved { .. } => "approved",
            PodDecision::Denied => "denied",
            PodDecision::Expired => "expired",
        }
    }

    fn scope(&self) -> Option<Scope> {
        match self {
            PodDecision::Approved { scope, .. } => Some(*scope),
            _ => None,
        }
    }
}

/// What a decision did, and the answer the routes send for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodAnswer {
    /// A pending card decided by this request (200, `applied: true`).
    Applied {
        /// The card's run.
        run_id: String,
        /// The card.
        request_id: String,
        /// The card's tool (Tollgate keys a scoped policy by it).
        tool_name: String,
        /// How it ended now.
        decision: PodDecision,
    },
    /// The card had already ended (200, `applied: false`).
    AlreadyEnded {
        /// The card's run.
        run_id: String,
        /// The card.
        request_id: String,
        /// The card's tool.
        tool_name: String,
        /// How it had ended.
        decision: PodDecision,
    },
    /// No such card on that run (404 `unknown`).
    Unknown,
    /// Pending, but its run has ended (409 `pending`).
    RunNotActive,
    /// The decision names another tool than the card's (409 `pending`): nothing applied.
    OtherTool,
}

impl PodAnswer {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            PodAnswer::Applied { .. } | PodAnswer::AlreadyEnded { .. } => 200,
            PodAnswer::Unknown => 404,
            PodAnswer::RunNotActive | PodAnswer::OtherTool => 409,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        match self {
            PodAnswer::Applied {
                run_id,
                request_id,
                tool_name,
                decision,
            }
            | PodAnswer::AlreadyEnded {
                run_id,
                request_id,
                tool_name,
                decision,
            } => {
                let mut body = Map::new();
                body.insert("runId".into(), run_id.clone().into());
                body.insert("requestId".into(), request_id.clone().into());
                body.insert("toolName".into(), tool_name.clone().into());
                body.insert("state".into(), decision.state().into());
                body.insert(
                    "applied".into(),
                    matches!(self, PodAnswer::Applied { .. }).into(),
                );
                body.insert("resolved".into(), true.into());
                body.insert("expired".into(), (*decision == PodDecision::Expired).into());
                if let Some(scope) = decision.scope() {
                    body.insert("scope".into(), scope.as_str().into());
                }
                Value::Object(body)
            }
            PodAnswer::Unknown => json!({"error": "no such approval request", "state": "unknown"}),
            PodAnswer::RunNotActive => json!({"error": "Run is not active.", "state": "pending"}),
            PodAnswer::OtherTool => {
                json!({"error": "the card is for another tool", "state": "pending"})
            }
        }
    }
}

/// The in-memory gate of one AgentHost pod. Cheap to clone (all clones share the cards).
#[derive(Clone)]
pub struct PodGate {
    inner: Arc<Inner>,
}

impl fmt::Debug for PodGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cards = self.inner.lock().cards.len();
        f.debug_struct("PodGate")
            .field("cards", &cards)
            .finish_non_exhaustive()
    }
}

impl PodGate {
    /// A gate whose routes accept `Authorization: Bearer <credential>` (the per-run
    /// credential Tollgate holds for this pod). An empty credential accepts nobody.
    pub fn new(credential: impl AsRef<[u8]>) -> Self {
        Self {
            inner: Arc::new(Inner {
                credential: Sha256::digest(credential.as_ref()).into(),
                state: Mutex::new(Cards::default()),
            }),
        }
    }

    /// Holds a card (now, before this returns) and gives the future of its decision.
    /// A bridge covering it approves it at once. Arming a `request_id` the pod already
    /// holds for the same run and tool waits on that card as it stands (its other fields
    /// are ignored); for another run or tool it is [`PodDecision::Expired`] at once.
    pub fn arm(&self, arm: PodArm) -> PendingApproval {
        let mut cards = self.inner.lock();
        let now = Instant::now();
        let request_id = arm.request_id.clone();
        // The id is the pod's for one call: arming it again for another run or tool never
        // inherits that card's decision; it is expired at once (and the card untouched).
        if let Some(held) = cards.cards.get(&request_id) {
            if held.arm.run_id != arm.run_id || held.arm.tool_name != arm.tool_name {
                cards.next_waiter += 1;
                return PendingApproval {
                    gate: self.inner.clone(),
                    request_id,
                    waiter: cards.next_waiter,
                    expires_at: now,
                    immediate: Some(PodDecision::Expired),
                    rx: None,
                    sleep: None,
                };
            }
        }
        if !cards.cards.contains_key(&request_id) {
            let state = cards
                .bridge_for(&arm.run_id, &arm.tool_name)
                .map(|scope| PodDecision::Approved { scope, auto: true });
            let expires_at = now + arm.timeout;
            let ended = Arc::new(tokio::sync::Notify::new());
            // A card that waits for a human is announced on its run's stream.
            if state.is_none() {
                if let (Some(run), Ok(runtime)) = (
                    cards.announce.get(&arm.run_id),
                    tokio::runtime::Handle::try_current(),
                ) {
                    runtime.spawn(announce(
                        Arc::downgrade(&self.inner),
                        run.clone(),
                        arm.clone(),
                        ended.clone(),
                        cards.heartbeat_every.unwrap_or(DEFAULT_POD_HEARTBEAT),
                    ));
                }
            }
            cards.cards.insert(
                request_id.clone(),
                Card {
                    arm,
                    expires_at,
                    state,
                    decided_by_id: None,
                    waiters: Vec::new(),
                    ended,
                },
            );
        }
        cards.next_waiter += 1;
        let waiter = cards.next_waiter;
        let card = cards
            .cards
            .get_mut(&request_id)
            .expect("the card was just found or inserted");
        card.expire_if_due(now);
        let (immediate, rx) = match card.state {
            Some(decision) => (Some(decision), None),
            None => {
                let (tx, rx) = oneshot::channel();
                card.waiters.push((waiter, tx));
                (None, Some(rx))
            }
        };
        PendingApproval {
            gate: self.inner.clone(),
            request_id,
            waiter,
            expires_at: card.expires_at,
            immediate,
            rx,
            sleep: None,
        }
    }

    /// Approves a card as the `/tool-approvals` route does.
    pub fn approve(&self, run_id: &str, request_id: &str, scope: Scope) -> PodAnswer {
        self.decide(run_id, request_id, Verb::Approve(scope), None, None)
    }

    /// Denies a card as the `/tool-denials` route does.
    pub fn deny(&self, run_id: &str, request_id: &str) -> PodAnswer {
        self.decide(run_id, request_id, Verb::Deny, None, None)
    }

    /// Decides a card as the routes do for a request carrying Tollgate's `decisionId`
    /// (one per operator, card, verb and scope): when the card was ended by that very
    /// decision, a repeat (its first answer was lost) is answered `applied` again, so
    /// Tollgate can still record what it applied.
    pub fn decide_once(
        &self,
        run_id: &str,
        request_id: &str,
        scope: Option<Scope>,
        decision_id: &str,
    ) -> PodAnswer {
        let verb = match scope {
            Some(scope) => Verb::Approve(scope),
            None => Verb::Deny,
        };
        self.decide(run_id, request_id, verb, Some(decision_id), None)
    }

    fn decide(
        &self,
        run_id: &str,
        request_id: &str,
        verb: Verb,
        decision_id: Option<&str>,
        tool_name: Option<&str>,
    ) -> PodAnswer {
        let mut guard = self.inner.lock();
        let cards = &mut *guard;
        let Some(card) = cards
            .cards
            .get_mut(request_id)
            .filter(|c| c.arm.run_id == run_id)
        else {
            return PodAnswer::Unknown;
        };
        // A decision meant for another tool applies to nothing here.
        if tool_name.is_some_and(|t| t != card.arm.tool_name) {
            return PodAnswer::OtherTool;
        }
        card.expire_if_due(Instant::now());
        if let Some(decision) = card.state {
            let same = decision_id.is_some()
                && card.decided_by_id.as_deref() == decision_id
                && match (verb, decision) {
                    (Verb::Approve(asked), PodDecision::Approved { scope, auto: false }) => {
                        asked == scope
                    }
                    (Verb::Deny, PodDecision::Denied) => true,
                    _ => false,
                };
            if same {
                return PodAnswer::Applied {
                    run_id: run_id.to_owned(),
                    request_id: request_id.to_owned(),
                    tool_name: card.arm.tool_name.clone(),
                    decision,
                };
            }
            return PodAnswer::AlreadyEnded {
                run_id: run_id.to_owned(),
                request_id: request_id.to_owned(),
                tool_name: card.arm.tool_name.clone(),
                decision,
            };
        }
        if cards.ended_runs.contains(run_id) {
            return PodAnswer::RunNotActive;
        }
        let decision = match verb {
            Verb::Approve(scope) => PodDecision::Approved { scope, auto: false },
            Verb::Deny => PodDecision::Denied,
        };
        let arm = card.arm.clone();
        // The bridge is in place before the waiting call resumes (seed 003 step 5).
        if let Verb::Approve(scope) = verb {
            cards.install_bridge(&arm, scope);
        }
        if let Some(card) = cards.cards.get_mut(request_id) {
            card.decided_by_id = decision_id.map(str::to_owned);
            card.end(decision);
        }
        PodAnswer::Applied {
            run_id: run_id.to_owned(),
            request_id: request_id.to_owned(),
            tool_name: arm.tool_name,
            decision,
        }
    }

    /// Announces the cards armed from now on for `run` on its stream (see the module
    /// docs): `run` is the run's handle with its run token. Needs a Tokio runtime at
    /// [`PodGate::arm`] (without one, a card is held but not announced).
    pub fn announce_through(&self, run: Run) -> &Self {
        self.inner.lock().announce.insert(run.id().to_owned(), run);
        self
    }

    /// How often a waiting card's `tool.approval_pending` is appended (default 20 s;
    /// Tollgate drops one that comes within half its own heartbeat interval of the last).
    pub fn heartbeat_every(&self, every: Duration) -> &Self {
        self.inner.lock().heartbeat_every = Some(every.max(Duration::from_millis(100)));
        self
    }

    /// Marks a run ended: its pending cards can no longer be decided (409 `pending`) and
    /// expire at their deadline.
    pub fn end_run(&self, run_id: &str) {
        self.inner.lock().ended_runs.insert(run_id.to_owned());
    }

    /// The card as `GET /tool-approvals/{requestId}` answers it: `runId`, `requestId`,
    /// `toolName`, `toolCallId`, `approvalId`, `url`, `intention`, `message`, `state`
    /// and, once ended, `scope` and `autoApproved`.
    pub fn card(&self, request_id: &str) -> Option<Value> {
        let mut cards = self.inner.lock();
        let card = cards.cards.get_mut(request_id)?;
        card.expire_if_due(Instant::now());
        Some(card.to_json())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn decisions_apply_once_and_report_the_real_state_after() {
        let gate = PodGate::new("c");
        let pending = gate.arm(PodArm::new("r1", "run-1", "web_fetch"));
        assert_eq!(pending.decided(), None);
        assert_eq!(gate.approve("run-2", "r1", Scope::Once), PodAnswer::Unknown);
        let first = gate.approve("run-1", "r1", Scope::Once);
        assert_eq!(first.status(), 200);
        assert_eq!(first.body()["applied"], true);
        assert_eq!(
            pending.await,
            PodDecision::Approved {
                scope: Scope::Once,
                auto: false
            }
        );
        let later = gate.deny("run-1", "r1");
        assert_eq!(later.body()["state"], "approved");
        assert_eq!(later.body()["applied"], false);
        assert_eq!(gate.deny("run-1", "nope"), PodAnswer::Unknown);
    }

    #[tokio::test]
    async fn cards_expire_at_their_deadline_and_when_abandoned() {
        let gate = PodGate::new("c");
        let pending = gate.arm(PodArm::new("r1", "run-1", "t").timeout(Duration::from_millis(50)));
        assert_eq!(pending.await, PodDecision::Expired);
        assert_eq!(
            gate.approve("run-1", "r1", Scope::Once).body()["state"],
            "expired"
        );
        let dropped = gate.arm(PodArm::new("r2", "run-1", "t"));
        drop(dropped);
        assert_eq!(gate.card("r2").unwrap()["state"], "expired");
        // Two waiters on one card: dropping one keeps it pending for the other.
        let a = gate.arm(PodArm::new("r3", "run-1", "t"));
        let b = gate.arm(PodArm::new("r3", "run-1", "t"));
        drop(a);
        assert_eq!(gate.card("r3").unwrap()["state"], "pending");
        gate.deny("run-1", "r3");
        assert_eq!(b.await, PodDecision::Denied);
    }

    #[tokio::test]
    async fn the_same_decision_sent_again_is_applied_again_and_ids_stay_with_their_call() {
        let gate = PodGate::new("c");
        let pending = gate.arm(PodArm::new("r1", "run-1", "web_fetch"));
        let first = gate.decide_once("run-1", "r1", Some(Scope::Tool), "d-1");
        assert_eq!(first.body()["applied"], true);
        // Its answer was lost: the same decision again is still the one that applied.
        let again = gate.decide_once("run-1", "r1", Some(Scope::Tool), "d-1");
        assert_eq!(again.body()["applied"], true);
        assert_eq!(again.body()["scope"], "tool");
        // Any other decision finds the card ended.
        for other in [
            gate.decide_once("run-1", "r1", Some(Scope::Tool), "d-2"),
            gate.decide_once("run-1", "r1", None, "d-1"),
            gate.approve("run-1", "r1", Scope::Tool),
        ] {
            assert_eq!(other.body()["applied"], false, "{other:?}");
        }
        assert_eq!(
            pending.await,
            PodDecision::Approved {
                scope: Scope::Tool,
                auto: false
            }
        );
        // The id armed again for another run or tool inherits nothing.
        let waiting = gate.arm(PodArm::new("r9", "run-1", "search"));
        assert_eq!(
            gate.arm(PodArm::new("r9", "run-2", "search")).decided(),
            Some(PodDecision::Expired)
        );
        assert_eq!(
            gate.arm(PodArm::new("r9", "run-1", "shell")).decided(),
            Some(PodDecision::Expired)
        );
        assert_eq!(gate.card("r9").unwrap()["state"], "pending");
        gate.deny("run-1", "r9");
        assert_eq!(waiting.await, PodDecision::Denied);
    }

    #[tokio::test]
    async fn bridges_reach_exactly_their_scope() {
        let gate = PodGate::new("c");
        let _w = gate.arm(PodArm::new("a", "run-1", "web_fetch"));
        gate.approve("run-1", "a", Scope::Tool);
        let auto = PodDecision::Approved {
            scope: Scope::Tool,
            auto: true,
        };
        assert_eq!(gate.arm(PodArm::new("b", "run-1", "web_fetch")).await, auto);
        assert_eq!(
            gate.arm(PodArm::new("c", "run-1", "shell")).decided(),
            None,
            "another tool prompts"
        );
        assert_eq!(
            gate.arm(PodArm::new("d", "run-2", "web_fetch")).decided(),
            None,
            "another run prompts"
        );
        let _w = gate.arm(PodArm::new("e", "run-1", "shell"));
        gate.approve("run-1", "e", Scope::Once);
        assert_eq!(gate.arm(PodArm::new("f", "run-1", "shell")).decided(), None);
        let _w = gate.arm(PodArm::new("g", "run-3", "search"));
        gate.approve("run-3", "g", Scope::Always);
        assert_eq!(
            gate.arm(PodArm::new("h", "run-4", "search")).await,
            PodDecision::Approved {
                scope: Scope::Always,
                auto: true
            }
        );
        assert_eq!(gate.card("h").unwrap()["autoApproved"], true);
    }

    #[tokio::test]
    async fn a_pending_card_of_an_ended_run_cannot_be_decided() {
        let gate = PodGate::new("c");
        let _w = gate.arm(PodArm::new("r1", "run-1", "t"));
        gate.end_run("run-1");
        let a = gate.approve("run-1", "r1", Scope::Once);
        assert_eq!(a, PodAnswer::RunNotActive);
        assert_eq!(a.status(), 409);
        assert_eq!(a.body()["state"], "pending");
    }
}
