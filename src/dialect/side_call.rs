//! Side calls: calls a harness makes outside the agent's trajectory (a
//! title for the session, a summary, token counting). They are recorded
//! like any call and marked `side_call`, so the datasets can leave them out.
//!
//! A [`Rule`] says what one looks like: a system prompt that starts with a
//! known text, and (optionally) no tools offered. The rules are data: each
//! harness adapter lists its own, and the config may add more.

use super::head::Head;
use serde::Deserialize;
use serde_json::value::RawValue;

/// What a side call looks like.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// The system prompt, or one of its text blocks, starts with this (after
    /// leading whitespace): Claude Code sends its own header blocks first.
    pub system_prefix: String,
    /// `Some(false)`: only when the call offers no tools.
    pub tools: Option<bool>,
}

/// The parts of a request body a rule looks at, as their JSON texts
/// borrowed from the body (not parsed into a tree): a caller that already
/// reads the body's head fills it in the same pass ([`Head::shape`]).
#[derive(Default)]
pub struct Shape<'a> {
    pub tools: Option<&'a str>,
    /// Messages' top-level system prompt (a string or text blocks).
    pub system: Option<&'a str>,
    /// Responses' system prompt.
    pub instructions: Option<&'a str>,
    /// Chat Completions' (and Messages') messages.
    pub messages: Option<&'a str>,
    /// The first message that names a role, where the head's reader found
    /// it on its way (`Some(None)`: none does, as [`first_role`] would
    /// say); `None`: [`first_role`] reads it from `messages` when asked.
    pub first_message: Option<Option<FirstMessage<'a>>>,
}

/// The first message of a request's messages that names a role: the
/// role's text (a string without escapes), and the content's JSON text
/// unless it is absent or `null`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FirstMessage<'a> {
    pub role: &'a str,
    pub content: Option<&'a str>,
}

#[derive(Deserialize)]
struct Msg<'a> {
    role: Option<&'a str>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
}

/// The first message of `messages` (a JSON array) that names a role, by
/// `serde`, for a head that `Scan` did not read (which finds it on its
/// way). It reads message by message and stops there: the messages after
/// it, most of an agent's request, are not read at all.
fn first_role(messages: &str) -> Option<FirstMessage<'_>> {
    let mut rest = messages.trim_start().strip_prefix('[')?;
    loop {
        let mut one = serde_json::Deserializer::from_str(rest).into_iter::<Msg>();
        let m = one.next()?.ok()?;
        if let Some(role) = m.role {
            return Some(FirstMessage {
                role,
                content: m.content.map(RawValue::get),
            });
        }
        rest = rest
            .get(one.byte_offset()..)?
            .trim_start()
            .strip_prefix(',')?;
    }
}

#[derive(Deserialize)]
struct Block<'a> {
    /// A block without text reads as an empty one; one whose text is not
    /// a string (`null` included) leaves the prompt without texts.
    #[serde(borrow, default = "no_text")]
    text: &'a RawValue,
}

fn no_text() -> &'static RawValue {
    static EMPTY: std::sync::OnceLock<Box<RawValue>> = std::sync::OnceLock::new();
    EMPTY.get_or_init(|| RawValue::from_string("\"\"".to_owned()).unwrap_or_default())
}

/// The texts of a string, or of each of an array of text blocks, as the
/// JSON string tokens they are in the body (quotes and escapes included):
/// a system prompt is often many KB, and a rule reads only its start.
fn texts_of(text: &str) -> Vec<&str> {
    let text = text.trim();
    if text.starts_with('"') {
        return vec![text];
    }
    let Ok(blocks) = serde_json::from_str::<Vec<Block>>(text) else {
        return Vec::new();
    };
    let tokens: Option<Vec<&str>> = blocks
        .iter()
        .map(|b| Some(b.text.get()).filter(|t| t.starts_with('"')))
        .collect();
    tokens.unwrap_or_default()
}

/// Does the JSON string token `token`, decoded, start with `prefix` after
/// leading whitespace? It decodes only as far as the comparison needs.
fn starts_with(token: &str, prefix: &str) -> bool {
    let Some(inner) = token.strip_prefix('"').and_then(|t| t.strip_suffix('"')) else {
        return false;
    };
    let mut text = Unescape(inner.chars()).skip_while(|c| c.is_whitespace());
    prefix.chars().all(|p| text.next() == Some(p))
}

/// The characters of a JSON string's content, its escapes decoded; it
/// ends early at a malformed escape (or a lone surrogate, which `serde`
/// also refuses).
struct Unescape<'a>(std::str::Chars<'a>);

impl Unescape<'_> {
    fn hex(&mut self) -> Option<u32> {
        (0..4).try_fold(0, |n, _| Some(n * 16 + self.0.next()?.to_digit(16)?))
    }
}

