//! The notifier (docs/architecture.md §10): turns card events into deliveries, once per
//! (sink, project, run, card, kind).
//!
//! For each sink that wants a notice, the delivery record is created with a conditional
//! write *before* anything is sent, holding a lease; whoever loses that write (another
//! notifier instance, a redelivered stream record, a second `serve` process) sends
//! nothing. The winner delivers and records the outcome on the version it wrote: sent
//! (with the sink's memo), due again after an exponential, jittered backoff, or a dead
//! letter after [`RetryPolicy::max_attempts`] or a permanent refusal. Due retries are
//! claimed the same way ([`Notifier::retry_due`]). A delivery is sent twice only if its
//! sender died between sending and recording (the lease then runs out and it is sent
//! again, with the same `delivery_id`).
//!
//! Fair between projects: a receiver's rate limit ([`DeliveryError::Throttled`]) pauses
//! that project's notices to the sink in this process and counts towards no delivery's
//! dead letter; notices that
//! arrive during the pause wait, each project's spaced [`FAIR_SPACING`] apart, and each
//! retry pass takes a bounded share of the due ones, the projects taking turns — so one
//! project's flood neither spends another's attempts nor keeps its notices waiting
//! behind the whole flood.

use std::sync::Arc;
use std::time::Duration;

use tollgate_domain::event::types as ev;
use tollgate_domain::now_millis;
use tollgate_store::{Delivery, DeliveryState, Store, StoreError, StoredEvent};

use super::{delivery_key, CardNotice, DeliveryError, NoticeKind, Sink};

/// The event types the notifier reads (the Lambda mapping's filter names the same).
pub const CARD_EVENT_TYPES: [&str; 2] = [ev::APPROVAL_REQUIRED, ev::APPROVAL_RESOLVED];

/// How deliveries are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts before a delivery becomes a dead letter.
    pub max_attempts: u32,
    /// The first retry's delay; each next one doubles, up to `max_delay`, jittered.
    pub base_delay: Duration,
    pub max_delay: Duration,
    /// How long a claimed delivery is left to its sender before another may take it
    /// (well above a sink's own time limit).
    pub lease: Duration,
    /// A pending delivery for a sink this notifier does not have, created longer ago
    /// than this, is a dead letter ("no notifier has the sink configured"): its sink was
    /// removed, or every process that has it has been gone this long. Younger ones are
    /// left to the processes that have the sink, and once overdue by
    /// [`RetryPolicy::stray_grace`] put off by as much, out of the due ones.
    pub stray_after: Duration,
    /// A delivery still rate limited ([`DeliveryError::Throttled`]) this long after it
    /// was created is a dead letter: rate limits alone never count towards
    /// `max_attempts`, so one project's flood cannot spend another's attempts.
    pub throttled_for: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 6,
            base_delay: Duration::from_secs(2),
            max_delay: Duration::from_secs(15 * 60),
            lease: Duration::from_secs(60),
            stray_after: Duration::from_secs(24 * 3600),
            throttled_for: Duration::from_secs(24 * 3600),
        }
    }
}

impl RetryPolicy {
    /// The defaults, with `TOLLGATE_NOTIFY_MAX_ATTEMPTS` and
    /// `TOLLGATE_NOTIFY_RETRY_BASE_MS` when set.
    pub fn from_env() -> Result<Self, crate::ConfigError> {
        let mut policy = Self::default();
        let num = |name: &str| -> Result<Option<u64>, crate::ConfigError> {
            match std::env::var(name).ok().filter(|v| !v.is_empty()) {
                None => Ok(None),
                Some(v) => match v.parse::<u64>() {
                    Ok(n) if n > 0 => Ok(Some(n)),
                    _ => Err(crate::ConfigError::Invalid(format!(
                        "{name} must be a positive integer"
                    ))),
                },
            }
        };
        if let Some(n) = num("TOLLGATE_NOTIFY_MAX_ATTEMPTS")? {
            policy.max_attempts = n.min(100) as u32;
        }
        if let Some(ms) = num("TOLLGATE_NOTIFY_RETRY_BASE_MS")? {
            policy.base_delay = Duration::from_millis(ms);
        }
        if let Some(s) = num("TOLLGATE_NOTIFY_STRAY_AFTER_SECONDS")? {
            // At least an hour: a process with a short horizon would otherwise dead-letter
            // the deliveries of another process's healthy sink between its retry passes.
            policy.stray_after = Duration::from_secs(s.max(MIN_STRAY_AFTER_SECONDS));
        }
        Ok(policy)
    }

