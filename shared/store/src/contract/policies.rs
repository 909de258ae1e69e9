//! Grants' contract: the paged listing, policies stored only from winning approvals,
//! revocation under load and the approved card an auto-approval stores.

use super::*;

/// Every policy of the listing, paged with `limit` from the start to the end.
async fn all_policies(
    store: &Store,
    project_id: Option<&str>,
    limit: usize,
) -> Vec<tollgate_domain::Policy> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store
            .list_policies(project_id, cursor.as_deref(), limit)
            .await
            .unwrap();
        assert!(page.policies.len() <= limit);
        all.extend(page.policies);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return all,
        }
    }
}

/// GIVEN seven grants in a project WHEN they are listed three at a time with each
/// page's cursor THEN pages of 3, 3 and 1, newest first across the pages, each grant
/// exactly once, `next_cursor` on all but the last; the listing of every project pages
/// through them once too; a cursor of another project, or one this store never handed
/// out, is `InvalidCursor`.
pub async fn policies_page_with_a_cursor(store: Store) {
    let run_id = new_run(&store, "pages").await;
    let project = fresh_id("proj");
    let other = fresh_id("proj");
    let base = tollgate_domain::now_millis();
    for i in 0..7 {
        let request = format!("pg-{i}");
        store
            .arm(RunRef::any(&run_id), card_for(&run_id, &request, None))
            .await
            .unwrap();
        let mut policy = tool_policy(&run_id, &request, &format!("tool_{i}"));
        policy.project_id = Some(project.clone());
        policy.granted_at = base + i;
        let won = store
            .resolve(&run_id, &request, approve("alice"), base, Some(policy))
            .await
            .unwrap();
        assert!(matches!(won, Resolved::Fresh(_)));
    }
    let first = store.list_policies(Some(&project), None, 3).await.unwrap();
    let second_cursor = first
        .next_cursor
        .clone()
        .expect("more after the first page");
    let second = store
        .list_policies(Some(&project), Some(&second_cursor), 3)
        .await
        .unwrap();
    let third = store
        .list_policies(Some(&project), second.next_cursor.as_deref(), 3)
        .await
        .unwrap();
    let tools = |page: &crate::PolicyPage| {
        page.policies
            .iter()
            .map(|p| p.tool_name.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(tools(&first), ["tool_6", "tool_5", "tool_4"]);
    assert_eq!(tools(&second), ["tool_3", "tool_2", "tool_1"]);
    assert_eq!(tools(&third)[..1], ["tool_0"]);
    if third.next_cursor.is_some() {
        // A store may only learn at the next read that nothing follows.
        let rest = store
            .list_policies(Some(&project), third.next_cursor.as_deref(), 3)
            .await
            .unwrap();
        assert!(rest.policies.is_empty() && rest.next_cursor.is_none());
    }
    assert_eq!(all_policies(&store, Some(&project), 7).await.len(), 7);
    // Every project's listing: each of them exactly once.
    let everyone = all_policies(&store, None, 4).await;
    let mut mine: Vec<String> = everyone
        .iter()
        .filter(|p| p.project_id.as_deref() == Some(project.as_str()))
        .map(|p| p.tool_name.clone())
        .collect();
    mine.sort();
    assert_eq!(
        mine,
        (0..7).map(|i| format!("tool_{i}")).collect::<Vec<_>>()
    );
    // Cursors are checked.
    for bad in ["zz", "7b7d", "", "0"] {
        assert_eq!(
            store.list_policies(Some(&project), Some(bad), 3).await,
            Err(StoreError::InvalidCursor),
            "{bad:?}"
        );
    }
    assert_eq!(
        store
            .list_policies(Some(&other), Some(&second_cursor), 3)
            .await,
        Err(StoreError::InvalidCursor)
    );
}

/// GIVEN an approval with a scope WHEN it wins THEN its policy is stored in the same
/// step (and only then); a covered gate is auto-approved once; a revocation stops it
/// and is announced on the stream.
pub async fn policies_come_only_from_winning_approvals(store: Store) {
    let run_id = new_run(&store, "policy").await;
    let key = format!("run:{run_id}");
    store
        .arm(RunRef::any(&run_id), card_for(&run_id, "p-1", None))
        .await
        .unwrap();
    let at = tollgate_domain::now_millis();
    let won = store
        .resolve(
            &run_id,
            "p-1",
            approve("alice"),
            at,
            Some(tool_policy(&run_id, "p-1", "web_fetch")),
        )
        .await
        .unwrap();
    assert!(matches!(won, Resolved::Fresh(_)));
    let policy = store
        .read_policy(&key, "web_fetch")
        .await
        .unwrap()
        .expect("the winner's policy");
    assert!(policy.is_live());
    assert_eq!(policy.reached_runs, vec![run_id.clone()]);
    // A losing approval writes no policy.
    store
        .arm(RunRef::any(&run_id), card_for(&run_id, "p-2", None))
        .await
        .unwrap();
    store
        .resolve(
            &run_id,
            "p-2",
            Resolution::Denied {
                by: "bob".into(),
                reason: None,
            },
            at,
            None,
        )
        .await
        .unwrap();
    let late = store
        .resolve(
            &run_id,
            "p-2",
            approve("alice"),
            at,
            Some(tool_policy(&run_id, "p-2", "shell")),
        )
        .await
        .unwrap();
    assert!(matches!(late, Resolved::Already(_)));
    assert_eq!(store.read_policy(&key, "shell").await.unwrap(), None);
    // Covered: auto-approved once, however often the gate is retried.
    let found = store
        .find_policy(&["run:other".to_string(), key.clone()], "web_fetch")
        .await
        .unwrap()
        .expect("covered");
    let gate = card_for(&run_id, "p-3", None);
    let first = store
        .auto_approve(RunRef::any(&run_id), &gate, &found)
        .await
        .unwrap();
    let again = store
        .auto_approve(RunRef::any(&run_id), &gate, &found)
        .await
        .unwrap();
    assert_eq!(first, again);
    // Revocation: announced once, then nothing is auto-approved.
    let revoked = store
        .revoke_policy(&key, "web_fetch", "op", at)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(revoked.revoked_by.as_deref(), Some("op"));
    let twice = store
        .revoke_policy(&key, "web_fetch", "op2", at)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(twice.revoked_by.as_deref(), Some("op"));
    assert_eq!(
        store
            .find_policy(std::slice::from_ref(&key), "web_fetch")
            .await
            .unwrap(),
        None
    );
    assert!(matches!(
        store
            .auto_approve(
                RunRef::any(&run_id),
                &card_for(&run_id, "p-4", None),
                &found
            )
            .await,
        Err(StoreError::Conflict(_))
    ));
    let listed = all_policies(&store, None, 50).await;
    assert!(listed.iter().any(|p| p.scope_key == key));
    let events = all_events(&store, &run_id).await;
    let kinds = types(&events);
    assert_eq!(
        kinds.iter().filter(|t| *t == "tool.auto_approved").count(),
        1
    );
    assert_eq!(
        kinds.iter().filter(|t| *t == "tool.policy_revoked").count(),
        1
    );
    let auto = events
        .iter()
        .find(|e| e["type"] == "tool.auto_approved")
        .unwrap();
    assert_eq!(auto["requestId"], "p-3");
    assert_eq!(auto["scope"], "tool");
}

/// GIVEN a policy that reached three running runs and one that has ended WHEN it is
/// revoked while two writers keep appending to the running ones (at most 2 × 2000
/// rounds; they stop once the revocation answers — a revocation that had to win one
/// race against every head at once would lose for its whole budget) THEN it answers
/// within the contention budget, the policy is revoked, and each running run holds
/// exactly one `tool.policy_revoked` (the ended one none); revoking again writes no
/// second announcement and answers the first revocation.
pub async fn revocation_stands_while_its_runs_are_busy(store: Store) {
    use std::sync::atomic::{AtomicBool, Ordering};
    const APPENDS: usize = 2000;
    let origin = new_run(&store, "revoke-origin").await;
    let key = format!("run:{origin}");
    store
        .arm(RunRef::any(&origin), card_for(&origin, "grant", None))
        .await
        .unwrap();
    let at = tollgate_domain::now_millis();
    let granted = store
        .resolve(
            &origin,
            "grant",
            approve("alice"),
            at,
            Some(tool_policy(&origin, "grant", "web_fetch")),
        )
        .await
        .unwrap();
    assert!(matches!(granted, Resolved::Fresh(_)));
    let policy = store
        .read_policy(&key, "web_fetch")
        .await
        .unwrap()
        .expect("granted");
    let mut running = vec![origin.clone()];
    for tag in ["revoke-reached-a", "revoke-reached-b"] {
        let run = new_run(&store, tag).await;
        store
            .auto_approve(RunRef::any(&run), &card_for(&run, "covered", None), &policy)
            .await
            .unwrap();
        running.push(run);
    }
    let ended = new_run(&store, "revoke-ended").await;
    store
        .auto_approve(
            RunRef::any(&ended),
            &card_for(&ended, "covered", None),
            &policy,
        )
        .await
        .unwrap();
    store
        .finish_run(RunRef::any(&ended), TerminalKind::Complete, Map::new())
        .await
        .unwrap();
    let reached = store.read_policy(&key, "web_fetch").await.unwrap().unwrap();
    assert_eq!(reached.reached_runs.len(), 4, "{:?}", reached.reached_runs);

    let stop = Arc::new(AtomicBool::new(false));
    // Each writer keeps one append in flight on every running run, so every head moves
    // all the time (heartbeats and producers on many streams).
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (store, runs, stop) = (store.clone(), running.clone(), stop.clone());
            tokio::spawn(async move {
                for i in 0..APPENDS {
                    if stop.load(Ordering::Relaxed) {
                        return i;
                    }
                    let appends = runs.iter().map(|run| {
                        store.append_events(
                            RunRef::any(run),
                            vec![producer("agent.message", None, json!({"w": w, "i": i}))],
                        )
                    });
                    for landed in futures::future::join_all(appends).await {
                        landed.expect("append beside the revocation");
                    }
                }
                APPENDS
            })
        })
        .collect();
    // The writers are going before the revocation starts.
    let busy = store
        .read_head(&running[1])
        .await
        .unwrap()
        .unwrap()
        .next_seq
        + 3;
    for _ in 0..1000 {
        if store
            .read_head(&running[1])
            .await
            .unwrap()
            .unwrap()
            .next_seq
            >= busy
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let started = std::time::Instant::now();
    let revoked = store.revoke_policy(&key, "web_fetch", "op", at + 1).await;
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.expect("writer");
    }
    let revoked = revoked
        .expect("the revocation stands while its runs are busy")
        .expect("the policy exists");
    assert!(
        took < crate::dynamo::CONTENTION_BUDGET,
        "revocation answered after {took:?}"
    );
    assert_eq!(revoked.revoked_by.as_deref(), Some("op"));
    assert_eq!(revoked.revoked_at, Some(at + 1));
    let stored = store.read_policy(&key, "web_fetch").await.unwrap().unwrap();
    assert!(!stored.is_live());
    assert_eq!(
        store
            .find_policy(std::slice::from_ref(&key), "web_fetch")
            .await
            .unwrap(),
        None
    );
    for run in &running {
        assert_eq!(
            count_of(&store, run, "tool.policy_revoked").await,
            1,
            "{run}: announced once"
        );
    }
    assert_eq!(count_of(&store, &ended, "tool.policy_revoked").await, 0);
    let announced = all_events(&store, &running[2]).await;
    let announcement = announced
        .iter()
        .find(|e| e["type"] == "tool.policy_revoked")
        .unwrap();
    assert_eq!(announcement["policyId"], json!(policy.id()));
    assert_eq!(announcement["revokedBy"], "op");
    // Again (a client retrying, or completing what a crashed first attempt missed).
    let again = store
        .revoke_policy(&key, "web_fetch", "op2", at + 2)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (again.revoked_by.as_deref(), again.revoked_at),
        (Some("op"), Some(at + 1)),
        "the first revocation stands"
    );
    for run in &running {
        assert_eq!(
            count_of(&store, run, "tool.policy_revoked").await,
            1,
            "{run}: still once"
        );
    }
    assert_eq!(
        all_events(&store, &ended).await.last().unwrap()["type"],
        "run_completed"
    );
}

