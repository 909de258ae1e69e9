//! What a scenario costs on AWS: every DynamoDB, SQS and Lambda operation it makes,
//! counted where it happens and priced as AWS bills it on demand in us-east-1.
//!
//! - [`DynamoMeter`]: an SDK interceptor on a [`DynamoStore`]'s client. It logs every
//!   operation the store sends (by name, with what it names), asks for
//!   `ReturnConsumedCapacity=INDEXES` on every operation that takes it, and keeps what
//!   DynamoDB answered. [`MeterLog::bill_calls`] then bills each call with DynamoDB's own
//!   sizing rules ([`item_size`]) — writes 1 WRU per started KB per item and per index
//!   entry, transactional writes double (ConditionCheck items included), reads 1 RRU per
//!   started 4 KB strongly consistent, ½ eventually consistent, 2 per item in
//!   `TransactGetItems`, a `Query` on the total it read — and takes the larger of that
//!   model and the capacity DynamoDB reported for the call. The report alone is not
//!   enough: DynamoDB Local reports nothing for a read that finds nothing (AWS bills the
//!   minimum), and older versions of it do not double transactional writes.
//! - [`CountingTimers`] / [`CountingHandler`]: the timer port and its consumer, counted.
//!   A scheduled timer is one SQS `SendMessage`; a delivered one is one `ReceiveMessage`
//!   and one `DeleteMessage` (the event source mapping) and one invocation of the
//!   `timers` function.
//! - [`Meter`]: the three together plus the HTTP requests a client makes (one API
//!   Gateway HTTP API request and one Lambda invocation each); [`Meter::bill`] prices
//!   them into a [`Bill`].
//!
//! Prices are constants with their source date ([`prices`]); free tiers are ignored.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use aws_sdk_dynamodb::config::interceptors::{
    BeforeSerializationInterceptorContextMut, BeforeTransmitInterceptorContextRef,
    FinalizerInterceptorContextRef,
};
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::operation::batch_get_item::{BatchGetItemInput, BatchGetItemOutput};
use aws_sdk_dynamodb::operation::batch_write_item::{BatchWriteItemInput, BatchWriteItemOutput};
use aws_sdk_dynamodb::operation::delete_item::{DeleteItemInput, DeleteItemOutput};
use aws_sdk_dynamodb::operation::get_item::{GetItemInput, GetItemOutput};
use aws_sdk_dynamodb::operation::put_item::{PutItemInput, PutItemOutput};
use aws_sdk_dynamodb::operation::query::{QueryInput, QueryOutput};
use aws_sdk_dynamodb::operation::scan::{ScanInput, ScanOutput};
use aws_sdk_dynamodb::operation::transact_get_items::{
    TransactGetItemsInput, TransactGetItemsOutput,
};
use aws_sdk_dynamodb::operation::transact_write_items::{
    TransactWriteItemsInput, TransactWriteItemsOutput,
};
use aws_sdk_dynamodb::operation::update_item::{UpdateItemInput, UpdateItemOutput};
use aws_sdk_dynamodb::types::{
    AttributeValue, ConsumedCapacity, ReturnConsumedCapacity, ReturnValue, TransactWriteItem,
};
use aws_smithy_types::config_bag::{Storable, StoreReplace};
use tollgate_store::dynamo::{DynamoStore, Tables};
use tollgate_timers::{TimerError, TimerHandler, TimerMessage, TimerQueue};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

// ---------------------------------------------------------------------------- prices

/// On-demand prices in us-east-1, free tiers ignored. Source: the AWS pricing pages of
/// each service (aws.amazon.com/{dynamodb/pricing/on-demand, sqs/pricing, lambda/pricing,
/// api-gateway/pricing}); DynamoDB's are those of its on-demand price cut effective
/// 2024-11-01, the others unchanged since well before that date.
pub mod prices {
    /// The date the constants below are taken as of.
    pub const AS_OF: &str = "2024-11-01";
    /// DynamoDB on-demand, standard table class: $0.625 per million write request units.
    pub const DYNAMODB_WRU_USD: f64 = 0.625e-6;
    /// DynamoDB on-demand, standard table class: $0.125 per million read request units.
    pub const DYNAMODB_RRU_USD: f64 = 0.125e-6;
    /// SQS standard queue: $0.40 per million requests (each 64 KB chunk of a payload is
    /// one request; timer messages are far smaller).
    pub const SQS_REQUEST_USD: f64 = 0.40e-6;
    /// Lambda: $0.20 per million requests.
    pub const LAMBDA_REQUEST_USD: f64 = 0.20e-6;
    /// Lambda on x86_64: $0.0000166667 per GB-second (arm64, the template's default, is
    /// $0.0000133334: x86_64 is the upper bound).
    pub const LAMBDA_GB_SECOND_USD: f64 = 0.000_016_666_7;
    /// API Gateway HTTP API: $1.00 per million requests (first 300 million a month).
    pub const HTTP_API_REQUEST_USD: f64 = 1.00e-6;
}

/// What one Lambda invocation is taken to cost in compute, for want of a measurement on
/// AWS: the template's `MemorySize` and an assumed billed duration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LambdaAssumption {
    pub memory_mb: u32,
    /// Billed duration of one warm invocation.
    pub billed_ms: u32,
}

impl Default for LambdaAssumption {
    /// 256 MB (`MemorySize` in `infra/template.yaml`) × 50 ms: a warm invocation making
    /// up to three DynamoDB round trips of ~10 ms in-region plus its own work, rounded
    /// up. Cold starts (their INIT phase) are left out: they are shared by many
    /// lifecycles.
    fn default() -> Self {
        Self {
            memory_mb: 256,
            billed_ms: 50,
        }
    }
}

impl LambdaAssumption {
    pub fn gb_seconds_per_invocation(&self) -> f64 {
        self.memory_mb as f64 / 1024.0 * self.billed_ms as f64 / 1000.0
    }
}

// ------------------------------------------------------------------------- item sizes

pub type Item = HashMap<String, AttributeValue>;

/// DynamoDB's size of a number: 1 byte per two significant digits, plus 1.
pub fn number_size(n: &str) -> usize {
    let mantissa = n.split(['e', 'E']).next().unwrap_or("");
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let significant = digits.trim_start_matches('0').trim_end_matches('0').len();
    significant.max(1).div_ceil(2) + 1
}

/// DynamoDB's size of one attribute value (without its name).
pub fn value_size(v: &AttributeValue) -> usize {
    match v {
        AttributeValue::S(s) => s.len(),
        AttributeValue::N(n) => number_size(n),
        AttributeValue::B(b) => b.as_ref().len(),
        AttributeValue::Bool(_) | AttributeValue::Null(_) => 1,
        AttributeValue::Ss(v) => v.iter().map(String::len).sum(),
        AttributeValue::Ns(v) => v.iter().map(|n| number_size(n)).sum(),
        AttributeValue::Bs(v) => v.iter().map(|b| b.as_ref().len()).sum(),
        AttributeValue::L(v) => 3 + v.iter().map(|e| 1 + value_size(e)).sum::<usize>(),
        AttributeValue::M(m) => {
            3 + m
                .iter()
                .map(|(k, e)| 1 + k.len() + value_size(e))
                .sum::<usize>()
        }
        _ => 0,
    }
}

/// DynamoDB's item size: the attribute names' UTF-8 lengths plus the values' sizes.
pub fn item_size(item: &Item) -> usize {
    item.iter().map(|(k, v)| k.len() + value_size(v)).sum()
}

/// Units of `unit` bytes, rounded up per item (a write of 0 bytes still costs one).
pub fn units(bytes: usize, unit: usize) -> u64 {
    bytes.max(1).div_ceil(unit) as u64
}

// ----------------------------------------------------------------------------- tables

/// One secondary index as the template declares it.
#[derive(Debug, Clone)]
pub struct IndexInfo {
    pub name: String,
    pub key: Vec<String>,
    /// `ProjectionType: ALL` (an index entry is the whole item).
    pub all: bool,
}

/// One table as the template declares it: what its items are, key, indexes.
#[derive(Debug, Clone)]
pub struct TableInfo {
    pub label: &'static str,
    pub key: Vec<String>,
    pub indexes: Vec<IndexInfo>,
}

/// Physical table name → its definition, from the deployment template.
pub fn table_infos(tables: &Tables) -> HashMap<String, TableInfo> {
    use tollgate_store::schema::{physical_name, table_defs, TEMPLATE};
    let defs = table_defs(TEMPLATE).expect("the template's tables");
    let names = |pairs: Vec<(String, String)>| pairs.into_iter().map(|(a, _)| a).collect();
    defs.into_iter()
        .filter_map(|def| {
            let physical = physical_name(tables, &def.logical_id)?;
            let label = match def.logical_id.as_str() {
                "RunsTable" => "head",
                "EventsTable" => "event",
                "ApprovalsTable" => "card",
                "PoliciesTable" => "policy",
                "MutationsTable" => "mutation",
                _ => "item",
            };
            let indexes = def
                .local_indexes
                .into_iter()
                .chain(def.global_indexes)
                .map(|(name, key, projection)| IndexInfo {
                    name,
                    key: names(key),
                    all: projection == "ALL",
                })
                .collect();
            Some((
                physical,
                TableInfo {
                    label,
                    key: names(def.key),
                    indexes,
                },
            ))
        })
        .collect()
}

/// The last known image of items, by [`model_key`].
pub type Model = HashMap<String, Item>;

