//! The signed webhook sink (docs/architecture.md §10): each notice is one `POST` of JSON
//! to the configured URL, signed with HMAC-SHA256 over `"<unix seconds>.<body>"`:
//!
//! ```text
//! Tollgate-Signature: t=<unix seconds>,v1=<hex hmac_sha256(secret, "<t>.<body>")>
//! Tollgate-Delivery: <delivery id>   (the same on every retry: receivers dedupe on it)
//! ```
//!
//! 2xx is delivered; 429, 5xx, a timeout or no connection are retried; any other answer
//! is permanent (dead letter). The URL obeys pod forwarding's origin rules
//! ([`crate::forward::check_target`]): https (plain http to loopback only with
//! `TOLLGATE_ALLOW_LOOPBACK_ORIGINS=1`), no private, link-local or metadata address —
//! checked at start-up and again, on the addresses the name resolves to, at every post.

use std::time::Duration;

use hmac::{Hmac, Mac};
use serde_json::json;
use sha2::Sha256;

use super::{CardNotice, DeliveryError, NoticeKind, Sink};
use crate::config::ConfigError;
use crate::forward::{self, Origin, Reach};

/// The signature header.
pub const SIGNATURE_HEADER: &str = "Tollgate-Signature";
/// The delivery id header.
pub const DELIVERY_HEADER: &str = "Tollgate-Delivery";
/// A webhook secret is at least this long.
pub const MIN_SECRET_LEN: usize = 16;
/// One post's time limit (resolving, connecting, sending, the answer's status).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// The webhook's signing secret. Its `Debug` never shows the value.
#[derive(Clone)]
pub struct WebhookSecret(Vec<u8>);

impl WebhookSecret {
    pub fn new(value: impl Into<Vec<u8>>) -> Result<Self, ConfigError> {
        let value = value.into();
        if value.len() < MIN_SECRET_LEN {
            return Err(ConfigError::Invalid(format!(
                "TOLLGATE_WEBHOOK_SECRET must be at least {MIN_SECRET_LEN} bytes"
            )));
        }
        Ok(Self(value))
    }
}

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WebhookSecret(<redacted>)")
    }
}

/// `t=<t>,v1=<hex hmac_sha256(secret, "<t>.<body>")>`.
pub fn signature(secret: &[u8], t: i64, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(format!("{t}.{body}").as_bytes());
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// The JSON a notice is posted as.
pub fn body(notice: &CardNotice, delivery_id: &str) -> String {
    let kind = match notice.kind {
        NoticeKind::Armed => "card.armed",
        NoticeKind::Resolved => "card.resolved",
    };
    json!({
        "type": kind,
        "delivery_id": delivery_id,
        "project": (notice.project != super::NO_PROJECT).then_some(notice.project.as_str()),
        "run_id": notice.run_id,
        "request_id": notice.request_id,
        "sequence": notice.sequence,
        "card": notice.card,
    })
    .to_string()
}

pub struct WebhookSink {
    target: Origin,
    secret: WebhookSecret,
    reach: Reach,
}

impl std::fmt::Debug for WebhookSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookSink")
            .field("url", &self.target.url().as_str())
            .finish_non_exhaustive()
    }
}

impl WebhookSink {
    /// A sink posting to `url` (checked now) signed with `secret`.
    pub fn new(
        url: &str,
        secret: WebhookSecret,
        allow_loopback: bool,
        timeout: Duration,
    ) -> Result<Self, ConfigError> {
        let target = forward::check_target(url, allow_loopback)
            .map_err(|e| ConfigError::Invalid(format!("TOLLGATE_WEBHOOK_URL {}", e.reason())))?;
        Ok(Self {
            target,
            secret,
            reach: Reach {
                timeout,
                allow_loopback,
            },
        })
    }

