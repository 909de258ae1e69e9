//! `make bench`: append and replay throughput of the run event log, on the embedded
//! store and on DynamoDB (DynamoDB Local under `make bench`). Every figure is printed
//! beside a baseline measured in the same process against the same emulator — one
//! plain `PutItem`, one plain `Query`, and the append's own two-item
//! `TransactWriteItems` written by hand — so the ratios, not the absolute times, are
//! what to compare across machines. On DynamoDB it also sets eight writers through one
//! store (in-process lanes, group commit) beside eight separate stores without lanes,
//! which is how eight Lambda instances meet on one run.
//!
//! Then the approval gate on DynamoDB: arm, heartbeat and decision (on single runs and
//! on child runs mirrored on a coordinator, through the store and through the API's
//! gate), each with its time beside the same baselines, the requests the SDK sent
//! (counted by an interceptor on the client) and the write units AWS would bill for
//! its transaction, sized item by item with DynamoDB's item-size rules.
//!
//! Last, the live stream (SSE) on DynamoDB: the DynamoDB calls and read units one
//! watcher makes per minute, idle and seeing one event a second, beside a client polling
//! `GET /events?after=N` once a second. `tollgate-bench sse` runs only that phase.
//!
//! Last, the reference lifecycle (tests/lifecycle_cost.rs) priced with each live-delivery
//! mode — SSE on Lambda, replay polling, WebSocket push — for the agent's five-minute wait
//! on its card and one console watching (`tollgate_tests::meter::delivery`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::{
    AttributeValue, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use serde_json::{json, Map};
use tollgate_api::sse::SseConfig;
use tollgate_api::{Auth, Deps, Gate, GateConfig};
use tollgate_domain::{
    now_millis, render_event, ApprovalRequest, ApprovalState, EventDraft, NewRun, Resolution,
    RunKind, RunStatus, Scope,
};
use tollgate_store::dynamo::DynamoStore;
use tollgate_store::memory::MemoryStore;
use tollgate_store::{ApprovalStore, Armed, Beat, Resolved, RunRef, RunStore, Store};
use tollgate_tests::meter::delivery::{price, Assumptions, Mode, Watch};
use tollgate_tests::meter::{
    bill, item_size, model_key, prices, table_infos, units, Call, CallKind, CallRequest,
    DynamoMeter, ItemBill, LambdaAssumption, Meter, MeterLog, Model, TableInfo, TxBill,
};
use tollgate_tests::{aws_endpoint_configured, dynamo_store, TestServer, TEST_SECRET};
use tollgate_timers::EmbeddedTimers;

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
                        .append_events(RunRef::any(&run_id), vec![event(w * appends + i)])
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
            .append_events(RunRef::any(&run_id), (0..k).map(event).collect())
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
    let put_item = put_item_time(store, BASELINE_OPS).await;
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

/// Mean time of one plain `PutItem` (a small event-shaped item), over `ops` of them.
async fn put_item_time(store: &DynamoStore, ops: usize) -> Duration {
    let client = store.client();
    let table = &store.tables().events;
    let start = Instant::now();
    for i in 0..ops {
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
    start.elapsed() / ops as u32
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
    println!(
        "  8 separate stores (each remembering its heads) = {:.2}× the throughput of 1 writer \
         (goal ≥ 0.75×)",
        lanes.one.as_secs_f64() / separate.as_secs_f64()
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    // `tollgate-bench sse`: only the live-stream phase (needs DynamoDB); `append`: only
    // the append throughput on DynamoDB (1 writer, 8 through one store, 8 stores).
    match std::env::args().nth(1).as_deref() {
        None => {}
        Some("ws") => {
            ws_watchers().await;
            return;
        }
        Some("append") => {
            assert!(
                aws_endpoint_configured(),
                "the append phase needs a DynamoDB endpoint (`source .cache/emulators/env`)"
            );
            let d = dynamo_store().await;
            let store: Arc<dyn RunStore> = Arc::new(d.clone());
            // Warmed up as the whole benchmark warms the emulator.
            append_throughput(&store, WRITERS).await;
            append_throughput(&store, 1).await;
            let lanes = AppendFigures {
                one: append_throughput(&store, 1).await,
                eight: append_throughput(&store, WRITERS).await,
            };
            separate_stores(&d, &lanes).await;
            return;
        }
        Some("sse") => {
            assert!(
                aws_endpoint_configured(),
                "the sse phase needs a DynamoDB endpoint (`source .cache/emulators/env`)"
            );
            sse_watchers(&dynamo_store().await).await;
            return;
        }
        Some(other) => {
            eprintln!(
                "usage: tollgate-bench [append|sse|ws]   (unknown phase {other:?}; none: every phase)"
            );
            std::process::exit(2);
        }
    }
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
    ws_watchers().await;
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
        approvals(&d, b).await;
        let measured = sse_watchers(&d).await;
        lifecycle_modes(&measured).await;
    }
}

// ------------------------------------------------------------------------- approvals
//
// The approval gate on DynamoDB: what one decision and one heartbeat cost — time per
// call beside the baselines, the requests the SDK sends (counted by an interceptor on
// the client), and the write units AWS would bill for the transaction, sized from the
// items themselves.

/// Cards per kind of run (single; child with a coordinator), each on fresh runs.
const CARDS: usize = 200;
/// Cards per variant decided through the API's gate (`locate` + `resolve`).
const GATE_CARDS: usize = 50;
/// Cards per kind whose transactions ask DynamoDB Local for its `ConsumedCapacity`.
const CAPACITY_CARDS: usize = 5;

/// One measured phase: `n` calls, one at a time.
struct Phase {
    per_op: Duration,
    n: usize,
    log: MeterLog,
    bills: Vec<TxBill>,
}

/// A count per call: `3`, or `1.02` when some calls differed.
fn per(count: usize, n: usize) -> String {
    let x = count as f64 / n as f64;
    if (x - x.round()).abs() < 1e-9 {
        format!("{}", x.round() as u64)
    } else {
        format!("{x:.2}")
    }
}

/// Counts in first-seen order.
fn tally<'a>(names: impl IntoIterator<Item = &'a str>) -> Vec<(&'a str, usize)> {
    let mut out: Vec<(&str, usize)> = Vec::new();
    for name in names {
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some((_, c)) => *c += 1,
            None => out.push((name, 1)),
        }
    }
    out
}

