//! HS256 JWTs and nothing else. Tollgate signs and verifies its own tokens with one
//! shared secret, so only `HMAC-SHA256` is compiled in: a general JWT library would put
//! RSA, ECDSA and EdDSA code into every Lambda binary for algorithms we must refuse
//! anyway.
//!
//! Verification refuses every header whose `alg` is not exactly `"HS256"` (so `"none"`
//! and algorithm confusion are impossible by construction), compares the signature in
//! constant time, and requires `exp` (with [`LEEWAY_SECS`] of clock skew) and `sub`.
//! `nbf` and `iat` are optional but honoured when present: a token is refused before its
//! `nbf`, and when it claims to be issued in the future (both beyond the leeway). A
//! maximum lifetime bounds how long a leaked token stays useful: `exp - iat`, or
//! `exp - now` for a token without `iat`.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sha2::Sha256;

/// Clock skew allowed on `exp`, `nbf` and `iat`, in seconds.
pub const LEEWAY_SECS: u64 = 30;

/// `base64url({"alg":"HS256","typ":"JWT"})`, the header of every token we mint.
const HEADER_B64: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9";

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// Signed by us and well formed, but `exp` (plus leeway) has passed.
    #[error("token has expired")]
    Expired,
    /// Signed by us, but its `nbf` (less the leeway) is still ahead.
    #[error("token is not valid yet (nbf)")]
    NotYetValid,
    /// Signed by us, but its `iat` is ahead of now by more than the leeway.
    #[error("token is issued in the future (iat)")]
    IssuedInFuture,
    /// Signed by us, but valid for longer than the maximum lifetime allows.
    #[error("token lifetime is longer than this server accepts")]
    TooLong,
    /// Anything else; the text names the check that failed (for tests and debugging,
    /// never shown to callers).
    #[error("invalid token ({0})")]
    Invalid(&'static str),
}

/// The HMAC key of the tokens, keyed once (each use clones the keyed state).
#[derive(Clone)]
pub struct Hs256Key(Hmac<Sha256>);

impl Hs256Key {
    pub fn new(secret: &[u8]) -> Self {
        Self(Hmac::new_from_slice(secret).expect("HMAC takes any key length"))
    }

    fn mac(&self, signing_input: &str) -> Hmac<Sha256> {
        let mut mac = self.0.clone();
        mac.update(signing_input.as_bytes());
        mac
    }
}

impl std::fmt::Debug for Hs256Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hs256Key(<redacted>)")
    }
}

/// Signs `claims` as `base64url(header).base64url(claims).base64url(signature)`.
pub fn encode<T: Serialize>(key: &Hs256Key, claims: &T) -> Result<String, serde_json::Error> {
    let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims)?);
    let signing_input = format!("{HEADER_B64}.{payload}");
    let signature = URL_SAFE_NO_PAD.encode(key.mac(&signing_input).finalize().into_bytes());
    Ok(format!("{signing_input}.{signature}"))
}

/// A JSON object (a JSON array would otherwise fill a struct field by field).
pub type Object = serde_json::Map<String, serde_json::Value>;

