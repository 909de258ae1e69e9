//! The history checker: what the clients did and were answered (every operation, its
//! answer or its unknown outcome), and what stands at the end (each run's whole stream,
//! its mutation records, each card, the policies), checked against Tollgate's invariants
//! (docs/architecture.md, *Invariants*). Pure: a history in, the violations out.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

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
        /// The `owner` the create named.
        owner: String,
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
        /// The operator who clicked (the JWT `sub`).
        by: String,
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
    /// The run is not there at all (404): a create answered with it was lost.
    pub absent: bool,
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
    /// The `TransactWriteItems` the DynamoDB-side proxy forwarded and saw answered 200
    /// within [`KILL_WINDOW_MS`] before a kill: (when the 200 came back, its request body).
    pub storage_acks: Vec<(i64, String)>,
    /// Every run of the seed the store holds (read from its table): (run, `delivery_id`).
    pub listed_runs: Vec<(String, Option<String>)>,
    /// Reads of the read-back that failed (each one fails the check).
    pub read_errors: Vec<String>,
}

/// How long before a kill of DynamoDB Local (ms) a transaction it acknowledged may be
/// lost by the emulator itself: it answers a transaction and then, killed within
/// milliseconds, does not keep it (a real DynamoDB acknowledges only what is durable;
/// `tests/harness/dynamodb-kill-durability.sh`).
pub const KILL_WINDOW_MS: i64 = 500;

/// At most this many acknowledged operations are excused per kill.
pub const LOST_PER_KILL: usize = 2;

/// The string the operation's transaction carries, by which the proxy's record of it is
/// found; `None` for the kinds never excused.
fn tx_key(op: &Op) -> Option<&str> {
    match &op.kind {
        OpKind::Append { event_ids, .. } => event_ids.first().map(String::as_str),
        OpKind::Arm { request_id, .. } => Some(request_id),
        OpKind::CreateRun { delivery_id, .. } => Some(delivery_id),
        _ => None,
    }
}

/// Whether nothing of the operation is in the end state (an excused loss is whole).
fn wholly_absent(h: &History, op: &Op) -> bool {
    match &op.kind {
        OpKind::Append { run_id, event_ids } => h.runs.iter().any(|r| {
            &r.run_id == run_id
                && r.stuck_after.is_none()
                && !r.events.iter().any(|e| {
                    e["event_id"]
                        .as_str()
                        .is_some_and(|x| event_ids.iter().any(|y| y == x))
                })
        }),
        OpKind::Arm {
            run_id, request_id, ..
        } => {
            h.cards
                .iter()
                .filter(|c| &c.request_id == request_id)
                .all(|c| c.card.is_none())
                && h.runs
                    .iter()
                    .all(|r| r.stuck_after.is_none() || &r.run_id != run_id)
                && h.runs
                    .iter()
                    .all(|r| !r.events.iter().any(|e| s(e, "requestId") == request_id))
        }
        OpKind::CreateRun { delivery_id, .. } => {
            h.receipts
                .iter()
                .all(|(d, run)| d != delivery_id || run.is_none())
                && h.listed_runs
                    .iter()
                    .all(|(_, d)| d.as_deref() != Some(delivery_id.as_str()))
        }
        _ => false,
    }
}

