//! Scope policies on DynamoDB. Policies table: partition `scope_key`, sort `tool_name`;
//! `reached_runs` (a string set) names the streams a revocation is announced on; the
//! index `policies_by_project` (`project_key`, `granted_at`) lists one project's grants.

use std::collections::HashMap;

use aws_sdk_dynamodb::error::SdkError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{
    AttributeValue, ConditionCheck, KeysAndAttributes, Put, ReturnValue,
    ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use tollgate_domain::{now_millis, ApprovalRequest, Policy};

use super::commit::{Budget, Committed, Plan, RunWrite, WriteKind};
use super::item::{build_error, card_to_item, n, policy_from_item, s, unavailable};
use super::DynamoStore;
use crate::{RunRef, RunStore, StoreError};

/// The index of the policies table by project.
pub const POLICIES_BY_PROJECT: &str = "policies_by_project";

fn project_key(project_id: Option<&str>) -> String {
    project_id.unwrap_or("-").to_owned()
}

/// A `LastEvaluatedKey` as an opaque cursor: its attributes' values in `names` order.
pub(super) fn cursor_from_key(
    key: &HashMap<String, AttributeValue>,
    names: &[(&'static str, bool)],
) -> Option<String> {
    let values: Option<Vec<String>> = names
        .iter()
        .map(|(name, numeric)| match (key.get(*name), numeric) {
            (Some(AttributeValue::S(v)), false) | (Some(AttributeValue::N(v)), true) => {
                Some(v.clone())
            }
            _ => None,
        })
        .collect();
    values.map(|v| crate::encode_cursor(&serde_json::json!(v)))
}

/// The start key in a cursor of [`cursor_from_key`], checked: exactly this listing's
/// attributes, numbers where numbers belong, and this project's key.
fn start_key_from_cursor(
    cursor: &str,
    names: &[(&'static str, bool)],
    project_id: Option<&str>,
) -> Result<HashMap<String, AttributeValue>, StoreError> {
    let tenant = project_id.map(|p| ("project_key", project_key(Some(p))));
    start_key_of_tenant(cursor, names, tenant)
}

/// [`start_key_from_cursor`] for any listing: `tenant` names the index's partition
/// attribute and the value the cursor must hold there (a cursor of another tenant is
/// `InvalidCursor`, so no start key can reach another tenant's items).
pub(super) fn start_key_of_tenant(
    cursor: &str,
    names: &[(&'static str, bool)],
    tenant: Option<(&str, String)>,
) -> Result<HashMap<String, AttributeValue>, StoreError> {
    let values = crate::decode_cursor(cursor)?;
    let values = values.as_array().ok_or(StoreError::InvalidCursor)?;
    if values.len() != names.len() {
        return Err(StoreError::InvalidCursor);
    }
    let mut key = HashMap::new();
    for ((name, numeric), v) in names.iter().zip(values) {
        let v = v.as_str().ok_or(StoreError::InvalidCursor)?;
        let value = if *numeric {
            v.parse::<i64>().map_err(|_| StoreError::InvalidCursor)?;
            AttributeValue::N(v.to_owned())
        } else {
            AttributeValue::S(v.to_owned())
        };
        key.insert((*name).to_owned(), value);
    }
    if let Some((name, value)) = tenant {
        if key.get(name) != Some(&s(value)) {
            return Err(StoreError::InvalidCursor);
        }
    }
    Ok(key)
}

impl DynamoStore {
    /// The grant written with the decision that won: (re)made live, its origin run
    /// added to the streams it reached.
    pub(crate) fn policy_grant(&self, p: &Policy) -> Result<TransactWriteItem, StoreError> {
        let mut update = Update::builder()
            .table_name(&self.tables.policies)
            .key("scope_key", s(&p.scope_key))
            .key("tool_name", s(&p.tool_name))
            .update_expression(
                "SET #scope = :scope, project_key = :pk, origin_run_id = :origin, \
                 request_id = :rid, granted_by = :by, granted_at = :at \
                 ADD reached_runs :run REMOVE revoked_by, revoked_at",
            )
            .expression_attribute_names("#scope", "scope")
            .expression_attribute_values(":scope", s(p.scope.as_str()))
            .expression_attribute_values(":pk", s(project_key(p.project_id.as_deref())))
            .expression_attribute_values(":origin", s(&p.origin_run_id))
            .expression_attribute_values(":rid", s(&p.request_id))
            .expression_attribute_values(":by", s(&p.granted_by))
            .expression_attribute_values(":at", n(p.granted_at))
            .expression_attribute_values(":run", AttributeValue::Ss(vec![p.origin_run_id.clone()]));
        let mut set_extra = Vec::new();
        if let Some(owner) = &p.owner {
            update = update.expression_attribute_values(":owner", s(owner));
            set_extra.push("#owner = :owner");
            update = update.expression_attribute_names("#owner", "owner");
        }
        if let Some(project) = &p.project_id {
            update = update.expression_attribute_values(":project", s(project));
            set_extra.push("project_id = :project");
        }
        if !set_extra.is_empty() {
            let expr = format!(
                "SET #scope = :scope, project_key = :pk, origin_run_id = :origin, \
                 request_id = :rid, granted_by = :by, granted_at = :at, {} \
                 ADD reached_runs :run REMOVE revoked_by, revoked_at",
                set_extra.join(", ")
            );
            update = update.update_expression(expr);
        }
        Ok(TransactWriteItem::builder()
            .update(update.build().map_err(build_error)?)
            .build())
    }

    pub(crate) async fn get_policy(
        &self,
        scope_key: &str,
        tool_name: &str,
    ) -> Result<Option<Policy>, StoreError> {
        let out = self
            .client
            .get_item()
            .table_name(&self.tables.policies)
            .key("scope_key", s(scope_key))
            .key("tool_name", s(tool_name))
            .consistent_read(true)
            .send()
            .await
            .map_err(unavailable)?;
        out.item.map(|i| policy_from_item(&i)).transpose()
    }

    pub(crate) async fn find_live_policy(
        &self,
        scope_keys: &[String],
        tool_name: &str,
    ) -> Result<Option<Policy>, StoreError> {
        if scope_keys.is_empty() {
            return Ok(None);
        }
        let keys = scope_keys
            .iter()
            .map(|k| {
                HashMap::from([
                    ("scope_key".to_string(), s(k)),
                    ("tool_name".to_string(), s(tool_name)),
                ])
            })
            .collect();
        let request = KeysAndAttributes::builder()
            .set_keys(Some(keys))
            .consistent_read(true)
            .build()
            .map_err(build_error)?;
        let mut found = Vec::new();
        let mut pending = Some(request);
        let mut attempt = 0u32;
        while let Some(req) = pending.take() {
            let out = self
                .client
                .batch_get_item()
                .request_items(&self.tables.policies, req)
                .send()
                .await
                .map_err(unavailable)?;
            for item in out
                .responses
                .unwrap_or_default()
                .remove(&self.tables.policies)
                .unwrap_or_default()
            {
                found.push(policy_from_item(&item)?);
            }
            pending = out
                .unprocessed_keys
                .and_then(|mut u| u.remove(&self.tables.policies));
            if pending.is_some() {
                attempt += 1;
                if attempt > 5 {
                    return Err(StoreError::Unavailable(
                        "policy lookups kept coming back unprocessed".into(),
                    ));
                }
                super::commit::backoff(attempt).await;
            }
        }
        Ok(scope_keys
            .iter()
            .find_map(|k| found.iter().find(|p| p.scope_key == *k && p.is_live()))
            .cloned())
    }

    pub(crate) async fn auto_approve_run(
        &self,
        run: RunRef<'_>,
        card: &ApprovalRequest,
        policy: &Policy,
    ) -> Result<u64, StoreError> {
        let mut budget = Budget::new(self.contention_budget, "an auto-approval");
        loop {
            let head = self.live_head(run).await?;
            if head.status.is_terminal() {
                return Err(StoreError::RunTerminal {
                    status: head.status,
                    terminal_seq: head.terminal_seq.unwrap_or(head.last_sequence()),
                });
            }
            // Invariant: nothing is auto-approved by a policy that is revoked (or gone)
            // when the approval commits. The streams it reached are recorded up to the
            // number a revocation announces on, so the item stays small.
            let live = "attribute_exists(scope_key) AND attribute_not_exists(revoked_at)";
            let reach = if policy.reached_runs.len() < crate::MAX_ANNOUNCED_RUNS {
                let update = Update::builder()
                    .table_name(&self.tables.policies)
                    .key("scope_key", s(&policy.scope_key))
                    .key("tool_name", s(&policy.tool_name))
                    .update_expression("ADD reached_runs :run")
                    .condition_expression(live)
                    .expression_attribute_values(
                        ":run",
                        AttributeValue::Ss(vec![card.run_id.clone()]),
                    )
                    .return_values_on_condition_check_failure(
                        ReturnValuesOnConditionCheckFailure::AllOld,
                    )
                    .build()
                    .map_err(build_error)?;
                TransactWriteItem::builder().update(update).build()
            } else {
                let check = ConditionCheck::builder()
                    .table_name(&self.tables.policies)
                    .key("scope_key", s(&policy.scope_key))
                    .key("tool_name", s(&policy.tool_name))
                    .condition_expression(live)
                    .return_values_on_condition_check_failure(
                        ReturnValuesOnConditionCheckFailure::AllOld,
                    )
                    .build()
                    .map_err(build_error)?;
                TransactWriteItem::builder().condition_check(check).build()
            };
            let sequence = head.next_seq;
            // The card, stored `approved` (never pending: no `pending_key`) with the
            // event's sequence. Invariant: one card per (run, request_id) — an arm or
            // another auto-approval of the same request racing this one, one wins.
            let now = now_millis();
            let approved = card.auto_approved(policy, sequence, now);
            let mut item = card_to_item(&approved);
            if let Some(exp) = self.expires_at(now.max(approved.expires_at)) {
                item.insert("expires_at".into(), exp);
            }
            let card_put = Put::builder()
                .table_name(&self.tables.approvals)
                .set_item(Some(item))
                .condition_expression("attribute_not_exists(item_key)")
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .build()
                .map_err(build_error)?;
            let plan = Plan {
                runs: vec![RunWrite {
                    head,
                    kind: WriteKind::Advance { end: None },
                    events: vec![policy.auto_approved_event(card)],
                    open_cards: 0,
                    budget_used: None,
                }],
                side: vec![reach, TransactWriteItem::builder().put(card_put).build()],
            };
            match self.commit(&plan).await? {
                Committed::Done { .. } => return Ok(sequence),
                // This request was auto-approved before (a retried arm).
                Committed::Lost(lost) if lost.taken[0][0].is_some() => {
                    return Ok(lost.taken[0][0].unwrap_or(sequence))
                }
                // A card for this request exists (armed meanwhile): it is the outcome.
                Committed::Lost(lost) if lost.side[1].is_some() => {
                    return Err(StoreError::Conflict(
                        "a card for this request already exists".into(),
                    ))
                }
                Committed::Lost(lost) if lost.side[0].is_some() => {
                    return Err(StoreError::Conflict("the policy was revoked".into()))
                }
                Committed::Lost(_) => {}
                Committed::Busy(why) => tracing::debug!(%why, "auto-approval retry"),
            }
            budget.next().await?;
        }
    }

    /// A page of policies: one project's from its index (newest first), or a `Scan` of
    /// all. Each request asks for at most what the page still lacks, so DynamoDB's
    /// `LastEvaluatedKey` is the position right after the last policy returned: that
    /// key is the cursor. A cursor is accepted only with exactly the key attributes of
    /// this listing (and this project's key), so no start key can reach another tenant.
    pub(crate) async fn policies(
        &self,
        project_id: Option<&str>,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<crate::PolicyPage, StoreError> {
        let mut names = vec![("scope_key", false), ("tool_name", false)];
        if project_id.is_some() {
            names.extend([("project_key", false), ("granted_at", true)]);
        }
        let mut start = match cursor {
            None => None,
            Some(c) => Some(start_key_from_cursor(c, &names, project_id)?),
        };
        let limit = limit.max(1);
        let mut list = Vec::new();
        loop {
            let want = (limit - list.len()).min(1000) as i32;
            let (items, next) = match project_id {
                Some(project) => {
                    let out = self
                        .client
                        .query()
                        .table_name(&self.tables.policies)
                        .index_name(POLICIES_BY_PROJECT)
                        .key_condition_expression("project_key = :pk")
                        .expression_attribute_values(":pk", s(project_key(Some(project))))
                        .scan_index_forward(false)
                        .limit(want)
                        .set_exclusive_start_key(start.take())
                        .send()
                        .await
                        .map_err(unavailable)?;
                    (out.items, out.last_evaluated_key)
                }
                None => {
                    let out = self
                        .client
                        .scan()
                        .table_name(&self.tables.policies)
                        .limit(want)
                        .set_exclusive_start_key(start.take())
                        .send()
                        .await
                        .map_err(unavailable)?;
                    (out.items, out.last_evaluated_key)
                }
            };
            for item in items.unwrap_or_default() {
                list.push(policy_from_item(&item)?);
            }
            start = next;
            if start.is_none() || list.len() >= limit {
                break;
            }
        }
        if project_id.is_none() {
            list.sort_by_key(|p| std::cmp::Reverse(p.granted_at));
        }
        let next_cursor = start.and_then(|key| cursor_from_key(&key, &names));
        Ok(crate::PolicyPage {
            policies: list,
            next_cursor,
        })
    }

    /// Revokes the policy alone — one conditional update, so no stream's traffic can
    /// hold it up — then announces it on each running stream it reached, each on its own
    /// (see [`DynamoStore::announce_revocation_of`]). Revoking a revoked policy answers the
    /// stored revocation and announces again: the announcements are keyed, so that only
    /// completes what an earlier attempt missed.
    pub(crate) async fn revoke(
        &self,
        scope_key: &str,
        tool_name: &str,
        by: &str,
        at: i64,
    ) -> Result<Option<Policy>, StoreError> {
        let mut budget = Budget::new(self.contention_budget, "a revocation");
        let revoked = loop {
            let result = self
                .client
                .update_item()
                .table_name(&self.tables.policies)
                .key("scope_key", s(scope_key))
                .key("tool_name", s(tool_name))
                .update_expression("SET revoked_by = :by, revoked_at = :at")
                // Invariant: one revocation — the first stands; a policy that does not
                // exist is never created by revoking it.
                .condition_expression(
                    "attribute_exists(scope_key) AND attribute_not_exists(revoked_at)",
                )
                .expression_attribute_values(":by", s(by))
                .expression_attribute_values(":at", n(at))
                .return_values(ReturnValue::AllNew)
                .return_values_on_condition_check_failure(
                    ReturnValuesOnConditionCheckFailure::AllOld,
                )
                .send()
                .await;
            let stored = match result {
                Ok(out) => match out.attributes {
                    Some(item) => Some(policy_from_item(&item)?),
                    None => self.get_policy(scope_key, tool_name).await?,
                },
                // Missing, or revoked already: the stored state answers.
                Err(SdkError::ServiceError(e))
                    if matches!(e.err(), UpdateItemError::ConditionalCheckFailedException(_)) =>
                {
                    let old = match e.into_err() {
                        UpdateItemError::ConditionalCheckFailedException(c) => c.item,
                        _ => None,
                    };
                    match old {
                        Some(item) => Some(policy_from_item(&item)?),
                        None => self.get_policy(scope_key, tool_name).await?,
                    }
                }
                Err(e) => return Err(unavailable(e)),
            };
            match stored {
                None => return Ok(None),
                Some(policy) if !policy.is_live() => break policy,
                // Granted again between a failed update and the read: revoke that.
                Some(_) => budget.next().await?,
            }
        };
        // The revocation stands whatever happens to its announcements (logged there; the
        // backstop timer or a repeat completes them).
        let _ = self.announce_revocation_of(&revoked).await;
        Ok(Some(revoked))
    }

    /// `tool.policy_revoked` on every running stream `revoked` reached (at most
    /// [`crate::MAX_ANNOUNCED_RUNS`]), concurrently and each on its own: a keyed append
    /// with its own retry budget, so a busy stream delays only its own announcement and
    /// a repeat writes nothing twice. A stream that ended is skipped (nothing follows a
    /// terminal event). The revocation stands whatever happens here: a failed
    /// announcement is logged and answered as `Unavailable` (the first such error), and
    /// announcing again completes it.
    pub(crate) async fn announce_revocation_of(&self, revoked: &Policy) -> Result<(), StoreError> {
        let mut failed = None;
        let mut announcements = tokio::task::JoinSet::new();
        for run_id in revoked.reached_runs.iter().take(crate::MAX_ANNOUNCED_RUNS) {
            let (store, run_id, event) = (self.clone(), run_id.clone(), revoked.revoked_event());
            announcements.spawn(async move {
                let result = store.append_events(RunRef::any(&run_id), vec![event]).await;
                (run_id, result)
            });
        }
        let policy_id = revoked.id();
        while let Some(joined) = announcements.join_next().await {
            match joined {
                Ok((_, Ok(_))) => {}
                // Ended (or gone): there is no running stream to tell.
                Ok((_, Err(StoreError::RunTerminal { .. } | StoreError::NotFound))) => {}
                Ok((run_id, Err(e))) => {
                    tracing::error!(
                        %policy_id, %run_id, error = %e,
                        "revocation stands but was not announced on this stream yet"
                    );
                    failed.get_or_insert(e);
                }
                Err(e) => {
                    tracing::error!(
                        %policy_id, error = %e,
                        "revocation stands but an announcement task failed"
                    );
                    failed.get_or_insert(StoreError::Unavailable(
                        "an announcement task failed".into(),
                    ));
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
