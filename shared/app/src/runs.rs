//! The run log's use-cases (docs/architecture.md §2): creating a run with every rule a
//! create obeys — bounded head fields, the run id (given, derived from a delivery id,
//! or fresh), the kind and its parent, the execution mode, the budget, the project —
//! and what a repeated create answers; appending to one. The HTTP handler parses the
//! body and answers the receipt; the rules are here. Reading a run back is
//! [`crate::replay`].

use std::sync::Arc;

use serde_json::Map;
use serde_json::Value;
use tollgate_domain::{
    delivery_run_id, run::DELIVERY_RUN_PREFIX, validate_run_id, ExecutionMode, NewRun, RunHead,
    RunKind,
};
use tollgate_domain::{event::validate_payload, validate_producer_event, TerminalKind};
use tollgate_store::{CreateOutcome, Finished, RunRef, RunStore, StoreError};

use crate::approvals::Gate;
use crate::AppError;

/// Every field stored in the run head is bounded: the head is rewritten by every append,
/// so its size is paid on each one (a 250 KB head would make every append cost ~500 WCU).
pub const MAX_HEAD_TEXT: usize = 256;
/// Longest `agenthost_origin`.
pub const MAX_ORIGIN: usize = 2048;
/// Longest string `subtask_id`, in bytes.
pub const MAX_SUBTASK_ID_BYTES: usize = 256;

/// What a run id may be.
pub const RUN_ID_RULE: &str =
    "run_id must be 1 to 128 characters of A-Z a-z 0-9 _ . : - (and not . or ..)";

/// Who creates the run: the agent token's subject and project.
#[derive(Debug, Clone, Copy)]
pub struct Creator<'a> {
    pub sub: &'a str,
    pub project_id: Option<&'a str>,
}

/// A create as asked (`POST /api/runs`' body).
#[derive(Debug, Clone, Default)]
pub struct CreateRun {
    pub run_id: Option<String>,
    pub kind: Option<String>,
    pub parent_run_id: Option<String>,
    pub subtask_id: Option<Value>,
    pub owner: Option<String>,
    pub project_id: Option<String>,
    pub channel_id: Option<String>,
    pub delivery_id: Option<String>,
    pub budget: Option<Value>,
    pub execution_mode: Option<String>,
    pub agenthost_origin: Option<String>,
}

/// What a create did.
#[derive(Debug, Clone, PartialEq)]
pub enum Created {
    /// A new run.
    New(RunHead),
    /// The run an earlier create of the same agent made (the same delivery, or the same
    /// run id and fields: its first answer was lost).
    Existing(RunHead),
}

fn invalid(message: impl Into<String>) -> AppError {
    AppError::Invalid(message.into())
}

fn short_text(field: &str, value: &Option<String>, max: usize) -> Result<(), AppError> {
    match value {
        Some(v) if v.is_empty() || v.chars().count() > max => {
            Err(invalid(format!("{field} must be 1 to {max} characters")))
        }
        _ => Ok(()),
    }
}

fn validate_subtask_id(subtask_id: &Value) -> Result<(), AppError> {
    let fits = match subtask_id {
        Value::String(s) => !s.is_empty() && s.len() <= MAX_SUBTASK_ID_BYTES,
        Value::Number(_) => true,
        _ => false,
    };
    if fits {
        Ok(())
    } else {
        Err(invalid(format!(
            "subtask_id must be a number or a string of 1 to {MAX_SUBTASK_ID_BYTES} bytes"
        )))
    }
}

/// The run's project is its creator's `project_id` claim: a body naming another (or
/// any, when the token has none) is refused, so a token cannot place runs in a tenant
/// it does not belong to.
fn run_project(creator: Creator<'_>, asked: Option<String>) -> Result<Option<String>, AppError> {
    match (creator.project_id, asked) {
        (claimed, Some(asked)) if claimed != Some(asked.as_str()) => Err(AppError::Forbidden(
            "project_id must be the token's project_id claim".into(),
        )),
        (claimed, _) => Ok(claimed.map(str::to_owned)),
    }
}

/// The run log as the routes reach it: created and appended here, read back in
/// [`crate::replay`]. Cheap to clone.
#[derive(Clone)]
pub struct RunLog {
    pub(crate) store: Arc<dyn RunStore>,
}

impl RunLog {
    pub fn new(store: Arc<dyn RunStore>) -> Self {
        Self { store }
    }

    /// Creates a run for `creator` as `asked`. `check_origin` judges a pod run's
    /// `agenthost_origin` (the HTTP layer's network rules); its refusal is a 400.
    pub async fn create(
        &self,
        creator: Creator<'_>,
        asked: CreateRun,
        check_origin: impl Fn(&str) -> Result<(), String>,
    ) -> Result<Created, AppError> {
        create(self.store.as_ref(), creator, asked, check_origin).await
    }

