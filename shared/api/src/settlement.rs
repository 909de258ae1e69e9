//! Approved execution over HTTP (seed 000, docs/architecture.md §5 and §7) — the `settlement`
//! function: an agent starts, dispatches and settles a human-approved mutating call;
//! anyone who may read the run reads its `mutation_outcome/v1` records; an operator
//! reconciles an unknown outcome. Every transition is one read–decide–commit of
//! [`decide_mutation`]: the domain decides ([`tollgate_domain::execution`]) and the store
//! writes the record with its event in one transaction. The settlement deadline and the
//! execution heartbeats run on the timer queue ([`Gate`]'s timer handler calls
//! [`Gate::settlement_deadline`] and [`Gate::execution_beat`]).
//!
//! Receipts (`GET /api/receipts/{delivery_id}`) are here too, served by `ingress`.

use std::time::Duration;

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tollgate_domain::approval::valid_id;
use tollgate_domain::execution::{
    self, Answer, Decision, MutationRecord, MutationState, Observed, Settlement, StartRefusal,
    StartRequest, Verdict,
};
use tollgate_domain::{
    delivery_run_id, now_millis, validate_run_id, ApprovalRequest, RunHead, RunStatus,
};
use tollgate_store::{decide_mutation, Beat, MutationOutcome, StoreError, MAX_MUTATIONS_LISTED};
use tollgate_timers::{TimerError, TimerMessage};
use tracing::instrument;

use crate::auth::{Credentials, Role};
use crate::replay::authorize_read;
use crate::request::{query_param, JsonBody};
use crate::{ApiError, Deps, Gate};

/// Routes of the `settlement` function.
pub fn routes() -> Router<Deps> {
    Router::new()
        .route(
            "/api/runs/{run_id}/tool-calls/{tool_call_id}/start",
            post(start),
        )
        .route(
            "/api/runs/{run_id}/tool-calls/{tool_call_id}/dispatch",
            post(dispatch),
        )
        .route(
            "/api/runs/{run_id}/tool-calls/{tool_call_id}/settle",
            post(settle),
        )
        .route("/api/runs/{run_id}/mutations", get(list))
        .route(
            "/api/runs/{run_id}/mutations/{tool_call_id}/{approval_id}",
            get(read_one),
        )
        .route(
            "/api/runs/{run_id}/mutations/{tool_call_id}/{approval_id}/reconcile",
            post(reconcile),
        )
}

/// The receipt route (served by `ingress`, which creates runs).
pub fn receipt_routes() -> Router<Deps> {
    Router::new().route("/api/receipts/{delivery_id}", get(receipt))
}

/// A listing answers at most this many bytes of records (under Lambda's 6 MB answer).
const MAX_LISTING_BYTES: usize = 5 * 1024 * 1024;

/// Listed records per answer unless `?limit=` says otherwise.
const DEFAULT_LISTED: usize = 100;

fn unknown_attempt() -> ApiError {
    ApiError::not_found("no such mutation attempt").with_state("unknown")
}

fn run_not_found() -> ApiError {
    ApiError::not_found("run not found")
}

/// A domain answer as HTTP: 200, 409 or 400 with its JSON body.
fn respond(answer: Answer) -> Response {
    let status = match answer.verdict {
        Verdict::Ok => StatusCode::OK,
        Verdict::Conflict => StatusCode::CONFLICT,
        Verdict::Invalid => StatusCode::BAD_REQUEST,
    };
    (status, Json(answer.body)).into_response()
}

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

impl From<Refused> for Result<Response, ApiError> {
    fn from(refused: Refused) -> Self {
        match refused {
            Refused::OtherIncarnation => Err(run_not_found()),
            Refused::NoAttempt | Refused::NotDue(_) => Err(unknown_attempt()),
            Refused::Start(r) => Ok(respond(r.answer())),
        }
    }
}

/// Path ids the store keys records by: anything else names no attempt (404).
fn checked_ids(run_id: &str, ids: &[&str]) -> Result<(), ApiError> {
    if !validate_run_id(run_id) {
        return Err(run_not_found());
    }
    if ids.iter().all(|id| valid_id(id)) {
        Ok(())
    } else {
        Err(unknown_attempt())
    }
}

