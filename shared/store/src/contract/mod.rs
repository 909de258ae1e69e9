//! The store contract: one suite, run unchanged against every adapter
//! (`contract_suite!` instantiates it for a store factory). Each case uses fresh run ids,
//! so adapters can share tables between cases and test runs.
//!
//! The suite by port: `runs` the run log (creation, appends, fencing, pages),
//! `approvals` approval cards (arming, resolution, deadlines, forwarded decisions),
//! `policies` grants (listing, storing, revoking, auto-approval), `stalls` the stall
//! guard's reads and writes, and `mutations` durable mutation records of approved
//! execution. This module holds what the parts share and `contract_suite!`.

mod approvals;
mod deliveries;
mod mutations;
mod policies;
mod runs;
mod stalls;

pub use approvals::*;
pub use deliveries::*;
pub use mutations::*;
pub use policies::*;
pub use runs::*;
pub use stalls::*;

use std::sync::Arc;

use serde_json::{json, Map, Value};
use tollgate_domain::{
    ApprovalRequest, ApprovalState, EventDraft, NewRun, Resolution, RunStatus, Scope, TerminalKind,
};

use crate::{Armed, Beat, CreateOutcome, Forwarded, Resolved, RunRef, StoreError};

pub type Store = Arc<dyn crate::Store>;

fn fresh_id(tag: &str) -> String {
    format!("contract-{tag}-{}", uuid::Uuid::new_v4().simple())
}

fn producer(event_type: &str, event_id: Option<&str>, payload: Value) -> EventDraft {
    let Value::Object(payload) = payload else {
        panic!("payload must be an object")
    };
    EventDraft {
        event_type: event_type.into(),
        event_id: event_id.map(Into::into),
        payload,
    }
}

/// Calls `call` again while it fails `Unavailable` — the store gave up on a contended or
/// slow write and wrote nothing (`docs/architecture.md` §1) — at most five times with a
/// growing pause, as a client retries; logs each retry and answers the last result. For
/// the contract's races, which are about something else: on a loaded machine DynamoDB
/// Local can be slow enough for a writer among many to spend its contention budget.
async fn until_served<T, F, Fut>(what: &str, mut call: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut result = call().await;
    for attempt in 1..5u64 {
        let Err(StoreError::Unavailable(why)) = &result else {
            break;
        };
        eprintln!("{what}: unavailable on attempt {attempt} ({why}), calling again");
        tokio::time::sleep(std::time::Duration::from_millis(250 * attempt)).await;
        result = call().await;
    }
    result
}

async fn new_run(store: &Store, tag: &str) -> String {
    let run_id = fresh_id(tag);
    let outcome = store
        .create_run(NewRun {
            run_id: run_id.clone(),
            created_by: "contract".into(),
            channel_id: Some("C1".into()),
            ..NewRun::default()
        })
        .await
        .expect("create_run");
    assert!(matches!(outcome, CreateOutcome::Created(_)));
    run_id
}

async fn all_events(store: &Store, run_id: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let page = store
            .read_events(run_id, after, 1000)
            .await
            .expect("read_events");
        for e in &page.events {
            let v: Value = serde_json::from_str(&e.body).expect("stored body is JSON");
            assert_eq!(v["sequence"], json!(e.sequence), "body and key agree");
            out.push(v);
        }
        if !page.has_more {
            return out;
        }
        after = page
            .events
            .last()
            .map(|e| e.sequence)
            .expect("has_more with no events");
    }
}

fn sequences(events: &[Value]) -> Vec<u64> {
    events
        .iter()
        .map(|e| e["sequence"].as_u64().unwrap())
        .collect()
}

