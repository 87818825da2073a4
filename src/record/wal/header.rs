//! The headers of call frames, packed: each field in a fixed order, as
//! little-endian integers and length-prefixed strings, behind a version
//! byte. The response path writes two of them for every call, so they are
//! built with a few copies and no escaping; written as JSON (even field by
//! field, with no serde) the two cost about 3.3k instructions of every
//! call under callgrind. Finish frames keep JSON headers (`serde`), and so
//! do call frames written before packed headers: a header that starts with
//! `{` is read as JSON (see [`read_meta`]), and no packed one does.
//!
//! Layout, after the version byte ([`VERSION`]):
//! - a string is its length (`u32`) and its UTF-8 bytes;
//! - an `Option` is a tag byte, 0 for `None` or 1 followed by the value;
//! - an enum is its name as a string (its serde name), so that reordering
//!   its variants changes nothing on disk;
//! - `bool` is one byte, 0 or 1; integers are their own width.
//!
//! Each header's fields come in its struct's order; see [`meta`] and
//! [`outcome`].

use crate::record::{CallMeta, CallOutcome, Continued};
use serde::de::{DeserializeOwned, IntoDeserializer};

/// The first byte of a packed header: its layout's version. Never `{`.
pub const VERSION: u8 = 1;

/// Appends fields to a header.
struct Put<'a>(&'a mut Vec<u8>);

impl Put<'_> {
    fn str(&mut self, s: &str) {
        // Frame parts are far below 4 GiB: the frame checks its own.
        let len = u32::try_from(s.len()).unwrap_or(u32::MAX);
        self.0.extend_from_slice(&len.to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
    }

    /// A tag byte, then the value (written by `put`) when there is one.
    fn opt<T>(&mut self, v: Option<T>, put: impl FnOnce(&mut Self, T)) {
        self.0.push(u8::from(v.is_some()));
        if let Some(v) = v {
            put(self, v);
        }
    }

    fn bool(&mut self, b: bool) {
        self.0.push(u8::from(b));
    }

    fn i64(&mut self, n: i64) {
        self.0.extend_from_slice(&n.to_le_bytes());
    }

    fn u32(&mut self, n: u32) {
        self.0.extend_from_slice(&n.to_le_bytes());
    }
}

/// Reads a header's fields back; `None` for a header cut short, a bad tag
/// or string, or an unknown enum name.
struct Take<'a>(&'a [u8]);

impl<'a> Take<'a> {
    fn bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    fn tag(&mut self) -> Option<bool> {
        match self.bytes::<1>()? {
            [0] => Some(false),
            [1] => Some(true),
            _ => None,
        }
    }

    fn str(&mut self) -> Option<&'a str> {
        let len = usize::try_from(u32::from_le_bytes(self.bytes()?)).ok()?;
        let s = self.0.get(..len)?;
        self.0 = self.0.get(len..)?;
        std::str::from_utf8(s).ok()
    }

    fn string(&mut self) -> Option<String> {
        self.str().map(str::to_owned)
    }

    /// A tag byte, then the value (read by `read`) when there is one.
    fn opt<T>(&mut self, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        Some(if self.tag()? { Some(read(self)?) } else { None })
    }

    /// An enum, by its serde name.
    fn named<T: DeserializeOwned>(&mut self) -> Option<T> {
        let name = self.str()?;
        let de: serde::de::value::StrDeserializer<serde::de::value::Error> =
            name.into_deserializer();
        T::deserialize(de).ok()
    }

    fn i64(&mut self) -> Option<i64> {
        self.bytes().map(i64::from_le_bytes)
    }

    fn u32(&mut self) -> Option<u32> {
        self.bytes().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.bytes().map(u64::from_le_bytes)
    }

    /// The header ends here.
    fn end(&self) -> Option<()> {
        self.0.is_empty().then_some(())
    }
}

/// Append a call's start frame header.
pub fn meta(buf: &mut Vec<u8>, m: &CallMeta) {
    buf.push(VERSION);
    let mut p = Put(buf);
    p.str(&m.call_id);
    p.str(&m.rollout_id);
    p.i64(m.sequence);
    p.str(m.wire_api.as_str());
    p.opt(m.route.as_deref(), Put::str);
    p.opt(m.model.as_deref(), Put::str);
    p.opt(m.upstream_model.as_deref(), Put::str);
    p.bool(m.stream);
    p.i64(m.received_at);
    p.opt(m.user_agent.as_deref(), Put::str);
    p.opt(m.upstream_api.map(|a| a.as_str()), Put::str);
    p.u32(m.attempt);
    p.opt(m.attempt_of, Put::i64);
    p.bool(m.side_call);
}

/// Append a call's end frame header.
pub fn outcome(buf: &mut Vec<u8>, c: &CallOutcome) {
    buf.push(VERSION);
    let mut p = Put(buf);
    p.str(&c.call_id);
    p.str(c.status.as_str());
    p.opt(c.http_status.map(i64::from), Put::i64);
    p.opt(c.failure_class.map(|f| f.as_str()), Put::str);
    p.opt(c.failure_message.as_deref(), Put::str);
    p.opt(c.first_byte_at, Put::i64);
    p.i64(c.done_at);
    p.opt(c.replica.as_deref(), Put::str);
    p.bool(c.repinned);
    p.opt(c.policy_version, Put::i64);
    p.opt(c.policy_version_end, Put::i64);
    p.u32(c.resent);
    p.u32(u32::try_from(c.continued.len()).unwrap_or(u32::MAX));
    for k in &c.continued {
        p.0.extend_from_slice(&k.completion_tokens.to_le_bytes());
        p.i64(k.policy_version);
    }
}

