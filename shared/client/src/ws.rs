//! Following one run over WebSocket ([`tollgate_protocol::ws`]): `tollgate serve`'s
//! `GET /api/ws` or a deployment's WebSocket API, whichever `GET /api/live` advertises.
//!
//! The client rule: the follower keeps the last sequence it handed out, drops a frame at
//! or below it, and when a frame skips ahead (a frame lost on the way) drops it and
//! subscribes again with `after` = that last sequence; when the connection drops it
//! reconnects with backoff and subscribes the same way. So every sequence comes out
//! exactly once and in order, whatever the transport loses.
//! [`crate::operator::Follow`] (and so `tollgate watch`) and the gate's wait use it when a
//! WebSocket endpoint is advertised, SSE otherwise.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use reqwest::Url;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tollgate_protocol::ws::{
    ClientMessage, BEARER_PREFIX, FRAME_DONE, FRAME_ERROR, RUN_QUERY, SUBPROTOCOL,
};

use crate::retry::reconnect_backoff;

type Socket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The longest wait between reconnects.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The first wait after a failure.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// `advertised` (from `GET /api/live`) as a WebSocket URL: an absolute `ws`/`wss` URL as
/// it is, an `http`/`https` one with its scheme swapped, a path resolved against `base`
/// (its path prefix kept) with `http`→`ws`, `https`→`wss`.
pub fn resolve(base: &Url, advertised: &str) -> Option<Url> {
    let mut url = if advertised.starts_with('/') {
        let mut url = base.clone();
        {
            let mut path = url.path_segments_mut().ok()?;
            path.pop_if_empty();
            for seg in advertised.split('/').filter(|s| !s.is_empty()) {
                path.push(seg);
            }
        }
        url
    } else {
        Url::parse(advertised).ok()?
    };
    let scheme = match url.scheme() {
        "http" | "ws" => "ws",
        "https" | "wss" => "wss",
        _ => return None,
    };
    url.set_scheme(scheme).ok()?;
    Some(url)
}

/// What [`WsFollow::next`] hands out.
#[derive(Debug, Clone, PartialEq)]
pub enum WsItem {
    /// One event, once, in order: its sequence, type and JSON exactly as replay serves it.
    Event {
        /// The frame's `id`.
        sequence: u64,
        /// The event's type.
        event: String,
        /// The event's JSON as the server stores it.
        data: String,
    },
    /// The run ended and every event was handed out: the `done` frame's data
    /// (`{run_id, terminal_sequence}`). Asking again answers this again.
    Done {
        /// The `done` frame's data.
        data: String,
    },
    /// The connection gave out (or a frame was missed): the follower subscribes again
    /// after `after` once `delay` has passed (the next call waits it).
    Reconnecting {
        /// Why, in words.
        why: String,
        /// The last sequence handed out (subscribed after).
        after: u64,
        /// How long the next call waits before reconnecting.
        delay: Duration,
    },
}

/// A refusal that asking again will not change (401, 403, 404, 400).
#[derive(Debug, Clone, PartialEq)]
pub struct WsRefused {
    /// The HTTP status of a refused upgrade, or the one an `error` frame's code stands for.
    pub status: u16,
    /// The `ErrorBody` (or `Null`).
    pub body: Value,
}

/// A frame as read, its `data` kept verbatim.
#[derive(Deserialize)]
struct RawFrame<'a> {
    #[serde(default)]
    run_id: Option<String>,
    #[serde(default)]
    id: Option<u64>,
    event: String,
    #[serde(borrow)]
    data: &'a RawValue,
}

/// The status an `error` frame's `code` stands for.
fn status_of(code: &str) -> u16 {
    match code {
        "unauthorized" => 401,
        "forbidden" => 403,
        "not_found" => 404,
        "too_many_streams" | "limit_reached" => 429,
        "unavailable" | "internal" => 503,
        _ => 400,
    }
}

fn transient(status: u16) -> bool {
    status >= 500 || status == 429 || status == 408
}