fn card_for(run_id: &str, request_id: &str, coordinator: Option<&str>) -> ApprovalRequest {
    let now = tollgate_domain::now_millis();
    ApprovalRequest {
        run_id: run_id.into(),
        request_id: request_id.into(),
        tool_name: "web_fetch".into(),
        tool_call_id: request_id.into(),
        approval_id: request_id.into(),
        explicit_ids: false,
        url: Some("https://example.com/a".into()),
        intention: Some("read the docs".into()),
        message: Some("The agent wants to fetch a URL.".into()),
        arguments_hash: Some("sha256:abc".into()),
        state: ApprovalState::Pending,
        scope: None,
        decided_by: None,
        decided_at: None,
        created_at: now,
        expires_at: now + 300_000,
        coordinator_run_id: coordinator.map(str::to_owned),
        subtask_id: Some(json!(3)),
        project_id: None,
        end_reason: None,
        auto_approval: None,
        arguments_preview: None,
        decision_reason: None,
        held_by_pod: false,
    }
}

async fn child_of(store: &Store, coordinator: &str, tag: &str) -> String {
    let run_id = fresh_id(tag);
    store
        .create_run(NewRun {
            run_id: run_id.clone(),
            kind: tollgate_domain::RunKind::Child,
            parent_run_id: Some(coordinator.into()),
            subtask_id: Some(json!(3)),
            created_by: "contract".into(),
            ..NewRun::default()
        })
        .await
        .expect("create child");
    run_id
}

fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

fn approve(by: &str) -> Resolution {
    Resolution::Approved {
        scope: Scope::Once,
        by: by.into(),
        reason: None,
    }
}

async fn count_of(store: &Store, run_id: &str, event_type: &str) -> usize {
    all_events(store, run_id)
        .await
        .iter()
        .filter(|e| e["type"] == event_type)
        .count()
}

fn tool_policy(run_id: &str, request_id: &str, tool: &str) -> tollgate_domain::Policy {
    tollgate_domain::Policy {
        scope: Scope::Tool,
        scope_key: format!("run:{run_id}"),
        tool_name: tool.into(),
        owner: Some("alice".into()),
        project_id: None,
        origin_run_id: run_id.into(),
        request_id: request_id.into(),
        granted_by: "alice".into(),
        granted_at: tollgate_domain::now_millis(),
        revoked_by: None,
        revoked_at: None,
        reached_runs: vec![run_id.into()],
    }
}

/// True when an AWS endpoint (an emulator or real AWS) is configured for the tests.
pub fn aws_endpoint_configured() -> bool {
    [
        "AWS_ENDPOINT_URL_DYNAMODB",
        "AWS_ENDPOINT_URL",
        "TOLLGATE_TEST_REAL_AWS",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some())
}

/// The DynamoDB store the AWS-backed tests share (tables `TOLLGATE_TEST_TABLE_PREFIX`,
/// default `tollgate-test-`, created from the template when missing).
pub async fn dynamo_test_store() -> crate::dynamo::DynamoStore {
    assert!(
        aws_endpoint_configured(),
        "no DynamoDB endpoint: run `make test` (it starts DynamoDB Local) or set AWS_ENDPOINT_URL"
    );
    let config = crate::dynamo::sdk_config().await;
    let client = crate::dynamo::client(&config);
    let prefix =
        std::env::var("TOLLGATE_TEST_TABLE_PREFIX").unwrap_or_else(|_| "tollgate-test-".into());
    let tables = crate::dynamo::Tables::with_prefix(&prefix);
    crate::schema::ensure_tables(&client, &tables)
        .await
        .expect("create test tables from the template");
    crate::dynamo::DynamoStore::new(client, tables)
}

