//! Translation between wire APIs, for routes whose upstream speaks only Chat
//! Completions: a Responses or Messages request becomes a Chat Completions
//! request, and the answer (a whole body or a stream, chunk by chunk) is
//! translated back into the harness's API.
//!
//! What has no Chat Completions equivalent (Codex's `web_search` and
//! `namespace` tools, Anthropic server tools, documents, …) is dropped and
//! listed in [`ChatRequest::dropped`], or rejected, as the route's
//! `unsupported` setting says. Nothing is changed silently.
//!
//! The same conversions give the recorded `messages` column of Responses and
//! Messages calls (with `drop`), whatever the route: [`responses_messages`],
//! [`messages_to_chat`].

use super::sse::Event;
use super::WireApi;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// What to do with a construct that has no Chat Completions equivalent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unsupported {
    /// Leave it out, and log a warning naming it.
    #[default]
    Drop,
    /// Answer 400 naming it.
    Reject,
}

/// Why a request could not be translated.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TranslateError {
    /// the request uses {0}, which Chat Completions cannot express
    #[error("the request uses {0}, which the route's Chat Completions upstream cannot express (route setting unsupported = \"reject\")")]
    Unsupported(String),
    /// the request is not valid for its API: {0}
    #[error("the request is not valid for its API: {0}")]
    Invalid(String),
}

/// A request translated to Chat Completions.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub request: Value,
    /// Constructs left out, for the warning log.
    pub dropped: Vec<String>,
}

struct Builder {
    policy: Unsupported,
    dropped: Vec<String>,
}

impl Builder {
    fn unsupported(&mut self, what: String) -> Result<(), TranslateError> {
        match self.policy {
            Unsupported::Drop => {
                self.dropped.push(what);
                Ok(())
            }
            Unsupported::Reject => Err(TranslateError::Unsupported(what)),
        }
    }
}

/// Translate a request of `api` into Chat Completions.
pub fn to_chat(
    api: WireApi,
    req: &Value,
    policy: Unsupported,
) -> Result<ChatRequest, TranslateError> {
    match api {
        WireApi::Responses => responses_to_chat(req, policy),
        WireApi::Messages => messages_to_chat(req, policy),
        WireApi::ChatCompletions | WireApi::Completions => Err(TranslateError::Invalid(format!(
            "{} needs no translation",
            api.as_str()
        ))),
    }
}

fn text_join(parts: &[Value]) -> String {
    parts
        .iter()
        .filter_map(|p| p.get("text").and_then(Value::as_str))
        .collect()
}

/// Chat content from a list of parts: a string when all parts are text and
/// there is one, else a list of chat parts.
fn chat_content(parts: Vec<Value>) -> Value {
    if parts.len() == 1 && parts[0]["type"] == "text" {
        return parts[0]["text"].clone();
    }
    Value::Array(parts)
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

/// Top-level fields both APIs share, copied as they are.
fn copy(from: &Map<String, Value>, to: &mut Map<String, Value>, keys: &[&str]) {
    for k in keys {
        if let Some(v) = from.get(*k) {
            to.insert((*k).into(), v.clone());
        }
    }
}

fn stream_fields(obj: &Map<String, Value>, out: &mut Map<String, Value>) {
    if obj.get("stream").and_then(Value::as_bool) == Some(true) {
        out.insert("stream".into(), json!(true));
        // Usage arrives in a last chunk; both target APIs report it.
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
}

// ---------------------------------------------------------------- Responses → Chat

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

// ---------------------------------------------------------------- Messages → Chat

fn blocks_of(content: &Value) -> Vec<Value> {
    match content {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(b) => b.clone(),
        _ => Vec::new(),
    }
}

fn image_part(b: &mut Builder, block: &Value) -> Result<Option<Value>, TranslateError> {
    let src = block.get("source").unwrap_or(&Value::Null);
    match src.get("type").and_then(Value::as_str) {
        Some("base64") => Ok(Some(
            json!({"type": "image_url", "image_url": {"url": format!(
                "data:{};base64,{}",
                src.get("media_type").and_then(Value::as_str).unwrap_or("image/png"),
                src.get("data").and_then(Value::as_str).unwrap_or("")
            )}}),
        )),
        Some("url") => Ok(Some(
            json!({"type": "image_url", "image_url": {"url": src.get("url")}}),
        )),
        _ => {
            b.unsupported(format!("an image source {src}"))?;
            Ok(None)
        }
    }
}

fn tool_result_content(b: &mut Builder, content: Option<&Value>) -> Result<Value, TranslateError> {
    let Some(content) = content else {
        return Ok(json!(""));
    };
    if let Value::String(s) = content {
        return Ok(json!(s));
    }
    let mut text = String::new();
    for block in blocks_of(content) {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or("")),
            Some(other) => b.unsupported(format!("a {other} block in a tool result"))?,
            None => b.unsupported("a tool-result block without a type".into())?,
        }
    }
    Ok(json!(text))
}

