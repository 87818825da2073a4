//! JSON text in the form `serde_json` writes it, read in one pass.
//!
//! A row stores an answer's message as compact JSON: the text that parsing
//! it into a `Value` and writing that out gives. Most upstreams already
//! send exactly that text, and then the row keeps their bytes instead of
//! building a tree and writing it out again; and the few fields a row
//! reads of a whole answer are found by [`Scan`] in the same single pass
//! (`chat::assemble_whole`), instead of by `serde`'s two passes and the
//! trees of its `Value` fields (14.7k of the shard thread's instructions
//! per call on the bench's 350-byte answer under callgrind).
//!
//! [`Scan`] reads a text only while it is valid JSON that `serde_json`
//! (with `preserve_order`) writes back byte for byte, that is:
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
//! Anything else, or anything deeper than [`MAX_DEPTH`] or an object of
//! more than [`MAX_KEYS`] keys (the repeated-key check is quadratic), stops
//! it with `None`, and the caller takes `serde`'s way.

/// Where a value lies in the text, as a byte range.
pub type Span = std::ops::Range<usize>;

/// Containers deeper than this are left to `serde` (whose own limit is 128).
pub const MAX_DEPTH: usize = 128;

/// Objects with more keys than this are left to `serde`.
pub const MAX_KEYS: usize = 64;

/// What [`canonical`] found in a canonical object.
#[derive(Debug, Default, PartialEq)]
pub struct Canonical {
    /// Where the top-level object's `tool_calls` value is, unless absent
    /// or `null`.
    pub tool_calls: Option<Span>,
}

/// The bytes a short escape stands for, in `serde_json`'s own choice.
const SHORT: &[u8] = b"\"\\bfnrt";

/// `Some` when `text` is a JSON object `serde_json` would write back byte
/// for byte; see the module's comment.
pub fn canonical(text: &str) -> Option<Canonical> {
    let mut s = Scan::new(text)?;
    let tool_calls = s.object_field(b"tool_calls")?;
    s.done().then_some(Canonical { tool_calls })
}

/// A reader of one JSON text in `serde_json`'s form, a token at a time.
/// Every method reads one whole value and leaves the reader just past it,
/// or returns `None`, after which the reader is spent.
pub struct Scan<'a> {
    text: &'a str,
    at: usize,
    depth: usize,
    /// The keys of every open object, innermost last.
    keys: Vec<&'a [u8]>,
}

impl<'a> Scan<'a> {
    /// `None` when `text` holds a control byte: JSON has them only
    /// escaped in strings or as whitespace, and `serde_json` writes no
    /// whitespace. Checked once here, the strings are then read a run at
    /// a time.
    pub fn new(text: &'a str) -> Option<Self> {
        let control = |chunk: &[u8]| chunk.iter().fold(false, |any, &c| any | (c < 0x20));
        if text.as_bytes().chunks(64).any(control) {
            return None;
        }
        Some(Scan {
            text,
            at: 0,
            depth: 0,
            // Enough for most answers' open objects without growing.
            keys: Vec::with_capacity(32),
        })
    }

    /// The whole text has been read.
    pub fn done(&self) -> bool {
        self.at == self.text.len()
    }

    /// Where the reader is: the end of what it has read.
    pub fn at(&self) -> usize {
        self.at
    }

