//! Talking to a Tollgate server (`watch`, `approvals`, `approve`, `deny`): the base URL
//! from `--url`/`TOLLGATE_URL`, the bearer token from `--token`/`TOLLGATE_TOKEN`.
//!
//! The token goes only into the `Authorization` header (marked sensitive, never sent
//! along a redirect) and never into any message: errors name what failed, not the
//! request, and transport errors are stripped of their URL.

use std::time::Duration;

use clap::Args;
use reqwest::header::{HeaderMap, HeaderValue, AUTHORIZATION, RETRY_AFTER};
use reqwest::{StatusCode, Url};
use serde_json::Value;

/// Where the server is and who is asking. No `Debug`: it holds the token.
#[derive(Args, Clone)]
pub struct Conn {
    /// The server's base URL, e.g. http://127.0.0.1:8080 (a path prefix such as an API
    /// stage is kept).
    #[arg(long, env = "TOLLGATE_URL", value_name = "URL")]
    pub url: Option<String>,
    /// Bearer token: an operator JWT (`watch` also takes the run's token or the creating
    /// agent's JWT). Prefer the environment variable: arguments show in `ps`.
    #[arg(
        long,
        env = "TOLLGATE_TOKEN",
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
}

/// What ends a command: a message for stderr and the exit code.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub code: i32,
}

impl Failure {
    /// Refused, unknown, not active: exit 1.
    pub fn refused(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: 1,
        }
    }

    /// Configuration, transport or an unavailable server (retry later): exit 2.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            code: 2,
        }
    }
}

/// A client bound to one server with one token.
pub struct Remote {
    base: Url,
    pub http: reqwest::Client,
    /// The `sub` the token names, read without verifying it (the server verifies): who
    /// "me" is when an answer says who decided.
    pub me: Option<String>,
}

#[cfg(test)]
pub fn token_sub_for_tests(token: &str) -> Option<String> {
    token_sub(token)
}

/// The `sub` claim of a JWT, unverified; `None` for anything else (a run token).
fn token_sub(token: &str) -> Option<String> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims.get("sub")?.as_str().map(str::to_owned)
}

/// How long a plain (non-streaming) request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl Remote {
    /// `streaming`: no overall timeout (the live stream stays open for minutes).
    pub fn new(conn: Conn, streaming: bool) -> Result<Self, Failure> {
        let url = conn
            .url
            .filter(|u| !u.trim().is_empty())
            .ok_or_else(|| Failure::unavailable("no server: set TOLLGATE_URL or pass --url"))?;
        let token = conn
            .token
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| Failure::unavailable("no token: set TOLLGATE_TOKEN or pass --token"))?;
        let mut base = Url::parse(url.trim())
            .map_err(|e| Failure::unavailable(format!("the server URL is not a URL ({e})")))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(Failure::unavailable(
                "the server URL must start with http:// or https://",
            ));
        }
        base.set_query(None);
        base.set_fragment(None);
        let mut auth = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
            .map_err(|_| Failure::unavailable("the token is not a valid HTTP header value"))?;
        auth.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert(AUTHORIZATION, auth);
        let mut builder = reqwest::Client::builder()
            .default_headers(headers)
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("tollgate-cli/", env!("CARGO_PKG_VERSION")));
        if !streaming {
            builder = builder.timeout(REQUEST_TIMEOUT);
        }
        let http = builder.build().map_err(|e| {
            Failure::unavailable(format!("cannot start an HTTP client: {}", describe(e)))
        })?;
        Ok(Self {
            base,
            http,
            me: token_sub(token.trim()),
        })
    }

    /// `base/seg/seg/…`, every segment percent-encoded.
    pub fn endpoint(&self, segments: &[&str]) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut path) = url.path_segments_mut() {
            path.pop_if_empty().extend(segments);
        }
        url
    }
}

/// A transport error as one line, without the URL (which may carry user info).
pub fn describe(err: reqwest::Error) -> String {
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
    // The deepest cause says what happened ("Connection refused (os error 111)"); the
    // layers above it name the client's internals.
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

/// An answer that was not the one hoped for.
#[derive(Debug, Clone)]
pub struct ApiRefusal {
    pub status: StatusCode,
    /// The body's `error`, when it is JSON with one.
    pub error: Option<String>,
    /// The body's `state`.
    pub state: Option<String>,
    /// `Retry-After` in seconds, when given.
    pub retry_after: Option<Duration>,
}

impl ApiRefusal {
    pub async fn read(resp: reqwest::Response) -> Self {
        let status = resp.status();
        let retry_after = resp
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        let text = |k: &str| {
            body.get(k)
                .and_then(Value::as_str)
                .map(crate::render::clean)
        };
        Self {
            status,
            error: text("error"),
            state: text("state"),
            retry_after,
        }
    }

    /// `401 Unauthorized: <the server's error>`.
    pub fn summary(&self) -> String {
        match &self.error {
            Some(e) => format!("{}: {e}", self.status),
            None => self.status.to_string(),
        }
    }

    /// The common cases: 401, 403, 400, 5xx; `None` for the ones the caller words itself.
    pub fn common(&self) -> Option<Failure> {
        match self.status {
            StatusCode::UNAUTHORIZED => Some(Failure::refused(format!(
                "the token was refused ({})",
                self.summary()
            ))),
            StatusCode::FORBIDDEN => Some(Failure::refused(format!(
                "not allowed ({})",
                self.summary()
            ))),
            StatusCode::BAD_REQUEST => Some(Failure::refused(format!(
                "bad request ({})",
                self.summary()
            ))),
            s if s == StatusCode::SERVICE_UNAVAILABLE
                && self.state.as_deref() == Some("agenthost_unreachable") =>
            {
                Some(Failure::unavailable("the agent host is unreachable; retry"))
            }
            s if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS => {
                Some(Failure::unavailable(format!(
                    "the server is unavailable ({}); retry",
                    self.summary()
                )))
            }
            _ => None,
        }
    }

    /// Anything else.
    pub fn unexpected(&self) -> Failure {
        Failure::refused(format!("unexpected answer ({})", self.summary()))
    }
}
