//! The storage port: everything a handler may ask of durable state, phrased in the
//! contract's words. Two adapters implement it — [`dynamo::DynamoStore`] for AWS and
//! [`memory::MemoryStore`] for `tollgate serve` and tests — and both must pass the one
//! suite in [`contract`]. Every method that changes state appends the event announcing
//! the change in the same atomic step (docs/architecture.md §1).

use async_trait::async_trait;
use serde_json::{Map, Value};
use tollgate_domain::execution::{BudgetUsage, Decision, MutationRecord};
use tollgate_domain::{
    ApprovalRequest, EventDraft, NewRun, Policy, Resolution, RunHead, RunStatus, TerminalKind,
};

pub use deliveries::{Delivery, DeliveryKey, DeliveryState, DeliveryStore};
pub use page::{read_page, ReplayPage};

#[cfg(feature = "contract")]
pub mod contract;
pub mod deliveries;
pub mod dynamo;
pub mod memory;
pub mod page;
pub mod schema;

/// One `read_events` call reads at most this many bytes of event bodies (at least one
/// event), whatever the `limit`; [`page`] then bounds what is served.
pub const MAX_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// The run a write is meant for: its id and, when the caller holds a run token, the
/// incarnation that token was issued for. A write whose incarnation differs from the
/// stored head's is `NotFound` — the run the token opened no longer exists, even if the
/// id has been created again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunRef<'a> {
    pub run_id: &'a str,
    pub incarnation: Option<&'a str>,
}

impl<'a> RunRef<'a> {
    /// Exactly the incarnation a run token names.
    pub fn exact(run_id: &'a str, incarnation: &'a str) -> Self {
        Self {
            run_id,
            incarnation: Some(incarnation),
        }
    }

    /// Whatever run holds this id now (server-internal writers and tests).
    pub fn any(run_id: &'a str) -> Self {
        Self {
            run_id,
            incarnation: None,
        }
    }

