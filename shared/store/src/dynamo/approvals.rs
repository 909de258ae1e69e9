//! Approval cards on DynamoDB ([`ApprovalStore`]). Each transition is a plan for the
//! commit engine: the card (conditioned on its state), the run heads it advances and the
//! events that announce it, in one transaction.
//!
//! Approvals table: partition `run_id`, sort `item_key` — `card#<request_id>` for a card
//! (on the run that raised it) and `route#<request_id>` for a route item (on its
//! coordinator). Pending cards carry `pending_key` and `due_key`, which put them in two
//! sparse indexes by deadline; both are removed by the transition that ends them:
//!
//! - `pending_by_expiry` (`pending_key` = `<project>#<shard>`): one project's open cards
//!   in [`PENDING_SHARDS`](super::item::PENDING_SHARDS) partitions — a project operator's
//!   listing reads only those, whatever other tenants hold;
//! - `pending_due` (`due_key` = `due#<shard>`): every tenant's open cards in
//!   [`DUE_SHARDS`](super::item::DUE_SHARDS) partitions — the sweeper's overdue cards and
//!   a global operator's listing, each shard read up to the limit and merged.
//!
//! `pending_due` projects the fields a listing shows (INCLUDE), not the card's
//! bookkeeping (`timers_sent_at`, `count_shard`, TTL). `pending_by_expiry` keeps the ALL
//! projection it had: an existing index's projection cannot change without rebuilding it,
//! and its entries are the listing's fields anyway (the bookkeeping adds a few bytes; the
//! rare re-send mark rewrites its entry).
//! Cards armed before the per-project keys carry `pending_key = "pending"` and no
//! `due_key`; that legacy partition is read as one more shard (filtered by project for a
//! project operator) until they have ended, so the sweeper still expires them.
//!
//! Each project's open cards are counted in [`COUNTER_SHARDS`] items (`project#<project>`,
//! `open_cards#<shard>`), each holding its share of the cap: an arm adds to one shard
//! (the card's own by its ids; another with room once that one is full) conditioned on
//! its share, and the transition that ends the card takes from the shard the card names
//! (`count_shard`), in their transactions. So the cap holds across processes, and a busy
//! project's concurrent arms rarely meet on one item.

use async_trait::async_trait;
use std::collections::HashMap;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, KeysAndAttributes, Put, ReturnValuesOnConditionCheckFailure, Update,
};
use tollgate_domain::card::{self, BeatStep, EndStep};
use tollgate_domain::{
    now_millis, ApprovalRequest, ApprovalState, EventDraft, Policy, Resolution, RunHead,
};

use super::commit::{Budget, Committed, Plan, RunWrite, WriteKind};
use super::item::{
    build_error, card_from_item, card_key, card_to_item, counter_partition, due_partitions,
    first_count_shard, get_s, n, pending_partitions, project_counter_key, route_key, s, shard_cap,
    unavailable, Item, COUNTER_SHARDS, LEGACY_PENDING_KEY,
};
use super::{DynamoStore, DUE_INDEX, PENDING_INDEX};
use crate::{ApprovalStore, Armed, Beat, Forwarded, Located, Resolved, RunRef, StoreError};

/// The count shard a stored card was added to (`count_shard`); `None` for a card armed
/// before the count existed: it never added to it, so ending it takes nothing from it.
fn count_shard(item: &Item) -> Option<u32> {
    match item.get("count_shard") {
        Some(AttributeValue::N(v)) => v.parse().ok(),
        _ => None,
    }
}

/// Most cards one listing reads (a console page; the sweeper's batch).
const MAX_LISTED: usize = crate::MAX_PENDING_LISTED;

impl DynamoStore {
    fn card_put(
        &self,
        card: &ApprovalRequest,
        condition: &str,
        now: i64,
        arming: Option<u32>,
    ) -> Result<aws_sdk_dynamodb::types::TransactWriteItem, StoreError> {
        let mut item = card_to_item(card);
        if let Some(shard) = arming {
            // Arming sends the timers: a repeat within the window sends none (see
            // `claim_timer_resend`). And the count shard the arm adds the card to, which
            // the transition that ends it takes it from. Neither is projected.
            item.insert("timers_sent_at".into(), n(now));
            item.insert("count_shard".into(), n(shard));
        }
        // Retention counts from the card's deadline too: a pending card is never removed
        // before it can expire (and be announced).
        if let Some(exp) = self.expires_at(now.max(card.expires_at)) {
            item.insert("expires_at".into(), exp);
        }
        let mut put = Put::builder()
            .table_name(&self.tables.approvals)
            .set_item(Some(item))
            .condition_expression(condition)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if condition.contains(":pending") {
            put = put
                .expression_attribute_names("#state", "state")
                .expression_attribute_values(":pending", s(ApprovalState::Pending.as_str()));
        }
        if condition.contains(":created_at") {
            put = put.expression_attribute_values(":created_at", n(card.created_at));
        }
        Ok(aws_sdk_dynamodb::types::TransactWriteItem::builder()
            .put(put.build().map_err(build_error)?)
            .build())
    }

