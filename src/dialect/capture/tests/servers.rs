//! Fixtures follow each server's response models, field for field and in
//! field order, so that "stripped" can be compared with "what the server
//! returns without the added request fields":
//!
//! - vLLM: `vllm/entrypoints/openai/chat_completion/protocol.py` and
//!   `completion/protocol.py` (the split of `protocol.py`, v0.11+; the
//!   fields are the same in `protocol.py` of v0.10.2, PR #22587).
//!   Whole responses are `JSONResponse(content=model_dump())`: every field,
//!   `null` when unset. Chunks are `model_dump_json(exclude_unset=True)`,
//!   but `serving_chat.py` / `serving_completion.py` pass `logprobs`,
//!   `token_ids` (and on the first chat chunk `prompt_token_ids`) to the
//!   constructor either way, so those keys are `null` when not asked.
//!   A real non-streamed body with `return_token_ids` is quoted in
//!   vllm-project/vllm#28246.
//! - SGLang: `python/sglang/srt/entrypoints/openai/protocol.py`
//!   (`ChatCompletionResponseChoice` / `CompletionResponseChoice` drop
//!   `token_ids`, `prompt_token_ids`, `hidden_states`, `meta_info` when
//!   unset; `SglExt` drops unset fields and responses drop an unset
//!   `sglext`) and `serving_chat.py` (the final `choices: []` chunk
//!   carrying `sglext.input_ids` / `output_ids`, sgl-project/sglang#34488;
//!   `return_token_ids` on chat and completions, #30917).

use serde_json::{json, Map, Value};

pub const PROMPT: [i32; 3] = [151644, 872, 198];
pub const OUT: [i32; 2] = [9707, 151645];

pub fn chat_lp(tokens: &[(&str, f64)]) -> Value {
    json!({"content": tokens.iter().map(|(t, l)| json!({
        "token": t, "logprob": l, "bytes": t.as_bytes(), "top_logprobs": []
    })).collect::<Vec<_>>()})
}

/// vLLM non-streamed chat completion (`ChatCompletionResponse.model_dump()`).
pub fn vllm_chat(lp: bool, ids: bool) -> Value {
    json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": "Hello", "refusal": null,
                        "annotations": null, "audio": null, "function_call": null,
                        "reasoning": null},
            "logprobs": if lp { chat_lp(&[("Hello", -0.25), ("", -0.01)]) } else { Value::Null },
            "finish_reason": "stop", "stop_reason": null,
            "token_ids": if ids { json!(OUT) } else { Value::Null },
            "routed_experts": null,
        }],
        "service_tier": null, "system_fingerprint": null,
        "usage": {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2,
                  "prompt_tokens_details": null},
        "prompt_logprobs": null,
        "prompt_token_ids": if ids { json!(PROMPT) } else { Value::Null },
        "prompt_text": null, "kv_transfer_params": null, "ec_transfer_params": null,
        "metrics": null,
    })
}

/// vLLM streamed chat: role chunk, two content chunks, usage chunk.
pub fn vllm_chat_chunks(lp: bool, ids: bool) -> Vec<Value> {
    let head = |extra: Value| {
        let mut c = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk",
                           "created": 1, "model": "m"});
        c.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        c
    };
    let delta = |text: &str, id: i32, l: f64, finish: Value| {
        head(json!({"choices": [{
            "index": 0, "delta": {"content": text},
            "logprobs": if lp { chat_lp(&[(text, l)]) } else { Value::Null },
            "finish_reason": finish,
            "token_ids": if ids { json!([id]) } else { Value::Null },
        }]}))
    };
    vec![
        head(json!({
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                         "logprobs": null, "finish_reason": null}],
            "prompt_token_ids": if ids { json!(PROMPT) } else { Value::Null },
        })),
        delta("Hello", OUT[0], -0.25, Value::Null),
        delta("", OUT[1], -0.01, json!("stop")),
        head(
            json!({"choices": [], "usage": {"prompt_tokens": 3, "total_tokens": 5,
                                             "completion_tokens": 2}}),
        ),
    ]
}

pub fn cmpl_lp(tokens: &[(&str, f64)]) -> Value {
    json!({
        "text_offset": (0..tokens.len()).collect::<Vec<_>>(),
        "token_logprobs": tokens.iter().map(|t| t.1).collect::<Vec<_>>(),
        "tokens": tokens.iter().map(|t| t.0).collect::<Vec<_>>(),
        "top_logprobs": tokens.iter().map(|(t, l)| json!({*t: l})).collect::<Vec<_>>(),
    })
}

/// vLLM non-streamed completion (`CompletionResponse.model_dump()`).
pub fn vllm_cmpl(lp: bool, ids: bool) -> Value {
    json!({
        "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
        "choices": [{
            "index": 0, "text": " world",
            "logprobs": if lp { cmpl_lp(&[(" world", -0.5), ("", -0.02)]) } else { Value::Null },
            "finish_reason": "stop", "stop_reason": null, "prompt_logprobs": null,
            "prompt_token_ids": if ids { json!(PROMPT) } else { Value::Null },
            "token_ids": if ids { json!(OUT) } else { Value::Null },
        }],
        "service_tier": null, "system_fingerprint": null,
        "usage": {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2,
                  "prompt_tokens_details": null},
        "kv_transfer_params": null,
    })
}