/// Verifies `token` at time `now` (seconds since the epoch) and parses its claims;
/// with `max_lifetime`, a token valid for longer (`exp - iat`, or `exp - now` without
/// `iat`) is refused. Unknown claims are ignored.
pub fn decode<T: DeserializeOwned>(
    key: &Hs256Key,
    token: &str,
    now: u64,
    max_lifetime: Option<u64>,
) -> Result<T, JwtError> {
    let segments: Vec<&str> = token.split('.').collect();
    let [header_b64, payload_b64, signature_b64] = segments[..] else {
        return Err(JwtError::Invalid("not three segments"));
    };
    let header: Object = URL_SAFE_NO_PAD
        .decode(header_b64)
        .ok()
        .and_then(|raw| serde_json::from_slice(&raw).ok())
        .ok_or(JwtError::Invalid("header"))?;
    // Invariant: only the algorithm we sign with is accepted, never what the token asks
    // for ("none", another HMAC, a public-key algorithm).
    if header.get("alg").and_then(|alg| alg.as_str()) != Some("HS256") {
        return Err(JwtError::Invalid("alg"));
    }
    let signature = URL_SAFE_NO_PAD
        .decode(signature_b64)
        .map_err(|_| JwtError::Invalid("signature encoding"))?;
    // The signature covers `header.payload` exactly as sent.
    let signing_input = &token[..header_b64.len() + 1 + payload_b64.len()];
    key.mac(signing_input)
        .verify_slice(&signature)
        .map_err(|_| JwtError::Invalid("signature"))?;
    let claims: Object = URL_SAFE_NO_PAD
        .decode(payload_b64)
        .map_err(|_| JwtError::Invalid("claims encoding"))
        .and_then(|raw| serde_json::from_slice(&raw).map_err(|_| JwtError::Invalid("claims")))?;
    if !claims.get("sub").is_some_and(|sub| sub.is_string()) {
        return Err(JwtError::Invalid("sub"));
    }
    // We are nobody's audience: a token naming one was meant for another service
    // (RFC 7519 section 4.1.3); the previous verifier (jsonwebtoken) refused these too.
    if claims.contains_key("aud") {
        return Err(JwtError::Invalid("aud"));
    }
    check_times(&claims, now, max_lifetime)?;
    serde_json::from_value(serde_json::Value::Object(claims))
        .map_err(|_| JwtError::Invalid("claims"))
}

