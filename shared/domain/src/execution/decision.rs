//! What a transition of an approved call decides — the record to write, the events to
//! append, the budget usage of an admission — and how the API answers it.

use serde_json::{Map, Value};

use super::{BudgetUsage, MutationRecord, MutationState};
use crate::event::EventDraft;
use crate::run::RunStatus;

/// How the API answers: 200, 409 (with the current state) or 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    Conflict,
    Invalid,
}

/// An answer's verdict and JSON body (errors carry `error`, docs/architecture.md §5).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub verdict: Verdict,
    pub body: Value,
}

/// What a transition decided. When `changed`, the store writes `record` — conditioned
/// on the stored record still being as read — together with `events` (and `usage` on
/// the head, for an admission) in one transaction; otherwise it writes nothing and
/// answers from `record`.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub record: MutationRecord,
    /// Empty when nothing is announced — always when the run is no longer running.
    pub events: Vec<EventDraft>,
    pub changed: bool,
    /// Admission only: the run's budget usage after this start.
    pub usage: Option<BudgetUsage>,
    /// Why the request was refused (409); `None` when it was accepted (200).
    pub refusal: Option<String>,
    /// Answer with `sequence` (of `tool_execution_started`): `start` answers do.
    pub(super) answers_sequence: bool,
}

impl Decision {
    pub(super) fn same(record: &MutationRecord, refusal: Option<String>) -> Self {
        Self {
            record: record.clone(),
            events: Vec::new(),
            changed: false,
            usage: None,
            refusal,
            answers_sequence: false,
        }
    }

    /// `record` written, with `events` only while the run is running: seed 000 "No late
    /// worker emits after run_completed or run_failed" (and nothing follows a cancel).
    pub(super) fn write(record: MutationRecord, events: Vec<EventDraft>, run: RunStatus) -> Self {
        Self {
            record,
            events: if run.is_terminal() {
                Vec::new()
            } else {
                events
            },
            changed: true,
            usage: None,
            refusal: None,
            answers_sequence: false,
        }
    }

    pub(super) fn refused(mut self, why: impl Into<String>) -> Self {
        self.refusal = Some(why.into());
        self
    }

    pub fn accepted(&self) -> bool {
        self.refusal.is_none()
    }

    /// 200 `{state, sequence?, reason?}` or 409 `{error, state, reason?}`; `reason` only
    /// for `not_executed`, `sequence` only on `start` answers.
    pub fn answer(&self) -> Answer {
        let mut body = Map::new();
        if let Some(why) = &self.refusal {
            body.insert("error".into(), why.clone().into());
        }
        body.insert("state".into(), self.record.state.as_str().into());
        if self.answers_sequence && self.accepted() {
            if let Some(seq) = self.record.started_sequence {
                body.insert("sequence".into(), seq.into());
            }
        }
        if self.record.state == MutationState::NotExecuted {
            if let Some(reason) = self.record.reason {
                body.insert("reason".into(), reason.as_str().into());
            }
        }
        Answer {
            verdict: if self.accepted() {
                Verdict::Ok
            } else {
                Verdict::Conflict
            },
            body: Value::Object(body),
        }
    }
}
