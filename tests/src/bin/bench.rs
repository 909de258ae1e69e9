//! `make bench`: append and replay throughput of the run event log, on the embedded
//! store and on DynamoDB (DynamoDB Local under `make bench`). Every figure is printed
//! beside a baseline measured in the same process against the same emulator — one
//! plain `PutItem` and one plain `Query` — so the ratios, not the absolute times, are
//! what to compare across machines.

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::{json, Map};
use tollgate_domain::{EventDraft, NewRun};
use tollgate_store::memory::MemoryStore;
use tollgate_store::RunStore;
use tollgate_tests::{aws_endpoint_configured, dynamo_store};

const APPENDS: usize = 800;
const WRITERS: usize = 8;
const REPLAY_EVENTS: u64 = 10_000;
const BASELINE_OPS: usize = 300;

fn event(i: usize) -> EventDraft {
    let mut p = Map::new();
    p.insert("i".into(), json!(i));
    p.insert("text".into(), json!("benchmark event with a short payload"));
    EventDraft {
        event_type: "agent.message".into(),
        event_id: None,
        payload: p,
    }
}

async fn new_run(store: &Arc<dyn RunStore>) -> String {
    let run_id = format!("bench-{}", uuid::Uuid::new_v4().simple());
    store
        .create_run(NewRun {
            run_id: run_id.clone(),
            created_by: "bench".into(),
            ..NewRun::default()
        })
        .await
        .expect("create run");
    run_id
}