/// A Messages request as a Chat Completions request.
pub fn messages_to_chat(req: &Value, policy: Unsupported) -> Result<ChatRequest, TranslateError> {
    let obj = req
        .as_object()
        .ok_or_else(|| TranslateError::Invalid("the body is not a JSON object".into()))?;
    let mut b = Builder {
        policy,
        dropped: Vec::new(),
    };
    let mut msgs: Vec<Value> = Vec::new();
    let system_text = |b: &mut Builder, v: &Value| -> Result<String, TranslateError> {
        let mut text = String::new();
        for (i, block) in blocks_of(v).iter().enumerate() {
            match block.get("type").and_then(Value::as_str) {
                Some("text") => {
                    if i > 0 && !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(block.get("text").and_then(Value::as_str).unwrap_or(""));
                }
                other => b.unsupported(format!(
                    "a {} block in a system prompt",
                    other.unwrap_or("untyped")
                ))?,
            }
        }
        Ok(text)
    };
    if let Some(s) = obj.get("system").filter(|s| !s.is_null()) {
        msgs.push(json!({"role": "system", "content": system_text(&mut b, s)?}));
    }
    let messages = obj
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| TranslateError::Invalid("messages must be a list".into()))?;
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        let content = m.get("content").unwrap_or(&Value::Null);
        match role {
            "system" => {
                msgs.push(json!({"role": "system", "content": system_text(&mut b, content)?}))
            }
            "assistant" => {
                let mut text: Option<String> = None;
                let mut reasoning: Option<String> = None;
                let mut calls = Vec::new();
                for block in blocks_of(content) {
                    match block.get("type").and_then(Value::as_str) {
                        Some("text") => text
                            .get_or_insert_with(String::new)
                            .push_str(block.get("text").and_then(Value::as_str).unwrap_or("")),
                        Some("thinking") => reasoning
                            .get_or_insert_with(String::new)
                            .push_str(block.get("thinking").and_then(Value::as_str).unwrap_or("")),
                        Some("tool_use") => calls.push(json!({
                            "id": block.get("id"),
                            "type": "function",
                            "function": {"name": block.get("name"), "arguments": super::messages::arguments_text(block.get("input"))},
                        })),
                        Some(other) => b.unsupported(format!("a {other} block in an assistant message"))?,
                        None => b.unsupported("an untyped block in an assistant message".into())?,
                    }
                }
                let mut msg = json!({"role": "assistant", "content": text});
                if let Some(r) = reasoning {
                    msg["reasoning_content"] = json!(r);
                }
                if !calls.is_empty() {
                    msg["tool_calls"] = Value::Array(calls);
                }
                msgs.push(msg);
            }
            _ => {
                // Tool results first (they answer the previous assistant
                // turn), then the user's own parts.
                let mut parts = Vec::new();
                for block in blocks_of(content) {
                    match block.get("type").and_then(Value::as_str) {
                        Some("tool_result") => msgs.push(json!({
                            "role": "tool",
                            "tool_call_id": block.get("tool_use_id"),
                            "content": tool_result_content(&mut b, block.get("content"))?,
                        })),
                        Some("text") => parts.push(json!({"type": "text", "text": block.get("text").cloned().unwrap_or(json!(""))})),
                        Some("image") => {
                            if let Some(p) = image_part(&mut b, &block)? {
                                parts.push(p);
                            }
                        }
                        Some(other) => b.unsupported(format!("a {other} block in a user message"))?,
                        None => b.unsupported("an untyped block in a user message".into())?,
                    }
                }
                if !parts.is_empty() {
                    msgs.push(json!({"role": "user", "content": chat_content(parts)}));
                }
            }
        }
    }
    let mut out = Map::new();
    copy(obj, &mut out, &["model"]);
    out.insert("messages".into(), Value::Array(msgs));
    if let Some(tools) = obj.get("tools").and_then(Value::as_array) {
        let mut chat_tools = Vec::new();
        for t in tools {
            let custom = matches!(t.get("type").and_then(Value::as_str), None | Some("custom"));
            if custom && t.get("input_schema").is_some() {
                let mut f = Map::new();
                copy(
                    t.as_object().unwrap_or(&Map::new()),
                    &mut f,
                    &["name", "description"],
                );
                f.insert("parameters".into(), t["input_schema"].clone());
                chat_tools.push(json!({"type": "function", "function": f}));
            } else {
                let name = t.get("name").and_then(Value::as_str).unwrap_or("?");
                let kind = t.get("type").and_then(Value::as_str).unwrap_or("untyped");
                b.unsupported(format!("the server tool {name:?} ({kind})"))?;
            }
        }
        if !chat_tools.is_empty() {
            out.insert("tools".into(), Value::Array(chat_tools));
        }
    }
    if let Some(tc) = obj.get("tool_choice").filter(|v| !v.is_null()) {
        let choice = match tc.get("type").and_then(Value::as_str) {
            Some("auto") => Some(json!("auto")),
            Some("any") => Some(json!("required")),
            Some("none") => Some(json!("none")),
            Some("tool") => Some(json!({"type": "function", "function": {"name": tc.get("name")}})),
            _ => {
                b.unsupported(format!("tool_choice {tc}"))?;
                None
            }
        };
        if let Some(c) = choice {
            out.insert("tool_choice".into(), c);
        }
        if tc.get("disable_parallel_tool_use").and_then(Value::as_bool) == Some(true) {
            out.insert("parallel_tool_calls".into(), json!(false));
        }
    }
    copy(
        obj,
        &mut out,
        &["max_tokens", "temperature", "top_p", "top_k"],
    );
    if let Some(s) = obj.get("stop_sequences").filter(|v| !v.is_null()) {
        out.insert("stop".into(), s.clone());
    }
    stream_fields(obj, &mut out);
    for (k, v) in obj {
        let handled = [
            "model",
            "system",
            "messages",
            "tools",
            "tool_choice",
            "max_tokens",
            "temperature",
            "top_p",
            "top_k",
            "stop_sequences",
            "stream",
            // Bookkeeping that does not change what the model is asked.
            "metadata",
            "service_tier",
            "cache_control",
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

// ---------------------------------------------------------------- Chat → Responses / Messages (whole)

fn chat_id(chat: &Value) -> String {
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
fn responses_usage(u: &Value) -> Value {
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
fn messages_usage(u: &Value) -> Value {
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

fn stop_reason(finish: Option<&str>, has_tools: bool) -> &'static str {
    match finish {
        _ if has_tools => "tool_use",
        Some("length") => "max_tokens",
        Some("tool_calls") | Some("function_call") => "tool_use",
        Some("content_filter") => "refusal",
        _ => "end_turn",
    }
}

fn reasoning_item(id: &str, text: &str) -> Value {
    json!({"type": "reasoning", "id": format!("rs_{id}"), "summary": [{"type": "summary_text", "text": text}]})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": format!("msg_{id}"), "role": "assistant", "status": status,
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

fn function_item(call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": format!("fc_{call_id}"), "call_id": call_id, "name": name,
           "arguments": arguments, "status": status})
}

fn responses_status(finish: Option<&str>) -> (&'static str, Value) {
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

// ---------------------------------------------------------------- streams

/// What is open in the harness-side stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    Reasoning,
    Text,
    Tool(u64),
}

#[derive(Default)]
struct ToolAcc {
    id: Option<String>,
    name: Option<String>,
    args: String,
    /// Index of its item or block on the harness side, once announced.
    out_index: Option<usize>,
    closed: bool,
}

/// Translates a Chat Completions chunk stream into a Responses or Messages
/// event stream, event by event as chunks arrive.
pub struct StreamTranslator {
    api: WireApi,
    started: bool,
    id: String,
    model: Value,
    created: Value,
    seq: u64,
    next_index: usize,
    open: Option<Open>,
    reasoning: String,
    reasoning_index: usize,
    text: String,
    text_index: usize,
    tools: BTreeMap<u64, ToolAcc>,
    finish: Option<String>,
    usage: Value,
    /// Output items in order, for the final `response` object.
    items: Vec<(usize, Value)>,
    done: bool,
}

impl StreamTranslator {
    pub fn new(api: WireApi) -> Self {
        Self {
            api,
            started: false,
            id: "rollcall".into(),
            model: Value::Null,
            created: json!(0),
            seq: 0,
            next_index: 0,
            open: None,
            reasoning: String::new(),
            reasoning_index: 0,
            text: String::new(),
            text_index: 0,
            tools: BTreeMap::new(),
            finish: None,
            usage: Value::Null,
            items: Vec::new(),
            done: false,
        }
    }

    /// Whether the terminal event has been written.
    pub fn is_done(&self) -> bool {
        self.done
    }

    fn emit(&mut self, out: &mut Vec<u8>, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        if self.api == WireApi::Responses {
            data["sequence_number"] = json!(self.seq);
            self.seq += 1;
        }
        out.extend_from_slice(format!("event: {kind}\ndata: {data}\n\n").as_bytes());
    }

    fn response_object(&self, status: &str) -> Value {
        let mut items = self.items.clone();
        items.sort_by_key(|(i, _)| *i);
        let (final_status, incomplete) = if status == "in_progress" {
            ("in_progress", Value::Null)
        } else {
            responses_status(self.finish.as_deref())
        };
        json!({
            "id": format!("resp_{}", self.id), "object": "response", "created_at": self.created,
            "status": final_status, "incomplete_details": incomplete, "model": self.model,
            "output": items.into_iter().map(|(_, v)| v).collect::<Vec<_>>(),
            "usage": if status == "in_progress" { Value::Null } else { responses_usage(&self.usage) },
        })
    }

    fn start(&mut self, chunk: &Value, out: &mut Vec<u8>) {
        self.started = true;
        self.id = chat_id(chunk);
        self.model = chunk.get("model").cloned().unwrap_or(Value::Null);
        self.created = chunk.get("created").cloned().unwrap_or(json!(0));
        match self.api {
            WireApi::Responses => {
                let r = self.response_object("in_progress");
                self.emit(out, "response.created", json!({"response": r}));
                self.emit(out, "response.in_progress", json!({"response": r}));
            }
            _ => {
                let m = json!({"id": format!("msg_{}", self.id), "type": "message", "role": "assistant",
                    "model": self.model, "content": [], "stop_reason": null, "stop_sequence": null,
                    "usage": messages_usage(&self.usage)});
                self.emit(out, "message_start", json!({"message": m}));
            }
        }
    }

    /// Close whatever item or block is open.
    fn close(&mut self, out: &mut Vec<u8>) {
        let Some(open) = self.open.take() else { return };
        let responses = self.api == WireApi::Responses;
        match open {
            Open::Reasoning => {
                let idx = self.reasoning_index;
                if responses {
                    let item = reasoning_item(&self.id, &self.reasoning);
                    let part = json!({"type": "summary_text", "text": self.reasoning});
                    self.emit(out, "response.reasoning_summary_text.done", json!({"item_id": item["id"], "output_index": idx, "summary_index": 0, "text": self.reasoning}));
                    self.emit(out, "response.reasoning_summary_part.done", json!({"item_id": item["id"], "output_index": idx, "summary_index": 0, "part": part}));
                    self.emit(
                        out,
                        "response.output_item.done",
                        json!({"output_index": idx, "item": item}),
                    );
                    self.items.push((idx, item));
                } else {
                    self.emit(out, "content_block_delta", json!({"index": idx, "delta": {"type": "signature_delta", "signature": ""}}));
                    self.emit(out, "content_block_stop", json!({"index": idx}));
                }
            }
            Open::Text => {
                let idx = self.text_index;
                if responses {
                    let item = message_item(&self.id, &self.text, "completed");
                    let part = json!({"type": "output_text", "text": self.text, "annotations": []});
                    self.emit(out, "response.output_text.done", json!({"item_id": item["id"], "output_index": idx, "content_index": 0, "text": self.text}));
                    self.emit(out, "response.content_part.done", json!({"item_id": item["id"], "output_index": idx, "content_index": 0, "part": part}));
                    self.emit(
                        out,
                        "response.output_item.done",
                        json!({"output_index": idx, "item": item}),
                    );
                    self.items.push((idx, item));
                } else {
                    self.emit(out, "content_block_stop", json!({"index": idx}));
                }
            }
            Open::Tool(ti) => {
                let Some(t) = self.tools.get_mut(&ti) else {
                    return;
                };
                t.closed = true;
                let (idx, call_id, name, args) = (
                    t.out_index.unwrap_or(0),
                    t.id.clone().unwrap_or_default(),
                    t.name.clone().unwrap_or_default(),
                    t.args.clone(),
                );
                if responses {
                    let item = function_item(&call_id, &name, &args, "completed");
                    self.emit(
                        out,
                        "response.function_call_arguments.done",
                        json!({"item_id": item["id"], "output_index": idx, "arguments": args}),
                    );
                    self.emit(
                        out,
                        "response.output_item.done",
                        json!({"output_index": idx, "item": item}),
                    );
                    self.items.push((idx, item));
                } else {
                    self.emit(out, "content_block_stop", json!({"index": idx}));
                }
            }
        }
    }

    fn reasoning_delta(&mut self, d: &str, out: &mut Vec<u8>) {
        if self.open != Some(Open::Reasoning) {
            self.close(out);
            self.open = Some(Open::Reasoning);
            self.reasoning_index = self.next_index;
            self.next_index += 1;
            let idx = self.reasoning_index;
            if self.api == WireApi::Responses {
                let item =
                    json!({"type": "reasoning", "id": format!("rs_{}", self.id), "summary": []});
                self.emit(
                    out,
                    "response.output_item.added",
                    json!({"output_index": idx, "item": item}),
                );
                self.emit(out, "response.reasoning_summary_part.added", json!({"item_id": format!("rs_{}", self.id), "output_index": idx, "summary_index": 0, "part": {"type": "summary_text", "text": ""}}));
            } else {
                self.emit(out, "content_block_start", json!({"index": idx, "content_block": {"type": "thinking", "thinking": "", "signature": ""}}));
            }
        }
        self.reasoning.push_str(d);
        let idx = self.reasoning_index;
        if self.api == WireApi::Responses {
            self.emit(out, "response.reasoning_summary_text.delta", json!({"item_id": format!("rs_{}", self.id), "output_index": idx, "summary_index": 0, "delta": d}));
        } else {
            self.emit(
                out,
                "content_block_delta",
                json!({"index": idx, "delta": {"type": "thinking_delta", "thinking": d}}),
            );
        }
    }

    fn text_delta(&mut self, d: &str, out: &mut Vec<u8>) {
        if self.open != Some(Open::Text) {
            self.close(out);
            self.open = Some(Open::Text);
            self.text_index = self.next_index;
            self.next_index += 1;
            let idx = self.text_index;
            if self.api == WireApi::Responses {
                let mut item = message_item(&self.id, "", "in_progress");
                item["content"] = json!([]);
                self.emit(
                    out,
                    "response.output_item.added",
                    json!({"output_index": idx, "item": item}),
                );
                self.emit(out, "response.content_part.added", json!({"item_id": format!("msg_{}", self.id), "output_index": idx, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}));
            } else {
                self.emit(
                    out,
                    "content_block_start",
                    json!({"index": idx, "content_block": {"type": "text", "text": ""}}),
                );
            }
        }
        self.text.push_str(d);
        let idx = self.text_index;
        if self.api == WireApi::Responses {
            self.emit(out, "response.output_text.delta", json!({"item_id": format!("msg_{}", self.id), "output_index": idx, "content_index": 0, "delta": d}));
        } else {
            self.emit(
                out,
                "content_block_delta",
                json!({"index": idx, "delta": {"type": "text_delta", "text": d}}),
            );
        }
    }

    fn tool_delta(&mut self, tc: &Value, out: &mut Vec<u8>) {
        let ti = tc.get("index").and_then(Value::as_u64).unwrap_or(0);
        {
            let t = self.tools.entry(ti).or_default();
            // The first id stays: it is the one announced to the harness.
            if let Some(id) = tc.get("id").and_then(Value::as_str) {
                t.id.get_or_insert_with(|| id.to_owned());
            }
            if let Some(n) = tc.pointer("/function/name").and_then(Value::as_str) {
                super::push_name(&mut t.name, n);
            }
        }
        let args = tc
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .unwrap_or("");
        let announced = self.tools.get(&ti).is_some_and(|t| t.out_index.is_some());
        if !announced {
            // Announce once the name is known; arguments seen before wait.
            if self.tools.get(&ti).is_some_and(|t| t.name.is_none()) {
                if let Some(t) = self.tools.get_mut(&ti) {
                    t.args.push_str(args);
                }
                return;
            }
            self.close(out);
            let idx = self.next_index;
            self.next_index += 1;
            let id = self.id.clone();
            let t = self.tools.entry(ti).or_default();
            t.out_index = Some(idx);
            let call_id =
                t.id.get_or_insert_with(|| format!("call_{id}_{ti}"))
                    .clone();
            let name = t.name.clone().unwrap_or_default();
            let pending = std::mem::take(&mut t.args);
            self.open = Some(Open::Tool(ti));
            if self.api == WireApi::Responses {
                let item = function_item(&call_id, &name, "", "in_progress");
                self.emit(
                    out,
                    "response.output_item.added",
                    json!({"output_index": idx, "item": item}),
                );
            } else {
                self.emit(out, "content_block_start", json!({"index": idx, "content_block": {"type": "tool_use", "id": call_id, "name": name, "input": {}}}));
            }
            if !pending.is_empty() {
                self.tool_args(ti, &pending, out);
            }
        } else if self.open != Some(Open::Tool(ti)) && self.tools.get(&ti).is_some_and(|t| t.closed)
        {
            tracing::warn!(
                index = ti,
                "arguments for a tool call that was already closed; recorded but not forwarded"
            );
            if let Some(t) = self.tools.get_mut(&ti) {
                t.args.push_str(args);
            }
            return;
        }
        if !args.is_empty() {
            self.tool_args(ti, args, out);
        }
    }

    fn tool_args(&mut self, ti: u64, args: &str, out: &mut Vec<u8>) {
        let Some(t) = self.tools.get_mut(&ti) else {
            return;
        };
        t.args.push_str(args);
        let idx = t.out_index.unwrap_or(0);
        let call_id = t.id.clone().unwrap_or_default();
        if self.api == WireApi::Responses {
            self.emit(
                out,
                "response.function_call_arguments.delta",
                json!({"item_id": format!("fc_{call_id}"), "output_index": idx, "delta": args}),
            );
        } else {
            self.emit(
                out,
                "content_block_delta",
                json!({"index": idx, "delta": {"type": "input_json_delta", "partial_json": args}}),
            );
        }
    }

    /// Translate one upstream event; returns the bytes to send the harness.
    pub fn feed(&mut self, ev: &Event) -> Vec<u8> {
        let mut out = Vec::new();
        if self.done {
            return out;
        }
        if ev.data == "[DONE]" {
            self.finish(&mut out);
            return out;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(&ev.data) else {
            return out;
        };
        if let Some(e) = chunk.get("error").filter(|e| !e.is_null()) {
            let msg = super::error_message(e);
            let err = super::ApiError::new(502, "server_error", "upstream_stream_error", msg);
            out.extend(self.api.error_event(&err));
            return out;
        }
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.usage = u.clone();
        }
        if !self.started {
            self.start(&chunk, &mut out);
        }
        for c in chunk
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if c.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                continue;
            }
            if let Some(d) = c.get("delta") {
                for key in ["reasoning_content", "reasoning"] {
                    if let Some(r) = d.get(key).and_then(Value::as_str).filter(|r| !r.is_empty()) {
                        self.reasoning_delta(r, &mut out);
                    }
                }
                if let Some(t) = d
                    .get("content")
                    .and_then(Value::as_str)
                    .filter(|t| !t.is_empty())
                {
                    self.text_delta(t, &mut out);
                }
                for tc in d
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    self.tool_delta(tc, &mut out);
                }
            }
            if let Some(f) = c.get("finish_reason").and_then(Value::as_str) {
                self.finish = Some(f.to_owned());
            }
        }
        out
    }

    /// Close everything and write the terminal events (on `[DONE]`).
    fn finish(&mut self, out: &mut Vec<u8>) {
        if !self.started {
            self.start(&json!({}), out);
        }
        // Tools announced only by arguments (no name ever came) still count.
        let unannounced: Vec<u64> = self
            .tools
            .iter()
            .filter(|(_, t)| t.out_index.is_none())
            .map(|(k, _)| *k)
            .collect();
        for ti in unannounced {
            if let Some(t) = self.tools.get_mut(&ti) {
                t.name.get_or_insert_with(String::new);
            }
            self.tool_delta(&json!({"index": ti}), out);
        }
        self.close(out);
        self.done = true;
        match self.api {
            WireApi::Responses => {
                let r = self.response_object("done");
                let kind = if r["status"] == "incomplete" {
                    "response.incomplete"
                } else {
                    "response.completed"
                };
                self.emit(out, kind, json!({"response": r}));
            }
            _ => {
                let has_tools = !self.tools.is_empty();
                let delta = json!({"stop_reason": stop_reason(self.finish.as_deref(), has_tools), "stop_sequence": null});
                let usage = messages_usage(&self.usage);
                self.emit(
                    out,
                    "message_delta",
                    json!({"delta": delta, "usage": usage}),
                );
                self.emit(out, "message_stop", json!({}));
            }
        }
    }
}

#[cfg(test)]
mod tests;
