//! `arguments_hash`: what binds an approval card to exactly the call a human saw.
//!
//! The hash is `"sha256:" + hex(SHA-256(canonical JSON of the arguments))`. Canonical
//! JSON here is: object keys sorted by their UTF-16 code units (as RFC 8785 sorts them),
//! no whitespace, strings and numbers written as `serde_json` writes them. Two argument
//! values that are equal as JSON (whatever their key order) hash the same; any other
//! difference changes the hash, so `start` of a call whose arguments changed after the
//! approval is refused by the server (400, `arguments_hash` mismatch).

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The prefix of every hash this crate makes.
pub const ARGUMENTS_HASH_PREFIX: &str = "sha256:";

/// The canonical JSON text of `value` (sorted keys, no whitespace).
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(k.as_str()).to_string());
                out.push(':');
                write_canonical(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// `"sha256:<64 hex>"` of the canonical JSON of `arguments`.
pub fn arguments_hash(arguments: &Value) -> String {
    let digest = Sha256::digest(canonical_json(arguments).as_bytes());
    format!("{ARGUMENTS_HASH_PREFIX}{}", hex::encode(digest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_form_sorts_keys_at_every_depth_without_whitespace() {
        let v: Value =
            serde_json::from_str(r#"{ "b": [ {"z": 1, "a": null} ], "a": "x\"y", "c": 1.5 }"#)
                .unwrap();
        assert_eq!(
            canonical_json(&v),
            r#"{"a":"x\"y","b":[{"a":null,"z":1}],"c":1.5}"#
        );
        assert_eq!(canonical_json(&json!([])), "[]");
        assert_eq!(canonical_json(&json!({})), "{}");
        assert_eq!(canonical_json(&json!("é")), "\"é\"");
    }

    #[test]
    fn keys_sort_by_utf16_code_units() {
        // U+FF61 sorts before U+1F600 by code point (and UTF-8 bytes) but after it in
        // UTF-16 units (the pair of U+1F600 starts with 0xD83D < 0xFF61).
        let v = json!({"\u{ff61}": 1, "\u{1f600}": 2, "a": 0});
        assert_eq!(
            canonical_json(&v),
            "{\"a\":0,\"\u{1f600}\":2,\"\u{ff61}\":1}"
        );
    }

    #[test]
    fn equal_json_hashes_equal_and_any_change_differs() {
        let a: Value = serde_json::from_str(r#"{"url": "https://x", "n": 1}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"n":1,"url":"https://x"}"#).unwrap();
        assert_eq!(arguments_hash(&a), arguments_hash(&b));
        assert_ne!(
            arguments_hash(&a),
            arguments_hash(&json!({"url": "https://x", "n": 2}))
        );
        // A known vector: sha256("{}").
        assert_eq!(
            arguments_hash(&json!({})),
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        let h = arguments_hash(&a);
        assert!(h.starts_with(ARGUMENTS_HASH_PREFIX));
        assert_eq!(h.len(), ARGUMENTS_HASH_PREFIX.len() + 64);
    }
}
