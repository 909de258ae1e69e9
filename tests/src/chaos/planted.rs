//! The checker can fail: a clean hand-built history passes, and one planted violation of
//! each invariant is caught (and named).

use serde_json::{json, Value};

use super::checker::*;

/// When the history's clicks were sent: 2026-12-01T10:00:00Z.
const CLICKED_AT: i64 = 1_796_119_200_000;

fn ev(seq: u64, ty: &str, extra: Value) -> Value {
    let mut e = json!({"protocol_version": "v2", "run_id": "r1", "sequence": seq, "type": ty,
                       "timestamp_utc": "2026-12-01T10:00:00.000Z"});
    e.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    e
}

fn ids(call: &str, approval: &str) -> Value {
    json!({"tool_call_id": call, "approval_id": approval})
}

fn merge(a: Value, b: Value) -> Value {
    let mut a = a;
    a.as_object_mut()
        .unwrap()
        .extend(b.as_object().unwrap().clone());
    a
}

fn op(kind: OpKind, status: u16, body: Value) -> Op {
    Op {
        kind,
        outcome: Outcome::Answered { status, body },
        saw_failure: false,
        sent_at_ms: Some(CLICKED_AT),
        answered_at_ms: CLICKED_AT,
    }
}

/// A run with an append, a card approved by a click with scope `tool` (and its policy),
/// an execution completed, a second card denied, and the run completed.
fn clean() -> History {
    let events = vec![
        ev(1, "run_started", json!({})),
        ev(2, "agent.step", json!({"event_id": "e1"})),
        ev(3, "agent.step", json!({"event_id": "e2"})),
        ev(
            4,
            "tool.approval_required",
            merge(json!({"requestId": "q1"}), ids("c1", "a1")),
        ),
        ev(
            5,
            "tool.approval_pending",
            merge(json!({"requestId": "q1"}), ids("c1", "a1")),
        ),
        ev(
            6,
            "tool.approval_resolved",
            merge(
                json!({"requestId": "q1", "approved": true, "expired": false, "scope": "tool"}),
                ids("c1", "a1"),
            ),
        ),
        ev(7, "tool_execution_started", ids("c1", "a1")),
        ev(
            8,
            "tool_execution",
            merge(json!({"mutation_outcome": "completed"}), ids("c1", "a1")),
        ),
        ev(
            9,
            "tool.approval_required",
            merge(json!({"requestId": "q2"}), ids("c2", "a2")),
        ),
        ev(
            10,
            "tool.approval_resolved",
            merge(
                json!({"requestId": "q2", "approved": false, "expired": false}),
                ids("c2", "a2"),
            ),
        ),
        ev(11, "run_completed", json!({})),
    ];
    let card = |rid: &str, state: &str, scope: Option<&str>| FinalCard {
        run_id: "r1".into(),
        request_id: rid.into(),
        card: Some(json!({"request_id": rid, "state": state, "scope": scope,
                          "expires_at": "2026-12-01T11:00:00.000Z"})),
    };
    History {
        ops: vec![
            op(
                OpKind::CreateRun {
                    delivery_id: "d1".into(),
                    kind: "single".into(),
                    parent: None,
                },
                201,
                json!({"run_id": "r1"}),
            ),
            op(
                OpKind::Append {
                    run_id: "r1".into(),
                    event_ids: vec!["e1".into(), "e2".into()],
                },
                200,
                json!({"sequences": [2, 3]}),
            ),
            op(
                OpKind::Decide {
                    run_id: "r1".into(),
                    request_id: "q1".into(),
                    approve: true,
                    scope: "tool".into(),
                },
                200,
                json!({"state": "approved"}),
            ),
            op(
                OpKind::Decide {
                    run_id: "r1".into(),
                    request_id: "q2".into(),
                    approve: false,
                    scope: "once".into(),
                },
                200,
                json!({"state": "denied"}),
            ),
        ],
        runs: vec![FinalRun {
            run_id: "r1".into(),
            events,
            mutations: vec![
                json!({"tool_call_id": "c1", "approval_id": "a1", "state": "completed"}),
            ],
            stuck_after: None,
        }],
        cards: vec![
            card("q1", "approved", Some("tool")),
            card("q2", "denied", None),
        ],
        policies: vec![
            json!({"policy_id": "p1", "origin_run_id": "r1", "request_id": "q1",
                              "scope": "tool"}),
        ],
        receipts: vec![("d1".into(), Some("r1".into()))],
        storage_kills_ms: vec![],
    }
}

