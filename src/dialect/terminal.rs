//! Spot the event that completes a stream (`data: [DONE]`,
//! `response.completed`, …) as bytes pass through, without buffering them.
//!
//! The proxy holds back the chunk that completes that event until the call
//! is in the write-ahead log, so a harness never sees a finished stream that
//! is not on disk.

/// Scans an SSE byte stream line by line, keeping only each line's head.
#[derive(Debug, Default)]
pub struct Detector {
    head: Vec<u8>,
    after_cr: bool,
    terminal_event: bool,
    /// An error event went by (`event: error`, or data that is an error object).
    pub saw_error: bool,
    /// The terminal event said the response failed (`response.failed`).
    pub failed: bool,
    /// The terminal event said the response is incomplete (`response.incomplete`).
    pub incomplete: bool,
}

const HEAD: usize = 48;

const ERRORS: &[&[u8]] = &[
    b"event: error",
    b"data: {\"error\"",
    b"data: {\"type\":\"error\"",
];

const MARKERS: &[&[u8]] = &[
    b"data: [DONE]",
    b"data:[DONE]",
    b"event: response.completed",
    b"event: response.failed",
    b"event: response.incomplete",
    b"event: message_stop",
    b"data: {\"type\":\"response.completed\"",
    b"data: {\"type\":\"response.failed\"",
    b"data: {\"type\":\"response.incomplete\"",
    b"data: {\"type\":\"message_stop\"",
];

impl Detector {
    /// Feed one chunk; true when the chunk ends (dispatches) a terminal event.
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        let mut done = false;
        for &b in bytes {
            if self.after_cr && b == b'\n' {
                self.after_cr = false;
                continue;
            }
            self.after_cr = b == b'\r';
            if b == b'\n' || b == b'\r' {
                if self.head.is_empty() {
                    done |= std::mem::take(&mut self.terminal_event);
                } else if MARKERS.iter().any(|m| self.head.starts_with(m)) {
                    self.terminal_event = true;
                    let has = |w: &[u8]| memchr::memmem::find(&self.head, w).is_some();
                    self.failed |= has(b"response.failed");
                    self.incomplete |= has(b"response.incomplete");
                } else if ERRORS.iter().any(|m| self.head.starts_with(m)) {
                    self.saw_error = true;
                }
                self.head.clear();
            } else if self.head.len() < HEAD {
                self.head.push(b);
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_only_when_event_is_dispatched() {
        let mut d = Detector::default();
        assert!(!d.feed(b"data: {\"choices\":[{\"delta\":{\"content\":\"[DONE]\"}}]}\n\n"));
        assert!(!d.feed(b"event: response.completed\n"));
        assert!(!d.feed(b"data: {\"type\":\"response.completed\"}"));
        assert!(d.feed(b"\n\n"));
        let mut d = Detector::default();
        assert!(!d.feed(b"data: [DO"));
        assert!(!d.feed(b"NE]\r\n"));
        assert!(d.feed(b"\r\n"));
        assert!(!d.saw_error);
        assert!(!d.feed(b"data: {\"error\":{\"message\":\"x\"}}\n\n"));
        assert!(d.saw_error);
        assert!(!d.failed && !d.incomplete);
        let mut d = Detector::default();
        assert!(d.feed(b"event: response.failed\ndata: {\"type\":\"response.failed\"}\n\n"));
        assert!(d.failed && !d.incomplete);
        let mut d = Detector::default();
        assert!(d.feed(b"data: {\"type\":\"response.incomplete\",\"response\":{}}\n\n"));
        assert!(d.incomplete);
    }
}