impl Phase {
    /// `1 GetItem(card) + 1 GetItem(head) + 1 TransactWriteItems = 3 round trips`.
    fn trips(&self) -> String {
        let parts: Vec<String> = tally(self.log.sent.iter().map(String::as_str))
            .into_iter()
            .map(|(name, c)| format!("{} {name}", per(c, self.n)))
            .collect();
        format!(
            "{} = {} round trips",
            parts.join(" + "),
            per(self.log.sent.len(), self.n)
        )
    }

    fn round_trips(&self) -> f64 {
        self.log.sent.len() as f64 / self.n as f64
    }

    /// Mean write units per call: (transactional item units, index units).
    fn write_units(&self) -> (f64, f64) {
        let n = self.n as f64;
        let (mut items, mut index) = (0u64, 0u64);
        for b in &self.bills {
            items += b.items.iter().map(|i| i.wcu).sum::<u64>();
            index += b.index.iter().map(|i| i.units).sum::<u64>();
        }
        (items as f64 / n, index as f64 / n)
    }

    /// `head Update 196 B (2) + event Put 344 B (2) = 2 items, 4 WCU transactional; …`.
    fn writes(&self, what: &str) -> String {
        let n = self.n;
        let all: Vec<&ItemBill> = self.bills.iter().flat_map(|b| &b.items).collect();
        let labels = tally(all.iter().map(|i| i.label.as_str()));
        let parts: Vec<String> = labels
            .iter()
            .map(|(label, count)| {
                let of: Vec<&&ItemBill> = all.iter().filter(|i| i.label == *label).collect();
                let bytes = of.iter().map(|i| i.bytes).sum::<usize>() / count;
                let wcu = of.iter().map(|i| i.wcu).sum::<u64>() as usize;
                let times = if *count == n {
                    String::new()
                } else {
                    format!(" ×{}", per(*count, n))
                };
                format!(
                    "{label} {}{times} {bytes} B ({})",
                    of[0].op,
                    per(wcu, *count)
                )
            })
            .collect();
        let index: Vec<String> = tally(
            self.bills
                .iter()
                .flat_map(|b| &b.index)
                .flat_map(|i| std::iter::repeat_n(i.index.as_str(), i.units as usize)),
        )
        .into_iter()
        .map(|(name, u)| format!("{name} {}", per(u, n)))
        .collect();
        let (tx, ix) = self.write_units();
        if index.is_empty() {
            return format!(
                "{} = {} items, {tx} WCU transactional (2 per started KB, per item) → {tx} WCU per {what}",
                parts.join(" + "),
                per(all.len(), n),
            );
        }
        format!(
            "{} = {} items, {tx} WCU transactional (2 per started KB, per item); index entries \
             written: {} = {ix} KB-units, +{ix} WCU at the standard rate or +{} if doubled like \
             the items → {} to {} WCU per {what}",
            parts.join(" + "),
            per(all.len(), n),
            index.join(" + "),
            2.0 * ix,
            tx + ix,
            tx + 2.0 * ix
        )
    }

    /// DynamoDB Local's own figure per call, when the transactions asked for it: the
    /// total, then per table its own units and each index's.
    fn consumed(&self, tables: &HashMap<String, TableInfo>) -> String {
        if self.log.transaction_capacity().next().is_none() {
            return "none returned".into();
        }
        let mut parts: Vec<(String, f64)> = Vec::new();
        let mut add = |name: String, units: f64| match parts.iter_mut().find(|(n, _)| *n == name) {
            Some((_, u)) => *u += units,
            None => parts.push((name, units)),
        };
        let mut total = 0.0;
        let capacity = |c: &aws_sdk_dynamodb::types::Capacity| c.capacity_units().unwrap_or(0.0);
        for c in self.log.transaction_capacity() {
            total += c.capacity_units().unwrap_or(0.0);
            let table = c.table_name().unwrap_or("?");
            let label = tables.get(table).map_or("?", |t| t.label);
            add(format!("{label}s"), c.table().map(capacity).unwrap_or(0.0));
            let indexes = c.local_secondary_indexes().into_iter().flatten();
            for (name, cap) in indexes.chain(c.global_secondary_indexes().into_iter().flatten()) {
                add(name.clone(), capacity(cap));
            }
        }
        let n = self.n as f64;
        let parts: Vec<String> = parts
            .iter()
            .map(|(name, u)| format!("{name} {:.1}", u / n))
            .collect();
        format!("{:.1} CU ({})", total / n, parts.join(" + "))
    }
}

/// One armed card and the runs it lives on.
struct BenchCard {
    run_id: String,
    request_id: String,
    coordinator: Option<String>,
}

fn approval_card(run_id: &str, coordinator: Option<&str>, i: usize) -> ApprovalRequest {
    let request_id = format!("call_{}", uuid::Uuid::new_v4().simple());
    let now = now_millis();
    ApprovalRequest {
        run_id: run_id.into(),
        tool_call_id: request_id.clone(),
        approval_id: request_id.clone(),
        request_id,
        tool_name: "web_fetch".into(),
        explicit_ids: false,
        url: Some("https://docs.example.com/guide/getting-started".into()),
        intention: Some("Read the setup guide to answer the user's question".into()),
        message: Some("The agent wants to fetch a page from docs.example.com.".into()),
        arguments_hash: Some(format!("sha256:{i:064x}")),
        state: ApprovalState::Pending,
        scope: None,
        decided_by: None,
        decided_at: None,
        created_at: now,
        expires_at: now + 3_600_000,
        coordinator_run_id: coordinator.map(Into::into),
        subtask_id: coordinator.map(|_| json!(i)),
        project_id: None,
        end_reason: None,
        auto_approval: None,
        arguments_preview: None,
        decision_reason: None,
        held_by_pod: false,
    }
}