fn caught(h: &History, invariant: Invariant) {
    let found = check(h);
    assert!(
        found.iter().any(|v| v.invariant == invariant),
        "{invariant:?} not caught; found {found:#?}"
    );
}

fn events(h: &mut History) -> &mut Vec<Value> {
    &mut h.runs[0].events
}

/// Renumbers the stream 1, 2, 3, … (so that a planted event breaks only what it means to).
fn renumber(h: &mut History) {
    for (i, e) in events(h).iter_mut().enumerate() {
        e["sequence"] = json!(i + 1);
    }
}

#[test]
fn a_clean_history_passes() {
    assert_eq!(check(&clean()), vec![]);
}

#[test]
fn an_acknowledged_append_missing_is_caught() {
    let mut h = clean();
    events(&mut h).remove(2);
    renumber(&mut h);
    // The run's end and everything else still agree; only the acknowledged e2 is gone.
    caught(&h, Invariant::AckedAppendOnce);
}

/// An acknowledged append wholly absent is excused only when answered within the
/// window of a kill of DynamoDB Local (the emulator lost it), and then reported.
#[test]
fn an_append_lost_by_a_storage_kill_is_told_apart() {
    let mut h = clean();
    events(&mut h).drain(1..3);
    renumber(&mut h);
    h.storage_kills_ms = vec![CLICKED_AT + KILL_WINDOW_MS + 1];
    caught(&h, Invariant::AckedAppendOnce);
    h.storage_kills_ms = vec![CLICKED_AT + KILL_WINDOW_MS];
    assert!(!check(&h)
        .iter()
        .any(|v| v.invariant == Invariant::AckedAppendOnce));
    assert_eq!(lost_in_storage_kills(&h).len(), 1);
    // Half of it present is never excused.
    events(&mut h).insert(1, ev(0, "agent.step", json!({"event_id": "e1"})));
    renumber(&mut h);
    caught(&h, Invariant::AckedAppendOnce);
    assert!(lost_in_storage_kills(&h).is_empty());
}

#[test]
fn an_acknowledged_append_twice_is_caught() {
    let mut h = clean();
    let dup = events(&mut h)[1].clone();
    events(&mut h).insert(3, dup);
    renumber(&mut h);
    caught(&h, Invariant::AckedAppendOnce);
}

#[test]
fn a_gap_is_caught() {
    let mut h = clean();
    events(&mut h)[4]["sequence"] = json!(50);
    caught(&h, Invariant::GaplessSequence);
}

#[test]
fn a_replay_stuck_at_a_gap_is_caught() {
    let mut h = clean();
    events(&mut h).truncate(4);
    h.runs[0].stuck_after = Some(4);
    caught(&h, Invariant::GaplessSequence);
}

#[test]
fn an_event_after_the_terminal_is_caught() {
    let mut h = clean();
    events(&mut h).push(ev(12, "agent.step", json!({})));
    caught(&h, Invariant::NothingAfterTerminal);
}

#[test]
fn a_second_resolution_is_caught() {
    let mut h = clean();
    let again = events(&mut h)[5].clone();
    events(&mut h).insert(6, again);
    renumber(&mut h);
    caught(&h, Invariant::OneResolution);
}

#[test]
fn a_heartbeat_after_the_resolution_is_caught() {
    let mut h = clean();
    let beat = events(&mut h)[4].clone();
    events(&mut h).insert(6, beat);
    renumber(&mut h);
    caught(&h, Invariant::OneResolution);
}

#[test]
fn a_policy_without_an_approval_is_caught() {
    let mut h = clean();
    h.policies.push(
        json!({"policy_id": "p2", "origin_run_id": "r1", "request_id": "q2", "scope": "run"}),
    );
    caught(&h, Invariant::PolicyNeedsApproval);
}

