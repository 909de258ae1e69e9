//! Approved execution's use-cases (seed 000, docs/architecture.md §7): an agent starts,
//! dispatches and settles a human-approved mutating call; an operator reconciles an
//! unknown outcome; the settlement deadline and the execution heartbeats run on the timer
//! queue. Every transition is one read–decide–commit of [`decide_mutation`]: the domain
//! decides ([`tollgate_domain::execution`]) and the store writes the record with its
//! event in one transaction. Each answers the domain's [`Answer`] (verdict and body),
//! which the HTTP layer only serializes.

use std::time::Duration;

use tollgate_domain::execution::{
    self, Answer, Decision, MutationRecord, MutationState, Observed, Settlement, StartRefusal,
    StartRequest,
};
use tollgate_domain::{now_millis, ApprovalRequest, RunHead, RunStatus};
use tollgate_store::{decide_mutation, Beat, MutationOutcome, StoreError};
use tollgate_timers::{TimerError, TimerMessage};

use crate::approvals::Gate;
use crate::AppError;

/// Why a transition was not decided at all.
enum Refused {
    /// The run token is of another incarnation of the run: as if it did not exist.
    OtherIncarnation,
    /// No record of this attempt (nothing was started).
    NoAttempt,
    /// `start` refused without writing (400/409).
    Start(StartRefusal),
    /// The deadline timer arrived before the deadline (this record's).
    NotDue(Box<MutationRecord>),
}

impl From<Refused> for Result<Answer, AppError> {
    fn from(refused: Refused) -> Self {
        match refused {
            Refused::OtherIncarnation => Err(AppError::run_not_found()),
            Refused::NoAttempt | Refused::NotDue(_) => Err(AppError::unknown_attempt()),
            Refused::Start(r) => Ok(r.answer()),
        }
    }
}

impl Gate {
    /// The read–decide–commit loop of one attempt, with the run-token incarnation
    /// check (`incarnation`: `None` for operators and timers).
    async fn transit<F>(
        &self,
        run_id: &str,
        tool_call_id: &str,
        approval_id: &str,
        incarnation: Option<&str>,
        mut decide: F,
    ) -> Result<Result<MutationOutcome, Refused>, AppError>
    where
        F: FnMut(
                &RunHead,
                Option<&MutationRecord>,
                &tollgate_store::MutationView,
            ) -> Result<Decision, Refused>
            + Send,
    {
        let outcome = decide_mutation(
            self.store.as_ref(),
            run_id,
            tool_call_id,
            approval_id,
            |view| {
                if incarnation.is_some_and(|i| i != view.head.incarnation) {
                    return Err(Refused::OtherIncarnation);
                }
                decide(&view.head, view.record(approval_id), view)
            },
        )
        .await;
        match outcome {
            Ok(result) => Ok(result),
            Err(StoreError::NotFound) => Err(AppError::run_not_found()),
            Err(e) => Err(e.into()),
        }
    }

    /// `start` of the approved call `card` names (checked against `req`).
    pub async fn start_execution(
        &self,
        req: &StartRequest,
        card: &ApprovalRequest,
        incarnation: &str,
    ) -> Result<Answer, AppError> {
        let now = now_millis();
        let settings = self.config.execution;
        let outcome = self
            .transit(
                &req.run_id,
                &req.tool_call_id,
                &req.approval_id,
                Some(incarnation),
                |head, _, view| {
                    execution::start(req, card, head, &view.usage, &view.attempts, &settings, now)
                        .map_err(Refused::Start)
                },
            )
            .await?;
        let outcome = match outcome {
            Ok(o) => o,
            Err(refused) => return refused.into(),
        };
        let record = &outcome.decision.record;
        // The deadline settles an intent nobody dispatched or settled. A repeated start
        // of an attempt still in flight sends it again (the first may have been lost);
        // the handler is idempotent.
        if matches!(
            record.state,
            MutationState::Intent | MutationState::Dispatched
        ) {
            self.schedule_deadline(record).await;
        }
        if outcome.decision.changed {
            tracing::info!(
                state = record.state.as_str(),
                reason = record.reason.map(|r| r.as_str()),
                "execution start decided"
            );
        }
        Ok(outcome.decision.answer())
    }

