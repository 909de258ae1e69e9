//! `tollgate watch RUN`: follows `GET /api/runs/RUN/events` with `Accept:
//! text/event-stream` (the live stream; unlike `/stream`, the HTTP API routes it too,
//! and the streaming Function URL serves both) and prints one line per event until the
//! run's `done` frame.
//!
//! A response ends cleanly after the server's window, or breaks; either way the command
//! reconnects with `Last-Event-ID` = the last sequence it printed, so every event is
//! printed once, in order. After a clean end it waits the server's `retry:` hint (at
//! least 100 ms); after an error it backs off (the hint, doubling, at most 30 s, or the
//! server's `Retry-After` when longer, up to 60 s). A window that ends within a second
//! without a new event counts as an error for the backoff (silently), so a server that
//! ends every response at once is not asked again and again. A server that does not
//! answer within 30 s, or sends a line over 1 MiB, is an error too. 400/401/403/404 end
//! the command (exit 1).

use std::io::Write;
use std::time::Duration;

use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::StatusCode;
use serde_json::Value;

use crate::remote::{describe, ApiRefusal, Failure, Remote};
use crate::render;

/// The reconnect delay until the server sends its `retry:` hint (the SSE default).
const DEFAULT_RETRY: Duration = Duration::from_secs(1);
/// Longest wait between attempts after errors.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The longest wait after a window that ended at once with nothing new.
const QUIET_MAX: Duration = Duration::from_secs(5);
/// A response that sends nothing this long (the server sends a keep-alive every 15 s)
/// is treated as broken.
const STALL: Duration = Duration::from_secs(45);
/// The shortest wait a server's `retry:` hint may ask for.
const MIN_RETRY: Duration = Duration::from_millis(100);
/// The longest wait a server's `Retry-After` may ask for.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// A window that ends sooner than this without a new event counts as a failure.
const QUICK_WINDOW: Duration = Duration::from_secs(1);
/// How long the server may take to answer (status and headers, and a refusal's body).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// Overrides [`ANSWER_TIMEOUT`], in milliseconds (for tests; not documented).
const ANSWER_TIMEOUT_ENV: &str = "TOLLGATE_WATCH_ANSWER_TIMEOUT_MS";
/// The longest line of the stream (an event is at most 64 KiB of payload).
pub const MAX_LINE: usize = 1 << 20;
/// The most `data` one frame may gather over several lines.
const MAX_DATA: usize = 4 << 20;

pub struct WatchArgs {
    pub run: String,
    pub json: bool,
    pub after: u64,
}

/// One item of the stream, as the SSE parser hands it over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Item {
    /// `retry: <ms>`.
    Retry(u64),
    /// A dispatched frame.
    Frame {
        id: Option<String>,
        event: String,
        data: String,
    },
}

/// An incremental `text/event-stream` parser (the WHATWG rules this stream needs):
/// bytes in, items out; a frame that a broken response leaves half-read is dropped
/// with the parser. A line over [`MAX_LINE`] bytes (or a frame gathering more than
/// [`MAX_DATA`] of data) stops it: [`Parser::overflowed`], and it takes nothing more.
#[derive(Default)]
pub struct Parser {
    buf: Vec<u8>,
    /// `buf[..scanned]` holds no line end (where the next search starts).
    scanned: usize,
    event: String,
    data: String,
    has_data: bool,
    id: Option<String>,
    overflowed: bool,
}

impl Parser {
    /// The items the complete lines of `chunk` (and what came before) make.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<Item> {
        let mut out = Vec::new();
        if self.overflowed {
            return out;
        }
        self.buf.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(pos) = self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
            let end = self.scanned + pos;
            let mut line = &self.buf[start..end];
            if let [rest @ .., b'\r'] = line {
                line = rest;
            }
            if line.len() > MAX_LINE {
                return self.overflow(out);
            }
            let line = String::from_utf8_lossy(line).into_owned();
            start = end + 1;
            self.scanned = start;
            self.line(&line, &mut out);
            if self.data.len() > MAX_DATA {
                return self.overflow(out);
            }
        }
        self.buf.drain(..start);
        self.scanned = self.buf.len();
        // The line in progress (one byte more for a `\r` before its `\n`).
        if self.buf.len() > MAX_LINE + 1 {
            return self.overflow(out);
        }
        out
    }

    /// Whether a line (or a frame) was too long: the response is to be dropped.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    fn overflow(&mut self, out: Vec<Item>) -> Vec<Item> {
        self.overflowed = true;
        self.buf = Vec::new();
        self.scanned = 0;
        self.data = String::new();
        out
    }

    fn line(&mut self, line: &str, out: &mut Vec<Item>) {
        if line.is_empty() {
            let event = std::mem::take(&mut self.event);
            let data = std::mem::take(&mut self.data);
            let id = self.id.take();
            if std::mem::take(&mut self.has_data) || !event.is_empty() {
                out.push(Item::Frame { id, event, data });
            }
            return;
        }
        if line.starts_with(':') {
            return; // a comment: `: keep-alive`
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = value.to_owned(),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "id" if !value.contains('\0') => self.id = Some(value.to_owned()),
            "retry" => {
                if let Ok(ms) = value.parse::<u64>() {
                    out.push(Item::Retry(ms));
                }
            }
            _ => {}
        }
    }
}

