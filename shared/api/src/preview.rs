//! An approval card's `arguments_preview`: what the operator is shown of the call's
//! arguments. Display only — the `arguments_hash` binds the call (docs/architecture.md §6).
//! The server redacts and bounds it before it is stored, so a careless agent cannot put a
//! secret into the run's events.

use base64::Engine;
use serde_json::{Map, Value};
use tollgate_protocol::limits::{
    MAX_PREVIEW_BYTES, MAX_PREVIEW_DEPTH, MAX_PREVIEW_STRING, PREVIEW_REDACTED,
    PREVIEW_SECRET_AUTH, PREVIEW_SECRET_KEYS, PREVIEW_TRUNCATED,
};

use crate::ApiError;

/// `key` lower-cased with every character that is not a letter or digit dropped.
fn normalise(key: &str) -> String {
    key.chars()
        .filter(|c| c.is_alphanumeric())
        .flat_map(char::to_lowercase)
        .collect()
}

/// Whether a value under `key` is never shown: the normalised key contains one of
/// [`PREVIEW_SECRET_KEYS`], or begins (not as `author`) or ends with
/// [`PREVIEW_SECRET_AUTH`].
pub fn secret_key(key: &str) -> bool {
    let key = normalise(key);
    PREVIEW_SECRET_KEYS.iter().any(|s| key.contains(s))
        || key.ends_with(PREVIEW_SECRET_AUTH)
        || (key.starts_with(PREVIEW_SECRET_AUTH) && !key.starts_with("author"))
}

/// The preview as stored: every value under a secret key (or paired with one, see
/// [`object`]) replaced by `"[redacted]"`, every secret inside a string replaced
/// ([`redact_text`]), then every string (key or value) longer than
/// [`MAX_PREVIEW_STRING`] characters cut and marked; 400 when it is deeper than
/// [`MAX_PREVIEW_DEPTH`] or larger than [`MAX_PREVIEW_BYTES`] serialized after that.
pub fn sanitize(preview: Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let clean = object(preview, 1)?;
    let size = serde_json::to_string(&clean).map_or(usize::MAX, |s| s.len());
    if size > MAX_PREVIEW_BYTES {
        return Err(ApiError::bad_request(format!(
            "arguments_preview is {size} bytes serialized after redaction and truncation; \
             at most {MAX_PREVIEW_BYTES}"
        )));
    }
    Ok(clean)
}

fn redacted() -> Value {
    Value::String(PREVIEW_REDACTED.into())
}

fn names_secret(value: &Value) -> bool {
    value.as_str().is_some_and(secret_key)
}

/// An object: a value under a secret key is redacted, and so is the `value` field of a
/// name/value pair whose `name`, `key` or `header` field names a secret key.
fn object(map: Map<String, Value>, depth: usize) -> Result<Map<String, Value>, ApiError> {
    let pair_secret = map.iter().any(|(k, v)| {
        matches!(k.to_lowercase().as_str(), "name" | "key" | "header") && names_secret(v)
    });
    let mut out = Map::with_capacity(map.len());
    for (key, value) in map {
        let value = if secret_key(&key) || (pair_secret && key.eq_ignore_ascii_case("value")) {
            redacted()
        } else {
            clean(value, depth)?
        };
        out.insert(cut(key), value);
    }
    Ok(out)
}

