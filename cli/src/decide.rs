//! `tollgate approvals` (the open cards as a table) and `tollgate approve` /
//! `tollgate deny` (one decision, its answer in words).

use chrono::{DateTime, Utc};
use tollgate_client::operator::{Card, DecisionAnswer, Operator, OperatorError, Verb};
use tollgate_client::Scope;

use crate::remote::{refusal, summary, Failure};
use crate::render::{clean, truncate, url};

/// Widest URL / intention cell.
const TARGET_MAX: usize = 60;

/// `GET /api/approvals?state=pending` (its first page), or a run's. Prints the table.
pub async fn list(operator: &Operator, run: Option<&str>) -> Result<(), Failure> {
    let page = operator.pending(run, None).await.map_err(|e| match e {
        OperatorError::Unreachable(cause) | OperatorError::NoAnswer(cause) => {
            Failure::unavailable(format!("cannot reach the server: {cause}"))
        }
        OperatorError::Unreadable { message, .. } => {
            Failure::unavailable(format!("the answer is not JSON: {message}"))
        }
        OperatorError::Refused(r) if r.status == 404 => Failure::refused(format!(
            "no such run, or not visible with this token ({})",
            summary(&r)
        )),
        OperatorError::Refused(r) => refusal(&r),
        other => Failure::unavailable(other.to_string()),
    })?;
    print!("{}", table(&page.cards, page.has_more, Utc::now()));
    Ok(())
}

/// The cards as an aligned table (or a sentence when there are none).
fn table(cards: &[Card], has_more: bool, now: DateTime<Utc>) -> String {
    let mut out = String::new();
    if cards.is_empty() {
        out.push_str("no pending approvals\n");
    } else {
        let cell = |field: &Option<String>| field.as_deref().map(clean).filter(|s| !s.is_empty());
        let text = |field: &str| Some(clean(field)).filter(|s| !s.is_empty());
        let mut rows = vec![[
            "RUN".to_owned(),
            "ID".to_owned(),
            "TOOL".to_owned(),
            "URL / INTENTION".to_owned(),
            "EXPIRES IN".to_owned(),
            "REQUEST".to_owned(),
        ]];
        for card in cards {
            // The URL parsed, its host and end always shown (never cut at the end);
            // free text shortened.
            let target = card
                .url
                .as_deref()
                .filter(|u| !u.trim().is_empty())
                .map(|u| url(u, TARGET_MAX))
                .or_else(|| {
                    cell(&card.intention)
                        .or_else(|| cell(&card.message))
                        .map(|t| truncate(&t, TARGET_MAX))
                })
                .unwrap_or_else(|| "-".to_owned());
            let expires = text(&card.expires_at)
                .and_then(|e| DateTime::parse_from_rfc3339(&e).ok())
                .map_or_else(
                    || "?".to_owned(),
                    |at| expires_in(at.with_timezone(&Utc) - now),
                );
            rows.push([
                text(&card.run_id).unwrap_or_else(|| "?".into()),
                text(&card.display_id).unwrap_or_else(|| "?".into()),
                match (text(&card.tool_name), cell(&card.held_by).as_deref()) {
                    (Some(tool), Some("pod")) => format!("{tool} (pod)"),
                    (tool, _) => tool.unwrap_or_else(|| "?".into()),
                },
                target,
                expires,
                text(&card.request_id).unwrap_or_else(|| "?".into()),
            ]);
        }
        for (n, line) in crate::render::aligned(&rows).iter().enumerate() {
            out.push_str(line);
            out.push('\n');
            // The card's argument preview (redacted by the server), on a line of its own.
            let preview = n
                .checked_sub(1)
                .and_then(|i| cards[i].arguments_preview.as_ref())
                .filter(|p| !p.is_empty());
            if let Some(preview) = preview {
                out.push_str(&format!("  args: {}\n", crate::render::preview(preview)));
            }
        }
    }
    if has_more {
        out.push_str("(more cards are pending than shown: deciding these makes room)\n");
    }
    out
}

/// `4m 59s`, `2h 5m`, `3d 4h`; `due` once the deadline passed (the expiry is on its way).
fn expires_in(left: chrono::TimeDelta) -> String {
    let secs = left.num_seconds();
    if secs <= 0 {
        return "due".into();
    }
    let (d, h, m, s) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    if d > 0 {
        format!("{d}d {h}h")
    } else if h > 0 {
        format!("{h}h {m}m")
    } else if m > 0 {
        format!("{m}m {s}s")
    } else {
        format!("{s}s")
    }
}

/// What a decision whose answer was lost may have done, and what to do about it.
const MAY_HAVE_LANDED: &str = "the decision may have been recorded: running the same \
     command again is safe (the server answers with the card's real state)";