fn approve_once() -> Resolution {
    Resolution::Approved {
        scope: Scope::Once,
        by: "operator@example.com".into(),
        reason: None,
    }
}

struct ApprovalBench {
    /// The store under test, on a client with the [`DynamoMeter`] interceptor.
    store: Arc<DynamoStore>,
    /// The same tables through the plain client: reads the items written (untimed,
    /// uncounted) so updates can be sized.
    plain: DynamoStore,
    wire: DynamoMeter,
    tables: HashMap<String, TableInfo>,
    model: Model,
    coordinators: HashSet<String>,
}

impl ApprovalBench {
    fn new(d: &DynamoStore) -> Self {
        let tables = table_infos(d.tables());
        // Capacity only where asked for (below): the timed phases send what the store does.
        let wire = DynamoMeter::new(d.tables());
        wire.set_ask_capacity(false);
        Self {
            store: Arc::new(wire.instrument(d)),
            plain: d.clone(),
            wire,
            tables,
            model: Model::new(),
            coordinators: HashSet::new(),
        }
    }

    /// Starts a phase: forgets what was sent so far; returns the images before it.
    fn start(&self) -> Model {
        self.wire.take();
        self.model.clone()
    }

    /// Ends a phase of `n` calls that took `elapsed`: takes what was sent, learns the
    /// images after it (a `Put`'s item as sent; an `Update`'s as stored now, read
    /// through the plain client) and bills every transaction.
    async fn finish(&mut self, pre: Model, elapsed: Duration, n: usize) -> Phase {
        let log = self.wire.take();
        let mut updated = HashMap::new();
        for w in log.transactions().flatten() {
            if let Some(p) = w.put() {
                let info = &self.tables[p.table_name()];
                let key = model_key(info, p.table_name(), p.item());
                self.model.insert(key, p.item().clone());
            } else if let Some(u) = w.update() {
                let info = &self.tables[u.table_name()];
                let key = model_key(info, u.table_name(), u.key());
                updated.insert(key, (u.table_name().to_owned(), u.key().clone()));
            } else if let Some(d) = w.delete() {
                let info = &self.tables[d.table_name()];
                self.model.remove(&model_key(info, d.table_name(), d.key()));
            }
        }
        for (key, (table, item_key)) in updated {
            let stored = self
                .plain
                .client()
                .get_item()
                .table_name(table)
                .set_key(Some(item_key))
                .consistent_read(true)
                .send()
                .await
                .expect("GetItem of an updated item")
                .item;
            match stored {
                Some(item) => self.model.insert(key, item),
                None => self.model.remove(&key),
            };
        }
        let bills = log
            .transactions()
            .map(|tx| bill(&self.tables, &self.coordinators, tx, &pre, &self.model))
            .collect();
        Phase {
            per_op: elapsed / n as u32,
            n,
            log,
            bills,
        }
    }

    async fn create(&self, kind: RunKind, parent: Option<&str>, subtask: Option<usize>) -> String {
        let run_id = format!("bench-{}", uuid::Uuid::new_v4().simple());
        self.store
            .create_run(NewRun {
                run_id: run_id.clone(),
                kind,
                parent_run_id: parent.map(Into::into),
                subtask_id: subtask.map(|i| json!(i)),
                owner: Some("bench-owner".into()),
                created_by: "bench".into(),
                ..NewRun::default()
            })
            .await
            .expect("create run");
        run_id
    }

    /// `n` fresh runs (single, or child each with its own fresh coordinator) with one
    /// pending card each; returns the cards and the arm phase.
    async fn cards(&mut self, with_coordinator: bool, n: usize) -> (Vec<BenchCard>, Phase) {
        let pre = self.start();
        let mut runs = Vec::with_capacity(n);
        for i in 0..n {
            let run = if with_coordinator {
                let coordinator = self.create(RunKind::Coordinator, None, None).await;
                self.coordinators.insert(coordinator.clone());
                let child = self
                    .create(RunKind::Child, Some(&coordinator), Some(i))
                    .await;
                (child, Some(coordinator))
            } else {
                (self.create(RunKind::Single, None, None).await, None)
            };
            runs.push(run);
        }
        self.finish(pre, Duration::ZERO, n).await; // the heads, for the model
        let pre = self.start();
        let start = Instant::now();
        let mut cards = Vec::with_capacity(n);
        for (i, (run_id, coordinator)) in runs.into_iter().enumerate() {
            let card = approval_card(&run_id, coordinator.as_deref(), i);
            let request_id = card.request_id.clone();
            let armed = self
                .store
                .arm(RunRef::any(&run_id), card)
                .await
                .expect("arm");
            match armed {
                Armed::Created { card, .. } => assert_eq!(card.coordinator_run_id, coordinator),
                other => panic!("a fresh card was not created: {other:?}"),
            }
            cards.push(BenchCard {
                run_id,
                request_id,
                coordinator,
            });
        }
        let elapsed = start.elapsed();
        (cards, self.finish(pre, elapsed, n).await)
    }

    /// Heartbeat 1 on every card, one at a time.
    async fn heartbeats(&mut self, cards: &[BenchCard]) -> Phase {
        let pre = self.start();
        let start = Instant::now();
        for c in cards {
            let beat = self
                .store
                .heartbeat(&c.run_id, &c.request_id, 1)
                .await
                .expect("heartbeat");
            assert!(
                matches!(beat, Beat::Emitted(_)),
                "heartbeat written: {beat:?}"
            );
        }
        let elapsed = start.elapsed();
        self.finish(pre, elapsed, cards.len()).await
    }