    /// `NotFound` unless `head` is the incarnation this reference names.
    pub fn check(&self, head: &RunHead) -> Result<(), StoreError> {
        match self.incarnation {
            Some(inc) if inc != head.incarnation => Err(StoreError::NotFound),
            _ => Ok(()),
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StoreError {
    #[error("run not found")]
    NotFound,
    /// The run has ended; nothing more may be appended.
    #[error("run is {} (terminal event at sequence {terminal_seq})", status.as_str())]
    RunTerminal {
        status: RunStatus,
        terminal_seq: u64,
    },
    /// The request contradicts what is stored (a run id already used, a revoked policy,
    /// a run full of pending cards).
    #[error("{0}")]
    Conflict(String),
    /// The request is malformed whatever is stored (an empty or oversized batch, an
    /// `event_id` twice in one): nothing was read or written (HTTP 400).
    #[error("{0}")]
    Invalid(String),
    /// The backend could not be reached, throttled past our budget, or answered
    /// something we cannot interpret. Nothing is assumed to have happened.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// A listing cursor this store did not hand out (or for another listing).
    #[error("invalid cursor")]
    InvalidCursor,
    /// A tenant's limit is reached (open cards of a project): nothing was written; it
    /// frees up as cards end (HTTP 429).
    #[error("{0}")]
    Limit(String),
    /// The run still holds this many pending cards: a terminal transition refuses until
    /// each is ended with its own `tool.approval_resolved` (`Gate::finish_run` does that
    /// and asks again), so that nothing follows the terminal event and no card ends
    /// unannounced (docs/architecture.md §6). Nothing was written.
    #[error("the run holds {0} pending approval requests")]
    CardsOpen(u64),
}

/// One page of policies and the cursor of the next (`None`: this was the last).
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyPage {
    pub policies: Vec<tollgate_domain::Policy>,
    pub next_cursor: Option<String>,
}

/// What the runs listing narrows to ([`RunStore::list_runs`]): every given field must
/// hold. `run_id_prefix` matches the start of the run id (case-sensitive).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunFilter {
    pub status: Option<RunStatus>,
    pub owner: Option<String>,
    pub run_id_prefix: Option<String>,
}

impl RunFilter {
    /// Whether a run matches.
    pub fn matches(&self, run: &RunSummary) -> bool {
        self.status.is_none_or(|s| s == run.status)
            && self
                .owner
                .as_deref()
                .is_none_or(|o| run.owner.as_deref() == Some(o))
            && self
                .run_id_prefix
                .as_deref()
                .is_none_or(|p| run.run_id.starts_with(p))
    }
}

/// One run as the runs listing shows it: the head's listing fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunSummary {
    pub run_id: String,
    pub kind: tollgate_domain::RunKind,
    pub status: RunStatus,
    pub owner: Option<String>,
    pub project_id: Option<String>,
    pub channel_id: Option<String>,
    pub created_at: i64,
    /// When the terminal event was written (`None` while running).
    pub ended_at: Option<i64>,
}

/// Most index entries one page of [`RunStore::list_runs`] reads, whatever its filters
/// match: a page with filters may hold fewer runs than asked (even none) and still have
/// a cursor, so the work of one request stays bounded.
pub const MAX_RUNS_EXAMINED: usize = 1000;

/// One page of runs and the cursor of the next (`None`: this was the last).
#[derive(Debug, Clone, PartialEq)]
pub struct RunPage {
    pub runs: Vec<RunSummary>,
    pub next_cursor: Option<String>,
}

/// Encodes a listing position as an opaque cursor: hex of its JSON (what a client gives
/// back is only ever read as a position, checked by the listing that made it).
pub(crate) fn encode_cursor(position: &serde_json::Value) -> String {
    position
        .to_string()
        .bytes()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The position in a cursor of [`encode_cursor`]; `InvalidCursor` for anything else.
pub(crate) fn decode_cursor(cursor: &str) -> Result<serde_json::Value, StoreError> {
    if !cursor.len().is_multiple_of(2) || cursor.len() > 4096 {
        return Err(StoreError::InvalidCursor);
    }
    let bytes = (0..cursor.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(cursor.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()
        .ok_or(StoreError::InvalidCursor)?;
    serde_json::from_slice(&bytes).map_err(|_| StoreError::InvalidCursor)
}

/// Arming on a run that holds [`tollgate_domain::approval::MAX_OPEN_CARDS_PER_RUN`]
/// pending cards.
pub(crate) fn too_many_open_cards() -> StoreError {
    StoreError::Conflict(format!(
        "the run has {} pending approval requests; decide or let some expire first",
        tollgate_domain::approval::MAX_OPEN_CARDS_PER_RUN
    ))
}

/// An adapter's reading of [`tollgate_domain::card::arm`]'s answer before it commits:
/// `Ok(Ok(arming))` is to be committed, `Ok(Err(answer))` is the answer as it is (the
/// stored card of a retried arm), `Err` refuses. `head` is the run's, as read.
pub(crate) fn to_commit(
    step: tollgate_domain::card::ArmStep,
    head: Option<&RunHead>,
) -> Result<Result<tollgate_domain::card::Arming, Armed>, StoreError> {
    use tollgate_domain::card::ArmStep;
    match step {
        ArmStep::Existing(existing) => Ok(Err(Armed::Existing(existing))),
        ArmStep::RunEnded => Err(match head {
            Some(head) => StoreError::RunTerminal {
                status: head.status,
                terminal_seq: head.terminal_seq.unwrap_or(head.last_sequence()),
            },
            None => StoreError::NotFound,
        }),
        ArmStep::TooManyOpen => Err(too_many_open_cards()),
        ArmStep::Create(arming) => Ok(Ok(arming)),
    }
}

/// Arming in a project that holds `cap` pending cards.
pub(crate) fn too_many_project_cards(cap: u64) -> StoreError {
    StoreError::Limit(format!(
        "the project has {cap} pending approval requests (TOLLGATE_MAX_OPEN_CARDS_PER_PROJECT); \
         decide or let some expire first"
    ))
}

/// The answer to `create_run`: a new run, or the one already stored under that id.
#[derive(Debug, Clone, PartialEq)]
pub enum CreateOutcome {
    Created(RunHead),
    Existing(RunHead),
}

/// The answer to `finish_run`: the terminal event's sequence, and whether this call
/// wrote it or found it already written by an earlier identical call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    pub sequence: u64,
    pub already_finished: bool,
    /// Pending cards an already ended run still counts on its head (0 for a fresh end,
    /// which only commits with none): a run ended before its cards were announced
    /// first, whose cards the caller ends silently (`Gate::end_cards_of`).
    pub open_cards: u64,
}

/// One stored event: its sequence, type and the exact JSON served to clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    pub sequence: u64,
    pub event_type: String,
    pub body: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EventPage {
    pub events: Vec<StoredEvent>,
    /// More events exist after the last one in this page.
    pub has_more: bool,
}

#[async_trait]
pub trait RunStore: Send + Sync + 'static {
    /// Creates the head and `run_started` (sequence 1) together. A run id already taken
    /// answers `Existing` with the stored head and writes nothing.
    async fn create_run(&self, new: NewRun) -> Result<CreateOutcome, StoreError>;

    /// Appends up to 99 events in one atomic step, gapless after the current last
    /// sequence. An event whose `event_id` is already in the run is not appended again:
    /// its original sequence is returned in its place.
    async fn append_events(
        &self,
        run: RunRef<'_>,
        events: Vec<EventDraft>,
    ) -> Result<Vec<u64>, StoreError>;

    /// Ends the run: sets the terminal status and appends its terminal event in one
    /// step. Repeating the same kind answers the existing terminal sequence; a different
    /// kind on an ended run is `RunTerminal`. While the run holds a pending card it
    /// writes nothing and answers [`StoreError::CardsOpen`]: its cards end first, each
    /// announced on the run (and its coordinator) before the terminal event.
    async fn finish_run(
        &self,
        run: RunRef<'_>,
        kind: TerminalKind,
        payload: Map<String, Value>,
    ) -> Result<Finished, StoreError>;

    async fn read_head(&self, run_id: &str) -> Result<Option<RunHead>, StoreError>;

    /// The head as an eventually consistent read sees it: it may lag a write that
    /// committed moments ago (never runs ahead of one). Only for waiting — a reader that
    /// sees a change reads [`RunStore::read_head`] before acting on it; a stale answer
    /// only delays it. On DynamoDB half the read units of [`RunStore::read_head`].
    async fn read_head_lagging(&self, run_id: &str) -> Result<Option<RunHead>, StoreError> {
        self.read_head(run_id).await
    }

    /// Events with sequence > `after`, ascending, at most `limit` (and at most
    /// [`MAX_PAGE_BYTES`] of bodies). On DynamoDB a read may miss events of a
    /// transaction that is committing (`Query` is read-committed, not serializable):
    /// serve pages through [`page::read_page`], which never lets a client skip them.
    async fn read_events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<EventPage, StoreError>;

    /// One tenant's runs, newest first (`created_at`, descending): the runs of
    /// `project_id`, or of no project when `None` — never another tenant's. A page reads
    /// at most `limit` matching runs and at most [`MAX_RUNS_EXAMINED`] runs in all, from
    /// `cursor` (the `next_cursor` of the page before) or the start; `filter` is applied
    /// to what is read, so a page may hold fewer than `limit` runs (even none) with a
    /// cursor. Every matching run present throughout the paging is listed exactly once.
    /// `InvalidCursor` for a cursor this listing did not hand out (or another tenant's).
    async fn list_runs(
        &self,
        project_id: Option<&str>,
        filter: &RunFilter,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<RunPage, StoreError>;

    /// A signal that changes after every write of this store instance, for a live
    /// stream to wait on instead of polling — `None` when writes can come from elsewhere
    /// (DynamoDB: other Lambda instances), where a live stream polls.
    fn appended(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }
}

/// The answer to [`ApprovalStore::arm`].
#[derive(Debug, Clone, PartialEq)]
pub enum Armed {
    /// The card is stored and `tool.approval_required` holds `sequence` on its run.
    Created {
        card: ApprovalRequest,
        sequence: u64,
    },
    /// A card with this `request_id` was armed before (a retry): nothing was written.
    Existing(ApprovalRequest),
}

/// The answer to [`ApprovalStore::resolve`].
#[derive(Debug, Clone, PartialEq)]
pub enum Resolved {
    /// This call moved the card out of `pending` (to the asked state, or to `expired` when
    /// the deadline had passed) and appended `tool.approval_resolved`; on a run that has
    /// ended, to `expired` with reason `run_ended` and no event on the run (nothing
    /// follows a terminal event; a running coordinator is still told).
    Fresh(ApprovalRequest),
    /// The card had already ended: its real state.
    Already(ApprovalRequest),
}

/// A card with the run heads a decision on it advances, read together: a decision's
/// reads in one round trip where the store can (the card's run posted on directly), so
/// that the decision itself is the second.
#[derive(Debug, Clone, PartialEq)]
pub struct Located {
    pub card: ApprovalRequest,
    /// The head of the card's run (`None`: none stored).
    pub head: Option<RunHead>,
    /// The head of the card's coordinator, when it has one and it is stored.
    pub coordinator: Option<RunHead>,
    /// Where the card is in its project's count of open cards (the count shard), so
    /// ending it takes it off there; `None` for a card stored before the count existed.
    pub count_shard: Option<u32>,
}

/// The answer to [`ApprovalStore::heartbeat`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// Beat `n` was appended now, at this sequence: this delivery carries the chain on
    /// (the caller schedules beat `n + 1`).
    Emitted(u64),
    /// Beat `n` was written before, at this sequence, by another delivery of the same
    /// beat (a duplicate or a redelivery): that delivery carries the chain; nothing was
    /// written and nothing is to be scheduled, so a chain never forks.
    Repeated(u64),
    /// The card is no longer pending, or the mutation no longer dispatched (or its run
    /// ended): no heartbeat, none later.
    Stopped,
}

/// The answer to [`ApprovalStore::record_forwarded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forwarded {
    Fresh(u64),
    Already(u64),
    RunEnded,
    /// A card with that `request_id` is stored on the run (its pod announced it while
    /// the decision was being forwarded): nothing was written; the decision is for that
    /// card, through [`ApprovalStore::resolve_located`].
    CardExists,
}

/// Approval cards (seed 003). Every transition writes the card and the events that
/// announce it in one atomic step, conditioned on the card still being `pending`.
#[async_trait]
pub trait ApprovalStore: Send + Sync + 'static {
    /// Stores the pending card and appends `tool.approval_required` on its run and, when
    /// `card.coordinator_run_id` is set and that run is running, the route item and
    /// `coordinator.child_approval_required` on the coordinator — all in one step. The
    /// run must be the incarnation `run` names and running (`RunTerminal` otherwise).
    /// A `request_id` already routed under the coordinator for another child is a
    /// `Conflict`.
    async fn arm(&self, run: RunRef<'_>, card: ApprovalRequest) -> Result<Armed, StoreError> {
        self.arm_within(run, card, u64::MAX).await
    }

