//! How events, cards and decisions read on a terminal: one line each, compact, and
//! never a control character from the server (an agent's text could otherwise move the
//! cursor or recolour the operator's terminal).

use serde_json::{Map, Value};

/// The envelope fields every event carries; the rest is the payload.
const ENVELOPE: [&str; 6] = [
    "protocol_version",
    "run_id",
    "sequence",
    "type",
    "timestamp_utc",
    "channel_id",
];

/// Longest value shown in a generic `key=value`.
const VALUE_MAX: usize = 80;
/// Longest free text (an agent's message, an intention).
const TEXT_MAX: usize = 120;

/// `s` with every control character (C0, DEL, C1) replaced by a space.
pub fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// `s` cut to `max` characters, `…` marking the cut.
pub fn truncate(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// The first 8 characters of an id, `…` when there is more (the card's display id).
pub fn short_id(id: &str) -> String {
    let id = clean(id);
    if id.chars().count() <= 8 {
        id
    } else {
        format!("{}…", id.chars().take(8).collect::<String>())
    }
}

/// One line for one event of the stream: `#SEQ TIMESTAMP TYPE DETAIL`. `id` and
/// `event` are the frame's, used when the data lacks them.
pub fn event_line(id: Option<u64>, event: &str, data: &str) -> String {
    let parsed: Option<Map<String, Value>> = serde_json::from_str(data).ok();
    let Some(obj) = parsed else {
        let seq = id.map_or_else(|| "-".to_owned(), |s| s.to_string());
        return format!(
            "#{seq} {} {}",
            clean(event),
            truncate(&clean(data), TEXT_MAX)
        );
    };
    let seq = obj
        .get("sequence")
        .and_then(Value::as_u64)
        .or(id)
        .map_or_else(|| "-".to_owned(), |s| s.to_string());
    let ts = text(&obj, "timestamp_utc").unwrap_or_else(|| "-".into());
    let ty = text(&obj, "type").unwrap_or_else(|| clean(event));
    let detail = detail(&ty, &obj);
    if detail.is_empty() {
        format!("#{seq} {ts} {ty}")
    } else {
        format!("#{seq} {ts} {ty} {detail}")
    }
}

/// A field as clean text: strings as they are, numbers and booleans written out.
fn text(obj: &Map<String, Value>, key: &str) -> Option<String> {
    match obj.get(key)? {
        Value::String(s) => Some(clean(s)),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

fn flag(obj: &Map<String, Value>, key: &str) -> bool {
    obj.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// ` (request 5f0c7a2e…)`, or nothing.
fn request(obj: &Map<String, Value>) -> String {
    text(obj, "requestId")
        .map(|r| format!(" (request {})", short_id(&r)))
        .unwrap_or_default()
}

/// `web_fetch https://… "intention"`.
fn tool_and_target(obj: &Map<String, Value>) -> String {
    let mut parts = vec![text(obj, "toolName").unwrap_or_else(|| "?".into())];
    if let Some(url) = text(obj, "url") {
        parts.push(truncate(&url, TEXT_MAX));
    }
    if let Some(intention) = text(obj, "intention") {
        parts.push(quoted(&truncate(&intention, TEXT_MAX)));
    }
    parts.join(" ")
}

fn quoted(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// `approved (scope once) by alice`, `denied by bob`, `expired`.
fn outcome(obj: &Map<String, Value>) -> String {
    if flag(obj, "expired") {
        return "expired".into();
    }
    let mut out = if flag(obj, "approved") {
        let mut s = "approved".to_owned();
        if let Some(scope) = text(obj, "scope") {
            s.push_str(&format!(" (scope {scope})"));
        }
        s
    } else {
        "denied".to_owned()
    };
    if let Some(by) = text(obj, "decidedBy") {
        out.push_str(&format!(" by {by}"));
    }
    out
}

/// `call c-1 (approval 5f0c7a2e…)`.
fn call(obj: &Map<String, Value>) -> String {
    let mut s = format!(
        "call {}",
        text(obj, "tool_call_id").map_or_else(|| "?".into(), |c| truncate(&c, 40))
    );
    if let Some(a) = text(obj, "approval_id") {
        s.push_str(&format!(" (approval {})", short_id(&a)));
    }
    s
}

/// The compact rendering of the known types; `key=value` of the payload for others.
fn detail(ty: &str, obj: &Map<String, Value>) -> String {
    match ty {
        "tool.approval_required" => format!("{}{}", tool_and_target(obj), request(obj)),
        "tool.approval_pending" => format!(
            "{} still waiting{}",
            text(obj, "toolName").unwrap_or_else(|| "?".into()),
            request(obj)
        ),
        "tool.approval_resolved" => format!("{}{}", outcome(obj), request(obj)),
        "coordinator.child_approval_required" => format!(
            "child {}: {}{}",
            text(obj, "childRunId").unwrap_or_else(|| "?".into()),
            tool_and_target(obj),
            request(obj)
        ),
        "coordinator.child_approval_resolved" => format!(
            "child {}: {}{}",
            text(obj, "childRunId").unwrap_or_else(|| "?".into()),
            outcome(obj),
            request(obj)
        ),
        "tool.auto_approved" => format!(
            "{} approved by policy {} (scope {}){}",
            text(obj, "toolName").unwrap_or_else(|| "?".into()),
            text(obj, "policyId").map_or_else(|| "?".into(), |p| short_id(&p)),
            text(obj, "scope").unwrap_or_else(|| "?".into()),
            request(obj)
        ),
        "tool.policy_revoked" => format!(
            "policy {} (scope {}, {}) revoked by {}",
            text(obj, "policyId").map_or_else(|| "?".into(), |p| short_id(&p)),
            text(obj, "scope").unwrap_or_else(|| "?".into()),
            text(obj, "toolName").unwrap_or_else(|| "?".into()),
            text(obj, "revokedBy").unwrap_or_else(|| "?".into()),
        ),
        "coordinator.child_stall_detected" => {
            let mut s = format!(
                "child {} silent {}s",
                text(obj, "childRunId").unwrap_or_else(|| "?".into()),
                text(obj, "silentSeconds").unwrap_or_else(|| "?".into())
            );
            if let Some(last) = text(obj, "lastEventType") {
                s.push_str(&format!(", last {last}"));
            }
            s
        }
        "tool_execution_started" => format!(
            "{} {}",
            text(obj, "tool_name").unwrap_or_else(|| "?".into()),
            call(obj)
        ),
        "tool_execution" => {
            let mut s = format!(
                "{} {}: {} → {}",
                text(obj, "tool_name").unwrap_or_else(|| "?".into()),
                call(obj),
                text(obj, "execution_status").unwrap_or_else(|| "?".into()),
                text(obj, "mutation_outcome").unwrap_or_else(|| "?".into())
            );
            if let Some(reason) = text(obj, "reason") {
                s.push_str(&format!(" ({reason})"));
            }
            s
        }
        "tool_execution_reconciled" => format!(
            "{} {}: observed {} → {} by {}",
            text(obj, "tool_name").unwrap_or_else(|| "?".into()),
            call(obj),
            text(obj, "observed").unwrap_or_else(|| "?".into()),
            text(obj, "mutation_outcome").unwrap_or_else(|| "?".into()),
            text(obj, "reconciled_by").unwrap_or_else(|| "?".into())
        ),
        "heartbeat" => format!(
            "{} {} in flight",
            text(obj, "tool_name").unwrap_or_else(|| "?".into()),
            call(obj)
        ),
        "agent.message" if obj.get("text").is_some_and(Value::is_string) => {
            let mut s = quoted(&truncate(&text(obj, "text").unwrap_or_default(), TEXT_MAX));
            let rest = generic(obj, &["text"]);
            if !rest.is_empty() {
                s.push(' ');
                s.push_str(&rest);
            }
            s
        }
        _ => generic(obj, &[]),
    }
}

/// `key=value …` of the payload (the envelope and `skip` left out).
fn generic(obj: &Map<String, Value>, skip: &[&str]) -> String {
    obj.iter()
        .filter(|(k, _)| !ENVELOPE.contains(&k.as_str()) && !skip.contains(&k.as_str()))
        .map(|(k, v)| format!("{}={}", clean(k), value(v)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A value in `key=value`: bare when it reads unambiguously, JSON otherwise, cut long.
fn value(v: &Value) -> String {
    let shown = match v {
        Value::String(s)
            if !s.is_empty()
                && !s
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '=')) =>
        {
            s.clone()
        }
        other => other.to_string(),
    };
    clean(&truncate(&shown, VALUE_MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approval_required_reads_compactly() {
        let data = r#"{"protocol_version":"v2","run_id":"r","sequence":12,"type":"tool.approval_required","timestamp_utc":"2026-11-30T12:00:00.123Z","channel_id":"C1","requestId":"5f0c7a2e-9d41-4c1b","displayId":"5f0c7a2e","toolName":"web_fetch","url":"https://example.com/docs"}"#;
        assert_eq!(
            event_line(Some(12), "tool.approval_required", data),
            "#12 2026-11-30T12:00:00.123Z tool.approval_required web_fetch https://example.com/docs (request 5f0c7a2e…)"
        );
    }

    #[test]
    fn resolutions() {
        let line = |payload: &str| {
            let data = format!(
                r#"{{"sequence":3,"type":"tool.approval_resolved","timestamp_utc":"T",{payload}}}"#
            );
            event_line(Some(3), "x", &data)
        };
        assert_eq!(
            line(
                r#""requestId":"abc","approved":true,"expired":false,"decidedBy":"alice","scope":"once""#
            ),
            "#3 T tool.approval_resolved approved (scope once) by alice (request abc)"
        );
        assert_eq!(
            line(r#""requestId":"abc","approved":false,"expired":false,"decidedBy":"bob""#),
            "#3 T tool.approval_resolved denied by bob (request abc)"
        );
        assert_eq!(
            line(r#""requestId":"abc","approved":false,"expired":true"#),
            "#3 T tool.approval_resolved expired (request abc)"
        );
    }

    #[test]
    fn others_are_key_value_and_never_control_characters() {
        let data = r#"{"sequence":1,"type":"run_started","timestamp_utc":"T","run_id":"r","kind":"single","owner":"alice"}"#;
        assert_eq!(
            event_line(Some(1), "run_started", data),
            "#1 T run_started kind=single owner=alice"
        );
        let data = r#"{"sequence":2,"type":"tool.call","timestamp_utc":"T","tool":"web\u001b[31mfetch","args":{"a":1},"note":"two words"}"#;
        assert_eq!(
            event_line(Some(2), "tool.call", data),
            r#"#2 T tool.call tool="web\u001b[31mfetch" args={"a":1} note="two words""#
        );
        let data =
            r#"{"sequence":4,"type":"agent.message","timestamp_utc":"T","text":"hi\nthere"}"#;
        assert_eq!(
            event_line(Some(4), "agent.message", data),
            r#"#4 T agent.message "hi there""#
        );
        assert_eq!(event_line(Some(5), "odd", "not json"), "#5 odd not json");
    }

    #[test]
    fn truncation_and_short_ids() {
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
        assert_eq!(short_id("5f0c7a2e-9d41"), "5f0c7a2e…");
        assert_eq!(short_id("short"), "short");
    }
}