    /// One transition of a stored attempt, decided by `decide` from the record and the
    /// run's status: the committed outcome, or the answer that nothing was decided.
    async fn step<F>(
        &self,
        run_id: &str,
        tool_call_id: &str,
        approval_id: &str,
        incarnation: Option<&str>,
        decide: F,
    ) -> Result<Result<MutationOutcome, Answer>, AppError>
    where
        F: Fn(&MutationRecord, RunStatus) -> Decision + Send + Sync,
    {
        let outcome = self
            .transit(
                run_id,
                tool_call_id,
                approval_id,
                incarnation,
                |head, record, _| {
                    record
                        .map(|r| decide(r, head.status))
                        .ok_or(Refused::NoAttempt)
                },
            )
            .await?;
        match outcome {
            Ok(o) => {
                if o.decision.changed {
                    tracing::info!(
                        state = o.decision.record.state.as_str(),
                        reason = o.decision.record.reason.map(|r| r.as_str()),
                        "mutation record written"
                    );
                }
                Ok(Ok(o))
            }
            Err(refused) => Result::<Answer, AppError>::from(refused).map(Err),
        }
    }

    /// `dispatch`: intent → dispatched, the fence before any transport; then the first
    /// execution heartbeat is scheduled.
    pub async fn dispatch_execution(
        &self,
        run_id: &str,
        tool_call_id: &str,
        approval_id: &str,
        incarnation: &str,
    ) -> Result<Answer, AppError> {
        let decided = self
            .step(
                run_id,
                tool_call_id,
                approval_id,
                Some(incarnation),
                |r, run| execution::dispatch(r, run, now_millis()),
            )
            .await?;
        let o = match decided {
            Ok(o) => o,
            Err(answer) => return Ok(answer),
        };
        if o.decision.changed && o.decision.record.state == MutationState::Dispatched {
            self.schedule_beat(&o.decision.record, 1).await;
        }
        Ok(o.decision.answer())
    }

    /// `settle` with the agent's evidence.
    pub async fn settle_execution(
        &self,
        run_id: &str,
        tool_call_id: &str,
        approval_id: &str,
        incarnation: &str,
        settlement: &Settlement,
    ) -> Result<Answer, AppError> {
        let decided = self
            .step(
                run_id,
                tool_call_id,
                approval_id,
                Some(incarnation),
                |r, run| execution::settle(r, settlement, run, now_millis()),
            )
            .await?;
        Ok(decided.map_or_else(|answer| answer, |o| o.decision.answer()))
    }

    /// An operator's reconciliation of an `outcome_unknown` attempt.
    pub async fn reconcile_execution(
        &self,
        run_id: &str,
        tool_call_id: &str,
        approval_id: &str,
        observed: Observed,
        by: &str,
    ) -> Result<Answer, AppError> {
        let decided = self
            .step(run_id, tool_call_id, approval_id, None, |r, run| {
                execution::reconcile(r, observed, by, run, now_millis())
            })
            .await?;
        Ok(decided.map_or_else(|answer| answer, |o| o.decision.answer()))
    }

    /// The settlement-deadline timer: settles the attempt if it is due and unsettled;
    /// arriving early (SQS delays stop at 15 minutes), it is sent again for the rest.
    pub async fn settlement_deadline(
        &self,
        run_id: &str,
        tool_call_id: &str,
        approval_id: &str,
    ) -> Result<(), TimerError> {
        self.settle_if_due(run_id, tool_call_id, approval_id, true)
            .await
            .map(|_| ())
    }