/// `table|key attribute values…`: one item of one table.
pub fn model_key(info: &TableInfo, table: &str, attrs: &Item) -> String {
    let mut key = table.to_owned();
    for name in &info.key {
        key.push_str(&format!("|{:?}", attrs.get(name)));
    }
    key
}

/// What an item is, for the tables: its table's label, `route` for a coordinator's route
/// item, and `coordinator head`/`coordinator event` on a run in `coordinators`.
fn item_label(info: &TableInfo, attrs: &Item, coordinators: &HashSet<String>) -> String {
    let mut label = info.label.to_owned();
    if let Some(AttributeValue::S(k)) = attrs.get("item_key") {
        if k.starts_with("route#") {
            label = "route".into();
        }
    }
    if let Some(AttributeValue::S(run)) = attrs.get("run_id") {
        if coordinators.contains(run) && (label == "head" || label == "event") {
            label = format!("coordinator {label}");
        }
    }
    label
}

// ------------------------------------------------------------------------ write bills

/// One item of a write as AWS bills it.
#[derive(Debug, Clone)]
pub struct ItemBill {
    pub label: String,
    pub op: &'static str,
    /// The larger of the item before and after the write.
    pub bytes: usize,
    /// Write units: 1 per started KB, 2 in a transaction.
    pub wcu: u64,
}

/// One write call (a transaction, or a single- or batch-item write) as AWS bills it.
#[derive(Debug, Clone, Default)]
pub struct TxBill {
    pub items: Vec<ItemBill>,
    /// Index name → KB-units of each index entry written (1 per started KB; a moved
    /// entry is a delete plus a put). Not multiplied for transactions: see
    /// [`TxBill::index_multiplier`].
    pub index: Vec<(String, u64)>,
}

impl TxBill {
    /// How AWS is taken to bill a transaction's index entries: doubled like its items
    /// (the upper bound of the two readings of the price page).
    pub fn index_multiplier(transactional: bool) -> u64 {
        if transactional {
            2
        } else {
            1
        }
    }
}

/// One item written, as a write names it.
#[derive(Debug, Clone, Copy)]
pub struct Written<'a> {
    /// `Put`, `Update`, `Delete` or `ConditionCheck`.
    pub op: &'static str,
    pub table: &'a str,
    /// A `Put`'s item, the key otherwise.
    pub attrs: &'a Item,
    /// The item's images before and after the write (`None`: absent or unknown).
    pub before: Option<&'a Item>,
    pub after: Option<&'a Item>,
}

/// Bills one item written, `multiplier` 2 in a transaction, into `out`. Index entries
/// are sized as the whole item (exact for `ALL` projections, every index of the
/// template).
pub fn bill_item<'a>(
    tables: &HashMap<String, TableInfo>,
    coordinators: &HashSet<String>,
    w: Written<'a>,
    multiplier: u64,
    out: &mut TxBill,
) {
    let Written {
        op,
        table,
        attrs,
        before,
        after,
    } = w;
    let Some(info) = tables.get(table) else {
        // A table outside the template (the bench's baselines): sized from what it names.
        out.items.push(ItemBill {
            label: "item".into(),
            op,
            bytes: item_size(attrs),
            wcu: multiplier * units(item_size(attrs), 1024),
        });
        return;
    };
    let bytes = before
        .map(item_size)
        .unwrap_or(0)
        .max(after.map(item_size).unwrap_or(0));
    out.items.push(ItemBill {
        label: item_label(info, attrs, coordinators),
        op,
        bytes,
        wcu: multiplier * units(bytes, 1024),
    });
    for index in &info.indexes {
        let in_index =
            |i: Option<&'a Item>| i.filter(|i| index.key.iter().all(|k| i.contains_key(k)));
        let entries: Vec<usize> = match (in_index(before), in_index(after)) {
            (None, None) => vec![],
            (None, Some(a)) => vec![item_size(a)],
            (Some(b), None) => vec![item_size(b)],
            (Some(b), Some(a)) if index.key.iter().any(|k| b.get(k) != a.get(k)) => {
                vec![item_size(b), item_size(a)] // the entry moves: delete + put
            }
            (Some(b), Some(a)) if b != a => vec![item_size(b).max(item_size(a))],
            _ => vec![],
        };
        let name = if index.all {
            index.name.clone()
        } else {
            format!("{} (not ALL: sized as the whole item)", index.name)
        };
        for size in entries {
            out.index.push((name.clone(), units(size, 1024)));
        }
    }
}

/// Bills one transaction from the items it names, their images before (`pre`) and after
/// (`post`; a `Put`'s own item), with DynamoDB's sizing rules: 2 write units per started
/// KB per item.
pub fn bill<'a>(
    tables: &HashMap<String, TableInfo>,
    coordinators: &HashSet<String>,
    tx: &'a [TransactWriteItem],
    pre: &'a Model,
    post: &'a Model,
) -> TxBill {
    let mut out = TxBill::default();
    for w in tx {
        let Some((op, table, attrs)) = transact_write_parts(w) else {
            continue;
        };
        let Some(info) = tables.get(table) else {
            let w = Written {
                op,
                table,
                attrs,
                before: None,
                after: Some(attrs),
            };
            bill_item(tables, coordinators, w, 2, &mut out);
            continue;
        };
        let key = model_key(info, table, attrs);
        let before = pre.get(&key);
        let after = match op {
            "Put" => Some(attrs),
            "Delete" => None,
            "ConditionCheck" => before,
            _ => post.get(&key),
        };
        let w = Written {
            op,
            table,
            attrs,
            before,
            after,
        };
        bill_item(tables, coordinators, w, 2, &mut out);
    }
    out
}

/// `(op, table, item or key)` of one transaction item.
fn transact_write_parts(w: &TransactWriteItem) -> Option<(&'static str, &str, &Item)> {
    if let Some(p) = w.put() {
        Some(("Put", p.table_name(), p.item()))
    } else if let Some(u) = w.update() {
        Some(("Update", u.table_name(), u.key()))
    } else if let Some(d) = w.delete() {
        Some(("Delete", d.table_name(), d.key()))
    } else {
        w.condition_check()
            .map(|c| ("ConditionCheck", c.table_name(), c.key()))
    }
}

// ------------------------------------------------------------------------ the meter

/// What one DynamoDB call asked for, as far as billing needs it.
#[derive(Debug, Clone)]
pub enum CallRequest {
    GetItem {
        table: String,
        key: Item,
        consistent: bool,
        /// A projection: the item returned is part of the item billed.
        partial: bool,
    },
    BatchGetItem {
        /// `(table, key, consistent)` per key asked for.
        keys: Vec<(String, Item, bool)>,
        partial: bool,
    },
    Query {
        table: String,
        index: Option<String>,
        consistent: bool,
        partial: bool,
    },
    Scan {
        table: String,
        index: Option<String>,
        consistent: bool,
        partial: bool,
    },
    TransactGetItems {
        /// `(table, key)` per item, in order; `partial` when any has a projection.
        keys: Vec<(String, Item)>,
        partial: bool,
    },
    PutItem {
        table: String,
        item: Item,
    },
    UpdateItem {
        table: String,
        key: Item,
        /// `ReturnValues` (ALL_NEW tells the image after).
        returns: Option<ReturnValue>,
    },
    DeleteItem {
        table: String,
        key: Item,
    },
    BatchWriteItem {
        /// `(table, item)` of each put, `(table, key)` of each delete.
        puts: Vec<(String, Item)>,
        deletes: Vec<(String, Item)>,
    },
    TransactWriteItems {
        items: Vec<TransactWriteItem>,
    },
    /// Control plane (`DescribeTable`, …): not billed per request.
    Other,
}

/// What DynamoDB answered, as far as billing needs it.
#[derive(Debug, Clone, Default)]
pub struct CallResponse {
    /// Items returned, `(table, item)` (reads; a write's `ReturnValues`).
    pub items: Vec<(String, Item)>,
    /// `(table, key)` asked for and found absent (GetItem, BatchGetItem, TransactGet).
    pub absent: Vec<(String, Item)>,
    /// BatchGetItem / BatchWriteItem: how many keys or items came back unprocessed.
    pub unprocessed: usize,
    /// Query / Scan: items examined before a filter (billed on those).
    pub scanned: usize,
    /// TransactGetItems: each item asked for, in order, as answered.
    ordered: Vec<Option<Item>>,
    /// BatchGetItem: the keys that came back unprocessed.
    unprocessed_keys: Vec<(String, Item)>,
}

/// One DynamoDB operation the metered client made.
#[derive(Debug, Clone)]
pub struct Call {
    /// The operation, e.g. `TransactWriteItems`.
    pub operation: String,
    pub request: CallRequest,
    /// Ticks of the log's clock when the call started and ended (orders the images).
    pub started: u64,
    pub ended: Option<u64>,
    /// HTTP requests sent for it (SDK retries included).
    pub attempts: u32,
    /// `None` while in flight or failed.
    pub response: Option<CallResponse>,
    pub failed: bool,
    /// What DynamoDB reported (`ReturnConsumedCapacity`), when asked.
    pub consumed: Vec<ConsumedCapacity>,
}

impl Call {
    /// Read, write or neither.
    pub fn kind(&self) -> CallKind {
        match self.request {
            CallRequest::GetItem { .. }
            | CallRequest::BatchGetItem { .. }
            | CallRequest::Query { .. }
            | CallRequest::Scan { .. }
            | CallRequest::TransactGetItems { .. } => CallKind::Read,
            CallRequest::PutItem { .. }
            | CallRequest::UpdateItem { .. }
            | CallRequest::DeleteItem { .. }
            | CallRequest::BatchWriteItem { .. }
            | CallRequest::TransactWriteItems { .. } => CallKind::Write,
            CallRequest::Other => CallKind::Free,
        }
    }

