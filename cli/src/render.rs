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

/// `s` safe to print: a C0 control character or DEL becomes a space (a newline in an
/// agent's message reads as one); a C1 control character (U+0080–U+009F, which some
/// terminals obey like ESC sequences) and an invisible character that can hide or
/// reorder text ([`invisible`]: bidi overrides and isolates, zero-width characters)
/// become a visible marker such as `<U+202E>`.
pub fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_ascii_control() {
            out.push(' ');
        } else if c.is_control() || invisible(c) {
            out.push_str(&marker(c));
        } else {
            out.push(c);
        }
    }
    out
}

/// `<U+202E>`.
fn marker(c: char) -> String {
    format!("<U+{:04X}>", u32::from(c))
}

/// A character that prints as nothing yet changes what the text around it shows: the
/// bidi marks, embeddings, overrides and isolates (U+061C, U+200E–U+200F,
/// U+202A–U+202E, U+2066–U+2069), the zero-width characters (U+200B–U+200D, U+2060,
/// U+FEFF), the line and paragraph separators, the soft hyphen, the invisible operators
/// and deprecated format characters (U+2061–U+206F), the interlinear annotation
/// characters and the tag characters (U+E0000–U+E007F, which can carry hidden text).
pub fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{061C}'
            | '\u{180E}'
            | '\u{200B}'..='\u{200F}'
            | '\u{2028}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{FEFF}'
            | '\u{FFF9}'..='\u{FFFB}'
            | '\u{E0000}'..='\u{E007F}'
    )
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

/// `s` cut to `max` characters in the middle, `…` marking the cut: the start and the
/// end stay.
pub fn truncate_middle(s: &str, max: usize) -> String {
    let count = s.chars().count();
    if count <= max {
        return s.to_owned();
    }
    if max == 0 {
        return String::new();
    }
    let front = (max - 1) / 2;
    let back = max - 1 - front;
    let mut out: String = s.chars().take(front).collect();
    out.push('…');
    out.extend(s.chars().skip(count - back));
    out
}

/// Room always left for a URL's path, query and fragment (their end).
const URL_REST_MIN: usize = 16;

/// A URL as the operator should read it, in about `max` characters: parsed, then
/// `scheme://host[:port]` in full (any user info, the classic way to make a URL start
/// with a trusted name, shows as `…@`), then the path, query and fragment shortened in
/// the middle so their end stays. The parsed form is ASCII: a non-ASCII path is
/// percent-encoded, an international host is in punycode. A host longer than `max`
/// keeps its end (the domain that owns it). Text that is not a URL with a host is
/// shortened in the middle.
pub fn url(raw: &str, max: usize) -> String {
    let Some((head, rest)) = url_parts(raw, max) else {
        // Cut before marking, so that no marker is cut.
        return clean(&truncate_middle(raw, max));
    };
    let budget = max.saturating_sub(head.chars().count()).max(URL_REST_MIN);
    clean(&format!("{head}{}", truncate_middle(&rest, budget)))
}

/// `scheme://[…@]host[:port]` and the rest (`/path?query#fragment`).
fn url_parts(raw: &str, max: usize) -> Option<(String, String)> {
    let parsed = ::url::Url::parse(raw.trim()).ok()?;
    let host = parsed.host_str().filter(|h| !h.is_empty())?;
    let host = if host.chars().count() > max {
        let keep = max.max(2) - 1;
        let skip = host.chars().count() - keep;
        format!("…{}", host.chars().skip(skip).collect::<String>())
    } else {
        host.to_owned()
    };
    let user = if !parsed.username().is_empty() || parsed.password().is_some() {
        "…@"
    } else {
        ""
    };
    let port = parsed.port().map(|p| format!(":{p}")).unwrap_or_default();
    let head = format!("{}://{user}{host}{port}", parsed.scheme());
    let mut rest = parsed.path().to_owned();
    if let Some(q) = parsed.query() {
        rest.push('?');
        rest.push_str(q);
    }
    if let Some(f) = parsed.fragment() {
        rest.push('#');
        rest.push_str(f);
    }
    Some((head, rest))
}

