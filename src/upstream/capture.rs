//! Token capture for routes served by vLLM or SGLang: ask the server for the
//! prompt token ids, the sampled token ids and per-token logprobs of a Chat
//! Completions or legacy Completions call, then take back out of the response
//! what the harness did not ask for, so it sees what it would have seen
//! without the proxy. The recorded row keeps the ids and logprobs. Nothing
//! is ever re-tokenized: what a server does not return stays absent, and the
//! row's `token_capture` column says what it holds. See `docs/tokens.md`.
//!
//! Use, per call:
//! 1. `prepare` on the request body going upstream; keep the [`Asked`].
//! 2. Read the tokens from the upstream's own response, before stripping:
//!    [`extract`] on the whole response, or on a stream assembled with
//!    [`WireApi::assemble`](crate::dialect::WireApi::assemble).
//! 3. Pass the harness [`strip`]ped responses, or each parsed stream chunk
//!    through [`strip_chunk`] (dropping the chunks it says to drop).
//!
//! Only Chat Completions and Completions apply; a route translates Responses
//! and Messages calls to Chat Completions before they reach these functions.

use crate::dialect::{tokens, Tokens, WireApi};
use serde_json::{Map, Value};

/// The server software behind a route, which decides the request fields and
/// response shapes used for token capture.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaptureKind {
    Vllm,
    Sglang,
}

impl CaptureKind {
    /// The route kind as written in configuration: `vllm` or `sglang`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "vllm" => Some(Self::Vllm),
            "sglang" => Some(Self::Sglang),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Vllm => "vllm",
            Self::Sglang => "sglang",
        }
    }
}

/// Why a request cannot be prepared for token capture.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CaptureError {
    /// token capture applies to chat completions and completions, not {0}
    #[error("token capture applies to chat completions and completions, not {0}")]
    UnsupportedApi(&'static str),
}

/// What the harness itself asked for, read before `prepare` changed the
/// request, and what `prepare` changed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Asked {
    pub stream: bool,
    /// Completions `echo`: the prompt is prepended to the text (and, with
    /// logprobs, its positions to the logprobs).
    pub echo: bool,
    /// The harness asked for logprobs (chat `logprobs: true`; completions
    /// `logprobs: <int>`).
    pub logprobs: bool,
    /// `return_token_ids` (vLLM; SGLang).
    pub token_ids: bool,
    /// SGLang `return_prompt_token_ids`.
    pub prompt_token_ids: bool,
    /// SGLang `return_input_ids_in_sglext`.
    pub sglext_input_ids: bool,
    /// SGLang `return_output_ids_in_sglext`.
    pub sglext_output_ids: bool,
    /// Request fields `prepare` set, each with the harness's own value
    /// (`None` when the harness did not send the field).
    pub added: Vec<(&'static str, Option<Value>)>,
}

/// What to do with one stream chunk after [`strip_chunk`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkFate {
    /// Pass the (possibly changed) chunk on.
    Keep,
    /// The chunk existed only to carry data the harness did not ask for
    /// (SGLang's final `sglext` ids chunk): do not pass it on.
    Drop,
}

/// Whether token capture applies to calls of this API.
pub fn applies(api: WireApi) -> bool {
    matches!(api, WireApi::ChatCompletions | WireApi::Completions)
}

/// A request flag as the servers' pydantic models would read it.
fn truthy(v: Option<&Value>) -> bool {
    match v {
        Some(Value::Bool(b)) => *b,
        Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0),
        Some(Value::String(s)) => matches!(s.to_ascii_lowercase().as_str(), "true" | "1"),
        _ => false,
    }
}