/// The acknowledged operations the emulator lost: each has the proxy's evidence (a
/// `TransactWriteItems` carrying it answered 200 at most [`KILL_WINDOW_MS`] before a kill
/// of DynamoDB Local, and before the client's answer), is wholly absent, and at most
/// [`LOST_PER_KILL`] per kill. Reported beside the violations, not as Tollgate's.
pub fn lost_in_storage_kills(h: &History) -> Vec<(usize, String)> {
    let mut per_kill: HashMap<i64, usize> = HashMap::new();
    let mut out = Vec::new();
    for (i, op) in h.ops.iter().enumerate() {
        let Outcome::Answered { status, .. } = &op.outcome else {
            continue;
        };
        if !(200..300).contains(status) {
            continue;
        }
        let Some(key) = tx_key(op) else { continue };
        let kill = h.storage_kills_ms.iter().copied().find(|k| {
            h.storage_acks.iter().any(|(at, body)| {
                *at <= *k
                    && k - at <= KILL_WINDOW_MS
                    && *at <= op.answered_at_ms
                    && body.contains(key)
            })
        });
        let Some(kill) = kill else { continue };
        if !wholly_absent(h, op) {
            continue;
        }
        let n = per_kill.entry(kill).or_default();
        if *n >= LOST_PER_KILL {
            continue;
        }
        *n += 1;
        out.push((
            i,
            format!(
                "{:?} answered {status} at {} ms, its transaction acknowledged within {KILL_WINDOW_MS} ms before the kill at {kill} ms, absent",
                op.kind, op.answered_at_ms
            ),
        ));
    }
    out
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
    /// Nothing approved or denied that no operator asked for (a refused click is no
    /// click), with the scope and by the operator the click named; nothing approved at
    /// or after the card's deadline.
    NoDecisionWithoutClick,
    /// Every operation answered 2xx holds at the end: the card armed, the run ended as
    /// answered, the card decided as answered (two answers never disagree), the record
    /// in the answered state or a later legal one, a create's receipt naming its run.
    AnswerHolds,
    /// A request committed whose answer was lost and which was retried wrote once: one
    /// run per create (no run of the seed the workload cannot account for), one
    /// `run_started` per run, one `tool.approval_required` per card, one
    /// `tool_execution` per attempt.
    ExactlyOnce,
    /// Each child card with a coordinator is mirrored there exactly once as required and,
    /// once resolved, exactly once as resolved.
    CoordinatorMirror,
    /// The read-back itself failed (nothing it did not read passes).
    ReadBack,
}

