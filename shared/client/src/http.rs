//! One server, requests with bounded retries, answers as JSON.
//!
//! Tokens go only into the `Authorization` header (marked sensitive, never followed
//! along a redirect) and never into an error or a log line; transport errors are
//! stripped of their URL.

use std::time::Duration;

use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, CONTENT_TYPE, RETRY_AFTER};
use reqwest::{Method, Url};
use serde_json::{json, Value};

use crate::retry::{Attempt, Next};
use crate::{ClientConfig, Error};

/// The `User-Agent` of an agent's [`crate::Client`].
pub(crate) const USER_AGENT: &str = concat!("tollgate-client/", env!("CARGO_PKG_VERSION"));

/// A server's answer: status, JSON body (`Null` when there was none), `Retry-After`.
#[derive(Debug, Clone)]
pub(crate) struct Answer {
    pub status: u16,
    pub body: Value,
    pub retry_after: Option<Duration>,
    /// Why the body is not JSON (`None` when it is): a refusal whose body is not JSON
    /// says nothing more than its status; a success whose body is not JSON is unreadable.
    pub not_json: Option<String>,
    /// The `x-request-id` header, when the server sent one.
    pub request_id: Option<String>,
}

/// A request whose answer did not come, by how far it got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lost {
    /// No connection: nothing was sent.
    Unreachable(String),
    /// Sent (perhaps received and acted upon), then no answer.
    NoAnswer(String),
    /// A success answer whose body broke off: the request was carried out.
    Unreadable { status: u16, message: String },
}

impl Lost {
    /// What happened, in one line (no URL, no token).
    pub fn message(&self) -> &str {
        match self {
            Lost::Unreachable(m) | Lost::NoAnswer(m) | Lost::Unreadable { message: m, .. } => m,
        }
    }

    pub fn into_error(self) -> Error {
        Error::Transport(self.message().to_owned())
    }

    fn of(err: reqwest::Error) -> Self {
        if err.is_connect() {
            Lost::Unreachable(describe(err))
        } else {
            Lost::NoAnswer(describe(err))
        }
    }
}

impl Answer {
    /// The body as the contract's type `T` (`tollgate-protocol`) when the status is one of
    /// `ok`; the refusal as an [`Error`] otherwise, and [`Error::Malformed`]-style
    /// when the body is not a `T`.
    pub fn parse<T: serde::de::DeserializeOwned>(self, ok: &[u16]) -> Result<T, Error> {
        let status = self.status;
        let body = self.expect(ok)?;
        serde_json::from_value(body)
            .map_err(|e| Error::malformed(status, &format!("a {} ({e})", short_name::<T>())))
    }

    /// The body when the status is one of `ok`; the refusal as an [`Error`] otherwise.
    pub fn expect(self, ok: &[u16]) -> Result<Value, Error> {
        if ok.contains(&self.status) {
            Ok(self.body)
        } else {
            Err(Error::from_answer(
                self.status,
                &self.body,
                self.retry_after,
            ))
        }
    }
}

/// The HTTP side of a [`crate::Client`].
#[derive(Debug)]
pub(crate) struct Http {
    base: Url,
    client: reqwest::Client,
    pub config: ClientConfig,
}

impl Http {
    pub fn new(base_url: &str, config: ClientConfig, user_agent: &str) -> Result<Self, Error> {
        let mut base = Url::parse(base_url.trim())
            .map_err(|e| Error::Config(format!("the server URL is not a URL ({e})")))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() {
            return Err(Error::Config(
                "the server URL must start with http:// or https://".into(),
            ));
        }
        base.set_query(None);
        base.set_fragment(None);
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(user_agent)
            .build()
            .map_err(|e| Error::Config(format!("cannot start an HTTP client: {}", describe(e))))?;
        Ok(Self {
            base,
            client,
            config,
        })
    }

    /// The WebSocket endpoint `GET /api/live` advertises, resolved against the base URL
    /// (`http`→`ws`, `https`→`wss`); `None` when there is none, or the server does not
    /// answer the question (an older server, a failure: the caller uses SSE).
    pub async fn live_websocket(&self) -> Option<Url> {
        let url = self.endpoint(&["api", "live"]);
        let resp = self
            .client
            .get(url)
            .timeout(self.config.request_timeout)
            .send()
            .await
            .ok()?;
        if resp.status().as_u16() != 200 {
            return None;
        }
        let live: tollgate_protocol::ws::LiveEndpoints = resp.json().await.ok()?;
        crate::ws::resolve(&self.base, &live.websocket_url?)
    }

    /// `base/seg/seg/…`, every segment percent-encoded (a base path prefix is kept).
    pub fn endpoint(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }

    /// Sends a request, retrying as the policy allows; the last answer whatever its
    /// status (a 5xx that outlived the retries maps to [`Error::Unavailable`] in
    /// [`Answer::expect`]), or [`Error::Transport`].
    pub async fn send(
        &self,
        method: Method,
        url: Url,
        token: &str,
        body: Option<&Value>,
    ) -> Result<Answer, Error> {
        match self.exchange(method, url, token, body).await? {
            Ok(answer) => Ok(answer),
            Err(lost) => Err(lost.into_error()),
        }
    }

