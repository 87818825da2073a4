//! Token ids and logprobs, for the token-capture tests: a token is a byte.
//! Prompt ids are the bytes of a toy chat template, completion ids the bytes
//! of the generated text, so that ids extend turn by turn as with a real
//! model server.

use crate::conversation::text_of;
use serde_json::{json, Value};

/// What an assistant message "generated": its content text, then each tool
/// call as `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, with the
/// arguments string verbatim. Its bytes are the completion token ids.
pub(crate) fn generated_text(content: &str, calls: &[(&str, &str)]) -> String {
    let mut s = content.to_owned();
    for (name, args) in calls {
        s.push_str(&format!(
            "<tool_call>{{\"name\": {}, \"arguments\": {}}}</tool_call>",
            Value::from(*name),
            args
        ));
    }
    s
}

/// A toy chat template for Chat Completions requests: `<|role|>text<|end|>`
/// per message, an assistant message as `<|assistant|>` plus its generated
/// text (no end marker, exactly what it completed), then `<|assistant|>`.
/// So the next turn's prompt starts with this prompt plus the completion,
/// as with a real model server, and token ids (bytes) extend turn by turn.
pub(crate) fn chat_prompt(body: &Value) -> String {
    let mut out = String::new();
    for m in body["messages"].as_array().into_iter().flatten() {
        let role = m["role"].as_str().unwrap_or("user");
        out.push_str(&format!("<|{role}|>"));
        let text = text_of(&m["content"]);
        if role == "assistant" {
            let calls: Vec<(&str, &str)> = m["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    (
                        c["function"]["name"].as_str().unwrap_or(""),
                        c["function"]["arguments"].as_str().unwrap_or(""),
                    )
                })
                .collect();
            out.push_str(&generated_text(&text, &calls));
        } else {
            out.push_str(&text);
            out.push_str("<|end|>");
        }
    }
    out.push_str("<|assistant|>");
    out
}

/// Token ids of `text`: its bytes.
pub(crate) fn token_ids(text: &str) -> Value {
    Value::Array(text.bytes().map(|b| json!(b)).collect())
}

/// OpenAI `logprobs.content` entries for `text`, a token per byte, with
/// logprobs cycling through 0, -0.25, -0.5, -0.75.
pub(crate) fn logprob_entries(text: &str) -> Value {
    Value::Array(
        text.bytes()
            .enumerate()
            .map(|(i, b)| json!({"token": (b as char).to_string(), "logprob": -0.25 * ((i % 4) as f64), "bytes": [b], "top_logprobs": []}))
            .collect(),
    )
}
