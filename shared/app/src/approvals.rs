//! The approval gate's use-cases (seed 003, docs/architecture.md §6), shared by every entry point: the HTTP
//! handlers (arm, decide), the timer handler (expiry, heartbeats — SQS in AWS, the
//! embedded queue in `tollgate serve`) and the sweeper. They take narrow ports — the
//! [`Store`] and a [`TimerQueue`] — and no HTTP or AWS types.

use std::sync::Arc;
use std::time::Duration;

use tollgate_domain::approval::{covering_keys, scope_key, CoordinatorReach};
use tollgate_domain::execution::ExecutionSettings;
use tollgate_domain::{
    now_millis, ApprovalRequest, Policy, Reach, Resolution, RunHead, RunKind, Scope,
};
use tollgate_store::{Armed, Beat, Located, Resolved, RunRef, Store, StoreError};
use tollgate_timers::{TimerError, TimerHandler, TimerMessage, TimerQueue};

/// Overdue cards one sweep expires at once.
const SWEEP_CONCURRENCY: usize = 16;

/// When the revocation backstop checks that every reached stream was told.
const REVOCATION_BACKSTOP: Duration = Duration::from_secs(60);

/// Default of `TOLLGATE_MAX_OPEN_CARDS_PER_PROJECT`.
pub const DEFAULT_MAX_OPEN_CARDS_PER_PROJECT: u64 = 2000;

/// Default of `TOLLGATE_MAX_CARD_TIMEOUT_SECONDS` (24 h).
pub const DEFAULT_MAX_CARD_TIMEOUT_SECONDS: u64 = 24 * 3600;

/// Knobs of the gate, read once at start-up.
#[derive(Debug, Clone)]
pub struct GateConfig {
    /// `TOLLGATE_HEARTBEAT_SECONDS` (default 20): `tool.approval_pending` cadence.
    pub heartbeat_every: Duration,
    /// `TOLLGATE_ALWAYS_ELIGIBLE_TOOLS` (comma-separated, default `web_fetch`): the only
    /// tools an `always` scope may be granted for.
    pub always_eligible: Vec<String>,
    /// `TOLLGATE_SWEEP_SECONDS` (default 60): how often `tollgate serve` expires overdue
    /// cards whose timer was lost (deployed, the `stall-watch` schedule does).
    pub sweep_every: Duration,
    /// `TOLLGATE_STALL_TIMEOUT_SECONDS` (default 300): how long a child may stay silent
    /// (heartbeats count) before its coordinator is told it stalled.
    pub stall_timeout: Duration,
    /// `TOLLGATE_STALL_ACTION` (`fail`, the default, or `report`): whether a stalled child
    /// is failed as `agent_stall_timeout` (seed 003) or only reported.
    pub stall_action: tollgate_domain::StallAction,
    /// Approved execution: `TOLLGATE_SETTLEMENT_DEADLINE_SECONDS` (default 60) and
    /// `TOLLGATE_EXECUTION_HEARTBEAT_SECONDS` (default 15).
    pub execution: ExecutionSettings,
    /// `TOLLGATE_AGENTHOST_TIMEOUT_SECONDS` (default 10): how long a decision forwarded
    /// to a run's AgentHost pod waits for its answer.
    pub forward_timeout: Duration,
    /// `TOLLGATE_ALLOW_LOOPBACK_ORIGINS=1`: pods may be reached over plain http on
    /// loopback (local pods and tests; never in a deployment).
    pub allow_loopback_origins: bool,
    /// `TOLLGATE_MAX_OPEN_CARDS_PER_PROJECT` (default 2000): pending cards one project
    /// (runs without a project: one more tenant) may hold; arming beyond is a 429.
    pub max_open_cards_per_project: u64,
    /// `TOLLGATE_MAX_CARD_TIMEOUT_SECONDS` (default 86400, at most 7 days): the longest
    /// `timeout_seconds` a card may ask for; beyond is a 400.
    pub max_timeout_seconds: u64,
}

