//! `tollgate`: `serve` runs every HTTP route of every function in one process (the same
//! handlers the Lambdas run); `token` mints a JWT (with `--stack`, a deployed stack's URLs
//! and tokens as `export` lines); `watch`, `approvals`,
//! `approve` and `deny` are clients of a running server (`TOLLGATE_URL`,
//! `TOLLGATE_TOKEN`).

mod decide;
mod mcp;
mod remote;
mod render;
mod runs;
mod stack;
mod watch;

use std::net::SocketAddr;

use clap::{Parser, Subcommand};
use tollgate_api::config::Secret;
use tollgate_api::{Auth, Backend, Config, Deps, Role, ServeTimers};
use tollgate_client::operator::Verb;

#[derive(Parser)]
#[command(
    name = "tollgate",
    version,
    about = "Human approval gates and replayable run streams for AI-agent tool calls"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve all routes on 127.0.0.1:PORT.
    Serve {
        #[arg(long, default_value_t = 8080, env = "TOLLGATE_PORT")]
        port: u16,
        /// `memory` (embedded, nothing to install) or `aws` (DynamoDB via the SDK's
        /// endpoint resolution, so AWS_ENDPOINT_URL reaches an emulator).
        #[arg(long, default_value = "memory", env = "TOLLGATE_BACKEND")]
        backend: String,
        /// With `--backend aws`: create missing tables from infra/template.yaml.
        #[arg(long, env = "TOLLGATE_CREATE_TABLES")]
        create_tables: bool,
        /// Listen address (loopback by default).
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
    },
    /// Print a JWT signed with TOLLGATE_SECRET. With --stack: the deployed stack's URLs
    /// and an agent and an operator token as `export` lines (or, with --sub and --role,
    /// one JWT), signed with the stack's own secret, read with the AWS SDK.
    Token {
        #[arg(long, required_unless_present = "stack", requires = "role")]
        sub: Option<String>,
        #[arg(long, value_parser = ["agent", "operator"], required_unless_present = "stack", requires = "sub")]
        role: Option<String>,
        /// Seconds the token is valid [default: 3600; with --stack: agent 86400,
        /// operator 28800].
        #[arg(long)]
        ttl: Option<u64>,
        #[arg(long)]
        project_id: Option<String>,
        /// A deployed Tollgate stack: read its outputs and signing secret (AWS
        /// credentials and region as the AWS SDK finds them).
        #[arg(long, value_name = "NAME")]
        stack: Option<String>,
        /// The stack's region (else AWS_REGION, or the profile's).
        #[arg(long, requires = "stack")]
        region: Option<String>,
    },
    /// Print the HTTP contract's OpenAPI 3.1 document, generated from its types
    /// (`make openapi` writes it to openapi.json).
    Openapi,
    /// Follow a run's live event stream, one line per event, until the run ends
    /// (resumes by itself after a dropped connection).
    Watch {
        /// The run id.
        run: String,
        /// Print each event's JSON as the server stores it, one per line.
        #[arg(long)]
        json: bool,
        /// Start after this sequence.
        #[arg(long, default_value_t = 0, value_name = "N")]
        after: u64,
        #[command(flatten)]
        conn: remote::Conn,
    },
    /// List the pending approval cards (of every run you may see, or of one).
    Approvals {
        /// Only this run's cards.
        #[arg(long, value_name = "RUN")]
        run: Option<String>,
        #[command(flatten)]
        conn: remote::Conn,
    },
    /// List the project's runs, newest first (one page; --after for the next).
    Runs {
        /// Only runs in this status.
        #[arg(long, value_parser = ["running", "completed", "failed", "cancelled"])]
        status: Option<String>,
        /// Only this owner's runs.
        #[arg(long)]
        owner: Option<String>,
        /// Only runs whose id starts with this.
        #[arg(long, value_name = "PREFIX")]
        q: Option<String>,
        /// The project (an operator token without a project).
        #[arg(long)]
        project_id: Option<String>,
        /// Most runs on the page (1–200; default 50).
        #[arg(long)]
        limit: Option<u32>,
        /// The cursor the previous page printed.
        #[arg(long, value_name = "CURSOR")]
        after: Option<String>,
        #[command(flatten)]
        conn: remote::Conn,
    },
    /// Approve a pending tool call.
    Approve {
        /// The run id (the child's or its coordinator's).
        run: String,
        /// The card's request id.
        request: String,
        /// What the approval also covers: once (this call), tool (the tool on this run),
        /// run (… and the owner's sibling runs), always (the owner's runs in the project).
        #[arg(long, default_value = "once", value_parser = ["once", "run", "tool", "always"])]
        scope: String,
        /// The tool the card is for (refused if the card is for another): a check, never
        /// needed (on a pod run Tollgate knows the card's tool from its pod).
        #[arg(long)]
        tool: Option<String>,
        /// Why: recorded on the card and in its resolution events (at most 1024
        /// characters).
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        conn: remote::Conn,
    },
    /// An MCP server's tools behind Tollgate: `tollgate mcp proxy --name NAME -- CMD …`.
    Mcp {
        #[command(subcommand)]
        command: mcp::McpCommand,
    },
    /// Reconcile an approved call whose outcome is unknown with what you observed at
    /// the tool: `applied` (it ran: the record becomes completed) or `not_applied` (it
    /// did not: not_executed, and the same call may be approved afresh).
    Reconcile {
        /// The run id.
        run: String,
        /// The call's tool_call_id (the MCP gateway's refusal names it).
        tool_call_id: String,
        /// The attempt's approval_id (defaults to the tool_call_id, as the gateway and
        /// the clients arm cards).
        approval_id: Option<String>,
        /// What the tool shows happened.
        #[arg(long, value_parser = ["applied", "not_applied"])]
        observed: String,
        #[command(flatten)]
        conn: remote::Conn,
    },
    /// Deny a pending tool call.
    Deny {
        /// The run id (the child's or its coordinator's).
        run: String,
        /// The card's request id.
        request: String,
        /// Why: recorded on the card and in its resolution events (at most 1024
        /// characters).
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        conn: remote::Conn,
    },
}

