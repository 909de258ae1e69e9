//! # tollgate-mcp
//!
//! The MCP gateway behind `tollgate mcp proxy`: it serves MCP to an agent (over stdio)
//! and relays everything to an upstream MCP server unchanged — except that each
//! `tools/call` is decided first. The [`Policy`] allows it, denies it, or (by default)
//! asks: a card is armed on the session's run (`mcp__<server>__<tool>`, the arguments'
//! hash, a preview), and the call waits as long as the card lives while operators
//! decide in the console, the CLI or Slack. An approved call goes through the execution
//! ledger — start, dispatch right before the upstream request, settle with what the
//! upstream answered — and a call whose answer never came is `outcome_unknown`: the
//! agent is told not to retry, and the same call is refused until an operator
//! reconciles the record.
//!
//! One agent session is one Tollgate run: created at the agent's first request,
//! completed when the agent's session ends, failed when the upstream's does.

mod gateway;
pub mod policy;
mod upstream;

pub use gateway::{Gateway, Options, OUTCOME_UNKNOWN};
pub use policy::{Policy, PolicyError, Verdict};
pub use upstream::{Upstream, UpstreamError};

use std::pin::Pin;
use std::task::{Context, Poll};

use rmcp::ServiceExt;
use tokio::io::{AsyncRead, ReadBuf};
use tokio_util::sync::CancellationToken;

/// Why the gateway stopped.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The agent's session ended (stdin closed); the run completed.
    AgentClosed,
    /// The upstream's session ended first; the run failed.
    UpstreamClosed,
    /// The process was asked to stop (SIGINT, SIGTERM); the run completed.
    Stopped,
}

/// Serves one agent on this process's stdin/stdout until its session or the upstream's
/// ends, then ends the run. stdout carries only MCP.
pub async fn serve_stdio(
    gateway: Gateway,
) -> Result<Ended, Box<dyn std::error::Error + Send + Sync>> {
    let (stdin, stdout) = rmcp::transport::io::stdio_pipes();
    let agent_eof = CancellationToken::new();
    let stdin = WatchEof {
        inner: stdin,
        eof: agent_eof.clone(),
    };
    let running = gateway.clone().serve((stdin, stdout)).await?;
    let agent_done = running.waiting();
    tokio::pin!(agent_done);
    let ended = tokio::select! {
        _ = &mut agent_done => Ended::AgentClosed,
        _ = gateway.upstream_gone() => Ended::UpstreamClosed,
        _ = stop_signal() => Ended::Stopped,
    };
    // The agent closed stdin first: the session's end is the agent's, even if the
    // upstream died after (a host ending a session stops the whole process group, the
    // upstream with it, once a grace period passes — the Python SDK's is 2 s — and the
    // agent's side may still be draining a call in flight then).
    let ended = match ended {
        Ended::UpstreamClosed if agent_eof.is_cancelled() => Ended::AgentClosed,
        other => other,
    };
    let failure = (ended == Ended::UpstreamClosed).then_some("the upstream MCP server exited");
    gateway.finish(failure).await?;
    Ok(ended)
}

/// The agent's stdin, noting its end of file (the agent closed the session).
struct WatchEof<R> {
    inner: R,
    eof: CancellationToken,
}

impl<R: AsyncRead + Unpin> AsyncRead for WatchEof<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let (before, room) = (buf.filled().len(), buf.remaining() > 0);
        let read = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && room && buf.filled().len() == before {
            self.eof.cancel();
        }
        read
    }
}

/// SIGINT or SIGTERM (an MCP host stopping its servers sends one of them).
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
