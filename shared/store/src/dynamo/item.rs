//! Item mapping: attribute values to domain values and back, and the translation of SDK
//! errors into [`StoreError`] (never by parsing message strings).

use std::collections::HashMap;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::Value;
use tollgate_domain::{RunHead, RunKind, RunStatus};

use crate::StoreError;

pub(crate) type Item = HashMap<String, AttributeValue>;
pub(crate) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub(crate) fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

pub(crate) fn get_s(
    item: &HashMap<String, AttributeValue>,
    key: &str,
) -> Result<String, StoreError> {
    match item.get(key) {
        Some(AttributeValue::S(v)) => Ok(v.clone()),
        _ => Err(corrupt(key)),
    }
}

pub(crate) fn opt_s(item: &HashMap<String, AttributeValue>, key: &str) -> Option<String> {
    match item.get(key) {
        Some(AttributeValue::S(v)) => Some(v.clone()),
        _ => None,
    }
}

pub(crate) fn get_n<T: std::str::FromStr>(
    item: &HashMap<String, AttributeValue>,
    key: &str,
) -> Result<T, StoreError> {
    match item.get(key) {
        Some(AttributeValue::N(v)) => v.parse().map_err(|_| corrupt(key)),
        _ => Err(corrupt(key)),
    }
}

pub(crate) fn opt_json(
    item: &HashMap<String, AttributeValue>,
    key: &str,
) -> Result<Option<Value>, StoreError> {
    opt_s(item, key)
        .map(|raw| serde_json::from_str(&raw).map_err(|_| corrupt(key)))
        .transpose()
}

/// An events-table item as the event replay serves (its sequence, type and stored
/// body): how a page and a stream record are both read.
pub(crate) fn stored_event_from_item(item: &Item) -> Result<crate::StoredEvent, StoreError> {
    Ok(crate::StoredEvent {
        sequence: get_n(item, "sequence")?,
        event_type: get_s(item, "type")?,
        body: get_s(item, "body")?,
    })
}

pub(crate) fn corrupt(key: &str) -> StoreError {
    StoreError::Unavailable(format!("stored item has a missing or malformed {key:?}"))
}

pub(crate) fn head_to_item(h: &RunHead) -> HashMap<String, AttributeValue> {
    let mut item = HashMap::from([
        ("run_id".to_string(), s(&h.run_id)),
        ("status".to_string(), s(h.status.as_str())),
        ("next_seq".to_string(), n(h.next_seq)),
        ("kind".to_string(), s(h.kind.as_str())),
        ("created_by".to_string(), s(&h.created_by)),
        ("created_at".to_string(), n(h.created_at)),
        ("last_event_at".to_string(), n(h.last_event_at)),
        ("incarnation".to_string(), s(&h.incarnation)),
    ]);
    if let Some(t) = &h.last_real_type {
        item.insert("last_real_type".into(), s(t));
    }
    if let Some(seq) = h.stall_reported_seq {
        item.insert("stall_reported_seq".into(), n(seq));
    }
    // Sparse index of running child runs, by silence (the stall guard reads it).
    if h.kind == RunKind::Child && !h.status.is_terminal() {
        item.insert(
            "running_child".into(),
            s(running_child_key(&h.run_id, h.next_seq)),
        );
    }
    let strings = [
        ("parent_run_id", &h.parent_run_id),
        ("owner", &h.owner),
        ("project_id", &h.project_id),
        ("channel_id", &h.channel_id),
        ("delivery_id", &h.delivery_id),
        ("execution_mode", &h.execution_mode),
        ("agenthost_origin", &h.agenthost_origin),
    ];
    for (k, v) in strings {
        if let Some(v) = v {
            item.insert(k.into(), s(v));
        }
    }
    for (k, v) in [
        ("subtask_id", &h.subtask_id),
        ("budget", &h.budget),
        ("budget_used", &h.budget_used),
    ] {
        if let Some(v) = v {
            item.insert(k.into(), s(v.to_string()));
        }
    }
    if let Some(t) = h.terminal_seq {
        item.insert("terminal_seq".into(), n(t));
    }
    // The runs listing's index (`runs_by_project`): the run's tenant, by creation.
    item.insert(
        "project_runs".into(),
        s(super::runs::project_runs_key(h.project_id.as_deref())),
    );
    item
}

