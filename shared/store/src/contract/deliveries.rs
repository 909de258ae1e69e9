//! Notification delivery records (docs/architecture.md §10): created once, written only
//! on the version read, listed as due while pending and as dead letters per project.

use crate::{Delivery, DeliveryKey, DeliveryState};

use super::{fresh_id, Store};

fn key(project: &str, run_id: &str, kind: &str) -> DeliveryKey {
    DeliveryKey {
        sink: "webhook".into(),
        project: project.into(),
        run_id: run_id.into(),
        request_id: "req-1".into(),
        kind: kind.into(),
    }
}

/// Racing creations of one record: exactly one lands; a write on a stale version is
/// refused and changes nothing.
pub async fn a_delivery_is_claimed_once(store: Store) {
    let run_id = fresh_id("dlv");
    let now = tollgate_domain::now_millis();
    let mut record = Delivery::new(key("p-claim", &run_id, "armed"), 3, now);
    record.version = 1;
    record.leased_until = now + 60_000;
    let mut racers = Vec::new();
    for _ in 0..8 {
        let (store, record) = (store.clone(), record.clone());
        racers.push(tokio::spawn(
            async move { store.put_delivery(&record, 0).await },
        ));
    }
    let mut won = 0;
    for r in racers {
        if r.await.expect("join").expect("put_delivery") {
            won += 1;
        }
    }
    assert_eq!(won, 1, "one creation wins");
    let stored = store
        .read_delivery(&record.delivery_id)
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(stored, record);

    let mut sent = stored.clone();
    sent.state = DeliveryState::Sent;
    sent.attempts = 1;
    sent.memo = Some("memo-1".into());
    sent.version = 2;
    assert!(store.put_delivery(&sent, 1).await.expect("put"));
    let mut stale = stored.clone();
    stale.version = 2;
    stale.last_error = Some("late".into());
    assert!(
        !store.put_delivery(&stale, 1).await.expect("put"),
        "a write on a version read before another write is refused"
    );
    assert_eq!(
        store
            .read_delivery(&record.delivery_id)
            .await
            .expect("read"),
        Some(sent)
    );
    assert_eq!(
        store.read_delivery("dlv_nothing").await.expect("read"),
        None
    );
}

/// Pending records are due at their `next_attempt_at`; sent and dead ones never.
/// Dead letters are listed per project, newest first, and no other project's.
pub async fn due_deliveries_and_dead_letters(store: Store) {
    let run_id = fresh_id("dlv");
    let project = fresh_id("proj");
    let other = fresh_id("proj");
    let now = tollgate_domain::now_millis();
    let mut later = Delivery::new(key(&project, &run_id, "armed"), 2, now);
    later.next_attempt_at = now + 3_600_000;
    later.version = 1;
    let mut due = Delivery::new(key(&project, &run_id, "resolved"), 5, now);
    due.next_attempt_at = now - 1000;
    due.version = 1;
    let mut dead = Delivery::new(key(&project, &fresh_id("dlv"), "armed"), 2, now);
    dead.state = DeliveryState::Dead;
    dead.attempts = 6;
    dead.last_error = Some("receiver answered 500".into());
    dead.version = 1;
    let mut dead_newer = Delivery::new(key(&project, &fresh_id("dlv"), "resolved"), 4, now);
    dead_newer.state = DeliveryState::Dead;
    dead_newer.updated_at = now + 10;
    dead_newer.version = 1;
    let mut elsewhere = Delivery::new(key(&other, &fresh_id("dlv"), "armed"), 2, now);
    elsewhere.state = DeliveryState::Dead;
    elsewhere.version = 1;
    for d in [&later, &due, &dead, &dead_newer, &elsewhere] {
        assert!(store.put_delivery(d, 0).await.expect("put"));
    }
    let listed = store.due_deliveries(now, 1000).await.expect("due");
    let ids: Vec<&str> = listed.iter().map(|d| d.delivery_id.as_str()).collect();
    assert!(ids.contains(&due.delivery_id.as_str()), "{ids:?}");
    assert!(!ids.contains(&later.delivery_id.as_str()));
    assert!(!ids.contains(&dead.delivery_id.as_str()));
    let listed = store
        .due_deliveries(now + 3_600_000, 1000)
        .await
        .expect("due");
    assert!(listed.iter().any(|d| d.delivery_id == later.delivery_id));

    // Once sent, never due again.
    let mut sent = due.clone();
    sent.state = DeliveryState::Sent;
    sent.version = 2;
    assert!(store.put_delivery(&sent, 1).await.expect("put"));
    let listed = store.due_deliveries(now, 1000).await.expect("due");
    assert!(!listed.iter().any(|d| d.delivery_id == due.delivery_id));

    let letters = store
        .dead_letters(&project, 100)
        .await
        .expect("dead letters");
    let ids: Vec<&str> = letters.iter().map(|d| d.delivery_id.as_str()).collect();
    assert_eq!(
        ids,
        vec![dead_newer.delivery_id.as_str(), dead.delivery_id.as_str()]
    );
    assert_eq!(letters[1], dead);
    let theirs = store.dead_letters(&other, 100).await.expect("dead letters");
    assert_eq!(theirs, vec![elsewhere.clone()]);
    assert_ne!(
        key(&project, &run_id, "armed").delivery_id(),
        key(&other, &run_id, "armed").delivery_id(),
        "the same card event in two projects is two deliveries"
    );
}