    /// [`ApprovalStore::arm`] within a cap on the pending cards of the card's project
    /// (`card.project_id`; runs without a project count as one more tenant): arming
    /// beyond `project_cap` is a `Limit` and writes nothing. The count is taken from by
    /// every transition that ends a card ([`ApprovalStore::resolve_located`]), so it holds
    /// across processes.
    async fn arm_within(
        &self,
        run: RunRef<'_>,
        card: ApprovalRequest,
        project_cap: u64,
    ) -> Result<Armed, StoreError>;

    /// Marks that the timers of the pending card are being sent again now, if the mark is
    /// absent (arming sets it; a failed send clears it, see
    /// [`ApprovalStore::clear_timer_mark`]): only the caller that gets `true` re-sends
    /// them, so repeated arms cannot start one expiry chain each.
    async fn claim_timer_resend(&self, run_id: &str, request_id: &str) -> Result<bool, StoreError>;

    /// Removes the card's timer mark: its timers could not be sent, so the next repeated
    /// arm sends them at once.
    async fn clear_timer_mark(&self, run_id: &str, request_id: &str) -> Result<(), StoreError>;

    async fn read_card(
        &self,
        run_id: &str,
        request_id: &str,
    ) -> Result<Option<ApprovalRequest>, StoreError>;