    /// The capacity DynamoDB reported for the call, if it reported any.
    pub fn reported_units(&self) -> Option<f64> {
        if self.consumed.is_empty() {
            return None;
        }
        Some(
            self.consumed
                .iter()
                .map(|c| c.capacity_units().unwrap_or(0.0))
                .sum(),
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum CallKind {
    Read,
    Write,
    Free,
}

/// What the metered client sent since the last [`DynamoMeter::take`].
#[derive(Debug, Default, Clone)]
pub struct MeterLog {
    /// One entry per HTTP request sent (SDK resends included): the operation from
    /// `X-Amz-Target` and the kind of item it names, e.g. `GetItem(card)`.
    pub sent: Vec<String>,
    /// Every call, by start order.
    pub calls: BTreeMap<u64, Call>,
    /// A logical clock: one tick at each call's start and end.
    clock: u64,
}

impl MeterLog {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Every `TransactWriteItems` call's items, as the store built them.
    pub fn transactions(&self) -> impl Iterator<Item = &[TransactWriteItem]> {
        self.calls.values().filter_map(|c| match &c.request {
            CallRequest::TransactWriteItems { items } => Some(items.as_slice()),
            _ => None,
        })
    }

    /// The `ConsumedCapacity` entries of every `TransactWriteItems` answer (when asked).
    pub fn transaction_capacity(&self) -> impl Iterator<Item = &ConsumedCapacity> {
        self.calls
            .values()
            .filter(|c| matches!(c.request, CallRequest::TransactWriteItems { .. }))
            .flat_map(|c| &c.consumed)
    }

    /// Calls per operation name.
    pub fn operations(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for c in self.calls.values() {
            *out.entry(c.operation.clone()).or_insert(0) += 1;
        }
        out
    }

    /// Every item a write named, `(table, item or key)` (for [`DynamoMeter::final_images`]).
    fn written(&self) -> Vec<(String, Item)> {
        let mut out = Vec::new();
        for c in self.calls.values() {
            match &c.request {
                CallRequest::PutItem { table, item } => out.push((table.clone(), item.clone())),
                CallRequest::UpdateItem { table, key, .. }
                | CallRequest::DeleteItem { table, key } => out.push((table.clone(), key.clone())),
                CallRequest::BatchWriteItem { puts, deletes } => {
                    out.extend(puts.iter().chain(deletes).cloned())
                }
                CallRequest::TransactWriteItems { items } => out.extend(
                    items
                        .iter()
                        .filter_map(transact_write_parts)
                        .map(|(_, t, a)| (t.to_owned(), a.clone())),
                ),
                _ => {}
            }
        }
        out
    }

    /// Bills every call ended so far. `finals`: each written item's image after
    /// everything (read by [`DynamoMeter::final_images`]), by [`model_key`].
    pub fn bill_calls(
        &self,
        tables: &HashMap<String, TableInfo>,
        finals: &HashMap<String, Option<Item>>,
    ) -> Vec<CallBill> {
        let images = Images::observe(self, tables, finals);
        let none = HashSet::new();
        self.calls
            .values()
            .filter(|c| c.ended.is_some())
            .map(|c| bill_call(c, tables, &images, &none))
            .collect()
    }
}

/// Every image of every item the log saw, in the log's clock order: items read (whole
/// ones), items put, deletions, the final images.
struct Images {
    by_key: HashMap<String, Vec<(u64, Option<Item>)>>,
}

impl Images {
    fn observe(
        log: &MeterLog,
        tables: &HashMap<String, TableInfo>,
        finals: &HashMap<String, Option<Item>>,
    ) -> Self {
        let mut by_key: HashMap<String, Vec<(u64, Option<Item>)>> = HashMap::new();
        let mut see = |table: &str, attrs: &Item, at: u64, image: Option<Item>| {
            if let Some(info) = tables.get(table) {
                by_key
                    .entry(model_key(info, table, attrs))
                    .or_default()
                    .push((at, image));
            }
        };
        for c in log.calls.values() {
            let (Some(at), Some(resp)) = (c.ended, &c.response) else {
                continue;
            };
            let whole = !matches!(
                c.request,
                CallRequest::GetItem { partial: true, .. }
                    | CallRequest::BatchGetItem { partial: true, .. }
                    | CallRequest::Query { partial: true, .. }
                    | CallRequest::Scan { partial: true, .. }
                    | CallRequest::TransactGetItems { partial: true, .. }
            );
            let returned_new = matches!(
                c.request,
                CallRequest::UpdateItem {
                    returns: Some(ReturnValue::AllNew),
                    ..
                }
            );
            if (c.kind() == CallKind::Read && whole) || returned_new {
                for (table, item) in &resp.items {
                    see(table, item, at, Some(item.clone()));
                }
            }
            for (table, key) in &resp.absent {
                see(table, key, at, None);
            }
            match &c.request {
                CallRequest::PutItem { table, item } => see(table, item, at, Some(item.clone())),
                CallRequest::DeleteItem { table, key } => see(table, key, at, None),
                CallRequest::BatchWriteItem { puts, deletes } if resp.unprocessed == 0 => {
                    for (table, item) in puts {
                        see(table, item, at, Some(item.clone()));
                    }
                    for (table, key) in deletes {
                        see(table, key, at, None);
                    }
                }
                CallRequest::TransactWriteItems { items } => {
                    for w in items {
                        if let Some(p) = w.put() {
                            see(p.table_name(), p.item(), at, Some(p.item().clone()));
                        } else if let Some(d) = w.delete() {
                            see(d.table_name(), d.key(), at, None);
                        }
                    }
                }
                _ => {}
            }
        }
        for (key, image) in finals {
            by_key
                .entry(key.clone())
                .or_default()
                .push((u64::MAX, image.clone()));
        }
        for seen in by_key.values_mut() {
            seen.sort_by_key(|(at, _)| *at);
        }
        Self { by_key }
    }

    /// The item's last image seen before tick `at` (`None`: absent, or never seen).
    fn before(&self, key: &str, at: u64) -> Option<&Item> {
        self.by_key
            .get(key)?
            .iter()
            .rev()
            .find(|(t, _)| *t < at)
            .and_then(|(_, i)| i.as_ref())
    }

    /// The item's first image seen after tick `at`.
    fn after(&self, key: &str, at: u64) -> Option<&Item> {
        self.by_key
            .get(key)?
            .iter()
            .find(|(t, _)| *t > at)
            .and_then(|(_, i)| i.as_ref())
    }
}

/// One call as AWS bills it.
#[derive(Debug, Clone)]
pub struct CallBill {
    pub operation: String,
    pub kind: CallKind,
    /// Request units by the model (RRU for reads, WRU for writes).
    pub model: f64,
    /// What DynamoDB reported, when it did.
    pub reported: Option<f64>,
    /// Where the model's units come from, e.g. `("event Put", 2.0)`, `("index by_sequence", 2.0)`.
    pub parts: Vec<(String, f64)>,
    pub failed: bool,
    pub attempts: u32,
}

impl CallBill {
    /// What AWS bills: the larger of the model and the report.
    pub fn billed(&self) -> f64 {
        self.model.max(self.reported.unwrap_or(0.0))
    }

    /// The report exceeded the model.
    pub fn reported_won(&self) -> bool {
        self.reported.is_some_and(|r| r > self.model)
    }
}

fn bill_call(
    c: &Call,
    tables: &HashMap<String, TableInfo>,
    images: &Images,
    coordinators: &HashSet<String>,
) -> CallBill {
    let ended = c.ended.unwrap_or(u64::MAX);
    let key_of = |table: &str, attrs: &Item| tables.get(table).map(|i| model_key(i, table, attrs));
    // The size a read is billed on: the whole item (a projection returns part of it).
    let read_size = |table: &str, item: &Item, partial: bool| -> usize {
        let returned = item_size(item);
        if !partial {
            return returned;
        }
        key_of(table, item)
            .and_then(|k| {
                images
                    .before(&k, ended)
                    .or_else(|| images.after(&k, ended))
                    .map(item_size)
            })
            .unwrap_or(returned)
            .max(returned)
    };
    let label = |table: &str| tables.get(table).map_or("item", |t| t.label);
    let factor = |consistent: bool| if consistent { 1.0 } else { 0.5 };
    let empty = CallResponse::default();
    let resp = c.response.as_ref().unwrap_or(&empty);
    let mut parts: Vec<(String, f64)> = Vec::new();
    match &c.request {
        CallRequest::GetItem {
            table,
            consistent,
            partial,
            ..
        } => {
            let bytes = resp
                .items
                .first()
                .map_or(0, |(t, i)| read_size(t, i, *partial));
            parts.push((
                label(table).to_owned(),
                units(bytes, 4096) as f64 * factor(*consistent),
            ));
        }
        CallRequest::BatchGetItem { keys, partial } => {
            // Each key is read as one GetItem: rounded per item, absent ones cost the minimum.
            let consistent: HashMap<&str, bool> =
                keys.iter().map(|(t, _, c)| (t.as_str(), *c)).collect();
            for (table, item) in &resp.items {
                let c = consistent.get(table.as_str()).copied().unwrap_or(true);
                parts.push((
                    label(table).to_owned(),
                    units(read_size(table, item, *partial), 4096) as f64 * factor(c),
                ));
            }
            for (table, _) in &resp.absent {
                let c = consistent.get(table.as_str()).copied().unwrap_or(true);
                parts.push((format!("{} (absent)", label(table)), factor(c)));
            }
        }
        CallRequest::Query {
            table,
            index,
            consistent,
            partial,
        }
        | CallRequest::Scan {
            table,
            index,
            consistent,
            partial,
        } => {
            // Billed on the total size read, rounded once. Items a filter dropped are not
            // seen here: DynamoDB's report covers them (billed = max).
            let bytes: usize = resp
                .items
                .iter()
                .map(|(t, i)| read_size(t, i, *partial))
                .sum();
            let what = match index {
                Some(ix) => format!("{} via {ix}", label(table)),
                None => label(table).to_owned(),
            };
            parts.push((what, units(bytes, 4096) as f64 * factor(*consistent)));
        }
        CallRequest::TransactGetItems { keys, partial } => {
            // 2 read units per started 4 KB per item, found or not.
            for (table, key) in keys {
                let found = resp.items.iter().find(|(t, i)| {
                    t == table && key_of(t, i).is_some() && key_of(t, i) == key_of(table, key)
                });
                let bytes = found.map_or(0, |(t, i)| read_size(t, i, *partial));
                parts.push((label(table).to_owned(), 2.0 * units(bytes, 4096) as f64));
            }
        }
        CallRequest::PutItem { table, item } => {
            let k = key_of(table, item);
            let before = k.as_deref().and_then(|k| images.before(k, c.started));
            write_parts(
                tables,
                coordinators,
                Written {
                    op: "Put",
                    table,
                    attrs: item,
                    before,
                    after: Some(item),
                },
                1,
                &mut parts,
            );
        }
        CallRequest::UpdateItem { table, key, .. } => {
            let k = key_of(table, key);
            let before = k.as_deref().and_then(|k| images.before(k, c.started));
            let after = k.as_deref().and_then(|k| images.after(k, ended)).or(before);
            write_parts(
                tables,
                coordinators,
                Written {
                    op: "Update",
                    table,
                    attrs: key,
                    before,
                    after,
                },
                1,
                &mut parts,
            );
        }
        CallRequest::DeleteItem { table, key } => {
            let k = key_of(table, key);
            let before = k.as_deref().and_then(|k| images.before(k, c.started));
            write_parts(
                tables,
                coordinators,
                Written {
                    op: "Delete",
                    table,
                    attrs: key,
                    before,
                    after: None,
                },
                1,
                &mut parts,
            );
        }
        CallRequest::BatchWriteItem { puts, deletes } => {
            for (table, item) in puts {
                let k = key_of(table, item);
                let before = k.as_deref().and_then(|k| images.before(k, c.started));
                write_parts(
                    tables,
                    coordinators,
                    Written {
                        op: "Put",
                        table,
                        attrs: item,
                        before,
                        after: Some(item),
                    },
                    1,
                    &mut parts,
                );
            }
            for (table, key) in deletes {
                let k = key_of(table, key);
                let before = k.as_deref().and_then(|k| images.before(k, c.started));
                write_parts(
                    tables,
                    coordinators,
                    Written {
                        op: "Delete",
                        table,
                        attrs: key,
                        before,
                        after: None,
                    },
                    1,
                    &mut parts,
                );
            }
        }
        CallRequest::TransactWriteItems { items } => {
            for w in items {
                let Some((op, table, attrs)) = transact_write_parts(w) else {
                    continue;
                };
                let k = key_of(table, attrs);
                let before = k.as_deref().and_then(|k| images.before(k, c.started));
                let after = match op {
                    "Put" => Some(attrs),
                    "Delete" => None,
                    "ConditionCheck" => before,
                    _ => k.as_deref().and_then(|k| images.after(k, ended)).or(before),
                };
                write_parts(
                    tables,
                    coordinators,
                    Written {
                        op,
                        table,
                        attrs,
                        before,
                        after,
                    },
                    2,
                    &mut parts,
                );
            }
        }
        CallRequest::Other => {}
    }
    CallBill {
        operation: c.operation.clone(),
        kind: c.kind(),
        model: parts.iter().map(|(_, u)| u).sum(),
        reported: c.reported_units(),
        parts,
        failed: c.failed,
        attempts: c.attempts,
    }
}

fn write_parts(
    tables: &HashMap<String, TableInfo>,
    coordinators: &HashSet<String>,
    w: Written<'_>,
    multiplier: u64,
    parts: &mut Vec<(String, f64)>,
) {
    let mut b = TxBill::default();
    bill_item(tables, coordinators, w, multiplier, &mut b);
    for i in b.items {
        parts.push((format!("{} {}", i.label, i.op), i.wcu as f64));
    }
    let m = TxBill::index_multiplier(multiplier > 1);
    for (name, u) in b.index {
        parts.push((format!("index {name}"), (m * u) as f64));
    }
}

/// Which call an SDK operation is, across the interceptor's hooks.
#[derive(Debug, Clone, Copy)]
struct CallId(u64);

impl Storable for CallId {
    type Storer = StoreReplace<Self>;
}

/// An SDK interceptor that logs every DynamoDB operation of the client it is registered
/// on (see the module docs). Cheap to clone; all clones are one log.
#[derive(Debug, Clone)]
pub struct DynamoMeter {
    log: Arc<Mutex<MeterLog>>,
    /// Physical table name → its definition (labels, keys, indexes).
    tables: Arc<HashMap<String, TableInfo>>,
    /// Sets `ReturnConsumedCapacity=INDEXES` on every operation that takes it.
    ask_capacity: Arc<AtomicBool>,
    next_id: Arc<AtomicU64>,
}

impl DynamoMeter {
    /// A meter for the tables `tables` names; asks for consumed capacity.
    pub fn new(tables: &Tables) -> Self {
        Self {
            log: Arc::default(),
            tables: Arc::new(table_infos(tables)),
            ask_capacity: Arc::new(AtomicBool::new(true)),
            next_id: Arc::default(),
        }
    }

    /// A store on the same tables and settings whose client carries this meter (its own
    /// client: lanes and remembered heads start empty).
    pub fn instrument(&self, store: &DynamoStore) -> DynamoStore {
        let config = store
            .client()
            .config()
            .to_builder()
            .interceptor(self.clone())
            .build();
        DynamoStore::new(
            aws_sdk_dynamodb::Client::from_conf(config),
            store.tables().clone(),
        )
    }

    pub fn tables(&self) -> &HashMap<String, TableInfo> {
        &self.tables
    }

    /// Whether to ask DynamoDB for the capacity of each call (on by default; a benchmark
    /// timing calls may turn it off).
    pub fn set_ask_capacity(&self, ask: bool) {
        self.ask_capacity.store(ask, Ordering::Relaxed);
    }

    fn lock(&self) -> MutexGuard<'_, MeterLog> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What was sent since the last take, and forgets it.
    pub fn take(&self) -> MeterLog {
        let mut log = self.lock();
        let clock = log.clock;
        let taken = std::mem::take(&mut *log);
        log.clock = clock;
        taken
    }

    /// A copy of what was sent since the last take.
    pub fn snapshot(&self) -> MeterLog {
        self.lock().clone()
    }

    /// The stored image of every item `log` wrote, read now through `plain` (a client
    /// without this meter), by [`model_key`]: the image after a write nobody read back.
    pub async fn final_images(
        &self,
        plain: &aws_sdk_dynamodb::Client,
        log: &MeterLog,
    ) -> HashMap<String, Option<Item>> {
        let mut out = HashMap::new();
        for (table, attrs) in log.written() {
            let Some(info) = self.tables.get(&table) else {
                continue;
            };
            let key = model_key(info, &table, &attrs);
            if out.contains_key(&key) {
                continue;
            }
            let item_key: Item = info
                .key
                .iter()
                .filter_map(|k| Some((k.clone(), attrs.get(k)?.clone())))
                .collect();
            let stored = plain
                .get_item()
                .table_name(&table)
                .set_key(Some(item_key))
                .consistent_read(true)
                .send()
                .await
                .expect("GetItem of an item written")
                .item;
            out.insert(key, stored);
        }
        out
    }
}

impl Intercept for DynamoMeter {
    fn name(&self) -> &'static str {
        "tollgate-dynamo-meter"
    }

    fn modify_before_serialization(
        &self,
        context: &mut BeforeSerializationInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let ask = self
            .ask_capacity
            .load(Ordering::Relaxed)
            .then_some(ReturnConsumedCapacity::Indexes);
        let input = context.input_mut();
        let (operation, request) = if let Some(i) = input.downcast_mut::<GetItemInput>() {
            if ask.is_some() {
                i.return_consumed_capacity = ask;
            }
            (
                "GetItem",
                CallRequest::GetItem {
                    table: i.table_name.clone().unwrap_or_default(),
                    key: i.key.clone().unwrap_or_default(),
                    consistent: i.consistent_read == Some(true),
                    partial: i.projection_expression.is_some() || i.attributes_to_get.is_some(),
                },
            )
        } else if let Some(i) = input.downcast_mut::<BatchGetItemInput>() {
            if ask.is_some() {
                i.return_consumed_capacity = ask;
            }
            let requests = i.request_items.clone().unwrap_or_default();
            let partial = requests
                .values()
                .any(|r| r.projection_expression.is_some() || r.attributes_to_get.is_some());
            let keys = requests
                .into_iter()
                .flat_map(|(table, r)| {
                    let consistent = r.consistent_read == Some(true);
                    r.keys
                        .into_iter()
                        .map(move |k| (table.clone(), k, consistent))
                })
                .collect();
            ("BatchGetItem", CallRequest::BatchGetItem { keys, partial })
        } else if let Some(i) = input.downcast_mut::<QueryInput>() {
            if ask.is_some() {
                i.return_consumed_capacity = ask;
            }
            (
                "Query",
                CallRequest::Query {
                    table: i.table_name.clone().unwrap_or_default(),
                    index: i.index_name.clone(),
                    consistent: i.consistent_read == Some(true),
                    partial: i.projection_expression.is_some() || i.attributes_to_get.is_some(),
                },
            )
        } else if let Some(i) = input.downcast_mut::<ScanInput>() {
            if ask.is_some() {
                i.return_consumed_capacity = ask;
            }
            (
                "Scan",
                CallRequest::Scan {
                    table: i.table_name.clone().unwrap_or_default(),
                    index: i.index_name.clone(),
                    consistent: i.consistent_read == Some(true),
                    partial: i.projection_expression.is_some() || i.attributes_to_get.is_some(),
                },
            )
        } else if let Some(i) = input.downcast_mut::<TransactGetItemsInput>() {
            if ask.is_some() {
                i.return_consumed_capacity = ask;
            }
            let gets: Vec<_> = i
                .transact_items
                .iter()
                .flatten()
                .filter_map(|t| t.get.as_ref())
                .collect();
            (
                "TransactGetItems",
                CallRequest::TransactGetItems {
                    keys: gets
                        .iter()
                        .map(|g| (g.table_name.clone(), g.key.clone()))
                        .collect(),
                    partial: gets.iter().any(|g| g.projection_expression.is_some()),
                },
            )
        } else if let Some(i) = input.downcast_mut::<PutItemInput>() {
            if ask.is_some() {
                i.return_consumed_capacity = ask;
            }
            (
                "PutItem",
                CallRequest::PutItem {
                    table: i.table_name.clone().unwrap_or_default(),
                    item: i.item.clone().unwrap_or_default(),
                },
            )
        } else if let Some(i) = input.downcast_mut::<UpdateItemInput>() {
            if ask.is_some() {
                i.return_consumed_capacity = ask;
            }
            (
                "UpdateItem",
                CallRequest::UpdateItem {
                    table: i.table_name.clone().unwrap_or_default(),
                    key: i.key.clone().unwrap_or_default(),
                    returns: i.return_values.clone(),
                },
            )
        } else if let Some(i) = input.downcast_mut::<DeleteItemInput>() {
            if ask.is_some() {
                i.return_consumed_capacity = ask;
            }
            (
                "DeleteItem",
                CallRequest::DeleteItem {
                    table: i.table_name.clone().unwrap_or_default(),
                    key: i.key.clone().unwrap_or_default(),
                },
            )
        } else if let Some(i) = input.downcast_mut::<BatchWriteItemInput>() {
            if ask.is_some() {
                i.return_consumed_capacity = ask;
            }
            let (mut puts, mut deletes) = (Vec::new(), Vec::new());
            for (table, requests) in i.request_items.iter().flatten() {
                for r in requests {
                    if let Some(p) = &r.put_request {
                        puts.push((table.clone(), p.item.clone()));
                    }
                    if let Some(d) = &r.delete_request {
                        deletes.push((table.clone(), d.key.clone()));
                    }
                }
            }
            (
                "BatchWriteItem",
                CallRequest::BatchWriteItem { puts, deletes },
            )
        } else if let Some(i) = input.downcast_mut::<TransactWriteItemsInput>() {
            if ask.is_some() {
                i.return_consumed_capacity = ask;
            }
            (
                "TransactWriteItems",
                CallRequest::TransactWriteItems {
                    items: i.transact_items.clone().unwrap_or_default(),
                },
            )
        } else {
            // Named from `X-Amz-Target` when it is sent.
            ("", CallRequest::Other)
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        cfg.interceptor_state().store_put(CallId(id));
        let mut log = self.lock();
        let started = log.tick();
        log.calls.insert(
            id,
            Call {
                operation: operation.to_owned(),
                request,
                started,
                ended: None,
                attempts: 0,
                response: None,
                failed: false,
                consumed: Vec::new(),
            },
        );
        Ok(())
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        let op = request
            .headers()
            .get("x-amz-target")
            .and_then(|t| t.rsplit('.').next())
            .unwrap_or("unknown")
            .to_owned();
        let body: Option<serde_json::Value> = request
            .body()
            .bytes()
            .and_then(|b| serde_json::from_slice(b).ok());
        let label = body.as_ref().and_then(|b| {
            let table = b.get("TableName")?.as_str()?;
            let label = self.tables.get(table)?.label;
            let item_key = b.pointer("/Key/item_key/S").and_then(|k| k.as_str());
            Some(match item_key {
                Some(k) if k.starts_with("route#") => "route",
                _ => label,
            })
        });
        let sent = match label {
            Some(l) => format!("{op}({l})"),
            None => op.clone(),
        };
        let mut log = self.lock();
        log.sent.push(sent);
        if let Some(call) = cfg.load::<CallId>().and_then(|id| log.calls.get_mut(&id.0)) {
            call.attempts += 1;
            if call.operation.is_empty() {
                call.operation = op;
            }
        }
        Ok(())
    }

    fn read_after_execution(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let Some(id) = cfg.load::<CallId>().copied() else {
            return Ok(());
        };
        let answer = read_output(context.inner());
        let mut log = self.lock();
        let ended = log.tick();
        let Some(call) = log.calls.get_mut(&id.0) else {
            return Ok(()); // taken while in flight
        };
        call.ended = Some(ended);
        match answer {
            Some((mut response, consumed)) => {
                complete_response(&call.request, &mut response, &self.tables);
                call.response = Some(response);
                call.consumed = consumed;
            }
            None => call.failed = true,
        }
        if call.operation.is_empty() {
            call.operation = "unknown".into();
        }
        Ok(())
    }
}

/// The items and capacity of a successful answer (`None`: the call failed).
fn read_output(
    ctx: &aws_sdk_dynamodb::config::interceptors::InterceptorContext,
) -> Option<(CallResponse, Vec<ConsumedCapacity>)> {
    let output = ctx.output_or_error()?.ok()?;
    let mut r = CallResponse::default();
    let one = |c: &Option<ConsumedCapacity>| c.iter().cloned().collect::<Vec<_>>();
    let capacity = if let Some(o) = output.downcast_ref::<GetItemOutput>() {
        r.items.extend(o.item.clone().map(|i| (String::new(), i)));
        one(&o.consumed_capacity)
    } else if let Some(o) = output.downcast_ref::<BatchGetItemOutput>() {
        for (table, items) in o.responses.iter().flatten() {
            r.items
                .extend(items.iter().map(|i| (table.clone(), i.clone())));
        }
        for (table, k) in o.unprocessed_keys.iter().flatten() {
            r.unprocessed_keys
                .extend(k.keys.iter().map(|key| (table.clone(), key.clone())));
        }
        r.unprocessed = r.unprocessed_keys.len();
        o.consumed_capacity.clone().unwrap_or_default()
    } else if let Some(o) = output.downcast_ref::<QueryOutput>() {
        r.items = o
            .items
            .iter()
            .flatten()
            .map(|i| (String::new(), i.clone()))
            .collect();
        r.scanned = o.scanned_count as usize;
        one(&o.consumed_capacity)
    } else if let Some(o) = output.downcast_ref::<ScanOutput>() {
        r.items = o
            .items
            .iter()
            .flatten()
            .map(|i| (String::new(), i.clone()))
            .collect();
        r.scanned = o.scanned_count as usize;
        one(&o.consumed_capacity)
    } else if let Some(o) = output.downcast_ref::<TransactGetItemsOutput>() {
        r.ordered = o
            .responses
            .iter()
            .flatten()
            .map(|i| i.item.clone())
            .collect();
        o.consumed_capacity.clone().unwrap_or_default()
    } else if let Some(o) = output.downcast_ref::<PutItemOutput>() {
        one(&o.consumed_capacity)
    } else if let Some(o) = output.downcast_ref::<UpdateItemOutput>() {
        r.items
            .extend(o.attributes.clone().map(|i| (String::new(), i)));
        one(&o.consumed_capacity)
    } else if let Some(o) = output.downcast_ref::<DeleteItemOutput>() {
        one(&o.consumed_capacity)
    } else if let Some(o) = output.downcast_ref::<BatchWriteItemOutput>() {
        r.unprocessed = o
            .unprocessed_items
            .iter()
            .flatten()
            .map(|(_, v)| v.len())
            .sum();
        o.consumed_capacity.clone().unwrap_or_default()
    } else if let Some(o) = output.downcast_ref::<TransactWriteItemsOutput>() {
        o.consumed_capacity.clone().unwrap_or_default()
    } else {
        Vec::new()
    };
    Some((r, capacity))
}

/// Names the tables of the items returned and the keys found absent, from the request.
fn complete_response(
    request: &CallRequest,
    r: &mut CallResponse,
    tables: &HashMap<String, TableInfo>,
) {
    match request {
        CallRequest::GetItem { table, key, .. } => {
            for (t, _) in &mut r.items {
                t.clone_from(table);
            }
            if r.items.is_empty() {
                r.absent.push((table.clone(), key.clone()));
            }
        }
        CallRequest::Query { table, .. }
        | CallRequest::Scan { table, .. }
        | CallRequest::UpdateItem { table, .. } => {
            for (t, _) in &mut r.items {
                t.clone_from(table);
            }
        }
        CallRequest::TransactGetItems { keys, .. } => {
            for ((table, key), item) in keys.iter().zip(std::mem::take(&mut r.ordered)) {
                match item {
                    Some(i) => r.items.push((table.clone(), i)),
                    None => r.absent.push((table.clone(), key.clone())),
                }
            }
        }
        CallRequest::BatchGetItem { keys, .. } => {
            let key_of = |t: &str, a: &Item| tables.get(t).map(|i| model_key(i, t, a));
            let answered: HashSet<Option<String>> = r
                .items
                .iter()
                .chain(&r.unprocessed_keys)
                .map(|(t, a)| key_of(t, a))
                .collect();
            for (table, key, _) in keys {
                if !answered.contains(&key_of(table, key)) {
                    r.absent.push((table.clone(), key.clone()));
                }
            }
        }
        _ => {}
    }
}

// --------------------------------------------------------------------------- timers

/// The timer messages of a scenario, by kind (`TimerMessage::kind`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimerTally {
    /// `schedule` calls: SQS `SendMessage`s.
    pub sent: BTreeMap<&'static str, u64>,
    /// Deliveries to the handler (a retry is another): `ReceiveMessage`s, and
    /// invocations of the `timers` function.
    pub delivered: BTreeMap<&'static str, u64>,
    /// Deliveries the handler acknowledged: `DeleteMessage`s.
    pub acked: BTreeMap<&'static str, u64>,
    /// Deliveries running now.
    pub in_flight: u64,
}

impl TimerTally {
    pub fn sent_total(&self) -> u64 {
        self.sent.values().sum()
    }
    pub fn delivered_total(&self) -> u64 {
        self.delivered.values().sum()
    }
    pub fn acked_total(&self) -> u64 {
        self.acked.values().sum()
    }

    /// Every message sent has been handled and acknowledged, and nothing is running.
    pub fn settled(&self) -> bool {
        self.in_flight == 0 && self.sent_total() == self.acked_total()
    }
}

/// Shared by a [`CountingTimers`] and its [`CountingHandler`].
#[derive(Debug)]
pub struct TimerCounts {
    tally: tokio::sync::watch::Sender<TimerTally>,
}

impl Default for TimerCounts {
    fn default() -> Self {
        Self {
            tally: tokio::sync::watch::Sender::new(TimerTally::default()),
        }
    }
}

impl TimerCounts {
    pub fn tally(&self) -> TimerTally {
        self.tally.borrow().clone()
    }

    /// Waits (at most `timeout`) until `done` holds for the tally; whether it did.
    pub async fn wait_for(&self, timeout: Duration, done: impl FnMut(&TimerTally) -> bool) -> bool {
        let mut rx = self.tally.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(done))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    fn sent(&self, kind: &'static str) {
        self.tally
            .send_modify(|t| *t.sent.entry(kind).or_insert(0) += 1);
    }
}

/// A [`TimerQueue`] that counts what it schedules (one SQS `SendMessage` each) and
/// hands it on to `inner`.
pub struct CountingTimers<Q> {
    inner: Q,
    counts: Arc<TimerCounts>,
}

impl<Q: TimerQueue> CountingTimers<Q> {
    pub fn new(inner: Q, counts: Arc<TimerCounts>) -> Self {
        Self { inner, counts }
    }
}

#[async_trait::async_trait]
impl<Q: TimerQueue> TimerQueue for CountingTimers<Q> {
    async fn schedule(&self, message: &TimerMessage, delay: Duration) -> Result<(), TimerError> {
        self.counts.sent(message.kind());
        self.inner.schedule(message, delay).await
    }
}

/// A [`TimerHandler`] that counts each delivery (one `ReceiveMessage` and one `timers`
/// invocation) and each acknowledgement (one `DeleteMessage`) around `inner`.
pub struct CountingHandler {
    inner: Arc<dyn TimerHandler>,
    counts: Arc<TimerCounts>,
}

impl CountingHandler {
    pub fn new(inner: Arc<dyn TimerHandler>, counts: Arc<TimerCounts>) -> Self {
        Self { inner, counts }
    }
}

#[async_trait::async_trait]
impl TimerHandler for CountingHandler {
    async fn handle(&self, message: TimerMessage) -> Result<(), TimerError> {
        let kind = message.kind();
        self.counts.tally.send_modify(|t| {
            *t.delivered.entry(kind).or_insert(0) += 1;
            t.in_flight += 1;
        });
        let result = self.inner.handle(message).await;
        self.counts.tally.send_modify(|t| {
            if result.is_ok() {
                *t.acked.entry(kind).or_insert(0) += 1;
            }
            t.in_flight -= 1;
        });
        result
    }
}

// ---------------------------------------------------------------------------- meter

/// One HTTP request a client made: one API Gateway request, one Lambda invocation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct HttpRequest {
    /// The function that serves it (`ingress`, `approvals`, `settlement`, `replay`).
    pub function: &'static str,
    /// `POST /api/runs/{id}/tool-approvals`.
    pub route: String,
}

/// The function serving `route` (`METHOD /api/...` with placeholders), as the registry
/// in `tollgate_api::functions` splits the routes.
pub fn function_of(route: &str) -> &'static str {
    let (method, path) = route.split_once(' ').unwrap_or(("GET", route));
    if path.contains("/tool-calls/") || path.contains("/mutations") {
        "settlement"
    } else if path.ends_with("/tool-approvals")
        || path.ends_with("/tool-denials")
        || path.starts_with("/api/approvals")
        || path.starts_with("/api/policies")
        || (method == "GET" && path.ends_with("/approvals"))
    {
        "approvals"
    } else if method == "GET" && (path.contains("/events") || path.ends_with("/stream")) {
        "replay"
    } else {
        "ingress"
    }
}

