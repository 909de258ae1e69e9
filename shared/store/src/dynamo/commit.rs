//! The commit engine: the one place that writes. Every state transition — create,
//! append, end, and the approval and execution transitions built on them — is a
//! [`Plan`]: run heads to advance (each conditioned on exactly the head that was read),
//! the events each run announces, and side items with their own conditions, all in one
//! `TransactWriteItems` (docs/architecture.md §1). [`DynamoStore::commit`] owns the client-token
//! resend, the classification of SDK errors and the decoding of cancellation reasons;
//! callers decide what a lost race means and try again inside a [`Budget`].
//!
//! Sequences are allocated here and only here: run `i`'s events take
//! `head.next_seq ..` in order.

use std::time::{Duration, Instant};

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    CancellationReason, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem, Update,
};
use rand::Rng;
use tollgate_domain::{
    now_millis, render_event, EventDraft, RunHead, RunKind, RunStatus, TerminalKind,
};

use super::item::{
    build_error, get_n, head_from_item, head_to_item, n, running_child_key, s, Item,
};
use super::DynamoStore;
use crate::StoreError;

/// How long one commit keeps resending after answers that leave its outcome unknown
/// before it gives up as `Unavailable`.
const AMBIGUITY_BUDGET: Duration = Duration::from_secs(4);

/// How long one call keeps retrying lost races and throttling. With the ambiguity budget
/// and one SDK operation timeout (3 s) a call ends within about 15 s, well inside the
/// functions' 25 s timeout, so a client always gets an answer.
pub const CONTENTION_BUDGET: Duration = Duration::from_secs(8);

/// What one run contributes to a plan.
#[derive(Debug, Clone)]
pub(crate) struct RunWrite {
    /// The head as read. `Advance` is conditioned on exactly its `next_seq` and
    /// incarnation and on the run running; `Create` puts it if the id is free.
    pub head: RunHead,
    pub kind: WriteKind,
    pub events: Vec<EventDraft>,
    /// Change to the run's count of pending cards (`+1` arming, `-1` ending one); a
    /// positive change is conditioned on staying within
    /// [`tollgate_domain::approval::MAX_OPEN_CARDS_PER_RUN`].
    pub open_cards: i64,
    /// The run's budget usage after this write (an admitted start), stored on the head
    /// as `budget_used`; conditioned like everything else on the head's `next_seq`, so
    /// concurrent admissions are serialised by the sequence they all advance.
    pub budget_used: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteKind {
    /// A new run: the head is put and its events start at sequence 1.
    Create,
    /// Appends to a running run, optionally ending it with the last event.
    Advance { end: Option<TerminalKind> },
}

/// One transaction's worth of writes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Plan {
    pub runs: Vec<RunWrite>,
    /// Conditioned items beside the runs (cards, routes, policies…), each built with
    /// `ReturnValuesOnConditionCheckFailure::AllOld` so a lost race shows the stored item.
    pub side: Vec<TransactWriteItem>,
}

/// Why a plan did not commit, item by item.
#[derive(Debug, Default)]
pub(crate) struct Lost {
    /// Per run write: `Some(stored head)` when its condition failed (`Some(None)` when
    /// no head is stored), `None` when it held.
    pub heads: Vec<Option<Option<RunHead>>>,
    /// Per run write, per event: the stored sequence when the event's key was taken.
    pub taken: Vec<Vec<Option<u64>>>,
    /// Per side item: `Some(stored item, if any)` when its condition failed.
    pub side: Vec<Option<Option<Item>>>,
}

/// What a commit did.
#[derive(Debug)]
pub(crate) enum Committed {
    /// Written at `now` (the events' timestamp).
    Done { now: i64 },
    /// Conditions failed: nothing was written.
    Lost(Lost),
    /// Rejected before it could commit (throttling, a conflicting transaction): nothing
    /// was written; read again and retry.
    Busy(String),
}

/// Retries of one call: bounded by [`CONTENTION_BUDGET`], full-jitter backoff.
pub(crate) struct Budget {
    deadline: Instant,
    attempt: u32,
    what: &'static str,
}

impl Budget {
    pub fn new(limit: Duration, what: &'static str) -> Self {
        Self {
            deadline: Instant::now() + limit,
            attempt: 0,
            what,
        }
    }

    /// Waits before the next try, or gives up (`Unavailable`, nothing written).
    pub async fn next(&mut self) -> Result<(), StoreError> {
        if Instant::now() >= self.deadline {
            return Err(StoreError::Unavailable(format!(
                "{} kept losing to concurrent writers; retry",
                self.what
            )));
        }
        self.attempt += 1;
        backoff(self.attempt).await;
        Ok(())
    }
}