/// One project with many due deliveries, all earlier than another's few: a retry pass's
/// worth (`limit`) still takes the other's, and the flooding one no more than the rest.
pub async fn due_deliveries_are_shared_between_projects(store: Store) {
    let flooding = fresh_id("proj");
    let other = fresh_id("proj");
    let now = tollgate_domain::now_millis();
    // At the epoch's start: earlier than anything another test leaves due.
    let long_ago = 1;
    let mut made = Vec::new();
    for i in 0..60 {
        let mut d = Delivery::new(key(&flooding, &fresh_id("dlv"), "armed"), 2, now);
        d.next_attempt_at = long_ago + i;
        d.version = 1;
        assert!(store.put_delivery(&d, 0).await.expect("put"));
        made.push(d);
    }
    let mut theirs = Vec::new();
    for _ in 0..2 {
        let mut d = Delivery::new(key(&other, &fresh_id("dlv"), "armed"), 2, now);
        // After the whole flood (within the window DynamoDB chooses from).
        d.next_attempt_at = long_ago + 1000;
        d.version = 1;
        assert!(store.put_delivery(&d, 0).await.expect("put"));
        theirs.push(d.delivery_id.clone());
        made.push(d);
    }
    let limit = 40;
    let due = store.due_deliveries(now, limit).await.expect("due");
    assert!(due.len() <= limit);
    for id in &theirs {
        assert!(
            due.iter().any(|d| &d.delivery_id == id),
            "the other project's delivery {id} is among the {} taken",
            due.len()
        );
    }
    let flood: Vec<&Delivery> = due.iter().filter(|d| d.key.project == flooding).collect();
    assert!(
        !flood.is_empty() && flood.len() <= limit - theirs.len(),
        "{} of the flood",
        flood.len()
    );
    // Each project's earliest first.
    assert!(
        flood
            .windows(2)
            .all(|w| w[0].next_attempt_at <= w[1].next_attempt_at),
        "in order"
    );
    assert_eq!(flood[0].next_attempt_at, long_ago);
    // Sent: none of them is left due for another test.
    for d in made {
        let mut sent = d.clone();
        sent.state = DeliveryState::Sent;
        sent.version = 2;
        assert!(store.put_delivery(&sent, 1).await.expect("put"));
    }
}

/// Racing first enablings of one sink: one time is kept, every racer and every later
/// call answers it; another sink has its own; the marker is neither due nor dead.
pub async fn a_sink_is_first_enabled_once(store: Store) {
    let sink = fresh_id("sink");
    let now = tollgate_domain::now_millis();
    let mut racers = Vec::new();
    for i in 0..8 {
        let (store, sink) = (store.clone(), sink.clone());
        racers.push(tokio::spawn(async move {
            store.sink_enabled_at(&sink, now + i).await
        }));
    }
    let mut answers = Vec::new();
    for racer in racers {
        answers.push(racer.await.unwrap().unwrap());
    }
    let kept = answers[0];
    assert!((now..now + 8).contains(&kept), "{answers:?}");
    assert!(
        answers.iter().all(|a| *a == kept),
        "one time kept: {answers:?}"
    );
    assert_eq!(
        store.sink_enabled_at(&sink, now + 60_000).await.unwrap(),
        kept
    );
    let other = format!("{sink}-other");
    assert_eq!(
        store.sink_enabled_at(&other, now + 5).await.unwrap(),
        now + 5
    );
    let due = store.due_deliveries(now + 3_600_000, 1000).await.unwrap();
    assert!(!due.iter().any(|d| d.key.sink == sink), "{due:?}");
}
