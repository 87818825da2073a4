//! OpenAI Responses: `response` objects and their typed, numbered events.

use crate::answer::Answer;
use serde_json::{json, Value};

impl Answer {
    /// A `response` object with `status`; its output and usage only once
    /// `completed`.
    pub(crate) fn response_object(&self, status: &str) -> Value {
        let output = match &self.tool {
            Some((name, args)) => {
                json!([{"type": "function_call", "id": format!("fc_{}", self.n), "call_id": format!("call_{}", self.n),
                "name": name, "arguments": args, "status": "completed"}])
            }
            None => {
                json!([{"type": "message", "id": format!("msg_{}", self.n), "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": self.text, "annotations": []}]}])
            }
        };
        let c = self.completion_tokens();
        json!({"id": format!("resp_{}", self.n), "object": "response", "created_at": 1_700_000_000, "status": status,
            "model": self.model, "output": if status == "completed" { output } else { json!([]) },
            "usage": if status == "completed" { json!({"input_tokens": self.prompt_words, "output_tokens": c, "total_tokens": self.prompt_words + c,
                "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}) } else { Value::Null }})
    }

    /// Responses events, each with its `sequence_number`: created,
    /// in progress, the one output item added, its text or arguments in
    /// deltas, done, completed.
    pub(crate) fn responses_events(&self, k: usize) -> Vec<String> {
        let mut seq = 0u64;
        let mut ev = |kind: &str, mut data: Value| {
            data["type"] = json!(kind);
            data["sequence_number"] = json!(seq);
            seq += 1;
            format!("event: {kind}\ndata: {data}\n\n")
        };
        let mut out = vec![
            ev(
                "response.created",
                json!({"response": self.response_object("in_progress")}),
            ),
            ev(
                "response.in_progress",
                json!({"response": self.response_object("in_progress")}),
            ),
        ];
        let done = self.response_object("completed");
        let item = done["output"][0].clone();
        match &self.tool {
            Some((_, args)) => {
                let mut added = item.clone();
                added["arguments"] = json!("");
                added["status"] = json!("in_progress");
                out.push(ev(
                    "response.output_item.added",
                    json!({"output_index": 0, "item": added}),
                ));
                for s in Self::argument_pieces(args, k) {
                    out.push(ev(
                        "response.function_call_arguments.delta",
                        json!({"output_index": 0, "item_id": item["id"], "delta": s}),
                    ));
                }
                out.push(ev(
                    "response.function_call_arguments.done",
                    json!({"output_index": 0, "item_id": item["id"], "arguments": args}),
                ));
            }
            None => {
                let mut added = item.clone();
                added["content"] = json!([]);
                added["status"] = json!("in_progress");
                out.push(ev(
                    "response.output_item.added",
                    json!({"output_index": 0, "item": added}),
                ));
                out.push(ev(
                    "response.content_part.added",
                    json!({"output_index": 0, "item_id": item["id"], "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []}}),
                ));
                for p in self.pieces(k) {
                    out.push(ev("response.output_text.delta", json!({"output_index": 0, "item_id": item["id"], "content_index": 0, "delta": p})));
                }
                out.push(ev("response.output_text.done", json!({"output_index": 0, "item_id": item["id"], "content_index": 0, "text": self.text})));
                out.push(ev(
                    "response.content_part.done",
                    json!({"output_index": 0, "item_id": item["id"], "content_index": 0,
                    "part": {"type": "output_text", "text": self.text, "annotations": []}}),
                ));
            }
        }
        out.push(ev(
            "response.output_item.done",
            json!({"output_index": 0, "item": item}),
        ));
        out.push(ev("response.completed", json!({"response": done})));
        out
    }
}
