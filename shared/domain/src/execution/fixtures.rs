//! What the execution unit tests share: a budgeted run head, the approved card and its
//! start request, the records of a started and a dispatched call, and settlements.

use serde_json::{json, Value};

use super::*;
use crate::approval::{ApprovalRequest, ApprovalState, Resolution, Scope};
use crate::event::EventDraft;
use crate::run::{NewRun, RunHead, RunStatus};

pub(super) const T0: i64 = 1_000_000;

pub(super) fn settings() -> ExecutionSettings {
    ExecutionSettings::default()
}

pub(super) fn head_with(budget: Option<Value>) -> RunHead {
    let mut head = NewRun {
        run_id: "run-1".into(),
        channel_id: Some("C1".into()),
        budget,
        ..NewRun::default()
    }
    .head(0);
    head.next_seq = 5;
    head
}

pub(super) fn head() -> RunHead {
    head_with(Some(
        json!({"tools": {"mcp__last9__create_dashboard": 2, "web_fetch": 1}, "call_ceiling": 5}),
    ))
}

pub(super) fn pending_card() -> ApprovalRequest {
    ApprovalRequest {
        run_id: "run-1".into(),
        request_id: "req-1".into(),
        tool_name: "mcp__last9__create_dashboard".into(),
        tool_call_id: "write-1".into(),
        approval_id: "approval-1".into(),
        explicit_ids: true,
        url: None,
        intention: None,
        message: None,
        arguments_hash: Some("sha256:abc".into()),
        state: ApprovalState::Pending,
        scope: None,
        decided_by: None,
        decided_at: None,
        created_at: 0,
        expires_at: 300_000,
        coordinator_run_id: None,
        subtask_id: None,
        project_id: None,
        end_reason: None,
        auto_approval: None,
        arguments_preview: None,
        decision_reason: None,
        held_by_pod: false,
    }
}

pub(super) fn card() -> ApprovalRequest {
    pending_card().resolved(
        &Resolution::Approved {
            scope: Scope::Once,
            by: "alice".into(),
            reason: None,
        },
        10,
    )
}

pub(super) fn req() -> StartRequest {
    StartRequest {
        run_id: "run-1".into(),
        tool_call_id: "write-1".into(),
        request_id: "req-1".into(),
        approval_id: "approval-1".into(),
        tool_name: "mcp__last9__create_dashboard".into(),
        arguments_hash: Some("sha256:abc".into()),
    }
}

pub(super) fn started() -> Decision {
    start(
        &req(),
        &card(),
        &head(),
        &BudgetUsage::default(),
        &[],
        &settings(),
        T0,
    )
    .unwrap()
}

pub(super) fn intent() -> MutationRecord {
    started().record
}

pub(super) fn dispatched() -> MutationRecord {
    dispatch(&intent(), RunStatus::Running, T0 + 1_000).record
}

pub(super) fn confirmed(result: Value) -> Settlement {
    Settlement::new("confirmed", Some(result), None).unwrap()
}

pub(super) fn ambiguous() -> Settlement {
    Settlement::new("ambiguous", None, Some(json!({"code": "timeout"}))).unwrap()
}

pub(super) fn not_sent() -> Settlement {
    Settlement::new("not_sent", None, None).unwrap()
}

pub(super) fn payload(d: &EventDraft) -> String {
    Value::Object(d.payload.clone()).to_string()
}
