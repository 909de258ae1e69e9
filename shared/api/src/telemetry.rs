//! Structured logs: JSON lines in Lambda (CloudWatch reads fields), compact text for a
//! person running `tollgate serve`. Level from `RUST_LOG` (default `info`).
//!
//! Whatever `RUST_LOG` says, only Tollgate's own crates may log below `info`: the Lambda
//! runtime, the HTTP stack and the AWS SDK log raw invocation events, headers
//! (`Authorization`) and response bodies (a `GetSecretValue` answer) at debug and trace.

use tracing::{Level, Metadata};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::fmt::writer::BoxMakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// True when a log line of this target and level may be written at all.
pub fn may_log(target: &str, level: &Level) -> bool {
    *level <= Level::INFO || target == "tollgate" || target.starts_with("tollgate_")
}

fn allowed(meta: &Metadata<'_>) -> bool {
    may_log(meta.target(), meta.level())
}

pub fn init(json: bool) {
    init_with(json, BoxMakeWriter::new(std::io::stdout));
}

/// [`init`] with every line on stderr: for a process whose stdout is a protocol
/// (`tollgate mcp proxy` speaks MCP there).
pub fn init_stderr() {
    init_with(false, BoxMakeWriter::new(std::io::stderr));
}

fn init_with(json: bool, writer: BoxMakeWriter) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,aws_config=warn,aws_smithy_runtime=warn"));
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_target(false)
        .with_writer(writer);
    let layer = if json {
        fmt.json()
            .flatten_event(true)
            .without_time()
            .with_filter(filter_fn(allowed))
            .boxed()
    } else {
        fmt.compact().with_filter(filter_fn(allowed)).boxed()
    };
    // A second init (tests) is harmless: keep the first subscriber.
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(layer)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_tollgate_logs_below_info() {
        for target in [
            "lambda_runtime",
            "lambda_runtime::layers::api_client",
            "lambda_http",
            "hyper::proto::h1",
            "aws_smithy_runtime::client::orchestrator",
            "tollgatex",
        ] {
            assert!(!may_log(target, &Level::DEBUG), "{target}");
            assert!(!may_log(target, &Level::TRACE), "{target}");
            assert!(may_log(target, &Level::INFO), "{target}");
            assert!(may_log(target, &Level::ERROR), "{target}");
        }
        assert!(may_log("tollgate_store::dynamo", &Level::DEBUG));
        assert!(may_log("tollgate", &Level::TRACE));
    }
}