impl Iterator for Unescape<'_> {
    type Item = char;

    fn next(&mut self) -> Option<char> {
        let c = self.0.next()?;
        if c != '\\' {
            return Some(c);
        }
        Some(match self.0.next()? {
            'n' => '\n',
            't' => '\t',
            'r' => '\r',
            'b' => '\u{8}',
            'f' => '\u{c}',
            '"' => '"',
            '\\' => '\\',
            '/' => '/',
            'u' => {
                let hi = self.hex()?;
                if (0xD800..0xDC00).contains(&hi) {
                    if (self.0.next()?, self.0.next()?) != ('\\', 'u') {
                        return None;
                    }
                    let lo = self.hex()?;
                    if !(0xDC00..0xE000).contains(&lo) {
                        return None;
                    }
                    char::from_u32(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))?
                } else {
                    char::from_u32(hi)?
                }
            }
            _ => return None,
        })
    }
}

impl<'a> Shape<'a> {
    fn has_tools(&self) -> bool {
        self.tools
            .is_some_and(|t| !matches!(t.trim(), "null" | "[]"))
    }

    /// The system prompt's texts (a string, or its blocks), wherever this
    /// API keeps it.
    fn system_prompt(&self) -> Option<Vec<&'a str>> {
        if let Some(s) = self.system.or(self.instructions) {
            return Some(texts_of(s));
        }
        let first = match self.first_message {
            Some(first) => first,
            None => first_role(self.messages?),
        }?;
        matches!(first.role, "system" | "developer")
            .then(|| first.content.map(texts_of).unwrap_or_default())
    }
}

/// Is the request (`body`, JSON) a side call by one of `rules`?
pub fn is_side_call(rules: &[Rule], body: &[u8]) -> bool {
    if rules.is_empty() {
        return false;
    }
    let Ok(text) = std::str::from_utf8(body) else {
        return false;
    };
    Head::read_text(text).is_ok_and(|h| matches(rules, &h.shape(text)))
}

