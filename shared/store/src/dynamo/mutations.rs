//! Durable mutation records on DynamoDB ([`MutationStore`]).
//!
//! Mutations table: partition `run_id`, sort `mutation_key` = `<tool_call_id>#<approval_id>`
//! for a record (the whole [`MutationRecord`] as JSON in `record`, with `state`,
//! `settled_by`, `dispatched_at` and `settled_at` beside it for conditions), and
//! `<tool_call_id>#` for the tool call's guard item, whose string set `admitted` names
//! every admitted attempt of the call (written by each admission, in its transaction).
//!
//! An attempt that is `intent` or `dispatched` also carries `unsettled_shard` (one of
//! [`UNSETTLED_SHARDS`] values, by its run id), which puts it in the sparse index
//! `unsettled_by_deadline` (`unsettled_shard`, `settlement_deadline_at`): the sweeper
//! finds attempts whose deadline timer was lost with one bounded `Query` per shard.
//! Settling drops the attribute (a put replaces the whole item), and with it the entry.
//! The shards spread every tenant's intents over several partitions instead of one.
//!
//! Why the guard: `start` decides from every attempt of the tool call, read with a
//! `Query`, which is only read-committed — it may miss an item of a transaction that is
//! committing. The view is therefore read as: the head and the guard as one
//! `TransactGetItems` snapshot (an admission writes both in one transaction, so the
//! snapshot holds both of its writes or neither — two separate `GetItem`s would not),
//! then the `Query`; any admitted attempt the guard names but the `Query` missed is read
//! by `GetItem`. An admission that committed before the snapshot is thus always seen; a
//! later one moves the head's `next_seq`, on which every admission is conditioned.
//!
//! Writes: a decision with events (or an admission's usage) is one plan on the commit
//! engine — the head advanced (conditioned on exactly the head read and on the run
//! running), the events, the record put (conditioned on the stored record being the one
//! read) and, for an admission, the guard. A decision without events writes the record
//! alone with one conditional `PutItem` (one item is atomic, and a transaction would
//! cost twice as much).

use std::collections::HashMap;

use async_trait::async_trait;
use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use tollgate_domain::execution::{self, Decision, MutationRecord, MutationState};
use tollgate_domain::{now_millis, RunHead};

use super::commit::{Budget, Committed, Plan, RunWrite, WriteKind};
use super::item::{build_error, corrupt, get_s, n, opt_s, s, unavailable, Item};
use super::DynamoStore;
use crate::{
    budget_usage, check_decision, mutation_key, Beat, MutationCommit, MutationStore, MutationView,
    StoreError,
};

/// The sparse index of unsettled attempts by settlement deadline.
pub const UNSETTLED_INDEX: &str = "unsettled_by_deadline";

/// How many partitions the unsettled index spreads its entries over.
pub const UNSETTLED_SHARDS: u32 = 16;

/// The index shard of a run's attempts: a stable hash (FNV-1a) of its run id.
fn unsettled_shard(run_id: &str) -> String {
    let hash = run_id.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    format!("u#{:02}", hash % UNSETTLED_SHARDS)
}

/// Sort key of a tool call's guard item: sorts before every attempt of the call.
fn guard_key(tool_call_id: &str) -> String {
    mutation_key(tool_call_id, "")
}

/// A snake_case wire string of a serde enum (`settled_by`).
fn wire<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => Ok(s),
        _ => Err(StoreError::Unavailable("unencodable enum".into())),
    }
}

fn record_to_item(r: &MutationRecord) -> Result<Item, StoreError> {
    let json = serde_json::to_string(r)
        .map_err(|e| StoreError::Unavailable(format!("encode mutation record: {e}")))?;
    let mut item = HashMap::from([
        ("run_id".to_string(), s(&r.run_id)),
        (
            "mutation_key".to_string(),
            s(mutation_key(&r.tool_call_id, &r.approval_id)),
        ),
        ("tool_call_id".to_string(), s(&r.tool_call_id)),
        ("approval_id".to_string(), s(&r.approval_id)),
        ("state".to_string(), s(r.state.as_str())),
        (
            "settlement_deadline_at".to_string(),
            n(r.settlement_deadline_at),
        ),
        ("record".to_string(), s(json)),
    ]);
    if let Some(by) = &r.settled_by {
        item.insert("settled_by".into(), s(wire(by)?));
    }
    if let Some(at) = r.dispatched_at {
        item.insert("dispatched_at".into(), n(at));
    }
    if let Some(at) = r.settled_at {
        item.insert("settled_at".into(), n(at));
    }
    if !r.state.is_settled() {
        item.insert("unsettled_shard".into(), s(unsettled_shard(&r.run_id)));
    }
    Ok(item)
}

