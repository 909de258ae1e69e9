//! `start` of an approved call (docs/architecture.md §7): the request, its refusals and
//! the admission that records the intent and announces `tool_execution_started`.

use super::*;
use crate::approval::POLICY_DECIDER_PREFIX;
use crate::approval::{valid_id, ApprovalRequest, ApprovalState, MAX_HASH, MAX_TOOL_NAME};
use crate::run::RunHead;

/// `POST /api/runs/{id}/tool-calls/{tool_call_id}/start`: `{request_id, approval_id,
/// tool_name, arguments_hash?}` plus the path's run and tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartRequest {
    pub run_id: String,
    pub tool_call_id: String,
    pub request_id: String,
    pub approval_id: String,
    pub tool_name: String,
    pub arguments_hash: Option<String>,
}

impl StartRequest {
    /// Shape checks before anything is read: ids as URL/key-safe as the card's.
    pub fn validate(&self) -> Result<(), StartRefusal> {
        for (field, id) in [
            ("tool_call_id", &self.tool_call_id),
            ("request_id", &self.request_id),
            ("approval_id", &self.approval_id),
        ] {
            if !valid_id(id) {
                return Err(StartRefusal::Invalid(format!(
                    "{field} must be 1 to 128 of [A-Za-z0-9_.:-]"
                )));
            }
        }
        if self.tool_name.is_empty() || self.tool_name.chars().count() > MAX_TOOL_NAME {
            return Err(StartRefusal::Invalid(format!(
                "tool_name must be 1 to {MAX_TOOL_NAME} characters"
            )));
        }
        if self
            .arguments_hash
            .as_ref()
            .is_some_and(|h| h.is_empty() || h.chars().count() > MAX_HASH)
        {
            return Err(StartRefusal::Invalid(format!(
                "arguments_hash must be 1 to {MAX_HASH} characters"
            )));
        }
        Ok(())
    }
}

/// A `start` refused without writing anything.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StartRefusal {
    /// 400: the request is malformed.
    #[error("{0}")]
    Invalid(String),
    /// 400: the request does not name what the card (or the stored attempt) approved.
    #[error("{field} does not match the approved call")]
    Mismatch { field: &'static str },
    /// 400: a policy approved the call, not a human; seed 000: "Automatic approval …
    /// do[es] not produce" `tool_execution_started`.
    #[error(
        "the call was approved automatically by a policy; start admits human-approved calls only"
    )]
    AutoApproved,
    /// 400: `human__ask` is a question to a human, not a mutation.
    #[error("human__ask is answered by a human, not executed; start admits tool calls only")]
    HumanAsk,
    /// 409: the card is still waiting for a human.
    #[error("the approval is still pending")]
    NotApproved(ApprovalState),
    /// 409: another attempt of this tool call blocks a new one (in flight, unknown
    /// until an operator reconciles, or already completed).
    #[error("another attempt of this tool call is {}", .0.state.as_str())]
    Blocked(Box<MutationRecord>),
}

impl StartRefusal {
    /// 400 `{error}` or 409 `{error, state}` (the card's or the blocking attempt's).
    pub fn answer(&self) -> Answer {
        let error = self.to_string();
        match self {
            StartRefusal::Invalid(_)
            | StartRefusal::Mismatch { .. }
            | StartRefusal::AutoApproved
            | StartRefusal::HumanAsk => Answer {
                verdict: Verdict::Invalid,
                error: Some(error),
                ..Answer::default()
            },
            StartRefusal::NotApproved(state) => Answer {
                verdict: Verdict::Conflict,
                error: Some(error),
                state: Some(state.as_str()),
                ..Answer::default()
            },
            StartRefusal::Blocked(other) => Answer {
                verdict: Verdict::Conflict,
                error: Some(error),
                state: Some(other.state.as_str()),
                approval_id: Some(other.approval_id.clone()),
                ..Answer::default()
            },
        }
    }
}

/// A bound `arguments_hash` must be repeated exactly: a different one — or none — is
/// not the call that was approved.
fn hash_matches(bound: Option<&str>, given: Option<&str>) -> bool {
    bound.is_none_or(|b| given == Some(b))
}