#[test]
fn a_start_of_a_denied_card_is_caught() {
    let mut h = clean();
    events(&mut h).insert(10, ev(0, "tool_execution_started", ids("c2", "a2")));
    renumber(&mut h);
    caught(&h, Invariant::StartNeedsHumanApproval);
}

#[test]
fn a_start_of_an_auto_approved_card_is_caught() {
    let mut h = clean();
    let at = events(&mut h).len() - 1;
    events(&mut h).insert(
        at,
        ev(
            0,
            "tool.auto_approved",
            merge(json!({"requestId": "q3", "scope": "tool"}), ids("c3", "a3")),
        ),
    );
    events(&mut h).insert(at + 1, ev(0, "tool_execution_started", ids("c3", "a3")));
    renumber(&mut h);
    caught(&h, Invariant::StartNeedsHumanApproval);
}

#[test]
fn a_start_of_an_expired_card_is_caught() {
    let mut h = clean();
    let at = events(&mut h).len() - 1;
    let card = [
        ev(
            0,
            "tool.approval_required",
            merge(json!({"requestId": "q4"}), ids("c4", "a4")),
        ),
        ev(
            0,
            "tool.approval_resolved",
            merge(
                json!({"requestId": "q4", "approved": false, "expired": true}),
                ids("c4", "a4"),
            ),
        ),
        ev(0, "tool_execution_started", ids("c4", "a4")),
    ];
    for (i, e) in card.into_iter().enumerate() {
        events(&mut h).insert(at + i, e);
    }
    renumber(&mut h);
    caught(&h, Invariant::StartNeedsHumanApproval);
}

/// A second approved attempt of call `c1` started while the first is in flight (or
/// `outcome_unknown`).
fn second_attempt(h: &mut History, first_outcome: Option<&str>) {
    let evs = events(h);
    // Drop the first attempt's settlement (in flight), or make it `first_outcome`.
    match first_outcome {
        None => {
            evs.remove(7);
            h.runs[0].mutations[0]["state"] = json!("intent");
        }
        Some(outcome) => {
            evs[7]["mutation_outcome"] = json!(outcome);
            h.runs[0].mutations[0]["state"] = json!(outcome);
        }
    }
    let evs = events(h);
    let at = evs.len() - 1;
    let more = [
        ev(
            0,
            "tool.approval_required",
            merge(json!({"requestId": "q5"}), ids("c1", "a5")),
        ),
        ev(
            0,
            "tool.approval_resolved",
            merge(
                json!({"requestId": "q5", "approved": true, "expired": false}),
                ids("c1", "a5"),
            ),
        ),
        ev(0, "tool_execution_started", ids("c1", "a5")),
        ev(
            0,
            "tool_execution",
            merge(json!({"mutation_outcome": "completed"}), ids("c1", "a5")),
        ),
    ];
    for (i, e) in more.into_iter().enumerate() {
        evs.insert(at + i, e);
    }
    h.ops.push(op(
        OpKind::Decide {
            run_id: "r1".into(),
            request_id: "q5".into(),
            approve: true,
            scope: "once".into(),
        },
        200,
        json!({}),
    ));
    renumber(h);
}

#[test]
fn a_start_while_an_attempt_is_in_flight_is_caught() {
    let mut h = clean();
    second_attempt(&mut h, None);
    caught(&h, Invariant::NoStartWhileInFlight);
}

#[test]
fn a_start_while_an_attempt_is_outcome_unknown_is_caught() {
    let mut h = clean();
    second_attempt(&mut h, Some("outcome_unknown"));
    caught(&h, Invariant::NoStartWhileInFlight);
}

#[test]
fn a_start_after_a_reconciled_outcome_unknown_passes() {
    let mut h = clean();
    second_attempt(&mut h, Some("outcome_unknown"));
    events(&mut h).insert(
        8,
        ev(
            0,
            "tool_execution_reconciled",
            merge(json!({"mutation_outcome": "not_executed"}), ids("c1", "a1")),
        ),
    );
    h.runs[0].mutations[0]["state"] = json!("not_executed");
    renumber(&mut h);
    assert_eq!(check(&h), vec![]);
}