impl Default for GateConfig {
    fn default() -> Self {
        Self {
            heartbeat_every: Duration::from_secs(20),
            sweep_every: Duration::from_secs(60),
            stall_timeout: Duration::from_secs(300),
            stall_action: tollgate_domain::StallAction::Fail,
            always_eligible: vec!["web_fetch".into()],
            execution: ExecutionSettings::default(),
            forward_timeout: Duration::from_secs(10),
            allow_loopback_origins: false,
            max_open_cards_per_project: DEFAULT_MAX_OPEN_CARDS_PER_PROJECT,
            max_timeout_seconds: DEFAULT_MAX_CARD_TIMEOUT_SECONDS,
        }
    }
}

impl GateConfig {
    pub fn from_env() -> Result<Self, crate::ConfigError> {
        let mut config = Self::default();
        if let Some(d) = positive_seconds("TOLLGATE_HEARTBEAT_SECONDS")? {
            config.heartbeat_every = d;
        }
        if let Some(d) = positive_seconds("TOLLGATE_SWEEP_SECONDS")? {
            config.sweep_every = d;
        }
        if let Some(d) = positive_seconds("TOLLGATE_STALL_TIMEOUT_SECONDS")? {
            config.stall_timeout = d;
        }
        if let Some(v) = std::env::var("TOLLGATE_STALL_ACTION")
            .ok()
            .filter(|v| !v.is_empty())
        {
            config.stall_action = tollgate_domain::StallAction::parse(&v).ok_or_else(|| {
                crate::ConfigError::Invalid("TOLLGATE_STALL_ACTION must be fail or report".into())
            })?;
        }
        if let Some(d) = positive_seconds("TOLLGATE_SETTLEMENT_DEADLINE_SECONDS")? {
            config.execution.settlement_deadline_ms = millis(d);
        }
        if let Some(d) = positive_seconds("TOLLGATE_EXECUTION_HEARTBEAT_SECONDS")? {
            config.execution.heartbeat_interval_ms = millis(d);
        }
        if let Some(d) = positive_seconds("TOLLGATE_AGENTHOST_TIMEOUT_SECONDS")? {
            config.forward_timeout = d;
        }
        if let Some(n) = positive_integer("TOLLGATE_MAX_OPEN_CARDS_PER_PROJECT", u64::MAX - 1)? {
            config.max_open_cards_per_project = n;
        }
        if let Some(n) = positive_integer(
            "TOLLGATE_MAX_CARD_TIMEOUT_SECONDS",
            tollgate_domain::approval::MAX_TIMEOUT_SECONDS,
        )? {
            config.max_timeout_seconds = n;
        }
        config.allow_loopback_origins =
            std::env::var("TOLLGATE_ALLOW_LOOPBACK_ORIGINS").is_ok_and(|v| v == "1" || v == "true");
        if let Ok(v) = std::env::var("TOLLGATE_ALWAYS_ELIGIBLE_TOOLS") {
            config.always_eligible = v
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect();
        }
        Ok(config)
    }
}

/// A duration setting in (possibly fractional) seconds; `None` when unset or empty.
fn positive_seconds(var: &str) -> Result<Option<Duration>, crate::ConfigError> {
    let Some(v) = std::env::var(var).ok().filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let secs: f64 = v
        .parse()
        .ok()
        .filter(|s: &f64| *s > 0.0 && *s <= 86_400.0 * 365.0)
        .ok_or_else(|| crate::ConfigError::Invalid(format!("{var} must be a positive number")))?;
    Ok(Some(Duration::from_secs_f64(secs)))
}