/// A header's version byte, after which `read` reads it; JSON (a header
/// written before packed ones) goes to serde.
fn read<T: DeserializeOwned>(
    header: &[u8],
    read: impl FnOnce(&mut Take) -> Option<T>,
) -> Option<T> {
    match header.split_first()? {
        (b'{', _) => serde_json::from_slice(header).ok(),
        (&VERSION, rest) => {
            let mut t = Take(rest);
            let v = read(&mut t)?;
            t.end()?;
            Some(v)
        }
        _ => None,
    }
}

/// A call's start frame header; `None` when it is neither packed nor JSON.
pub fn read_meta(header: &[u8]) -> Option<CallMeta> {
    read(header, |t| {
        Some(CallMeta {
            call_id: t.string()?,
            rollout_id: t.string()?,
            sequence: t.i64()?,
            wire_api: t.named()?,
            route: t.opt(Take::string)?,
            model: t.opt(Take::string)?,
            upstream_model: t.opt(Take::string)?,
            stream: t.tag()?,
            received_at: t.i64()?,
            user_agent: t.opt(Take::string)?,
            upstream_api: t.opt(Take::named)?,
            attempt: t.u32()?,
            attempt_of: t.opt(Take::i64)?,
            side_call: t.tag()?,
        })
    })
}

/// A call's end frame header; `None` when it is neither packed nor JSON.
pub fn read_outcome(header: &[u8]) -> Option<CallOutcome> {
    read(header, |t| {
        let call_id = t.string()?;
        let status = t.named()?;
        let http_status = match t.opt(Take::i64)? {
            Some(n) => Some(u16::try_from(n).ok()?),
            None => None,
        };
        let mut c = CallOutcome {
            call_id,
            status,
            http_status,
            failure_class: t.opt(Take::named)?,
            failure_message: t.opt(Take::string)?,
            first_byte_at: t.opt(Take::i64)?,
            done_at: t.i64()?,
            replica: t.opt(Take::string)?,
            repinned: t.tag()?,
            policy_version: t.opt(Take::i64)?,
            policy_version_end: t.opt(Take::i64)?,
            resent: t.u32()?,
            continued: Vec::new(),
        };
        let n = t.u32()?;
        for _ in 0..n {
            c.continued.push(Continued {
                completion_tokens: t.u64()?,
                policy_version: t.i64()?,
            });
        }
        Some(c)
    })
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

    fn all() -> (Vec<CallMeta>, Vec<CallOutcome>) {
        let apis = [
            WireApi::ChatCompletions,
            WireApi::Responses,
            WireApi::Completions,
            WireApi::Messages,
        ];
        let (mut metas, mut outcomes) = (Vec::new(), Vec::new());
        for full in [false, true] {
            metas.extend(apis.iter().map(|&api| meta_of(full, api)));
            let classes = FailureClass::ALL.iter().copied().map(Some);
            for class in classes.chain([None]) {
                for status in [CallStatus::Ok, CallStatus::Failed, CallStatus::Incomplete] {
                    outcomes.push(outcome_of(full, class, status));
                }
            }
        }
        (metas, outcomes)
    }

    /// Every field, set and unset, and every enum value comes back as it
    /// was written, from a packed header and from a JSON one.
    #[test]
    fn headers_read_back_packed_and_as_json() {
        let (metas, outcomes) = all();
        for m in metas {
            let mut packed = Vec::new();
            meta(&mut packed, &m);
            assert_eq!(packed[0], VERSION);
            assert_eq!(read_meta(&packed).as_ref(), Some(&m));
            let json = serde_json::to_vec(&m).unwrap();
            assert_eq!(read_meta(&json).as_ref(), Some(&m));
        }
        for c in outcomes {
            let mut packed = Vec::new();
            outcome(&mut packed, &c);
            assert_eq!(read_outcome(&packed).as_ref(), Some(&c));
            let json = serde_json::to_vec(&c).unwrap();
            assert_eq!(read_outcome(&json).as_ref(), Some(&c));
        }
    }

    /// A header cut short, grown, of an unknown version or enum name, or
    /// read as the other kind's, is `None`, never a panic.
    #[test]
    fn damaged_headers_are_none() {
        let (metas, outcomes) = all();
        let (mut m, mut c) = (Vec::new(), Vec::new());
        meta(&mut m, metas.last().unwrap());
        outcome(&mut c, outcomes.last().unwrap());
        for cut in 0..m.len() {
            assert!(read_meta(&m[..cut]).is_none(), "meta cut at {cut}");
        }
        for cut in 0..c.len() {
            assert!(read_outcome(&c[..cut]).is_none(), "outcome cut at {cut}");
        }
        let mut longer = m.clone();
        longer.push(0);
        assert!(read_meta(&longer).is_none());
        let mut version = m.clone();
        version[0] = VERSION + 1;
        assert!(read_meta(&version).is_none());
        assert!(read_outcome(&m).is_none() && read_meta(&c).is_none());
        // The wire API's name, renamed to one of the same length.
        let at = m.windows(5).position(|w| w == b"chat_").unwrap();
        m[at] = b'x';
        assert!(read_meta(&m).is_none());
    }

    proptest::proptest! {
        /// Arbitrary bytes behind the version byte never panic a reader.
        #[test]
        fn arbitrary_headers_never_panic(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let mut h = vec![VERSION];
            h.extend_from_slice(&data);
            let _ = (read_meta(&h), read_outcome(&h), read_meta(&data), read_outcome(&data));
        }
    }
}
