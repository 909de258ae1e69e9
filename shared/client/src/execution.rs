//! The execution guard for approved mutations (seed 000, docs/architecture.md §7).
//!
//! A human-approved call goes through the server's ledger in three steps, and the types
//! make the order the only one possible:
//!
//! 1. [`Run::start`] (`POST …/tool-calls/{tool_call_id}/start`) consumes the
//!    [`ApprovedCall`] and admits it (budget, ceiling, the card naming exactly this call)
//!    → [`Started`]; refusals are typed ([`Error::NotExecuted`] with its `reason`,
//!    [`Error::OutcomeUnknown`], [`Error::Dispatched`], [`Error::ApprovalPending`], …).
//! 2. [`Started::dispatch`] (`…/dispatch`) → [`Dispatched`] only on
//!    `200 {state: "dispatched"}`: the one value that permits sending.
//! 3. [`Dispatched::send`] runs the caller's transport under a deadline, classifies what
//!    actually happened, and settles (`…/settle`) with that evidence:
//!
//! | what happened | evidence | durable record |
//! |---|---|---|
//! | the transport returned a [`Reply`] (success or an application-level error) | `confirmed` + the reply's result/error facts | `completed` |
//! | the transport failed ([`TransportError::failed`]) or the deadline passed after dispatch | `ambiguous` + error facts | `outcome_unknown` |
//! | nothing was sent: [`Started::abort`], [`Dispatched::abort`], or the transport's [`TransportError::not_sent`] | `not_sent` | `not_executed` |
//!
//! Every step consumes its value, so one attempt cannot be sent twice through this
//! client, and an `ambiguous` outcome cannot be retried: a new [`Run::start`] of the same
//! `(tool_call_id, approval_id)` (e.g. with [`ApprovedCall::new`] after a restart) is
//! answered [`Error::OutcomeUnknown`] until an operator reconciles it. Nothing is ever
//! retried automatically — only the HTTP requests of the ledger are (each idempotent).
//!
//! When `start` or `dispatch` is refused or fails, the client sends nothing and settles
//! nothing: the server has already settled a refused attempt, and the settlement
//! deadline settles an undispatched intent as `not_executed` (`unsent`). A `dispatch`
//! answered `409 dispatched` (an earlier attempt's answer was lost, or another holder of
//! the same attempt dispatched it) is left to the deadline as well, which settles it
//! `outcome_unknown`: this process cannot tell whether someone else sent it, and a false
//! `not_sent` would let a fresh approval run the mutation twice. If you know it was
//! never sent by anyone, say so with [`Run::settle`].
//!
//! A call a policy approved ([`ApprovedCall::is_auto`]) is not on the ledger (the server
//! admits human-approved calls only, and seed 000 says automatic approval produces no
//! `tool_execution_started`): [`Run::execute`] runs its transport under the same deadline
//! and reports [`Record::NotLedgered`].

use std::future::Future;
use std::time::Duration;

use reqwest::Method;
use serde_json::{json, Value};

use tollgate_protocol::execution::{Dispatch, ExecutionAnswer, Settle, Start};
use crate::{Error, Run};

/// Refusals of post-approval admission: the server announced the start before them.
const ADMISSION_REFUSALS: &[&str] = &[
    "no_budget",
    "tool_not_in_budget",
    "budget_exhausted",
    "call_ceiling_reached",
];

/// The most bytes of result and error facts together the server keeps.
pub const MAX_FACTS_BYTES: usize = 32 * 1024;
/// The longest transport error message recorded.
const MAX_MESSAGE_CHARS: usize = 1000;

/// An approved call: what `start` names. Not `Clone`: it is consumed by the step that
/// uses it.
#[derive(Debug, PartialEq, Eq)]
pub struct ApprovedCall {
    pub(crate) request_id: String,
    pub(crate) tool_call_id: String,
    pub(crate) approval_id: String,
    pub(crate) tool_name: String,
    pub(crate) arguments_hash: Option<String>,
    pub(crate) auto: bool,
}

impl ApprovedCall {
    /// A human-approved call known from elsewhere (e.g. kept across a restart): the
    /// card's `request_id`, the call's `tool_call_id` and `approval_id`, the tool, and
    /// the card's `arguments_hash` when it has one. The server checks all of it.
    pub fn new(
        request_id: impl Into<String>,
        tool_call_id: impl Into<String>,
        approval_id: impl Into<String>,
        tool_name: impl Into<String>,
        arguments_hash: Option<String>,
    ) -> Self {
        Self {
            request_id: request_id.into(),
            tool_call_id: tool_call_id.into(),
            approval_id: approval_id.into(),
            tool_name: tool_name.into(),
            arguments_hash,
            auto: false,
        }
    }