    /// How long a due delivery of a sink this notifier does not have is left to the
    /// processes that have it before it is put off (and by how much): a tenth of
    /// [`RetryPolicy::stray_after`], at most 10 minutes — many retry passes of a process
    /// with the sink.
    pub fn stray_grace(&self) -> Duration {
        (self.stray_after / 10).min(Duration::from_secs(600))
    }

    /// How long a delivery put off before (and untouched since) stays among the due ones
    /// when it comes due again, for a process with its sink to claim: [`STRAY_WINDOW`],
    /// at most the grace.
    pub fn stray_window(&self) -> Duration {
        STRAY_WINDOW.min(self.stray_grace())
    }

    /// The delay after the `attempts`-th failed attempt: `base · 2^(attempts-1)`, at most
    /// `max_delay`, drawn from its upper half (jitter: retries of many deliveries spread).
    pub fn delay(&self, attempts: u32) -> Duration {
        let exp = self
            .base_delay
            .saturating_mul(1u32 << attempts.saturating_sub(1).min(20));
        let full = exp.min(self.max_delay).as_millis() as u64;
        let half = full / 2;
        Duration::from_millis(half + rand::random_range(0..=full - half))
    }
}

/// How the last error of a delivery a process without its sink put off begins (a pending
/// record's last error is seen by no client; a dead letter's says why it died).
const PUT_OFF: &str = "put off";

/// Whether a process without its sink put `delivery` off (and nobody claimed it since).
fn is_put_off(delivery: &Delivery) -> bool {
    delivery
        .last_error
        .as_deref()
        .is_some_and(|e| e.starts_with(PUT_OFF))
}

/// Drops the entries of a per-project map at or before `after` once it holds more than
/// 4096 (the pauses, slots and turns of [`Notifier`]).
fn prune<K>(map: &mut std::collections::HashMap<K, i64>, after: i64) {
    if map.len() > 4096 {
        map.retain(|_, at| *at > after);
    }
}

/// How many due deliveries one retry pass takes ([`Notifier::retry_due`]).
pub const PASS_SHARE: usize = 100;

/// [`RetryPolicy::stray_window`]: longer than the slowest retry pass of a process with
/// the sink (the `notifier` function's schedule runs one a minute; `serve` one a second).
pub const STRAY_WINDOW: Duration = Duration::from_secs(150);

/// The least `TOLLGATE_NOTIFY_STRAY_AFTER_SECONDS` is taken as (seconds).
pub const MIN_STRAY_AFTER_SECONDS: u64 = 3600;

/// How far apart the notices of one project that wait out a sink's pause are put
/// (`next_attempt_at`): a project's many take their turns after another's few, in the
/// due index's order as in each retry pass ([`tollgate_store::deliveries::fair_share`]).
pub const FAIR_SPACING: Duration = Duration::from_millis(50);

/// How far before its first start a sink's notifier still notifies card events, by
/// default: the `notifier` function starts on the first event it is given, so a sink
/// enabled with a new stack still notifies the cards that woke it.
pub const BACKLOG_GRACE: Duration = Duration::from_secs(5 * 60);