    /// Adds `delta` to shard `shard` of the open-card count of `project_id`; a positive
    /// change is conditioned on the shard staying within its share of `cap` (`u64::MAX`:
    /// no cap).
    fn counter_update(
        &self,
        project_id: Option<&str>,
        shard: u32,
        delta: i64,
        cap: u64,
    ) -> Result<aws_sdk_dynamodb::types::TransactWriteItem, StoreError> {
        let mut update = Update::builder()
            .table_name(&self.tables.approvals)
            .set_key(Some(project_counter_key(project_id, shard)))
            .update_expression("ADD #open :d")
            .expression_attribute_names("#open", "open")
            .expression_attribute_values(":d", n(delta))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if delta > 0 && cap < u64::MAX {
            // Invariant: a project holds at most `cap` pending cards, across processes —
            // each shard at most its share, and the shares add up to `cap`.
            update = update
                .condition_expression("attribute_not_exists(#open) OR #open <= :room")
                .expression_attribute_values(":room", n(shard_cap(cap, shard) as i64 - delta));
        }
        Ok(aws_sdk_dynamodb::types::TransactWriteItem::builder()
            .update(update.build().map_err(build_error)?)
            .build())
    }

    /// A count shard of the project with room under `cap` (strongly consistent), after
    /// `full` turned out full; `None`: every shard is at its share.
    async fn shard_with_room(
        &self,
        project_id: Option<&str>,
        cap: u64,
        full: u32,
    ) -> Result<Option<u32>, StoreError> {
        let partition = counter_partition(project_id);
        let keys: Vec<(&str, String)> = (0..COUNTER_SHARDS)
            .filter(|i| *i != full && shard_cap(cap, *i) > 0)
            .map(|i| (partition.as_str(), format!("open_cards#{i}")))
            .collect();
        if keys.is_empty() {
            return Ok(None);
        }
        let (items, _) = self.batch_read(&keys, &[]).await?;
        Ok((0..COUNTER_SHARDS)
            .filter(|i| *i != full && shard_cap(cap, *i) > 0)
            .find(|i| {
                let open = items
                    .get(&(partition.clone(), format!("open_cards#{i}")))
                    .and_then(|item| item.get("open"))
                    .and_then(|v| v.as_n().ok())
                    .and_then(|v| v.parse::<i64>().ok())
                    .unwrap_or(0);
                open < shard_cap(cap, *i) as i64
            }))
    }

    /// Open cards of one index partition (`(index, its key attribute, the partition)`),
    /// soonest deadline first, at most `limit` (fewer when the index still lists cards
    /// that just ended). `project`: only that project's (the legacy all-tenant partition).
    async fn pending_in(
        &self,
        (index, key_attr, partition): (&str, &str, String),
        due_before: Option<i64>,
        after: Option<&crate::ListingCursor>,
        project: Option<Option<&str>>,
        limit: usize,
    ) -> Result<Vec<ApprovalRequest>, StoreError> {
        let mut cards = Vec::new();
        let mut start = None;
        loop {
            let mut query = self
                .client
                .query()
                .table_name(&self.tables.approvals)
                .index_name(index)
                .expression_attribute_names("#pk", key_attr)
                .expression_attribute_values(":p", s(partition.clone()))
                .set_exclusive_start_key(start.take());
            query = match (due_before, after) {
                (Some(t), _) => query
                    .key_condition_expression("#pk = :p AND expires_at_ms <= :due")
                    .expression_attribute_values(":due", AttributeValue::N(t.to_string())),
                // A next page starts at the cursor's deadline (cards of that very deadline
                // up to the cursor are read again and skipped below).
                (None, Some(cursor)) => query
                    .key_condition_expression("#pk = :p AND expires_at_ms >= :from")
                    .expression_attribute_values(
                        ":from",
                        AttributeValue::N(cursor.expires_at.to_string()),
                    ),
                (None, None) => query.key_condition_expression("#pk = :p"),
            };
            query = match project {
                Some(Some(p)) => query
                    .filter_expression("project_id = :project")
                    .expression_attribute_values(":project", s(p)),
                Some(None) => query.filter_expression("attribute_not_exists(project_id)"),
                None => query.limit(limit.min(MAX_LISTED) as i32),
            };
            let out = query.send().await.map_err(unavailable)?;
            for item in out.items.unwrap_or_default() {
                // The index is eventually consistent: it may still list a card that just
                // ended. Callers act on the card itself (conditioned), never on this list.
                let card = card_from_item(&item)?;
                if card.state == ApprovalState::Pending && after.is_none_or(|a| a.precedes(&card)) {
                    cards.push(card);
                }
            }
            start = out.last_evaluated_key;
            if start.is_none() || cards.len() >= limit {
                cards.truncate(limit);
                return Ok(cards);
            }
        }
    }