    /// The card's `request_id`.
    pub fn request_id(&self) -> &str {
        &self.request_id
    }

    /// The tool call's id.
    pub fn tool_call_id(&self) -> &str {
        &self.tool_call_id
    }

    /// The approval attempt's id.
    pub fn approval_id(&self) -> &str {
        &self.approval_id
    }

    /// The tool.
    pub fn tool_name(&self) -> &str {
        &self.tool_name
    }

    /// The card's `arguments_hash`.
    pub fn arguments_hash(&self) -> Option<&str> {
        self.arguments_hash.as_deref()
    }

    /// Whether a policy approved it (not on the ledger).
    pub fn is_auto(&self) -> bool {
        self.auto
    }

    /// The attempt's identity, for [`Run::settle`] and the mutation record.
    pub fn reference(&self) -> CallRef {
        CallRef {
            tool_call_id: self.tool_call_id.clone(),
            approval_id: self.approval_id.clone(),
        }
    }
}

/// One attempt of a tool call: `(tool_call_id, approval_id)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CallRef {
    /// The tool call's id.
    pub tool_call_id: String,
    /// The approval attempt's id.
    pub approval_id: String,
}

/// `state` of a durable `mutation_outcome/v1` record.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MutationState {
    /// Admitted, not dispatched.
    Intent,
    /// Dispatched, not settled.
    Dispatched,
    /// A response was confirmed.
    Completed,
    /// Dispatched and then a timeout or transport failure: an operator must reconcile.
    OutcomeUnknown,
    /// Never sent (refused, aborted, or the deadline found it undispatched).
    NotExecuted,
    /// A state this client does not know.
    Other(String),
}

impl MutationState {
    /// From the wire string.
    pub fn parse(s: &str) -> Self {
        match s {
            "intent" => MutationState::Intent,
            "dispatched" => MutationState::Dispatched,
            "completed" => MutationState::Completed,
            "outcome_unknown" => MutationState::OutcomeUnknown,
            "not_executed" => MutationState::NotExecuted,
            other => MutationState::Other(other.to_owned()),
        }
    }

    /// The wire string.
    pub fn as_str(&self) -> &str {
        match self {
            MutationState::Intent => "intent",
            MutationState::Dispatched => "dispatched",
            MutationState::Completed => "completed",
            MutationState::OutcomeUnknown => "outcome_unknown",
            MutationState::NotExecuted => "not_executed",
            MutationState::Other(s) => s,
        }
    }
}

/// The kind of evidence a settlement carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EvidenceKind {
    /// A response arrived.
    Confirmed,
    /// A timeout or transport failure after dispatch.
    Ambiguous,
    /// The request never left.
    NotSent,
}

impl EvidenceKind {
    /// `confirmed`, `ambiguous` or `not_sent`.
    pub fn as_str(self) -> &'static str {
        match self {
            EvidenceKind::Confirmed => "confirmed",
            EvidenceKind::Ambiguous => "ambiguous",
            EvidenceKind::NotSent => "not_sent",
        }
    }
}

/// What a settlement records: the evidence and its facts.
#[derive(Debug, Clone, PartialEq)]
pub enum Evidence {
    /// A response arrived: its result facts, or its application-level error facts.
    Confirmed {
        /// Facts of a successful response.
        result: Option<Value>,
        /// Facts of an application-level error response.
        error: Option<Value>,
    },
    /// A timeout or transport failure after dispatch.
    Ambiguous {
        /// What failed.
        error: Value,
    },
    /// The request never left.
    NotSent {
        /// Why.
        error: Option<Value>,
    },
}

impl Evidence {
    /// Its kind.
    pub fn kind(&self) -> EvidenceKind {
        match self {
            Evidence::Confirmed { .. } => EvidenceKind::Confirmed,
            Evidence::Ambiguous { .. } => EvidenceKind::Ambiguous,
            Evidence::NotSent { .. } => EvidenceKind::NotSent,
        }
    }

    /// `not_sent` with a reason.
    pub fn not_sent(why: &str) -> Self {
        Evidence::NotSent {
            error: Some(json!({"code": "not_sent", "message": clip(why)})),
        }
    }

