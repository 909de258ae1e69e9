//! The run log's contract: creation, gapless and deduplicated appends, terminal fencing,
//! replay pages and incarnations.

use super::*;

/// GIVEN a new run WHEN it is created THEN `run_started` is sequence 1 and a second
/// create with the same id finds the first without writing.
pub async fn create_is_idempotent_and_starts_at_one(store: Store) {
    let run_id = new_run(&store, "create").await;
    let again = store
        .create_run(NewRun {
            run_id: run_id.clone(),
            created_by: "someone-else".into(),
            ..NewRun::default()
        })
        .await
        .unwrap();
    let CreateOutcome::Existing(head) = again else {
        panic!("second create must find the run")
    };
    assert_eq!(head.created_by, "contract");
    assert_eq!(head.status, RunStatus::Running);
    let events = all_events(&store, &run_id).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "run_started");
    assert_eq!(events[0]["sequence"], 1);
    assert_eq!(events[0]["run_id"], json!(run_id));
    assert_eq!(events[0]["channel_id"], "C1");
    assert_eq!(events[0]["protocol_version"], "v2");
}

/// Batches append gaplessly, in order, with payloads stored verbatim.
pub async fn appends_are_gapless_and_verbatim(store: Store) {
    let run_id = new_run(&store, "gapless").await;
    let seqs = store
        .append_events(
            RunRef::any(&run_id),
            vec![
                producer("agent.message", None, json!({"text": "hi", "n": [1, 2]})),
                producer("tool.call", Some("e-1"), json!({"tool": "x"})),
            ],
        )
        .await
        .unwrap();
    assert_eq!(seqs, vec![2, 3]);
    let seqs = store
        .append_events(
            RunRef::any(&run_id),
            vec![producer("agent.message", None, json!({}))],
        )
        .await
        .unwrap();
    assert_eq!(seqs, vec![4]);
    let events = all_events(&store, &run_id).await;
    assert_eq!(sequences(&events), vec![1, 2, 3, 4]);
    assert_eq!(events[1]["text"], "hi");
    assert_eq!(events[1]["n"], json!([1, 2]));
    assert_eq!(events[2]["event_id"], "e-1");
    let head = store.read_head(&run_id).await.unwrap().unwrap();
    assert_eq!(head.next_seq, 5);
}

/// A full batch of 99 keyed events is one atomic append.
pub async fn full_batch_of_keyed_events_fits_one_append(store: Store) {
    let run_id = new_run(&store, "batch99").await;
    let batch: Vec<_> = (0..99)
        .map(|i| producer("agent.message", Some(&format!("k{i}")), json!({"i": i})))
        .collect();
    let seqs = store
        .append_events(RunRef::any(&run_id), batch.clone())
        .await
        .unwrap();
    assert_eq!(seqs, (2..=100).collect::<Vec<_>>());
    // The same batch again adds nothing and answers the same sequences.
    assert_eq!(
        store
            .append_events(RunRef::any(&run_id), batch)
            .await
            .unwrap(),
        seqs
    );
    assert_eq!(all_events(&store, &run_id).await.len(), 100);
    let too_many: Vec<_> = (0..100)
        .map(|_| producer("agent.message", None, json!({})))
        .collect();
    assert!(matches!(
        store.append_events(RunRef::any(&run_id), too_many).await,
        Err(StoreError::Invalid(_))
    ));
}