/// One run followed over WebSocket, across reconnects.
pub struct WsFollow {
    url: Url,
    token: String,
    run_id: String,
    last: u64,
    stall: Duration,
    connect_timeout: Duration,
    socket: Option<Socket>,
    failures: u32,
    wait: Option<Duration>,
    done: Option<String>,
}

impl std::fmt::Debug for WsFollow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WsFollow")
            .field("url", &self.url.as_str())
            .field("run_id", &self.run_id)
            .field("last", &self.last)
            .finish_non_exhaustive()
    }
}

impl WsFollow {
    /// Follows `run_id` at the WebSocket endpoint `url` with `token` (a run token, an
    /// agent or an operator JWT) from after `after`. `stall`: a connection that receives
    /// nothing this long (the server pings every 20 s) is dropped and opened again.
    pub fn new(url: Url, token: &str, run_id: &str, after: u64, stall: Duration) -> Self {
        Self {
            url,
            token: token.trim().to_owned(),
            run_id: run_id.to_owned(),
            last: after,
            stall: stall.max(Duration::from_secs(45)),
            connect_timeout: Duration::from_secs(10),
            socket: None,
            failures: 0,
            wait: None,
            done: None,
        }
    }

    /// The last sequence handed out.
    pub fn last(&self) -> u64 {
        self.last
    }

    fn reconnecting(&mut self, why: String) -> WsItem {
        self.socket = None;
        self.failures = self.failures.saturating_add(1);
        let delay = reconnect_backoff(FIRST_BACKOFF, self.failures, MAX_BACKOFF);
        self.wait = Some(delay);
        WsItem::Reconnecting {
            why,
            after: self.last,
            delay,
        }
    }

    /// Opens the connection and subscribes after `last`.
    async fn connect(&mut self) -> Result<Result<Socket, String>, WsRefused> {
        let mut url = self.url.clone();
        // A run token names its run (docs: the protocol's "Run tokens").
        if !self.token.contains('.') {
            url.query_pairs_mut().append_pair(RUN_QUERY, &self.run_id);
        }
        let mut request = match url.as_str().into_client_request() {
            Ok(r) => r,
            Err(e) => {
                return Err(WsRefused {
                    status: 400,
                    body: serde_json::json!({"error": format!("not a WebSocket URL: {e}")}),
                })
            }
        };
        let protocols = format!("{SUBPROTOCOL}, {BEARER_PREFIX}{}", self.token);
        match HeaderValue::from_str(&protocols) {
            Ok(mut v) => {
                v.set_sensitive(true);
                request.headers_mut().insert("sec-websocket-protocol", v);
            }
            Err(_) => {
                return Err(WsRefused {
                    status: 400,
                    body: serde_json::json!({"error": "the token is not header-safe"}),
                })
            }
        }
        let connected = tokio::time::timeout(
            self.connect_timeout,
            tokio_tungstenite::connect_async(request),
        )
        .await;
        let mut socket = match connected {
            Err(_) => return Ok(Err("connecting timed out".into())),
            Ok(Ok((socket, _))) => socket,
            Ok(Err(tokio_tungstenite::tungstenite::Error::Http(resp))) => {
                let status = resp.status().as_u16();
                let body = resp
                    .body()
                    .as_deref()
                    .and_then(|b| serde_json::from_slice(b).ok())
                    .unwrap_or(Value::Null);
                if transient(status) {
                    return Ok(Err(format!("the upgrade was refused ({status})")));
                }
                return Err(WsRefused { status, body });
            }
            Ok(Err(e)) => return Ok(Err(format!("connecting failed: {e}"))),
        };
        let subscribe = ClientMessage::Subscribe {
            run_id: self.run_id.clone(),
            after: Some(self.last),
        };
        let text = serde_json::to_string(&subscribe).unwrap_or_default();
        if let Err(e) = socket.send(Message::Text(text.into())).await {
            return Ok(Err(format!("subscribing failed: {e}")));
        }
        Ok(Ok(socket))
    }

