//! An approval card's `arguments_preview`: what the operator is shown of the call's
//! arguments. Display only — the `arguments_hash` binds the call (docs/architecture.md §6).
//! The server redacts and bounds it before it is stored, so a careless agent cannot put a
//! secret into the run's events.

use serde_json::{Map, Value};
use tollgate_protocol::limits::{
    MAX_PREVIEW_BYTES, MAX_PREVIEW_DEPTH, MAX_PREVIEW_STRING, PREVIEW_REDACTED,
    PREVIEW_SECRET_KEYS, PREVIEW_TRUNCATED,
};

use crate::ApiError;

/// Whether a value under `key` is never shown: the key contains, lower-cased (with `-`
/// read as `_`), one of [`PREVIEW_SECRET_KEYS`].
pub fn secret_key(key: &str) -> bool {
    let key = key.to_lowercase().replace('-', "_");
    PREVIEW_SECRET_KEYS.iter().any(|s| key.contains(s))
}

/// The preview as stored: every value under a secret key replaced by `"[redacted]"`,
/// every string (key or value) longer than [`MAX_PREVIEW_STRING`] characters cut and
/// marked; 400 when it is deeper than [`MAX_PREVIEW_DEPTH`] or larger than
/// [`MAX_PREVIEW_BYTES`] serialized after that.
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

fn object(map: Map<String, Value>, depth: usize) -> Result<Map<String, Value>, ApiError> {
    let mut out = Map::with_capacity(map.len());
    for (key, value) in map {
        let value = if secret_key(&key) {
            Value::String(PREVIEW_REDACTED.into())
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
        Value::String(s) => Value::String(cut(s)),
        Value::Object(map) => Value::Object(object(map, depth + 1)?),
        Value::Array(items) => Value::Array(
            items
                .into_iter()
                .map(|v| clean(v, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        other => other,
    })
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
