//! OpenAI Responses: assemble an event stream into one `response` object,
//! read the fields a trainer needs, and normalize `input` items to chat
//! messages.

use super::{
    error_message, int_at, sse::Event, Assembled, Normalized, StreamFailure, StreamFailureKind,
    StreamOutcome, Usage,
};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// The final `response` object of a stream: the one carried by
/// `response.completed` (or `failed`/`incomplete`), else rebuilt from the
/// items and deltas seen before the stream ended.
pub fn assemble_stream(events: &[Event]) -> StreamOutcome {
    let mut base: Option<Map<String, Value>> = None;
    let mut done_items: BTreeMap<u64, Value> = BTreeMap::new();
    let mut partial_text: BTreeMap<u64, String> = BTreeMap::new();
    let mut outcome = StreamOutcome::default();
    for ev in events {
        let Ok(data) = serde_json::from_str::<Value>(&ev.data) else {
            continue;
        };
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .or(ev.event.as_deref())
            .unwrap_or("");
        match kind {
            "response.completed" | "response.failed" | "response.incomplete" => {
                let r = data.get("response").filter(|r| r.is_object());
                let said = match kind {
                    "response.failed" => Some(StreamFailureKind::Failed),
                    "response.incomplete" => Some(StreamFailureKind::Incomplete),
                    _ => None,
                };
                // The response's status and error say it best; else the event's name.
                let failure = r.and_then(status_failure).or_else(|| {
                    said.map(|failed| StreamFailure {
                        kind: failed,
                        message: format!("the upstream sent {kind}"),
                    })
                });
                if failure.is_some() {
                    outcome.failure = failure;
                }
                if let Some(r) = r {
                    outcome.response = Some(r.clone());
                    return outcome;
                }
            }
            "response.created" | "response.in_progress" => {
                // Only an object can be completed below; anything else is
                // not a response.
                base = data
                    .get("response")
                    .and_then(Value::as_object)
                    .cloned()
                    .or(base);
            }
            "response.output_item.done" => {
                let idx = data
                    .get("output_index")
                    .and_then(Value::as_u64)
                    .unwrap_or(done_items.len() as u64);
                if let Some(item) = data.get("item") {
                    done_items.insert(idx, item.clone());
                }
            }
            "response.output_text.delta" => {
                let idx = data
                    .get("output_index")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                if let Some(d) = data.get("delta").and_then(Value::as_str) {
                    partial_text.entry(idx).or_default().push_str(d);
                }
            }
            "error" => outcome.note_error(&data),
            _ => {}
        }
    }
    let mut resp = match base {
        Some(b) => b,
        None if done_items.is_empty() && partial_text.is_empty() => return outcome,
        None => Map::from_iter([("object".into(), json!("response"))]),
    };
    for (idx, text) in partial_text {
        done_items.entry(idx).or_insert_with(|| {
            json!({"type": "message", "role": "assistant", "status": "incomplete",
                   "content": [{"type": "output_text", "text": text, "annotations": []}]})
        });
    }
    resp.insert(
        "output".into(),
        Value::Array(done_items.into_values().collect()),
    );
    resp.insert("status".into(), json!("incomplete"));
    outcome.response = Some(Value::Object(resp));
    outcome
}

/// The failure a `response` object's `status` reports: `failed` (with its
/// `error`), or `incomplete` (with its reason).
pub(crate) fn status_failure(resp: &Value) -> Option<StreamFailure> {
    let (kind, message) = match resp.get("status").and_then(Value::as_str)? {
        "failed" => (
            StreamFailureKind::Failed,
            resp.get("error")
                .filter(|e| !e.is_null())
                .map_or_else(|| "the response failed".to_owned(), error_message),
        ),
        "incomplete" => (
            StreamFailureKind::Incomplete,
            format!(
                "incomplete: {}",
                resp.pointer("/incomplete_details/reason")
                    .and_then(Value::as_str)
                    .unwrap_or("no reason given")
            ),
        ),
        _ => return None,
    };
    Some(StreamFailure { kind, message })
}