/// The time claims of a verified token at `now`: `exp` required, `nbf` and `iat`
/// honoured when present, each with [`LEEWAY_SECS`]; with `max_lifetime`, a token valid
/// for longer is refused. Answers `exp`.
pub fn check_times(claims: &Object, now: u64, max_lifetime: Option<u64>) -> Result<u64, JwtError> {
    let Some(exp) = claims.get("exp").and_then(|exp| exp.as_u64()) else {
        return Err(JwtError::Invalid("exp"));
    };
    // Optional, but typed when present (a string `nbf` must not read as "no nbf").
    let optional_time = |name: &'static str| match claims.get(name) {
        None => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or(JwtError::Invalid(name)),
    };
    let nbf = optional_time("nbf")?;
    let iat = optional_time("iat")?;
    if exp.saturating_add(LEEWAY_SECS) < now {
        return Err(JwtError::Expired);
    }
    if nbf.is_some_and(|nbf| nbf > now.saturating_add(LEEWAY_SECS)) {
        return Err(JwtError::NotYetValid);
    }
    if iat.is_some_and(|iat| iat > now.saturating_add(LEEWAY_SECS)) {
        return Err(JwtError::IssuedInFuture);
    }
    if let Some(max) = max_lifetime {
        let lifetime = exp.saturating_sub(iat.unwrap_or(now));
        if lifetime > max.saturating_add(LEEWAY_SECS) {
            return Err(JwtError::TooLong);
        }
    }
    Ok(exp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{Claims, Role};

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";
    const NOW: u64 = 1_700_000_000;

    fn key() -> Hs256Key {
        Hs256Key::new(SECRET)
    }

    fn claims(exp: u64) -> Claims {
        Claims {
            sub: "alice".into(),
            role: Role::Operator,
            exp,
            project_id: Some("p-1".into()),
        }
    }

    fn b64(raw: &[u8]) -> String {
        URL_SAFE_NO_PAD.encode(raw)
    }

    /// A token with any header and payload, signed correctly under `SECRET`.
    fn signed(header: &str, payload: &str) -> String {
        let input = format!("{}.{}", b64(header.as_bytes()), b64(payload.as_bytes()));
        let sig = key().mac(&input).finalize().into_bytes();
        format!("{input}.{}", b64(&sig))
    }

    fn verify(token: &str) -> Result<Claims, JwtError> {
        decode::<Claims>(&key(), token, NOW, None)
    }

    const PAYLOAD: &str = r#"{"sub":"alice","role":"operator","exp":1700003600}"#;

    #[test]
    fn round_trip() {
        let token = encode(&key(), &claims(NOW + 60)).unwrap();
        assert!(token.starts_with(&format!("{HEADER_B64}.")));
        assert_eq!(verify(&token), Ok(claims(NOW + 60)));
        let header = URL_SAFE_NO_PAD.decode(HEADER_B64).unwrap();
        assert_eq!(header, br#"{"alg":"HS256","typ":"JWT"}"#);
    }

    /// GIVEN a token minted by the previous implementation (jsonwebtoken 12,
    /// `Header::default()`, which writes `{"typ":"JWT","alg":"HS256"}`)
    /// WHEN it is verified THEN its claims come back unchanged.
    #[test]
    fn token_minted_by_jsonwebtoken_verifies() {
        let token = "eyJ0eXAiOiJKV1QiLCJhbGciOiJIUzI1NiJ9.\
            eyJzdWIiOiJhbGljZSIsInJvbGUiOiJvcGVyYXRvciIsImV4cCI6NDEwMjQ0NDgwMCwicHJvamVjdF9pZCI6InAtMSJ9.\
            Dtiv6RY4uP5oUTldlKxKpZ5m9lekoWaZLMlkIySZSTs";
        assert_eq!(verify(token), Ok(claims(4_102_444_800)));
    }

    #[test]
    fn previous_header_format_verifies() {
        for header in [
            r#"{"alg":"HS256","typ":"JWT"}"#,
            r#"{"typ":"JWT","alg":"HS256"}"#,
            r#"{"alg":"HS256"}"#,
        ] {
            let claims = verify(&signed(header, PAYLOAD)).unwrap();
            assert_eq!(
                (claims.sub.as_str(), claims.role),
                ("alice", Role::Operator)
            );
            assert_eq!(claims.project_id, None);
        }
    }

    #[test]
    fn unknown_claims_are_ignored_and_project_id_is_optional() {
        let token = signed(
            r#"{"alg":"HS256","typ":"JWT"}"#,
            r#"{"sub":"bob","role":"agent","exp":1700003600,"iat":1,"nbf":1,"x":[1]}"#,
        );
        let claims = verify(&token).unwrap();
        assert_eq!((claims.sub.as_str(), claims.role), ("bob", Role::Agent));
    }

    #[test]
    fn any_alg_but_hs256_is_refused() {
        for header in [
            r#"{"alg":"none","typ":"JWT"}"#,
            r#"{"alg":"HS512","typ":"JWT"}"#,
            r#"{"alg":"hs256","typ":"JWT"}"#,
            r#"{"alg":"RS256","typ":"JWT"}"#,
            r#"{"alg":"HS256 ","typ":"JWT"}"#,
        ] {
            assert_eq!(
                verify(&signed(header, PAYLOAD)),
                Err(JwtError::Invalid("alg")),
                "{header}"
            );
        }
        for header in [r#"{"typ":"JWT"}"#, r#"{"alg":null}"#, r#"{"alg":256}"#] {
            assert_eq!(
                verify(&signed(header, PAYLOAD)),
                Err(JwtError::Invalid("alg")),
                "{header}"
            );
        }
        for header in [r#"["HS256"]"#, "x", ""] {
            assert_eq!(
                verify(&signed(header, PAYLOAD)),
                Err(JwtError::Invalid("header")),
                "{header}"
            );
        }
        // alg "none" with an empty signature, the classic forgery.
        let none = format!(
            "{}.{}.",
            b64(br#"{"alg":"none","typ":"JWT"}"#),
            b64(PAYLOAD.as_bytes())
        );
        assert_eq!(verify(&none), Err(JwtError::Invalid("alg")));
    }

    #[test]
    fn tampered_payload_is_refused() {
        let token = encode(&key(), &claims(NOW + 60)).unwrap();
        let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
        let mut forged = claims(NOW + 60);
        forged.sub = "mallory".into();
        parts[1] = b64(&serde_json::to_vec(&forged).unwrap());
        assert_eq!(
            verify(&parts.join(".")),
            Err(JwtError::Invalid("signature"))
        );
    }

    #[test]
    fn tampered_signature_is_refused() {
        let token = encode(&key(), &claims(NOW + 60)).unwrap();
        let (input, sig) = token.rsplit_once('.').unwrap();
        let mut raw = URL_SAFE_NO_PAD.decode(sig).unwrap();
        raw[0] ^= 1;
        let flipped = format!("{input}.{}", b64(&raw));
        assert_eq!(verify(&flipped), Err(JwtError::Invalid("signature")));
        let truncated = format!("{input}.{}", b64(&raw[..31]));
        assert_eq!(verify(&truncated), Err(JwtError::Invalid("signature")));
        let empty = format!("{input}.");
        assert_eq!(verify(&empty), Err(JwtError::Invalid("signature")));
    }

    #[test]
    fn wrong_secret_is_refused() {
        let other = Hs256Key::new(b"another-secret-another-secret-xx");
        let token = encode(&other, &claims(NOW + 60)).unwrap();
        assert_eq!(verify(&token), Err(JwtError::Invalid("signature")));
    }

    #[test]
    fn wrong_segment_counts_are_refused() {
        let token = encode(&key(), &claims(NOW + 60)).unwrap();
        let (two, _) = token.rsplit_once('.').unwrap();
        for bad in [two, "", "abc", &format!("{token}."), &format!("{token}.x")] {
            assert_eq!(
                verify(bad),
                Err(JwtError::Invalid("not three segments")),
                "{bad}"
            );
        }
    }

    #[test]
    fn garbage_base64_is_refused() {
        let token = encode(&key(), &claims(NOW + 60)).unwrap();
        let parts: Vec<&str> = token.split('.').collect();
        let header_pad = format!("{}=.{}.{}", parts[0], parts[1], parts[2]);
        assert_eq!(verify(&header_pad), Err(JwtError::Invalid("header")));
        let header_bad = format!("!!!.{}.{}", parts[1], parts[2]);
        assert_eq!(verify(&header_bad), Err(JwtError::Invalid("header")));
        // Standard (not URL-safe) alphabet in the signature.
        let sig_std = format!("{}.{}.{}+/", parts[0], parts[1], parts[2]);
        assert_eq!(
            verify(&sig_std),
            Err(JwtError::Invalid("signature encoding"))
        );
        // A correctly signed payload that is not base64url.
        assert_eq!(
            verify(&signed_raw_payload("*not base64*")),
            Err(JwtError::Invalid("claims encoding"))
        );
    }

    /// A correctly signed token whose payload segment is `payload` verbatim.
    fn signed_raw_payload(payload: &str) -> String {
        let input = format!("{HEADER_B64}.{payload}");
        let sig = key().mac(&input).finalize().into_bytes();
        format!("{input}.{}", b64(&sig))
    }

    #[test]
    fn exp_and_sub_are_required_and_typed() {
        for (payload, why) in [
            (r#"{"sub":"alice","role":"operator"}"#, "exp"),
            (
                r#"{"sub":"alice","role":"operator","exp":"1700003600"}"#,
                "exp",
            ),
            (
                r#"{"sub":"alice","role":"operator","exp":1700003600.5}"#,
                "exp",
            ),
            (r#"{"sub":"alice","role":"operator","exp":-1}"#, "exp"),
            (r#"{"role":"operator","exp":1700003600}"#, "sub"),
            (r#"{"sub":7,"role":"operator","exp":1700003600}"#, "sub"),
            (
                r#"{"sub":"alice","role":"admin","exp":1700003600}"#,
                "claims",
            ),
            (r#"{"sub":"alice","exp":1700003600}"#, "claims"),
            (r#"["alice","operator",1700003600]"#, "claims"),
            ("not json", "claims"),
        ] {
            let token = signed(r#"{"alg":"HS256","typ":"JWT"}"#, payload);
            assert_eq!(verify(&token), Err(JwtError::Invalid(why)), "{payload}");
        }
    }

    #[test]
    fn a_token_with_an_audience_is_refused() {
        let token = signed(
            r#"{"alg":"HS256"}"#,
            r#"{"sub":"alice","role":"operator","exp":1700003600,"aud":"elsewhere"}"#,
        );
        assert_eq!(verify(&token), Err(JwtError::Invalid("aud")));
    }

    #[test]
    fn expired_is_refused_after_the_leeway() {
        let at = |exp: u64| verify(&encode(&key(), &claims(exp)).unwrap());
        assert_eq!(at(NOW), Ok(claims(NOW)));
        assert_eq!(at(NOW - LEEWAY_SECS), Ok(claims(NOW - LEEWAY_SECS)));
        assert_eq!(at(NOW - LEEWAY_SECS - 1), Err(JwtError::Expired));
        assert_eq!(at(1_000), Err(JwtError::Expired));
        assert_eq!(JwtError::Expired.to_string(), "token has expired");
        // Expiry is only reported for tokens we signed.
        let forged = encode(&Hs256Key::new(b"other"), &claims(1_000)).unwrap();
        assert_eq!(verify(&forged), Err(JwtError::Invalid("signature")));
    }

    fn with_times(extra: &str) -> String {
        signed(
            r#"{"alg":"HS256"}"#,
            &format!(
                r#"{{"sub":"alice","role":"operator","exp":{}{extra}}}"#,
                NOW + 3600
            ),
        )
    }

    #[test]
    fn nbf_is_honoured_with_the_leeway() {
        assert!(verify(&with_times(&format!(r#","nbf":{NOW}"#))).is_ok());
        let edge = NOW + LEEWAY_SECS;
        assert!(verify(&with_times(&format!(r#","nbf":{edge}"#))).is_ok());
        let early = NOW + LEEWAY_SECS + 1;
        assert_eq!(
            verify(&with_times(&format!(r#","nbf":{early}"#))),
            Err(JwtError::NotYetValid)
        );
        assert_eq!(
            verify(&with_times(r#","nbf":"soon""#)),
            Err(JwtError::Invalid("nbf"))
        );
    }

    #[test]
    fn an_iat_in_the_future_is_refused() {
        assert!(verify(&with_times(&format!(r#","iat":{NOW}"#))).is_ok());
        let edge = NOW + LEEWAY_SECS;
        assert!(verify(&with_times(&format!(r#","iat":{edge}"#))).is_ok());
        let future = NOW + LEEWAY_SECS + 1;
        assert_eq!(
            verify(&with_times(&format!(r#","iat":{future}"#))),
            Err(JwtError::IssuedInFuture)
        );
        assert_eq!(
            verify(&with_times(r#","iat":-5"#)),
            Err(JwtError::Invalid("iat"))
        );
    }

    #[test]
    fn lifetime_is_bounded_from_iat_or_from_now() {
        let day = 86_400;
        let check = |payload: String| {
            decode::<Claims>(
                &key(),
                &signed(r#"{"alg":"HS256"}"#, &payload),
                NOW,
                Some(day),
            )
        };
        let token = |exp: u64, iat: Option<u64>| match iat {
            Some(iat) => format!(r#"{{"sub":"a","role":"agent","exp":{exp},"iat":{iat}}}"#),
            None => format!(r#"{{"sub":"a","role":"agent","exp":{exp}}}"#),
        };
        // exp - iat: a day is fine (a token minted an hour ago for a day, too).
        assert!(check(token(NOW + day, Some(NOW))).is_ok());
        assert!(check(token(NOW + day - 3600, Some(NOW - 3600))).is_ok());
        assert_eq!(
            check(token(NOW + day + 3600, Some(NOW))),
            Err(JwtError::TooLong)
        );
        // An old iat with a far exp is too long even though little of it is left.
        assert_eq!(
            check(token(NOW + 60, Some(NOW - 2 * day))),
            Err(JwtError::TooLong)
        );
        // Without iat: what is left of it.
        assert!(check(token(NOW + day, None)).is_ok());
        assert_eq!(check(token(NOW + 2 * day, None)), Err(JwtError::TooLong));
        // No maximum: anything that has not expired.
        let far = signed(r#"{"alg":"HS256"}"#, &token(NOW + 100 * day, None));
        assert!(decode::<Claims>(&key(), &far, NOW, None).is_ok());
    }
}