    /// Settles the attempt if its deadline passed and nobody settled it (`true` when
    /// this call settled it); an early deadline timer (`resend`) is sent again for the
    /// rest. The sweeper calls it too (`resend: false`) for attempts whose timer was lost.
    pub async fn settle_if_due(
        &self,
        run_id: &str,
        tool_call_id: &str,
        approval_id: &str,
        resend: bool,
    ) -> Result<bool, TimerError> {
        let outcome = self
            .transit(
                run_id,
                tool_call_id,
                approval_id,
                None,
                |head, record, _| {
                    let record = record.ok_or(Refused::NoAttempt)?;
                    execution::settle_at_deadline(record, head.status, now_millis())
                        .ok_or_else(|| Refused::NotDue(Box::new(record.clone())))
                },
            )
            .await;
        match outcome {
            Ok(Ok(o)) => {
                if o.decision.changed {
                    tracing::info!(
                        run_id,
                        state = o.decision.record.state.as_str(),
                        "settlement deadline settled an attempt"
                    );
                }
                Ok(o.decision.changed)
            }
            Ok(Err(Refused::NotDue(record))) if resend => {
                let message = deadline_message(&record, record.settlement_deadline_at);
                let rest = message.remaining_delay(now_millis()).unwrap_or_default();
                self.timers.schedule(&message, rest).await.map(|()| false)
            }
            // Nothing to settle: the run or the attempt is gone.
            Ok(Err(_)) => Ok(false),
            Err(AppError::NotFound { .. }) => Ok(false),
            Err(e) => Err(TimerError::Unavailable(e.to_string())),
        }
    }

    /// Execution heartbeat `beat`; schedules the next while the call stays dispatched.
    pub async fn execution_beat(
        &self,
        run_id: &str,
        tool_call_id: &str,
        approval_id: &str,
        beat: u32,
    ) -> Result<(), TimerError> {
        match self
            .store
            .execution_heartbeat(run_id, tool_call_id, approval_id, beat)
            .await
        {
            Ok(Beat::Emitted(_)) => {
                let next = TimerMessage::ExecutionHeartbeat {
                    run_id: run_id.to_owned(),
                    tool_call_id: tool_call_id.to_owned(),
                    approval_id: approval_id.to_owned(),
                    beat: beat + 1,
                };
                self.timers
                    .schedule(&next, interval(&self.config.execution))
                    .await
            }
            // The chain ends at the settlement or at the deadline: it settles a call its
            // deadline timer missed (a lost message), so the stream still gets its
            // terminal decision. Already settled, this only reads.
            Ok(Beat::Stopped) => self
                .settle_if_due(run_id, tool_call_id, approval_id, false)
                .await
                .map(|_| ()),
            Ok(Beat::Repeated(_)) | Err(StoreError::NotFound) => Ok(()),
            Err(e) => Err(TimerError::Unavailable(e.to_string())),
        }
    }

    /// Sends the attempt's settlement-deadline timer. A failure is logged: `dispatch`
    /// checks the deadline itself, so no call is sent after it even without the timer.
    async fn schedule_deadline(&self, record: &MutationRecord) {
        let message = deadline_message(record, record.settlement_deadline_at);
        let delay = message.remaining_delay(now_millis()).unwrap_or_default();
        if let Err(e) = self.timers.schedule(&message, delay).await {
            tracing::error!(error = %e, "could not schedule the settlement deadline");
        }
    }

    async fn schedule_beat(&self, record: &MutationRecord, beat: u32) {
        let message = TimerMessage::ExecutionHeartbeat {
            run_id: record.run_id.clone(),
            tool_call_id: record.tool_call_id.clone(),
            approval_id: record.approval_id.clone(),
            beat,
        };
        if let Err(e) = self
            .timers
            .schedule(&message, interval(&self.config.execution))
            .await
        {
            tracing::error!(error = %e, "could not schedule the execution heartbeat");
        }
    }
}

fn interval(settings: &execution::ExecutionSettings) -> Duration {
    Duration::from_millis(u64::try_from(settings.heartbeat_interval_ms).unwrap_or(15_000))
}

fn deadline_message(record: &MutationRecord, due_at_millis: i64) -> TimerMessage {
    TimerMessage::SettlementDeadline {
        run_id: record.run_id.clone(),
        tool_call_id: record.tool_call_id.clone(),
        approval_id: record.approval_id.clone(),
        due_at_millis,
    }
}