/// Instantiates the whole suite for one adapter: `contract_suite!(async { store })`.
#[macro_export]
macro_rules! contract_suite {
    ($factory:expr) => {
        async fn __store() -> $crate::contract::Store {
            $factory.await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn runs_are_listed_per_tenant_newest_first() {
            $crate::contract::runs_are_listed_per_tenant_newest_first(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn create_is_idempotent_and_starts_at_one() {
            $crate::contract::create_is_idempotent_and_starts_at_one(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn appends_are_gapless_and_verbatim() {
            $crate::contract::appends_are_gapless_and_verbatim(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn full_batch_of_keyed_events_fits_one_append() {
            $crate::contract::full_batch_of_keyed_events_fits_one_append(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn event_ids_deduplicate() {
            $crate::contract::event_ids_deduplicate(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_appends_are_gapless() {
            $crate::contract::concurrent_appends_are_gapless(__store().await, 8, 25).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn racing_retries_land_once() {
            $crate::contract::racing_retries_land_once(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn terminal_fencing() {
            $crate::contract::terminal_fencing(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn appends_racing_terminal_never_follow_it() {
            $crate::contract::appends_racing_terminal_never_follow_it(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn pages_stop_at_the_byte_cap() {
            $crate::contract::pages_stop_at_the_byte_cap(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn writes_name_one_incarnation() {
            $crate::contract::writes_name_one_incarnation(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn served_pages_end_at_the_terminal_event() {
            $crate::contract::served_pages_end_at_the_terminal_event(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn arming_writes_one_card_and_one_event() {
            $crate::contract::arming_writes_one_card_and_one_event(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn coordinators_mirror_their_children() {
            $crate::contract::coordinators_mirror_their_children(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn one_resolution_wins() {
            $crate::contract::one_resolution_wins(vec![__store().await]).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn deadlines_and_ended_runs() {
            $crate::contract::deadlines_and_ended_runs(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn heartbeats_never_follow_the_resolution() {
            $crate::contract::heartbeats_never_follow_the_resolution(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn policies_come_only_from_winning_approvals() {
            $crate::contract::policies_come_only_from_winning_approvals(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn forwarded_decisions_are_recorded_once() {
            $crate::contract::forwarded_decisions_are_recorded_once(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_silent_child_is_failed_once() {
            $crate::contract::a_silent_child_is_failed_once(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_silence_is_reported_once() {
            $crate::contract::a_silence_is_reported_once(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn expiry_races_clicks_at_the_deadline() {
            $crate::contract::expiry_races_clicks_at_the_deadline(vec![__store().await], 200).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn replay_pages() {
            $crate::contract::replay_pages(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn revocation_stands_while_its_runs_are_busy() {
            $crate::contract::revocation_stands_while_its_runs_are_busy(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn reported_and_orphaned_children_leave_the_stall_listing() {
            $crate::contract::reported_and_orphaned_children_leave_the_stall_listing(
                __store().await,
            )
            .await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn auto_approval_stores_an_approved_card() {
            $crate::contract::auto_approval_stores_an_approved_card(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_run_holds_a_bounded_number_of_pending_cards() {
            $crate::contract::a_run_holds_a_bounded_number_of_pending_cards(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn start_admits_once() {
            $crate::contract::start_admits_once(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn concurrent_starts_respect_the_call_ceiling() {
            $crate::contract::concurrent_starts_respect_the_call_ceiling(vec![__store().await])
                .await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn confirmed_settlement_completes() {
            $crate::contract::confirmed_settlement_completes(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn deadlines_settle_and_late_evidence_is_kept() {
            $crate::contract::deadlines_settle_and_late_evidence_is_kept(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_dispatch_never_lands_after_the_run_ended() {
            $crate::contract::a_dispatch_never_lands_after_the_run_ended(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn execution_heartbeats_stop_at_settlement() {
            $crate::contract::execution_heartbeats_stop_at_settlement(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn policies_page_with_a_cursor() {
            $crate::contract::policies_page_with_a_cursor(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn retention_never_frees_a_block() {
            $crate::contract::retention_never_frees_a_block(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_delivery_is_claimed_once() {
            $crate::contract::a_delivery_is_claimed_once(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn a_sink_is_first_enabled_once() {
            $crate::contract::a_sink_is_first_enabled_once(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn due_deliveries_and_dead_letters() {
            $crate::contract::due_deliveries_and_dead_letters(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn due_deliveries_are_shared_between_projects() {
            $crate::contract::due_deliveries_are_shared_between_projects(__store().await).await
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn nothing_follows_the_end_of_a_run() {
            $crate::contract::nothing_follows_the_end_of_a_run(__store().await).await
        }
    };
}