    /// The next event, the run's end, or a reconnect about to happen.
    pub async fn next(&mut self) -> Result<WsItem, WsRefused> {
        loop {
            if let Some(data) = &self.done {
                return Ok(WsItem::Done { data: data.clone() });
            }
            if self.socket.is_none() {
                if let Some(wait) = self.wait.take() {
                    tokio::time::sleep(wait).await;
                }
                match self.connect().await? {
                    Ok(socket) => self.socket = Some(socket),
                    Err(why) => return Ok(self.reconnecting(why)),
                }
            }
            let Some(socket) = self.socket.as_mut() else {
                continue;
            };
            let msg = match tokio::time::timeout(self.stall, socket.next()).await {
                Err(_) => {
                    let why = format!("nothing received for {:?}", self.stall);
                    return Ok(self.reconnecting(why));
                }
                Ok(None) => return Ok(self.reconnecting("the connection closed".into())),
                Ok(Some(Err(e))) => {
                    return Ok(self.reconnecting(format!("the connection broke: {e}")))
                }
                Ok(Some(Ok(msg))) => msg,
            };
            let text = match msg {
                Message::Text(t) => t,
                Message::Close(frame) => {
                    let why = match frame {
                        Some(f) => format!(
                            "the server closed the connection ({} {})",
                            u16::from(f.code),
                            f.reason
                        ),
                        None => "the server closed the connection".into(),
                    };
                    return Ok(self.reconnecting(why));
                }
                _ => continue,
            };
            let Ok(frame) = serde_json::from_str::<RawFrame>(text.as_str()) else {
                continue;
            };
            if frame.run_id.as_deref().is_some_and(|r| r != self.run_id) {
                continue;
            }
            if let Some(seq) = frame.id {
                if seq <= self.last {
                    continue; // handed out already
                }
                if seq > self.last + 1 {
                    // A frame was missed: subscribe again after the last one handed out.
                    let again = ClientMessage::Subscribe {
                        run_id: self.run_id.clone(),
                        after: Some(self.last),
                    };
                    let text = serde_json::to_string(&again).unwrap_or_default();
                    if let Err(e) = socket.send(Message::Text(text.into())).await {
                        return Ok(self.reconnecting(format!("resubscribing failed: {e}")));
                    }
                    // Frames still in flight from before are dropped as they come (below
                    // the gap they repeat nothing; past it they trigger this again).
                    continue;
                }
                self.last = seq;
                self.failures = 0;
                return Ok(WsItem::Event {
                    sequence: seq,
                    event: frame.event,
                    data: frame.data.get().to_owned(),
                });
            }
            match frame.event.as_str() {
                FRAME_DONE => {
                    let data = frame.data.get().to_owned();
                    self.done = Some(data.clone());
                    if let Some(mut socket) = self.socket.take() {
                        let _ = socket.close(None).await;
                    }
                    return Ok(WsItem::Done { data });
                }
                FRAME_ERROR => {
                    let body: Value = serde_json::from_str(frame.data.get()).unwrap_or(Value::Null);
                    let status = status_of(body.get("code").and_then(Value::as_str).unwrap_or(""));
                    if transient(status) {
                        let why = format!(
                            "the server refused the subscription for now: {}",
                            body.get("error").and_then(Value::as_str).unwrap_or("")
                        );
                        return Ok(self.reconnecting(why));
                    }
                    return Err(WsRefused { status, body });
                }
                _ => continue, // subscribed, pong, unsubscribed
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertised_endpoints_resolve_against_the_base() {
        let base = Url::parse("http://127.0.0.1:8080/").unwrap();
        assert_eq!(
            resolve(&base, "/api/ws").unwrap().as_str(),
            "ws://127.0.0.1:8080/api/ws"
        );
        let base = Url::parse("https://api.example.com/prod/").unwrap();
        assert_eq!(
            resolve(&base, "/api/ws").unwrap().as_str(),
            "wss://api.example.com/prod/api/ws"
        );
        assert_eq!(
            resolve(&base, "wss://ws.example.com/live")
                .unwrap()
                .as_str(),
            "wss://ws.example.com/live"
        );
        assert_eq!(
            resolve(&base, "https://ws.example.com/live")
                .unwrap()
                .as_str(),
            "wss://ws.example.com/live"
        );
        assert_eq!(resolve(&base, "ftp://x"), None);
        assert_eq!(resolve(&base, "not a url"), None);
    }
}