/// `APPENDS` single-event appends to one run from `writers` concurrent tasks; returns
/// the mean time per append (wall time / appends).
async fn append_throughput(store: &Arc<dyn RunStore>, writers: usize) -> Duration {
    let run_id = new_run(store).await;
    let start = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let (store, run_id) = (store.clone(), run_id.clone());
            tokio::spawn(async move {
                for i in 0..APPENDS / writers {
                    store
                        .append_events(&run_id, vec![event(w * APPENDS + i)])
                        .await
                        .expect("append");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("writer");
    }
    let elapsed = start.elapsed();
    let head = store.read_head(&run_id).await.unwrap().unwrap();
    assert_eq!(
        head.last_sequence() as usize,
        APPENDS + 1,
        "every append landed once"
    );
    elapsed / APPENDS as u32
}

/// Replays a 10,000-event run in pages of `limit`; returns (whole replay, per page).
async fn replay(store: &Arc<dyn RunStore>, run_id: &str, limit: usize) -> (Duration, Duration) {
    let start = Instant::now();
    let (mut after, mut pages, mut seen) = (0u64, 0u32, 0u64);
    loop {
        let page = store.read_events(run_id, after, limit).await.expect("page");
        pages += 1;
        seen += page.events.len() as u64;
        if !page.has_more {
            break;
        }
        after = page.events.last().unwrap().sequence;
    }
    assert_eq!(seen, REPLAY_EVENTS, "replay covered the run");
    let total = start.elapsed();
    (total, total / pages)
}

async fn filled_run(store: &Arc<dyn RunStore>) -> String {
    let run_id = new_run(store).await;
    let mut n = 1u64;
    while n < REPLAY_EVENTS {
        let k = (REPLAY_EVENTS - n).min(99) as usize;
        store
            .append_events(&run_id, (0..k).map(event).collect())
            .await
            .expect("fill");
        n += k as u64;
    }
    run_id
}

struct Baseline {
    put_item: Duration,
    query: Duration,
}

/// One plain `PutItem`, and one plain `Query` of 100 items, on the same emulator.
async fn dynamo_baseline(store: &tollgate_store::dynamo::DynamoStore, run_id: &str) -> Baseline {
    let client = store.client();
    let table = &store.tables().events;
    let start = Instant::now();
    for i in 0..BASELINE_OPS {
        client
            .put_item()
            .table_name(table)
            .item("run_id", AttributeValue::S(format!("baseline-{}", i % 10)))
            .item("event_key", AttributeValue::S(format!("k{i}")))
            .item("sequence", AttributeValue::N(i.to_string()))
            .item(
                "body",
                AttributeValue::S("{\"type\":\"agent.message\"}".into()),
            )
            .send()
            .await
            .expect("PutItem");
    }
    let put_item = start.elapsed() / BASELINE_OPS as u32;
    let start = Instant::now();
    for _ in 0..BASELINE_OPS / 3 {
        client
            .query()
            .table_name(table)
            .index_name(tollgate_store::dynamo::BY_SEQUENCE_INDEX)
            .key_condition_expression("run_id = :r AND #s > :a")
            .expression_attribute_names("#s", "sequence")
            .expression_attribute_values(":r", AttributeValue::S(run_id.into()))
            .expression_attribute_values(":a", AttributeValue::N("0".into()))
            .limit(100)
            .send()
            .await
            .expect("Query");
    }
    Baseline {
        put_item,
        query: start.elapsed() / (BASELINE_OPS / 3) as u32,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn ratio(d: Duration, base: Duration) -> String {
    let r = d.as_secs_f64() / base.as_secs_f64();
    if r < 0.1 {
        format!("{r:.4}×")
    } else {
        format!("{r:.2}×")
    }
}

async fn bench(name: &str, store: Arc<dyn RunStore>, baseline: Option<&Baseline>) {
    println!("\n== {name}");
    append_throughput(&store, WRITERS).await; // warm-up (JIT, connections), not reported
    let one = append_throughput(&store, 1).await;
    let eight = append_throughput(&store, WRITERS).await;
    let run_id = filled_run(&store).await;
    let (full_1000, page_1000) = replay(&store, &run_id, 1000).await;
    let (full_100, page_100) = replay(&store, &run_id, 100).await;
    let rows = [
        (
            "append, 1 writer (per append)",
            one,
            baseline.map(|b| b.put_item),
            "PutItem",
        ),
        (
            "append, 8 writers (per append)",
            eight,
            baseline.map(|b| b.put_item),
            "PutItem",
        ),
        (
            "replay 10,000 events, limit 1000 (whole)",
            full_1000,
            None,
            "",
        ),
        (
            "replay page of 1000",
            page_1000,
            baseline.map(|b| b.query),
            "Query(100)",
        ),
        (
            "replay 10,000 events, limit 100 (whole)",
            full_100,
            None,
            "",
        ),
        (
            "replay page of 100",
            page_100,
            baseline.map(|b| b.query),
            "Query(100)",
        ),
    ];
    for (what, d, base, base_name) in rows {
        let rate = if what.starts_with("append") {
            format!("{:>9.0} appends/s", 1.0 / d.as_secs_f64())
        } else {
            String::new()
        };
        match base {
            Some(b) => println!(
                "  {what:<42} {:>11} {rate}  = {} of one {base_name}",
                ms(d),
                ratio(d, b)
            ),
            None => println!("  {what:<42} {:>11} {rate}", ms(d)),
        }
    }
    println!(
        "  8 writers vs 1 writer: {:.2}× the throughput",
        one.as_secs_f64() / eight.as_secs_f64()
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    println!("Tollgate event-log benchmark: {APPENDS} appends per mode, {WRITERS} concurrent writers, replay of {REPLAY_EVENTS} events");
    let dynamo = if aws_endpoint_configured() {
        Some(Arc::new(dynamo_store().await))
    } else {
        None
    };
    let baseline = match &dynamo {
        Some(d) => {
            let store: Arc<dyn RunStore> = d.clone();
            let run_id = filled_run(&store).await;
            // A fresh emulator JIT-compiles as it goes: warm it up before measuring.
            dynamo_baseline(d, &run_id).await;
            append_throughput(&store, WRITERS).await;
            append_throughput(&store, 1).await;
            let b = dynamo_baseline(d, &run_id).await;
            println!(
                "\nbaseline on this DynamoDB endpoint: PutItem {}, Query of 100 items {}",
                ms(b.put_item),
                ms(b.query)
            );
            Some(b)
        }
        None => {
            println!("\n(no AWS endpoint configured: embedded store only; `make bench` starts DynamoDB Local)");
            None
        }
    };
    bench(
        "embedded store (memory)",
        Arc::new(MemoryStore::new()),
        baseline.as_ref(),
    )
    .await;
    if let Some(d) = dynamo {
        bench("DynamoDB", d, baseline.as_ref()).await;
    }
}