    /// The next byte, which says what kind of value comes next.
    pub fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    /// The text of a span this reader returned (spans start and end at
    /// ASCII tokens).
    pub fn text(&self, span: Span) -> &'a str {
        self.text.get(span).unwrap_or_default()
    }

    fn eat(&mut self, c: u8) -> bool {
        let yes = self.peek() == Some(c);
        self.at += usize::from(yes);
        yes
    }

    /// Read any value; where it lies.
    pub fn value(&mut self) -> Option<Span> {
        let start = self.at;
        let b = self.text.as_bytes();
        match *b.get(start)? {
            b'{' => self.object(|s, _| s.value().map(drop))?,
            b'[' => self.array(|s, _| s.value().map(drop))?,
            b'"' => self.at = string_end(b, start)?,
            b'-' | b'0'..=b'9' => self.at = number_end(b, start)?,
            c => {
                let word: &[u8] = match c {
                    b't' => b"true",
                    b'f' => b"false",
                    b'n' => b"null",
                    _ => return None,
                };
                if !b[start..].starts_with(word) {
                    return None;
                }
                self.at += word.len();
            }
        }
        Some(start..self.at)
    }

    /// Read a value, and its integer when it is one (`Value::as_i64`).
    pub fn int(&mut self) -> Option<Option<i64>> {
        let v = self.value()?;
        Some(self.text(v).parse().ok())
    }

    /// Read a value, and its text when it is a string (`Value::as_str`).
    pub fn string(&mut self) -> Option<Option<String>> {
        let v = self.value()?;
        let t = self.text(v);
        Some(
            match t.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
                Some(inner) if !inner.contains('\\') => Some(inner.to_owned()),
                Some(_) => serde_json::from_str(t).ok(),
                None => None,
            },
        )
    }

    /// Read an object, and where its value at `key` is, unless absent or
    /// `null`.
    pub fn object_field(&mut self, key: &[u8]) -> Option<Option<Span>> {
        let mut found = None;
        self.object(|s, k| {
            let v = s.value()?;
            if k == key && s.text(v.clone()) != "null" {
                found = Some(v);
            }
            Some(())
        })?;
        Some(found)
    }

    /// Read an object: after each key, `on` reads that key's value.
    pub fn object(&mut self, mut on: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.open(b'{')?;
        let base = self.keys.len();
        if !self.eat(b'}') {
            loop {
                let b = self.text.as_bytes();
                if self.peek()? != b'"' {
                    return None;
                }
                let end = string_end(b, self.at)?;
                let key = &b[self.at + 1..end - 1];
                let seen = &self.keys[base..];
                if seen.len() >= MAX_KEYS || seen.contains(&key) {
                    return None;
                }
                self.keys.push(key);
                self.at = end;
                if !self.eat(b':') {
                    return None;
                }
                on(self, key)?;
                if self.eat(b'}') {
                    break;
                }
                if !self.eat(b',') {
                    return None;
                }
            }
        }
        self.keys.truncate(base);
        self.depth -= 1;
        Some(())
    }

    /// Read an array: `on` reads each element, given its index.
    pub fn array(&mut self, mut on: impl FnMut(&mut Self, usize) -> Option<()>) -> Option<()> {
        self.open(b'[')?;
        if !self.eat(b']') {
            let mut n = 0;
            loop {
                on(self, n)?;
                n += 1;
                if self.eat(b']') {
                    break;
                }
                if !self.eat(b',') {
                    return None;
                }
            }
        }
        self.depth -= 1;
        Some(())
    }

    fn open(&mut self, c: u8) -> Option<()> {
        if self.depth >= MAX_DEPTH || !self.eat(c) {
            return None;
        }
        self.depth += 1;
        Some(())
    }
}

/// The index just past the number that starts at `start`, or `None` when
/// it is not an integer `serde_json` writes back the same.
fn number_end(b: &[u8], start: usize) -> Option<usize> {
    let from = start + usize::from(b[start] == b'-');
    let digits = b
        .get(from..)?
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    let end = from + digits;
    let leading_zero = digits > 1 && b[from] == b'0';
    if digits == 0 || digits > 18 || leading_zero || &b[start..end] == b"-0" {
        return None;
    }
    if matches!(b.get(end), Some(b'.' | b'e' | b'E')) {
        return None;
    }
    Some(end)
}

