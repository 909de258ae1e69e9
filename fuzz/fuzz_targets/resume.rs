//! Where a replay or a stream resumes (`?after=`, `Last-Event-ID`): never a panic; a
//! sequence number is accepted only as the decimal text of one.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let query = format!("after={text}");
    if let Ok(n) = tollgate_api::replay::parse_after(Some(&query)) {
        let given = tollgate_api::request::query_param(Some(&query), "after").unwrap();
        assert_eq!(given.parse::<u64>().ok(), Some(n));
    }
    let mut headers = http::HeaderMap::new();
    if let Ok(v) = http::HeaderValue::from_str(text) {
        headers.insert("last-event-id", v);
        if let Ok(n) = tollgate_api::sse::start_after(&headers, None) {
            assert_eq!(text.trim().parse::<u64>().ok(), Some(n));
        }
    }
});
