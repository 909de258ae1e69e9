//! The deployed WebSocket push (docs/architecture.md §9) on DynamoDB Local: the
//! `websocket` function's handler fed API Gateway WebSocket events as API Gateway sends
//! them, the `fanout` function's handler fed the events table's *real* DynamoDB Local
//! stream (read with the DynamoDB Streams API and shaped as Lambda hands it over), and a
//! fake `@connections` endpoint on loopback that records what each connection was sent
//! (and answers 410 Gone for chosen connections). Runs are created and appended through
//! the HTTP API on the same tables. Asserted as a client sees it: the frames, in order.
//!
//! Needs DynamoDB (`make test`): every test is under `dynamo::`.

use std::collections::HashMap;
use std::sync::Arc;

use aws_lambda_events::apigw::ApiGatewayWebsocketProxyRequest;
use serde_json::{json, Value};
use tollgate_api::push::{Fanout, Poster, Websocket};
use tollgate_api::{Auth, Role};
use tollgate_app::runs::RunLog;
use tollgate_store::dynamo::{Connections, DynamoStore, Tables};
use tollgate_tests::connections::Endpoint;
use tollgate_tests::TestServer;

/// The frames as a client keeps them: event frames above the last sequence delivered
/// (the others dropped), control frames as they come. Answers the kept frames' `event`
/// names with their `id`s.
fn as_client(frames: &[Value], last: &mut u64) -> Vec<(String, Option<u64>)> {
    let mut kept = Vec::new();
    for f in frames {
        match f["id"].as_u64() {
            Some(id) => {
                assert_eq!(id, *last + 1, "a frame skipped ahead: {frames:?}");
                *last = id;
                kept.push((f["event"].as_str().unwrap().to_owned(), Some(id)));
            }
            None if f["id"].is_null() => {
                kept.push((f["event"].as_str().unwrap().to_owned(), None));
            }
            None => panic!("bad id {f}"),
        }
    }
    kept
}

/// One set of fresh tables (the events table with its stream), the HTTP app, the two
/// handlers, the fake endpoint and a reader of the events table's stream.
struct Rig {
    server: TestServer,
    ws: Websocket,
    fanout: Fanout,
    endpoint: Endpoint,
    registry: Connections,
    stream: tokio::sync::Mutex<StreamReader>,
}

impl Rig {
    async fn start() -> Self {
        assert!(
            tollgate_tests::aws_endpoint_configured(),
            "needs DynamoDB (make test)"
        );
        let sdk = tollgate_store::dynamo::sdk_config().await;
        let client = tollgate_store::dynamo::client(&sdk);
        let tables = Tables::with_prefix(&format!("ws-{}-", uuid::Uuid::new_v4().simple()));
        tollgate_store::schema::ensure_tables(&client, &tables)
            .await
            .unwrap();
        let store = Arc::new(DynamoStore::new(client.clone(), tables.clone()));
        let server = TestServer::with_store(store.clone()).await;
        let (endpoint, url) = Endpoint::start().await;
        let registry = Connections::new(client.clone(), tables.connections.clone());
        let poster = Poster::new(sdk.clone(), Some(url.clone()));
        let ws = Websocket {
            runs: RunLog::new(store),
            auth: server.auth.clone(),
            registry: registry.clone(),
            poster: poster.clone(),
            caps: Default::default(),
        };
        let fanout = Fanout {
            registry: registry.clone(),
            poster,
            endpoint: url,
        };
        let stream = StreamReader::open(&sdk, &client, &tables.events).await;
        Self {
            server,
            ws,
            fanout,
            endpoint,
            registry,
            stream: tokio::sync::Mutex::new(stream),
        }
    }

    /// A WebSocket event as API Gateway hands it to the function.
    async fn invoke(&self, route: &str, connection: &str, extra: Value) -> Value {
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
        serde_json::to_value(self.ws.handle(request).await).unwrap()
    }

