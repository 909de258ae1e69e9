//! Approval cards' contract: arming, coordinators' mirrors, one resolution per card,
//! deadlines and ended runs, pending heartbeats, forwarded pod decisions and the cap on
//! a run's pending cards.

use super::*;

/// GIVEN a running run WHEN a card is armed (twice, as a retry would) THEN one card, one
/// `tool.approval_required` with seed 003's payload, listed as pending.
pub async fn arming_writes_one_card_and_one_event(store: Store) {
    let run_id = new_run(&store, "arm").await;
    let rid = format!("req-{}", uuid::Uuid::new_v4());
    let armed = store
        .arm(RunRef::any(&run_id), card_for(&run_id, &rid, None))
        .await
        .unwrap();
    let Armed::Created { card, sequence } = armed else {
        panic!("first arm creates")
    };
    assert_eq!(sequence, 2);
    assert_eq!(card.state, ApprovalState::Pending);
    let again = store
        .arm(RunRef::any(&run_id), card_for(&run_id, &rid, None))
        .await
        .unwrap();
    assert!(matches!(again, Armed::Existing(c) if c.request_id == rid));
    let events = all_events(&store, &run_id).await;
    assert_eq!(types(&events), ["run_started", "tool.approval_required"]);
    assert_eq!(events[1]["requestId"], json!(rid));
    assert_eq!(events[1]["displayId"], json!(&rid[..8]));
    assert_eq!(events[1]["toolName"], "web_fetch");
    assert_eq!(events[1]["url"], "https://example.com/a");
    let stored = store.read_card(&run_id, &rid).await.unwrap().unwrap();
    assert_eq!(stored.arguments_hash.as_deref(), Some("sha256:abc"));
    let pending = store.pending_cards(&run_id).await.unwrap();
    assert_eq!(pending.len(), 1);
    let open = store.open_cards(None, None, 1000).await.unwrap();
    assert!(open.iter().any(|c| c.request_id == rid));
    // A stale incarnation arms nothing.
    assert_eq!(
        store
            .arm(
                RunRef::exact(&run_id, "0000000000000000"),
                card_for(&run_id, "other", None)
            )
            .await,
        Err(StoreError::NotFound)
    );
}

/// GIVEN a child of a coordinator WHEN its card is armed and approved THEN both streams
/// tell it, the route leads to the child, and the request id cannot be reused by a
/// sibling.
pub async fn coordinators_mirror_their_children(store: Store) {
    let coordinator = fresh_id("coord");
    store
        .create_run(NewRun {
            run_id: coordinator.clone(),
            kind: tollgate_domain::RunKind::Coordinator,
            created_by: "contract".into(),
            ..NewRun::default()
        })
        .await
        .unwrap();
    let child = child_of(&store, &coordinator, "child").await;
    let sibling = child_of(&store, &coordinator, "sibling").await;
    let rid = format!("req-{}", uuid::Uuid::new_v4());
    store
        .arm(
            RunRef::any(&child),
            card_for(&child, &rid, Some(&coordinator)),
        )
        .await
        .unwrap();
    assert_eq!(
        store.read_route(&coordinator, &rid).await.unwrap(),
        Some(child.clone())
    );
    assert!(matches!(
        store
            .arm(
                RunRef::any(&sibling),
                card_for(&sibling, &rid, Some(&coordinator))
            )
            .await,
        Err(StoreError::Conflict(_))
    ));
    let at = tollgate_domain::now_millis();
    let resolved = store
        .resolve(&child, &rid, approve("alice"), at, None)
        .await
        .unwrap();
    assert!(matches!(&resolved, Resolved::Fresh(c) if c.state == ApprovalState::Approved));
    let child_events = all_events(&store, &child).await;
    assert_eq!(
        types(&child_events),
        [
            "run_started",
            "tool.approval_required",
            "tool.approval_resolved"
        ]
    );
    assert_eq!(child_events[2]["runId"], json!(child));
    assert_eq!(child_events[2]["approved"], true);
    assert_eq!(child_events[2]["expired"], false);
    assert_eq!(child_events[2]["decidedBy"], "alice");
    let coord_events = all_events(&store, &coordinator).await;
    assert_eq!(
        types(&coord_events),
        [
            "run_started",
            "coordinator.child_approval_required",
            "coordinator.child_approval_resolved"
        ]
    );
    assert_eq!(coord_events[1]["childRunId"], json!(child));
    assert_eq!(coord_events[1]["subtaskId"], 3);
    assert_eq!(coord_events[2]["approved"], true);
    assert!(store.pending_cards(&child).await.unwrap().is_empty());
}