/// Add to `request` the fields that make `kind` return token ids and
/// logprobs for `api`, and return what the harness had asked for itself.
/// Fields the harness set are never lowered or replaced (`logprobs: true,
/// top_logprobs: 5` stays exactly that).
pub fn prepare(
    kind: CaptureKind,
    api: WireApi,
    request: &mut Map<String, Value>,
) -> Result<Asked, CaptureError> {
    if !applies(api) {
        return Err(CaptureError::UnsupportedApi(api.as_str()));
    }
    let chat = api == WireApi::ChatCompletions;
    let lp = request.get("logprobs");
    let mut asked = Asked {
        stream: truthy(request.get("stream")),
        echo: !chat && truthy(request.get("echo")),
        // Completions `logprobs` is a count: 0 asks for the sampled token's.
        logprobs: if chat {
            truthy(lp)
        } else {
            !matches!(lp, None | Some(Value::Null) | Some(Value::Bool(false)))
        },
        token_ids: truthy(request.get("return_token_ids")),
        prompt_token_ids: truthy(request.get("return_prompt_token_ids")),
        sglext_input_ids: truthy(request.get("return_input_ids_in_sglext")),
        sglext_output_ids: truthy(request.get("return_output_ids_in_sglext")),
        added: Vec::new(),
    };
    // `top_logprobs` without `logprobs: true` is an error on both servers;
    // such a request is left as the harness wrote it.
    let top_alone = request
        .get("top_logprobs")
        .and_then(Value::as_f64)
        .is_some_and(|n| n > 0.0);
    let mut added = Vec::new();
    let mut set = |key: &'static str, value: Value, added: &mut Vec<_>| {
        let old = request.insert(key.into(), value);
        added.push((key, old));
    };
    if !asked.logprobs {
        if !chat {
            set("logprobs", Value::from(0), &mut added);
        } else if !top_alone {
            set("logprobs", Value::Bool(true), &mut added);
        }
    }
    let on = || Value::Bool(true);
    match (kind, api, asked.stream) {
        (CaptureKind::Vllm, _, _) | (CaptureKind::Sglang, WireApi::Completions, _) => {
            if !asked.token_ids {
                set("return_token_ids", on(), &mut added);
            }
        }
        // SGLang refuses `return_token_ids` / `return_prompt_token_ids` on
        // a streamed chat call (400); its `sglext` flags work on both.
        (CaptureKind::Sglang, _, true) => {
            if !asked.sglext_input_ids {
                set("return_input_ids_in_sglext", on(), &mut added);
            }
            if !asked.sglext_output_ids {
                set("return_output_ids_in_sglext", on(), &mut added);
            }
        }
        (CaptureKind::Sglang, _, false) => {
            if !asked.token_ids {
                set("return_token_ids", on(), &mut added);
            }
            if !asked.prompt_token_ids {
                set("return_prompt_token_ids", on(), &mut added);
            }
        }
    }
    asked.added = added;
    Ok(asked)
}

/// Take out of a whole response what `prepare` caused and the harness did
/// not ask for. Odd input (not an object, no choices) is left as it is.
pub fn strip(kind: CaptureKind, api: WireApi, asked: &Asked, response: &mut Value) {
    let _ = strip_value(kind, api, asked, response);
}

/// [`strip`] for one parsed stream chunk.
pub fn strip_chunk(kind: CaptureKind, api: WireApi, asked: &Asked, chunk: &mut Value) -> ChunkFate {
    if !strip_value(kind, api, asked, chunk) {
        return ChunkFate::Keep;
    }
    // The chunk lost its whole `sglext`: drop it if nothing else is left.
    let no_choices = chunk
        .get("choices")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty);
    let no_usage = chunk.get("usage").is_none_or(Value::is_null);
    if no_choices && no_usage {
        ChunkFate::Drop
    } else {
        ChunkFate::Keep
    }
}

/// Remove one field the way `kind` writes an absent value: vLLM serializes
/// every field of its response models (`null` when unset); SGLang's models
/// drop `token_ids` / `prompt_token_ids` when unset.
fn unset(kind: CaptureKind, obj: &mut Map<String, Value>, key: &str) {
    match kind {
        CaptureKind::Vllm => {
            if let Some(v) = obj.get_mut(key) {
                *v = Value::Null;
            }
        }
        CaptureKind::Sglang => {
            obj.remove(key);
        }
    }
}

