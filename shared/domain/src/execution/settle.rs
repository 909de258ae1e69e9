//! After a start: `dispatch` (the fence before any transport), `settle` with the agent's
//! evidence, the settlement deadline's own settlement, and the execution heartbeats of a
//! dispatched call awaiting its settlement.

use serde_json::{json, Value};

use super::*;
use crate::event::EventDraft;
use crate::run::RunStatus;

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
    use crate::execution::fixtures::*;

    // --- dispatch ------------------------------------------------------------------

    #[test]
    fn dispatch_moves_intent_to_dispatched_without_an_event() {
        let d = dispatch(&intent(), RunStatus::Running, T0 + 1_000);
        assert!(d.changed && d.accepted());
        assert!(d.events.is_empty());
        assert_eq!(d.record.state, MutationState::Dispatched);
        assert_eq!(d.record.dispatched_at, Some(T0 + 1_000));
        assert_eq!(d.answer().verdict, Verdict::Ok);
        assert_eq!(d.answer().body(), json!({"state": "dispatched"}));
    }

    #[test]
    fn a_repeated_dispatch_is_refused_with_the_state() {
        let d = dispatch(&dispatched(), RunStatus::Running, T0 + 2_000);
        assert!(!d.changed && !d.accepted());
        assert_eq!(d.answer().verdict, Verdict::Conflict);
        assert_eq!(d.answer().body()["state"], "dispatched");
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
            assert_eq!(d.answer().body()["state"], settled.state.as_str());
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
        assert_eq!(d.answer().body()["state"], "not_executed");
        assert_eq!(d.answer().body()["reason"], "unsent");
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
        assert_eq!(d.answer().body()["reason"], "run_not_running");
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
        assert_eq!(d.answer().verdict, Verdict::Ok);
        assert_eq!(d.answer().body(), json!({"state": "completed"}));
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
                d.answer().body(),
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
        assert_eq!(late.answer().body()["state"], "outcome_unknown");
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
            assert_eq!(d.answer().body()["state"], "intent");
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
        assert_eq!(d.answer().body()["state"], "not_executed");
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
        assert_eq!(again.answer().body(), json!({"state": "completed"}));
        let contra = settle(&done, &not_sent(), RunStatus::Running, T0 + 3_000);
        assert!(!contra.changed && !contra.accepted());
        assert_eq!(contra.answer().body()["state"], "completed");
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
        assert_eq!(d.answer().body()["state"], "outcome_unknown");
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
