//! The JWT decoder on any text: never a panic, and nothing but a token signed with the
//! key verifies (a fuzzer cannot forge an HMAC: any verified input is a crash).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_api::auth::Claims;
use tollgate_api::jwt::{decode, Hs256Key};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let key = Hs256Key::new(b"fuzz-secret-fuzz-secret-fuzz-secret!");
    let verified = decode::<Claims>(&key, text, 1_800_000_000, Some(86_400));
    assert!(verified.is_err(), "{text:?} verified: {verified:?}");
});
