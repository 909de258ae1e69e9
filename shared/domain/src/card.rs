//! An approval card's lifecycle as one transition table (`docs/architecture.md` §6): pure
//! functions that take what a store read — the card as stored, whether its run and its
//! coordinator still run — and return what to write. Each store adapter commits the
//! answer mechanically (the embedded store under its lock; DynamoDB in one transaction
//! conditioned on exactly those reads, reading again and asking again when it loses), the
//! way approved execution commits `execution::Decision`s.
//!
//! | card as read | input | run | step |
//! |---|---|---|---|
//! | any, same `request_id` | arm | any | [`ArmStep::Existing`]: nothing written (a retry) |
//! | none | arm | ended | [`ArmStep::RunEnded`] |
//! | none | arm | running, at the per-run cap | [`ArmStep::TooManyOpen`] |
//! | none | arm | running | [`ArmStep::Create`]: card + `tool.approval_required`; the coordinator's mirror and route only while it runs |
//! | pending | approve / deny before the deadline | running | [`EndStep::End`] as asked, with the scope's policy when approved |
//! | pending | approve / deny at or after the deadline | running | [`EndStep::End`] as expired (invariant 5) |
//! | pending | expire (timer, sweeper) | running | [`EndStep::End`] as expired |
//! | pending | any ending | ended | [`EndStep::End`] as `run_ended`: no event on the run, the running coordinator still told |
//! | ended | any ending (late click, late or repeated timer) | any | [`EndStep::Already`]: nothing written (invariant 3) |
//! | pending | heartbeat `n` | running | [`BeatStep::Append`] `tool.approval_pending` |
//! | none or ended | heartbeat | any | [`BeatStep::Stop`] (invariant 4) |
//! | any | heartbeat | ended | [`BeatStep::Stop`] |
//!
//! What the reads cannot decide stays a condition of the commit: a `request_id` routed
//! to another child under the same coordinator, and the project's open-card cap.

use crate::approval::{ApprovalRequest, ApprovalState, Policy, Resolution, MAX_OPEN_CARDS_PER_RUN};
use crate::event::EventDraft;

/// What arming a card decides from the reads ([`arm`]). (A step lives for one commit;
/// its size does not matter.)
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum ArmStep {
    /// A card with this `request_id` is stored: it is the answer; nothing is written.
    Existing(ApprovalRequest),
    /// The run has ended: nothing may follow its terminal event.
    RunEnded,
    /// The run holds [`MAX_OPEN_CARDS_PER_RUN`] pending cards already.
    TooManyOpen,
    /// Store the card and append its events, in one step.
    Create(Arming),
}

/// The writes of a card's arming.
#[derive(Debug, Clone, PartialEq)]
pub struct Arming {
    /// The pending card as stored: its `coordinator_run_id` is cleared when the
    /// coordinator does not run (nothing routes to it then).
    pub card: ApprovalRequest,
    /// `tool.approval_required`, on the card's run.
    pub on_run: EventDraft,
    /// `coordinator.child_approval_required` on the running coordinator, written with the
    /// route item that leads decisions posted there to this run's card.
    pub on_coordinator: Option<EventDraft>,
}

/// Arming `card`: `stored` is the card stored under its `request_id`, `open_on_run` the
/// run's pending cards, `coordinator_running` whether the card's coordinator (if any)
/// runs.
pub fn arm(
    card: ApprovalRequest,
    stored: Option<&ApprovalRequest>,
    run_running: bool,
    open_on_run: u64,
    coordinator_running: bool,
) -> ArmStep {
    if let Some(existing) = stored {
        return ArmStep::Existing(existing.clone());
    }
    if !run_running {
        return ArmStep::RunEnded;
    }
    if open_on_run >= MAX_OPEN_CARDS_PER_RUN {
        return ArmStep::TooManyOpen;
    }
    let mut card = card;
    // (A run is never its own coordinator: one step cannot advance one run twice.)
    let coordinated = coordinator_running
        && card
            .coordinator_run_id
            .as_ref()
            .is_some_and(|c| *c != card.run_id);
    if !coordinated {
        card.coordinator_run_id = None;
    }
    ArmStep::Create(Arming {
        on_run: card.required_event(),
        on_coordinator: coordinated.then(|| card.coordinator_required_event()),
        card,
    })
}

/// What ending a card decides from the reads ([`end`]).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum EndStep {
    /// The card had ended already: its stored state is the answer (a late click, a late
    /// or repeated timer, the loser of a race); nothing is written.
    Already(ApprovalRequest),
    /// End it now.
    End(Ending),
}

