//! Durable mutation records of approved execution (seed 000): admission once and under
//! the call ceiling, settlement, deadlines, heartbeats, the end of a run and retention.

use super::*;

use tollgate_domain::execution::{
    self, Decision, ExecutionSettings, MutationRecord, MutationState, Settlement, StartRequest,
    Verdict,
};

use crate::{decide_mutation, MutationCommit, MutationOutcome};

/// A running run with `budget`.
async fn budget_run(store: &Store, tag: &str, budget: Value) -> String {
    let run_id = fresh_id(tag);
    let outcome = store
        .create_run(NewRun {
            run_id: run_id.clone(),
            created_by: "contract".into(),
            budget: Some(budget),
            ..NewRun::default()
        })
        .await
        .expect("create_run");
    assert!(matches!(outcome, CreateOutcome::Created(_)));
    run_id
}

/// A card for `tool` on `run_id`, armed and approved by a human: what `start` admits.
async fn approved_card(store: &Store, run_id: &str, call: &str, tool: &str) -> ApprovalRequest {
    let mut card = card_for(run_id, &format!("req-{call}"), None);
    card.tool_name = tool.into();
    card.tool_call_id = call.into();
    card.approval_id = format!("approval-{call}");
    card.explicit_ids = true;
    store.arm(RunRef::any(run_id), card.clone()).await.unwrap();
    match store
        .resolve(
            run_id,
            &card.request_id,
            approve("alice"),
            tollgate_domain::now_millis(),
            None,
        )
        .await
        .unwrap()
    {
        Resolved::Fresh(c) => {
            assert_eq!(c.state, ApprovalState::Approved);
            c
        }
        other => panic!("approval: {other:?}"),
    }
}

fn start_request(card: &ApprovalRequest) -> StartRequest {
    StartRequest {
        run_id: card.run_id.clone(),
        tool_call_id: card.tool_call_id.clone(),
        request_id: card.request_id.clone(),
        approval_id: card.approval_id.clone(),
        tool_name: card.tool_name.clone(),
        arguments_hash: card.arguments_hash.clone(),
    }
}

/// `start` of an approved card through the store's read–decide–commit loop.
async fn start_call(store: &Store, card: &ApprovalRequest) -> MutationOutcome {
    let req = start_request(card);
    let now = tollgate_domain::now_millis();
    decide_mutation(
        store.as_ref(),
        &card.run_id,
        &card.tool_call_id,
        &card.approval_id,
        |v| {
            execution::start(
                &req,
                card,
                &v.head,
                &v.usage,
                &v.attempts,
                &ExecutionSettings::default(),
                now,
            )
        },
    )
    .await
    .expect("store")
    .expect("start is not refused outright")
}

/// A transition of a stored record (dispatch, settle, deadline, reconcile).
async fn transit(
    store: &Store,
    record: &MutationRecord,
    step: impl Fn(&MutationRecord, RunStatus) -> Decision + Send + Sync,
) -> MutationOutcome {
    decide_mutation(
        store.as_ref(),
        &record.run_id,
        &record.tool_call_id,
        &record.approval_id,
        |v| {
            v.record(&record.approval_id)
                .map(|r| step(r, v.head.status))
                .ok_or("no record")
        },
    )
    .await
    .expect("store")
    .expect("the record is stored")
}

/// The stored record equals what the domain produced, as a struct and on the wire.
async fn assert_stored(store: &Store, expected: &MutationRecord) {
    let stored = store
        .read_mutation(
            &expected.run_id,
            &expected.tool_call_id,
            &expected.approval_id,
        )
        .await
        .unwrap()
        .expect("record stored");
    assert_eq!(&stored, expected);
    assert_eq!(stored.to_json(), expected.to_json());
    assert_eq!(stored.to_json()["schema"], "mutation_outcome/v1");
}

fn confirmed(result: Value) -> Settlement {
    Settlement::new("confirmed", Some(result), None).unwrap()
}

