//! `make bench`: append and replay throughput of the run event log, on the embedded
//! store and on DynamoDB (DynamoDB Local under `make bench`). Every figure is printed
//! beside a baseline measured in the same process against the same emulator — one
//! plain `PutItem`, one plain `Query`, and the append's own two-item
//! `TransactWriteItems` written by hand — so the ratios, not the absolute times, are
//! what to compare across machines. On DynamoDB it also sets eight writers through one
//! store (in-process lanes, group commit) beside eight separate stores without lanes,
//! which is how eight Lambda instances meet on one run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{
    AttributeValue, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use serde_json::{json, Map};
use tollgate_domain::{now_millis, render_event, EventDraft, NewRun, RunStatus};
use tollgate_store::dynamo::DynamoStore;
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
    append_throughput_on(std::slice::from_ref(store), writers, APPENDS).await
}

/// `appends` single-event appends to one run from `writers` concurrent tasks, writer `w`
/// through `stores[w % stores.len()]`; returns the mean time per append (wall time /
/// appends). `appends` is a multiple of `writers`.
async fn append_throughput_on(
    stores: &[Arc<dyn RunStore>],
    writers: usize,
    appends: usize,
) -> Duration {
    assert_eq!(appends % writers, 0, "every writer appends as many");
    let run_id = new_run(&stores[0]).await;
    let start = Instant::now();
    let tasks: Vec<_> = (0..writers)
        .map(|w| {
            let (store, run_id) = (stores[w % stores.len()].clone(), run_id.clone());
            tokio::spawn(async move {
                for i in 0..appends / writers {
                    store
                        .append_events(
                            tollgate_store::RunRef::any(&run_id),
                            vec![event(w * appends + i)],
                        )
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
    let head = stores[0].read_head(&run_id).await.unwrap().unwrap();
    assert_eq!(
        head.last_sequence() as usize,
        appends + 1,
        "every append landed once"
    );
    elapsed / appends as u32
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
            .append_events(
                tollgate_store::RunRef::any(&run_id),
                (0..k).map(event).collect(),
            )
            .await
            .expect("fill");
        n += k as u64;
    }
    run_id
}

struct Baseline {
    put_item: Duration,
    query: Duration,
    /// One append's transaction written by hand (see [`raw_append_transaction`]).
    transact_2: Duration,
}

/// What one append transaction of the store is on the wire, written by hand: the head
/// `Update` (conditioned on the `next_seq` last written, status `running` and, where
/// the head carries one, its incarnation; `ALL_OLD` on failure) plus one event `Put`
/// (`attribute_not_exists(event_key)`, `ALL_OLD`), with the same attributes, body and
/// a client request token. Runs `ops` of them, one at a time, on a fresh run of the
/// bench's own (created by the store, so the items are the store's) and returns the
/// mean time per transaction. With `read_head_first` each transaction is preceded by
/// the strongly consistent `GetItem` of the head that an append without a remembered
/// head makes; without it, what an append costs beyond this is the store's own work.
async fn raw_append_transaction(
    store: &DynamoStore,
    ops: usize,
    read_head_first: bool,
) -> Duration {
    let (client, tables) = (store.client(), store.tables());
    let shared: Arc<dyn RunStore> = Arc::new(store.clone());
    let run_id = new_run(&shared).await;
    let mut head = shared.read_head(&run_id).await.unwrap().unwrap();
    let stored_head = client
        .get_item()
        .table_name(&tables.runs)
        .key("run_id", AttributeValue::S(run_id.clone()))
        .consistent_read(true)
        .send()
        .await
        .expect("GetItem")
        .item
        .expect("the head the store wrote");
    let incarnation = stored_head.get("incarnation").cloned();
    let start = Instant::now();
    for i in 0..ops {
        if read_head_first {
            let item = client
                .get_item()
                .table_name(&tables.runs)
                .key("run_id", AttributeValue::S(run_id.clone()))
                .consistent_read(true)
                .send()
                .await
                .expect("GetItem")
                .item
                .expect("the head");
            let Some(AttributeValue::N(next_seq)) = item.get("next_seq") else {
                panic!("head without next_seq");
            };
            head.next_seq = next_seq.parse().expect("numeric next_seq");
        }
        let (seq, now, draft) = (head.next_seq, now_millis(), event(i));
        let mut condition = String::from("next_seq = :seen AND #status = :running");
        let mut update = Update::builder()
            .table_name(&tables.runs)
            .key("run_id", AttributeValue::S(run_id.clone()))
            .update_expression("SET next_seq = :new, last_event_at = :now")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":seen", AttributeValue::N(seq.to_string()))
            .expression_attribute_values(
                ":running",
                AttributeValue::S(RunStatus::Running.as_str().into()),
            )
            .expression_attribute_values(":new", AttributeValue::N((seq + 1).to_string()))
            .expression_attribute_values(":now", AttributeValue::N(now.to_string()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if let Some(incarnation) = &incarnation {
            condition.push_str(" AND incarnation = :inc");
            update = update.expression_attribute_values(":inc", incarnation.clone());
        }
        let update = update
            .condition_expression(condition)
            .build()
            .expect("Update");
        let put = Put::builder()
            .table_name(&tables.events)
            .item("run_id", AttributeValue::S(run_id.clone()))
            .item("event_key", AttributeValue::S(format!("seq#{seq:020}")))
            .item("sequence", AttributeValue::N(seq.to_string()))
            .item("type", AttributeValue::S(draft.event_type.clone()))
            .item(
                "body",
                AttributeValue::S(render_event(&head, seq, &draft, now)),
            )
            .condition_expression("attribute_not_exists(event_key)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()
            .expect("Put");
        client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(update).build())
            .transact_items(TransactWriteItem::builder().put(put).build())
            .client_request_token(uuid::Uuid::new_v4().to_string())
            .send()
            .await
            .expect("TransactWriteItems");
        head.next_seq = seq + 1;
        head.last_event_at = now;
    }
    let per_op = start.elapsed() / ops as u32;
    let stored = shared.read_head(&run_id).await.unwrap().unwrap();
    assert_eq!(
        stored.last_sequence() as usize,
        ops + 1,
        "the hand-written appends form a gapless run"
    );
    per_op
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
    let query = start.elapsed() / (BASELINE_OPS / 3) as u32;
    Baseline {
        put_item,
        query,
        transact_2: raw_append_transaction(store, BASELINE_OPS, false).await,
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

/// Mean time per append with one writer and with `WRITERS` writers (one store).
struct AppendFigures {
    one: Duration,
    eight: Duration,
}

async fn bench(name: &str, store: Arc<dyn RunStore>, baseline: Option<&Baseline>) -> AppendFigures {
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
    AppendFigures { one, eight }
}

/// `WRITERS` writers on one run, each through its own `DynamoStore` (own client, no
/// lanes): how as many Lambda instances, one request at a time each, meet on one run.
/// Every append races on the head's condition and the losers retry; printed beside the
/// same writers through one store, whose lane queues them and commits them in groups.
async fn separate_stores(shared: &DynamoStore, lanes: &AppendFigures) {
    let stores: Vec<Arc<dyn RunStore>> = (0..WRITERS)
        .map(|_| {
            // Same settings (endpoint, timeouts), its own client as each Lambda has.
            let client =
                aws_sdk_dynamodb::Client::from_conf(shared.client().config().to_builder().build());
            Arc::new(DynamoStore::new(client, shared.tables().clone()).without_lanes())
                as Arc<dyn RunStore>
        })
        .collect();
    append_throughput_on(&stores, WRITERS, WRITERS * 10).await; // warm-up (connections)
    let separate = append_throughput_on(&stores, WRITERS, APPENDS).await;
    let row = |what: &str, d: Duration| {
        println!(
            "  {what:<42} {:>11} {:>9.0} appends/s",
            ms(d),
            1.0 / d.as_secs_f64()
        )
    };
    row("append, 8 writers, 1 store with lanes", lanes.eight);
    row("append, 8 writers, 8 stores without lanes", separate);
    println!(
        "  8 writers: 1 store with lanes = {:.2}× the throughput of 8 separate stores",
        separate.as_secs_f64() / lanes.eight.as_secs_f64()
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
                "\nbaseline on this DynamoDB endpoint: PutItem {}, Query of 100 items {}, \
                 raw 2-item TransactWriteItems (head Update + event Put) {}/op",
                ms(b.put_item),
                ms(b.query),
                ms(b.transact_2)
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
    if let (Some(d), Some(b)) = (dynamo, baseline.as_ref()) {
        let lanes = bench("DynamoDB", d.clone(), Some(b)).await;
        // Measured again right after the appends it is compared with: the emulator
        // speeds up as it warms, which would flatter whichever ran later.
        let raw = raw_append_transaction(&d, BASELINE_OPS, false).await;
        let read_raw = raw_append_transaction(&d, BASELINE_OPS, true).await;
        println!(
            "  append 1 writer = {:.2}× raw 2-item TransactWriteItems ({} vs {} per op; \
             {} at the start)",
            lanes.one.as_secs_f64() / raw.as_secs_f64(),
            ms(lanes.one),
            ms(raw),
            ms(b.transact_2)
        );
        println!(
            "  append 1 writer = {:.2}× raw GetItem(head, consistent) + the same transaction ({} per op)",
            lanes.one.as_secs_f64() / read_raw.as_secs_f64(),
            ms(read_raw)
        );
        separate_stores(&d, &lanes).await;
    }
}
