//! The history checker: what the clients did and were answered (every operation, its
//! answer or its unknown outcome), and what stands at the end (each run's whole stream,
//! its mutation records, each card, the policies), checked against Tollgate's invariants
//! (docs/architecture.md, *Invariants*). Pure: a history in, the violations out.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

/// What the client finally knew of one operation.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// An answer it can act on (2xx, 4xx): `status`, body.
    Answered { status: u16, body: Value },
    /// Every try ended in a 5xx or a transport error: it may or may not have happened.
    Unknown { last: String },
}

/// One client operation (retries of the same request included).
#[derive(Debug, Clone, PartialEq)]
pub enum OpKind {
    CreateRun {
        delivery_id: String,
        kind: String,
        parent: Option<String>,
    },
    Append {
        run_id: String,
        event_ids: Vec<String>,
    },
    Arm {
        run_id: String,
        request_id: String,
        tool_call_id: String,
        approval_id: String,
    },
    Decide {
        /// The run the decision was posted on (the card's, or its coordinator's).
        run_id: String,
        request_id: String,
        approve: bool,
        scope: String,
    },
    Start {
        run_id: String,
        tool_call_id: String,
        approval_id: String,
    },
    Dispatch {
        run_id: String,
        tool_call_id: String,
        approval_id: String,
    },
    Settle {
        run_id: String,
        tool_call_id: String,
        approval_id: String,
        evidence: String,
    },
    Reconcile {
        run_id: String,
        tool_call_id: String,
        approval_id: String,
        observed: String,
    },
    End {
        run_id: String,
        how: String,
    },
    Read {
        run_id: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Op {
    pub kind: OpKind,
    pub outcome: Outcome,
    /// Some try of it was answered with a 5xx or lost in transport.
    pub saw_failure: bool,
    /// When its first try was sent (Unix millis), where the check needs it (decisions).
    pub sent_at_ms: Option<i64>,
    /// When its outcome was known (Unix millis): for reading a history.
    pub answered_at_ms: i64,
}

/// A run as it stands at the end.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FinalRun {
    pub run_id: String,
    /// The whole stream, in order.
    pub events: Vec<Value>,
    /// Its `mutation_outcome/v1` records.
    pub mutations: Vec<Value>,
    /// Replay stopped making progress after this sequence (`has_more` stayed true):
    /// the stream has a gap there.
    pub stuck_after: Option<u64>,
}

/// A card as it stands at the end (`None`: 404, no such card).
#[derive(Debug, Clone, PartialEq)]
pub struct FinalCard {
    pub run_id: String,
    pub request_id: String,
    pub card: Option<Value>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct History {
    pub ops: Vec<Op>,
    pub runs: Vec<FinalRun>,
    pub cards: Vec<FinalCard>,
    /// The policies whose origin run is one of `runs`.
    pub policies: Vec<Value>,
    /// Per create's `delivery_id`: the run its receipt names, if any.
    pub receipts: Vec<(String, Option<String>)>,
    /// When DynamoDB Local was killed (Unix millis).
    pub storage_kills_ms: Vec<i64>,
}

/// How close to a kill of DynamoDB Local (ms) an acknowledged write may be lost by the
/// emulator itself: it answers a transaction and then, killed within milliseconds, does
/// not keep it (a real DynamoDB acknowledges only what is durable).
pub const KILL_WINDOW_MS: i64 = 250;

/// Acknowledged appends the emulator lost: answered within [`KILL_WINDOW_MS`] of a kill
/// of DynamoDB Local, and wholly absent (not one of their events, the stream gapless).
/// Reported beside the violations, not as Tollgate's.
pub fn lost_in_storage_kills(h: &History) -> Vec<String> {
    let mut out = Vec::new();
    for op in &h.ops {
        if let (OpKind::Append { run_id, event_ids }, Outcome::Answered { status: 200, .. }) =
            (&op.kind, &op.outcome)
        {
            if excused(h, op, run_id, event_ids) {
                out.push(format!(
                    "{run_id}: append of {} event(s) answered at {} ms, within {KILL_WINDOW_MS} ms of a kill of DynamoDB Local, absent",
                    event_ids.len(),
                    op.answered_at_ms
                ));
            }
        }
    }
    out
}

fn excused(h: &History, op: &Op, run_id: &str, event_ids: &[String]) -> bool {
    let near = h
        .storage_kills_ms
        .iter()
        .any(|k| (op.answered_at_ms - k).abs() <= KILL_WINDOW_MS);
    let run = h.runs.iter().find(|r| r.run_id == run_id);
    let absent = run.is_some_and(|r| {
        r.stuck_after.is_none()
            && !r.events.iter().any(|e| {
                e["event_id"]
                    .as_str()
                    .is_some_and(|x| event_ids.iter().any(|y| y == x))
            })
    });
    near && absent
}

/// The invariants, as the report names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Invariant {
    /// Every acknowledged append is in its run's stream exactly once, at the sequence
    /// its answer gave; no `event_id` appears twice.
    AckedAppendOnce,
    /// A run's sequences are 1, 2, 3, … with no gap or duplicate.
    GaplessSequence,
    /// Nothing follows a run's terminal event.
    NothingAfterTerminal,
    /// At most one resolution (and one `tool.approval_resolved`) per card, no heartbeat
    /// after it.
    OneResolution,
    /// A policy exists only for a card a human approved with that scope.
    PolicyNeedsApproval,
    /// `tool_execution_started` only for a card a human approved (not an auto-approved,
    /// denied or expired one), after the approval.
    StartNeedsHumanApproval,
    /// No start of a tool call while another attempt of it is in flight or
    /// `outcome_unknown`.
    NoStartWhileInFlight,
    /// A failed (5xx) or unanswered operation left nothing or all of it; state and
    /// stream agree (card vs. its events, record vs. its events, receipt vs. run).
    AllOrNothing,
    /// Nothing approved or denied that no operator asked for; nothing approved after
    /// the card's deadline.
    NoDecisionWithoutClick,
}

impl Invariant {
    pub const ALL: [Invariant; 9] = [
        Invariant::AckedAppendOnce,
        Invariant::GaplessSequence,
        Invariant::NothingAfterTerminal,
        Invariant::OneResolution,
        Invariant::PolicyNeedsApproval,
        Invariant::StartNeedsHumanApproval,
        Invariant::NoStartWhileInFlight,
        Invariant::AllOrNothing,
        Invariant::NoDecisionWithoutClick,
    ];
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub invariant: Invariant,
    pub detail: String,
}

const TERMINAL: &[&str] = &["run_completed", "run_failed", "run_cancelled"];

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("")
}