pub struct Notifier {
    store: Arc<dyn Store>,
    sinks: Vec<Arc<dyn Sink>>,
    policy: RetryPolicy,
    /// Card events older than their sink's first enabling, less this, are not notified.
    backlog_grace: Duration,
    /// Each sink's first enabling (ms), once read.
    enabled: std::sync::Mutex<std::collections::HashMap<&'static str, i64>>,
    /// The (sink, project)s whose receiver rate limits this process, until when (ms):
    /// nothing of that project is sent to that sink before. Per project: a tenant's flood
    /// into its own channel pauses only its own notices (a limit shared by every tenant
    /// pauses each of them in turn).
    paused: std::sync::Mutex<std::collections::HashMap<(&'static str, String), i64>>,
    /// The last slot (ms) given to a notice of each (sink, project) waiting out a pause
    /// ([`FAIR_SPACING`]).
    slots: std::sync::Mutex<std::collections::HashMap<(&'static str, String), i64>>,
    /// When this process last attempted a delivery of each project (ms): a retry pass
    /// takes the projects least recently served first, so when a rate limit lets one
    /// post through per pause, the projects take turns at it.
    served: std::sync::Mutex<std::collections::HashMap<String, i64>>,
}

impl Notifier {
    pub fn new(store: Arc<dyn Store>, sinks: Vec<Arc<dyn Sink>>) -> Self {
        Self {
            store,
            sinks,
            policy: RetryPolicy::default(),
            backlog_grace: BACKLOG_GRACE,
            enabled: Default::default(),
            paused: Default::default(),
            slots: Default::default(),
            served: Default::default(),
        }
    }

    /// How far before its sinks' first enabling card events are still notified
    /// ([`BACKLOG_GRACE`] unless set): `tollgate serve` enables its sinks before it reads
    /// anything ([`Notifier::enable_sinks`]) and needs none.
    pub fn with_backlog_grace(mut self, grace: Duration) -> Self {
        self.backlog_grace = grace;
        self
    }

    /// Records (once, durably: the first writer's time stands) when each sink was first
    /// enabled, and remembers it: card events older than that are a backlog this sink
    /// never had to notify (docs/architecture.md §10).
    pub async fn enable_sinks(&self) -> Result<(), StoreError> {
        for sink in &self.sinks {
            self.enabled_at(sink.name()).await?;
        }
        Ok(())
    }

    /// When the sink named `sink` was first enabled, less the backlog grace.
    async fn enabled_at(&self, sink: &'static str) -> Result<i64, StoreError> {
        if let Some(at) = self.enabled_lock().get(sink) {
            return Ok(*at);
        }
        let first = now_millis() - self.backlog_grace.as_millis() as i64;
        let at = self.store.sink_enabled_at(sink, first).await?;
        self.enabled_lock().insert(sink, at);
        Ok(at)
    }

    fn enabled_lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::HashMap<&'static str, i64>> {
        self.enabled.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Until when (ms) `project`'s notices to `sink` are paused by its receiver's rate
    /// limit, if they are at `now`.
    fn paused_until(&self, sink: &'static str, project: &str, now: i64) -> Option<i64> {
        let paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
        paused
            .get(&(sink, project.to_owned()))
            .copied()
            .filter(|until| *until > now)
    }

    fn pause(&self, sink: &'static str, project: &str, until: i64) {
        let mut paused = self.paused.lock().unwrap_or_else(|p| p.into_inner());
        prune(&mut paused, now_millis());
        let at = paused.entry((sink, project.to_owned())).or_insert(until);
        *at = (*at).max(until);
    }

    /// When a notice of `project` waiting out `sink`'s pause is due: no sooner than
    /// `from`, and [`FAIR_SPACING`] after the project's last one — so while one project
    /// queues hundreds, another's first is due as soon as the pause ends.
    fn slot(&self, sink: &'static str, project: &str, from: i64) -> i64 {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        prune(&mut slots, now_millis());
        let spacing = FAIR_SPACING.as_millis() as i64;
        let key = (sink, project.to_owned());
        let at = slots
            .get(&key)
            .map_or(from, |last| (*last + spacing).max(from));
        slots.insert(key, at);
        at
    }

    /// `due` (each project's in the store's order) with the projects taking turns, the
    /// least recently served first.
    fn in_turns(&self, due: Vec<Delivery>) -> Vec<Delivery> {
        let served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        let n = due.len();
        tollgate_store::deliveries::fair_share(
            due,
            n,
            |d| d.key.project.as_str(),
            |d| served.get(&d.key.project).copied().unwrap_or(0),
        )
    }

    /// Notes that a delivery of `project` was just attempted.
    fn serve_turn(&self, project: &str) {
        let mut served = self.served.lock().unwrap_or_else(|p| p.into_inner());
        prune(&mut served, now_millis() - 3_600_000);
        served.insert(project.to_owned(), now_millis());
    }

    pub fn with_policy(mut self, policy: RetryPolicy) -> Self {
        self.policy = policy;
        self
    }

    pub fn policy(&self) -> RetryPolicy {
        self.policy
    }

    /// Whether any sink is configured (without one the notifier has nothing to do).
    pub fn is_empty(&self) -> bool {
        self.sinks.is_empty()
    }

    /// One event of run `run_id` from a feed: a card event becomes a notice for each sink
    /// that wants it, delivered unless another instance has it already. Other events are
    /// ignored. `Err` only when the store failed (the feed should hand the event again).
    pub async fn on_event(&self, run_id: &str, event: &StoredEvent) -> Result<(), StoreError> {
        let kind = match event.event_type.as_str() {
            ev::APPROVAL_REQUIRED => NoticeKind::Armed,
            ev::APPROVAL_RESOLVED => NoticeKind::Resolved,
            _ => return Ok(()),
        };
        if self.sinks.is_empty() {
            return Ok(());
        }
        let request_id = serde_json::from_str::<serde_json::Value>(&event.body)
            .ok()
            .and_then(|v| {
                v.get("requestId")
                    .and_then(|r| r.as_str())
                    .map(str::to_owned)
            });
        let Some(request_id) = request_id else {
            tracing::warn!(
                run_id,
                sequence = event.sequence,
                "card event without requestId"
            );
            return Ok(());
        };
        let Some(notice) = self
            .notice(kind, run_id, &request_id, event.sequence)
            .await?
        else {
            return Ok(());
        };
        let now = now_millis();
        for sink in &self.sinks {
            if !sink.wants(&notice) {
                continue;
            }
            // A backlog from before this sink was enabled (a stream read from its oldest
            // record): not this sink's to notify — but for the arm of a card still open,
            // which an operator can still decide there. (The sink's enabling is read
            // first either way: the first card event records it.)
            let enabled_at = self.enabled_at(sink.name()).await?;
            let backlog = notice.at < enabled_at;
            let open_arm = kind == NoticeKind::Armed && notice.open;
            if backlog && !open_arm {
                tracing::warn!(
                    sink = sink.name(),
                    run_id,
                    request_id = %notice.request_id,
                    kind = %kind,
                    "card event from before the sink was enabled, card no longer open; not notified"
                );
                continue;
            }
            let key = delivery_key(&notice, sink.name());
            let mut record = Delivery::new(key, notice.sequence, now);
            record.version = 1;
            record.leased_until = now + self.policy.lease.as_millis() as i64;
            // Due again only when the lease lapses (its sender died): a delivery in flight
            // never sits among the due ones, where it would crowd out those really due.
            record.next_attempt_at = record.leased_until;
            if let Some(until) = self.paused_until(sink.name(), &notice.project, now) {
                // The sink's receiver asked this process to slow down: the notice waits
                // its project's turn after the pause, claimed by nobody yet.
                record.leased_until = 0;
                record.next_attempt_at = self.slot(sink.name(), &record.key.project, until);
                // Lost: another instance created it (or this event was handed twice).
                self.store.put_delivery(&record, 0).await?;
                continue;
            }
            if self.store.put_delivery(&record, 0).await? {
                // An old arm is posted for being open: as the card stands now (a card
                // decided meanwhile is posted without its buttons).
                let fresh = if backlog {
                    self.notice(kind, run_id, &request_id, event.sequence)
                        .await?
                } else {
                    Some(notice.clone())
                };
                match fresh {
                    Some(fresh) => self.attempt(sink.as_ref(), &fresh, record).await?,
                    None => self.bury_orphan(record).await?,
                }
            }
            // Lost: another instance created it (or this event was handed twice) — it is
            // theirs to send, or already sent; its retries come through `retry_due`.
        }
        Ok(())
    }

    /// The notice of `kind` for card `request_id` of run `run_id`, as the store holds
    /// them now; `None` when the run or the card is gone.
    pub async fn notice(
        &self,
        kind: NoticeKind,
        run_id: &str,
        request_id: &str,
        sequence: u64,
    ) -> Result<Option<CardNotice>, StoreError> {
        let Some(head) = self.store.read_head(run_id).await? else {
            return Ok(None);
        };
        let Some(card) = self.store.read_card(run_id, request_id).await? else {
            return Ok(None);
        };
        Ok(Some(CardNotice {
            kind,
            project: head
                .project_id
                .clone()
                .unwrap_or_else(|| super::NO_PROJECT.into()),
            run_id: run_id.to_owned(),
            request_id: request_id.to_owned(),
            sequence,
            card: crate::wire::card(&card),
            channel_id: head.channel_id.clone(),
            owner: head.owner.clone(),
            at: match kind {
                NoticeKind::Armed => card.created_at,
                NoticeKind::Resolved => card.decided_at.unwrap_or(card.created_at),
            },
            open: card.state == tollgate_domain::ApprovalState::Pending
                && card.expires_at > now_millis(),
        }))
    }

    /// Claims and sends the deliveries due now (their retries), at most [`PASS_SHARE`],
    /// shared between projects (each project's earliest first, the projects taking
    /// turns); none of a project its sink has paused. How many were attempted.
    pub async fn retry_due(&self) -> Result<usize, StoreError> {
        let mut attempted = 0;
        let due = self.store.due_deliveries(now_millis(), PASS_SHARE).await?;
        for due in self.in_turns(due) {
            // Each claim's own time: a long pass never claims with a lapsed lease.
            let now = now_millis();
            if due.leased_until > now {
                continue;
            }
            let Some(sink) = self.sinks.iter().find(|s| s.name() == due.key.sink) else {
                // One stray record that cannot be put off does not stop the pass.
                if let Err(e) = self.stray(due, now).await {
                    tracing::warn!(error = %e, "notifications: a stray delivery was not put off");
                }
                continue;
            };
            if let Some(until) = self.paused_until(sink.name(), &due.key.project, now) {
                // Put after the pause in its project's turn (out of the due ones, so a
                // paused backlog never crowds out another project's), unclaimed; or, rate
                // limited too long, a dead letter.
                let mut waits = due.clone();
                if now - due.created_at >= self.policy.throttled_for.as_millis() as i64 {
                    waits.state = DeliveryState::Dead;
                    waits.last_error = Some(format!(
                        "rate limited for more than {} s",
                        self.policy.throttled_for.as_secs()
                    ));
                } else {
                    waits.next_attempt_at = self.slot(sink.name(), &due.key.project, until);
                }
                waits.version = due.version + 1;
                waits.updated_at = now.max(due.updated_at);
                // Lost: another process claimed it meanwhile — theirs.
                self.store.put_delivery(&waits, due.version).await?;
                continue;
            }
            let mut claimed = due.clone();
            if is_put_off(&claimed) {
                // Claimed by a process with the sink: no longer a stray.
                claimed.last_error = None;
            }
            claimed.version += 1;
            claimed.leased_until = now + self.policy.lease.as_millis() as i64;
            claimed.next_attempt_at = claimed.leased_until;
            claimed.updated_at = now;
            if !self.store.put_delivery(&claimed, due.version).await? {
                continue;
            }
            let Some(kind) = NoticeKind::parse(&claimed.key.kind) else {
                continue;
            };
            let notice = self
                .notice(
                    kind,
                    &claimed.key.run_id,
                    &claimed.key.request_id,
                    claimed.sequence,
                )
                .await?;
            match notice {
                Some(notice) => {
                    self.attempt(sink.as_ref(), &notice, claimed).await?;
                    attempted += 1;
                }
                None => self.bury_orphan(claimed).await?,
            }
        }
        Ok(attempted)
    }

    /// A due delivery for a sink this notifier does not have (docs/architecture.md §10):
    /// left to the processes that have it while it is overdue by less than the grace;
    /// then put off by the grace (so it no longer crowds the due ones, and a process
    /// with the sink still finds it); a dead letter once older than `stray_after`. Each
    /// write is on the version read: a process with the sink that claims it first wins.
    async fn stray(&self, due: Delivery, now: i64) -> Result<(), StoreError> {
        let grace = self.policy.stray_grace().as_millis() as i64;
        // Put off before, untouched since and due again: the processes with the sink had
        // a whole grace and did not claim it (a claim clears the mark), so it is left to
        // them only for the window (long enough for the slowest retry pass of one), not
        // another grace among the due ones.
        let put_off_before = is_put_off(&due) && now - due.updated_at >= grace;
        let left_for = if put_off_before {
            self.policy.stray_window().as_millis() as i64
        } else {
            grace
        };
        if now - due.next_attempt_at < left_for {
            return Ok(());
        }
        let mut record = due.clone();
        if now - due.created_at >= self.policy.stray_after.as_millis() as i64 {
            record.state = DeliveryState::Dead;
            record.last_error = Some(format!(
                "no notifier has the sink {} configured (pending for more than {} s)",
                due.key.sink,
                self.policy.stray_after.as_secs()
            ));
            tracing::warn!(
                sink = %due.key.sink,
                delivery_id = %due.delivery_id,
                "notification dead-lettered: no notifier has its sink"
            );
        } else {
            record.next_attempt_at = now + grace;
            record.last_error = Some(format!(
                "{PUT_OFF}: no notifier here has the sink {} configured",
                due.key.sink
            ));
        }
        record.version = due.version + 1;
        record.updated_at = now.max(record.updated_at);
        // Lost: a process with the sink claimed it meanwhile — theirs.
        self.store.put_delivery(&record, due.version).await?;
        Ok(())
    }

    /// Revives a dead letter of `project` (an operator's retry): due now, its attempts
    /// counted afresh. `None` when there is no such dead letter.
    pub async fn revive(
        &self,
        project: &str,
        delivery_id: &str,
    ) -> Result<Option<Delivery>, StoreError> {
        let Some(dead) = self.store.read_delivery(delivery_id).await? else {
            return Ok(None);
        };
        if dead.key.project != project || dead.state != DeliveryState::Dead {
            return Ok(None);
        }
        let now = now_millis();
        let mut revived = dead.clone();
        revived.state = DeliveryState::Pending;
        revived.attempts = 0;
        revived.next_attempt_at = now;
        revived.leased_until = 0;
        // Made again: its day of rate limits counts from now.
        revived.created_at = now;
        revived.updated_at = now;
        revived.version += 1;
        if self.store.put_delivery(&revived, dead.version).await? {
            Ok(Some(revived))
        } else {
            // Revived (or changed) by someone else meanwhile: answer what stands.
            self.store.read_delivery(delivery_id).await
        }
    }

    /// One project's dead letters, newest first.
    pub async fn dead_letters(
        &self,
        project: &str,
        limit: usize,
    ) -> Result<Vec<Delivery>, StoreError> {
        self.store.dead_letters(project, limit).await
    }

    /// One attempt of a delivery this instance holds (`claimed`: as it wrote it).
    async fn attempt(
        &self,
        sink: &dyn Sink,
        notice: &CardNotice,
        claimed: Delivery,
    ) -> Result<(), StoreError> {
        let now = now_millis();
        let mut memo = None;
        if notice.kind == NoticeKind::Resolved {
            let armed_id =
                super::delivery_key_of(notice, sink.name(), NoticeKind::Armed).delivery_id();
            if let Some(armed) = self.store.read_delivery(&armed_id).await? {
                if armed.state == DeliveryState::Pending {
                    // The Armed notice is still on its way: this one waits for it (a sink
                    // may update what the Armed notice posted).
                    let mut wait = claimed.clone();
                    // In flight: its sender settles it within the call's bound; else it is
                    // due at `next_attempt_at`.
                    let armed_due = if armed.leased_until > now {
                        now
                    } else {
                        armed.next_attempt_at.max(now)
                    };
                    wait.next_attempt_at = armed_due + 1000;
                    wait.leased_until = 0;
                    return self.settle(wait, claimed.version).await;
                }
                memo = armed.memo;
            }
        }
        self.serve_turn(&notice.project);
        let answer = sink.deliver(notice, memo.as_deref()).await;
        let mut done = claimed.clone();
        done.attempts += 1;
        done.leased_until = 0;
        // A receiver that named when is tried no sooner than that (nor sooner than the
        // backoff).
        let asked = match &answer {
            Err(DeliveryError::RetryAfter(_, after)) => *after,
            _ => Duration::ZERO,
        };
        match answer {
            Err(DeliveryError::Throttled(why, after))
                if now - claimed.created_at < self.policy.throttled_for.as_millis() as i64 =>
            {
                // The receiver slows this sender down: the sink pauses, and this delivery
                // waits its project's turn after, the attempt not counted.
                let until = now_millis() + after.max(Duration::from_millis(100)).as_millis() as i64;
                self.pause(sink.name(), &notice.project, until);
                done.attempts = claimed.attempts;
                done.next_attempt_at = self.slot(sink.name(), &done.key.project, until);
                tracing::warn!(
                    sink = sink.name(),
                    delivery_id = %done.delivery_id,
                    paused_ms = until - now,
                    error = %why,
                    "notifications: rate limited; the sink pauses"
                );
                done.last_error = Some(format!("rate limited: {why}"));
            }
            Err(DeliveryError::Throttled(why, _)) => {
                done.state = DeliveryState::Dead;
                tracing::warn!(
                    sink = sink.name(),
                    delivery_id = %done.delivery_id,
                    error = %why,
                    "notification dead-lettered: rate limited for too long"
                );
                done.last_error = Some(format!(
                    "rate limited for more than {} s: {why}",
                    self.policy.throttled_for.as_secs()
                ));
            }
            Ok(memo) => {
                done.state = DeliveryState::Sent;
                done.last_error = None;
                if memo.is_some() {
                    done.memo = memo;
                }
                tracing::info!(
                    sink = sink.name(),
                    delivery_id = %done.delivery_id,
                    attempts = done.attempts,
                    "notification delivered"
                );
            }
            Err(DeliveryError::Retry(why) | DeliveryError::RetryAfter(why, _))
                if done.attempts < self.policy.max_attempts =>
            {
                let delay = self.policy.delay(done.attempts).max(asked);
                done.next_attempt_at = now_millis() + delay.as_millis() as i64;
                tracing::warn!(
                    sink = sink.name(),
                    delivery_id = %done.delivery_id,
                    attempts = done.attempts,
                    error = %why,
                    "notification not delivered; retrying"
                );
                done.last_error = Some(why);
            }
            Err(
                DeliveryError::Retry(why)
                | DeliveryError::RetryAfter(why, _)
                | DeliveryError::Permanent(why),
            ) => {
                done.state = DeliveryState::Dead;
                tracing::warn!(
                    sink = sink.name(),
                    delivery_id = %done.delivery_id,
                    attempts = done.attempts,
                    error = %why,
                    "notification dead-lettered"
                );
                done.last_error = Some(why);
            }
        }
        self.settle(done, claimed.version).await
    }

    /// A delivery this instance holds whose run or card is gone: a dead letter saying so.
    async fn bury_orphan(&self, mut held: Delivery) -> Result<(), StoreError> {
        let version = held.version;
        held.state = DeliveryState::Dead;
        held.last_error = Some("the run or its card no longer exists".into());
        self.settle(held, version).await
    }

    /// Writes the outcome on the version this instance holds.
    async fn settle(&self, mut record: Delivery, held: u64) -> Result<(), StoreError> {
        record.version = held + 1;
        record.updated_at = now_millis().max(record.updated_at);
        if !self.store.put_delivery(&record, held).await? {
            tracing::warn!(
                delivery_id = %record.delivery_id,
                "a delivery's lease ran out before its outcome was recorded"
            );
        }
        Ok(())
    }
}
