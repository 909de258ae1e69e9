//! The approval gate of seed 003: cards, their states, decision scopes, and the exact
//! payloads of the events that announce them. Pure values; the stores write them and
//! the use-cases decide which transition applies.

use crate::event::types as ev;
use serde_json::{json, Map, Value};

use crate::event::EventDraft;

/// Where a card is in its life. Only `Pending` moves, and only once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApprovalState {
    Pending,
    Approved,
    Denied,
    Expired,
}

impl ApprovalState {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Approved => "approved",
            ApprovalState::Denied => "denied",
            ApprovalState::Expired => "expired",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "pending" => ApprovalState::Pending,
            "approved" => ApprovalState::Approved,
            "denied" => ApprovalState::Denied,
            "expired" => ApprovalState::Expired,
            _ => return None,
        })
    }
}

/// How far an approval reaches (docs/architecture.md §6). Parsed exactly and case-sensitively;
/// anything else is `Once`, the narrowest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scope {
    Once,
    Run,
    Tool,
    Always,
}

impl Scope {
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("run") => Scope::Run,
            Some("tool") => Scope::Tool,
            Some("always") => Scope::Always,
            _ => Scope::Once,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Once => "once",
            Scope::Run => "run",
            Scope::Tool => "tool",
            Scope::Always => "always",
        }
    }
}

/// How a pending card ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    Approved {
        scope: Scope,
        by: String,
        /// Why the operator decided so, when they said.
        reason: Option<String>,
    },
    Denied {
        by: String,
        reason: Option<String>,
    },
    /// The deadline passed (a timer, the sweeper, or a click that came too late).
    Expired,
    /// The card's run ended while it was pending: it expires with reason `run_ended`,
    /// whatever was asked of it (nothing is approved on a run that no longer runs).
    RunEnded,
    /// The agent that armed it no longer needs it (its caller cancelled the call): it
    /// expires with reason `withdrawn`, and nothing it asked for may run.
    Withdrawn,
}

impl Resolution {
    pub fn state(&self) -> ApprovalState {
        match self {
            Resolution::Approved { .. } => ApprovalState::Approved,
            Resolution::Denied { .. } => ApprovalState::Denied,
            Resolution::Expired | Resolution::RunEnded | Resolution::Withdrawn => {
                ApprovalState::Expired
            }
        }
    }

    /// The time a resolution asked at `asked_at` is judged at, when the step that writes
    /// it commits at `now`: a denial by the click's time (a denial clicked before the
    /// deadline stays a denial, however late it commits); anything else by the later of
    /// the two (an approval never commits past the deadline).
    pub fn judged_at(&self, asked_at: i64, now: i64) -> i64 {
        match self {
            Resolution::Denied { .. } => asked_at,
            _ => asked_at.max(now),
        }
    }

    /// What a resolution asked of a pending card becomes, given whether its run still
    /// runs and whether its deadline has passed at `at`: on an ended run every card
    /// ends as [`Resolution::RunEnded`]; past the deadline, as [`Resolution::Expired`].
    /// The stores apply this in the same step that writes the card, with `at` from
    /// [`Resolution::judged_at`] (for an approval, the clock as that step commits, never
    /// the click's earlier time).
    pub fn effective(self, run_running: bool, at: i64, expires_at: i64) -> Resolution {
        if !run_running {
            Resolution::RunEnded
        } else if at >= expires_at {
            Resolution::Expired
        } else {
            self
        }
    }
}

/// Why an expired card ended when its deadline is not the reason.
pub const REASON_RUN_ENDED: &str = "run_ended";
/// Why an expired card ended when the agent that armed it withdrew it.
pub const REASON_WITHDRAWN: &str = "withdrawn";

