//! Tool calls in the model's own output: Hermes-format blocks,
//! `<tool_call>{"name": …, "arguments": {…}}</tool_call>`, the format
//! [`super::template`] teaches templates without tool support and that Qwen,
//! Hermes and SmolLM-family templates use natively.
//!
//! [`Splitter`] separates a streamed answer into text that can go to the
//! harness at once and text held back because it is (or may become) a tool
//! call; [`parse`] reads the held-back part when the answer ends.

use serde_json::Value;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// One parsed call: the function name and its arguments as a JSON string.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// The answer split into its text and its tool calls. A block that does not
/// parse as a call stays in the text, so nothing the model wrote is lost.
pub fn parse(text: &str) -> (String, Vec<ToolCall>) {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(OPEN) {
        let (before, after) = rest.split_at(start);
        let body_start = &after[OPEN.len()..];
        let (body, next, whole) = match body_start.find(CLOSE) {
            Some(end) => (
                &body_start[..end],
                &body_start[end + CLOSE.len()..],
                &after[..OPEN.len() + end + CLOSE.len()],
            ),
            None => (body_start, "", after),
        };
        content.push_str(before);
        match call(body) {
            Some(c) => calls.push(c),
            None => content.push_str(whole),
        }
        rest = next;
    }
    content.push_str(rest);
    if !calls.is_empty() {
        content = content.trim().to_owned();
    }
    (content, calls)
}

fn call(body: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_owned();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        None | Some(Value::Null) => "{}".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    };
    Some(ToolCall { name, arguments })
}

/// Streams text until a tool call may begin, then holds everything back.
#[derive(Debug, Default)]
pub struct Splitter {
    /// Bytes of the answer already released as text.
    released: usize,
    /// A `<tool_call>` tag has started: the rest is held for [`parse`].
    holding: bool,
}

impl Splitter {
    /// Given the whole answer so far, the new text that can be released now.
    pub fn release<'a>(&mut self, text: &'a str) -> &'a str {
        if self.holding {
            return "";
        }
        let pending = &text[self.released..];
        let upto = match pending.find(OPEN) {
            Some(i) => {
                self.holding = true;
                i
            }
            // Hold back a tail that could be the start of the tag.
            None => (1..OPEN.len())
                .rev()
                .find(|&k| pending.ends_with(&OPEN[..k]))
                .map_or(pending.len(), |k| pending.len() - k),
        };
        let out = &pending[..upto];
        self.released += upto;
        out
    }

    /// The text not yet released, once the answer is complete.
    pub fn rest<'a>(&self, text: &'a str) -> &'a str {
        &text[self.released.min(text.len())..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_calls_and_keeps_the_text() {
        let (text, calls) = parse(
            "Let me look.\n<tool_call>\n{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la\"}}\n</tool_call>\n<tool_call>{\"name\":\"read\",\"arguments\":\"{\\\"path\\\":\\\"a\\\"}\"}</tool_call>",
        );
        assert_eq!(text, "Let me look.");
        assert_eq!(
            calls,
            vec![
                ToolCall {
                    name: "bash".into(),
                    arguments: "{\"command\":\"ls -la\"}".into()
                },
                ToolCall {
                    name: "read".into(),
                    arguments: "{\"path\":\"a\"}".into()
                },
            ]
        );
    }

    #[test]
    fn unclosed_and_broken_blocks() {
        let (_, calls) = parse("<tool_call>{\"name\": \"bash\", \"arguments\": {}}");
        assert_eq!(calls.len(), 1, "an unclosed last block still counts");
        let broken = "<tool_call>{\"name\": bash}</tool_call> done";
        assert_eq!(parse(broken), (broken.to_owned(), vec![]));
        assert_eq!(parse("plain"), ("plain".to_owned(), vec![]));
    }

    #[test]
    fn splitter_holds_back_what_may_be_a_tag() {
        let mut s = Splitter::default();
        assert_eq!(s.release("Hello <tool"), "Hello ");
        assert_eq!(s.release("Hello <toolbox"), "<toolbox");
        assert_eq!(s.release("Hello <toolbox <tool_call>{"), " ");
        assert_eq!(s.release("Hello <toolbox <tool_call>{\"name\""), "");
        assert_eq!(
            s.rest("Hello <toolbox <tool_call>{\"name\""),
            "<tool_call>{\"name\""
        );
    }
}
