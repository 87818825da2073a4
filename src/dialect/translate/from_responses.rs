//! Responses → Chat Completions: a Responses request as a chat request
//! ([`responses_to_chat`]), and the one conversion of its `instructions` and
//! `input` into chat messages that the recorded `messages` column uses too
//! ([`responses_messages`]).

use super::{chat_content, copy, stream_fields, Builder, ChatRequest, TranslateError, Unsupported};
use serde_json::{json, Map, Value};

fn text_join(parts: &[Value]) -> String {
    parts
        .iter()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect()
}

/// Append a tool call to the assistant message at the end of `msgs`, or
/// start one. Reasoning before the call is that message's too.
fn push_tool_call(msgs: &mut Vec<Value>, call: Value, reasoning: &mut Option<String>) {
    if let Some(last) = msgs.last_mut().filter(|m| m["role"] == "assistant") {
        match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
            Some(calls) => calls.push(call),
            None => last["tool_calls"] = json!([call]),
        }
        if let Some(r) = reasoning.take() {
            let mut all = last
                .get("reasoning_content")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            all.push_str(&r);
            last["reasoning_content"] = json!(all);
        }
        return;
    }
    let mut m = json!({"role": "assistant", "content": null, "tool_calls": [call]});
    if let Some(r) = reasoning.take() {
        m["reasoning_content"] = json!(r);
    }
    msgs.push(m);
}

/// Reasoning that no assistant message or tool call followed becomes an
/// assistant turn of its own, so that it is not lost.
fn flush_reasoning(msgs: &mut Vec<Value>, reasoning: &mut Option<String>) {
    if let Some(r) = reasoning.take() {
        msgs.push(json!({"role": "assistant", "content": "", "reasoning_content": r}));
    }
}

fn responses_content(b: &mut Builder, content: &Value) -> Result<Value, TranslateError> {
    let parts = match content {
        Value::String(s) => return Ok(json!(s)),
        Value::Array(p) => p,
        Value::Null => return Ok(Value::Null),
        other => return Err(TranslateError::Invalid(format!("message content {other}"))),
    };
    let mut out = Vec::new();
    for p in parts {
        match p.get("type").and_then(Value::as_str) {
            Some("input_text") | Some("output_text") | Some("text") | Some("summary_text") => out
                .push(json!({"type": "text", "text": p.get("text").cloned().unwrap_or(json!(""))})),
            Some("refusal") => out.push(
                json!({"type": "text", "text": p.get("refusal").cloned().unwrap_or(json!(""))}),
            ),
            Some("input_image") => match p.get("image_url").and_then(Value::as_str) {
                Some(url) => {
                    let mut img = json!({"url": url});
                    if let Some(d) = p.get("detail") {
                        img["detail"] = d.clone();
                    }
                    out.push(json!({"type": "image_url", "image_url": img}))
                }
                None => b.unsupported("an input_image given by file_id".into())?,
            },
            Some(other) => b.unsupported(format!("a {other} content part"))?,
            None => b.unsupported("a content part without a type".into())?,
        }
    }
    Ok(chat_content(out))
}

/// A tool result's output as chat tool content: strings stay strings; a list
/// of `input_text` parts (Kimi sends these) becomes their text.
fn tool_output(b: &mut Builder, output: &Value) -> Result<Value, TranslateError> {
    match output {
        Value::String(s) => Ok(json!(s)),
        Value::Array(parts) => {
            let mut text = String::new();
            for p in parts {
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text") | Some("output_text") | Some("text") => {
                        text.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""))
                    }
                    Some(other) => b.unsupported(format!("a {other} part in a tool output"))?,
                    None => b.unsupported("a tool output part without a type".into())?,
                }
            }
            Ok(json!(text))
        }
        Value::Null => Ok(json!("")),
        other => Ok(json!(other.to_string())),
    }
}

/// A Responses function tool (`name`, `description`, `parameters`, `strict`
/// beside `type`) in chat form (inside `function`). One already in chat
/// form stays as it is.
pub fn function_tool(t: &Value) -> Value {
    if t.get("name").is_none() && t.get("function").is_some_and(Value::is_object) {
        return t.clone();
    }
    let mut f = Map::new();
    for key in ["name", "description", "parameters", "strict"] {
        if let Some(v) = t.get(key).filter(|v| !v.is_null()) {
            f.insert(key.into(), v.clone());
        }
    }
    json!({"type": "function", "function": f})
}

