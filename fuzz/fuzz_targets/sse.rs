//! The client's SSE parser: any bytes, cut at a place the input chooses, give the same
//! items as the bytes whole.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_client::sse::SseParser;

fuzz_target!(|data: &[u8]| {
    let Some((&cut, bytes)) = data.split_first() else {
        return;
    };
    let whole = SseParser::new().feed(bytes);
    let at = usize::from(cut) % (bytes.len() + 1);
    let mut parser = SseParser::new();
    let mut pieces = parser.feed(&bytes[..at]);
    pieces.extend(parser.feed(&bytes[at..]));
    assert_eq!(whole, pieces);
});