/// Whether an attempt keeps a new attempt of the same tool call from starting, and how
/// strongly (the strongest blocker is the one answered).
fn blocking_rank(state: MutationState) -> Option<u8> {
    match state {
        // Seed 000: "Unknown outcomes require authoritative reconciliation".
        MutationState::OutcomeUnknown => Some(3),
        // In flight: two attempts of one call must never both reach the transport.
        MutationState::Dispatched => Some(2),
        MutationState::Intent => Some(1),
        // Done: running the same tool call again would be a duplicate mutation.
        MutationState::Completed => Some(0),
        // Seed 000: "confirmed non-execution still requires a fresh approval" — which
        // this attempt, having its own approval_id, is.
        MutationState::NotExecuted => None,
    }
}

/// `start` of an approved call (docs/architecture.md §7). `card` is the card `request_id` names;
/// `attempts` every stored record of `(run_id, tool_call_id)` (this `approval_id`'s
/// included, if any); `usage` the head's budget usage. The event of an admission takes
/// `head.next_seq`: the store commits it conditioned on that head, so the sequence the
/// answer reports is the one the event gets.
pub fn start(
    req: &StartRequest,
    card: &ApprovalRequest,
    head: &RunHead,
    usage: &BudgetUsage,
    attempts: &[MutationRecord],
    settings: &ExecutionSettings,
    now: i64,
) -> Result<Decision, StartRefusal> {
    req.validate()?;
    if req.tool_name == HUMAN_ASK_TOOL {
        return Err(StartRefusal::HumanAsk);
    }
    let attempts = attempts
        .iter()
        .filter(|a| a.run_id == req.run_id && a.tool_call_id == req.tool_call_id);
    let (mine, others): (Vec<_>, Vec<_>) = attempts.partition(|a| a.approval_id == req.approval_id);

    // A repeated start answers from the stored attempt, whatever happened since, and
    // appends nothing — provided it names the same call.
    if let Some(existing) = mine.first() {
        if existing.tool_name != req.tool_name {
            return Err(StartRefusal::Mismatch { field: "tool_name" });
        }
        if !hash_matches(
            existing.arguments_hash.as_deref(),
            req.arguments_hash.as_deref(),
        ) {
            return Err(StartRefusal::Mismatch {
                field: "arguments_hash",
            });
        }
        let mut d = Decision::same(existing, None);
        d.answers_sequence = true;
        if let Some(why) = start_refusal_for(existing) {
            d = d.refused(why);
        }
        return Ok(d);
    }

    // The card must be exactly the approved call.
    let identity = [
        ("run_id", card.run_id == req.run_id),
        ("request_id", card.request_id == req.request_id),
        ("tool_call_id", card.tool_call_id == req.tool_call_id),
        ("approval_id", card.approval_id == req.approval_id),
        ("tool_name", card.tool_name == req.tool_name),
        (
            "arguments_hash",
            hash_matches(
                card.arguments_hash.as_deref(),
                req.arguments_hash.as_deref(),
            ),
        ),
    ];
    if let Some((field, _)) = identity.iter().find(|(_, ok)| !ok) {
        return Err(StartRefusal::Mismatch { field });
    }
    let auto = card.auto_approval.is_some()
        || card
            .decided_by
            .as_deref()
            .is_some_and(|by| by.starts_with(POLICY_DECIDER_PREFIX));
    if auto {
        return Err(StartRefusal::AutoApproved);
    }
    if card.state == ApprovalState::Pending {
        return Err(StartRefusal::NotApproved(ApprovalState::Pending));
    }
    if let Some(blocker) = others
        .into_iter()
        .filter_map(|a| blocking_rank(a.state).map(|rank| (rank, a)))
        .max_by_key(|(rank, _)| *rank)
        .map(|(_, a)| a)
    {
        return Err(StartRefusal::Blocked(Box::new(blocker.clone())));
    }

    let intent = MutationRecord {
        run_id: req.run_id.clone(),
        tool_call_id: req.tool_call_id.clone(),
        approval_id: req.approval_id.clone(),
        request_id: req.request_id.clone(),
        tool_name: req.tool_name.clone(),
        arguments_hash: card
            .arguments_hash
            .clone()
            .or_else(|| req.arguments_hash.clone()),
        state: MutationState::Intent,
        execution_status: None,
        result: None,
        error: None,
        reason: None,
        evidence: None,
        settled_by: None,
        started_sequence: None,
        created_at: now,
        dispatched_at: None,
        settled_at: None,
        settlement_deadline_at: now + settings.settlement_deadline_ms,
        reconciliation: None,
    };

    // Refusals that settle this attempt durably as `not_executed`: a repeated start
    // then answers the same refusal, and another attempt needs a fresh approval.
    let refusal = if head.status.is_terminal() {
        Some(Reason::RunNotRunning)
    } else {
        match card.state {
            ApprovalState::Expired => Some(Reason::ApprovalExpired),
            ApprovalState::Denied => Some(Reason::ApprovalDenied),
            _ => None,
        }
    };
    // Seed 000: `tool_execution_started` comes once after the approval and *before*
    // post-approval admission ("local execution has started, including admission"): a
    // human-approved call announces its start even when admission then refuses it, and
    // the refusal's `tool_execution {not_executed}` follows it in the same transaction.
    // A card that was denied or expired approved nothing, so nothing started.
    let (admitted, started) = match refusal {
        Some(reason) => (Err(reason), false),
        None => (
            admit(Budget::of_run(head).as_ref(), usage, &req.tool_name),
            true,
        ),
    };
    match admitted {
        Err(reason) => {
            let mut record = intent.settled(
                MutationState::NotExecuted,
                ExecutionStatus::NotExecuted,
                Some(reason),
                SettledBy::Admission,
                now,
            );
            let mut events = Vec::new();
            if started {
                record.started_sequence = Some(head.next_seq);
                events.push(record.started_event());
            }
            events.push(record.execution_event());
            let why = start_refusal_for(&record);
            let mut d = Decision::write(record, events, head.status);
            d.answers_sequence = true;
            d.refusal = why;
            Ok(d)
        }
        Ok(next_usage) => {
            let mut record = intent;
            record.started_sequence = Some(head.next_seq);
            let event = record.started_event();
            let mut d = Decision::write(record, vec![event], head.status);
            d.usage = Some(next_usage);
            d.answers_sequence = true;
            Ok(d)
        }
    }
}