    async fn connect(&self, connection: &str, token: &str) -> Value {
        self.invoke(
            "$connect",
            connection,
            json!({"headers": {"Sec-WebSocket-Protocol": format!("tollgate.v1, bearer.{token}")}}),
        )
        .await
    }

    /// `$connect` with a run token, which names its run in the query.
    async fn connect_run(&self, connection: &str, token: &str, run_id: &str) -> Value {
        self.invoke(
            "$connect",
            connection,
            json!({
                "headers": {"Sec-WebSocket-Protocol": format!("tollgate.v1, bearer.{token}")},
                "queryStringParameters": {"run_id": run_id},
            }),
        )
        .await
    }

    async fn send(&self, connection: &str, message: Value) -> Value {
        let route = message["action"].as_str().unwrap_or("$default").to_owned();
        let route = if ["subscribe", "unsubscribe", "ping"].contains(&route.as_str()) {
            route
        } else {
            "$default".to_owned()
        };
        self.invoke(&route, connection, json!({"body": message.to_string()}))
            .await
    }

    /// The stream's new records since the last call, handed to the fanout as Lambda
    /// would; answers the fanout's response.
    async fn fan_out(&self) -> Value {
        let event = self.stream.lock().await.next_batch().await;
        let response = self.fanout.handle(event).await;
        serde_json::to_value(response).unwrap()
    }
}

/// Reads the events table's stream on DynamoDB Local from where it last stopped, and
/// shapes the records as the Lambda event source mapping hands them to a function.
struct StreamReader {
    client: aws_sdk_dynamodbstreams::Client,
    arn: String,
    iterators: HashMap<String, String>,
}

fn attribute_json(v: &aws_sdk_dynamodbstreams::types::AttributeValue) -> Value {
    use aws_sdk_dynamodbstreams::types::AttributeValue as A;
    match v {
        A::S(s) => json!({ "S": s }),
        A::N(n) => json!({ "N": n }),
        A::Bool(b) => json!({ "BOOL": b }),
        A::Null(b) => json!({ "NULL": b }),
        other => panic!("an events item has no {other:?}"),
    }
}

fn image_json(
    image: Option<&HashMap<String, aws_sdk_dynamodbstreams::types::AttributeValue>>,
) -> Value {
    Value::Object(
        image
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), attribute_json(v)))
            .collect(),
    )
}

impl StreamReader {
    async fn open(
        sdk: &aws_config::SdkConfig,
        ddb: &aws_sdk_dynamodb::Client,
        table: &str,
    ) -> Self {
        let endpoint = std::env::var("AWS_ENDPOINT_URL_DYNAMODB")
            .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
            .expect("a DynamoDB endpoint");
        let client = aws_sdk_dynamodbstreams::Client::from_conf(
            aws_sdk_dynamodbstreams::config::Builder::from(sdk)
                .endpoint_url(endpoint)
                .build(),
        );
        let arn = ddb
            .describe_table()
            .table_name(table)
            .send()
            .await
            .unwrap()
            .table
            .unwrap()
            .latest_stream_arn
            .expect("the events table has a stream (StreamSpecification in the template)");
        Self {
            client,
            arn,
            iterators: HashMap::new(),
        }
    }

