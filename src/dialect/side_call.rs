//! Side calls: calls a harness makes outside the agent's trajectory (a
//! title for the session, a summary, token counting). They are recorded
//! like any call and marked `side_call`, so the datasets can leave them out.
//!
//! A [`Rule`] says what one looks like: a system prompt that starts with a
//! known text, and (optionally) no tools offered. The rules are data: each
//! harness adapter lists its own, and the config may add more.

use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

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

/// The parts of a request body a rule looks at, borrowed from the body
/// (not parsed into a tree): a caller that already reads the body's head
/// fills it in the same pass.
#[derive(Deserialize, Default)]
pub struct Shape<'a> {
    #[serde(borrow, default)]
    pub tools: Option<&'a RawValue>,
    /// Messages' top-level system prompt (a string or text blocks).
    #[serde(borrow, default)]
    pub system: Option<&'a RawValue>,
    /// Responses' system prompt.
    #[serde(borrow, default)]
    pub instructions: Option<&'a RawValue>,
    /// Chat Completions' (and Messages') messages.
    #[serde(borrow, default)]
    pub messages: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Msg<'a> {
    role: Option<&'a str>,
    #[serde(borrow)]
    content: Option<&'a RawValue>,
}

/// The first message of `messages` (a JSON array) that names a role. It
/// reads message by message and stops there: the messages after it, most
/// of an agent's request, are not read at all (skipping them would still
/// scan every byte).
fn first_role(messages: &str) -> Option<Msg<'_>> {
    let mut rest = messages.trim_start().strip_prefix('[')?;
    loop {
        let mut one = serde_json::Deserializer::from_str(rest).into_iter::<Msg>();
        let m = one.next()?.ok()?;
        if m.role.is_some() {
            return Some(m);
        }
        rest = rest
            .get(one.byte_offset()..)?
            .trim_start()
            .strip_prefix(',')?;
    }
}

#[derive(Deserialize)]
struct Block<'a> {
    #[serde(borrow, default)]
    text: Cow<'a, str>,
}

/// The text of a string, or of each of an array of text blocks, borrowed
/// from the body where it has no escapes (a system prompt is often many KB).
fn texts_of(v: &RawValue) -> Vec<Cow<'_, str>> {
    let text = v.get();
    if let Ok(s) = serde_json::from_str::<&str>(text) {
        return vec![Cow::Borrowed(s)];
    }
    if let Ok(s) = serde_json::from_str::<String>(text) {
        return vec![Cow::Owned(s)];
    }
    serde_json::from_str::<Vec<Block>>(text)
        .map(|b| b.into_iter().map(|b| b.text).collect())
        .unwrap_or_default()
}

impl<'a> Shape<'a> {
    fn has_tools(&self) -> bool {
        self.tools
            .is_some_and(|t| !matches!(t.get().trim(), "null" | "[]"))
    }

    /// The system prompt's texts (a string, or its blocks), wherever this
    /// API keeps it.
    fn system_prompt(&self) -> Option<Vec<Cow<'a, str>>> {
        if let Some(s) = self.system.or(self.instructions) {
            return Some(texts_of(s));
        }
        let first = first_role(self.messages?.get())?;
        matches!(first.role, Some("system" | "developer"))
            .then(|| first.content.map(texts_of).unwrap_or_default())
    }
}

/// Is the request (`body`, JSON) a side call by one of `rules`?
pub fn is_side_call(rules: &[Rule], body: &[u8]) -> bool {
    if rules.is_empty() {
        return false;
    }
    serde_json::from_slice::<Shape>(body).is_ok_and(|s| matches(rules, &s))
}

/// Does a request of this shape match one of `rules`?
pub fn matches(rules: &[Rule], shape: &Shape) -> bool {
    if rules.is_empty() {
        return false;
    }
    let Some(system) = shape.system_prompt() else {
        return false;
    };
    rules.iter().any(|r| {
        system
            .iter()
            .any(|t| t.trim_start().starts_with(r.system_prefix.as_str()))
            && r.tools.is_none_or(|t| t == shape.has_tools())
    })
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
    }
}