/// Which stored states a repeated `start` answers with 409 (docs/architecture.md §5: "refusal 409
/// {state:\"not_executed\", reason}; blocked 409 {state:\"outcome_unknown\"}").
fn start_refusal_for(record: &MutationRecord) -> Option<String> {
    match record.state {
        MutationState::NotExecuted => Some(format!(
            "the call was not executed ({}); a new attempt needs a fresh approval",
            record.reason.map_or("unknown", Reason::as_str)
        )),
        MutationState::OutcomeUnknown => {
            Some("the outcome is unknown; an operator must reconcile it first".into())
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::approval::{AutoApproval, Resolution};
    use crate::execution::fixtures::*;
    use crate::run::RunStatus;
    use serde_json::json;
    use serde_json::Value;

    type Change = Box<dyn Fn(&mut StartRequest)>;
    // --- start ---------------------------------------------------------------------

    #[test]
    fn a_human_approved_call_starts_once_with_the_seed_event() {
        // GIVEN a human-approved card and a budget that lists the tool
        // WHEN the agent starts the call
        let d = started();
        // THEN an intent is written with tool_execution_started at the head's next sequence
        assert!(d.changed && d.accepted());
        assert_eq!(d.record.state, MutationState::Intent);
        assert_eq!(d.record.started_sequence, Some(5));
        assert_eq!(d.record.arguments_hash.as_deref(), Some("sha256:abc"));
        assert_eq!(d.record.settlement_deadline_at, T0 + 60_000);
        assert_eq!(d.events.len(), 1);
        assert_eq!(d.events[0].event_type, "tool_execution_started");
        assert_eq!(d.events[0].event_id, None);
        // Exactly the seed's payload, in the seed's order.
        assert_eq!(
            payload(&d.events[0]),
            r#"{"tool_name":"mcp__last9__create_dashboard","tool_call_id":"write-1","approval_id":"approval-1"}"#
        );
        // And the rendered event is the seed's line plus the envelope's timestamp.
        let body: Value =
            serde_json::from_str(&crate::render_event(&head(), 5, &d.events[0], 0)).unwrap();
        assert_eq!(
            body,
            json!({"protocol_version":"v2","sequence":5,"run_id":"run-1","channel_id":"C1",
                   "type":"tool_execution_started","tool_name":"mcp__last9__create_dashboard",
                   "tool_call_id":"write-1","approval_id":"approval-1",
                   "timestamp_utc":"1970-01-01T00:00:00.000Z"})
        );
        // The budget use is written with it.
        let usage = d.usage.clone().unwrap();
        assert_eq!(usage.starts_of("mcp__last9__create_dashboard"), 1);
        assert_eq!(usage.calls, 1);
        assert_eq!(d.answer().verdict, Verdict::Ok);
        assert_eq!(d.answer().body(), json!({"state": "intent", "sequence": 5}));
    }

    #[test]
    fn a_repeated_start_answers_the_same_without_an_event() {
        let first = started();
        let again = start(
            &req(),
            &card(),
            &head_with(None),
            &first.usage.clone().unwrap(),
            std::slice::from_ref(&first.record),
            &settings(),
            T0 + 5,
        )
        .unwrap();
        assert!(!again.changed);
        assert!(again.events.is_empty());
        assert_eq!(again.usage, None, "no second start is counted");
        assert_eq!(again.record, first.record);
        assert_eq!(again.answer(), first.answer());
        // Later, after dispatch, the repeat still answers 200 with the original sequence.
        let later = start(
            &req(),
            &card(),
            &head(),
            &BudgetUsage::default(),
            &[dispatched()],
            &settings(),
            T0 + 9,
        )
        .unwrap();
        assert!(!later.changed && later.events.is_empty());
        assert_eq!(
            later.answer().body(),
            json!({"state": "dispatched", "sequence": 5})
        );
    }

    #[test]
    fn a_repeat_naming_another_call_is_refused() {
        let stored = intent();
        let mut other_hash = req();
        other_hash.arguments_hash = Some("sha256:zzz".into());
        assert_eq!(
            start(
                &other_hash,
                &card(),
                &head(),
                &BudgetUsage::default(),
                std::slice::from_ref(&stored),
                &settings(),
                T0
            ),
            Err(StartRefusal::Mismatch {
                field: "arguments_hash"
            })
        );
        let mut other_tool = req();
        other_tool.tool_name = "web_fetch".into();
        assert_eq!(
            start(
                &other_tool,
                &card(),
                &head(),
                &BudgetUsage::default(),
                &[stored],
                &settings(),
                T0
            ),
            Err(StartRefusal::Mismatch { field: "tool_name" })
        );
    }

    #[test]
    fn the_card_must_be_the_approved_call() {
        let cases: Vec<(&str, Change)> = vec![
            (
                "tool_call_id",
                Box::new(|r| r.tool_call_id = "write-2".into()),
            ),
            (
                "approval_id",
                Box::new(|r| r.approval_id = "approval-2".into()),
            ),
            ("tool_name", Box::new(|r| r.tool_name = "web_fetch".into())),
            (
                "arguments_hash",
                Box::new(|r| r.arguments_hash = Some("sha256:other".into())),
            ),
            ("arguments_hash", Box::new(|r| r.arguments_hash = None)),
            ("run_id", Box::new(|r| r.run_id = "run-2".into())),
            ("request_id", Box::new(|r| r.request_id = "req-2".into())),
        ];
        for (field, change) in cases {
            let mut r = req();
            change(&mut r);
            let refusal = start(
                &r,
                &card(),
                &head(),
                &BudgetUsage::default(),
                &[],
                &settings(),
                T0,
            )
            .unwrap_err();
            assert_eq!(refusal, StartRefusal::Mismatch { field }, "{field}");
            assert_eq!(refusal.answer().verdict, Verdict::Invalid);
        }
        // A card without a hash binds the one start names.
        let mut unhashed = card();
        unhashed.arguments_hash = None;
        let mut r = req();
        r.arguments_hash = Some("sha256:given".into());
        let d = start(
            &r,
            &unhashed,
            &head(),
            &BudgetUsage::default(),
            &[],
            &settings(),
            T0,
        )
        .unwrap();
        assert_eq!(d.record.arguments_hash.as_deref(), Some("sha256:given"));
        r.arguments_hash = None;
        let d = start(
            &r,
            &unhashed,
            &head(),
            &BudgetUsage::default(),
            &[],
            &settings(),
            T0,
        )
        .unwrap();
        assert!(d.accepted());
        assert_eq!(d.record.arguments_hash, None);
    }

    #[test]
    fn malformed_requests_are_invalid() {
        for change in [
            |r: &mut StartRequest| r.tool_call_id = "a/b".into(),
            |r: &mut StartRequest| r.approval_id = String::new(),
            |r: &mut StartRequest| r.tool_name = String::new(),
            |r: &mut StartRequest| r.arguments_hash = Some("h".repeat(MAX_HASH + 1)),
        ] {
            let mut r = req();
            change(&mut r);
            let refusal = start(
                &r,
                &card(),
                &head(),
                &BudgetUsage::default(),
                &[],
                &settings(),
                T0,
            )
            .unwrap_err();
            assert!(matches!(refusal, StartRefusal::Invalid(_)), "{refusal:?}");
        }
    }

    #[test]
    fn human_ask_never_starts() {
        let mut ask = card();
        ask.tool_name = HUMAN_ASK_TOOL.into();
        let mut r = req();
        r.tool_name = HUMAN_ASK_TOOL.into();
        let head = head_with(Some(json!({"tools": {"human__ask": 5}})));
        let refusal = start(
            &r,
            &ask,
            &head,
            &BudgetUsage::default(),
            &[],
            &settings(),
            T0,
        )
        .unwrap_err();
        assert_eq!(refusal, StartRefusal::HumanAsk);
        assert_eq!(refusal.answer().verdict, Verdict::Invalid);
    }

    #[test]
    fn auto_approved_calls_never_start() {
        let mut auto = card();
        auto.auto_approval = Some(AutoApproval {
            policy_id: "p".into(),
            sequence: 3,
        });
        let refusal = start(
            &req(),
            &auto,
            &head(),
            &BudgetUsage::default(),
            &[],
            &settings(),
            T0,
        )
        .unwrap_err();
        assert_eq!(refusal, StartRefusal::AutoApproved);
        assert_eq!(refusal.answer().verdict, Verdict::Invalid);
        // Recognised by its decider as well, should the marker be missing.
        let mut by_policy = card();
        by_policy.decided_by = Some(format!("{POLICY_DECIDER_PREFIX}abc"));
        assert_eq!(
            start(
                &req(),
                &by_policy,
                &head(),
                &BudgetUsage::default(),
                &[],
                &settings(),
                T0
            ),
            Err(StartRefusal::AutoApproved)
        );
    }

    #[test]
    fn a_pending_card_is_refused_without_burning_the_approval() {
        let refusal = start(
            &req(),
            &pending_card(),
            &head(),
            &BudgetUsage::default(),
            &[],
            &settings(),
            T0,
        )
        .unwrap_err();
        assert_eq!(refusal, StartRefusal::NotApproved(ApprovalState::Pending));
        let a = refusal.answer();
        assert_eq!(a.verdict, Verdict::Conflict);
        assert_eq!(a.body()["state"], "pending");
        assert!(a.body()["error"].is_string());
    }

    #[test]
    fn expired_and_denied_cards_are_recorded_not_executed_without_a_start_event() {
        for (resolution, reason) in [
            (Resolution::Expired, "approval_expired"),
            (
                Resolution::Denied {
                    by: "bob".into(),
                    reason: None,
                },
                "approval_denied",
            ),
        ] {
            let c = pending_card().resolved(&resolution, 10);
            let d = start(
                &req(),
                &c,
                &head(),
                &BudgetUsage::default(),
                &[],
                &settings(),
                T0,
            )
            .unwrap();
            assert!(d.changed && !d.accepted());
            assert_eq!(d.usage, None);
            assert_eq!(d.record.state, MutationState::NotExecuted);
            assert_eq!(d.events.len(), 1);
            assert_eq!(d.events[0].event_type, "tool_execution");
            assert!(d
                .events
                .iter()
                .all(|e| e.event_type != "tool_execution_started"));
            assert_eq!(
                Value::Object(d.events[0].payload.clone()),
                json!({"tool_name":"mcp__last9__create_dashboard","tool_call_id":"write-1",
                       "approval_id":"approval-1","execution_status":"not_executed",
                       "mutation_outcome":"not_executed","reason":reason})
            );
            let a = d.answer();
            assert_eq!(a.verdict, Verdict::Conflict);
            assert_eq!(a.body()["state"], "not_executed");
            assert_eq!(a.body()["reason"], reason);
            assert_eq!(a.body().get("sequence"), None);
        }
    }

    #[test]
    fn budget_refusals_are_recorded_with_their_reason() {
        let tool = "mcp__last9__create_dashboard";
        let used = |starts: u64, calls: u64| BudgetUsage {
            starts: [(tool.to_owned(), starts)].into(),
            calls,
        };
        let cases = [
            (head_with(None), used(0, 0), "no_budget"),
            (
                head_with(Some(json!({"tools": {"web_fetch": 3}}))),
                used(0, 0),
                "tool_not_in_budget",
            ),
            (head_with(Some(json!({}))), used(0, 0), "tool_not_in_budget"),
            (head(), used(2, 2), "budget_exhausted"),
            (
                head_with(Some(json!({"tools": {tool: 0}}))),
                used(0, 0),
                "budget_exhausted",
            ),
            (head(), used(1, 5), "call_ceiling_reached"),
            (
                head_with(Some(json!({"tools": {tool: 9}, "call_ceiling": 0}))),
                used(0, 0),
                "call_ceiling_reached",
            ),
            // A stored budget that no longer parses admits nothing.
            (
                head_with(Some(json!({"tools": {tool: "many"}}))),
                used(0, 0),
                "no_budget",
            ),
        ];
        for (h, usage, reason) in cases {
            let d = start(&req(), &card(), &h, &usage, &[], &settings(), T0).unwrap();
            assert_eq!(d.record.state, MutationState::NotExecuted, "{reason}");
            assert_eq!(d.record.reason.map(Reason::as_str), Some(reason));
            assert_eq!(d.record.settled_by, Some(SettledBy::Admission));
            assert_eq!(d.usage, None, "a refusal uses nothing");
            // Seed 000: the start comes before admission, the refusal right after it.
            assert_eq!(d.events.len(), 2);
            assert_eq!(d.events[0].event_type, "tool_execution_started");
            assert_eq!(d.record.started_sequence, Some(h.next_seq));
            assert_eq!(d.events[1].payload["execution_status"], "not_executed");
            assert_eq!(d.events[1].payload["reason"], reason);
            assert_eq!(d.answer().body()["reason"], reason);
            // A repeat answers the same refusal without a new event.
            let again = start(
                &req(),
                &card(),
                &h,
                &usage,
                std::slice::from_ref(&d.record),
                &settings(),
                T0 + 1,
            )
            .unwrap();
            assert!(!again.changed && again.events.is_empty());
            assert_eq!(again.answer(), d.answer());
        }
    }

    #[test]
    fn a_start_on_an_ended_run_is_recorded_but_announces_nothing() {
        for status in [
            RunStatus::Cancelled,
            RunStatus::Completed,
            RunStatus::Failed,
        ] {
            let mut h = head();
            h.status = status;
            let d = start(
                &req(),
                &card(),
                &h,
                &BudgetUsage::default(),
                &[],
                &settings(),
                T0,
            )
            .unwrap();
            assert!(d.changed);
            assert_eq!(d.record.reason, Some(Reason::RunNotRunning));
            assert!(
                d.events.is_empty(),
                "no event after the run's terminal event"
            );
            assert_eq!(d.answer().body()["reason"], "run_not_running");
        }
    }

    #[test]
    fn outcome_unknown_blocks_new_starts_until_reconciled() {
        let unknown = settle(&dispatched(), &ambiguous(), RunStatus::Running, T0 + 2_000).record;
        let mut fresh = req();
        fresh.approval_id = "approval-2".into();
        fresh.request_id = "req-2".into();
        let mut fresh_card = card();
        fresh_card.approval_id = "approval-2".into();
        fresh_card.request_id = "req-2".into();
        let refusal = start(
            &fresh,
            &fresh_card,
            &head(),
            &BudgetUsage::default(),
            std::slice::from_ref(&unknown),
            &settings(),
            T0 + 3_000,
        )
        .unwrap_err();
        assert!(
            matches!(&refusal, StartRefusal::Blocked(r) if r.state == MutationState::OutcomeUnknown)
        );
        assert_eq!(refusal.answer().verdict, Verdict::Conflict);
        assert_eq!(refusal.answer().body()["state"], "outcome_unknown");
        // The same attempt repeated is blocked too (409 outcome_unknown, nothing written).
        let same = start(
            &req(),
            &card(),
            &head(),
            &BudgetUsage::default(),
            std::slice::from_ref(&unknown),
            &settings(),
            T0 + 3_000,
        )
        .unwrap();
        assert!(!same.changed);
        assert_eq!(same.answer().verdict, Verdict::Conflict);
        assert_eq!(same.answer().body()["state"], "outcome_unknown");
        // Reconciled not applied: a fresh approval may start it again.
        let not_applied = reconcile(
            &unknown,
            Observed::NotApplied,
            "op",
            RunStatus::Running,
            T0 + 4_000,
        )
        .record;
        let d = start(
            &fresh,
            &fresh_card,
            &head(),
            &BudgetUsage::default(),
            std::slice::from_ref(&not_applied),
            &settings(),
            T0 + 5_000,
        )
        .unwrap();
        assert!(d.accepted() && d.changed);
        assert_eq!(d.events[0].event_type, "tool_execution_started");
        // Reconciled applied: it happened, so the same tool call is not run again.
        let applied = reconcile(
            &unknown,
            Observed::Applied,
            "op",
            RunStatus::Running,
            T0 + 4_000,
        )
        .record;
        assert!(matches!(
            start(&fresh, &fresh_card, &head(), &BudgetUsage::default(), &[applied], &settings(), T0 + 5_000),
            Err(StartRefusal::Blocked(r)) if r.state == MutationState::Completed
        ));
    }

    #[test]
    fn confirmed_non_execution_needs_a_fresh_approval() {
        let not_executed = settle(&intent(), &not_sent(), RunStatus::Running, T0 + 1).record;
        // The same approval again: the refusal it already has.
        let again = start(
            &req(),
            &card(),
            &head(),
            &BudgetUsage::default(),
            std::slice::from_ref(&not_executed),
            &settings(),
            T0 + 2,
        )
        .unwrap();
        assert!(!again.changed && !again.accepted());
        assert_eq!(
            again.answer().body(),
            json!({"error": again.refusal.clone().unwrap(), "state": "not_executed", "reason": "not_sent"})
        );
        // A fresh approval (new approval_id) is a new attempt.
        let mut fresh = req();
        fresh.approval_id = "approval-2".into();
        let mut fresh_card = card();
        fresh_card.approval_id = "approval-2".into();
        let d = start(
            &fresh,
            &fresh_card,
            &head(),
            &BudgetUsage::default(),
            &[not_executed],
            &settings(),
            T0 + 3,
        )
        .unwrap();
        assert_eq!(d.record.state, MutationState::Intent);
        assert_eq!(d.record.approval_id, "approval-2");
    }

    #[test]
    fn an_attempt_in_flight_blocks_another() {
        let mut fresh = req();
        fresh.approval_id = "approval-2".into();
        let mut fresh_card = card();
        fresh_card.approval_id = "approval-2".into();
        for (stored, state) in [(intent(), "intent"), (dispatched(), "dispatched")] {
            let refusal = start(
                &fresh,
                &fresh_card,
                &head(),
                &BudgetUsage::default(),
                &[stored],
                &settings(),
                T0,
            )
            .unwrap_err();
            assert_eq!(refusal.answer().body()["state"], state);
            assert_eq!(refusal.answer().body()["approval_id"], "approval-1");
        }
        // The strongest blocker is the one answered.
        let unknown = settle_at_deadline(&dispatched(), RunStatus::Running, T0 + 60_000)
            .unwrap()
            .record;
        let mut third = intent();
        third.approval_id = "approval-0".into();
        let refusal = start(
            &fresh,
            &fresh_card,
            &head(),
            &BudgetUsage::default(),
            &[third, unknown],
            &settings(),
            T0,
        )
        .unwrap_err();
        assert_eq!(refusal.answer().body()["state"], "outcome_unknown");
        // Attempts of other tool calls do not block.
        let mut elsewhere = dispatched();
        elsewhere.tool_call_id = "write-9".into();
        assert!(start(
            &fresh,
            &fresh_card,
            &head(),
            &BudgetUsage::default(),
            &[elsewhere],
            &settings(),
            T0
        )
        .is_ok());
    }
}
