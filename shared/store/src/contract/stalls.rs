//! The stall guard's contract: a silent child failed or reported once, and the listing
//! of silent children it reads.

use super::*;

/// The stall guard's check in `report` mode (`TOLLGATE_STALL_ACTION=report`).
fn report_only(now: i64) -> tollgate_domain::StallCheck {
    tollgate_domain::StallCheck {
        now,
        timeout_ms: 30_000,
        action: tollgate_domain::StallAction::Report,
    }
}

/// GIVEN a silent child WHEN the stall guard (seed 003's default, `fail`) acts on it twice
/// at once, as two sweepers would THEN its coordinator gets one
/// `coordinator.child_stall_detected` (with `staleSinceUtc`, `stallTimeoutSeconds`,
/// `lastEventSequence`) and the child one `run_failed` with `reason:
/// "agent_stall_timeout"`, in one step; a child holding a pending card — even one armed
/// before its latest event — is neither listed nor failed.
pub async fn a_silent_child_is_failed_once(store: Store) {
    let coordinator = fresh_id("stall-fail-coord");
    store
        .create_run(NewRun {
            run_id: coordinator.clone(),
            kind: tollgate_domain::RunKind::Coordinator,
            created_by: "contract".into(),
            ..NewRun::default()
        })
        .await
        .unwrap();
    let child = child_of(&store, &coordinator, "stall-fail-child").await;
    let waiting = child_of(&store, &coordinator, "stall-fail-waiting").await;
    store
        .arm(
            RunRef::any(&waiting),
            card_for(&waiting, "open-1", Some(&coordinator)),
        )
        .await
        .unwrap();
    store
        .append_events(
            RunRef::any(&waiting),
            vec![producer("agent.message", None, json!({}))],
        )
        .await
        .unwrap();
    let later = tollgate_domain::now_millis() + 60_000;
    let check = tollgate_domain::StallCheck {
        now: later,
        timeout_ms: 30_000,
        action: tollgate_domain::StallAction::Fail,
    };
    let silent = store.silent_children(later, 10_000).await.unwrap();
    assert!(
        silent.iter().all(|h| h.run_id != waiting),
        "a child holding a card is not a candidate"
    );
    let head = silent
        .into_iter()
        .find(|h| h.run_id == child)
        .expect("the silent child is listed");
    let (a, b) = tokio::join!(
        store.report_stall(&head, &check),
        store.report_stall(&head, &check)
    );
    assert_eq!(
        [a.unwrap(), b.unwrap()]
            .iter()
            .filter(|r| r.is_some())
            .count(),
        1,
        "one report per silence"
    );
    let ended = store.read_head(&child).await.unwrap().unwrap();
    assert_eq!(ended.status, tollgate_domain::RunStatus::Failed);
    let child_events = all_events(&store, &child).await;
    assert_eq!(types(&child_events), ["run_started", "run_failed"]);
    assert_eq!(child_events[1]["reason"], "agent_stall_timeout");
    let events = all_events(&store, &coordinator).await;
    let stalls: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "coordinator.child_stall_detected")
        .collect();
    assert_eq!(stalls.len(), 1, "{:?}", types(&events));
    assert_eq!(stalls[0]["childRunId"], json!(child));
    assert_eq!(stalls[0]["stallTimeoutSeconds"], 30);
    assert_eq!(stalls[0]["lastEventSequence"], 1);
    assert!(stalls[0]["staleSinceUtc"].is_string(), "{}", stalls[0]);
    // The waiting child, even if handed to the guard, is left alone.
    let waiting_head = store.read_head(&waiting).await.unwrap().unwrap();
    assert_eq!(
        store.report_stall(&waiting_head, &check).await.unwrap(),
        None
    );
    let still = store.read_head(&waiting).await.unwrap().unwrap();
    assert_eq!(still.status, tollgate_domain::RunStatus::Running);
    assert_eq!(still.next_seq, waiting_head.next_seq, "nothing written");
    // Nor is the failed child listed again.
    let silent = store.silent_children(later, 10_000).await.unwrap();
    assert!(silent.iter().all(|h| h.run_id != child));
}

/// GIVEN a silent child WHEN the stall guard reports it (twice, as two sweepers would)
/// THEN its coordinator gets one `coordinator.child_stall_detected`; a new event on the
/// child starts a new silence.
pub async fn a_silence_is_reported_once(store: Store) {
    let coordinator = fresh_id("stall-coord");
    store
        .create_run(NewRun {
            run_id: coordinator.clone(),
            kind: tollgate_domain::RunKind::Coordinator,
            created_by: "contract".into(),
            ..NewRun::default()
        })
        .await
        .unwrap();
    let child = child_of(&store, &coordinator, "stall-child").await;
    let later = tollgate_domain::now_millis() + 60_000;
    let silent = store.silent_children(later, 10_000).await.unwrap();
    let head = silent
        .into_iter()
        .find(|h| h.run_id == child)
        .expect("the silent child is listed");
    assert_eq!(head.last_real_type.as_deref(), Some("run_started"));
    assert!(tollgate_domain::is_stalled(&head, later, 30_000));
    let check = report_only(later);
    let (a, b) = tokio::join!(
        store.report_stall(&head, &check),
        store.report_stall(&head, &check)
    );
    assert_eq!(
        [a.unwrap(), b.unwrap()]
            .iter()
            .filter(|r| r.is_some())
            .count(),
        1,
        "one report per silence"
    );
    let fresh = store.read_head(&child).await.unwrap().unwrap();
    assert!(!tollgate_domain::is_stalled(&fresh, later, 30_000));
    let events = all_events(&store, &coordinator).await;
    assert_eq!(
        types(&events),
        ["run_started", "coordinator.child_stall_detected"]
    );
    assert_eq!(events[1]["childRunId"], json!(child));
    assert_eq!(events[1]["subtaskId"], 3);
    // The child speaks: its head records the real event; a later silence is new.
    store
        .append_events(
            RunRef::any(&child),
            vec![producer("tool.error", None, json!({}))],
        )
        .await
        .unwrap();
    let spoke = store.read_head(&child).await.unwrap().unwrap();
    assert_eq!(spoke.last_real_type.as_deref(), Some("tool.error"));
    assert!(tollgate_domain::is_stalled(&spoke, later, 30_000));
    // Ended children are not listed.
    store
        .finish_run(RunRef::any(&child), TerminalKind::Complete, Map::new())
        .await
        .unwrap();
    let silent = store.silent_children(later, 10_000).await.unwrap();
    assert!(silent.iter().all(|h| h.run_id != child));
}