/// GIVEN a human-approved card on a budgeted run WHEN `start` is called (and repeated)
/// THEN one intent, one `tool_execution_started` at the sequence the answer reports, the
/// head's usage counted once, and the repeat answers the same without a second event.
pub async fn start_admits_once(store: Store) {
    let run_id = budget_run(
        &store,
        "start",
        json!({"tools": {"web_fetch": 2}, "call_ceiling": 5}),
    )
    .await;
    let card = approved_card(&store, &run_id, "call-1", "web_fetch").await;
    let first = start_call(&store, &card).await;
    assert!(first.decision.changed && first.decision.accepted());
    let seq = first.decision.record.started_sequence.expect("admitted");
    assert_eq!(first.sequences, vec![seq]);
    assert_eq!(first.decision.answer().sequence, Some(seq));
    assert_eq!(first.decision.record.state, MutationState::Intent);
    assert_stored(&store, &first.decision.record).await;
    let events = all_events(&store, &run_id).await;
    let started = &events[(seq - 1) as usize];
    assert_eq!(started["type"], "tool_execution_started");
    assert_eq!(started["tool_call_id"], "call-1");
    assert_eq!(started["approval_id"], "approval-call-1");
    assert_eq!(started["tool_name"], "web_fetch");
    assert!(started.get("arguments").is_none());
    let head = store.read_head(&run_id).await.unwrap().unwrap();
    assert_eq!(
        head.budget_used,
        Some(json!({"starts": {"web_fetch": 1}, "calls": 1}))
    );
    let view = store
        .read_mutation_view(&run_id, "call-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.usage.calls, 1);
    assert_eq!(view.attempts, vec![first.decision.record.clone()]);

    let again = start_call(&store, &card).await;
    assert!(!again.decision.changed && again.sequences.is_empty());
    assert_eq!(again.decision.answer(), first.decision.answer());
    assert_eq!(all_events(&store, &run_id).await.len(), events.len());
    let head = store.read_head(&run_id).await.unwrap().unwrap();
    assert_eq!(head.budget_used.unwrap()["calls"], 1, "counted once");
    assert_eq!(
        store.tool_call_mutations(&run_id, "call-1").await.unwrap(),
        vec![first.decision.record.clone()]
    );
    assert_eq!(
        store.list_mutations(&run_id, 10).await.unwrap(),
        vec![first.decision.record.clone()]
    );
    // A decision computed from a record that has since changed loses, writes nothing.
    let stale = execution::dispatch(
        &first.decision.record,
        RunStatus::Running,
        tollgate_domain::now_millis(),
    );
    let head = store.read_head(&run_id).await.unwrap().unwrap();
    let ok = store
        .commit_mutation(&head, Some(&first.decision.record), &stale)
        .await
        .unwrap();
    assert_eq!(
        ok,
        MutationCommit::Written {
            sequences: Vec::new()
        }
    );
    let lost = store
        .commit_mutation(&head, Some(&first.decision.record), &stale)
        .await
        .unwrap();
    assert_eq!(lost, MutationCommit::Lost);
    assert_stored(&store, &stale.record).await;
}

/// GIVEN 20 approved calls on a run whose `call_ceiling` is 5 WHEN all 20 start at once
/// (over every store given) THEN exactly 5 are admitted and 15 refused with
/// `call_ceiling_reached`, each durably recorded with its one event.
pub async fn concurrent_starts_respect_the_call_ceiling(stores: Vec<Store>) {
    let store = stores[0].clone();
    let run_id = budget_run(
        &store,
        "ceiling",
        json!({"tools": {"w": 100}, "call_ceiling": 5}),
    )
    .await;
    let mut cards = Vec::new();
    for i in 0..20 {
        cards.push(approved_card(&store, &run_id, &format!("c{i}"), "w").await);
    }
    let racers: Vec<_> = cards
        .into_iter()
        .enumerate()
        .map(|(i, card)| {
            let store = stores[i % stores.len()].clone();
            tokio::spawn(async move { start_call(&store, &card).await })
        })
        .collect();
    let mut admitted = 0;
    let mut refused = 0;
    for r in racers {
        let out = r.await.unwrap();
        assert!(out.decision.changed);
        assert_stored(&store, &out.decision.record).await;
        match out.decision.answer().verdict {
            Verdict::Ok => {
                assert_eq!(out.sequences.len(), 1);
                assert_eq!(out.decision.record.state, MutationState::Intent);
                admitted += 1;
            }
            _ => {
                // The start, then the refusal, in one step.
                assert_eq!(out.sequences.len(), 2);
                assert_eq!(
                    out.decision.record.to_json()["reason"],
                    "call_ceiling_reached"
                );
                refused += 1;
            }
        }
    }
    assert_eq!((admitted, refused), (5, 15));
    let events = all_events(&store, &run_id).await;
    // Every human-approved call started once, admitted or not.
    assert_eq!(
        count_of(&store, &run_id, "tool_execution_started").await,
        20
    );
    let not_executed = events
        .iter()
        .filter(|e| e["type"] == "tool_execution" && e["execution_status"] == "not_executed")
        .count();
    assert_eq!(not_executed, 15);
    let head = store.read_head(&run_id).await.unwrap().unwrap();
    assert_eq!(
        head.budget_used,
        Some(json!({"starts": {"w": 5}, "calls": 5}))
    );
    assert_eq!(store.list_mutations(&run_id, 100).await.unwrap().len(), 20);
    assert_eq!(store.list_mutations(&run_id, 7).await.unwrap().len(), 7);
}

/// dispatch → settle(confirmed): the record completes with its result and the terminal
/// `tool_execution` (`executed`, `completed`) is appended once.
pub async fn confirmed_settlement_completes(store: Store) {
    let run_id = budget_run(&store, "settle", json!({"tools": {"web_fetch": 1}})).await;
    let card = approved_card(&store, &run_id, "call-1", "web_fetch").await;
    let started = start_call(&store, &card).await.decision.record;
    let dispatched = transit(&store, &started, |r, run| {
        execution::dispatch(r, run, tollgate_domain::now_millis())
    })
    .await;
    assert!(dispatched.decision.accepted() && dispatched.sequences.is_empty());
    assert_eq!(dispatched.decision.record.state, MutationState::Dispatched);
    assert_stored(&store, &dispatched.decision.record).await;
    let settle = |r: &MutationRecord, run| {
        execution::settle(
            r,
            &confirmed(json!({"id": "d-1"})),
            run,
            tollgate_domain::now_millis(),
        )
    };
    let done = transit(&store, &dispatched.decision.record, settle).await;
    assert!(done.decision.accepted());
    assert_eq!(done.sequences.len(), 1);
    assert_stored(&store, &done.decision.record).await;
    assert_eq!(done.decision.record.to_json()["state"], "completed");
    assert_eq!(
        done.decision.record.to_json()["result"],
        json!({"id": "d-1"})
    );
    let events = all_events(&store, &run_id).await;
    let last = events.last().unwrap();
    assert_eq!(last["sequence"], json!(done.sequences[0]));
    assert_eq!(last["type"], "tool_execution");
    assert_eq!(last["execution_status"], "executed");
    assert_eq!(last["mutation_outcome"], "completed");
    assert_eq!(last["result"], json!({"id": "d-1"}));
    // The same settlement again: the same answer, nothing written.
    let again = transit(&store, &done.decision.record, settle).await;
    assert!(!again.decision.changed && again.decision.accepted());
    assert_eq!(all_events(&store, &run_id).await.len(), events.len());
    assert_eq!(
        types(&events)[events.len() - 2..],
        ["tool_execution_started", "tool_execution"]
    );
}

/// The settlement deadline settles an undispatched intent `not_executed` (and dispatch
/// is then refused) and a dispatched one `outcome_unknown`; a late confirmed settlement
/// still records the actual result, without a second terminal event.
pub async fn deadlines_settle_and_late_evidence_is_kept(store: Store) {
    let run_id = budget_run(&store, "deadline-exec", json!({"tools": {"t": 2}})).await;
    let a = approved_card(&store, &run_id, "undispatched", "t").await;
    let b = approved_card(&store, &run_id, "dispatched", "t").await;
    let a = start_call(&store, &a).await.decision.record;
    let b = start_call(&store, &b).await.decision.record;
    let b = transit(&store, &b, |r, run| {
        execution::dispatch(r, run, tollgate_domain::now_millis())
    })
    .await
    .decision
    .record;
    let at_deadline = |r: &MutationRecord, run| {
        execution::settle_at_deadline(r, run, r.settlement_deadline_at).expect("due")
    };

    let unsent = transit(&store, &a, at_deadline).await;
    assert_eq!(unsent.sequences.len(), 1);
    assert_stored(&store, &unsent.decision.record).await;
    let json = unsent.decision.record.to_json();
    assert_eq!(
        (json["state"].as_str(), json["reason"].as_str()),
        (Some("not_executed"), Some("unsent"))
    );
    let fenced = transit(&store, &unsent.decision.record, |r, run| {
        execution::dispatch(r, run, r.settlement_deadline_at + 1)
    })
    .await;
    assert!(!fenced.decision.accepted() && !fenced.decision.changed);
    assert_eq!(fenced.decision.answer().state, Some("not_executed"));

    let unknown = transit(&store, &b, at_deadline).await;
    assert_eq!(unknown.sequences.len(), 1);
    assert_stored(&store, &unknown.decision.record).await;
    assert_eq!(unknown.decision.record.state, MutationState::OutcomeUnknown);
    let events = all_events(&store, &run_id).await;
    let terminal: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "tool_execution")
        .collect();
    assert_eq!(terminal.len(), 2);
    assert_eq!(terminal[0]["execution_status"], "not_executed");
    assert_eq!(terminal[1]["execution_status"], "executed");
    assert_eq!(terminal[1]["mutation_outcome"], "outcome_unknown");
    // A deadline redelivered: nothing more.
    let again = transit(&store, &unknown.decision.record, at_deadline).await;
    assert!(!again.decision.changed);

    let late = transit(&store, &unknown.decision.record, |r, run| {
        execution::settle(
            r,
            &confirmed(json!({"ok": true})),
            run,
            r.settlement_deadline_at + 5_000,
        )
    })
    .await;
    // The change is announced in the same step: the stream never disagrees with the
    // durable record.
    assert!(late.decision.changed && late.sequences.len() == 1);
    assert_stored(&store, &late.decision.record).await;
    assert_eq!(late.decision.record.to_json()["state"], "completed");
    assert_eq!(
        late.decision.record.to_json()["result"],
        json!({"ok": true})
    );
    let after = all_events(&store, &run_id).await;
    assert_eq!(after.len(), events.len() + 1);
    let updated = after.last().unwrap();
    assert_eq!(updated["type"], "tool_execution_updated");
    assert_eq!(updated["sequence"], json!(late.sequences[0]));
    assert_eq!(
        (
            updated["previous_outcome"].clone(),
            updated["mutation_outcome"].clone()
        ),
        (json!("outcome_unknown"), json!("completed"))
    );
}