    /// `resolve(run, request, Approved { scope: once }, now, None)` on every card.
    async fn decisions(&mut self, cards: &[BenchCard]) -> Phase {
        let pre = self.start();
        let start = Instant::now();
        for c in cards {
            let resolved = self
                .store
                .resolve(&c.run_id, &c.request_id, approve_once(), now_millis(), None)
                .await
                .expect("resolve");
            assert!(
                matches!(&resolved, Resolved::Fresh(card) if card.state == ApprovalState::Approved),
                "decision landed: {resolved:?}"
            );
        }
        let elapsed = start.elapsed();
        self.finish(pre, elapsed, cards.len()).await
    }

    /// A decision as the API makes it (`POST …/approve`, scope once, less HTTP and auth):
    /// the gate locates the card from the run it was posted on, then resolves it.
    /// `cold`: decided through another store instance than the one that armed them (as
    /// when the approvals function decides what ingress armed): it has seen no head.
    async fn gate_decisions(
        &mut self,
        cards: &[BenchCard],
        on_coordinator: bool,
        cold: bool,
    ) -> Phase {
        let store: Arc<dyn Store> = if cold {
            Arc::new(DynamoStore::new(
                self.store.client().clone(),
                self.store.tables().clone(),
            ))
        } else {
            self.store.clone()
        };
        let gate = Gate::new(
            store,
            Arc::new(EmbeddedTimers::new()),
            GateConfig::default(),
        );
        let pre = self.start();
        let start = Instant::now();
        for c in cards {
            let posted_on = match (&c.coordinator, on_coordinator) {
                (Some(coordinator), true) => coordinator,
                _ => &c.run_id,
            };
            let card = gate
                .locate(posted_on, &c.request_id)
                .await
                .expect("locate")
                .expect("the card is found");
            let resolved = gate.resolve(card, approve_once()).await.expect("resolve");
            assert!(
                matches!(&resolved, Resolved::Fresh(card) if card.state == ApprovalState::Approved),
                "decision landed: {resolved:?}"
            );
        }
        let elapsed = start.elapsed();
        self.finish(pre, elapsed, cards.len()).await
    }

    /// The largest item any GetItem of the phases could have read (for read units).
    fn largest_item(&self) -> usize {
        self.model.values().map(item_size).max().unwrap_or(0)
    }
}

/// Decision and heartbeat latency, round trips and write units on DynamoDB.
async fn approvals(d: &DynamoStore, start_baseline: &Baseline) {
    println!(
        "\n== approvals on DynamoDB: {CARDS} cards per kind, each on fresh runs, one call at a time"
    );
    let mut bench = ApprovalBench::new(d);
    // Warm-up (connections, the emulator's JIT on these code paths), not reported.
    for with_coordinator in [false, true] {
        let (cards, _) = bench.cards(with_coordinator, 20).await;
        bench.heartbeats(&cards).await;
        bench.decisions(&cards).await;
    }
    // Baselines again, just before and just after what they are compared with (the
    // emulator and the machine drift): the ratios use the mean of the two.
    let put_before = put_item_time(d, BASELINE_OPS).await;
    let tx2_before = raw_append_transaction(d, BASELINE_OPS, false).await;

    let (single, single_arm) = bench.cards(false, CARDS).await;
    let single_beat = bench.heartbeats(&single).await;
    let single_decision = bench.decisions(&single).await;
    let (child, child_arm) = bench.cards(true, CARDS).await;
    let child_beat = bench.heartbeats(&child).await;
    let child_decision = bench.decisions(&child).await;
    // Through the API's gate: the card is located first (decide → Gate::locate).
    let (cards, _) = bench.cards(false, GATE_CARDS).await;
    let gate_single = bench.gate_decisions(&cards, false, false).await;
    let (cards, _) = bench.cards(true, GATE_CARDS).await;
    let gate_child = bench.gate_decisions(&cards, false, false).await;
    let (cards, _) = bench.cards(true, GATE_CARDS).await;
    let gate_child_cold = bench.gate_decisions(&cards, false, true).await;
    let (cards, _) = bench.cards(true, GATE_CARDS).await;
    let gate_routed = bench.gate_decisions(&cards, true, false).await;

    let put_after = put_item_time(d, BASELINE_OPS).await;
    let tx2_after = raw_append_transaction(d, BASELINE_OPS, false).await;
    let (put, tx2) = ((put_before + put_after) / 2, (tx2_before + tx2_after) / 2);
    println!(
        "  baselines here (before / after the approvals below): PutItem {} / {}, raw 2-item \
         TransactWriteItems {} / {}; at the start of the run {} and {}",
        ms(put_before),
        ms(put_after),
        ms(tx2_before),
        ms(tx2_after),
        ms(start_baseline.put_item),
        ms(start_baseline.transact_2)
    );
    let row = |what: &str, unit: &str, p: &Phase| {
        println!(
            "  {what:<44} {:>9}/{unit} = {} one PutItem, {} one raw 2-item TransactWriteItems",
            ms(p.per_op),
            ratio(p.per_op, put),
            ratio(p.per_op, tx2)
        );
        println!("      round trips: {}", p.trips());
    };
    row("arm, single run", "arm", &single_arm);
    row(
        "arm, child run (mirrored on its coordinator)",
        "arm",
        &child_arm,
    );
    row("heartbeat, single run", "beat", &single_beat);
    println!("      writes: {}", single_beat.writes("heartbeat"));
    row("heartbeat, child run", "beat", &child_beat);
    println!("      writes: {}", child_beat.writes("heartbeat"));
    row("decision, single run", "decision", &single_decision);
    println!("      writes: {}", single_decision.writes("decision"));
    row(
        "decision, child run (mirrored on coordinator)",
        "decision",
        &child_decision,
    );
    println!("      writes: {}", child_decision.writes("decision"));
    println!("  decision through the API gate (Gate::locate + Gate::resolve, scope once; {GATE_CARDS} cards each):");
    row("  posted on the single run", "decision", &gate_single);
    row("  posted on the child run (warm)", "decision", &gate_child);
    row(
        "  posted on the child run, cold instance",
        "decision",
        &gate_child_cold,
    );
    row(
        "  posted on the coordinator (route)",
        "decision",
        &gate_routed,
    );

    let largest = bench.largest_item();
    println!(
        "  reads: every item read above (GetItem, BatchGetItem) is strongly consistent and at \
         most {largest} B = {} RCU per item; TransactGetItems (the heartbeat's head + card \
         snapshot) bills 2× that per item",
        units(largest, 4096)
    );

    // DynamoDB Local's own reckoning, on a few more cards (not timed).
    bench.wire.set_ask_capacity(true);
    let mut consumed = Vec::new();
    for with_coordinator in [false, true] {
        let (cards, _) = bench.cards(with_coordinator, CAPACITY_CARDS).await;
        let beat = bench.heartbeats(&cards).await;
        let decision = bench.decisions(&cards).await;
        consumed.push((with_coordinator, beat, decision));
    }
    bench.wire.set_ask_capacity(false);
    for (with_coordinator, beat, decision) in &consumed {
        let kind = if *with_coordinator {
            "child run"
        } else {
            "single run"
        };
        println!(
            "  DynamoDB Local's ConsumedCapacity (INDEXES), {kind}:\n      heartbeat {} \
             [computed: items {} + index entries {}]\n      decision  {} [computed: items {} + \
             index entries {}]",
            beat.consumed(&bench.tables),
            beat.write_units().0,
            beat.write_units().1,
            decision.consumed(&bench.tables),
            decision.write_units().0,
            decision.write_units().1,
        );
    }

    println!(
        "  goal ≤ 2 round trips per decision: store.resolve {} (single run), {} (with coordinator); \
         through the gate {} (run) / {} (child, warm) / {} (child, cold instance) / {} (via the \
         coordinator's route); heartbeat {} / {}",
        single_decision.round_trips(),
        child_decision.round_trips(),
        gate_single.round_trips(),
        gate_child.round_trips(),
        gate_child_cold.round_trips(),
        gate_routed.round_trips(),
        single_beat.round_trips(),
        child_beat.round_trips(),
    );
}