    /// The child run that owns `request_id` under coordinator `coordinator_run_id`.
    async fn read_route(
        &self,
        coordinator_run_id: &str,
        request_id: &str,
    ) -> Result<Option<String>, StoreError>;

    /// Ends a pending card: `Approved`/`Denied` only while the later of `at` (when it was
    /// asked) and the store's clock at the commit attempt is before its deadline — each
    /// attempt of a retried write reads the clock again (a decision at or after the
    /// deadline expires the card instead) and only while its run is
    /// running; `Expired` always (on an ended run the card expires without an event —
    /// nothing may follow a terminal event). Appends `tool.approval_resolved` on the run
    /// and `coordinator.child_approval_resolved` on a running coordinator, in the same
    /// step — and `grant` (the scope's policy) when this call approves the card: a policy
    /// exists only if the decision that made it won. `NotFound` when there is no card.
    async fn resolve(
        &self,
        run_id: &str,
        request_id: &str,
        resolution: Resolution,
        at: i64,
        grant: Option<Policy>,
    ) -> Result<Resolved, StoreError>;

    /// The card a decision posted to `run_id` means — the run's own card `request_id`,
    /// else the one the coordinator's route item leads to — with the heads a decision
    /// writes. `None`: no such card (the API's `state: "unknown"`).
    async fn locate(&self, run_id: &str, request_id: &str) -> Result<Option<Located>, StoreError>;

    /// [`ApprovalStore::locate`] from storage, whatever this instance remembers of the
    /// card: a refusal judged on a remembered card is judged again on this, so it
    /// answers as a fresh read does (docs/architecture.md §6). A store that remembers
    /// nothing locates as usual.
    async fn locate_fresh(
        &self,
        run_id: &str,
        request_id: &str,
    ) -> Result<Option<Located>, StoreError> {
        self.locate(run_id, request_id).await
    }

    /// [`ApprovalStore::resolve`] on a card [`ApprovalStore::locate`] read: its card and
    /// heads are the first attempt's reads (each write is conditioned on exactly them, so
    /// a stale read loses and is read again — never acted on).
    async fn resolve_located(
        &self,
        located: Located,
        resolution: Resolution,
        at: i64,
        grant: Option<Policy>,
    ) -> Result<Resolved, StoreError>;