    /// The settle body: `{approval_id, evidence, result?, error?}`, facts bounded to
    /// what the server keeps (a fact too large is replaced by
    /// `{"code": "facts_too_large", "bytes": n}` so the settlement is still recorded).
    fn body(&self, approval_id: &str) -> Settle {
        let (result, error) = match self {
            Evidence::Confirmed { result, error } => (result.clone(), error.clone()),
            Evidence::Ambiguous { error } => (None, Some(error.clone())),
            Evidence::NotSent { error } => (None, error.clone()),
        };
        let size = |v: &Option<Value>| v.as_ref().map_or(0, |v| v.to_string().len());
        let (result, error) = if size(&result) + size(&error) > MAX_FACTS_BYTES {
            let stub = |v: Option<Value>| {
                v.map(|v| json!({"code": "facts_too_large", "bytes": v.to_string().len()}))
            };
            (stub(result), stub(error))
        } else {
            (result, error)
        };
        Settle {
            approval_id: approval_id.into(),
            evidence: self.kind().as_str().into(),
            result,
            error,
        }
    }
}

/// What the caller's transport got back: a response. `result` facts for a success,
/// `error` facts for an application-level error (both are `confirmed`: the remote side
/// answered). Facts are what the ledger keeps — never credentials or full payloads.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply<T> {
    /// What the transport hands back to the caller.
    pub value: T,
    /// Facts of a successful response.
    pub result: Option<Value>,
    /// Facts of an application-level error response.
    pub error: Option<Value>,
}

impl<T> Reply<T> {
    /// A successful response with its facts (e.g. `{"http_status": 200}`).
    pub fn ok(value: T, result: Value) -> Self {
        Self {
            value,
            result: Some(result),
            error: None,
        }
    }

    /// An application-level error response with its facts (e.g.
    /// `{"http_status": 422, "code": "invalid"}`).
    pub fn error(value: T, error: Value) -> Self {
        Self {
            value,
            result: None,
            error: Some(error),
        }
    }
}

/// A transport that got no response.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct TransportError {
    sent: bool,
    message: String,
}

impl TransportError {
    /// The request may have left (connection reset, read timeout, …): `ambiguous`.
    pub fn failed(message: impl Into<String>) -> Self {
        Self {
            sent: true,
            message: clip(&message.into()),
        }
    }

    /// The caller aborted before sending, or knows the request certainly never left this
    /// process (it could not be built, the connection was refused): `not_sent`. Only
    /// when certain — a wrong `not_sent` lets a fresh approval run the mutation again.
    pub fn not_sent(message: impl Into<String>) -> Self {
        Self {
            sent: false,
            message: clip(&message.into()),
        }
    }

    /// Whether this says the request never left.
    pub fn is_not_sent(&self) -> bool {
        !self.sent
    }

    /// What happened.
    pub fn message(&self) -> &str {
        &self.message
    }
}

fn clip(s: &str) -> String {
    s.chars().take(MAX_MESSAGE_CHARS).collect()
}

/// What the call came to, from the caller's side.
#[derive(Debug)]
pub enum CallOutcome<T> {
    /// A response arrived.
    Responded(T),
    /// The transport failed after dispatch.
    Failed(TransportError),
    /// No response within the deadline; the transport was dropped mid-call.
    TimedOut(Duration),
    /// The transport said the request never left.
    NotSent(TransportError),
}

/// What the ledger holds after [`Dispatched::send`] / [`Run::execute`].
#[derive(Debug)]
pub enum Record {
    /// The evidence was recorded; the durable record's state.
    Settled(MutationState),
    /// A policy approved the call: it is not on the ledger.
    NotLedgered,
    /// Recording the evidence failed (after retries). The server's settlement deadline
    /// settles the call conservatively (`outcome_unknown` once dispatched); record the
    /// real evidence later with [`Run::settle`] and [`Executed::evidence`].
    Unsettled(Error),
}

/// An executed call: what happened, the evidence recorded, and the ledger's state.
#[derive(Debug)]
pub struct Executed<T> {
    /// What the call came to.
    pub outcome: CallOutcome<T>,
    /// The evidence it was classified as.
    pub evidence: Evidence,
    /// What the ledger holds now.
    pub record: Record,
}

impl<T> Executed<T> {
    /// The durable record's state, when it was settled.
    pub fn state(&self) -> Option<&MutationState> {
        match &self.record {
            Record::Settled(s) => Some(s),
            _ => None,
        }
    }

    /// The response, when one arrived.
    pub fn response(self) -> Option<T> {
        match self.outcome {
            CallOutcome::Responded(v) => Some(v),
            _ => None,
        }
    }
}