pub(crate) fn head_from_item(
    item: &HashMap<String, AttributeValue>,
) -> Result<RunHead, StoreError> {
    Ok(RunHead {
        run_id: get_s(item, "run_id")?,
        status: RunStatus::parse(&get_s(item, "status")?).ok_or_else(|| corrupt("status"))?,
        next_seq: get_n(item, "next_seq")?,
        kind: RunKind::parse(&get_s(item, "kind")?).ok_or_else(|| corrupt("kind"))?,
        parent_run_id: opt_s(item, "parent_run_id"),
        subtask_id: opt_json(item, "subtask_id")?,
        owner: opt_s(item, "owner"),
        project_id: opt_s(item, "project_id"),
        channel_id: opt_s(item, "channel_id"),
        created_by: get_s(item, "created_by")?,
        delivery_id: opt_s(item, "delivery_id"),
        execution_mode: opt_s(item, "execution_mode"),
        agenthost_origin: opt_s(item, "agenthost_origin"),
        budget: opt_json(item, "budget")?,
        created_at: get_n(item, "created_at")?,
        last_event_at: get_n(item, "last_event_at")?,
        terminal_seq: item
            .get("terminal_seq")
            .map(|_| get_n(item, "terminal_seq"))
            .transpose()?,
        // Heads written before incarnations existed have none: "" (their tokens are the
        // MAC of the run id alone).
        incarnation: opt_s(item, "incarnation").unwrap_or_default(),
        last_real_type: opt_s(item, "last_real_type"),
        stall_reported_seq: item
            .get("stall_reported_seq")
            .map(|_| get_n(item, "stall_reported_seq"))
            .transpose()?,
        // (A card armed before the count existed can take it below zero: read as 0.)
        open_cards: item
            .get("open_cards")
            .map(|_| get_n::<i64>(item, "open_cards"))
            .transpose()?
            .unwrap_or(0)
            .max(0) as u64,
        budget_used: opt_json(item, "budget_used")?,
    })
}

pub(crate) fn unavailable<
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
>(
    err: SdkError<E, R>,
) -> StoreError {
    let detail = match &err {
        SdkError::ServiceError(ctx) => format!(
            "{}: {}",
            ctx.err().code().unwrap_or("error"),
            ctx.err().message().unwrap_or("")
        ),
        other => other.to_string(),
    };
    StoreError::Unavailable(detail)
}

pub(crate) fn build_error(err: aws_sdk_dynamodb::error::BuildError) -> StoreError {
    StoreError::Unavailable(format!("request build: {err}"))
}

/// `running_child` that heads written before the stall index was sharded carry (one
/// partition for every child). The stall guard still reads it; such a head moves to a
/// shard with its next event.
pub(crate) const LEGACY_RUNNING_CHILD: &str = "running";

/// Shards of the stall guard's index. Every event a child appends rewrites its entry (its
/// `last_event_at` is the index's sort key, so the entry is deleted and put anyway):
/// choosing the shard by the head's new `next_seq` spreads even one busy child's writes
/// over every shard at no extra write.
pub(crate) const STALL_SHARDS: u32 = 8;

/// `running_child` of a running child run's head at `next_seq` (see the runs table's
/// sparse index `running_children`): `running#<shard>`.
pub(crate) fn running_child_key(run_id: &str, next_seq: u64) -> String {
    format!(
        "running#{}",
        shard_of(&[run_id, &next_seq.to_string()], STALL_SHARDS)
    )
}

/// Every `running_child` partition the stall guard reads: the shards, then the legacy one.
pub(crate) fn running_child_partitions() -> Vec<String> {
    (0..STALL_SHARDS)
        .map(|i| format!("running#{i}"))
        .chain([LEGACY_RUNNING_CHILD.to_owned()])
        .collect()
}

/// A stable shard in `0..shards` of `parts` (FNV-1a: the same in every build and
/// process, unlike the standard library's hasher, so every writer and reader agrees).
pub(crate) fn shard_of(parts: &[&str], shards: u32) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    for part in parts {
        for byte in part.bytes().chain([0]) {
            hash ^= u32::from(byte);
            hash = hash.wrapping_mul(0x0100_0193);
        }
    }
    hash % shards
}

/// Sort key of a card in the approvals table (partition: the run that raised it).
pub(crate) fn card_key(request_id: &str) -> String {
    format!("card#{request_id}")
}

/// Sort key of a route item (partition: the coordinator): `request_id → child run`.
pub(crate) fn route_key(request_id: &str) -> String {
    format!("route#{request_id}")
}

/// `pending_key` of cards armed before the pending index was keyed per project: one
/// partition for every tenant. Listings and the sweeper still read it (with a filter on
/// the project) until those cards have ended — at most their timeout after the deploy.
pub(crate) const LEGACY_PENDING_KEY: &str = "pending";

