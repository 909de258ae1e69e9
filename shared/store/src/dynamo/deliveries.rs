//! The [`crate::DeliveryStore`] port on the deliveries table (docs/architecture.md §10):
//! one item per delivery, keyed by its delivery id; every write is a `PutItem`
//! conditioned on the version it read.

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::AttributeValue;

use super::item::{get_n, get_s, n, opt_s, s, shard_of, unavailable};
use super::DynamoStore;
use crate::deliveries::{expires_at, fair_share, sink_marker_id, DUE_WINDOW};
use crate::{Delivery, DeliveryKey, DeliveryState, StoreError};

/// The sparse index of pending deliveries by `next_attempt_at` (`due_key`).
pub const DELIVERIES_DUE_INDEX: &str = "deliveries_due";
/// The sparse index of one project's dead letters (`dead_key` = the project).
pub const DEAD_LETTERS_INDEX: &str = "dead_by_project";
/// Shards of the due index.
const DUE_SHARDS: u32 = 4;

type Item = HashMap<String, AttributeValue>;

fn to_item(d: &Delivery) -> Item {
    let mut item = HashMap::from([
        ("delivery_id".to_owned(), s(&d.delivery_id)),
        ("sink".to_owned(), s(&d.key.sink)),
        ("project".to_owned(), s(&d.key.project)),
        ("run_id".to_owned(), s(&d.key.run_id)),
        ("request_id".to_owned(), s(&d.key.request_id)),
        ("kind".to_owned(), s(&d.key.kind)),
        ("sequence".to_owned(), n(d.sequence)),
        ("state".to_owned(), s(d.state.as_str())),
        ("attempts".to_owned(), n(d.attempts)),
        ("next_attempt_at".to_owned(), n(d.next_attempt_at)),
        ("leased_until".to_owned(), n(d.leased_until)),
        ("created_at".to_owned(), n(d.created_at)),
        ("updated_at".to_owned(), n(d.updated_at)),
        ("version".to_owned(), n(d.version)),
    ]);
    if let Some(e) = &d.last_error {
        item.insert("last_error".into(), s(e));
    }
    if let Some(m) = &d.memo {
        item.insert("memo".into(), s(m));
    }
    match d.state {
        DeliveryState::Pending => {
            let shard = shard_of(&[&d.delivery_id], DUE_SHARDS);
            item.insert("due_key".into(), s(format!("due#{shard}")));
        }
        DeliveryState::Dead => {
            item.insert("dead_key".into(), s(&d.key.project));
        }
        DeliveryState::Sent => {}
    }
    if let Some(at) = expires_at(d) {
        item.insert("expires_at".into(), n(at));
    }
    item
}

fn from_item(item: &Item) -> Result<Delivery, StoreError> {
    let state = get_s(item, "state")?;
    Ok(Delivery {
        key: DeliveryKey {
            sink: get_s(item, "sink")?,
            project: get_s(item, "project")?,
            run_id: get_s(item, "run_id")?,
            request_id: get_s(item, "request_id")?,
            kind: get_s(item, "kind")?,
        },
        delivery_id: get_s(item, "delivery_id")?,
        sequence: get_n(item, "sequence")?,
        state: DeliveryState::parse(&state).ok_or_else(|| super::item::corrupt("state"))?,
        attempts: get_n(item, "attempts")?,
        next_attempt_at: get_n(item, "next_attempt_at")?,
        leased_until: get_n(item, "leased_until")?,
        last_error: opt_s(item, "last_error"),
        memo: opt_s(item, "memo"),
        created_at: get_n(item, "created_at")?,
        updated_at: get_n(item, "updated_at")?,
        version: get_n(item, "version")?,
    })
}

#[async_trait]
impl crate::DeliveryStore for DynamoStore {
    async fn put_delivery(&self, record: &Delivery, expected: u64) -> Result<bool, StoreError> {
        let mut put = self
            .client
            .put_item()
            .table_name(&self.tables.deliveries)
            .set_item(Some(to_item(record)));
        put = if expected == 0 {
            put.condition_expression("attribute_not_exists(delivery_id)")
        } else {
            put.condition_expression("version = :v")
                .expression_attribute_values(":v", n(expected))
        };
        match put.send().await {
            Ok(_) => Ok(true),
            Err(SdkError::ServiceError(ctx))
                if matches!(ctx.err(), PutItemError::ConditionalCheckFailedException(_)) =>
            {
                Ok(false)
            }
            Err(e) => Err(unavailable(e)),
        }
    }

