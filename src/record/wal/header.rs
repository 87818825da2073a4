//! The JSON headers of call frames, written field by field: the same bytes
//! `serde_json` makes of [`CallMeta`] and [`CallOutcome`] (a test holds
//! them equal), without escaping every key and going through serde's map
//! machinery for each field. Through serde the two headers cost about 7k
//! instructions of every call (callgrind); they are read back with serde.

use crate::record::{CallMeta, CallOutcome};

/// One JSON object being written: a comma before every field but the first.
struct Obj<'a> {
    buf: &'a mut Vec<u8>,
    first: bool,
}

impl<'a> Obj<'a> {
    fn open(buf: &'a mut Vec<u8>) -> Self {
        buf.push(b'{');
        Obj { buf, first: true }
    }

    /// `"name":`. Names are field names: nothing in them needs escaping.
    fn key(&mut self, name: &str) -> &mut Vec<u8> {
        if !self.first {
            self.buf.push(b',');
        }
        self.first = false;
        self.buf.push(b'"');
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.extend_from_slice(b"\":");
        self.buf
    }

    /// A string field. Most need no escape (ids, names, a user agent):
    /// those are copied between quotes, without `serde_json`'s byte-by-byte
    /// escape writer (about 1.8k instructions per call for nine of them).
    fn str(&mut self, name: &str, v: &str) -> Result<(), serde_json::Error> {
        let buf = self.key(name);
        if !nothing_to_escape(v.as_bytes()) {
            return serde_json::to_writer(buf, v);
        }
        buf.push(b'"');
        buf.extend_from_slice(v.as_bytes());
        buf.push(b'"');
        Ok(())
    }

    fn opt_str(&mut self, name: &str, v: Option<&str>) -> Result<(), serde_json::Error> {
        match v {
            Some(v) => self.str(name, v),
            None => {
                self.key(name).extend_from_slice(b"null");
                Ok(())
            }
        }
    }

    fn int(&mut self, name: &str, v: impl itoa::Integer) {
        let mut b = itoa::Buffer::new();
        let text = b.format(v);
        self.key(name).extend_from_slice(text.as_bytes());
    }

    fn opt_int(&mut self, name: &str, v: Option<impl itoa::Integer>) {
        match v {
            Some(v) => self.int(name, v),
            None => self.key(name).extend_from_slice(b"null"),
        }
    }

    fn bool(&mut self, name: &str, v: bool) {
        let text: &[u8] = if v { b"true" } else { b"false" };
        self.key(name).extend_from_slice(text);
    }

    fn close(self) {
        self.buf.push(b'}');
    }
}

/// No byte of `s` is one JSON escapes: a control byte, `"` or `\`. Eight
/// bytes at a time, with the classic has-a-byte-below test (exact as to
/// whether there is one); a byte at a time took about as long as
/// `serde_json`'s escape writer it was to spare.
fn nothing_to_escape(s: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = ONES << 7;
    let below = |x: u64, n: u64| x.wrapping_sub(ONES * n) & !x & HIGH != 0;
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        let Ok(bytes) = <[u8; 8]>::try_from(c) else {
            return false;
        };
        let x = u64::from_ne_bytes(bytes);
        if below(x, 0x20) || below(x ^ (ONES * 0x22), 1) || below(x ^ (ONES * 0x5c), 1) {
            return false;
        }
    }
    chunks
        .remainder()
        .iter()
        .all(|&b| b >= 0x20 && b != b'"' && b != b'\\')
}

/// A call's start frame header, as `serde_json` writes `CallMeta`.
pub fn meta(buf: &mut Vec<u8>, m: &CallMeta) -> Result<(), serde_json::Error> {
    let mut o = Obj::open(buf);
    o.str("call_id", &m.call_id)?;
    o.str("rollout_id", &m.rollout_id)?;
    o.int("sequence", m.sequence);
    o.str("wire_api", m.wire_api.as_str())?;
    o.opt_str("route", m.route.as_deref())?;
    o.opt_str("model", m.model.as_deref())?;
    o.opt_str("upstream_model", m.upstream_model.as_deref())?;
    o.bool("stream", m.stream);
    o.int("received_at", m.received_at);
    o.opt_str("user_agent", m.user_agent.as_deref())?;
    if let Some(api) = m.upstream_api {
        o.str("upstream_api", api.as_str())?;
    }
    if m.attempt != 0 {
        o.int("attempt", m.attempt);
    }
    if let Some(of) = m.attempt_of {
        o.int("attempt_of", of);
    }
    if m.side_call {
        o.bool("side_call", true);
    }
    o.close();
    Ok(())
}

