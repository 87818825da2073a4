//! OpenAI Chat Completions: `chat.completion` objects and
//! `chat.completion.chunk` streams, with vLLM's `prompt_token_ids` and
//! `token_ids` and OpenAI's `logprobs` when asked for.

use crate::answer::Answer;
use crate::tokens::{logprob_entries, token_ids};
use serde_json::{json, Value};

impl Answer {
    /// Chat Completions' (and Completions') `usage`.
    pub(crate) fn chat_usage(&self) -> Value {
        let c = self.completion_tokens();
        json!({"prompt_tokens": self.prompt_words, "completion_tokens": c, "total_tokens": self.prompt_words + c,
               "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0}})
    }

    /// A `chat.completion` object.
    pub(crate) fn chat_whole(&self) -> Value {
        let message = match &self.tool {
            Some((name, args)) => {
                json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": format!("call_{}", self.n), "type": "function", "function": {"name": name, "arguments": args}}]})
            }
            None => json!({"role": "assistant", "content": self.text}),
        };
        let mut choice = json!({"index": 0, "message": message, "finish_reason": if self.tool.is_some() {"tool_calls"} else {"stop"}, "logprobs": null});
        if self.logprobs {
            choice["logprobs"] = json!({"content": logprob_entries(&self.generated())});
        }
        let mut v = json!({"id": format!("chatcmpl-scripted-{}", self.n), "object": "chat.completion", "created": 1_700_000_000, "model": self.model,
            "choices": [choice], "usage": self.chat_usage()});
        if self.token_ids {
            v["prompt_token_ids"] = token_ids(&self.prompt);
            v["choices"][0]["token_ids"] = token_ids(&self.generated());
        }
        v
    }

    /// `chat.completion.chunk` events: the role, the content or the tool
    /// call in deltas, the finish reason, usage when
    /// `stream_options.include_usage` asks for it, then `[DONE]`.
    pub(crate) fn chat_events(&self, k: usize) -> Vec<String> {
        let id = format!("chatcmpl-scripted-{}", self.n);
        let chunk = |delta: Value, finish: Value, extra: Option<(&str, Value)>| {
            let mut c = json!({"id": id, "object": "chat.completion.chunk", "created": 1_700_000_000, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]});
            if let Some((k, v)) = extra {
                c["choices"][0][k] = v;
            }
            format!("data: {c}\n\n")
        };
        let mut out = vec![];
        let first_extra = self.token_ids.then(|| token_ids(&self.prompt));
        let mut first = json!({"id": id, "object": "chat.completion.chunk", "created": 1_700_000_000, "model": self.model,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null, "logprobs": null}]});
        if let Some(p) = first_extra {
            first["prompt_token_ids"] = p;
        }
        out.push(format!("data: {first}\n\n"));
        match &self.tool {
            Some((name, args)) => {
                let gen = self.generated();
                let mut head = chunk(
                    json!({"tool_calls": [{"index": 0, "id": format!("call_{}", self.n), "type": "function",
                    "function": {"name": name, "arguments": ""}}]}),
                    Value::Null,
                    self.logprobs
                        .then(|| ("logprobs", json!({"content": logprob_entries(&gen)}))),
                );
                if self.token_ids {
                    let mut v: Value =
                        serde_json::from_str(head.trim_start_matches("data: ").trim())
                            .expect("own json");
                    v["choices"][0]["token_ids"] = token_ids(&gen);
                    head = format!("data: {v}\n\n");
                }
                out.push(head);
                for s in Self::argument_pieces(args, k) {
                    out.push(chunk(
                        json!({"tool_calls": [{"index": 0, "function": {"arguments": s}}]}),
                        Value::Null,
                        None,
                    ));
                }
                out.push(chunk(json!({}), json!("tool_calls"), None));
            }
            None => {
                for p in self.pieces(k) {
                    let mut extra = None;
                    if self.logprobs {
                        extra = Some(("logprobs", json!({"content": logprob_entries(&p)})));
                    }
                    let mut c = chunk(json!({"content": p}), Value::Null, extra);
                    if self.token_ids {
                        let mut v: Value =
                            serde_json::from_str(c.trim_start_matches("data: ").trim())
                                .expect("own json");
                        v["choices"][0]["token_ids"] = token_ids(&p);
                        c = format!("data: {v}\n\n");
                    }
                    out.push(c);
                }
                out.push(chunk(json!({}), json!("stop"), None));
            }
        }
        if self.include_usage {
            let u = json!({"id": id, "object": "chat.completion.chunk", "created": 1_700_000_000, "model": self.model,
                "choices": [], "usage": self.chat_usage()});
            out.push(format!("data: {u}\n\n"));
        }
        out.push("data: [DONE]\n\n".into());
        out
    }
}
