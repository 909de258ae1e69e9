//! What a transition of an approved call decides — the record to write, the events to
//! append, the budget usage of an admission — and how the API answers it.

use super::{BudgetUsage, MutationRecord, MutationState};
use crate::event::EventDraft;
use crate::run::RunStatus;

/// How the API answers: 200, 409 (with the current state) or 400.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Verdict {
    #[default]
    Ok,
    Conflict,
    Invalid,
}

/// How the API answers a transition (docs/architecture.md §5 and §7): its verdict and the
/// facts the answer carries. The API answers an accepted one as `ExecutionAnswer`
/// `{state, sequence?, reason?}` and a refused one as an error body `{error, code,
/// state?, reason?, approval_id?}` (`tollgate-protocol`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    pub verdict: Verdict,
    /// Why it was refused (400 and 409 only).
    pub error: Option<String>,
    /// The attempt's state (or, refused before any attempt, the card's); `None` for a
    /// request refused as invalid.
    pub state: Option<&'static str>,
    /// Accepted starts: the sequence of `tool_execution_started`.
    pub sequence: Option<u64>,
    /// Why the attempt is `not_executed`.
    pub reason: Option<&'static str>,
    /// A start refused because another attempt of the call blocks it: that attempt.
    pub approval_id: Option<String>,
}

impl Answer {
    /// The answer as the JSON object the API sends (before it adds `code` and
    /// `request_id` to a refusal): what the tests compare.
    #[cfg(test)]
    pub(crate) fn body(&self) -> serde_json::Value {
        use serde_json::{Map, Value};
        let mut body = Map::new();
        if let Some(error) = &self.error {
            body.insert("error".into(), error.clone().into());
        }
        if let Some(state) = self.state {
            body.insert("state".into(), state.into());
        }
        if let Some(sequence) = self.sequence {
            body.insert("sequence".into(), sequence.into());
        }
        if let Some(reason) = self.reason {
            body.insert("reason".into(), reason.into());
        }
        if let Some(approval_id) = &self.approval_id {
            body.insert("approval_id".into(), approval_id.clone().into());
        }
        Value::Object(body)
    }
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
        let sequence = if self.answers_sequence && self.accepted() {
            self.record.started_sequence
        } else {
            None
        };
        let reason = match self.record.state {
            MutationState::NotExecuted => self.record.reason.map(|r| r.as_str()),
            _ => None,
        };
        Answer {
            verdict: if self.accepted() {
                Verdict::Ok
            } else {
                Verdict::Conflict
            },
            error: self.refusal.clone(),
            state: Some(self.record.state.as_str()),
            sequence,
            reason,
            approval_id: None,
        }
    }
}
