//! Domain records as the contract's types (`tollgate-protocol`): what the handlers answer.

use tollgate_domain::approval::{ApprovalRequest, Policy, Scope};
use tollgate_domain::execution::{MutationRecord, MUTATION_OUTCOME_SCHEMA};
use tollgate_domain::format_timestamp;
use tollgate_protocol::approvals as wire;

/// A card as listed and read.
pub fn card(c: &ApprovalRequest) -> wire::Card {
    wire::Card {
        run_id: c.run_id.clone(),
        request_id: c.request_id.clone(),
        display_id: c.display_id().to_owned(),
        tool_name: c.tool_name.clone(),
        tool_call_id: c.tool_call_id.clone(),
        approval_id: c.approval_id.clone(),
        url: c.url.clone(),
        intention: c.intention.clone(),
        message: c.message.clone(),
        arguments_hash: c.arguments_hash.clone(),
        arguments_preview: c.arguments_preview.clone(),
        state: c.state.as_str().into(),
        scope: c.scope.map(|s| Scope::as_str(s).into()),
        decided_by: c.decided_by.clone(),
        decided_at: c.decided_at.map(format_timestamp),
        created_at: format_timestamp(c.created_at),
        expires_at: format_timestamp(c.expires_at),
        coordinator_run_id: c.coordinator_run_id.clone(),
        subtask_id: c.subtask_id.clone(),
        reason: c.end_reason.clone(),
        decision_reason: c.decision_reason.clone(),
        auto_approved: c.auto_approval.as_ref().map(|_| true),
        policy_id: c.auto_approval.as_ref().map(|a| a.policy_id.clone()),
        held_by: c.held_by_pod.then(|| "pod".into()),
    }
}

/// A standing grant.
pub fn policy(p: &Policy) -> wire::Policy {
    wire::Policy {
        policy_id: p.id(),
        scope: p.scope.as_str().into(),
        tool_name: p.tool_name.clone(),
        owner: p.owner.clone(),
        project_id: p.project_id.clone(),
        origin_run_id: p.origin_run_id.clone(),
        request_id: p.request_id.clone(),
        granted_by: p.granted_by.clone(),
        granted_at: format_timestamp(p.granted_at),
        revoked_by: p.revoked_by.clone(),
        revoked_at: p.revoked_at.map(format_timestamp),
        covers_nothing: p.is_legacy(),
    }
}

/// A mutation record, `mutation_outcome/v1` (the optional facts absent until known).
pub fn mutation(r: &MutationRecord) -> tollgate_protocol::execution::MutationRecord {
    tollgate_protocol::execution::MutationRecord {
        schema: MUTATION_OUTCOME_SCHEMA.into(),
        run_id: r.run_id.clone(),
        tool_call_id: r.tool_call_id.clone(),
        approval_id: r.approval_id.clone(),
        tool_name: r.tool_name.clone(),
        state: r.state.as_str().into(),
        execution_status: r.execution_status.map(|s| s.as_str().into()),
        result: r.result.clone(),
        error: r.error.clone(),
        reason: r.reason.map(|r| r.as_str().into()),
    }
}

/// A run of the runs listing (`GET /api/runs`).
pub fn run_summary(r: &tollgate_store::RunSummary) -> tollgate_protocol::runs::RunSummary {
    tollgate_protocol::runs::RunSummary {
        run_id: r.run_id.clone(),
        kind: r.kind.as_str().into(),
        status: r.status.as_str().into(),
        owner: r.owner.clone(),
        project_id: r.project_id.clone(),
        channel_id: r.channel_id.clone(),
        created_at: r.created_at,
        ended_at: r.ended_at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_domain::execution::{ExecutionStatus, MutationState, Reason};

    /// The wire record says what the domain's `mutation_outcome/v1` projection says.
    #[test]
    fn a_mutation_record_is_its_projection() {
        let mut r = MutationRecord {
            run_id: "run-1".into(),
            tool_call_id: "call-1".into(),
            approval_id: "a-1".into(),
            request_id: "req-1".into(),
            tool_name: "send_email".into(),
            arguments_hash: None,
            state: MutationState::Intent,
            execution_status: None,
            result: None,
            error: None,
            reason: None,
            evidence: None,
            settled_by: None,
            started_sequence: Some(4),
            created_at: 0,
            dispatched_at: None,
            settled_at: None,
            settlement_deadline_at: 60_000,
            reconciliation: None,
        };
        assert_eq!(serde_json::to_value(mutation(&r)).unwrap(), r.to_json());
        r.state = MutationState::NotExecuted;
        r.execution_status = Some(ExecutionStatus::NotExecuted);
        r.reason = Some(Reason::NotSent);
        r.error = Some(serde_json::json!({"code": "refused"}));
        r.result = Some(serde_json::json!({"id": 1}));
        assert_eq!(serde_json::to_value(mutation(&r)).unwrap(), r.to_json());
    }
}