    /// From `TOLLGATE_WEBHOOK_URL` and `TOLLGATE_WEBHOOK_SECRET` (or, deployed,
    /// `TOLLGATE_WEBHOOK_SECRET_ARN`: the secret read from Secrets Manager); `None`
    /// without a URL. A secret without a URL, a URL without a secret, a short secret or
    /// a refused URL fail start-up.
    pub async fn from_env() -> Result<Option<Self>, ConfigError> {
        let var = |n: &str| std::env::var(n).ok().filter(|v| !v.is_empty());
        let url = var("TOLLGATE_WEBHOOK_URL");
        let secret = var("TOLLGATE_WEBHOOK_SECRET");
        let arn = var("TOLLGATE_WEBHOOK_SECRET_ARN");
        let Some(url) = url else {
            if secret.is_some() || arn.is_some() {
                return Err(ConfigError::Invalid(
                    "TOLLGATE_WEBHOOK_SECRET is set but TOLLGATE_WEBHOOK_URL is not".into(),
                ));
            }
            return Ok(None);
        };
        let secret = match (secret, arn) {
            (Some(_), Some(_)) => {
                return Err(ConfigError::Invalid(
                    "set TOLLGATE_WEBHOOK_SECRET or TOLLGATE_WEBHOOK_SECRET_ARN, not both".into(),
                ))
            }
            (Some(s), None) => s,
            (None, Some(arn)) => {
                crate::config::secret_string(
                    &arn,
                    "the webhook secret",
                    "TOLLGATE_WEBHOOK_SECRET_ARN",
                )
                .await?
            }
            (None, None) => {
                return Err(ConfigError::Invalid(
                    "TOLLGATE_WEBHOOK_URL is set but TOLLGATE_WEBHOOK_SECRET (or \
                     TOLLGATE_WEBHOOK_SECRET_ARN) is not"
                        .into(),
                ))
            }
        };
        let allow_loopback =
            std::env::var("TOLLGATE_ALLOW_LOOPBACK_ORIGINS").is_ok_and(|v| v == "1" || v == "true");
        Self::new(
            &url,
            WebhookSecret::new(secret)?,
            allow_loopback,
            DEFAULT_TIMEOUT,
        )
        .map(Some)
    }
}

#[async_trait::async_trait]
impl Sink for WebhookSink {
    fn name(&self) -> &'static str {
        "webhook"
    }

    fn wants(&self, _notice: &CardNotice) -> bool {
        true
    }

    async fn deliver(
        &self,
        notice: &CardNotice,
        _memo: Option<&str>,
    ) -> Result<Option<String>, DeliveryError> {
        let delivery_id = notice_delivery_id(notice, self.name());
        let body = body(notice, &delivery_id);
        let t = tollgate_domain::now_millis() / 1000;
        let (client, url) = forward::connect_checked(self.target.clone(), self.reach)
            .await
            .map_err(DeliveryError::Retry)?;
        let answer = client
            .post(url)
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(SIGNATURE_HEADER, signature(&self.secret.0, t, &body))
            .header(DELIVERY_HEADER, &delivery_id)
            .body(body)
            .send()
            .await;
        let (status, after) = match answer {
            Ok(r) => (r.status().as_u16(), super::retry_after(r.headers())),
            Err(e) if e.is_timeout() => {
                return Err(DeliveryError::Retry(
                    "the receiver did not answer in time".into(),
                ))
            }
            Err(_) => {
                return Err(DeliveryError::Retry(
                    "the receiver could not be reached".into(),
                ))
            }
        };
        let why = format!("the receiver answered {status}");
        match (status, after) {
            (200..=299, _) => Ok(None),
            // Slowed down: the sink pauses as long as asked (a second if not said).
            (429, after) => Err(DeliveryError::Throttled(
                why,
                after.unwrap_or(super::THROTTLE_PAUSE),
            )),
            // Put off no sooner than the receiver asked (503).
            (500..=599, Some(after)) => Err(DeliveryError::RetryAfter(why, after)),
            (500..=599, None) => Err(DeliveryError::Retry(why)),
            _ => Err(DeliveryError::Permanent(why)),
        }
    }
}

/// The delivery id of `notice` for the sink named `sink` (what the notifier's record is
/// keyed by).
pub fn notice_delivery_id(notice: &CardNotice, sink: &str) -> String {
    super::delivery_key(notice, sink).delivery_id()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signature_is_hmac_over_timestamp_dot_body() {
        // RFC 4231-independent check: recompute by hand.
        let sig = signature(b"0123456789abcdef", 1700000000, "{\"a\":1}");
        let mut mac = Hmac::<Sha256>::new_from_slice(b"0123456789abcdef").unwrap();
        mac.update(b"1700000000.{\"a\":1}");
        let want = hex::encode(mac.finalize().into_bytes());
        assert_eq!(sig, format!("t=1700000000,v1={want}"));
    }

    #[test]
    fn short_secrets_and_internal_targets_are_refused() {
        assert!(WebhookSecret::new("short").is_err());
        let secret = WebhookSecret::new("0123456789abcdef").unwrap();
        for url in [
            "http://example.com/hook",
            "https://169.254.169.254/latest",
            "https://10.0.0.1/hook",
            "https://metadata.google.internal/x",
            "http://127.0.0.1:9/hook",
        ] {
            assert!(
                WebhookSink::new(url, secret.clone(), false, DEFAULT_TIMEOUT).is_err(),
                "{url}"
            );
        }
        assert!(WebhookSink::new(
            "https://example.com/hook",
            secret.clone(),
            false,
            DEFAULT_TIMEOUT
        )
        .is_ok());
        assert!(WebhookSink::new("http://127.0.0.1:9/hook", secret, true, DEFAULT_TIMEOUT).is_ok());
    }
}