/// An approval card as stored: one per `(run_id, request_id)`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalRequest {
    /// The run that raised it (a child when it has a coordinator).
    pub run_id: String,
    pub request_id: String,
    pub tool_name: String,
    pub tool_call_id: String,
    pub approval_id: String,
    /// `tool_call_id` / `approval_id` were given when armed (the events then carry them).
    pub explicit_ids: bool,
    pub url: Option<String>,
    pub intention: Option<String>,
    pub message: Option<String>,
    pub arguments_hash: Option<String>,
    /// What the operator is shown of the arguments, redacted and bounded when armed
    /// (display only: `arguments_hash` binds the call).
    pub arguments_preview: Option<Map<String, Value>>,
    pub state: ApprovalState,
    pub scope: Option<Scope>,
    pub decided_by: Option<String>,
    /// The deciding operator's reason, when they gave one.
    pub decision_reason: Option<String>,
    pub decided_at: Option<i64>,
    pub created_at: i64,
    /// Milliseconds since the epoch; a decision at or after it expires the card instead.
    pub expires_at: i64,
    /// The coordinator that mirrors it, when the run is a child.
    pub coordinator_run_id: Option<String>,
    pub subtask_id: Option<Value>,
    /// The run's project (policies never reach across projects).
    pub project_id: Option<String>,
    /// Why it ended, when not by decision or deadline: `run_ended` ([`REASON_RUN_ENDED`]).
    pub end_reason: Option<String>,
    /// Set when a live policy approved the gate instead of a human: the card was stored
    /// `approved` in the same step as `tool.auto_approved` and was never pending.
    pub auto_approval: Option<AutoApproval>,
    /// The card lives in the run's AgentHost pod (`execution_mode: "pod"`), which
    /// announced it on the run: a decision on it is forwarded to the pod, its heartbeats
    /// and its own timeout come from the pod, and Tollgate's expiry is only a backstop
    /// (docs/architecture.md §8). Listed with `held_by: "pod"`.
    pub held_by_pod: bool,
}

/// How a policy approved a card (see [`ApprovalRequest::auto_approved`]): what a retried
/// arm needs to answer exactly as the first one did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AutoApproval {
    /// [`Policy::id`] of the policy that covered the gate.
    pub policy_id: String,
    /// Sequence of `tool.auto_approved` on the card's run.
    pub sequence: u64,
}

/// `decided_by` of an auto-approved card: this prefix, then the covering policy's id
/// (`policy:<policy_id>`). A human's decision carries the operator's subject instead.
pub const POLICY_DECIDER_PREFIX: &str = "policy:";

/// Bounds on a card's text fields (the card is read on every decision and heartbeat).
pub const MAX_REQUEST_ID: usize = 128;
pub const MAX_TOOL_NAME: usize = 128;
pub const MAX_URL: usize = 2048;
pub const MAX_TEXT: usize = 4096;
pub const MAX_HASH: usize = 256;
/// Longest a card may wait for a human.
pub const MAX_TIMEOUT_SECONDS: u64 = 7 * 24 * 3600;
/// Most pending cards one run may hold at once: arming another answers 409 until one is
/// decided or expires (a runaway agent cannot flood the operators' console).
pub const MAX_OPEN_CARDS_PER_RUN: u64 = 200;
pub const DEFAULT_TIMEOUT_SECONDS: u64 = 300;

/// Ids travel in URLs and keys: `[A-Za-z0-9_.:-]`, 1–128, never `.` or `..`.
pub fn valid_id(id: &str) -> bool {
    crate::validate_run_id(id)
}

impl ApprovalRequest {
    /// The short form operators read: the first 8 characters of `request_id`.
    pub fn display_id(&self) -> &str {
        let end = self
            .request_id
            .char_indices()
            .nth(8)
            .map_or(self.request_id.len(), |(i, _)| i);
        &self.request_id[..end]
    }

    fn with_ids(&self, mut p: Map<String, Value>) -> Map<String, Value> {
        if self.explicit_ids {
            p.insert("tool_call_id".into(), self.tool_call_id.clone().into());
            p.insert("approval_id".into(), self.approval_id.clone().into());
        }
        p
    }

    /// `tool.approval_required` on the card's own run (seed 003 payload).
    pub fn required_event(&self) -> EventDraft {
        let mut p = Map::new();
        p.insert("requestId".into(), self.request_id.clone().into());
        p.insert("displayId".into(), self.display_id().into());
        p.insert("toolName".into(), self.tool_name.clone().into());
        for (k, v) in [
            ("url", &self.url),
            ("intention", &self.intention),
            ("message", &self.message),
        ] {
            if let Some(v) = v {
                p.insert(k.into(), v.clone().into());
            }
        }
        self.with_preview(&mut p);
        EventDraft::server(ev::APPROVAL_REQUIRED, self.with_ids(p))
    }