/// A retried `event_id` returns its original sequence, alone or mixed with new events.
pub async fn event_ids_deduplicate(store: Store) {
    let run_id = new_run(&store, "dedupe").await;
    let first = store
        .append_events(
            RunRef::any(&run_id),
            vec![producer("tool.call", Some("a"), json!({"v": 1}))],
        )
        .await
        .unwrap();
    assert_eq!(first, vec![2]);
    let retry = store
        .append_events(
            RunRef::any(&run_id),
            vec![producer("tool.call", Some("a"), json!({"v": 2}))],
        )
        .await
        .unwrap();
    assert_eq!(retry, vec![2], "retry answers the original sequence");
    let mixed = store
        .append_events(
            RunRef::any(&run_id),
            vec![
                producer("tool.call", Some("b"), json!({})),
                producer("tool.call", Some("a"), json!({})),
                producer("agent.message", None, json!({})),
            ],
        )
        .await
        .unwrap();
    assert_eq!(mixed, vec![3, 2, 4]);
    let events = all_events(&store, &run_id).await;
    assert_eq!(sequences(&events), vec![1, 2, 3, 4]);
    assert_eq!(events[1]["v"], 1, "the first write wins");
    let twice_in_one = store
        .append_events(
            RunRef::any(&run_id),
            vec![
                producer("tool.call", Some("z"), json!({})),
                producer("tool.call", Some("z"), json!({})),
            ],
        )
        .await;
    assert!(matches!(twice_in_one, Err(StoreError::Invalid(_))));
    assert_eq!(
        all_events(&store, &run_id).await.len(),
        4,
        "refused batch wrote nothing"
    );
}

/// Concurrent writers on one run: every sequence handed out once, no gap.
pub async fn concurrent_appends_are_gapless(store: Store, writers: usize, per_writer: usize) {
    concurrent_appends_across_stores(vec![store], writers, per_writer).await
}

/// The same, with writers spread round-robin over several store instances that share
/// one backend (several processes).
pub async fn concurrent_appends_across_stores(
    stores: Vec<Store>,
    writers: usize,
    per_writer: usize,
) {
    let store = stores[0].clone();
    let run_id = new_run(&store, "concurrent").await;
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let store = stores[w % stores.len()].clone();
            let run_id = run_id.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                for i in 0..per_writer {
                    let id = format!("w{w}-{i}");
                    // Every other append carries two events, so grouped requests of
                    // different sizes must be split back correctly.
                    let mut batch = vec![producer("agent.message", Some(&id), json!({}))];
                    if i % 2 == 1 {
                        batch.push(producer(
                            "agent.message",
                            Some(&format!("{id}-b")),
                            json!({}),
                        ));
                    }
                    // Keyed events: an append sent again lands once.
                    let s = until_served("append", || {
                        store.append_events(RunRef::any(&run_id), batch.clone())
                    })
                    .await
                    .expect("append under contention");
                    assert_eq!(s.len(), batch.len());
                    assert!(
                        s.windows(2).all(|p| p[1] == p[0] + 1),
                        "one request stays contiguous"
                    );
                    for (draft, seq) in batch.iter().zip(s) {
                        got.push((draft.event_id.clone().unwrap(), seq));
                    }
                }
                got
            })
        })
        .collect();
    let mut answered: Vec<(String, u64)> = Vec::new();
    for t in futures::future::join_all(tasks).await {
        answered.extend(t.expect("writer task"));
    }
    let total = answered.len() as u64;
    let mut all: Vec<u64> = answered.iter().map(|(_, s)| *s).collect();
    all.sort_unstable();
    assert_eq!(
        all,
        (2..=total + 1).collect::<Vec<_>>(),
        "distinct, gapless sequences"
    );
    let events = all_events(&store, &run_id).await;
    assert_eq!(sequences(&events), (1..=total + 1).collect::<Vec<_>>());
    for (id, seq) in &answered {
        assert_eq!(
            events[(*seq - 1) as usize]["event_id"],
            json!(id),
            "the event stored at an answered sequence is the caller's"
        );
    }
}

/// A retry racing its original (same `event_id`, concurrently, many times over) lands
/// once, and every caller gets that one sequence.
pub async fn racing_retries_land_once(store: Store) {
    let run_id = new_run(&store, "racing-retries").await;
    let tasks: Vec<_> = (0..24)
        .map(|i| {
            let store = store.clone();
            let run_id = run_id.clone();
            tokio::spawn(async move {
                let id = format!("same-{}", i % 3);
                store
                    .append_events(
                        RunRef::any(&run_id),
                        vec![producer("tool.call", Some(&id), json!({}))],
                    )
                    .await
                    .expect("append")
            })
        })
        .collect();
    let mut by_id: std::collections::HashMap<usize, std::collections::HashSet<Vec<u64>>> =
        std::collections::HashMap::new();
    for (i, t) in futures::future::join_all(tasks)
        .await
        .into_iter()
        .enumerate()
    {
        by_id.entry(i % 3).or_default().insert(t.expect("task"));
    }
    for answers in by_id.values() {
        assert_eq!(
            answers.len(),
            1,
            "every racer of one event_id got the same sequence"
        );
    }
    let events = all_events(&store, &run_id).await;
    assert_eq!(
        sequences(&events),
        vec![1, 2, 3, 4],
        "three ids, three events"
    );
}