    /// A decision an AgentHost pod took on a card only it held (seed 003's pod-per-run
    /// forwarding): `card` is that card as the pod ended it. One atomic step appends
    /// `tool.approval_resolved` keyed per request (so repeated forwards of one decision
    /// append it once) and, with it, `grant` — only for the forward that applied the
    /// decision. `Fresh(sequence)`: written now; `Already(sequence)`: an earlier forward
    /// wrote the event (a concurrent forward that had not applied the decision may win
    /// that race: the applying forward's `grant` is then written on its own, atomically
    /// with a check that the run still runs); `RunEnded`: the run is no longer running
    /// (nothing may follow its terminal event; nothing written).
    async fn record_forwarded(
        &self,
        run_id: &str,
        card: &ApprovalRequest,
        grant: Option<Policy>,
    ) -> Result<Forwarded, StoreError>;

    /// One policy, live or revoked.
    async fn read_policy(
        &self,
        scope_key: &str,
        tool_name: &str,
    ) -> Result<Option<Policy>, StoreError>;

    /// The first live policy for `tool_name` under any of `scope_keys` (in their order).
    async fn find_policy(
        &self,
        scope_keys: &[String],
        tool_name: &str,
    ) -> Result<Option<Policy>, StoreError>;

    /// A gate `policy` covers: `tool.auto_approved` on the run and the card stored
    /// already `approved` (decided by `policy:<policy_id>`, never pending, so no operator
    /// sees it), in one step with a check that the policy is still live (`Conflict` if it
    /// was revoked meanwhile, or if a card for `request_id` exists) and with the run added
    /// to the streams the policy reached. A retried arm finds that card and answers the
    /// first sequence, even after a revocation.
    async fn auto_approve(
        &self,
        run: RunRef<'_>,
        card: &ApprovalRequest,
        policy: &Policy,
    ) -> Result<u64, StoreError>;

    /// Announces a revoked policy on the running streams it reached (keyed: a stream
    /// already told is not told again). `None`: no such policy; a live policy is answered
    /// as it stands and nothing is written (it was never revoked). `Unavailable` when
    /// some stream could not be told (try again).
    async fn announce_revocation(
        &self,
        scope_key: &str,
        tool_name: &str,
    ) -> Result<Option<Policy>, StoreError>;

    /// A page of at most `limit` policies (of one project when `project_id` is given),
    /// from `cursor` (the `next_cursor` of the page before) or the start. A project's
    /// are listed newest first; all projects' in the store's own order (each page newest
    /// first). Every policy present throughout the paging is listed exactly once.
    /// `InvalidCursor` for a cursor this listing did not hand out.
    async fn list_policies(
        &self,
        project_id: Option<&str>,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<PolicyPage, StoreError>;

    /// Revokes a policy (one conditional write: from then on it covers nothing), then
    /// announces it (`tool.policy_revoked`, keyed, so never twice) on each running stream
    /// it reached, each on its own. `None`: no such policy. Revoking again answers the
    /// first revocation and completes any announcement that did not land.
    async fn revoke_policy(
        &self,
        scope_key: &str,
        tool_name: &str,
        by: &str,
        at: i64,
    ) -> Result<Option<Policy>, StoreError>;

    /// Heartbeat number `beat` (1, 2, …): one `tool.approval_pending` on the card's run if
    /// the card is still pending and the run running, conditioned so that it can never
    /// follow the resolution. The same `beat` again (a redelivered timer) writes nothing
    /// and answers the sequence it got the first time.
    async fn heartbeat(
        &self,
        run_id: &str,
        request_id: &str,
        beat: u32,
    ) -> Result<Beat, StoreError>;

    /// Running child runs whose last event was written at or before `silent_since`, at
    /// most `limit` (candidates for the stall guard, which applies
    /// [`tollgate_domain::is_stalled`]).
    async fn silent_children(
        &self,
        silent_since: i64,
        limit: usize,
    ) -> Result<Vec<RunHead>, StoreError>;

    /// Reports `child`'s silence: `coordinator.child_stall_detected` on its running
    /// coordinator and — with [`tollgate_domain::StallAction::Fail`] — the child's
    /// `run_failed` (`reason: "agent_stall_timeout"`), else the silence marked reported on
    /// the child, in one step; only if the child is still exactly as read (no event
    /// since) and holds no pending card. `None`: nothing written on the coordinator (a
    /// child whose coordinator has ended is still failed, silently there).
    async fn report_stall(
        &self,
        child: &RunHead,
        check: &tollgate_domain::StallCheck,
    ) -> Result<Option<u64>, StoreError>;

    /// Pending cards of one run, at most [`MAX_PENDING_LISTED`].
    async fn pending_cards(&self, run_id: &str) -> Result<Vec<ApprovalRequest>, StoreError>;

    /// Pending cards of every run (of one project when `project_id` is given), soonest
    /// deadline first, at most `limit`; with `due_before`, only cards whose deadline is
    /// at or before it (the sweeper).
    async fn open_cards(
        &self,
        project_id: Option<&str>,
        due_before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<ApprovalRequest>, StoreError>;

    /// [`ApprovalStore::open_cards`] (no deadline bound) from just after `after`: the
    /// next page of a listing, in the same order — soonest deadline, then run id, then
    /// request id.
    async fn open_cards_after(
        &self,
        project_id: Option<&str>,
        after: &ListingCursor,
        limit: usize,
    ) -> Result<Vec<ApprovalRequest>, StoreError>;
}

/// Where a listing of pending cards stopped: the last card it answered, by the listing's
/// order `(expires_at, run_id, request_id)`. Its text form (`next_after`) is
/// `<expires_at_ms>~<run_id>~<request_id>` (neither id may hold `~`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ListingCursor {
    pub expires_at: i64,
    pub run_id: String,
    pub request_id: String,
}

impl ListingCursor {
    pub fn of(card: &ApprovalRequest) -> Self {
        Self {
            expires_at: card.expires_at,
            run_id: card.run_id.clone(),
            request_id: card.request_id.clone(),
        }
    }