fn responses_tools(b: &mut Builder, tools: &[Value]) -> Result<Vec<Value>, TranslateError> {
    let mut out = Vec::new();
    for t in tools {
        match t.get("type").and_then(Value::as_str) {
            Some("function") => out.push(function_tool(t)),
            Some(other) => {
                let name = t
                    .get("name")
                    .and_then(Value::as_str)
                    .map(|n| format!(" {n:?}"))
                    .unwrap_or_default();
                b.unsupported(format!("a {other} tool{name}"))?
            }
            None => b.unsupported("a tool without a type".into())?,
        }
    }
    Ok(out)
}

/// Responses `instructions` and `input` items as chat messages: the one
/// conversion of a Responses conversation, used for the translated request
/// and for the recorded `messages` column ([`responses_messages`]), so that
/// the record shows what a Chat Completions upstream is sent.
///
/// - `instructions` is a `system` message (text parts as content parts,
///   any other value as its JSON text); `developer` and `system` input
///   messages are `system` messages too, `assistant` stays, any other role
///   is `user`.
/// - Content parts become chat parts (`input_text`, `output_text`, `text`,
///   `summary_text` and `refusal` text; `input_image` by URL); one text part
///   is a plain string.
/// - `function_call` items are `tool_calls` of an assistant message (the one
///   before when it is an assistant's), `function_call_output` items are
///   `tool` messages with their output as text.
/// - `reasoning` text (consecutive items joined, as in an assembled answer)
///   is the `reasoning_content` of the assistant message or tool call that
///   follows it, else an assistant turn of its own.
/// - Anything else (other item types, parts, encrypted reasoning) is
///   unsupported: dropped and listed, or rejected, as the policy says.
fn responses_input(
    b: &mut Builder,
    obj: &Map<String, Value>,
) -> Result<Vec<Value>, TranslateError> {
    let mut msgs: Vec<Value> = Vec::new();
    if let Some(i) = obj.get("instructions").filter(|i| !i.is_null()) {
        let content = match i {
            Value::String(s) => json!(s),
            Value::Array(_) => responses_content(b, i)?,
            other => json!(other.to_string()),
        };
        msgs.push(json!({"role": "system", "content": content}));
    }
    let mut reasoning: Option<String> = None;
    match obj.get("input") {
        Some(Value::String(s)) => msgs.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for item in items {
                let kind = item
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("message");
                match kind {
                    "message" => {
                        let role = match item.get("role").and_then(Value::as_str) {
                            Some("developer") | Some("system") => "system",
                            Some("assistant") => "assistant",
                            _ => "user",
                        };
                        let content =
                            responses_content(b, item.get("content").unwrap_or(&Value::Null))?;
                        if role != "assistant" {
                            flush_reasoning(&mut msgs, &mut reasoning);
                        }
                        let mut m = json!({"role": role, "content": content});
                        if let Some(r) = reasoning.take() {
                            m["reasoning_content"] = json!(r);
                        }
                        msgs.push(m);
                    }
                    "function_call" => {
                        let call = json!({
                            "id": item.get("call_id").or_else(|| item.get("id")),
                            "type": "function",
                            "function": {"name": item.get("name"), "arguments": item.get("arguments").cloned().unwrap_or(json!("{}"))},
                        });
                        push_tool_call(&mut msgs, call, &mut reasoning);
                    }
                    "function_call_output" => {
                        flush_reasoning(&mut msgs, &mut reasoning);
                        let content = tool_output(b, item.get("output").unwrap_or(&Value::Null))?;
                        msgs.push(json!({
                            "role": "tool",
                            "tool_call_id": item.get("call_id"),
                            "content": content,
                        }));
                    }
                    "reasoning" => {
                        let mut text = String::new();
                        for key in ["content", "summary"] {
                            if let Some(parts) = item.get(key).and_then(Value::as_array) {
                                text.push_str(&text_join(parts));
                            }
                        }
                        if item.get("encrypted_content").is_some_and(|e| !e.is_null()) {
                            b.unsupported("encrypted reasoning content".into())?;
                        }
                        if !text.is_empty() {
                            reasoning.get_or_insert_with(String::new).push_str(&text);
                        }
                    }
                    other => b.unsupported(format!("a {other} input item"))?,
                }
            }
        }
        None | Some(Value::Null) => {}
        Some(other) => {
            return Err(TranslateError::Invalid(format!(
                "input must be a string or a list, got {other}"
            )))
        }
    }
    flush_reasoning(&mut msgs, &mut reasoning);
    Ok(msgs)
}