/// After the terminal event nothing lands; repeating the same end answers its sequence.
pub async fn terminal_fencing(store: Store) {
    let run_id = new_run(&store, "terminal").await;
    store
        .append_events(
            RunRef::any(&run_id),
            vec![producer("tool.call", Some("id#before"), json!({}))],
        )
        .await
        .unwrap();
    let done = store
        .finish_run(RunRef::any(&run_id), TerminalKind::Complete, Map::new())
        .await
        .unwrap();
    assert_eq!(done.sequence, 3);
    assert!(!done.already_finished);
    let again = store
        .finish_run(RunRef::any(&run_id), TerminalKind::Complete, Map::new())
        .await
        .unwrap();
    assert_eq!(again.sequence, 3);
    assert!(again.already_finished);
    let other = store
        .finish_run(RunRef::any(&run_id), TerminalKind::Fail, Map::new())
        .await;
    assert_eq!(
        other,
        Err(StoreError::RunTerminal {
            status: RunStatus::Completed,
            terminal_seq: 3
        })
    );
    let late = store
        .append_events(
            RunRef::any(&run_id),
            vec![producer("agent.message", None, json!({}))],
        )
        .await;
    assert!(matches!(
        late,
        Err(StoreError::RunTerminal {
            terminal_seq: 3,
            ..
        })
    ));
    // A retry of an event that landed before the end still gets its answer.
    let retry = store
        .append_events(
            RunRef::any(&run_id),
            vec![producer("tool.call", Some("id#before"), json!({}))],
        )
        .await
        .unwrap();
    assert_eq!(retry, vec![2]);
    let events = all_events(&store, &run_id).await;
    assert_eq!(sequences(&events), vec![1, 2, 3]);
    assert_eq!(events[2]["type"], "run_completed");
    let head = store.read_head(&run_id).await.unwrap().unwrap();
    assert_eq!(head.status, RunStatus::Completed);
    assert_eq!(head.terminal_seq, Some(3));
}

/// Appends racing a terminal transition never land after the terminal event.
pub async fn appends_racing_terminal_never_follow_it(store: Store) {
    let run_id = new_run(&store, "race").await;
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let store = store.clone();
            let run_id = run_id.clone();
            tokio::spawn(async move {
                let mut landed = Vec::new();
                for i in 0..20_000 {
                    let id = format!("{w}-{i}");
                    let r = store
                        .append_events(
                            RunRef::any(&run_id),
                            vec![producer("agent.message", Some(&id), json!({}))],
                        )
                        .await;
                    match r {
                        Ok(seqs) => landed.push((id, seqs[0])),
                        Err(StoreError::RunTerminal { .. }) => return (landed, true),
                        Err(e) => panic!("unexpected {e}"),
                    }
                }
                (landed, false)
            })
        })
        .collect();
    // End the run while the writers are mid-stream.
    loop {
        let head = store.read_head(&run_id).await.unwrap().unwrap();
        if head.next_seq > 20 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let done = store
        .finish_run(RunRef::any(&run_id), TerminalKind::Cancel, Map::new())
        .await
        .unwrap();
    let mut landed = Vec::new();
    let mut refused = 0;
    for w in writers {
        let (l, was_refused) = w.await.unwrap();
        landed.extend(l);
        refused += usize::from(was_refused);
    }
    assert!(refused > 0, "the end raced live writers");
    let events = all_events(&store, &run_id).await;
    let last = events.last().unwrap();
    assert_eq!(last["type"], "run_cancelled");
    assert_eq!(last["sequence"], json!(done.sequence));
    assert_eq!(sequences(&events), (1..=done.sequence).collect::<Vec<_>>());
    assert_eq!(
        landed.len() as u64,
        done.sequence - 2,
        "every event before the end was answered"
    );
    for (id, seq) in landed {
        assert!(
            seq < done.sequence,
            "an answered append precedes the terminal event"
        );
        assert_eq!(events[(seq - 1) as usize]["event_id"], json!(id));
    }
}

