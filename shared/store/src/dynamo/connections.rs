//! The WebSocket connection registry (docs/architecture.md §9): who holds each API
//! Gateway connection, and which connections follow each run. One table
//! (`TOLLGATE_CONNECTIONS_TABLE`, `<prefix>connections`), partition `pk`, sort `sk`:
//!
//! | item | `pk` | `sk` | attributes |
//! |---|---|---|---|
//! | connection | `conn#<connection_id>` | `conn` | who (kind, sub, project, run token's incarnation and digest), `holder`, `tenant` (its cap keys, none for an operator), `runs` (a string set: the runs it follows), `expires_at` |
//! | subscription | `run#<run_id>` | `conn#<connection_id>` | `connection_id`, `holder`, `tenant`, `expires_at` |
//!
//! - get by connection: `GetItem conn#<id>/conn`;
//! - a run's subscribers: `Query pk = run#<run_id>` (strongly consistent: a subscription
//!   recorded before the fanout reads is seen);
//! - subscribe: the run added to the connection's `runs` set (conditioned on the
//!   connection and its limit), then the subscription item put — plain writes, each
//!   billed once (a transaction bills every item twice); unsubscribe the reverse;
//! - a connection's subscriptions on disconnect: its `runs` set (the connection item,
//!   deleted with `ReturnValues ALL_OLD`), then one `BatchWriteItem` of deletes;
//! - caps: the sparse indexes `by_holder` (a run token's run, or an agent) and
//!   `by_tenant` (a run's project, or its creator) count live places (`Select COUNT`,
//!   expired ones filtered out): a connection takes one under its holder and its tenant
//!   whether or not it follows anything, each subscription one more under its run's
//!   tenant;
//! - a run's token connections: `Query by_holder = run:<run_id>` (what the fanout closes
//!   once the run has ended);
//! - `expires_at` (epoch seconds) is the table's TTL attribute: at most API Gateway's
//!   2-hour connection limit, and never past the credential's expiry. DynamoDB deletes
//!   expired items late, so every read here also ignores them.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, DeleteRequest, ReturnValue, Select, WriteRequest};
use aws_sdk_dynamodb::Client;

use super::commit::backoff;
use super::item::{build_error, get_n, get_s, n, opt_s, s, unavailable, Item};
use crate::StoreError;

/// Index of live subscriptions per holder (a run token's run, or an agent).
pub const BY_HOLDER_INDEX: &str = "by_holder";
/// Index of live subscriptions per tenant (a run's project, or its creating agent).
pub const BY_TENANT_INDEX: &str = "by_tenant";

/// Who holds a connection, as verified at `$connect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionRecord {
    pub connection_id: String,
    /// `run` (a run token), `agent` or `operator` (a JWT).
    pub kind: String,
    /// The JWT's `sub` (none for a run token).
    pub sub: Option<String>,
    /// The JWT's `project_id`.
    pub project_id: Option<String>,
    /// A run token's incarnation (its first 16 hex digits).
    pub incarnation: Option<String>,
    /// A keyed one-way digest of a run token: the token itself is never stored; a
    /// subscription re-derives the run's token and compares digests.
    pub token_digest: Option<String>,
    /// Epoch seconds after which the connection is no longer honoured.
    pub expires_at: u64,
    /// The runs it follows.
    pub runs: Vec<String>,
    /// The cap key of its holder (`by_holder`: a run token's run, an agent), if capped.
    pub holder: Option<String>,
    /// The cap key of its holder's tenant (`by_tenant`), if capped.
    pub tenant: Option<String>,
}

/// One connection following one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscription {
    pub run_id: String,
    pub connection_id: String,
    /// The cap key of whoever subscribed (`by_holder`), if capped.
    pub holder: Option<String>,
    /// The cap key of the run's tenant (`by_tenant`), if capped.
    pub tenant: Option<String>,
    pub expires_at: u64,
}

/// One cap a new subscription counts against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cap {
    /// [`BY_HOLDER_INDEX`] or [`BY_TENANT_INDEX`].
    pub index: &'static str,
    pub key: String,
    pub max: usize,
    /// What the cap is about, for the refusal ("run token", "agent", "project").
    pub what: &'static str,
}