fn parse<T: serde::de::DeserializeOwned>(value: Value, what: &str) -> Result<T, ApiError> {
    serde_json::from_value(value).map_err(|e| ApiError::bad_request(format!("invalid {what}: {e}")))
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
    ) -> Result<Result<MutationOutcome, Refused>, ApiError>
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
            Err(StoreError::NotFound) => Err(run_not_found()),
            Err(e) => Err(e.into()),
        }
    }

    /// `start` of the approved call `card` names (checked against `req`).
    pub async fn start_execution(
        &self,
        req: &StartRequest,
        card: &ApprovalRequest,
        incarnation: &str,
    ) -> Result<Response, ApiError> {
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
        Ok(respond(outcome.decision.answer()))
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
    ) -> Result<Result<MutationOutcome, Response>, ApiError>
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
            Err(refused) => Result::<Response, ApiError>::from(refused).map(Err),
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
    ) -> Result<Response, ApiError> {
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
        Ok(respond(o.decision.answer()))
    }

    /// `settle` with the agent's evidence.
    pub async fn settle_execution(
        &self,
        run_id: &str,
        tool_call_id: &str,
        approval_id: &str,
        incarnation: &str,
        settlement: &Settlement,
    ) -> Result<Response, ApiError> {
        let decided = self
            .step(
                run_id,
                tool_call_id,
                approval_id,
                Some(incarnation),
                |r, run| execution::settle(r, settlement, run, now_millis()),
            )
            .await?;
        Ok(decided.map_or_else(|answer| answer, |o| respond(o.decision.answer())))
    }

    /// An operator's reconciliation of an `outcome_unknown` attempt.
    pub async fn reconcile_execution(
        &self,
        run_id: &str,
        tool_call_id: &str,
        approval_id: &str,
        observed: Observed,
        by: &str,
    ) -> Result<Response, ApiError> {
        let decided = self
            .step(run_id, tool_call_id, approval_id, None, |r, run| {
                execution::reconcile(r, observed, by, run, now_millis())
            })
            .await?;
        Ok(decided.map_or_else(|answer| answer, |o| respond(o.decision.answer())))
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
    pub(crate) async fn settle_if_due(
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
            Err(e) if e.status == StatusCode::NOT_FOUND => Ok(false),
            Err(e) => Err(TimerError::Unavailable(e.error)),
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

/// An agent's call on its run: the run id checked, the run token's incarnation, the
/// body parsed.
async fn agent_call<T: serde::de::DeserializeOwned>(
    deps: &Deps,
    run_id: &str,
    creds: &Credentials,
    body: JsonBody,
    what: &str,
) -> Result<(String, T), ApiError> {
    if !validate_run_id(run_id) {
        return Err(run_not_found());
    }
    let incarnation = deps.auth.require_run_token(creds, run_id)?;
    Ok((incarnation, parse(body.value().await?, what)?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StartBody {
    request_id: String,
    approval_id: String,
    tool_name: String,
    arguments_hash: Option<String>,
}

#[instrument(skip_all, fields(run_id = %run_id, tool_call_id = %tool_call_id))]
async fn start(
    State(deps): State<Deps>,
    Path((run_id, tool_call_id)): Path<(String, String)>,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let (incarnation, body): (String, StartBody) =
        agent_call(&deps, &run_id, &creds, body, "start").await?;
    let req = StartRequest {
        run_id,
        tool_call_id,
        request_id: body.request_id,
        approval_id: body.approval_id,
        tool_name: body.tool_name,
        arguments_hash: body.arguments_hash,
    };
    if let Err(refusal) = req.validate() {
        return Ok(respond(refusal.answer()));
    }
    let card = deps
        .gate
        .store()
        .read_card(&req.run_id, &req.request_id)
        .await?
        .ok_or_else(|| ApiError::not_found("no such approval request").with_state("unknown"))?;
    deps.gate.start_execution(&req, &card, &incarnation).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DispatchBody {
    approval_id: String,
}

#[instrument(skip_all, fields(run_id = %run_id, tool_call_id = %tool_call_id))]
async fn dispatch(
    State(deps): State<Deps>,
    Path((run_id, tool_call_id)): Path<(String, String)>,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let (incarnation, body): (String, DispatchBody) =
        agent_call(&deps, &run_id, &creds, body, "dispatch").await?;
    checked_ids(&run_id, &[&tool_call_id, &body.approval_id])?;
    deps.gate
        .dispatch_execution(&run_id, &tool_call_id, &body.approval_id, &incarnation)
        .await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleBody {
    approval_id: String,
    evidence: String,
    result: Option<Value>,
    error: Option<Value>,
}

#[instrument(skip_all, fields(run_id = %run_id, tool_call_id = %tool_call_id))]
async fn settle(
    State(deps): State<Deps>,
    Path((run_id, tool_call_id)): Path<(String, String)>,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let (incarnation, body): (String, SettleBody) =
        agent_call(&deps, &run_id, &creds, body, "settlement").await?;
    let settlement = Settlement::new(&body.evidence, body.result, body.error)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    checked_ids(&run_id, &[&tool_call_id, &body.approval_id])?;
    deps.gate
        .settle_execution(
            &run_id,
            &tool_call_id,
            &body.approval_id,
            &incarnation,
            &settlement,
        )
        .await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReconcileBody {
    observed: String,
}

#[instrument(skip_all, fields(run_id = %run_id, tool_call_id = %tool_call_id, approval_id = %approval_id))]
async fn reconcile(
    State(deps): State<Deps>,
    Path((run_id, tool_call_id, approval_id)): Path<(String, String, String)>,
    creds: Credentials,
    body: JsonBody,
) -> Result<Response, ApiError> {
    let claims = deps.auth.require_role(&creds, Role::Operator)?;
    let body: ReconcileBody = parse(body.value().await?, "reconciliation")?;
    let observed = Observed::parse(&body.observed)
        .ok_or_else(|| ApiError::bad_request("observed must be applied or not_applied"))?;
    checked_ids(&run_id, &[&tool_call_id, &approval_id])?;
    // An operator of one project reconciles only that project's runs.
    let head = deps
        .store
        .read_head(&run_id)
        .await?
        .filter(|h| claims.project_id.is_none() || claims.project_id == h.project_id)
        .ok_or_else(run_not_found)?;
    deps.gate
        .reconcile_execution(
            &head.run_id,
            &tool_call_id,
            &approval_id,
            observed,
            &claims.sub,
        )
        .await
}

/// The head of a run the caller may read (404 otherwise, as replay answers).
async fn readable_head(
    deps: &Deps,
    creds: &Credentials,
    run_id: &str,
) -> Result<RunHead, ApiError> {
    if !validate_run_id(run_id) {
        return Err(run_not_found());
    }
    let caller = deps.auth.caller(creds, Some(run_id))?;
    let head = deps
        .store
        .read_head(run_id)
        .await?
        .ok_or_else(run_not_found)?;
    authorize_read(&caller, &head)?;
    Ok(head)
}

#[instrument(skip_all, fields(run_id = %run_id))]
async fn list(
    State(deps): State<Deps>,
    Path(run_id): Path<String>,
    RawQuery(query): RawQuery,
    creds: Credentials,
) -> Result<Response, ApiError> {
    let limit = match query_param(query.as_deref(), "limit") {
        None => DEFAULT_LISTED,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|l| (1..=MAX_MUTATIONS_LISTED).contains(l))
            .ok_or_else(|| {
                ApiError::bad_request(format!("limit must be 1 to {MAX_MUTATIONS_LISTED}"))
            })?,
    };
    let head = readable_head(&deps, &creds, &run_id).await?;
    let records = deps
        .gate
        .store()
        .list_mutations(&head.run_id, limit + 1)
        .await?;
    let mut has_more = records.len() > limit;
    let mut bytes = 0;
    let mut listed = Vec::new();
    for record in records.iter().take(limit) {
        let json = record.to_json();
        bytes += json.to_string().len() + 1;
        if bytes > MAX_LISTING_BYTES {
            has_more = true;
            break;
        }
        listed.push(json);
    }
    Ok(
        Json(json!({"run_id": head.run_id, "mutations": listed, "has_more": has_more}))
            .into_response(),
    )
}

#[instrument(skip_all, fields(run_id = %run_id, tool_call_id = %tool_call_id, approval_id = %approval_id))]
async fn read_one(
    State(deps): State<Deps>,
    Path((run_id, tool_call_id, approval_id)): Path<(String, String, String)>,
    creds: Credentials,
) -> Result<Response, ApiError> {
    let head = readable_head(&deps, &creds, &run_id).await?;
    checked_ids(&run_id, &[&tool_call_id, &approval_id])?;
    let record = deps
        .gate
        .store()
        .read_mutation(&head.run_id, &tool_call_id, &approval_id)
        .await?
        .ok_or_else(unknown_attempt)?;
    Ok(Json(record.to_json()).into_response())
}

/// The run a delivery created, for the agent that created it (seed 000: "use the
/// original delivery identity to find its later receipt").
#[instrument(skip_all)]
async fn receipt(
    State(deps): State<Deps>,
    Path(delivery_id): Path<String>,
    creds: Credentials,
) -> Result<Response, ApiError> {
    let claims = deps.auth.require_role(&creds, Role::Agent)?;
    let none = || ApiError::not_found("no run was created for this delivery").with_state("unknown");
    if delivery_id.is_empty() || delivery_id.chars().count() > tollgate_domain::approval::MAX_TEXT {
        return Err(none());
    }
    let run_id = delivery_run_id(&claims.sub, claims.project_id.as_deref(), &delivery_id);
    let head = deps
        .store
        .read_head(&run_id)
        .await?
        .filter(|h| {
            h.delivery_id.as_deref() == Some(delivery_id.as_str())
                && h.created_by == claims.sub
                && h.project_id == claims.project_id
        })
        .ok_or_else(none)?;
    let mut answer = crate::ingress::run_receipt(&deps, &head);
    answer["status"] = head.status.as_str().into();
    Ok(Json(answer).into_response())
}