/// Nothing is appended after the run ended: a settlement still changes the durable
/// record, a start is recorded `not_executed` (`run_not_running`), both silently, and a
/// decision computed while the run was running loses.
/// GIVEN a dispatch decided while the run was running WHEN the run ends before it is
/// written THEN it is not written (the agent would send on it); decided again, the call
/// settles `not_executed` and nothing follows the terminal event.
pub async fn a_dispatch_never_lands_after_the_run_ended(store: Store) {
    let run_id = budget_run(&store, "dispatch-end", json!({"tools": {"t": 1}})).await;
    let card = approved_card(&store, &run_id, "to-dispatch", "t").await;
    let started = start_call(&store, &card).await.decision.record;
    let running_head = store.read_head(&run_id).await.unwrap().unwrap();
    let dispatch = execution::dispatch(&started, RunStatus::Running, tollgate_domain::now_millis());
    assert!(dispatch.changed);
    assert_eq!(dispatch.record.state, MutationState::Dispatched);
    let end = store
        .finish_run(RunRef::any(&run_id), TerminalKind::Cancel, Map::new())
        .await
        .unwrap();
    assert_eq!(
        store
            .commit_mutation(&running_head, Some(&started), &dispatch)
            .await
            .unwrap(),
        MutationCommit::Lost,
        "the run was cancelled before the dispatch landed"
    );
    let again = transit(&store, &started, |r, run| {
        execution::dispatch(r, run, tollgate_domain::now_millis())
    })
    .await;
    assert_ne!(again.decision.record.state, MutationState::Dispatched);
    assert_stored(&store, &again.decision.record).await;
    let events = all_events(&store, &run_id).await;
    assert_eq!(events.last().unwrap()["sequence"], json!(end.sequence));
}

