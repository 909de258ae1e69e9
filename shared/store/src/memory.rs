//! The embedded store: one mutex over a map of runs. Holding the lock for a whole
//! operation is what makes each operation atomic, the in-process analogue of one
//! DynamoDB transaction; it obeys the same contract suite as the DynamoDB adapter.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use tollgate_domain::event::types as ev;

use async_trait::async_trait;
use serde_json::{Map, Value};
use tollgate_domain::{
    now_millis, render_event, ApprovalRequest, ApprovalState, EventDraft, NewRun, Policy,
    Resolution, RunHead, TerminalKind,
};

use tollgate_domain::card::{self, BeatStep, EndStep};
use tollgate_domain::execution::{self, Decision, MutationRecord, MutationState};

use crate::{
    budget_usage, check_batch, check_decision, ended_run_answer, fill_page, mutation_key,
    ApprovalStore, Armed, Beat, CreateOutcome, EventPage, Finished, Forwarded, Located,
    MutationCommit, MutationStore, MutationView, Resolved, RunRef, RunStore, StoreError,
    StoredEvent,
};

#[derive(Default)]
struct RunRecord {
    head: Option<RunHead>,
    /// sequence → (type, body)
    events: BTreeMap<u64, (String, String)>,
    /// request_id → card (cards raised on this run).
    cards: BTreeMap<String, ApprovalRequest>,
    /// request_id → child run id (on a coordinator).
    routes: HashMap<String, String>,
    /// `<tool_call_id>#<approval_id>` → durable mutation record (key order is
    /// `(tool_call_id, approval_id)` order, as on DynamoDB).
    mutations: BTreeMap<String, MutationRecord>,
    event_ids: HashMap<String, u64>,
    /// The stall guard dealt with this child's silence at this `next_seq` (reported it,
    /// or found its coordinator ended): it is not listed by `silent_children` until its
    /// next event — as the DynamoDB index drops it until then.
    unlisted_at: Option<u64>,
    /// request_id → when a repeated arm last re-sent the card's timers.
    timers_sent: HashMap<String, i64>,
}

pub struct MemoryStore {
    state: Mutex<State>,
    /// Notification delivery records by delivery id (docs/architecture.md §10).
    deliveries: Mutex<HashMap<String, crate::Delivery>>,
    /// When each notification sink was first enabled (ms).
    sinks_enabled: Mutex<HashMap<String, i64>>,
    /// Bumped after every write: what a live stream waits on ([`RunStore::appended`]).
    appended: tokio::sync::watch::Sender<u64>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self {
            state: Mutex::default(),
            deliveries: Mutex::default(),
            sinks_enabled: Mutex::default(),
            appended: tokio::sync::watch::Sender::new(0),
        }
    }
}

/// The state locked for a write: live streams are woken once it is released, if it was
/// written through (a lock taken only to read wakes nobody).
struct Writing<'a> {
    guard: Option<std::sync::MutexGuard<'a, State>>,
    appended: &'a tokio::sync::watch::Sender<u64>,
    written: bool,
}

impl std::ops::Deref for Writing<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        self.guard.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for Writing<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.written = true;
        self.guard.as_mut().expect("held until dropped")
    }
}

impl Drop for Writing<'_> {
    fn drop(&mut self) {
        // Release first, so a woken stream finds the lock free.
        drop(self.guard.take());
        if self.written {
            self.appended.send_modify(|v| *v = v.wrapping_add(1));
        }
    }
}

/// Everything, under one lock: runs (with their events and cards) and policies.
#[derive(Default)]
struct State {
    runs: HashMap<String, RunRecord>,
    /// (scope key, tool name) → policy
    policies: BTreeMap<(String, String), Policy>,
}

// Most operations touch runs only: let them use the state as the map of runs.
impl std::ops::Deref for State {
    type Target = HashMap<String, RunRecord>;
    fn deref(&self) -> &Self::Target {
        &self.runs
    }
}

impl std::ops::DerefMut for State {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.runs
    }
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// The state, for a read.
    fn read(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied operation: every
        // mutation below is computed first and applied last.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Events of `types` appended since `seen` (run id → the last sequence looked at,
    /// updated here), as `(run_id, event)`, in each run's order: the embedded store's
    /// feed of the notifier (docs/architecture.md §10), which calls it on every write
    /// signal ([`RunStore::appended`]).
    pub fn events_since(
        &self,
        types: &[&str],
        seen: &mut HashMap<String, u64>,
    ) -> Vec<(String, StoredEvent)> {
        let state = self.read();
        let mut out = Vec::new();
        for (run_id, record) in state.runs.iter() {
            let Some(head) = record.head.as_ref() else {
                continue;
            };
            let last = head.next_seq.saturating_sub(1);
            let from = seen.get(run_id).copied().unwrap_or(0);
            if last <= from {
                continue;
            }
            for (seq, (event_type, body)) in record.events.range(from + 1..=last) {
                if types.contains(&event_type.as_str()) {
                    out.push((
                        run_id.clone(),
                        StoredEvent {
                            sequence: *seq,
                            event_type: event_type.clone(),
                            body: body.clone(),
                        },
                    ));
                }
            }
            seen.insert(run_id.clone(), last);
        }
        out
    }

    /// The state, for a write (live streams look again once it is released).
    fn lock(&self) -> Writing<'_> {
        Writing {
            guard: Some(self.read()),
            appended: &self.appended,
            written: false,
        }
    }
}

