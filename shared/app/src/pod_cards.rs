//! The use-cases of cards an AgentHost pod holds and announces itself (seed 003,
//! docs/architecture.md §8): recording an announcement, the pod's heartbeats and its own
//! expiry, and a decision forwarded on a card Tollgate never saw.
//! `shared/api/src/pod_cards.rs` parses the pod's events and answers them.

use std::time::Duration;
use tollgate_domain::event::types as ev;

use tollgate_domain::{now_millis, ApprovalRequest, ApprovalState, Resolution, RunHead, Scope};
use tollgate_store::{Beat, Forwarded, Located, Resolved, StoreError};

use crate::approvals::{ArmOutcome, Gate};

/// The event types a pod appends for the cards it holds.
pub const POD_CARD_EVENTS: [&str; 3] = [
    ev::APPROVAL_REQUIRED,
    ev::APPROVAL_PENDING,
    ev::APPROVAL_RESOLVED,
];

/// Whether an appended event's `type` is one of [`POD_CARD_EVENTS`].
pub fn is_pod_card_event(event_type: Option<&str>) -> bool {
    event_type.is_some_and(|t| POD_CARD_EVENTS.contains(&t))
}

/// How long after the pod's own timeout Tollgate's backstop expires a pod-held card: long
/// enough that the pod's expiry (or a decision forwarded just before it) always comes
/// first while the pod lives.
pub fn pod_expiry_grace(gate: &Gate) -> Duration {
    Duration::from_secs(60).max(gate.config().forward_timeout * 2)
}

/// What a pod's heartbeat or expiry did.
#[derive(Debug, Clone, PartialEq)]
pub enum PodCardStep {
    /// Appended at this sequence (heartbeats).
    Appended(u64),
    /// The card ended now (its `tool.approval_resolved` is on the run).
    Ended(Box<ApprovalRequest>),
    /// Nothing written: why, and the card's state.
    Dropped {
        reason: &'static str,
        state: ApprovalState,
    },
    /// No pod-held card with that id on the run.
    Unknown,
}

impl Gate {
    /// Records a decision forwarded to `head`'s pod on a card the gate never saw
    /// (`card`, as the pod answered it) — once, however often it is forwarded — with the
    /// policy `grant` names (its scope and who approved) when this forward applied an
    /// approval beyond `once` (`ApprovalStore::record_forwarded`).
    pub async fn record_forwarded_decision(
        &self,
        head: &RunHead,
        card: &ApprovalRequest,
        grant: Option<(Scope, &str)>,
    ) -> Result<Forwarded, crate::AppError> {
        let policy = match grant {
            Some((scope, by)) => {
                let coordinator = match &head.parent_run_id {
                    Some(parent) => self.store.read_head(parent).await?,
                    None => None,
                };
                let located = Located {
                    card: card.clone(),
                    head: Some(head.clone()),
                    coordinator,
                    count_shard: None,
                };
                self.grant_for(&located, scope, by)
            }
            None => None,
        };
        Ok(self
            .store
            .record_forwarded(&head.run_id, card, policy)
            .await?)
    }

    /// Records a card the run's pod announced (`card.held_by_pod`): stored pending with
    /// its event (and its coordinator's mirror) in one transaction; only the backstop
    /// expiry is scheduled. A repeated announcement answers the card as it stands.
    pub async fn announce_pod_card(
        &self,
        head: &RunHead,
        incarnation: &str,
        mut card: ApprovalRequest,
    ) -> Result<ArmOutcome, StoreError> {
        card.held_by_pod = true;
        self.arm(head, incarnation, card).await
    }

    /// A pod's heartbeat for a card it announced. Numbered by time (one per half
    /// interval since the card was recorded), so a retried append, or a pod beating
    /// faster than that, writes nothing twice.
    pub async fn pod_heartbeat(
        &self,
        run_id: &str,
        request_id: &str,
    ) -> Result<PodCardStep, StoreError> {
        let Some(card) = self
            .store
            .read_card(run_id, request_id)
            .await?
            .filter(|c| c.held_by_pod)
        else {
            return Ok(PodCardStep::Unknown);
        };
        if card.state != ApprovalState::Pending {
            return Ok(PodCardStep::Dropped {
                reason: "card_resolved",
                state: card.state,
            });
        }
        let half = (self.config.heartbeat_every.as_millis() as i64 / 2).max(1);
        let beat =
            u32::try_from((now_millis() - card.created_at).max(0) / half + 1).unwrap_or(u32::MAX);
        Ok(
            match self.store.heartbeat(run_id, request_id, beat).await? {
                Beat::Emitted(sequence) => PodCardStep::Appended(sequence),
                Beat::Repeated(_) => PodCardStep::Dropped {
                    reason: "too_soon",
                    state: ApprovalState::Pending,
                },
                // Ended between the read and the write.
                Beat::Stopped => PodCardStep::Dropped {
                    reason: "card_resolved",
                    state: self
                        .store
                        .read_card(run_id, request_id)
                        .await?
                        .map_or(ApprovalState::Expired, |c| c.state),
                },
            },
        )
    }

    /// The pod's own timeout ended a card it announced.
    pub async fn pod_expired(
        &self,
        run_id: &str,
        request_id: &str,
    ) -> Result<PodCardStep, StoreError> {
        match self.store.read_card(run_id, request_id).await? {
            Some(card) if card.held_by_pod => {}
            _ => return Ok(PodCardStep::Unknown),
        }
        Ok(
            match self
                .store
                .resolve(run_id, request_id, Resolution::Expired, now_millis(), None)
                .await?
            {
                Resolved::Fresh(card) => PodCardStep::Ended(Box::new(card)),
                Resolved::Already(card) => PodCardStep::Dropped {
                    reason: "card_resolved",
                    state: card.state,
                },
            },
        )
    }
}