/// GIVEN a dispatched mutation WHEN its heartbeat timers fire (and are redelivered)
/// THEN one sequenced `heartbeat` per beat number, a redelivery writes nothing, and none
/// once the call is settled — nor for an intent that was never dispatched.
pub async fn execution_heartbeats_stop_at_settlement(store: Store) {
    let run_id = budget_run(&store, "exec-beats", json!({"tools": {"t": 2}})).await;
    let card = approved_card(&store, &run_id, "beating", "t").await;
    let intent = start_call(&store, &card).await.decision.record;
    let beat = |n: u32| {
        let store = store.clone();
        let (r, t, a) = (
            intent.run_id.clone(),
            intent.tool_call_id.clone(),
            intent.approval_id.clone(),
        );
        async move { store.execution_heartbeat(&r, &t, &a, n).await.unwrap() }
    };
    assert_eq!(
        beat(1).await,
        Beat::Stopped,
        "an intent is not dispatched yet"
    );
    let dispatched = transit(&store, &intent, |r, run| {
        execution::dispatch(r, run, tollgate_domain::now_millis())
    })
    .await
    .decision
    .record;
    let Beat::Emitted(first) = beat(1).await else {
        panic!("the first beat of a dispatched call is written")
    };
    assert_eq!(
        beat(1).await,
        Beat::Repeated(first),
        "redelivered before beat 2: the first delivery carries the chain"
    );
    let Beat::Emitted(second) = beat(2).await else {
        panic!("beat 2")
    };
    assert_eq!(second, first + 1);
    assert_eq!(beat(1).await, Beat::Repeated(first), "a late redelivery");
    let settled = transit(&store, &dispatched, |r, run| {
        execution::settle(
            r,
            &confirmed(json!({"ok": true})),
            run,
            tollgate_domain::now_millis(),
        )
    })
    .await;
    assert_eq!(settled.decision.record.state, MutationState::Completed);
    assert_eq!(beat(3).await, Beat::Stopped, "none after settlement");
    let events = all_events(&store, &run_id).await;
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        &types[types.len() - 4..],
        [
            "tool_execution_started",
            "heartbeat",
            "heartbeat",
            "tool_execution"
        ]
    );
    let beats: Vec<&Value> = events.iter().filter(|e| e["type"] == "heartbeat").collect();
    assert_eq!(beats.len(), 2);
    for b in beats {
        assert_eq!(b["tool_call_id"], "beating");
        assert_eq!(b["approval_id"], "approval-beating");
    }
}