fn live_head<'a>(
    runs: &'a mut HashMap<String, RunRecord>,
    run: RunRef<'_>,
) -> Result<&'a mut RunRecord, StoreError> {
    match runs.get_mut(run.run_id) {
        Some(r) if r.head.as_ref().is_some_and(|h| run.check(h).is_ok()) => Ok(r),
        _ => Err(StoreError::NotFound),
    }
}

fn stored(head: &RunHead, seq: u64, draft: &EventDraft, now: i64) -> (String, String) {
    (
        draft.event_type.clone(),
        render_event(head, seq, draft, now),
    )
}

#[async_trait]
impl RunStore for MemoryStore {
    async fn create_run(&self, new: NewRun) -> Result<CreateOutcome, StoreError> {
        let mut runs = self.lock();
        let record = runs.entry(new.run_id.clone()).or_default();
        if let Some(head) = &record.head {
            return Ok(CreateOutcome::Existing(head.clone()));
        }
        let now = now_millis();
        let head = new.head(now);
        // Invariant (as on DynamoDB): a run id whose events outlived their head is never
        // created again, so nobody is served another run's leftovers.
        if !record.events.is_empty() {
            return Err(StoreError::Conflict(
                "run id has leftover events; choose another run id".into(),
            ));
        }
        record
            .events
            .insert(1, stored(&head, 1, &new.started_event(), now));
        record.head = Some(head.clone());
        Ok(CreateOutcome::Created(head))
    }

    async fn append_events(
        &self,
        run: RunRef<'_>,
        events: Vec<EventDraft>,
    ) -> Result<Vec<u64>, StoreError> {
        check_batch(&events)?;
        let mut runs = self.lock();
        let record = live_head(&mut runs, run)?;
        let head = record.head.as_mut().ok_or(StoreError::NotFound)?;
        // Duplicates answer with their original sequence even on an ended run, exactly
        // as the DynamoDB adapter does: a retry must see the result of its first try.
        let mut sequences = Vec::with_capacity(events.len());
        let mut fresh = Vec::new();
        for draft in &events {
            match draft
                .event_id
                .as_ref()
                .and_then(|id| record.event_ids.get(id))
            {
                Some(seq) => sequences.push(Some(*seq)),
                None => {
                    sequences.push(None);
                    fresh.push(draft);
                }
            }
        }
        if !fresh.is_empty() {
            if head.status.is_terminal() {
                return Err(StoreError::RunTerminal {
                    status: head.status,
                    terminal_seq: head.terminal_seq.unwrap_or(head.last_sequence()),
                });
            }
            let now = now_millis();
            let mut next = head.next_seq;
            for (slot, draft) in sequences.iter_mut().zip(&events) {
                if slot.is_some() {
                    continue;
                }
                record.events.insert(next, stored(head, next, draft, now));
                if let Some(id) = &draft.event_id {
                    record.event_ids.insert(id.clone(), next);
                }
                *slot = Some(next);
                next += 1;
            }
            head.next_seq = next;
            head.record(fresh.iter().map(|d| d.event_type.as_str()), now);
        }
        Ok(sequences.into_iter().flatten().collect())
    }

    async fn finish_run(
        &self,
        run: RunRef<'_>,
        kind: TerminalKind,
        payload: Map<String, Value>,
    ) -> Result<Finished, StoreError> {
        let mut runs = self.lock();
        let record = live_head(&mut runs, run)?;
        let head = record.head.as_mut().ok_or(StoreError::NotFound)?;
        if head.status.is_terminal() {
            return ended_run_answer(head, kind);
        }
        // Invariant 3: every card a run's end closes is announced before the terminal
        // event, so the end refuses while one is pending (`Gate::finish_run`).
        let pending = record
            .cards
            .values()
            .filter(|c| c.state == ApprovalState::Pending)
            .count();
        if pending > 0 {
            return Err(StoreError::CardsOpen(pending as u64));
        }
        let seq = record.end(kind, payload, now_millis());
        Ok(Finished {
            sequence: seq,
            already_finished: false,
            open_cards: 0,
        })
    }

    async fn read_head(&self, run_id: &str) -> Result<Option<RunHead>, StoreError> {
        Ok(self.read().get(run_id).and_then(|r| r.head.clone()))
    }

    async fn read_events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<EventPage, StoreError> {
        let runs = self.read();
        let Some(record) = runs.get(run_id).filter(|r| r.head.is_some()) else {
            return Err(StoreError::NotFound);
        };
        let events =
            record
                .events
                .range(after.saturating_add(1)..)
                .map(|(seq, (event_type, body))| StoredEvent {
                    sequence: *seq,
                    event_type: event_type.clone(),
                    body: body.clone(),
                });
        Ok(fill_page(events, limit))
    }

