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

/// The building blocks of a history's streams: one card's or attempt's event, on `r1`
/// (sequence 0 until [`before_end`] renumbers).
fn required(rid: &str, call: &str, approval: &str) -> Value {
    ev(
        0,
        "tool.approval_required",
        merge(json!({ "requestId": rid }), ids(call, approval)),
    )
}

fn resolved(rid: &str, call: &str, approval: &str, approved: bool, expired: bool) -> Value {
    ev(
        0,
        "tool.approval_resolved",
        merge(
            json!({"requestId": rid, "approved": approved, "expired": expired}),
            ids(call, approval),
        ),
    )
}

fn started(call: &str, approval: &str) -> Value {
    ev(0, "tool_execution_started", ids(call, approval))
}

fn settled(call: &str, approval: &str, outcome: &str) -> Value {
    ev(
        0,
        "tool_execution",
        merge(json!({ "mutation_outcome": outcome }), ids(call, approval)),
    )
}

/// Inserts `more` before the run's terminal event and renumbers the stream.
fn before_end(h: &mut History, more: Vec<Value>) {
    let at = events(h).len() - 1;
    for (i, e) in more.into_iter().enumerate() {
        events(h).insert(at + i, e);
    }
    renumber(h);
}

/// An append of `event_ids` whose every try failed (outcome unknown).
fn failed_append(event_ids: &[&str]) -> Op {
    Op {
        kind: OpKind::Append {
            run_id: "r1".into(),
            event_ids: event_ids.iter().map(|e| (*e).to_owned()).collect(),
        },
        outcome: Outcome::Unknown { last: "503".into() },
        saw_failure: true,
        sent_at_ms: None,
        answered_at_ms: CLICKED_AT,
    }
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
        required("q1", "c1", "a1"),
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
        started("c1", "a1"),
        settled("c1", "a1", "completed"),
        required("q2", "c2", "a2"),
        resolved("q2", "c2", "a2", false, false),
        ev(11, "run_completed", json!({})),
    ];
    let card = |rid: &str, n: &str, state: &str, scope: Option<&str>, by: &str| FinalCard {
        run_id: "r1".into(),
        request_id: rid.into(),
        card: Some(
            json!({"run_id": "r1", "request_id": rid, "state": state, "scope": scope,
                          "tool_call_id": format!("c{n}"), "approval_id": format!("a{n}"),
                          "decided_by": by, "decided_at": "2026-12-01T10:00:01.000Z",
                          "expires_at": "2026-12-01T11:00:00.000Z"}),
        ),
    };
    let mut h = History {
        ops: vec![
            op(
                OpKind::CreateRun {
                    delivery_id: "d1".into(),
                    kind: "single".into(),
                    parent: None,
                    owner: OWNER.into(),
                },
                201,
                json!({"run_id": "r1"}),
            ),
            arm("q1", "1"),
            arm("q2", "2"),
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
                    by: OWNER.into(),
                },
                200,
                json!({"state": "approved", "decided_by": OWNER, "scope": "tool"}),
            ),
            op(
                OpKind::Decide {
                    run_id: "r1".into(),
                    request_id: "q2".into(),
                    approve: false,
                    scope: "once".into(),
                    by: "op".into(),
                },
                200,
                json!({"state": "denied", "decided_by": "op"}),
            ),
            op(
                OpKind::Start {
                    run_id: "r1".into(),
                    tool_call_id: "c1".into(),
                    approval_id: "a1".into(),
                },
                200,
                json!({"state": "intent"}),
            ),
            op(
                OpKind::End {
                    run_id: "r1".into(),
                    how: "complete".into(),
                },
                200,
                json!({}),
            ),
        ],
        runs: vec![FinalRun {
            run_id: "r1".into(),
            events,
            mutations: vec![
                json!({"tool_call_id": "c1", "approval_id": "a1", "state": "completed"}),
            ],
            stuck_after: None,
            absent: false,
        }],
        cards: vec![
            card("q1", "1", "approved", Some("tool"), OWNER),
            card("q2", "2", "denied", None, "op"),
        ],
        policies: vec![
            json!({"policy_id": "p1", "origin_run_id": "r1", "request_id": "q1",
                              "scope": "tool", "granted_by": OWNER}),
        ],
        receipts: vec![("d1".into(), Some("r1".into()))],
        storage_kills_ms: vec![],
        storage_acks: vec![],
        listed_runs: vec![("r1".into(), Some("d1".into()))],
        read_errors: vec![],
    };
    renumber(&mut h);
    h
}

