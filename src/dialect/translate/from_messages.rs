//! Messages → Chat Completions: an Anthropic Messages request (system
//! prompt, content blocks, tool use and results, tools, tool choice) as a
//! chat request ([`messages_to_chat`]).

use super::{chat_content, copy, stream_fields, Builder, ChatRequest, TranslateError, Unsupported};
use serde_json::{json, Map, Value};

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
                            "function": {"name": block.get("name"), "arguments": crate::dialect::messages::arguments_text(block.get("input"))},
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