    /// `coordinator.child_approval_required` on the coordinator's run.
    pub fn coordinator_required_event(&self) -> EventDraft {
        let mut p = Map::new();
        p.insert("childRunId".into(), self.run_id.clone().into());
        p.insert(
            "subtaskId".into(),
            self.subtask_id.clone().unwrap_or(Value::Null),
        );
        p.insert("requestId".into(), self.request_id.clone().into());
        p.insert("toolName".into(), self.tool_name.clone().into());
        if let Some(url) = &self.url {
            p.insert("url".into(), url.clone().into());
        }
        self.with_preview(&mut p);
        EventDraft::server(ev::CHILD_APPROVAL_REQUIRED, self.with_ids(p))
    }

    /// `tool.approval_pending`: heartbeat number `beat` while the card waits. Keyed
    /// (`event_id`), so a redelivered timer cannot write the same heartbeat twice.
    pub fn pending_event(&self, beat: u32) -> EventDraft {
        let p = json!({
            "requestId": self.request_id,
            "displayId": self.display_id(),
            "toolName": self.tool_name,
        });
        let mut draft = EventDraft::server(ev::APPROVAL_PENDING, as_map(p));
        draft.event_id = Some(format!("approval_pending:{}:{beat}", self.request_id));
        draft
    }

    /// The card Tollgate keeps for a decision its pod took on a card Tollgate never saw
    /// (ended, pod-held, counted nowhere): a later announcement of it finds it ended.
    pub fn forwarded_record(&self) -> Self {
        let mut card = self.clone();
        card.held_by_pod = true;
        card
    }

    /// `tool.approval_resolved` for a decision an AgentHost pod took on a card only it
    /// held, keyed per request (`tollgate:pod_resolved:<32 hex>`): repeated forwards of
    /// one decision append it once.
    pub fn forwarded_resolved_event(&self) -> EventDraft {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(b"tollgate-pod-resolved\0")
            .chain_update(self.run_id.as_bytes())
            .chain_update(b"\0")
            .chain_update(self.request_id.as_bytes())
            .finalize();
        let mut draft = self.resolved_event();
        draft.event_id = Some(format!(
            "tollgate:pod_resolved:{}",
            hex::encode(&digest[..16])
        ));
        draft
    }

    /// `tool.approval_resolved` on the card's run, for a card already moved to its end.
    pub fn resolved_event(&self) -> EventDraft {
        let mut p = as_map(json!({
            "requestId": self.request_id,
            "runId": self.run_id,
            "approved": self.state == ApprovalState::Approved,
            "expired": self.state == ApprovalState::Expired,
        }));
        self.decision_facts(&mut p);
        EventDraft::server(ev::APPROVAL_RESOLVED, self.with_ids(p))
    }

    /// `coordinator.child_approval_resolved`, mirroring the resolution on the coordinator.
    pub fn coordinator_resolved_event(&self) -> EventDraft {
        let mut p = as_map(json!({
            "childRunId": self.run_id,
            "subtaskId": self.subtask_id.clone().unwrap_or(Value::Null),
            "requestId": self.request_id,
            "approved": self.state == ApprovalState::Approved,
            "expired": self.state == ApprovalState::Expired,
        }));
        self.decision_facts(&mut p);
        EventDraft::server(ev::CHILD_APPROVAL_RESOLVED, self.with_ids(p))
    }

    fn with_preview(&self, p: &mut Map<String, Value>) {
        if let Some(preview) = &self.arguments_preview {
            p.insert("argumentsPreview".into(), Value::Object(preview.clone()));
        }
    }

    /// Who decided, why, and with which scope (absent for an expiry): the audit trail.
    fn decision_facts(&self, p: &mut Map<String, Value>) {
        if let Some(by) = &self.decided_by {
            p.insert("decidedBy".into(), by.clone().into());
        }
        if let Some(reason) = &self.decision_reason {
            p.insert("decisionReason".into(), reason.clone().into());
        }
        if let Some(scope) = self.scope {
            p.insert("scope".into(), scope.as_str().into());
        }
        if let Some(reason) = &self.end_reason {
            p.insert("reason".into(), reason.clone().into());
        }
    }