/// Shards of one project's pending partition: a busy project's arms and resolutions
/// spread over this many index partitions; its operator's listing reads all of them.
pub(crate) const PENDING_SHARDS: u32 = 4;

/// Shards of the global `due_key` partition (the sweeper's and a global operator's
/// view): every tenant's arm writes one of them.
pub(crate) const DUE_SHARDS: u32 = 8;

/// The project part of a per-project key: `p:<project>`, or `~` for runs without one
/// (a project named `~` stays apart).
fn project_part(project_id: Option<&str>) -> String {
    match project_id {
        Some(p) => format!("p:{p}"),
        None => "~".to_owned(),
    }
}

fn card_shard(run_id: &str, request_id: &str, shards: u32) -> u32 {
    shard_of(&[run_id, request_id], shards)
}

/// `pending_key` of a pending card: `<project>#<shard>` (index `pending_by_expiry`).
pub(crate) fn pending_key(c: &tollgate_domain::ApprovalRequest) -> String {
    format!(
        "{}#{}",
        project_part(c.project_id.as_deref()),
        card_shard(&c.run_id, &c.request_id, PENDING_SHARDS)
    )
}

/// Every partition of one project's pending cards.
pub(crate) fn pending_partitions(project_id: Option<&str>) -> Vec<String> {
    let part = project_part(project_id);
    (0..PENDING_SHARDS).map(|i| format!("{part}#{i}")).collect()
}

/// `due_key` of a pending card: `due#<shard>` (index `pending_due`, every tenant).
pub(crate) fn due_key(c: &tollgate_domain::ApprovalRequest) -> String {
    format!("due#{}", card_shard(&c.run_id, &c.request_id, DUE_SHARDS))
}

/// Every partition of the global due index.
pub(crate) fn due_partitions() -> Vec<String> {
    (0..DUE_SHARDS).map(|i| format!("due#{i}")).collect()
}

/// Shards of one project's count of open cards: concurrent arms and resolutions of a
/// busy project spread over this many items instead of conflicting on one (transactions
/// that meet on an item cancel each other and retry; with 8 shards, 16 concurrent arms of
/// one project still starved on DynamoDB Local, with 32 they do not).
pub(crate) const COUNTER_SHARDS: u32 = 32;

/// One shard of the count of a project's pending cards (approvals table; run ids cannot
/// hold `#`, so this partition is never a run's): `open` is the count.
pub(crate) fn project_counter_key(project_id: Option<&str>, shard: u32) -> Item {
    HashMap::from([
        ("run_id".to_string(), s(counter_partition(project_id))),
        ("item_key".to_string(), s(format!("open_cards#{shard}"))),
    ])
}

/// The partition holding a project's count shards.
pub(crate) fn counter_partition(project_id: Option<&str>) -> String {
    format!("project#{}", project_part(project_id))
}

/// The share of `cap` one count shard may hold: the shares add up to exactly `cap`.
pub(crate) fn shard_cap(cap: u64, shard: u32) -> u64 {
    let shards = u64::from(COUNTER_SHARDS);
    cap / shards + u64::from(u64::from(shard) < cap % shards)
}

/// The count shard an arm tries first: the card's own (by its ids), or shard 0 when that
/// one's share of the cap is nothing (tiny caps).
pub(crate) fn first_count_shard(c: &tollgate_domain::ApprovalRequest, cap: u64) -> u32 {
    let shard = card_shard(&c.run_id, &c.request_id, COUNTER_SHARDS);
    if shard_cap(cap, shard) > 0 {
        shard
    } else {
        0
    }
}

