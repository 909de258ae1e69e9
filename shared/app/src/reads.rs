//! What the gate recorded, read back for the routes (docs/architecture.md §2): a run's
//! cards, a project's open cards, the grants an operator may see, and the
//! `mutation_outcome/v1` records of approved execution. Tenancy is
//! [`access::in_project`]; the HTTP handlers render what these answer.

use tollgate_domain::approval::valid_id;
use tollgate_domain::execution::MutationRecord;
use tollgate_domain::{ApprovalRequest, Policy};
use tollgate_store::{ListingCursor, PolicyPage, MAX_PENDING_LISTED};

use crate::access;
use crate::approvals::Gate;
use crate::AppError;

/// A run's pending cards, soonest deadline first.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingCards {
    pub cards: Vec<ApprovalRequest>,
    /// The store listed as many as it lists at most: there may be more.
    pub capped: bool,
}

impl Gate {
    /// The card `request_id` of run `run_id`; `None` when there is none (an id the store
    /// keys nothing by names none).
    pub async fn card(
        &self,
        run_id: &str,
        request_id: &str,
    ) -> Result<Option<ApprovalRequest>, AppError> {
        if !valid_id(request_id) {
            return Ok(None);
        }
        Ok(self.store.read_card(run_id, request_id).await?)
    }

    /// The pending cards of run `run_id`.
    pub async fn pending_cards_of(&self, run_id: &str) -> Result<PendingCards, AppError> {
        let mut cards = self.store.pending_cards(run_id).await?;
        cards.sort_by_key(|c| c.expires_at);
        let capped = cards.len() >= MAX_PENDING_LISTED;
        Ok(PendingCards { cards, capped })
    }

    /// Up to `limit` open cards of `project` (none: every project), soonest deadline
    /// first, from the start or just after `after` (a listing's cursor).
    pub async fn open_cards(
        &self,
        project: Option<&str>,
        after: Option<&ListingCursor>,
        limit: usize,
    ) -> Result<Vec<ApprovalRequest>, AppError> {
        Ok(match after {
            None => self.store.open_cards(project, None, limit).await?,
            Some(cursor) => self.store.open_cards_after(project, cursor, limit).await?,
        })
    }

    /// A page (from `cursor`, at most `limit`) of the grants of `project` (none: every
    /// project).
    pub async fn policies(
        &self,
        project: Option<&str>,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<PolicyPage, AppError> {
        Ok(self.store.list_policies(project, cursor, limit).await?)
    }

    /// The grant of `tool_name` under `scope_key`, if a caller of `caller_project` (none:
    /// every project) may see it; `None` otherwise, as when there is none.
    pub async fn visible_policy(
        &self,
        scope_key: &str,
        tool_name: &str,
        caller_project: Option<&str>,
    ) -> Result<Option<Policy>, AppError> {
        let policy = self.store.read_policy(scope_key, tool_name).await?;
        Ok(policy.filter(|p| access::in_project(caller_project, p.project_id.as_deref())))
    }

    /// Up to `limit` mutation records of run `run_id`.
    pub async fn mutations(
        &self,
        run_id: &str,
        limit: usize,
    ) -> Result<Vec<MutationRecord>, AppError> {
        Ok(self.store.list_mutations(run_id, limit).await?)
    }

    /// The mutation record of one attempt, if it was started.
    pub async fn mutation(
        &self,
        run_id: &str,
        tool_call_id: &str,
        approval_id: &str,
    ) -> Result<Option<MutationRecord>, AppError> {
        Ok(self
            .store
            .read_mutation(run_id, tool_call_id, approval_id)
            .await?)
    }
}
