//! The JWT decoder. The first byte chooses what the rest is:
//! - even: a token, as text. Never a panic, and nothing but a token signed with the key
//!   verifies (a fuzzer cannot forge an HMAC: any verified input is a crash).
//! - odd: a claims object, as JSON text, signed with the key (`encode`). Never a panic;
//!   what verifies obeys the rules `decode` states (`exp` within the leeway, `nbf` and
//!   `iat` not in the future, a lifetime within the limit, no `aud`) and reads back its
//!   own `sub`, `exp`, `role` and `project_id`; and the signed token with any one byte
//!   changed does not verify.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value};
use tollgate_api::auth::Claims;
use tollgate_api::jwt::{decode, encode, Hs256Key, LEEWAY_SECS};

const NOW: u64 = 1_800_000_000;
const MAX_LIFETIME: u64 = 86_400;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let key = Hs256Key::new(b"fuzz-secret-fuzz-secret-fuzz-secret!");
    if mode & 1 == 0 {
        let Ok(text) = std::str::from_utf8(rest) else {
            return;
        };
        let verified = decode::<Claims>(&key, text, NOW, Some(MAX_LIFETIME));
        assert!(verified.is_err(), "{text:?} verified: {verified:?}");
        return;
    }
    // A position to change, then the claims.
    let Some((&at, json)) = rest.split_first() else {
        return;
    };
    let Ok(claims) = serde_json::from_slice::<Map<String, Value>>(json) else {
        return;
    };
    let token = encode(&key, &claims).expect("an object serializes");
    if let Ok(got) = decode::<Claims>(&key, &token, NOW, Some(MAX_LIFETIME)) {
        let time = |name: &str| claims.get(name).map(|v| v.as_u64().expect("a typed time"));
        let exp = time("exp").expect("exp is required");
        assert!(
            exp.saturating_add(LEEWAY_SECS) >= NOW,
            "expired: {claims:?}"
        );
        assert!(
            time("nbf").is_none_or(|nbf| nbf <= NOW + LEEWAY_SECS),
            "{claims:?}"
        );
        let iat = time("iat");
        assert!(iat.is_none_or(|iat| iat <= NOW + LEEWAY_SECS), "{claims:?}");
        assert!(
            exp.saturating_sub(iat.unwrap_or(NOW)) <= MAX_LIFETIME + LEEWAY_SECS,
            "too long: {claims:?}"
        );
        assert!(!claims.contains_key("aud"), "{claims:?}");
        assert_eq!(got.exp, exp);
        assert_eq!(Some(&Value::String(got.sub.clone())), claims.get("sub"));
        assert_eq!(
            Some(serde_json::to_value(&got.role).unwrap()),
            claims.get("role").cloned()
        );
        assert_eq!(
            got.project_id.as_ref().map(|p| Value::String(p.clone())),
            claims.get("project_id").filter(|p| !p.is_null()).cloned()
        );
    }
    // Any one byte changed (to another URL-safe base64 character or a separator):
    // refused, whatever the claims.
    let mut forged = token.into_bytes();
    let i = usize::from(at) * forged.len() / 256;
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.";
    let c = ALPHABET[usize::from(json.len() as u8) % ALPHABET.len()];
    if forged[i] == c {
        return;
    }
    forged[i] = c;
    let forged = String::from_utf8(forged).unwrap();
    let verified = decode::<Claims>(&key, &forged, NOW, Some(MAX_LIFETIME));
    assert!(verified.is_err(), "{forged:?} verified: {verified:?}");
});
