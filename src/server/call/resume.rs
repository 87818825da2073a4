//! Continuing a stream that an `abort` pause cut after its head had reached
//! the harness: once the route resumes, the answer so far goes back to the
//! upstream as the start of the assistant's message (vLLM's and SGLang's
//! `continue_final_message`), and the rest is streamed to the harness as
//! part of the same answer. The harness sees one stream with one id.
//!
//! Only where it can be exact: a Chat Completions upstream of a vLLM or
//! SGLang route, with token capture (the record must say where the new
//! policy's tokens start), one choice, and an answer that is text so far (a
//! tool call or reasoning half-streamed cannot be handed back as text). Any
//! other stream finishes as it is, under the old weights.

use crate::server::pause::Gate;
use bytes::Bytes;
use http::HeaderMap;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// What a stream needs to be continued after an `abort` pause.
pub struct Resume {
    pub gate: Arc<Gate>,
    pub endpoint: String,
    pub headers: HeaderMap,
    /// The body sent upstream.
    pub body: Bytes,
    pub translated: bool,
    pub rollout: String,
    pub max_wait: Duration,
}

/// What the upstream has streamed so far, read event by event.
#[derive(Debug, Default)]
pub struct Progress {
    pub id: Option<String>,
    pub text: String,
    /// Completion token ids streamed so far.
    pub tokens: u64,
    /// Text was streamed without its token ids.
    missing_ids: bool,
    /// Something was streamed that text cannot carry back (a tool call,
    /// reasoning, a second choice), or the answer finished.
    spoiled: bool,
}

fn nonempty(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(_) => true,
    }
}

impl Progress {
    /// Read one Chat Completions chunk from the upstream.
    pub fn observe(&mut self, chunk: &Value) {
        if self.id.is_none() {
            self.id = chunk.get("id").and_then(Value::as_str).map(str::to_owned);
        }
        let Some(choices) = chunk.get("choices").and_then(Value::as_array) else {
            return;
        };
        for c in choices {
            if c.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                self.spoiled = true;
                continue;
            }
            let delta = c.get("delta");
            if let Some(t) = delta.and_then(|d| d.get("content")).and_then(Value::as_str) {
                self.text.push_str(t);
            }
            let d = |k| delta.and_then(|d| d.get(k));
            if nonempty(d("tool_calls"))
                || nonempty(d("reasoning_content"))
                || nonempty(d("reasoning"))
                || nonempty(c.get("finish_reason"))
            {
                self.spoiled = true;
            }
            match c.get("token_ids").and_then(Value::as_array) {
                Some(ids) => self.tokens += ids.len() as u64,
                None if nonempty(d("content")) => self.missing_ids = true,
                None => {}
            }
        }
    }

    /// Completion token ids streamed so far, when every piece of output
    /// came with its ids.
    pub fn counted(&self) -> Option<u64> {
        (!self.missing_ids).then_some(self.tokens)
    }

    /// The stream can be continued from here.
    pub fn resumable(&self) -> bool {
        !self.spoiled && !self.missing_ids && self.tokens > 0 && self.id.is_some()
    }
}

/// The request that continues `body`'s answer from `text`.
pub fn continuation_body(body: &[u8], text: &str) -> Option<Bytes> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let obj = v.as_object_mut()?;
    obj.get_mut("messages")?
        .as_array_mut()?
        .push(json!({"role": "assistant", "content": text}));
    obj.insert("continue_final_message".into(), Value::Bool(true));
    obj.insert("add_generation_prompt".into(), Value::Bool(false));
    serde_json::to_vec(&v).ok().map(Bytes::from)
}

/// Make a chunk of the continuation part of the first answer: its id, no
/// second `role`, no prompt ids (the first answer's are the prompt's), and
/// usage counted as one answer's (the `tokens` before the cut were the
/// completion's, not the prompt's).
pub fn rewrite(chunk: &mut Value, id: &str, tokens: u64) {
    let Some(obj) = chunk.as_object_mut() else {
        return;
    };
    obj.insert("id".into(), Value::String(id.to_owned()));
    obj.remove("prompt_token_ids");
    obj.remove("prompt_logprobs");
    if let Some(choices) = obj.get_mut("choices").and_then(Value::as_array_mut) {
        for c in choices.iter_mut().filter_map(Value::as_object_mut) {
            c.remove("prompt_token_ids");
            if let Some(d) = c.get_mut("delta").and_then(Value::as_object_mut) {
                d.remove("role");
            }
        }
    }
    if let Some(u) = obj.get_mut("usage").and_then(Value::as_object_mut) {
        let n = |u: &serde_json::Map<String, Value>, k: &str| u.get(k).and_then(Value::as_u64);
        if let (Some(p), Some(c)) = (n(u, "prompt_tokens"), n(u, "completion_tokens")) {
            u.insert("prompt_tokens".into(), json!(p.saturating_sub(tokens)));
            u.insert("completion_tokens".into(), json!(c + tokens));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(content: &str, ids: &[i32]) -> Value {
        json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": content}, "token_ids": ids}]})
    }

    #[test]
    fn text_with_token_ids_can_be_continued_and_tool_calls_cannot() {
        let mut p = Progress::default();
        p.observe(&json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "token_ids": []}]}));
        p.observe(&chunk("Hel", &[1, 2]));
        p.observe(&chunk("lo", &[3]));
        assert!(p.resumable());
        assert_eq!((p.text.as_str(), p.tokens), ("Hello", 3));
        p.observe(&json!({"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0}]}}]}));
        assert!(!p.resumable());
        let mut no_ids = Progress::default();
        no_ids.observe(&json!({"id": "x", "choices": [{"index": 0, "delta": {"content": "a"}}]}));
        assert!(
            !no_ids.resumable(),
            "without token ids the record could not say where the new policy starts"
        );
        let mut done = Progress::default();
        done.observe(&json!({"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "token_ids": [1]}]}));
        assert!(!done.resumable());
    }

    #[test]
    fn the_continuation_asks_to_continue_and_its_chunks_join_the_first_answer() {
        let body = continuation_body(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
            "Hel",
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v["messages"][1],
            json!({"role": "assistant", "content": "Hel"})
        );
        assert_eq!(
            (
                v["continue_final_message"].clone(),
                v["add_generation_prompt"].clone()
            ),
            (json!(true), json!(false))
        );
        assert!(continuation_body(b"[1]", "x").is_none());
        let mut c = json!({"id": "other", "prompt_token_ids": [9], "choices": [{"index": 0, "delta": {"role": "assistant", "content": "lo"}}],
                           "usage": {"prompt_tokens": 13, "completion_tokens": 2, "total_tokens": 15}});
        rewrite(&mut c, "chatcmpl-1", 3);
        assert_eq!(c["id"], "chatcmpl-1");
        assert!(
            c.get("prompt_token_ids").is_none() && c["choices"][0]["delta"].get("role").is_none()
        );
        assert_eq!(
            c["usage"],
            json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
        );
    }
}