/// What the transport receives: proof the call was dispatched, and its identity (e.g. as
/// an idempotency key for the remote side).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendPermit {
    run_id: String,
    tool_call_id: String,
    approval_id: String,
    tool_name: String,
}

impl SendPermit {
    /// The run.
    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The tool call's id.
    pub fn tool_call_id(&self) -> &str {
        &self.tool_call_id
    }

    /// The approval attempt's id.
    pub fn approval_id(&self) -> &str {
        &self.approval_id
    }

    /// The tool.
    pub fn tool_name(&self) -> &str {
        &self.tool_name
    }

    /// `<run_id>:<tool_call_id>:<approval_id>`: one key per attempt, for remote APIs that
    /// deduplicate requests.
    pub fn idempotency_key(&self) -> String {
        format!("{}:{}:{}", self.run_id, self.tool_call_id, self.approval_id)
    }
}

/// Classifies what the transport did after dispatch (`Err(deadline)`: it did not finish
/// within `deadline` and was dropped).
pub(crate) fn classify<T>(
    happened: Result<Result<Reply<T>, TransportError>, Duration>,
) -> (Evidence, CallOutcome<T>) {
    match happened {
        Ok(Ok(reply)) => (
            Evidence::Confirmed {
                result: reply.result,
                error: reply.error,
            },
            CallOutcome::Responded(reply.value),
        ),
        Ok(Err(e)) if e.is_not_sent() => (Evidence::not_sent(&e.message), CallOutcome::NotSent(e)),
        Ok(Err(e)) => (
            Evidence::Ambiguous {
                error: json!({"code": "transport", "message": e.message}),
            },
            CallOutcome::Failed(e),
        ),
        Err(deadline) => (
            Evidence::Ambiguous {
                error: json!({"code": "timeout",
                              "message": format!("no response within {} ms", deadline.as_millis())}),
            },
            CallOutcome::TimedOut(deadline),
        ),
    }
}

/// An admitted call (`intent`): dispatch it, or abort it.
#[must_use = "an admitted call is dispatched or aborted; dropped, the server's settlement deadline settles it not_executed"]
#[derive(Debug)]
pub struct Started {
    run: Run,
    call: ApprovedCall,
    sequence: Option<u64>,
}

impl Started {
    /// The sequence of its `tool_execution_started`.
    pub fn sequence(&self) -> Option<u64> {
        self.sequence
    }

    /// The call.
    pub fn call(&self) -> &ApprovedCall {
        &self.call
    }

    /// `intent → dispatched` (`POST …/dispatch`), right before sending. Only
    /// `200 {state: "dispatched"}` gives the [`Dispatched`] that permits sending;
    /// anything else is an error and nothing may be sent (see the module docs).
    pub async fn dispatch(self) -> Result<Dispatched, Error> {
        let body = wire(Dispatch {
            approval_id: self.call.approval_id.clone(),
        })?;
        let answer = self
            .run
            .call(
                Method::POST,
                &["tool-calls", &self.call.tool_call_id, "dispatch"],
                Some(&body),
            )
            .await?;
        let answer: ExecutionAnswer = answer.parse(&[200])?;
        match answer.state.as_str() {
            "dispatched" => Ok(Dispatched {
                run: self.run,
                call: self.call,
            }),
            other => Err(Error::conflict(
                Some(other.to_owned()),
                None,
                None,
                "dispatch did not answer dispatched; do not send".into(),
            )),
        }
    }

    /// Gives up before dispatch: settles `not_sent` (the record becomes `not_executed`;
    /// another attempt needs a fresh approval).
    pub async fn abort(self, why: &str) -> Result<MutationState, Error> {
        self.run
            .settle(&self.call.reference(), &Evidence::not_sent(why))
            .await
    }
}

/// A dispatched call: the only value that permits sending it. Send it with
/// [`Dispatched::send`], or [`Dispatched::abort`] if it was never sent.
#[must_use = "a dispatched call is sent or aborted; dropped, the server's settlement deadline settles it outcome_unknown"]
#[derive(Debug)]
pub struct Dispatched {
    run: Run,
    call: ApprovedCall,
}

impl Dispatched {
    /// The call.
    pub fn call(&self) -> &ApprovedCall {
        &self.call
    }

    fn permit(&self) -> SendPermit {
        SendPermit {
            run_id: self.run.id().to_owned(),
            tool_call_id: self.call.tool_call_id.clone(),
            approval_id: self.call.approval_id.clone(),
            tool_name: self.call.tool_name.clone(),
        }
    }