/// GIVEN a live policy WHEN a gate it covers is auto-approved THEN its card is stored in
/// the same step, `approved` and never pending (decided by `policy:<policy_id>`, with the
/// event's sequence), so a retried arm — even after the policy was revoked — finds that
/// one outcome: no pending card, no second event. An arm racing the auto-approval of one
/// request also ends in one outcome.
pub async fn auto_approval_stores_an_approved_card(store: Store) {
    let run_id = new_run(&store, "auto-card").await;
    let key = format!("run:{run_id}");
    store
        .arm(RunRef::any(&run_id), card_for(&run_id, "grant", None))
        .await
        .unwrap();
    let at = tollgate_domain::now_millis();
    store
        .resolve(
            &run_id,
            "grant",
            approve("alice"),
            at,
            Some(tool_policy(&run_id, "grant", "web_fetch")),
        )
        .await
        .unwrap();
    let policy = store
        .read_policy(&key, "web_fetch")
        .await
        .unwrap()
        .expect("granted");
    let gate = card_for(&run_id, "covered-1", None);
    let sequence = store
        .auto_approve(RunRef::any(&run_id), &gate, &policy)
        .await
        .unwrap();
    let card = store
        .read_card(&run_id, "covered-1")
        .await
        .unwrap()
        .expect("the auto-approved gate has a card");
    assert_eq!(card.state, ApprovalState::Approved);
    assert_eq!(card.scope, Some(Scope::Tool));
    assert_eq!(
        card.decided_by,
        Some(format!("policy:{}", policy.id())),
        "decided by the policy"
    );
    assert!(card.decided_at.is_some_and(|t| t >= gate.created_at));
    assert_eq!(
        card.auto_approval,
        Some(tollgate_domain::approval::AutoApproval {
            policy_id: policy.id(),
            sequence
        })
    );
    assert_eq!(
        (card.request_id.as_str(), card.tool_name.as_str()),
        ("covered-1", "web_fetch")
    );
    let never_pending =
        |cards: Vec<ApprovalRequest>| cards.iter().all(|c| c.request_id != "covered-1");
    assert!(never_pending(store.pending_cards(&run_id).await.unwrap()));
    assert!(never_pending(
        store
            .open_cards(None, None, 1000)
            .await
            .unwrap()
            .into_iter()
            .filter(|c| c.run_id == run_id)
            .collect()
    ));
    // An arm racing the auto-approval of one request: one card, one event.
    let racer = card_for(&run_id, "covered-2", None);
    let (armed, auto) = tokio::join!(
        store.arm(RunRef::any(&run_id), racer.clone()),
        store.auto_approve(RunRef::any(&run_id), &racer, &policy)
    );
    let stored = store
        .read_card(&run_id, "covered-2")
        .await
        .unwrap()
        .unwrap();
    match (armed.unwrap(), auto) {
        (Armed::Created { card, .. }, Err(StoreError::Conflict(_))) => {
            assert_eq!(stored, card);
            assert_eq!(stored.state, ApprovalState::Pending);
        }
        (Armed::Existing(card), Ok(seq)) => {
            assert_eq!(stored, card);
            assert_eq!(stored.auto_approval.map(|a| a.sequence), Some(seq));
        }
        other => panic!("two outcomes for one request: {other:?}"),
    }
    let events = all_events(&store, &run_id).await;
    let about = |rid: &str| {
        events
            .iter()
            .filter(|e| e["requestId"] == json!(rid))
            .map(|e| e["type"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(about("covered-2").len(), 1, "{:?}", about("covered-2"));
    // Revoked; the agent retries the first gate: the same approved card, nothing new.
    store
        .revoke_policy(&key, "web_fetch", "op", at + 1)
        .await
        .unwrap()
        .unwrap();
    let retried = store
        .arm(RunRef::any(&run_id), card_for(&run_id, "covered-1", None))
        .await
        .unwrap();
    assert_eq!(retried, Armed::Existing(card.clone()));
    assert_eq!(
        store
            .auto_approve(RunRef::any(&run_id), &gate, &policy)
            .await,
        Ok(sequence),
        "a retried auto-approval answers the first"
    );
    assert_eq!(
        store.read_card(&run_id, "covered-1").await.unwrap(),
        Some(card)
    );
    let events = all_events(&store, &run_id).await;
    let about: Vec<&Value> = events
        .iter()
        .filter(|e| e["requestId"] == "covered-1")
        .collect();
    assert_eq!(about.len(), 1, "one event for the gate: {about:?}");
    assert_eq!(about[0]["type"], "tool.auto_approved");
    assert_eq!(about[0]["sequence"], json!(sequence));
    assert!(never_pending(store.pending_cards(&run_id).await.unwrap()));
}