pub(crate) fn card_to_item(c: &tollgate_domain::ApprovalRequest) -> Item {
    use tollgate_domain::ApprovalState;
    let mut item = HashMap::from([
        ("run_id".to_string(), s(&c.run_id)),
        ("item_key".to_string(), s(card_key(&c.request_id))),
        ("request_id".to_string(), s(&c.request_id)),
        ("tool_name".to_string(), s(&c.tool_name)),
        ("tool_call_id".to_string(), s(&c.tool_call_id)),
        ("approval_id".to_string(), s(&c.approval_id)),
        (
            "explicit_ids".to_string(),
            AttributeValue::Bool(c.explicit_ids),
        ),
        ("state".to_string(), s(c.state.as_str())),
        ("created_at".to_string(), n(c.created_at)),
        ("expires_at_ms".to_string(), n(c.expires_at)),
    ]);
    let strings = [
        ("url", &c.url),
        ("intention", &c.intention),
        ("message", &c.message),
        ("arguments_hash", &c.arguments_hash),
        ("decided_by", &c.decided_by),
        ("decision_reason", &c.decision_reason),
        ("coordinator_run_id", &c.coordinator_run_id),
        ("project_id", &c.project_id),
        ("end_reason", &c.end_reason),
    ];
    for (k, v) in strings {
        if let Some(v) = v {
            item.insert(k.into(), s(v));
        }
    }
    if let Some(scope) = c.scope {
        item.insert("scope".into(), s(scope.as_str()));
    }
    if let Some(at) = c.decided_at {
        item.insert("decided_at".into(), n(at));
    }
    if let Some(v) = &c.subtask_id {
        item.insert("subtask_id".into(), s(v.to_string()));
    }
    if let Some(preview) = &c.arguments_preview {
        item.insert(
            "arguments_preview".into(),
            s(serde_json::Value::Object(preview.clone()).to_string()),
        );
    }
    if c.state == ApprovalState::Pending {
        item.insert("pending_key".into(), s(pending_key(c)));
        item.insert("due_key".into(), s(due_key(c)));
    }
    // An auto-approved card: the policy and the `tool.auto_approved` sequence, so a
    // retried arm answers as the first one did.
    if let Some(auto) = &c.auto_approval {
        item.insert("auto_policy_id".into(), s(&auto.policy_id));
        item.insert("auto_sequence".into(), n(auto.sequence));
    }
    if c.held_by_pod {
        item.insert("held_by".into(), s("pod"));
    }
    item
}

pub(crate) fn card_from_item(item: &Item) -> Result<tollgate_domain::ApprovalRequest, StoreError> {
    use tollgate_domain::{ApprovalState, Scope};
    Ok(tollgate_domain::ApprovalRequest {
        run_id: get_s(item, "run_id")?,
        request_id: get_s(item, "request_id")?,
        tool_name: get_s(item, "tool_name")?,
        tool_call_id: get_s(item, "tool_call_id")?,
        approval_id: get_s(item, "approval_id")?,
        explicit_ids: matches!(item.get("explicit_ids"), Some(AttributeValue::Bool(true))),
        url: opt_s(item, "url"),
        intention: opt_s(item, "intention"),
        message: opt_s(item, "message"),
        arguments_hash: opt_s(item, "arguments_hash"),
        state: ApprovalState::parse(&get_s(item, "state")?).ok_or_else(|| corrupt("state"))?,
        scope: opt_s(item, "scope").map(|v| Scope::parse(Some(&v))),
        decided_by: opt_s(item, "decided_by"),
        decision_reason: opt_s(item, "decision_reason"),
        arguments_preview: match opt_json(item, "arguments_preview")? {
            Some(serde_json::Value::Object(map)) => Some(map),
            Some(_) => return Err(corrupt("arguments_preview")),
            None => None,
        },
        decided_at: item
            .get("decided_at")
            .map(|_| get_n(item, "decided_at"))
            .transpose()?,
        created_at: get_n(item, "created_at")?,
        expires_at: get_n(item, "expires_at_ms")?,
        coordinator_run_id: opt_s(item, "coordinator_run_id"),
        subtask_id: opt_json(item, "subtask_id")?,
        project_id: opt_s(item, "project_id"),
        end_reason: opt_s(item, "end_reason"),
        auto_approval: match opt_s(item, "auto_policy_id") {
            Some(policy_id) => Some(tollgate_domain::approval::AutoApproval {
                policy_id,
                sequence: get_n(item, "auto_sequence")?,
            }),
            None => None,
        },
        held_by_pod: opt_s(item, "held_by").as_deref() == Some("pod"),
    })
}

pub(crate) fn policy_from_item(item: &Item) -> Result<tollgate_domain::Policy, StoreError> {
    use tollgate_domain::Scope;
    let mut reached_runs = match item.get("reached_runs") {
        Some(AttributeValue::Ss(runs)) => runs.clone(),
        _ => Vec::new(),
    };
    reached_runs.sort();
    Ok(tollgate_domain::Policy {
        scope: Scope::parse(Some(&get_s(item, "scope")?)),
        scope_key: get_s(item, "scope_key")?,
        tool_name: get_s(item, "tool_name")?,
        owner: opt_s(item, "owner"),
        project_id: opt_s(item, "project_id"),
        origin_run_id: get_s(item, "origin_run_id")?,
        request_id: get_s(item, "request_id")?,
        granted_by: get_s(item, "granted_by")?,
        granted_at: get_n(item, "granted_at")?,
        revoked_by: opt_s(item, "revoked_by"),
        revoked_at: item
            .get("revoked_at")
            .map(|_| get_n(item, "revoked_at"))
            .transpose()?,
        reached_runs,
    })
}