/// Big events: a page stops at [`crate::MAX_PAGE_BYTES`] whatever the limit, and paging
/// still covers the stream (on DynamoDB this also crosses its 1 MB query pages).
pub async fn pages_stop_at_the_byte_cap(store: Store) {
    let run_id = new_run(&store, "big").await;
    let blob = "x".repeat(60 * 1024);
    for _ in 0..24 {
        let batch = (0..3)
            .map(|_| producer("tool.result", None, json!({ "output": blob })))
            .collect();
        store
            .append_events(RunRef::any(&run_id), batch)
            .await
            .unwrap();
    }
    let first = store.read_events(&run_id, 0, 1000).await.unwrap();
    let bytes: usize = first.events.iter().map(|e| e.body.len()).sum();
    assert!(first.has_more, "72 × 60 KiB does not fit one page");
    assert!(bytes <= crate::MAX_PAGE_BYTES, "page of {bytes} bytes");
    assert!(first.events.len() > 40, "the page is filled up to the cap");
    let events = all_events(&store, &run_id).await;
    assert_eq!(sequences(&events), (1..=73).collect::<Vec<_>>());
}

/// Pages cover the stream exactly; `after` past the end is empty; unknown runs are NotFound.
pub async fn replay_pages(store: Store) {
    let run_id = new_run(&store, "pages").await;
    for chunk in 0..5 {
        let batch = (0..50)
            .map(|i| producer("agent.message", None, json!({"i": chunk * 50 + i})))
            .collect();
        store
            .append_events(RunRef::any(&run_id), batch)
            .await
            .unwrap();
    }
    let page = store.read_events(&run_id, 10, 7).await.unwrap();
    assert_eq!(
        page.events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        (11..=17).collect::<Vec<_>>()
    );
    assert!(page.has_more);
    let tail = store.read_events(&run_id, 245, 100).await.unwrap();
    assert_eq!(
        tail.events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        (246..=251).collect::<Vec<_>>()
    );
    assert!(!tail.has_more);
    let exact = store.read_events(&run_id, 241, 10).await.unwrap();
    assert_eq!(exact.events.len(), 10);
    assert!(
        !exact.has_more,
        "a page ending at the last event has no more"
    );
    let past = store.read_events(&run_id, 10_000, 10).await.unwrap();
    assert!(past.events.is_empty() && !past.has_more);
    let mut seen = Vec::new();
    let mut after = 0;
    loop {
        let p = store.read_events(&run_id, after, 33).await.unwrap();
        seen.extend(p.events.iter().map(|e| e.sequence));
        if !p.has_more {
            break;
        }
        after = p.events.last().unwrap().sequence;
    }
    assert_eq!(seen, (1..=251).collect::<Vec<_>>());
    let missing = fresh_id("missing");
    assert_eq!(
        store.read_events(&missing, 0, 10).await,
        Err(StoreError::NotFound)
    );
    assert_eq!(store.read_head(&missing).await, Ok(None));
    assert_eq!(
        store
            .append_events(
                RunRef::any(&missing),
                vec![producer("agent.message", None, json!({}))]
            )
            .await,
        Err(StoreError::NotFound)
    );
    assert_eq!(
        store
            .finish_run(RunRef::any(&missing), TerminalKind::Complete, Map::new())
            .await,
        Err(StoreError::NotFound)
    );
}