/// Everything a scenario makes on AWS: DynamoDB calls through a metered store, timer
/// messages through a counting queue and handler, HTTP requests as the client reports
/// them. Cheap to clone; all clones are one meter.
#[derive(Clone)]
pub struct Meter {
    pub dynamo: DynamoMeter,
    pub timers: Arc<TimerCounts>,
    http: Arc<Mutex<Vec<HttpRequest>>>,
    /// The unmetered client, to read final images for the bill.
    plain: aws_sdk_dynamodb::Client,
    pub lambda: LambdaAssumption,
}

impl Meter {
    /// A meter and a store on `store`'s tables whose every DynamoDB call it meters.
    pub fn new(store: &DynamoStore) -> (Self, DynamoStore) {
        let dynamo = DynamoMeter::new(store.tables());
        let metered = dynamo.instrument(store);
        let meter = Self {
            dynamo,
            timers: Arc::default(),
            http: Arc::default(),
            plain: store.client().clone(),
            lambda: LambdaAssumption::default(),
        };
        (meter, metered)
    }

    /// `inner`, counting what it schedules.
    pub fn timer_queue<Q: TimerQueue>(&self, inner: Q) -> CountingTimers<Q> {
        CountingTimers::new(inner, self.timers.clone())
    }

    /// `inner`, counting what it is delivered.
    pub fn timer_handler(&self, inner: Arc<dyn TimerHandler>) -> Arc<dyn TimerHandler> {
        Arc::new(CountingHandler::new(inner, self.timers.clone()))
    }