/// How one response ended.
enum Ended {
    /// The `done` frame: the run ended and everything was printed.
    Done,
    /// The window ended (or the body did) without `done`: resume.
    Window,
}

/// Why one response gave out.
enum Interrupt {
    /// Stop the command.
    Fatal(Failure),
    /// Try again after a while.
    Transient {
        reason: String,
        retry_after: Option<Duration>,
    },
}

/// What survives from one response to the next.
struct Position {
    /// The last sequence printed (or `--after`).
    last: u64,
    /// The server's `retry:` hint.
    retry: Duration,
    /// Whether the current response delivered an event.
    progressed: bool,
}

pub async fn watch(remote: &Remote, args: &WatchArgs) -> Result<(), Failure> {
    let url = remote.endpoint(&["api", "runs", &args.run, "events"]);
    let answer_timeout = answer_timeout()?;
    let mut pos = Position {
        last: args.after,
        retry: DEFAULT_RETRY,
        progressed: false,
    };
    let mut failures: u32 = 0;
    loop {
        pos.progressed = false;
        let opened = tokio::time::Instant::now();
        let outcome = follow(remote, url.clone(), args, &mut pos, answer_timeout).await;
        if pos.progressed {
            failures = 0;
        }
        match outcome {
            Ok(Ended::Done) => return Ok(()),
            // Nothing new, and over at once: as if it had failed (no message), so a
            // server that ends each response straight away is asked ever less often.
            Ok(Ended::Window) if !pos.progressed && opened.elapsed() < QUICK_WINDOW => {
                failures = failures.saturating_add(1);
                // At most 5 s: through a buffered HTTP API every response of an idle
                // run is empty and quick, and a new event should not wait 30 s.
                tokio::time::sleep(backoff(pos.retry, failures).min(QUIET_MAX)).await;
            }
            Ok(Ended::Window) => {
                failures = 0;
                tokio::time::sleep(pos.retry).await;
            }
            Err(Interrupt::Fatal(f)) => return Err(f),
            Err(Interrupt::Transient {
                reason,
                retry_after,
            }) => {
                failures = failures.saturating_add(1);
                let delay = error_delay(pos.retry, failures, retry_after);
                eprintln!(
                    "tollgate: {reason}; reconnecting after #{} in {:.1}s",
                    pos.last,
                    delay.as_secs_f64()
                );
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// The wait before attempt `failures` (1, 2, …) after errors: the hint, doubling, ≤ 30 s.
fn backoff(hint: Duration, failures: u32) -> Duration {
    let base = hint.clamp(MIN_RETRY, MAX_BACKOFF);
    base.saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(MAX_BACKOFF)
}

/// The wait after an error: the backoff, or the server's `Retry-After` when longer (at
/// most 60 s).
fn error_delay(hint: Duration, failures: u32, retry_after: Option<Duration>) -> Duration {
    backoff(hint, failures).max(retry_after.unwrap_or_default().min(MAX_RETRY_AFTER))
}

/// [`ANSWER_TIMEOUT`], or `TOLLGATE_WATCH_ANSWER_TIMEOUT_MS`.
fn answer_timeout() -> Result<Duration, Failure> {
    match std::env::var(ANSWER_TIMEOUT_ENV) {
        Err(_) => Ok(ANSWER_TIMEOUT),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
            _ => Err(Failure::unavailable(format!(
                "{ANSWER_TIMEOUT_ENV} must be a number of milliseconds (at least 1)"
            ))),
        },
    }
}

/// One response: open it from `pos.last`, print what arrives.
async fn follow(
    remote: &Remote,
    url: reqwest::Url,
    args: &WatchArgs,
    pos: &mut Position,
    answer_timeout: Duration,
) -> Result<Ended, Interrupt> {
    // The answer (and a refusal's body) within the timeout: a server that accepts the
    // connection and then says nothing would otherwise hold the command forever.
    let resp = match tokio::time::timeout(answer_timeout, open(remote, url, pos.last)).await {
        Ok(answer) => answer?,
        Err(_) => {
            return Err(Interrupt::Transient {
                reason: format!(
                    "no answer from the server within {:.1}s",
                    answer_timeout.as_secs_f64()
                ),
                retry_after: None,
            })
        }
    };
    let is_stream = resp
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !is_stream {
        return Err(Interrupt::Fatal(Failure::refused(
            "the server did not answer with an event stream (is the URL a Tollgate server?)",
        )));
    }
    let mut resp = resp;
    let mut parser = Parser::default();
    loop {
        let chunk = match tokio::time::timeout(STALL, resp.chunk()).await {
            Err(_) => {
                return Err(Interrupt::Transient {
                    reason: format!("nothing received for {}s", STALL.as_secs()),
                    retry_after: None,
                })
            }
            Ok(Err(e)) => {
                return Err(Interrupt::Transient {
                    reason: format!("the stream broke ({})", describe(e)),
                    retry_after: None,
                })
            }
            Ok(Ok(None)) => return Ok(Ended::Window),
            Ok(Ok(Some(chunk))) => chunk,
        };
        for item in parser.feed(&chunk) {
            match item {
                Item::Retry(ms) => {
                    pos.retry = Duration::from_millis(ms).clamp(MIN_RETRY, MAX_BACKOFF)
                }
                Item::Frame { id, event, data } => {
                    if event == "done" && id.is_none() {
                        if !args.json {
                            let end = serde_json::from_str::<Value>(&data)
                                .ok()
                                .and_then(|v| v.get("terminal_sequence").and_then(Value::as_u64));
                            print_line(&match end {
                                Some(seq) => format!("done: the run ended at #{seq}"),
                                None => "done: the run ended".to_owned(),
                            });
                        }
                        return Ok(Ended::Done);
                    }
                    let seq = id.as_deref().and_then(|i| i.trim().parse::<u64>().ok());
                    if let Some(seq) = seq {
                        if seq <= pos.last {
                            continue; // already printed
                        }
                    }
                    if args.json {
                        print_line(&render::json_line(&data));
                    } else {
                        print_line(&render::event_line(seq, &event, &data));
                    }
                    if let Some(seq) = seq {
                        pos.last = seq;
                        pos.progressed = true;
                    }
                }
            }
        }
        if parser.overflowed() {
            return Err(Interrupt::Transient {
                reason: format!("the stream broke (a line over {} MiB)", MAX_LINE >> 20),
                retry_after: None,
            });
        }
    }
}

/// Sends the request; the response when it is 200, the interruption otherwise.
async fn open(
    remote: &Remote,
    url: reqwest::Url,
    last: u64,
) -> Result<reqwest::Response, Interrupt> {
    let resp = remote
        .http
        .get(url)
        .header(ACCEPT, "text/event-stream")
        .header("Last-Event-ID", last.to_string())
        .send()
        .await
        .map_err(|e| Interrupt::Transient {
            reason: describe(e),
            retry_after: None,
        })?;
    let status = resp.status();
    if status == StatusCode::OK {
        return Ok(resp);
    }
    let refusal = ApiRefusal::read(resp).await;
    Err(match status {
        StatusCode::NOT_FOUND => Interrupt::Fatal(Failure::refused(format!(
            "no such run, or not visible with this token ({})",
            refusal.summary()
        ))),
        s if s.is_server_error()
            || s == StatusCode::TOO_MANY_REQUESTS
            || s == StatusCode::REQUEST_TIMEOUT =>
        {
            Interrupt::Transient {
                reason: format!("the server answered {}", refusal.summary()),
                retry_after: refusal.retry_after,
            }
        }
        _ => Interrupt::Fatal(refusal.common().unwrap_or_else(|| refusal.unexpected())),
    })
}

/// One line on stdout, flushed; a closed stdout (`| head`) ends the command quietly.
fn print_line(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
        std::process::exit(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(id: Option<&str>, event: &str, data: &str) -> Item {
        Item::Frame {
            id: id.map(str::to_owned),
            event: event.into(),
            data: data.into(),
        }
    }

    #[test]
    fn parses_the_server_frames_across_any_split() {
        let text = "retry: 1000\n\nid: 1\nevent: run_started\ndata: {\"a\":\"é\"}\n\n: keep-alive\n\nid: 2\r\nevent: x\r\ndata: 1\r\ndata: 2\r\n\r\nevent: done\ndata: {}\n\n";
        let want = vec![
            Item::Retry(1000),
            frame(Some("1"), "run_started", "{\"a\":\"é\"}"),
            frame(Some("2"), "x", "1\n2"),
            frame(None, "done", "{}"),
        ];
        let bytes = text.as_bytes();
        for cut in 0..bytes.len() {
            let mut p = Parser::default();
            let mut got = p.feed(&bytes[..cut]);
            got.extend(p.feed(&bytes[cut..]));
            assert_eq!(got, want, "split at {cut}");
        }
        // Byte by byte.
        let mut p = Parser::default();
        let got: Vec<Item> = bytes.iter().flat_map(|b| p.feed(&[*b])).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn a_half_frame_is_not_dispatched() {
        let mut p = Parser::default();
        assert_eq!(p.feed(b"id: 3\nevent: x\ndata: {\"sequ"), vec![]);
    }

    #[test]
    fn a_line_over_the_cap_stops_the_parser() {
        // Complete frames before the long line still come out.
        let mut p = Parser::default();
        let mut head = b"id: 1\nevent: x\ndata: {}\n\ndata: ".to_vec();
        head.extend(std::iter::repeat_n(b'a', MAX_LINE));
        assert_eq!(p.feed(&head), vec![frame(Some("1"), "x", "{}")]);
        assert!(p.overflowed());
        assert_eq!(p.feed(b"\n\nid: 2\nevent: y\ndata: 1\n\n"), vec![]);

        // Arriving a little at a time, without a line end.
        let mut p = Parser::default();
        let piece = vec![b'a'; 64 * 1024];
        let mut fed = 0;
        while !p.overflowed() {
            assert!(p.feed(&piece).is_empty());
            fed += piece.len();
            assert!(
                fed <= MAX_LINE + 2 * piece.len(),
                "no overflow after {fed} bytes"
            );
        }

        // A complete line over the cap, in one chunk.
        let mut p = Parser::default();
        let mut line = b"data: ".to_vec();
        line.extend(std::iter::repeat_n(b'a', MAX_LINE));
        line.extend(b"\n\n");
        assert_eq!(p.feed(&line), vec![]);
        assert!(p.overflowed());

        // Just under the cap is fine; so are many lines adding up to more.
        let mut p = Parser::default();
        let mut line = b"data:".to_vec();
        line.extend(std::iter::repeat_n(b'a', MAX_LINE - 5));
        line.extend(b"\r\n\n");
        let got = p.feed(&line);
        assert!(!p.overflowed());
        assert!(matches!(&got[..], [Item::Frame { data, .. }] if data.len() == MAX_LINE - 5));
        let mut p = Parser::default();
        let many = "data: x\n\n".repeat(MAX_LINE / 4);
        assert_eq!(p.feed(many.as_bytes()).len(), MAX_LINE / 4);
        assert!(!p.overflowed());

        // One frame gathering more than MAX_DATA over its lines.
        let mut p = Parser::default();
        let line = format!("data: {}\n", "a".repeat(MAX_LINE / 2));
        for _ in 0..(MAX_DATA / (MAX_LINE / 2)) {
            assert_eq!(p.feed(line.as_bytes()), vec![]);
        }
        assert!(p.overflowed());
    }

    #[test]
    fn backoff_doubles_and_is_bounded() {
        let s = Duration::from_secs;
        assert_eq!(backoff(s(1), 1), s(1));
        assert_eq!(backoff(s(1), 2), s(2));
        assert_eq!(backoff(s(1), 4), s(8));
        assert_eq!(backoff(s(1), 9), MAX_BACKOFF);
        assert_eq!(backoff(s(1), u32::MAX), MAX_BACKOFF);
        assert_eq!(backoff(Duration::ZERO, 1), Duration::from_millis(100));
    }

    #[test]
    fn retry_after_is_honoured_up_to_a_minute() {
        let s = Duration::from_secs;
        assert_eq!(error_delay(s(1), 1, None), s(1));
        assert_eq!(error_delay(s(1), 1, Some(s(5))), s(5));
        assert_eq!(error_delay(s(1), 4, Some(s(5))), s(8));
        assert_eq!(error_delay(s(1), 1, Some(s(86_400))), MAX_RETRY_AFTER);
        assert_eq!(error_delay(s(1), 1, Some(Duration::MAX)), MAX_RETRY_AFTER);
    }
}
