//! `tollgate mcp proxy`: an MCP server behind Tollgate's approval gates
//! (`tollgate_mcp`). The agent starts this command as its MCP server; this command
//! starts (or connects to) the real one and relays everything, deciding each
//! `tools/call` first. stdout carries only MCP; logs go to stderr.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use tollgate_client::{Client, ClientConfig};
use tollgate_mcp::{Ended, Gateway, Options, Policy, Upstream};

#[derive(Subcommand)]
pub enum McpCommand {
    /// Serve MCP on stdin/stdout to the agent, relaying to the upstream server
    /// (`-- CMD ARGS…`, or --upstream-url); each tools/call is allowed, denied or asked
    /// by the policy (ask by default). TOLLGATE_URL and TOLLGATE_TOKEN (an agent JWT)
    /// say which Tollgate decides.
    Proxy(Proxy),
}

#[derive(Args)]
pub struct Proxy {
    /// The upstream server's name: tools are carded as mcp__NAME__TOOL.
    #[arg(long)]
    name: String,
    /// A TOML policy file (`[[rule]]` tool glob, `when` conditions, decision).
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// The human the session's run acts for (who may grant scopes beyond once).
    #[arg(long)]
    owner: Option<String>,
    /// The channel the run reports to.
    #[arg(long)]
    channel_id: Option<String>,
    /// A tool the upstream annotates readOnlyHint: true is allowed when no rule covers
    /// it (annotations are the server's own unverified word; off by default).
    #[arg(long)]
    trust_annotations: bool,
    /// Seconds a card waits for an operator.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    timeout: u64,
    /// Seconds an approved call may take upstream before its outcome is unknown.
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    call_timeout: u64,
    /// A Streamable HTTP upstream instead of a command.
    #[arg(long, value_name = "URL", conflicts_with = "command")]
    upstream_url: Option<String>,
    /// A header for the HTTP upstream (`Name: value`), repeatable.
    #[arg(long, value_name = "HEADER", requires = "upstream_url")]
    upstream_header: Vec<String>,
    /// Tollgate's base URL.
    #[arg(long, env = "TOLLGATE_URL", value_name = "URL")]
    url: String,
    /// An agent JWT (prefer the environment variable: arguments show in `ps`).
    #[arg(
        long,
        env = "TOLLGATE_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    token: String,
    /// The upstream command and its arguments (after `--`).
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// Runs the command; its exit code.
pub async fn run(command: McpCommand) -> Result<i32, String> {
    let McpCommand::Proxy(p) = command;
    tollgate_api::telemetry::init_stderr();
    let upstream = match (&p.upstream_url, p.command.split_first()) {
        (Some(url), _) => Upstream::Url {
            url: url.clone(),
            headers: p
                .upstream_header
                .iter()
                .map(|h| Upstream::parse_header(h))
                .collect::<Result<_, _>>()
                .map_err(|e| e.to_string())?,
        },
        (None, Some((program, args))) => Upstream::Command {
            program: program.clone(),
            args: args.to_vec(),
        },
        (None, None) => {
            return Err("name the upstream server: `-- CMD [ARGS…]` or --upstream-url URL".into())
        }
    };
    let valid_name = !p.name.is_empty()
        && p.name.len() <= 64
        && p.name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid_name {
        return Err("--name must be 1 to 64 of A-Z a-z 0-9 _ -".into());
    }
    if !(1..=7 * 24 * 3600).contains(&p.timeout) || p.call_timeout == 0 {
        return Err("--timeout must be 1 s to 7 days, --call-timeout at least 1 s".into());
    }
    let policy = match &p.policy {
        Some(path) => Policy::load(path).map_err(|e| e.to_string())?,
        None => Policy::default(),
    }
    .trust_annotations(p.trust_annotations);
    let tollgate = Client::with_config(&p.url, &p.token, ClientConfig::default())
        .map_err(|e| format!("TOLLGATE_URL / TOLLGATE_TOKEN: {e}"))?;
    let mut options = Options::new(p.name);
    options.owner = p.owner;
    options.channel_id = p.channel_id;
    options.policy = policy;
    options.card_timeout = Duration::from_secs(p.timeout);
    options.call_timeout = Duration::from_secs(p.call_timeout);
    let gateway = Gateway::new(options, tollgate, upstream);
    match tollgate_mcp::serve_stdio(gateway).await {
        Ok(Ended::AgentClosed | Ended::Stopped) => Ok(0),
        Ok(Ended::UpstreamClosed) => {
            Err("the upstream MCP server exited; the session's run failed".into())
        }
        Err(e) => Err(format!("mcp proxy: {e}")),
    }
}