// ----------------------------------------------------------------- live stream (SSE)
//
// What one live-stream watcher (`GET /api/runs/{id}/stream`, default `SseConfig`) costs
// on DynamoDB while it waits: the HTTP app on a metered store, one watcher per scenario
// reading its frames, the DynamoDB calls of the scenario's `SSE_SECONDS` counted and
// billed (AWS's on-demand model, `tollgate_tests::meter`) and scaled to a minute. Events
// are appended through another store (another Lambda instance's), so only the watcher's
// reads are counted. The baseline, in the same process: a client polling `GET
// /api/runs/{id}/events?after=N` once a second.

/// How long each scenario lasts.
const SSE_SECONDS: u64 = 15;
/// The deployed `replay-stream` function (`infra/template.yaml`): its timeout, and the
/// margin the stream keeps before the invocation's deadline (`lambda::insert_deadline`).
const REPLAY_STREAM_TIMEOUT_S: f64 = 60.0;
const DEADLINE_MARGIN_S: f64 = 3.0;

/// One open stream, frame by frame.
struct SseReader {
    resp: reqwest::Response,
    buf: String,
}

impl SseReader {
    async fn open(srv: &TestServer, run_id: &str, token: &str) -> Self {
        let resp = srv
            .http
            .get(srv.url(&format!("/api/runs/{run_id}/stream")))
            .bearer_auth(token)
            .header("accept", "text/event-stream")
            .send()
            .await
            .expect("the stream opens");
        assert_eq!(resp.status(), reqwest::StatusCode::OK, "stream status");
        Self {
            resp,
            buf: String::new(),
        }
    }

    /// The next frame's text; `None` at the end of the response.
    async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                return Some(self.buf.drain(..end + 2).collect());
            }
            let chunk = self.resp.chunk().await.expect("the stream reads")?;
            self.buf
                .push_str(std::str::from_utf8(&chunk).expect("UTF-8 frames"));
        }
    }

    /// Reads until the frame of `id` (the catch-up), then returns.
    async fn until_id(&mut self, id: u64) {
        let want = format!("id: {id}\n");
        while let Some(f) = self.next().await {
            if f.starts_with(&want) {
                return;
            }
        }
        panic!("the stream ended before id {id}");
    }
}

/// Frames a watcher received during a scenario.
#[derive(Default)]
struct Frames {
    events: u64,
    keepalives: u64,
}

/// One scenario's DynamoDB calls, billed.
struct SseCost {
    elapsed: Duration,
    /// Calls per operation.
    ops: BTreeMap<String, u64>,
    /// Read units billed.
    rru: f64,
    /// The same with every `GetItem` strongly consistent (as the head polls were before
    /// they read eventually consistent: 2× the units of an eventual one).
    rru_strong_gets: f64,
    /// Largest item a `GetItem` returned (bytes, by DynamoDB's sizing rules).
    get_bytes: usize,
    /// HTTP requests the client made (poller), or streams opened (watcher).
    requests: u64,
    frames: Frames,
}

impl SseCost {
    fn of(
        log: &MeterLog,
        tables: &HashMap<String, TableInfo>,
        elapsed: Duration,
        requests: u64,
        frames: Frames,
    ) -> Self {
        let ended: Vec<&Call> = log.calls.values().filter(|c| c.ended.is_some()).collect();
        let bills = log.bill_calls(tables, &HashMap::new());
        assert_eq!(bills.len(), ended.len(), "one bill per call");
        let (mut rru, mut rru_strong_gets, mut get_bytes) = (0.0, 0.0, 0);
        for (call, b) in ended.iter().zip(&bills) {
            assert!(
                b.kind != CallKind::Write,
                "a watcher writes nothing: {:?}",
                call.request
            );
            rru += b.billed();
            rru_strong_gets += match call.request {
                CallRequest::GetItem {
                    consistent: false, ..
                } => b.billed() * 2.0,
                _ => b.billed(),
            };
            if let (CallRequest::GetItem { .. }, Some(resp)) = (&call.request, &call.response) {
                for (_, item) in &resp.items {
                    get_bytes = get_bytes.max(item_size(item));
                }
            }
        }
        Self {
            elapsed,
            ops: log.operations(),
            rru,
            rru_strong_gets,
            get_bytes,
            requests,
            frames,
        }
    }