#[test]
fn half_of_a_failed_append_is_caught() {
    let mut h = clean();
    h.ops.push(Op {
        kind: OpKind::Append {
            run_id: "r1".into(),
            event_ids: vec!["e3".into(), "e4".into()],
        },
        outcome: Outcome::Unknown { last: "503".into() },
        saw_failure: true,
        sent_at_ms: None,
        answered_at_ms: CLICKED_AT,
    });
    let at = events(&mut h).len() - 1;
    events(&mut h).insert(at, ev(0, "agent.step", json!({"event_id": "e3"})));
    renumber(&mut h);
    caught(&h, Invariant::AllOrNothing);
}

#[test]
fn a_whole_failed_append_passes() {
    let mut h = clean();
    h.ops.push(Op {
        kind: OpKind::Append {
            run_id: "r1".into(),
            event_ids: vec!["e3".into(), "e4".into()],
        },
        outcome: Outcome::Unknown { last: "503".into() },
        saw_failure: true,
        sent_at_ms: None,
        answered_at_ms: CLICKED_AT,
    });
    let at = events(&mut h).len() - 1;
    events(&mut h).insert(at, ev(0, "agent.step", json!({"event_id": "e3"})));
    events(&mut h).insert(at + 1, ev(0, "agent.step", json!({"event_id": "e4"})));
    renumber(&mut h);
    assert_eq!(check(&h), vec![]);
}

#[test]
fn a_card_resolved_without_its_event_is_caught() {
    let mut h = clean();
    events(&mut h).remove(9);
    renumber(&mut h);
    caught(&h, Invariant::AllOrNothing);
}

#[test]
fn a_record_without_its_events_is_caught() {
    let mut h = clean();
    h.runs[0]
        .mutations
        .push(json!({"tool_call_id": "c9", "approval_id": "a9", "state": "intent"}));
    caught(&h, Invariant::AllOrNothing);
}

/// A record changed without its event: caught on a running run, and on an ended run
/// when it had been announced `completed` (final); a change after the run's end from
/// another state (a late settlement, a reconciliation) appends nothing and passes.
#[test]
fn a_record_changed_without_its_event() {
    let mut h = clean();
    h.runs[0].mutations[0]["state"] = json!("outcome_unknown");
    caught(&h, Invariant::AllOrNothing);
    let mut h = clean();
    events(&mut h)[7]["mutation_outcome"] = json!("not_executed");
    h.runs[0].mutations[0]["state"] = json!("completed");
    assert_eq!(check(&h), vec![], "changed after the end");
    events(&mut h).pop();
    caught(&h, Invariant::AllOrNothing);
}

#[test]
fn a_receipt_of_a_half_created_run_is_caught() {
    let mut h = clean();
    h.receipts.push(("d2".into(), Some("r2".into())));
    h.runs.push(FinalRun {
        run_id: "r2".into(),
        ..Default::default()
    });
    caught(&h, Invariant::AllOrNothing);
}

#[test]
fn an_approval_nobody_clicked_is_caught() {
    let mut h = clean();
    h.ops
        .retain(|o| !matches!(&o.kind, OpKind::Decide { request_id, .. } if request_id == "q1"));
    caught(&h, Invariant::NoDecisionWithoutClick);
}

#[test]
fn an_approval_clicked_after_the_deadline_is_caught() {
    let mut h = clean();
    h.cards[0].card.as_mut().unwrap()["expires_at"] = json!("2026-12-01T09:59:59.000Z");
    caught(&h, Invariant::NoDecisionWithoutClick);
}

/// Every invariant has a planted violation above.
#[test]
fn every_invariant_can_fail() {
    let planted = [
        Invariant::AckedAppendOnce,
        Invariant::GaplessSequence,
        Invariant::NothingAfterTerminal,
        Invariant::OneResolution,
        Invariant::PolicyNeedsApproval,
        Invariant::StartNeedsHumanApproval,
        Invariant::NoStartWhileInFlight,
        Invariant::AllOrNothing,
        Invariant::NoDecisionWithoutClick,
    ];
    assert_eq!(planted, Invariant::ALL);
}