    /// Records one HTTP request on `route` (`POST /api/runs/{id}/complete`).
    pub fn http_request(&self, route: &str) {
        self.http
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(HttpRequest {
                function: function_of(route),
                route: route.to_owned(),
            });
    }

    /// Forgets everything counted so far.
    pub fn reset(&self) {
        self.dynamo.take();
        self.http
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        self.timers.tally.send_replace(TimerTally::default());
    }

    /// What everything counted so far costs (reads the final image of every item
    /// written, through the unmetered client, to size updates nobody read back).
    pub async fn bill(&self) -> Bill {
        let log = self.dynamo.snapshot();
        let finals = self.dynamo.final_images(&self.plain, &log).await;
        let calls = log.bill_calls(self.dynamo.tables(), &finals);
        let usage = Usage {
            dynamo: DynamoUsage::from_calls(&calls),
            timers: self.timers.tally(),
            http: self
                .http
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        };
        Bill::price(&usage, self.lambda)
    }
}

// ----------------------------------------------------------------------------- bill

/// One DynamoDB operation's calls, billed.
#[derive(Debug, Clone, PartialEq)]
pub struct DynamoUsage {
    pub operation: String,
    pub kind: CallKind,
    pub calls: u64,
    pub failed: u64,
    /// HTTP requests sent (retries included).
    pub attempts: u64,
    pub model: f64,
    /// Sum of what DynamoDB reported, over the calls it reported for.
    pub reported: Option<f64>,
    /// Σ max(model, reported) per call.
    pub billed: f64,
    /// Calls whose report exceeded the model.
    pub reported_won: u64,
    /// Model units by what they are for, e.g. `event Put` → 4.
    pub parts: BTreeMap<String, f64>,
}

