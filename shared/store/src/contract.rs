//! The store contract: one suite, run unchanged against every adapter
//! (`contract_suite!` instantiates it for a store factory). Each case uses fresh run ids,
//! so adapters can share tables between cases and test runs.

use std::sync::Arc;

use serde_json::{json, Map, Value};
use tollgate_domain::{
    ApprovalRequest, ApprovalState, EventDraft, NewRun, Resolution, RunStatus, Scope, TerminalKind,
};

use crate::{Armed, Beat, CreateOutcome, Forwarded, Resolved, RunRef, StoreError};

pub type Store = Arc<dyn crate::Store>;

fn fresh_id(tag: &str) -> String {
    format!("contract-{tag}-{}", uuid::Uuid::new_v4().simple())
}

fn producer(event_type: &str, event_id: Option<&str>, payload: Value) -> EventDraft {
    let Value::Object(payload) = payload else {
        panic!("payload must be an object")
    };
    EventDraft {
        event_type: event_type.into(),
        event_id: event_id.map(Into::into),
        payload,
    }
}

async fn new_run(store: &Store, tag: &str) -> String {
    let run_id = fresh_id(tag);
    let outcome = store
        .create_run(NewRun {
            run_id: run_id.clone(),
            created_by: "contract".into(),
            channel_id: Some("C1".into()),
            ..NewRun::default()
        })
        .await
        .expect("create_run");
    assert!(matches!(outcome, CreateOutcome::Created(_)));
    run_id
}

async fn all_events(store: &Store, run_id: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = store
            .read_events(run_id, after, 1000)
            .await
            .expect("read_events");
        for e in &page.events {
            let v: Value = serde_json::from_str(&e.body).expect("stored body is JSON");
            assert_eq!(v["sequence"], json!(e.sequence), "body and key agree");
            out.push(v);
        }
        if !page.has_more {
            return out;
        }
        after = page
            .events
            .last()
            .map(|e| e.sequence)
            .expect("has_more with no events");
    }
}

fn sequences(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .map(|e| e["sequence"].as_u64().unwrap())
        .collect()
}

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
                    let s = store
                        .append_events(RunRef::any(&run_id), batch.clone())
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

// ---- approval cards ----------------------------------------------------------------

fn card_for(run_id: &str, request_id: &str, coordinator: Option<&str>) -> ApprovalRequest {
    let now = tollgate_domain::now_millis();
    ApprovalRequest {
        run_id: run_id.into(),
        request_id: request_id.into(),
        tool_name: "web_fetch".into(),
        tool_call_id: request_id.into(),
        approval_id: request_id.into(),
        explicit_ids: false,
        url: Some("https://example.com/a".into()),
        intention: Some("read the docs".into()),
        message: Some("The agent wants to fetch a URL.".into()),
        arguments_hash: Some("sha256:abc".into()),
        state: ApprovalState::Pending,
        scope: None,
        decided_by: None,
        decided_at: None,
        created_at: now,
        expires_at: now + 300_000,
        coordinator_run_id: coordinator.map(str::to_owned),
        subtask_id: Some(json!(3)),
        project_id: None,
        end_reason: None,
        auto_approval: None,
        held_by_pod: false,
    }
}

async fn child_of(store: &Store, coordinator: &str, tag: &str) -> String {
    let run_id = fresh_id(tag);
    store
        .create_run(NewRun {
            run_id: run_id.clone(),
            kind: tollgate_domain::RunKind::Child,
            parent_run_id: Some(coordinator.into()),
            subtask_id: Some(json!(3)),
            created_by: "contract".into(),
            ..NewRun::default()
        })
        .await
        .expect("create child");
    run_id
}

fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