/// Strip in place; true when a whole `sglext` object was removed.
fn strip_value(kind: CaptureKind, api: WireApi, asked: &Asked, v: &mut Value) -> bool {
    let Some(obj) = v.as_object_mut() else {
        return false;
    };
    if !applies(api) {
        return false;
    }
    let prompt_asked = asked.token_ids || (kind == CaptureKind::Sglang && asked.prompt_token_ids);
    if !asked.token_ids {
        // vLLM chat: top level.
        unset(kind, obj, "prompt_token_ids");
    }
    if let Some(choices) = obj.get_mut("choices").and_then(Value::as_array_mut) {
        for c in choices.iter_mut().filter_map(Value::as_object_mut) {
            if !asked.logprobs {
                // Both servers always write `logprobs`, `null` when not asked.
                if let Some(lp) = c.get_mut("logprobs") {
                    *lp = Value::Null;
                }
            }
            if !asked.token_ids {
                unset(kind, c, "token_ids");
            }
            if !prompt_asked {
                unset(kind, c, "prompt_token_ids");
            }
        }
    }
    if kind != CaptureKind::Sglang {
        return false;
    }
    let Some(ext) = obj.get_mut("sglext").and_then(Value::as_object_mut) else {
        return false;
    };
    let before = ext.len();
    if !asked.sglext_input_ids {
        ext.remove("input_ids");
    }
    if !asked.sglext_output_ids {
        ext.remove("output_ids");
    }
    // SGLang omits `sglext` when none of its fields is set.
    if before > 0 && ext.is_empty() {
        obj.remove("sglext");
        return true;
    }
    false
}

/// Token ids and logprobs from the upstream's response (whole, or a stream
/// assembled into one object), before [`strip`]. The shapes of both servers
/// are read by [`crate::dialect::tokens::read`]; this adds what depends on
/// the request: with Completions `echo`, the logprobs of the echoed prompt
/// positions are cut off (and dropped when the split is unknowable).
pub fn extract(api: WireApi, asked: &Asked, response: &Value) -> Tokens {
    let mut t = tokens::read(api, response);
    if api == WireApi::Completions && asked.echo {
        t.completion_logprobs = t.completion_logprobs.take().and_then(|lp| {
            let skip = match (&t.completion_ids, &t.prompt_ids) {
                (Some(c), _) => lp.len().checked_sub(c.len())?,
                (None, Some(p)) if lp.len() >= p.len() => p.len(),
                _ => return None,
            };
            Some(lp[skip..].to_vec())
        });
    }
    t
}

#[cfg(test)]
mod tests {
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
    use super::*;
    use crate::dialect::WireApi::{ChatCompletions as Chat, Completions as Cmpl};
    use serde_json::json;

    const PROMPT: [i32; 3] = [151644, 872, 198];
    const OUT: [i32; 2] = [9707, 151645];

    fn req(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap()
    }

    fn chat_lp(tokens: &[(&str, f64)]) -> Value {
        json!({"content": tokens.iter().map(|(t, l)| json!({
            "token": t, "logprob": l, "bytes": t.as_bytes(), "top_logprobs": []
        })).collect::<Vec<_>>()})
    }

