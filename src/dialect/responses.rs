//! OpenAI Responses: assemble an event stream into one `response` object,
//! read the fields a trainer needs, and normalize a request to chat messages
//! (with translation's conversion of `input` items,
//! [`translate::responses_messages`]).

use super::{
    error_message, int_at, sse::Event, translate, Assembled, Normalized, StreamFailure,
    StreamFailureKind, StreamOutcome, Usage,
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
                super::at(resp, &["incomplete_details", "reason"])
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
            Some("incomplete") => {
                match super::at(resp, &["incomplete_details", "reason"]).and_then(Value::as_str) {
                    Some("max_output_tokens") => "length",
                    Some("content_filter") => "content_filter",
                    _ => "incomplete",
                }
            }
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

/// `instructions` and `input` items as chat messages, converted as
/// translation converts them ([`translate::responses_messages`]), so that the
/// recorded `messages` are what a Chat Completions upstream is sent; `null`
/// when the input is not valid. Function tools in chat form; other tools
/// (`web_search`, …) as they are.
pub fn normalize_request(req: &Value) -> Normalized {
    let messages = translate::responses_messages(req).map_or(Value::Null, Value::Array);
    let tools = req.get("tools").and_then(Value::as_array).map(|tools| {
        Value::Array(
            tools
                .iter()
                .map(|t| {
                    if t.get("type").and_then(Value::as_str) == Some("function") {
                        translate::function_tool(t)
                    } else {
                        t.clone()
                    }
                })
                .collect(),
        )
    });
    Normalized { messages, tools }
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

    /// The recorded messages are the translated request's: the cases where
    /// the column's converter and translation's once differed (roles,
    /// content parts, reasoning, call ids and arguments, tool output parts,
    /// item types Chat Completions has no equivalent for).
    #[test]
    fn normalized_messages_are_the_translated_ones() {
        let req = json!({
            "model": "m",
            "instructions": [{"type": "input_text", "text": "be brief"}],
            "input": [
                {"type": "message", "role": "developer", "content": "rules"},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
                {"type": "reasoning", "summary": []},
                {"type": "web_search_call", "id": "ws_1", "status": "completed"},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
                {"type": "function_call", "id": "fc_1", "name": "shell"},
                {"type": "function_call_output", "call_id": "fc_1", "output": [{"type": "input_text", "text": "/w"}]},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "done?"}]},
            ],
        });
        let want = json!([
            {"role": "system", "content": "be brief"},
            {"role": "system", "content": "rules"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": null, "reasoning_content": "think",
             "tool_calls": [{"id": "fc_1", "type": "function", "function": {"name": "shell", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "fc_1", "content": "/w"},
            {"role": "assistant", "content": "", "reasoning_content": "done?"},
        ]);
        assert_eq!(normalize_request(&req).messages, want);
        let t = translate::responses_to_chat(&req, translate::Unsupported::Drop).unwrap();
        assert_eq!(t.request["messages"], want);
        assert_eq!(t.dropped, vec!["a web_search_call input item".to_owned()]);
    }

    #[test]
    fn normalizes_what_translation_refuses_but_no_invalid_input() {
        // Server-side state cannot be translated; its input is still recorded.
        let req = json!({"input": "x", "previous_response_id": "resp_1", "store": true});
        assert!(translate::responses_to_chat(&req, translate::Unsupported::Drop).is_err());
        assert_eq!(
            normalize_request(&req).messages,
            json!([{"role": "user", "content": "x"}])
        );
        for bad in [
            json!({"input": 5}),
            json!({"input": [{"type": "message", "content": 5}]}),
        ] {
            assert_eq!(normalize_request(&bad).messages, Value::Null);
        }
        let req = json!({"tools": [
            {"type": "function", "name": "f", "description": null, "parameters": {"type": "object"}},
            {"type": "function", "function": {"name": "g"}}]});
        let want = json!([
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},
            {"type": "function", "function": {"name": "g"}}]);
        assert_eq!(normalize_request(&req).tools, Some(want.clone()));
        let t = translate::responses_to_chat(&req, translate::Unsupported::Reject).unwrap();
        assert_eq!(t.request["tools"], want);
    }

    /// Codex's own requests (`fixtures/codex`): its `developer` messages are
    /// `system` ones, in the record as upstream.
    #[test]
    fn codex_fixture_normalizes_as_it_translates() {
        for line in include_str!("../../fixtures/codex/exchange.jsonl").lines() {
            let call: Value = serde_json::from_str(line).unwrap();
            let req: Value = serde_json::from_str(call["request"].as_str().unwrap()).unwrap();
            assert_eq!(req["input"][0]["role"], "developer");
            let t = translate::responses_to_chat(&req, translate::Unsupported::Drop).unwrap();
            let n = normalize_request(&req);
            assert_eq!(n.messages, t.request["messages"]);
            assert_eq!(n.messages[0]["role"], "system");
        }
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