/// `value` found at `depth` (the preview object itself is level 1).
fn clean(value: Value, depth: usize) -> Result<Value, ApiError> {
    let nested = matches!(value, Value::Object(_) | Value::Array(_));
    if nested && depth >= MAX_PREVIEW_DEPTH {
        return Err(ApiError::bad_request(format!(
            "arguments_preview is nested deeper than {MAX_PREVIEW_DEPTH} levels"
        )));
    }
    Ok(match value {
        Value::String(s) => Value::String(cut(redact_text(&s))),
        Value::Object(map) => Value::Object(object(map, depth + 1)?),
        // A pair `["Authorization", "…"]`: the second element is the secret's value.
        Value::Array(items) if items.len() == 2 && names_secret(&items[0]) => {
            let first = clean(items[0].clone(), depth + 1)?;
            Value::Array(vec![first, redacted()])
        }
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(|v| clean(v, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        other => other,
    })
}

/// `s` with the secrets it carries replaced by `[redacted]`: a URL's userinfo
/// (`scheme://user:pass@host` reads `scheme://[redacted]@host`), the value of a query
/// parameter whose name is a secret key (`?token=…`), the credential after `Bearer ` or
/// `Basic ` (any case), and whole words that look like keys ([`secret_word`]).
pub fn redact_text(s: &str) -> String {
    let s = redact_userinfo(s);
    let s = redact_query(&s);
    let s = redact_schemes(&s);
    redact_words(&s)
}

/// Characters of a URL's authority, a query value, a credential or a key.
fn wordish(c: char) -> bool {
    !c.is_whitespace() && !matches!(c, '"' | '\'' | '<' | '>' | '`' | ',' | ';' | '(' | ')')
}

fn redact_userinfo(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let end = tail
            .find(|c: char| !wordish(c) || matches!(c, '/' | '?' | '#'))
            .unwrap_or(tail.len());
        let authority = &tail[..end];
        match authority.rfind('@') {
            Some(at) if at > 0 => {
                out.push_str(PREVIEW_REDACTED);
                out.push_str(&authority[at..]);
            }
            _ => out.push_str(authority),
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

fn redact_query(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(['?', '&']) {
        let (head, tail) = rest.split_at(i + 1);
        out.push_str(head);
        let name_end = tail
            .find(|c: char| !wordish(c) || matches!(c, '=' | '&' | '?' | '#'))
            .unwrap_or(tail.len());
        let name = &tail[..name_end];
        if !name.is_empty() && tail[name_end..].starts_with('=') && secret_key(name) {
            out.push_str(name);
            out.push('=');
            let value = &tail[name_end + 1..];
            let end = value
                .find(|c: char| !wordish(c) || matches!(c, '&' | '#'))
                .unwrap_or(value.len());
            if end > 0 {
                out.push_str(PREVIEW_REDACTED);
            }
            rest = &value[end..];
        } else {
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// `Bearer <credential>` (8 characters or more) and `Basic <credential>` (base64 of
/// `user:password`), any case.
fn redact_schemes(s: &str) -> String {
    let lower = s.to_ascii_lowercase();
    let mut out = String::with_capacity(s.len());
    let mut pos = 0;
    let mut from = 0;
    while from < s.len() {
        let found = ["bearer ", "basic "]
            .iter()
            .filter_map(|w| lower[from..].find(w).map(|i| (from + i, w.len())))
            .min();
        let Some((i, len)) = found else { break };
        let boundary = s[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !c.is_alphanumeric());
        let start = i + len;
        let cred_len = s[start..]
            .find(|c: char| !wordish(c))
            .unwrap_or(s.len() - start);
        let cred = &s[start..start + cred_len];
        let secret = boundary
            && if len == "bearer ".len() {
                cred.len() >= 8
            } else {
                base64::engine::general_purpose::STANDARD
                    .decode(cred)
                    .is_ok_and(|b| b.contains(&b':'))
            };
        if secret {
            out.push_str(&s[pos..start]);
            out.push_str(PREVIEW_REDACTED);
            pos = start + cred_len;
            from = pos;
        } else {
            from = start;
        }
    }
    out.push_str(&s[pos..]);
    out
}

/// Replaces every word (a run of letters, digits, `-`, `_`, `.`) that [`secret_word`]
/// finds secret.
fn redact_words(s: &str) -> String {
    let word = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find(word) {
        out.push_str(&rest[..start]);
        let tail = &rest[start..];
        let end = tail.find(|c: char| !word(c)).unwrap_or(tail.len());
        let w = &tail[..end];
        if secret_word(w.trim_end_matches('.')) {
            out.push_str(PREVIEW_REDACTED);
            if w.ends_with('.') {
                out.push('.');
            }
        } else {
            out.push_str(w);
        }
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// A JWT (three base64url segments joined by `.`, the first starting `eyJ`), an AWS
/// access key id (`AKIA` and 16 upper-case letters or digits), a GitHub token (`ghp_`,
/// `gho_`, `github_pat_`) or Slack token (`xoxb-`, `xoxp-`) with 8 or more characters
/// after the prefix, or `sk-` with 20 or more.
fn secret_word(w: &str) -> bool {
    let b64url = |p: &str| {
        !p.is_empty()
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    let parts: Vec<&str> = w.split('.').collect();
    if parts.len() == 3 && w.starts_with("eyJ") && parts.iter().all(|p| b64url(p)) {
        return true;
    }
    if let Some(rest) = w.strip_prefix("AKIA") {
        if rest.len() == 16
            && rest
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        {
            return true;
        }
    }
    let after = |prefix: &str, min: usize| w.strip_prefix(prefix).is_some_and(|r| r.len() >= min);
    ["ghp_", "gho_", "github_pat_", "xoxb-", "xoxp-"]
        .iter()
        .any(|p| after(p, 8))
        || after("sk-", 20)
}

fn cut(s: String) -> String {
    match s.char_indices().nth(MAX_PREVIEW_STRING) {
        None => s,
        Some((end, _)) => format!("{}{PREVIEW_TRUNCATED}", &s[..end]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn secrets_are_redacted_at_any_depth() {
        let clean = sanitize(map(json!({
            "url": "https://example.com",
            "Password": "hunter2",
            "headers": {"X-Api-Key": "k", "Authorization": {"deep": "x"}, "accept": "json"},
            "list": [{"client_secret": "s", "n": 1}],
            "AWS_CREDENTIALS": ["a"],
        })))
        .unwrap();
        assert_eq!(
            Value::Object(clean),
            json!({
                "url": "https://example.com",
                "Password": "[redacted]",
                "headers": {"X-Api-Key": "[redacted]", "Authorization": "[redacted]", "accept": "json"},
                "list": [{"client_secret": "[redacted]", "n": 1}],
                "AWS_CREDENTIALS": "[redacted]",
            })
        );
    }

    #[test]
    fn keys_are_normalised_before_matching() {
        for key in [
            "privateKey",
            "api.key",
            "api key",
            "X-Api-Key",
            "PASSPHRASE",
            "db_pwd",
            "sessionId",
            "x-hub-signature",
            "SENTRY_DSN",
            "DATABASE_URL",
            "connection-string",
            "auth",
            "basicAuth",
            "oauth",
            "auth_header",
            "max_tokens",
        ] {
            assert!(secret_key(key), "{key}");
        }
        for key in [
            "author",
            "authors",
            "authority",
            "url",
            "name",
            "accept",
            "path",
        ] {
            assert!(!secret_key(key), "{key}");
        }
    }

    #[test]
    fn name_value_pairs_are_redacted() {
        let clean = sanitize(map(json!({
            "headers": [
                {"name": "Authorization", "value": "x"},
                {"Key": "api-key", "Value": "y"},
                {"header": "Accept", "value": "json"},
            ],
            "env": [["DB_PASSWORD", "z"], ["HOME", "/root"], ["token", {"a": 1}, 3]],
        })))
        .unwrap();
        assert_eq!(
            Value::Object(clean),
            json!({
                "headers": [
                    {"name": "Authorization", "value": "[redacted]"},
                    {"Key": "api-key", "Value": "[redacted]"},
                    {"header": "Accept", "value": "json"},
                ],
                "env": [["DB_PASSWORD", "[redacted]"], ["HOME", "/root"], ["token", {"a": 1}, 3]],
            })
        );
    }

    #[test]
    fn secrets_inside_strings_are_redacted() {
        let jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl";
        let basic = base64::engine::general_purpose::STANDARD.encode("user:pass");
        let cases = [
            (
                "postgres://admin:hunter2@db.example.com:5432/app".to_owned(),
                "postgres://[redacted]@db.example.com:5432/app".to_owned(),
            ),
            (
                "see https://example.com/a?x=1&access_token=abc123&y=2#top".into(),
                "see https://example.com/a?x=1&access_token=[redacted]&y=2#top".into(),
            ),
            (
                "https://h/?API-Key=k1".into(),
                "https://h/?API-Key=[redacted]".into(),
            ),
            (
                "Authorization: Bearer abcdef123456".into(),
                "Authorization: Bearer [redacted]".into(),
            ),
            (format!("basic {basic}"), "basic [redacted]".into()),
            (format!("token {jwt}."), "token [redacted].".into()),
            (
                "key AKIAIOSFODNN7EXAMPLE here".into(),
                "key [redacted] here".into(),
            ),
            (
                "ghp_abcdefghijklmnop gho_abcdefghij github_pat_11ABCDEFG0123".into(),
                "[redacted] [redacted] [redacted]".into(),
            ),
            (
                "xoxb-1234-5678-abcd, xoxp-1234-5678-abcd".into(),
                "[redacted], [redacted]".into(),
            ),
            (
                "use sk-abcdefghijklmnopqrstuvwx now".into(),
                "use [redacted] now".into(),
            ),
        ];
        for (given, want) in cases {
            assert_eq!(redact_text(&given), want, "{given}");
            let clean = sanitize(map(json!({ "s": given }))).unwrap();
            assert_eq!(clean["s"], json!(want));
        }
        // Ordinary text stays.
        for text in [
            "https://example.com/path?q=rust&page=2",
            "mailto me@example.com",
            "a basic example, bearer of news",
            "risk-assessment sk-short ghp_ AKIAshort eyJ.not",
            "author=me&x=1",
        ] {
            assert_eq!(redact_text(text), text);
        }
    }

    #[test]
    fn long_strings_are_cut_and_deep_or_large_previews_refused() {
        let long = "é".repeat(MAX_PREVIEW_STRING + 5);
        let clean = sanitize(map(json!({ "body": long }))).unwrap();
        let body = clean["body"].as_str().unwrap();
        assert_eq!(
            body.chars().count(),
            MAX_PREVIEW_STRING + PREVIEW_TRUNCATED.chars().count()
        );
        assert!(body.ends_with(PREVIEW_TRUNCATED));
        let exact = "a".repeat(MAX_PREVIEW_STRING);
        assert_eq!(
            sanitize(map(json!({ "b": exact }))).unwrap()["b"],
            json!(exact)
        );
        // Level 4 holds scalars; a container there would be level 5.
        assert!(sanitize(map(json!({"a": {"b": {"c": {"d": 1}}}}))).is_ok());
        assert!(sanitize(map(json!({"a": {"b": {"c": {"d": {}}}}}))).is_err());
        assert!(sanitize(map(json!({"a": [[[[1]]]]}))).is_err());
        // A secret deep down is replaced before depth counts.
        assert!(sanitize(map(json!({"a": {"b": {"token": {"d": {"e": 1}}}}}))).is_ok());
        let wide: Map<String, Value> = (0..40)
            .map(|i| (format!("k{i}"), json!("x".repeat(200))))
            .collect();
        assert!(sanitize(wide).is_err());
    }
}
