//! Chat Completions → Responses / Messages, streamed: [`StreamTranslator`]
//! turns a chat chunk stream into a Responses or Messages event stream,
//! event by event as chunks arrive.

use super::response::{
    chat_id, function_item, message_item, messages_usage, reasoning_item, responses_status,
    responses_usage, stop_reason,
};
use crate::dialect::sse::Event;
use crate::dialect::WireApi;
use serde_json::{json, Value};
use std::collections::BTreeMap;

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
                crate::dialect::push_name(&mut t.name, n);
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
            let msg = crate::dialect::error_message(e);
            let err =
                crate::dialect::ApiError::new(502, "server_error", "upstream_stream_error", msg);
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