pub async fn nothing_follows_the_end_of_a_run(store: Store) {
    let run_id = budget_run(&store, "ended-exec", json!({"tools": {"t": 2}})).await;
    let a = approved_card(&store, &run_id, "in-flight", "t").await;
    let late_card = approved_card(&store, &run_id, "too-late", "t").await;
    let a = start_call(&store, &a).await.decision.record;
    let a = transit(&store, &a, |r, run| {
        execution::dispatch(r, run, tollgate_domain::now_millis())
    })
    .await
    .decision
    .record;
    let running_head = store.read_head(&run_id).await.unwrap().unwrap();
    let computed_while_running = execution::settle(
        &a,
        &confirmed(json!(1)),
        RunStatus::Running,
        tollgate_domain::now_millis(),
    );
    assert_eq!(computed_while_running.events.len(), 1);
    let end = store
        .finish_run(RunRef::any(&run_id), TerminalKind::Complete, Map::new())
        .await
        .unwrap();
    assert_eq!(
        store
            .commit_mutation(&running_head, Some(&a), &computed_while_running)
            .await
            .unwrap(),
        MutationCommit::Lost,
        "the head moved and ended"
    );
    let settled = transit(&store, &a, |r, run| {
        execution::settle(r, &confirmed(json!(1)), run, tollgate_domain::now_millis())
    })
    .await;
    assert!(settled.decision.changed && settled.sequences.is_empty());
    assert_stored(&store, &settled.decision.record).await;
    assert_eq!(settled.decision.record.state, MutationState::Completed);
    let refused = start_call(&store, &late_card).await;
    assert!(refused.decision.changed && refused.sequences.is_empty());
    assert_stored(&store, &refused.decision.record).await;
    assert_eq!(
        refused.decision.record.to_json()["reason"],
        "run_not_running"
    );
    let events = all_events(&store, &run_id).await;
    assert_eq!(events.last().unwrap()["type"], "run_completed");
    assert_eq!(events.last().unwrap()["sequence"], json!(end.sequence));
    let head = store.read_head(&run_id).await.unwrap().unwrap();
    assert_eq!(head.budget_used.unwrap()["calls"], 1);
}