    /// Whether `card` comes after this cursor in the listing's order.
    pub fn precedes(&self, card: &ApprovalRequest) -> bool {
        (
            self.expires_at,
            self.run_id.as_str(),
            self.request_id.as_str(),
        ) < (
            card.expires_at,
            card.run_id.as_str(),
            card.request_id.as_str(),
        )
    }

    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.splitn(3, '~');
        let expires_at = parts.next()?.parse().ok()?;
        let run_id = parts.next().filter(|p| !p.is_empty())?.to_owned();
        let request_id = parts.next().filter(|p| !p.is_empty())?.to_owned();
        Some(Self {
            expires_at,
            run_id,
            request_id,
        })
    }
}

impl std::fmt::Display for ListingCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}~{}~{}", self.expires_at, self.run_id, self.request_id)
    }
}

/// Most cards one listing of pending cards reads (a console page; the sweeper's batch).
pub const MAX_PENDING_LISTED: usize = 1000;

/// Most streams a policy records as reached (and a revocation announces on); gates it
/// covers beyond them are still auto-approved, only not announced again.
pub const MAX_ANNOUNCED_RUNS: usize = 48;

/// Most records one listing of a run's mutations reads (`GET /api/runs/{id}/mutations`).
pub const MAX_MUTATIONS_LISTED: usize = 1000;

/// What every execution transition decides from, read so that a decision conditioned on
/// it cannot miss a concurrent admission: the run's head (with its budget usage) first,
/// then every stored attempt of one `(run_id, tool_call_id)`. Any admission that
/// committed before the head was read is among `attempts`; any later one moves the
/// head's `next_seq`, on which every admission is conditioned.
#[derive(Debug, Clone, PartialEq)]
pub struct MutationView {
    pub head: RunHead,
    /// The head's `budget_used` (nothing stored: nothing used).
    pub usage: BudgetUsage,
    /// The tool call's attempts, by `approval_id`.
    pub attempts: Vec<MutationRecord>,
}

impl MutationView {
    /// The attempt of `approval_id`, if it is stored.
    pub fn record(&self, approval_id: &str) -> Option<&MutationRecord> {
        self.attempts.iter().find(|r| r.approval_id == approval_id)
    }
}

/// The budget usage stored on a head (`budget_used`); one that no longer parses is
/// `Unavailable` (never read as "nothing used", which would admit past the budget).
pub fn budget_usage(head: &RunHead) -> Result<BudgetUsage, StoreError> {
    BudgetUsage::from_json(head.budget_used.as_ref()).map_err(|_| {
        StoreError::Unavailable("stored item has a missing or malformed \"budget_used\"".into())
    })
}

/// The answer to [`MutationStore::commit_mutation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MutationCommit {
    /// The record and the decision's events are stored: the events' sequences, in order
    /// (empty when the decision announces nothing).
    Written { sequences: Vec<u64> },
    /// The record or the head is no longer what the decision was computed from (or the
    /// backend turned the write away before it could commit): nothing was written. Read
    /// again ([`MutationStore::read_mutation_view`]) and decide again —
    /// [`decide_mutation`] does exactly that.
    Lost,
}