impl DynamoUsage {
    /// One line per operation, in the order reads, writes, free; then by name.
    pub fn from_calls(calls: &[CallBill]) -> Vec<Self> {
        let mut by_op: BTreeMap<(CallKind, String), DynamoUsage> = BTreeMap::new();
        for c in calls {
            let u = by_op
                .entry((c.kind, c.operation.clone()))
                .or_insert_with(|| DynamoUsage {
                    operation: c.operation.clone(),
                    kind: c.kind,
                    calls: 0,
                    failed: 0,
                    attempts: 0,
                    model: 0.0,
                    reported: None,
                    billed: 0.0,
                    reported_won: 0,
                    parts: BTreeMap::new(),
                });
            u.calls += 1;
            u.failed += c.failed as u64;
            u.attempts += c.attempts as u64;
            u.model += c.model;
            if let Some(r) = c.reported {
                *u.reported.get_or_insert(0.0) += r;
            }
            u.billed += c.billed();
            u.reported_won += c.reported_won() as u64;
            for (what, units) in &c.parts {
                *u.parts.entry(what.clone()).or_insert(0.0) += units;
            }
        }
        by_op.into_values().collect()
    }
}

/// What a scenario used, before pricing.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    pub dynamo: Vec<DynamoUsage>,
    pub timers: TimerTally,
    pub http: Vec<HttpRequest>,
}