    async fn next_batch(&mut self) -> aws_lambda_events::dynamodb::Event {
        use aws_sdk_dynamodbstreams::types::ShardIteratorType;
        let stream = self
            .client
            .describe_stream()
            .stream_arn(&self.arn)
            .send()
            .await
            .unwrap()
            .stream_description
            .unwrap();
        assert_eq!(
            stream.stream_view_type.as_ref().map(|v| v.as_str()),
            Some("NEW_IMAGE")
        );
        let mut records = Vec::new();
        for shard in stream.shards.unwrap_or_default() {
            let shard_id = shard.shard_id.unwrap();
            let iterator = match self.iterators.remove(&shard_id) {
                Some(it) => it,
                None => self
                    .client
                    .get_shard_iterator()
                    .stream_arn(&self.arn)
                    .shard_id(&shard_id)
                    .shard_iterator_type(ShardIteratorType::TrimHorizon)
                    .send()
                    .await
                    .unwrap()
                    .shard_iterator
                    .unwrap(),
            };
            let mut iterator = Some(iterator);
            // Read the shard up to its current end (bounded: an open shard's iterator
            // never runs out; a page without records means we are at its end).
            for _ in 0..100 {
                let Some(it) = iterator.take() else { break };
                let out = self
                    .client
                    .get_records()
                    .shard_iterator(&it)
                    .send()
                    .await
                    .unwrap();
                let page = out.records.unwrap_or_default();
                let empty = page.is_empty();
                for r in page {
                    let d = r.dynamodb.unwrap();
                    records.push(json!({
                        "eventID": r.event_id,
                        "eventName": r.event_name.map(|n| n.as_str().to_owned()),
                        "eventVersion": r.event_version,
                        "eventSource": r.event_source,
                        "awsRegion": r.aws_region,
                        "eventSourceARN": self.arn,
                        "dynamodb": {
                            "ApproximateCreationDateTime": d.approximate_creation_date_time.map_or(0, |t| t.secs()),
                            "Keys": image_json(d.keys.as_ref()),
                            "NewImage": image_json(d.new_image.as_ref()),
                            "SequenceNumber": d.sequence_number,
                            "SizeBytes": d.size_bytes,
                            "StreamViewType": d.stream_view_type.map(|v| v.as_str().to_owned()),
                        }
                    }));
                }
                match out.next_shard_iterator {
                    Some(next) if empty => {
                        self.iterators.insert(shard_id.clone(), next);
                        break;
                    }
                    Some(next) => iterator = Some(next),
                    None => break,
                }
            }
        }
        serde_json::from_value(json!({ "Records": records }))
            .expect("the stream's records read as a Lambda DynamoDB event")
    }
}

fn events_of(n: usize, tag: &str) -> Value {
    Value::Array(
        (0..n)
            .map(|i| json!({"type": "agent.step", "i": i, "tag": tag}))
            .collect(),
    )
}

mod dynamo {
    use super::*;

    /// connect → subscribe (backlog) → fanout of the stream's records: every sequence
    /// once and in order, `done` after the terminal event, each event frame's `data`
    /// the event exactly as replay serves it; then the subscription is gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn subscribe_then_fanout_delivers_every_event_in_order() {
        let rig = Rig::start().await;
        let s = &rig.server;
        let (run_id, run_token) = s.create_run(json!({})).await;
        s.append(&run_id, &run_token, events_of(2, "backlog")).await;
        // The stream so far is read (and fanned out to nobody) before anyone subscribes.
        assert_eq!(rig.fan_out().await["batchItemFailures"], json!([]));

        let connected = rig.connect_run("conn-a", &run_token, &run_id).await;
        assert_eq!(connected["statusCode"], 200, "{connected}");
        let conn = rig
            .registry
            .get_connection("conn-a")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(conn.kind, "run");
        assert!(conn.token_digest.as_deref() != Some(run_token.as_str()));
        assert_eq!(
            conn.holder.as_deref(),
            Some(format!("run:{run_id}").as_str())
        );
        assert_eq!(
            connected["headers"]["sec-websocket-protocol"], "tollgate.v1",
            "{connected}"
        );
        let answer = rig
            .send(
                "conn-a",
                json!({"action": "subscribe", "run_id": run_id, "after": 0}),
            )
            .await;
        assert_eq!(answer["statusCode"], 200, "{answer}");
        let mut last = 0;
        let backlog = rig.endpoint.take("conn-a");
        assert_eq!(backlog[0]["event"], "subscribed");
        assert_eq!(backlog[0]["data"], json!({"run_id": run_id, "after": 0}));
        let kept = as_client(&backlog, &mut last);
        assert_eq!(last, 3, "{backlog:?}");
        assert_eq!(kept.len(), 4);