/// Checks `h`; every violation found, in invariant order.
pub fn check(h: &History) -> Vec<Violation> {
    let mut out = Vec::new();
    let mut v = |invariant: Invariant, detail: String| out.push(Violation { invariant, detail });
    let runs: HashMap<&str, &FinalRun> = h.runs.iter().map(|r| (r.run_id.as_str(), r)).collect();

    // Streams on their own: sequences, terminal, event ids, resolutions, executions.
    for run in &h.runs {
        let id = &run.run_id;
        if let Some(at) = run.stuck_after {
            v(
                Invariant::GaplessSequence,
                format!("{id}: replay stops after sequence {at} (has_more without progress: a gap; or an error)"),
            );
        }
        for (i, e) in run.events.iter().enumerate() {
            let seq = e["sequence"].as_u64();
            if seq != Some(i as u64 + 1) || s(e, "run_id") != id {
                v(
                    Invariant::GaplessSequence,
                    format!(
                        "{id}: event #{} has sequence {seq:?}, run {:?}",
                        i + 1,
                        e["run_id"]
                    ),
                );
            }
        }
        if let Some(at) = run
            .events
            .iter()
            .position(|e| TERMINAL.contains(&s(e, "type")))
        {
            if at + 1 != run.events.len() {
                v(
                    Invariant::NothingAfterTerminal,
                    format!(
                        "{id}: {} event(s) after {} at sequence {}",
                        run.events.len() - at - 1,
                        s(&run.events[at], "type"),
                        at + 1
                    ),
                );
            }
        }
        let mut ids: HashMap<&str, usize> = HashMap::new();
        for e in &run.events {
            if let Some(eid) = e["event_id"].as_str() {
                *ids.entry(eid).or_default() += 1;
            }
        }
        for (eid, n) in ids {
            if n > 1 {
                v(
                    Invariant::AckedAppendOnce,
                    format!("{id}: event_id {eid} appears {n} times"),
                );
            }
        }
        check_resolutions(run, &mut v);
        check_executions(run, &mut v);
        check_records(run, &mut v);
    }

    // Acknowledged and failed appends.
    for op in &h.ops {
        let OpKind::Append { run_id, event_ids } = &op.kind else {
            continue;
        };
        let events = runs
            .get(run_id.as_str())
            .map(|r| r.events.as_slice())
            .unwrap_or(&[]);
        let found: Vec<(usize, &Value)> = events
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e["event_id"]
                    .as_str()
                    .is_some_and(|x| event_ids.iter().any(|y| y == x))
            })
            .collect();
        if let Outcome::Answered { status: 200, body } = &op.outcome {
            if excused(h, op, run_id, event_ids) {
                continue;
            }
            let seqs: Vec<u64> = body["sequences"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default();
            for (eid, seq) in event_ids
                .iter()
                .zip(seqs.iter().map(Some).chain(std::iter::repeat(None)))
            {
                let at: Vec<u64> = events
                    .iter()
                    .filter(|e| s(e, "event_id") == eid)
                    .filter_map(|e| e["sequence"].as_u64())
                    .collect();
                if at.len() != 1 || seq.is_some_and(|q| at[0] != *q) {
                    v(
                        Invariant::AckedAppendOnce,
                        format!("{run_id}: acknowledged {eid} (sequence {seq:?}) found at {at:?}"),
                    );
                }
            }
        }
        if op.saw_failure && !found.is_empty() {
            let contiguous = found.windows(2).all(|w| w[1].0 == w[0].0 + 1);
            if found.len() != event_ids.len() || !contiguous {
                v(
                    Invariant::AllOrNothing,
                    format!(
                        "{run_id}: a failed append of {} event(s) left {} of them (contiguous: {contiguous})",
                        event_ids.len(),
                        found.len()
                    ),
                );
            }
        }
    }

    // Creates: a receipt names a whole run.
    for (delivery, run) in &h.receipts {
        if let Some(run_id) = run {
            let ok = runs.get(run_id.as_str()).is_some_and(|r| {
                r.events
                    .first()
                    .is_some_and(|e| s(e, "type") == "run_started")
            });
            if !ok {
                v(
                    Invariant::AllOrNothing,
                    format!("receipt {delivery} names {run_id}, whose stream does not start with run_started"),
                );
            }
        }
    }

    // Cards against their streams, and against the clicks.
    // Per card: (approve clicked, deny clicked, first approve click sent at).
    let mut clicks: HashMap<&str, (bool, bool, Option<i64>)> = HashMap::new();
    for op in &h.ops {
        if let OpKind::Decide {
            request_id,
            approve,
            ..
        } = &op.kind
        {
            let c = clicks.entry(request_id.as_str()).or_default();
            if *approve {
                c.0 = true;
                c.2 = match (c.2, op.sent_at_ms) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            } else {
                c.1 = true;
            }
        }
    }
    for fc in &h.cards {
        let events = runs
            .get(fc.run_id.as_str())
            .map(|r| r.events.as_slice())
            .unwrap_or(&[]);
        let about = |ty: &str| -> Vec<&Value> {
            events
                .iter()
                .filter(|e| s(e, "type") == ty && s(e, "requestId") == fc.request_id)
                .collect()
        };
        let (required, resolved, auto) = (
            about("tool.approval_required"),
            about("tool.approval_resolved"),
            about("tool.auto_approved"),
        );
        let rid = &fc.request_id;
        let Some(card) = &fc.card else {
            if !required.is_empty() || !resolved.is_empty() || !auto.is_empty() {
                v(
                    Invariant::AllOrNothing,
                    format!("{rid}: no card, but its events are on the stream"),
                );
            }
            continue;
        };
        let state = s(card, "state");
        let is_auto = card["auto_approved"].as_bool() == Some(true);
        if is_auto {
            if auto.len() != 1 || !required.is_empty() {
                v(
                    Invariant::AllOrNothing,
                    format!(
                        "{rid}: auto-approved card with {} tool.auto_approved, {} required",
                        auto.len(),
                        required.len()
                    ),
                );
            }
            continue;
        }
        if required.is_empty() {
            v(
                Invariant::AllOrNothing,
                format!("{rid}: card {state} without tool.approval_required"),
            );
        }
        match state {
            "pending" => {
                if !resolved.is_empty() {
                    v(
                        Invariant::AllOrNothing,
                        format!("{rid}: card pending but resolved on the stream"),
                    );
                }
            }
            "approved" | "denied" | "expired" => {
                // A card its run's end ended expires with no event on the ended run.
                let ended_with_run = state == "expired"
                    && resolved.is_empty()
                    && events
                        .last()
                        .is_some_and(|e| TERMINAL.contains(&s(e, "type")));
                if resolved.len() != 1 && !ended_with_run {
                    v(
                        Invariant::AllOrNothing,
                        format!(
                            "{rid}: card {state} with {} resolutions on the stream",
                            resolved.len()
                        ),
                    );
                } else if let Some(e) = resolved.first() {
                    let agrees = e["approved"].as_bool() == Some(state == "approved")
                        && e["expired"].as_bool() == Some(state == "expired");
                    if !agrees {
                        v(
                            Invariant::AllOrNothing,
                            format!("{rid}: card {state}, stream says {e}"),
                        );
                    }
                }
                let (approve_clicked, deny_clicked, first_approve) =
                    clicks.get(rid.as_str()).copied().unwrap_or_default();
                if (state == "approved" && !approve_clicked) || (state == "denied" && !deny_clicked)
                {
                    v(
                        Invariant::NoDecisionWithoutClick,
                        format!("{rid}: {state} but nobody clicked that"),
                    );
                }
                // A click is judged at the time it was made (its commit may land later,
                // racing the expiry): one sent only after the deadline approves nothing.
                if state == "approved" {
                    let sent = first_approve.and_then(chrono::DateTime::from_timestamp_millis);
                    if let (Some(at), Some(deadline)) = (sent, time(&card["expires_at"])) {
                        if at > deadline {
                            v(Invariant::NoDecisionWithoutClick, format!("{rid}: approved, but the first approve click was sent at {at}, after its deadline {deadline}"));
                        }
                    }
                }
            }
            other => v(
                Invariant::AllOrNothing,
                format!("{rid}: card state {other:?}"),
            ),
        }
    }

    // Policies.
    let cards: HashMap<(&str, &str), &FinalCard> = h
        .cards
        .iter()
        .map(|c| ((c.run_id.as_str(), c.request_id.as_str()), c))
        .collect();
    for p in &h.policies {
        let (run_id, rid, scope) = (s(p, "origin_run_id"), s(p, "request_id"), s(p, "scope"));
        let card = cards.get(&(run_id, rid)).and_then(|c| c.card.as_ref());
        let events = runs.get(run_id).map(|r| r.events.as_slice()).unwrap_or(&[]);
        let approved_event = events.iter().any(|e| {
            s(e, "type") == "tool.approval_resolved"
                && s(e, "requestId") == rid
                && e["approved"].as_bool() == Some(true)
                && s(e, "scope") == scope
        });
        let ok = card.is_some_and(|c| {
            s(c, "state") == "approved"
                && c["auto_approved"].as_bool() != Some(true)
                && s(c, "scope") == scope
        }) && approved_event;
        if !ok {
            v(
                Invariant::PolicyNeedsApproval,
                format!("policy {} ({scope}) from {run_id}/{rid}: card {card:?}, approved on the stream: {approved_event}", s(p, "policy_id")),
            );
        }
    }
    out
}

