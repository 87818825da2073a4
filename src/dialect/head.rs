//! What the proxy reads of a request before it sends it, in one pass over
//! the body: the route's key (`model`), the answer's shape (`stream`), and
//! where the values lie that the row and the side-call rules look at
//! (`messages`, `tools`, `system`, `instructions`, and the first message
//! that names a role).
//!
//! A body in `serde_json`'s compact form (what JavaScript's
//! `JSON.stringify` and most SDKs send) is read by [`Scan`]; any other,
//! and any that holds what `Scan` leaves to `serde` (a `model` that is not
//! a plain string, a `stream` that is not a boolean), is read by `serde`,
//! whose answer, or error, is then the one given. Under callgrind at the
//! bench's 160-byte request, `serde` took 3.6k instructions per call.

use super::canonical::{Scan, Span};
use super::side_call::{FirstMessage, Shape};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

/// The head of a request body; each span is `None` when the value is
/// absent or `null`.
#[derive(Debug, Default, PartialEq)]
pub struct Head {
    pub model: Option<Value>,
    pub stream: Option<bool>,
    pub tools: Option<Span>,
    /// Messages' top-level system prompt.
    pub system: Option<Span>,
    /// Responses' system prompt.
    pub instructions: Option<Span>,
    /// Chat Completions' (and Messages') messages.
    pub messages: Option<Span>,
    /// Where the first message that names a role lies, when [`Scan`] read
    /// the body (`Some(None)`: no message does); see [`FirstMessage`].
    pub first_message: Option<Option<MessageAt>>,
}

/// Where a message's role (its string's content) and content (unless
/// absent or `null`) lie.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageAt {
    pub role: Span,
    pub content: Option<Span>,
}

impl Head {
    /// Read the head of `body`, which must be one JSON object.
    pub fn read(body: &[u8]) -> Result<Head, serde_json::Error> {
        match std::str::from_utf8(body) {
            Ok(text) => Head::read_text(text),
            // Not UTF-8, so not JSON: `serde` says where.
            Err(_) => by_serde(body),
        }
    }

    /// [`Head::read`] of a body already known to be UTF-8.
    pub fn read_text(body: &str) -> Result<Head, serde_json::Error> {
        match scan(body) {
            Some(h) => Ok(h),
            None => by_serde(body.as_bytes()),
        }
    }

    /// What the side-call rules look at: the texts of `body`, the body
    /// this head was read from.
    pub fn shape<'a>(&self, body: &'a str) -> Shape<'a> {
        let text = |span: &Option<Span>| body.get(span.clone()?);
        let first = |m: &MessageAt| {
            Some(FirstMessage {
                role: body.get(m.role.clone())?,
                content: match &m.content {
                    Some(c) => Some(body.get(c.clone())?),
                    None => None,
                },
            })
        };
        Shape {
            tools: text(&self.tools),
            system: text(&self.system),
            instructions: text(&self.instructions),
            messages: text(&self.messages),
            // A span outside `body` (a head read from another body) leaves
            // the search to `side_call`.
            first_message: match &self.first_message {
                Some(Some(m)) => first(m).map(Some),
                Some(None) => Some(None),
                None => None,
            },
        }
    }
}

fn scan(text: &str) -> Option<Head> {
    let mut s = Scan::new(text)?;
    let mut h = Head::default();
    s.object(|s, key| {
        let slot = match key {
            b"model" => {
                return match s.peek()? {
                    b'"' => {
                        h.model = Some(Value::String(s.string()??));
                        Some(())
                    }
                    b'n' => s.value().map(drop),
                    _ => None,
                };
            }
            b"stream" => {
                let v = s.value()?;
                h.stream = match s.text(v) {
                    "true" => Some(true),
                    "false" => Some(false),
                    "null" => None,
                    _ => return None,
                };
                return Some(());
            }
            b"tools" => &mut h.tools,
            b"system" => &mut h.system,
            b"instructions" => &mut h.instructions,
            b"messages" => {
                let (v, first) = messages(s)?;
                if s.text(v.clone()) != "null" {
                    h.messages = Some(v);
                    h.first_message = Some(first);
                }
                return Some(());
            }
            _ => return s.value().map(drop),
        };
        let v = s.value()?;
        *slot = (s.text(v.clone()) != "null").then_some(v);
        Some(())
    })?;
    s.done().then_some(h)
}

/// Read `messages`: where it lies, and its first message that names a
/// role, as `side_call`'s `serde` reading finds it: a value before it
/// that is not an object, or whose role is neither `null` nor a string
/// without escapes, ends the search with none, as does a `messages` that
/// is not an array.
fn messages(s: &mut Scan) -> Option<(Span, Option<MessageAt>)> {
    let start = s.at();
    if s.peek()? != b'[' {
        return Some((s.value()?, None));
    }
    let mut first: Option<Option<MessageAt>> = None;
    s.array(|s, _| {
        if first.is_some() {
            return s.value().map(drop);
        }
        if s.peek()? != b'{' {
            first = Some(None);
            return s.value().map(drop);
        }
        let (mut role, mut content, mut bad) = (None, None, false);
        s.object(|s, key| {
            let v = s.value()?;
            let t = s.text(v.clone());
            match key {
                b"role" if t == "null" => {}
                b"role" if t.starts_with('"') && !t.contains('\\') => {
                    role = Some(v.start + 1..v.end - 1);
                }
                b"role" => bad = true,
                b"content" if t != "null" => content = Some(v),
                _ => {}
            }
            Some(())
        })?;
        if bad {
            first = Some(None);
        } else if let Some(role) = role {
            first = Some(Some(MessageAt { role, content }));
        }
        Some(())
    })?;
    Some((start..s.at(), first.flatten()))
}

