//! `tollgate watch RUN`: follows `GET /api/runs/RUN/events` with `Accept:
//! text/event-stream` (the live stream; unlike `/stream`, the HTTP API routes it too,
//! and the streaming Function URL serves both) and prints one line per event until the
//! run's `done` frame.
//!
//! The following is [`tollgate_client::operator::Follow`] — over WebSocket when the
//! server advertises an endpoint (`GET /api/live`; a note on stderr says so), else over
//! SSE: every event once, in order,
//! across windows and breaks (`Last-Event-ID`, the server's `retry:` hint, backoff,
//! `Retry-After`); a line over 1 MiB breaks a response. Here: the lines, the reconnect
//! notes on stderr, and the exit code — 400/401/403/404 end the command (exit 1). A
//! server that does not answer within 30 s (`TOLLGATE_WATCH_ANSWER_TIMEOUT_MS`, for
//! tests) is a reason to reconnect.

use std::io::Write;
use std::time::Duration;

use serde_json::Value;
use tollgate_client::operator::{FollowItem, Interruption, Operator, OperatorError};
use tollgate_client::sse::MAX_LINE;

use crate::remote::{refusal, summary, Failure};
use crate::render;

/// Overrides the client's answer timeout, in milliseconds (for tests; not documented).
const ANSWER_TIMEOUT_ENV: &str = "TOLLGATE_WATCH_ANSWER_TIMEOUT_MS";

pub struct WatchArgs {
    pub run: String,
    pub json: bool,
    pub after: u64,
}

pub async fn watch(operator: &Operator, args: &WatchArgs) -> Result<(), Failure> {
    let mut follow = operator.follow(&args.run, args.after);
    let mut told = false;
    loop {
        let item = follow.next().await;
        if !told && follow.transport() == "websocket" {
            told = true;
            eprintln!("tollgate: following live over WebSocket");
        }
        match item {
            Ok(FollowItem::Event {
                sequence,
                event,
                data,
            }) => {
                if args.json {
                    print_line(&render::json_line(&data));
                } else {
                    print_line(&render::event_line(sequence, &event, &data));
                }
            }
            Ok(FollowItem::Done { data }) => {
                if !args.json {
                    let end = serde_json::from_str::<Value>(&data)
                        .ok()
                        .and_then(|v| v.get("terminal_sequence").and_then(Value::as_u64));
                    print_line(&match end {
                        Some(seq) => format!("done: the run ended at #{seq}"),
                        None => "done: the run ended".to_owned(),
                    });
                }
                return Ok(());
            }
            Ok(FollowItem::Reconnecting { why, after, delay }) => eprintln!(
                "tollgate: {}; reconnecting after #{after} in {:.1}s",
                reason(&why),
                delay.as_secs_f64()
            ),
            Ok(_) => {}
            Err(OperatorError::Refused(r)) if r.status == 404 => {
                return Err(Failure::refused(format!(
                    "no such run, or not visible with this token ({})",
                    summary(&r)
                )))
            }
            Err(OperatorError::Refused(r)) => return Err(refusal(&r)),
            Err(OperatorError::NotAStream) => return Err(Failure::refused(
                "the server did not answer with an event stream (is the URL a Tollgate server?)",
            )),
            Err(OperatorError::Config(message)) => return Err(Failure::unavailable(message)),
            Err(other) => return Err(Failure::unavailable(other.to_string())),
        }
    }
}

/// Why a response gave out, in words.
fn reason(why: &Interruption) -> String {
    match why {
        Interruption::NoAnswer(t) => {
            format!("no answer from the server within {:.1}s", t.as_secs_f64())
        }
        Interruption::SendFailed(cause) => cause.clone(),
        Interruption::Stalled(t) => format!("nothing received for {}s", t.as_secs()),
        Interruption::Broke(cause) => format!("the stream broke ({cause})"),
        Interruption::Overflow => {
            format!("the stream broke (a line over {} MiB)", MAX_LINE >> 20)
        }
        Interruption::Refused(r) => format!("the server answered {}", summary(r)),
        _ => "the stream broke".to_owned(),
    }
}

/// `TOLLGATE_WATCH_ANSWER_TIMEOUT_MS`, when set.
pub fn answer_timeout() -> Result<Option<Duration>, Failure> {
    match std::env::var(ANSWER_TIMEOUT_ENV) {
        Err(_) => Ok(None),
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(ms) if ms > 0 => Ok(Some(Duration::from_millis(ms))),
            _ => Err(Failure::unavailable(format!(
                "{ANSWER_TIMEOUT_ENV} must be a number of milliseconds (at least 1)"
            ))),
        },
    }
}

/// One line on stdout, flushed; a closed stdout (`| head`) ends the command quietly.
fn print_line(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|_| out.flush()).is_err() {
        std::process::exit(0);
    }
}
