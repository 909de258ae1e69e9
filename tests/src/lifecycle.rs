//! The reference lifecycle, driven over HTTP on DynamoDB with every operation counted
//! (docs/architecture.md §6, §7): a run is created with a budget for one
//! `create_dashboard` call; the agent arms a card; the card waits through 60 s of
//! `tool.approval_pending` heartbeats at 20 s intervals — three beats, here 2 s apart —
//! and an operator approves it (scope once); the agent starts, dispatches and settles
//! (confirmed) the mutation, then completes the run; every timer still queued (the
//! card's expiry, the fourth heartbeat, the settlement deadline, the first execution
//! heartbeat) arrives and finds nothing to do. The card's timeout and the execution
//! timers are shortened with it; the messages sent are the same as with the defaults
//! (300 s expiry, one message under SQS's 15-minute delay cap; 60 s deadline; 15 s
//! execution heartbeat, after which a prompt settlement has happened).
//!
//! Every DynamoDB call goes through a metered client ([`Meter`]), every timer through a
//! counting queue and handler, every HTTP request is counted by the client.
//! `tests/lifecycle_cost.rs` holds its bill to the goal; `make bench` prices it with
//! each live-delivery mode ([`crate::meter::delivery`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{json, Value};
use tollgate_api::{Auth, Deps, GateConfig};
use tollgate_domain::execution::ExecutionSettings;
use tollgate_timers::EmbeddedTimers;

use crate::meter::delivery::WsCounts;
use crate::meter::{Bill, Meter};
use crate::{dynamo_store, TestServer, TEST_SECRET};

const TOOL: &str = "create_dashboard";
/// 60 s of heartbeats at 20 s intervals.
pub const BEATS: u64 = 3;
/// Bound of every wait.
const WAIT: Duration = Duration::from_secs(30);

/// The reference lifecycle's settings, shortened, with seconds of margin around every
/// step so a loaded machine does not add a beat: beats 2 s apart, the card expires 10 s
/// after arming (after the approval at ~6 s and the fourth beat at ~8 s), an execution
/// heartbeat 3 s after dispatch and the settlement deadline 5 s after start (both after
/// the prompt settlement).
pub fn gate() -> GateConfig {
    GateConfig {
        heartbeat_every: Duration::from_secs(2),
        execution: ExecutionSettings {
            settlement_deadline_ms: 5_000,
            heartbeat_interval_ms: 3_000,
        },
        ..GateConfig::default()
    }
}
pub const CARD_TIMEOUT_SECONDS: u64 = 10;

/// The reference lifecycle as its run's stream tells it, in order.
pub const EVENTS: [&str; 9] = [
    "run_started",
    "tool.approval_required",
    "tool.approval_pending",
    "tool.approval_pending",
    "tool.approval_pending",
    "tool.approval_resolved",
    "tool_execution_started",
    "tool_execution",
    "run_completed",
];

/// What one lifecycle cost, and the DynamoDB operations of each step.
pub struct Lifecycle {
    pub bill: Bill,
    /// DynamoDB operations per step.
    pub steps: Vec<(&'static str, BTreeMap<String, u64>)>,
    /// The run's event types as the stream tells them, in order.
    pub events: Vec<String>,
    /// Its WebSocket delivery, counted on the deployed handlers ([`ws::Rig`]).
    pub ws: WsCounts,
}

/// The client side: each request counted on the meter before it is sent.
struct Client<'a> {
    srv: &'a TestServer,
    meter: &'a Meter,
}

impl Client<'_> {
    async fn post(&self, route: &str, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
        self.meter.http_request(route);
        self.srv.post(path, token, &body).await
    }
}

/// DynamoDB calls per operation since `before` (a snapshot of the cumulative counts).
fn since(meter: &Meter, before: &mut BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let now = meter.dynamo.snapshot().operations();
    let diff = now
        .iter()
        .filter_map(|(op, n)| {
            let d = n - before.get(op).copied().unwrap_or(0);
            (d > 0).then(|| (op.clone(), d))
        })
        .collect();
    *before = now;
    diff
}