/// Durable mutation records (seed 000, docs/architecture.md §7), keyed `(run_id, tool_call_id,
/// approval_id)`. The store never decides a transition: [`tollgate_domain::execution`]
/// does, from a [`MutationView`], and [`MutationStore::commit_mutation`] writes the
/// [`Decision`] in one atomic step conditioned on exactly what it was computed from, or
/// reports it [`MutationCommit::Lost`].
#[async_trait]
pub trait MutationStore: Send + Sync + 'static {
    /// One record (strongly consistent).
    async fn read_mutation(
        &self,
        run_id: &str,
        tool_call_id: &str,
        approval_id: &str,
    ) -> Result<Option<MutationRecord>, StoreError>;

    /// A run's records by `(tool_call_id, approval_id)`, at most `limit` (capped at
    /// [`MAX_MUTATIONS_LISTED`] + 1, so a listing of the maximum can tell there is more).
    async fn list_mutations(
        &self,
        run_id: &str,
        limit: usize,
    ) -> Result<Vec<MutationRecord>, StoreError>;

    /// Every record of one tool call of a run, by `approval_id`.
    async fn tool_call_mutations(
        &self,
        run_id: &str,
        tool_call_id: &str,
    ) -> Result<Vec<MutationRecord>, StoreError>;

    /// The head and the tool call's attempts, read in the order that makes a decision on
    /// them safe (see [`MutationView`]). `None`: no such run.
    async fn read_mutation_view(
        &self,
        run_id: &str,
        tool_call_id: &str,
    ) -> Result<Option<MutationView>, StoreError>;

    /// Commits a decision whose `changed` is true, in one atomic step: its record, put
    /// only if the stored record is still `prior` (absent for a new attempt); its events
    /// appended on the run, only if the head is still exactly `head` and running; and
    /// for an admission (`usage`) the head's `budget_used` — so concurrent admissions are
    /// serialised by the sequence they all advance and can never exceed the budget. A
    /// decision without events or usage (a dispatch, a settlement on an ended run, a late
    /// settlement replacing the deadline's guess) writes the record alone. A decision
    /// that changed nothing writes nothing and answers `Written` with no sequences.
    /// `Conflict` when the decision does not belong to `head`/`prior` or carries events
    /// for an ended run (a caller bug).
    async fn commit_mutation(
        &self,
        head: &RunHead,
        prior: Option<&MutationRecord>,
        decision: &Decision,
    ) -> Result<MutationCommit, StoreError>;

    /// Execution heartbeat number `beat` (1, 2, …) of the attempt `(tool_call_id,
    /// approval_id)`: one sequenced `heartbeat` on its run while the record is
    /// `dispatched`, unsettled and before its settlement deadline, and the run running —
    /// conditioned on the head read in one snapshot with the record, so that no heartbeat
    /// can follow the settlement (which moves the head). The same `beat` again writes
    /// nothing and answers as [`ApprovalStore::heartbeat`] does.
    async fn execution_heartbeat(
        &self,
        run_id: &str,
        tool_call_id: &str,
        approval_id: &str,
        beat: u32,
    ) -> Result<Beat, StoreError>;

    /// Attempts still `intent` or `dispatched` whose settlement deadline is at or before
    /// `due_before`, soonest first, at most `limit` (the sweeper settles them as their
    /// lost deadline timer would have). On DynamoDB the listing comes from an eventually
    /// consistent index and may include an attempt that was just settled: callers act
    /// through the conditioned transition, never on this list alone.
    async fn overdue_attempts(
        &self,
        due_before: i64,
        limit: usize,
    ) -> Result<Vec<tollgate_domain::execution::MutationRecord>, StoreError>;

    /// Test support (the store contract): removes what retention may already have
    /// removed of the run's mutation items while its head is still readable — every item
    /// whose TTL is not later than the head's (DynamoDB deletes expired items in no
    /// particular order, late, and an append revives a head past its TTL). Nothing on a
    /// store whose records live and go with their run (the embedded store).
    #[doc(hidden)]
    async fn expire_mutations_with_head(&self, _run_id: &str) -> Result<(), StoreError> {
        Ok(())
    }
}

/// Checks a decision against the reads it claims to come from, before any adapter
/// writes it.
pub(crate) fn check_decision(
    head: &RunHead,
    prior: Option<&MutationRecord>,
    decision: &Decision,
) -> Result<(), StoreError> {
    let r = &decision.record;
    let conflict = |why: &str| Err(StoreError::Conflict(why.into()));
    if r.run_id != head.run_id {
        return conflict("the mutation record names another run than the head");
    }
    if let Some(p) = prior {
        if (&p.run_id, &p.tool_call_id, &p.approval_id)
            != (&r.run_id, &r.tool_call_id, &r.approval_id)
        {
            return conflict("the decision is about another attempt than the record read");
        }
    }
    if !decision.events.is_empty() && head.status.is_terminal() {
        return conflict("a decision on an ended run announces nothing");
    }
    if decision.events.len() > tollgate_domain::MAX_BATCH_EVENTS {
        return conflict("a decision announces too many events");
    }
    if decision.usage.is_some() && decision.events.is_empty() {
        return conflict("an admission is announced by tool_execution_started");
    }
    Ok(())
}

/// `<tool_call_id>#<approval_id>`: the record's sort key (ids never hold `#`, and `#`
/// sorts before every id character, so key order is `(tool_call_id, approval_id)` order).
pub fn mutation_key(tool_call_id: &str, approval_id: &str) -> String {
    format!("{tool_call_id}#{approval_id}")
}