        // Live: more events and the end, through the real stream and the fanout.
        s.append(&run_id, &run_token, events_of(3, "live")).await;
        let (status, v) = s
            .post(
                &format!("/api/runs/{run_id}/complete"),
                &run_token,
                &json!({}),
            )
            .await;
        assert!(status.is_success(), "{v}");
        assert_eq!(rig.fan_out().await["batchItemFailures"], json!([]));
        let live = rig.endpoint.take("conn-a");
        let kept = as_client(&live, &mut last);
        assert_eq!(last, 7, "{live:?}");
        assert_eq!(kept.last().unwrap().0, "done");
        assert_eq!(
            live.last().unwrap()["data"],
            json!({"run_id": run_id, "terminal_sequence": 7})
        );
        // Each event frame's data is the event as replay serves it.
        let replayed = s.replay_all(&run_id, &run_token, 100).await;
        let delivered: Vec<&Value> = backlog
            .iter()
            .chain(live.iter())
            .filter(|f| f["id"].is_u64())
            .map(|f| &f["data"])
            .collect();
        assert_eq!(delivered, replayed.iter().collect::<Vec<_>>());
        // The run ended: its subscription is gone, and its token's connection closed.
        assert!(rig.registry.subscribers(&run_id).await.unwrap().is_empty());
        assert_eq!(rig.endpoint.closed(), ["conn-a"]);
        assert!(rig
            .registry
            .get_connection("conn-a")
            .await
            .unwrap()
            .is_none());

        // The agent subscribing to the ended run: backlog after 5, then done, nothing
        // recorded.
        let connected = rig.connect("conn-b", &s.agent_token).await;
        assert_eq!(connected["statusCode"], 200, "{connected}");
        let conn = rig
            .registry
            .get_connection("conn-b")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(conn.kind, "agent");
        rig.send(
            "conn-b",
            json!({"action": "subscribe", "run_id": run_id, "after": 5}),
        )
        .await;
        let frames = rig.endpoint.take("conn-b");
        let mut last = 5;
        let kept = as_client(&frames, &mut last);
        assert_eq!(
            kept.iter().map(|k| k.0.as_str()).collect::<Vec<_>>(),
            ["subscribed", "agent.step", "run_completed", "done"]
        );
        assert!(rig.registry.subscribers(&run_id).await.unwrap().is_empty());