    /// Open cards soonest deadline first, at most `limit`: of one project
    /// (`Some(project)`; `Some(None)`: runs without one) from its own partitions, or of
    /// every tenant (`None`) from the due index. Every shard is read up to `limit` and
    /// the answers merged, so the reads are bounded by the shards and the limit — never
    /// by what other tenants hold.
    pub(crate) async fn open_cards_of(
        &self,
        project: Option<Option<&str>>,
        due_before: Option<i64>,
        after: Option<&crate::ListingCursor>,
        limit: usize,
    ) -> Result<Vec<ApprovalRequest>, StoreError> {
        let limit = limit.min(MAX_LISTED);
        let (index, key_attr, partitions) = match project {
            Some(p) => (PENDING_INDEX, "pending_key", pending_partitions(p)),
            None => (DUE_INDEX, "due_key", due_partitions()),
        };
        let shards = partitions.into_iter().map(|partition| {
            self.pending_in((index, key_attr, partition), due_before, after, None, limit)
        });
        // Cards armed before the per-project keys (see the module's notes).
        let legacy = self.pending_in(
            (PENDING_INDEX, "pending_key", LEGACY_PENDING_KEY.to_owned()),
            due_before,
            after,
            project,
            limit,
        );
        let (found, legacy) =
            futures::future::try_join(futures::future::try_join_all(shards), legacy).await?;
        let mut cards: Vec<ApprovalRequest> = found.into_iter().flatten().chain(legacy).collect();
        cards.sort_by(|a, b| {
            (a.expires_at, &a.run_id, &a.request_id).cmp(&(b.expires_at, &b.run_id, &b.request_id))
        });
        cards.truncate(limit);
        Ok(cards)
    }

