//! Where a replay or a stream resumes (`?after=`, `Last-Event-ID`): never a panic; a
//! sequence number is accepted exactly when the text is the decimal text of one (digits,
//! an optional `+`, at most `u64::MAX`; the header's surrounding spaces aside), and reads
//! as that number. Checked against a reading of its own, not the product's.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_api::replay::parse_after;
use tollgate_api::sse::start_after;

/// The number `text` is the decimal text of, if any.
fn decimal(text: &str) -> Option<u64> {
    let digits = text.strip_prefix('+').unwrap_or(text);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut n: u64 = 0;
    for b in digits.bytes() {
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // `?after=<text>`: the value is the text up to the first `&` (the first `after`).
    let query = format!("after={text}");
    let value = text.split('&').next().unwrap();
    assert_eq!(parse_after(Some(&query)).ok(), decimal(value), "?{query}");
    assert_eq!(
        start_after(&http::HeaderMap::new(), Some(&query)).ok(),
        decimal(value)
    );
    // `Last-Event-ID: <text>` (a header value is visible ASCII, spaces and tabs): it wins
    // over `?after=`.
    if let Ok(v) = http::HeaderValue::from_str(text) {
        let mut headers = http::HeaderMap::new();
        headers.insert("last-event-id", v);
        let expected = decimal(text.trim_matches([' ', '\t']));
        assert_eq!(start_after(&headers, None).ok(), expected, "{text:?}");
        assert_eq!(
            start_after(&headers, Some("after=7")).ok(),
            expected,
            "{text:?}"
        );
    }
});