/// GIVEN a run WHEN a write names another incarnation of its id THEN it is NotFound and
/// nothing is written; the run's own incarnation writes and ends it.
pub async fn writes_name_one_incarnation(store: Store) {
    let run_id = new_run(&store, "incarnation").await;
    let head = store.read_head(&run_id).await.unwrap().unwrap();
    assert_eq!(head.incarnation.len(), 16);
    let stale = RunRef::exact(&run_id, "00000000deadbeef");
    assert_eq!(
        store
            .append_events(stale, vec![producer("agent.message", None, json!({}))])
            .await,
        Err(StoreError::NotFound)
    );
    assert_eq!(
        store
            .finish_run(stale, TerminalKind::Complete, Map::new())
            .await,
        Err(StoreError::NotFound)
    );
    let own = RunRef::exact(&run_id, &head.incarnation);
    let seqs = store
        .append_events(own, vec![producer("agent.message", None, json!({}))])
        .await
        .unwrap();
    assert_eq!(seqs, vec![2]);
    let done = store
        .finish_run(own, TerminalKind::Complete, Map::new())
        .await
        .unwrap();
    assert_eq!(done.sequence, 3);
    assert_eq!(sequences(&all_events(&store, &run_id).await), vec![1, 2, 3]);
}

/// Pages served through [`crate::read_page`] are gapless, end with `terminal` exactly
/// when they hold the terminal event, and carry each event's type.
pub async fn served_pages_end_at_the_terminal_event(store: Store) {
    let run_id = new_run(&store, "served").await;
    for _ in 0..3 {
        store
            .append_events(
                RunRef::any(&run_id),
                vec![producer("agent.message", None, json!({}))],
            )
            .await
            .unwrap();
    }
    let head = store.read_head(&run_id).await.unwrap().unwrap();
    let page = crate::read_page(store.as_ref(), &head, 0, 2).await.unwrap();
    assert_eq!(page.events.len(), 2);
    assert_eq!(page.events[0].event_type, "run_started");
    assert!(page.has_more && !page.terminal);
    store
        .finish_run(RunRef::any(&run_id), TerminalKind::Fail, Map::new())
        .await
        .unwrap();
    let head = store.read_head(&run_id).await.unwrap().unwrap();
    let rest = crate::read_page(store.as_ref(), &head, page.next_after, 100)
        .await
        .unwrap();
    assert_eq!(
        rest.events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        vec![3, 4, 5]
    );
    assert_eq!(rest.events[2].event_type, "run_failed");
    assert!(rest.terminal && !rest.has_more);
    let past = crate::read_page(store.as_ref(), &head, 5, 100)
        .await
        .unwrap();
    assert!(past.events.is_empty() && past.terminal && !past.has_more);
}

/// Two store instances on one backend (two processes), each remembering the head it
/// last wrote: what one instance remembers never lets it write past the other's events.
/// A head that moved elsewhere loses its condition and the append lands right after the
/// other's events; a retried `event_id` after another instance's appends answers its
/// first sequence and writes nothing twice; once the run ended on the other instance,
/// nothing lands after the terminal event, and a retry of an earlier event still gets its
/// answer.
pub async fn remembered_heads_follow_other_instances(a: Store, b: Store) {
    let run_id = new_run(&a, "remembered").await;
    let run = RunRef::any(&run_id);
    let one = |id: &str| vec![producer("agent.message", Some(id), json!({}))];
    assert_eq!(a.append_events(run, one("a-1")).await.unwrap(), vec![2]);
    assert_eq!(b.append_events(run, one("b-1")).await.unwrap(), vec![3]);
    assert_eq!(b.append_events(run, one("b-2")).await.unwrap(), vec![4]);
    // `a` last wrote sequence 2: its next append still lands after `b`'s.
    assert_eq!(a.append_events(run, one("a-2")).await.unwrap(), vec![5]);
    // A retry of `a-2` through `b` (whose head is behind) and of `b-2` through `a`.
    assert_eq!(b.append_events(run, one("a-2")).await.unwrap(), vec![5]);
    assert_eq!(a.append_events(run, one("b-2")).await.unwrap(), vec![4]);
    // A retry mixed with a new event: the new one takes the next sequence.
    assert_eq!(
        b.append_events(
            run,
            vec![
                producer("agent.message", Some("a-1"), json!({})),
                producer("agent.message", Some("b-3"), json!({})),
            ]
        )
        .await
        .unwrap(),
        vec![2, 6]
    );
    // `a` remembers a running head at 6; the run ends through `b`.
    let done = b
        .finish_run(run, TerminalKind::Complete, Map::new())
        .await
        .unwrap();
    assert_eq!(done.sequence, 7);
    let late = a
        .append_events(run, vec![producer("agent.message", None, json!({}))])
        .await;
    assert_eq!(
        late,
        Err(StoreError::RunTerminal {
            status: RunStatus::Completed,
            terminal_seq: 7
        }),
        "a remembered running head lets nothing through after the end"
    );
    let late_keyed = a.append_events(run, one("a-late")).await;
    assert!(
        matches!(late_keyed, Err(StoreError::RunTerminal { .. })),
        "{late_keyed:?}"
    );
    assert_eq!(a.append_events(run, one("b-3")).await.unwrap(), vec![6]);
    let events = all_events(&a, &run_id).await;
    assert_eq!(sequences(&events), (1..=7).collect::<Vec<_>>());
    let ids: Vec<&str> = events[1..6]
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["a-1", "b-1", "b-2", "a-2", "b-3"], "each id once");
    assert_eq!(events[6]["type"], "run_completed");
}