/// `POST /api/runs/RUN/tool-approvals` or `/tool-denials`. Prints the answer; `Ok(0)`
/// when the card ended as this click asked, `Ok(1)` when it had already ended otherwise.
pub async fn decide(
    operator: &Operator,
    run: &str,
    request: &str,
    verb: Verb,
    scope: &str,
    tool: Option<&str>,
    reason: Option<&str>,
) -> Result<i32, Failure> {
    let scope_asked = Scope::parse(Some(scope));
    let answer = operator
        .decide_with_reason(run, request, verb, Some(scope_asked), tool, reason)
        .await
        .map_err(|e| match e {
            // No connection: the decision was never sent.
            OperatorError::Unreachable(cause) => {
                Failure::unavailable(format!("cannot reach the server: {cause}"))
            }
            // Sent, perhaps received and recorded, then no answer.
            OperatorError::NoAnswer(cause) => Failure::unavailable(format!(
                "no answer from the server ({cause}); {MAY_HAVE_LANDED}"
            )),
            OperatorError::Unreadable { message, .. } => Failure::unavailable(format!(
                "the answer could not be read ({message}); {MAY_HAVE_LANDED}"
            )),
            OperatorError::Refused(r) => match r.status {
                404 => Failure::refused("no such pending request"),
                // The card is pending where it cannot be decided now (an agent host
                // that holds it busy): the click may be repeated.
                409 => Failure::refused("the request cannot be decided now; retry"),
                _ => refusal(&r),
            },
            other => Failure::unavailable(other.to_string()),
        })?;
    let (mut line, as_asked) = answer_line(&answer, verb, scope, operator.me());
    if let Some(reason) = answer.decision_reason.as_deref() {
        line.push_str(&format!(
            ": {}",
            serde_json::Value::from(truncate(&clean(reason), TARGET_MAX))
        ));
    }
    if let Some(grant) = &answer.grant {
        // What later cards this approval now approves without a human.
        line.push_str(&format!(
            "; standing grant: {} within scope {}",
            clean(&grant.tool_name),
            clean(&grant.scope)
        ));
    }
    println!("{line}");
    Ok(if as_asked { 0 } else { 1 })
}