    /// Runs `transport` with at most `deadline` to finish (dropped mid-call after it),
    /// classifies what happened (module docs) and settles it. Never fails: a settlement
    /// that could not be recorded is [`Record::Unsettled`], so the response is not lost.
    pub async fn send<T, F, Fut>(self, deadline: Duration, transport: F) -> Executed<T>
    where
        F: FnOnce(SendPermit) -> Fut,
        Fut: Future<Output = Result<Reply<T>, TransportError>>,
    {
        let happened = tokio::time::timeout(deadline, transport(self.permit()))
            .await
            .map_err(|_| deadline);
        let (evidence, outcome) = classify(happened);
        let record = match self.run.settle(&self.call.reference(), &evidence).await {
            Ok(state) => Record::Settled(state),
            Err(e) => {
                tracing::warn!(
                    run_id = self.run.id(),
                    tool_call_id = self.call.tool_call_id.as_str(),
                    evidence = evidence.kind().as_str(),
                    error = %e,
                    "the call's settlement could not be recorded"
                );
                Record::Unsettled(e)
            }
        };
        Executed {
            outcome,
            evidence,
            record,
        }
    }

    /// The caller never sent it after all: settles `not_sent`. Only when certain.
    pub async fn abort(self, why: &str) -> Result<MutationState, Error> {
        self.run
            .settle(&self.call.reference(), &Evidence::not_sent(why))
            .await
    }
}

impl Run {
    /// Admits an approved call (`POST …/tool-calls/{tool_call_id}/start`): the
    /// [`Started`] intent, or the refusal as a typed error. A repeat of an attempt that
    /// moved on is refused too ([`Error::Dispatched`], [`Error::OutcomeUnknown`], …).
    pub async fn start(&self, call: ApprovedCall) -> Result<Started, Error> {
        if call.auto {
            return Err(Error::Config(
                "a policy approved this call: the ledger admits human-approved calls only \
                 (run it directly, or with Run::execute)"
                    .into(),
            ));
        }
        let body = wire(Start {
            request_id: call.request_id.clone(),
            approval_id: call.approval_id.clone(),
            tool_name: call.tool_name.clone(),
            arguments_hash: call.arguments_hash.clone(),
        })?;
        let answer = self
            .call(
                Method::POST,
                &["tool-calls", &call.tool_call_id, "start"],
                Some(&body),
            )
            .await?;
        // Seed 000: the start is announced before admission, so a refusal at admission
        // (its reason says so) started the call too.
        if answer.status == 409
            && answer
                .body
                .get("reason")
                .and_then(Value::as_str)
                .is_some_and(|r| ADMISSION_REFUSALS.contains(&r))
        {
            self.execution_started(&call.tool_name);
        }
        let answer: ExecutionAnswer = answer.parse(&[200])?;
        if answer.state == "intent" {
            self.execution_started(&call.tool_name);
            return Ok(Started {
                run: self.clone(),
                sequence: answer.sequence,
                call,
            });
        }
        // A repeated start answers the attempt's later state: it is not ours to send.
        Err(Error::conflict(
            Some(answer.state.clone()),
            Some(call.approval_id),
            answer.reason,
            format!(
                "the attempt is already {}; it is not sent again",
                answer.state
            ),
        ))
    }

    /// The whole guarded call: [`Run::start`], [`Started::dispatch`],
    /// [`Dispatched::send`]. `Err` only when it was refused before dispatch (nothing was
    /// sent). A policy-approved call runs its transport directly ([`Record::NotLedgered`]).
    pub async fn execute<T, F, Fut>(
        &self,
        call: ApprovedCall,
        deadline: Duration,
        transport: F,
    ) -> Result<Executed<T>, Error>
    where
        F: FnOnce(SendPermit) -> Fut,
        Fut: Future<Output = Result<Reply<T>, TransportError>>,
    {
        if call.auto {
            let permit = SendPermit {
                run_id: self.id().to_owned(),
                tool_call_id: call.tool_call_id,
                approval_id: call.approval_id,
                tool_name: call.tool_name,
            };
            let happened = tokio::time::timeout(deadline, transport(permit))
                .await
                .map_err(|_| deadline);
            let (evidence, outcome) = classify(happened);
            return Ok(Executed {
                outcome,
                evidence,
                record: Record::NotLedgered,
            });
        }
        let dispatched = self.start(call).await?.dispatch().await?;
        Ok(dispatched.send(deadline, transport).await)
    }

