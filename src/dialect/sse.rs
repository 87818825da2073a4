//! Server-sent events, parsed incrementally so that a stream cut at any byte
//! boundary parses the same as one given whole.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub event: Option<String>,
    pub data: String,
    /// The event was longer than the parser's limit: `data` holds its first
    /// bytes only (see [`Parser::with_limit`]).
    pub truncated: bool,
}

/// The default bound on one event's data, and on one line.
pub const MAX_EVENT_BYTES: usize = 64 << 20;

/// Write `ev` back as SSE: its `event:` line, one `data:` line per line of
/// data, and the blank line that dispatches it.
pub fn write_event(ev: &Event, out: &mut Vec<u8>) {
    if let Some(e) = &ev.event {
        out.extend_from_slice(b"event: ");
        out.extend_from_slice(e.as_bytes());
        out.push(b'\n');
    }
    for line in ev.data.split('\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
    out.push(b'\n');
}

/// Incremental SSE parser (WHATWG event-stream rules: `\n`, `\r\n` or `\r`
/// line ends; `data` lines joined with `\n`; comments ignored).
///
/// Memory is bounded: a line keeps at most `limit` bytes, and an event's
/// data at most `limit` bytes. What goes beyond is dropped and the event
/// dispatched with `truncated` set, its data a prefix of the real data
/// (cut at a character boundary). With the default limit,
/// [`MAX_EVENT_BYTES`], no real event is affected.
#[derive(Debug)]
pub struct Parser {
    line: Vec<u8>,
    /// Bytes of the current line were dropped.
    line_cut: bool,
    after_cr: bool,
    event: Option<String>,
    data: Option<String>,
    /// The data reached the limit: later data lines of the event are dropped.
    data_full: bool,
    truncated: bool,
    limit: usize,
}

impl Default for Parser {
    fn default() -> Self {
        Self::with_limit(MAX_EVENT_BYTES)
    }
}

impl Parser {
    /// A parser that keeps at most `limit` bytes of a line and of an event's data.
    pub fn with_limit(limit: usize) -> Self {
        Self {
            line: Vec::new(),
            line_cut: false,
            after_cr: false,
            event: None,
            data: None,
            data_full: false,
            truncated: false,
            limit,
        }
    }

    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<Event>) {
        for &b in bytes {
            if self.after_cr && b == b'\n' {
                self.after_cr = false;
                continue;
            }
            self.after_cr = b == b'\r';
            if b == b'\n' || b == b'\r' {
                let line = std::mem::take(&mut self.line);
                self.line_done(&line, out);
                self.line_cut = false;
            } else if self.line.len() < self.limit {
                self.line.push(b);
            } else {
                self.line_cut = true;
            }
        }
    }

    /// Dispatch what is pending at the end of the stream.
    pub fn finish(&mut self, out: &mut Vec<Event>) {
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&line, out);
        }
        self.line_done(b"", out);
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<Event>) {
        if line.is_empty() && !self.line_cut {
            if let Some(mut data) = self.data.take() {
                // Every data line ends in '\n'; a cut prefix may not.
                if !self.data_full {
                    data.pop();
                }
                out.push(Event {
                    event: self.event.take(),
                    data,
                    truncated: self.truncated,
                });
            }
            self.event = None;
            self.data_full = false;
            self.truncated = false;
            return;
        }
        if line.first() == Some(&b':') {
            return;
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        let value = if self.line_cut {
            whole_chars(value)
        } else {
            value
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"data" if self.data_full => {}
            b"data" => {
                let d = self.data.get_or_insert_with(String::new);
                let room = self.limit.saturating_sub(d.len());
                if !self.line_cut && value.len() < room {
                    d.push_str(&value);
                    d.push('\n');
                } else {
                    let mut end = room.min(value.len());
                    while !value.is_char_boundary(end) {
                        end -= 1;
                    }
                    d.push_str(&value[..end]);
                    self.data_full = true;
                    self.truncated = true;
                }
            }
            b"event" => {
                self.truncated |= self.line_cut;
                self.event = Some(value.into_owned());
            }
            _ => {}
        }
    }
}

/// `b` without the UTF-8 sequence a cut left incomplete at its end.
fn whole_chars(b: &[u8]) -> &[u8] {
    // The last character starts at one of the last four bytes.
    for back in 1..=b.len().min(4) {
        let i = b.len() - back;
        if b[i] & 0xC0 != 0x80 {
            return match std::str::from_utf8(&b[i..]) {
                Err(e) if e.error_len().is_none() => &b[..i],
                _ => b,
            };
        }
    }
    b
}

/// Parse a whole stream.
pub fn parse_all(bytes: &[u8]) -> Vec<Event> {
    let mut p = Parser::default();
    let mut out = Vec::new();
    p.feed(bytes, &mut out);
    p.finish(&mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_events_across_any_split() {
        let text =
            b"event: a\r\ndata: {\"x\":1}\r\n\r\n: comment\ndata: l1\ndata: l2\n\ndata: [DONE]\n\n";
        let whole = parse_all(text);
        assert_eq!(whole.len(), 3);
        assert_eq!(whole[0].event.as_deref(), Some("a"));
        assert_eq!(whole[1].data, "l1\nl2");
        for cut in 0..text.len() {
            let mut p = Parser::default();
            let mut out = Vec::new();
            p.feed(&text[..cut], &mut out);
            p.feed(&text[cut..], &mut out);
            p.finish(&mut out);
            assert_eq!(out, whole, "split at {cut}");
        }
        assert!(whole.iter().all(|e| !e.truncated));
    }

    #[test]
    fn an_event_over_the_limit_is_cut_and_flagged() {
        let mut p = Parser::with_limit(12);
        let mut out = Vec::new();
        p.feed(b"data: 0123456789abcdef\n\ndata: ok\n\n", &mut out);
        p.feed(b"data: 1234\ndata: 5678\ndata: 9\ndata: abc\n\n", &mut out);
        p.feed(
            "event: e\ndata: x\u{e9}\u{e9}\u{e9}\u{e9}\n\n".as_bytes(),
            &mut out,
        );
        p.feed(b"event: a-very-long-name\ndata: {}\n\n", &mut out);
        p.finish(&mut out);
        let got: Vec<(&str, bool)> = out.iter().map(|e| (e.data.as_str(), e.truncated)).collect();
        // A line keeps 12 bytes ("data: 012345"); data lines fill an event
        // up to 12 bytes; the data is a prefix of the real data, and "é" is
        // not cut in half.
        assert_eq!(
            got,
            [
                ("012345", true),
                ("ok", false),
                ("1234\n5678\n9\n", true),
                ("x\u{e9}\u{e9}", true),
                ("{}", true),
            ]
        );
        assert_eq!(out[3].event.as_deref(), Some("e"));
        assert_eq!(out[4].event.as_deref(), Some("a-ver"));
    }
}