/// The writes of a card's ending, in one step.
#[derive(Debug, Clone, PartialEq)]
pub struct Ending {
    /// The card as it ends.
    pub card: ApprovalRequest,
    /// `tool.approval_resolved` on the card's run; `None` when the run has ended (nothing
    /// may follow its terminal event).
    pub on_run: Option<EventDraft>,
    /// `coordinator.child_approval_resolved` on the running coordinator.
    pub on_coordinator: Option<EventDraft>,
    /// The scope's policy, only when this step approves the card (invariant 6: a policy
    /// exists only if the approval that grants it won); it reaches the card's run.
    pub grant: Option<Policy>,
}

/// Ending the pending `stored` card as `asked` at `at` (milliseconds): approved or denied
/// only before its deadline and while its run runs; expired past the deadline; `run_ended`
/// on an ended run (`Resolution::effective`). `grant` is the policy an approval's scope
/// makes.
pub fn end(
    stored: &ApprovalRequest,
    asked: Resolution,
    run_running: bool,
    coordinator_running: bool,
    at: i64,
    grant: Option<Policy>,
) -> EndStep {
    if stored.state != ApprovalState::Pending {
        return EndStep::Already(stored.clone());
    }
    let resolution = asked.effective(run_running, at, stored.expires_at);
    let card = stored.resolved(&resolution, at);
    let coordinated = coordinator_running
        && card
            .coordinator_run_id
            .as_ref()
            .is_some_and(|c| *c != card.run_id);
    let grant = grant
        .filter(|_| card.state == ApprovalState::Approved)
        .map(|mut policy| {
            policy.reached_runs = vec![card.run_id.clone()];
            policy
        });
    EndStep::End(Ending {
        on_run: run_running.then(|| card.resolved_event()),
        on_coordinator: coordinated.then(|| card.coordinator_resolved_event()),
        grant,
        card,
    })
}

/// What a heartbeat decides ([`beat`]).
#[derive(Debug, Clone, PartialEq)]
pub enum BeatStep {
    /// Append `tool.approval_pending` (keyed per beat, so a repeated delivery finds it).
    Append(EventDraft),
    /// No heartbeat, now or later: the card is gone or ended, or its run ended.
    Stop,
}