    fn appended(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.appended.subscribe())
    }

    async fn list_runs(
        &self,
        project_id: Option<&str>,
        filter: &crate::RunFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<crate::RunPage, StoreError> {
        // Newest first; ties by run id, so a position is exact.
        let order = |r: &crate::RunSummary| (std::cmp::Reverse(r.created_at), r.run_id.clone());
        let after = match cursor {
            None => None,
            Some(c) => {
                let v = crate::decode_cursor(c)?;
                match (v["created_at"].as_i64(), v["run_id"].as_str()) {
                    (Some(at), Some(id)) if v["project"] == serde_json::json!(project_id) => {
                        Some((std::cmp::Reverse(at), id.to_owned()))
                    }
                    _ => return Err(StoreError::InvalidCursor),
                }
            }
        };
        let mut tenant: Vec<crate::RunSummary> = self
            .read()
            .values()
            .filter_map(|r| r.head.as_ref())
            .filter(|h| h.project_id.as_deref() == project_id)
            .map(summary)
            .filter(|r| after.as_ref().is_none_or(|a| order(r) > *a))
            .collect();
        tenant.sort_by_key(order);
        let limit = limit.max(1);
        let mut runs = Vec::new();
        let mut examined = 0;
        for run in &tenant {
            examined += 1;
            if filter.matches(run) {
                runs.push(run.clone());
            }
            if runs.len() >= limit || examined >= crate::MAX_RUNS_EXAMINED {
                break;
            }
        }
        let next_cursor = match tenant.get(examined.wrapping_sub(1)) {
            Some(last) if examined < tenant.len() => {
                Some(crate::encode_cursor(&serde_json::json!({
                    "project": project_id,
                    "created_at": last.created_at,
                    "run_id": last.run_id,
                })))
            }
            _ => None,
        };
        Ok(crate::RunPage { runs, next_cursor })
    }
}

/// A head as the runs listing shows it; a run's last event is its terminal one once it
/// has ended.
fn summary(h: &RunHead) -> crate::RunSummary {
    crate::RunSummary {
        run_id: h.run_id.clone(),
        kind: h.kind,
        status: h.status,
        owner: h.owner.clone(),
        project_id: h.project_id.clone(),
        channel_id: h.channel_id.clone(),
        created_at: h.created_at,
        ended_at: h.status.is_terminal().then_some(h.last_event_at),
    }
}

/// `tool.policy_revoked` on each running stream `policy` reached, keyed: a stream
/// already told is not told again.
fn announce(state: &mut State, policy: &Policy) {
    let draft = policy.revoked_event();
    let id = draft.event_id.clone().unwrap_or_default();
    let now = now_millis();
    for run_id in policy.reached_runs.iter().take(crate::MAX_ANNOUNCED_RUNS) {
        let Some(record) = state
            .runs
            .get_mut(run_id)
            .filter(|r| r.running_head().is_some())
        else {
            continue;
        };
        if record.event_ids.contains_key(&id) {
            continue;
        }
        if let Some(seq) = record.push(std::slice::from_ref(&draft), now) {
            record.event_ids.insert(id.clone(), seq);
        }
    }
}

impl RunRecord {
    fn running_head(&self) -> Option<&RunHead> {
        self.head.as_ref().filter(|h| !h.status.is_terminal())
    }

    /// Appends server events to a run (the caller checked it runs); the first sequence.
    /// The terminal event and status of a running run's head (its caller checked that
    /// it runs); the terminal sequence.
    fn end(&mut self, kind: TerminalKind, payload: Map<String, Value>, now: i64) -> u64 {
        let Some(head) = self.head.as_mut() else {
            return 0;
        };
        let seq = head.next_seq;
        let draft = EventDraft::server(kind.event_type(), payload);
        self.events.insert(seq, stored(head, seq, &draft, now));
        head.next_seq = seq + 1;
        head.status = kind.status();
        head.terminal_seq = Some(seq);
        head.record([kind.event_type()], now);
        seq
    }

    fn push(&mut self, drafts: &[EventDraft], now: i64) -> Option<u64> {
        let head = self.head.as_mut()?;
        let first = head.next_seq;
        for draft in drafts {
            let seq = head.next_seq;
            self.events.insert(seq, stored(head, seq, draft, now));
            head.next_seq += 1;
        }
        head.record(drafts.iter().map(|d| d.event_type.as_str()), now);
        Some(first)
    }
}

#[async_trait]
impl ApprovalStore for MemoryStore {
    async fn arm_within(
        &self,
        run: RunRef<'_>,
        card: ApprovalRequest,
        project_cap: u64,
    ) -> Result<Armed, StoreError> {
        let mut runs = self.lock();
        let record = live_head(&mut runs, run)?;
        let stored = record.cards.get(&card.request_id).cloned();
        let head = record.head.clone();
        let open = record
            .cards
            .values()
            .filter(|c| c.state == ApprovalState::Pending)
            .count() as u64;
        let coordinator_running = card
            .coordinator_run_id
            .as_ref()
            .is_some_and(|c| runs.get(c).and_then(RunRecord::running_head).is_some());
        let running = head.as_ref().is_some_and(|h| !h.status.is_terminal());
        let step = card::arm(card, stored.as_ref(), running, open, coordinator_running);
        let arming = match crate::to_commit(step, head.as_ref())? {
            Ok(arming) => arming,
            Err(answer) => return Ok(answer),
        };
        let card = arming.card;
        // The commit's conditions. One lock holds the whole step, so counting the
        // project's pending cards is exact.
        if project_cap < u64::MAX {
            let in_project = runs
                .values()
                .flat_map(|r| r.cards.values())
                .filter(|c| c.state == ApprovalState::Pending && c.project_id == card.project_id)
                .count() as u64;
            if in_project >= project_cap {
                return Err(crate::too_many_project_cards(project_cap));
            }
        }
        let coordinator = card.coordinator_run_id.clone();
        if let Some(c) = &coordinator {
            match runs.get(c).and_then(|r| r.routes.get(&card.request_id)) {
                Some(owner) if *owner != card.run_id => {
                    return Err(StoreError::Conflict(
                        "request_id is already in use under this coordinator".into(),
                    ))
                }
                _ => {}
            }
        }
        let now = now_millis();
        let record = runs.get_mut(&card.run_id).ok_or(StoreError::NotFound)?;
        let sequence = record
            .push(&[arming.on_run], now)
            .ok_or(StoreError::NotFound)?;
        record.cards.insert(card.request_id.clone(), card.clone());
        // Arming sends the timers: a repeat within the window sends none.
        record.timers_sent.insert(card.request_id.clone(), now);
        if let (Some(coord), Some(mirror)) = (
            coordinator.as_ref().and_then(|c| runs.get_mut(c)),
            arming.on_coordinator,
        ) {
            coord
                .routes
                .insert(card.request_id.clone(), card.run_id.clone());
            coord.push(&[mirror], now);
        }
        Ok(Armed::Created { card, sequence })
    }