/// A whole number setting in `1..=max`; `None` when unset or empty.
fn positive_integer(var: &str, max: u64) -> Result<Option<u64>, crate::ConfigError> {
    let Some(v) = std::env::var(var).ok().filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    v.parse()
        .ok()
        .filter(|n: &u64| (1..=max).contains(n))
        .map(Some)
        .ok_or_else(|| {
            crate::ConfigError::Invalid(format!("{var} must be a whole number 1 to {max}"))
        })
}

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// The gate: cards, their timers, their decisions.
pub struct Gate {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) timers: Arc<dyn TimerQueue>,
    pub(crate) config: GateConfig,
}

/// What arming a gate did.
// One per arm request, moved once into its answer: boxing the card would buy nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum ArmOutcome {
    /// A card (new, or the one a retry finds).
    Card(Armed),
    /// The `request_id` is taken by a card for another call (tool, ids, arguments, URL
    /// or text differ): nothing was written or sent (409).
    OtherCall(ApprovalRequest),
    /// A live policy covered it: `tool.auto_approved` at `sequence`; its card is stored
    /// already approved (no operator ever sees it pending).
    AutoApproved { sequence: u64, policy: Policy },
}

impl Gate {
    pub fn new(store: Arc<dyn Store>, timers: Arc<dyn TimerQueue>, config: GateConfig) -> Self {
        Self {
            store,
            timers,
            config,
        }
    }

    pub fn config(&self) -> &GateConfig {
        &self.config
    }