/// Every run of one tenant's listing, paged with `limit` from the start to the end.
async fn all_listed(
    store: &Store,
    project_id: Option<&str>,
    filter: &crate::RunFilter,
    limit: usize,
) -> Vec<crate::RunSummary> {
    let mut all = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store
            .list_runs(project_id, filter, cursor.as_deref(), limit)
            .await
            .unwrap();
        assert!(page.runs.len() <= limit);
        all.extend(page.runs);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return all,
        }
    }
}

/// GIVEN seven runs of a project (two ended) and two of another WHEN the project's runs
/// are listed three at a time THEN pages of 3, 3 and 1, newest first, each run once and
/// none of the other project's; the status, owner and run-id-prefix filters narrow the
/// listing and page through what they match exactly once; a run without a project is in
/// no project's listing and a project's run in no listing but its own; a cursor of another
/// project, or one the store never handed out, is `InvalidCursor`.
pub async fn runs_are_listed_per_tenant_newest_first(store: Store) {
    let project = fresh_id("proj");
    let other = fresh_id("proj");
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let mut ids = Vec::new();
    for i in 0..7 {
        let run_id = format!("list-{tag}-{i}");
        store
            .create_run(NewRun {
                run_id: run_id.clone(),
                created_by: "contract".into(),
                owner: Some(if i % 2 == 0 { "alice" } else { "bob" }.into()),
                project_id: Some(project.clone()),
                channel_id: Some("C1".into()),
                ..NewRun::default()
            })
            .await
            .unwrap();
        ids.push(run_id);
        // Distinct creation times, so "newest first" is one order on every store.
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
    for (i, p) in [(0, &other), (1, &other)] {
        store
            .create_run(NewRun {
                run_id: format!("list-{tag}-other-{i}"),
                created_by: "contract".into(),
                owner: Some("alice".into()),
                project_id: Some(p.clone()),
                ..NewRun::default()
            })
            .await
            .unwrap();
    }
    let no_project = format!("list-{tag}-none");
    store
        .create_run(NewRun {
            run_id: no_project.clone(),
            created_by: "contract".into(),
            ..NewRun::default()
        })
        .await
        .unwrap();
    let completed = store
        .finish_run(RunRef::any(&ids[1]), TerminalKind::Complete, Map::new())
        .await
        .unwrap();
    assert!(!completed.already_finished);
    store
        .finish_run(RunRef::any(&ids[3]), TerminalKind::Fail, Map::new())
        .await
        .unwrap();

    let none = crate::RunFilter::default();
    let run_ids =
        |runs: &[crate::RunSummary]| runs.iter().map(|r| r.run_id.clone()).collect::<Vec<_>>();
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    let first = store
        .list_runs(Some(&project), &none, None, 3)
        .await
        .unwrap();
    let second_cursor = first
        .next_cursor
        .clone()
        .expect("more after the first page");
    let second = store
        .list_runs(Some(&project), &none, Some(&second_cursor), 3)
        .await
        .unwrap();
    let third = store
        .list_runs(Some(&project), &none, second.next_cursor.as_deref(), 3)
        .await
        .unwrap();
    assert_eq!(run_ids(&first.runs), newest_first[0..3]);
    assert_eq!(run_ids(&second.runs), newest_first[3..6]);
    assert_eq!(run_ids(&third.runs), newest_first[6..7]);
    if third.next_cursor.is_some() {
        // A store may only learn at the next read that nothing follows.
        let rest = store
            .list_runs(Some(&project), &none, third.next_cursor.as_deref(), 3)
            .await
            .unwrap();
        assert!(rest.runs.is_empty() && rest.next_cursor.is_none());
    }
    let all = all_listed(&store, Some(&project), &none, 100).await;
    assert_eq!(run_ids(&all), newest_first, "only the project's runs");
    let first_listed = &all[6];
    assert_eq!(first_listed.owner.as_deref(), Some("alice"));
    assert_eq!(first_listed.channel_id.as_deref(), Some("C1"));
    assert_eq!(first_listed.project_id.as_deref(), Some(project.as_str()));
    assert_eq!(first_listed.kind, tollgate_domain::RunKind::Single);
    assert_eq!(first_listed.status, RunStatus::Running);
    assert_eq!(first_listed.ended_at, None);
    let ended = all.iter().find(|r| r.run_id == ids[1]).unwrap();
    assert_eq!(ended.status, RunStatus::Completed);
    let ended_at = ended.ended_at.expect("an ended run has ended_at");
    assert!(ended_at >= ended.created_at);

    // Filters narrow, and page through their matches once.
    let by_status = |status| crate::RunFilter {
        status: Some(status),
        ..Default::default()
    };
    assert_eq!(
        run_ids(&all_listed(&store, Some(&project), &by_status(RunStatus::Completed), 2).await),
        [ids[1].clone()]
    );
    assert_eq!(
        run_ids(&all_listed(&store, Some(&project), &by_status(RunStatus::Failed), 2).await),
        [ids[3].clone()]
    );
    assert_eq!(
        all_listed(&store, Some(&project), &by_status(RunStatus::Running), 2)
            .await
            .len(),
        5
    );
    let alice = crate::RunFilter {
        owner: Some("alice".into()),
        ..Default::default()
    };
    assert_eq!(
        run_ids(&all_listed(&store, Some(&project), &alice, 2).await),
        [&ids[6], &ids[4], &ids[2], &ids[0]].map(String::clone)
    );
    let prefix = |p: &str| crate::RunFilter {
        run_id_prefix: Some(p.into()),
        ..Default::default()
    };
    assert_eq!(
        run_ids(&all_listed(&store, Some(&project), &prefix(&ids[4]), 2).await),
        [ids[4].clone()]
    );
    assert_eq!(
        all_listed(&store, Some(&project), &prefix(&format!("list-{tag}")), 2)
            .await
            .len(),
        7
    );
    let alice_running = crate::RunFilter {
        status: Some(RunStatus::Running),
        owner: Some("alice".into()),
        run_id_prefix: Some(format!("list-{tag}")),
    };
    assert_eq!(
        all_listed(&store, Some(&project), &alice_running, 1)
            .await
            .len(),
        4
    );

    // Tenants never mix.
    let mut theirs = run_ids(&all_listed(&store, Some(&other), &none, 100).await);
    theirs.sort();
    assert_eq!(
        theirs,
        [format!("list-{tag}-other-0"), format!("list-{tag}-other-1")]
    );
    let unowned = all_listed(&store, None, &prefix(&format!("list-{tag}")), 1000).await;
    assert_eq!(run_ids(&unowned), [no_project]);
    assert_eq!(unowned[0].project_id, None);

    // Cursors are checked.
    for bad in ["zz", "7b7d", "", "0"] {
        assert_eq!(
            store.list_runs(Some(&project), &none, Some(bad), 3).await,
            Err(StoreError::InvalidCursor),
            "{bad:?}"
        );
    }
    assert_eq!(
        store
            .list_runs(Some(&other), &none, Some(&second_cursor), 3)
            .await,
        Err(StoreError::InvalidCursor)
    );
    assert_eq!(
        store.list_runs(None, &none, Some(&second_cursor), 3).await,
        Err(StoreError::InvalidCursor)
    );
}