/// Ends a client command: its message on stderr, its exit code.
fn exit_with(result: Result<i32, remote::Failure>) -> ! {
    match result {
        Ok(code) => std::process::exit(code),
        Err(f) => {
            eprintln!("tollgate: {}", f.message);
            std::process::exit(f.code)
        }
    }
}

fn fail(msg: impl std::fmt::Display) -> ! {
    eprintln!("tollgate: {msg}");
    std::process::exit(2)
}

fn secret_from_env() -> Option<Secret> {
    let value = std::env::var("TOLLGATE_SECRET")
        .ok()
        .filter(|v| !v.is_empty())?;
    Some(Secret::new(value).unwrap_or_else(|e| fail(e)))
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    match cli.command {
        Command::Mcp { command } => match mcp::run(command).await {
            // The agent's stdin may still be held by a blocking read: exit now.
            Ok(code) => std::process::exit(code),
            Err(e) => fail(e),
        },
        Command::Openapi => {
            let doc = tollgate_protocol::openapi::document();
            println!(
                "{}",
                serde_json::to_string_pretty(&doc).unwrap_or_else(|e| fail(e))
            );
        }
        Command::Watch {
            run,
            json,
            after,
            conn,
        } => exit_with(
            async {
                // The server's address and token are checked first, then the override.
                let answer_timeout = watch::answer_timeout();
                let operator =
                    remote::connect(conn, answer_timeout.as_ref().ok().copied().flatten())?;
                answer_timeout?;
                watch::watch(&operator, &watch::WatchArgs { run, json, after }).await
            }
            .await
            .map(|()| 0),
        ),
        Command::Approvals { run, conn } => exit_with(
            match remote::connect(conn, None) {
                Ok(operator) => decide::list(&operator, run.as_deref()).await,
                Err(f) => Err(f),
            }
            .map(|()| 0),
        ),
        Command::Runs {
            status,
            owner,
            q,
            project_id,
            limit,
            after,
            conn,
        } => exit_with(
            match remote::connect(conn, None) {
                Ok(operator) => {
                    let query = tollgate_client::operator::RunQuery {
                        limit,
                        after,
                        status,
                        owner,
                        run_id_prefix: q,
                        project_id,
                    };
                    runs::list(&operator, &query).await
                }
                Err(f) => Err(f),
            }
            .map(|()| 0),
        ),
        Command::Approve {
            run,
            request,
            scope,
            tool,
            reason,
            conn,
        } => exit_with(match remote::connect(conn, None) {
            Ok(operator) => {
                let verb = Verb::Approve;
                let (tool, reason) = (tool.as_deref(), reason.as_deref());
                decide::decide(&operator, &run, &request, verb, &scope, tool, reason).await
            }
            Err(f) => Err(f),
        }),
        Command::Reconcile {
            run,
            tool_call_id,
            approval_id,
            observed,
            conn,
        } => exit_with(match remote::connect(conn, None) {
            Ok(operator) => {
                let approval_id = approval_id.as_deref().unwrap_or(&tool_call_id);
                match operator
                    .reconcile(&run, &tool_call_id, approval_id, observed == "applied")
                    .await
                {
                    Ok(state) => {
                        println!("reconciled {tool_call_id}: {state}");
                        Ok(0)
                    }
                    Err(tollgate_client::operator::OperatorError::Refused(r)) => {
                        Err(remote::refusal(&r))
                    }
                    Err(e) => Err(remote::Failure::unavailable(format!(
                        "the reconciliation may not have been recorded: {e}"
                    ))),
                }
            }
            Err(f) => Err(f),
        }),
        Command::Deny {
            run,
            request,
            reason,
            conn,
        } => exit_with(match remote::connect(conn, None) {
            Ok(operator) => {
                let reason = reason.as_deref();
                decide::decide(&operator, &run, &request, Verb::Deny, "once", None, reason).await
            }
            Err(f) => Err(f),
        }),
        Command::Token {
            sub,
            role,
            ttl,
            project_id,
            stack,
            region,
        } => {
            let max = Auth::max_token_lifetime_from_env().unwrap_or_else(|e| fail(e));
            let (secret, stack) = match stack {
                Some(name) => {
                    let (facts, secret) = stack::read(&name, region.as_deref())
                        .await
                        .unwrap_or_else(|e| fail(e));
                    (secret, Some(facts))
                }
                None => (
                    secret_from_env().unwrap_or_else(|| {
                        fail("TOLLGATE_SECRET is not set (use the one `tollgate serve` runs with, or --stack NAME)")
                    }),
                    None,
                ),
            };
            let (Some(sub), Some(role)) = (sub, role) else {
                // --stack without --sub/--role: the export lines.
                let facts = stack.expect("clap requires --sub and --role without --stack");
                if let Some(ttl) = ttl.filter(|ttl| *ttl > max) {
                    fail(format!(
                        "--ttl {ttl} is longer than the servers accept \
                         (TOLLGATE_MAX_TOKEN_LIFETIME_SECONDS, here {max})"
                    ));
                }
                let operator = std::env::var("USER")
                    .ok()
                    .filter(|u| !u.is_empty() && u != "root")
                    .unwrap_or_else(|| "operator".into());
                let who = stack::Subjects {
                    agent: "agent".into(),
                    operator,
                    project_id,
                    ttl,
                };
                let auth = Auth::new(secret.expose());
                print!(
                    "{}",
                    stack::export_lines(&facts, &auth, &who).unwrap_or_else(|e| fail(e))
                );
                return;
            };
            let ttl = ttl.unwrap_or(3600);
            // A token the server would refuse is no use: say so instead of printing it.
            if ttl > max {
                fail(format!(
                    "--ttl {ttl} is longer than the servers accept \
                     (TOLLGATE_MAX_TOKEN_LIFETIME_SECONDS, here {max})"
                ));
            }
            let role = if role == "operator" {
                Role::Operator
            } else {
                Role::Agent
            };
            println!(
                "{}",
                Auth::new(secret.expose()).mint_jwt(&sub, role, ttl, project_id)
            );
        }
        Command::Serve {
            port,
            backend,
            create_tables,
            host,
        } => {
            tollgate_api::telemetry::init(false);
            let (secret, generated) = match secret_from_env() {
                Some(s) => (s, false),
                None => (Secret::generate(), true),
            };
            let mut config = Config::from_env_with_secret(secret).unwrap_or_else(|e| fail(e));
            config.backend = backend.parse().unwrap_or_else(|e| fail(e));
            config.create_tables |= create_tables;
            // The embedded store is made here so that the notifier can follow its writes.
            let memory = (config.backend == Backend::Memory)
                .then(|| std::sync::Arc::new(tollgate_store::memory::MemoryStore::new()));
            let store: std::sync::Arc<dyn tollgate_store::Store> = match &memory {
                Some(m) => m.clone(),
                None => config.connect_store().await.unwrap_or_else(|e| fail(e)),
            };
            // Slack (docs/architecture.md §11): the interactivity endpoint, and the sink
            // that posts cards to runs' channels.
            let slack = tollgate_api::slack::Slack::from_env()
                .unwrap_or_else(|e| fail(e))
                .map(std::sync::Arc::new);
            // Notification sinks (a signed webhook, Slack): a bad configuration stops here.
            let sinks =
                tollgate_api::notify::sinks_from_env(slack.as_ref().map(|s| s.client.clone()))
                    .await
                    .unwrap_or_else(|e| fail(e));
            let notify_policy =
                tollgate_api::notify::RetryPolicy::from_env().unwrap_or_else(|e| fail(e));
            let timers = config.serve_timers().await.unwrap_or_else(|e| fail(e));
            let max_lifetime = Auth::max_token_lifetime_from_env().unwrap_or_else(|e| fail(e));
            let auth = Auth::new(config.secret.expose())
                .with_max_token_lifetime(max_lifetime)
                .with_oidc_from_env()
                .unwrap_or_else(|e| fail(e));
            let addr: SocketAddr = format!("{host}:{port}").parse().unwrap_or_else(|e| fail(e));
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .unwrap_or_else(|e| fail(format!("cannot listen on {addr}: {e}")));
            let url = format!("http://{}", listener.local_addr().unwrap_or(addr));
            println!(
                "Tollgate is listening on {url} (backend: {})",
                match config.backend {
                    Backend::Memory => "memory",
                    Backend::Aws => "aws",
                }
            );
            match (&timers, config.backend) {
                (ServeTimers::Sqs { queue_url }, _) => println!(
                    "Timers (approval expiry, heartbeats): SQS queue {queue_url}, consumed by this process."
                ),
                (ServeTimers::Embedded, Backend::Aws) => println!(
                    "Timers (approval expiry, heartbeats) run in this process: set \
                     TOLLGATE_TIMER_QUEUE_URL, or pass --create-tables, to run them on SQS."
                ),
                (ServeTimers::Embedded, Backend::Memory) => {
                    println!("Timers (approval expiry, heartbeats) run in this process.")
                }
            }
            if let Some(slack) = &slack {
                println!(
                    "Slack: cards go to their runs' channels; interactivity at {url}{} ({} Slack users mapped).",
                    tollgate_api::slack::INTERACTIONS_PATH,
                    slack.users.len()
                );
            }
            // Ready tokens only for a secret this process made up (it exists nowhere
            // else, so nobody could mint with it). A secret that was given may be shared
            // with other servers or a deployment: printing live tokens for it would put
            // credentials into terminals and logs nobody meant to hold them.
            if generated {
                let ttl = max_lifetime.min(86_400);
                let agent = auth.mint_jwt("local-agent", Role::Agent, ttl, None);
                let operator = auth.mint_jwt("local-operator", Role::Operator, ttl, None);
                println!("TOLLGATE_SECRET was not set; this process signs with a random secret.");
                println!("To mint more tokens, restart with TOLLGATE_SECRET set and use `tollgate token`.");
                println!();
                println!("export TOLLGATE_URL={url}");
                println!("export AGENT_TOKEN={agent}");
                println!("export OPERATOR_TOKEN={operator}");
            } else {
                println!("Signing with the given TOLLGATE_SECRET; mint tokens with it, e.g.:");
                println!("  tollgate token --sub local-operator --role operator");
                println!("  tollgate token --sub local-agent --role agent");
                println!();
                println!("export TOLLGATE_URL={url}");
            }
            println!();
            let gate = tollgate_api::GateConfig::from_env().unwrap_or_else(|e| fail(e));
            // Timers (expiry, heartbeats) on the embedded queue or on SQS, consumed here;
            // the sweeper and the stall guard run in this process either way.
            let sse = tollgate_api::sse::SseConfig::from_env().unwrap_or_else(|e| fail(e));
            let mut deps = Deps::serve(store.clone(), &timers, gate, auth)
                .await
                .with_slack(slack.clone());
            deps.sse = sse;
            deps.slack_channels = tollgate_api::slack::channels::SlackChannels::from_env()
                .unwrap_or_else(|e| fail(e))
                .map(std::sync::Arc::new);
            // `GET /api/live` advertises this server's WebSocket endpoint, or the one
            // configured (a deployment's API Gateway URL).
            deps.websocket_url = Some(
                tollgate_api::live::websocket_url_from_env()
                    .unwrap_or_else(|| tollgate_protocol::ws::WS_PATH.to_owned()),
            );
            // On DynamoDB, one stream reader wakes this process's live tails of the runs
            // any process appends to (docs/architecture.md §5).
            if config.backend == Backend::Aws {
                let safety = tollgate_api::live::safety_poll_from_env().unwrap_or_else(|e| fail(e));
                let sdk = tollgate_store::dynamo::sdk_config().await;
                deps = deps
                    .with_wakes(std::sync::Arc::new(tollgate_api::live::Wakes::new(safety)))
                    .with_stream_reader(&sdk, config.tables.events.clone());
            }
            // Notifications (docs/architecture.md §10): fed by the embedded store's writes,
            // or by this process's reader of the events table's stream.
            if !sinks.is_empty() {
                let names: Vec<&str> = sinks.iter().map(|s| s.name()).collect();
                println!(
                    "Notifications: {} (delivered from this process).",
                    names.join(", ")
                );
                // Each sink's first enabling is recorded before anything is read: what
                // the stream holds from before it is not this sink's to notify.
                let notifier = tollgate_api::notify::Notifier::new(store.clone(), sinks)
                    .with_policy(notify_policy)
                    .with_backlog_grace(std::time::Duration::ZERO);
                notifier.enable_sinks().await.unwrap_or_else(|e| {
                    fail(format!("notifications: the sinks' first enabling: {e}"))
                });
                let notifier = std::sync::Arc::new(notifier);
                let feed = match &memory {
                    Some(m) => {
                        tollgate_api::notify::feed::spawn_embedded(notifier.clone(), m.clone())
                    }
                    None => {
                        let sdk = tollgate_store::dynamo::sdk_config().await;
                        tollgate_api::notify::feed::spawn_stream(
                            notifier.clone(),
                            &sdk,
                            config.tables.events.clone(),
                        )
                    }
                };
                deps = deps.with_notifier(notifier, Some(feed));
            }
            let app = tollgate_api::app(deps.clone());
            // Ctrl-C, or SIGTERM (a process manager's stop): finish what is in hand; open
            // live streams end at once (their clients resume with Last-Event-ID).
            let closing = deps.clone();
            let signalled = async {
                #[cfg(unix)]
                {
                    use tokio::signal::unix::{signal, SignalKind};
                    match signal(SignalKind::terminate()) {
                        Ok(mut term) => {
                            tokio::select! {
                                _ = tokio::signal::ctrl_c() => {}
                                _ = term.recv() => {}
                            }
                            return;
                        }
                        Err(e) => eprintln!("tollgate: SIGTERM not handled: {e}"),
                    }
                }
                let _ = tokio::signal::ctrl_c().await;
            };
            let shutdown = async move {
                signalled.await;
                closing.close_streams();
            };
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
            {
                fail(e);
            }
            deps.shutdown().await;
        }
    }
}