    /// vLLM non-streamed chat completion (`ChatCompletionResponse.model_dump()`).
    fn vllm_chat(lp: bool, ids: bool) -> Value {
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
    fn vllm_chat_chunks(lp: bool, ids: bool) -> Vec<Value> {
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

    fn cmpl_lp(tokens: &[(&str, f64)]) -> Value {
        json!({
            "text_offset": (0..tokens.len()).collect::<Vec<_>>(),
            "token_logprobs": tokens.iter().map(|t| t.1).collect::<Vec<_>>(),
            "tokens": tokens.iter().map(|t| t.0).collect::<Vec<_>>(),
            "top_logprobs": tokens.iter().map(|(t, l)| json!({*t: l})).collect::<Vec<_>>(),
        })
    }

    /// vLLM non-streamed completion (`CompletionResponse.model_dump()`).
    fn vllm_cmpl(lp: bool, ids: bool) -> Value {
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
    fn vllm_cmpl_chunks(lp: bool, ids: bool) -> Vec<Value> {
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
    fn sglang_chat(lp: bool, ids: bool) -> Value {
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
    fn sglang_chat_chunks(lp: bool, ids: bool, cached: bool) -> Vec<Value> {
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
    fn sglang_cmpl_chunks(lp: bool, ids: bool) -> Vec<Value> {
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

    fn sse(chunks: &[Value]) -> Vec<u8> {
        let mut s = String::new();
        for c in chunks {
            s.push_str(&format!("data: {c}\n\n"));
        }
        s.push_str("data: [DONE]\n\n");
        s.into_bytes()
    }

    /// Strip every chunk; the chunks the harness receives.
    fn strip_all(kind: CaptureKind, api: WireApi, asked: &Asked, chunks: &[Value]) -> Vec<Value> {
        chunks
            .iter()
            .cloned()
            .filter_map(|mut c| match strip_chunk(kind, api, asked, &mut c) {
                ChunkFate::Keep => Some(c),
                ChunkFate::Drop => None,
            })
            .collect()
    }

    fn assembled_tokens(api: WireApi, asked: &Asked, chunks: &[Value]) -> Tokens {
        let a = api.assemble(&sse(chunks), true);
        let t = extract(api, asked, a.response.as_ref().unwrap());
        assert_eq!(a.tokens.completion_ids, t.completion_ids);
        t
    }

    fn full_tokens() -> (Vec<i32>, Vec<i32>) {
        (PROMPT.to_vec(), OUT.to_vec())
    }

    #[test]
    fn prepare_adds_fields_and_reports_what_the_harness_asked() {
        let mut r = req(json!({"model": "m", "messages": []}));
        let asked = prepare(CaptureKind::Vllm, Chat, &mut r).unwrap();
        assert_eq!(r["logprobs"], true);
        assert_eq!(r["return_token_ids"], true);
        assert!(r.get("top_logprobs").is_none());
        assert!(!asked.logprobs && !asked.token_ids && !asked.stream);
        assert_eq!(
            asked.added,
            vec![("logprobs", None), ("return_token_ids", None)]
        );

        // The harness's own values are kept exactly, never lowered.
        let mut r =
            req(json!({"messages": [], "logprobs": true, "top_logprobs": 5, "stream": true}));
        let asked = prepare(CaptureKind::Vllm, Chat, &mut r).unwrap();
        assert_eq!(
            (r["logprobs"].clone(), r["top_logprobs"].clone()),
            (json!(true), json!(5))
        );
        assert!(asked.logprobs && asked.stream);
        assert_eq!(asked.added, vec![("return_token_ids", None)]);

        // `logprobs: false` is overwritten, and remembered.
        let mut r = req(json!({"messages": [], "logprobs": false}));
        let asked = prepare(CaptureKind::Vllm, Chat, &mut r).unwrap();
        assert_eq!(asked.added[0], ("logprobs", Some(json!(false))));

        // Completions: `logprobs` is a count; 0 is the cheapest ask, and a
        // harness's 0 is an ask of its own.
        let mut r = req(json!({"prompt": "Hi"}));
        let asked = prepare(CaptureKind::Vllm, Cmpl, &mut r).unwrap();
        assert_eq!(r["logprobs"], 0);
        assert!(!asked.logprobs);
        let mut r = req(json!({"prompt": "Hi", "logprobs": 0, "echo": true}));
        let asked = prepare(CaptureKind::Sglang, Cmpl, &mut r).unwrap();
        assert!(asked.logprobs && asked.echo);
        assert_eq!(r["return_token_ids"], true);

        // A request the server would refuse is left as the harness wrote it.
        let mut r = req(json!({"messages": [], "top_logprobs": 3}));
        prepare(CaptureKind::Vllm, Chat, &mut r).unwrap();
        assert!(r.get("logprobs").is_none());

        assert_eq!(
            prepare(CaptureKind::Vllm, WireApi::Responses, &mut Map::new()),
            Err(CaptureError::UnsupportedApi("responses"))
        );
    }

    #[test]
    fn prepare_sglang_chat_uses_sglext_only_when_streaming() {
        let mut r = req(json!({"messages": []}));
        prepare(CaptureKind::Sglang, Chat, &mut r).unwrap();
        assert_eq!(r["return_token_ids"], true);
        assert_eq!(r["return_prompt_token_ids"], true);
        assert!(r.get("return_input_ids_in_sglext").is_none());

        let mut r = req(json!({"messages": [], "stream": true}));
        prepare(CaptureKind::Sglang, Chat, &mut r).unwrap();
        // SGLang answers 400 to these on a streamed chat call.
        assert!(r.get("return_token_ids").is_none());
        assert!(r.get("return_prompt_token_ids").is_none());
        assert_eq!(r["return_input_ids_in_sglext"], true);
        assert_eq!(r["return_output_ids_in_sglext"], true);
        assert_eq!(r["logprobs"], true);
    }

    #[test]
    fn vllm_chat_whole_strips_to_the_plain_response() {
        let mut r = req(json!({"messages": []}));
        let asked = prepare(CaptureKind::Vllm, Chat, &mut r).unwrap();
        let mut resp = vllm_chat(true, true);
        let t = extract(Chat, &asked, &resp);
        let (p, c) = full_tokens();
        assert_eq!(t.prompt_ids, Some(p));
        assert_eq!(t.completion_ids, Some(c));
        assert_eq!(t.completion_logprobs, Some(vec![-0.25, -0.01]));
        assert_eq!(t.capture(), "ids_and_logprobs");
        strip(CaptureKind::Vllm, Chat, &asked, &mut resp);
        assert_eq!(resp, vllm_chat(false, false));
        assert_eq!(resp.to_string(), vllm_chat(false, false).to_string());
    }

    #[test]
    fn vllm_chat_keeps_logprobs_the_harness_asked_for() {
        let mut r = req(json!({"messages": [], "logprobs": true, "top_logprobs": 5}));
        let asked = prepare(CaptureKind::Vllm, Chat, &mut r).unwrap();
        let mut resp = vllm_chat(true, true);
        strip(CaptureKind::Vllm, Chat, &asked, &mut resp);
        assert_eq!(resp, vllm_chat(true, false));

        // Asked for ids too: nothing to take out.
        let mut r = req(json!({"messages": [], "logprobs": true, "return_token_ids": true}));
        let asked = prepare(CaptureKind::Vllm, Chat, &mut r).unwrap();
        assert!(asked.added.is_empty());
        let mut resp = vllm_chat(true, true);
        strip(CaptureKind::Vllm, Chat, &asked, &mut resp);
        assert_eq!(resp, vllm_chat(true, true));
    }

    #[test]
    fn vllm_chat_stream_strips_each_chunk_and_concatenates_ids() {
        let mut r = req(json!({"messages": [], "stream": true}));
        let asked = prepare(CaptureKind::Vllm, Chat, &mut r).unwrap();
        let upstream = vllm_chat_chunks(true, true);
        let t = assembled_tokens(Chat, &asked, &upstream);
        let (p, c) = full_tokens();
        assert_eq!(t.prompt_ids, Some(p));
        assert_eq!(t.completion_ids, Some(c));
        assert_eq!(t.completion_logprobs, Some(vec![-0.25, -0.01]));
        assert_eq!(
            strip_all(CaptureKind::Vllm, Chat, &asked, &upstream),
            vllm_chat_chunks(false, false)
        );
        // Harness asked for logprobs: they stay, the ids go.
        let mut r = req(json!({"messages": [], "stream": true, "logprobs": true}));
        let asked = prepare(CaptureKind::Vllm, Chat, &mut r).unwrap();
        assert_eq!(
            strip_all(CaptureKind::Vllm, Chat, &asked, &upstream),
            vllm_chat_chunks(true, false)
        );
    }

    #[test]
    fn vllm_completions_whole_and_stream() {
        let mut r = req(json!({"prompt": "Hello"}));
        let asked = prepare(CaptureKind::Vllm, Cmpl, &mut r).unwrap();
        let mut resp = vllm_cmpl(true, true);
        let t = extract(Cmpl, &asked, &resp);
        let (p, c) = full_tokens();
        assert_eq!(
            (t.prompt_ids.clone(), t.completion_ids.clone()),
            (Some(p.clone()), Some(c.clone()))
        );
        assert_eq!(t.completion_logprobs, Some(vec![-0.5, -0.02]));
        strip(CaptureKind::Vllm, Cmpl, &asked, &mut resp);
        assert_eq!(resp, vllm_cmpl(false, false));

        let mut r = req(json!({"prompt": "Hello", "stream": true}));
        let asked = prepare(CaptureKind::Vllm, Cmpl, &mut r).unwrap();
        let upstream = vllm_cmpl_chunks(true, true);
        let t = assembled_tokens(Cmpl, &asked, &upstream);
        assert_eq!((t.prompt_ids, t.completion_ids), (Some(p), Some(c)));
        assert_eq!(t.completion_logprobs, Some(vec![-0.5, -0.02]));
        assert_eq!(
            strip_all(CaptureKind::Vllm, Cmpl, &asked, &upstream),
            vllm_cmpl_chunks(false, false)
        );
    }

    #[test]
    fn echo_cuts_the_prompt_positions_off_the_logprobs() {
        let mut r = req(json!({"prompt": "Hello", "echo": true, "logprobs": 1}));
        let asked = prepare(CaptureKind::Vllm, Cmpl, &mut r).unwrap();
        let mut resp = vllm_cmpl(true, true);
        // With echo the logprobs cover the prompt (first position null) too.
        resp["choices"][0]["logprobs"]["token_logprobs"] = json!([null, -1.0, -2.0, -0.5, -0.02]);
        let t = extract(Cmpl, &asked, &resp);
        assert_eq!(t.completion_logprobs, Some(vec![-0.5, -0.02]));
        resp["choices"][0]["token_ids"] = Value::Null;
        resp["choices"][0]["prompt_token_ids"] = Value::Null;
        assert_eq!(extract(Cmpl, &asked, &resp).completion_logprobs, None);
    }

    #[test]
    fn vllm_prompt_logprobs_are_read_when_the_harness_asked() {
        let mut resp = vllm_chat(true, true);
        resp["prompt_logprobs"] = json!([
            null,
            {"872": {"logprob": -3.5, "rank": 2, "decoded_token": "user"},
             "9": {"logprob": -0.1, "rank": 1, "decoded_token": "x"}},
            {"198": {"logprob": -0.2, "rank": 1, "decoded_token": "\n"}},
        ]);
        let t = extract(Chat, &Asked::default(), &resp);
        let lp = t.prompt_logprobs.unwrap();
        assert!(lp[0].is_nan());
        assert_eq!(&lp[1..], &[-3.5, -0.2]);
    }

    #[test]
    fn sglang_chat_whole_strips_to_the_plain_response() {
        let mut r = req(json!({"messages": []}));
        let asked = prepare(CaptureKind::Sglang, Chat, &mut r).unwrap();
        let mut resp = sglang_chat(true, true);
        let t = extract(Chat, &asked, &resp);
        let (p, c) = full_tokens();
        assert_eq!(t.capture(), "ids_and_logprobs");
        assert_eq!((t.prompt_ids, t.completion_ids), (Some(p), Some(c)));
        strip(CaptureKind::Sglang, Chat, &asked, &mut resp);
        assert_eq!(resp.to_string(), sglang_chat(false, false).to_string());

        let mut r = req(json!({"messages": [], "logprobs": true, "top_logprobs": 2}));
        let asked = prepare(CaptureKind::Sglang, Chat, &mut r).unwrap();
        let mut resp = sglang_chat(true, true);
        strip(CaptureKind::Sglang, Chat, &asked, &mut resp);
        assert_eq!(resp, sglang_chat(true, false));
    }

    #[test]
    fn sglang_chat_stream_drops_the_ids_chunk_it_caused() {
        let mut r = req(json!({"messages": [], "stream": true}));
        let asked = prepare(CaptureKind::Sglang, Chat, &mut r).unwrap();
        let upstream = sglang_chat_chunks(true, true, false);
        let t = assembled_tokens(Chat, &asked, &upstream);
        let (p, c) = full_tokens();
        assert_eq!((t.prompt_ids, t.completion_ids), (Some(p), Some(c)));
        assert_eq!(t.completion_logprobs, Some(vec![-0.25, -0.01]));
        assert_eq!(
            strip_all(CaptureKind::Sglang, Chat, &asked, &upstream),
            sglang_chat_chunks(false, false, false)
        );

        // The harness asked for another `sglext` field: the chunk stays,
        // holding just that field.
        let mut r = req(json!({"messages": [], "stream": true,
                               "return_cached_tokens_details": true}));
        let asked = prepare(CaptureKind::Sglang, Chat, &mut r).unwrap();
        let upstream = sglang_chat_chunks(true, true, true);
        assert_eq!(
            strip_all(CaptureKind::Sglang, Chat, &asked, &upstream),
            sglang_chat_chunks(false, false, true)
        );
    }

    #[test]
    fn a_server_without_token_ids_gives_logprobs_only() {
        // SGLang before #30917 / #34488 ignores the id flags (pydantic
        // drops unknown fields) and streams logprobs alone.
        let mut r = req(json!({"messages": [], "stream": true}));
        let asked = prepare(CaptureKind::Sglang, Chat, &mut r).unwrap();
        let upstream = sglang_chat_chunks(true, false, false);
        let t = assembled_tokens(Chat, &asked, &upstream);
        assert_eq!(
            (t.prompt_ids.as_ref(), t.completion_ids.as_ref()),
            (None, None)
        );
        assert_eq!(t.completion_logprobs, Some(vec![-0.25, -0.01]));
        assert_eq!(t.capture(), "logprobs");
        assert_eq!(
            strip_all(CaptureKind::Sglang, Chat, &asked, &upstream),
            sglang_chat_chunks(false, false, false)
        );
        // vLLM before 0.10.2: no id fields at all.
        let mut resp = vllm_chat(true, false);
        for k in [
            "prompt_token_ids",
            "prompt_text",
            "ec_transfer_params",
            "metrics",
        ] {
            resp.as_object_mut().unwrap().remove(k);
        }
        resp["choices"][0]
            .as_object_mut()
            .unwrap()
            .remove("token_ids");
        assert_eq!(
            extract(Chat, &Asked::default(), &resp).capture(),
            "logprobs"
        );
        assert_eq!(
            extract(Chat, &Asked::default(), &vllm_chat(false, false)).capture(),
            "none"
        );
    }

    #[test]
    fn sglang_completions_stream() {
        let mut r = req(json!({"prompt": "Hello", "stream": true}));
        let asked = prepare(CaptureKind::Sglang, Cmpl, &mut r).unwrap();
        let upstream = sglang_cmpl_chunks(true, true);
        let t = assembled_tokens(Cmpl, &asked, &upstream);
        let (p, c) = full_tokens();
        assert_eq!((t.prompt_ids, t.completion_ids), (Some(p), Some(c)));
        assert_eq!(t.completion_logprobs, Some(vec![-0.5, -0.02]));
        assert_eq!(
            strip_all(CaptureKind::Sglang, Cmpl, &asked, &upstream),
            sglang_cmpl_chunks(false, false)
        );
    }

    #[test]
    fn odd_input_is_left_alone() {
        let asked = Asked::default();
        for mut v in [
            json!(null),
            json!("x"),
            json!([1, 2]),
            json!({"choices": "no"}),
            json!({"choices": [1, null]}),
            json!({"sglext": 3}),
        ] {
            let before = v.clone();
            strip(CaptureKind::Sglang, Chat, &asked, &mut v);
            assert_eq!(
                strip_chunk(CaptureKind::Vllm, Cmpl, &asked, &mut v),
                ChunkFate::Keep
            );
            assert_eq!(v, before);
            assert_eq!(extract(Chat, &asked, &v), Tokens::default());
        }
        // Ids that are not integers are not ids.
        let resp = json!({"choices": [{"token_ids": [1, "2"]}], "prompt_token_ids": {}});
        assert_eq!(extract(Chat, &asked, &resp).capture(), "none");
        assert_eq!(CaptureKind::parse("sglang"), Some(CaptureKind::Sglang));
        assert_eq!(CaptureKind::parse("llamacpp"), None);
        assert_eq!(CaptureKind::Vllm.as_str(), "vllm");
    }
}
