//! `agenthost_origin` of any text: never a panic; an accepted origin is https, or http
//! only where loopback is allowed, with no user or password.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_api::forward::check_origin;

fuzz_target!(|data: &[u8]| {
    let Some((&flag, rest)) = data.split_first() else {
        return;
    };
    let Ok(origin) = std::str::from_utf8(rest) else {
        return;
    };
    let allow = flag & 1 == 1;
    if check_origin(origin, allow).is_ok() {
        let url = url::Url::parse(origin).expect("an accepted origin is a URL");
        assert!(
            url.scheme() == "https" || (allow && url.scheme() == "http"),
            "{origin:?} accepted"
        );
        assert!(
            url.username().is_empty() && url.password().is_none(),
            "{origin:?} accepted with credentials"
        );
        assert!(matches!(url.path(), "" | "/"), "{origin:?} accepted with a path");
    }
});
