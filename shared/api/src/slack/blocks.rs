//! The card message in Block Kit (docs/architecture.md §11): what a pending card shows
//! (tool, URL, intention, message, the argument preview, the deadline, Approve / Deny
//! and the scope menu) and what it becomes once resolved (who decided, how; no
//! buttons). Every text is cut to Slack's limits; what an agent supplies (tool name,
//! URL, intention, message, owner, ids) is shown as `plain_text`, which Slack never
//! formats, or, in the preview's code block and the context line, escaped for `mrkdwn`
//! with backticks neutralized — so no agent text can format, link or mention.

use serde_json::{json, Value};
use tollgate_protocol::approvals::Card;
use tollgate_protocol::slack::{ButtonValue, APPROVE_ACTION, DENY_ACTION, SCOPE_ACTION};

/// Slack's limit on a section's text.
const MAX_SECTION: usize = 3000;
/// Slack's limit on a header's text.
const MAX_HEADER: usize = 150;
/// What of the argument preview a message shows (a code block within one section).
const MAX_PREVIEW: usize = 2800;
/// Slack's limit on a message's notification text.
const MAX_TEXT: usize = 3000;

/// Slack's limit on a section field's text.
const MAX_FIELD: usize = 2000;

/// `&`, `<`, `>` as Slack's `mrkdwn` wants them.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// `text` escaped to sit inside an inline `code` span: a backtick would end the span
/// (and let the rest format), so it is shown as `ˋ` (U+02CB).
fn code(text: &str) -> String {
    escape(text).replace('`', "\u{2cb}")
}

/// A label (`mrkdwn`, ours) and a value (`plain_text`, the agent's: never formatted).
fn field_pair(label: &str, value: &str) -> [Value; 2] {
    [
        json!({"type": "mrkdwn", "text": format!("*{label}:*")}),
        json!({"type": "plain_text", "text": cut(value, MAX_FIELD), "emoji": false}),
    ]
}

/// At most `max` characters of `text`, ending in `…` when cut.
fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn section(text: String) -> Value {
    json!({"type": "section", "text": {"type": "mrkdwn", "text": cut(&text, MAX_SECTION)}})
}

/// `<!date^…>`: the deadline in the reader's time zone, the UTC time as the fallback.
fn deadline(expires_at: &str) -> String {
    match tollgate_domain::parse_timestamp(expires_at) {
        Some(millis) => format!(
            "<!date^{}^{{date_short_pretty}} at {{time_secs}}|{}>",
            millis.div_euclid(1000),
            escape(expires_at)
        ),
        None => escape(expires_at),
    }
}

/// What the card is about: tool, project, URL, intention, message, preview.
fn details(card: &Card, project: Option<&str>) -> Vec<Value> {
    let mut fields: Vec<Value> = Vec::with_capacity(10);
    fields.extend(field_pair("Tool", &cut(&card.tool_name, 200)));
    fields.extend(field_pair("Project", project.unwrap_or("(none)")));
    if let Some(url) = &card.url {
        fields.extend(field_pair("URL", &cut(url, 500)));
    }
    if let Some(intention) = &card.intention {
        fields.extend(field_pair("Intention", &cut(intention, 1000)));
    }
    if let Some(message) = &card.message {
        fields.extend(field_pair("Message", &cut(message, 1000)));
    }
    let mut blocks = vec![json!({"type": "section", "fields": fields})];
    if let Some(preview) = &card.arguments_preview {
        let text = serde_json::to_string_pretty(preview).unwrap_or_default();
        // A code block cannot hold its own fence; cut after escaping, so the closing
        // fence always fits.
        let text = cut(&escape(&text).replace("```", "`\u{200b}``"), MAX_PREVIEW);
        blocks.push(section(format!("*Arguments (preview):*\n```{text}```")));
    }
    blocks
}

fn context(card: &Card) -> String {
    format!(
        "Run `{}` · request `{}`",
        code(&cut(&card.run_id, 128)),
        code(&cut(&card.request_id, 128))
    )
}

fn button(text: &str, action_id: &str, value: &str, style: &str) -> Value {
    json!({
        "type": "button",
        "text": {"type": "plain_text", "text": text},
        "action_id": action_id,
        "value": value,
        "style": style,
    })
}

fn option(scope: &str, label: &str) -> Value {
    json!({"text": {"type": "plain_text", "text": label}, "value": scope})
}

/// What a card's buttons carry (compact JSON, within Slack's 2000 bytes: ids are at most
/// 128 characters each).
pub fn button_value(project: Option<&str>, card: &Card, decision: &str) -> String {
    serde_json::to_string(&ButtonValue {
        v: 1,
        p: project.map(str::to_owned),
        r: card.run_id.clone(),
        q: card.request_id.clone(),
        d: decision.to_owned(),
    })
    .unwrap_or_default()
}