/// One event's JSON for `watch --json`, on one line and with nothing a terminal would
/// obey or hide: inside strings, every control character (C0 including ESC, DEL, C1)
/// and every [`invisible`] character becomes its `\uXXXX` escape (the JSON means the
/// same); outside strings, a tab or line break becomes a space (JSON whitespace either
/// way). Everything else is printed as the server stores it.
pub fn json_line(data: &str) -> String {
    let mut out = String::with_capacity(data.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in data.chars() {
        if c.is_control() || invisible(c) {
            if !in_string && matches!(c, '\t' | '\n' | '\r') {
                out.push(' ');
            } else {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            escaped = false;
            continue;
        }
        out.push(c);
        if in_string {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
        }
    }
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
    match obj.get("url") {
        Some(Value::String(u)) => parts.push(url(u, TEXT_MAX)),
        _ => {
            if let Some(u) = text(obj, "url") {
                parts.push(truncate(&u, TEXT_MAX));
            }
        }
    }
    if let Some(intention) = text(obj, "intention") {
        parts.push(quoted(&truncate(&intention, TEXT_MAX)));
    }
    parts.join(" ")
}

fn quoted(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

/// A card's argument preview (already redacted by the server) as `key=value …`, nested
/// values as JSON, cut at [`TEXT_MAX`].
pub fn preview(map: &Map<String, Value>) -> String {
    let line = map
        .iter()
        .map(|(k, v)| format!("{}={}", clean(k), value(v)))
        .collect::<Vec<_>>()
        .join(" ");
    truncate(&line, TEXT_MAX)
}

/// ` [key=value …]` of a payload's `argumentsPreview`, or nothing.
fn arguments(obj: &Map<String, Value>) -> String {
    match obj.get("argumentsPreview") {
        Some(Value::Object(map)) if !map.is_empty() => format!(" [{}]", preview(map)),
        _ => String::new(),
    }
}

/// `approved (scope once) by alice`, `denied by bob: "reason"`, `expired`.
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
    if let Some(reason) = text(obj, "decisionReason") {
        out.push_str(&format!(": {}", quoted(&truncate(&reason, TEXT_MAX))));
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
        "tool.approval_required" => {
            format!("{}{}{}", tool_and_target(obj), arguments(obj), request(obj))
        }
        "tool.approval_pending" => format!(
            "{} still waiting{}",
            text(obj, "toolName").unwrap_or_else(|| "?".into()),
            request(obj)
        ),
        "tool.approval_resolved" => format!("{}{}", outcome(obj), request(obj)),
        "coordinator.child_approval_required" => format!(
            "child {}: {}{}{}",
            text(obj, "childRunId").unwrap_or_else(|| "?".into()),
            tool_and_target(obj),
            arguments(obj),
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
                && !s.chars().any(|c| {
                    c.is_whitespace() || c.is_control() || invisible(c) || matches!(c, '"' | '=')
                }) =>
        {
            s.clone()
        }
        other => other.to_string(),
    };
    clean(&truncate(&shown, VALUE_MAX))
}

/// The rows of a table as lines, each column padded to its widest cell (two spaces
/// apart), trailing spaces trimmed.
pub fn aligned<const N: usize>(rows: &[[String; N]]) -> Vec<String> {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (i, (c, w)) in row.iter().zip(widths).enumerate() {
                line.push_str(c);
                if i + 1 < row.len() {
                    line.extend(std::iter::repeat_n(' ', w - c.chars().count() + 2));
                }
            }
            line.trim_end().to_owned()
        })
        .collect()
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
        assert_eq!(
            line(
                r#""requestId":"abc","approved":false,"expired":false,"decidedBy":"bob","decisionReason":"not now\u001b[2J""#
            ),
            "#3 T tool.approval_resolved denied by bob: \"not now [2J\" (request abc)"
        );
    }

    #[test]
    fn argument_previews_read_as_key_values() {
        let data = r#"{"sequence":4,"type":"tool.approval_required","timestamp_utc":"T","requestId":"abc","toolName":"send_email","argumentsPreview":{"to":"ops@example.com","api_key":"[redacted]","cc":["a","b"]}}"#;
        assert_eq!(
            event_line(Some(4), "x", data),
            "#4 T tool.approval_required send_email [to=ops@example.com api_key=[redacted] cc=[\"a\",\"b\"]] (request abc)"
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
        assert_eq!(truncate_middle("abcdefgh", 5), "ab…gh");
        assert_eq!(truncate_middle("abcdefgh", 4), "a…gh");
        assert_eq!(truncate_middle("abcdefgh", 8), "abcdefgh");
        assert_eq!(truncate_middle("abcdefgh", 1), "…");
        assert_eq!(truncate_middle("abcdefgh", 0), "");
        assert_eq!(short_id("5f0c7a2e-9d41"), "5f0c7a2e…");
        assert_eq!(short_id("short"), "short");
    }

    #[test]
    fn invisible_and_c1_characters_show_as_markers() {
        assert_eq!(
            clean("a\u{202E}b\u{2066}c\u{200B}d\u{FEFF}e\u{2060}f"),
            "a<U+202E>b<U+2066>c<U+200B>d<U+FEFF>e<U+2060>f"
        );
        assert_eq!(clean("x\u{9B}31my\u{85}z"), "x<U+009B>31my<U+0085>z");
        assert_eq!(clean("tag\u{E0041}"), "tag<U+E0041>");
        // C0 and DEL read as a space, as before; ordinary text is kept.
        assert_eq!(clean("a\tb\nc\u{1b}[2Jd\u{7f}é😀"), "a b c [2Jd é😀");
        for c in ('\u{202A}'..='\u{202E}')
            .chain('\u{2066}'..='\u{2069}')
            .chain('\u{200B}'..='\u{200F}')
            .chain('\u{80}'..='\u{9F}')
            .chain(['\u{FEFF}', '\u{2060}'])
        {
            assert_eq!(clean(&c.to_string()), format!("<U+{:04X}>", u32::from(c)));
        }
    }

    #[test]
    fn urls_show_their_host_and_their_end() {
        let tail = "a".repeat(200);
        // The host after user info: the start says nothing about where it goes.
        let spoof = format!("https://docs.example.com.{tail}@evil.example/run.sh");
        assert_eq!(url(&spoof, 60), "https://…@evil.example/run.sh");
        // A long path: the host and the end stay, the middle goes.
        let long = format!("https://docs.example.com/{tail}/evil.example/run.sh");
        let shown = url(&long, 60);
        assert_eq!(shown.chars().count(), 60, "{shown}");
        assert!(shown.starts_with("https://docs.example.com/aaa"), "{shown}");
        assert_eq!(
            shown,
            "https://docs.example.com/aaaaaaaaaaaaaaaa…vil.example/run.sh"
        );
        assert!(shown.contains('…'), "{shown}");
        // Port, query and fragment are kept; short URLs read as given.
        assert_eq!(
            url("http://127.0.0.1:8080/x?q=1#f", 60),
            "http://127.0.0.1:8080/x?q=1#f"
        );
        assert_eq!(
            url("https://example.com/docs", 60),
            "https://example.com/docs"
        );
        // What a fetch would really see: punycode, percent-encoded invisible characters.
        assert_eq!(
            url("https://exämple.com/", 60),
            "https://xn--exmple-cua.com/"
        );
        assert_eq!(
            url("https://example.com/\u{202E}txt.exe", 60),
            "https://example.com/%E2%80%AEtxt.exe"
        );
        // A very long host keeps its end; the path's end is still shown.
        let host = format!("{}.evil.example", "b".repeat(100));
        let shown = url(&format!("https://{host}/{tail}/end"), 60);
        assert!(shown.starts_with("https://…bbb"), "{shown}");
        assert!(shown.contains(".evil.example/"), "{shown}");
        assert!(shown.ends_with("/end"), "{shown}");
        // Not a URL with a host: shortened in the middle, cleaned.
        let text = format!("see {tail} then\u{202E}end");
        let shown = url(&text, 20);
        assert_eq!(shown, "see aaaaa…a then<U+202E>end");
    }

    #[test]
    fn json_lines_escape_what_a_terminal_would_obey() {
        let data = "{\"a\":\"x\u{1b}[31m\u{7f}\u{9b}\u{202e}\u{e0041}\\\"q\\\\\",\n\"b\":\t1}";
        let line = json_line(data);
        assert_eq!(
            line,
            r#"{"a":"x\u001b[31m\u007f\u009b\u202e\udb40\udc41\"q\\", "b": 1}"#
        );
        assert!(!line.chars().any(|c| c.is_control() || invisible(c)));
        // Valid JSON (the raw C0 characters were not), meaning what was meant.
        let after: Value = serde_json::from_str(&line).unwrap();
        assert_eq!(
            after,
            serde_json::json!({"a": "x\u{1b}[31m\u{7f}\u{9b}\u{202e}\u{e0041}\"q\\", "b": 1})
        );
        // A server's JSON (C0 already escaped, DEL, C1 and the rest raw): same value.
        let stored =
            serde_json::json!({"t": "\u{1b}]0;x\u{7}\u{7f}\u{9b}2J\u{200b}\u{2066}"}).to_string();
        let line = json_line(&stored);
        assert!(!line.chars().any(|c| c.is_control() || invisible(c)));
        assert_eq!(
            serde_json::from_str::<Value>(&line).unwrap(),
            serde_json::from_str::<Value>(&stored).unwrap()
        );
        // Plain JSON is printed exactly as stored.
        let plain = r#"{"sequence":1,"text":"héllo \"w\" \\ \u0007"}"#;
        assert_eq!(json_line(plain), plain);
    }
}