/// What [`Connections::subscribe`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subscribed {
    /// Recorded (or already there: recorded again with a fresh expiry).
    Recorded,
    /// The connection already follows `max_per_connection` other runs.
    TooManyOnConnection,
    /// A cap is full: its `what`.
    CapFull(&'static str),
    /// The connection is not (or no longer) registered.
    NoConnection,
}

/// The registry on its table.
#[derive(Clone)]
pub struct Connections {
    client: Client,
    table: String,
}

fn conn_key(connection_id: &str) -> Item {
    HashMap::from([
        ("pk".to_owned(), s(format!("conn#{connection_id}"))),
        ("sk".to_owned(), s("conn")),
    ])
}

fn sub_key(run_id: &str, connection_id: &str) -> Item {
    HashMap::from([
        ("pk".to_owned(), s(format!("run#{run_id}"))),
        ("sk".to_owned(), s(format!("conn#{connection_id}"))),
    ])
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Connections {
    pub fn new(client: Client, table: impl Into<String>) -> Self {
        Self {
            client,
            table: table.into(),
        }
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    /// Records a connection (`PutItem`; a repeated `$connect` of the same id replaces it).
    pub async fn put_connection(&self, c: &ConnectionRecord) -> Result<(), StoreError> {
        let mut item = conn_key(&c.connection_id);
        item.insert("connection_id".into(), s(&c.connection_id));
        item.insert("kind".into(), s(&c.kind));
        item.insert("expires_at".into(), n(c.expires_at));
        for (name, value) in [
            ("sub", &c.sub),
            ("project_id", &c.project_id),
            ("incarnation", &c.incarnation),
            ("token_digest", &c.token_digest),
            ("holder", &c.holder),
            ("tenant", &c.tenant),
        ] {
            if let Some(v) = value {
                item.insert(name.into(), s(v));
            }
        }
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// The connection, if registered and not expired (`GetItem`, strongly consistent).
    pub async fn get_connection(
        &self,
        connection_id: &str,
    ) -> Result<Option<ConnectionRecord>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(conn_key(connection_id)))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        match out.item {
            None => Ok(None),
            Some(item) => {
                let record = connection_from_item(&item)?;
                Ok((record.expires_at > now_secs()).then_some(record))
            }
        }
    }

    /// The first of `caps` that is full, if any (one `Query … Select COUNT` each; the
    /// count is approximate under concurrent writers, by at most those in flight).
    pub async fn full_cap(&self, caps: &[Cap]) -> Result<Option<&'static str>, StoreError> {
        for cap in caps {
            if self.count(cap).await? >= cap.max {
                return Ok(Some(cap.what));
            }
        }
        Ok(None)
    }

    /// The live connections opened with `run_id`'s token (`Query by_holder =
    /// run:<run_id>`, connection items only): the fanout closes them after the run's
    /// terminal event.
    pub async fn run_token_connections(&self, run_id: &str) -> Result<Vec<String>, StoreError> {
        let now = now_secs();
        let mut ids = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(BY_HOLDER_INDEX)
                .key_condition_expression("holder = :k")
                .expression_attribute_values(":k", s(format!("run:{run_id}")))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(unavailable)?;
            for item in out.items.unwrap_or_default() {
                let live = get_n::<u64>(&item, "expires_at").is_ok_and(|at| at > now);
                if let Some(id) =
                    opt_s(&item, "pk").and_then(|pk| pk.strip_prefix("conn#").map(str::to_owned))
                {
                    if live {
                        ids.push(id);
                    }
                }
            }
            start = out.last_evaluated_key;
            if start.is_none() {
                return Ok(ids);
            }
        }
    }

    /// Live places under `cap`'s key (`Query … Select COUNT` on its index).
    async fn count(&self, cap: &Cap) -> Result<usize, StoreError> {
        let attr = if cap.index == BY_HOLDER_INDEX {
            "holder"
        } else {
            "tenant"
        };
        let mut total = 0usize;
        let mut start = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .index_name(cap.index)
                .key_condition_expression("#k = :k")
                .filter_expression("expires_at > :now")
                .expression_attribute_names("#k", attr)
                .expression_attribute_values(":k", s(&cap.key))
                .expression_attribute_values(":now", n(now_secs()))
                .select(Select::Count)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(unavailable)?;
            total += out.count.max(0) as usize;
            start = out.last_evaluated_key;
            if start.is_none() || total >= cap.max {
                return Ok(total);
            }
        }
    }

    /// Records `sub` on its connection: the caps are counted first (one `Query` each;
    /// the count is approximate under concurrent subscribes, by at most those in flight),
    /// then the run added to the connection's `runs` set (`UpdateItem`, conditioned on the
    /// connection existing and following fewer than `max_per_connection` other runs),
    /// then the subscription item put (`PutItem`). A run the connection already follows
    /// is only put again.
    /// `connection` is the record as read (by [`Connections::get_connection`]) before.
    pub async fn subscribe(
        &self,
        connection: &ConnectionRecord,
        sub: &Subscription,
        max_per_connection: usize,
        caps: &[Cap],
    ) -> Result<Subscribed, StoreError> {
        let already = connection.runs.contains(&sub.run_id);
        if !already {
            if connection.runs.len() >= max_per_connection {
                return Ok(Subscribed::TooManyOnConnection);
            }
            if let Some(what) = self.full_cap(caps).await? {
                return Ok(Subscribed::CapFull(what));
            }
        }
        let mut item = sub_key(&sub.run_id, &sub.connection_id);
        item.insert("connection_id".into(), s(&sub.connection_id));
        item.insert("run_id".into(), s(&sub.run_id));
        item.insert("expires_at".into(), n(sub.expires_at));
        if let Some(h) = &sub.holder {
            item.insert("holder".into(), s(h));
        }
        if let Some(t) = &sub.tenant {
            item.insert("tenant".into(), s(t));
        }
        // The connection's set first, conditioned; then the subscription item. Two plain
        // writes, not one transaction (which bills every item twice): should the second
        // fail, the set names one run too many until it is unsubscribed or the
        // connection goes, which only counts against the per-connection limit, and a
        // retried subscribe finds the run already in the set.
        if already {
            // Followed already: the item is put again, with a fresh expiry.
            self.put_subscription(item).await?;
            return Ok(Subscribed::Recorded);
        }
        let added = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(conn_key(&sub.connection_id)))
            .update_expression("ADD runs :r")
            .condition_expression(
                "attribute_exists(pk) AND expires_at > :now AND \
                 (attribute_not_exists(runs) OR size(runs) < :max OR contains(runs, :run))",
            )
            .expression_attribute_values(":r", AttributeValue::Ss(vec![sub.run_id.clone()]))
            .expression_attribute_values(":run", s(&sub.run_id))
            .expression_attribute_values(":max", n(max_per_connection))
            .expression_attribute_values(":now", n(now_secs()))
            .send()
            .await;
        if let Err(e) = added {
            if !e
                .as_service_error()
                .is_some_and(|se| se.is_conditional_check_failed_exception())
            {
                return Err(unavailable(e));
            }
            // The condition failed: gone, or full by a concurrent subscribe.
            return match self.get_connection(&sub.connection_id).await? {
                None => Ok(Subscribed::NoConnection),
                Some(_) => Ok(Subscribed::TooManyOnConnection),
            };
        }
        self.put_subscription(item).await?;
        Ok(Subscribed::Recorded)
    }

    async fn put_subscription(&self, item: Item) -> Result<(), StoreError> {
        self.client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    /// Stops `connection_id` following `run_id`: the subscription item deleted, then the
    /// run taken out of the connection's set (two plain writes; a connection already
    /// gone is no error). Nothing followed is no error.
    pub async fn unsubscribe(&self, connection_id: &str, run_id: &str) -> Result<(), StoreError> {
        self.client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(sub_key(run_id, connection_id)))
            .send()
            .await
            .map_err(unavailable)?;
        let removed = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(conn_key(connection_id)))
            .update_expression("DELETE runs :r")
            .condition_expression("attribute_exists(pk)")
            .expression_attribute_values(":r", AttributeValue::Ss(vec![run_id.to_owned()]))
            .send()
            .await;
        match removed {
            Ok(_) => Ok(()),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|se| se.is_conditional_check_failed_exception()) =>
            {
                Ok(())
            }
            Err(e) => Err(unavailable(e)),
        }
    }

    /// Deletes a connection and every subscription it holds: the connection item
    /// (`DeleteItem … ALL_OLD`, which answers its `runs`), then their subscription items
    /// (`BatchWriteItem`, 25 a call). `$disconnect`, and a post answered 410 Gone.
    /// Answers how many subscriptions were deleted.
    pub async fn remove_connection(&self, connection_id: &str) -> Result<usize, StoreError> {
        let out = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(conn_key(connection_id)))
            .return_values(ReturnValue::AllOld)
            .send()
            .await
            .map_err(unavailable)?;
        let runs = match out.attributes {
            Some(item) => connection_from_item(&item)?.runs,
            None => Vec::new(),
        };
        let deletes: Vec<WriteRequest> = runs
            .iter()
            .map(|run_id| {
                DeleteRequest::builder()
                    .set_key(Some(sub_key(run_id, connection_id)))
                    .build()
                    .map(|d| WriteRequest::builder().delete_request(d).build())
                    .map_err(build_error)
            })
            .collect::<Result<_, _>>()?;
        for chunk in deletes.chunks(25) {
            let mut pending = Some(chunk.to_vec());
            let mut attempt = 0u32;
            while let Some(requests) = pending.take() {
                let out = self
                    .client
                    .batch_write_item()
                    .request_items(&self.table, requests)
                    .send()
                    .await
                    .map_err(unavailable)?;
                pending = out
                    .unprocessed_items
                    .and_then(|mut u| u.remove(&self.table))
                    .filter(|left| !left.is_empty());
                if pending.is_some() {
                    attempt += 1;
                    if attempt > 10 {
                        return Err(StoreError::Unavailable(
                            "subscription deletes kept coming back unprocessed".into(),
                        ));
                    }
                    backoff(attempt).await;
                }
            }
        }
        Ok(runs.len())
    }

    /// The live subscriptions of `run_id` (`Query pk = run#<run_id>`, strongly
    /// consistent; expired ones left out).
    pub async fn subscribers(&self, run_id: &str) -> Result<Vec<Subscription>, StoreError> {
        let now = now_secs();
        let mut subs = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.table)
                .consistent_read(true)
                .key_condition_expression("pk = :pk")
                .expression_attribute_values(":pk", s(format!("run#{run_id}")))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(unavailable)?;
            for item in out.items.unwrap_or_default() {
                let sub = Subscription {
                    run_id: run_id.to_owned(),
                    connection_id: get_s(&item, "connection_id")?,
                    holder: opt_s(&item, "holder"),
                    tenant: opt_s(&item, "tenant"),
                    expires_at: get_n(&item, "expires_at")?,
                };
                if sub.expires_at > now {
                    subs.push(sub);
                }
            }
            start = out.last_evaluated_key;
            if start.is_none() {
                return Ok(subs);
            }
        }
    }
}

fn connection_from_item(item: &Item) -> Result<ConnectionRecord, StoreError> {
    let mut runs = match item.get("runs") {
        Some(AttributeValue::Ss(runs)) => runs.clone(),
        _ => Vec::new(),
    };
    runs.sort();
    Ok(ConnectionRecord {
        connection_id: get_s(item, "connection_id")?,
        kind: get_s(item, "kind")?,
        sub: opt_s(item, "sub"),
        project_id: opt_s(item, "project_id"),
        incarnation: opt_s(item, "incarnation"),
        token_digest: opt_s(item, "token_digest"),
        expires_at: get_n(item, "expires_at")?,
        runs,
        holder: opt_s(item, "holder"),
        tenant: opt_s(item, "tenant"),
    })
}
