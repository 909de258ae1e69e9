//! The stall guard's reads and writes on DynamoDB. The runs table's sparse index
//! `running_children` (`running_child`, `last_event_at`) holds the running child runs
//! that may still need a report, by their last event. `running_child` is one of
//! [`STALL_SHARDS`](super::item::STALL_SHARDS) partitions (`running#<shard>`, chosen anew
//! on every append), so no single index partition takes every child's writes; the silent
//! ones are one `Query` per shard, merged oldest silence first. Heads written before the
//! sharding still carry the legacy `running` partition, which is read as one more shard
//! until they have appended again or ended.
//!
//! A child leaves the index when its silence is reported, when the guard finds its
//! coordinator ended or gone (nobody to report to), and when it ends; every event it
//! appends puts it back (the commit engine sets `running_child` on each append to a child
//! run). So the front of the index is never held by children already dealt with, and a
//! child that speaks after a report and falls silent again is listed and reported again
//! (seed 003: the guard cannot latch).

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use tollgate_domain::event::types as ev;
use tollgate_domain::{
    stall_detected_event, stall_failure_payload, EventDraft, RunHead, RunStatus, StallAction,
    StallCheck, TerminalKind,
};

use super::commit::{Budget, Committed, Plan, RunWrite, WriteKind};
use super::item::{build_error, head_from_item, n, running_child_partitions, s, unavailable};
use super::DynamoStore;
use crate::StoreError;

/// The runs table's index of running child runs.
pub const RUNNING_CHILDREN_INDEX: &str = "running_children";

impl DynamoStore {
    pub(crate) async fn query_silent_children(
        &self,
        silent_since: i64,
        limit: usize,
    ) -> Result<Vec<RunHead>, StoreError> {
        let shards = running_child_partitions();
        let found = futures::future::try_join_all(
            shards
                .iter()
                .map(|shard| self.silent_in(shard, silent_since, limit)),
        )
        .await?;
        // Each shard answers its oldest silences first; the merge keeps the oldest overall.
        let mut heads: Vec<RunHead> = found.into_iter().flatten().collect();
        heads.sort_by(|a, b| (a.last_event_at, &a.run_id).cmp(&(b.last_event_at, &b.run_id)));
        heads.dedup_by(|a, b| a.run_id == b.run_id);
        heads.truncate(limit);
        Ok(heads)
    }