/// A call's end frame header, as `serde_json` writes `CallOutcome`.
pub fn outcome(buf: &mut Vec<u8>, c: &CallOutcome) -> Result<(), serde_json::Error> {
    let mut o = Obj::open(buf);
    o.str("call_id", &c.call_id)?;
    o.str("status", c.status.as_str())?;
    o.opt_int("http_status", c.http_status);
    o.opt_str("failure_class", c.failure_class.map(|f| f.as_str()))?;
    o.opt_str("failure_message", c.failure_message.as_deref())?;
    o.opt_int("first_byte_at", c.first_byte_at);
    o.int("done_at", c.done_at);
    if let Some(r) = &c.replica {
        o.str("replica", r)?;
    }
    if c.repinned {
        o.bool("repinned", true);
    }
    if let Some(v) = c.policy_version {
        o.int("policy_version", v);
    }
    if let Some(v) = c.policy_version_end {
        o.int("policy_version_end", v);
    }
    if c.resent != 0 {
        o.int("resent", c.resent);
    }
    if !c.continued.is_empty() {
        serde_json::to_writer(o.key("continued"), &c.continued)?;
    }
    o.close();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::WireApi;
    use crate::record::{CallStatus, Continued, FailureClass};

    fn meta_of(full: bool, api: WireApi) -> CallMeta {
        CallMeta {
            call_id: "0190-\"id\"\\\u{1}é".into(),
            rollout_id: "r/1\n".into(),
            sequence: if full { i64::MIN } else { 7 },
            wire_api: api,
            route: full.then(|| "default".into()),
            model: full.then(|| "m\t\u{7f}\u{2028}".into()),
            // Nothing to escape, but not ASCII: `serde_json` leaves DEL
            // and U+2028 as they are.
            upstream_model: full.then(|| "up\u{7f}é\u{2028}".into()),
            stream: full,
            received_at: i64::MAX,
            user_agent: full.then(|| "codex/1 (\"x\")".into()),
            upstream_api: full.then_some(WireApi::ChatCompletions),
            attempt: if full { u32::MAX } else { 0 },
            attempt_of: full.then_some(-3),
            side_call: full,
        }
    }

    fn outcome_of(full: bool, class: Option<FailureClass>, status: CallStatus) -> CallOutcome {
        CallOutcome {
            call_id: "c\u{0}".into(),
            status,
            http_status: full.then_some(599),
            failure_class: class,
            failure_message: full.then(|| "upstream said \"no\"\r\n".into()),
            first_byte_at: full.then_some(-1),
            done_at: 0,
            replica: full.then(|| "http://10.0.0.1:8000/v1".into()),
            repinned: full,
            policy_version: full.then_some(3),
            policy_version_end: full.then_some(i64::MAX),
            resent: if full { 2 } else { 0 },
            continued: if full {
                vec![Continued {
                    completion_tokens: u64::MAX,
                    policy_version: 4,
                }]
            } else {
                Vec::new()
            },
        }
    }

    #[test]
    fn nothing_to_escape_finds_every_byte_json_escapes() {
        // Each byte value at each place of a text longer than two words.
        for at in 0..19 {
            for b in 0..=255u8 {
                let mut s = vec![b'a'; 19];
                s[at] = b;
                let escaped = b < 0x20 || b == b'"' || b == b'\\';
                assert_eq!(nothing_to_escape(&s), !escaped, "byte {b:#x} at {at}");
            }
        }
        assert!(nothing_to_escape(b""));
    }

    #[test]
    fn headers_are_the_bytes_serde_writes() {
        let apis = [
            WireApi::ChatCompletions,
            WireApi::Responses,
            WireApi::Completions,
            WireApi::Messages,
        ];
        for full in [false, true] {
            for api in apis {
                let m = meta_of(full, api);
                let mut ours = Vec::new();
                meta(&mut ours, &m).unwrap();
                assert_eq!(
                    String::from_utf8(ours).unwrap(),
                    serde_json::to_string(&m).unwrap()
                );
            }
            let classes = FailureClass::ALL.iter().copied().map(Some);
            for class in classes.chain([None]) {
                for status in [CallStatus::Ok, CallStatus::Failed, CallStatus::Incomplete] {
                    let c = outcome_of(full, class, status);
                    let mut ours = Vec::new();
                    outcome(&mut ours, &c).unwrap();
                    assert_eq!(
                        String::from_utf8(ours).unwrap(),
                        serde_json::to_string(&c).unwrap()
                    );
                }
            }
        }
    }
}
