//! Lost timers: the heartbeat chain and the sweeper settle attempts whose
//! settlement-deadline timer was lost.

use super::*;

/// A timer queue that loses every message of the kinds in `lose` (a failed SendMessage,
/// a purged or dead-lettered message) and delivers the others in this process.
struct Losing {
    inner: tollgate_timers::EmbeddedTimers,
    lose: &'static [&'static str],
}

#[async_trait::async_trait]
impl tollgate_timers::TimerQueue for Losing {
    async fn schedule(
        &self,
        message: &tollgate_timers::TimerMessage,
        delay: Duration,
    ) -> Result<(), tollgate_timers::TimerError> {
        if self.lose.contains(&message.kind()) {
            return Ok(());
        }
        self.inner.schedule(message, delay).await
    }
}

/// A server whose timer queue loses the kinds in `lose`; keep the loop while it runs.
async fn losing_server(
    backend: Backend,
    lose: &'static [&'static str],
) -> (TestServer, tollgate_timers::TimerLoop) {
    let inner = tollgate_timers::EmbeddedTimers::new();
    let deps = tollgate_api::Deps::new(
        store_for(backend).await,
        std::sync::Arc::new(Losing {
            inner: inner.clone(),
            lose,
        }),
        GateConfig {
            heartbeat_every: Duration::from_secs(60),
            execution: ExecutionSettings {
                settlement_deadline_ms: DEADLINE_MS,
                heartbeat_interval_ms: BEAT_MS,
            },
            ..GateConfig::default()
        },
        tollgate_api::Auth::new(tollgate_tests::TEST_SECRET.as_bytes()),
    );
    let timers = inner.attach(deps.gate.clone());
    (TestServer::with_deps(deps).await, timers)
}

/// GIVEN a dispatched call whose settlement-deadline message was lost WHEN nobody
/// settles it THEN the end of its heartbeat chain settles it at the deadline
/// (`outcome_unknown`, the terminal `tool_execution` on the stream) — and with every
/// timer lost, an operator can still reconcile it once its deadline has passed.
pub(super) async fn lost_deadline_timers_are_backstopped(backend: Backend) {
    let (srv, _timers) = losing_server(backend, &["settlement_deadline"]).await;
    let run = budget_run(&srv, json!({TOOL: 2})).await;
    let call = approved(&srv, &run, TOOL).await;
    assert_eq!(start(&srv, &run, &call).await.0, StatusCode::OK);
    assert_eq!(dispatch(&srv, &run, &call).await.0, StatusCode::OK);
    let r = wait_record(&srv, &run, &call, "the heartbeat chain's backstop", |r| {
        r["state"] == "outcome_unknown"
    })
    .await;
    assert_eq!(r["reason"], "settlement_deadline", "{r}");
    let evs = events(&srv, &run).await;
    assert_terminal(
        &evs,
        &call,
        json!({"execution_status": "executed", "mutation_outcome": "outcome_unknown"}),
        &["result"],
    );
    assert!(
        !of_call(&evs, &call, "heartbeat").is_empty(),
        "{:?}",
        types(&evs)
    );

    let (srv, _timers) =
        losing_server(backend, &["settlement_deadline", "execution_heartbeat"]).await;
    let run = budget_run(&srv, json!({TOOL: 2})).await;
    let call = approved(&srv, &run, TOOL).await;
    assert_eq!(start(&srv, &run, &call).await.0, StatusCode::OK);
    assert_eq!(dispatch(&srv, &run, &call).await.0, StatusCode::OK);
    let (status, v) = reconcile(
        &srv,
        &run,
        &call,
        &srv.operator_token,
        json!({"observed": "applied"}),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "not before the deadline: {v}");
    assert_eq!(v["state"], "dispatched");
    tokio::time::sleep(Duration::from_millis(DEADLINE_MS as u64 + 200)).await;
    assert_eq!(
        record(&srv, &run, &call).await["state"],
        "dispatched",
        "no timer ran"
    );
    let (status, v) = reconcile(
        &srv,
        &run,
        &call,
        &srv.operator_token,
        json!({"observed": "not_applied"}),
    )
    .await;
    assert_eq!(
        (status, &v["state"]),
        (StatusCode::OK, &json!("not_executed")),
        "{v}"
    );
    let evs = events(&srv, &run).await;
    let tail: Vec<&str> = types(&evs).into_iter().rev().take(2).collect();
    assert_eq!(tail, ["tool_execution_reconciled", "tool_execution"]);
    // Not applied: a fresh approval may run the call.
    let fresh = Call::of(TOOL, &call.tool_call_id);
    arm(&srv, &run, &fresh).await;
    approve(&srv, &run, &fresh).await;
    assert_eq!(start(&srv, &run, &fresh).await.0, StatusCode::OK);
}