impl Invariant {
    pub const ALL: [Invariant; 13] = [
        Invariant::AckedAppendOnce,
        Invariant::GaplessSequence,
        Invariant::NothingAfterTerminal,
        Invariant::OneResolution,
        Invariant::PolicyNeedsApproval,
        Invariant::StartNeedsHumanApproval,
        Invariant::NoStartWhileInFlight,
        Invariant::AllOrNothing,
        Invariant::NoDecisionWithoutClick,
        Invariant::AnswerHolds,
        Invariant::ExactlyOnce,
        Invariant::CoordinatorMirror,
        Invariant::ReadBack,
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
    let excused: HashSet<usize> = lost_in_storage_kills(h)
        .into_iter()
        .map(|(i, _)| i)
        .collect();
    for e in &h.read_errors {
        v(Invariant::ReadBack, e.clone());
    }

    // Streams on their own: sequences, terminal, event ids, resolutions, executions.
    for run in &h.runs {
        let id = &run.run_id;
        if run.absent {
            // Only a create the storage lost (excused, with its evidence) leaves a run
            // a client was answered with absent.
            let lost = h.ops.iter().enumerate().any(|(i, op)| {
                excused.contains(&i)
                    && matches!(&op.outcome, Outcome::Answered { body, .. } if body["run_id"] == id.as_str())
            });
            if !lost {
                v(
                    Invariant::AnswerHolds,
                    format!("{id}: a create was answered with it, but the run is not there (404)"),
                );
            }
            continue;
        }
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
        let mut once: HashMap<(&str, &str, &str), usize> = HashMap::new();
        for e in &run.events {
            let ty = s(e, "type");
            let key = match ty {
                "run_started" => Some((ty, "", "")),
                "tool.approval_required" | "tool.auto_approved" => {
                    Some((ty, s(e, "requestId"), ""))
                }
                "tool_execution" => Some((ty, s(e, "tool_call_id"), s(e, "approval_id"))),
                _ => None,
            };
            if let Some(k) = key {
                *once.entry(k).or_default() += 1;
            }
        }
        for ((ty, a, b), n) in once {
            if n > 1 {
                v(
                    Invariant::ExactlyOnce,
                    format!("{id}: {ty} {a} {b} appears {n} times"),
                );
            }
        }
        if run
            .events
            .first()
            .is_some_and(|e| s(e, "type") != "run_started")
        {
            v(
                Invariant::ExactlyOnce,
                format!("{id}: the stream does not start with run_started"),
            );
        }
        check_resolutions(run, &mut v);
        check_executions(run, &mut v);
        check_records(run, &mut v);
    }

    // Acknowledged and failed appends.
    for (i, op) in h.ops.iter().enumerate() {
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
            if excused.contains(&i) {
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
        let refused = matches!(&op.outcome, Outcome::Answered { status, .. } if *status >= 400);
        if refused && !op.saw_failure && !found.is_empty() {
            v(
                Invariant::AllOrNothing,
                format!(
                    "{run_id}: an append refused ({:?}) left {} of its {} event(s)",
                    op.outcome,
                    found.len(),
                    event_ids.len()
                ),
            );
        } else if (op.saw_failure || refused) && !found.is_empty() {
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

    check_creates(h, &excused, &mut v);
    check_answers(h, &excused, &mut v);
    check_mirrors(h, &mut v);

    // Cards against their streams, and against the clicks. A click counts only when it
    // was answered 200 or its outcome is unknown (a refused click decided nothing).
    let mut clicks: HashMap<&str, Vec<&Op>> = HashMap::new();
    for op in &h.ops {
        if let OpKind::Decide { request_id, .. } = &op.kind {
            let counts = matches!(
                &op.outcome,
                Outcome::Answered { status: 200, .. } | Outcome::Unknown { .. }
            );
            if counts {
                clicks.entry(request_id.as_str()).or_default().push(op);
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
                // Invariant 3: every end is announced once, a run's end's included (before
                // its terminal event: nothing follows that).
                if resolved.len() != 1 {
                    v(
                        Invariant::AllOrNothing,
                        format!(
                            "{rid}: card {state} with {} resolutions on the stream",
                            resolved.len()
                        ),
                    );
                } else if let Some(e) = resolved.first() {
                    let agrees = e["approved"].as_bool() == Some(state == "approved")
                        && e["expired"].as_bool() == Some(state == "expired")
                        && (s(card, "reason") != "run_ended" || s(e, "reason") == "run_ended");
                    if !agrees {
                        v(
                            Invariant::AllOrNothing,
                            format!("{rid}: card {state}, stream says {e}"),
                        );
                    }
                }
                let mine = clicks.get(rid.as_str()).map(Vec::as_slice).unwrap_or(&[]);
                let by = s(card, "decided_by");
                let deadline = time(&card["expires_at"]);
                let matching = |approve: bool| {
                    mine.iter().any(|o| match &o.kind {
                        OpKind::Decide {
                            approve: a,
                            scope,
                            by: b,
                            ..
                        } => {
                            *a == approve
                                && b == by
                                && (!approve || scope == s(card, "scope"))
                                // A click sent at or after the deadline approves nothing.
                                && (!approve
                                    || o.sent_at_ms
                                        .and_then(chrono::DateTime::from_timestamp_millis)
                                        .zip(deadline)
                                        .is_none_or(|(at, d)| at < d))
                        }
                        _ => false,
                    })
                };
                if (state == "approved" && !matching(true))
                    || (state == "denied" && !matching(false))
                {
                    v(
                        Invariant::NoDecisionWithoutClick,
                        format!("{rid}: {state} by {by:?} with scope {:?}, but no click (200 or unknown) before its deadline asked that", card["scope"]),
                    );
                }
                // Judged by the clock when the decision committed: strictly before the
                // deadline.
                if state == "approved" {
                    match (time(&card["decided_at"]), deadline) {
                        (Some(at), Some(d)) if at < d => {}
                        (at, d) => v(
                            Invariant::NoDecisionWithoutClick,
                            format!("{rid}: approved at {at:?}, its deadline {d:?}"),
                        ),
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
        // Only the run's owner grants beyond `once` (docs/architecture.md §6).
        let owner = owner_of(h, run_id);
        let by_owner = owner.is_some_and(|o| o == s(p, "granted_by"));
        let ok = card.is_some_and(|c| {
            s(c, "state") == "approved"
                && c["auto_approved"].as_bool() != Some(true)
                && s(c, "scope") == scope
                && s(c, "decided_by") == s(p, "granted_by")
        }) && approved_event
            && by_owner;
        if !ok {
            v(
                Invariant::PolicyNeedsApproval,
                format!("policy {} ({scope}) from {run_id}/{rid} granted by {:?} (owner {owner:?}): card {card:?}, approved on the stream: {approved_event}", s(p, "policy_id"), p["granted_by"]),
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
        // After its run ended, only what the README allows changes a record with nothing
        // appended: a settlement or reconciliation of an attempt started before the end
        // (a late `confirmed` contesting a `not_applied`, an operator's reconcile, the
        // deadline settling an unsettled attempt); `completed` is final.
        // A start refused before it started (the card denied or expired, the run not
        // running) settles its attempt `not_executed` at once: with its `tool_execution`
        // while the run runs, as the record alone once it has ended.
        let reason = s(r, "reason");
        let approved = run.events.iter().any(|e| {
            s(e, "type") == "tool.approval_resolved"
                && s(e, "approval_id") == approval
                && e["approved"].as_bool() == Some(true)
        });
        let refused_start = !started
            && state == "not_executed"
            && match last {
                Some(e) => {
                    s(e, "mutation_outcome") == "not_executed"
                        && (reason == "run_not_running"
                            || (!approved
                                && matches!(reason, "approval_denied" | "approval_expired")))
                }
                None => ended && reason == "run_not_running",
            };
        let ok = refused_start
            || started
                && match state {
                    "intent" | "dispatched" => last.is_none(),
                    "completed" | "not_executed" | "outcome_unknown" => match last {
                        Some(e) => {
                            let was = s(e, "mutation_outcome");
                            was == state
                                || (ended && was != "completed" && later_or_same(was, state))
                        }
                        None => ended,
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

/// Whether a record may go from `was` to `now` (the same, or a later legal state):
/// intent → dispatched → a settlement; `outcome_unknown` ↔ `not_executed` (reconciled, or
/// contested by a late `confirmed`) → `completed`; `completed` is final.
pub fn later_or_same(was: &str, now: &str) -> bool {
    const SETTLED: &[&str] = &["completed", "not_executed", "outcome_unknown"];
    match was {
        _ if was == now => true,
        "intent" => now == "dispatched" || SETTLED.contains(&now),
        "dispatched" => SETTLED.contains(&now),
        "outcome_unknown" | "not_executed" => SETTLED.contains(&now),
        _ => false,
    }
}

/// The run each create made, by answer or receipt: run → (delivery, owner).
fn created(h: &History) -> HashMap<String, (&str, &str)> {
    let mut out = HashMap::new();
    for op in &h.ops {
        let OpKind::CreateRun {
            delivery_id, owner, ..
        } = &op.kind
        else {
            continue;
        };
        if let Outcome::Answered { status, body } = &op.outcome {
            if (200..300).contains(status) {
                if let Some(run) = body["run_id"].as_str() {
                    out.insert(run.to_owned(), (delivery_id.as_str(), owner.as_str()));
                }
            }
        }
        for (d, run) in &h.receipts {
            if let (true, Some(run)) = (d == delivery_id, run) {
                out.insert(run.clone(), (delivery_id.as_str(), owner.as_str()));
            }
        }
    }
    out
}

fn owner_of<'a>(h: &'a History, run_id: &str) -> Option<&'a str> {
    created(h).get(run_id).map(|(_, o)| *o)
}

/// A create answered 2xx: its receipt names the run answered; a create refused without a
/// failed try made nothing; every run of the seed the store holds is one a create made,
/// one per delivery.
fn check_creates(h: &History, excused: &HashSet<usize>, v: &mut impl FnMut(Invariant, String)) {
    let receipt = |d: &str| {
        h.receipts
            .iter()
            .find(|(x, _)| x == d)
            .and_then(|(_, r)| r.clone())
    };
    for (i, op) in h.ops.iter().enumerate() {
        let OpKind::CreateRun { delivery_id, .. } = &op.kind else {
            continue;
        };
        match &op.outcome {
            Outcome::Answered { status, body } if (200..300).contains(status) => {
                if excused.contains(&i) {
                    continue;
                }
                let answered = body["run_id"].as_str();
                if receipt(delivery_id).as_deref() != answered {
                    v(
                        Invariant::AnswerHolds,
                        format!("create {delivery_id} answered run {answered:?}, its receipt names {:?}", receipt(delivery_id)),
                    );
                }
            }
            Outcome::Answered { status, .. } if !op.saw_failure => {
                let made = h
                    .listed_runs
                    .iter()
                    .filter(|(_, d)| d.as_deref() == Some(delivery_id.as_str()))
                    .count();
                if made > 0 || receipt(delivery_id).is_some() {
                    v(
                        Invariant::AllOrNothing,
                        format!("create {delivery_id} refused ({status}) made {made} run(s)"),
                    );
                }
            }
            _ => {}
        }
    }
    let made = created(h);
    let mut per_delivery: HashMap<&str, Vec<&str>> = HashMap::new();
    for (run, delivery) in &h.listed_runs {
        if !made.contains_key(run) {
            v(
                Invariant::ExactlyOnce,
                format!("run {run} (delivery {delivery:?}) is in the store, but no create was answered it and no receipt names it"),
            );
        }
        if let Some(d) = delivery {
            per_delivery.entry(d).or_default().push(run);
        }
    }
    for (d, runs) in per_delivery {
        if runs.len() > 1 {
            v(
                Invariant::ExactlyOnce,
                format!("delivery {d} made {} runs: {runs:?}", runs.len()),
            );
        }
    }
}

/// Every other operation answered 2xx against the end state.
fn check_answers(h: &History, excused: &HashSet<usize>, v: &mut impl FnMut(Invariant, String)) {
    let card_of = |rid: &str| {
        h.cards
            .iter()
            .find(|c| c.request_id == rid)
            .and_then(|c| c.card.as_ref())
    };
    let run_of = |id: &str| h.runs.iter().find(|r| r.run_id == id);
    let record = |run: &str, call: &str, approval: &str| {
        run_of(run).and_then(|r| {
            r.mutations
                .iter()
                .find(|m| s(m, "tool_call_id") == call && s(m, "approval_id") == approval)
        })
    };
    // Per card, the first 200 decision answer: (state, decided_by, scope).
    let mut decided: HashMap<&str, (String, String, String)> = HashMap::new();
    for (i, op) in h.ops.iter().enumerate() {
        if excused.contains(&i) {
            continue;
        }
        let Outcome::Answered { status, body } = &op.outcome else {
            continue;
        };
        let ok = (200..300).contains(status);
        match &op.kind {
            OpKind::Arm {
                request_id,
                tool_call_id,
                approval_id,
                run_id,
            } => {
                let card = card_of(request_id);
                if ok {
                    let holds = card.is_some_and(|c| {
                        s(c, "tool_call_id") == tool_call_id
                            && s(c, "approval_id") == approval_id
                            && s(c, "run_id") == run_id
                    });
                    if !holds {
                        v(
                            Invariant::AnswerHolds,
                            format!("{run_id}: arm of {request_id} answered {status}, the card is {card:?}"),
                        );
                    }
                } else if !op.saw_failure && card.is_some() {
                    v(
                        Invariant::AllOrNothing,
                        format!(
                            "{run_id}: arm of {request_id} refused ({status}), but the card exists"
                        ),
                    );
                }
            }
            OpKind::End { run_id, how } if ok => {
                let want = match how.as_str() {
                    "complete" => "run_completed",
                    "fail" => "run_failed",
                    _ => "run_cancelled",
                };
                let last = run_of(run_id).and_then(|r| r.events.last());
                let holds = last.is_some_and(|e| {
                    s(e, "type") == want
                        && body["sequence"]
                            .as_u64()
                            .is_none_or(|q| e["sequence"].as_u64() == Some(q))
                });
                if !holds {
                    v(
                        Invariant::AnswerHolds,
                        format!(
                            "{run_id}: {how} answered {status} {body}, the stream ends with {:?}",
                            last.map(|e| s(e, "type"))
                        ),
                    );
                }
            }
            OpKind::Decide { request_id, .. } if *status == 200 => {
                let answer = (
                    s(body, "state").to_owned(),
                    s(body, "decided_by").to_owned(),
                    s(body, "scope").to_owned(),
                );
                let card = card_of(request_id);
                let holds = card.is_some_and(|c| {
                    (s(c, "state"), s(c, "decided_by"), s(c, "scope"))
                        == (answer.0.as_str(), answer.1.as_str(), answer.2.as_str())
                });
                if !holds {
                    v(
                        Invariant::AnswerHolds,
                        format!(
                            "{request_id}: a decision answered {answer:?}, the card is {card:?}"
                        ),
                    );
                }
                if let Some(first) = decided.get(request_id.as_str()) {
                    if *first != answer {
                        v(
                            Invariant::AnswerHolds,
                            format!("{request_id}: two decisions answered 200 disagree: {first:?} and {answer:?}"),
                        );
                    }
                } else {
                    decided.insert(request_id, answer);
                }
            }
            OpKind::Start {
                run_id,
                tool_call_id,
                approval_id,
            }
            | OpKind::Dispatch {
                run_id,
                tool_call_id,
                approval_id,
            }
            | OpKind::Settle {
                run_id,
                tool_call_id,
                approval_id,
                ..
            }
            | OpKind::Reconcile {
                run_id,
                tool_call_id,
                approval_id,
                ..
            } if *status == 200 => {
                let Some(answered) = body["state"].as_str() else {
                    continue;
                };
                let stored = record(run_id, tool_call_id, approval_id).map(|r| s(r, "state"));
                if !stored.is_some_and(|st| later_or_same(answered, st)) {
                    v(
                        Invariant::AnswerHolds,
                        format!("{run_id}: {tool_call_id}/{approval_id} answered {answered} ({:?}), its record is {stored:?}", op.kind),
                    );
                }
            }
            _ => {}
        }
    }
}

/// Each child card with a coordinator: on the coordinator, exactly one
/// `coordinator.child_approval_required` and, once the card is resolved, exactly one
/// `coordinator.child_approval_resolved` — while the coordinator runs (nothing follows
/// its terminal event: after it, at most one of each).
fn check_mirrors(h: &History, v: &mut impl FnMut(Invariant, String)) {
    for fc in &h.cards {
        let Some(card) = &fc.card else { continue };
        let Some(coord) = card["coordinator_run_id"].as_str() else {
            continue;
        };
        if coord == fc.run_id || card["auto_approved"].as_bool() == Some(true) {
            continue;
        }
        let Some(run) = h.runs.iter().find(|r| r.run_id == coord) else {
            v(
                Invariant::CoordinatorMirror,
                format!(
                    "{}: its coordinator {coord} was not read back",
                    fc.request_id
                ),
            );
            continue;
        };
        let count = |ty: &str| {
            run.events
                .iter()
                .filter(|e| s(e, "type") == ty && s(e, "requestId") == fc.request_id)
                .count()
        };
        let (required, resolved) = (
            count("coordinator.child_approval_required"),
            count("coordinator.child_approval_resolved"),
        );
        let ended = run
            .events
            .last()
            .is_some_and(|e| TERMINAL.contains(&s(e, "type")));
        let is_resolved = s(card, "state") != "pending";
        let ok = if ended {
            required <= 1 && resolved <= required
        } else {
            required == 1 && resolved == usize::from(is_resolved)
        };
        if !ok {
            v(
                Invariant::CoordinatorMirror,
                format!(
                    "{}: card {} on {}; coordinator {coord} (ended: {ended}) mirrors it required {required}, resolved {resolved} times",
                    fc.request_id,
                    s(card, "state"),
                    fc.run_id
                ),
            );
        }
    }
}