fn record_from_item(item: &Item) -> Result<MutationRecord, StoreError> {
    let raw = get_s(item, "record")?;
    let record: MutationRecord = serde_json::from_str(&raw).map_err(|_| corrupt("record"))?;
    // The attributes conditions read must agree with the record they describe.
    if opt_s(item, "state").and_then(|st| MutationState::parse(&st)) != Some(record.state) {
        return Err(corrupt("state"));
    }
    Ok(record)
}

/// Whether an item is a record (not a tool call's guard item).
fn is_record(item: &Item) -> bool {
    item.contains_key("record")
}

/// A condition expression with its placeholder values.
type Condition = (String, Vec<(&'static str, AttributeValue)>);

/// The condition that the stored record is exactly `prior` (absent for `None`): its
/// state, who settled it and when it was dispatched and settled. Every transition of a
/// record changes at least one of them, and none returns to an earlier combination
/// (the transitions form a DAG), so equal attributes mean the same record version.
fn prior_condition(prior: Option<&MutationRecord>) -> Result<Condition, StoreError> {
    let Some(p) = prior else {
        return Ok(("attribute_not_exists(mutation_key)".into(), Vec::new()));
    };
    let mut parts = vec!["#state = :pstate".to_owned()];
    let mut values = vec![(":pstate", s(p.state.as_str()))];
    match &p.settled_by {
        Some(by) => {
            parts.push("settled_by = :pby".into());
            values.push((":pby", s(wire(by)?)));
        }
        None => parts.push("attribute_not_exists(settled_by)".into()),
    }
    for (attr, placeholder, v) in [
        ("dispatched_at", ":pdis", p.dispatched_at),
        ("settled_at", ":pset", p.settled_at),
    ] {
        match v {
            Some(at) => {
                parts.push(format!("{attr} = {placeholder}"));
                values.push((placeholder, n(at)));
            }
            None => parts.push(format!("attribute_not_exists({attr})")),
        }
    }
    Ok((parts.join(" AND "), values))
}

impl DynamoStore {
    /// The record's item, and its TTL (retention on) only once its run has ended
    /// (nothing can start on it any more) — from the later of now and its deadline, as
    /// the run's head gets from its last write.
    ///
    /// Invariant: no attempt expires while its run can still start calls. One in
    /// flight, `outcome_unknown` (until an operator reconciles it) or `completed`
    /// (running it again would be a duplicate mutation) blocks new starts of its tool
    /// call; a `not_executed` one blocks its own approval from admitting a second
    /// attempt (a new attempt needs a fresh approval) — were it deleted while the card
    /// still reads `approved`, the same approval would start the call again. The head's TTL moves with every append, so a TTL stamped on the
    /// record at its own last write could fall due while the run goes on, and its
    /// deletion would let the call run again. Such a record carries no TTL (a put
    /// replaces the whole item, so an earlier one goes too); the run's end gives its
    /// records the head's final TTL ([`DynamoStore::expire_mutations_with_run`]).
    fn mutation_item(
        &self,
        r: &MutationRecord,
        now: i64,
        run_ended: bool,
    ) -> Result<Item, StoreError> {
        let mut item = record_to_item(r)?;
        if run_ended {
            if let Some(exp) = self.expires_at(now.max(r.settlement_deadline_at)) {
                item.insert("expires_at".into(), exp);
            }
        }
        Ok(item)
    }

    /// After a run's terminal event (retention on): its mutation items get the head's
    /// final TTL, so they go with the run. Best effort — one that fails only stays
    /// longer (logged); nothing can start on an ended run, so no block depends on it.
    pub(crate) async fn expire_mutations_with_run(&self, run_id: &str, now: i64) {
        let Some(exp) = self.expires_at(now) else {
            return;
        };
        let mut start_key = None;
        loop {
            let out = match self
                .client
                .query()
                .table_name(&self.tables.mutations)
                .key_condition_expression("run_id = :r")
                .expression_attribute_values(":r", s(run_id))
                .projection_expression("run_id, mutation_key")
                .set_exclusive_start_key(start_key.take())
                .send()
                .await
            {
                Ok(out) => out,
                Err(e) => {
                    tracing::warn!(error = %unavailable(e), run_id, "ended run's records keep no TTL");
                    return;
                }
            };
            for item in out.items.unwrap_or_default() {
                let (Some(run), Some(key)) = (item.get("run_id"), item.get("mutation_key")) else {
                    continue;
                };
                // Never earlier than a TTL the item already has (a later settlement's).
                let stamped = self
                    .client
                    .update_item()
                    .table_name(&self.tables.mutations)
                    .key("run_id", run.clone())
                    .key("mutation_key", key.clone())
                    .update_expression("SET expires_at = :exp")
                    .condition_expression(
                        "attribute_exists(mutation_key) AND \
                         (attribute_not_exists(expires_at) OR expires_at < :exp)",
                    )
                    .expression_attribute_values(":exp", exp.clone())
                    .send()
                    .await;
                if let Err(e) = stamped {
                    let lost_condition = matches!(
                        &e,
                        SdkError::ServiceError(ctx) if matches!(
                            ctx.err(),
                            aws_sdk_dynamodb::operation::update_item::UpdateItemError::ConditionalCheckFailedException(_)
                        )
                    );
                    if !lost_condition {
                        tracing::warn!(error = %unavailable(e), run_id, "an ended run's record keeps no TTL");
                    }
                }
            }
            start_key = out.last_evaluated_key;
            if start_key.is_none() {
                return;
            }
        }
    }

    /// The run's head and the tool call's guard as one serializable snapshot
    /// (`TransactGetItems`): an admission writes both in one transaction, so the
    /// snapshot holds both of its writes or neither. `None`: cancelled by a transaction
    /// in flight (read again).
    async fn head_and_guard(
        &self,
        run_id: &str,
        tool_call_id: &str,
    ) -> Result<Option<(Option<RunHead>, Option<Item>)>, StoreError> {
        let guard_k = HashMap::from([
            ("run_id".to_owned(), s(run_id)),
            ("mutation_key".to_owned(), s(guard_key(tool_call_id))),
        ]);
        self.head_with_item(run_id, &self.tables.mutations, guard_k)
            .await
    }

    async fn get_mutation_item(
        &self,
        run_id: &str,
        key: String,
    ) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.tables.mutations)
            .key("run_id", s(run_id))
            .key("mutation_key", s(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(out.item)
    }

    /// Strongly consistent `Query` of a run's mutation items (with `prefix`, only keys
    /// that start with it), at most `limit` records.
    async fn query_mutations(
        &self,
        run_id: &str,
        prefix: Option<&str>,
        limit: usize,
    ) -> Result<Vec<MutationRecord>, StoreError> {
        let mut records = Vec::new();
        let mut start_key = None;
        loop {
            let mut q = self
                .client
                .query()
                .table_name(&self.tables.mutations)
                .consistent_read(true)
                .expression_attribute_values(":r", s(run_id))
                .set_exclusive_start_key(start_key.take());
            q = match prefix {
                Some(p) => q
                    .key_condition_expression("run_id = :r AND begins_with(mutation_key, :p)")
                    .expression_attribute_values(":p", s(p)),
                None => q.key_condition_expression("run_id = :r"),
            };
            // (+1: the guard items are skipped.)
            let want = (limit - records.len()).saturating_add(1).min(1000);
            let out = q.limit(want as i32).send().await.map_err(unavailable)?;
            for item in out.items.unwrap_or_default() {
                if is_record(&item) && records.len() < limit {
                    records.push(record_from_item(&item)?);
                }
            }
            start_key = out.last_evaluated_key;
            if start_key.is_none() || records.len() >= limit {
                return Ok(records);
            }
        }
    }

    /// A dispatch: the record with a check that the run is still the running incarnation
    /// it was decided on, in one transaction — the agent sends only on this answer, so a
    /// cancel or an end committed in between must win.
    async fn dispatch_while_running(
        &self,
        head: &RunHead,
        prior: Option<&MutationRecord>,
        record: &MutationRecord,
    ) -> Result<MutationCommit, StoreError> {
        use aws_sdk_dynamodb::types::ConditionCheck;
        let same_incarnation = if head.incarnation.is_empty() {
            "attribute_not_exists(incarnation)"
        } else {
            "incarnation = :inc"
        };
        let mut check = ConditionCheck::builder()
            .table_name(&self.tables.runs)
            .key("run_id", s(&head.run_id))
            .condition_expression(format!("#status = :running AND {same_incarnation}"))
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(
                ":running",
                s(tollgate_domain::RunStatus::Running.as_str()),
            );
        if !head.incarnation.is_empty() {
            check = check.expression_attribute_values(":inc", s(&head.incarnation));
        }
        let plan = Plan {
            runs: Vec::new(),
            side: vec![
                self.record_put(prior, record, now_millis())?,
                TransactWriteItem::builder()
                    .condition_check(check.build().map_err(build_error)?)
                    .build(),
            ],
        };
        match self.commit(&plan).await? {
            Committed::Done { .. } => Ok(MutationCommit::Written {
                sequences: Vec::new(),
            }),
            Committed::Lost(_) | Committed::Busy(_) => Ok(MutationCommit::Lost),
        }
    }

    /// A conditional `PutItem` of the record alone.
    async fn put_record_alone(
        &self,
        prior: Option<&MutationRecord>,
        record: &MutationRecord,
        run_ended: bool,
    ) -> Result<MutationCommit, StoreError> {
        let (condition, values) = prior_condition(prior)?;
        let mut put = self
            .client
            .put_item()
            .table_name(&self.tables.mutations)
            .set_item(Some(self.mutation_item(record, now_millis(), run_ended)?))
            .condition_expression(condition);
        if prior.is_some() {
            put = put.expression_attribute_names("#state", "state");
        }
        for (k, v) in values {
            put = put.expression_attribute_values(k, v);
        }
        match put.send().await {
            Ok(_) => Ok(MutationCommit::Written {
                sequences: Vec::new(),
            }),
            Err(SdkError::ServiceError(ctx))
                if matches!(
                    ctx.err(),
                    PutItemError::ConditionalCheckFailedException(_)
                        | PutItemError::ProvisionedThroughputExceededException(_)
                        | PutItemError::RequestLimitExceeded(_)
                        | PutItemError::ThrottlingException(_)
                ) =>
            {
                // A lost condition — or a resend of a put that did land (read again: the
                // decision from the stored record then changes nothing).
                Ok(MutationCommit::Lost)
            }
            Err(e) => Err(unavailable(e)),
        }
    }

    fn record_put(
        &self,
        prior: Option<&MutationRecord>,
        record: &MutationRecord,
        now: i64,
    ) -> Result<TransactWriteItem, StoreError> {
        let (condition, values) = prior_condition(prior)?;
        let mut put = Put::builder()
            .table_name(&self.tables.mutations)
            .set_item(Some(self.mutation_item(record, now, false)?))
            .condition_expression(condition)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if prior.is_some() {
            put = put.expression_attribute_names("#state", "state");
        }
        for (k, v) in values {
            put = put.expression_attribute_values(k, v);
        }
        Ok(TransactWriteItem::builder()
            .put(put.build().map_err(build_error)?)
            .build())
    }

    /// Adds an admitted attempt to its tool call's guard item.
    fn guard_update(
        &self,
        record: &MutationRecord,
        now: i64,
    ) -> Result<TransactWriteItem, StoreError> {
        let mut update = Update::builder()
            .table_name(&self.tables.mutations)
            .key("run_id", s(&record.run_id))
            .key("mutation_key", s(guard_key(&record.tool_call_id)))
            .expression_attribute_values(
                ":a",
                AttributeValue::Ss(vec![record.approval_id.clone()]),
            );
        // The guard's TTL is no later than any of its attempts' (it is stamped at their
        // admission, they at their settlement or never): a guard gone first only
        // narrows a read to the `Query`, which sees every long-committed attempt.
        let mut expr = "ADD admitted :a".to_owned();
        if let Some(exp) = self.expires_at(now.max(record.settlement_deadline_at)) {
            expr.push_str(" SET expires_at = :exp");
            update = update.expression_attribute_values(":exp", exp);
        }
        Ok(TransactWriteItem::builder()
            .update(
                update
                    .update_expression(expr)
                    .build()
                    .map_err(build_error)?,
            )
            .build())
    }
}

#[async_trait]
impl MutationStore for DynamoStore {
    async fn read_mutation(
        &self,
        run_id: &str,
        tool_call_id: &str,
        approval_id: &str,
    ) -> Result<Option<MutationRecord>, StoreError> {
        self.get_mutation_item(run_id, mutation_key(tool_call_id, approval_id))
            .await?
            .filter(is_record)
            .map(|item| record_from_item(&item))
            .transpose()
    }

    async fn list_mutations(
        &self,
        run_id: &str,
        limit: usize,
    ) -> Result<Vec<MutationRecord>, StoreError> {
        self.query_mutations(run_id, None, limit.min(crate::MAX_MUTATIONS_LISTED + 1))
            .await
    }

    async fn tool_call_mutations(
        &self,
        run_id: &str,
        tool_call_id: &str,
    ) -> Result<Vec<MutationRecord>, StoreError> {
        self.query_mutations(run_id, Some(&guard_key(tool_call_id)), usize::MAX)
            .await
    }

    async fn read_mutation_view(
        &self,
        run_id: &str,
        tool_call_id: &str,
    ) -> Result<Option<MutationView>, StoreError> {
        // The head and the guard as one snapshot (see the module docs), then the attempts.
        let mut budget =
            super::commit::Budget::new(self.contention_budget, "reading a tool call's attempts");
        let (head, guard) = loop {
            match self.head_and_guard(run_id, tool_call_id).await? {
                Some(read) => break read,
                None => budget.next().await?,
            }
        };
        let Some(head) = head else {
            return Ok(None);
        };
        let usage = budget_usage(&head)?;
        let mut attempts = self.tool_call_mutations(run_id, tool_call_id).await?;
        let admitted = match guard.and_then(|g| g.get("admitted").cloned()) {
            Some(AttributeValue::Ss(ids)) => ids,
            _ => Vec::new(),
        };
        for approval_id in admitted {
            if attempts.iter().any(|a| a.approval_id == approval_id) {
                continue;
            }
            // Committed (the snapshot holds its guard entry), but not yet visible to the
            // read-committed Query: read it by key.
            //
            // A strongly consistent read after the snapshot sees every committed write,
            // so an admitted attempt it cannot find is gone: expired. While its run can
            // still start calls, only a `not_executed` attempt — which blocks nothing —
            // carries a TTL (see `mutation_item`), and the guard (stamped at the latest
            // admission) may outlive it: skip it rather than refuse the tool call.
            if let Some(record) = self
                .read_mutation(run_id, tool_call_id, &approval_id)
                .await?
            {
                attempts.push(record);
            }
        }
        attempts.sort_by(|a, b| a.approval_id.cmp(&b.approval_id));
        Ok(Some(MutationView {
            head,
            usage,
            attempts,
        }))
    }

    async fn commit_mutation(
        &self,
        head: &RunHead,
        prior: Option<&MutationRecord>,
        decision: &Decision,
    ) -> Result<MutationCommit, StoreError> {
        if !decision.changed {
            return Ok(MutationCommit::Written {
                sequences: Vec::new(),
            });
        }
        check_decision(head, prior, decision)?;
        let record = &decision.record;
        if decision.events.is_empty() && decision.usage.is_none() {
            if record.state == MutationState::Dispatched {
                return self.dispatch_while_running(head, prior, record).await;
            }
            return self
                .put_record_alone(prior, record, head.status.is_terminal())
                .await;
        }
        let now = now_millis();
        let mut side = vec![self.record_put(prior, record, now)?];
        if decision.usage.is_some() {
            side.push(self.guard_update(record, now)?);
        }
        let plan = Plan {
            runs: vec![RunWrite {
                head: head.clone(),
                kind: WriteKind::Advance { end: None },
                events: decision.events.clone(),
                open_cards: 0,
                budget_used: decision.usage.as_ref().map(|u| u.to_json()),
            }],
            side,
        };
        match self.commit(&plan).await? {
            Committed::Done { .. } => {
                let first = head.next_seq;
                Ok(MutationCommit::Written {
                    sequences: (first..first + decision.events.len() as u64).collect(),
                })
            }
            Committed::Lost(_) => Ok(MutationCommit::Lost),
            Committed::Busy(why) => {
                tracing::debug!(%why, "mutation commit turned away; read again");
                Ok(MutationCommit::Lost)
            }
        }
    }

    async fn overdue_attempts(
        &self,
        due_before: i64,
        limit: usize,
    ) -> Result<Vec<MutationRecord>, StoreError> {
        // One page per shard, at most `limit` each: bounded per sweep; what is left
        // waits for the next.
        let want = limit.clamp(1, 1000) as i32;
        let mut due = Vec::new();
        for shard in 0..UNSETTLED_SHARDS {
            let out = self
                .client
                .query()
                .table_name(&self.tables.mutations)
                .index_name(UNSETTLED_INDEX)
                .key_condition_expression("unsettled_shard = :s AND settlement_deadline_at <= :due")
                .expression_attribute_values(":s", s(format!("u#{shard:02}")))
                .expression_attribute_values(":due", n(due_before))
                .limit(want)
                .send()
                .await
                .map_err(unavailable)?;
            for item in out.items.unwrap_or_default() {
                let record = record_from_item(&item)?;
                if !record.state.is_settled() {
                    due.push(record);
                }
            }
        }
        due.sort_by_key(|r| r.settlement_deadline_at);
        due.truncate(limit);
        Ok(due)
    }

    async fn expire_mutations_with_head(&self, run_id: &str) -> Result<(), StoreError> {
        let ttl = |item: &Item| match item.get("expires_at") {
            Some(AttributeValue::N(v)) => v.parse::<i64>().ok(),
            _ => None,
        };
        let head = self
            .client
            .get_item()
            .table_name(&self.tables.runs)
            .key("run_id", s(run_id))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?
            .item;
        let Some(head_ttl) = head.as_ref().and_then(ttl) else {
            return Ok(());
        };
        let mut start_key = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.tables.mutations)
                .consistent_read(true)
                .key_condition_expression("run_id = :r")
                .expression_attribute_values(":r", s(run_id))
                .set_exclusive_start_key(start_key.take())
                .send()
                .await
                .map_err(unavailable)?;
            for item in out.items.unwrap_or_default() {
                if ttl(&item).is_some_and(|t| t <= head_ttl) {
                    self.client
                        .delete_item()
                        .table_name(&self.tables.mutations)
                        .key("run_id", item["run_id"].clone())
                        .key("mutation_key", item["mutation_key"].clone())
                        .send()
                        .await
                        .map_err(unavailable)?;
                }
            }
            start_key = out.last_evaluated_key;
            if start_key.is_none() {
                return Ok(());
            }
        }
    }

    async fn execution_heartbeat(
        &self,
        run_id: &str,
        tool_call_id: &str,
        approval_id: &str,
        beat: u32,
    ) -> Result<Beat, StoreError> {
        let mut budget = Budget::new(self.contention_budget, "an execution heartbeat");
        let key = HashMap::from([
            ("run_id".to_owned(), s(run_id)),
            (
                "mutation_key".to_owned(),
                s(mutation_key(tool_call_id, approval_id)),
            ),
        ]);
        loop {
            // The head and the record as one snapshot: the settlement (or a cancel)
            // committing after it moves the head, so this append cannot follow it.
            let Some((head, item)) = self
                .head_with_item(run_id, &self.tables.mutations, key.clone())
                .await?
            else {
                budget.next().await?;
                continue;
            };
            let (Some(head), Some(item)) = (head, item) else {
                return Ok(Beat::Stopped);
            };
            let record = record_from_item(&item)?;
            let Some(draft) =
                execution::execution_heartbeat(&record, beat, head.status, now_millis())
            else {
                return Ok(Beat::Stopped);
            };
            if let Some(beat) = self.beat_on(head, draft).await? {
                return Ok(beat);
            }
            budget.next().await?;
        }
    }
}