    /// Arms a card on `head`'s run (the caller read the head; `incarnation` is the run
    /// token's). On a child run the card is mirrored on its coordinator. Then the expiry
    /// and the first heartbeat are scheduled; if that fails the card still expires (the
    /// sweeper finds overdue cards), so the arm itself stands.
    pub async fn arm(
        &self,
        head: &RunHead,
        incarnation: &str,
        mut card: ApprovalRequest,
    ) -> Result<ArmOutcome, StoreError> {
        card.run_id = head.run_id.clone();
        card.project_id = head.project_id.clone();
        card.subtask_id = head.subtask_id.clone();
        card.coordinator_run_id = match head.kind {
            RunKind::Child => head.parent_run_id.clone(),
            _ => None,
        };
        let run = RunRef::exact(&head.run_id, incarnation);
        // A card already armed (a retry) answers as it stands, even if a policy came since;
        // so does a gate a policy approved (its card is stored `approved` with
        // `tool.auto_approved`), even if the policy was revoked since.
        if let Some(existing) = self.store.read_card(&head.run_id, &card.request_id).await? {
            // The same request id for another call is refused before anything else: the
            // card's decision answers its own call only.
            if !existing.same_call_as(&card) {
                return Ok(ArmOutcome::OtherCall(existing));
            }
            // The first call's timers could not be sent (it cleared the card's mark): a
            // repeat sends the expiry again — only the repeat that wins the conditional
            // mark. While the mark stands nothing is re-sent, however often or late the
            // arm is repeated: a card has one expiry chain, never one per repeat. (Should
            // a process stop between the arm's commit and its send, the mark stands with
            // no chain behind it: the sweeper expires the card, at most a sweep late, and
            // it has no heartbeats — fail-safe, never an approval.) Not the heartbeat: a
            // second chain would double its reads.
            // (The mark failing to write is no reason to fail the repeat: it answers the
            // card as it stands and sends nothing.)
            if existing.state == tollgate_domain::ApprovalState::Pending
                && self
                    .store
                    .claim_timer_resend(&existing.run_id, &existing.request_id)
                    .await
                    .unwrap_or_else(|e| {
                        tracing::warn!(error = %e, request_id = %existing.request_id, "timer re-send not claimed");
                        false
                    })
            {
                let (_, sent) = self.schedule_expiry(&existing).await;
                if !sent {
                    self.clear_timer_mark(&existing).await;
                }
            }
            return Ok(ArmOutcome::Card(Armed::Existing(existing)));
        }
        // A pod asks a human only when its own bridges did not cover the call: no policy
        // is looked up for the cards it announces (docs/architecture.md §8).
        let policy = if card.held_by_pod {
            None
        } else {
            let coordinator = self.coordinator_of(head).await?;
            let keys = covering_keys(
                &reach(head, coordinator.as_ref()),
                self.always_eligible(&card.tool_name),
            );
            self.store.find_policy(&keys, &card.tool_name).await?
        };
        if let Some(policy) = policy {
            match self.store.auto_approve(run, &card, &policy).await {
                Ok(sequence) => return Ok(ArmOutcome::AutoApproved { sequence, policy }),
                // Revoked meanwhile: a human decides after all.
                Err(StoreError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        let armed = self
            .store
            .arm_within(run, card, self.config.max_open_cards_per_project)
            .await?;
        if let Armed::Created { card, .. } = &armed {
            if !self.schedule_timers(card).await {
                // The card stands (the sweeper expires it); a repeat sends its expiry.
                self.clear_timer_mark(card).await;
            }
        }
        Ok(ArmOutcome::Card(armed))
    }

    pub fn always_eligible(&self, tool_name: &str) -> bool {
        crate::access::is_always_eligible(tool_name, &self.config.always_eligible)
    }

    /// The parent coordinator's head, for a child run.
    async fn coordinator_of(&self, head: &RunHead) -> Result<Option<RunHead>, StoreError> {
        match (&head.kind, &head.parent_run_id) {
            (RunKind::Child, Some(parent)) => self.store.read_head(parent).await,
            _ => Ok(None),
        }
    }

    /// The policy an approval with `scope` by `by` grants on a located card (`None` for
    /// `once`, or when its run is gone). Reads nothing: the reach comes from the heads
    /// [`Gate::locate`] read with the card.
    pub fn grant_for(&self, located: &Located, scope: Scope, by: &str) -> Option<Policy> {
        if scope == Scope::Once {
            return None;
        }
        let card = &located.card;
        let head = located.head.as_ref().filter(|h| h.run_id == card.run_id)?;
        let coordinator = located
            .coordinator
            .as_ref()
            .filter(|c| head.parent_run_id.as_deref() == Some(c.run_id.as_str()));
        let key = scope_key(scope, &reach(head, coordinator))?;
        Some(Policy {
            scope,
            scope_key: key,
            tool_name: card.tool_name.clone(),
            owner: head.owner.clone(),
            project_id: head.project_id.clone(),
            origin_run_id: card.run_id.clone(),
            request_id: card.request_id.clone(),
            granted_by: by.to_owned(),
            granted_at: now_millis(),
            revoked_by: None,
            revoked_at: None,
            reached_runs: vec![card.run_id.clone()],
        })
    }

    /// Lets the next repeated arm send the card's timers at once (they could not be
    /// sent now). Best effort: should this fail too, a repeat after the window sends them,
    /// and the sweeper expires the card regardless.
    async fn clear_timer_mark(&self, card: &ApprovalRequest) {
        if let Err(e) = self
            .store
            .clear_timer_mark(&card.run_id, &card.request_id)
            .await
        {
            tracing::warn!(error = %e, request_id = %card.request_id, "timer mark not cleared");
        }
    }

    /// Sends the card's expiry; the time until it is due, and whether it was sent.
    async fn schedule_expiry(&self, card: &ApprovalRequest) -> (Duration, bool) {
        let expiry = TimerMessage::ApprovalExpiry {
            run_id: card.run_id.clone(),
            request_id: card.request_id.clone(),
            due_at_millis: card.expires_at,
        };
        let until_due = Duration::from_millis((card.expires_at - now_millis()).max(0) as u64);
        if let Err(e) = self.timers.schedule(&expiry, until_due).await {
            tracing::error!(error = %e, request_id = %card.request_id, "expiry not scheduled; the sweeper will expire the card");
            return (until_due, false);
        }
        (until_due, true)
    }

    /// Sends the expiry and the first heartbeat; whether the expiry was sent.
    async fn schedule_timers(&self, card: &ApprovalRequest) -> bool {
        let (until_due, sent) = self.schedule_expiry(card).await;
        // A pod-held card's heartbeats come from its pod.
        if !card.held_by_pod && self.config.heartbeat_every < until_due {
            let beat = heartbeat(card, 1);
            if let Err(e) = self
                .timers
                .schedule(&beat, self.config.heartbeat_every)
                .await
            {
                tracing::warn!(error = %e, request_id = %card.request_id, "heartbeat not scheduled");
            }
        }
        sent
    }

    /// The card a decision posted to `run_id` means — the run's own card, else the one
    /// the coordinator's route leads to — with the heads the decision writes, read
    /// together. `None`: unknown (404 `state: "unknown"`).
    pub async fn locate(
        &self,
        run_id: &str,
        request_id: &str,
    ) -> Result<Option<Located>, StoreError> {
        self.store.locate(run_id, request_id).await
    }

    /// [`Gate::locate`] from storage, not from what this process remembers: to judge
    /// again a decision refused on a remembered card.
    pub async fn locate_fresh(
        &self,
        run_id: &str,
        request_id: &str,
    ) -> Result<Option<Located>, StoreError> {
        self.store.locate_fresh(run_id, request_id).await
    }

    /// Decides (or expires, when late) a located card; an approval with a scope beyond
    /// `once` writes its policy in the same step, only if it wins. One write: the reads
    /// were [`Gate::locate`]'s.
    pub async fn resolve(
        &self,
        located: Located,
        resolution: Resolution,
    ) -> Result<Resolved, StoreError> {
        let grant = match &resolution {
            Resolution::Approved { scope, by, .. }
                if located.card.state == tollgate_domain::ApprovalState::Pending =>
            {
                self.grant_for(&located, *scope, by)
            }
            _ => None,
        };
        self.store
            .resolve_located(located, resolution, now_millis(), grant)
            .await
    }

    /// Withdraws a pending card of the running run `run_id` on its agent's word: it ends
    /// `expired` with reason `withdrawn` and its `tool.approval_resolved` (and the
    /// coordinator's mirror), in one transaction like any decision. A card that already
    /// ended answers as it stands; `None` when there is no such card. A card its pod
    /// holds is the pod's to end (refused by the caller).
    pub async fn withdraw(
        &self,
        run_id: &str,
        request_id: &str,
    ) -> Result<Option<Resolved>, StoreError> {
        match self
            .store
            .resolve(
                run_id,
                request_id,
                Resolution::Withdrawn,
                now_millis(),
                None,
            )
            .await
        {
            Ok(resolved) => Ok(Some(resolved)),
            Err(StoreError::NotFound) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Ends a located card as `resolution` asks (or as its run and deadline say) with no
    /// policy, whatever its scope: a pod's report of how it had ended its own card.
    pub async fn resolve_without_grant(
        &self,
        located: Located,
        resolution: Resolution,
    ) -> Result<Resolved, StoreError> {
        self.store
            .resolve_located(located, resolution, now_millis(), None)
            .await
    }

    /// Revokes a policy and announces it on the streams it reached. A backstop timer is
    /// sent first: should this call stop after revoking but before every stream was told,
    /// the timer completes the announcements (it does nothing for a policy still live).
    pub async fn revoke(
        &self,
        scope_key: &str,
        tool_name: &str,
        by: &str,
    ) -> Result<Option<Policy>, StoreError> {
        let backstop = TimerMessage::PolicyRevocation {
            policy_id: tollgate_domain::approval::policy_id(scope_key, tool_name),
        };
        if let Err(e) = self.timers.schedule(&backstop, REVOCATION_BACKSTOP).await {
            // Revoking still goes ahead (it only narrows what is approved); a repeat of
            // the call completes any announcement that does not land now.
            tracing::warn!(error = %e, "revocation backstop not scheduled");
        }
        self.store
            .revoke_policy(scope_key, tool_name, by, now_millis())
            .await
    }

    /// Expires every pending card whose deadline has passed (timers that were lost);
    /// returns how many this call expired.
    pub async fn sweep(&self, limit: usize) -> Result<usize, StoreError> {
        let now = now_millis();
        let overdue = self.store.open_cards(None, Some(now), limit).await?;
        // A backlog after an outage clears in one tick; a card that cannot be expired now
        // (throttling, contention) does not hold up the others: the next sweep retries it.
        self.end_each(
            overdue,
            Resolution::Expired,
            now,
            "overdue card not expired; next sweep retries",
        )
        .await
    }

    /// Ends each of `cards` with `resolution` at `now` ([`SWEEP_CONCURRENCY`] at a time);
    /// counts the ones this call ended. A card that cannot be ended now is logged with
    /// `failed` and does not hold up the others.
    async fn end_each(
        &self,
        cards: Vec<ApprovalRequest>,
        resolution: Resolution,
        now: i64,
        failed: &'static str,
    ) -> Result<usize, StoreError> {
        let store = self.store.clone();
        each_concurrently(cards, failed, move |card| {
            let (store, resolution) = (store.clone(), resolution.clone());
            async move {
                match store
                    .resolve(&card.run_id, &card.request_id, resolution, now, None)
                    .await
                {
                    Ok(Resolved::Fresh(_)) => Ok(true),
                    Ok(_) | Err(StoreError::NotFound) => Ok(false),
                    Err(e) => Err((card.request_id, e)),
                }
            }
        })
        .await
    }

    /// Settles the execution attempts past their settlement deadline that nobody
    /// settled — their deadline timer (and the heartbeat chain's backstop) was lost —
    /// exactly as the timer would: an undispatched intent `not_executed` (`unsent`), a
    /// dispatched one `outcome_unknown`. At most `limit` per call, soonest deadline first
    /// (the rest wait for the next sweep); returns how many this call settled.
    pub async fn sweep_settlements(self: &Arc<Self>, limit: usize) -> Result<usize, StoreError> {
        let overdue = self.store.overdue_attempts(now_millis(), limit).await?;
        let gate = self.clone();
        each_concurrently(
            overdue,
            "overdue attempt not settled; next sweep retries",
            move |record| {
                let gate = gate.clone();
                async move {
                    gate.settle_if_due(
                        &record.run_id,
                        &record.tool_call_id,
                        &record.approval_id,
                        false,
                    )
                    .await
                    .map_err(|e| {
                        (
                            format!("{}/{}", record.run_id, record.tool_call_id),
                            StoreError::Unavailable(e.to_string()),
                        )
                    })
                }
            },
        )
        .await
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Ends each pending card of the running run `run_id` as `run_ended`, one at a time
    /// (each transaction appends on the run's head, so concurrent ones would only
    /// contend), each with its resolution event on the run and its coordinator; counts
    /// the ones this call ended. A card a decision ended first is that decision's. Any
    /// failure stops here: the run's end is refused until every card is announced.
    pub(crate) async fn end_cards_before_end(&self, run_id: &str) -> Result<usize, StoreError> {
        let mut ended = 0;
        for card in self.store.pending_cards(run_id).await? {
            match self
                .store
                .resolve(
                    run_id,
                    &card.request_id,
                    Resolution::RunEnded,
                    now_millis(),
                    None,
                )
                .await
            {
                Ok(Resolved::Fresh(_)) => ended += 1,
                Ok(_) | Err(StoreError::NotFound) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(ended)
    }

    /// Ends the pending cards of a run that has ended (`expired`, reason `run_ended`, no
    /// event on the run; its running coordinator is told): only cards a run ended with
    /// before its end announced them, found again when a client repeats the end. Until
    /// then such a card can still be listed, but nothing can approve it: any decision
    /// on it ends it as `run_ended` (fail closed).
    pub async fn end_cards_of(&self, run_id: &str) -> Result<usize, StoreError> {
        let pending = self.store.pending_cards(run_id).await?;
        self.end_each(
            pending,
            Resolution::RunEnded,
            now_millis(),
            "card of an ended run not ended; a decision or its expiry ends it",
        )
        .await
    }

    /// The coordinator stall guard (seed 003): every silent child that
    /// [`tollgate_domain::is_stalled`] judges stalled, holding no pending card, gets one
    /// `coordinator.child_stall_detected` on its coordinator and — unless
    /// `TOLLGATE_STALL_ACTION=report` — is failed as `agent_stall_timeout` in the same
    /// transaction; returns how many coordinators were told.
    pub async fn stall_guard(&self, limit: usize) -> Result<usize, StoreError> {
        let now = now_millis();
        let timeout = self.config.stall_timeout.as_millis() as i64;
        let check = tollgate_domain::StallCheck {
            now,
            timeout_ms: timeout,
            action: self.config.stall_action,
        };
        let stalled: Vec<RunHead> = self
            .store
            .silent_children(now - timeout, limit)
            .await?
            .into_iter()
            .filter(|child| tollgate_domain::is_stalled(child, now, timeout))
            .collect();
        // One child that cannot be reported now does not hold up the others.
        let store = self.store.clone();
        each_concurrently(
            stalled,
            "stall not reported; next run retries",
            move |child| {
                let store = store.clone();
                async move {
                    match store.report_stall(&child, &check).await {
                        Ok(found) => Ok(found.is_some()),
                        Err(e) => Err((child.run_id, e)),
                    }
                }
            },
        )
        .await
    }

    /// Sweeps every `sweep_every` in this process until the gate is dropped (`tollgate
    /// serve`; deployed stacks sweep on the `stall-watch` schedule).
    pub fn spawn_sweeper(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let gate = Arc::downgrade(self);
        let every = self.config.sweep_every;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(gate) = gate.upgrade() else { return };
                match gate.sweep(500).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(expired = n, "swept overdue approval cards"),
                    Err(e) => tracing::warn!(error = %e, "sweep failed; next tick retries"),
                }
                match gate.sweep_settlements(500).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(settled = n, "settled overdue execution attempts"),
                    Err(e) => {
                        tracing::warn!(error = %e, "settlement sweep failed; next tick retries")
                    }
                }
                match gate.stall_guard(500).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(stalled = n, "reported stalled children"),
                    Err(e) => tracing::warn!(error = %e, "stall guard failed; next tick retries"),
                }
            }
        })
    }
}

/// Runs `work` on every item, [`SWEEP_CONCURRENCY`] at a time; counts the items it did
/// something for (`Ok(true)`). A failure (`Err((label, error))`) is logged with `failed`
/// and does not stop the others; the first is answered only when nothing was done.
async fn each_concurrently<T, F, Fut>(
    items: Vec<T>,
    failed: &'static str,
    work: F,
) -> Result<usize, StoreError>
where
    T: Send + 'static,
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = Result<bool, (String, StoreError)>> + Send + 'static,
{
    let mut done = 0;
    let mut first_error = None;
    let mut items = items.into_iter().peekable();
    while items.peek().is_some() {
        let mut running = tokio::task::JoinSet::new();
        for item in items.by_ref().take(SWEEP_CONCURRENCY) {
            running.spawn(work(item));
        }
        while let Some(joined) = running.join_next().await {
            match joined {
                Ok(Ok(true)) => done += 1,
                Ok(Ok(false)) => {}
                Ok(Err((label, e))) => {
                    tracing::warn!(error = %e, item = %label, "{failed}");
                    first_error.get_or_insert(e);
                }
                Err(e) => {
                    first_error.get_or_insert(StoreError::Unavailable(format!("task: {e}")));
                }
            }
        }
    }
    match first_error {
        Some(e) if done == 0 => Err(e),
        _ => Ok(done),
    }
}

fn reach<'a>(head: &'a RunHead, coordinator: Option<&'a RunHead>) -> Reach<'a> {
    Reach {
        run_id: &head.run_id,
        incarnation: &head.incarnation,
        owner: head.owner.as_deref(),
        project_id: head.project_id.as_deref(),
        principal: &head.created_by,
        coordinator: coordinator
            .filter(|_| head.kind == RunKind::Child)
            .map(|c| CoordinatorReach {
                run_id: &c.run_id,
                incarnation: &c.incarnation,
                owner: c.owner.as_deref(),
                principal: &c.created_by,
            }),
    }
}

fn heartbeat(card: &ApprovalRequest, beat: u32) -> TimerMessage {
    TimerMessage::ApprovalHeartbeat {
        run_id: card.run_id.clone(),
        request_id: card.request_id.clone(),
        beat,
    }
}

fn unavailable(e: StoreError) -> TimerError {
    TimerError::Unavailable(e.to_string())
}

#[async_trait::async_trait]
impl TimerHandler for Gate {
    async fn handle(&self, message: TimerMessage) -> Result<(), TimerError> {
        let now = now_millis();
        if let Some(rest) = message.remaining_delay(now) {
            // Arrived early (SQS delays stop at 15 minutes): wait for the rest — but an
            // expiry hops on only while its card is still pending, so a card decided (or
            // its run ended) stops its chain at the next hop instead of at its deadline.
            if let TimerMessage::ApprovalExpiry {
                run_id, request_id, ..
            } = &message
            {
                match self.store.read_card(run_id, request_id).await {
                    Ok(Some(card)) if card.state == tollgate_domain::ApprovalState::Pending => {}
                    Ok(_) => return Ok(()),
                    Err(e) => return Err(unavailable(e)),
                }
            }
            return self.timers.schedule(&message, rest).await;
        }
        match message {
            TimerMessage::ApprovalExpiry {
                run_id, request_id, ..
            } => match self
                .store
                .resolve(&run_id, &request_id, Resolution::Expired, now, None)
                .await
            {
                Ok(_) | Err(StoreError::NotFound) => Ok(()),
                Err(e) => Err(unavailable(e)),
            },
            TimerMessage::ApprovalHeartbeat {
                run_id,
                request_id,
                beat,
            } => match self.store.heartbeat(&run_id, &request_id, beat).await {
                Ok(Beat::Emitted(_)) => {
                    // The next one; it stops by itself once the card has ended (no read of
                    // the card here: heartbeats are the most frequent write).
                    let next = TimerMessage::ApprovalHeartbeat {
                        run_id,
                        request_id,
                        beat: beat + 1,
                    };
                    self.timers
                        .schedule(&next, self.config.heartbeat_every)
                        .await
                }
                // A late redelivery of a chain that carried on (its next beat is
                // written): a second chain is not started (it would double every later
                // beat's reads and messages).
                Ok(Beat::Repeated(_)) | Ok(Beat::Stopped) => Ok(()),
                Err(e) => Err(unavailable(e)),
            },
            TimerMessage::SettlementDeadline {
                run_id,
                tool_call_id,
                approval_id,
                ..
            } => {
                self.settlement_deadline(&run_id, &tool_call_id, &approval_id)
                    .await
            }
            TimerMessage::ExecutionHeartbeat {
                run_id,
                tool_call_id,
                approval_id,
                beat,
            } => {
                self.execution_beat(&run_id, &tool_call_id, &approval_id, beat)
                    .await
            }
            TimerMessage::PolicyRevocation { policy_id } => {
                let Some((scope_key, tool_name)) =
                    tollgate_domain::approval::parse_policy_id(&policy_id)
                else {
                    tracing::warn!(%policy_id, "revocation backstop for a malformed policy id");
                    return Ok(());
                };
                self.store
                    .announce_revocation(&scope_key, &tool_name)
                    .await
                    .map(|_| ())
                    .map_err(unavailable)
            }
        }
    }
}
