//! Posting frames to WebSocket connections through API Gateway's `@connections` API
//! (`POST {endpoint}/@connections/{connection_id}`), docs/architecture.md §9.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_apigatewaymanagement::primitives::Blob;
use aws_sdk_apigatewaymanagement::Client;

/// The environment variable that sets the `@connections` endpoint
/// (`https://{api}.execute-api.{region}.amazonaws.com/{stage}`): the fanout's only way to
/// know it, and for the `websocket` function an override of the request's own.
pub const ENDPOINT_ENV: &str = "TOLLGATE_WEBSOCKET_ENDPOINT";

/// What became of one post.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Posted {
    Sent,
    /// 410: the connection is closed; it is removed from the registry.
    Gone,
    /// Anything else (throttled, timed out, unreachable): logged and skipped.
    Failed,
}

/// `@connections` clients, one per endpoint, sharing one SDK configuration.
#[derive(Clone)]
pub struct Poster {
    sdk: aws_config::SdkConfig,
    clients: Arc<Mutex<HashMap<String, Client>>>,
    /// [`ENDPOINT_ENV`], when set.
    fixed: Option<String>,
}

impl Poster {
    pub fn new(sdk: aws_config::SdkConfig, fixed_endpoint: Option<String>) -> Self {
        Self {
            sdk,
            clients: Arc::default(),
            fixed: fixed_endpoint.filter(|e| !e.is_empty()),
        }
    }

    /// With the endpoint from [`ENDPOINT_ENV`], if set.
    pub fn from_env(sdk: aws_config::SdkConfig) -> Self {
        Self::new(sdk, std::env::var(ENDPOINT_ENV).ok())
    }

    /// The endpoint to post to: the fixed one, else `https://{domain}/{stage}` of the
    /// request.
    pub fn endpoint(&self, domain: Option<&str>, stage: Option<&str>) -> Option<String> {
        match (&self.fixed, domain, stage) {
            (Some(fixed), _, _) => Some(fixed.clone()),
            (None, Some(domain), Some(stage)) => Some(format!("https://{domain}/{stage}")),
            _ => None,
        }
    }

    /// The fixed endpoint ([`ENDPOINT_ENV`]).
    pub fn fixed_endpoint(&self) -> Option<&str> {
        self.fixed.as_deref()
    }

    fn client(&self, endpoint: &str) -> Client {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients
            .entry(endpoint.to_owned())
            .or_insert_with(|| {
                let timeouts = aws_config::timeout::TimeoutConfig::builder()
                    .connect_timeout(Duration::from_secs(1))
                    .operation_attempt_timeout(Duration::from_secs(2))
                    .operation_timeout(Duration::from_secs(3))
                    .build();
                Client::from_conf(
                    aws_sdk_apigatewaymanagement::config::Builder::from(&self.sdk)
                        .endpoint_url(endpoint)
                        .timeout_config(timeouts)
                        .build(),
                )
            })
            .clone()
    }

    /// Closes one connection (one `DeleteConnection` call): API Gateway then hangs up and
    /// invokes `$disconnect`. A connection already gone is [`Posted::Gone`].
    pub async fn close(&self, endpoint: &str, connection_id: &str) -> Posted {
        let result = self
            .client(endpoint)
            .delete_connection()
            .connection_id(connection_id)
            .send()
            .await;
        match result {
            Ok(_) => Posted::Sent,
            Err(e) => failed(
                e.as_service_error()
                    .is_some_and(|se| se.is_gone_exception()),
                &aws_sdk_apigatewaymanagement::error::DisplayErrorContext(&e),
                connection_id,
                "closing a WebSocket connection failed; left to its expiry",
            ),
        }
    }

    /// Posts one frame to one connection (one `PostToConnection` call).
    pub async fn post(&self, endpoint: &str, connection_id: &str, frame: Vec<u8>) -> Posted {
        let result = self
            .client(endpoint)
            .post_to_connection()
            .connection_id(connection_id)
            .data(Blob::new(frame))
            .send()
            .await;
        match result {
            Ok(_) => Posted::Sent,
            Err(e) => failed(
                e.as_service_error()
                    .is_some_and(|se| se.is_gone_exception()),
                &aws_sdk_apigatewaymanagement::error::DisplayErrorContext(&e),
                connection_id,
                "post to a WebSocket connection failed; skipped",
            ),
        }
    }
}

/// A call to a connection that failed: [`Posted::Gone`] when API Gateway said 410,
/// else logged as `what` and [`Posted::Failed`].
fn failed(
    gone: bool,
    error: &dyn std::fmt::Display,
    connection_id: &str,
    what: &'static str,
) -> Posted {
    if gone {
        return Posted::Gone;
    }
    tracing::warn!(connection_id, error = %error, "{what}");
    Posted::Failed
}
