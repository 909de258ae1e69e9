//! Slack's request signature (docs/architecture.md §11): `X-Slack-Signature: v0=<hex>`,
//! the HMAC-SHA256 of `v0:<X-Slack-Request-Timestamp>:<raw body>` under the app's
//! signing secret, compared in constant time, and only within
//! [`MAX_SKEW_SECONDS`] of the server's clock (a replayed request is refused once it is
//! older than that).

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// How far a request's timestamp may be from the server's clock, either way.
pub const MAX_SKEW_SECONDS: i64 = 300;
/// Slack's timestamp header.
pub const TIMESTAMP_HEADER: &str = "x-slack-request-timestamp";
/// Slack's signature header.
pub const SIGNATURE_HEADER: &str = "x-slack-signature";

/// Why a request is not Slack's (each answers 401; the value of the secret never appears).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    #[error("the request carries no X-Slack-Request-Timestamp or X-Slack-Signature")]
    Missing,
    #[error("X-Slack-Request-Timestamp is not a Unix time in seconds")]
    BadTimestamp,
    #[error("the request is more than 300 seconds away from the server's clock (a replay?)")]
    Stale,
    #[error("X-Slack-Signature does not match the request")]
    Mismatch,
}

fn mac(secret: &[u8], timestamp: &str, body: &[u8]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(b"v0:");
    mac.update(timestamp.as_bytes());
    mac.update(b":");
    mac.update(body);
    mac
}

/// The `X-Slack-Signature` value Slack sends for `body` at `timestamp`.
pub fn sign(secret: &[u8], timestamp: &str, body: &[u8]) -> String {
    format!(
        "v0={}",
        hex::encode(mac(secret, timestamp, body).finalize().into_bytes())
    )
}

/// Checks a request's signature over its raw `body`, at `now` (Unix seconds).
pub fn verify(
    secret: &[u8],
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now: i64,
) -> Result<(), SignatureError> {
    let (Some(timestamp), Some(signature)) = (timestamp, signature) else {
        return Err(SignatureError::Missing);
    };
    // At most 12 digits: a number, never parsed from anything longer.
    if timestamp.is_empty()
        || timestamp.len() > 12
        || !timestamp.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(SignatureError::BadTimestamp);
    }
    let ts: i64 = timestamp
        .parse()
        .map_err(|_| SignatureError::BadTimestamp)?;
    if (now - ts).abs() > MAX_SKEW_SECONDS {
        return Err(SignatureError::Stale);
    }
    let given = signature
        .strip_prefix("v0=")
        .filter(|h| h.len() == 64)
        .and_then(|h| hex::decode(h).ok())
        .ok_or(SignatureError::Mismatch)?;
    // `verify_slice` compares in constant time.
    mac(secret, timestamp, body)
        .verify_slice(&given)
        .map_err(|_| SignatureError::Mismatch)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Slack's documented example (api.slack.com, "Verifying requests from Slack").
    const SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const TS: &str = "1531420618";
    const BODY: &str = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";

    #[test]
    fn slacks_documented_example_verifies() {
        let sig = sign(SECRET.as_bytes(), TS, BODY.as_bytes());
        assert_eq!(
            sig,
            "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"
        );
        let now = TS.parse::<i64>().unwrap() + 10;
        assert_eq!(
            verify(
                SECRET.as_bytes(),
                Some(TS),
                Some(&sig),
                BODY.as_bytes(),
                now
            ),
            Ok(())
        );
    }

    #[test]
    fn anything_else_is_refused() {
        let s = SECRET.as_bytes();
        let b = BODY.as_bytes();
        let sig = sign(s, TS, b);
        let now: i64 = TS.parse().unwrap();
        assert_eq!(
            verify(s, None, Some(&sig), b, now),
            Err(SignatureError::Missing)
        );
        assert_eq!(
            verify(s, Some(TS), None, b, now),
            Err(SignatureError::Missing)
        );
        assert_eq!(
            verify(s, Some("-1"), Some(&sig), b, now),
            Err(SignatureError::BadTimestamp)
        );
        assert_eq!(
            verify(s, Some(TS), Some(&sig), b, now + 301),
            Err(SignatureError::Stale)
        );
        assert_eq!(
            verify(s, Some(TS), Some(&sig), b, now - 301),
            Err(SignatureError::Stale)
        );
        assert_eq!(verify(s, Some(TS), Some(&sig), b, now + 300), Ok(()));
        assert_eq!(
            verify(s, Some(TS), Some(&sig), b"tampered", now),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(b"another secret", Some(TS), Some(&sig), b, now),
            Err(SignatureError::Mismatch)
        );
        let v1 = sig.replacen("v0=", "v1=", 1);
        assert_eq!(
            verify(s, Some(TS), Some(&v1), b, now),
            Err(SignatureError::Mismatch)
        );
        // The timestamp is part of what is signed.
        let later = (now + 1).to_string();
        assert_eq!(
            verify(s, Some(&later), Some(&sig), b, now),
            Err(SignatureError::Mismatch)
        );
    }
}