    async fn claim_timer_resend(&self, run_id: &str, request_id: &str) -> Result<bool, StoreError> {
        let mut runs = self.lock();
        let Some(record) = runs.get_mut(run_id) else {
            return Ok(false);
        };
        let pending = record
            .cards
            .get(request_id)
            .is_some_and(|c| c.state == ApprovalState::Pending);
        if !pending || record.timers_sent.contains_key(request_id) {
            return Ok(false);
        }
        record
            .timers_sent
            .insert(request_id.to_owned(), now_millis());
        Ok(true)
    }

    async fn clear_timer_mark(&self, run_id: &str, request_id: &str) -> Result<(), StoreError> {
        if let Some(record) = self.lock().get_mut(run_id) {
            record.timers_sent.remove(request_id);
        }
        Ok(())
    }

    async fn read_card(
        &self,
        run_id: &str,
        request_id: &str,
    ) -> Result<Option<ApprovalRequest>, StoreError> {
        Ok(self
            .lock()
            .get(run_id)
            .and_then(|r| r.cards.get(request_id).cloned()))
    }

    async fn locate(&self, run_id: &str, request_id: &str) -> Result<Option<Located>, StoreError> {
        let runs = self.read();
        let posted = runs.get(run_id);
        let card = match posted.and_then(|r| r.cards.get(request_id)) {
            Some(card) => Some(card.clone()),
            None => posted
                .and_then(|r| r.routes.get(request_id))
                .and_then(|child| runs.get(child))
                .and_then(|r| r.cards.get(request_id))
                .cloned(),
        };
        Ok(card.map(|card| {
            let head_of = |id: &str| runs.get(id).and_then(|r| r.head.clone());
            Located {
                head: head_of(&card.run_id),
                coordinator: card.coordinator_run_id.as_deref().and_then(head_of),
                card,
                count_shard: Some(0),
            }
        }))
    }

    async fn resolve_located(
        &self,
        located: Located,
        resolution: Resolution,
        at: i64,
        grant: Option<Policy>,
    ) -> Result<Resolved, StoreError> {
        // One lock makes the whole step atomic: the located reads need no re-check.
        let card = located.card;
        self.resolve(&card.run_id, &card.request_id, resolution, at, grant)
            .await
    }

    async fn read_route(
        &self,
        coordinator_run_id: &str,
        request_id: &str,
    ) -> Result<Option<String>, StoreError> {
        Ok(self
            .lock()
            .get(coordinator_run_id)
            .and_then(|r| r.routes.get(request_id).cloned()))
    }

    async fn resolve(
        &self,
        run_id: &str,
        request_id: &str,
        resolution: Resolution,
        at: i64,
        grant: Option<Policy>,
    ) -> Result<Resolved, StoreError> {
        resolve_in(&mut self.lock(), run_id, request_id, resolution, at, grant)
    }

    async fn heartbeat(
        &self,
        run_id: &str,
        request_id: &str,
        beat: u32,
    ) -> Result<Beat, StoreError> {
        let mut runs = self.lock();
        let Some(record) = runs.get_mut(run_id) else {
            return Ok(Beat::Stopped);
        };
        let running = record.running_head().is_some();
        match card::beat(record.cards.get(request_id), running, beat) {
            BeatStep::Append(draft) => Ok(beat_on(record, draft)),
            BeatStep::Stop => Ok(Beat::Stopped),
        }
    }