/// Drives one reference lifecycle on the DynamoDB endpoint configured (needs one).
pub async fn lifecycle() -> Lifecycle {
    let base = dynamo_store().await;
    let (meter, store) = Meter::new(&base);
    let queue = EmbeddedTimers::new();
    let deps = Deps::new(
        Arc::new(store),
        Arc::new(meter.timer_queue(queue.clone())),
        gate(),
        Auth::new(TEST_SECRET.as_bytes()),
    );
    // Timers in this process as `Deps::embedded` wires them, with each delivery counted
    // (no sweeper: deployed, it is the `stall-watch` schedule, not part of a lifecycle).
    let timer_loop = queue.attach(meter.timer_handler(deps.gate.clone()));
    let srv = TestServer::with_deps(deps).await;
    let client = Client {
        srv: &srv,
        meter: &meter,
    };
    let mut seen = BTreeMap::new();
    let mut steps = Vec::new();
    let id = uuid::Uuid::new_v4().simple().to_string();
    let (request_id, tool_call_id, approval_id) = (
        format!("req-{}", &id[..12]),
        format!("call-{}", &id[..12]),
        format!("approval-{}", &id[..12]),
    );

    // GIVEN a run with a budget for one create_dashboard call
    let (status, run) = client
        .post(
            "POST /api/runs",
            "/api/runs",
            &srv.agent_token,
            json!({"budget": {"tools": {TOOL: 1}, "call_ceiling": 1}}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "create: {run}");
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let token = run["run_token"].as_str().unwrap().to_owned();
    steps.push(("create run", since(&meter, &mut seen)));
    // The console watches the run from here (its WebSocket delivery, metered apart).
    let push = ws::Rig::start(&base, srv.auth.clone()).await;
    push.watch(ws::CONSOLE, &srv.operator_token, None, &run_id, 0)
        .await;

    // WHEN the agent arms a card
    let (status, card) = client
        .post(
            "POST /api/runs/{id}/approval-requests",
            &format!("/api/runs/{run_id}/approval-requests"),
            &token,
            json!({"request_id": request_id, "tool_name": TOOL, "tool_call_id": tool_call_id,
                   "approval_id": approval_id, "arguments_hash": format!("sha256:{:064x}", 7),
                   "message": "The agent wants to create a dashboard.",
                   "timeout_seconds": CARD_TIMEOUT_SECONDS}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "arm: {card}");
    steps.push(("arm card", since(&meter, &mut seen)));
    // The stream hands the new event to the fanout (the console's), then the agent waits
    // on its card over WebSocket from its `tool.approval_required`.
    push.fan_out_new(&base, &run_id).await;
    let armed_at = card["sequence"].as_u64().expect("a fresh card's sequence");
    push.watch(ws::AGENT, &token, Some(&run_id), &run_id, armed_at)
        .await;

    // AND it waits through three heartbeats
    assert!(
        meter
            .timers
            .wait_for(WAIT, |t| t.acked.get("approval_heartbeat") >= Some(&BEATS))
            .await,
        "three heartbeats: {:?}",
        meter.timers.tally()
    );
    steps.push(("3 heartbeats (timers)", since(&meter, &mut seen)));

    // AND an operator approves it, once
    let (status, decision) = client
        .post(
            "POST /api/runs/{id}/tool-approvals",
            &format!("/api/runs/{run_id}/tool-approvals"),
            &srv.operator_token,
            json!({"request_id": request_id, "scope": "once"}),
        )
        .await;
    assert_eq!(
        (status, decision["state"].as_str()),
        (StatusCode::OK, Some("approved")),
        "approve: {decision}"
    );
    steps.push(("approve", since(&meter, &mut seen)));

    // AND the agent starts, dispatches and settles the call, then completes the run
    let call = format!("/api/runs/{run_id}/tool-calls/{tool_call_id}");
    let (status, started) = client
        .post(
            "POST /api/runs/{id}/tool-calls/{tool_call_id}/start",
            &format!("{call}/start"),
            &token,
            json!({"request_id": request_id, "approval_id": approval_id, "tool_name": TOOL,
                   "arguments_hash": format!("sha256:{:064x}", 7)}),
        )
        .await;
    assert_eq!(
        (status, started["state"].as_str()),
        (StatusCode::OK, Some("intent")),
        "start: {started}"
    );
    assert!(started["sequence"].is_u64(), "start: {started}");
    steps.push(("start", since(&meter, &mut seen)));
    let (status, dispatched) = client
        .post(
            "POST /api/runs/{id}/tool-calls/{tool_call_id}/dispatch",
            &format!("{call}/dispatch"),
            &token,
            json!({"approval_id": approval_id}),
        )
        .await;
    assert_eq!(
        (status, dispatched["state"].as_str()),
        (StatusCode::OK, Some("dispatched")),
        "dispatch: {dispatched}"
    );
    steps.push(("dispatch", since(&meter, &mut seen)));
    let (status, settled) = client
        .post(
            "POST /api/runs/{id}/tool-calls/{tool_call_id}/settle",
            &format!("{call}/settle"),
            &token,
            json!({"approval_id": approval_id, "evidence": "confirmed",
                   "result": {"dashboard_id": "dash-1", "url": "https://example.com/d/dash-1"}}),
        )
        .await;
    assert_eq!(
        (status, settled["state"].as_str()),
        (StatusCode::OK, Some("completed")),
        "settle: {settled}"
    );
    steps.push(("settle", since(&meter, &mut seen)));
    let (status, completed) = client
        .post(
            "POST /api/runs/{id}/complete",
            &format!("/api/runs/{run_id}/complete"),
            &token,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "complete: {completed}");
    steps.push(("complete run", since(&meter, &mut seen)));

    // AND every timer still queued arrives and is acknowledged
    assert!(
        meter.timers.wait_for(WAIT, |t| t.settled()).await,
        "every timer handled: {:?}",
        meter.timers.tally()
    );
    steps.push(("remaining timers", since(&meter, &mut seen)));
    let bill = meter.bill().await;
    timer_loop.shutdown().await;

    // THEN the stream tells the lifecycle (read after billing: not part of it)
    let events: Vec<String> = srv
        .replay_all(&run_id, &srv.operator_token, 100)
        .await
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect();
    // AND the events after the console subscribed reach the watchers through the
    // fanout, one stream batch per event; the agent hangs up once its card is resolved,
    // the console once the run has ended.
    let ws = push.deliver(&base, &run_id).await;
    Lifecycle {
        bill,
        steps,
        events,
        ws,
    }
}

/// The deployed WebSocket push of one lifecycle: the `websocket` and `fanout`
/// functions' handlers (`tollgate_api::push`) on the lifecycle's tables, their DynamoDB
/// calls through a meter of their own, a loopback `@connections` endpoint that counts
/// the frames posted, and each invocation counted and timed.
pub mod ws {
    use std::collections::BTreeMap;
    use std::sync::{Arc, Mutex};
    use std::time::Instant;

    use aws_lambda_events::apigw::ApiGatewayWebsocketProxyRequest;
    use aws_sdk_dynamodb::types::AttributeValue;
    use serde_json::{json, Value};
    use tollgate_api::push::{Fanout, Poster, Websocket};
    use tollgate_api::Auth;
    use tollgate_app::runs::RunLog;
    use tollgate_store::dynamo::{Connections, DynamoStore};

    use crate::connections::Endpoint;
    use crate::meter::delivery::WsCounts;
    use crate::meter::{Bill, DynamoMeter, DynamoUsage, LambdaAssumption, Usage};

    pub const CONSOLE: &str = "console-connection";

    /// A warm invocation's duration: the median of `ms` without the first (which opened
    /// the handler's connections, as a cold start's first invocation does; cold starts
    /// are shared by many lifecycles).
    fn warm_median(ms: &[f64]) -> f64 {
        let mut warm: Vec<f64> = ms.iter().skip(usize::from(ms.len() > 1)).copied().collect();
        warm.sort_by(f64::total_cmp);
        match warm.len() {
            0 => 0.0,
            n if n % 2 == 1 => warm[n / 2],
            n => (warm[n / 2 - 1] + warm[n / 2]) / 2.0,
        }
    }
    pub const AGENT: &str = "agent-connection";

    pub struct Rig {
        ws: Websocket,
        fanout: Fanout,
        endpoint: Endpoint,
        meter: DynamoMeter,
        /// Client messages API Gateway received.
        received: Mutex<u64>,
        /// Invocations per route / function: how many, and their durations (ms).
        invocations: Mutex<BTreeMap<&'static str, Vec<f64>>>,
        /// The last sequence handed to the fanout (the console's backlog ends at 1).
        fanned: Mutex<u64>,
        /// This rig's connections' suffix: the registry table is shared by the tests
        /// running at once, so each rig's connection ids are its own.
        suffix: String,
    }

    impl Rig {
        pub async fn start(base: &DynamoStore, auth: Arc<Auth>) -> Self {
            let meter = DynamoMeter::new(base.tables());
            let store = meter.instrument(base);
            let registry =
                Connections::new(store.client().clone(), base.tables().connections.clone());
            let (endpoint, url) = Endpoint::start().await;
            let poster = Poster::new(
                tollgate_store::dynamo::sdk_config().await,
                Some(url.clone()),
            );
            Self {
                ws: Websocket {
                    runs: RunLog::new(Arc::new(store)),
                    auth,
                    registry: registry.clone(),
                    poster: poster.clone(),
                    caps: Default::default(),
                },
                fanout: Fanout {
                    registry,
                    poster,
                    endpoint: url,
                },
                endpoint,
                meter,
                received: Mutex::new(0),
                invocations: Mutex::default(),
                fanned: Mutex::new(1),
                suffix: uuid::Uuid::new_v4().simple().to_string(),
            }
        }

        /// The connection id API Gateway gives this rig's watcher `name`.
        fn id(&self, name: &str) -> String {
            format!("{name}-{}", self.suffix)
        }

        fn timed(&self, what: &'static str, started: Instant) {
            let ms = started.elapsed().as_secs_f64() * 1000.0;
            self.invocations
                .lock()
                .unwrap()
                .entry(what)
                .or_default()
                .push(ms);
        }

        /// One WebSocket event as API Gateway hands it to the `websocket` function.
        async fn invoke(&self, route: &'static str, connection: &str, extra: Value) -> Value {
            let connection = self.id(connection);
            let mut event = json!({
                "requestContext": {
                    "routeKey": route,
                    "eventType": match route { "$connect" => "CONNECT", "$disconnect" => "DISCONNECT", _ => "MESSAGE" },
                    "connectionId": connection,
                    "domainName": "abc123.execute-api.us-east-1.amazonaws.com",
                    "stage": "live",
                    "requestId": format!("req-{connection}-{route}"),
                    "apiId": "abc123",
                    "connectedAt": 1_700_000_000_000_i64,
                    "requestTimeEpoch": 1_700_000_000_000_i64
                },
                "isBase64Encoded": false
            });
            for (k, v) in extra.as_object().unwrap() {
                event[k] = v.clone();
            }
            let request: ApiGatewayWebsocketProxyRequest = serde_json::from_value(event).unwrap();
            let started = Instant::now();
            let answer = serde_json::to_value(self.ws.handle(request).await).unwrap();
            self.timed(route, started);
            answer
        }

        /// A watcher connects (`$connect`; a run token names its run) and subscribes to
        /// `run_id` after `after`.
        pub async fn watch(
            &self,
            connection: &str,
            token: &str,
            token_run: Option<&str>,
            run_id: &str,
            after: u64,
        ) {
            let mut connect = json!({"headers": {"Sec-WebSocket-Protocol": format!("tollgate.v1, bearer.{token}")}});
            if let Some(run) = token_run {
                connect["queryStringParameters"] = json!({"run_id": run});
            }
            let answer = self.invoke("$connect", connection, connect).await;
            assert_eq!(answer["statusCode"], 200, "connect: {answer}");
            let message = json!({"action": "subscribe", "run_id": run_id, "after": after});
            *self.received.lock().unwrap() += 1;
            let answer = self
                .invoke(
                    "subscribe",
                    connection,
                    json!({"body": message.to_string()}),
                )
                .await;
            assert_eq!(answer["statusCode"], 200, "subscribe: {answer}");
            let frames = self.frames(connection);
            assert_eq!(
                frames.first().map(|f| f["event"].clone()),
                Some(json!("subscribed")),
                "{frames:?}"
            );
        }

        fn frames(&self, connection: &str) -> Vec<Value> {
            self.endpoint.sent(&self.id(connection))
        }

        /// `connection` hangs up: API Gateway answers 410 for it from now on and invokes
        /// `$disconnect`.
        async fn hang_up(&self, connection: &str) {
            self.endpoint.hang_up(&self.id(connection));
            let answer = self.invoke("$disconnect", connection, json!({})).await;
            assert_eq!(answer["statusCode"], 200, "disconnect: {answer}");
        }

        /// The run's events not handed to the fanout yet (those after the console's
        /// backlog, `run_started`), handed to it as the events table's stream would, one
        /// batch per event, in order; the agent hangs up after its card's resolution.
        pub async fn fan_out_new(&self, base: &DynamoStore, run_id: &str) {
            let items = base
                .client()
                .query()
                .table_name(&base.tables().events)
                .key_condition_expression("run_id = :r")
                .expression_attribute_values(":r", AttributeValue::S(run_id.to_owned()))
                .consistent_read(true)
                .send()
                .await
                .expect("the run's events")
                .items
                .unwrap_or_default();
            for item in &items {
                let Ok(Some((_, event))) = tollgate_store::dynamo::event_from_item(item) else {
                    continue;
                };
                {
                    let mut fanned = self.fanned.lock().unwrap();
                    if event.sequence <= *fanned {
                        continue;
                    }
                    *fanned = event.sequence;
                }
                let image: serde_json::Map<String, Value> = item
                    .iter()
                    .filter_map(|(k, v)| {
                        let v = match v {
                            AttributeValue::S(s) => json!({ "S": s }),
                            AttributeValue::N(n) => json!({ "N": n }),
                            AttributeValue::Bool(b) => json!({ "BOOL": b }),
                            _ => return None,
                        };
                        Some((k.clone(), v))
                    })
                    .collect();
                let batch = json!({"Records": [{
                    "eventID": format!("record-{}", event.sequence),
                    "eventName": "INSERT",
                    "eventVersion": "1.1",
                    "eventSource": "aws:dynamodb",
                    "awsRegion": "us-east-1",
                    "eventSourceARN": "arn:aws:dynamodb:us-east-1:000000000000:table/events/stream/x",
                    "dynamodb": {
                        "ApproximateCreationDateTime": 0,
                        "Keys": {},
                        "NewImage": Value::Object(image),
                        "SequenceNumber": format!("{:021}", event.sequence),
                        "SizeBytes": 100,
                        "StreamViewType": "NEW_IMAGE",
                    }
                }]});
                let batch = serde_json::from_value(batch).expect("a Lambda DynamoDB event");
                let started = Instant::now();
                let response = self.fanout.handle(batch).await;
                self.timed("fanout", started);
                assert!(response.batch_item_failures.is_empty(), "fanout failed");
                if event.event_type == "tool.approval_resolved" {
                    self.hang_up(AGENT).await;
                }
            }
        }

        /// The rest of the run's events through the fanout ([`Rig::fan_out_new`]), then
        /// the console hangs up after `done`. Answers what the delivery made, after
        /// checking what each watcher was sent.
        pub async fn deliver(self, base: &DynamoStore, run_id: &str) -> WsCounts {
            self.fan_out_new(base, run_id).await;
            let console = self.frames(CONSOLE);
            assert_eq!(
                console.last().map(|f| f["event"].clone()),
                Some(json!("done")),
                "the console saw the run end: {console:?}"
            );
            self.hang_up(CONSOLE).await;
            let agent = self.frames(AGENT);
            assert_eq!(
                agent.last().map(|f| f["event"].clone()),
                Some(json!("tool.approval_resolved")),
                "the agent saw its card resolved: {agent:?}"
            );
            let sent = self.endpoint.total();
            let log = self.meter.snapshot();
            let finals = self.meter.final_images(base.client(), &log).await;
            let calls = log.bill_calls(self.meter.tables(), &finals);
            let usage = Usage {
                dynamo: DynamoUsage::from_calls(&calls),
                timers: Default::default(),
                http: Vec::new(),
            };
            let dynamo = Bill::price(&usage, LambdaAssumption::default())
                .lines
                .into_iter()
                .filter(|l| l.service == "DynamoDB")
                .collect();
            let received = *self.received.lock().unwrap();
            let invocations = self
                .invocations
                .lock()
                .unwrap()
                .iter()
                .map(|(what, ms)| (*what, ms.len() as u64, warm_median(ms)))
                .collect();
            WsCounts {
                received,
                sent,
                invocations,
                dynamo,
            }
        }
    }
}
