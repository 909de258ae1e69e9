//! Slack's Web API, the calls Tollgate makes (docs/architecture.md §11):
//! `chat.postMessage`, `chat.update`, `chat.postEphemeral`. The base URL is
//! configurable (`TOLLGATE_SLACK_API_URL`, tests point it at a fake Slack on loopback);
//! the bot token is sent as a bearer and never appears in an error or a log line.

use std::time::Duration;

use serde_json::{json, Value};

use crate::config::Secret;

/// Slack's Web API.
pub const DEFAULT_API_URL: &str = "https://slack.com/api";
/// How long one call may take: well inside the notifier's claim on a delivery (its
/// lease) and a notifier invocation's timeout, so a slow Slack never makes a second
/// sender take the delivery over while the first may still post. A `Retry-After` is
/// never waited out in place: the call answers [`SlackError::RateLimited`] (or
/// [`SlackError::Retry`]) and the notifier retries later.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long an ephemeral answer to a click may take: the click's own answer to Slack
/// is due within 3 s.
const EPHEMERAL_TIMEOUT: Duration = Duration::from_secs(2);
/// Most bytes of an answer read.
const MAX_ANSWER: usize = 256 * 1024;

/// Why a call failed. The text names Slack's error code or the transport's failure,
/// never the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlackError {
    /// Worth trying again later: rate limited, Slack's 5xx or `internal_error`, a
    /// transport failure. `after`: Slack's `Retry-After`.
    #[error("slack: {why} (retryable)")]
    Retry {
        why: String,
        after: Option<Duration>,
    },
    /// Slack is limiting how fast this app posts (HTTP 429, `ratelimited`,
    /// `message_limit_exceeded`). `after`: Slack's `Retry-After`.
    #[error("slack: {why} (rate limited)")]
    RateLimited {
        why: String,
        after: Option<Duration>,
    },
    /// Will fail the same way again: `channel_not_found`, `invalid_auth`, `not_in_channel`, …
    #[error("slack: {0}")]
    Permanent(String),
}

/// Slack's `ok: false` error codes saying this app posts too fast.
const RATE_LIMITED: &[&str] = &["ratelimited", "rate_limited", "message_limit_exceeded"];

/// Slack's other `ok: false` error codes that a later attempt may not see.
const RETRYABLE: &[&str] = &[
    "internal_error",
    "fatal_error",
    "service_unavailable",
    "request_timeout",
];

/// A Slack Web API client for one bot token.
#[derive(Clone)]
pub struct SlackClient {
    http: reqwest::Client,
    base: String,
    token: Secret,
}

impl std::fmt::Debug for SlackClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlackClient")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// Where a posted message is: what `chat.update` needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Posted {
    pub channel: String,
    pub ts: String,
}

impl SlackClient {
    /// A client of the Web API at `base` (e.g. [`DEFAULT_API_URL`]) with `token`.
    pub fn new(base: &str, token: Secret) -> Self {
        Self {
            http: reqwest::Client::builder()
                .timeout(CALL_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("the HTTP client builds"),
            base: base.trim_end_matches('/').to_owned(),
            token,
        }
    }

    /// Posts a message with `blocks` (and `text`, the notification's fallback) to `channel`.
    pub async fn post_message(
        &self,
        channel: &str,
        text: &str,
        blocks: &Value,
    ) -> Result<Posted, SlackError> {
        let answer = self
            .call(
                "chat.postMessage",
                &json!({"channel": channel, "text": text, "blocks": blocks, "unfurl_links": false, "unfurl_media": false}),
            )
            .await?;
        let channel = answer["channel"].as_str().unwrap_or(channel).to_owned();
        let ts = answer["ts"]
            .as_str()
            .filter(|ts| !ts.is_empty())
            .ok_or_else(|| SlackError::Permanent("chat.postMessage answered no ts".into()))?
            .to_owned();
        Ok(Posted { channel, ts })
    }

    /// Rewrites the message at `posted`.
    pub async fn update(
        &self,
        posted: &Posted,
        text: &str,
        blocks: &Value,
    ) -> Result<(), SlackError> {
        self.call(
            "chat.update",
            &json!({"channel": posted.channel, "ts": posted.ts, "text": text, "blocks": blocks}),
        )
        .await
        .map(drop)
    }

    /// Shows `text` to `user` only, in `channel`.
    pub async fn post_ephemeral(
        &self,
        channel: &str,
        user: &str,
        text: &str,
    ) -> Result<(), SlackError> {
        self.call_within(
            "chat.postEphemeral",
            &json!({"channel": channel, "user": user, "text": text}),
            EPHEMERAL_TIMEOUT,
        )
        .await
        .map(drop)
    }

    /// One Web API method, once, within [`CALL_TIMEOUT`].
    async fn call(&self, method: &str, body: &Value) -> Result<Value, SlackError> {
        self.call_within(method, body, CALL_TIMEOUT).await
    }

    async fn call_within(
        &self,
        method: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<Value, SlackError> {
        let url = format!("{}/{method}", self.base);
        let token = std::str::from_utf8(self.token.expose()).unwrap_or_default();
        let response = self
            .http
            .post(&url)
            .timeout(timeout)
            .bearer_auth(token)
            .json(body)
            .send()
            .await
            .map_err(|e| SlackError::Retry {
                // reqwest's error names the URL (no token: it travels in a header).
                why: format!("{method}: {}", e.without_url()),
                after: None,
            })?;
        let status = response.status();
        let after = crate::notify::retry_after(response.headers());
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return Err(SlackError::RateLimited {
                why: format!("{method}: HTTP 429"),
                after,
            });
        }
        if status.is_server_error() {
            return Err(SlackError::Retry {
                why: format!("{method}: HTTP {}", status.as_u16()),
                after,
            });
        }
        let bytes = response.bytes().await.map_err(|e| SlackError::Retry {
            why: format!("{method}: {}", e.without_url()),
            after: None,
        })?;
        if !status.is_success() {
            return Err(SlackError::Permanent(format!(
                "{method}: HTTP {}",
                status.as_u16()
            )));
        }
        if bytes.len() > MAX_ANSWER {
            return Err(SlackError::Permanent(format!("{method}: answer too large")));
        }
        let answer: Value = serde_json::from_slice(&bytes).map_err(|_| SlackError::Retry {
            why: format!("{method}: the answer is not JSON"),
            after: None,
        })?;
        if answer["ok"] == json!(true) {
            return Ok(answer);
        }
        let code = answer["error"]
            .as_str()
            .unwrap_or("unknown_error")
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
            .take(64)
            .collect::<String>();
        if RATE_LIMITED.contains(&code.as_str()) {
            Err(SlackError::RateLimited {
                why: format!("{method}: {code}"),
                after,
            })
        } else if RETRYABLE.contains(&code.as_str()) {
            Err(SlackError::Retry {
                why: format!("{method}: {code}"),
                after,
            })
        } else {
            Err(SlackError::Permanent(format!("{method}: {code}")))
        }
    }
}
