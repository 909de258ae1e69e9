//! Every event payload Tollgate writes is its `tollgate-protocol` type, key for key: each
//! server-owned event, built by the constructor the server uses (with every optional
//! field set, and with none), renders to an envelope whose payload reads into the type
//! `tollgate_protocol::payloads::PAYLOADS` names and writes back to the same keys and
//! values. A key added to an event and not to its type (or the reverse) fails here.

use std::collections::BTreeSet;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use tollgate_domain::approval::{AutoApproval, Policy};
use tollgate_domain::execution::{MutationRecord, Reason, Reconciliation};
use tollgate_domain::{
    render_event, stall_detected_event, ApprovalRequest, ApprovalState, EventDraft,
    ExecutionStatus, MutationState, NewRun, Observed, RunHead, RunKind, Scope, StallAction,
    StallCheck, SERVER_OWNED_TYPES,
};
use tollgate_protocol::payloads::{self, PAYLOADS};
use tollgate_protocol::Event;

const T0: i64 = 1_764_000_000_000;

fn head(channel: Option<&str>) -> RunHead {
    RunHead::new_for_test("run-1", channel)
}

/// The draft rendered as the server stores it, read back as the client sees it.
fn served(draft: &EventDraft) -> Event {
    let text = render_event(&head(Some("C1")), 7, draft, T0);
    serde_json::from_str(&text).expect("an event reads as the envelope")
}

/// The payload as `T` writes back to exactly the payload (less the envelope's
/// `channel_id` and the key `event_id`); `T` is the type `PAYLOADS` names for it.
fn holds<T: DeserializeOwned + Serialize>(
    schema: &str,
    draft: &EventDraft,
    seen: &mut Vec<String>,
) {
    let event = served(draft);
    let named = PAYLOADS
        .iter()
        .find(|(t, _)| *t == event.event_type)
        .map(|(_, s)| *s);
    assert_eq!(named, Some(schema), "{}", event.event_type);
    let mut payload = event.payload.clone();
    payload.remove("channel_id");
    payload.remove("event_id");
    let typed: T = event.payload_as().unwrap_or_else(|| {
        panic!(
            "{} does not read as {schema}: {payload:?}",
            event.event_type
        )
    });
    assert_eq!(
        serde_json::to_value(&typed).unwrap(),
        Value::Object(payload),
        "{} as {schema}",
        event.event_type
    );
    seen.push(event.event_type);
}

fn card(full: bool) -> ApprovalRequest {
    let text = |v: &str| full.then(|| v.to_owned());
    ApprovalRequest {
        run_id: "child-1".into(),
        request_id: "5f0c7a2e-9d41".into(),
        tool_name: "web_fetch".into(),
        tool_call_id: "call-1".into(),
        approval_id: "appr-1".into(),
        explicit_ids: full,
        url: text("https://example.com/docs"),
        intention: text("read the docs"),
        message: text("The agent wants to fetch a URL."),
        arguments_hash: text("ab12"),
        state: ApprovalState::Pending,
        scope: None,
        decided_by: None,
        decided_at: None,
        created_at: T0,
        expires_at: T0 + 300_000,
        coordinator_run_id: full.then(|| "coord-1".to_owned()),
        subtask_id: full.then(|| json!("subtask-a")),
        project_id: None,
        end_reason: None,
        auto_approval: None,
        arguments_preview: full.then(|| {
            json!({"to": "ops@example.com", "api_key": "[redacted]", "n": [1, {"a": null}]})
                .as_object()
                .cloned()
                .unwrap()
        }),
        decision_reason: None,
        held_by_pod: false,
    }
}

fn ended(mut c: ApprovalRequest, state: ApprovalState, full: bool) -> ApprovalRequest {
    c.state = state;
    if full {
        c.scope = Some(Scope::Tool);
        c.decided_by = Some("alice".into());
        c.decided_at = Some(T0 + 1_000);
        c.end_reason = Some("run_ended".into());
        c.decision_reason = Some("on the allow list".into());
    }
    c
}

fn policy() -> Policy {
    Policy {
        scope: Scope::Tool,
        scope_key: "run:run-1".into(),
        tool_name: "web_fetch".into(),
        owner: Some("alice".into()),
        project_id: None,
        origin_run_id: "run-1".into(),
        request_id: "5f0c7a2e-9d41".into(),
        granted_by: "alice".into(),
        granted_at: T0,
        revoked_by: Some("bob".into()),
        revoked_at: Some(T0 + 5_000),
        reached_runs: vec!["run-1".into()],
    }
}

fn record(state: MutationState, full: bool) -> MutationRecord {
    MutationRecord {
        run_id: "run-1".into(),
        tool_call_id: "call-1".into(),
        approval_id: "appr-1".into(),
        request_id: "5f0c7a2e-9d41".into(),
        tool_name: "send_email".into(),
        arguments_hash: None,
        state,
        execution_status: Some(if state == MutationState::Completed {
            ExecutionStatus::Executed
        } else {
            ExecutionStatus::NotExecuted
        }),
        result: full.then(|| json!({"message_id": "m-1"})),
        error: full.then(|| json!({"code": "timeout"})),
        reason: full.then_some(Reason::NotSent),
        evidence: full.then_some(tollgate_domain::Evidence::Confirmed),
        settled_by: None,
        started_sequence: Some(5),
        created_at: T0,
        dispatched_at: Some(T0 + 10),
        settled_at: Some(T0 + 20),
        settlement_deadline_at: T0 + 60_000,
        reconciliation: Some(Reconciliation {
            observed: Observed::Applied,
            by: "ops-alice".into(),
            at: T0 + 30,
        }),
    }
}

