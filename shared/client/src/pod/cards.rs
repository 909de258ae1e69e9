//! The cards a pod holds: the shared state behind a [`PodGate`], where each bridge
//! reaches, and [`PendingApproval`], the future of one card's decision.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::oneshot;
use tokio::time::{Instant, Sleep};

use crate::gate::Scope;
use crate::Run;

use super::*;

pub(super) struct Inner {
    /// SHA-256 of the credential: compared digest to digest, in constant time.
    pub(super) credential: [u8; 32],
    pub(super) state: Mutex<Cards>,
}

impl Inner {
    pub(super) fn lock(&self) -> MutexGuard<'_, Cards> {
        // Every change below is made whole under the lock: a panic elsewhere cannot leave
        // a half-made one, so a poisoned lock is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Where a bridge reaches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Bridge {
    /// This tool on this run (`tool`, `run`).
    Run { run_id: String, tool_name: String },
    /// This tool on any run of the pod (`always`).
    Pod { tool_name: String },
}

#[derive(Default)]
pub(super) struct Cards {
    pub(super) cards: HashMap<String, Card>,
    pub(super) ended_runs: HashSet<String>,
    pub(super) bridges: HashMap<Bridge, Scope>,
    pub(super) next_waiter: u64,
    /// Runs whose cards are announced on their stream ([`PodGate::announce_through`]).
    pub(super) announce: HashMap<String, Run>,
    /// `None`: [`DEFAULT_POD_HEARTBEAT`].
    pub(super) heartbeat_every: Option<Duration>,
}

pub(super) struct Card {
    pub(super) arm: PodArm,
    pub(super) expires_at: Instant,
    pub(super) state: Option<PodDecision>,
    /// The `decisionId` of the forward that decided it, if it carried one: the same
    /// decision sent again (its answer was lost) is answered as applied again.
    pub(super) decided_by_id: Option<String>,
    pub(super) waiters: Vec<(u64, oneshot::Sender<PodDecision>)>,
    /// Wakes the card's announcer when it ends.
    pub(super) ended: Arc<tokio::sync::Notify>,
}

impl Card {
    /// Ends a pending card and tells everyone waiting.
    pub(super) fn end(&mut self, decision: PodDecision) {
        self.state = Some(decision);
        for (_, tx) in self.waiters.drain(..) {
            let _ = tx.send(decision);
        }
        self.ended.notify_one();
    }

    /// A pending card past its deadline expires (a click at or after it never approves).
    pub(super) fn expire_if_due(&mut self, now: Instant) {
        if self.state.is_none() && now >= self.expires_at {
            self.end(PodDecision::Expired);
        }
    }

    pub(super) fn to_json(&self) -> Value {
        let a = &self.arm;
        let mut card = json!({
            "runId": a.run_id,
            "requestId": a.request_id,
            "toolName": a.tool_name,
            "toolCallId": a.tool_call_id.as_deref().unwrap_or(&a.request_id),
            "approvalId": a.approval_id.as_deref().unwrap_or(&a.request_id),
            "url": a.url,
            "intention": a.intention,
            "message": a.message,
            "state": self.state.map_or("pending", |d| d.state()),
        });
        if let Some(d) = self.state {
            card["scope"] = d.scope().map(Scope::as_str).into();
            card["autoApproved"] = matches!(d, PodDecision::Approved { auto: true, .. }).into();
        }
        card
    }
}

impl Cards {
    pub(super) fn bridge_for(&self, run_id: &str, tool_name: &str) -> Option<Scope> {
        let run = Bridge::Run {
            run_id: run_id.to_owned(),
            tool_name: tool_name.to_owned(),
        };
        let pod = Bridge::Pod {
            tool_name: tool_name.to_owned(),
        };
        self.bridges
            .get(&run)
            .or_else(|| self.bridges.get(&pod))
            .copied()
    }

    pub(super) fn install_bridge(&mut self, card: &PodArm, scope: Scope) {
        let bridge = match scope {
            Scope::Once => return,
            Scope::Tool | Scope::Run => Bridge::Run {
                run_id: card.run_id.clone(),
                tool_name: card.tool_name.clone(),
            },
            Scope::Always => Bridge::Pod {
                tool_name: card.tool_name.clone(),
            },
        };
        self.bridges.insert(bridge, scope);
    }
}

/// A decision to take on a card.
#[derive(Debug, Clone, Copy)]
pub(super) enum Verb {
    Approve(Scope),
    Deny,
}

/// The future of a pod card's decision ([`PodGate::arm`]). Dropping every future of a
/// card that is still pending expires it.
pub struct PendingApproval {
    pub(super) gate: Arc<Inner>,
    pub(super) request_id: String,
    pub(super) waiter: u64,
    pub(super) expires_at: Instant,
    pub(super) immediate: Option<PodDecision>,
    pub(super) rx: Option<oneshot::Receiver<PodDecision>>,
    /// Made on first poll, so `arm` works outside a Tokio runtime too.
    pub(super) sleep: Option<Pin<Box<Sleep>>>,
}

impl fmt::Debug for PendingApproval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PendingApproval")
            .field("request_id", &self.request_id)
            .field("immediate", &self.immediate)
            .finish_non_exhaustive()
    }
}

impl PendingApproval {
    /// The card's id.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// The decision, when it was known at arm time (a bridge approved it, or the card
    /// had already ended).
    pub fn decided(&self) -> Option<PodDecision> {
        self.immediate
    }

    /// The card's decision as it stands (the deadline expires it).
    fn settled_state(&self) -> PodDecision {
        let mut cards = self.gate.lock();
        match cards.cards.get_mut(&self.request_id) {
            Some(card) => {
                card.expire_if_due(Instant::now());
                card.state.unwrap_or(PodDecision::Expired)
            }
            None => PodDecision::Expired,
        }
    }
}

impl Future for PendingApproval {
    type Output = PodDecision;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<PodDecision> {
        let this = self.get_mut();
        if let Some(decision) = this.immediate {
            return Poll::Ready(decision);
        }
        if let Some(rx) = this.rx.as_mut() {
            match Pin::new(rx).poll(cx) {
                Poll::Ready(Ok(decision)) => {
                    this.immediate = Some(decision);
                    return Poll::Ready(decision);
                }
                Poll::Ready(Err(_)) => this.rx = None,
                Poll::Pending => {}
            }
        }
        if this.rx.is_none() {
            let decision = this.settled_state();
            this.immediate = Some(decision);
            return Poll::Ready(decision);
        }
        let expires_at = this.expires_at;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(expires_at)));
        if sleep.as_mut().poll(cx).is_ready() {
            // Due: the card expires now unless a decision won just before.
            let decision = this.settled_state();
            this.immediate = Some(decision);
            return Poll::Ready(decision);
        }
        Poll::Pending
    }
}

impl Drop for PendingApproval {
    fn drop(&mut self) {
        if self.immediate.is_some() {
            return;
        }
        let mut cards = self.gate.lock();
        if let Some(card) = cards.cards.get_mut(&self.request_id) {
            card.waiters.retain(|(id, _)| *id != self.waiter);
            if card.state.is_none() && card.waiters.is_empty() {
                // Nobody waits for this call any more: no decision may apply to it.
                card.end(PodDecision::Expired);
            }
        }
    }
}
