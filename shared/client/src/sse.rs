//! An incremental `text/event-stream` parser for Tollgate's live stream
//! (`GET /api/runs/{id}/stream`): `retry: <ms>` first, then `id:` / `event:` / `data:`
//! frames, `: keep-alive` comments, and after the terminal event a final `event: done`
//! frame without an id. Bytes go in as they arrive (any split, CRLF or LF); whole items
//! come out. A frame a broken response leaves half-read is never handed out, and a
//! line or frame over its cap ([`MAX_LINE`], [`MAX_FRAME_DATA`]) stops the parser
//! instead of growing its buffer: a broken server cannot make a reader buffer without
//! bound.

/// One item of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseItem {
    /// `retry: <ms>`: how soon to reconnect after the end of a window.
    Retry(u64),
    /// A dispatched frame.
    Frame(SseFrame),
}

/// One dispatched frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseFrame {
    /// `id:` — the event's sequence (absent on `done`).
    pub id: Option<String>,
    /// `event:` — the event's type, or `done`.
    pub event: String,
    /// `data:` lines joined by `\n` — the event's JSON.
    pub data: String,
}

impl SseFrame {
    /// The sequence in `id:`, when it is one.
    pub fn sequence(&self) -> Option<u64> {
        self.id.as_deref().and_then(|i| i.trim().parse().ok())
    }

    /// Whether this is the final frame after the run's terminal event.
    pub fn is_done(&self) -> bool {
        self.event == "done" && self.id.is_none()
    }
}

/// The longest line of the stream (an event is at most 64 KiB of payload): a longer one
/// stops the parser ([`SseParser::overflowed`]).
pub const MAX_LINE: usize = 1 << 20;
/// The most `data` one frame may gather over several lines.
pub const MAX_FRAME_DATA: usize = 4 << 20;

/// The parser's state between chunks.
///
/// Memory is bounded: a line over [`MAX_LINE`] bytes (complete or still arriving), or a
/// frame gathering more than [`MAX_FRAME_DATA`] of data, stops it — what it holds is
/// dropped, [`SseParser::overflowed`] turns true and it takes nothing more (the
/// response is to be dropped as broken; a new one gets a new parser).
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    /// `buf[..scanned]` holds no line end (where the next search starts).
    scanned: usize,
    event: String,
    data: String,
    has_data: bool,
    id: Option<String>,
    overflowed: bool,
}

impl SseParser {
    /// A parser at the start of a response.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next bytes; returns the items they complete (the complete frames before
    /// an overflowing line still come out).
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseItem> {
        let mut out = Vec::new();
        if self.overflowed {
            return out;
        }
        self.buf.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(pos) = self.buf[self.scanned..].iter().position(|&b| b == b'\n') {
            let end = self.scanned + pos;
            let mut line = &self.buf[start..end];
            if let [rest @ .., b'\r'] = line {
                line = rest;
            }
            if line.len() > MAX_LINE {
                return self.overflow(out);
            }
            let line = String::from_utf8_lossy(line).into_owned();
            start = end + 1;
            self.scanned = start;
            self.line(&line, &mut out);
            if self.data.len() > MAX_FRAME_DATA {
                return self.overflow(out);
            }
        }
        self.buf.drain(..start);
        self.scanned = self.buf.len();
        // The line in progress (one byte more for a `\r` before its `\n`).
        if self.buf.len() > MAX_LINE + 1 {
            return self.overflow(out);
        }
        out
    }

    /// Whether a line (or a frame) was too long: the response is to be dropped.
    pub fn overflowed(&self) -> bool {
        self.overflowed
    }

    fn overflow(&mut self, out: Vec<SseItem>) -> Vec<SseItem> {
        self.overflowed = true;
        self.buf = Vec::new();
        self.scanned = 0;
        self.data = String::new();
        out
    }

