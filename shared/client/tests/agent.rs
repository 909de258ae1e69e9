//! The agent side against the real server (embedded store, loopback): runs and retries,
//! gates that wait, the execution guard's evidence.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use serde_json::json;
use tollgate_client::{
    ApprovedCall, Budget, CallOutcome, Decision, Error, EvidenceKind, GateRequest, MutationState,
    Record, Reply, Run, RunSpec, Scope, TransportError,
};

use common::{black_hole, bounded, client, decide, page, server, Proxy};

fn budgeted(owner: Option<&str>) -> RunSpec {
    RunSpec {
        owner: owner.map(str::to_owned),
        budget: Some(Budget::new().tool("web_fetch", 3).call_ceiling(5)),
        ..RunSpec::default()
    }
}

fn fetch_gate() -> GateRequest {
    GateRequest::new("web_fetch", json!({"url": "https://example.com/docs"}))
        .url("https://example.com/docs")
        .message("The agent wants to fetch a URL.")
}

/// Arms a gate, starts waiting in a task, checks it is still waiting a moment later,
/// then lets `decide` act on the request id; returns the decision.
async fn gate_decided_by<F, Fut>(run: &Run, request: GateRequest, act: F) -> Decision
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let armed = run.arm(request).await.unwrap();
    assert!(armed.is_pending());
    let request_id = armed.request_id().to_owned();
    let waiter = {
        let run = run.clone();
        tokio::spawn(async move { run.wait(armed).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "the gate waits for the decision");
    act(request_id).await;
    waiter.await.unwrap().unwrap()
}

fn events_of(events: &[tollgate_client::Event]) -> Vec<&str> {
    events.iter().map(|e| e.event_type.as_str()).collect()
}

/// GIVEN a pending card WHEN an operator approves it THEN the waiting gate returns
/// Approved (scope, decided_by, not auto) with the call that was approved.
#[tokio::test]
async fn gate_waits_and_returns_approved() {
    bounded(async {
        let srv = server().await;
        let run = client(&srv.base, &srv)
            .create_run(budgeted(None))
            .await
            .unwrap();
        let (srv, run_id) = (&srv, run.id().to_owned());
        let decision = gate_decided_by(&run, fetch_gate(), |rid| async move {
            let (status, _) = decide(srv, &run_id, "tool-approvals", &rid, "once").await;
            assert_eq!(status, StatusCode::OK);
        })
        .await;
        let Decision::Approved {
            scope,
            decided_by,
            auto,
            call,
        } = decision
        else {
            panic!("approved expected, got {decision:?}")
        };
        assert_eq!(scope, Scope::Once);
        assert_eq!(decided_by.as_deref(), Some("test-operator"));
        assert!(!auto);
        assert_eq!(call.tool_name(), "web_fetch");
        assert_eq!(call.tool_call_id(), call.request_id());
        assert_eq!(
            call.arguments_hash(),
            Some(
                tollgate_client::arguments_hash(&json!({"url": "https://example.com/docs"}))
                    .as_str()
            )
        );
    })
    .await
}

/// GIVEN a pending card WHEN an operator denies it THEN the gate returns Denied.
#[tokio::test]
async fn gate_waits_and_returns_denied() {
    bounded(async {
        let srv = server().await;
        let run = client(&srv.base, &srv)
            .create_run(RunSpec::default())
            .await
            .unwrap();
        let (srv, run_id) = (&srv, run.id().to_owned());
        let decision = gate_decided_by(&run, fetch_gate(), |rid| async move {
            decide(srv, &run_id, "tool-denials", &rid, "once").await;
        })
        .await;
        assert!(
            matches!(&decision, Decision::Denied { decided_by: Some(by) } if by == "test-operator"),
            "{decision:?}"
        );
    })
    .await
}

/// GIVEN a card with a 1 s timeout WHEN nobody answers THEN the gate returns Expired
/// (told by the server's expiry on the stream).
#[tokio::test]
async fn gate_returns_expired_when_nobody_answers() {
    bounded(async {
        let srv = server().await;
        let run = client(&srv.base, &srv)
            .create_run(RunSpec::default())
            .await
            .unwrap();
        let t0 = Instant::now();
        let decision = run
            .gate(fetch_gate().timeout(Duration::from_secs(1)))
            .await
            .unwrap();
        assert!(matches!(decision, Decision::Expired), "{decision:?}");
        assert!(t0.elapsed() >= Duration::from_millis(900));
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    })
    .await
}

/// GIVEN an owner's `tool` approval (a durable policy) WHEN the run gates the same tool
/// again THEN the gate returns Approved at once, auto, decided by the policy — and the
/// ledger does not admit it (policy approvals run without it).
#[tokio::test]
async fn auto_approval_returns_at_once() {
    bounded(async {
        let srv = server().await;
        let run = client(&srv.base, &srv)
            .create_run(budgeted(Some("test-operator")))
            .await
            .unwrap();
        let (srv, run_id) = (&srv, run.id().to_owned());
        let first = gate_decided_by(&run, fetch_gate(), |rid| async move {
            let (status, v) = decide(srv, &run_id, "tool-approvals", &rid, "tool").await;
            assert_eq!(status, StatusCode::OK, "{v}");
        })
        .await;
        assert!(matches!(
            first,
            Decision::Approved {
                scope: Scope::Tool,
                auto: false,
                ..
            }
        ));

        let t0 = Instant::now();
        let second = run.gate(fetch_gate()).await.unwrap();
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        let Decision::Approved {
            scope,
            decided_by,
            auto,
            call,
        } = second
        else {
            panic!("auto-approval expected, got {second:?}")
        };
        assert!(auto);
        assert_eq!(scope, Scope::Tool);
        assert!(decided_by.unwrap().starts_with("policy:"));
        assert!(call.is_auto());
        assert!(matches!(run.start(call).await, Err(Error::Config(_))));
        let page = run.events(0, None).await.unwrap();
        assert!(events_of(&page.events).contains(&"tool.auto_approved"));
    })
    .await
}

/// GIVEN a gate waiting WHEN the run ends THEN the gate fails with RunEnded.
#[tokio::test]
async fn the_run_ending_while_waiting_is_an_error() {
    bounded(async {
        let srv = server().await;
        let run = client(&srv.base, &srv)
            .create_run(RunSpec::default())
            .await
            .unwrap();
        let armed = run.arm(fetch_gate()).await.unwrap();
        let request_id = armed.request_id().to_owned();
        let waiter = {
            let run = run.clone();
            tokio::spawn(async move { run.wait(armed).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        run.complete(None).await.unwrap();
        let err = waiter.await.unwrap().unwrap_err();
        assert!(
            matches!(&err, Error::RunEnded { request_id: r, .. } if *r == request_id),
            "{err}"
        );
    })
    .await
}

/// GIVEN a gateway without the live stream (405) WHEN the gate waits THEN it polls the
/// event pages and still returns the decision.
#[tokio::test]
async fn without_the_stream_the_gate_polls() {
    bounded(async {
        let srv = server().await;
        let proxy = Proxy::start(&srv.base, true).await;
        let run = client(&proxy.base, &srv)
            .create_run(RunSpec::default())
            .await
            .unwrap();
        let (srv, run_id) = (&srv, run.id().to_owned());
        let decision = gate_decided_by(&run, fetch_gate(), |rid| async move {
            decide(srv, &run_id, "tool-approvals", &rid, "once").await;
        })
        .await;
        assert!(decision.is_approved(), "{decision:?}");
        assert_eq!(
            proxy.hits(Method::GET, "/stream"),
            1,
            "tried once, then polled"
        );
        assert!(proxy.hits(Method::GET, "/events") >= 2);
    })
    .await
}

/// GIVEN a create with a delivery_id whose first answer is lost WHEN the client retries
/// THEN it gets the run the first attempt made; a later create and the receipt name the
/// same run.
#[tokio::test]
async fn a_retried_create_with_a_delivery_id_gets_the_same_run() {
    bounded(async {
        let srv = server().await;
        let proxy = Proxy::start(&srv.base, false).await;
        let client = client(&proxy.base, &srv);
        let delivery = format!("delivery-{}", uuid::Uuid::new_v4());
        let spec = RunSpec {
            delivery_id: Some(delivery.clone()),
            ..RunSpec::default()
        };
        proxy.lose(Method::POST, "/api/runs", 1);
        let run = client.create_run(spec.clone()).await.unwrap();
        assert_eq!(
            proxy.hits(Method::POST, "/api/runs"),
            2,
            "one lost answer, one retry"
        );
        assert!(
            !run.created(),
            "the retry found the run the lost attempt made"
        );

        let again = client.create_run(spec).await.unwrap();
        assert_eq!(again.id(), run.id());
        assert_eq!(again.token(), run.token());
        let receipt = client.receipt(&delivery).await.unwrap();
        assert_eq!(receipt.run.id(), run.id());
        assert_eq!(receipt.status, "running");
        assert!(matches!(
            client.receipt("never-delivered").await,
            Err(Error::NotFound { state: Some(s), .. }) if s == "unknown"
        ));
        // The run has one run_started: nothing was created twice.
        let page = run.events(0, None).await.unwrap();
        assert_eq!(events_of(&page.events), ["run_started"]);
    })
    .await
}

/// GIVEN an append whose answer is lost WHEN the client retries it THEN the events are
/// on the stream once (their automatic event_ids), with the sequences first assigned;
/// after the run ends an append is RunTerminal (not retried).
#[tokio::test]
async fn a_retried_append_appends_once() {
    bounded(async {
        let srv = server().await;
        let proxy = Proxy::start(&srv.base, false).await;
        let run = client(&proxy.base, &srv)
            .create_run(RunSpec::default())
            .await
            .unwrap();
        proxy.lose(Method::POST, "/events", 2);
        let seqs = run
            .append([
                json!({"type": "agent.message", "text": "one"}),
                json!({"type": "tool.call", "tool": "web_fetch"}),
            ])
            .await
            .unwrap();
        assert_eq!(seqs, [2, 3]);
        assert_eq!(proxy.hits(Method::POST, "/events"), 3);
        let page = run.events(0, None).await.unwrap();
        assert_eq!(
            events_of(&page.events),
            ["run_started", "agent.message", "tool.call"]
        );
        run.complete(None).await.unwrap();
        let before = proxy.hits(Method::POST, "/events");
        let err = run
            .append([json!({"type": "agent.message"})])
            .await
            .unwrap_err();
        assert!(matches!(err, Error::RunTerminal { .. }), "{err}");
        assert_eq!(
            proxy.hits(Method::POST, "/events"),
            before + 1,
            "4xx not retried"
        );
    })
    .await
}

/// An approved call on a budgeted run, decided by the operator (`once`).
async fn approved_call(srv: &tollgate_tests::TestServer, run: &Run) -> ApprovedCall {
    let decision = gate_decided_by(run, fetch_gate(), |rid| async move {
        decide(srv, run.id(), "tool-approvals", &rid, "once").await;
    })
    .await;
    decision.into_call().expect("approved")
}

/// GIVEN an approved call WHEN the transport gets a response THEN the guard settles
/// `confirmed` with its facts and the record is `completed`.
#[tokio::test]
async fn the_guard_settles_confirmed_on_a_response() {
    bounded(async {
        let srv = server().await;
        let run = client(&srv.base, &srv)
            .create_run(budgeted(None))
            .await
            .unwrap();
        let call = approved_call(&srv, &run).await;
        let ids = call.reference();
        let url = page(200).await;
        let executed = run
            .execute(call, Duration::from_secs(5), |permit| async move {
                let resp = reqwest::Client::new()
                    .get(&url)
                    .header("Idempotency-Key", permit.idempotency_key())
                    .send()
                    .await
                    .map_err(|e| TransportError::failed(e.to_string()))?;
                let status = resp.status().as_u16();
                Ok(Reply::ok(status, json!({"http_status": status})))
            })
            .await
            .unwrap();
        assert_eq!(executed.evidence.kind(), EvidenceKind::Confirmed);
        assert_eq!(executed.state(), Some(&MutationState::Completed));
        assert!(matches!(executed.outcome, CallOutcome::Responded(200)));
        let record = run
            .mutation(&ids.tool_call_id, &ids.approval_id)
            .await
            .unwrap();
        assert_eq!(record.state, "completed");
        assert_eq!(record.result, Some(json!({"http_status": 200})));
    })
    .await
}

/// GIVEN an approved call WHEN the remote answers with an application error THEN it is
/// still `confirmed` (a response arrived), with error facts.
#[tokio::test]
async fn an_application_error_is_confirmed_with_error_facts() {
    bounded(async {
        let srv = server().await;
        let run = client(&srv.base, &srv)
            .create_run(budgeted(None))
            .await
            .unwrap();
        let call = approved_call(&srv, &run).await;
        let ids = call.reference();
        let executed = run
            .execute(call, Duration::from_secs(5), |_| async {
                Ok::<_, TransportError>(Reply::error((), json!({"http_status": 422})))
            })
            .await
            .unwrap();
        assert_eq!(executed.evidence.kind(), EvidenceKind::Confirmed);
        assert_eq!(executed.state(), Some(&MutationState::Completed));
        let record = run
            .mutation(&ids.tool_call_id, &ids.approval_id)
            .await
            .unwrap();
        assert_eq!(record.error, Some(json!({"http_status": 422})));
    })
    .await
}

/// GIVEN a dispatched call to a server that accepts and never answers WHEN the
/// transport's deadline passes THEN the guard settles `ambiguous` (`outcome_unknown`),
/// and starting the same attempt again is refused with OutcomeUnknown.
#[tokio::test]
async fn a_call_killed_after_dispatch_is_ambiguous_and_cannot_be_retried() {
    bounded(async {
        let srv = server().await;
        let run = client(&srv.base, &srv)
            .create_run(budgeted(None))
            .await
            .unwrap();
        let call = approved_call(&srv, &run).await;
        let again = ApprovedCall::new(
            call.request_id(),
            call.tool_call_id(),
            call.approval_id(),
            call.tool_name(),
            call.arguments_hash().map(str::to_owned),
        );
        let url = black_hole().await;
        let t0 = Instant::now();
        let executed = run
            .execute(call, Duration::from_millis(300), |_| async move {
                let resp = reqwest::Client::new()
                    .get(&url)
                    .send()
                    .await
                    .map_err(|e| TransportError::failed(e.to_string()))?;
                Ok(Reply::ok(resp.status().as_u16(), json!({})))
            })
            .await
            .unwrap();
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert_eq!(executed.evidence.kind(), EvidenceKind::Ambiguous);
        assert!(matches!(executed.outcome, CallOutcome::TimedOut(_)));
        assert_eq!(executed.state(), Some(&MutationState::OutcomeUnknown));

        let err = run.start(again).await.unwrap_err();
        assert!(matches!(err, Error::OutcomeUnknown { .. }), "{err}");
        assert!(err.to_string().contains("outcome_unknown"));
    })
    .await
}

/// GIVEN an admitted call WHEN the caller aborts before sending (or its transport says
/// nothing left) THEN the guard settles `not_sent` and the record is `not_executed`; a
/// new start of that attempt is NotExecuted.
#[tokio::test]
async fn aborting_before_sending_is_not_sent() {
    bounded(async {
        let srv = server().await;
        let run = client(&srv.base, &srv)
            .create_run(budgeted(None))
            .await
            .unwrap();

        let call = approved_call(&srv, &run).await;
        let (rid, tcid, aid, hash) = (
            call.request_id().to_owned(),
            call.tool_call_id().to_owned(),
            call.approval_id().to_owned(),
            call.arguments_hash().map(str::to_owned),
        );
        let started = run.start(call).await.unwrap();
        assert!(started.sequence().is_some());
        let state = started.abort("the user changed their mind").await.unwrap();
        assert_eq!(state, MutationState::NotExecuted);
        let record = run.mutation(&tcid, &aid).await.unwrap();
        assert_eq!(record.state, "not_executed");
        let err = run
            .start(ApprovedCall::new(rid, tcid, aid, "web_fetch", hash))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::NotExecuted { .. }), "{err}");

        // After dispatch, a transport that knows nothing left says so.
        let call = approved_call(&srv, &run).await;
        let executed = run
            .execute(call, Duration::from_secs(5), |_| async {
                Err::<Reply<()>, _>(TransportError::not_sent("aborted before sending"))
            })
            .await
            .unwrap();
        assert_eq!(executed.evidence.kind(), EvidenceKind::NotSent);
        assert!(matches!(
            executed.record,
            Record::Settled(MutationState::NotExecuted)
        ));
    })
    .await
}

/// GIVEN refusals before dispatch THEN they are typed: no budget → NotExecuted
/// (`no_budget`), a pending card → ApprovalPending, an attempt already dispatched →
/// Dispatched (nothing is sent twice).
#[tokio::test]
async fn refusals_before_dispatch_are_typed() {
    bounded(async {
        let srv = server().await;
        let client = client(&srv.base, &srv);

        let unbudgeted = client.create_run(RunSpec::default()).await.unwrap();
        let call = approved_call(&srv, &unbudgeted).await;
        let err = unbudgeted.start(call).await.unwrap_err();
        assert!(
            matches!(&err, Error::NotExecuted { reason: Some(r), .. } if r == "no_budget"),
            "{err}"
        );

        let run = client.create_run(budgeted(None)).await.unwrap();
        let armed = run.arm(fetch_gate()).await.unwrap();
        let pending = ApprovedCall::new(
            armed.request_id(),
            armed.request_id(),
            armed.request_id(),
            "web_fetch",
            Some(tollgate_client::arguments_hash(
                &json!({"url": "https://example.com/docs"}),
            )),
        );
        let err = run.start(pending).await.unwrap_err();
        assert!(matches!(err, Error::ApprovalPending { .. }), "{err}");

        let call = approved_call(&srv, &run).await;
        let copy = ApprovedCall::new(
            call.request_id(),
            call.tool_call_id(),
            call.approval_id(),
            call.tool_name(),
            call.arguments_hash().map(str::to_owned),
        );
        let dispatched = run.start(call).await.unwrap().dispatch().await.unwrap();
        let err = run.start(copy).await.unwrap_err();
        assert!(matches!(err, Error::Dispatched { .. }), "{err}");
        let executed = dispatched
            .send(Duration::from_secs(5), |_| async {
                Ok::<_, TransportError>(Reply::ok((), json!({"ok": true})))
            })
            .await;
        assert_eq!(executed.state(), Some(&MutationState::Completed));
    })
    .await
}

/// GIVEN a run handle with seed 000's `on_tool_execution_started(tool_name)` hook WHEN a
/// human-approved call is admitted, and another is refused at admission THEN the hook is
/// told the tool's name for both (the server announced both starts); a call whose start
/// the server refuses before admission (a pending card) does not call it.
#[tokio::test]
async fn the_execution_started_hook_follows_the_servers_start_event() {
    bounded(async {
        let srv = server().await;
        let client = client(&srv.base, &srv);
        let seen = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let hook = {
            let seen = seen.clone();
            move |tool: &str| seen.lock().unwrap().push(tool.to_owned())
        };
        let unbudgeted = client
            .create_run(RunSpec::default())
            .await
            .unwrap()
            .on_tool_execution_started(hook.clone());
        let call = approved_call(&srv, &unbudgeted).await;
        let err = unbudgeted.start(call).await.unwrap_err();
        assert!(matches!(&err, Error::NotExecuted { .. }), "{err}");
        assert_eq!(*seen.lock().unwrap(), ["web_fetch"], "refused at admission");

        let run = client
            .create_run(budgeted(None))
            .await
            .unwrap()
            .on_tool_execution_started(hook);
        let armed = run.arm(fetch_gate()).await.unwrap();
        let pending = ApprovedCall::new(
            armed.request_id(),
            armed.request_id(),
            armed.request_id(),
            "web_fetch",
            Some(tollgate_client::arguments_hash(
                &json!({"url": "https://example.com/docs"}),
            )),
        );
        assert!(run.start(pending).await.is_err());
        assert_eq!(
            seen.lock().unwrap().len(),
            1,
            "a pending card started nothing"
        );
        let call = approved_call(&srv, &run).await;
        let started = run.start(call).await.unwrap();
        assert_eq!(*seen.lock().unwrap(), ["web_fetch", "web_fetch"]);
        let events = run.events(0, None).await.unwrap().events;
        let starts = events
            .iter()
            .filter(|e| e.event_type == "tool_execution_started")
            .count();
        assert_eq!(starts, 1, "one start on this run, one hook call");
        started.abort("test").await.unwrap();
    })
    .await
}