fn approve(by: &str) -> Resolution {
    Resolution::Approved {
        scope: Scope::Once,
        by: by.into(),
    }
}

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
    // An unknown card is NotFound.
    assert_eq!(
        store
            .resolve(&run_id, "nope", Resolution::Expired, 0, None)
            .await,
        Err(StoreError::NotFound)
    );
    // Ended run: decisions refused, expiry silent.
    store
        .arm(RunRef::any(&run_id), card_for(&run_id, "open-1", None))
        .await
        .unwrap();
    store
        .finish_run(RunRef::any(&run_id), TerminalKind::Complete, Map::new())
        .await
        .unwrap();
    let now = tollgate_domain::now_millis();
    // A decision on a card of an ended run never approves it: the card ends as
    // `run_ended` (the embedded store ended it with the run already; DynamoDB ends it
    // here, or in the gate's follow-up step after the terminal transaction).
    let (Resolved::Fresh(c) | Resolved::Already(c)) = store
        .resolve(&run_id, "open-1", approve("bob"), now, None)
        .await
        .unwrap();
    assert_eq!(c.state, ApprovalState::Expired);
    assert_eq!(c.end_reason.as_deref(), Some("run_ended"));
    assert_eq!(c.decided_by, None, "nobody decided it");
    assert!(matches!(
        store.resolve(&run_id, "open-1", Resolution::Expired, now, None).await.unwrap(),
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

fn tool_policy(run_id: &str, request_id: &str, tool: &str) -> tollgate_domain::Policy {
    tollgate_domain::Policy {
        scope: Scope::Tool,
        scope_key: format!("run:{run_id}"),
        tool_name: tool.into(),
        owner: Some("alice".into()),
        project_id: None,
        origin_run_id: run_id.into(),
        request_id: request_id.into(),
        granted_by: "alice".into(),
        granted_at: tollgate_domain::now_millis(),
        revoked_by: None,
        revoked_at: None,
        reached_runs: vec![run_id.into()],
    }
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
            Resolution::Denied { by: "bob".into() },
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

// ---- revocation under load, the stall listing, auto-approved cards ----------------

async fn count_of(store: &Store, run_id: &str, event_type: &str) -> usize {
    all_events(store, run_id)
        .await
        .iter()
        .filter(|e| e["type"] == event_type)
        .count()
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

/// GIVEN a live policy WHEN a gate it covers is auto-approved THEN its card is stored in
/// the same step, `approved` and never pending (decided by `policy:<policy_id>`, with the
/// event's sequence), so a retried arm — even after the policy was revoked — finds that
/// one outcome: no pending card, no second event. An arm racing the auto-approval of one
/// request also ends in one outcome.
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
                    store
                        .arm(RunRef::any(&run_id), card_for(&run_id, &rid, None))
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

/// True when an AWS endpoint (an emulator or real AWS) is configured for the tests.
pub fn aws_endpoint_configured() -> bool {
    [
        "AWS_ENDPOINT_URL_DYNAMODB",
        "AWS_ENDPOINT_URL",
        "TOLLGATE_TEST_REAL_AWS",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

/// The DynamoDB store the AWS-backed tests share (tables `TOLLGATE_TEST_TABLE_PREFIX`,
/// default `tollgate-test-`, created from the template when missing).
pub async fn dynamo_test_store() -> crate::dynamo::DynamoStore {
    assert!(
        aws_endpoint_configured(),
        "no DynamoDB endpoint: run `make test` (it starts DynamoDB Local) or set AWS_ENDPOINT_URL"
    );
    let config = crate::dynamo::sdk_config().await;
    let client = crate::dynamo::client(&config);
    let prefix =
        std::env::var("TOLLGATE_TEST_TABLE_PREFIX").unwrap_or_else(|_| "tollgate-test-".into());
    let tables = crate::dynamo::Tables::with_prefix(&prefix);
    crate::schema::ensure_tables(&client, &tables)
        .await
        .expect("create test tables from the template");
    crate::dynamo::DynamoStore::new(client, tables)
}

/// Instantiates the whole suite for one adapter: `contract_suite!(async { store })`.
#[macro_export]
macro_rules! contract_suite {
    ($factory:expr) => {
        async fn __store() -> $crate::contract::Store {
            $factory.await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn create_is_idempotent_and_starts_at_one() {
            $crate::contract::create_is_idempotent_and_starts_at_one(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn appends_are_gapless_and_verbatim() {
            $crate::contract::appends_are_gapless_and_verbatim(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn full_batch_of_keyed_events_fits_one_append() {
            $crate::contract::full_batch_of_keyed_events_fits_one_append(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn event_ids_deduplicate() {
            $crate::contract::event_ids_deduplicate(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_appends_are_gapless() {
            $crate::contract::concurrent_appends_are_gapless(__store().await, 8, 25).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn racing_retries_land_once() {
            $crate::contract::racing_retries_land_once(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn terminal_fencing() {
            $crate::contract::terminal_fencing(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn appends_racing_terminal_never_follow_it() {
            $crate::contract::appends_racing_terminal_never_follow_it(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn pages_stop_at_the_byte_cap() {
            $crate::contract::pages_stop_at_the_byte_cap(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn writes_name_one_incarnation() {
            $crate::contract::writes_name_one_incarnation(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn served_pages_end_at_the_terminal_event() {
            $crate::contract::served_pages_end_at_the_terminal_event(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn arming_writes_one_card_and_one_event() {
            $crate::contract::arming_writes_one_card_and_one_event(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn coordinators_mirror_their_children() {
            $crate::contract::coordinators_mirror_their_children(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn one_resolution_wins() {
            $crate::contract::one_resolution_wins(vec![__store().await]).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn deadlines_and_ended_runs() {
            $crate::contract::deadlines_and_ended_runs(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn heartbeats_never_follow_the_resolution() {
            $crate::contract::heartbeats_never_follow_the_resolution(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn policies_come_only_from_winning_approvals() {
            $crate::contract::policies_come_only_from_winning_approvals(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn forwarded_decisions_are_recorded_once() {
            $crate::contract::forwarded_decisions_are_recorded_once(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_silent_child_is_failed_once() {
            $crate::contract::a_silent_child_is_failed_once(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_silence_is_reported_once() {
            $crate::contract::a_silence_is_reported_once(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn expiry_races_clicks_at_the_deadline() {
            $crate::contract::expiry_races_clicks_at_the_deadline(vec![__store().await], 200).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn replay_pages() {
            $crate::contract::replay_pages(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn revocation_stands_while_its_runs_are_busy() {
            $crate::contract::revocation_stands_while_its_runs_are_busy(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn reported_and_orphaned_children_leave_the_stall_listing() {
            $crate::contract::reported_and_orphaned_children_leave_the_stall_listing(
                __store().await,
            )
            .await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn auto_approval_stores_an_approved_card() {
            $crate::contract::auto_approval_stores_an_approved_card(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_run_holds_a_bounded_number_of_pending_cards() {
            $crate::contract::a_run_holds_a_bounded_number_of_pending_cards(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn start_admits_once() {
            $crate::contract::start_admits_once(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_starts_respect_the_call_ceiling() {
            $crate::contract::concurrent_starts_respect_the_call_ceiling(vec![__store().await])
                .await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn confirmed_settlement_completes() {
            $crate::contract::confirmed_settlement_completes(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn deadlines_settle_and_late_evidence_is_kept() {
            $crate::contract::deadlines_settle_and_late_evidence_is_kept(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_dispatch_never_lands_after_the_run_ended() {
            $crate::contract::a_dispatch_never_lands_after_the_run_ended(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn execution_heartbeats_stop_at_settlement() {
            $crate::contract::execution_heartbeats_stop_at_settlement(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn policies_page_with_a_cursor() {
            $crate::contract::policies_page_with_a_cursor(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn retention_never_frees_a_block() {
            $crate::contract::retention_never_frees_a_block(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn nothing_follows_the_end_of_a_run() {
            $crate::contract::nothing_follows_the_end_of_a_run(__store().await).await
        }
    };
}

// ---- approved execution: durable mutation records (seed 000) -----------------------

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
    assert_eq!(first.decision.answer().body["sequence"], json!(seq));
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
    assert_eq!(fenced.decision.answer().body["state"], "not_executed");

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