    fn line(&mut self, line: &str, out: &mut Vec<SseItem>) {
        if line.is_empty() {
            let event = std::mem::take(&mut self.event);
            let data = std::mem::take(&mut self.data);
            let id = self.id.take();
            if std::mem::take(&mut self.has_data) || !event.is_empty() {
                out.push(SseItem::Frame(SseFrame { id, event, data }));
            }
            return;
        }
        if line.starts_with(':') {
            return; // a comment: `: keep-alive`
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = value.to_owned(),
            "data" => {
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            "id" if !value.contains('\0') => self.id = Some(value.to_owned()),
            "retry" => {
                if let Ok(ms) = value.parse::<u64>() {
                    out.push(SseItem::Retry(ms));
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(id: Option<&str>, event: &str, data: &str) -> SseItem {
        SseItem::Frame(SseFrame {
            id: id.map(str::to_owned),
            event: event.into(),
            data: data.into(),
        })
    }

    #[test]
    fn server_frames_parse_across_any_split() {
        let text = "retry: 1000\n\nid: 1\nevent: run_started\ndata: {\"a\":\"é\"}\n\n: keep-alive\n\nid: 2\r\nevent: x\r\ndata: 1\r\ndata: 2\r\n\r\nevent: done\ndata: {}\n\n";
        let want = vec![
            SseItem::Retry(1000),
            frame(Some("1"), "run_started", "{\"a\":\"é\"}"),
            frame(Some("2"), "x", "1\n2"),
            frame(None, "done", "{}"),
        ];
        let bytes = text.as_bytes();
        for cut in 0..bytes.len() {
            let mut p = SseParser::new();
            let mut got = p.feed(&bytes[..cut]);
            got.extend(p.feed(&bytes[cut..]));
            assert_eq!(got, want, "split at {cut}");
        }
        let mut p = SseParser::new();
        let got: Vec<SseItem> = bytes.iter().flat_map(|b| p.feed(&[*b])).collect();
        assert_eq!(got, want, "byte by byte");
    }

    #[test]
    fn keepalives_alone_dispatch_nothing_and_half_frames_wait() {
        let mut p = SseParser::new();
        assert!(p.feed(b": keep-alive\n\n: keep-alive\n\n").is_empty());
        assert!(p.feed(b"id: 3\nevent: x\ndata: {\"sequ").is_empty());
        let got = p.feed(b"ence\":3}\n\n");
        assert_eq!(got, vec![frame(Some("3"), "x", "{\"sequence\":3}")]);
    }

    #[test]
    fn sequences_and_done() {
        let SseItem::Frame(f) = frame(Some(" 42"), "tool.call", "{}") else {
            unreachable!()
        };
        assert_eq!(f.sequence(), Some(42));
        assert!(!f.is_done());
        let SseItem::Frame(done) = frame(None, "done", "{}") else {
            unreachable!()
        };
        assert!(done.is_done());
        assert_eq!(done.sequence(), None);
        // An event whose type happens to be "done" but has an id is an event.
        let SseItem::Frame(f) = frame(Some("7"), "done", "{}") else {
            unreachable!()
        };
        assert!(!f.is_done());
    }

    #[test]
    fn a_line_over_the_cap_stops_the_parser() {
        // Complete frames before the long line still come out.
        let mut p = SseParser::new();
        let mut head = b"id: 1\nevent: x\ndata: {}\n\ndata: ".to_vec();
        head.extend(std::iter::repeat_n(b'a', MAX_LINE));
        assert_eq!(p.feed(&head), vec![frame(Some("1"), "x", "{}")]);
        assert!(p.overflowed());
        assert_eq!(p.feed(b"\n\nid: 2\nevent: y\ndata: 1\n\n"), vec![]);

        // Arriving a little at a time, without a line end.
        let mut p = SseParser::new();
        let piece = vec![b'a'; 64 * 1024];
        let mut fed = 0;
        while !p.overflowed() {
            assert!(p.feed(&piece).is_empty());
            fed += piece.len();
            assert!(
                fed <= MAX_LINE + 2 * piece.len(),
                "no overflow after {fed} bytes"
            );
        }

        // A complete line over the cap, in one chunk.
        let mut p = SseParser::new();
        let mut line = b"data: ".to_vec();
        line.extend(std::iter::repeat_n(b'a', MAX_LINE));
        line.extend(b"\n\n");
        assert_eq!(p.feed(&line), vec![]);
        assert!(p.overflowed());

        // Just under the cap is fine; so are many lines adding up to more.
        let mut p = SseParser::new();
        let mut line = b"data:".to_vec();
        line.extend(std::iter::repeat_n(b'a', MAX_LINE - 5));
        line.extend(b"\r\n\n");
        let got = p.feed(&line);
        assert!(!p.overflowed());
        assert!(
            matches!(&got[..], [SseItem::Frame(SseFrame { data, .. })] if data.len() == MAX_LINE - 5)
        );
        let mut p = SseParser::new();
        let many = "data: x\n\n".repeat(MAX_LINE / 4);
        assert_eq!(p.feed(many.as_bytes()).len(), MAX_LINE / 4);
        assert!(!p.overflowed());

        // One frame gathering more than MAX_FRAME_DATA over its lines.
        let mut p = SseParser::new();
        let line = format!("data: {}\n", "a".repeat(MAX_LINE / 2));
        for _ in 0..(MAX_FRAME_DATA / (MAX_LINE / 2)) {
            assert_eq!(p.feed(line.as_bytes()), vec![]);
        }
        assert!(p.overflowed());
    }

    #[test]
    fn bad_retry_and_unknown_fields_are_ignored() {
        let mut p = SseParser::new();
        let got = p.feed(b"retry: soon\nretry:  5\nfoo: bar\nid\ndata\n\n");
        assert_eq!(got, vec![frame(Some(""), "", "")]);
    }
}