fn time(v: &Value) -> Option<chrono::DateTime<chrono::Utc>> {
    if let Some(ms) = v.as_i64() {
        return chrono::DateTime::from_timestamp_millis(ms);
    }
    chrono::DateTime::parse_from_rfc3339(v.as_str()?)
        .ok()
        .map(|t| t.with_timezone(&chrono::Utc))
}

/// One resolution per card (on its run, and mirrored on a coordinator), no heartbeat
/// after it, no second resolution after an auto-approval.
fn check_resolutions(run: &FinalRun, v: &mut impl FnMut(Invariant, String)) {
    let id = &run.run_id;
    let mut resolved: BTreeMap<String, usize> = BTreeMap::new();
    let mut mirrored: BTreeMap<(String, String), usize> = BTreeMap::new();
    for e in &run.events {
        let rid = s(e, "requestId").to_owned();
        match s(e, "type") {
            "tool.approval_resolved" | "tool.auto_approved" => {
                *resolved.entry(rid).or_default() += 1;
            }
            "coordinator.child_approval_resolved" => {
                *mirrored
                    .entry((s(e, "childRunId").to_owned(), rid))
                    .or_default() += 1;
            }
            "tool.approval_pending" if resolved.contains_key(&rid) => v(
                Invariant::OneResolution,
                format!(
                    "{id}: heartbeat of {rid} at {} after its resolution",
                    e["sequence"]
                ),
            ),
            _ => {}
        }
    }
    for (rid, n) in resolved {
        if n > 1 {
            v(
                Invariant::OneResolution,
                format!("{id}: card {rid} resolved {n} times"),
            );
        }
    }
    for ((child, rid), n) in mirrored {
        if n > 1 {
            v(
                Invariant::OneResolution,
                format!("{id}: child {child}'s card {rid} mirrored resolved {n} times"),
            );
        }
    }
}