/// One priced line of a [`Bill`].
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    pub service: &'static str,
    pub item: String,
    /// Operations or requests counted.
    pub count: u64,
    /// Units billed (`WRU`, `RRU`, `requests`, `GB-s`).
    pub units: f64,
    pub unit: &'static str,
    pub usd_per_unit: f64,
    /// How the units were arrived at.
    pub note: String,
}

impl Line {
    pub fn usd(&self) -> f64 {
        self.units * self.usd_per_unit
    }
}

/// A priced scenario: one line per operation, and the assumptions it rests on.
#[derive(Debug, Clone, PartialEq)]
pub struct Bill {
    pub lines: Vec<Line>,
    pub assumptions: Vec<String>,
}

fn fmt_units(u: f64) -> String {
    if (u - u.round()).abs() < 1e-9 {
        format!("{}", u.round() as i64)
    } else if u < 10.0 {
        format!("{u:.3}")
    } else {
        format!("{u:.1}")
    }
}

impl Bill {
    /// Prices `usage` with [`prices`] and `lambda`'s compute assumption.
    pub fn price(usage: &Usage, lambda: LambdaAssumption) -> Self {
        use prices::*;
        let mut lines = Vec::new();
        for d in &usage.dynamo {
            let (unit, usd_per_unit) = match d.kind {
                CallKind::Read => ("RRU", DYNAMODB_RRU_USD),
                CallKind::Write => ("WRU", DYNAMODB_WRU_USD),
                CallKind::Free => ("-", 0.0),
            };
            let source = match d.reported {
                None => "model (nothing reported)".to_owned(),
                Some(r) if d.reported_won == 0 => {
                    format!("model; DynamoDB reported {}", fmt_units(r))
                }
                Some(r) if d.reported_won == d.calls => {
                    format!("reported {}; model {}", fmt_units(r), fmt_units(d.model))
                }
                Some(r) => format!(
                    "max per call: reported on {} of {} calls; reported {}, model {}",
                    d.reported_won,
                    d.calls,
                    fmt_units(r),
                    fmt_units(d.model)
                ),
            };
            let parts: Vec<String> = d
                .parts
                .iter()
                .map(|(what, u)| format!("{what} {}", fmt_units(*u)))
                .collect();
            let mut note = source;
            if !parts.is_empty() {
                let _ = write!(note, " [{}]", parts.join(", "));
            }
            if d.failed > 0 {
                let _ = write!(note, "; {} failed, billed as if done", d.failed);
            }
            if d.attempts > d.calls {
                let _ = write!(note, "; {} HTTP attempts", d.attempts);
            }
            lines.push(Line {
                service: "DynamoDB",
                item: d.operation.clone(),
                count: d.calls,
                units: d.billed,
                unit,
                usd_per_unit,
                note,
            });
        }
        let t = &usage.timers;
        let by_kind = |m: &BTreeMap<&'static str, u64>| {
            m.iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        for (item, n, map, note) in [
            (
                "SendMessage",
                t.sent_total(),
                &t.sent,
                "one per timer scheduled",
            ),
            (
                "ReceiveMessage",
                t.delivered_total(),
                &t.delivered,
                "one per delivery (event source mapping; batching ignored)",
            ),
            (
                "DeleteMessage",
                t.acked_total(),
                &t.acked,
                "one per delivery acknowledged",
            ),
        ] {
            lines.push(Line {
                service: "SQS",
                item: item.into(),
                count: n,
                units: n as f64,
                unit: "requests",
                usd_per_unit: SQS_REQUEST_USD,
                note: format!("{note} [{}]", by_kind(map)),
            });
        }
        let mut by_function: BTreeMap<&'static str, Vec<&str>> = BTreeMap::new();
        for r in &usage.http {
            by_function.entry(r.function).or_default().push(&r.route);
        }
        let http = usage.http.len() as u64;
        lines.push(Line {
            service: "API Gateway",
            item: "HTTP API requests".into(),
            count: http,
            units: http as f64,
            unit: "requests",
            usd_per_unit: HTTP_API_REQUEST_USD,
            note: "one per HTTP request of the client".into(),
        });
        let mut invocations = 0;
        for (function, routes) in &by_function {
            let mut tally: Vec<(&str, u64)> = Vec::new();
            for r in routes {
                match tally.iter_mut().find(|(x, _)| x == r) {
                    Some((_, n)) => *n += 1,
                    None => tally.push((r, 1)),
                }
            }
            let n = routes.len() as u64;
            invocations += n;
            lines.push(Line {
                service: "Lambda",
                item: format!("{function} invocations"),
                count: n,
                units: n as f64,
                unit: "requests",
                usd_per_unit: LAMBDA_REQUEST_USD,
                note: tally
                    .iter()
                    .map(|(r, n)| format!("{r} ×{n}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        let timer_invocations = t.delivered_total();
        invocations += timer_invocations;
        lines.push(Line {
            service: "Lambda",
            item: "timers invocations".into(),
            count: timer_invocations,
            units: timer_invocations as f64,
            unit: "requests",
            usd_per_unit: LAMBDA_REQUEST_USD,
            note: "one per timer delivered (batching ignored)".into(),
        });
        lines.push(Line {
            service: "Lambda",
            item: "compute".into(),
            count: invocations,
            units: invocations as f64 * lambda.gb_seconds_per_invocation(),
            unit: "GB-s",
            usd_per_unit: LAMBDA_GB_SECOND_USD,
            note: format!(
                "{} MB × {} ms per invocation (assumed), x86_64",
                lambda.memory_mb, lambda.billed_ms
            ),
        });
        let assumptions = vec![
            format!(
                "prices: us-east-1 on demand as of {AS_OF} (DynamoDB after its 2024-11-01 \
                 price cut; x86_64 Lambda), free tiers ignored"
            ),
            "DynamoDB: per call the larger of the model (item sizes by DynamoDB's rules: \
             1 WRU/KB per item and per index entry written, ×2 in a transaction incl. \
             ConditionCheck and index entries; 1 RRU/4 KB strongly consistent, 0.5 \
             eventually, ×2 per item in TransactGetItems; Query on the total read, a \
             read finding nothing at the minimum) and what DynamoDB reported"
                .into(),
            format!(
                "Lambda: {} MB × {} ms billed per warm invocation (assumed, not measured); \
                 cold-start INIT and the SQS pollers' empty receives are fixed costs, not \
                 per lifecycle",
                lambda.memory_mb, lambda.billed_ms
            ),
        ];
        Self { lines, assumptions }
    }

    pub fn total_usd(&self) -> f64 {
        self.lines.iter().map(Line::usd).sum()
    }

    /// What was counted, by `service item` (calls or requests) and, for DynamoDB,
    /// `… units` (billed request units ×10, to keep halves whole): equal for two runs of
    /// the same scenario when it is deterministic.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for l in &self.lines {
            if l.unit == "GB-s" {
                continue;
            }
            out.insert(format!("{} {}", l.service, l.item), l.count);
            if l.service == "DynamoDB" {
                out.insert(
                    format!("{} {} {}×10", l.service, l.item, l.unit),
                    (l.units * 10.0).round() as u64,
                );
            }
        }
        out
    }

    /// A readable table: one line per operation, then the total and the assumptions.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "{:<12} {:<22} {:>6} {:>10} {:<8} {:>13}  how",
            "service", "operation", "count", "units", "unit", "USD"
        );
        for l in &self.lines {
            let _ = writeln!(
                s,
                "{:<12} {:<22} {:>6} {:>10} {:<8} {:>13.10}  {}",
                l.service,
                l.item,
                l.count,
                fmt_units(l.units),
                l.unit,
                l.usd(),
                l.note
            );
        }
        let mut services: Vec<&'static str> = Vec::new();
        for l in &self.lines {
            if !services.contains(&l.service) {
                services.push(l.service);
            }
        }
        for service in services {
            let usd: f64 = self
                .lines
                .iter()
                .filter(|l| l.service == service)
                .map(Line::usd)
                .sum();
            let _ = writeln!(s, "{:<12} {:<22} {:>41.10}", service, "subtotal", usd);
        }
        let _ = writeln!(s, "{:<35} {:>41.10}", "TOTAL (USD)", self.total_usd());
        for a in &self.assumptions {
            let _ = writeln!(s, "  * {a}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> AttributeValue {
        AttributeValue::S(v.into())
    }
    fn n(v: &str) -> AttributeValue {
        AttributeValue::N(v.into())
    }

    #[test]
    fn sizes_follow_dynamodb_rules() {
        assert_eq!(number_size("0"), 2);
        assert_eq!(number_size("12"), 2);
        assert_eq!(number_size("123"), 3);
        assert_eq!(number_size("1700000000000"), 2); // 2 significant digits
        assert_eq!(number_size("-1.5e10"), 2);
        let item: Item = [("run_id".to_owned(), s("abc")), ("n".to_owned(), n("42"))].into();
        assert_eq!(item_size(&item), 6 + 3 + 1 + 2);
        assert_eq!(units(0, 1024), 1);
        assert_eq!(units(1024, 1024), 1);
        assert_eq!(units(1025, 1024), 2);
        assert_eq!(units(4097, 4096), 2);
    }

    fn usage(kind: CallKind, op: &str, calls: u64, billed: f64) -> DynamoUsage {
        DynamoUsage {
            operation: op.into(),
            kind,
            calls,
            failed: 0,
            attempts: calls,
            model: billed,
            reported: None,
            billed,
            reported_won: 0,
            parts: BTreeMap::new(),
        }
    }

    /// GIVEN 3 RRU, 20 WRU, 7 timers sent/delivered/acked and 7 HTTP requests (256 MB ×
    /// 50 ms each invocation) WHEN priced THEN each line and the total are the list
    /// prices times the units.
    #[test]
    fn a_known_usage_prices_to_known_dollars() {
        let seven: BTreeMap<&'static str, u64> =
            [("approval_heartbeat", 4), ("approval_expiry", 3)].into();
        let usage = Usage {
            dynamo: vec![
                usage(CallKind::Read, "GetItem", 3, 3.0),
                usage(CallKind::Write, "TransactWriteItems", 5, 20.0),
            ],
            timers: TimerTally {
                sent: seven.clone(),
                delivered: seven.clone(),
                acked: seven,
                in_flight: 0,
            },
            http: (0..7)
                .map(|_| HttpRequest {
                    function: "ingress",
                    route: "POST /api/runs".into(),
                })
                .collect(),
        };
        let bill = Bill::price(&usage, LambdaAssumption::default());
        let usd = |service: &str, item: &str| {
            bill.lines
                .iter()
                .find(|l| l.service == service && l.item == item)
                .unwrap_or_else(|| panic!("{service} {item}"))
                .usd()
        };
        let close = |a: f64, b: f64| assert!((a - b).abs() < 1e-15, "{a} != {b}");
        close(usd("DynamoDB", "GetItem"), 3.0 * 0.125e-6);
        close(usd("DynamoDB", "TransactWriteItems"), 20.0 * 0.625e-6);
        close(usd("SQS", "SendMessage"), 7.0 * 0.40e-6);
        close(usd("SQS", "ReceiveMessage"), 7.0 * 0.40e-6);
        close(usd("SQS", "DeleteMessage"), 7.0 * 0.40e-6);
        close(usd("API Gateway", "HTTP API requests"), 7.0 * 1.00e-6);
        close(usd("Lambda", "ingress invocations"), 7.0 * 0.20e-6);
        close(usd("Lambda", "timers invocations"), 7.0 * 0.20e-6);
        // 14 invocations × 0.25 GB × 0.05 s = 0.175 GB-s.
        close(usd("Lambda", "compute"), 0.175 * 0.000_016_666_7);
        // 0.375 + 12.5 + 8.4 + 7 + 2.8 + 2.91667… µ$
        close(bill.total_usd(), 33.991_672_5e-6);
        assert!(bill.render().contains("TOTAL (USD)"));
        assert_eq!(bill.counts()["DynamoDB TransactWriteItems"], 5);
        assert_eq!(bill.counts()["DynamoDB TransactWriteItems WRU×10"], 200);
        assert_eq!(bill.counts()["SQS ReceiveMessage"], 7);
    }

    fn tables() -> HashMap<String, TableInfo> {
        table_infos(&Tables::with_prefix("t-"))
    }

    fn call(id: u64, request: CallRequest, response: CallResponse, reported: Option<f64>) -> Call {
        Call {
            operation: String::new(),
            request,
            started: 2 * id,
            ended: Some(2 * id + 1),
            attempts: 1,
            response: Some(response),
            failed: false,
            consumed: reported
                .map(|u| vec![ConsumedCapacity::builder().capacity_units(u).build()])
                .unwrap_or_default(),
        }
    }

    fn bill_one(c: Call) -> CallBill {
        let mut log = MeterLog::default();
        log.calls.insert(0, c);
        log.bill_calls(&tables(), &HashMap::new()).remove(0)
    }

    /// GIVEN reads of a 5,000-byte card WHEN billed THEN 2 RRU strongly consistent, 1
    /// eventually, 4 in a TransactGetItems (and 2 for an absent item there); a report
    /// above the model wins.
    #[test]
    fn reads_are_billed_per_started_4_kb() {
        let t = "t-approvals".to_owned();
        let key: Item = [
            ("run_id".to_owned(), s("r")),
            ("item_key".to_owned(), s("req#q")),
        ]
        .into();
        let mut card = key.clone();
        card.insert("blob".into(), s(&"x".repeat(5000)));
        let found = CallResponse {
            items: vec![(t.clone(), card.clone())],
            ..CallResponse::default()
        };
        let get = |consistent| CallRequest::GetItem {
            table: t.clone(),
            key: key.clone(),
            consistent,
            partial: false,
        };
        assert_eq!(
            bill_one(call(0, get(true), found.clone(), None)).billed(),
            2.0
        );
        assert_eq!(
            bill_one(call(0, get(false), found.clone(), None)).billed(),
            1.0
        );
        let reported = bill_one(call(0, get(false), found.clone(), Some(3.0)));
        assert!(reported.reported_won());
        assert_eq!(reported.billed(), 3.0);
        let mut other = key.clone();
        other.insert("item_key".into(), s("req#absent"));
        let tx = bill_one(call(
            0,
            CallRequest::TransactGetItems {
                keys: vec![(t.clone(), key.clone()), (t.clone(), other)],
                partial: false,
            },
            found,
            None,
        ));
        assert_eq!(tx.model, 4.0 + 2.0);
    }

    /// GIVEN a transaction putting a 1,500-byte event (one LSI entry) and updating a
    /// head seen at 200 bytes WHEN billed THEN items 2×1 + 2×2 WRU and the index entry
    /// 2×2 (DynamoDB Local's 3 loses); an event put alone as PutItem costs 2 + 2.
    #[test]
    fn writes_are_billed_per_started_kb_and_doubled_in_transactions() {
        use aws_sdk_dynamodb::types::{Put, Update};
        let tables = tables();
        let events = "t-events".to_owned();
        let runs = "t-runs".to_owned();
        let mut event: Item = [
            ("run_id".to_owned(), s("r")),
            ("event_key".to_owned(), s("seq#1")),
            ("sequence".to_owned(), n("1")),
        ]
        .into();
        event.insert("body".into(), s(&"x".repeat(1500)));
        let head_key: Item = [("run_id".to_owned(), s("r"))].into();
        let mut head = head_key.clone();
        head.insert("pad".into(), s(&"y".repeat(190)));
        let tx = vec![
            TransactWriteItem::builder()
                .update(
                    Update::builder()
                        .table_name(&runs)
                        .set_key(Some(head_key.clone()))
                        .update_expression("SET a = :a")
                        .build()
                        .unwrap(),
                )
                .build(),
            TransactWriteItem::builder()
                .put(
                    Put::builder()
                        .table_name(&events)
                        .set_item(Some(event.clone()))
                        .build()
                        .unwrap(),
                )
                .build(),
        ];
        let mut log = MeterLog::default();
        // The head read first (a GetItem), then the transaction.
        log.calls.insert(
            0,
            call(
                0,
                CallRequest::GetItem {
                    table: runs.clone(),
                    key: head_key,
                    consistent: true,
                    partial: false,
                },
                CallResponse {
                    items: vec![(runs.clone(), head)],
                    ..CallResponse::default()
                },
                None,
            ),
        );
        log.calls.insert(
            1,
            call(
                1,
                CallRequest::TransactWriteItems { items: tx },
                CallResponse::default(),
                Some(3.0), // what DynamoDB Local says: not doubled
            ),
        );
        // The next event alone, as a PutItem: item 2 + its index entry 2.
        event.insert("event_key".into(), s("seq#2"));
        event.insert("sequence".into(), n("2"));
        log.calls.insert(
            2,
            call(
                2,
                CallRequest::PutItem {
                    table: events.clone(),
                    item: event,
                },
                CallResponse::default(),
                None,
            ),
        );
        let bills = log.bill_calls(&tables, &HashMap::new());
        assert_eq!(bills[0].billed(), 1.0);
        let tx = &bills[1];
        let parts: BTreeMap<&str, f64> = tx.parts.iter().map(|(w, u)| (w.as_str(), *u)).collect();
        assert_eq!(parts["head Update"], 2.0);
        assert_eq!(parts["event Put"], 4.0);
        let index: f64 = tx
            .parts
            .iter()
            .filter(|(w, _)| w.starts_with("index "))
            .map(|(_, u)| u)
            .sum();
        assert_eq!(index, 4.0, "{:?}", tx.parts);
        assert_eq!(tx.billed(), 10.0);
        assert!(!tx.reported_won());
        assert_eq!(bills[2].billed(), 4.0, "{:?}", bills[2].parts);
    }

    #[test]
    fn routes_map_to_their_functions() {
        assert_eq!(function_of("POST /api/runs"), "ingress");
        assert_eq!(
            function_of("POST /api/runs/{id}/approval-requests"),
            "ingress"
        );
        assert_eq!(
            function_of("POST /api/runs/{id}/tool-approvals"),
            "approvals"
        );
        assert_eq!(function_of("GET /api/approvals?state=pending"), "approvals");
        assert_eq!(
            function_of("POST /api/runs/{id}/tool-calls/{tool_call_id}/start"),
            "settlement"
        );
        assert_eq!(function_of("GET /api/runs/{id}/events?after=0"), "replay");
        assert_eq!(function_of("POST /api/runs/{id}/complete"), "ingress");
    }
}
