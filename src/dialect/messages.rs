//! Anthropic Messages: assemble an event stream (`message_start`, content
//! blocks, `message_delta`, `message_stop`) into one `message`, and read the
//! fields a trainer needs from it.

use super::{int_at, sse::Event, Assembled, Normalized, StreamOutcome, Usage};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// One content block being assembled.
#[derive(Default)]
struct Block {
    block: Map<String, Value>,
    text: String,
    partial_json: String,
}

/// Join Messages stream events into one `message` object.
pub fn assemble_stream(events: &[Event]) -> StreamOutcome {
    let mut message: Option<Map<String, Value>> = None;
    let mut blocks: BTreeMap<u64, Block> = BTreeMap::new();
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
        let index = data.get("index").and_then(Value::as_u64).unwrap_or(0);
        match kind {
            "message_start" => {
                message = data.get("message").and_then(Value::as_object).cloned();
            }
            "content_block_start" => {
                let block = data
                    .get("content_block")
                    .and_then(Value::as_object)
                    .cloned()
                    .unwrap_or_default();
                blocks.insert(
                    index,
                    Block {
                        block,
                        ..Block::default()
                    },
                );
            }
            "content_block_delta" => {
                let b = blocks.entry(index).or_default();
                let d = data.get("delta").unwrap_or(&Value::Null);
                match d.get("type").and_then(Value::as_str) {
                    Some("text_delta") => b
                        .text
                        .push_str(d.get("text").and_then(Value::as_str).unwrap_or("")),
                    Some("thinking_delta") => b
                        .text
                        .push_str(d.get("thinking").and_then(Value::as_str).unwrap_or("")),
                    Some("input_json_delta") => b
                        .partial_json
                        .push_str(d.get("partial_json").and_then(Value::as_str).unwrap_or("")),
                    Some("signature_delta") => {
                        if let Some(s) = d.get("signature") {
                            b.block.insert("signature".into(), s.clone());
                        }
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                let m = message.get_or_insert_with(Map::new);
                if let Some(d) = data.get("delta").and_then(Value::as_object) {
                    for (k, v) in d {
                        m.insert(k.clone(), v.clone());
                    }
                }
                if let Some(u) = data.get("usage").and_then(Value::as_object) {
                    let usage = m
                        .entry("usage")
                        .or_insert_with(|| json!({}))
                        .as_object_mut();
                    if let Some(usage) = usage {
                        for (k, v) in u {
                            if !v.is_null() {
                                usage.insert(k.clone(), v.clone());
                            }
                        }
                    }
                }
            }
            "error" => outcome.note_error(data.get("error").unwrap_or(&data)),
            _ => {}
        }
    }
    let Some(mut m) = message else {
        return outcome;
    };
    let content: Vec<Value> = blocks
        .into_values()
        .map(|b| {
            let mut block = b.block;
            match block.get("type").and_then(Value::as_str) {
                Some("text") => {
                    block.insert("text".into(), json!(b.text));
                }
                Some("thinking") => {
                    block.insert("thinking".into(), json!(b.text));
                }
                Some("tool_use") | Some("server_tool_use") if !b.partial_json.is_empty() => {
                    let input = serde_json::from_str(&b.partial_json)
                        .unwrap_or(Value::String(b.partial_json));
                    block.insert("input".into(), input);
                }
                _ => {}
            }
            Value::Object(block)
        })
        .collect();
    m.insert("content".into(), Value::Array(content));
    outcome.response = Some(Value::Object(m));
    outcome
}

/// Read message, tool calls, stop reason and usage from a `message`, in
/// chat format (content, reasoning_content, tool_calls).
pub fn extract(resp: &Value, out: &mut Assembled) {
    let mut content: Option<String> = None;
    let mut reasoning: Option<String> = None;
    let mut calls = Vec::new();
    for b in resp
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => content
                .get_or_insert_with(String::new)
                .push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("thinking") => reasoning
                .get_or_insert_with(String::new)
                .push_str(b.get("thinking").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => calls.push(json!({
                "id": b.get("id"),
                "type": "function",
                "function": {"name": b.get("name"), "arguments": arguments_text(b.get("input"))},
            })),
            _ => {}
        }
    }
    let mut msg = json!({"role": "assistant", "content": content});
    if let Some(r) = reasoning {
        msg["reasoning_content"] = json!(r);
    }
    if !calls.is_empty() {
        msg["tool_calls"] = Value::Array(calls.clone());
        out.tool_calls = Some(Value::Array(calls));
    }
    out.message = Some(msg);
    out.finish_reason = resp
        .get("stop_reason")
        .and_then(Value::as_str)
        .map(str::to_owned);
    out.usage = usage(resp.get("usage").unwrap_or(&Value::Null));
}