/// The message of a pending card: `(text, blocks)`. The scope menu sets what Approve
/// grants (`once` unless chosen); beyond `once` only the run's `owner` may grant it —
/// the gate refuses anyone else, and the card stays pending.
pub fn pending(card: &Card, project: Option<&str>, owner: Option<&str>) -> (String, Value) {
    let text = cut(
        &format!(
            "Approval needed: {} on run {}",
            code(&card.tool_name),
            code(&card.run_id)
        ),
        MAX_TEXT,
    );
    let mut blocks = vec![json!({
        "type": "header",
        "text": {"type": "plain_text", "text": cut(&format!("Approval needed: {}", card.tool_name), MAX_HEADER)},
    })];
    blocks.extend(details(card, project));
    let owner_note = match owner {
        Some(owner) => format!(
            "Scopes beyond *once* are the run owner's (`{}`) to grant.",
            code(&cut(owner, 128))
        ),
        None => "The run has no owner: only *once* can be granted.".to_owned(),
    };
    blocks.push(section(format!(
        "*Deadline:* {}\n{owner_note}",
        deadline(&card.expires_at)
    )));
    blocks.push(json!({
        "type": "actions",
        "block_id": "tollgate.decide",
        "elements": [
            button("Approve", APPROVE_ACTION, &button_value(project, card, "approve"), "primary"),
            button("Deny", DENY_ACTION, &button_value(project, card, "deny"), "danger"),
            {
                "type": "static_select",
                "action_id": SCOPE_ACTION,
                "placeholder": {"type": "plain_text", "text": "Scope: once"},
                "initial_option": option("once", "Scope: once"),
                "options": [
                    option("once", "Scope: once"),
                    option("run", "Scope: this run"),
                    option("tool", "Scope: this tool"),
                    option("always", "Scope: always"),
                ],
            },
        ],
    }));
    blocks
        .push(json!({"type": "context", "elements": [{"type": "mrkdwn", "text": context(card)}]}));
    (text, Value::Array(blocks))
}

/// How a resolved card ended, in words: "Approved by alice (scope run)", "Denied by
/// bob: <reason>", "Expired".
pub fn outcome(card: &Card) -> String {
    let by = card.decided_by.as_deref().unwrap_or("someone");
    match card.state.as_str() {
        "approved" if card.auto_approved == Some(true) => format!(
            "Approved by policy (scope {})",
            card.scope.as_deref().unwrap_or("once")
        ),
        "approved" => format!(
            "Approved by {by} (scope {})",
            card.scope.as_deref().unwrap_or("once")
        ),
        "denied" => match &card.decision_reason {
            Some(reason) => format!("Denied by {by}: {reason}"),
            None => format!("Denied by {by}"),
        },
        "expired" => match card.reason.as_deref() {
            Some("run_ended") => "Expired (the run ended)".to_owned(),
            _ => "Expired".to_owned(),
        },
        // Still pending past its deadline: the expiry is on its way.
        "pending" => "Past its deadline: expiring".to_owned(),
        other => other.to_owned(),
    }
}