    async fn record_forwarded(
        &self,
        run_id: &str,
        card: &ApprovalRequest,
        grant: Option<Policy>,
    ) -> Result<Forwarded, StoreError> {
        let mut state = self.lock();
        let draft = card.forwarded_resolved_event();
        let id = draft.event_id.clone().unwrap_or_default();
        let Some(record) = state.get_mut(run_id) else {
            return Err(StoreError::NotFound);
        };
        let running = record.running_head().is_some();
        let answer = match record.event_ids.get(&id) {
            // Another forward of this decision wrote the event first; the grant this
            // forward applied is still written (while the run runs).
            Some(seq) => Forwarded::Already(*seq),
            None if !running => return Ok(Forwarded::RunEnded),
            // Its pod announced the card meanwhile: the decision is that card's.
            None if record.cards.contains_key(&card.request_id) => {
                return Ok(Forwarded::CardExists)
            }
            None => {
                let Some(seq) = record.push(&[draft], now_millis()) else {
                    return Ok(Forwarded::RunEnded);
                };
                record.event_ids.insert(id, seq);
                // The card as it ended in the pod: a later announcement of it finds it
                // ended, and nothing more is appended for it.
                record
                    .cards
                    .insert(card.request_id.clone(), card.forwarded_record());
                Forwarded::Fresh(seq)
            }
        };
        if !running {
            return Ok(answer);
        }
        // Once the event was there, a grant goes only where no policy is (granted or
        // revoked): the same decision sent again never undoes a revocation.
        let fresh = matches!(answer, Forwarded::Fresh(_));
        let grant = grant.filter(|p| {
            fresh
                || !state
                    .policies
                    .contains_key(&(p.scope_key.clone(), p.tool_name.clone()))
        });
        if let (Some(mut policy), ApprovalState::Approved) = (grant, card.state) {
            policy.reached_runs = vec![card.run_id.clone()];
            state
                .policies
                .insert((policy.scope_key.clone(), policy.tool_name.clone()), policy);
        }
        Ok(answer)
    }

    async fn read_policy(
        &self,
        scope_key: &str,
        tool_name: &str,
    ) -> Result<Option<Policy>, StoreError> {
        Ok(self
            .lock()
            .policies
            .get(&(scope_key.to_owned(), tool_name.to_owned()))
            .cloned())
    }

    async fn find_policy(
        &self,
        scope_keys: &[String],
        tool_name: &str,
    ) -> Result<Option<Policy>, StoreError> {
        let state = self.read();
        Ok(scope_keys.iter().find_map(|key| {
            state
                .policies
                .get(&(key.clone(), tool_name.to_owned()))
                .filter(|p| p.is_live())
                .cloned()
        }))
    }

    async fn auto_approve(
        &self,
        run: RunRef<'_>,
        card: &ApprovalRequest,
        policy: &Policy,
    ) -> Result<u64, StoreError> {
        let mut state = self.lock();
        let key = (policy.scope_key.clone(), policy.tool_name.clone());
        let live = state.policies.get(&key).is_some_and(Policy::is_live);
        let record = live_head(&mut state, run)?;
        let draft = policy.auto_approved_event(card);
        let id = draft.event_id.clone().unwrap_or_default();
        // A retried arm answers the first auto-approval, even after a revocation.
        if let Some(seq) = record.event_ids.get(&id) {
            return Ok(*seq);
        }
        // One card per (run, request_id): an arm that came first is the outcome.
        if record.cards.contains_key(&card.request_id) {
            return Err(StoreError::Conflict(
                "a card for this request already exists".into(),
            ));
        }
        if !live {
            return Err(StoreError::Conflict("the policy was revoked".into()));
        }
        if let Some(head) = record.head.as_ref().filter(|h| h.status.is_terminal()) {
            return Err(StoreError::RunTerminal {
                status: head.status,
                terminal_seq: head.terminal_seq.unwrap_or(head.last_sequence()),
            });
        }
        let now = now_millis();
        let seq = record.push(&[draft], now).ok_or(StoreError::NotFound)?;
        record.event_ids.insert(id, seq);
        // The card, approved and never pending, in the same step as the event.
        record.cards.insert(
            card.request_id.clone(),
            card.auto_approved(policy, seq, now),
        );
        if let Some(p) = state.policies.get_mut(&key) {
            if !p.reached_runs.contains(&card.run_id)
                && p.reached_runs.len() < crate::MAX_ANNOUNCED_RUNS
            {
                p.reached_runs.push(card.run_id.clone());
            }
        }
        Ok(seq)
    }