const OWNER: &str = "alice";

fn arm(rid: &str, n: &str) -> Op {
    op(
        OpKind::Arm {
            run_id: "r1".into(),
            request_id: rid.into(),
            tool_call_id: format!("c{n}"),
            approval_id: format!("a{n}"),
        },
        201,
        json!({"state": "pending"}),
    )
}

/// The history's `i`th operation answered `status` with `body`.
fn answered(h: &mut History, i: usize, status: u16, body: Value) {
    h.ops[i].outcome = Outcome::Answered { status, body };
}

/// Index of the first operation `pick` matches.
fn find(h: &History, pick: impl Fn(&OpKind) -> bool) -> usize {
    h.ops.iter().position(|o| pick(&o.kind)).unwrap()
}

fn card_mut(h: &mut History, i: usize) -> &mut Value {
    h.cards[i].card.as_mut().unwrap()
}

fn caught(h: &History, invariant: Invariant) {
    let found = check(h);
    assert!(
        found.iter().any(|v| v.invariant == invariant),
        "{invariant:?} not caught; found {found:#?}"
    );
}

/// `invariant` caught, with `needle` in what the violation says.
fn caught_with(h: &History, invariant: Invariant, needle: &str) {
    let found = check(h);
    assert!(
        found
            .iter()
            .any(|v| v.invariant == invariant && v.detail.contains(needle)),
        "{invariant:?} about {needle:?} not caught; found {found:#?}"
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

/// An acknowledged append wholly absent is excused only with the proxy's evidence: its
/// transaction answered 200 at most the window before a kill of DynamoDB Local (not
/// after it, not earlier), at most two per kill, and never when half of it is there.
#[test]
fn an_append_lost_by_a_storage_kill_is_told_apart() {
    let mut h = clean();
    events(&mut h).drain(1..3);
    renumber(&mut h);
    let kill = CLICKED_AT + 100;
    h.storage_kills_ms = vec![kill];
    // No evidence: a violation.
    caught(&h, Invariant::AckedAppendOnce);
    let tx = r#"{"TransactItems":[{"Put":{"Item":{"event_id":{"S":"e1"}}}}]}"#.to_owned();
    // Acknowledged after the kill, or too long before it: not excused.
    h.storage_acks = vec![(kill + 1, tx.clone())];
    caught(&h, Invariant::AckedAppendOnce);
    h.storage_acks = vec![(kill - KILL_WINDOW_MS - 1, tx.clone())];
    caught(&h, Invariant::AckedAppendOnce);
    // Acknowledged within the window before it, but of another write: not excused.
    h.storage_acks = vec![(kill - 10, tx.replace("e1", "e7"))];
    caught(&h, Invariant::AckedAppendOnce);
    h.storage_acks = vec![(kill - KILL_WINDOW_MS, tx.clone())];
    // (The client's answer came after the acknowledgement.)
    h.ops[3].answered_at_ms = kill;
    assert!(!check(&h)
        .iter()
        .any(|v| v.invariant == Invariant::AckedAppendOnce));
    assert_eq!(lost_in_storage_kills(&h).len(), 1);
    // At most two per kill.
    for n in 0..2 {
        let id = format!("e-x{n}");
        let mut o = h.ops[3].clone();
        o.kind = OpKind::Append {
            run_id: "r1".into(),
            event_ids: vec![id.clone()],
        };
        h.ops.push(o);
        h.storage_acks.push((kill - 5, tx.replace("e1", &id)));
    }
    assert_eq!(lost_in_storage_kills(&h).len(), LOST_PER_KILL);
    caught(&h, Invariant::AckedAppendOnce);
    h.ops.truncate(h.ops.len() - 2);
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
    let auto = ev(
        0,
        "tool.auto_approved",
        merge(json!({"requestId": "q3", "scope": "tool"}), ids("c3", "a3")),
    );
    before_end(&mut h, vec![auto, started("c3", "a3")]);
    caught(&h, Invariant::StartNeedsHumanApproval);
}

#[test]
fn a_start_of_an_expired_card_is_caught() {
    let mut h = clean();
    before_end(
        &mut h,
        vec![
            required("q4", "c4", "a4"),
            resolved("q4", "c4", "a4", false, true),
            started("c4", "a4"),
        ],
    );
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
    before_end(
        h,
        vec![
            required("q5", "c1", "a5"),
            resolved("q5", "c1", "a5", true, false),
            started("c1", "a5"),
            settled("c1", "a5", "completed"),
        ],
    );
    h.ops.push(op(
        OpKind::Decide {
            run_id: "r1".into(),
            request_id: "q5".into(),
            approve: true,
            scope: "once".into(),
            by: "op".into(),
        },
        200,
        json!({"state": "approved", "decided_by": "op", "scope": "once"}),
    ));
    h.cards.push(FinalCard {
        run_id: "r1".into(),
        request_id: "q5".into(),
        card: Some(
            json!({"run_id": "r1", "request_id": "q5", "state": "approved",
                          "scope": "once", "decided_by": "op",
                          "tool_call_id": "c1", "approval_id": "a5",
                          "decided_at": "2026-12-01T10:00:01.000Z",
                          "expires_at": "2026-12-01T11:00:00.000Z"}),
        ),
    });
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
    h.ops.push(failed_append(&["e3", "e4"]));
    before_end(&mut h, vec![ev(0, "agent.step", json!({"event_id": "e3"}))]);
    caught(&h, Invariant::AllOrNothing);
}

#[test]
fn a_whole_failed_append_passes() {
    let mut h = clean();
    h.ops.push(failed_append(&["e3", "e4"]));
    before_end(
        &mut h,
        vec![
            ev(0, "agent.step", json!({"event_id": "e3"})),
            ev(0, "agent.step", json!({"event_id": "e4"})),
        ],
    );
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
    card_mut(&mut h, 0)["expires_at"] = json!("2026-12-01T09:59:59.000Z");
    caught(&h, Invariant::NoDecisionWithoutClick);
}

/// A click refused (403: a scope beyond `once` from someone not the owner) is no click:
/// a card approved with only such a click behind it was approved by nobody.
#[test]
fn a_refused_click_is_no_click() {
    let mut h = clean();
    let i = find(&h, |k| matches!(k, OpKind::Decide { approve: true, .. }));
    answered(&mut h, i, 403, json!({"error": "forbidden"}));
    caught(&h, Invariant::NoDecisionWithoutClick);
    // Its outcome unknown, it counts.
    h.ops[i].outcome = Outcome::Unknown {
        last: "reset".into(),
    };
    assert_eq!(check(&h), vec![]);
}

/// An approval must be the one a click asked: by that operator, with that scope.
#[test]
fn an_approval_by_someone_else_or_another_scope_is_caught() {
    let mut h = clean();
    card_mut(&mut h, 0)["decided_by"] = json!("mallory");
    caught(&h, Invariant::NoDecisionWithoutClick);
    let mut h = clean();
    card_mut(&mut h, 0)["scope"] = json!("run");
    caught(&h, Invariant::NoDecisionWithoutClick);
    let mut h = clean();
    card_mut(&mut h, 1)["decided_by"] = json!("mallory");
    caught(&h, Invariant::NoDecisionWithoutClick);
}

/// Approved by the clock at commit: at or after the deadline is a violation, even for
/// a click sent before it.
#[test]
fn an_approval_committed_at_the_deadline_is_caught() {
    let mut h = clean();
    card_mut(&mut h, 0)["decided_at"] = json!("2026-12-01T11:00:00.000Z");
    caught(&h, Invariant::NoDecisionWithoutClick);
}

#[test]
fn an_armed_card_missing_is_caught() {
    let mut h = clean();
    let i = find(
        &h,
        |k| matches!(k, OpKind::Arm { request_id, .. } if request_id == "q1"),
    );
    if let OpKind::Arm { approval_id, .. } = &mut h.ops[i].kind {
        *approval_id = "other".into();
    }
    caught(&h, Invariant::AnswerHolds);
}

#[test]
fn an_end_answered_but_not_on_the_stream_is_caught() {
    let mut h = clean();
    let last = events(&mut h).len() - 1;
    events(&mut h)[last]["type"] = json!("run_failed");
    caught(&h, Invariant::AnswerHolds);
    // Or at another sequence than answered.
    let mut h = clean();
    let i = find(&h, |k| matches!(k, OpKind::End { .. }));
    answered(&mut h, i, 200, json!({"sequence": 11}));
    assert_eq!(check(&h), vec![]);
    answered(&mut h, i, 200, json!({"sequence": 12}));
    caught(&h, Invariant::AnswerHolds);
}

/// A decision answered 200 holds (the card as answered), and two answers agree.
#[test]
fn a_decision_answer_that_does_not_hold_is_caught() {
    let mut h = clean();
    let i = find(&h, |k| matches!(k, OpKind::Decide { approve: false, .. }));
    answered(
        &mut h,
        i,
        200,
        json!({"state": "approved", "decided_by": "op", "scope": "once"}),
    );
    caught(&h, Invariant::AnswerHolds);
    let mut h = clean();
    let mut again = h.ops[i].clone();
    again.outcome = Outcome::Answered {
        status: 200,
        body: json!({"state": "denied", "decided_by": "bob"}),
    };
    h.ops.push(again);
    caught_with(&h, Invariant::AnswerHolds, "disagree");
}

/// A record answered `completed` must stay so; `intent` may move on.
#[test]
fn a_record_behind_its_answer_is_caught() {
    let mut h = clean();
    let i = find(&h, |k| matches!(k, OpKind::Start { .. }));
    answered(&mut h, i, 200, json!({"state": "completed"}));
    assert_eq!(check(&h), vec![]);
    h.runs[0].mutations[0]["state"] = json!("outcome_unknown");
    events(&mut h)[7]["mutation_outcome"] = json!("outcome_unknown");
    caught(&h, Invariant::AnswerHolds);
    assert!(later_or_same("intent", "completed"));
    assert!(later_or_same("not_executed", "outcome_unknown"));
    assert!(!later_or_same("completed", "not_executed"));
    assert!(!later_or_same("dispatched", "intent"));
}

/// A create's receipt names the run it answered; no run without a create behind it, and
/// one run per delivery.
#[test]
fn a_second_run_from_a_retried_create_is_caught() {
    let mut h = clean();
    h.listed_runs.push(("r9".into(), Some("d1".into())));
    caught(&h, Invariant::ExactlyOnce);
    let mut h = clean();
    h.listed_runs.push(("r9".into(), None));
    caught(&h, Invariant::ExactlyOnce);
    let mut h = clean();
    h.receipts[0].1 = Some("r9".into());
    h.runs.push(FinalRun {
        run_id: "r9".into(),
        events: vec![json!({"run_id": "r9", "sequence": 1, "type": "run_started"})],
        ..Default::default()
    });
    caught(&h, Invariant::AnswerHolds);
}

/// A retried request whose first try committed writes nothing twice.
#[test]
fn a_retried_write_twice_is_caught() {
    for at in [0, 3, 7] {
        let mut h = clean();
        let again = events(&mut h)[at].clone();
        events(&mut h).insert(at + 1, again);
        renumber(&mut h);
        caught(&h, Invariant::ExactlyOnce);
    }
}

/// A policy granted by someone other than the run's owner is caught.
#[test]
fn a_policy_not_granted_by_the_owner_is_caught() {
    let mut h = clean();
    h.policies[0]["granted_by"] = json!("op");
    caught(&h, Invariant::PolicyNeedsApproval);
}

/// A record with no start of its attempt on the stream is only a start refused before
/// it started: on the ended run (`run_not_running`, the record alone), or of a card
/// denied or expired (with its `tool_execution`); nothing else is excused.
#[test]
fn a_record_of_an_attempt_never_started_is_caught() {
    let record = |reason: &str| {
        json!({"tool_call_id": "c2", "approval_id": "a2", "state": "not_executed",
               "reason": reason})
    };
    let mut h = clean();
    h.runs[0].mutations.push(record("run_not_running"));
    assert_eq!(check(&h), vec![]);
    h.runs[0].mutations[1] = record("budget_exhausted");
    caught_with(&h, Invariant::AllOrNothing, "record c2/a2");
    h.runs[0].mutations[1]["state"] = json!("outcome_unknown");
    caught_with(&h, Invariant::AllOrNothing, "record c2/a2");
    // The denied card's refused start, announced while the run ran.
    let mut h = clean();
    events(&mut h).insert(
        10,
        ev(
            0,
            "tool_execution",
            merge(json!({"mutation_outcome": "not_executed"}), ids("c2", "a2")),
        ),
    );
    renumber(&mut h);
    h.runs[0].mutations.push(record("approval_denied"));
    assert_eq!(check(&h), vec![]);
    // Claimed denied, but the card was approved.
    events(&mut h)[9]["approved"] = json!(true);
    caught_with(&h, Invariant::AllOrNothing, "record c2/a2");
}

/// A refused (4xx) operation left nothing; a failed one nothing or all.
#[test]
fn a_refused_operation_that_wrote_is_caught() {
    let mut h = clean();
    let i = find(&h, |k| matches!(k, OpKind::Append { .. }));
    answered(&mut h, i, 409, json!({"error": "run_terminal"}));
    caught_with(&h, Invariant::AllOrNothing, "refused");
    let mut h = clean();
    let i = find(
        &h,
        |k| matches!(k, OpKind::Arm { request_id, .. } if request_id == "q2"),
    );
    answered(&mut h, i, 409, json!({"error": "too many"}));
    caught_with(&h, Invariant::AllOrNothing, "refused");
    let mut h = clean();
    let i = find(&h, |k| matches!(k, OpKind::CreateRun { .. }));
    answered(&mut h, i, 400, json!({"error": "bad"}));
    caught_with(&h, Invariant::AllOrNothing, "refused");
}

#[test]
fn a_failed_read_back_fails_the_check() {
    let mut h = clean();
    h.read_errors.push("r1: mutations: 503".into());
    caught(&h, Invariant::ReadBack);
}

/// A card its run's end closed is announced before the terminal event, saying so
/// (`reason: run_ended`): an unannounced one (a frontend keeps its live buttons) or an
/// announcement without the reason is caught.
#[test]
fn a_run_end_that_closes_a_card_unannounced_is_caught() {
    let mut h = clean();
    let mut announced = resolved("q6", "c6", "a6", false, true);
    announced["reason"] = json!("run_ended");
    before_end(&mut h, vec![required("q6", "c6", "a6"), announced]);
    h.cards.push(FinalCard {
        run_id: "r1".into(),
        request_id: "q6".into(),
        card: Some(
            json!({"run_id": "r1", "request_id": "q6", "state": "expired",
                          "reason": "run_ended", "expires_at": "2026-12-01T11:00:00.000Z"}),
        ),
    });
    assert_eq!(check(&h), vec![]);
    let mut silent = h.clone();
    let at = events(&mut silent)
        .iter()
        .position(|e| e["type"] == "tool.approval_resolved" && e["requestId"] == "q6")
        .unwrap();
    events(&mut silent).remove(at);
    renumber(&mut silent);
    caught_with(&silent, Invariant::AllOrNothing, "0 resolutions");
    let at = events(&mut h)
        .iter()
        .position(|e| e["requestId"] == "q6" && e["type"] == "tool.approval_resolved")
        .unwrap();
    events(&mut h)[at]["reason"] = Value::Null;
    caught_with(&h, Invariant::AllOrNothing, "stream says");
}

/// A child's card is mirrored on its running coordinator exactly once as required and
/// once as resolved.
#[test]
fn a_missing_or_doubled_mirror_is_caught() {
    let coordinator = |events: Vec<Value>| FinalRun {
        run_id: "r0".into(),
        events,
        ..Default::default()
    };
    let mirror = |seq: u64, ty: &str| json!({"run_id": "r0", "sequence": seq, "type": ty, "requestId": "q1", "childRunId": "r1"});
    let started = json!({"run_id": "r0", "sequence": 1, "type": "run_started"});
    let mut h = clean();
    card_mut(&mut h, 0)["coordinator_run_id"] = json!("r0");
    h.runs.push(coordinator(vec![
        started.clone(),
        mirror(2, "coordinator.child_approval_required"),
        mirror(3, "coordinator.child_approval_resolved"),
    ]));
    h.listed_runs.push(("r0".into(), Some("d0".into())));
    h.receipts.push(("d0".into(), Some("r0".into())));
    h.ops.push(op(
        OpKind::CreateRun {
            delivery_id: "d0".into(),
            kind: "coordinator".into(),
            parent: None,
            owner: OWNER.into(),
        },
        201,
        json!({"run_id": "r0"}),
    ));
    assert_eq!(check(&h), vec![]);
    h.runs[1] = coordinator(vec![
        started.clone(),
        mirror(2, "coordinator.child_approval_required"),
    ]);
    caught(&h, Invariant::CoordinatorMirror);
    h.runs[1] = coordinator(vec![
        started,
        mirror(2, "coordinator.child_approval_resolved"),
    ]);
    caught(&h, Invariant::CoordinatorMirror);
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
        Invariant::AnswerHolds,
        Invariant::ExactlyOnce,
        Invariant::CoordinatorMirror,
        Invariant::ReadBack,
    ];
    assert_eq!(planted, Invariant::ALL);
}

/// The branches each check has, planted one by one.
#[test]
fn a_start_naming_no_card_or_started_twice_is_caught() {
    let mut h = clean();
    before_end(&mut h, vec![started("c8", "a8")]);
    caught_with(&h, Invariant::StartNeedsHumanApproval, "names no card");
    let mut h = clean();
    let again = events(&mut h)[6].clone();
    events(&mut h).insert(7, again);
    renumber(&mut h);
    caught_with(&h, Invariant::NoStartWhileInFlight, "started twice");
}

#[test]
fn an_acknowledged_append_at_another_sequence_is_caught() {
    let mut h = clean();
    answered(&mut h, 3, 200, json!({"sequences": [2, 4]}));
    caught_with(&h, Invariant::AckedAppendOnce, "e2");
}

#[test]
fn a_failed_append_split_apart_is_caught() {
    let mut h = clean();
    h.ops.push(failed_append(&["e3", "e4"]));
    before_end(
        &mut h,
        vec![
            ev(0, "agent.step", json!({"event_id": "e3"})),
            ev(0, "agent.step", json!({"event_id": "x"})),
            ev(0, "agent.step", json!({"event_id": "e4"})),
        ],
    );
    caught_with(&h, Invariant::AllOrNothing, "contiguous: false");
}

#[test]
fn card_and_stream_disagreeing_is_caught() {
    // No card, but its events.
    let mut h = clean();
    h.cards[1].card = None;
    caught_with(&h, Invariant::AllOrNothing, "no card");
    // Pending, but resolved on the stream.
    let mut h = clean();
    card_mut(&mut h, 1)["state"] = json!("pending");
    caught_with(&h, Invariant::AllOrNothing, "pending but resolved");
    // Expired on the card, denied on the stream.
    let mut h = clean();
    card_mut(&mut h, 1)["state"] = json!("expired");
    caught_with(&h, Invariant::AllOrNothing, "stream says");
    // A state no card has.
    let mut h = clean();
    card_mut(&mut h, 1)["state"] = json!("maybe");
    caught_with(&h, Invariant::AllOrNothing, "card state");
    // Auto-approved on the card, but a human's card on the stream.
    let mut h = clean();
    card_mut(&mut h, 1)["auto_approved"] = json!(true);
    caught_with(&h, Invariant::AllOrNothing, "auto-approved card");
}

#[test]
fn a_child_card_mirrored_resolved_twice_is_caught() {
    let mut h = clean();
    let mirror = |ty: &str| json!({"run_id": "r1", "sequence": 0, "type": ty, "requestId": "qc", "childRunId": "r7"});
    before_end(
        &mut h,
        vec![
            mirror("coordinator.child_approval_resolved"),
            mirror("coordinator.child_approval_resolved"),
        ],
    );
    caught_with(&h, Invariant::OneResolution, "mirrored resolved 2 times");
}

/// A run a create was answered with, not there at the end: only a create the storage
/// lost (with the proxy's evidence) is excused.
#[test]
fn a_created_run_missing_is_caught() {
    let mut h = clean();
    h.runs[0] = FinalRun {
        run_id: "r1".into(),
        absent: true,
        ..Default::default()
    };
    h.receipts[0].1 = None;
    h.listed_runs.clear();
    h.cards.clear();
    h.policies.clear();
    h.ops.truncate(1);
    caught_with(&h, Invariant::AnswerHolds, "not there");
    let kill = CLICKED_AT + 100;
    h.storage_kills_ms = vec![kill];
    h.storage_acks = vec![(kill - 50, r#"{"delivery_id":{"S":"d1"}}"#.into())];
    h.ops[0].answered_at_ms = kill;
    assert_eq!(check(&h), vec![]);
    assert_eq!(lost_in_storage_kills(&h).len(), 1);
}
