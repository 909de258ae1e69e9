//! Domain records as the contract's types (`tollgate-protocol`): what the handlers answer.

use tollgate_domain::approval::{ApprovalRequest, Policy, Scope};
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
        state: c.state.as_str().into(),
        scope: c.scope.map(|s| Scope::as_str(s).into()),
        decided_by: c.decided_by.clone(),
        decided_at: c.decided_at.map(format_timestamp),
        created_at: format_timestamp(c.created_at),
        expires_at: format_timestamp(c.expires_at),
        coordinator_run_id: c.coordinator_run_id.clone(),
        subtask_id: c.subtask_id.clone(),
        reason: c.end_reason.clone(),
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
