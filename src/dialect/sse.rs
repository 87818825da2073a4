//! Server-sent events, parsed incrementally so that a stream cut at any byte
//! boundary parses the same as one given whole.

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub event: Option<String>,
    pub data: String,
}

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
#[derive(Debug, Default)]
pub struct Parser {
    line: Vec<u8>,
    after_cr: bool,
    event: Option<String>,
    data: Option<String>,
}

impl Parser {
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
            } else {
                self.line.push(b);
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
        if line.is_empty() {
            if let Some(mut data) = self.data.take() {
                data.pop();
                out.push(Event {
                    event: self.event.take(),
                    data,
                });
            }
            self.event = None;
            return;
        }
        if line[0] == b':' {
            return;
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        let value = String::from_utf8_lossy(value);
        match field {
            b"data" => {
                let d = self.data.get_or_insert_with(String::new);
                d.push_str(&value);
                d.push('\n');
            }
            b"event" => self.event = Some(value.into_owned()),
            _ => {}
        }
    }
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
    }
}