/// The decision answer in words, and whether the card is in the state this click asked
/// for, decided by `me` (when the token names who that is). A later click answers 200
/// too, with the card's real state: one that differs from the ask (or `expired`), or
/// that someone else (or nobody Tollgate can name) decided, means the card had already
/// ended.
fn answer_line(
    answer: &DecisionAnswer,
    verb: Verb,
    asked_scope: &str,
    me: Option<&str>,
) -> (String, bool) {
    let text = |field: &Option<String>| field.as_deref().map(clean);
    let state = Some(clean(&answer.state))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into());
    let expired = answer.expired || state == "expired";
    let by = text(&answer.decided_by)
        .map(|b| format!(" by {b}"))
        .unwrap_or_default();
    if expired {
        let line = match text(&answer.reason).as_deref() {
            Some("run_ended") => "already resolved: expired (the run ended)".into(),
            _ => "already resolved: expired".into(),
        };
        return (line, false);
    }
    let decided_by = answer.decided_by.as_deref();
    let mine = match me {
        Some(me) => decided_by == Some(me),
        None => true,
    };
    if state == verb.state() && mine {
        let line = match verb {
            // The scope the answer names, else the one this click asked for.
            Verb::Approve => format!(
                "approved (scope {}){by}",
                text(&answer.scope).unwrap_or_else(|| asked_scope.to_owned())
            ),
            Verb::Deny => format!("denied{by}"),
        };
        return (line, true);
    }
    let line = match state.as_str() {
        "approved" => match text(&answer.scope) {
            Some(scope) => format!("already resolved: approved (scope {scope}){by}"),
            None => format!("already resolved: approved{by}"),
        },
        other => format!("already resolved: {other}{by}"),
    };
    (line, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    /// `fields` over a decision answer's required ones.
    fn answer_line(v: &Value, verb: Verb, scope: &str, me: Option<&str>) -> (String, bool) {
        let mut answer = json!({"run_id": "run-1", "request_id": "req-1", "resolved": true,
                                "state": "approved", "expired": false});
        answer
            .as_object_mut()
            .unwrap()
            .extend(v.as_object().unwrap().clone());
        let answer: DecisionAnswer = serde_json::from_value(answer).unwrap();
        super::answer_line(&answer, verb, scope, me)
    }

    /// Cards from `fields` over a card's required ones.
    fn table(cards: &[Value], has_more: bool, now: DateTime<Utc>) -> String {
        let cards: Vec<Card> = cards
            .iter()
            .map(|fields| {
                let mut card = json!({"run_id": "r", "request_id": "q", "display_id": "d",
                    "tool_name": "t", "tool_call_id": "q", "approval_id": "q", "url": null,
                    "intention": null, "message": null, "arguments_hash": null,
                    "state": "pending", "scope": null, "decided_by": null, "decided_at": null,
                    "created_at": "2026-11-30T11:00:00.000Z",
                    "expires_at": "2026-11-30T12:05:00.000Z", "coordinator_run_id": null,
                    "subtask_id": null});
                card.as_object_mut()
                    .unwrap()
                    .extend(fields.as_object().unwrap().clone());
                serde_json::from_value(card).unwrap()
            })
            .collect();
        super::table(&cards, has_more, now)
    }

    #[test]
    fn answers_in_words() {
        let a = |v: Value, verb| answer_line(&v, verb, "once", None);
        assert_eq!(
            a(
                json!({"approved": true, "resolved": true, "state": "approved", "expired": false, "decided_by": "alice"}),
                Verb::Approve
            ),
            ("approved (scope once) by alice".into(), true)
        );
        assert_eq!(
            a(
                json!({"approved": true, "state": "approved", "expired": false, "decided_by": "alice", "scope": "tool"}),
                Verb::Approve
            ),
            ("approved (scope tool) by alice".into(), true)
        );
        assert_eq!(
            a(
                json!({"denied": true, "state": "denied", "expired": false, "decided_by": "bob"}),
                Verb::Deny
            ),
            ("denied by bob".into(), true)
        );
        assert_eq!(
            a(
                json!({"approved": false, "state": "expired", "expired": true}),
                Verb::Approve
            ),
            ("already resolved: expired".into(), false)
        );
        assert_eq!(
            a(
                json!({"denied": false, "state": "approved", "expired": false, "decided_by": "alice"}),
                Verb::Deny
            ),
            ("already resolved: approved by alice".into(), false)
        );
        assert_eq!(
            a(
                json!({"approved": false, "state": "denied", "expired": false, "decided_by": "bob"}),
                Verb::Approve
            ),
            ("already resolved: denied by bob".into(), false)
        );
    }

    #[test]
    fn a_card_someone_else_decided_is_already_resolved() {
        let approved = json!({"approved": true, "state": "approved", "expired": false,
                              "decided_by": "bob", "scope": "tool"});
        assert_eq!(
            answer_line(&approved, Verb::Approve, "once", Some("alice")),
            (
                "already resolved: approved (scope tool) by bob".into(),
                false
            )
        );
        assert_eq!(
            answer_line(&approved, Verb::Approve, "tool", Some("bob")),
            ("approved (scope tool) by bob".into(), true)
        );
        // Decided earlier, by nobody Tollgate can name (a pod's answer): not this click.
        let unnamed = json!({"approved": true, "state": "approved", "expired": false});
        assert_eq!(
            answer_line(&unnamed, Verb::Approve, "once", Some("alice")),
            ("already resolved: approved".into(), false)
        );
        let denied = json!({"denied": true, "state": "denied", "expired": false,
                            "decided_by": "bob"});
        assert_eq!(
            answer_line(&denied, Verb::Deny, "once", Some("alice")),
            ("already resolved: denied by bob".into(), false)
        );
    }

    #[test]
    fn expiry_reads_short() {
        let s = chrono::TimeDelta::seconds;
        assert_eq!(expires_in(s(299)), "4m 59s");
        assert_eq!(expires_in(s(42)), "42s");
        assert_eq!(expires_in(s(7500)), "2h 5m");
        assert_eq!(expires_in(s(3 * 86_400 + 4 * 3600)), "3d 4h");
        assert_eq!(expires_in(s(0)), "due");
        assert_eq!(expires_in(s(-5)), "due");
    }

    #[test]
    fn table_aligns_and_notes_more() {
        let now = DateTime::parse_from_rfc3339("2026-11-30T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc);
        let cards = vec![
            json!({"run_id": "run-1", "display_id": "5f0c7a2e", "request_id": "5f0c7a2e-9d41",
                   "tool_name": "web_fetch", "url": "https://example.com/docs",
                   "expires_at": "2026-11-30T12:04:59.500Z"}),
            json!({"run_id": "run-22", "display_id": "abc", "request_id": "abc",
                   "tool_name": "shell", "url": null, "intention": "list\nfiles",
                   "expires_at": "2026-11-30T11:00:00.000Z",
                   "arguments_preview": {"cmd": "ls -la", "token": "[redacted]"}}),
        ];
        assert_eq!(
            table(&cards, true, now),
            "RUN     ID        TOOL       URL / INTENTION           EXPIRES IN  REQUEST\n\
             run-1   5f0c7a2e  web_fetch  https://example.com/docs  4m 59s      5f0c7a2e-9d41\n\
             run-22  abc       shell      list files                due         abc\n\
             \x20 args: cmd=\"ls -la\" token=[redacted]\n\
             (more cards are pending than shown: deciding these makes room)\n"
        );
        assert_eq!(table(&[], false, now), "no pending approvals\n");
        // A host as wide as the cell: the URL's end is still shown.
        let host = format!("{}.evil.example", "b".repeat(47));
        let card = json!({"run_id": "r", "display_id": "d", "request_id": "q",
                          "tool_name": "t", "url": format!("https://{host}/{}/run.sh", "a".repeat(90))});
        let row = table(&[card], false, now);
        assert!(
            row.contains(&format!("https://{host}/aaaaaa…a/run.sh ")),
            "{row}"
        );
    }
}