    /// [`Http::send`], telling how far a request whose answer was lost got.
    pub async fn exchange(
        &self,
        method: Method,
        url: Url,
        token: &str,
        body: Option<&Value>,
    ) -> Result<Result<Answer, Lost>, Error> {
        let auth = bearer(token)?;
        let mut attempt = 1;
        loop {
            let mut req = self
                .client
                .request(method.clone(), url.clone())
                .header(AUTHORIZATION, auth.clone())
                .header(ACCEPT, "application/json")
                .timeout(self.config.request_timeout);
            if let Some(body) = body {
                req = req.json(body);
            }
            let outcome = match req.send().await {
                Ok(resp) => read(resp).await,
                Err(e) => Err(Lost::of(e)),
            };
            let seen = match &outcome {
                Ok(a) => Attempt::Answered(a.status, a.retry_after),
                Err(_) => Attempt::TransportError,
            };
            match self.config.retry.next(attempt, seen) {
                Next::Stop => return Ok(outcome),
                Next::RetryAfter(wait) => {
                    tracing::debug!(
                        path = url.path(),
                        attempt,
                        wait_ms = wait.as_millis() as u64,
                        "retrying a request"
                    );
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
            }
        }
    }

    /// A `GET` of the live stream from after `last_event_id`, without an overall
    /// timeout (the stream stays open for minutes; the reader bounds each wait itself).
    pub fn stream_request(
        &self,
        url: Url,
        token: &str,
        last_event_id: u64,
    ) -> Result<reqwest::RequestBuilder, Error> {
        Ok(self
            .client
            .get(url)
            .header(AUTHORIZATION, bearer(token)?)
            .header(ACCEPT, "text/event-stream")
            .header("Last-Event-ID", last_event_id.to_string()))
    }
}

pub(crate) fn bearer(token: &str) -> Result<HeaderValue, Error> {
    let mut value = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
        .map_err(|_| Error::Config("the token is not a valid HTTP header value".into()))?;
    value.set_sensitive(true);
    Ok(value)
}

/// Whether a response is `text/event-stream`.
pub(crate) fn is_event_stream(resp: &reqwest::Response) -> bool {
    resp.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"))
}

/// `Retry-After` in seconds.
pub(crate) fn retry_after(resp: &reqwest::Response) -> Option<Duration> {
    resp.headers()
        .get(RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(Duration::from_secs)
}

/// The whole answer; a body that is not JSON becomes `{"error": <its text>}` (and
/// [`Answer::not_json`] says why). A refusal whose body breaks off is the refusal with
/// no body; a success whose body breaks off is [`Lost::Unreadable`].
pub(crate) async fn read(resp: reqwest::Response) -> Result<Answer, Lost> {
    let status = resp.status().as_u16();
    let retry_after = retry_after(&resp);
    let request_id = resp
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let bytes = match resp.bytes().await {
        Ok(bytes) => bytes,
        Err(e) if (200..300).contains(&status) => {
            return Err(Lost::Unreadable {
                status,
                message: describe(e),
            })
        }
        Err(_) => Default::default(),
    };
    let (body, not_json) = match serde_json::from_slice(&bytes) {
        Ok(body) => (body, None),
        // What a JSON reader says of it, as a transport error would read.
        Err(e) => {
            let why = format!("the answer broke off: {e}");
            if bytes.is_empty() {
                (Value::Null, Some(why))
            } else {
                let text = String::from_utf8_lossy(&bytes);
                let text = text.chars().take(200).collect::<String>();
                (json!({ "error": text }), Some(why))
            }
        }
    };
    Ok(Answer {
        status,
        body,
        retry_after,
        not_json,
        request_id,
    })
}

/// A transport error as one line, without the URL.
pub(crate) fn describe(err: reqwest::Error) -> String {
    let err = err.without_url();
    let what = if err.is_timeout() {
        "timed out"
    } else if err.is_connect() {
        "cannot connect"
    } else if err.is_body() || err.is_decode() {
        "the answer broke off"
    } else {
        "request failed"
    };
    let mut deepest = None;
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        deepest = Some(cause.to_string());
        source = cause.source();
    }
    match deepest.filter(|d| !d.is_empty()) {
        Some(cause) => format!("{what}: {cause}"),
        None => what.to_owned(),
    }
}

/// A type's last path segment (`RunReceipt`), for error messages.
fn short_name<T>() -> &'static str {
    let name = std::any::type_name::<T>();
    name.rsplit("::").next().unwrap_or(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_keep_a_base_prefix_and_encode_segments() {
        let http = Http::new(
            "https://api.example.com/prod/",
            ClientConfig::default(),
            "t",
        )
        .unwrap();
        assert_eq!(
            http.endpoint(&["api", "runs", "a b/c"]).as_str(),
            "https://api.example.com/prod/api/runs/a%20b%2Fc"
        );
        let http = Http::new("http://127.0.0.1:8080?x=1", ClientConfig::default(), "t").unwrap();
        assert_eq!(
            http.endpoint(&["api", "runs"]).as_str(),
            "http://127.0.0.1:8080/api/runs"
        );
        for bad in ["", "ftp://x", "not a url", "mailto:a@b"] {
            assert!(
                matches!(
                    Http::new(bad, ClientConfig::default(), "t"),
                    Err(Error::Config(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn tokens_must_be_header_safe_and_are_sensitive() {
        assert!(bearer("abc").unwrap().is_sensitive());
        assert!(matches!(bearer("a\nb"), Err(Error::Config(_))));
    }
}