/// GIVEN a server that loses every settlement-deadline and execution-heartbeat timer,
/// with its sweeper running, and two started calls — one never dispatched, one
/// dispatched — that nobody settles WHEN their deadline passes THEN the sweeper settles
/// them exactly as the deadline timer would: the intent `not_executed` (`unsent`,
/// `tool_execution` not_executed), the dispatched one `outcome_unknown`
/// (`settlement_deadline`, `tool_execution` executed), each announced once; a dispatch
/// after that is refused.
pub(super) async fn the_sweeper_settles_attempts_whose_deadline_timer_was_lost(backend: Backend) {
    let inner = tollgate_timers::EmbeddedTimers::new();
    let deps = tollgate_api::Deps::new(
        store_for(backend).await,
        std::sync::Arc::new(Losing {
            inner: inner.clone(),
            lose: &["settlement_deadline", "execution_heartbeat"],
        }),
        GateConfig {
            heartbeat_every: Duration::from_secs(60),
            sweep_every: Duration::from_millis(250),
            execution: ExecutionSettings {
                settlement_deadline_ms: DEADLINE_MS,
                heartbeat_interval_ms: BEAT_MS,
            },
            ..GateConfig::default()
        },
        tollgate_api::Auth::new(tollgate_tests::TEST_SECRET.as_bytes()),
    )
    .with_sweeper();
    let _timers = inner.attach(deps.gate.clone());
    let srv = TestServer::with_deps(deps).await;
    let run = budget_run(&srv, json!({TOOL: 3})).await;
    let unsent = approved(&srv, &run, TOOL).await;
    let sent = approved(&srv, &run, TOOL).await;
    assert_eq!(start(&srv, &run, &unsent).await.0, StatusCode::OK);
    assert_eq!(start(&srv, &run, &sent).await.0, StatusCode::OK);
    assert_eq!(dispatch(&srv, &run, &sent).await.0, StatusCode::OK);

    let r = wait_record(&srv, &run, &unsent, "the sweeper (intent)", |r| {
        r["state"] != "intent"
    })
    .await;
    assert_eq!(
        (&r["state"], &r["reason"]),
        (&json!("not_executed"), &json!("unsent")),
        "{r}"
    );
    let r = wait_record(&srv, &run, &sent, "the sweeper (dispatched)", |r| {
        r["state"] != "dispatched"
    })
    .await;
    assert_eq!(
        (&r["state"], &r["reason"]),
        (&json!("outcome_unknown"), &json!("settlement_deadline")),
        "{r}"
    );
    let evs = events(&srv, &run).await;
    assert_terminal(
        &evs,
        &unsent,
        json!({"execution_status": "not_executed", "mutation_outcome": "not_executed"}),
        &["result"],
    );
    assert_terminal(
        &evs,
        &sent,
        json!({"execution_status": "executed", "mutation_outcome": "outcome_unknown"}),
        &["result"],
    );
    let (status, v) = dispatch(&srv, &run, &unsent).await;
    assert_eq!(
        (status, &v["state"]),
        (StatusCode::CONFLICT, &json!("not_executed")),
        "{v}"
    );
}