    /// The card a live `policy` approves at `at` (millis), with `tool.auto_approved` at
    /// `sequence`: `approved` with the policy's scope, decided by
    /// `policy:<policy_id>` ([`POLICY_DECIDER_PREFIX`]) — never pending.
    pub fn auto_approved(&self, policy: &Policy, sequence: u64, at: i64) -> Self {
        let mut card = self.clone();
        card.state = ApprovalState::Approved;
        card.scope = Some(policy.scope);
        card.decided_by = Some(format!("{POLICY_DECIDER_PREFIX}{}", policy.id()));
        card.decided_at = Some(at);
        card.auto_approval = Some(AutoApproval {
            policy_id: policy.id(),
            sequence,
        });
        card
    }

    /// Whether `other` (an arm repeated with this card's `request_id`) asks about the same
    /// call: tool, call identity, arguments, URL and the text the operator was shown (the
    /// `arguments_preview` is display only and not compared: a retry whose preview differs,
    /// e.g. across a change of redaction, answers this card). A
    /// repeat that differs must not be answered with this card's decision — the human
    /// approved this call, not that one.
    pub fn same_call_as(&self, other: &ApprovalRequest) -> bool {
        self.tool_name == other.tool_name
            && self.tool_call_id == other.tool_call_id
            && self.approval_id == other.approval_id
            && self.arguments_hash == other.arguments_hash
            && self.url == other.url
            && self.intention == other.intention
            && self.message == other.message
            && self.held_by_pod == other.held_by_pod
    }

    /// The card after `resolution` at `at` (millis).
    pub fn resolved(&self, resolution: &Resolution, at: i64) -> Self {
        let mut card = self.clone();
        card.state = resolution.state();
        card.decided_at = Some(at);
        match resolution {
            Resolution::Approved { scope, by, reason } => {
                card.scope = Some(*scope);
                card.decided_by = Some(by.clone());
                card.decision_reason = reason.clone();
            }
            Resolution::Denied { by, reason } => {
                card.decided_by = Some(by.clone());
                card.decision_reason = reason.clone();
            }
            Resolution::Expired => {}
            Resolution::RunEnded => card.end_reason = Some(REASON_RUN_ENDED.into()),
            Resolution::Withdrawn => card.end_reason = Some(REASON_WITHDRAWN.into()),
        }
        card
    }
}

fn as_map(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card() -> ApprovalRequest {
        ApprovalRequest {
            run_id: "child-1".into(),
            request_id: "a1b2c3d4e5f6-0000".into(),
            tool_name: "web_fetch".into(),
            tool_call_id: "a1b2c3d4e5f6-0000".into(),
            approval_id: "a1b2c3d4e5f6-0000".into(),
            explicit_ids: false,
            url: Some("https://example.com".into()),
            intention: None,
            message: Some("The agent wants to fetch a URL.".into()),
            arguments_hash: None,
            state: ApprovalState::Pending,
            scope: None,
            decided_by: None,
            decided_at: None,
            created_at: 0,
            expires_at: 300_000,
            coordinator_run_id: Some("coord-1".into()),
            subtask_id: Some(3.into()),
            project_id: None,
            end_reason: None,
            auto_approval: None,
            arguments_preview: None,
            decision_reason: None,
            held_by_pod: false,
        }
    }

    #[test]
    fn scopes_are_exact_and_default_to_once() {
        assert_eq!(Scope::parse(Some("always")), Scope::Always);
        for other in [None, Some("Always"), Some("RUN"), Some(""), Some("forever")] {
            assert_eq!(Scope::parse(other), Scope::Once, "{other:?}");
        }
    }

    #[test]
    fn payloads_follow_seed_003() {
        let c = card();
        assert_eq!(c.display_id(), "a1b2c3d4");
        let req = c.required_event();
        assert_eq!(req.event_type, "tool.approval_required");
        assert_eq!(
            Value::Object(req.payload),
            json!({"requestId": "a1b2c3d4e5f6-0000", "displayId": "a1b2c3d4",
                   "toolName": "web_fetch", "url": "https://example.com",
                   "message": "The agent wants to fetch a URL."})
        );
        let mirror = c.coordinator_required_event();
        assert_eq!(mirror.payload["childRunId"], "child-1");
        assert_eq!(mirror.payload["subtaskId"], 3);
        let expired = c.resolved(&Resolution::Expired, 300_000);
        assert_eq!(
            Value::Object(expired.resolved_event().payload),
            json!({"requestId": "a1b2c3d4e5f6-0000", "runId": "child-1",
                   "approved": false, "expired": true})
        );
        let approved = c.resolved(
            &Resolution::Approved {
                scope: Scope::Run,
                by: "alice".into(),
                reason: None,
            },
            1,
        );
        let ev = approved.coordinator_resolved_event();
        assert_eq!(ev.payload["approved"], true);
        assert_eq!(ev.payload["expired"], false);
        assert_eq!(ev.payload["decidedBy"], "alice");
        assert_eq!(
            c.pending_event(2).event_id.as_deref(),
            Some("approval_pending:a1b2c3d4e5f6-0000:2")
        );
        assert_eq!(
            Value::Object(c.pending_event(1).payload),
            json!({"requestId": "a1b2c3d4e5f6-0000", "displayId": "a1b2c3d4", "toolName": "web_fetch"})
        );
    }
}