/// Beat `n` of the card `stored` (as read with its run's head).
pub fn beat(stored: Option<&ApprovalRequest>, run_running: bool, n: u32) -> BeatStep {
    match stored {
        Some(card) if run_running && card.state == ApprovalState::Pending => {
            BeatStep::Append(card.pending_event(n))
        }
        _ => BeatStep::Stop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approval::{Scope, REASON_RUN_ENDED};

    const DEADLINE: i64 = 10_000;

    fn card(coordinator: Option<&str>) -> ApprovalRequest {
        ApprovalRequest {
            run_id: "run-1".into(),
            request_id: "req-1".into(),
            tool_name: "web_fetch".into(),
            tool_call_id: "req-1".into(),
            approval_id: "req-1".into(),
            explicit_ids: false,
            url: Some("https://example.com".into()),
            intention: None,
            message: None,
            arguments_hash: None,
            state: ApprovalState::Pending,
            scope: None,
            decided_by: None,
            decided_at: None,
            created_at: 1_000,
            expires_at: DEADLINE,
            coordinator_run_id: coordinator.map(Into::into),
            subtask_id: None,
            project_id: None,
            end_reason: None,
            auto_approval: None,
            arguments_preview: None,
            decision_reason: None,
            held_by_pod: false,
        }
    }

    fn approve() -> Resolution {
        Resolution::Approved {
            scope: Scope::Run,
            by: "alice".into(),
            reason: None,
        }
    }

    fn policy() -> Policy {
        Policy {
            scope_key: "run:run-1".into(),
            tool_name: "web_fetch".into(),
            scope: Scope::Run,
            owner: None,
            project_id: None,
            origin_run_id: "run-1".into(),
            request_id: "req-1".into(),
            granted_by: "alice".into(),
            granted_at: 2_000,
            revoked_by: None,
            revoked_at: None,
            reached_runs: Vec::new(),
        }
    }

    fn ended(step: EndStep) -> Ending {
        match step {
            EndStep::End(e) => e,
            other => panic!("expected an ending, got {other:?}"),
        }
    }

    #[test]
    fn arming_follows_the_table() {
        let stored = card(None);
        assert_eq!(
            arm(card(None), Some(&stored), false, 0, false),
            ArmStep::Existing(stored.clone()),
            "a retried arm answers the stored card even on an ended run"
        );
        assert_eq!(arm(card(None), None, false, 0, true), ArmStep::RunEnded);
        assert_eq!(
            arm(card(None), None, true, MAX_OPEN_CARDS_PER_RUN, false),
            ArmStep::TooManyOpen
        );
        let ArmStep::Create(a) = arm(card(Some("coord")), None, true, 0, true) else {
            panic!("expected a creation");
        };
        assert_eq!(a.on_run.event_type, "tool.approval_required");
        assert_eq!(
            a.on_coordinator.map(|e| e.event_type),
            Some("coordinator.child_approval_required".into())
        );
        assert_eq!(a.card.coordinator_run_id.as_deref(), Some("coord"));
        // A coordinator that does not run is dropped from the card.
        let ArmStep::Create(a) = arm(card(Some("coord")), None, true, 0, false) else {
            panic!("expected a creation");
        };
        assert_eq!((a.on_coordinator, a.card.coordinator_run_id), (None, None));
        // A run is never its own coordinator.
        let mut own = card(Some("run-1"));
        own.coordinator_run_id = Some("run-1".into());
        let ArmStep::Create(a) = arm(own, None, true, 0, true) else {
            panic!("expected a creation");
        };
        assert_eq!((a.on_coordinator, a.card.coordinator_run_id), (None, None));
    }

    #[test]
    fn a_decision_before_the_deadline_ends_the_card_as_asked_with_its_grant() {
        let e = ended(end(
            &card(Some("coord")),
            approve(),
            true,
            true,
            5_000,
            Some(policy()),
        ));
        assert_eq!(e.card.state, ApprovalState::Approved);
        assert_eq!(e.card.decided_by.as_deref(), Some("alice"));
        assert_eq!(
            e.on_run.map(|d| d.event_type),
            Some("tool.approval_resolved".into())
        );
        assert_eq!(
            e.on_coordinator.map(|d| d.event_type),
            Some("coordinator.child_approval_resolved".into())
        );
        assert_eq!(
            e.grant.map(|p| p.reached_runs),
            Some(vec!["run-1".to_string()])
        );
        let denied = ended(end(
            &card(None),
            Resolution::Denied {
                by: "bob".into(),
                reason: None,
            },
            true,
            false,
            5_000,
            Some(policy()),
        ));
        assert_eq!(denied.card.state, ApprovalState::Denied);
        assert_eq!(denied.grant, None, "only an approval grants");
        assert_eq!(denied.on_coordinator, None);
    }

    #[test]
    fn a_click_at_or_after_the_deadline_expires_the_card_and_grants_nothing() {
        for at in [DEADLINE, DEADLINE + 1] {
            let e = ended(end(&card(None), approve(), true, false, at, Some(policy())));
            assert_eq!(e.card.state, ApprovalState::Expired, "at {at}");
            assert_eq!(e.card.end_reason, None);
            assert_eq!(e.grant, None);
            assert!(e.on_run.is_some());
        }
        let timer = ended(end(
            &card(None),
            Resolution::Expired,
            true,
            false,
            DEADLINE,
            None,
        ));
        assert_eq!(timer.card.state, ApprovalState::Expired);
    }

    #[test]
    fn on_an_ended_run_every_ending_is_run_ended_with_no_event_on_the_run() {
        for asked in [
            approve(),
            Resolution::Denied {
                by: "b".into(),
                reason: None,
            },
            Resolution::Expired,
        ] {
            let e = ended(end(
                &card(Some("coord")),
                asked,
                false,
                true,
                5_000,
                Some(policy()),
            ));
            assert_eq!(e.card.state, ApprovalState::Expired);
            assert_eq!(e.card.end_reason.as_deref(), Some(REASON_RUN_ENDED));
            assert_eq!(e.on_run, None, "nothing follows a terminal event");
            assert!(
                e.on_coordinator.is_some(),
                "the running coordinator is told"
            );
            assert_eq!(e.grant, None);
        }
    }

    #[test]
    fn late_arrivals_on_an_ended_card_write_nothing() {
        let approved = card(None).resolved(&approve(), 5_000);
        for asked in [
            approve(),
            Resolution::Denied {
                by: "b".into(),
                reason: None,
            },
            Resolution::Expired,
            Resolution::RunEnded,
        ] {
            assert_eq!(
                end(&approved, asked, true, true, 6_000, Some(policy())),
                EndStep::Already(approved.clone())
            );
        }
        assert_eq!(beat(Some(&approved), true, 3), BeatStep::Stop);
    }

    #[test]
    fn heartbeats_only_for_a_pending_card_on_a_running_run() {
        let pending = card(None);
        match beat(Some(&pending), true, 2) {
            BeatStep::Append(d) => assert_eq!(d.event_type, "tool.approval_pending"),
            BeatStep::Stop => panic!("a pending card on a running run beats"),
        }
        assert_eq!(beat(Some(&pending), false, 2), BeatStep::Stop);
        assert_eq!(beat(None, true, 2), BeatStep::Stop);
    }
}