/// GIVEN retention on, a dispatched call that its settlement deadline settled
/// `outcome_unknown` and a call that completed WHEN the run goes on and retention
/// removes whatever of the run's mutation items falls due no later than its head THEN a
/// new attempt of either tool call (a fresh approval) is still blocked — by the unknown
/// outcome, still there for an operator to reconcile, and by the completed call.
pub async fn retention_never_frees_a_block(store: Store) {
    let run_id = budget_run(
        &store,
        "retain",
        json!({"tools": {"web_fetch": 2}, "call_ceiling": 5}),
    )
    .await;
    let card = approved_card(&store, &run_id, "call-r", "web_fetch").await;
    // Started two minutes ago: its settlement deadline (default 60 s) has passed.
    let past = tollgate_domain::now_millis() - 120_000;
    let req = start_request(&card);
    let started = decide_mutation(
        store.as_ref(),
        &run_id,
        &card.tool_call_id,
        &card.approval_id,
        |v| {
            execution::start(
                &req,
                &card,
                &v.head,
                &v.usage,
                &v.attempts,
                &ExecutionSettings::default(),
                past,
            )
        },
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(started.decision.record.state, MutationState::Intent);
    let dispatched = transit(&store, &started.decision.record, |r, run| {
        execution::dispatch(r, run, past + 1)
    })
    .await;
    assert_eq!(dispatched.decision.record.state, MutationState::Dispatched);
    let unknown = transit(&store, &dispatched.decision.record, |r, run| {
        execution::settle_at_deadline(r, run, r.settlement_deadline_at).expect("due")
    })
    .await;
    assert_eq!(unknown.decision.record.state, MutationState::OutcomeUnknown);
    // Another call completes: running it again would be a duplicate mutation.
    let done_card = approved_card(&store, &run_id, "call-d", "web_fetch").await;
    // (Also two minutes ago, so its deadline does not keep it.)
    let done_req = start_request(&done_card);
    let done = decide_mutation(
        store.as_ref(),
        &run_id,
        &done_card.tool_call_id,
        &done_card.approval_id,
        |v| {
            execution::start(
                &done_req,
                &done_card,
                &v.head,
                &v.usage,
                &v.attempts,
                &ExecutionSettings::default(),
                past,
            )
        },
    )
    .await
    .unwrap()
    .unwrap();
    let done = transit(&store, &done.decision.record, |r, run| {
        execution::dispatch(r, run, past + 1)
    })
    .await;
    let done = transit(&store, &done.decision.record, |r, run| {
        execution::settle(r, &confirmed(json!({"ok": true})), run, past + 2)
    })
    .await;
    assert_eq!(done.decision.record.state, MutationState::Completed);
    // The run goes on (its head's TTL moves), then retention catches up.
    store
        .append_events(
            RunRef::any(&run_id),
            vec![producer("agent.message", None, json!({"text": "later"}))],
        )
        .await
        .unwrap();
    store.expire_mutations_with_head(&run_id).await.unwrap();

    let mut again = card_for(&run_id, "req-call-r-2", None);
    again.tool_name = "web_fetch".into();
    again.tool_call_id = card.tool_call_id.clone();
    again.approval_id = "approval-call-r-2".into();
    again.explicit_ids = true;
    store
        .arm(RunRef::any(&run_id), again.clone())
        .await
        .unwrap();
    let again = match store
        .resolve(
            &run_id,
            &again.request_id,
            approve("alice"),
            tollgate_domain::now_millis(),
            None,
        )
        .await
        .unwrap()
    {
        Resolved::Fresh(c) => c,
        other => panic!("approval: {other:?}"),
    };
    let req = start_request(&again);
    let now = tollgate_domain::now_millis();
    let answer = decide_mutation(
        store.as_ref(),
        &run_id,
        &again.tool_call_id,
        &again.approval_id,
        |v| {
            execution::start(
                &req,
                &again,
                &v.head,
                &v.usage,
                &v.attempts,
                &ExecutionSettings::default(),
                now,
            )
        },
    )
    .await
    .unwrap();
    match answer {
        Err(execution::StartRefusal::Blocked(r)) => {
            assert_eq!(r.state, MutationState::OutcomeUnknown);
            assert_eq!(r.approval_id, card.approval_id);
        }
        other => panic!("a new attempt must stay blocked, got {other:?}"),
    }
    assert_stored(&store, &unknown.decision.record).await;
    assert_stored(&store, &done.decision.record).await;
    let mut again = card_for(&run_id, "req-call-d-2", None);
    again.tool_name = "web_fetch".into();
    again.tool_call_id = done_card.tool_call_id.clone();
    again.approval_id = "approval-call-d-2".into();
    again.explicit_ids = true;
    store
        .arm(RunRef::any(&run_id), again.clone())
        .await
        .unwrap();
    let Resolved::Fresh(again) = store
        .resolve(
            &run_id,
            &again.request_id,
            approve("alice"),
            tollgate_domain::now_millis(),
            None,
        )
        .await
        .unwrap()
    else {
        panic!("approval of the second attempt");
    };
    let req = start_request(&again);
    let answer = decide_mutation(
        store.as_ref(),
        &run_id,
        &again.tool_call_id,
        &again.approval_id,
        |v| {
            execution::start(
                &req,
                &again,
                &v.head,
                &v.usage,
                &v.attempts,
                &ExecutionSettings::default(),
                now,
            )
        },
    )
    .await
    .unwrap();
    match answer {
        Err(execution::StartRefusal::Blocked(r)) => {
            assert_eq!(r.state, MutationState::Completed)
        }
        other => panic!("a completed call must stay blocked, got {other:?}"),
    }
}

/// DynamoDB with retention on: GIVEN a run whose call is `outcome_unknown` (no TTL while
/// the run runs) WHEN the run ends THEN that record (and the call's guard) gets the
/// head's final TTL, so it goes with the run instead of staying for ever.
pub async fn an_ended_runs_records_expire_with_it(dynamo: crate::dynamo::DynamoStore) {
    use aws_sdk_dynamodb::types::AttributeValue;
    let raw = dynamo.clone();
    let store: Store = Arc::new(dynamo);
    let run_id = budget_run(&store, "ends", json!({"tools": {"web_fetch": 1}})).await;
    let card = approved_card(&store, &run_id, "call-e", "web_fetch").await;
    let started = start_call(&store, &card).await;
    let dispatched = transit(&store, &started.decision.record, |r, run| {
        execution::dispatch(r, run, r.settlement_deadline_at - 1)
    })
    .await;
    let unknown = transit(&store, &dispatched.decision.record, |r, run| {
        execution::settle_at_deadline(r, run, r.settlement_deadline_at).expect("due")
    })
    .await;
    assert_eq!(unknown.decision.record.state, MutationState::OutcomeUnknown);
    let ttl = |table: String, key: Vec<(&'static str, String)>| {
        let raw = raw.clone();
        async move {
            let mut get = raw
                .client()
                .get_item()
                .table_name(table)
                .consistent_read(true);
            for (k, v) in key {
                get = get.key(k, AttributeValue::S(v));
            }
            let item = get.send().await.unwrap().item.expect("item");
            item.get("expires_at")
                .map(|v| v.as_n().unwrap().parse::<i64>().unwrap())
        }
    };
    let record_key = || {
        vec![
            ("run_id", run_id.clone()),
            (
                "mutation_key",
                crate::mutation_key("call-e", "approval-call-e"),
            ),
        ]
    };
    let mutations = raw.tables().mutations.clone();
    assert_eq!(
        ttl(mutations.clone(), record_key()).await,
        None,
        "no TTL while the run can start calls"
    );
    store
        .finish_run(RunRef::any(&run_id), TerminalKind::Complete, Map::new())
        .await
        .unwrap();
    let head = ttl(raw.tables().runs.clone(), vec![("run_id", run_id.clone())])
        .await
        .expect("the head has a TTL");
    let record = ttl(mutations.clone(), record_key())
        .await
        .expect("a TTL now");
    assert!(record >= head, "{record} < {head}");
    let guard = ttl(
        mutations,
        vec![
            ("run_id", run_id.clone()),
            ("mutation_key", crate::mutation_key("call-e", "")),
        ],
    )
    .await
    .expect("the guard has a TTL");
    assert!(guard >= head, "{guard} < {head}");
}
