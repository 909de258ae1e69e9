//! Structured logs: JSON lines in Lambda (CloudWatch reads fields), compact text for a
//! person running `tollgate serve`. Level from `RUST_LOG` (default `info`).

use tracing_subscriber::EnvFilter;

pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,aws_config=warn,aws_smithy_runtime=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_target(false);
    // A second init (tests) is harmless: keep the first subscriber.
    let _ = if json {
        builder.json().flatten_event(true).without_time().try_init()
    } else {
        builder.compact().try_init()
    };
}