/// A durable grant from a `tool`, `run` or `always` decision: the tool it covers and
/// where (its scope key). Written in the same step as the decision that won; revoked by
/// an operator, which is announced on the streams it reached.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub scope: Scope,
    /// Where it reaches: `run:<run>`, `crew:<coordinator>:<project>:<principal>:<owner>`
    /// or `agent:<project>:<principal>:<owner>` (see [`scope_key`]). Keys of the older
    /// forms `family:…` and `owner:…` (no principal) are never generated any more, so
    /// such grants cover nothing ([`Policy::is_legacy`]).
    pub scope_key: String,
    pub tool_name: String,
    pub owner: Option<String>,
    pub project_id: Option<String>,
    /// The run and card of the decision that granted it.
    pub origin_run_id: String,
    pub request_id: String,
    pub granted_by: String,
    pub granted_at: i64,
    pub revoked_by: Option<String>,
    pub revoked_at: Option<i64>,
    /// Runs it auto-approved in (and the origin run): where a revocation is announced.
    pub reached_runs: Vec<String>,
}

/// What a run knows of itself for scope reach.
#[derive(Debug, Clone, Copy)]
pub struct Reach<'a> {
    pub run_id: &'a str,
    /// The run's incarnation: a grant never outlives the run it was made on, even if
    /// the id is created again.
    pub incarnation: &'a str,
    pub owner: Option<&'a str>,
    pub project_id: Option<&'a str>,
    /// The authenticated agent principal (JWT `sub`) that created the run. `owner` is
    /// only what the create body claims, so no grant reaches past the principal.
    pub principal: &'a str,
    /// The parent coordinator, for a child run.
    pub coordinator: Option<CoordinatorReach<'a>>,
}

/// What a child's coordinator contributes to its reach.
#[derive(Debug, Clone, Copy)]
pub struct CoordinatorReach<'a> {
    pub run_id: &'a str,
    pub incarnation: &'a str,
    pub owner: Option<&'a str>,
    /// The agent principal that created the coordinator.
    pub principal: &'a str,
}

/// One part of a scope key: hex, so no owner, project or id can contain the separator
/// (`p` + `x:alice` and `p:x` + `alice` are different keys; no project is not `-`).
fn part(value: Option<&str>) -> String {
    match value {
        Some(v) => hex::encode(v),
        None => "~".into(),
    }
}