/// Starts only for human-approved cards; no start while another attempt of the call is
/// in flight or `outcome_unknown`.
fn check_executions(run: &FinalRun, v: &mut impl FnMut(Invariant, String)) {
    let id = &run.run_id;
    // approval_id -> the card's request id, as armed on this run.
    let mut card_of: HashMap<(&str, &str), &str> = HashMap::new();
    // request id -> approved by a human (Some(true)), otherwise resolved (Some(false)).
    let mut human: HashMap<&str, bool> = HashMap::new();
    // tool_call_id -> (open attempt, blocked by outcome_unknown)
    let mut calls: HashMap<&str, (Option<&str>, Option<&str>)> = HashMap::new();
    let mut started: BTreeSet<(&str, &str)> = BTreeSet::new();
    for e in &run.events {
        let (call, approval) = (s(e, "tool_call_id"), s(e, "approval_id"));
        match s(e, "type") {
            "tool.approval_required" => {
                card_of.insert((call, approval), s(e, "requestId"));
            }
            "tool.auto_approved" => {
                card_of.insert((call, approval), s(e, "requestId"));
                human.insert(s(e, "requestId"), false);
            }
            "tool.approval_resolved" => {
                let ok =
                    e["approved"].as_bool() == Some(true) && e["expired"].as_bool() != Some(true);
                human.insert(s(e, "requestId"), ok);
            }
            "tool_execution_started" => {
                let seq = &e["sequence"];
                match card_of.get(&(call, approval)) {
                    None => v(
                        Invariant::StartNeedsHumanApproval,
                        format!("{id}: start of {call}/{approval} at {seq} names no card of this run"),
                    ),
                    Some(rid) if human.get(rid) != Some(&true) => v(
                        Invariant::StartNeedsHumanApproval,
                        format!("{id}: start of {call}/{approval} at {seq}; card {rid} approved by a human: {:?}", human.get(rid)),
                    ),
                    _ => {}
                }
                if !started.insert((call, approval)) {
                    v(
                        Invariant::NoStartWhileInFlight,
                        format!("{id}: {call}/{approval} started twice (again at {seq})"),
                    );
                }
                let c = calls.entry(call).or_default();
                if let Some(open) = c.0 {
                    v(
                        Invariant::NoStartWhileInFlight,
                        format!(
                            "{id}: {call}/{approval} started at {seq} while {open} is in flight"
                        ),
                    );
                }
                if let Some(blocked) = c.1 {
                    v(Invariant::NoStartWhileInFlight, format!("{id}: {call}/{approval} started at {seq} while {blocked} is outcome_unknown"));
                }
                c.0 = Some(approval);
            }
            "tool_execution" | "tool_execution_updated" | "tool_execution_reconciled" => {
                let c = calls.entry(call).or_default();
                if c.0 == Some(approval) {
                    c.0 = None;
                }
                if s(e, "mutation_outcome") == "outcome_unknown" {
                    c.1 = Some(approval);
                } else if c.1 == Some(approval) {
                    c.1 = None;
                }
            }
            _ => {}
        }
    }
}

