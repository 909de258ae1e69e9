//! The client's SSE parser: any bytes, cut in up to four places the input chooses, give
//! the same items as the bytes whole, and overflow (or not) alike.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tollgate_client::sse::SseParser;

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 4) + 1;
    if rest.len() < n {
        return;
    }
    let (cuts, bytes) = rest.split_at(n);
    let mut whole_parser = SseParser::new();
    let whole = whole_parser.feed(bytes);
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|&c| usize::from(c) * (bytes.len() + 1) / 256)
        .collect();
    at.sort_unstable();
    let mut parser = SseParser::new();
    let mut pieces = Vec::new();
    let mut from = 0;
    for to in at.into_iter().chain([bytes.len()]) {
        pieces.extend(parser.feed(&bytes[from..to]));
        from = to;
    }
    assert_eq!(whole, pieces);
    assert_eq!(whole_parser.overflowed(), parser.overflowed());
});
