//! A bearer of any bytes on a run's route: never a panic, never the run's caller — except
//! the run's own token (its MAC part in either case, the same bytes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_api::auth::{Caller, Credentials};
use tollgate_api::Auth;

fuzz_target!(|data: &[u8]| {
    let auth = Auth::new(b"fuzz-secret-fuzz-secret-fuzz-secret!");
    let real = auth.run_token("run-1", "0000000000000001");
    let mut headers = http::HeaderMap::new();
    let mut value = b"Bearer ".to_vec();
    value.extend_from_slice(data);
    let Ok(value) = http::HeaderValue::from_bytes(&value) else {
        return;
    };
    headers.insert(http::header::AUTHORIZATION, value);
    let creds = Credentials::from_headers(&headers);
    if let Ok(Caller::Run { .. }) = auth.caller(&creds, Some("run-1")) {
        let given = String::from_utf8_lossy(data);
        assert_eq!(
            given.trim().to_ascii_lowercase(),
            real,
            "forged run token let in"
        );
    }
});