    fn per_min(&self, x: f64) -> f64 {
        x * 60.0 / self.elapsed.as_secs_f64()
    }

    fn usd_per_min(&self) -> f64 {
        self.per_min(self.rru) * prices::DYNAMODB_RRU_USD
    }

    /// `58.9 GetItem/min + 4.0 Query/min, 62.9 RRU/min = $0.00000786`.
    fn line(&self) -> String {
        let ops: Vec<String> = self
            .ops
            .iter()
            .map(|(op, n)| format!("{:.1} {op}/min", self.per_min(*n as f64)))
            .collect();
        format!(
            "{}, {:.1} RRU/min = ${:.8}",
            if ops.is_empty() {
                "no calls".to_owned()
            } else {
                ops.join(" + ")
            },
            self.per_min(self.rru),
            self.usd_per_min()
        )
    }
}

/// Appends one event a second through `writer` (not metered) until `until`, the first
/// half a second after `start`; returns how many.
async fn one_per_second(
    writer: DynamoStore,
    run_id: String,
    start: Instant,
    until: Instant,
) -> u64 {
    let mut n = 0u64;
    loop {
        let at = start + Duration::from_millis(500) + Duration::from_secs(n);
        if at >= until {
            return n;
        }
        tokio::time::sleep_until(at.into()).await;
        writer
            .append_events(RunRef::any(&run_id), vec![event(n as usize)])
            .await
            .expect("append");
        n += 1;
    }
}

/// One watcher on a fresh run for `SSE_SECONDS` after its catch-up (with one event a
/// second appended when `active`); then it is dropped and what it made afterwards is
/// counted too (a dropped watcher should stop at once).
async fn sse_watcher(
    srv: &TestServer,
    meter: &Meter,
    writer: &DynamoStore,
    active: bool,
) -> (SseCost, BTreeMap<String, u64>) {
    let (run_id, token) = srv.create_run(json!({})).await;
    let mut s = SseReader::open(srv, &run_id, &token).await;
    s.until_id(1).await; // retry hint, run_started: the catch-up is over
    meter.dynamo.take();
    let start = Instant::now();
    let until = start + Duration::from_secs(SSE_SECONDS);
    let appender =
        active.then(|| tokio::spawn(one_per_second(writer.clone(), run_id.clone(), start, until)));
    let mut frames = Frames::default();
    loop {
        match tokio::time::timeout_at(until.into(), s.next()).await {
            Err(_) => break,
            Ok(None) => panic!("the stream ended within its window"),
            Ok(Some(f)) if f.starts_with(": keep-alive") => frames.keepalives += 1,
            Ok(Some(f)) if f.starts_with("id: ") => frames.events += 1,
            Ok(Some(f)) => panic!("unexpected frame {f:?}"),
        }
    }
    let log = meter.dynamo.take();
    let elapsed = start.elapsed();
    let appended = match appender {
        Some(a) => a.await.expect("appender"),
        None => 0,
    };
    // The last append may land after `until`: its frame is not counted, its reads are.
    assert!(
        frames.events + 1 >= appended && frames.events <= appended,
        "the watcher saw the appends live: {} of {appended}",
        frames.events
    );
    drop(s);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after_drop = meter.dynamo.take().operations();
    let cost = SseCost::of(&log, meter.dynamo.tables(), elapsed, 1, frames);
    (cost, after_drop)
}

/// A client polling `GET /events?after=N` once a second on a fresh run for
/// `SSE_SECONDS` (with one event a second appended when `active`).
async fn sse_poller(
    srv: &TestServer,
    meter: &Meter,
    writer: &DynamoStore,
    active: bool,
) -> SseCost {
    let (run_id, token) = srv.create_run(json!({})).await;
    let mut after = 1u64; // what a client that has read run_started asks for
    meter.dynamo.take();
    let start = Instant::now();
    let until = start + Duration::from_secs(SSE_SECONDS);
    let appender =
        active.then(|| tokio::spawn(one_per_second(writer.clone(), run_id.clone(), start, until)));
    let (mut requests, mut frames) = (0u64, Frames::default());
    while Instant::now() < until {
        let at = start + Duration::from_secs(requests);
        tokio::time::sleep_until(at.into()).await;
        let (status, page) = srv
            .get(&format!("/api/runs/{run_id}/events?after={after}"), &token)
            .await;
        assert_eq!(status, reqwest::StatusCode::OK, "poll: {page}");
        requests += 1;
        frames.events += page["events"].as_array().map_or(0, |e| e.len() as u64);
        after = page["next_after"].as_u64().expect("next_after");
        if Instant::now() + Duration::from_secs(1) > until {
            break;
        }
    }
    let elapsed = Duration::from_secs(requests); // one request per second of the window
    let log = meter.dynamo.take();
    if let Some(a) = appender {
        a.await.expect("appender");
    }
    SseCost::of(&log, meter.dynamo.tables(), elapsed, requests, frames)
}