/// Read message, tool calls, usage and finish reason from a `response`.
pub fn extract(resp: &Value, out: &mut Assembled) {
    let mut content: Option<String> = None;
    let mut reasoning: Option<String> = None;
    let mut calls = Vec::new();
    for item in resp
        .get("output")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                for part in item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(t) = part.get("text").and_then(Value::as_str) {
                        content.get_or_insert_with(String::new).push_str(t);
                    }
                }
            }
            Some("reasoning") => {
                for key in ["content", "summary"] {
                    for part in item
                        .get(key)
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        if let Some(t) = part.get("text").and_then(Value::as_str) {
                            reasoning.get_or_insert_with(String::new).push_str(t);
                        }
                    }
                }
            }
            Some("function_call") => calls.push(json!({
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments")},
            })),
            _ => {}
        }
    }
    let mut msg = Map::new();
    msg.insert("role".into(), json!("assistant"));
    msg.insert("content".into(), content.map_or(Value::Null, Value::String));
    if let Some(r) = reasoning {
        msg.insert("reasoning_content".into(), json!(r));
    }
    if !calls.is_empty() {
        msg.insert("tool_calls".into(), Value::Array(calls.clone()));
        out.tool_calls = Some(Value::Array(calls.clone()));
    }
    out.message = Some(Value::Object(msg));
    out.finish_reason = Some(
        match resp.get("status").and_then(Value::as_str) {
            Some("incomplete") => match resp
                .pointer("/incomplete_details/reason")
                .and_then(Value::as_str)
            {
                Some("max_output_tokens") => "length",
                Some("content_filter") => "content_filter",
                _ => "incomplete",
            },
            Some("failed") => "error",
            _ if !calls.is_empty() => "tool_calls",
            _ => "stop",
        }
        .to_owned(),
    );
    out.usage = usage(resp.get("usage").unwrap_or(&Value::Null));
}

pub(crate) fn usage(u: &Value) -> Usage {
    Usage {
        prompt: int_at(u, &["input_tokens"]),
        completion: int_at(u, &["output_tokens"]),
        total: int_at(u, &["total_tokens"]),
        cached: int_at(u, &["input_tokens_details", "cached_tokens"]),
        reasoning: int_at(u, &["output_tokens_details", "reasoning_tokens"]),
    }
}

