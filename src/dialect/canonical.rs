//! Is a JSON text already in the form `serde_json` writes it?
//!
//! A row stores an answer's message as compact JSON: the text that parsing
//! it into a `Value` and writing that out gives. Most upstreams already
//! send exactly that text, and then the row keeps their bytes instead of
//! building a tree and writing it out again (4 % of the shard thread's
//! instructions on the bench's small answer under callgrind, growing with
//! the answer; the check itself reads each byte once).
//!
//! [`canonical`] says yes only when the round trip provably changes
//! nothing. Given valid JSON (the caller's text was read as a `RawValue`,
//! which checks that), the text is what `serde_json` (with
//! `preserve_order`) writes back when:
//! - no whitespace stands between tokens;
//! - every escape in a string is one `serde_json` writes itself: `\"`,
//!   `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, or `\u00xx` (lowercase hex) for
//!   another control character, never `\/` or `\u` for any other
//!   character;
//! - every number is an integer of at most 18 digits other than `-0` (a
//!   fraction or exponent may be written back otherwise: `1.0e0` as `1.0`);
//! - no object repeats a key (the tree keeps the last value at the first
//!   key's place).
//!
//! Anything else says no, and the caller takes the tree's way.

/// Where a value lies in the text, as a byte range.
pub type Span = std::ops::Range<usize>;

/// What [`canonical`] found in a canonical object.
#[derive(Debug, Default, PartialEq)]
pub struct Canonical {
    /// Where the top-level object's `tool_calls` value is, unless absent
    /// or `null`.
    pub tool_calls: Option<Span>,
}

/// The bytes a short escape stands for, in `serde_json`'s own choice.
const SHORT: &[u8] = b"\"\\bfnrt";

/// `Some` when `text` (valid JSON) is an object `serde_json` would write
/// back byte for byte; see the module's comment.
pub fn canonical(text: &str) -> Option<Canonical> {
    let b = text.as_bytes();
    if b.first() != Some(&b'{') {
        return None;
    }
    let mut out = Canonical::default();
    // Each open container: for an object, the keys seen so far.
    let mut open: Vec<Option<Vec<&[u8]>>> = Vec::new();
    let mut i = 0;
    // The top-level value now being read is `tool_calls`'s.
    let mut tool_calls_at: Option<usize> = None;
    while i < b.len() {
        match b[i] {
            b'{' => {
                open.push(Some(Vec::new()));
                i += 1;
            }
            b'[' => {
                open.push(None);
                i += 1;
            }
            b'}' | b']' => {
                open.pop();
                i += 1;
                end_value(&mut out, &mut tool_calls_at, open.len(), b, i);
            }
            b',' => i += 1,
            b':' => i += 1,
            b'"' => {
                let end = string_end(b, i)?;
                // A key is followed by `:` (no whitespace comes between).
                let is_key = b.get(end) == Some(&b':');
                if is_key {
                    let key = &b[i + 1..end - 1];
                    let Some(Some(keys)) = open.last_mut() else {
                        return None;
                    };
                    if keys.contains(&key) {
                        return None;
                    }
                    keys.push(key);
                    if open.len() == 1 && key == b"tool_calls" {
                        tool_calls_at = Some(end + 1);
                    }
                } else {
                    end_value(&mut out, &mut tool_calls_at, open.len(), b, end);
                }
                i = end;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                i += usize::from(b[i] == b'-');
                let digits = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
                i += digits;
                if digits == 0 || digits > 18 || &b[start..i] == b"-0" {
                    return None;
                }
                if matches!(b.get(i), Some(b'.' | b'e' | b'E')) {
                    return None;
                }
                end_value(&mut out, &mut tool_calls_at, open.len(), b, i);
            }
            b't' | b'f' | b'n' => {
                let word: &[u8] = match b[i] {
                    b't' => b"true",
                    b'f' => b"false",
                    _ => b"null",
                };
                if !b[i..].starts_with(word) {
                    return None;
                }
                let null = word == b"null";
                i += word.len();
                if null && open.len() == 1 && tool_calls_at.is_some() {
                    tool_calls_at = None;
                } else {
                    end_value(&mut out, &mut tool_calls_at, open.len(), b, i);
                }
            }
            // Whitespace between tokens, or anything else.
            _ => return None,
        }
    }
    open.is_empty().then_some(out)
}

/// A value that ends at `end` with `depth` containers still open: when it
/// is the top-level object's `tool_calls`, note where it is.
fn end_value(
    out: &mut Canonical,
    tool_calls_at: &mut Option<usize>,
    depth: usize,
    b: &[u8],
    end: usize,
) {
    if depth != 1 {
        return;
    }
    if let Some(start) = tool_calls_at.take() {
        if start < end && end <= b.len() {
            out.tool_calls = Some(start..end);
        }
    }
}

/// The index just past the string that opens at `start`, or `None` when
/// it holds an escape `serde_json` would not write.
fn string_end(b: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        match b.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => {
                let e = *b.get(i + 1)?;
                if SHORT.contains(&e) {
                    i += 2;
                } else if e == b'u' {
                    let hex = b.get(i + 2..i + 6)?;
                    if !hex.starts_with(b"00") || !lower_hex(hex[2]) || !lower_hex(hex[3]) {
                        return None;
                    }
                    let v = u8::from_str_radix(std::str::from_utf8(&hex[2..]).ok()?, 16).ok()?;
                    // `serde_json` writes these five short, and nothing
                    // from 0x20 up as an escape.
                    if v >= 0x20 || matches!(v, 0x08 | 0x09 | 0x0a | 0x0c | 0x0d) {
                        return None;
                    }
                    i += 6;
                } else {
                    return None;
                }
            }
            _ => i += 1,
        }
    }
}

