//! The upstream MCP server: a command the gateway starts (stdio), or a Streamable HTTP
//! endpoint it connects to.

use std::collections::HashMap;

use rmcp::service::{RoleClient, RunningService, ServiceExt};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use tokio_util::sync::CancellationToken;

use crate::gateway::Relay;

/// Where the upstream server is.
#[derive(Debug, Clone)]
pub enum Upstream {
    /// A command that serves MCP on its stdin/stdout (its stderr is the gateway's).
    Command {
        /// The program.
        program: String,
        /// Its arguments.
        args: Vec<String>,
    },
    /// A Streamable HTTP endpoint, with headers sent on every request
    /// (`Authorization: …`).
    Url {
        /// The endpoint.
        url: String,
        /// `(name, value)` pairs.
        headers: Vec<(String, String)>,
    },
}

/// Why the upstream could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The command could not be started.
    #[error("could not start {program}: {source}")]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// A header is not a valid HTTP header.
    #[error("header {0:?} is not `Name: value`")]
    Header(String),
    /// The MCP handshake failed.
    #[error("the MCP handshake failed: {0}")]
    Handshake(String),
}

impl Upstream {
    /// Parses `Name: value` headers.
    pub fn parse_header(line: &str) -> Result<(String, String), UpstreamError> {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| UpstreamError::Header(line.to_owned()))?;
        let (name, value) = (name.trim(), value.trim());
        if name.is_empty() {
            return Err(UpstreamError::Header(line.to_owned()));
        }
        Ok((name.to_owned(), value.to_owned()))
    }

    pub(crate) async fn connect(
        &self,
        relay: Relay,
        ct: CancellationToken,
    ) -> Result<RunningService<RoleClient, Relay>, UpstreamError> {
        match self {
            Upstream::Command { program, args } => {
                let mut command = tokio::process::Command::new(program);
                command.args(args);
                let transport =
                    TokioChildProcess::new(command).map_err(|source| UpstreamError::Spawn {
                        program: program.clone(),
                        source,
                    })?;
                relay
                    .serve_with_ct(transport, ct)
                    .await
                    .map_err(|e| UpstreamError::Handshake(e.to_string()))
            }
            Upstream::Url { url, headers } => {
                let mut custom = HashMap::new();
                for (name, value) in headers {
                    let n = http::HeaderName::try_from(name.as_str())
                        .map_err(|_| UpstreamError::Header(name.clone()))?;
                    let v = http::HeaderValue::try_from(value.as_str())
                        .map_err(|_| UpstreamError::Header(name.clone()))?;
                    custom.insert(n, v);
                }
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
                config.custom_headers = custom;
                let transport = StreamableHttpClientTransport::from_config(config);
                relay
                    .serve_with_ct(transport, ct)
                    .await
                    .map_err(|e| UpstreamError::Handshake(e.to_string()))
            }
        }
    }
}