/// Does a request of this shape match one of `rules`?
pub fn matches(rules: &[Rule], shape: &Shape) -> bool {
    // The tools condition first: it costs nothing, and an agent's turn
    // (which offers tools) fails every shipped rule on it, so its system
    // prompt is not looked for.
    let tools = shape.has_tools();
    let mut rules = rules
        .iter()
        .filter(|r| r.tools.is_none_or(|t| t == tools))
        .peekable();
    if rules.peek().is_none() {
        return false;
    }
    let Some(system) = shape.system_prompt() else {
        return false;
    };
    rules.any(|r| system.iter().any(|t| starts_with(t, &r.system_prefix)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules() -> Vec<Rule> {
        vec![Rule {
            system_prefix: "You are a title generator".into(),
            tools: Some(false),
        }]
    }

    #[test]
    fn a_title_generator_without_tools_is_a_side_call() {
        let chat = br#"{"model":"m","messages":[{"role":"system","content":"You are a title generator. You output ONLY a thread title."},{"role":"user","content":"hi"}]}"#;
        assert!(is_side_call(&rules(), chat));
        let with_tools = br#"{"tools":[{"type":"function"}],"messages":[{"role":"system","content":"You are a title generator."}]}"#;
        assert!(!is_side_call(&rules(), with_tools));
        let agent = br#"{"messages":[{"role":"system","content":"You are opencode"},{"role":"user","content":"x"}]}"#;
        assert!(!is_side_call(&rules(), agent));
        let blocks =
            br#"{"system":[{"type":"text","text":"  You are a title generator"}],"messages":[]}"#;
        assert!(is_side_call(&rules(), blocks));
        // Claude Code's header blocks come first.
        let later_block = br#"{"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=2"},{"type":"text","text":"You are a title generator"}],"tools":[],"messages":[]}"#;
        assert!(is_side_call(&rules(), later_block));
        let responses = br#"{"instructions":"You are a title generator","input":"x","tools":[]}"#;
        assert!(is_side_call(&rules(), responses));
        assert!(!is_side_call(&rules(), b"not json"));
        // Escapes in the prompt; messages before the first role, and any
        // after it, whatever their shape.
        let escaped = br#"{"messages":[{"content":"x"},{"role":"developer","content":"You are a title\u0020generator"},7,{"role":1}]}"#;
        assert!(is_side_call(&rules(), escaped));
        let user_first = br#"{"messages":[{"role":"user","content":"You are a title generator"},{"role":"system","content":"You are a title generator"}]}"#;
        assert!(!is_side_call(&rules(), user_first));
        assert!(!is_side_call(
            &rules(),
            br#"{"messages":[7,{"role":"system","content":"You are a title generator"}]}"#
        ));
        assert!(!is_side_call(&[], chat));
        // Whitespace between messages; no messages at all.
        let spaced = br#"{"messages": [ {"content":"x"} ,
            {"role":"system","content":"You are a title generator"} ]}"#;
        assert!(is_side_call(&rules(), spaced));
        assert!(!is_side_call(&rules(), br#"{"messages":[ ]}"#));
        // A block without text is an empty text; one with a null text
        // leaves the prompt without texts, as a failed parse did.
        let any = [Rule {
            system_prefix: String::new(),
            tools: None,
        }];
        assert!(is_side_call(&any, br#"{"system":[{"type":"text"}]}"#));
        assert!(!is_side_call(&any, br#"{"system":[{"text":null}]}"#));
        assert!(!is_side_call(&any, br#"{"system":[{"text":7}]}"#));
        // Messages that are not a list; a role with an escape, which
        // `serde` does not read as a role.
        assert!(!is_side_call(&any, br#"{"messages":"You"}"#));
        let escaped_role = br#"{"messages":[{"role":"syst\u0065m","content":"You"}]}"#;
        assert!(!is_side_call(&any, escaped_role));
    }

    /// The JSON string token of `s`, each character written raw or as a
    /// `\u` escape (a surrogate pair above the BMP) as `escape` says.
    fn token(s: &str, escape: &[bool]) -> String {
        let mut t = String::from("\"");
        for (i, c) in s.chars().enumerate() {
            let must = c == '"' || c == '\\' || c < ' ';
            if must || escape.get(i).copied().unwrap_or(false) {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    t.push_str(&format!("\\u{u:04x}"));
                }
            } else {
                t.push(c);
            }
        }
        t.push('"');
        t
    }

    /// What a message list may hold before and at its first role.
    const ELEMENTS: &[&str] = &[
        "7",
        "\"x\"",
        "[]",
        "null",
        "{}",
        r#"{"content":"x"}"#,
        r#"{"role":null,"content":"x"}"#,
        r#"{"role":"system","content":"You are a title generator"}"#,
        r#"{"content":null,"role":"developer"}"#,
        r#"{"role":"system","content":[{"type":"text","text":"You are"}],"name":"n"}"#,
        r#"{"role":"us\u0065r","content":"x"}"#,
        r#"{"role":"sys\ntem","content":"x"}"#,
        r#"{"role":1}"#,
        r#"{"role":{"a":1},"content":"x"}"#,
        r#"{"role":"user","content":{"a":[1,{"b":null}]}}"#,
    ];

    proptest::proptest! {
        /// The head's reader finds the first message that names a role
        /// exactly where `serde`'s reading does, or says there is none
        /// where it finds none; and the rules then match alike.
        #[test]
        fn the_scanned_first_message_is_serdes(
            picks in proptest::collection::vec(0..ELEMENTS.len(), 0..5),
            tools in proptest::bool::ANY,
        ) {
            let list: Vec<&str> = picks.iter().map(|&i| ELEMENTS[i]).collect();
            let tools = if tools { r#","tools":[{"type":"function"}]"# } else { "" };
            let body = format!(r#"{{"model":"m","messages":[{}]{tools}}}"#, list.join(","));
            let head = Head::read_text(&body).unwrap();
            let shape = head.shape(&body);
            // `\u0065` is not `serde_json`'s form: `serde` reads that body.
            proptest::prop_assert_eq!(shape.first_message.is_some(), !body.contains("\\u"), "{}", body);
            if let Some(first) = shape.first_message {
                proptest::prop_assert_eq!(first, first_role(shape.messages.unwrap()), "{}", body);
            }
            let unread = Shape { first_message: None, ..head.shape(&body) };
            proptest::prop_assert_eq!(shape.system_prompt(), unread.system_prompt());
            let any = [Rule { system_prefix: String::new(), tools: None }];
            for rules in [&rules()[..], &any[..]] {
                proptest::prop_assert_eq!(matches(rules, &shape), matches(rules, &unread));
            }
        }

        /// A prefix is matched on the decoded text, as `serde` decodes it.
        #[test]
        fn starts_with_decodes_as_serde_does(
            s in "[ \t\n]{0,3}[a-zé\"\\\\\n😀 ]{0,12}",
            prefix in "[a-zé\"\\\\\n😀 ]{0,4}",
            escape in proptest::collection::vec(proptest::bool::ANY, 16),
        ) {
            let t = token(&s, &escape);
            let decoded: String = serde_json::from_str(&t).unwrap();
            proptest::prop_assert_eq!(&decoded, &s);
            proptest::prop_assert_eq!(starts_with(&t, &prefix), s.trim_start().starts_with(&prefix));
            let short = serde_json::to_string(&s).unwrap();
            proptest::prop_assert_eq!(starts_with(&short, &prefix), s.trim_start().starts_with(&prefix));
        }
    }

    #[test]
    fn malformed_escapes_and_lone_surrogates_match_nothing() {
        for t in [r#""\ud800x""#, r#""\udc00""#, r#""\q""#, r#""\u12""#, "abc"] {
            assert!(!starts_with(t, "x") && !starts_with(t, "a"), "{t}");
        }
        assert!(starts_with(r#""\ud83d\ude00!""#, "😀!"));
    }
}