    async fn get_item(&self, run_id: &str, key: String) -> Result<Option<Item>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.tables.approvals)
            .key("run_id", s(run_id))
            .key("item_key", s(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(out.item)
    }

    /// The head of `run_id` if it is running.
    async fn running_head(&self, run_id: &str) -> Result<Option<RunHead>, StoreError> {
        Ok(self
            .get_head(run_id)
            .await?
            .filter(|h| !h.status.is_terminal()))
    }

    /// Approval items (`run_id`, `item_key`) and run heads in one strongly consistent
    /// `BatchGetItem` (one round trip unless DynamoDB leaves keys unprocessed, which are
    /// asked again). Answers items by `(run_id, item_key)` and heads by run id.
    async fn batch_read(
        &self,
        approval_keys: &[(&str, String)],
        head_ids: &[&str],
    ) -> Result<(HashMap<(String, String), Item>, HashMap<String, RunHead>), StoreError> {
        let key = |pairs: &[(&str, AttributeValue)]| -> Item {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect()
        };
        let mut request: HashMap<String, KeysAndAttributes> = HashMap::new();
        if !approval_keys.is_empty() {
            let keys = approval_keys
                .iter()
                .map(|(run, k)| key(&[("run_id", s(*run)), ("item_key", s(k.clone()))]))
                .collect();
            request.insert(
                self.tables.approvals.clone(),
                KeysAndAttributes::builder()
                    .set_keys(Some(keys))
                    .consistent_read(true)
                    .build()
                    .map_err(build_error)?,
            );
        }
        if !head_ids.is_empty() {
            let keys = head_ids
                .iter()
                .map(|run| key(&[("run_id", s(*run))]))
                .collect();
            request.insert(
                self.tables.runs.clone(),
                KeysAndAttributes::builder()
                    .set_keys(Some(keys))
                    .consistent_read(true)
                    .build()
                    .map_err(build_error)?,
            );
        }
        let mut items = HashMap::new();
        let mut heads = HashMap::new();
        let mut budget = Budget::new(self.contention_budget, "a batched read");
        loop {
            let out = self
                .client
                .batch_get_item()
                .set_request_items(Some(request))
                .send()
                .await
                .map_err(unavailable)?;
            for (table, found) in out.responses.unwrap_or_default() {
                for item in found {
                    if table == self.tables.runs {
                        let head = super::item::head_from_item(&item)?;
                        heads.insert(head.run_id.clone(), head);
                    } else {
                        let k = (get_s(&item, "run_id")?, get_s(&item, "item_key")?);
                        items.insert(k, item);
                    }
                }
            }
            match out.unprocessed_keys.filter(|u| !u.is_empty()) {
                None => return Ok((items, heads)),
                Some(rest) => {
                    request = rest;
                    budget.next().await?;
                }
            }
        }
    }

    /// The card `request_id` on `run_id` (or, with `follow_route`, the one its route item
    /// leads to) with its heads: one `BatchGetItem` for a card on the run posted to (plus a
    /// `GetItem` for a coordinator's head), two for a card reached through a route.
    async fn locate_card(
        &self,
        run_id: &str,
        request_id: &str,
        follow_route: bool,
    ) -> Result<Option<Located>, StoreError> {
        // Warm: the pending card and its heads as this instance last saw them, no read
        // (see `RecentCards`: every write that follows is conditioned on them).
        if let Some((card, count_shard)) = self.cards.get(run_id, request_id) {
            let head = self.recent.get(run_id).filter(|h| !h.status.is_terminal());
            let coordinator = match &card.coordinator_run_id {
                Some(c) if c != run_id => self.recent.get(c).filter(|h| !h.status.is_terminal()),
                _ => None,
            };
            if head.is_some() && (coordinator.is_some() || card.coordinator_run_id.is_none()) {
                return Ok(Some(Located {
                    card,
                    head,
                    coordinator,
                    count_shard,
                }));
            }
        }
        let card_k = card_key(request_id);
        let route_k = route_key(request_id);
        let mut keys = vec![(run_id, card_k.clone())];
        if follow_route {
            keys.push((run_id, route_k.clone()));
        }
        let (items, mut heads) = self.batch_read(&keys, &[run_id]).await?;
        let posted_head = heads.remove(run_id);
        if let Some(item) = items.get(&(run_id.to_owned(), card_k.clone())) {
            let card = card_from_item(item)?;
            let count_shard = count_shard(item);
            self.cards.put(&card, count_shard);
            // Warm, this process saw the coordinator's head moments ago (it is
            // conditioned like any read: a stale one loses and is replaced).
            let coordinator = match &card.coordinator_run_id {
                Some(c) if c != run_id => self.recent_head(c).await?,
                _ => None,
            };
            return Ok(Some(Located {
                card,
                head: posted_head,
                coordinator,
                count_shard,
            }));
        }
        let Some(route) = items.get(&(run_id.to_owned(), route_k)) else {
            return Ok(None);
        };
        let child = get_s(route, "child_run_id")?;
        let (items, mut heads) = self
            .batch_read(&[(child.as_str(), card_k.clone())], &[child.as_str()])
            .await?;
        let Some(item) = items.get(&(child.clone(), card_k)) else {
            return Ok(None);
        };
        let card = card_from_item(item)?;
        let count_shard = count_shard(item);
        // The coordinator posted to is the card's (a route names exactly one child).
        let coordinator =
            posted_head.filter(|_| card.coordinator_run_id.as_deref() == Some(run_id));
        Ok(Some(Located {
            head: heads.remove(&child),
            card,
            coordinator,
            count_shard,
        }))
    }

    /// Appends the keyed heartbeat `draft` on `head`'s run, conditioned on exactly that
    /// head (the fence: anything that ends what the heartbeat is about moves the head).
    /// `None`: the head moved — read again. The event's key is the chain's mark, taken in
    /// the same write: only the delivery that wrote beat `n` carries the chain on
    /// ([`Beat::Emitted`]); a duplicate delivery finds the key taken and answers
    /// [`Beat::Repeated`], so two deliveries of one beat never fork the chain. (Should the
    /// writer stop between this write and sending the next beat, the chain ends there:
    /// the card's expiry timer and the sweeper still end the card.)
    pub(crate) async fn beat_on(
        &self,
        head: RunHead,
        draft: EventDraft,
    ) -> Result<Option<Beat>, StoreError> {
        let sequence = head.next_seq;
        let plan = Plan {
            runs: vec![RunWrite {
                head,
                kind: WriteKind::Advance { end: None },
                events: vec![draft],
                open_cards: 0,
                budget_used: None,
            }],
            side: Vec::new(),
        };
        match self.commit(&plan).await? {
            Committed::Done { .. } => Ok(Some(Beat::Emitted(sequence))),
            Committed::Lost(lost) if lost.taken[0][0].is_some() => {
                Ok(Some(Beat::Repeated(lost.taken[0][0].unwrap_or(sequence))))
            }
            Committed::Lost(_) => Ok(None),
            Committed::Busy(why) => {
                tracing::debug!(%why, "heartbeat retry");
                Ok(None)
            }
        }
    }

    /// The sequence of the event keyed `event_id` on `run_id`, if it is stored.
    async fn keyed_event_sequence(
        &self,
        run_id: &str,
        event_id: &str,
    ) -> Result<Option<u64>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.tables.events)
            .key("run_id", s(run_id))
            .key("event_key", s(format!("id#{event_id}")))
            .projection_expression("#seq")
            .expression_attribute_names("#seq", "sequence")
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        Ok(out.item.and_then(|item| {
            item.get("sequence")
                .and_then(|v| v.as_n().ok())
                .and_then(|n| n.parse().ok())
        }))
    }

    /// The run's head and then its card as one serializable snapshot
    /// (`TransactGetItems`): a heartbeat's only read. `None` when the transaction was
    /// cancelled by a concurrent write (read again).
    async fn head_and_card(
        &self,
        run_id: &str,
        request_id: &str,
    ) -> Result<Option<(Option<RunHead>, Option<ApprovalRequest>)>, StoreError> {
        let card_k = HashMap::from([
            ("run_id".to_owned(), s(run_id)),
            ("item_key".to_owned(), s(card_key(request_id))),
        ]);
        let Some((head, card)) = self
            .head_with_item(run_id, &self.tables.approvals, card_k)
            .await?
        else {
            return Ok(None);
        };
        let card = card.map(|i| card_from_item(&i)).transpose()?;
        Ok(Some((head, card)))
    }
}