/// vLLM streamed completion: `prompt_token_ids` on the first chunk's choice.
pub fn vllm_cmpl_chunks(lp: bool, ids: bool) -> Vec<Value> {
    let chunk = |i: usize, text: &str, l: f64, finish: Value| {
        json!({"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m",
        "choices": [{
            "index": 0, "text": text,
            "logprobs": if lp { cmpl_lp(&[(text, l)]) } else { Value::Null },
            "finish_reason": finish, "stop_reason": null,
            "prompt_token_ids": if ids && i == 0 { json!(PROMPT) } else { Value::Null },
            "token_ids": if ids { json!([OUT[i]]) } else { Value::Null },
        }]})
    };
    vec![
        chunk(0, " world", -0.5, Value::Null),
        chunk(1, "", -0.02, json!("stop")),
    ]
}

/// SGLang non-streamed chat completion (`return_token_ids`, #30917).
pub fn sglang_chat(lp: bool, ids: bool) -> Value {
    let mut choice = json!({
        "index": 0,
        "message": {"role": "assistant", "content": "Hello", "reasoning_content": null,
                    "tool_calls": null},
        "logprobs": if lp { chat_lp(&[("Hello", -0.25), ("", -0.01)]) } else { Value::Null },
        "finish_reason": "stop", "matched_stop": 151645,
    });
    if ids {
        choice["prompt_token_ids"] = json!(PROMPT);
        choice["token_ids"] = json!(OUT);
    }
    json!({
        "id": "abc", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [choice],
        "usage": {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2,
                  "prompt_tokens_details": null, "reasoning_tokens": 0},
        "metadata": null,
    })
}

/// SGLang streamed chat: ids only in a final `choices: []` chunk carrying
/// `sglext` (#34488); `cached` adds an `sglext` field the harness asked for.
pub fn sglang_chat_chunks(lp: bool, ids: bool, cached: bool) -> Vec<Value> {
    let chunk = |choices: Value, rest: Value| {
        let mut c = json!({"id": "abc", "object": "chat.completion.chunk",
                           "created": 1, "model": "m", "choices": choices, "usage": null});
        c.as_object_mut()
            .unwrap()
            .extend(rest.as_object().unwrap().clone());
        c
    };
    let choice = |delta: Value, l: Option<(&str, f64)>, finish: Value, stop: Value| {
        json!([{"index": 0, "delta": delta,
                "logprobs": match l { Some(t) if lp => chat_lp(&[t]), _ => Value::Null },
                "finish_reason": finish, "matched_stop": stop}])
    };
    let delta = |role: Value, content: &str| {
        json!({"role": role, "content": content, "reasoning_content": null,
               "tool_calls": null})
    };
    let mut out = vec![
        chunk(
            choice(
                delta(json!("assistant"), ""),
                None,
                Value::Null,
                Value::Null,
            ),
            json!({}),
        ),
        chunk(
            choice(
                delta(Value::Null, "Hello"),
                Some(("Hello", -0.25)),
                Value::Null,
                Value::Null,
            ),
            json!({}),
        ),
        chunk(
            choice(
                delta(Value::Null, ""),
                Some(("", -0.01)),
                Value::Null,
                Value::Null,
            ),
            json!({}),
        ),
        chunk(
            choice(delta(Value::Null, ""), None, json!("stop"), json!(151645)),
            json!({}),
        ),
    ];
    let mut ext = Map::new();
    if cached {
        ext.insert(
            "cached_tokens_details".into(),
            json!({"device": 0, "host": 0}),
        );
    }
    if ids {
        ext.insert("input_ids".into(), json!(PROMPT));
        ext.insert("output_ids".into(), json!([OUT]));
    }
    if !ext.is_empty() {
        out.push(chunk(json!([]), json!({"sglext": ext})));
    }
    out.push(chunk(
        json!([]),
        json!({"usage": {"prompt_tokens": 3, "total_tokens": 5,
        "completion_tokens": 2, "prompt_tokens_details": null, "reasoning_tokens": 0}}),
    ));
    out
}

/// SGLang completion (`return_token_ids`, #30917): ids per choice, omitted
/// when not asked; streamed, `prompt_token_ids` on the first chunk only.
pub fn sglang_cmpl_chunks(lp: bool, ids: bool) -> Vec<Value> {
    (0..2)
        .map(|i| {
            let text = [" world", ""][i];
            let l = [-0.5, -0.02][i];
            let mut choice = json!({
                "index": 0, "text": text,
                "logprobs": if lp { cmpl_lp(&[(text, l)]) } else { Value::Null },
                "finish_reason": if i == 1 { json!("stop") } else { Value::Null },
                "matched_stop": null,
            });
            if ids {
                choice["token_ids"] = json!([OUT[i]]);
                if i == 0 {
                    choice["prompt_token_ids"] = json!(PROMPT);
                }
            }
            json!({"id": "abc", "object": "text_completion", "created": 1, "model": "m",
                   "choices": [choice], "usage": null})
        })
        .collect()
}

pub fn sse(chunks: &[Value]) -> Vec<u8> {
    let mut s = String::new();
    for c in chunks {
        s.push_str(&format!("data: {c}\n\n"));
    }
    s.push_str("data: [DONE]\n\n");
    s.into_bytes()
}