#[derive(Deserialize)]
struct Raw<'a> {
    model: Option<Value>,
    stream: Option<bool>,
    #[serde(borrow, default)]
    tools: Option<&'a RawValue>,
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
    #[serde(borrow, default)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow, default)]
    messages: Option<&'a RawValue>,
}

fn by_serde(body: &[u8]) -> Result<Head, serde_json::Error> {
    let r: Raw = serde_json::from_slice(body)?;
    let span = |v: Option<&RawValue>| {
        let t = v?.get();
        let start = (t.as_ptr() as usize).checked_sub(body.as_ptr() as usize)?;
        let end = start + t.len();
        (end <= body.len()).then_some(start..end)
    };
    Ok(Head {
        model: r.model,
        stream: r.stream,
        tools: span(r.tools),
        system: span(r.system),
        instructions: span(r.instructions),
        messages: span(r.messages),
        first_message: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn texts(body: &str) -> Option<[Option<String>; 4]> {
        let h = Head::read(body.as_bytes()).ok()?;
        let t = |s: &Option<Span>| body.get(s.clone()?).map(str::to_owned);
        Some([
            t(&h.tools),
            t(&h.system),
            t(&h.instructions),
            t(&h.messages),
        ])
    }

    #[test]
    fn compact_and_spaced_bodies_read_the_same() {
        let compact = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"h\u00e9 \n"}],"tools":[{"type":"function"}],"system":"s","instructions":null,"x":{"y":[1,2.5]}}"#;
        let h = Head::read(compact.as_bytes()).unwrap();
        assert_eq!(h.model, Some(Value::from("m")));
        assert_eq!(h.stream, Some(true));
        let [tools, system, instructions, messages] = texts(compact).unwrap();
        assert_eq!(tools.as_deref(), Some(r#"[{"type":"function"}]"#));
        assert_eq!(system.as_deref(), Some(r#""s""#));
        assert_eq!(instructions, None);
        assert_eq!(
            messages.as_deref(),
            Some(r#"[{"role":"user","content":"h\u00e9 \n"}]"#)
        );
        let spaced = r#" { "model" : "m" , "stream" : true , "messages" : [ 1 , 2 ] } "#;
        let h = Head::read(spaced.as_bytes()).unwrap();
        assert_eq!((h.model, h.stream), (Some(Value::from("m")), Some(true)));
        assert_eq!(texts(spaced).unwrap()[3].as_deref(), Some("[ 1 , 2 ]"));
    }

    #[test]
    fn what_scan_leaves_serde_answers() {
        // A model that is not a string is the caller's error to report.
        let h = Head::read(br#"{"model":7}"#).unwrap();
        assert_eq!(h.model, Some(Value::from(7)));
        let h = Head::read(br#"{"model":"a\"b","stream":null}"#).unwrap();
        assert_eq!((h.model, h.stream), (Some(Value::from("a\"b")), None));
        assert!(Head::read(br#"{"stream":"yes"}"#).is_err());
        assert!(Head::read(br#"{"model":"a","model":"b"}"#).is_err());
        assert!(Head::read(br#"{"model":"a"} x"#).is_err());
        assert!(Head::read(b"[1]").is_err());
        assert!(Head::read(b"{\"model\":\"\xff\"}").is_err());
        assert_eq!(Head::read(b"{}").unwrap(), Head::default());
    }

    proptest! {
        /// Scan and serde read every body alike, whichever reads it.
        #[test]
        fn scan_reads_what_serde_reads(
            model in prop_oneof![Just(None), Just(Some(Value::Null)), any::<String>().prop_map(|s| Some(Value::from(s))), any::<i64>().prop_map(|n| Some(Value::from(n)))],
            stream in prop_oneof![Just(None), Just(Some(Value::Null)), any::<bool>().prop_map(|b| Some(Value::from(b)))],
            messages in prop_oneof![Just(None), Just(Some(Value::Null)), "[a-z\\\\\" ]{0,12}".prop_map(|s| Some(serde_json::json!([{"role": "user", "content": s}])))],
            extra in "[a-z]{0,6}",
            pretty in any::<bool>(),
        ) {
            let mut o = serde_json::Map::new();
            if let Some(m) = model { o.insert("model".into(), m); }
            if !extra.is_empty() { o.insert(extra.clone(), Value::from(extra)); }
            if let Some(s) = stream { o.insert("stream".into(), s); }
            if let Some(m) = messages { o.insert("messages".into(), m); }
            let v = Value::Object(o);
            let body = if pretty { serde_json::to_vec_pretty(&v) } else { serde_json::to_vec(&v) }.unwrap();
            let mut fast = Head::read(&body).unwrap();
            let slow = by_serde(&body).unwrap();
            // Only the scan finds the first message on its way (side_call's
            // tests check it against serde's reading).
            prop_assert!(fast.first_message.is_none() || (!pretty && fast.messages.is_some()));
            fast.first_message = None;
            prop_assert_eq!(fast, slow);
        }
    }
}
