//! The randomized workload: several `tollgate serve --backend aws` processes on one set
//! of tables and one SQS timer queue, both reached through fault proxies, and each
//! process reached by the clients through a fault proxy of its own; agents create runs
//! (single, coordinators, children), append, arm cards; operators click with scopes;
//! approved calls go through start, dispatch and settle; operators reconcile; runs end.
//! Clients retry a request that failed (5xx, reset, no answer within 8 s) with the same
//! body — the same `delivery_id`, `event_id`s, `request_id` — on another process. Every
//! client operation and what it was answered is recorded, and at the end (faults off,
//! timers quiet) every run's stream, mutation records, cards and policies, and the
//! seed's runs in the runs table, are read back for the checker.
//!
//! Per seed: the operations each worker picks come from a generator seeded with the seed
//! and the worker's number, the proxies' schedules from the seed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};
use tollgate_api::{Auth, Role};

use super::checker::{FinalCard, FinalRun, History, Op, OpKind, Outcome};
use super::dynamodb::DynamoDbLocal;
use super::localstack::LocalStack;
use super::proxy::{FaultCounts, FaultProxy, Rates, Service};
use crate::serve::{ServeProcess, Start};
use crate::TEST_SECRET;

/// Tools the runs' budgets allow (each run: 3 starts of each, 6 calls in all).
const TOOLS: &[&str] = &["create_dashboard", "web_fetch", "shell"];

/// The serve processes, all on the same tables and timer queue, reaching DynamoDB and
/// SQS through the proxies. Killed when dropped.
pub struct Fleet {
    serves: Vec<Mutex<Option<ServeProcess>>>,
    table_prefix: String,
    queue_name: String,
    queue_url: Mutex<Option<String>>,
    ddb_url: String,
    sqs_url: String,
    /// Serve processes killed (SIGKILL) and started again.
    pub kills: AtomicUsize,
}

impl Fleet {
    /// Starts `n` processes; the first creates the tables and the queue.
    pub fn start(n: usize, ddb_url: &str, sqs_url: &str) -> Self {
        let unique = uuid::Uuid::new_v4().simple().to_string();
        let fleet = Self {
            serves: (0..n).map(|_| Mutex::new(None)).collect(),
            table_prefix: format!("tollgate-chaos-{}-", &unique[..10]),
            queue_name: format!("tollgate-chaos-timers-{}", &unique[..10]),
            queue_url: Mutex::new(None),
            ddb_url: ddb_url.to_owned(),
            sqs_url: sqs_url.to_owned(),
            kills: AtomicUsize::new(0),
        };
        for i in 0..n {
            let serve = fleet.spawn(i);
            *fleet.serves[i].lock().unwrap() = Some(serve);
        }
        fleet
    }

    pub fn len(&self) -> usize {
        self.serves.len()
    }

    pub fn is_empty(&self) -> bool {
        self.serves.is_empty()
    }

    /// The base URL of process `i` (`None` while it is down).
    fn base(&self, i: usize) -> Option<String> {
        self.serves[i % self.serves.len()]
            .lock()
            .unwrap()
            .as_ref()
            .map(|s| s.base.clone())
    }

    fn spawn(&self, i: usize) -> ServeProcess {
        let queue_url = self.queue_url.lock().unwrap().clone();
        let mut env = vec![
            ("TOLLGATE_TABLE_PREFIX", self.table_prefix.clone()),
            ("TOLLGATE_TIMER_QUEUE_NAME", self.queue_name.clone()),
            ("AWS_ENDPOINT_URL_DYNAMODB", self.ddb_url.clone()),
            ("AWS_ENDPOINT_URL_SQS", self.sqs_url.clone()),
            ("TOLLGATE_HEARTBEAT_SECONDS", "3".into()),
            ("TOLLGATE_SETTLEMENT_DEADLINE_SECONDS", "4".into()),
            ("TOLLGATE_EXECUTION_HEARTBEAT_SECONDS", "3".into()),
            ("TOLLGATE_SWEEP_SECONDS", "3".into()),
            ("TOLLGATE_STALL_TIMEOUT_SECONDS", "3600".into()),
        ];
        let mut args = vec!["--backend", "aws"];
        match &queue_url {
            Some(url) => env.push(("TOLLGATE_TIMER_QUEUE_URL", url.clone())),
            None => args.push("--create-tables"),
        }
        let serve = ServeProcess::start_with(Start {
            args,
            env,
            remove: vec![
                "AWS_ENDPOINT_URL",
                "TOLLGATE_RUNS_TABLE",
                "TOLLGATE_EVENTS_TABLE",
                "TOLLGATE_APPROVALS_TABLE",
                "TOLLGATE_POLICIES_TABLE",
                "TOLLGATE_MUTATIONS_TABLE",
                "TOLLGATE_ALWAYS_ELIGIBLE_TOOLS",
            ],
            secret: Some(TEST_SECRET),
            log: Some("error"),
            echo: std::env::var_os("TOLLGATE_CHAOS_VERBOSE").map(|_| format!("[serve {i}]")),
            wait: Some(Duration::from_secs(90)),
        });
        if let Some(url) = serve.queue_url() {
            self.queue_url.lock().unwrap().get_or_insert(url);
        }
        serve
    }

    /// Kills process `i` with SIGKILL (whatever it was doing) and starts it again.
    pub fn kill_and_restart(&self, i: usize) {
        let old = self.serves[i].lock().unwrap().take();
        if let Some(mut s) = old {
            s.kill();
        }
        self.kills.fetch_add(1, Ordering::SeqCst);
        let new = self.spawn(i);
        *self.serves[i].lock().unwrap() = Some(new);
    }
}