    async fn list_policies(
        &self,
        project_id: Option<&str>,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<crate::PolicyPage, StoreError> {
        // Newest first; ties by key, so a position is exact.
        let order = |p: &Policy| {
            (
                std::cmp::Reverse(p.granted_at),
                p.scope_key.clone(),
                p.tool_name.clone(),
            )
        };
        let after = match cursor {
            None => None,
            Some(c) => {
                let v = crate::decode_cursor(c)?;
                let at = v["granted_at"].as_i64();
                let scope = v["scope_key"].as_str();
                let tool = v["tool_name"].as_str();
                match (at, scope, tool) {
                    (Some(at), Some(scope), Some(tool))
                        if v["project"] == serde_json::json!(project_id) =>
                    {
                        Some((std::cmp::Reverse(at), scope.to_owned(), tool.to_owned()))
                    }
                    _ => return Err(StoreError::InvalidCursor),
                }
            }
        };
        let state = self.read();
        let mut list: Vec<Policy> = state
            .policies
            .values()
            .filter(|p| project_id.is_none() || p.project_id.as_deref() == project_id)
            .filter(|p| after.as_ref().is_none_or(|a| order(p) > *a))
            .cloned()
            .collect();
        list.sort_by_key(order);
        let more = list.len() > limit;
        list.truncate(limit);
        let next_cursor = match list.last() {
            Some(last) if more => Some(crate::encode_cursor(&serde_json::json!({
                "project": project_id,
                "granted_at": last.granted_at,
                "scope_key": last.scope_key,
                "tool_name": last.tool_name,
            }))),
            _ => None,
        };
        Ok(crate::PolicyPage {
            policies: list,
            next_cursor,
        })
    }

    async fn revoke_policy(
        &self,
        scope_key: &str,
        tool_name: &str,
        by: &str,
        at: i64,
    ) -> Result<Option<Policy>, StoreError> {
        let mut state = self.lock();
        let key = (scope_key.to_owned(), tool_name.to_owned());
        let Some(mut policy) = state.policies.get(&key).cloned() else {
            return Ok(None);
        };
        // The first revocation stands; a repeat announces again (as on DynamoDB, where
        // announcing is a step of its own that a repeat completes).
        if policy.is_live() {
            policy.revoked_by = Some(by.to_owned());
            policy.revoked_at = Some(at);
            state.policies.insert(key, policy.clone());
        }
        announce(&mut state, &policy);
        Ok(Some(policy))
    }

    async fn announce_revocation(
        &self,
        scope_key: &str,
        tool_name: &str,
    ) -> Result<Option<Policy>, StoreError> {
        let mut state = self.lock();
        let key = (scope_key.to_owned(), tool_name.to_owned());
        let policy = state.policies.get(&key).cloned();
        if let Some(p) = policy.as_ref().filter(|p| !p.is_live()) {
            announce(&mut state, p);
        }
        Ok(policy)
    }

    async fn silent_children(
        &self,
        silent_since: i64,
        limit: usize,
    ) -> Result<Vec<RunHead>, StoreError> {
        let state = self.read();
        let mut silent: Vec<RunHead> = state
            .runs
            .values()
            // Dealt with at this silence (reported, or its coordinator ended): not
            // listed until it speaks again, so it cannot hold the front of the list.
            .filter(|r| {
                r.running_head()
                    .is_some_and(|h| r.unlisted_at != Some(h.next_seq))
            })
            // Waiting on a card (even one armed before its latest event): not stalled.
            .filter(|r| !r.cards.values().any(|c| c.state == ApprovalState::Pending))
            .filter_map(|r| r.running_head())
            .filter(|h| h.kind == tollgate_domain::RunKind::Child)
            .filter(|h| h.last_event_at <= silent_since)
            // Waiting on a card: never stalled (seed 003), so no candidate.
            .filter(|h| h.last_real_type.as_deref() != Some(ev::APPROVAL_REQUIRED))
            .cloned()
            .collect();
        silent.sort_by_key(|h| h.last_event_at);
        silent.truncate(limit);
        Ok(silent)
    }

    async fn report_stall(
        &self,
        child: &RunHead,
        check: &tollgate_domain::StallCheck,
    ) -> Result<Option<u64>, StoreError> {
        let mut state = self.lock();
        // Only while the child is exactly as read (no event since), still running, and
        // waiting on no card (seed 003: a child waiting on a human is not stalled).
        let unchanged = state
            .runs
            .get(&child.run_id)
            .filter(|r| !r.cards.values().any(|c| c.state == ApprovalState::Pending))
            .and_then(RunRecord::running_head)
            .is_some_and(|h| h.next_seq == child.next_seq && h.incarnation == child.incarnation);
        if !unchanged {
            return Ok(None);
        }
        let coordinator = child
            .parent_run_id
            .as_ref()
            .filter(|c| {
                state
                    .runs
                    .get(*c)
                    .and_then(RunRecord::running_head)
                    .is_some()
            })
            .cloned();
        let already = state
            .runs
            .get(&child.run_id)
            .and_then(|r| r.head.as_ref())
            .is_some_and(|h| h.stall_reported_seq == Some(h.next_seq));
        let fail = check.action == tollgate_domain::StallAction::Fail;
        let seq = match coordinator {
            // Reported before at this silence: nothing new to say.
            Some(_) if already => None,
            Some(coordinator) => state.runs.get_mut(&coordinator).and_then(|coord| {
                coord.push(
                    &[tollgate_domain::stall_detected_event(child, check)],
                    now_millis(),
                )
            }),
            // Its coordinator ended (or is gone): nobody to tell, ever.
            None => None,
        };
        if let Some(record) = state.runs.get_mut(&child.run_id) {
            if fail && !already {
                // The child's end, in the same step as its coordinator's report.
                record.end(
                    TerminalKind::Fail,
                    tollgate_domain::stall_failure_payload(check),
                    now_millis(),
                );
            } else if let (Some(head), Some(_)) = (record.head.as_mut(), seq) {
                head.stall_reported_seq = Some(child.next_seq);
            }
            record.unlisted_at = Some(child.next_seq);
        }
        Ok(seq)
    }

    async fn pending_cards(&self, run_id: &str) -> Result<Vec<ApprovalRequest>, StoreError> {
        Ok(self
            .lock()
            .get(run_id)
            .map(|r| {
                r.cards
                    .values()
                    .filter(|c| c.state == ApprovalState::Pending)
                    .take(crate::MAX_PENDING_LISTED)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn open_cards(
        &self,
        project_id: Option<&str>,
        due_before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<ApprovalRequest>, StoreError> {
        let runs = self.read();
        let mut open: Vec<ApprovalRequest> = runs
            .values()
            .flat_map(|r| r.cards.values())
            .filter(|c| c.state == ApprovalState::Pending)
            .filter(|c| project_id.is_none() || c.project_id.as_deref() == project_id)
            .filter(|c| due_before.is_none_or(|t| c.expires_at <= t))
            .cloned()
            .collect();
        open.sort_by_key(|c| (c.expires_at, c.run_id.clone(), c.request_id.clone()));
        open.truncate(limit);
        Ok(open)
    }

    async fn open_cards_after(
        &self,
        project_id: Option<&str>,
        after: &crate::ListingCursor,
        limit: usize,
    ) -> Result<Vec<ApprovalRequest>, StoreError> {
        let mut open = self
            .open_cards(project_id, None, usize::MAX)
            .await?
            .into_iter()
            .filter(|c| after.precedes(c))
            .collect::<Vec<_>>();
        open.truncate(limit);
        Ok(open)
    }
}

#[async_trait]
impl MutationStore for MemoryStore {
    async fn read_mutation(
        &self,
        run_id: &str,
        tool_call_id: &str,
        approval_id: &str,
    ) -> Result<Option<MutationRecord>, StoreError> {
        Ok(self.read().get(run_id).and_then(|r| {
            r.mutations
                .get(&mutation_key(tool_call_id, approval_id))
                .cloned()
        }))
    }

    async fn list_mutations(
        &self,
        run_id: &str,
        limit: usize,
    ) -> Result<Vec<MutationRecord>, StoreError> {
        Ok(self
            .lock()
            .get(run_id)
            .map(|r| {
                r.mutations
                    .values()
                    .take(limit.min(crate::MAX_MUTATIONS_LISTED + 1))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn tool_call_mutations(
        &self,
        run_id: &str,
        tool_call_id: &str,
    ) -> Result<Vec<MutationRecord>, StoreError> {
        Ok(self
            .lock()
            .get(run_id)
            .map(|r| of_tool_call(r, tool_call_id))
            .unwrap_or_default())
    }

    async fn overdue_attempts(
        &self,
        due_before: i64,
        limit: usize,
    ) -> Result<Vec<MutationRecord>, StoreError> {
        let runs = self.read();
        let mut due: Vec<MutationRecord> = runs
            .values()
            .flat_map(|r| r.mutations.values())
            .filter(|m| !m.state.is_settled() && m.settlement_deadline_at <= due_before)
            .cloned()
            .collect();
        due.sort_by_key(|m| m.settlement_deadline_at);
        due.truncate(limit);
        Ok(due)
    }

    async fn read_mutation_view(
        &self,
        run_id: &str,
        tool_call_id: &str,
    ) -> Result<Option<MutationView>, StoreError> {
        let runs = self.read();
        let Some((record, head)) = runs
            .get(run_id)
            .and_then(|r| r.head.clone().map(|h| (r, h)))
        else {
            return Ok(None);
        };
        Ok(Some(MutationView {
            usage: budget_usage(&head)?,
            attempts: of_tool_call(record, tool_call_id),
            head,
        }))
    }

    async fn commit_mutation(
        &self,
        head: &RunHead,
        prior: Option<&MutationRecord>,
        decision: &Decision,
    ) -> Result<MutationCommit, StoreError> {
        if !decision.changed {
            return Ok(MutationCommit::Written {
                sequences: Vec::new(),
            });
        }
        check_decision(head, prior, decision)?;
        // One lock: the conditions and the writes are one atomic step.
        let mut runs = self.lock();
        let Some(run) = runs.get_mut(&head.run_id) else {
            return Ok(MutationCommit::Lost);
        };
        let rec = &decision.record;
        let key = mutation_key(&rec.tool_call_id, &rec.approval_id);
        if run.mutations.get(&key) != prior {
            return Ok(MutationCommit::Lost);
        }
        // A dispatch tells the agent to send: only while the run is still the running
        // incarnation it was decided on (a cancel in between must win).
        let still_running = run
            .running_head()
            .is_some_and(|h| h.incarnation == head.incarnation);
        if rec.state == MutationState::Dispatched && !still_running {
            return Ok(MutationCommit::Lost);
        }
        let writes_head = !decision.events.is_empty() || decision.usage.is_some();
        if writes_head {
            let same = run
                .running_head()
                .is_some_and(|h| h.next_seq == head.next_seq && h.incarnation == head.incarnation);
            if !same {
                return Ok(MutationCommit::Lost);
            }
        }
        let mut sequences = Vec::new();
        if !decision.events.is_empty() {
            let first = run
                .push(&decision.events, now_millis())
                .ok_or(StoreError::NotFound)?;
            sequences = (first..first + decision.events.len() as u64).collect();
        }
        if let (Some(usage), Some(h)) = (&decision.usage, run.head.as_mut()) {
            h.budget_used = Some(usage.to_json());
        }
        run.mutations.insert(key, rec.clone());
        Ok(MutationCommit::Written { sequences })
    }

    async fn execution_heartbeat(
        &self,
        run_id: &str,
        tool_call_id: &str,
        approval_id: &str,
        beat: u32,
    ) -> Result<Beat, StoreError> {
        let mut runs = self.lock();
        let Some(run) = runs.get_mut(run_id) else {
            return Ok(Beat::Stopped);
        };
        let Some(head) = run.running_head() else {
            return Ok(Beat::Stopped);
        };
        let status = head.status;
        let due = run
            .mutations
            .get(&mutation_key(tool_call_id, approval_id))
            .and_then(|r| execution::execution_heartbeat(r, beat, status, now_millis()));
        Ok(match due {
            Some(draft) => beat_on(run, draft),
            None => Beat::Stopped,
        })
    }
}

/// Appends the keyed heartbeat `draft` on a running `run` — unless a delivery of the same
/// beat wrote it: only the writer carries the chain on, so a duplicate delivery never
/// forks it (as on DynamoDB, where the event's key is the mark).
fn beat_on(run: &mut RunRecord, draft: EventDraft) -> Beat {
    let id = draft.event_id.clone().unwrap_or_default();
    if let Some(seq) = run.event_ids.get(&id) {
        return Beat::Repeated(*seq);
    }
    let Some(seq) = run.push(&[draft], now_millis()) else {
        return Beat::Stopped;
    };
    run.event_ids.insert(id, seq);
    Beat::Emitted(seq)
}

/// The records of one tool call, by `approval_id`.
fn of_tool_call(run: &RunRecord, tool_call_id: &str) -> Vec<MutationRecord> {
    let from = mutation_key(tool_call_id, "");
    run.mutations
        .range(from.clone()..)
        .take_while(|(k, _)| k.starts_with(&from))
        .map(|(_, r)| r.clone())
        .collect()
}

/// One card's resolution under the store's lock (see [`ApprovalStore::resolve`]).
fn resolve_in(
    runs: &mut State,
    run_id: &str,
    request_id: &str,
    resolution: Resolution,
    at: i64,
    grant: Option<Policy>,
) -> Result<Resolved, StoreError> {
    // An approval commits only before the card's deadline by the clock at commit time
    // (docs/architecture.md §6): `at` is when it was asked, the lock is held now. A
    // denial is judged by its click's time (`Resolution::judged_at`).
    let at = resolution.judged_at(at, now_millis());
    let record = runs.get(run_id).ok_or(StoreError::NotFound)?;
    let card = record
        .cards
        .get(request_id)
        .cloned()
        .ok_or(StoreError::NotFound)?;
    let running = record.running_head().is_some();
    let coordinator_running = card
        .coordinator_run_id
        .as_ref()
        .is_some_and(|c| runs.get(c).and_then(RunRecord::running_head).is_some());
    let ending = match card::end(&card, resolution, running, coordinator_running, at, grant) {
        EndStep::Already(card) => return Ok(Resolved::Already(card)),
        EndStep::End(ending) => ending,
    };
    let now = now_millis();
    let record = runs.get_mut(run_id).ok_or(StoreError::NotFound)?;
    if let Some(event) = ending.on_run {
        record.push(&[event], now);
    }
    record
        .cards
        .insert(request_id.to_owned(), ending.card.clone());
    if let Some(policy) = ending.grant {
        runs.policies
            .insert((policy.scope_key.clone(), policy.tool_name.clone()), policy);
    }
    if let (Some(coord), Some(event)) = (
        ending
            .card
            .coordinator_run_id
            .as_ref()
            .and_then(|c| runs.get_mut(c)),
        ending.on_coordinator,
    ) {
        coord.push(&[event], now);
    }
    Ok(Resolved::Fresh(ending.card))
}

#[async_trait]
impl crate::DeliveryStore for MemoryStore {
    async fn put_delivery(
        &self,
        record: &crate::Delivery,
        expected: u64,
    ) -> Result<bool, StoreError> {
        let mut all = self.deliveries.lock().unwrap_or_else(|p| p.into_inner());
        let stored = all.get(&record.delivery_id).map(|d| d.version).unwrap_or(0);
        if stored != expected {
            return Ok(false);
        }
        all.insert(record.delivery_id.clone(), record.clone());
        Ok(true)
    }

    async fn read_delivery(
        &self,
        delivery_id: &str,
    ) -> Result<Option<crate::Delivery>, StoreError> {
        let all = self.deliveries.lock().unwrap_or_else(|p| p.into_inner());
        Ok(all.get(delivery_id).cloned())
    }

    async fn due_deliveries(
        &self,
        now: i64,
        limit: usize,
    ) -> Result<Vec<crate::Delivery>, StoreError> {
        let all = self.deliveries.lock().unwrap_or_else(|p| p.into_inner());
        let mut due: Vec<crate::Delivery> = all
            .values()
            .filter(|d| d.state == crate::DeliveryState::Pending && d.next_attempt_at <= now)
            .cloned()
            .collect();
        due.sort_by(|a, b| {
            (a.next_attempt_at, &a.delivery_id).cmp(&(b.next_attempt_at, &b.delivery_id))
        });
        Ok(crate::deliveries::fair_share(
            due,
            limit,
            |d| d.key.project.as_str(),
            |d| d.next_attempt_at,
        ))
    }

    async fn dead_letters(
        &self,
        project: &str,
        limit: usize,
    ) -> Result<Vec<crate::Delivery>, StoreError> {
        let all = self.deliveries.lock().unwrap_or_else(|p| p.into_inner());
        let mut dead: Vec<crate::Delivery> = all
            .values()
            .filter(|d| d.state == crate::DeliveryState::Dead && d.key.project == project)
            .cloned()
            .collect();
        dead.sort_by_key(|d| std::cmp::Reverse((d.updated_at, d.delivery_id.clone())));
        dead.truncate(limit);
        Ok(dead)
    }

    async fn sink_enabled_at(&self, sink: &str, at: i64) -> Result<i64, StoreError> {
        let mut all = self.sinks_enabled.lock().unwrap_or_else(|p| p.into_inner());
        Ok(*all.entry(sink.to_owned()).or_insert(at))
    }
}