/// Text of a content value: a string, or the `text` of its parts joined.
fn text_of(content: &Value) -> Value {
    match content {
        Value::Array(parts) if parts.iter().all(|p| p.get("text").is_some()) => Value::String(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// `instructions` and `input` items as chat messages; function tools in chat format.
pub fn normalize_request(req: &Value) -> Normalized {
    let mut msgs: Vec<Value> = Vec::new();
    if let Some(i) = req.get("instructions").filter(|i| !i.is_null()) {
        msgs.push(json!({"role": "system", "content": text_of(i)}));
    }
    let mut pending_reasoning: Option<String> = None;
    match req.get("input") {
        Some(Value::String(s)) => msgs.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for item in items {
                let kind = item
                    .get("type")
                    .and_then(Value::as_str)
                    .unwrap_or("message");
                match kind {
                    "message" => {
                        let role = item.get("role").and_then(Value::as_str).unwrap_or("user");
                        let mut m = json!({"role": role, "content": text_of(item.get("content").unwrap_or(&Value::Null))});
                        if role == "assistant" {
                            if let Some(r) = pending_reasoning.take() {
                                m["reasoning_content"] = json!(r);
                            }
                        }
                        msgs.push(m);
                    }
                    "function_call" => {
                        let call = json!({
                            "id": item.get("call_id"),
                            "type": "function",
                            "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                        });
                        let extend_last = msgs.last().is_some_and(|m| {
                            m["role"] == "assistant" && m.get("tool_calls").is_some()
                        });
                        if extend_last {
                            if let Some(Value::Array(tc)) =
                                msgs.last_mut().and_then(|m| m.get_mut("tool_calls"))
                            {
                                tc.push(call);
                            }
                        } else if msgs.last().is_some_and(|m| m["role"] == "assistant") {
                            if let Some(m) = msgs.last_mut() {
                                m["tool_calls"] = json!([call]);
                            }
                        } else {
                            let mut m =
                                json!({"role": "assistant", "content": null, "tool_calls": [call]});
                            if let Some(r) = pending_reasoning.take() {
                                m["reasoning_content"] = json!(r);
                            }
                            msgs.push(m);
                        }
                    }
                    "function_call_output" => msgs.push(json!({
                        "role": "tool",
                        "tool_call_id": item.get("call_id"),
                        "content": text_of(item.get("output").unwrap_or(&Value::Null)),
                    })),
                    "reasoning" => {
                        let mut text = String::new();
                        for key in ["content", "summary"] {
                            for p in item
                                .get(key)
                                .and_then(Value::as_array)
                                .into_iter()
                                .flatten()
                            {
                                text.push_str(p.get("text").and_then(Value::as_str).unwrap_or(""));
                            }
                        }
                        pending_reasoning = Some(text);
                    }
                    _ => msgs.push(json!({"role": "item", "content": item})),
                }
            }
        }
        _ => {}
    }
    let tools = req.get("tools").and_then(Value::as_array).map(|tools| {
        Value::Array(
            tools
                .iter()
                .map(|t| {
                    if t.get("type").and_then(Value::as_str) == Some("function")
                        && t.get("function").is_none()
                    {
                        let mut f = Map::new();
                        for key in ["name", "description", "parameters", "strict"] {
                            if let Some(v) = t.get(key) {
                                f.insert(key.into(), v.clone());
                            }
                        }
                        json!({"type": "function", "function": f})
                    } else {
                        t.clone()
                    }
                })
                .collect(),
        )
    });
    Normalized {
        messages: Value::Array(msgs),
        tools,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_codex_style_input() {
        let req = json!({
            "instructions": "be brief",
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]},
                {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"cmd\":\"ls\"}"},
                {"type": "function_call_output", "call_id": "c1", "output": "a.txt"}
            ],
            "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}, {"type": "web_search"}]
        });
        let n = normalize_request(&req);
        assert_eq!(n.messages[0]["role"], "system");
        assert_eq!(n.messages[1]["content"], "list files");
        assert_eq!(n.messages[2]["tool_calls"][0]["function"]["name"], "shell");
        assert_eq!(n.messages[3]["tool_call_id"], "c1");
        let tools = n.tools.unwrap();
        assert_eq!(tools[0]["function"]["name"], "shell");
        assert_eq!(tools[1]["type"], "web_search");
    }

    #[test]
    fn rebuilds_a_cut_stream() {
        let s = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"r1\",\"object\":\"response\",\"status\":\"in_progress\",\"output\":[]}}\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"par\"}\n\n",
        );
        let a = crate::dialect::WireApi::Responses.assemble(s.as_bytes(), true);
        assert_eq!(a.message.unwrap()["content"], "par");
        assert_eq!(a.response.unwrap()["status"], "incomplete");
    }

    #[test]
    fn a_response_that_is_not_an_object_is_not_a_base() {
        // `response.created` with a string used to panic on `resp["output"] = …`.
        let s = concat!(
            "data: {\"type\":\"response.created\",\"response\":\"a string\"}\n\n",
            "data: {\"type\":\"response.completed\",\"response\":7}\n\n",
            "data: {\"type\":\"response.output_text.delta\",\"output_index\":0,\"delta\":\"x\"}\n\n",
        );
        let a = crate::dialect::WireApi::Responses.assemble(s.as_bytes(), true);
        assert_eq!(a.message.unwrap()["content"], "x");
        let r = a.response.unwrap();
        assert_eq!(r["object"], "response");
        assert_eq!(r["status"], "incomplete");
    }
}