#[async_trait]
impl ApprovalStore for DynamoStore {
    async fn arm_within(
        &self,
        run: RunRef<'_>,
        card: ApprovalRequest,
        project_cap: u64,
    ) -> Result<Armed, StoreError> {
        let mut budget = Budget::new(self.contention_budget, "arming an approval");
        let mut shard = first_count_shard(&card, project_cap);
        loop {
            let head = self.live_head(run).await?;
            let stored = self.read_card(run.run_id, &card.request_id).await?;
            let running = !head.status.is_terminal();
            // The coordinator's head, when the card may be armed and names one (a run is
            // never its own coordinator: one transaction cannot write one head twice).
            let coordinator = match &card.coordinator_run_id {
                Some(c) if stored.is_none() && running && *c != card.run_id => {
                    self.running_head(c).await?
                }
                _ => None,
            };
            // (The commit's condition holds the per-run cap against concurrent arms; a
            // lost one reads the head again and stops here.)
            let step = card::arm(
                card.clone(),
                stored.as_ref(),
                running,
                head.open_cards,
                coordinator.is_some(),
            );
            let arming = match crate::to_commit(step, Some(&head))? {
                Ok(arming) => arming,
                Err(answer) => return Ok(answer),
            };
            let card = arming.card;
            let now = now_millis();
            // Invariant: one card per (run, request_id); a retried arm finds the first.
            let mut side =
                vec![self.card_put(&card, "attribute_not_exists(item_key)", now, Some(shard))?];
            let mut runs = vec![RunWrite {
                head: head.clone(),
                kind: WriteKind::Advance { end: None },
                events: vec![arming.on_run],
                open_cards: 1,
                budget_used: None,
            }];
            if let (Some(coord), Some(mirror)) = (&coordinator, arming.on_coordinator) {
                let route = Put::builder()
                    .table_name(&self.tables.approvals)
                    .item("run_id", s(&coord.run_id))
                    .item("item_key", s(route_key(&card.request_id)))
                    .item("child_run_id", s(&card.run_id))
                    // Invariant: a request_id names one child under a coordinator, so a
                    // decision posted to the coordinator reaches exactly that child.
                    .condition_expression("attribute_not_exists(item_key)")
                    .return_values_on_condition_check_failure(
                        ReturnValuesOnConditionCheckFailure::AllOld,
                    )
                    .build()
                    .map_err(build_error)?;
                side.push(
                    aws_sdk_dynamodb::types::TransactWriteItem::builder()
                        .put(route)
                        .build(),
                );
                runs.push(RunWrite {
                    head: coord.clone(),
                    kind: WriteKind::Advance { end: None },
                    events: vec![mirror],
                    open_cards: 0,
                    budget_used: None,
                });
            }
            let route_at = (side.len() > 1).then_some(1);
            let counter_at = side.len();
            side.push(self.counter_update(card.project_id.as_deref(), shard, 1, project_cap)?);
            let plan = Plan { runs, side };
            match self.commit(&plan).await? {
                Committed::Done { .. } => {
                    self.cards.put(&card, Some(shard));
                    return Ok(Armed::Created {
                        card,
                        sequence: head.next_seq,
                    });
                }
                Committed::Lost(lost) => {
                    if lost.side.first().is_some_and(Option::is_some) {
                        // Armed meanwhile by a retry of this call: answer its card.
                        continue;
                    }
                    if lost.side.get(counter_at).is_some_and(Option::is_some) {
                        // This shard holds its share: another with room, or the cap is
                        // reached.
                        match self
                            .shard_with_room(card.project_id.as_deref(), project_cap, shard)
                            .await?
                        {
                            Some(other) => shard = other,
                            None => return Err(crate::too_many_project_cards(project_cap)),
                        }
                    }
                    if route_at.is_some_and(|i| lost.side.get(i).is_some_and(Option::is_some)) {
                        return Err(StoreError::Conflict(
                            "request_id is already in use under this coordinator".into(),
                        ));
                    }
                }
                Committed::Busy(why) => tracing::debug!(%why, "arm retry"),
            }
            budget.next().await?;
        }
    }

