//! Tenants apart (issue 15): every index a tenant writes is keyed per project and
//! write-sharded, no listing reads another tenant's cards, and each tenant's timers and
//! open cards are bounded.
//!
//! - `dynamo_only_*` need DynamoDB Local (and, for the queue tests, LocalStack SQS); `make
//!   test` starts both. Read and write units come from the DynamoDB cost meter
//!   (`tollgate_tests::meter`), billed as AWS bills them.
//! - The caps run on both stores (`memory::…`, `dynamo::…`).

use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tollgate_api::{GateConfig, Role};
use tollgate_tests::meter::{CallKind, DynamoMeter};
use tollgate_tests::{store_for, Backend, TestServer};
use tollgate_timers::{TimerHandler, TimerMessage};

fn request_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Arms a card; a 503 `unavailable` (the store gave up on a contended write, nothing
/// written) is sent again, as a client would: these tests race arms on shared counters.
async fn arm(srv: &TestServer, run_id: &str, token: &str, body: Value) -> (StatusCode, Value) {
    srv.post_until_served(
        &format!("/api/runs/{run_id}/approval-requests"),
        token,
        &body,
    )
    .await
}

/// A run of `project` (created by an agent of that project): `(run_id, run_token)`.
async fn project_run(srv: &TestServer, project: &str) -> (String, String) {
    let agent = srv
        .auth
        .mint_jwt("agent", Role::Agent, 600, Some(project.into()));
    let (status, run) = srv.post("/api/runs", &agent, &json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    (
        run["run_id"].as_str().unwrap().to_owned(),
        run["run_token"].as_str().unwrap().to_owned(),
    )
}

/// Arms `n` cards in `project` (runs of at most 200 open cards each), 8 at a time, each
/// with `timeout_seconds`.
async fn fill(srv: &Arc<TestServer>, project: &str, n: usize, timeout_seconds: u64) {
    let mut runs = Vec::new();
    for _ in 0..n.div_ceil(200) {
        runs.push(project_run(srv, project).await);
    }
    let mut pending = tokio::task::JoinSet::new();
    for i in 0..n {
        let srv = srv.clone();
        let (run_id, token) = runs[i % runs.len()].clone();
        pending.spawn(async move {
            let (status, v) = arm(
                &srv,
                &run_id,
                &token,
                json!({"request_id": request_id(), "tool_name": "web_fetch",
                       "timeout_seconds": timeout_seconds}),
            )
            .await;
            assert_eq!(status, StatusCode::CREATED, "{v}");
        });
        if pending.len() >= 8 {
            pending.join_next().await.unwrap().unwrap();
        }
    }
    while let Some(done) = pending.join_next().await {
        done.unwrap();
    }
}

/// Read units of everything `meter` logged since its last take.
fn read_units(meter: &DynamoMeter) -> f64 {
    let log = meter.take();
    let bills = log.bill_calls(meter.tables(), &Default::default());
    bills
        .iter()
        .filter(|b| b.kind == CallKind::Read)
        .map(|b| b.billed())
        .sum()
}

/// The request ids a pending listing answered.
fn listed(v: &Value) -> Vec<String> {
    v["approvals"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["request_id"].as_str().unwrap().to_owned())
        .collect()
}

/// GIVEN a project with 3 open cards WHEN its operator lists the pending cards with no
/// other tenant's cards, and again after another project armed 1,200 cards with sooner
/// deadlines THEN the second listing costs the same read units (within 10 %) and still
/// shows all three cards: the listing reads only its own project's index partitions.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_project_listing_reads_do_not_grow_with_other_tenants() {
    let base = tollgate_tests::dynamo_store().await;
    let meter = DynamoMeter::new(base.tables());
    let store = Arc::new(meter.instrument(&base));
    // No heartbeat or sweep inside the test: the meter sees the listings' reads only.
    let quiet = GateConfig {
        sweep_every: Duration::from_secs(3600),
        ..capped(u64::MAX - 1)
    };
    let srv = Arc::new(TestServer::with_deps(TestServer::deps(store, quiet)).await);
    let mine = format!("mine-{}", uuid::Uuid::new_v4().simple());
    let theirs = format!("theirs-{}", uuid::Uuid::new_v4().simple());
    let (run_id, token) = project_run(&srv, &mine).await;
    let mut rids = Vec::new();
    for _ in 0..3 {
        let rid = request_id();
        let (status, v) = arm(
            &srv,
            &run_id,
            &token,
            json!({"request_id": rid, "tool_name": "web_fetch", "timeout_seconds": 3600}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        rids.push(rid);
    }
    let op = srv
        .auth
        .mint_jwt("op-mine", Role::Operator, 600, Some(mine.clone()));
    // The index may lag a moment behind the arms: list until it shows all three.
    let list = || async {
        let (status, v) = srv.get("/api/approvals?state=pending", &op).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        v
    };
    for _ in 0..100 {
        if listed(&list().await).len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    meter.take();
    let alone = list().await;
    let units_alone = read_units(&meter);
    assert_eq!(listed(&alone).len(), 3, "{alone}");

    // Another tenant's 1,200 cards, all due sooner than ours.
    fill(&srv, &theirs, 1200, 600).await;
    let their_op = srv
        .auth
        .mint_jwt("op-theirs", Role::Operator, 600, Some(theirs.clone()));
    for _ in 0..200 {
        let (_, v) = srv.get("/api/approvals?state=pending", &their_op).await;
        if listed(&v).len() == 500 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    meter.take();
    let crowded = list().await;
    let units_crowded = read_units(&meter);
    let mut seen = listed(&crowded);
    seen.sort();
    rids.sort();
    assert_eq!(seen, rids, "the project's own cards, nobody else's");
    eprintln!(
        "project operator's pending listing: {units_alone} read units alone, \
         {units_crowded} beside another project's 1,200 cards"
    );
    assert!(
        (units_crowded - units_alone).abs() <= units_alone * 0.10,
        "read units {units_alone} alone vs {units_crowded} beside 1,200 other cards"
    );
}

/// GIVEN child runs WHEN they append N events in all THEN the writes to the stall guard's
/// index (`running_child`) land on several shard keys, never one constant partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_child_appends_spread_over_stall_shards() {
    let base = tollgate_tests::dynamo_store().await;
    let meter = DynamoMeter::new(base.tables());
    let store = Arc::new(meter.instrument(&base));
    let srv = TestServer::with_deps(TestServer::deps(store, GateConfig::default())).await;
    let (coordinator, _) = srv
        .create_run(json!({"kind": "coordinator", "owner": "alice"}))
        .await;
    let mut children = Vec::new();
    for i in 0..4 {
        children.push(
            srv.create_run(json!({"kind": "child", "parent_run_id": coordinator,
                                   "subtask_id": i, "owner": "alice"}))
                .await,
        );
    }
    meter.take();
    const APPENDS: usize = 64;
    for i in 0..APPENDS {
        let (run_id, token) = &children[i % children.len()];
        srv.append(
            run_id,
            token,
            json!([{"type": "agent.message", "text": "working"}]),
        )
        .await;
    }
    let log = meter.take();
    let mut keys = std::collections::BTreeMap::<String, usize>::new();
    let mut child_head_writes = 0;
    for items in log.transactions() {
        for item in items {
            let Some(update) = item.update() else {
                continue;
            };
            if let Some(aws_sdk_dynamodb::types::AttributeValue::S(key)) = update
                .expression_attribute_values()
                .and_then(|v| v.get(":rc"))
            {
                child_head_writes += 1;
                *keys.entry(key.clone()).or_default() += 1;
            }
        }
    }
    eprintln!("{child_head_writes} child appends wrote running_child keys {keys:?}");
    assert_eq!(
        child_head_writes, APPENDS,
        "every child append rewrites its entry"
    );
    assert!(
        keys.keys().all(|k| k.starts_with("running#")),
        "sharded keys only: {keys:?}"
    );
    assert!(
        keys.len() >= 6,
        "{APPENDS} appends spread over at least 6 of the 8 shards: {keys:?}"
    );
    let busiest = keys.values().max().copied().unwrap_or(0);
    assert!(
        busiest <= APPENDS / 3,
        "no shard takes a third of the writes: {keys:?}"
    );
}

fn capped(open: u64) -> GateConfig {
    GateConfig {
        heartbeat_every: Duration::from_secs(600),
        max_open_cards_per_project: open,
        ..GateConfig::default()
    }
}

/// GIVEN a cap of 3 open cards per project WHEN a project arms a fourth THEN 429 JSON
/// with a clear error and nothing written; another project is not held up; a decision or
/// an expiry gives the place back; a retried arm of an open card is not a new one.
async fn open_cards_per_project_are_capped(backend: Backend) {
    let srv = TestServer::with_deps(TestServer::deps(store_for(backend).await, capped(3))).await;
    let project = format!("capped-{}", uuid::Uuid::new_v4().simple());
    let (run_a, token_a) = project_run(&srv, &project).await;
    let (run_b, token_b) = project_run(&srv, &project).await;
    let mut rids = Vec::new();
    for (run, token) in [(&run_a, &token_a), (&run_b, &token_b), (&run_b, &token_b)] {
        let rid = request_id();
        let (status, v) = arm(
            &srv,
            run,
            token,
            json!({"request_id": rid, "tool_name": "web_fetch"}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
        rids.push(rid);
    }
    // A retry of an open card answers it (it holds its place already).
    let (status, _) = arm(
        &srv,
        &run_b,
        &token_b,
        json!({"request_id": rids[2], "tool_name": "web_fetch"}),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let over = request_id();
    let (status, v) = arm(
        &srv,
        &run_a,
        &token_a,
        json!({"request_id": over, "tool_name": "web_fetch"}),
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(v["state"], "limit_reached", "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("TOLLGATE_MAX_OPEN_CARDS_PER_PROJECT"),
        "{v}"
    );
    let (status, _) = srv
        .get(
            &format!("/api/runs/{run_a}/approval-requests/{over}"),
            &token_a,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was written");
    // Another tenant arms as usual.
    let (run_q, token_q) = project_run(&srv, &format!("{project}-other")).await;
    let (status, v) = arm(
        &srv,
        &run_q,
        &token_q,
        json!({"request_id": request_id(), "tool_name": "web_fetch"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    // A decision gives the place back.
    let op = srv
        .auth
        .mint_jwt("op", Role::Operator, 600, Some(project.clone()));
    let (status, v) = srv
        .post(
            &format!("/api/runs/{run_a}/tool-denials"),
            &op,
            &json!({"request_id": rids[0]}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let (status, v) = arm(
        &srv,
        &run_a,
        &token_a,
        json!({"request_id": over, "tool_name": "web_fetch", "timeout_seconds": 1}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let (status, _) = arm(
        &srv,
        &run_a,
        &token_a,
        json!({"request_id": request_id(), "tool_name": "web_fetch"}),
    )
    .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    // So does an expiry (the 1 s card's timer; waited for by its state, never a clock).
    let mut state = Value::Null;
    for _ in 0..200 {
        let (_, card) = srv
            .get(
                &format!("/api/runs/{run_a}/approval-requests/{over}"),
                &token_a,
            )
            .await;
        state = card["state"].clone();
        if state == "expired" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(state, "expired");
    let (status, v) = arm(
        &srv,
        &run_a,
        &token_a,
        json!({"request_id": request_id(), "tool_name": "web_fetch"}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
}

/// GIVEN the default card timeout cap (24 h) and a deployment that sets 1 h WHEN a card
/// asks for more THEN 400 JSON naming the cap (the same request never succeeds later, so
/// not a 429), nothing written; the cap itself is accepted.
async fn card_timeouts_are_capped(backend: Backend) {
    let srv = TestServer::with_deps(TestServer::deps(
        store_for(backend).await,
        GateConfig::default(),
    ))
    .await;
    let (run_id, token) = srv.create_run(json!({})).await;
    let rid = request_id();
    let (status, v) = arm(
        &srv,
        &run_id,
        &token,
        json!({"request_id": rid, "tool_name": "web_fetch", "timeout_seconds": 86_401}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["state"], "timeout_too_long", "{v}");
    assert!(v["error"].as_str().unwrap().contains("86400"), "{v}");
    let (status, _) = srv
        .get(
            &format!("/api/runs/{run_id}/approval-requests/{rid}"),
            &token,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, v) = arm(
        &srv,
        &run_id,
        &token,
        json!({"request_id": rid, "tool_name": "web_fetch", "timeout_seconds": 86_400}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");

    let hour = TestServer::with_deps(TestServer::deps(
        store_for(backend).await,
        GateConfig {
            max_timeout_seconds: 3600,
            ..GateConfig::default()
        },
    ))
    .await;
    let (run_id, token) = hour.create_run(json!({})).await;
    let (status, v) = arm(
        &hour,
        &run_id,
        &token,
        json!({"request_id": request_id(), "tool_name": "web_fetch", "timeout_seconds": 3601}),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["error"].as_str().unwrap().contains("3600"), "{v}");
}

/// Pages of a pending listing, `limit` at a time, following `next_after` to the end:
/// every page's request ids in order.
async fn pages(srv: &TestServer, token: &str, limit: usize) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let path = match &after {
            None => format!("/api/approvals?state=pending&limit={limit}"),
            Some(a) => format!("/api/approvals?state=pending&limit={limit}&after={a}"),
        };
        let (status, v) = srv.get(&path, token).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        out.push(listed(&v));
        if v["has_more"] != true {
            assert!(v.get("next_after").is_none(), "{v}");
            return out;
        }
        after = Some(v["next_after"].as_str().expect("next_after").to_owned());
        assert!(out.len() < 100, "the pages end");
    }
}

/// GIVEN 7 open cards (two pairs asking the same timeout) WHEN an operator lists them 3 at a
/// time following `next_after` THEN the pages hold every card exactly once, soonest
/// deadline first, as one listing would — for a project operator on both stores and for a
/// global operator (on the embedded store, where this test's cards are all there is).
async fn listings_page_with_a_cursor(backend: Backend) {
    let srv = TestServer::with_deps(TestServer::deps(store_for(backend).await, capped(2000))).await;
    let project = format!("pages-{}", uuid::Uuid::new_v4().simple());
    let (run_a, token_a) = project_run(&srv, &project).await;
    let (run_b, token_b) = project_run(&srv, &project).await;
    for (i, timeout) in [600, 700, 700, 800, 900, 900, 1000].into_iter().enumerate() {
        let (run, token) = if i % 2 == 0 {
            (&run_a, &token_a)
        } else {
            (&run_b, &token_b)
        };
        let (status, v) = arm(
            &srv,
            run,
            token,
            json!({"request_id": request_id(), "tool_name": "web_fetch", "timeout_seconds": timeout}),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{v}");
    }
    let project_op = srv
        .auth
        .mint_jwt("op", Role::Operator, 600, Some(project.clone()));
    let mut operators = vec![project_op];
    if backend == Backend::Memory {
        operators.push(srv.operator_token.clone());
    }
    for op in operators {
        let mut whole = Vec::new();
        for _ in 0..100 {
            let (_, v) = srv.get("/api/approvals?state=pending", &op).await;
            whole = listed(&v);
            if whole.len() == 7 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(whole.len(), 7);
        let paged = pages(&srv, &op, 3).await;
        assert_eq!(
            paged.iter().map(Vec::len).collect::<Vec<_>>(),
            vec![3, 3, 1]
        );
        assert_eq!(paged.concat(), whole, "the pages are the listing, in order");
    }
    let (status, v) = srv
        .get(
            "/api/approvals?state=pending&after=nonsense",
            &srv.operator_token,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
}

/// GIVEN runs of two projects, and one without a project WHEN operators list runs over
/// HTTP THEN a project's operator pages through its own runs only (newest first, each
/// once), naming another project is 403, an operator of every project lists the project
/// it names (or, naming none, the runs without one), an agent is refused, and a bad
/// `limit`, `status`, filter or cursor is a 400 `ErrorBody`.
/// Run ids are global (one id space for every project). A create naming an id another
/// tenant holds answers exactly what a create naming an id of one's own project's run
/// (with other fields) answers: 409 `run_exists`, the same body (but for a request id),
/// nothing of the holder; reading that run answers what reading an id nobody holds
/// answers (404). Nothing is written by the refused creates.
async fn a_taken_run_id_says_nothing_of_its_holder(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let (acme, other) = (format!("acme-{tag}"), format!("other-{tag}"));
    let agent = |sub: &str, project: &str| {
        srv.auth
            .mint_jwt(sub, Role::Agent, 600, Some(project.to_owned()))
    };
    let (ours, theirs) = (agent("agent", &acme), agent("intruder", &other));
    let mine = format!("run-mine-{tag}");
    let (status, v) = srv
        .post(
            "/api/runs",
            &ours,
            &json!({"run_id": mine, "owner": "alice"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let mut refusals = Vec::new();
    for (token, who) in [(&theirs, "another tenant"), (&ours, "its own tenant")] {
        let (status, mut v) = srv
            .post(
                "/api/runs",
                token,
                &json!({"run_id": mine, "owner": "mallory"}),
            )
            .await;
        assert_eq!(status, StatusCode::CONFLICT, "{who}: {v}");
        assert_eq!(v["state"], "run_exists", "{who}: {v}");
        v.as_object_mut().unwrap().remove("request_id");
        refusals.push(v);
    }
    assert_eq!(refusals[0], refusals[1], "the holder's tenant is not told");
    for key in ["owner", "project_id", "created_by", "status", "sequence"] {
        assert!(refusals[0].get(key).is_none(), "{key} in {}", refusals[0]);
    }
    let (held, mut a) = srv.get(&format!("/api/runs/{mine}/events"), &theirs).await;
    let nobody = format!("run-nobody-{tag}");
    let (none, mut b) = srv
        .get(&format!("/api/runs/{nobody}/events"), &theirs)
        .await;
    assert_eq!((held, none), (StatusCode::NOT_FOUND, StatusCode::NOT_FOUND));
    for v in [&mut a, &mut b] {
        v.as_object_mut().unwrap().remove("request_id");
    }
    assert_eq!(
        a.to_string().replace(&mine, "ID"),
        b.to_string().replace(&nobody, "ID"),
        "another tenant's run reads as no run"
    );
    // The run is as its creator made it.
    let (status, page) = srv
        .get(&format!("/api/runs/{mine}/events"), &srv.operator_token)
        .await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["events"][0]["owner"], "alice", "{page}");
}

async fn runs_are_listed_per_tenant(backend: Backend) {
    let srv = TestServer::start(backend).await;
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let (acme, other) = (format!("acme-{tag}"), format!("other-{tag}"));
    let mut ours = Vec::new();
    for _ in 0..5 {
        ours.push(project_run(&srv, &acme).await.0);
    }
    let theirs = project_run(&srv, &other).await.0;
    let (unowned, _) = srv.create_run(json!({"owner": format!("o-{tag}")})).await;
    let ops = srv
        .auth
        .mint_jwt("olivia", Role::Operator, 600, Some(acme.clone()));
    let list = |token: String, query: String| {
        let srv = &srv;
        async move {
            let mut ids = Vec::new();
            let mut after = String::new();
            loop {
                let (status, v) = srv
                    .get(&format!("/api/runs?limit=2{query}{after}"), &token)
                    .await;
                assert_eq!(status, StatusCode::OK, "{v}");
                let runs = v["runs"].as_array().unwrap();
                assert!(runs.len() <= 2, "{v}");
                ids.extend(
                    runs.iter()
                        .map(|r| r["run_id"].as_str().unwrap().to_owned()),
                );
                match v["next_cursor"].as_str() {
                    Some(c) if v["has_more"] == true => after = format!("&after={c}"),
                    _ => return ids,
                }
            }
        }
    };
    let mut mine = list(ops.clone(), String::new()).await;
    mine.sort();
    let mut expected = ours.clone();
    expected.sort();
    assert_eq!(
        mine, expected,
        "the project's runs, each once, none of another's"
    );
    let global = srv.operator_token.clone();
    assert_eq!(
        list(global.clone(), format!("&project_id={other}")).await,
        [theirs]
    );
    assert_eq!(
        list(global.clone(), format!("&owner=o-{tag}")).await,
        [unowned],
        "without project_id: the runs without a project"
    );
    let (status, v) = srv
        .get(&format!("/api/runs?project_id={other}"), &ops)
        .await;
    assert_eq!(
        (status, v["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("forbidden")),
        "{v}"
    );
    let (status, v) = srv.get("/api/runs", &srv.agent_token).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{v}");
    let long = "x".repeat(257);
    for bad in [
        "limit=0".to_owned(),
        "limit=201".to_owned(),
        "limit=two".to_owned(),
        "status=paused".to_owned(),
        format!("owner={long}"),
        "q=".to_owned(),
        "after=nonsense".to_owned(),
    ] {
        let (status, v) = srv.get(&format!("/api/runs?{bad}"), &ops).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {v}");
        assert!(v["error"].is_string(), "{bad}: {v}");
    }
    // Another tenant's cursor is refused too.
    let (_, v) = srv
        .get(&format!("/api/runs?limit=1&project_id={other}"), &global)
        .await;
    if let Some(cursor) = v["next_cursor"].as_str() {
        let (status, v) = srv.get(&format!("/api/runs?after={cursor}"), &ops).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    }
    let (_, v) = srv.get("/api/runs?limit=1", &ops).await;
    let cursor = v["next_cursor"].as_str().expect("more than one run");
    let (status, v) = srv
        .get(
            &format!("/api/runs?after={cursor}&project_id={other}"),
            &global,
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
}

macro_rules! for_backend {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn open_cards_per_project_are_capped() {
                super::open_cards_per_project_are_capped($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn listings_page_with_a_cursor() {
                super::listings_page_with_a_cursor($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn runs_are_listed_per_tenant() {
                super::runs_are_listed_per_tenant($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn card_timeouts_are_capped() {
                super::card_timeouts_are_capped($backend).await
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_taken_run_id_says_nothing_of_its_holder() {
                super::a_taken_run_id_says_nothing_of_its_holder($backend).await
            }
        }
    };
}

for_backend!(memory, Backend::Memory);
for_backend!(dynamo, Backend::Dynamo);

/// GIVEN a cap of 5 and four servers, each with its own store instance on the same tables
/// (four Lambda instances) WHEN 24 arms of one project race through them THEN exactly 5
/// cards are created and the rest answer 429: the count holds across processes. WHEN
/// every card is then denied twice at once through different servers THEN each ending
/// takes its card off the count exactly once: 5 new cards fit again, a sixth does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_project_cap_holds_across_store_instances() {
    let mut servers = Vec::new();
    for _ in 0..4 {
        let store = Arc::new(tollgate_tests::dynamo_store().await.without_lanes());
        servers.push(Arc::new(
            TestServer::with_deps(TestServer::deps(store, capped(5))).await,
        ));
    }
    let project = format!("race-{}", uuid::Uuid::new_v4().simple());
    let mut runs = Vec::new();
    for _ in 0..4 {
        runs.push(project_run(&servers[0], &project).await);
    }
    let arms: Vec<_> = (0..24)
        .map(|i| {
            let srv = servers[i % 4].clone();
            let (run_id, token) = runs[i % 4].clone();
            tokio::spawn(async move {
                arm(
                    &srv,
                    &run_id,
                    &token,
                    json!({"request_id": request_id(), "tool_name": "web_fetch"}),
                )
                .await
            })
        })
        .collect();
    let mut created = Vec::new();
    let mut refused = 0;
    for a in arms {
        match a.await.unwrap() {
            (StatusCode::CREATED, v) => created.push((
                v["run_id"].as_str().unwrap().to_owned(),
                v["request_id"].as_str().unwrap().to_owned(),
            )),
            (StatusCode::TOO_MANY_REQUESTS, _) => refused += 1,
            (other, v) => panic!("unexpected {other} {v}"),
        }
    }
    assert_eq!((created.len(), refused), (5, 19));
    let op = servers[0]
        .auth
        .mint_jwt("op", Role::Operator, 600, Some(project.clone()));
    let denials: Vec<_> = created
        .iter()
        .cycle()
        .take(created.len() * 2)
        .enumerate()
        .map(|(i, (run_id, rid))| {
            let (srv, op, run_id, rid) = (
                servers[i % 4].clone(),
                op.clone(),
                run_id.clone(),
                rid.clone(),
            );
            tokio::spawn(async move {
                srv.post_until_served(
                    &format!("/api/runs/{run_id}/tool-denials"),
                    &op,
                    &json!({"request_id": rid}),
                )
                .await
                .0
            })
        })
        .collect();
    for d in denials {
        assert_eq!(d.await.unwrap(), StatusCode::OK);
    }
    for i in 0..6 {
        let (run_id, token) = &runs[i % 4];
        let (status, v) = arm(
            &servers[i % 4],
            run_id,
            token,
            json!({"request_id": request_id(), "tool_name": "web_fetch"}),
        )
        .await;
        let expected = if i < 5 {
            StatusCode::CREATED
        } else {
            StatusCode::TOO_MANY_REQUESTS
        };
        assert_eq!(status, expected, "arm {i} after the denials: {v}");
    }
}

/// An SQS timer queue of its own (LocalStack from `make test`), deleted on drop of the
/// test; `None` without an endpoint.
struct Queue {
    client: aws_sdk_sqs::Client,
    url: String,
}

impl Queue {
    async fn new() -> Self {
        let config = aws_config::load_from_env().await;
        let client = tollgate_timers::sqs_client(&config);
        let name = format!("tollgate-test-tenants-{}", uuid::Uuid::new_v4().simple());
        let url = tollgate_timers::ensure_queue(&client, &name)
            .await
            .expect("create the queue");
        Self { client, url }
    }

    fn timers(&self) -> Arc<tollgate_timers::SqsTimers> {
        Arc::new(tollgate_timers::SqsTimers::new(
            self.client.clone(),
            self.url.clone(),
        ))
    }

    /// Messages on the queue: visible, delayed and in flight.
    async fn messages(&self) -> u64 {
        use aws_sdk_sqs::types::QueueAttributeName as A;
        let out = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(A::ApproximateNumberOfMessages)
            .attribute_names(A::ApproximateNumberOfMessagesDelayed)
            .attribute_names(A::ApproximateNumberOfMessagesNotVisible)
            .send()
            .await
            .expect("GetQueueAttributes");
        out.attributes
            .unwrap_or_default()
            .values()
            .map(|v| v.parse::<u64>().unwrap_or(0))
            .sum()
    }

    async fn delete(self) {
        let _ = self.client.delete_queue().queue_url(&self.url).send().await;
    }
}

/// GIVEN a card armed with its expiry and first heartbeat on an SQS queue WHEN the agent
/// repeats the same arm 99 more times THEN the queue holds at most one message more than
/// after the first arm (no expiry chain per repeat).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_sqs_repeated_arms_start_no_second_chain() {
    let queue = Queue::new().await;
    let deps = tollgate_api::Deps::new(
        Arc::new(tollgate_tests::dynamo_store().await),
        queue.timers(),
        capped(2000),
        tollgate_api::Auth::new(tollgate_tests::TEST_SECRET.as_bytes()),
    );
    let srv = Arc::new(TestServer::with_deps(deps).await);
    let (run_id, token) = srv.create_run(json!({})).await;
    let body =
        json!({"request_id": request_id(), "tool_name": "web_fetch", "timeout_seconds": 3600});
    let (status, v) = arm(&srv, &run_id, &token, body.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let after_first = queue.messages().await;
    assert_eq!(after_first, 2, "the expiry and the first heartbeat");
    let repeats: Vec<_> = (0..99)
        .map(|_| {
            let (srv, run_id, token, body) =
                (srv.clone(), run_id.clone(), token.clone(), body.clone());
            tokio::spawn(async move { arm(&srv, &run_id, &token, body).await.0 })
        })
        .collect();
    for r in repeats {
        assert_eq!(r.await.unwrap(), StatusCode::OK);
    }
    let after_all = queue.messages().await;
    eprintln!("queue after 1 arm: {after_first}; after 100: {after_all}");
    assert!(
        after_all <= after_first + 1,
        "100 identical arms: {after_all} messages on the queue"
    );
    queue.delete().await;
}

/// GIVEN a pending card WHEN its first heartbeat is delivered twice (an SQS duplicate),
/// concurrently and then once more late THEN one `tool.approval_pending` and exactly one
/// next heartbeat on the queue: one chain.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_sqs_duplicate_heartbeat_keeps_one_chain() {
    let queue = Queue::new().await;
    let deps = tollgate_api::Deps::new(
        Arc::new(tollgate_tests::dynamo_store().await),
        queue.timers(),
        capped(2000),
        tollgate_api::Auth::new(tollgate_tests::TEST_SECRET.as_bytes()),
    );
    let gate = deps.gate.clone();
    let srv = TestServer::with_deps(deps).await;
    let (run_id, token) = srv.create_run(json!({})).await;
    let rid = request_id();
    let (status, v) = arm(
        &srv,
        &run_id,
        &token,
        json!({"request_id": rid, "tool_name": "web_fetch", "timeout_seconds": 3600}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let before = queue.messages().await;
    let beat = TimerMessage::ApprovalHeartbeat {
        run_id: run_id.clone(),
        request_id: rid.clone(),
        beat: 1,
    };
    let (a, b) = tokio::join!(gate.handle(beat.clone()), gate.handle(beat.clone()));
    a.unwrap();
    b.unwrap();
    gate.handle(beat).await.unwrap();
    let after = queue.messages().await;
    eprintln!("queue before the beat: {before}; after three deliveries of it: {after}");
    assert_eq!(after, before + 1, "one next heartbeat: one chain");
    let events = srv.replay_all(&run_id, &token, 100).await;
    let beats = events
        .iter()
        .filter(|e| e["type"] == "tool.approval_pending")
        .count();
    assert_eq!(beats, 1);
    queue.delete().await;
}

/// GIVEN a card stored as before the per-project keys (`pending_key = "pending"`, no
/// `due_key`, not in any open-card count) WHEN its project's operator lists and the
/// sweeper runs past its deadline THEN it is listed, swept (expired) and its ending takes
/// nothing from the project's count: a deploy needs no migration.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_cards_stored_before_the_change_are_listed_swept_and_uncounted() {
    use aws_sdk_dynamodb::types::AttributeValue::{N, S};
    let base = tollgate_tests::dynamo_store().await;
    let client = base.client().clone();
    let tables = base.tables().clone();
    let deps = TestServer::deps(Arc::new(base), capped(2000));
    let gate = deps.gate.clone();
    let srv = TestServer::with_deps(deps).await;
    let project = format!("legacy-{}", uuid::Uuid::new_v4().simple());
    let (run_id, token) = project_run(&srv, &project).await;
    let rid = request_id();
    let now = tollgate_domain::now_millis();
    client
        .put_item()
        .table_name(&tables.approvals)
        .item("run_id", S(run_id.clone()))
        .item("item_key", S(format!("card#{rid}")))
        .item("request_id", S(rid.clone()))
        .item("tool_name", S("web_fetch".into()))
        .item("tool_call_id", S(rid.clone()))
        .item("approval_id", S(rid.clone()))
        .item("state", S("pending".into()))
        .item("created_at", N((now - 60_000).to_string()))
        .item("expires_at_ms", N((now - 1_000).to_string()))
        .item("project_id", S(project.clone()))
        .item("pending_key", S("pending".into()))
        .send()
        .await
        .unwrap();
    let op = srv
        .auth
        .mint_jwt("op", Role::Operator, 600, Some(project.clone()));
    let mut seen = Vec::new();
    for _ in 0..100 {
        let (_, v) = srv.get("/api/approvals?state=pending", &op).await;
        seen = listed(&v);
        if !seen.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        seen,
        vec![rid.clone()],
        "its project's operator still sees it"
    );
    let mut swept = 0;
    for _ in 0..100 {
        swept += gate.sweep(500).await.unwrap();
        let (_, card) = srv
            .get(
                &format!("/api/runs/{run_id}/approval-requests/{rid}"),
                &token,
            )
            .await;
        if card["state"] == "expired" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(swept >= 1, "the sweeper found the old card");
    let counts = client
        .query()
        .table_name(&tables.approvals)
        .key_condition_expression("run_id = :p")
        .expression_attribute_values(":p", S(format!("project#p:{project}")))
        .consistent_read(true)
        .send()
        .await
        .unwrap();
    assert!(
        counts.items().is_empty(),
        "ending an uncounted card writes no count: {:?}",
        counts.items()
    );
}

/// What arming and deciding one card write, item by item and index by index (printed:
/// the figures behind the README's notes on the indexes' cost). The arm's one
/// transaction writes the card, its two index entries (its project's partition and the
/// due index) and one shard of the project's count; the decision removes both entries
/// and takes the card off that shard.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dynamo_only_arm_and_decision_write_units() {
    let base = tollgate_tests::dynamo_store().await;
    let meter = DynamoMeter::new(base.tables());
    let store = Arc::new(meter.instrument(&base));
    let srv = TestServer::with_deps(TestServer::deps(store, capped(2000))).await;
    let project = format!("units-{}", uuid::Uuid::new_v4().simple());
    let (run_id, token) = project_run(&srv, &project).await;
    let rid = request_id();
    meter.take();
    let (status, v) = arm(
        &srv,
        &run_id,
        &token,
        json!({"request_id": rid, "tool_name": "web_fetch", "url": "https://example.com/docs",
               "message": "The agent wants to fetch a URL."}),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    let op = srv
        .auth
        .mint_jwt("op", Role::Operator, 600, Some(project.clone()));
    let (status, v) = srv
        .post(
            &format!("/api/runs/{run_id}/tool-denials"),
            &op,
            &json!({"request_id": rid}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{v}");
    let log = meter.take();
    let finals = meter.final_images(base.client(), &log).await;
    let writes: Vec<_> = log
        .bill_calls(meter.tables(), &finals)
        .into_iter()
        .filter(|b| b.kind == CallKind::Write)
        .collect();
    for w in &writes {
        eprintln!("{} billed {} WRU: {:?}", w.operation, w.billed(), w.parts);
    }
    assert_eq!(writes.len(), 2, "one transaction to arm, one to decide");
    let names = |i: usize| format!("{:?}", writes[i].parts);
    for index in ["pending_by_expiry", "pending_due"] {
        assert!(names(0).contains(index), "the arm enters {index}");
        assert!(names(1).contains(index), "the decision leaves {index}");
    }
}