/// GIVEN one pending card WHEN 24 approvals and denials race (over every store given)
/// THEN exactly one wins, one `tool.approval_resolved` is written, and every loser reads
/// the winner's state.
pub async fn one_resolution_wins(stores: Vec<Store>) {
    let store = stores[0].clone();
    let run_id = new_run(&store, "race").await;
    let rid = format!("req-{}", uuid::Uuid::new_v4());
    store
        .arm(RunRef::any(&run_id), card_for(&run_id, &rid, None))
        .await
        .unwrap();
    let at = tollgate_domain::now_millis();
    let racers: Vec<_> = (0..24)
        .map(|i| {
            let store = stores[i % stores.len()].clone();
            let (run_id, rid) = (run_id.clone(), rid.clone());
            tokio::spawn(async move {
                let resolution = if i % 2 == 0 {
                    approve(&format!("op{i}"))
                } else {
                    Resolution::Denied {
                        by: format!("op{i}"),
                        reason: None,
                    }
                };
                store
                    .resolve(&run_id, &rid, resolution, at, None)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut fresh = Vec::new();
    let mut states = std::collections::HashSet::new();
    for r in racers {
        match r.await.unwrap() {
            Resolved::Fresh(c) => {
                states.insert(c.state);
                fresh.push(c);
            }
            Resolved::Already(c) => {
                states.insert(c.state);
            }
        }
    }
    assert_eq!(fresh.len(), 1, "exactly one click wins");
    assert_eq!(states.len(), 1, "every answer reports the same final state");
    let events = all_events(&store, &run_id).await;
    assert_eq!(
        types(&events),
        [
            "run_started",
            "tool.approval_required",
            "tool.approval_resolved"
        ]
    );
    assert_eq!(events[2]["decidedBy"], json!(fresh[0].decided_by));
}

/// A click at or after the deadline expires the card instead of deciding it; a run that
/// ended refuses decisions (409 upstream) and expires its cards without an event.
pub async fn deadlines_and_ended_runs(store: Store) {
    let run_id = new_run(&store, "deadline").await;
    let mut late = card_for(&run_id, "late-1", None);
    late.expires_at = tollgate_domain::now_millis() - 1;
    store.arm(RunRef::any(&run_id), late).await.unwrap();
    let answer = store
        .resolve(
            &run_id,
            "late-1",
            approve("alice"),
            tollgate_domain::now_millis(),
            None,
        )
        .await
        .unwrap();
    let Resolved::Fresh(card) = answer else {
        panic!("the late click moved the card")
    };
    assert_eq!(card.state, ApprovalState::Expired);
    assert_eq!(card.decided_by, None, "nobody decided an expired card");
    let events = all_events(&store, &run_id).await;
    assert_eq!(events[2]["type"], "tool.approval_resolved");
    assert_eq!(
        (events[2]["approved"].clone(), events[2]["expired"].clone()),
        (json!(false), json!(true))
    );
    // A click asked before the deadline whose write commits after it (a decision held
    // up by retries) is judged by the clock at commit: it expires the card, with the
    // usual event, and is never approved.
    let mut slow = card_for(&run_id, "slow-1", None);
    slow.expires_at = tollgate_domain::now_millis() - 1;
    let asked_at = slow.expires_at - 2_000;
    store.arm(RunRef::any(&run_id), slow).await.unwrap();
    let Resolved::Fresh(card) = store
        .resolve(&run_id, "slow-1", approve("alice"), asked_at, None)
        .await
        .unwrap()
    else {
        panic!("the slow click moved the card")
    };
    assert_eq!(card.state, ApprovalState::Expired);
    assert_eq!(card.decided_by, None);
    assert!(
        card.decided_at.is_some_and(|t| t >= card.expires_at),
        "ended by the clock at commit, not the click's time: {card:?}"
    );
    let events = all_events(&store, &run_id).await;
    let last = events.last().unwrap();
    assert_eq!(
        (last["type"].clone(), last["requestId"].clone()),
        (json!("tool.approval_resolved"), json!("slow-1"))
    );
    assert_eq!(
        (last["approved"].clone(), last["expired"].clone()),
        (json!(false), json!(true))
    );
    // A denial is judged by its click's time: one asked 2 s before the deadline whose
    // write commits after it stays a denial, with who denied it and why.
    let mut slow_no = card_for(&run_id, "slow-2", None);
    slow_no.expires_at = tollgate_domain::now_millis() - 1;
    let asked_at = slow_no.expires_at - 2_000;
    store.arm(RunRef::any(&run_id), slow_no).await.unwrap();
    let denial = Resolution::Denied {
        by: "alice".into(),
        reason: Some("not now".into()),
    };
    let Resolved::Fresh(card) = store
        .resolve(&run_id, "slow-2", denial, asked_at, None)
        .await
        .unwrap()
    else {
        panic!("the slow denial moved the card")
    };
    assert_eq!(card.state, ApprovalState::Denied, "{card:?}");
    assert_eq!(card.decided_by.as_deref(), Some("alice"));
    assert_eq!(card.decision_reason.as_deref(), Some("not now"));
    let events = all_events(&store, &run_id).await;
    let last = events.last().unwrap();
    assert_eq!(
        (last["type"].clone(), last["requestId"].clone()),
        (json!("tool.approval_resolved"), json!("slow-2"))
    );
    assert_eq!(
        (last["approved"].clone(), last["expired"].clone()),
        (json!(false), json!(false))
    );
    // An unknown card is NotFound.
    assert_eq!(
        store
            .resolve(&run_id, "nope", Resolution::Expired, 0, None)
            .await,
        Err(StoreError::NotFound)
    );
    // A run's end refuses while a card is pending, writing nothing (invariant 3: the
    // cards it closes are announced first).
    store
        .arm(RunRef::any(&run_id), card_for(&run_id, "open-1", None))
        .await
        .unwrap();
    let before = all_events(&store, &run_id).await;
    assert_eq!(
        store
            .finish_run(RunRef::any(&run_id), TerminalKind::Complete, Map::new())
            .await,
        Err(StoreError::CardsOpen(1))
    );
    assert_eq!(all_events(&store, &run_id).await, before, "nothing written");
    // Ended as `run_ended` while the run runs: announced on the run, expired.
    let now = tollgate_domain::now_millis();
    let Resolved::Fresh(c) = store
        .resolve(&run_id, "open-1", Resolution::RunEnded, now, None)
        .await
        .unwrap()
    else {
        panic!("the card was pending");
    };
    assert_eq!(c.state, ApprovalState::Expired);
    assert_eq!(c.end_reason.as_deref(), Some("run_ended"));
    assert_eq!(c.decided_by, None, "nobody decided it");
    let last = all_events(&store, &run_id).await.pop().unwrap();
    assert_eq!(
        (
            &last["type"],
            &last["requestId"],
            &last["expired"],
            &last["reason"]
        ),
        (
            &json!("tool.approval_resolved"),
            &json!("open-1"),
            &json!(true),
            &json!("run_ended")
        )
    );
    store
        .finish_run(RunRef::any(&run_id), TerminalKind::Complete, Map::new())
        .await
        .unwrap();
    // A decision after the end never approves the card: it answers the ended card.
    assert!(matches!(
        store.resolve(&run_id, "open-1", approve("bob"), now, None).await.unwrap(),
        Resolved::Already(c) if c.state == ApprovalState::Expired
    ));
    assert!(
        store.pending_cards(&run_id).await.unwrap().is_empty(),
        "no card of an ended run is pending"
    );
    let after = all_events(&store, &run_id).await;
    assert_eq!(
        after.last().unwrap()["type"],
        "run_completed",
        "nothing after the end"
    );
    assert!(matches!(
        store
            .arm(RunRef::any(&run_id), card_for(&run_id, "after-end", None))
            .await,
        Err(StoreError::RunTerminal { .. })
    ));
}

/// Heartbeats while pending; none once resolved, even when they race the resolution.
pub async fn heartbeats_never_follow_the_resolution(store: Store) {
    let run_id = new_run(&store, "beat").await;
    let rid = "beat-1";
    store
        .arm(RunRef::any(&run_id), card_for(&run_id, rid, None))
        .await
        .unwrap();
    assert!(matches!(
        store.heartbeat(&run_id, rid, 1).await.unwrap(),
        Beat::Emitted(3)
    ));
    // The same heartbeat delivered again (an SQS duplicate, at once or late) writes
    // nothing, answers its sequence and carries nothing on: only the delivery that wrote
    // it schedules the next, so the chain never forks.
    assert!(matches!(
        store.heartbeat(&run_id, rid, 1).await.unwrap(),
        Beat::Repeated(3)
    ));
    assert!(matches!(
        store.heartbeat(&run_id, rid, 2).await.unwrap(),
        Beat::Emitted(4)
    ));
    assert!(matches!(
        store.heartbeat(&run_id, rid, 1).await.unwrap(),
        Beat::Repeated(3)
    ));
    // Of concurrent deliveries of one beat, exactly one carries the chain on.
    let racers: Vec<_> = (0..4)
        .map(|_| {
            let (store, run_id) = (store.clone(), run_id.clone());
            tokio::spawn(async move { store.heartbeat(&run_id, rid, 3).await.unwrap() })
        })
        .collect();
    let mut carried = 0;
    for r in racers {
        if matches!(r.await.unwrap(), Beat::Emitted(_)) {
            carried += 1;
        }
    }
    assert_eq!(carried, 1, "one delivery of beat 3 carries the chain on");
    let beaters: Vec<_> = (0..4)
        .map(|_| {
            let (store, run_id) = (store.clone(), run_id.clone());
            tokio::spawn(async move {
                for beat in 2..12 {
                    if store.heartbeat(&run_id, rid, beat).await.unwrap() == Beat::Stopped {
                        return;
                    }
                }
            })
        })
        .collect();
    store
        .resolve(
            &run_id,
            rid,
            approve("alice"),
            tollgate_domain::now_millis(),
            None,
        )
        .await
        .unwrap();
    for b in beaters {
        b.await.unwrap();
    }
    assert_eq!(
        store.heartbeat(&run_id, rid, 99).await.unwrap(),
        Beat::Stopped
    );
    let events = all_events(&store, &run_id).await;
    let resolved_at = events
        .iter()
        .position(|e| e["type"] == "tool.approval_resolved")
        .expect("resolved");
    assert!(
        events[resolved_at + 1..]
            .iter()
            .all(|e| e["type"] != "tool.approval_pending"),
        "no heartbeat after the resolution: {:?}",
        types(&events)
    );
    assert_eq!(events[2]["type"], "tool.approval_pending");
    assert_eq!(events[2]["displayId"], "beat-1");
    assert_eq!(
        sequences(&events),
        (1..=events.len() as u64).collect::<Vec<_>>()
    );
}

/// A pod's card as the pod ended it (what a forward records).
fn pod_card(run_id: &str, request_id: &str, state: ApprovalState) -> ApprovalRequest {
    let mut card = card_for(run_id, request_id, None);
    card.state = state;
    card.scope = (state == ApprovalState::Approved).then_some(Scope::Tool);
    card.decided_by = Some("alice".into());
    card.decided_at = Some(card.created_at);
    card
}

/// GIVEN a pod's decision forwarded several times WHEN each records it THEN one
/// `tool.approval_resolved` (keyed per request); a forward that did not apply it records
/// no policy, the applying one does — also when it comes second; nothing after the run
/// ended.
pub async fn forwarded_decisions_are_recorded_once(store: Store) {
    let run_id = new_run(&store, "forward").await;
    let rid = format!("req-{}", uuid::Uuid::new_v4());
    let key = format!("run:{run_id}");
    let card = pod_card(&run_id, &rid, ApprovalState::Approved);
    // A forward that did not apply the decision (the pod answered applied: false) wins
    // the race to the event: no policy from it.
    let first = store.record_forwarded(&run_id, &card, None).await.unwrap();
    let Forwarded::Fresh(seq) = first else {
        panic!("first record writes: {first:?}")
    };
    assert_eq!(store.read_policy(&key, "web_fetch").await.unwrap(), None);
    // The forward that applied it comes second: the same event, and its policy.
    let grant = tool_policy(&run_id, &rid, "web_fetch");
    assert_eq!(
        store
            .record_forwarded(&run_id, &card, Some(grant))
            .await
            .unwrap(),
        Forwarded::Already(seq)
    );
    let policy = store.read_policy(&key, "web_fetch").await.unwrap();
    assert!(policy.is_some_and(|p| p.is_live() && p.scope == Scope::Tool));
    assert_eq!(
        store.record_forwarded(&run_id, &card, None).await.unwrap(),
        Forwarded::Already(seq)
    );
    // Revoked, then the same applied decision sent again: the revocation stands.
    store
        .revoke_policy(&key, "web_fetch", "bob", tollgate_domain::now_millis())
        .await
        .unwrap();
    let again = tool_policy(&run_id, &rid, "web_fetch");
    assert_eq!(
        store
            .record_forwarded(&run_id, &card, Some(again))
            .await
            .unwrap(),
        Forwarded::Already(seq)
    );
    let policy = store.read_policy(&key, "web_fetch").await.unwrap().unwrap();
    assert!(!policy.is_live(), "{policy:?}");
    let events = all_events(&store, &run_id).await;
    assert_eq!(
        types(&events),
        [
            "run_started",
            "tool.approval_resolved",
            "tool.policy_revoked"
        ]
    );
    assert_eq!(events[1]["requestId"], json!(rid));
    assert_eq!(events[1]["approved"], true);
    assert_eq!(events[1]["sequence"], json!(seq));

    // A denial grants nothing, whatever is passed; after the run ended nothing is written.
    let denied = pod_card(&run_id, "req-denied", ApprovalState::Denied);
    let other = tool_policy(&run_id, "req-denied", "shell");
    assert!(matches!(
        store
            .record_forwarded(&run_id, &denied, Some(other))
            .await
            .unwrap(),
        Forwarded::Fresh(_)
    ));
    assert_eq!(store.read_policy(&key, "shell").await.unwrap(), None);
    store
        .finish_run(RunRef::any(&run_id), TerminalKind::Complete, Map::new())
        .await
        .unwrap();
    let late = pod_card(&run_id, "req-late", ApprovalState::Approved);
    let late_grant = tool_policy(&run_id, "req-late", "late_tool");
    assert_eq!(
        store
            .record_forwarded(&run_id, &late, Some(late_grant))
            .await
            .unwrap(),
        Forwarded::RunEnded
    );
    assert_eq!(store.read_policy(&key, "late_tool").await.unwrap(), None);
    // The decision recorded before the end is still answered as such.
    assert_eq!(
        store.record_forwarded(&run_id, &card, None).await.unwrap(),
        Forwarded::Already(seq)
    );
    let events = all_events(&store, &run_id).await;
    assert_eq!(
        types(&events),
        [
            "run_started",
            "tool.approval_resolved",
            "tool.policy_revoked",
            "tool.approval_resolved",
            "run_completed"
        ]
    );
}

/// GIVEN cards at their deadline WHEN an approval click (just before, at or just after
/// the deadline) races the expiry, `trials` times (over every store given) THEN each
/// card ends in exactly one state with exactly one resolved event, and a click at or
/// after the deadline never approves.
pub async fn expiry_races_clicks_at_the_deadline(stores: Vec<Store>, trials: usize) {
    let store = stores[0].clone();
    let run_id = new_run(&store, "deadline-race").await;
    for i in 0..trials {
        let rid = format!("race-{i}");
        let mut card = card_for(&run_id, &rid, None);
        let deadline = tollgate_domain::now_millis() + 1_000;
        card.expires_at = deadline;
        store.arm(RunRef::any(&run_id), card).await.unwrap();
        let click_at = deadline - 1 + (i % 3) as i64;
        let (a, b) = (
            stores[i % stores.len()].clone(),
            stores[(i + 1) % stores.len()].clone(),
        );
        let (r1, r2) = (run_id.clone(), run_id.clone());
        let (q1, q2) = (rid.clone(), rid.clone());
        let click = tokio::spawn(async move {
            a.resolve(&r1, &q1, approve("op"), click_at, None)
                .await
                .unwrap()
        });
        let expiry = tokio::spawn(async move {
            b.resolve(&r2, &q2, Resolution::Expired, deadline, None)
                .await
                .unwrap()
        });
        let answers = [click.await.unwrap(), expiry.await.unwrap()];
        let fresh: Vec<&ApprovalRequest> = answers
            .iter()
            .filter_map(|r| match r {
                Resolved::Fresh(c) => Some(c),
                _ => None,
            })
            .collect();
        assert_eq!(fresh.len(), 1, "trial {i}: one transition");
        let stored = store.read_card(&run_id, &rid).await.unwrap().unwrap();
        assert_eq!(stored.state, fresh[0].state);
        if click_at >= deadline {
            assert_eq!(
                stored.state,
                ApprovalState::Expired,
                "trial {i}: late click"
            );
        }
    }
    let events = all_events(&store, &run_id).await;
    for i in 0..trials {
        let rid = format!("race-{i}");
        let resolved = events
            .iter()
            .filter(|e| e["type"] == "tool.approval_resolved" && e["requestId"] == json!(rid))
            .count();
        assert_eq!(resolved, 1, "{rid}");
    }
}

/// GIVEN a run holding the most pending cards a run may hold (armed concurrently, in
/// bursts) WHEN another is armed THEN it is refused and nothing is written — a retry of
/// an armed one still answers its card; once one card ends, one more may be armed.
pub async fn a_run_holds_a_bounded_number_of_pending_cards(store: Store) {
    use tollgate_domain::approval::MAX_OPEN_CARDS_PER_RUN;
    let run_id = new_run(&store, "cap").await;
    let max = MAX_OPEN_CARDS_PER_RUN as usize;
    // 8 more than the cap, 16 at a time: exactly the cap is armed.
    let ids: Vec<String> = (0..max + 8).map(|i| format!("cap-{i:03}")).collect();
    let mut armed = 0;
    let mut refused = 0;
    let mut first = None;
    for chunk in ids.chunks(16) {
        let calls: Vec<_> = chunk
            .iter()
            .map(|rid| {
                let (store, run_id, rid) = (store.clone(), run_id.clone(), rid.clone());
                tokio::spawn(async move {
                    // 16 arms race on one head: one may spend its contention budget.
                    until_served("arm", || {
                        store.arm(RunRef::any(&run_id), card_for(&run_id, &rid, None))
                    })
                    .await
                })
            })
            .collect();
        for c in calls {
            match c.await.unwrap() {
                Ok(Armed::Created { card, .. }) => {
                    armed += 1;
                    first.get_or_insert(card.request_id);
                }
                Err(StoreError::Conflict(msg)) => {
                    assert!(msg.contains("pending approval requests"), "{msg}");
                    refused += 1
                }
                other => panic!("{other:?}"),
            }
        }
    }
    assert_eq!((armed, refused), (max, 8));
    let events = all_events(&store, &run_id).await;
    assert_eq!(
        events.len(),
        1 + max,
        "run_started + one event per armed card"
    );
    // A retry of an armed card still answers it.
    let first = first.expect("some armed");
    assert!(matches!(
        store
            .arm(RunRef::any(&run_id), card_for(&run_id, &first, None))
            .await
            .unwrap(),
        Armed::Existing(_)
    ));
    store
        .resolve(
            &run_id,
            &first,
            approve("alice"),
            tollgate_domain::now_millis(),
            None,
        )
        .await
        .unwrap();
    assert!(matches!(
        store
            .arm(RunRef::any(&run_id), card_for(&run_id, "cap-after", None))
            .await
            .unwrap(),
        Armed::Created { .. }
    ));
    assert!(store
        .arm(RunRef::any(&run_id), card_for(&run_id, "cap-over", None))
        .await
        .is_err());
}

/// Two store instances on one backend, each remembering the cards it armed and the heads
/// it wrote: a decision from what one instance remembers never undoes or doubles what
/// the other did. A card denied on `b` stays denied when `a` (which armed it) approves
/// it, with no policy; `a` decides a card after `b` moved the run's head, and the
/// resolution lands after `b`'s events; once `b` ended the last card as `run_ended` and
/// then the run, `a`'s approval answers that card.
pub async fn remembered_cards_follow_other_instances(a: Store, b: Store) {
    let run_id = new_run(&a, "remembered-cards").await;
    let run = RunRef::any(&run_id);
    for rid in ["denied-elsewhere", "head-moved", "run-ended"] {
        assert!(matches!(
            a.arm(run, card_for(&run_id, rid, None)).await.unwrap(),
            Armed::Created { .. }
        ));
    }
    let denied = b
        .resolve(
            &run_id,
            "denied-elsewhere",
            Resolution::Denied {
                by: "bob".into(),
                reason: None,
            },
            tollgate_domain::now_millis(),
            None,
        )
        .await
        .unwrap();
    assert!(matches!(denied, Resolved::Fresh(ref c) if c.state == ApprovalState::Denied));
    let policy = tool_policy(&run_id, "denied-elsewhere", "web_fetch");
    let late = a
        .resolve(
            &run_id,
            "denied-elsewhere",
            Resolution::Approved {
                scope: Scope::Tool,
                by: "alice".into(),
                reason: None,
            },
            tollgate_domain::now_millis(),
            Some(policy.clone()),
        )
        .await
        .unwrap();
    assert!(
        matches!(late, Resolved::Already(ref c) if c.state == ApprovalState::Denied),
        "{late:?}"
    );
    assert_eq!(
        a.find_policy(std::slice::from_ref(&policy.scope_key), "web_fetch")
            .await
            .unwrap(),
        None,
        "no policy from the losing approval"
    );

    let moved = b
        .append_events(run, vec![producer("agent.message", None, json!({}))])
        .await
        .unwrap();
    let approved = a
        .resolve(
            &run_id,
            "head-moved",
            approve("alice"),
            tollgate_domain::now_millis(),
            None,
        )
        .await
        .unwrap();
    assert!(matches!(approved, Resolved::Fresh(ref c) if c.state == ApprovalState::Approved));
    let events = all_events(&a, &run_id).await;
    let resolved_at = events
        .iter()
        .position(|e| e["type"] == "tool.approval_resolved" && e["requestId"] == "head-moved")
        .expect("resolved event") as u64
        + 1;
    assert!(
        resolved_at > moved[0],
        "the resolution follows the other's append"
    );

    // `b` refuses the end while `a`'s card is pending, ends the card as the run's end
    // does, then ends the run; `a`'s approval from what it remembers approves nothing.
    assert_eq!(
        b.finish_run(run, TerminalKind::Complete, Map::new()).await,
        Err(StoreError::CardsOpen(1))
    );
    assert!(matches!(
        b.resolve(
            &run_id,
            "run-ended",
            Resolution::RunEnded,
            tollgate_domain::now_millis(),
            None
        )
        .await
        .unwrap(),
        Resolved::Fresh(_)
    ));
    b.finish_run(run, TerminalKind::Complete, Map::new())
        .await
        .unwrap();
    let after_end = a
        .resolve(
            &run_id,
            "run-ended",
            approve("alice"),
            tollgate_domain::now_millis(),
            None,
        )
        .await
        .unwrap();
    let card = match after_end {
        Resolved::Fresh(c) | Resolved::Already(c) => c,
    };
    assert_eq!(
        (card.state, card.end_reason.as_deref()),
        (ApprovalState::Expired, Some("run_ended")),
        "nothing approved after the run's end"
    );
    let events = all_events(&a, &run_id).await;
    assert_eq!(
        sequences(&events),
        (1..=events.len() as u64).collect::<Vec<_>>()
    );
    assert_eq!(
        events.last().unwrap()["type"],
        "run_completed",
        "nothing after the end"
    );
    assert_eq!(count_of(&a, &run_id, "tool.approval_resolved").await, 3);
}