/// GIVEN more silent children than the stall guard reads at once (limit 3) — five it
/// already reported and one whose coordinator has ended — WHEN a fresh child goes silent
/// THEN the guard's flow (list the oldest silent children, report the stalled ones)
/// reaches it: a reported child and an orphan leave the listing. A reported child that
/// speaks and falls silent again is listed and reported again (the guard cannot latch).
///
/// The runs table may be shared with other tests, whose children can sit before this
/// test's in the listing: the guard reads 3 beyond them, and touches only this test's.
pub async fn reported_and_orphaned_children_leave_the_stall_listing(store: Store) {
    const LIMIT: usize = 3;
    const TIMEOUT: i64 = 30_000;
    let coordinator = fresh_id("stall-clog-coord");
    let ended_coordinator = fresh_id("stall-clog-ended");
    for id in [&coordinator, &ended_coordinator] {
        store
            .create_run(NewRun {
                run_id: id.clone(),
                kind: tollgate_domain::RunKind::Coordinator,
                created_by: "contract".into(),
                ..NewRun::default()
            })
            .await
            .unwrap();
    }
    let mut reported = Vec::new();
    for _ in 0..5 {
        let child = child_of(&store, &coordinator, "stall-clog-reported").await;
        let head = store.read_head(&child).await.unwrap().unwrap();
        let at = head.last_event_at + TIMEOUT;
        assert!(tollgate_domain::is_stalled(&head, at, TIMEOUT));
        assert!(
            store
                .report_stall(&head, &report_only(at))
                .await
                .unwrap()
                .is_some(),
            "reported"
        );
        reported.push(child);
    }
    let orphan = child_of(&store, &ended_coordinator, "stall-clog-orphan").await;
    store
        .finish_run(
            RunRef::any(&ended_coordinator),
            TerminalKind::Complete,
            Map::new(),
        )
        .await
        .unwrap();
    let fresh = child_of(&store, &coordinator, "stall-clog-fresh").await;
    let since = store
        .read_head(&fresh)
        .await
        .unwrap()
        .unwrap()
        .last_event_at;
    let now = since + TIMEOUT;
    let ours: std::collections::HashSet<&String> =
        reported.iter().chain([&orphan, &fresh]).collect();
    let listed = |limit: usize| {
        let store = store.clone();
        async move { store.silent_children(since, limit).await.unwrap() }
    };
    let foreign = listed(100_000)
        .await
        .iter()
        .filter(|h| !ours.contains(&h.run_id))
        .count();
    let stalls_of = |child: String| {
        let (store, coordinator) = (store.clone(), coordinator.clone());
        async move {
            all_events(&store, &coordinator)
                .await
                .iter()
                .filter(|e| {
                    e["type"] == "coordinator.child_stall_detected"
                        && e["childRunId"] == json!(child)
                })
                .count()
        }
    };
    // The stall guard's flow, round after round (as its schedule runs it).
    for _round in 0..5 {
        for child in listed(foreign + LIMIT).await {
            if ours.contains(&child.run_id) && tollgate_domain::is_stalled(&child, now, TIMEOUT) {
                store.report_stall(&child, &report_only(now)).await.unwrap();
            }
        }
        if stalls_of(fresh.clone()).await > 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        stalls_of(fresh.clone()).await,
        1,
        "the fresh silence is reached and reported once"
    );
    for child in &reported {
        assert_eq!(stalls_of(child.clone()).await, 1, "{child}: reported once");
    }
    let left: Vec<String> = listed(100_000)
        .await
        .into_iter()
        .map(|h| h.run_id)
        .filter(|id| ours.contains(id))
        .collect();
    assert!(
        left.is_empty(),
        "reported children and orphans leave the listing: {left:?}"
    );
    assert_eq!(
        types(&all_events(&store, &ended_coordinator).await),
        ["run_started", "run_completed"]
    );
    let orphan_head = store.read_head(&orphan).await.unwrap().unwrap();
    assert_eq!(orphan_head.status, RunStatus::Running);
    // Not latched: a reported child speaks, falls silent again, and is reported again.
    store
        .append_events(
            RunRef::any(&fresh),
            vec![producer("tool.error", None, json!({}))],
        )
        .await
        .unwrap();
    let spoke = store.read_head(&fresh).await.unwrap().unwrap();
    let later = spoke.last_event_at + TIMEOUT;
    let relisted = store
        .silent_children(spoke.last_event_at, 100_000)
        .await
        .unwrap()
        .into_iter()
        .find(|h| h.run_id == fresh)
        .expect("a child that spoke is listed again");
    assert!(tollgate_domain::is_stalled(&relisted, later, TIMEOUT));
    assert!(store
        .report_stall(&relisted, &report_only(later))
        .await
        .unwrap()
        .is_some());
    assert_eq!(stalls_of(fresh.clone()).await, 2, "a new silence, reported");
}