#[test]
fn every_server_owned_event_is_its_payload_type() {
    let mut seen = Vec::new();
    for full in [true, false] {
        let run = NewRun {
            run_id: "run-1".into(),
            kind: if full {
                RunKind::Child
            } else {
                RunKind::Single
            },
            parent_run_id: full.then(|| "coord-1".to_owned()),
            subtask_id: full.then(|| json!(3)),
            owner: full.then(|| "alice".to_owned()),
            project_id: full.then(|| "p-1".to_owned()),
            execution_mode: full.then(|| "pod".to_owned()),
            ..NewRun::default()
        };
        holds::<payloads::RunStarted>("RunStarted", &run.started_event(), &mut seen);

        let c = card(full);
        holds::<payloads::ApprovalRequired>("ApprovalRequired", &c.required_event(), &mut seen);
        holds::<payloads::ApprovalPending>("ApprovalPending", &c.pending_event(1), &mut seen);
        holds::<payloads::ChildApprovalRequired>(
            "ChildApprovalRequired",
            &c.coordinator_required_event(),
            &mut seen,
        );
        for state in [
            ApprovalState::Approved,
            ApprovalState::Denied,
            ApprovalState::Expired,
        ] {
            let e = ended(card(full), state, full);
            holds::<payloads::ApprovalResolved>("ApprovalResolved", &e.resolved_event(), &mut seen);
            holds::<payloads::ApprovalResolved>(
                "ApprovalResolved",
                &e.forwarded_resolved_event(),
                &mut seen,
            );
            holds::<payloads::ChildApprovalResolved>(
                "ChildApprovalResolved",
                &e.coordinator_resolved_event(),
                &mut seen,
            );
        }
        let mut auto = card(full);
        auto.auto_approval = Some(AutoApproval {
            policy_id: "p".into(),
            sequence: 4,
        });
        holds::<payloads::AutoApproved>(
            "AutoApproved",
            &policy().auto_approved_event(&auto),
            &mut seen,
        );
        let mut unrevoked = policy();
        if !full {
            unrevoked.revoked_by = None;
        }
        holds::<payloads::PolicyRevoked>("PolicyRevoked", &unrevoked.revoked_event(), &mut seen);

        let mut child = NewRun {
            run_id: "child-1".into(),
            kind: RunKind::Child,
            parent_run_id: Some("coord-1".into()),
            subtask_id: full.then(|| json!("subtask-a")),
            ..NewRun::default()
        }
        .head(T0);
        child.record(["agent.message"], T0 + 1_000);
        if !full {
            child.last_real_type = None;
        }
        let check = StallCheck {
            now: T0 + 700_000,
            timeout_ms: 600_000,
            action: if full {
                StallAction::Fail
            } else {
                StallAction::default()
            },
        };
        holds::<payloads::ChildStallDetected>(
            "ChildStallDetected",
            &stall_detected_event(&child, &check),
            &mut seen,
        );

        for state in [
            MutationState::Completed,
            MutationState::NotExecuted,
            MutationState::OutcomeUnknown,
        ] {
            let r = record(state, full);
            holds::<payloads::ExecutionIds>("ExecutionIds", &r.started_event(), &mut seen);
            holds::<payloads::ExecutionIds>("ExecutionIds", &r.heartbeat_event(2), &mut seen);
            holds::<payloads::ToolExecution>("ToolExecution", &r.execution_event(), &mut seen);
            holds::<payloads::ExecutionReconciled>(
                "ExecutionReconciled",
                &r.reconciled_event().unwrap(),
                &mut seen,
            );
            holds::<payloads::ExecutionUpdated>(
                "ExecutionUpdated",
                &r.updated_event(MutationState::OutcomeUnknown),
                &mut seen,
            );
        }
    }
    // Every server-owned type but the three terminal ones (whose payload is the agent's)
    // was built and checked, and `PAYLOADS` names no other.
    let seen: BTreeSet<&str> = seen.iter().map(String::as_str).collect();
    let owned: BTreeSet<&str> = SERVER_OWNED_TYPES
        .iter()
        .copied()
        .filter(|t| !tollgate_domain::event::types::TERMINAL.contains(t))
        .collect();
    assert_eq!(seen, owned);
    let named: BTreeSet<&str> = PAYLOADS.iter().map(|(t, _)| *t).collect();
    assert_eq!(named, owned);
}

/// The check can fail: a payload with a key its type lacks does not write back the same.
#[test]
fn a_key_the_type_lacks_is_caught() {
    let mut draft = card(true).required_event();
    draft.payload.insert("surprise".into(), json!(1));
    let caught = std::panic::catch_unwind(|| {
        holds::<payloads::ApprovalRequired>("ApprovalRequired", &draft, &mut Vec::new())
    });
    assert!(caught.is_err());
    let mut draft = card(true).required_event();
    let _: Option<Value> = draft.payload.remove("toolName");
    let caught = std::panic::catch_unwind(|| {
        holds::<payloads::ApprovalRequired>("ApprovalRequired", &draft, &mut Vec::new())
    });
    assert!(caught.is_err());
}
