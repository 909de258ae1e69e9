//! An incremental `text/event-stream` parser for Tollgate's live stream
//! (`GET /api/runs/{id}/stream`): `retry: <ms>` first, then `id:` / `event:` / `data:`
//! frames, `: keep-alive` comments, and after the terminal event a final `event: done`
//! frame without an id. Bytes go in as they arrive (any split, CRLF or LF); whole items
//! come out. A frame a broken response leaves half-read is never handed out.

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

/// The parser's state between chunks.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    event: String,
    data: String,
    has_data: bool,
    id: Option<String>,
}

impl SseParser {
    /// A parser at the start of a response.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next bytes; returns the items they complete.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseItem> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut start = 0;
        while let Some(pos) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let mut line = &self.buf[start..start + pos];
            if let [rest @ .., b'\r'] = line {
                line = rest;
            }
            let line = String::from_utf8_lossy(line).into_owned();
            start += pos + 1;
            self.line(&line, &mut out);
        }
        self.buf.drain(..start);
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
                if let Ok(ms) = value.trim().parse::<u64>() {
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
    fn bad_retry_and_unknown_fields_are_ignored() {
        let mut p = SseParser::new();
        let got = p.feed(b"retry: soon\nfoo: bar\nid\ndata\n\n");
        assert_eq!(got, vec![frame(Some(""), "", "")]);
    }
}