/// A committed decision: what was decided from the final reads, and the sequences its
/// events got (empty when it wrote nothing or announced nothing).
#[derive(Debug, Clone, PartialEq)]
pub struct MutationOutcome {
    pub decision: Decision,
    pub sequences: Vec<u64>,
}

/// How long [`decide_mutation`] keeps re-reading and re-deciding after lost races.
pub const MUTATION_CONTENTION_BUDGET: std::time::Duration = std::time::Duration::from_secs(8);

/// The read–decide–commit loop of every execution transition: reads the
/// [`MutationView`] of `(run_id, tool_call_id)`, asks `decide` (a pure domain call such
/// as `execution::start` or `|v| Ok(execution::dispatch(v.record(..)?, ..))`) for the
/// decision, and commits it conditioned on exactly those reads — the view's head and the
/// view's record of `approval_id` — until it commits or the contention budget is spent
/// (`Unavailable`, nothing written). `decide` may refuse (`Err(E)`, answered as is, nothing
/// written). `NotFound`: no such run.
pub async fn decide_mutation<S, E, F>(
    store: &S,
    run_id: &str,
    tool_call_id: &str,
    approval_id: &str,
    mut decide: F,
) -> Result<Result<MutationOutcome, E>, StoreError>
where
    S: MutationStore + ?Sized,
    F: FnMut(&MutationView) -> Result<Decision, E> + Send,
    E: Send,
{
    let deadline = std::time::Instant::now() + MUTATION_CONTENTION_BUDGET;
    let mut attempt = 0u32;
    loop {
        let view = store
            .read_mutation_view(run_id, tool_call_id)
            .await?
            .ok_or(StoreError::NotFound)?;
        let decision = match decide(&view) {
            Ok(d) => d,
            Err(e) => return Ok(Err(e)),
        };
        if !decision.changed {
            return Ok(Ok(MutationOutcome {
                decision,
                sequences: Vec::new(),
            }));
        }
        let prior = view.record(approval_id);
        match store.commit_mutation(&view.head, prior, &decision).await? {
            MutationCommit::Written { sequences } => {
                return Ok(Ok(MutationOutcome {
                    decision,
                    sequences,
                }))
            }
            MutationCommit::Lost => {
                if std::time::Instant::now() >= deadline {
                    return Err(StoreError::Unavailable(
                        "a mutation transition kept losing to concurrent writers; retry".into(),
                    ));
                }
                attempt += 1;
                let cap = 2u64 << attempt.min(4);
                let ms = rand::Rng::random_range(&mut rand::rng(), 1..=cap);
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            }
        }
    }
}

/// Everything a deployment stores: the run log, the approval cards and the mutation
/// records, on one backend.
pub trait Store: RunStore + ApprovalStore + MutationStore + DeliveryStore {}
impl<T: RunStore + ApprovalStore + MutationStore + DeliveryStore> Store for T {}

/// Checks a batch before any adapter touches storage: 1..=99 events, no `event_id` twice.
pub fn check_batch(events: &[EventDraft]) -> Result<(), StoreError> {
    if events.is_empty() || events.len() > tollgate_domain::MAX_BATCH_EVENTS {
        return Err(StoreError::Invalid(format!(
            "a batch holds 1 to {} events, got {}",
            tollgate_domain::MAX_BATCH_EVENTS,
            events.len()
        )));
    }
    let mut seen = std::collections::HashSet::new();
    for id in events.iter().filter_map(|e| e.event_id.as_deref()) {
        if !seen.insert(id) {
            return Err(StoreError::Invalid(format!(
                "event_id {id:?} appears twice in one batch"
            )));
        }
    }
    Ok(())
}

/// `finish_run` on a run that has already ended: the same end repeated answers its
/// terminal sequence; a different end is refused.
pub(crate) fn ended_run_answer(head: &RunHead, kind: TerminalKind) -> Result<Finished, StoreError> {
    let terminal_seq = head.terminal_seq.unwrap_or(head.last_sequence());
    if head.status == kind.status() {
        Ok(Finished {
            sequence: terminal_seq,
            already_finished: true,
            // A repeat completes what a stop right after the end left.
            open_cards: head.open_cards,
        })
    } else {
        Err(StoreError::RunTerminal {
            status: head.status,
            terminal_seq,
        })
    }
}

/// Takes events into a page until `limit` or the byte cap; reports whether more remain.
pub(crate) fn fill_page(mut events: impl Iterator<Item = StoredEvent>, limit: usize) -> EventPage {
    let mut page = EventPage::default();
    let mut bytes = 0usize;
    for event in events.by_ref() {
        let full = page.events.len() >= limit
            || (!page.events.is_empty() && bytes + event.body.len() > MAX_PAGE_BYTES);
        if full {
            page.has_more = true;
            return page;
        }
        bytes += event.body.len();
        page.events.push(event);
    }
    page
}