/// What one seed's run does.
#[derive(Debug, Clone)]
pub struct Config {
    pub seed: u64,
    pub ops: usize,
    pub workers: usize,
    /// Probability of a fault per proxied request.
    pub fault_rate: f64,
    /// Kill DynamoDB Local (SIGKILL) and restart it once, mid-workload.
    pub crash_dynamodb: bool,
    /// Kill one serve process (SIGKILL) and restart it once, mid-workload.
    pub kill_serve: bool,
    /// Kill LocalStack (SIGKILL) and restart it once, mid-workload.
    pub restart_localstack: bool,
    /// The workload stops issuing operations after this long.
    pub time_limit: Duration,
}

/// What one seed produced.
pub struct SeedReport {
    pub seed: u64,
    pub ops: usize,
    /// Operations some try of which was answered 5xx or lost in transport.
    pub failed: usize,
    /// Operations whose every try was: outcome unknown to the client.
    pub unknown: usize,
    pub faults: FaultCounts,
    pub dynamodb_crashes: u64,
    pub localstack_crashes: u64,
    pub serve_kills: usize,
    pub history: History,
    pub elapsed: Duration,
}

/// The shared environment of every seed: proxies, the fleet, the HTTP client.
pub struct Chaos {
    pub ddb_proxy: FaultProxy,
    pub sqs_proxy: FaultProxy,
    /// One per serve process, between the clients and it.
    pub serve_proxies: Vec<FaultProxy>,
    pub dynamodb: Option<tokio::sync::Mutex<DynamoDbLocal>>,
    pub localstack: Option<tokio::sync::Mutex<LocalStack>>,
    pub fleet: Arc<Fleet>,
    http: reqwest::Client,
    auth: Auth,
}

impl Chaos {
    /// Starts the proxies in front of `dynamodb` (our own on-disk DynamoDB Local, or the
    /// endpoint in `AWS_ENDPOINT_URL_DYNAMODB`) and `AWS_ENDPOINT_URL_SQS`, and `serves`
    /// processes behind them.
    pub async fn start(
        serves: usize,
        dynamodb: Option<DynamoDbLocal>,
        localstack: Option<LocalStack>,
    ) -> Self {
        let ddb_upstream = match &dynamodb {
            Some(d) => d.url(),
            None => std::env::var("AWS_ENDPOINT_URL_DYNAMODB")
                .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
                .expect("AWS_ENDPOINT_URL_DYNAMODB (run under tests/harness/emulators.sh with)"),
        };
        let sqs_upstream = match &localstack {
            Some(l) => l.url(),
            None => std::env::var("AWS_ENDPOINT_URL_SQS")
                .or_else(|_| std::env::var("AWS_ENDPOINT_URL"))
                .expect("AWS_ENDPOINT_URL_SQS (run under tests/harness/emulators.sh with)"),
        };
        let ddb_proxy = FaultProxy::start(Service::Dynamo, &ddb_upstream)
            .await
            .expect("DynamoDB proxy");
        let sqs_proxy = FaultProxy::start(Service::Sqs, &sqs_upstream)
            .await
            .expect("SQS proxy");
        let (d, s) = (ddb_proxy.url(), sqs_proxy.url());
        let fleet = tokio::task::spawn_blocking(move || Fleet::start(serves, &d, &s))
            .await
            .expect("the fleet starts");
        let mut serve_proxies = Vec::new();
        for i in 0..fleet.len() {
            let base = fleet.base(i).expect("a serve process");
            serve_proxies.push(
                FaultProxy::start(Service::Serve, &base)
                    .await
                    .expect("serve proxy"),
            );
        }
        let queue_url = fleet.queue_url.lock().unwrap().clone();
        if let Some(url) = queue_url {
            short_visibility(&sqs_proxy.url(), &url).await;
        }
        Self {
            ddb_proxy,
            sqs_proxy,
            serve_proxies,
            dynamodb: dynamodb.map(tokio::sync::Mutex::new),
            localstack: localstack.map(tokio::sync::Mutex::new),
            fleet: Arc::new(fleet),
            http: reqwest::Client::builder()
                .no_proxy()
                .pool_max_idle_per_host(32)
                .timeout(Duration::from_secs(8))
                .build()
                .unwrap(),
            auth: Auth::new(TEST_SECRET.as_bytes()),
        }
    }