    /// The silent children of one `running_child` partition, oldest silence first.
    async fn silent_in(
        &self,
        partition: &str,
        silent_since: i64,
        limit: usize,
    ) -> Result<Vec<RunHead>, StoreError> {
        let mut heads = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.tables.runs)
                .index_name(RUNNING_CHILDREN_INDEX)
                .key_condition_expression("running_child = :r AND last_event_at <= :t")
                // A child already reported at this silence is no candidate. Reports take
                // the child out of the index, so this only skips entries reported before
                // they did (or that the index still shows for a moment): they cannot
                // hold the front of the list either.
                // Nor is a child waiting on a card (seed 003: never stalled while its
                // latest real event is `tool.approval_required`): a page of those must not
                // fill the batch while a real stall waits behind them.
                // Nor one holding a pending card armed before its latest event.
                .filter_expression(
                    "(attribute_not_exists(stall_reported_seq) OR stall_reported_seq <> next_seq) \
                     AND (attribute_not_exists(last_real_type) OR last_real_type <> :waiting) \
                     AND (attribute_not_exists(open_cards) OR open_cards <= :none)",
                )
                .expression_attribute_values(":none", n(0))
                .expression_attribute_values(":waiting", s(ev::APPROVAL_REQUIRED))
                .expression_attribute_values(":r", s(partition))
                .expression_attribute_values(":t", AttributeValue::N(silent_since.to_string()))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(unavailable)?;
            for item in out.items.unwrap_or_default() {
                heads.push(head_from_item(&item)?);
            }
            start = out.last_evaluated_key;
            if start.is_none() || heads.len() >= limit {
                heads.truncate(limit);
                return Ok(heads);
            }
        }
    }

    pub(crate) async fn write_stall_report(
        &self,
        child: &RunHead,
        check: &StallCheck,
    ) -> Result<Option<u64>, StoreError> {
        // Waiting on a card (even one armed before its latest event): not stalled. The
        // head's count is the one as read, and every write below is conditioned on that
        // head, so a card armed since makes it lose.
        if child.open_cards > 0 {
            self.unlist_child(child).await?;
            return Ok(None);
        }
        let fail = check.action == StallAction::Fail;
        let mut budget = Budget::new(self.contention_budget, "a stall report");
        loop {
            let coord = match &child.parent_run_id {
                Some(c) => self.get_head(c).await?.filter(|h| !h.status.is_terminal()),
                None => None,
            };
            if coord.is_none() && !fail {
                // Nobody to report to, ever: out of the index, or it would hold the
                // front for good and starve newer silences.
                self.unlist_child(child).await?;
                return Ok(None);
            }
            let sequence = coord.as_ref().map(|c| c.next_seq);
            let mut runs = Vec::new();
            if let Some(coord) = coord {
                runs.push(RunWrite {
                    head: coord,
                    kind: WriteKind::Advance { end: None },
                    events: vec![stall_detected_event(child, check)],
                    open_cards: 0,
                    budget_used: None,
                });
            }
            let mut side = Vec::new();
            if fail {
                // Reported already at this silence (by a guard in `report` mode, say
                // during a rollout): the coordinator has been told; say nothing twice.
                if child.stall_reported_seq == Some(child.next_seq) {
                    return Ok(None);
                }
                // Seed 003: the silent child is failed as `agent_stall_timeout`, in the
                // same transaction as its coordinator's report — conditioned on the head
                // exactly as read (no event since, still running), which also takes it
                // out of the stall index.
                runs.push(RunWrite {
                    head: child.clone(),
                    kind: WriteKind::Advance {
                        end: Some(TerminalKind::Fail),
                    },
                    events: vec![EventDraft::server(
                        TerminalKind::Fail.event_type(),
                        stall_failure_payload(check),
                    )],
                    open_cards: 0,
                    budget_used: None,
                });
            } else {
                let mark = Update::builder()
                    .table_name(&self.tables.runs)
                    .key("run_id", s(&child.run_id))
                    // Reported: out of the index until the child speaks again.
                    .update_expression("SET stall_reported_seq = :seen REMOVE running_child")
                    // Invariant: a silence is reported only while it lasts — the child is
                    // exactly as read (no event since), still running.
                    .condition_expression(
                        "next_seq = :seen AND #status = :running AND \
                         (attribute_not_exists(stall_reported_seq) OR stall_reported_seq <> :seen)",
                    )
                    .expression_attribute_names("#status", "status")
                    .expression_attribute_values(":seen", n(child.next_seq))
                    .expression_attribute_values(":running", s(RunStatus::Running.as_str()))
                    .return_values_on_condition_check_failure(
                        ReturnValuesOnConditionCheckFailure::AllOld,
                    )
                    .build()
                    .map_err(build_error)?;
                side.push(TransactWriteItem::builder().update(mark).build());
            }
            let child_at = runs.len() - 1;
            match self.commit(&Plan { runs, side }).await? {
                Committed::Done { now } => {
                    if fail {
                        // The child can start no call any more: its mutation records
                        // may go with it, as after any end.
                        self.expire_mutations_with_run(&child.run_id, now).await;
                    }
                    return Ok(sequence);
                }
                // The child spoke (or ended) meanwhile: no stall to report.
                Committed::Lost(lost) if !fail && lost.side[0].is_some() => return Ok(None),
                Committed::Lost(lost)
                    if fail && matches!(lost.heads.get(child_at), Some(Some(_))) =>
                {
                    return Ok(None)
                }
                Committed::Lost(_) => {}
                Committed::Busy(why) => tracing::debug!(%why, "stall report retry"),
            }
            budget.next().await?;
        }
    }

    /// Takes a silent child whose coordinator has ended (or is gone) out of the stall
    /// guard's index — only if it is exactly as read (the same incarnation, no event
    /// since, still running): a child that spoke meanwhile is listed by its new silence.
    async fn unlist_child(&self, child: &RunHead) -> Result<(), StoreError> {
        let mut update = self
            .client
            .update_item()
            .table_name(&self.tables.runs)
            .key("run_id", s(&child.run_id))
            .update_expression("REMOVE running_child")
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":seen", n(child.next_seq))
            .expression_attribute_values(":running", s(RunStatus::Running.as_str()));
        // A head without an incarnation was written before incarnations existed.
        let same_incarnation = if child.incarnation.is_empty() {
            "attribute_not_exists(incarnation)"
        } else {
            update = update.expression_attribute_values(":inc", s(&child.incarnation));
            "incarnation = :inc"
        };
        let result = update
            .condition_expression(format!(
                "next_seq = :seen AND #status = :running AND {same_incarnation}"
            ))
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            // It spoke, ended or was created again meanwhile: nothing to take out.
            Err(SdkError::ServiceError(e))
                if matches!(e.err(), UpdateItemError::ConditionalCheckFailedException(_)) =>
            {
                Ok(())
            }
            Err(e) => Err(unavailable(e)),
        }
    }
}
