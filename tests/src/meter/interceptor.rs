//! [`DynamoMeter`]: the SDK interceptor that logs every operation a store sends, asks
//! for the consumed capacity and keeps what DynamoDB answered.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::*;
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
use aws_sdk_dynamodb::types::{ConsumedCapacity, ReturnConsumedCapacity};
use aws_smithy_types::config_bag::{Storable, StoreReplace};
use tollgate_store::dynamo::{DynamoStore, Tables};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

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