/// The chat messages of a Responses request, as [`responses_to_chat`] sends
/// them with `unsupported = "drop"`: the recorded `messages` column. Unlike
/// translation it reads the input of any request, `previous_response_id`
/// or unknown fields included; it fails only where the input itself is not
/// valid (`input` neither a string nor a list, a message's content neither
/// a string nor a list of parts).
pub fn responses_messages(req: &Value) -> Result<Vec<Value>, TranslateError> {
    let obj = req
        .as_object()
        .ok_or_else(|| TranslateError::Invalid("the body is not a JSON object".into()))?;
    let mut b = Builder {
        policy: Unsupported::Drop,
        dropped: Vec::new(),
    };
    responses_input(&mut b, obj)
}

/// A Responses request as a Chat Completions request.
pub fn responses_to_chat(req: &Value, policy: Unsupported) -> Result<ChatRequest, TranslateError> {
    let obj = req
        .as_object()
        .ok_or_else(|| TranslateError::Invalid("the body is not a JSON object".into()))?;
    if obj
        .get("previous_response_id")
        .is_some_and(|v| !v.is_null())
    {
        return Err(TranslateError::Unsupported(
            "previous_response_id (it needs server-side conversation state)".into(),
        ));
    }
    let mut b = Builder {
        policy,
        dropped: Vec::new(),
    };
    let msgs = responses_input(&mut b, obj)?;
    let mut out = Map::new();
    copy(obj, &mut out, &["model"]);
    out.insert("messages".into(), Value::Array(msgs));
    if let Some(tools) = obj.get("tools").and_then(Value::as_array) {
        let tools = responses_tools(&mut b, tools)?;
        if !tools.is_empty() {
            out.insert("tools".into(), Value::Array(tools));
        }
    }
    if let Some(tc) = obj.get("tool_choice").filter(|v| !v.is_null()) {
        match tc {
            Value::String(_) => {
                out.insert("tool_choice".into(), tc.clone());
            }
            _ if tc["type"] == "function" => {
                out.insert(
                    "tool_choice".into(),
                    json!({"type": "function", "function": {"name": tc.get("name")}}),
                );
            }
            _ => b.unsupported(format!("tool_choice {tc}"))?,
        }
    }
    copy(
        obj,
        &mut out,
        &[
            "temperature",
            "top_p",
            "parallel_tool_calls",
            "user",
            "seed",
            "stop",
        ],
    );
    if let Some(m) = obj.get("max_output_tokens").filter(|v| !v.is_null()) {
        out.insert("max_tokens".into(), m.clone());
    }
    if let Some(n) = obj.get("top_logprobs").filter(|v| !v.is_null()) {
        out.insert("logprobs".into(), json!(true));
        out.insert("top_logprobs".into(), n.clone());
    }
    if let Some(format) = req.pointer("/text/format").filter(|v| !v.is_null()) {
        match format.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("json_object") => {
                out.insert("response_format".into(), json!({"type": "json_object"}));
            }
            Some("json_schema") => {
                let mut js = Map::new();
                copy(
                    format.as_object().unwrap_or(&Map::new()),
                    &mut js,
                    &["name", "schema", "strict", "description"],
                );
                out.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": js}),
                );
            }
            _ => b.unsupported(format!("text.format {format}"))?,
        }
    }
    stream_fields(obj, &mut out);
    for (k, v) in obj {
        let handled = [
            "model",
            "input",
            "instructions",
            "tools",
            "tool_choice",
            "temperature",
            "top_p",
            "parallel_tool_calls",
            "user",
            "seed",
            "stop",
            "max_output_tokens",
            "top_logprobs",
            "text",
            "stream",
            "previous_response_id",
            // Bookkeeping that does not change what the model is asked.
            "store",
            "include",
            "prompt_cache_key",
            "client_metadata",
            "metadata",
            "service_tier",
            "truncation",
            "background",
            "safety_identifier",
            "stream_options",
        ];
        if !handled.contains(&k.as_str()) && !v.is_null() {
            b.unsupported(format!("the field {k:?}"))?;
        }
    }
    Ok(ChatRequest {
        request: Value::Object(out),
        dropped: b.dropped,
    })
}