    async fn claim_timer_resend(&self, run_id: &str, request_id: &str) -> Result<bool, StoreError> {
        // One conditional write on the card: of concurrent repeats, one wins; a repeat
        // that finds the mark set writes nothing.
        let result = self
            .client
            .update_item()
            .table_name(&self.tables.approvals)
            .key("run_id", s(run_id))
            .key("item_key", s(card_key(request_id)))
            .update_expression("SET timers_sent_at = :now")
            .condition_expression("#state = :pending AND attribute_not_exists(timers_sent_at)")
            .expression_attribute_names("#state", "state")
            .expression_attribute_values(":pending", s(ApprovalState::Pending.as_str()))
            .expression_attribute_values(":now", n(now_millis()))
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(SdkError::ServiceError(e))
                if matches!(e.err(), UpdateItemError::ConditionalCheckFailedException(_)) =>
            {
                Ok(false)
            }
            Err(e) => Err(unavailable(e)),
        }
    }

    async fn clear_timer_mark(&self, run_id: &str, request_id: &str) -> Result<(), StoreError> {
        self.client
            .update_item()
            .table_name(&self.tables.approvals)
            .key("run_id", s(run_id))
            .key("item_key", s(card_key(request_id)))
            .update_expression("REMOVE timers_sent_at")
            // Never creates an item: only a stored card loses its mark.
            .condition_expression("attribute_exists(item_key)")
            .send()
            .await
            .map(|_| ())
            .or_else(|e| match e {
                SdkError::ServiceError(se)
                    if matches!(
                        se.err(),
                        UpdateItemError::ConditionalCheckFailedException(_)
                    ) =>
                {
                    Ok(())
                }
                other => Err(unavailable(other)),
            })
    }

    async fn read_card(
        &self,
        run_id: &str,
        request_id: &str,
    ) -> Result<Option<ApprovalRequest>, StoreError> {
        self.get_item(run_id, card_key(request_id))
            .await?
            .map(|item| card_from_item(&item))
            .transpose()
    }

    async fn read_route(
        &self,
        coordinator_run_id: &str,
        request_id: &str,
    ) -> Result<Option<String>, StoreError> {
        self.get_item(coordinator_run_id, route_key(request_id))
            .await?
            .map(|item| get_s(&item, "child_run_id"))
            .transpose()
    }

    async fn locate(&self, run_id: &str, request_id: &str) -> Result<Option<Located>, StoreError> {
        self.locate_card(run_id, request_id, true).await
    }

    async fn locate_fresh(
        &self,
        run_id: &str,
        request_id: &str,
    ) -> Result<Option<Located>, StoreError> {
        self.cards.forget(run_id, request_id);
        self.locate_card(run_id, request_id, true).await
    }

    async fn resolve(
        &self,
        run_id: &str,
        request_id: &str,
        resolution: Resolution,
        at: i64,
        grant: Option<Policy>,
    ) -> Result<Resolved, StoreError> {
        let located = self
            .locate_card(run_id, request_id, false)
            .await?
            .ok_or(StoreError::NotFound)?;
        self.resolve_located(located, resolution, at, grant).await
    }

    async fn resolve_located(
        &self,
        mut located: Located,
        resolution: Resolution,
        at: i64,
        grant: Option<Policy>,
    ) -> Result<Resolved, StoreError> {
        let mut budget = Budget::new(self.contention_budget, "resolving an approval");
        loop {
            // Each commit attempt judges an approval by the clock as it commits, not the
            // click's: an approval retried (contention) past the card's deadline expires
            // it instead (docs/architecture.md §6). A denial is judged by its click's time
            // (`Resolution::judged_at`).
            let at = resolution.judged_at(at, now_millis());
            let card = &located.card;
            let head = located
                .head
                .clone()
                .filter(|h| h.run_id == card.run_id && !h.status.is_terminal());
            let coordinator = located.coordinator.clone().filter(|c| {
                card.coordinator_run_id.as_deref() == Some(c.run_id.as_str())
                    && !c.status.is_terminal()
            });
            let step = card::end(
                card,
                resolution.clone(),
                head.is_some(),
                coordinator.is_some(),
                at,
                grant.clone(),
            );
            let ending = match step {
                EndStep::Already(card) => return Ok(Resolved::Already(card)),
                EndStep::End(ending) => ending,
            };
            let ended = ending.card;
            let now = now_millis();
            // Invariant: a card ends once — exactly one resolution, one resolved event,
            // one policy; the losers of a race read the winner's state.
            // Conditioned on the card as it was armed too (its `created_at` never
            // changes): a remembered card of an earlier run of the same id loses here,
            // and the stored card it is answered with is decided instead
            // (docs/architecture.md §6).
            let mut side = vec![self.card_put(
                &ended,
                "attribute_exists(item_key) AND #state = :pending AND created_at = :created_at",
                now,
                None,
            )?];
            // The scope's policy, only with the approval that won.
            if let Some(policy) = &ending.grant {
                side.push(self.policy_grant(policy)?);
            }
            // The card leaves its project's open-card count with the transition that ends
            // it (decision, expiry by timer or sweeper, a run's end) — never otherwise.
            if let Some(shard) = located.count_shard {
                side.push(self.counter_update(ended.project_id.as_deref(), shard, -1, u64::MAX)?);
            }
            let mut runs = Vec::new();
            // (On an ended run the card expires without an event there: nothing may
            // follow its terminal event. Its running coordinator is still told, so no
            // console keeps live buttons for it.)
            let on_run = ending.on_run.is_some();
            if let (Some(head), Some(event)) = (head, ending.on_run) {
                runs.push(RunWrite {
                    head,
                    kind: WriteKind::Advance { end: None },
                    events: vec![event],
                    open_cards: -1,
                    budget_used: None,
                });
            }
            let on_coordinator = ending.on_coordinator.is_some();
            if let (Some(coord), Some(event)) = (coordinator, ending.on_coordinator) {
                runs.push(RunWrite {
                    head: coord,
                    kind: WriteKind::Advance { end: None },
                    events: vec![event],
                    open_cards: 0,
                    budget_used: None,
                });
            }
            // An approval is not resent past the card's deadline (a resend could commit
            // after it); a denial or an expiry may be.
            let not_after = (ended.state == ApprovalState::Approved).then_some(ended.expires_at);
            match self.commit_until(&Plan { runs, side }, not_after).await? {
                Committed::Done { .. } => {
                    self.cards.forget(&ended.run_id, &ended.request_id);
                    return Ok(Resolved::Fresh(ended));
                }
                Committed::Lost(lost) => {
                    // Each failed condition returned the stored item: act on those,
                    // never on the stale reads (no second read for a lost race).
                    let vanished = matches!(lost.side[0], Some(None))
                        || lost.heads.iter().any(|h| matches!(h, Some(None)));
                    if vanished {
                        // A failed condition without the stored item: read everything
                        // again (not from the recent heads) rather than take the item for
                        // deleted.
                        if let Some(c) = &card.coordinator_run_id {
                            self.recent.forget(c);
                        }
                        self.cards.forget(&card.run_id, &card.request_id);
                        let (run_id, request_id) = (card.run_id.clone(), card.request_id.clone());
                        located = self
                            .locate_card(&run_id, &request_id, false)
                            .await?
                            .ok_or(StoreError::NotFound)?;
                        budget.next().await?;
                        continue;
                    }
                    if let Some(Some(item)) = &lost.side[0] {
                        located.card = card_from_item(item)?;
                        located.count_shard = count_shard(item);
                        self.cards.put(&located.card, located.count_shard);
                        if located.card.state != ApprovalState::Pending {
                            continue;
                        }
                    }
                    let mut heads = lost.heads.into_iter();
                    if on_run {
                        if let Some(Some(stored)) = heads.next() {
                            located.head = stored;
                        }
                    }
                    if on_coordinator {
                        if let Some(Some(stored)) = heads.next() {
                            // The stored head replaces the stale one here and for the
                            // next decisions of this process.
                            if let Some(h) = &stored {
                                self.recent.put(h);
                            }
                            located.coordinator = stored;
                        }
                    }
                }
                Committed::Busy(why) => tracing::debug!(%why, "resolve retry"),
            }
            budget.next().await?;
        }
    }

    async fn heartbeat(
        &self,
        run_id: &str,
        request_id: &str,
        beat: u32,
    ) -> Result<Beat, StoreError> {
        let mut budget = Budget::new(self.contention_budget, "a heartbeat");
        loop {
            // The head and the card as one snapshot: a resolution committing after it
            // moves the head, so the append below (conditioned on this head) cannot
            // follow it. No condition on the card is needed — the run's sequence is the
            // fence.
            let Some((head, card)) = self.head_and_card(run_id, request_id).await? else {
                budget.next().await?;
                continue;
            };
            let head = head.filter(|h| !h.status.is_terminal());
            let (Some(head), BeatStep::Append(draft)) = (
                head.clone(),
                card::beat(card.as_ref(), head.is_some(), beat),
            ) else {
                return Ok(Beat::Stopped);
            };
            let beat = self.beat_on(head, draft).await?;
            if let Some(beat) = beat {
                return Ok(beat);
            }
            budget.next().await?;
        }
    }

    async fn record_forwarded(
        &self,
        run_id: &str,
        card: &ApprovalRequest,
        grant: Option<Policy>,
    ) -> Result<Forwarded, StoreError> {
        let mut budget = Budget::new(self.contention_budget, "a forwarded decision");
        let draft = card.forwarded_resolved_event();
        // The event's sequence once another forward of this decision is known to have
        // written it.
        let mut written: Option<u64> = None;
        loop {
            let head = self.get_head(run_id).await?.ok_or(StoreError::NotFound)?;
            if head.status.is_terminal() {
                // Written before the run ended? Then it is that forward's answer.
                if let Some(seq) = written {
                    return Ok(Forwarded::Already(seq));
                }
                let id = draft.event_id.clone().unwrap_or_default();
                return Ok(match self.keyed_event_sequence(run_id, &id).await? {
                    Some(seq) => Forwarded::Already(seq),
                    None => Forwarded::RunEnded,
                });
            }
            let sequence = head.next_seq;
            let mut side = Vec::new();
            // With the event, the card as it ended in the pod — only where no card is: one
            // its pod announced meanwhile is the card this decision is for.
            if written.is_none() {
                side.push(self.card_put(
                    &card.forwarded_record(),
                    "attribute_not_exists(item_key)",
                    now_millis(),
                    None,
                )?);
            }
            // Once the event is there, a grant is written only where no policy is (granted
            // or revoked): the same decision sent again never undoes a revocation.
            if let (Some(seq), Some(policy)) = (written, &grant) {
                if self
                    .get_policy(&policy.scope_key, &policy.tool_name)
                    .await?
                    .is_some()
                {
                    return Ok(Forwarded::Already(seq));
                }
            }
            if let (Some(policy), ApprovalState::Approved) = (&grant, card.state) {
                let mut policy = policy.clone();
                policy.reached_runs = vec![card.run_id.clone()];
                side.push(self.policy_grant(&policy)?);
            }
            let has_grant = grant.is_some() && card.state == ApprovalState::Approved;
            // Once another forward of this decision wrote the event, only this forward's
            // grant is left to write: with the run's head (still running) and no event.
            let events = match written {
                Some(_) => Vec::new(),
                None => vec![draft.clone()],
            };
            let plan = Plan {
                runs: vec![RunWrite {
                    head,
                    kind: WriteKind::Advance { end: None },
                    events,
                    open_cards: 0,
                    budget_used: None,
                }],
                side,
            };
            match (written, self.commit(&plan).await?) {
                (Some(seq), Committed::Done { .. }) => return Ok(Forwarded::Already(seq)),
                (None, Committed::Done { .. }) => return Ok(Forwarded::Fresh(sequence)),
                // An earlier forward of this decision wrote it.
                (None, Committed::Lost(lost)) if lost.taken[0][0].is_some() => {
                    let seq = lost.taken[0][0].unwrap_or(sequence);
                    if !has_grant {
                        return Ok(Forwarded::Already(seq));
                    }
                    written = Some(seq);
                    continue;
                }
                (None, Committed::Lost(lost))
                    if lost.heads[0].is_none()
                        && lost.side.first().is_some_and(Option::is_some) =>
                {
                    return Ok(Forwarded::CardExists)
                }
                (_, Committed::Lost(_)) => {}
                (_, Committed::Busy(why)) => tracing::debug!(%why, "forwarded decision retry"),
            }
            budget.next().await?;
        }
    }

    async fn read_policy(
        &self,
        scope_key: &str,
        tool_name: &str,
    ) -> Result<Option<Policy>, StoreError> {
        self.get_policy(scope_key, tool_name).await
    }

    async fn find_policy(
        &self,
        scope_keys: &[String],
        tool_name: &str,
    ) -> Result<Option<Policy>, StoreError> {
        self.find_live_policy(scope_keys, tool_name).await
    }

    async fn auto_approve(
        &self,
        run: RunRef<'_>,
        card: &ApprovalRequest,
        policy: &Policy,
    ) -> Result<u64, StoreError> {
        self.auto_approve_run(run, card, policy).await
    }

    async fn list_policies(
        &self,
        project_id: Option<&str>,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<crate::PolicyPage, StoreError> {
        self.policies(project_id, cursor, limit).await
    }

    async fn revoke_policy(
        &self,
        scope_key: &str,
        tool_name: &str,
        by: &str,
        at: i64,
    ) -> Result<Option<Policy>, StoreError> {
        self.revoke(scope_key, tool_name, by, at).await
    }

    async fn announce_revocation(
        &self,
        scope_key: &str,
        tool_name: &str,
    ) -> Result<Option<Policy>, StoreError> {
        match self.get_policy(scope_key, tool_name).await? {
            Some(policy) if !policy.is_live() => {
                self.announce_revocation_of(&policy).await?;
                Ok(Some(policy))
            }
            other => Ok(other),
        }
    }

    async fn silent_children(
        &self,
        silent_since: i64,
        limit: usize,
    ) -> Result<Vec<RunHead>, StoreError> {
        self.query_silent_children(silent_since, limit).await
    }

    async fn report_stall(
        &self,
        child: &RunHead,
        check: &tollgate_domain::StallCheck,
    ) -> Result<Option<u64>, StoreError> {
        self.write_stall_report(child, check).await
    }

    async fn pending_cards(&self, run_id: &str) -> Result<Vec<ApprovalRequest>, StoreError> {
        let mut cards = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.tables.approvals)
                .consistent_read(true)
                .key_condition_expression("run_id = :r AND begins_with(item_key, :card)")
                .filter_expression("#state = :pending")
                .expression_attribute_names("#state", "state")
                .expression_attribute_values(":r", s(run_id))
                .expression_attribute_values(":card", s("card#"))
                .expression_attribute_values(":pending", s(ApprovalState::Pending.as_str()))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(unavailable)?;
            for item in out.items.unwrap_or_default() {
                cards.push(card_from_item(&item)?);
            }
            start = out.last_evaluated_key;
            if start.is_none() || cards.len() >= MAX_LISTED {
                return Ok(cards);
            }
        }
    }

    async fn open_cards(
        &self,
        project_id: Option<&str>,
        due_before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<ApprovalRequest>, StoreError> {
        self.open_cards_of(project_id.map(Some), due_before, None, limit)
            .await
    }

    async fn open_cards_after(
        &self,
        project_id: Option<&str>,
        after: &crate::ListingCursor,
        limit: usize,
    ) -> Result<Vec<ApprovalRequest>, StoreError> {
        self.open_cards_of(project_id.map(Some), None, Some(after), limit)
            .await
    }
}