fn lower_hex(c: u8) -> bool {
    c.is_ascii_digit() || (b'a'..=b'f').contains(&c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    /// What `serde_json` writes back for `text`.
    fn round_trip(text: &str) -> Option<String> {
        serde_json::from_str::<Value>(text)
            .ok()
            .map(|v| serde_json::to_string(&v).unwrap())
    }

    /// Canonical texts are their own round trip, and their `tool_calls`
    /// span is the value's text.
    fn check(text: &str) {
        if serde_json::from_str::<&serde_json::value::RawValue>(text).is_err() {
            return;
        }
        if let Some(c) = canonical(text) {
            assert_eq!(round_trip(text).as_deref(), Some(text), "{text}");
            let v: Value = serde_json::from_str(text).unwrap();
            let want = v
                .get("tool_calls")
                .filter(|t| !t.is_null())
                .map(|t| t.to_string());
            let got = c.tool_calls.map(|s| text[s].to_owned());
            assert_eq!(got, want, "{text}");
        }
    }

    #[test]
    fn what_serde_json_writes_is_canonical() {
        for text in [
            r#"{"role":"assistant","content":"hi"}"#,
            r#"{"role":"assistant","content":null,"tool_calls":[{"id":"t","type":"function","function":{"name":"bash","arguments":"{\"cmd\":\"ls\\n\"}"}}]}"#,
            r#"{"content":"tab\there\u0001\u001f é ☃ \"q\" \\ \/x"}"#,
            r#"{"a":{},"b":[],"c":[1,-2,true,false,null],"tool_calls":null}"#,
            r#"{"tool_calls":7,"x":{"tool_calls":[1]}}"#,
            r#"{"tool_calls":"s"}"#,
            r#"{"tool_calls":{"a":[{"b":null}]},"z":0}"#,
        ] {
            check(text);
        }
        assert!(canonical(r#"{"role":"assistant","content":"hi"}"#).is_some());
        let t = r#"{"tool_calls":[{"a":1}],"content":"x"}"#;
        assert_eq!(canonical(t).unwrap().tool_calls, Some(14..23));
        assert_eq!(
            canonical(r#"{"tool_calls":null}"#).unwrap().tool_calls,
            None
        );
        assert_eq!(
            canonical(r#"{"x":{"tool_calls":[1]}}"#).unwrap().tool_calls,
            None
        );
    }

    #[test]
    fn texts_serde_json_writes_otherwise_are_not() {
        for text in [
            r#"{ "a":1}"#,
            "{\"a\":1}\n",
            r#"{"a":"\/"}"#,
            r#"{"a":"\u00e9"}"#,
            r#"{"a":"\u000A"}"#,
            r#"{"a":"\u000a"}"#,
            r#"{"a":"\u001F"}"#,
            r#"{"a":"\u0041"}"#,
            r#"{"a":1.0}"#,
            r#"{"a":1e3}"#,
            r#"{"a":-0}"#,
            r#"{"a":12345678901234567890}"#,
            r#"{"a":1,"a":2}"#,
            r#"{"b":{"a":1,"a":2}}"#,
            r#"[1]"#,
            r#""s""#,
            r#"null"#,
        ] {
            assert!(canonical(text).is_none(), "{text}");
        }
        // Keys repeated in different objects are fine.
        assert!(canonical(r#"{"a":{"a":1},"b":[{"a":1},{"a":2}]}"#).is_some());
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "[a-c\"\\\\/\u{0}-\u{1f}é☃ ]{0,6}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec(("(tool_calls|[a-c]{1,2})", inner), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Whatever `serde_json` writes is read back as canonical or not,
        /// and a canonical verdict is never wrong.
        #[test]
        fn canonical_texts_are_their_own_round_trip(v in json(), pretty in any::<bool>()) {
            let obj = match v {
                Value::Object(_) => v,
                other => serde_json::json!({ "tool_calls": other }),
            };
            let text = if pretty {
                serde_json::to_string_pretty(&obj).unwrap()
            } else {
                serde_json::to_string(&obj).unwrap()
            };
            check(&text);
        }

        /// Raw texts with any escape, number and spacing JSON allows: any
        /// the scanner calls canonical are their own round trip.
        #[test]
        fn scanned_texts_are_never_wrongly_canonical(s in prop_oneof![
            r#"\{"(a|b|tool_calls)":"(\\["\\/bfnrtu]|\\u00[0-9a-fA-F]{2}|\\u[0-9a-f]{4}|[a-z é]){0,3}"(,"(a|b)":(1|null|\[\]))?\}"#,
            r#"\{"a":-?[0-9]{1,20}(\.[0-9]{1,3})?([eE][+-]?[0-9]{1,3})?\}"#,
            r#"\{ ?"(a|tool_calls)" ?: ?(\[ ?1 ?\]|\{"a":1,"(a|b)":2\}|null|true) ?\}"#,
            "\\{[\"a:,\\[\\]{}\\\\u0-9eE.+\\- tnulrf/]{0,24}\\}",
        ]) {
            check(&s);
        }
    }
}