/// The message of a resolved card: the same details, the outcome, no buttons.
pub fn resolved(card: &Card, project: Option<&str>) -> (String, Value) {
    let outcome = outcome(card);
    let text = cut(
        &format!(
            "{} — {}: {}",
            code(&card.tool_name),
            code(&card.run_id),
            escape(&outcome)
        ),
        MAX_TEXT,
    );
    let mut blocks = vec![json!({
        "type": "header",
        "text": {"type": "plain_text", "text": cut(&format!("{}: {}", outcome, card.tool_name), MAX_HEADER)},
    })];
    blocks.extend(details(card, project));
    blocks.push(json!({"type": "section", "text": {"type": "plain_text", "text": cut(&outcome, 1000), "emoji": false}}));
    blocks
        .push(json!({"type": "context", "elements": [{"type": "mrkdwn", "text": context(card)}]}));
    (text, Value::Array(blocks))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn card() -> Card {
        serde_json::from_value(json!({
            "run_id": "run-1", "request_id": "req-1", "display_id": "req-1",
            "tool_name": "shell", "tool_call_id": "req-1", "approval_id": "req-1",
            "url": "https://example.com/<x>", "intention": "clean & tidy", "message": null,
            "arguments_hash": null,
            "arguments_preview": {"cmd": "rm -rf ```/tmp``` ".repeat(400)},
            "state": "pending", "scope": null, "decided_by": null, "decided_at": null,
            "created_at": "2026-01-01T00:00:00.000Z", "expires_at": "2026-01-01T00:05:00.000Z",
            "coordinator_run_id": null, "subtask_id": null,
        }))
        .unwrap()
    }

    /// Every text of the blocks, with its type (`mrkdwn` or `plain_text`).
    fn typed_texts(blocks: &Value) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for b in blocks.as_array().unwrap() {
            let mut parts: Vec<&Value> = vec![&b["text"]];
            if let Some(fields) = b["fields"].as_array() {
                parts.extend(fields);
            }
            if let Some(elements) = b["elements"].as_array() {
                parts.extend(elements);
            }
            for t in parts {
                if let (Some(kind), Some(text)) = (t["type"].as_str(), t["text"].as_str()) {
                    out.push((kind.to_owned(), text.to_owned()));
                }
            }
        }
        out
    }

    fn texts(blocks: &Value) -> Vec<String> {
        typed_texts(blocks).into_iter().map(|(_, t)| t).collect()
    }

    #[test]
    fn a_pending_card_has_both_buttons_the_menu_and_bounded_escaped_text() {
        let (text, blocks) = pending(&card(), Some("p1"), Some("alice"));
        assert!(text.contains("shell"));
        let actions = blocks
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["type"] == "actions")
            .unwrap();
        let ids: Vec<&str> = actions["elements"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["action_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [APPROVE_ACTION, DENY_ACTION, SCOPE_ACTION]);
        let value: ButtonValue =
            serde_json::from_str(actions["elements"][0]["value"].as_str().unwrap()).unwrap();
        assert_eq!(
            (value.p.as_deref(), value.d.as_str()),
            (Some("p1"), "approve")
        );
        for t in texts(&blocks) {
            assert!(t.chars().count() <= MAX_SECTION);
        }
        let all = texts(&blocks).join("\n");
        // The agent's texts are plain text (shown as typed, never formatted).
        let typed = typed_texts(&blocks);
        for agent_text in ["https://example.com/<x>", "clean & tidy", "shell", "p1"] {
            assert!(
                typed.contains(&("plain_text".to_owned(), agent_text.to_owned())),
                "{agent_text}: {typed:?}"
            );
        }
        assert!(all.contains("<!date^1767225900^"), "{all}");
        // The preview's code block is not closed early by a fence inside it.
        let preview = texts(&blocks)
            .into_iter()
            .find(|t| t.contains("Arguments"))
            .unwrap();
        assert_eq!(preview.matches("```").count(), 2, "{preview}");
    }

    /// GIVEN an agent whose tool name, message, owner and request id carry Slack
    /// formatting (backticks, `*bold*`, `<!channel>`, a link) THEN none of it reaches a
    /// `mrkdwn` text unescaped: in plain text as typed, in code spans with no backtick
    /// and no `<`.
    #[test]
    fn agent_texts_cannot_format_link_or_mention() {
        let mut c = card();
        c.tool_name = "x` *pwn* <!channel> `y".into();
        c.message = Some("*urgent* <https://evil.example|click> @here".into());
        c.request_id = "r`<!here>`".into();
        let (_, blocks) = pending(&c, Some("p1"), Some("own`er <@U1>"));
        for (kind, text) in typed_texts(&blocks) {
            if kind == "mrkdwn" {
                for bad in [
                    "<!channel>",
                    "<!here>",
                    "<@U1>",
                    "<https://evil",
                    "*pwn*",
                    "*urgent*",
                ] {
                    assert!(!text.contains(bad), "{bad} in mrkdwn {text:?}");
                }
                // Only our own code spans (pairs of backticks) remain.
                let spans = text.matches('`').count() - 6 * text.matches("```").count();
                assert_eq!(spans % 2, 0, "{text:?}");
                assert!(!text.contains("own`er"), "{text:?}");
            }
        }
        let typed = typed_texts(&blocks);
        assert!(typed.contains(&("plain_text".to_owned(), c.tool_name.clone())));
    }

    #[test]
    fn a_resolved_card_says_who_and_has_no_buttons() {
        let mut c = card();
        c.state = "approved".into();
        c.decided_by = Some("alice".into());
        c.scope = Some("run".into());
        let (_, blocks) = resolved(&c, None);
        assert!(blocks
            .as_array()
            .unwrap()
            .iter()
            .all(|b| b["type"] != "actions"));
        assert!(texts(&blocks)
            .join("\n")
            .contains("Approved by alice (scope run)"));
        c.state = "denied".into();
        c.decided_by = Some("bob".into());
        c.decision_reason = Some("not today".into());
        assert_eq!(outcome(&c), "Denied by bob: not today");
        c.state = "expired".into();
        assert_eq!(outcome(&c), "Expired");
    }
}