    /// Appends producer events (`raw`, as posted) to the run `run` names: each validated
    /// (`events[i]: why` → 400, nothing written), the batch checked, then appended in one
    /// step. Their sequences, in order.
    pub async fn append(&self, run: RunRef<'_>, raw: Vec<Value>) -> Result<Vec<u64>, AppError> {
        append(self.store.as_ref(), run, raw).await
    }

    /// A page of the runs an operator of `caller_project` (none: an operator of every
    /// project) lists in `project`: its own project only (asking for another is 403);
    /// an operator of every project names the project, or lists the runs without one
    /// (docs/architecture.md invariant 9: a listing never reaches another tenant).
    pub async fn list(
        &self,
        caller_project: Option<&str>,
        project: Option<&str>,
        filter: &tollgate_store::RunFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<tollgate_store::RunPage, AppError> {
        let tenant = match (caller_project, project) {
            (Some(own), Some(asked)) if own != asked => {
                return Err(AppError::Forbidden(
                    "an operator of a project lists only that project's runs".into(),
                ))
            }
            (Some(own), _) => Some(own),
            (None, asked) => asked,
        };
        Ok(self.store.list_runs(tenant, filter, cursor, limit).await?)
    }
}

async fn create(
    store: &dyn RunStore,
    creator: Creator<'_>,
    asked: CreateRun,
    check_origin: impl Fn(&str) -> Result<(), String>,
) -> Result<Created, AppError> {
    // Claims become head fields too (the creator, the project): bounded like the body's.
    if creator.sub.is_empty()
        || creator.sub.chars().count() > MAX_HEAD_TEXT
        || creator
            .project_id
            .is_some_and(|p| p.is_empty() || p.chars().count() > MAX_HEAD_TEXT)
    {
        return Err(invalid(format!(
            "the token's sub and project_id must be 1 to {MAX_HEAD_TEXT} characters"
        )));
    }
    for (field, value) in [
        ("delivery_id", &asked.delivery_id),
        ("owner", &asked.owner),
        ("project_id", &asked.project_id),
        ("channel_id", &asked.channel_id),
        ("execution_mode", &asked.execution_mode),
    ] {
        short_text(field, value, MAX_HEAD_TEXT)?;
    }
    short_text("agenthost_origin", &asked.agenthost_origin, MAX_ORIGIN)?;
    if let Some(subtask_id) = &asked.subtask_id {
        validate_subtask_id(subtask_id)?;
    }
    let run_id = match (&asked.run_id, &asked.delivery_id) {
        // The derived namespace is reserved, so nobody can take another agent's
        // delivery id's run in advance.
        (Some(id), _) if id.starts_with(DELIVERY_RUN_PREFIX) => {
            return Err(invalid(format!(
                "run ids starting with {DELIVERY_RUN_PREFIX:?} are reserved for delivery_id runs"
            )))
        }
        (Some(id), _) => id.clone(),
        (None, Some(delivery)) => delivery_run_id(creator.sub, creator.project_id, delivery),
        (None, None) => format!("run-{}", uuid::Uuid::new_v4().simple()),
    };
    if !validate_run_id(&run_id) {
        return Err(invalid(RUN_ID_RULE));
    }
    tracing::Span::current().record("run_id", run_id.as_str());
    let kind = match asked.kind.as_deref() {
        None => RunKind::Single,
        Some(k) => {
            RunKind::parse(k).ok_or_else(|| invalid("kind must be single, coordinator or child"))?
        }
    };
    if let Some(parent) = &asked.parent_run_id {
        if !validate_run_id(parent) {
            return Err(invalid(format!("parent_run_id: {RUN_ID_RULE}")));
        }
    }
    let mode = match asked.execution_mode.as_deref() {
        None => ExecutionMode::Inline,
        Some(given) => ExecutionMode::parse(given)
            .ok_or_else(|| invalid("execution_mode must be inline or pod"))?,
    };
    match mode {
        ExecutionMode::Inline if asked.agenthost_origin.is_some() => {
            return Err(invalid("agenthost_origin is for execution_mode pod only"))
        }
        ExecutionMode::Inline => {}
        ExecutionMode::Pod => {
            let origin = asked
                .agenthost_origin
                .as_deref()
                .ok_or_else(|| invalid("execution_mode pod needs an agenthost_origin"))?;
            check_origin(origin).map_err(invalid)?;
        }
    }
    // The domain's one parser decides what a budget is (the same one admission reads it
    // with, so a budget accepted here is never refused there).
    if let Some(budget) = &asked.budget {
        tollgate_domain::execution::Budget::parse(budget).map_err(|e| invalid(e.to_string()))?;
    }
    let project_id = run_project(creator, asked.project_id)?;
    match (kind, &asked.parent_run_id) {
        (RunKind::Child, None) => return Err(invalid("a child run needs parent_run_id")),
        (RunKind::Child, Some(parent)) => {
            let parent_head = store
                .read_head(parent)
                .await?
                .ok_or_else(|| invalid("parent_run_id names no run"))?;
            if parent_head.kind != RunKind::Coordinator {
                return Err(invalid("parent_run_id must name a coordinator run"));
            }
            // A child lives in its coordinator's project and joins only a coordinator
            // its own agent principal created: `run` grants reach siblings, so another
            // agent of the project must not be able to place a run among them.
            let joins =
                parent_head.project_id == project_id && parent_head.created_by == creator.sub;
            if !joins {
                return Err(AppError::Forbidden(
                    "a child run joins only a coordinator its own agent created, in its project"
                        .into(),
                ));
            }
        }
        (_, Some(_)) => return Err(invalid("only a child run has a parent_run_id")),
        _ => {}
    }
    let new = NewRun {
        run_id,
        kind,
        parent_run_id: asked.parent_run_id,
        subtask_id: asked.subtask_id,
        owner: asked.owner,
        project_id,
        channel_id: asked.channel_id,
        created_by: creator.sub.to_owned(),
        delivery_id: asked.delivery_id.clone(),
        execution_mode: asked.execution_mode,
        agenthost_origin: asked.agenthost_origin,
        budget: asked.budget,
    };
    match store.create_run(new.clone()).await? {
        CreateOutcome::Created(head) => {
            tracing::info!("run created");
            Ok(Created::New(head))
        }
        // Same creator, same delivery: the run of the first create.
        CreateOutcome::Existing(head)
            if asked.delivery_id.is_some()
                && head.delivery_id == asked.delivery_id
                && head.created_by == creator.sub
                && head.project_id.as_deref() == creator.project_id =>
        {
            Ok(Created::Existing(head))
        }
        // The same agent retrying the same create (its first answer was lost): the run
        // it made. Anyone else, or different fields, is a conflict.
        CreateOutcome::Existing(head) if new.matches(&head) => Ok(Created::Existing(head)),
        CreateOutcome::Existing(_) => Err(AppError::Conflict {
            message: "a run with this run_id already exists".into(),
            state: Some(crate::ErrorState::RunExists),
        }),
    }
}

async fn append(
    store: &dyn RunStore,
    run: RunRef<'_>,
    raw: Vec<Value>,
) -> Result<Vec<u64>, AppError> {
    let drafts = raw
        .into_iter()
        .enumerate()
        .map(|(i, v)| validate_producer_event(v).map_err(|e| invalid(format!("events[{i}]: {e}"))))
        .collect::<Result<Vec<_>, _>>()?;
    tollgate_store::check_batch(&drafts)?;
    Ok(store.append_events(run, drafts).await?)
}

/// How many times a run's end ends the cards in its way before it answers 503: each
/// round ends every card pending when it began, so only an agent arming while it ends
/// its own run needs another.
const END_ROUNDS: usize = 4;

impl Gate {
    /// Ends the run `run` names as `kind` with `payload` (its terminal event's fields).
    /// Its pending cards end first, each in its own step with its
    /// `tool.approval_resolved` (`expired`, reason `run_ended`) and its coordinator's
    /// mirror, then the terminal event, last (docs/architecture.md §6, invariant 3): a
    /// stop between the steps leaves a running run whose ended cards were announced,
    /// which a repeated call ends. A decision racing the end either wins its card or
    /// finds it ended; a card armed meanwhile is ended in the next round.
    pub async fn finish_run(
        &self,
        run: RunRef<'_>,
        kind: TerminalKind,
        payload: Map<String, Value>,
    ) -> Result<Finished, AppError> {
        // A terminal call is idempotent by itself; an `event_id` here would read as a
        // producer idempotency key that nothing honours.
        if payload.contains_key("event_id") {
            return Err(invalid(
                "a terminal body has no event_id (complete, fail and cancel are idempotent)",
            ));
        }
        validate_payload(&payload).map_err(|e| invalid(e.to_string()))?;
        let run_id = run.run_id.to_owned();
        let mut round = 0;
        let finished = loop {
            match self.store.finish_run(run, kind, payload.clone()).await {
                Err(StoreError::CardsOpen(open)) if round < END_ROUNDS => {
                    round += 1;
                    let ended = self.end_cards_before_end(&run_id).await?;
                    tracing::info!(open, ended, round, "cards ended ahead of the run's end");
                }
                other => break other?,
            }
        };
        tracing::info!(
            sequence = finished.sequence,
            repeated = finished.already_finished,
            "run ended"
        );
        // A run ended before its end announced its cards (by an earlier version) may
        // still hold some: they expire silently, as nothing may follow its end.
        if finished.open_cards > 0 {
            if let Err(e) = self.end_cards_of(&run_id).await {
                tracing::warn!(error = %e, "pending cards of the ended run not all ended");
            }
        }
        Ok(finished)
    }
}
