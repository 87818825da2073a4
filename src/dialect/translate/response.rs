//! Chat Completions → Responses / Messages, whole: a `chat.completion` as a
//! Responses `response` object or an Anthropic `message`
//! ([`response_from_chat`]). The item shapes, usage, status and stop reason
//! here are the stream translator's too.

use crate::dialect::WireApi;
use serde_json::{json, Map, Value};

pub(super) fn chat_id(chat: &Value) -> String {
    chat.get("id")
        .and_then(Value::as_str)
        .unwrap_or("rollcall")
        .trim_start_matches("chatcmpl-")
        .to_owned()
}

fn choice_message(chat: &Value) -> (&Value, Option<&str>) {
    let choice = chat.pointer("/choices/0").unwrap_or(&Value::Null);
    (
        choice.get("message").unwrap_or(&Value::Null),
        choice.get("finish_reason").and_then(Value::as_str),
    )
}

fn reasoning_of(msg: &Value) -> Option<&str> {
    msg.get("reasoning_content")
        .or_else(|| msg.get("reasoning"))
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
}

/// Chat usage as Responses usage; `null` unless the upstream sent both token
/// counts (clients such as Codex need all three counts or none). The total is
/// their sum when not sent; the details appear only when sent.
pub(super) fn responses_usage(u: &Value) -> Value {
    let i = |p: &str| u.pointer(p).and_then(Value::as_i64);
    let (Some(input), Some(output)) = (i("/prompt_tokens"), i("/completion_tokens")) else {
        return Value::Null;
    };
    let mut out = Map::new();
    out.insert("input_tokens".into(), json!(input));
    if let Some(c) = i("/prompt_tokens_details/cached_tokens") {
        out.insert("input_tokens_details".into(), json!({"cached_tokens": c}));
    }
    out.insert("output_tokens".into(), json!(output));
    if let Some(r) = i("/completion_tokens_details/reasoning_tokens") {
        out.insert(
            "output_tokens_details".into(),
            json!({"reasoning_tokens": r}),
        );
    }
    let total = i("/total_tokens").unwrap_or(input.saturating_add(output));
    out.insert("total_tokens".into(), json!(total));
    Value::Object(out)
}

/// Chat usage as Messages usage, with only the counts the upstream sent (an
/// empty object when none: clients read `usage.output_tokens` of an object
/// that must be there). Anthropic counts cache reads apart from
/// `input_tokens`; Chat Completions has no cache writes, so with a known
/// prompt count they are 0.
pub(super) fn messages_usage(u: &Value) -> Value {
    let i = |p: &str| u.pointer(p).and_then(Value::as_i64);
    let cached = i("/prompt_tokens_details/cached_tokens");
    let mut out = Map::new();
    if let Some(p) = i("/prompt_tokens") {
        out.insert(
            "input_tokens".into(),
            json!(p.saturating_sub(cached.unwrap_or(0))),
        );
        out.insert("cache_creation_input_tokens".into(), json!(0));
    }
    if let Some(c) = i("/completion_tokens") {
        out.insert("output_tokens".into(), json!(c));
    }
    if let Some(c) = cached {
        out.insert("cache_read_input_tokens".into(), json!(c));
    }
    Value::Object(out)
}

pub(super) fn stop_reason(finish: Option<&str>, has_tools: bool) -> &'static str {
    match finish {
        _ if has_tools => "tool_use",
        Some("length") => "max_tokens",
        Some("tool_calls") | Some("function_call") => "tool_use",
        Some("content_filter") => "refusal",
        _ => "end_turn",
    }
}

pub(super) fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"type": "reasoning", "id": format!("rs_{id}"), "summary": [{"type": "summary_text", "text": text}]})
}

pub(super) fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": format!("msg_{id}"), "role": "assistant", "status": status,
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

pub(super) fn function_item(call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id, "name": name,
           "arguments": arguments, "status": status})
}

pub(super) fn responses_status(finish: Option<&str>) -> (&'static str, Value) {
    match finish {
        Some("length") => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some("content_filter") => ("incomplete", json!({"reason": "content_filter"})),
        _ => ("completed", Value::Null),
    }
}

/// A `chat.completion` as a Responses `response` object.
pub fn chat_to_responses(chat: &Value) -> Value {
    let id = chat_id(chat);
    let (msg, finish) = choice_message(chat);
    let mut output = Vec::new();
    if let Some(r) = reasoning_of(msg) {
        output.push(reasoning_item(&id, r));
    }
    if let Some(text) = msg
        .get("content")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        output.push(message_item(&id, text, "completed"));
    }
    for (i, tc) in msg
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let call_id = tc
            .get("id")
            .and_then(Value::as_str)
            .map_or_else(|| format!("call_{id}_{i}"), str::to_owned);
        output.push(function_item(
            &call_id,
            tc.pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or(""),
            tc.pointer("/function/arguments")
                .and_then(Value::as_str)
                .unwrap_or(""),
            "completed",
        ));
    }
    let (status, incomplete) = responses_status(finish);
    json!({
        "id": format!("resp_{id}"),
        "object": "response",
        "created_at": chat.get("created").cloned().unwrap_or(json!(0)),
        "status": status,
        "incomplete_details": incomplete,
        "model": chat.get("model"),
        "output": output,
        "usage": responses_usage(chat.get("usage").unwrap_or(&Value::Null)),
    })
}

fn tool_input(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ if arguments.trim().is_empty() => json!({}),
        _ => {
            tracing::warn!(
                arguments,
                "a tool call's arguments are not a JSON object; passed as {{\"arguments\": TEXT}}"
            );
            json!({"arguments": arguments})
        }
    }
}

/// A `chat.completion` as an Anthropic `message`.
pub fn chat_to_messages(chat: &Value) -> Value {
    let id = chat_id(chat);
    let (msg, finish) = choice_message(chat);
    let mut content = Vec::new();
    if let Some(r) = reasoning_of(msg) {
        content.push(json!({"type": "thinking", "thinking": r, "signature": ""}));
    }
    if let Some(text) = msg
        .get("content")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        content.push(json!({"type": "text", "text": text}));
    }
    let calls = msg.get("tool_calls").and_then(Value::as_array);
    for tc in calls.into_iter().flatten() {
        content.push(json!({
            "type": "tool_use",
            "id": tc.get("id"),
            "name": tc.pointer("/function/name"),
            "input": tool_input(tc.pointer("/function/arguments").and_then(Value::as_str).unwrap_or("")),
        }));
    }
    let has_tools = calls.is_some_and(|c| !c.is_empty());
    json!({
        "id": format!("msg_{id}"),
        "type": "message",
        "role": "assistant",
        "model": chat.get("model"),
        "content": content,
        "stop_reason": stop_reason(finish, has_tools),
        "stop_sequence": null,
        "usage": messages_usage(chat.get("usage").unwrap_or(&Value::Null)),
    })
}

/// A whole Chat Completions answer translated back to `api`.
pub fn response_from_chat(api: WireApi, chat: &Value) -> Value {
    match api {
        WireApi::Responses => chat_to_responses(chat),
        WireApi::Messages => chat_to_messages(chat),
        WireApi::ChatCompletions | WireApi::Completions => chat.clone(),
    }
}
