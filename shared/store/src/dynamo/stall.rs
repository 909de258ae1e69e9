//! The stall guard's reads and writes on DynamoDB. The runs table's sparse index
//! `running_children` (`running_child`, `last_event_at`) holds exactly the running child
//! runs, by their last event, so the silent ones are one `Query`.

use aws_sdk_dynamodb::types::{
    AttributeValue, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use tollgate_domain::{stall_detected_event, RunHead, RunStatus};

use super::commit::{Budget, Committed, Plan, RunWrite, WriteKind};
use super::item::{build_error, head_from_item, n, s, unavailable, RUNNING_CHILD};
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
        let mut heads = Vec::new();
        let mut start = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(&self.tables.runs)
                .index_name(RUNNING_CHILDREN_INDEX)
                .key_condition_expression("running_child = :r AND last_event_at <= :t")
                .expression_attribute_values(":r", s(RUNNING_CHILD))
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
        now: i64,
    ) -> Result<Option<u64>, StoreError> {
        let Some(coordinator) = &child.parent_run_id else {
            return Ok(None);
        };
        let mut budget = Budget::new(self.contention_budget, "a stall report");
        loop {
            let Some(coord) = self
                .get_head(coordinator)
                .await?
                .filter(|h| !h.status.is_terminal())
            else {
                return Ok(None);
            };
            let mark = Update::builder()
                .table_name(&self.tables.runs)
                .key("run_id", s(&child.run_id))
                .update_expression("SET stall_reported_seq = :seen")
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
            let sequence = coord.next_seq;
            let plan = Plan {
                runs: vec![RunWrite {
                    head: coord,
                    kind: WriteKind::Advance { end: None },
                    events: vec![stall_detected_event(child, now)],
                }],
                side: vec![TransactWriteItem::builder().update(mark).build()],
            };
            match self.commit(&plan).await? {
                Committed::Done { .. } => return Ok(Some(sequence)),
                // The child spoke (or ended) meanwhile: no stall to report.
                Committed::Lost(lost) if lost.side[0].is_some() => return Ok(None),
                Committed::Lost(_) => {}
                Committed::Busy(why) => tracing::debug!(%why, "stall report retry"),
            }
            budget.next().await?;
        }
    }
}