/// Each mutation record agrees with the events of its attempt.
fn check_records(run: &FinalRun, v: &mut impl FnMut(Invariant, String)) {
    let id = &run.run_id;
    let ended = run
        .events
        .last()
        .is_some_and(|e| TERMINAL.contains(&s(e, "type")));
    for r in &run.mutations {
        let (call, approval, state) = (s(r, "tool_call_id"), s(r, "approval_id"), s(r, "state"));
        let mine: Vec<&Value> = run
            .events
            .iter()
            .filter(|e| s(e, "tool_call_id") == call && s(e, "approval_id") == approval)
            .collect();
        let started = mine
            .iter()
            .any(|e| s(e, "type") == "tool_execution_started");
        let last = mine.iter().rev().find(|e| {
            s(e, "type").starts_with("tool_execution") && s(e, "type") != "tool_execution_started"
        });
        let ok = match state {
            "intent" | "dispatched" => started && last.is_none(),
            "completed" | "not_executed" | "outcome_unknown" => match last {
                // After its run ended a record still changes — a late `confirmed`
                // contests a `not_applied`, an operator reconciles — with nothing appended
                // after the terminal event; only `completed` is final.
                Some(e) => {
                    s(e, "mutation_outcome") == state
                        || (ended && s(e, "mutation_outcome") != "completed")
                }
                // Nothing is appended after a run ended: a start refused there, or an
                // attempt settled (by its deadline) after the end, writes only the record.
                None => ended && (state != "completed" || started),
            },
            _ => false,
        };
        if !ok {
            v(
                Invariant::AllOrNothing,
                format!(
                    "{id}: record {call}/{approval} is {state}; its events: {:?}; run ended: {ended}",
                    mine.iter().map(|e| (s(e, "type"), s(e, "mutation_outcome"))).collect::<Vec<_>>()
                ),
            );
        }
    }
}