    /// Runs one seed: the workload under faults, then the read-back.
    pub async fn run_seed(self: &Arc<Self>, cfg: &Config) -> SeedReport {
        let started = Instant::now();
        let kills_before = self.fleet.kills.load(Ordering::SeqCst);
        let crashes_before = match &self.dynamodb {
            Some(d) => d.lock().await.crashes,
            None => 0,
        };
        let ls_before = match &self.localstack {
            Some(l) => l.lock().await.crashes,
            None => 0,
        };
        let model = Arc::new(Model::new(cfg.seed));
        let rates = Rates {
            fault: cfg.fault_rate,
            timer: 0.5,
        };
        self.ddb_proxy.arm(cfg.seed, rates);
        self.sqs_proxy.arm(cfg.seed.rotate_left(17), rates);
        for (i, p) in self.serve_proxies.iter().enumerate() {
            p.arm(cfg.seed.rotate_left(29 + i as u32), rates);
        }
        let next = Arc::new(AtomicUsize::new(0));
        let deadline = started + cfg.time_limit;
        let mut workers = Vec::new();
        for w in 0..cfg.workers {
            let (me, model, next) = (Arc::clone(self), Arc::clone(&model), Arc::clone(&next));
            let ops = cfg.ops;
            let seed = cfg.seed;
            workers.push(tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(seed.wrapping_mul(1000).wrapping_add(w as u64));
                loop {
                    // `next` counts the operations recorded and in flight.
                    let n = next.fetch_add(1, Ordering::SeqCst);
                    if n >= ops || Instant::now() >= deadline {
                        break;
                    }
                    if !me.one_op(&model, &mut rng).await {
                        next.fetch_sub(1, Ordering::SeqCst);
                    }
                }
            }));
        }
        // Crashes, mid-workload: DynamoDB Local at a third of the operations, a serve
        // process at two thirds.
        let storage_kills = Arc::new(Mutex::new(Vec::new()));
        let storage_acks = Arc::new(Mutex::new(Vec::new()));
        let crash = {
            let (me, next) = (Arc::clone(self), Arc::clone(&next));
            let kills = Arc::clone(&storage_kills);
            let acks = Arc::clone(&storage_acks);
            let (ops, crash_dynamodb, kill_serve, restart_localstack, seed) = (
                cfg.ops,
                cfg.crash_dynamodb,
                cfg.kill_serve,
                cfg.restart_localstack,
                cfg.seed,
            );
            tokio::spawn(async move {
                let wait_for = |at: usize| {
                    let next = Arc::clone(&next);
                    async move {
                        while next.load(Ordering::SeqCst) < at && Instant::now() < deadline {
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                };
                if crash_dynamodb {
                    wait_for(ops / 3).await;
                    if let Some(d) = &me.dynamodb {
                        let at = chrono::Utc::now();
                        let killed = d.lock().await.crash_and_restart().await;
                        kills.lock().unwrap().push(killed);
                        acks.lock().unwrap().extend(
                            me.ddb_proxy
                                .acks_between(killed - super::checker::KILL_WINDOW_MS, killed),
                        );
                        eprintln!(
                            "chaos: seed {seed}: DynamoDB Local killed at {at}, up again at {}",
                            chrono::Utc::now()
                        );
                    }
                }
                if restart_localstack {
                    wait_for(ops / 2).await;
                    if let Some(l) = &me.localstack {
                        let at = chrono::Utc::now();
                        let mut l = l.lock().await;
                        l.crash_and_restart().await;
                        // Its queues are gone: the timer queue again, same name, same URL.
                        let sdk = aws_config::from_env().endpoint_url(l.url()).load().await;
                        let sqs = aws_sdk_sqs::Client::new(&sdk);
                        let url = tollgate_timers::ensure_queue(&sqs, &me.fleet.queue_name)
                            .await
                            .expect("the timer queue again");
                        short_visibility(&me.sqs_proxy.url(), &url).await;
                        assert_eq!(Some(url), me.fleet.queue_url.lock().unwrap().clone());
                        eprintln!(
                            "chaos: seed {seed}: LocalStack killed at {at}, up again at {}",
                            chrono::Utc::now()
                        );
                    }
                }
                if kill_serve {
                    wait_for(2 * ops / 3).await;
                    let fleet = Arc::clone(&me.fleet);
                    let i = (seed as usize) % fleet.len();
                    let at = chrono::Utc::now();
                    let f = Arc::clone(&fleet);
                    let _ = tokio::task::spawn_blocking(move || f.kill_and_restart(i)).await;
                    if let Some(base) = fleet.base(i) {
                        me.serve_proxies[i].set_upstream(&base);
                    }
                    eprintln!(
                        "chaos: seed {seed}: serve {i} killed at {at}, up again at {}",
                        chrono::Utc::now()
                    );
                }
            })
        };
        for w in workers {
            w.await.expect("a worker panicked");
        }
        let _ = crash.await;
        // Timers keep firing under faults for a while (late and duplicate deliveries
        // after the cards and attempts ended), then everything quiets down.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let mut faults = self.ddb_proxy.counts();
        faults.add(&self.sqs_proxy.counts());
        self.ddb_proxy.disarm();
        self.sqs_proxy.disarm();
        for p in &self.serve_proxies {
            faults.add(&p.counts());
            p.disarm();
        }
        self.quiesce(&model).await;
        let mut history = self.read_back(&model).await;
        history.storage_kills_ms = storage_kills.lock().unwrap().clone();
        history.storage_acks = storage_acks.lock().unwrap().clone();
        let ops = model.ops.lock().unwrap().len();
        let unknown = model
            .ops
            .lock()
            .unwrap()
            .iter()
            .filter(|o| matches!(o.outcome, Outcome::Unknown { .. }))
            .count();
        let failed = model
            .ops
            .lock()
            .unwrap()
            .iter()
            .filter(|o| o.saw_failure)
            .count();
        SeedReport {
            seed: cfg.seed,
            ops,
            failed,
            unknown,
            faults,
            dynamodb_crashes: match &self.dynamodb {
                Some(d) => d.lock().await.crashes - crashes_before,
                None => 0,
            },
            localstack_crashes: match &self.localstack {
                Some(l) => l.lock().await.crashes - ls_before,
                None => 0,
            },
            serve_kills: self.fleet.kills.load(Ordering::SeqCst) - kills_before,
            history,
            elapsed: started.elapsed(),
        }
    }

    fn agent_token(&self, agent: &str) -> String {
        self.auth.mint_jwt(agent, Role::Agent, 3600, None)
    }

    fn operator_token(&self, sub: &str) -> String {
        self.auth.mint_jwt(sub, Role::Operator, 3600, None)
    }

    /// Sends one request, retrying (same body) on 5xx and transport errors on another
    /// process, at most 4 tries: the final answer or `Unknown`, and whether some try
    /// failed.
    async fn call(
        &self,
        rng_pick: usize,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<&Value>,
    ) -> (Outcome, bool) {
        let mut failed = false;
        let mut last = String::new();
        for attempt in 0..4 {
            // Through the client-side proxy of the process (while it is down, its
            // connection is reset).
            let base = self.serve_proxies[(rng_pick + attempt) % self.serve_proxies.len()].url();
            let mut req = self
                .http
                .request(method.clone(), format!("{base}{path}"))
                .bearer_auth(token);
            if let Some(b) = body {
                req = req.json(b);
            }
            match req.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let text = resp.text().await.unwrap_or_default();
                    if status >= 500 {
                        failed = true;
                        last = format!("{status} {text}");
                    } else {
                        let body = serde_json::from_str(&text).unwrap_or(Value::Null);
                        return (Outcome::Answered { status, body }, failed);
                    }
                }
                Err(e) => {
                    failed = true;
                    last = format!("transport: {e}");
                }
            }
            tokio::time::sleep(Duration::from_millis(50 + 100 * attempt as u64)).await;
        }
        (Outcome::Unknown { last }, failed)
    }

    async fn post(&self, pick: usize, path: &str, token: &str, body: &Value) -> (Outcome, bool) {
        self.call(pick, reqwest::Method::POST, path, token, Some(body))
            .await
    }

    async fn get_clean(&self, path: &str, token: &str) -> (u16, Value) {
        for attempt in 0..20u64 {
            if let (Outcome::Answered { status, body }, _) = self
                .call(attempt as usize, reqwest::Method::GET, path, token, None)
                .await
            {
                return (status, body);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("GET {path} never answered with faults off");
    }

    /// One operation chosen by `rng` from what the model knows.
    async fn one_op(&self, model: &Model, rng: &mut StdRng) -> bool {
        let pick = rng.random_range(0..self.fleet.len());
        let roll = rng.random_range(0..100);
        let running = model.running_runs();
        if running.is_empty() || roll < 10 {
            return self.create_run(model, rng, pick).await;
        }
        let run = running[rng.random_range(0..running.len())].clone();
        match roll {
            10..=34 => self.append(model, rng, pick, &run).await,
            35..=49 => self.arm(model, rng, pick, &run).await,
            50..=64 => self.decide(model, rng, pick).await,
            65..=76 => self.start_call(model, rng, pick).await,
            77..=84 => self.dispatch_or_settle(model, rng, pick).await,
            85..=87 => self.reconcile(model, rng, pick).await,
            88..=93 => self.end(model, rng, pick, &run).await,
            _ => {
                let path = format!("/api/runs/{}/events?after=0&limit=50", run.run_id);
                let (outcome, failed) = self
                    .call(pick, reqwest::Method::GET, &path, &run.token, None)
                    .await;
                model.record(OpKind::Read { run_id: run.run_id }, outcome, failed);
                true
            }
        }
    }

    async fn create_run(&self, model: &Model, rng: &mut StdRng, pick: usize) -> bool {
        let agent = format!("{}-agent-{}", model.prefix, rng.random_range(0..2));
        let owner = format!("{}-owner-{}", model.prefix, rng.random_range(0..2));
        let delivery_id = format!("{}-d-{}", model.prefix, uuid::Uuid::new_v4().simple());
        let mut body = json!({"owner": owner, "channel_id": "C1", "delivery_id": delivery_id,
            "budget": {"tools": {"create_dashboard": 3, "web_fetch": 3, "shell": 3},
                       "call_ceiling": 6}});
        let mut kind = "single".to_owned();
        let mut parent = None;
        let k = rng.random_range(0..10);
        if k < 2 {
            kind = "coordinator".into();
        } else if k < 5 {
            // A child joins only a coordinator its own agent created.
            if let Some(c) = model.running_coordinator_of(&agent, rng) {
                kind = "child".into();
                parent = Some(c);
            }
        }
        body["kind"] = json!(kind);
        if let Some(p) = &parent {
            body["parent_run_id"] = json!(p);
            body["subtask_id"] = json!(format!("sub-{}", rng.random_range(0..1000)));
        }
        let token = self.agent_token(&agent);
        let owner_named = owner.clone();
        let (outcome, failed) = self.post(pick, "/api/runs", &token, &body).await;
        if let Outcome::Answered { status, body } = &outcome {
            if (200..300).contains(status) {
                model.runs.lock().unwrap().push(RunInfo {
                    run_id: body["run_id"].as_str().unwrap_or_default().to_owned(),
                    token: body["run_token"].as_str().unwrap_or_default().to_owned(),
                    kind: kind.clone(),
                    parent: parent.clone(),
                    owner: owner.clone(),
                    agent: agent.clone(),
                    ended: false,
                });
            }
        }
        model
            .deliveries
            .lock()
            .unwrap()
            .push((delivery_id.clone(), agent));
        model.record(
            OpKind::CreateRun {
                delivery_id,
                kind,
                parent,
                owner: owner_named,
            },
            outcome,
            failed,
        );
        true
    }

    async fn append(&self, model: &Model, rng: &mut StdRng, pick: usize, run: &RunInfo) -> bool {
        let n = rng.random_range(1..=4);
        let event_ids: Vec<String> = (0..n)
            .map(|_| format!("e-{}", uuid::Uuid::new_v4().simple()))
            .collect();
        let events: Vec<Value> = event_ids
            .iter()
            .map(|id| json!({"type": "agent.step", "event_id": id, "text": "working"}))
            .collect();
        let (outcome, failed) = self
            .post(
                pick,
                &format!("/api/runs/{}/events", run.run_id),
                &run.token,
                &json!({ "events": events }),
            )
            .await;
        model.record(
            OpKind::Append {
                run_id: run.run_id.clone(),
                event_ids,
            },
            outcome,
            failed,
        );
        true
    }

    async fn arm(&self, model: &Model, rng: &mut StdRng, pick: usize, run: &RunInfo) -> bool {
        let tool = TOOLS[rng.random_range(0..TOOLS.len())];
        let request_id = uuid::Uuid::new_v4().to_string();
        // Now and then a fresh approval of a call armed before (a second attempt).
        let tool_call_id = match model.call_of(&run.run_id, tool, rng) {
            Some(call) if rng.random_bool(0.3) => call,
            _ => format!("call-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
        };
        let approval_id = format!(
            "approval-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        );
        let body = json!({"request_id": request_id, "tool_name": tool,
            "tool_call_id": tool_call_id, "approval_id": approval_id,
            "url": "https://example.com/x", "timeout_seconds": rng.random_range(2..=6)});
        let (outcome, failed) = self
            .post(
                pick,
                &format!("/api/runs/{}/approval-requests", run.run_id),
                &run.token,
                &body,
            )
            .await;
        let state = match &outcome {
            Outcome::Answered { body, .. } => body["state"].as_str().map(str::to_owned),
            _ => None,
        };
        model.cards.lock().unwrap().push(CardInfo {
            run_id: run.run_id.clone(),
            token: run.token.clone(),
            owner: run.owner.clone(),
            parent: run.parent.clone(),
            request_id: request_id.clone(),
            tool: tool.to_owned(),
            tool_call_id: tool_call_id.clone(),
            approval_id: approval_id.clone(),
            state,
        });
        model.record(
            OpKind::Arm {
                run_id: run.run_id.clone(),
                request_id,
                tool_call_id,
                approval_id,
            },
            outcome,
            failed,
        );
        true
    }

    async fn decide(&self, model: &Model, rng: &mut StdRng, pick: usize) -> bool {
        let Some(card) = model.some_card(rng, |c| c.state.as_deref() == Some("pending")) else {
            return false;
        };
        let approve = rng.random_bool(0.65);
        let scope = match rng.random_range(0..10) {
            0..=5 => "once",
            6 | 7 => "tool",
            _ => "run",
        };
        // Scopes beyond `once` only from the run's owner; sometimes someone else tries.
        let by = if scope == "once" || rng.random_bool(0.15) {
            format!("{}-op", model.prefix)
        } else {
            card.owner.clone()
        };
        // A child's card is decided on the child, or now and then on its coordinator.
        let on = match &card.parent {
            Some(p) if rng.random_bool(0.3) => p.clone(),
            _ => card.run_id.clone(),
        };
        let verb = if approve {
            "tool-approvals"
        } else {
            "tool-denials"
        };
        let sent = chrono::Utc::now().timestamp_millis();
        let (outcome, failed) = self
            .post(
                pick,
                &format!("/api/runs/{on}/{verb}"),
                &self.operator_token(&by),
                &json!({"request_id": card.request_id, "scope": scope}),
            )
            .await;
        if let Outcome::Answered { status: 200, body } = &outcome {
            model.set_card_state(&card.request_id, body["state"].as_str());
        }
        model.record_sent(
            OpKind::Decide {
                run_id: on,
                request_id: card.request_id,
                approve,
                scope: scope.to_owned(),
                by,
            },
            outcome,
            failed,
            Some(sent),
        );
        true
    }

    async fn start_call(&self, model: &Model, rng: &mut StdRng, pick: usize) -> bool {
        // Mostly approved cards; now and then any card (a refusal that starts nothing).
        let card = if rng.random_bool(0.8) {
            model.some_card(rng, |c| c.state.as_deref() == Some("approved"))
        } else {
            model.some_card(rng, |_| true)
        };
        let Some(card) = card else { return false };
        let (outcome, failed) = self
            .post(
                pick,
                &format!(
                    "/api/runs/{}/tool-calls/{}/start",
                    card.run_id, card.tool_call_id
                ),
                &card.token,
                &json!({"request_id": card.request_id, "approval_id": card.approval_id,
                        "tool_name": card.tool}),
            )
            .await;
        if let Outcome::Answered { body, .. } = &outcome {
            if let Some(state) = body["state"].as_str() {
                model.set_attempt(&card, state);
            }
        }
        model.record(
            OpKind::Start {
                run_id: card.run_id,
                tool_call_id: card.tool_call_id,
                approval_id: card.approval_id,
            },
            outcome,
            failed,
        );
        true
    }

    async fn dispatch_or_settle(&self, model: &Model, rng: &mut StdRng, pick: usize) -> bool {
        let Some((card, state)) = model.some_attempt(rng, |s| s == "intent" || s == "dispatched")
        else {
            return false;
        };
        let base = format!("/api/runs/{}/tool-calls/{}", card.run_id, card.tool_call_id);
        if state == "intent" && rng.random_bool(0.7) {
            let (outcome, failed) = self
                .post(
                    pick,
                    &format!("{base}/dispatch"),
                    &card.token,
                    &json!({"approval_id": card.approval_id}),
                )
                .await;
            if let Outcome::Answered { body, .. } = &outcome {
                if let Some(s) = body["state"].as_str() {
                    model.set_attempt(&card, s);
                }
            }
            model.record(
                OpKind::Dispatch {
                    run_id: card.run_id,
                    tool_call_id: card.tool_call_id,
                    approval_id: card.approval_id,
                },
                outcome,
                failed,
            );
            return true;
        }
        let evidence = ["confirmed", "ambiguous", "not_sent"][rng.random_range(0..3)];
        let mut body = json!({"approval_id": card.approval_id, "evidence": evidence});
        if evidence == "confirmed" {
            body["result"] = json!({"http_status": 200});
        } else if evidence == "ambiguous" {
            body["error"] = json!({"code": "timeout", "message": "no answer"});
        }
        let (outcome, failed) = self
            .post(pick, &format!("{base}/settle"), &card.token, &body)
            .await;
        if let Outcome::Answered { body, .. } = &outcome {
            if let Some(s) = body["state"].as_str() {
                model.set_attempt(&card, s);
            }
        }
        model.record(
            OpKind::Settle {
                run_id: card.run_id,
                tool_call_id: card.tool_call_id,
                approval_id: card.approval_id,
                evidence: evidence.to_owned(),
            },
            outcome,
            failed,
        );
        true
    }

    async fn reconcile(&self, model: &Model, rng: &mut StdRng, pick: usize) -> bool {
        let Some((card, _)) =
            model.some_attempt(rng, |s| s == "outcome_unknown" || s == "dispatched")
        else {
            return false;
        };
        let observed = if rng.random_bool(0.5) {
            "applied"
        } else {
            "not_applied"
        };
        let (outcome, failed) = self
            .post(
                pick,
                &format!(
                    "/api/runs/{}/mutations/{}/{}/reconcile",
                    card.run_id, card.tool_call_id, card.approval_id
                ),
                &self.operator_token(&format!("{}-op", model.prefix)),
                &json!({ "observed": observed }),
            )
            .await;
        if let Outcome::Answered { body, .. } = &outcome {
            if let Some(s) = body["state"].as_str() {
                model.set_attempt(&card, s);
            }
        }
        model.record(
            OpKind::Reconcile {
                run_id: card.run_id,
                tool_call_id: card.tool_call_id,
                approval_id: card.approval_id,
                observed: observed.to_owned(),
            },
            outcome,
            failed,
        );
        true
    }

    async fn end(&self, model: &Model, rng: &mut StdRng, pick: usize, run: &RunInfo) -> bool {
        let how = ["complete", "fail", "cancel"][rng.random_range(0..3)];
        let (outcome, failed) = self
            .post(
                pick,
                &format!("/api/runs/{}/{how}", run.run_id),
                &run.token,
                &json!({}),
            )
            .await;
        if matches!(&outcome, Outcome::Answered { status, .. } if *status == 200 || *status == 409)
        {
            model.ended(&run.run_id);
        }
        model.record(
            OpKind::End {
                run_id: run.run_id.clone(),
                how: how.to_owned(),
            },
            outcome,
            failed,
        );
        true
    }

    /// Faults off: waits (at most 30 s) until no card of the seed is pending and no
    /// attempt is `intent` or `dispatched` (the timers and sweepers have done their work).
    async fn quiesce(&self, model: &Model) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let cards: Vec<CardInfo> = model.cards.lock().unwrap().clone();
        for c in cards {
            loop {
                let (status, card) = self
                    .get_clean(
                        &format!("/api/runs/{}/approval-requests/{}", c.run_id, c.request_id),
                        &c.token,
                    )
                    .await;
                if status != 200 || card["state"] != "pending" || Instant::now() > deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
        let runs: Vec<String> = model.all_run_ids();
        let op = self.operator_token(&format!("{}-op", model.prefix));
        for run_id in runs {
            loop {
                let (_, listing) = self
                    .get_clean(&format!("/api/runs/{run_id}/mutations?limit=1000"), &op)
                    .await;
                let busy = listing["mutations"].as_array().is_some_and(|m| {
                    m.iter()
                        .any(|r| r["state"] == "intent" || r["state"] == "dispatched")
                });
                if !busy || Instant::now() > deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
        // A last moment for timer deliveries in flight.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    /// Reads back, faults off: receipts of every create, every run's whole stream and
    /// records, every armed card, the policies of the seed's runs.
    async fn read_back(&self, model: &Model) -> History {
        let op = self.operator_token(&format!("{}-op", model.prefix));
        let mut read_errors = Vec::new();
        let mut receipts = Vec::new();
        let deliveries = model.deliveries.lock().unwrap().clone();
        let mut tokens: BTreeMap<String, String> = model
            .runs
            .lock()
            .unwrap()
            .iter()
            .map(|r| (r.run_id.clone(), r.token.clone()))
            .collect();
        for (delivery, agent) in deliveries {
            let (status, body) = self
                .get_clean(
                    &format!("/api/receipts/{delivery}"),
                    &self.agent_token(&agent),
                )
                .await;
            if status != 200 && status != 404 {
                read_errors.push(format!("receipt {delivery}: {status} {body}"));
            }
            let run = (status == 200).then(|| body["run_id"].as_str().unwrap_or("").to_owned());
            if let Some(r) = &run {
                tokens
                    .entry(r.clone())
                    .or_insert_with(|| body["run_token"].as_str().unwrap_or("").to_owned());
            }
            receipts.push((delivery, run));
        }
        let mut runs = Vec::new();
        for run_id in tokens.keys() {
            let mut events = Vec::new();
            let mut after = 0u64;
            let mut stuck = 0;
            let mut stuck_after = None;
            let mut absent = false;
            loop {
                let (status, page) = self
                    .get_clean(
                        &format!("/api/runs/{run_id}/events?after={after}&limit=1000"),
                        &op,
                    )
                    .await;
                if status == 404 && after == 0 && events.is_empty() {
                    // No such run (a create lost with the storage): the checker judges it.
                    absent = true;
                    break;
                }
                if status != 200 {
                    read_errors.push(format!("{run_id}: events after {after}: {status} {page}"));
                    stuck_after = Some(after);
                    break;
                }
                events.extend(page["events"].as_array().cloned().unwrap_or_default());
                let next = page["next_after"].as_u64().unwrap_or(after);
                if page["has_more"] != true {
                    break;
                }
                if next <= after {
                    // Not visible yet, or a gap: a few more reads, then call it a gap.
                    stuck += 1;
                    if stuck > 10 {
                        stuck_after = Some(after);
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    continue;
                }
                after = next;
            }
            let mut mutations = Vec::new();
            if !absent {
                let (status, listing) = self
                    .get_clean(&format!("/api/runs/{run_id}/mutations?limit=1000"), &op)
                    .await;
                if status != 200 || listing["has_more"] == true {
                    read_errors.push(format!("{run_id}: mutations: {status} {listing}"));
                }
                mutations = listing["mutations"].as_array().cloned().unwrap_or_default();
            }
            runs.push(FinalRun {
                run_id: run_id.clone(),
                events,
                mutations,
                stuck_after,
                absent,
            });
        }
        let mut cards = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let armed: Vec<CardInfo> = model.cards.lock().unwrap().clone();
        for c in armed {
            if !seen.insert(c.request_id.clone()) {
                continue;
            }
            let (status, card) = self
                .get_clean(
                    &format!("/api/runs/{}/approval-requests/{}", c.run_id, c.request_id),
                    &c.token,
                )
                .await;
            if status != 200 && status != 404 {
                read_errors.push(format!("card {}: {status} {card}", c.request_id));
            }
            cards.push(FinalCard {
                run_id: c.run_id,
                request_id: c.request_id,
                card: (status == 200).then_some(card),
            });
        }
        let mut policies = Vec::new();
        let mut cursor: Option<String> = None;
        loop {
            let path = match &cursor {
                Some(c) => format!("/api/policies?limit=500&cursor={c}"),
                None => "/api/policies?limit=500".to_owned(),
            };
            let (status, page) = self.get_clean(&path, &op).await;
            if status != 200 {
                read_errors.push(format!("policies: {status} {page}"));
                break;
            }
            for p in page["policies"].as_array().cloned().unwrap_or_default() {
                if tokens.contains_key(p["origin_run_id"].as_str().unwrap_or("")) {
                    policies.push(p);
                }
            }
            match page["next_cursor"].as_str() {
                Some(c) if page["has_more"] == true => cursor = Some(c.to_owned()),
                _ => break,
            }
        }
        let listed_runs = self.list_runs(model, &mut read_errors).await;
        History {
            ops: model.ops.lock().unwrap().clone(),
            runs,
            cards,
            policies,
            receipts,
            storage_kills_ms: Vec::new(),
            storage_acks: Vec::new(),
            listed_runs,
            read_errors,
        }
    }

    /// Every run of the seed in the runs table (its owners are the seed's), read from
    /// the table itself: a run no create accounts for would show here.
    async fn list_runs(
        &self,
        model: &Model,
        errors: &mut Vec<String>,
    ) -> Vec<(String, Option<String>)> {
        let sdk = aws_config::from_env()
            .endpoint_url(self.ddb_proxy.url())
            .load()
            .await;
        let ddb = aws_sdk_dynamodb::Client::new(&sdk);
        let table = format!("{}runs", self.fleet.table_prefix);
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let page = ddb
                .scan()
                .table_name(&table)
                .filter_expression("begins_with(#o, :p) AND attribute_exists(next_seq)")
                .expression_attribute_names("#o", "owner")
                .expression_attribute_values(
                    ":p",
                    aws_sdk_dynamodb::types::AttributeValue::S(format!("{}-owner-", model.prefix)),
                )
                .set_exclusive_start_key(start.take())
                .send()
                .await;
            let page = match page {
                Ok(p) => p,
                Err(e) => {
                    errors.push(format!("scan of {table}: {e:?}"));
                    return out;
                }
            };
            for item in page.items() {
                let get = |k: &str| item.get(k).and_then(|v| v.as_s().ok()).cloned();
                if let Some(run) = get("run_id") {
                    out.push((run, get("delivery_id")));
                }
            }
            match page.last_evaluated_key() {
                Some(k) if !k.is_empty() => start = Some(k.clone()),
                _ => break,
            }
        }
        out
    }
}

/// The chaos timer queue's visibility timeout: 3 s, so that a message whose delete was
/// lost (the proxy's `sqs_redeliver`) or whose handling outlasts it is delivered again
/// by SQS itself.
async fn short_visibility(endpoint: &str, queue_url: &str) {
    let sdk = aws_config::from_env().endpoint_url(endpoint).load().await;
    aws_sdk_sqs::Client::new(&sdk)
        .set_queue_attributes()
        .queue_url(queue_url)
        .attributes(
            aws_sdk_sqs::types::QueueAttributeName::VisibilityTimeout,
            "3",
        )
        .send()
        .await
        .expect("the timer queue's visibility timeout");
}

#[derive(Debug, Clone)]
struct RunInfo {
    run_id: String,
    token: String,
    kind: String,
    parent: Option<String>,
    owner: String,
    agent: String,
    ended: bool,
}

#[derive(Debug, Clone)]
struct CardInfo {
    run_id: String,
    token: String,
    owner: String,
    parent: Option<String>,
    request_id: String,
    tool: String,
    tool_call_id: String,
    approval_id: String,
    /// The last state an answer reported.
    state: Option<String>,
}

/// What the clients know, and the record of what they did.
struct Model {
    /// Names of the seed's principals start with it (agents, owners, operators).
    prefix: String,
    runs: Mutex<Vec<RunInfo>>,
    cards: Mutex<Vec<CardInfo>>,
    /// (run, tool call, approval) → the attempt's last reported state.
    attempts: Mutex<BTreeMap<(String, String, String), String>>,
    deliveries: Mutex<Vec<(String, String)>>,
    ops: Mutex<Vec<Op>>,
}

impl Model {
    fn new(seed: u64) -> Self {
        Self {
            prefix: format!(
                "s{seed}-{}",
                &uuid::Uuid::new_v4().simple().to_string()[..6]
            ),
            runs: Mutex::default(),
            cards: Mutex::default(),
            attempts: Mutex::default(),
            deliveries: Mutex::default(),
            ops: Mutex::default(),
        }
    }

    fn record(&self, kind: OpKind, outcome: Outcome, saw_failure: bool) {
        self.record_sent(kind, outcome, saw_failure, None);
    }

    fn record_sent(&self, kind: OpKind, outcome: Outcome, saw_failure: bool, sent: Option<i64>) {
        self.ops.lock().unwrap().push(Op {
            kind,
            outcome,
            saw_failure,
            sent_at_ms: sent,
            answered_at_ms: chrono::Utc::now().timestamp_millis(),
        });
    }

    fn running_runs(&self) -> Vec<RunInfo> {
        self.runs
            .lock()
            .unwrap()
            .iter()
            .filter(|r| !r.ended)
            .cloned()
            .collect()
    }

    fn all_run_ids(&self) -> Vec<String> {
        self.runs
            .lock()
            .unwrap()
            .iter()
            .map(|r| r.run_id.clone())
            .collect()
    }

    fn running_coordinator_of(&self, agent: &str, rng: &mut StdRng) -> Option<String> {
        let runs = self.runs.lock().unwrap();
        let mine: Vec<&RunInfo> = runs
            .iter()
            .filter(|r| !r.ended && r.kind == "coordinator" && r.agent == agent)
            .collect();
        (!mine.is_empty()).then(|| mine[rng.random_range(0..mine.len())].run_id.clone())
    }

    fn ended(&self, run_id: &str) {
        for r in self.runs.lock().unwrap().iter_mut() {
            if r.run_id == run_id {
                r.ended = true;
            }
        }
    }

    fn call_of(&self, run_id: &str, tool: &str, rng: &mut StdRng) -> Option<String> {
        let cards = self.cards.lock().unwrap();
        let calls: Vec<&CardInfo> = cards
            .iter()
            .filter(|c| c.run_id == run_id && c.tool == tool)
            .collect();
        (!calls.is_empty()).then(|| calls[rng.random_range(0..calls.len())].tool_call_id.clone())
    }

    fn some_card(&self, rng: &mut StdRng, keep: impl Fn(&CardInfo) -> bool) -> Option<CardInfo> {
        let cards = self.cards.lock().unwrap();
        let fit: Vec<&CardInfo> = cards.iter().filter(|c| keep(c)).collect();
        (!fit.is_empty()).then(|| fit[rng.random_range(0..fit.len())].clone())
    }

    fn set_card_state(&self, request_id: &str, state: Option<&str>) {
        for c in self.cards.lock().unwrap().iter_mut() {
            if c.request_id == request_id {
                c.state = state.map(str::to_owned);
            }
        }
    }

    fn set_attempt(&self, card: &CardInfo, state: &str) {
        self.attempts.lock().unwrap().insert(
            (
                card.run_id.clone(),
                card.tool_call_id.clone(),
                card.approval_id.clone(),
            ),
            state.to_owned(),
        );
    }

    fn some_attempt(
        &self,
        rng: &mut StdRng,
        keep: impl Fn(&str) -> bool,
    ) -> Option<(CardInfo, String)> {
        let attempts = self.attempts.lock().unwrap();
        let fit: Vec<(&(String, String, String), &String)> =
            attempts.iter().filter(|(_, s)| keep(s)).collect();
        if fit.is_empty() {
            return None;
        }
        let ((run, call, approval), state) = fit[rng.random_range(0..fit.len())];
        let cards = self.cards.lock().unwrap();
        let card = cards
            .iter()
            .find(|c| &c.run_id == run && &c.tool_call_id == call && &c.approval_id == approval)?
            .clone();
        Some((card, state.clone()))
    }
}