/// The key a grant of `scope` made on a run with this reach is stored under (`None` for
/// `once`, which grants nothing). `tool`: this run. `run`: this run and, when its
/// coordinator has the same owner and was created by the same agent principal, its
/// siblings. `always`: the owner's runs within the project created by the same agent
/// principal. Every key beyond `run:` names the principal: a grant never reaches a run
/// another agent created, whatever `owner` that agent claims.
pub fn scope_key(scope: Scope, reach: &Reach<'_>) -> Option<String> {
    let project = part(reach.project_id);
    let principal = part(Some(reach.principal));
    let this_run = format!(
        "run:{}:{}",
        part(Some(reach.run_id)),
        part(Some(reach.incarnation))
    );
    match scope {
        Scope::Once => None,
        Scope::Tool => Some(this_run),
        Scope::Run => Some(match (reach.coordinator, reach.owner) {
            (Some(c), Some(owner)) if c.owner == Some(owner) && c.principal == reach.principal => {
                format!(
                    "crew:{}:{}:{project}:{principal}:{}",
                    part(Some(c.run_id)),
                    part(Some(c.incarnation)),
                    part(Some(owner))
                )
            }
            _ => this_run,
        }),
        Scope::Always => reach
            .owner
            .map(|owner| format!("agent:{project}:{principal}:{}", part(Some(owner)))),
    }
}

/// Every key under which a live grant would cover a new gate on a run with this reach
/// (`always` keys only when the tool is always-eligible).
pub fn covering_keys(reach: &Reach<'_>, always_eligible: bool) -> Vec<String> {
    let mut keys: Vec<String> = scope_key(Scope::Tool, reach).into_iter().collect();
    if let Some(family) = scope_key(Scope::Run, reach).filter(|k| k.starts_with("crew:")) {
        keys.push(family);
    }
    if always_eligible {
        keys.extend(scope_key(Scope::Always, reach));
    }
    keys
}

impl Policy {
    /// The policy's public id: its key, hex-encoded (opaque, URL-safe, no lookup).
    pub fn id(&self) -> String {
        policy_id(&self.scope_key, &self.tool_name)
    }

    pub fn is_live(&self) -> bool {
        self.revoked_at.is_none()
    }

    /// A grant stored under a key of an earlier form (no agent principal): no gate looks
    /// it up any more, so it covers nothing; listed so that an operator can revoke it.
    pub fn is_legacy(&self) -> bool {
        self.scope_key.starts_with("family:") || self.scope_key.starts_with("owner:")
    }

    /// `tool.auto_approved`: a gate a live policy covered (no card).
    pub fn auto_approved_event(&self, card: &ApprovalRequest) -> EventDraft {
        let mut p = as_map(json!({
            "requestId": card.request_id,
            "displayId": card.display_id(),
            "toolName": card.tool_name,
            "scope": self.scope.as_str(),
            "policyId": self.id(),
        }));
        if card.explicit_ids {
            p.insert("tool_call_id".into(), card.tool_call_id.clone().into());
            p.insert("approval_id".into(), card.approval_id.clone().into());
        }
        let mut draft = EventDraft::server("tool.auto_approved", p);
        // Keyed: a retried arm cannot auto-approve the same request twice.
        draft.event_id = Some(format!("auto_approved:{}", card.request_id));
        draft
    }

    /// `tool.policy_revoked`, announced on each stream the policy reached. Keyed by
    /// [`Policy::revocation_event_id`]: announcing the same revocation again (a repeated
    /// revoke completing what an earlier attempt missed) writes nothing twice.
    pub fn revoked_event(&self) -> EventDraft {
        let mut draft = EventDraft::server(
            "tool.policy_revoked",
            as_map(json!({
                "policyId": self.id(),
                "scope": self.scope.as_str(),
                "toolName": self.tool_name,
                "revokedBy": self.revoked_by,
            })),
        );
        draft.event_id = Some(self.revocation_event_id());
        draft
    }

    /// `policy_revoked:<32 hex>`: a digest of the policy's key (`scope_key`,
    /// `tool_name`) and of the grant it revokes (`request_id`, `granted_at`) — the same
    /// for every announcement of one revocation, a new one when the key is granted again
    /// and revoked again. A digest, because the key can be far longer than an event key
    /// may be.
    pub fn revocation_event_id(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(b"tollgate-policy-revoked\0")
            .chain_update(self.scope_key.as_bytes())
            .chain_update(b"\0")
            .chain_update(self.tool_name.as_bytes())
            .chain_update(b"\0")
            .chain_update(self.request_id.as_bytes())
            .chain_update(b"\0")
            .chain_update(self.granted_at.to_string().as_bytes())
            .finalize();
        format!("policy_revoked:{}", hex::encode(&digest[..16]))
    }
}