    /// Records evidence for an attempt (`POST …/tool-calls/{tool_call_id}/settle`) and
    /// returns the record's state. The guard does this itself; use it to record what
    /// [`Record::Unsettled`] could not, or `not_sent` for an attempt you know nobody sent.
    /// The same settlement again answers the same; a contradicting one is a conflict.
    pub async fn settle(
        &self,
        call: &CallRef,
        evidence: &Evidence,
    ) -> Result<MutationState, Error> {
        let body = wire(evidence.body(&call.approval_id))?;
        let answer = self
            .call(
                Method::POST,
                &["tool-calls", &call.tool_call_id, "settle"],
                Some(&body),
            )
            .await?;
        let answer: ExecutionAnswer = answer.parse(&[200])?;
        Ok(MutationState::parse(&answer.state))
    }
}

/// A request body of the contract as JSON.
fn wire<T: serde::Serialize>(body: T) -> Result<Value, Error> {
    serde_json::to_value(body).map_err(|e| Error::Config(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_is_confirmed_with_its_facts() {
        let (e, o) = classify(Ok(Ok(Reply::ok("body", json!({"http_status": 200})))));
        assert_eq!(
            e,
            Evidence::Confirmed {
                result: Some(json!({"http_status": 200})),
                error: None
            }
        );
        assert!(matches!(o, CallOutcome::Responded("body")));
        // An application-level error is still a response: confirmed, with error facts.
        let (e, o) = classify(Ok(Ok(Reply::error((), json!({"http_status": 422})))));
        assert_eq!(
            e,
            Evidence::Confirmed {
                result: None,
                error: Some(json!({"http_status": 422}))
            }
        );
        assert_eq!(e.kind(), EvidenceKind::Confirmed);
        assert!(matches!(o, CallOutcome::Responded(())));
    }

    #[test]
    fn failures_and_timeouts_after_dispatch_are_ambiguous() {
        let (e, o) = classify::<()>(Ok(Err(TransportError::failed("connection reset"))));
        assert_eq!(e.kind(), EvidenceKind::Ambiguous);
        assert_eq!(
            e,
            Evidence::Ambiguous {
                error: json!({"code": "transport", "message": "connection reset"})
            }
        );
        assert!(matches!(o, CallOutcome::Failed(_)));
        let (e, o) = classify::<()>(Err(Duration::from_millis(250)));
        assert_eq!(
            e,
            Evidence::Ambiguous {
                error: json!({"code": "timeout", "message": "no response within 250 ms"})
            }
        );
        assert!(matches!(o, CallOutcome::TimedOut(d) if d == Duration::from_millis(250)));
    }

    #[test]
    fn only_a_certain_non_send_is_not_sent() {
        let (e, o) = classify::<()>(Ok(Err(TransportError::not_sent("aborted"))));
        assert_eq!(e.kind(), EvidenceKind::NotSent);
        assert_eq!(e, Evidence::not_sent("aborted"));
        assert!(matches!(o, CallOutcome::NotSent(_)));
        assert!(!TransportError::failed("x").is_not_sent());
    }

    #[test]
    fn settle_bodies_carry_bounded_facts() {
        let body = Evidence::Confirmed {
            result: Some(json!({"n": 1})),
            error: None,
        }
        .body("a-1");
        assert_eq!(
            wire(body).unwrap(),
            json!({"approval_id": "a-1", "evidence": "confirmed", "result": {"n": 1}})
        );
        let body = wire(Evidence::not_sent("why").body("a-1")).unwrap();
        assert_eq!(body["evidence"], "not_sent");
        assert!(body.get("result").is_none());
        let huge = "x".repeat(MAX_FACTS_BYTES);
        let body = Evidence::Confirmed {
            result: Some(json!({"body": huge})),
            error: None,
        }
        .body("a-1");
        let body = wire(body).unwrap();
        assert_eq!(body["result"]["code"], "facts_too_large");
        assert!(body.to_string().len() < 1024);
        // Messages are clipped.
        assert_eq!(
            TransportError::failed("y".repeat(5000)).message().len(),
            MAX_MESSAGE_CHARS
        );
    }

    #[test]
    fn mutation_states_round_trip() {
        for s in [
            "intent",
            "dispatched",
            "completed",
            "outcome_unknown",
            "not_executed",
            "later",
        ] {
            assert_eq!(MutationState::parse(s).as_str(), s);
        }
        assert_eq!(
            MutationState::parse("later"),
            MutationState::Other("later".into())
        );
    }
}
