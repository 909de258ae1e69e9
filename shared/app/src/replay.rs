//! Reading a run back (docs/architecture.md §2): its head for whoever may see it
//! ([`access::may_read`]), for the run's own token, or within a caller's project; gap-safe
//! pages of its events ([`tollgate_store::read_page`]); what a live tail waits on; and the
//! run a delivery created. The HTTP handlers render what these answer.

use tollgate_domain::approval::MAX_TEXT;
use tollgate_domain::{delivery_run_id, RunHead};
use tollgate_store::{read_page, ReplayPage};

use crate::access::{self, Viewer};
use crate::runs::{Creator, RunLog};
use crate::AppError;

impl RunLog {
    /// The head of `run_id`, if it exists.
    pub async fn head(&self, run_id: &str) -> Result<Option<RunHead>, AppError> {
        Ok(self.store.read_head(run_id).await?)
    }

    /// The head as a cheaper, possibly lagging read sees it: for waiting on a change
    /// only (read [`RunLog::head`] once one is seen, before reading a page).
    pub async fn lagging_head(&self, run_id: &str) -> Result<Option<RunHead>, AppError> {
        Ok(self.store.read_head_lagging(run_id).await?)
    }

    /// The head of `run_id` for `viewer`: 404 when there is none or it is not the
    /// viewer's to see, 403 for another agent's run ([`access::may_read`]).
    pub async fn readable_head(
        &self,
        run_id: &str,
        viewer: &Viewer<'_>,
    ) -> Result<RunHead, AppError> {
        let head = self
            .head(run_id)
            .await?
            .ok_or_else(AppError::run_not_found)?;
        access::may_read(viewer, &head)?;
        Ok(head)
    }

    /// The head of the run a run token issued for `incarnation` acts on: 404 when there
    /// is none or it is another incarnation of the id.
    pub async fn own_head(&self, run_id: &str, incarnation: &str) -> Result<RunHead, AppError> {
        self.head(run_id)
            .await?
            .filter(|h| h.incarnation == incarnation)
            .ok_or_else(AppError::run_not_found)
    }

    /// The head of `run_id` if a caller of `caller_project` (none: every project) may see
    /// it ([`access::in_project`]); `None` otherwise, as when there is none.
    pub async fn head_in_project(
        &self,
        run_id: &str,
        caller_project: Option<&str>,
    ) -> Result<Option<RunHead>, AppError> {
        Ok(self
            .head(run_id)
            .await?
            .filter(|h| access::in_project(caller_project, h.project_id.as_deref())))
    }

    /// The page after `after` (at most `limit` events) of the run whose `head` was read
    /// first — the order [`read_page`]'s promise relies on.
    pub async fn page(
        &self,
        head: &RunHead,
        after: u64,
        limit: usize,
    ) -> Result<ReplayPage, AppError> {
        Ok(read_page(self.store.as_ref(), head, after, limit).await?)
    }

    /// What a live tail waits on between pages: a signal that changes after every write
    /// of this process's store, or `None` where writes come from elsewhere (DynamoDB:
    /// other Lambda instances) and a tail polls the head instead.
    pub fn appended(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.store.appended()
    }

    /// The run the delivery `delivery_id` created for `creator` (its id is derived from
    /// the agent, its project and the delivery), if that run says so; `None` for any
    /// other (or an id no delivery can have).
    pub async fn delivered(
        &self,
        creator: Creator<'_>,
        delivery_id: &str,
    ) -> Result<Option<RunHead>, AppError> {
        if delivery_id.is_empty() || delivery_id.chars().count() > MAX_TEXT {
            return Ok(None);
        }
        let run_id = delivery_run_id(creator.sub, creator.project_id, delivery_id);
        Ok(self.head(&run_id).await?.filter(|h| {
            h.delivery_id.as_deref() == Some(delivery_id)
                && h.created_by == creator.sub
                && h.project_id.as_deref() == creator.project_id
        }))
    }
}