/// A tool_use `input` as the JSON text chat tool calls carry.
pub(crate) fn arguments_text(input: Option<&Value>) -> String {
    match input {
        Some(Value::String(s)) => s.clone(),
        Some(v) => v.to_string(),
        None => "{}".into(),
    }
}

/// Messages usage in rollcall's terms: prompt tokens include cache reads and
/// writes, which Anthropic counts apart from `input_tokens`.
pub(crate) fn usage(u: &Value) -> Usage {
    let input = int_at(u, &["input_tokens"]);
    let cache_read = int_at(u, &["cache_read_input_tokens"]);
    let cache_write = int_at(u, &["cache_creation_input_tokens"]);
    // Sums of numbers the upstream sent: one that overflows is not a count.
    let prompt = input.and_then(|i| {
        i.checked_add(cache_read.unwrap_or(0))?
            .checked_add(cache_write.unwrap_or(0))
    });
    let completion = int_at(u, &["output_tokens"]);
    Usage {
        prompt,
        completion,
        total: prompt.zip(completion).and_then(|(p, c)| p.checked_add(c)),
        cached: cache_read,
        reasoning: None,
    }
}

/// `system` and `messages` as chat messages; tools in chat format.
pub fn normalize_request(req: &Value) -> Normalized {
    let t = super::translate::messages_to_chat(req, super::translate::Unsupported::Drop);
    match t {
        Ok(t) => Normalized {
            messages: t.request.get("messages").cloned().unwrap_or(json!([])),
            tools: t.request.get("tools").cloned(),
        },
        Err(_) => Normalized {
            messages: req.get("messages").cloned().unwrap_or(json!([])),
            tools: req.get("tools").cloned(),
        },
    }
}

#[cfg(test)]
mod tests {
    use crate::dialect::WireApi;

    #[test]
    fn assembles_text_thinking_and_tool_use() {
        let s = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"m\",\"content\":[],\"stop_reason\":null,\"usage\":{\"input_tokens\":10,\"output_tokens\":1,\"cache_read_input_tokens\":4}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hmm\"}}\n\n",
            "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi \"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"there\"}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"Bash\",\"input\":{}}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"command\\\":\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"\\\"ls\\\"}\"}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":7}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        let a = WireApi::Messages.assemble(s.as_bytes(), true);
        let msg = a.message.unwrap();
        assert_eq!(msg["content"], "Hi there");
        assert_eq!(msg["reasoning_content"], "hmm");
        assert_eq!(msg["tool_calls"][0]["function"]["name"], "Bash");
        assert_eq!(
            msg["tool_calls"][0]["function"]["arguments"],
            "{\"command\":\"ls\"}"
        );
        assert_eq!(a.finish_reason.as_deref(), Some("tool_use"));
        assert_eq!(a.usage.prompt, Some(14));
        assert_eq!(a.usage.completion, Some(7));
        assert_eq!(a.usage.cached, Some(4));
        let r = a.response.unwrap();
        assert_eq!(r["content"][2]["input"]["command"], "ls");
    }

    #[test]
    fn usage_sums_that_overflow_are_unknown() {
        let u = serde_json::json!({"input_tokens": i64::MAX, "cache_read_input_tokens": 1, "output_tokens": 2});
        let u = super::usage(&u);
        assert_eq!((u.prompt, u.total, u.completion), (None, None, Some(2)));
        let u = serde_json::json!({"input_tokens": 1, "output_tokens": i64::MAX});
        assert_eq!(super::usage(&u).total, None);
    }
}