    async fn read_delivery(&self, delivery_id: &str) -> Result<Option<Delivery>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.tables.deliveries)
            .key("delivery_id", s(delivery_id))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        out.item().map(from_item).transpose()
    }

    async fn due_deliveries(&self, now: i64, limit: usize) -> Result<Vec<Delivery>, StoreError> {
        // The earliest [`DUE_WINDOW`] times the limit from the index (keys only), each
        // shard's earliest first; the records read; the share chosen from those.
        let per_shard = (limit.max(1) * DUE_WINDOW).div_ceil(DUE_SHARDS as usize);
        let mut ids = Vec::new();
        for shard in 0..DUE_SHARDS {
            let mut start: Option<Item> = None;
            let mut read = 0;
            loop {
                let out = self
                    .client
                    .query()
                    .table_name(&self.tables.deliveries)
                    .index_name(DELIVERIES_DUE_INDEX)
                    .key_condition_expression("due_key = :k AND next_attempt_at <= :now")
                    .expression_attribute_values(":k", s(format!("due#{shard}")))
                    .expression_attribute_values(":now", n(now))
                    .limit((per_shard - read).clamp(1, 1000) as i32)
                    .set_exclusive_start_key(start.take())
                    .send()
                    .await
                    .map_err(unavailable)?;
                for item in out.items() {
                    ids.push(get_s(item, "delivery_id")?);
                }
                read += out.items().len();
                match out.last_evaluated_key() {
                    Some(key) if read < per_shard => start = Some(key.clone()),
                    _ => break,
                }
            }
        }
        // The index is eventually consistent: read each record itself, and keep those
        // still pending and due.
        let mut due = Vec::new();
        for id in ids {
            if let Some(d) = self.read_delivery(&id).await? {
                if d.state == DeliveryState::Pending && d.next_attempt_at <= now {
                    due.push(d);
                }
            }
        }
        due.sort_by(|a, b| {
            (a.next_attempt_at, &a.delivery_id).cmp(&(b.next_attempt_at, &b.delivery_id))
        });
        Ok(fair_share(
            due,
            limit,
            |d| d.key.project.as_str(),
            |d| d.next_attempt_at,
        ))
    }

    async fn dead_letters(&self, project: &str, limit: usize) -> Result<Vec<Delivery>, StoreError> {
        let out = self
            .client
            .query()
            .table_name(&self.tables.deliveries)
            .index_name(DEAD_LETTERS_INDEX)
            .key_condition_expression("dead_key = :p")
            .expression_attribute_values(":p", s(project))
            .scan_index_forward(false)
            .limit(limit.clamp(1, 1000) as i32)
            .send()
            .await
            .map_err(unavailable)?;
        out.items()
            .iter()
            .map(from_item)
            .filter(|d| match d {
                Ok(d) => d.state == DeliveryState::Dead,
                Err(_) => true,
            })
            .collect()
    }

    async fn sink_enabled_at(&self, sink: &str, at: i64) -> Result<i64, StoreError> {
        let id = sink_marker_id(sink);
        let read = || async {
            let out = self
                .client
                .get_item()
                .table_name(&self.tables.deliveries)
                .key("delivery_id", s(&id))
                .consistent_read(true)
                .send()
                .await
                .map_err(unavailable)?;
            out.item()
                .map(|item| get_n::<i64>(item, "enabled_at"))
                .transpose()
        };
        if let Some(enabled) = read().await? {
            return Ok(enabled);
        }
        // No due_key or dead_key: the marker is in neither index.
        let put = self
            .client
            .put_item()
            .table_name(&self.tables.deliveries)
            .item("delivery_id", s(&id))
            .item("sink", s(sink))
            .item("enabled_at", n(at))
            .condition_expression("attribute_not_exists(delivery_id)")
            .send()
            .await;
        match put {
            Ok(_) => Ok(at),
            Err(SdkError::ServiceError(ctx))
                if matches!(ctx.err(), PutItemError::ConditionalCheckFailedException(_)) =>
            {
                read()
                    .await?
                    .ok_or_else(|| super::item::corrupt("enabled_at"))
            }
            Err(e) => Err(unavailable(e)),
        }
    }
}