        // ping → pong; unknown action → error frame (400, ErrorBody); disconnect.
        rig.send("conn-b", json!({"action": "ping"})).await;
        rig.send("conn-b", json!({"action": "dance"})).await;
        let frames = rig.endpoint.take("conn-b");
        assert_eq!(frames[0], json!({"event": "pong", "data": {}}));
        assert_eq!(frames[1]["event"], "error");
        assert_eq!(frames[1]["data"]["code"], "invalid_request", "{frames:?}");
        assert!(frames[1].get("id").is_none());
        let bye = rig.invoke("$disconnect", "conn-b", json!({})).await;
        assert_eq!(bye["statusCode"], 200);
        assert!(rig
            .registry
            .get_connection("conn-b")
            .await
            .unwrap()
            .is_none());
    }

    /// A connection whose post answers 410 is removed with its subscriptions; the other
    /// subscriber of the same run still gets every frame.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_gone_connection_is_removed_and_the_others_still_get_frames() {
        let rig = Rig::start().await;
        let s = &rig.server;
        let (run_id, run_token) = s.create_run(json!({})).await;
        assert_eq!(rig.fan_out().await["batchItemFailures"], json!([]));
        for c in ["conn-ok", "conn-gone"] {
            assert_eq!(rig.connect(c, &s.operator_token).await["statusCode"], 200);
            rig.send(c, json!({"action": "subscribe", "run_id": run_id}))
                .await;
            assert_eq!(rig.endpoint.take(c).len(), 2, "subscribed + run_started");
        }
        assert_eq!(rig.registry.subscribers(&run_id).await.unwrap().len(), 2);
        rig.endpoint.hang_up("conn-gone");
        s.append(&run_id, &run_token, events_of(2, "x")).await;
        assert_eq!(rig.fan_out().await["batchItemFailures"], json!([]));
        let mut last = 1;
        as_client(&rig.endpoint.take("conn-ok"), &mut last);
        assert_eq!(last, 3);
        assert!(rig.endpoint.take("conn-gone").is_empty());
        let subs = rig.registry.subscribers(&run_id).await.unwrap();
        assert_eq!(
            subs.iter()
                .map(|s| s.connection_id.as_str())
                .collect::<Vec<_>>(),
            ["conn-ok"]
        );
        assert!(rig
            .registry
            .get_connection("conn-gone")
            .await
            .unwrap()
            .is_none());
    }

    /// Tenants apart, run tokens bound to their run: another project's agent and run
    /// A's token are refused run B (an `error` frame, nothing recorded) and the fanout
    /// of B's events sends them nothing. A bad credential refuses the upgrade (401)
    /// and records nothing; every credential kind connects.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn other_tenants_and_other_runs_never_receive_frames() {
        let rig = Rig::start().await;
        let s = &rig.server;
        let auth = Auth::new(tollgate_tests::TEST_SECRET.as_bytes());
        let agent_b = auth.mint_jwt("agent-b", Role::Agent, 3600, Some("proj-b".into()));
        let agent_c = auth.mint_jwt("agent-c", Role::Agent, 3600, Some("proj-c".into()));
        let (status, v) = s.post("/api/runs", &agent_b, &json!({})).await;
        assert_eq!(status, 201, "{v}");
        let run_b = v["run_id"].as_str().unwrap().to_owned();
        let token_b = v["run_token"].as_str().unwrap().to_owned();
        let (run_a, token_a) = s.create_run(json!({})).await;
        assert_eq!(rig.fan_out().await["batchItemFailures"], json!([]));

        // Refused upgrades: nothing recorded.
        let bad = rig.connect("conn-bad", "not-a-token").await;
        assert_eq!(bad["statusCode"], 401, "{bad}");
        let forged = rig.connect("conn-forged", &format!("{agent_c}x")).await;
        assert_eq!(forged["statusCode"], 401, "{forged}");
        let none = rig.invoke("$connect", "conn-none", json!({})).await;
        assert_eq!(none["statusCode"], 401, "{none}");
        // A run token without its run, for another run, or forged in its run's shape.
        let unbound = rig.connect("conn-unbound", &token_a).await;
        assert_eq!(unbound["statusCode"], 401, "{unbound}");
        let other = rig.connect_run("conn-other", &token_a, &run_b).await;
        assert_eq!(other["statusCode"], 401, "{other}");
        let forged_run: String = token_a
            .chars()
            .rev()
            .map(|c| if c == '0' { '1' } else { '0' })
            .collect();
        let forged_run = rig
            .connect_run("conn-forged-run", &forged_run, &run_a)
            .await;
        assert_eq!(forged_run["statusCode"], 401, "{forged_run}");
        for c in [
            "conn-bad",
            "conn-forged",
            "conn-none",
            "conn-unbound",
            "conn-other",
            "conn-forged-run",
        ] {
            assert!(rig.registry.get_connection(c).await.unwrap().is_none());
        }
        // ?access_token= works as well as the subprotocol (and then no subprotocol).
        let by_query = rig
            .invoke(
                "$connect",
                "conn-c",
                json!({"queryStringParameters": {"access_token": agent_c}}),
            )
            .await;
        assert_eq!(by_query["statusCode"], 200, "{by_query}");
        assert!(by_query["headers"].get("sec-websocket-protocol").is_none());
        assert_eq!(
            rig.connect_run("conn-token-a", &token_a, &run_a).await["statusCode"],
            200
        );
        assert_eq!(rig.connect("conn-b", &agent_b).await["statusCode"], 200);

        // Another tenant's agent, and run A's token, on run B: error frames.
        rig.send("conn-c", json!({"action": "subscribe", "run_id": run_b}))
            .await;
        let frames = rig.endpoint.take("conn-c");
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert_eq!(frames[0]["event"], "error");
        assert_eq!(frames[0]["data"]["code"], "not_found", "{frames:?}");
        rig.send(
            "conn-token-a",
            json!({"action": "subscribe", "run_id": run_b}),
        )
        .await;
        let frames = rig.endpoint.take("conn-token-a");
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert_eq!(frames[0]["data"]["code"], "forbidden", "{frames:?}");
        // Run A's token on run A, and B's agent on run B: subscribed.
        rig.send(
            "conn-token-a",
            json!({"action": "subscribe", "run_id": run_a}),
        )
        .await;
        rig.send("conn-b", json!({"action": "subscribe", "run_id": run_b}))
            .await;
        assert_eq!(rig.endpoint.take("conn-token-a")[0]["event"], "subscribed");
        assert_eq!(rig.endpoint.take("conn-b")[0]["event"], "subscribed");

        // B's events reach B's subscriber only; A's reach A's only.
        s.append(&run_b, &token_b, events_of(2, "b")).await;
        s.append(&run_a, &token_a, events_of(1, "a")).await;
        assert_eq!(rig.fan_out().await["batchItemFailures"], json!([]));
        let to_b = rig.endpoint.take("conn-b");
        assert!(to_b.iter().all(|f| f["run_id"] == run_b.as_str()));
        assert_eq!(to_b.len(), 2, "{to_b:?}");
        let to_a = rig.endpoint.take("conn-token-a");
        assert!(to_a.iter().all(|f| f["run_id"] == run_a.as_str()));
        assert_eq!(to_a.len(), 1, "{to_a:?}");
        assert!(rig.endpoint.take("conn-c").is_empty());
        assert_eq!(
            rig.registry
                .subscribers(&run_b)
                .await
                .unwrap()
                .iter()
                .map(|s| s.connection_id.as_str())
                .collect::<Vec<_>>(),
            ["conn-b"]
        );
    }

    /// GIVEN a run with two connections opened with its token (one following the run,
    /// one following nothing) and an agent's connection following it WHEN the run
    /// completes and the fanout posts its end THEN the follower gets `done`, both run
    /// token connections are closed (`DELETE @connections`) and gone from the
    /// registry, the agent's stays; the ended run's token is refused at `$connect` with
    /// 409 `run_terminal` and records nothing.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn an_ended_runs_token_holds_no_connection() {
        let rig = Rig::start().await;
        let s = &rig.server;
        let (run_id, run_token) = s.create_run(json!({})).await;
        assert_eq!(rig.fan_out().await["batchItemFailures"], json!([]));
        for c in ["follows", "idle"] {
            let r = rig.connect_run(c, &run_token, &run_id).await;
            assert_eq!(r["statusCode"], 200, "{r}");
        }
        assert_eq!(
            rig.connect("agent", &s.agent_token).await["statusCode"],
            200
        );
        for c in ["follows", "agent"] {
            rig.send(c, json!({"action": "subscribe", "run_id": run_id}))
                .await;
            assert_eq!(rig.endpoint.take(c).last().unwrap()["id"], 1);
        }
        let (status, v) = s
            .post(
                &format!("/api/runs/{run_id}/complete"),
                &run_token,
                &json!({}),
            )
            .await;
        assert_eq!(status, 200, "{v}");
        assert_eq!(rig.fan_out().await["batchItemFailures"], json!([]));
        for c in ["follows", "agent"] {
            let frames = rig.endpoint.take(c);
            assert_eq!(frames.last().unwrap()["event"], "done", "{c}: {frames:?}");
        }
        let mut closed = rig.endpoint.closed();
        closed.sort();
        assert_eq!(closed, ["follows", "idle"]);
        for c in ["follows", "idle"] {
            assert!(
                rig.registry.get_connection(c).await.unwrap().is_none(),
                "{c}"
            );
        }
        assert!(rig
            .registry
            .get_connection("agent")
            .await
            .unwrap()
            .is_some());
        let late = rig.connect_run("late", &run_token, &run_id).await;
        assert_eq!(late["statusCode"], 409, "{late}");
        let body: Value = serde_json::from_str(late["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["code"], "run_terminal", "{body}");
        assert!(rig.registry.get_connection("late").await.unwrap().is_none());
    }

    /// Caps: a run token holds at most `per_run` connections (each counted in the
    /// registry whether or not it follows anything), a connection at most 16 runs; one
    /// more connection is 429 `too_many_streams` at `$connect` and writes nothing, one
    /// more run an error frame; a connection gone frees its place.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn caps_are_counted_in_the_registry() {
        let mut rig = Rig::start().await;
        rig.ws.caps.per_run = 2;
        let s = &rig.server;
        let (run_id, run_token) = s.create_run(json!({})).await;
        for c in ["c1", "c2"] {
            assert_eq!(
                rig.connect_run(c, &run_token, &run_id).await["statusCode"],
                200
            );
        }
        let third = rig.connect_run("c3", &run_token, &run_id).await;
        assert_eq!(third["statusCode"], 429, "{third}");
        let body: Value = serde_json::from_str(third["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["code"], "too_many_streams", "{body}");
        assert!(rig.registry.get_connection("c3").await.unwrap().is_none());
        // Subscribing takes no place under the run token's cap: both connections follow.
        for c in ["c1", "c2"] {
            rig.send(c, json!({"action": "subscribe", "run_id": run_id}))
                .await;
            assert_eq!(rig.endpoint.take(c)[0]["event"], "subscribed");
        }
        // A connection gone frees its place.
        rig.invoke("$disconnect", "c1", json!({})).await;
        let again = rig.connect_run("c3", &run_token, &run_id).await;
        assert_eq!(again["statusCode"], 200, "{again}");

        // Per tenant: an agent's idle connections count against its project.
        rig.ws.caps.per_project = 2;
        let auth = Auth::new(tollgate_tests::TEST_SECRET.as_bytes());
        let flood = auth.mint_jwt("flood", Role::Agent, 3600, Some("flood".into()));
        let quiet = auth.mint_jwt("quiet", Role::Agent, 3600, Some("quiet".into()));
        for c in ["f1", "f2"] {
            assert_eq!(rig.connect(c, &flood).await["statusCode"], 200);
        }
        let f3 = rig.connect("f3", &flood).await;
        assert_eq!(f3["statusCode"], 429, "{f3}");
        assert_eq!(rig.connect("q1", &quiet).await["statusCode"], 200);
        rig.ws.caps.per_project = 250;

        // Sixteen runs on one operator connection, then one more is refused.
        assert_eq!(
            rig.connect("op", &s.operator_token).await["statusCode"],
            200
        );
        for _ in 0..tollgate_protocol::ws::MAX_SUBSCRIPTIONS_PER_CONNECTION {
            let (r, _) = s.create_run(json!({})).await;
            rig.send("op", json!({"action": "subscribe", "run_id": r}))
                .await;
        }
        let (r, _) = s.create_run(json!({})).await;
        rig.send("op", json!({"action": "subscribe", "run_id": r}))
            .await;
        let frames = rig.endpoint.take("op");
        let subscribed = frames.iter().filter(|f| f["event"] == "subscribed").count();
        assert_eq!(
            subscribed,
            tollgate_protocol::ws::MAX_SUBSCRIPTIONS_PER_CONNECTION
        );
        assert_eq!(frames.last().unwrap()["data"]["code"], "too_many_streams");
        let _ = rig.fan_out().await;
    }
}