/// `hex(scope_key ‖ "\n" ‖ tool_name)`.
pub fn policy_id(scope_key: &str, tool_name: &str) -> String {
    hex::encode(format!("{scope_key}\n{tool_name}"))
}

/// The key a policy id names, if it is one.
pub fn parse_policy_id(id: &str) -> Option<(String, String)> {
    let raw = String::from_utf8(hex::decode(id).ok()?).ok()?;
    let (key, tool) = raw.split_once('\n')?;
    (!key.is_empty() && !tool.is_empty()).then(|| (key.to_owned(), tool.to_owned()))
}

#[cfg(test)]
mod scope_tests {
    use super::*;

    #[test]
    fn scope_reach_follows_design_6() {
        let child = Reach {
            run_id: "c1",
            incarnation: "i1",
            owner: Some("alice"),
            project_id: Some("p"),
            principal: "agent-a",
            coordinator: Some(CoordinatorReach {
                run_id: "co",
                incarnation: "i0",
                owner: Some("alice"),
                principal: "agent-a",
            }),
        };
        let tool = scope_key(Scope::Tool, &child).unwrap();
        let run = scope_key(Scope::Run, &child).unwrap();
        let always = scope_key(Scope::Always, &child).unwrap();
        assert_eq!(scope_key(Scope::Once, &child), None);
        assert!(
            tool.starts_with("run:") && run.starts_with("crew:") && always.starts_with("agent:")
        );
        // A coordinator of another owner: `run` stays on this run.
        let foreign = Reach {
            coordinator: Some(CoordinatorReach {
                owner: Some("bob"),
                ..child.coordinator.unwrap()
            }),
            ..child
        };
        // A coordinator another agent created: `run` stays on this run too.
        let other_agent = Reach {
            coordinator: Some(CoordinatorReach {
                principal: "agent-b",
                ..child.coordinator.unwrap()
            }),
            ..child
        };
        assert_eq!(scope_key(Scope::Run, &other_agent).unwrap(), tool);
        // The same owner claimed by another agent principal never shares a grant.
        let claimed = Reach {
            principal: "agent-b",
            ..child
        };
        assert_ne!(scope_key(Scope::Always, &claimed).unwrap(), always);
        assert_ne!(scope_key(Scope::Run, &claimed).unwrap(), run);
        assert_eq!(scope_key(Scope::Run, &foreign).unwrap(), tool);
        assert_eq!(
            covering_keys(&child, true),
            [tool.clone(), run, always.clone()]
        );
        assert_eq!(covering_keys(&foreign, false), std::slice::from_ref(&tool));
        // Another project, or the same id created again, never shares a key.
        let other = Reach {
            project_id: Some("q"),
            ..child
        };
        assert_ne!(scope_key(Scope::Always, &other).unwrap(), always);
        let again = Reach {
            incarnation: "i2",
            ..child
        };
        assert_ne!(scope_key(Scope::Tool, &again).unwrap(), tool);
        // Separators inside values cannot make two grants collide.
        let a = Reach {
            project_id: Some("p"),
            owner: Some("x:alice"),
            ..child
        };
        let b = Reach {
            project_id: Some("p:x"),
            owner: Some("alice"),
            ..child
        };
        assert_ne!(scope_key(Scope::Always, &a), scope_key(Scope::Always, &b));
        let none = Reach {
            project_id: None,
            ..child
        };
        let dash = Reach {
            project_id: Some("-"),
            ..child
        };
        assert_ne!(
            scope_key(Scope::Always, &none),
            scope_key(Scope::Always, &dash)
        );
        let id = policy_id("owner:p:alice", "web_fetch");
        assert_eq!(
            parse_policy_id(&id),
            Some(("owner:p:alice".into(), "web_fetch".into()))
        );
        assert_eq!(parse_policy_id("zz"), None);
    }
}