/// The index just past the string that opens at `start`, or `None` when
/// it is not valid or holds an escape `serde_json` would not write. The
/// text holds no control byte ([`Scan::new`]).
fn string_end(b: &[u8], start: usize) -> Option<usize> {
    let mut i = start + 1;
    loop {
        i = quote_or_backslash(b, i)?;
        match b[i] {
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
            _ => return None,
        }
    }
}

/// How far [`quote_or_backslash`] looks a word at a time before it hands
/// the rest to `memchr`: an agent's history escapes a newline or a quote
/// every few dozen bytes, and a call into `memchr` for each such run cost
/// more than the run (138k instructions per call on an 18 KB history of
/// code, against 4k for the same bytes in one long run).
const SHORT_RUN: usize = 64;

/// The index of the first `"` or `\` in `b` from `i`: the first
/// [`SHORT_RUN`] bytes eight at a time, the rest by `memchr`.
fn quote_or_backslash(b: &[u8], mut i: usize) -> Option<usize> {
    const ONES: u64 = u64::from_le_bytes([1; 8]);
    const HIGH: u64 = u64::from_le_bytes([0x80; 8]);
    // The high bit of each zero byte of `x`; a borrow may also mark bytes
    // after the first zero, never one before it, so the lowest mark is
    // exact.
    let zeros = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    let end = b.len().min(i.saturating_add(SHORT_RUN));
    while let Some(word) = b.get(i..end).and_then(|w| w.first_chunk::<8>()) {
        let w = u64::from_le_bytes(*word);
        let hits = zeros(w ^ (ONES * u64::from(b'"'))) | zeros(w ^ (ONES * u64::from(b'\\')));
        if hits != 0 {
            return Some(i + hits.trailing_zeros() as usize / 8);
        }
        i += 8;
    }
    Some(i + memchr::memchr2(b'"', b'\\', b.get(i..)?)?)
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

    /// Canonical texts are valid JSON and their own round trip, and their
    /// `tool_calls` span is the value's text.
    fn check(text: &str) {
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
            // Not JSON at all.
            r#"{"a":01}"#,
            r#"{"a":-}"#,
            "{\"a\":\"\u{1}\"}",
            r#"{"a":1,}"#,
            r#"{"a":[1,]}"#,
            r#"{"a"}"#,
            r#"{"a":1}}"#,
            r#"{"a":tru}"#,
            r#"{"a":"x}"#,
            r#"{"a":[1}"#,
            r#"[1]"#,
            r#""s""#,
            r#"null"#,
        ] {
            assert!(canonical(text).is_none(), "{text}");
        }
        // Keys repeated in different objects are fine.
        assert!(canonical(r#"{"a":{"a":1},"b":[{"a":1},{"a":2}]}"#).is_some());
    }

    #[test]
    fn deep_or_wide_texts_are_left_to_serde() {
        let deep = format!(
            "{{\"a\":{}{}}}",
            "[".repeat(MAX_DEPTH),
            "]".repeat(MAX_DEPTH)
        );
        assert!(canonical(&deep).is_none());
        let fits = format!(
            "{{\"a\":{}{}}}",
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        assert!(canonical(&fits).is_some());
        let keys = |n: usize| {
            let kv: Vec<String> = (0..n).map(|i| format!("\"k{i}\":{i}")).collect();
            format!("{{{}}}", kv.join(","))
        };
        assert!(canonical(&keys(MAX_KEYS)).is_some());
        assert!(canonical(&keys(MAX_KEYS + 1)).is_none());
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

        /// Word at a time or by `memchr`, the first quote or backslash
        /// found is the first there is.
        #[test]
        fn quote_or_backslash_finds_the_first(b in proptest::collection::vec(prop_oneof![Just(b'"'), Just(b'\\'), Just(b'#'), Just(b']'), any::<u8>()], 0..200), from in 0usize..200) {
            let want = b.get(from..).and_then(|r| r.iter().position(|&c| c == b'"' || c == b'\\')).map(|p| from + p);
            prop_assert_eq!(quote_or_backslash(&b, from), want);
        }
    }
}