/// The live stream's idle and active cost on DynamoDB, beside a once-a-second poller.
async fn sse_watchers(d: &DynamoStore) -> Assumptions {
    let config = SseConfig::default();
    println!(
        "\n== live stream (SSE) on DynamoDB: one watcher per scenario, default SseConfig (head \
         polled {} ms doubling to {} ms while idle, keep-alive {} s, window {} s), {SSE_SECONDS} s \
         each after the catch-up, scaled to a minute; events appended by another store",
        config.poll_min.as_millis(),
        config.poll_max.as_millis(),
        config.keepalive.as_secs(),
        config.window.as_secs(),
    );
    let (meter, metered) = Meter::new(d);
    // Capacity reports stay on: a read that finds something is billed on the larger of
    // the model and the report. The deps of `TestServer::deps` without the stall sweeper
    // (as tests/lifecycle_cost.rs builds them): deployed, it is the `stall-watch`
    // schedule, and here it would bill the watcher for sweeping every run on the tables.
    let mut deps = Deps::new(
        Arc::new(metered),
        Arc::new(EmbeddedTimers::new()),
        GateConfig::default(),
        Auth::new(TEST_SECRET.as_bytes()),
    );
    deps.sse = config;
    let srv = TestServer::with_deps(deps).await;
    let writer = d.clone();
    // Warm-up (connections, the emulator's JIT): a short poll and a short stream.
    {
        let (run_id, token) = srv.create_run(json!({})).await;
        srv.get(&format!("/api/runs/{run_id}/events?after=0"), &token)
            .await;
        let mut s = SseReader::open(&srv, &run_id, &token).await;
        s.until_id(1).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    let (idle, idle_dropped) = sse_watcher(&srv, &meter, &writer, false).await;
    let (active, active_dropped) = sse_watcher(&srv, &meter, &writer, true).await;
    let poll_idle = sse_poller(&srv, &meter, &writer, false).await;
    let poll_active = sse_poller(&srv, &meter, &writer, true).await;
    let where_ = "per watcher-minute (us-east-1 on-demand)";
    println!("  idle SSE watcher on DynamoDB: {} {where_}", idle.line());
    println!(
        "      ({:.1} s measured, {} keep-alive(s), no event)",
        idle.elapsed.as_secs_f64(),
        idle.frames.keepalives
    );
    println!(
        "  SSE watcher seeing 1 event/s on DynamoDB: {} {where_}",
        active.line()
    );
    println!(
        "      ({:.1} s measured, {} events received live)",
        active.elapsed.as_secs_f64(),
        active.frames.events
    );
    let per_request = |c: &SseCost| {
        let parts: Vec<String> = c
            .ops
            .iter()
            .map(|(op, n)| format!("{:.2} {op}", *n as f64 / c.requests as f64))
            .collect();
        parts.join(" + ")
    };
    println!(
        "  baseline, client polling GET /events?after=N once a second, idle: {} per \
         client-minute ({} requests: {} per request)",
        poll_idle.line(),
        poll_idle.requests,
        per_request(&poll_idle)
    );
    println!(
        "  baseline, client polling GET /events?after=N once a second, 1 event/s: {} per \
         client-minute ({} requests: {} per request; {} events)",
        poll_active.line(),
        poll_active.requests,
        per_request(&poll_active),
        poll_active.frames.events
    );
    let r = |a: &SseCost, b: &SseCost| a.usd_per_min() / b.usd_per_min();
    println!(
        "  DynamoDB cost, watcher vs 1/s poller: idle {:.2}×, 1 event/s {:.2}×",
        r(&idle, &poll_idle),
        r(&active, &poll_active)
    );
    let gets = |c: &SseCost| c.ops.get("GetItem").copied().unwrap_or(0) as f64;
    println!(
        "  head polls read eventually consistent ({} B head = {} RRU strong, ½ eventual), a \
         strong read only once a change is seen: idle {:.1} RRU/min (strong polls: {:.1}; \
         saved {:.1} RRU/min = ${:.8}/min), 1 event/s {:.1} RRU/min (strong polls: {:.1}; \
         saved {:.1}); GetItem per event received at 1 event/s: {:.1}",
        idle.get_bytes.max(active.get_bytes),
        units(idle.get_bytes.max(active.get_bytes), 4096),
        idle.per_min(idle.rru),
        idle.per_min(idle.rru_strong_gets),
        idle.per_min(idle.rru_strong_gets - idle.rru),
        idle.per_min(idle.rru_strong_gets - idle.rru) * prices::DYNAMODB_RRU_USD,
        active.per_min(active.rru),
        active.per_min(active.rru_strong_gets),
        active.per_min(active.rru_strong_gets - active.rru),
        gets(&active) / active.frames.events.max(1) as f64,
    );
    // What the compute and the requests around those reads cost, as deployed: the
    // watcher holds a `replay-stream` invocation (Function URL, RESPONSE_STREAM) open for
    // its whole window; the poller makes one API Gateway request and one buffered
    // `replay` invocation a second.
    let lambda = LambdaAssumption::default();
    let gb = lambda.memory_mb as f64 / 1024.0;
    let window_s = (config.window.as_secs_f64()).min(REPLAY_STREAM_TIMEOUT_S - DEADLINE_MARGIN_S);
    let stream_invocations = 60.0 / window_s;
    let watcher_lambda =
        60.0 * gb * prices::LAMBDA_GB_SECOND_USD + stream_invocations * prices::LAMBDA_REQUEST_USD;
    let poller_requests = poll_idle.per_min(poll_idle.requests as f64);
    let poller_lambda = poller_requests
        * (prices::HTTP_API_REQUEST_USD
            + prices::LAMBDA_REQUEST_USD
            + lambda.gb_seconds_per_invocation() * prices::LAMBDA_GB_SECOND_USD);
    println!(
        "  with Lambda around it (assumed {} MB, x86_64): idle watcher = {:.0} GB-s/min of \
         replay-stream duration + {stream_invocations:.2} invocations/min ({window_s:.0} s \
         windows) = ${watcher_lambda:.8} + DynamoDB ${:.8} = ${:.8}/min; 1/s poller = \
         {poller_requests:.0} × (API Gateway request + replay invocation of {} ms) = \
         ${poller_lambda:.8} + DynamoDB ${:.8} = ${:.8}/min; watcher/poller {:.2}×",
        lambda.memory_mb,
        60.0 * gb,
        idle.usd_per_min(),
        watcher_lambda + idle.usd_per_min(),
        lambda.billed_ms,
        poll_idle.usd_per_min(),
        poller_lambda + poll_idle.usd_per_min(),
        (watcher_lambda + idle.usd_per_min()) / (poller_lambda + poll_idle.usd_per_min()),
    );
    for (what, ops) in [("idle", idle_dropped), ("active", active_dropped)] {
        if ops.is_empty() {
            println!("  the {what} watcher, dropped: no DynamoDB call in the 3 s after");
        } else {
            println!(
                "  the {what} watcher, dropped: still called DynamoDB in the 3 s after: {ops:?}"
            );
        }
    }
    // What the lifecycle's delivery is priced with: these measurements where there are.
    let idle_gets = gets(&idle);
    Assumptions {
        sse_polls_per_min: idle.per_min(idle_gets),
        sse_poll_rru: if idle_gets > 0.0 {
            idle.rru / idle_gets
        } else {
            0.0
        },
        page_rru: poll_idle.rru / poll_idle.requests.max(1) as f64,
        ..Assumptions::default()
    }
}

// ------------------------------------------------------- lifecycle with live delivery
//
// The reference lifecycle of tests/lifecycle_cost.rs (counted on DynamoDB Local), plus
// the agent waiting five minutes on its card and one console watching the run, in each
// delivery mode (tollgate_tests::meter::delivery).

const WAIT_SECONDS: u64 = 300;

async fn lifecycle_modes(measured: &Assumptions) {
    let lifecycle = tollgate_tests::lifecycle::lifecycle().await;
    let base = lifecycle.bill.total_usd();
    let watch = Watch::of_lifecycle(&lifecycle.events, WAIT_SECONDS);
    println!(
        "\n== lifecycle cost per live-delivery mode (us-east-1 on demand): the reference \
         lifecycle (tests/lifecycle_cost.rs, counted: ${base:.8}) + the agent waiting \
         {WAIT_SECONDS} s on its card + one console watching the run as long"
    );
    for mode in Mode::ALL {
        let delivery = price(mode, &watch, measured, &lifecycle.ws);
        let total = base + delivery.total_usd();
        println!(
            "  {:<22} delivery ${:.8} → lifecycle ${total:.8} ({:.0}% of the $0.0001 goal){}",
            mode.name(),
            delivery.total_usd(),
            100.0 * total / 0.0001,
            if total <= 0.0001 { "" } else { " — over" }
        );
        for l in &delivery.lines {
            println!(
                "      {:<12} {:<38} {:>5} × {:>8.3} {:<9} ${:.8}  {}",
                l.service,
                l.item,
                l.count,
                l.units / l.count.max(1) as f64,
                l.unit,
                l.usd(),
                l.note
            );
        }
        for a in &delivery.assumptions {
            println!("      * {a}");
        }
    }
}

// ------------------------------------------------------------------- WebSocket watchers
//
// Idle WebSocket watchers on one `tollgate serve` (embedded store, loopback): the server
// process's resident memory before and after 1,000 connections that each follow a run,
// per connection.

/// Idle watchers opened.
const WS_WATCHERS: usize = 1000;

/// `VmRSS` of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

type WsSocket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// One watcher: connected with `token`, subscribed to `run_id`, its backlog read.
async fn ws_watcher(url: &str, token: &str, run_id: &str) -> WsSocket {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::tungstenite::Message;
    let mut req = url.into_client_request().unwrap();
    req.headers_mut().insert(
        "sec-websocket-protocol",
        format!("tollgate.v1, bearer.{token}").parse().unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .expect("the watcher connects");
    let sub = json!({"action": "subscribe", "run_id": run_id, "after": 0}).to_string();
    ws.send(Message::Text(sub.into())).await.unwrap();
    // `subscribed`, then the run's first event.
    let mut frames = 0;
    while frames < 2 {
        match tokio::time::timeout(Duration::from_secs(30), ws.next()).await {
            Ok(Some(Ok(Message::Text(_)))) => frames += 1,
            Ok(Some(Ok(_))) => {}
            other => panic!("watcher: no frame ({other:?})"),
        }
    }
    ws
}

async fn ws_watchers() {
    println!("\nWebSocket: {WS_WATCHERS} idle watchers on one `tollgate serve` (embedded store, loopback)");
    let serve = tollgate_tests::serve::ServeProcess::start(&[]);
    let srv = TestServer::remote(&serve.base);
    let url = format!("{}/api/ws", serve.base.replacen("http://", "ws://", 1));
    // Operators and agents have a pool of 500 places each; agents are capped per agent
    // and per project, so the agent half is spread over 20 agents in 20 projects.
    let agents: Vec<String> = (0..20)
        .map(|i| {
            srv.auth.mint_jwt(
                &format!("bench-agent-{i}"),
                tollgate_api::Role::Agent,
                3600,
                Some(format!("bench-{i}")),
            )
        })
        .collect();
    let mut plan: Vec<(String, String)> = Vec::with_capacity(WS_WATCHERS);
    for i in 0..WS_WATCHERS {
        let agent = &agents[i % agents.len()];
        let (status, body) = srv.post("/api/runs", agent, &json!({})).await;
        assert_eq!(status, reqwest::StatusCode::CREATED, "{body}");
        let run_id = body["run_id"].as_str().unwrap().to_owned();
        let token = if i % 2 == 0 {
            srv.operator_token.clone()
        } else {
            agent.clone()
        };
        plan.push((token, run_id));
    }
    // Warm up (the first connections allocate the server's pools), then settle.
    let warm: Vec<WsSocket> =
        futures::future::join_all(plan.iter().take(8).map(|(t, r)| ws_watcher(&url, t, r))).await;
    drop(warm);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss(serve.pid());
    let started = Instant::now();
    let mut watchers = Vec::with_capacity(WS_WATCHERS);
    for chunk in plan.chunks(50) {
        let opened =
            futures::future::join_all(chunk.iter().map(|(t, r)| ws_watcher(&url, t, r))).await;
        watchers.extend(opened);
    }
    let opened_in = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rss(serve.pid());
    let per = after.saturating_sub(before) as f64 / WS_WATCHERS as f64;
    println!(
        "  server RSS {:.1} MiB before, {:.1} MiB with {} watchers: {:.1} KiB per idle watcher \
         (opened and subscribed in {})",
        before as f64 / 1048576.0,
        after as f64 / 1048576.0,
        watchers.len(),
        per / 1024.0,
        ms(opened_in)
    );
    drop(watchers);
}