pub(crate) async fn backoff(attempt: u32) {
    // Full jitter, 2 ms doubling to a 32 ms ceiling: a low ceiling keeps a writer that
    // lost several times from starving behind fresh arrivals.
    let cap = 2u64 << attempt.min(4);
    let ms = rand::rng().random_range(1..=cap);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

impl DynamoStore {
    /// Writes `plan` in one transaction, or reports item by item why it could not.
    pub(crate) async fn commit(&self, plan: &Plan) -> Result<Committed, StoreError> {
        self.commit_until(plan, None).await
    }

    /// [`Self::commit`], resending after an unknown outcome only while the clock is
    /// before `not_after` (epoch ms): an approval is not resent past its card's deadline
    /// (docs/architecture.md §6); its outcome then stays unknown and the call fails
    /// closed, so the card's expiry wins unless the first attempt had committed.
    pub(crate) async fn commit_until(
        &self,
        plan: &Plan,
        not_after: Option<i64>,
    ) -> Result<Committed, StoreError> {
        let now = now_millis();
        let mut items = Vec::new();
        let mut layout = Vec::with_capacity(plan.runs.len());
        for run in &plan.runs {
            let head_at = items.len();
            items.push(self.head_item(run, now)?);
            let first = match run.kind {
                WriteKind::Create => 1,
                WriteKind::Advance { .. } => run.head.next_seq,
            };
            for (offset, draft) in run.events.iter().enumerate() {
                items.push(self.event_put(&run.head, first + offset as u64, draft, now)?);
            }
            layout.push(head_at);
        }
        let side_at = items.len();
        items.extend(plan.side.iter().cloned());
        match self.transact(items, not_after).await {
            Ok(()) => {
                // What was written is what this instance remembers of each run
                // (`RecentHeads`): the next append to it starts from there.
                for run in &plan.runs {
                    if run.kind == WriteKind::Create {
                        // (A new head is put as stored: `next_seq` past its events.)
                        self.recent.put(&run.head);
                    }
                    if let WriteKind::Advance { end } = run.kind {
                        let mut head = run.head.clone();
                        head.next_seq += run.events.len() as u64;
                        if !run.events.is_empty() {
                            head.record(run.events.iter().map(|e| e.event_type.as_str()), now);
                        }
                        head.open_cards = (head.open_cards as i64 + run.open_cards).max(0) as u64;
                        if let Some(used) = &run.budget_used {
                            head.budget_used = Some(used.clone());
                        }
                        if let Some(kind) = end {
                            head.status = kind.status();
                            head.terminal_seq = Some(head.next_seq - 1);
                        }
                        self.recent.put(&head);
                    }
                }
                Ok(Committed::Done { now })
            }
            Err(TxFailure::Retryable(why)) => Ok(Committed::Busy(why)),
            Err(TxFailure::Fatal(why) | TxFailure::Ambiguous(why)) => {
                Err(StoreError::Unavailable(why))
            }
            Err(TxFailure::Cancelled(reasons)) => {
                let failed = |i: usize| reasons.get(i).filter(|r| reason_failed(r));
                let mut lost = Lost::default();
                for (run, head_at) in plan.runs.iter().zip(&layout) {
                    let stored = match failed(*head_at) {
                        Some(r) => Some(r.item().map(head_from_item).transpose()?),
                        None => None,
                    };
                    // A lost condition shows the stored head: remember it for the retry.
                    match &stored {
                        Some(Some(head)) => self.recent.put(head),
                        Some(None) => self.recent.forget(&run.head.run_id),
                        None => {}
                    }
                    lost.heads.push(stored);
                    let mut taken = Vec::with_capacity(run.events.len());
                    for (offset, draft) in run.events.iter().enumerate() {
                        taken.push(match failed(head_at + 1 + offset) {
                            Some(r) if draft.event_id.is_some() => {
                                r.item().map(|i| get_n(i, "sequence")).transpose()?
                            }
                            _ => None,
                        });
                    }
                    lost.taken.push(taken);
                }
                for i in 0..plan.side.len() {
                    lost.side
                        .push(failed(side_at + i).map(|r| r.item().cloned()));
                }
                Ok(Committed::Lost(lost))
            }
        }
    }

    fn head_item(&self, run: &RunWrite, now: i64) -> Result<TransactWriteItem, StoreError> {
        let head = &run.head;
        let end = match run.kind {
            WriteKind::Create => {
                let mut item = head_to_item(head);
                if let Some(exp) = self.expires_at(now) {
                    item.insert("expires_at".into(), exp);
                }
                let put = Put::builder()
                    .table_name(&self.tables.runs)
                    .set_item(Some(item))
                    // Invariant: a run id names one run; a second create finds the first.
                    .condition_expression("attribute_not_exists(run_id)")
                    .return_values_on_condition_check_failure(
                        ReturnValuesOnConditionCheckFailure::AllOld,
                    )
                    .build()
                    .map_err(build_error)?;
                return Ok(TransactWriteItem::builder().put(put).build());
            }
            WriteKind::Advance { end } => end,
        };
        let new_next_seq = head.next_seq + run.events.len() as u64;
        let mut set = String::from("next_seq = :new, last_event_at = :now");
        let mut extra = Vec::new();
        // Keep the head alive as long as its newest events (TTL retention).
        let expires = self.expires_at(now);
        if expires.is_some() {
            set.push_str(", expires_at = :exp");
        }
        if let Some(t) =
            tollgate_domain::last_real_type(run.events.iter().map(|e| e.event_type.as_str()))
        {
            set.push_str(", last_real_type = :lt");
            extra.push((":lt", s(t)));
        }
        if let Some(used) = &run.budget_used {
            set.push_str(", budget_used = :bu");
            extra.push((":bu", s(used.to_string())));
        }
        // A head without an incarnation was written before incarnations existed.
        let same_incarnation = if head.incarnation.is_empty() {
            "attribute_not_exists(incarnation)"
        } else {
            extra.push((":inc", s(&head.incarnation)));
            "incarnation = :inc"
        };
        let mut update = Update::builder()
            .table_name(&self.tables.runs)
            .key("run_id", s(&head.run_id))
            // Invariant: gapless, single-writer sequences and no event after a terminal
            // event — the head must still be exactly as we read it (the same incarnation
            // of the run id), and running.
            .condition_expression(format!(
                "next_seq = :seen AND #status = :running AND {same_incarnation}"
            ))
            .expression_attribute_names("#status", "status")
            .expression_attribute_values(":seen", n(head.next_seq))
            .expression_attribute_values(":running", s(RunStatus::Running.as_str()))
            .expression_attribute_values(":new", n(new_next_seq))
            // A write without events (a side item guarded by the head) is no sign of life:
            // the run's last event time stays.
            .expression_attribute_values(
                ":now",
                n(if run.events.is_empty() {
                    head.last_event_at
                } else {
                    now
                }),
            )
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if let Some(exp) = expires {
            update = update.expression_attribute_values(":exp", exp);
        }
        for (name, value) in extra {
            update = update.expression_attribute_values(name, value);
        }
        let mut add = "";
        if run.open_cards != 0 {
            add = " ADD open_cards :oc";
            update = update.expression_attribute_values(":oc", n(run.open_cards));
            if run.open_cards > 0 {
                // Invariant: a run holds at most MAX_OPEN_CARDS_PER_RUN pending cards.
                update = update
                    .condition_expression(format!(
                        "next_seq = :seen AND #status = :running AND {same_incarnation} AND \
                         (attribute_not_exists(open_cards) OR open_cards <= :ocmax)"
                    ))
                    .expression_attribute_values(
                        ":ocmax",
                        n(tollgate_domain::approval::MAX_OPEN_CARDS_PER_RUN as i64
                            - run.open_cards),
                    );
            }
        }
        let mut remove = "";
        if let Some(kind) = end {
            // `ended_at` is listed by `runs_by_project`, which gets one write at the end.
            set.push_str(", #status = :terminal, terminal_seq = :tseq, ended_at = :now");
            update = update
                .expression_attribute_values(":terminal", s(kind.status().as_str()))
                .expression_attribute_values(":tseq", n(new_next_seq - 1));
            // An ended child leaves the stall guard's index.
            remove = " REMOVE running_child";
        } else if head.kind == RunKind::Child && !run.events.is_empty() {
            // A child that speaks is (back) in the stall guard's index: a stall report,
            // or the cleanup of a child whose coordinator ended, took it out until then.
            // Its shard follows the new `next_seq`, so children's appends spread over the
            // index's partitions instead of all writing one.
            set.push_str(", running_child = :rc");
            update = update.expression_attribute_values(
                ":rc",
                s(running_child_key(&head.run_id, new_next_seq)),
            );
        }
        update = update.update_expression(format!("SET {set}{remove}{add}"));
        Ok(TransactWriteItem::builder()
            .update(update.build().map_err(build_error)?)
            .build())
    }

    fn event_put(
        &self,
        head: &RunHead,
        sequence: u64,
        draft: &EventDraft,
        now: i64,
    ) -> Result<TransactWriteItem, StoreError> {
        let key = match &draft.event_id {
            Some(id) => format!("id#{id}"),
            None => format!("seq#{sequence:020}"),
        };
        let mut put = Put::builder()
            .table_name(&self.tables.events)
            .item("run_id", s(&head.run_id))
            .item("event_key", s(key))
            .item("sequence", n(sequence))
            .item("type", s(&draft.event_type))
            .item("body", s(render_event(head, sequence, draft, now)))
            // Invariant: one item per (run, event_id) and per sequence — a retried
            // event_id fails here and reports the stored sequence back (ALL_OLD).
            .condition_expression("attribute_not_exists(event_key)")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        if let Some(exp) = self.expires_at(now) {
            put = put.item("expires_at", exp);
        }
        Ok(TransactWriteItem::builder()
            .put(put.build().map_err(build_error)?)
            .build())
    }

    /// One transaction attempt. Its client request token stays the same while we resend
    /// after an answer that leaves the outcome unknown (timeout, dispatch failure,
    /// `InternalServerError`, `TransactionInProgress`): DynamoDB answers a resend of a
    /// committed token with success and writes nothing, so an attempt never lands twice.
    /// If the outcome is still unknown after the ambiguity budget, fail closed.
    async fn transact(
        &self,
        items: Vec<TransactWriteItem>,
        not_after: Option<i64>,
    ) -> Result<(), TxFailure> {
        let token = uuid::Uuid::new_v4().to_string();
        let give_up = Instant::now() + AMBIGUITY_BUDGET;
        let mut attempt = 0u32;
        let mut unknown = false;
        loop {
            let result = self
                .client
                .transact_write_items()
                .set_transact_items(Some(items.clone()))
                .client_request_token(&token)
                .send()
                .await;
            match result.map_err(classify_tx_error) {
                Ok(_) => return Ok(()),
                // Once an attempt's outcome is unknown, only this token may settle it: a
                // throttled or conflicting resend says nothing about the first attempt.
                Err(TxFailure::Ambiguous(why)) | Err(TxFailure::Retryable(why))
                    if unknown || why.starts_with(AMBIGUOUS) =>
                {
                    if Instant::now() >= give_up || not_after.is_some_and(|t| now_millis() >= t) {
                        return Err(TxFailure::Fatal(format!("outcome unknown: {why}")));
                    }
                    unknown = true;
                    tracing::warn!(%why, "transaction outcome unknown; resending with the same token");
                    attempt += 1;
                    backoff(attempt + 3).await;
                }
                // A condition failure under the same token proves nothing committed
                // (a committed token answers success).
                Err(other) => return Err(other),
            }
        }
    }
}

const AMBIGUOUS: &str = "outcome unknown";

/// Why one transaction attempt did not commit.
enum TxFailure {
    /// Conditions failed: one reason per item, in order, with the stored item (ALL_OLD).
    Cancelled(Vec<CancellationReason>),
    /// Rejected before it could commit (throttling, a conflicting transaction): safe
    /// to rebuild from a fresh read and try again.
    Retryable(String),
    /// It may or may not have committed: resend the same request (same token). The
    /// text starts with [`AMBIGUOUS`].
    Ambiguous(String),
    /// Anything else: fail closed.
    Fatal(String),
}

fn classify_tx_error(err: SdkError<TransactWriteItemsError>) -> TxFailure {
    match err {
        SdkError::ServiceError(ctx) => match ctx.into_err() {
            TransactWriteItemsError::TransactionCanceledException(e) => {
                let reasons = e.cancellation_reasons.unwrap_or_default();
                if reasons.iter().any(reason_failed) {
                    TxFailure::Cancelled(reasons)
                } else {
                    // TransactionConflict, ThrottlingError, … on some item: transient.
                    let codes: Vec<_> = reasons.iter().filter_map(|r| r.code()).collect();
                    TxFailure::Retryable(format!("transaction cancelled: {codes:?}"))
                }
            }
            e @ (TransactWriteItemsError::ProvisionedThroughputExceededException(_)
            | TransactWriteItemsError::RequestLimitExceeded(_)
            | TransactWriteItemsError::ThrottlingException(_)) => {
                TxFailure::Retryable(e.code().unwrap_or("throttled").to_owned())
            }
            e @ (TransactWriteItemsError::TransactionInProgressException(_)
            | TransactWriteItemsError::InternalServerError(_)) => {
                TxFailure::Ambiguous(format!("{AMBIGUOUS}: {}", e.code().unwrap_or("transient")))
            }
            e => TxFailure::Fatal(format!(
                "{}: {}",
                e.code().unwrap_or("error"),
                e.message().unwrap_or("")
            )),
        },
        // Timeouts and dispatch failures (the SDK already retried): the request may have
        // reached DynamoDB and committed.
        other => TxFailure::Ambiguous(format!("{AMBIGUOUS}: {other}")),
    }
}

fn reason_failed(r: &CancellationReason) -> bool {
    r.code() == Some("ConditionalCheckFailed")
}
