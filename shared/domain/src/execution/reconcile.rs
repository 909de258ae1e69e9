//! An operator's reconciliation of an `outcome_unknown` mutation.

use super::*;
use crate::run::RunStatus;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::execution::fixtures::*;
    use serde_json::json;

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
        assert_eq!(d.answer().verdict, Verdict::Ok);
        assert_eq!(d.answer().body(), json!({"state": "completed"}));

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
        assert_eq!(contra.answer().body()["state"], "not_executed");
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
        assert_eq!(late.answer().body(), json!({"state": "outcome_unknown"}));
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
        assert_eq!(d.answer().body()["state"], "dispatched");
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
            assert_eq!(d.answer().body()["state"], record.state.as_str());
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
}
