//! Fuzzing with proptest: whatever an upstream server or a client sends, the
//! wire-format code must not panic. The values are arbitrary JSON trees whose
//! keys and strings are drawn mostly from the real field and event names, so
//! that they reach deep into the assemblers and translators.
//!
//! A case proptest finds is kept as a regular unit test next to the code it
//! broke.

use super::capture::{self, Asked, CaptureKind};
use super::sse::{self, Parser};
use super::translate::{self, StreamTranslator, Unsupported};
use super::{tokens, WireApi};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

const APIS: [WireApi; 4] = [
    WireApi::ChatCompletions,
    WireApi::Responses,
    WireApi::Completions,
    WireApi::Messages,
];

/// Field names the code reads.
const KEYS: &[&str] = &[
    "type",
    "response",
    "choices",
    "delta",
    "tool_calls",
    "function",
    "name",
    "arguments",
    "usage",
    "output",
    "item",
    "index",
    "error",
    "message",
    "content",
    "id",
    "output_index",
    "text",
    "status",
    "role",
    "finish_reason",
    "reasoning_content",
    "reasoning",
    "refusal",
    "content_block",
    "partial_json",
    "thinking",
    "signature",
    "input",
    "instructions",
    "messages",
    "system",
    "tools",
    "tool_choice",
    "stream",
    "call_id",
    "summary",
    "incomplete_details",
    "reason",
    "code",
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
    "prompt_tokens_details",
    "cached_tokens",
    "logprobs",
    "logprob",
    "token_logprobs",
    "tokens",
    "token_ids",
    "prompt_token_ids",
    "prompt_logprobs",
    "sglext",
    "input_ids",
    "output_ids",
    "tool_use_id",
    "source",
    "image_url",
    "input_schema",
    "parameters",
    "model",
    "created",
    "stop_reason",
    "max_output_tokens",
    "top_logprobs",
    "previous_response_id",
    "encrypted_content",
    "echo",
    "return_token_ids",
];

/// Event names (SSE `event:` lines and `type` values).
const EVENTS: &[&str] = &[
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.output_item.done",
    "response.output_text.delta",
    "response.completed",
    "response.failed",
    "response.incomplete",
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "error",
];

/// Other strings with a meaning somewhere.
const WORDS: &[&str] = &[
    "[DONE]",
    "text_delta",
    "thinking_delta",
    "input_json_delta",
    "signature_delta",
    "function",
    "function_call",
    "function_call_output",
    "message",
    "reasoning",
    "tool_use",
    "server_tool_use",
    "tool_result",
    "text",
    "thinking",
    "image",
    "input_text",
    "output_text",
    "input_image",
    "summary_text",
    "base64",
    "url",
    "assistant",
    "user",
    "system",
    "developer",
    "tool",
    "failed",
    "incomplete",
    "completed",
    "max_output_tokens",
    "content_filter",
    "stop",
    "length",
    "tool_calls",
    "auto",
    "any",
    "none",
    "get_weather",
    "{\"a\":",
    "1}",
    "",
];

fn word() -> impl Strategy<Value = &'static str> {
    prop_oneof![
        prop::sample::select(EVENTS),
        prop::sample::select(WORDS),
        prop::sample::select(KEYS),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        (0u64..4).prop_map(Value::from),
        prop_oneof![
            Just(i64::MAX),
            Just(i64::MIN),
            Just(-1),
            Just(i64::from(i32::MAX) + 1)
        ]
        .prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        word().prop_map(Value::from),
        ".{0,6}".prop_map(Value::String),
    ]
}

/// Arbitrary JSON, depth at most 4.
fn json() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((prop::sample::select(KEYS), inner), 0..6).prop_map(|kv| {
                Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
            }),
        ]
    })
}

/// Realistic streams, one per API, as arrays of events (the data of each).
fn stream_fixtures() -> Vec<(WireApi, Value)> {
    vec![
        (
            WireApi::ChatCompletions,
            json!([
                {"id": "chatcmpl-1", "model": "m", "created": 1, "prompt_token_ids": [1, 2], "prompt_logprobs": [null, {"2": {"logprob": -1.0}}],
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": "", "reasoning_content": "r"}, "finish_reason": null}]},
                {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"content": "Hi", "refusal": null},
                 "logprobs": {"content": [{"token": "Hi", "logprob": -0.5}]}, "token_ids": [7]}]},
                {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"a\":"}}]}}]},
                {"id": "chatcmpl-1", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "get_weather", "arguments": "1}"}}]},
                 "finish_reason": "tool_calls"}]},
                {"id": "chatcmpl-1", "choices": [], "sglext": {"input_ids": [1, 2], "output_ids": [[7]]}},
                {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
                 "prompt_tokens_details": {"cached_tokens": 2}, "completion_tokens_details": {"reasoning_tokens": 1}}},
                {"error": {"message": "boom", "type": "server_error"}},
            ]),
        ),
        (
            WireApi::Completions,
            json!([
                {"id": "cmpl-1", "model": "m", "choices": [{"index": 0, "text": " wor", "prompt_token_ids": [1, 2], "token_ids": [7],
                 "logprobs": {"tokens": [" wor"], "token_logprobs": [-0.5]}, "finish_reason": null}]},
                {"id": "cmpl-1", "choices": [{"index": 0, "text": "ld", "finish_reason": "stop", "prompt_logprobs": [null, {"2": {"logprob": -1.0}}]}],
                 "usage": {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}},
            ]),
        ),
        (
            WireApi::Responses,
            json!([
                {"type": "response.created", "response": {"id": "r1", "object": "response", "status": "in_progress", "output": []}},
                {"type": "response.output_text.delta", "output_index": 0, "delta": "Hi"},
                {"type": "response.output_item.done", "output_index": 1, "item": {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"}},
                {"type": "error", "code": "x", "message": "boom", "error": {"message": "boom"}},
                {"type": "response.completed", "response": {"id": "r1", "object": "response", "status": "incomplete",
                 "incomplete_details": {"reason": "max_output_tokens"}, "error": null,
                 "output": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}], "content": [{"text": "c"}]},
                            {"type": "message", "content": [{"type": "output_text", "text": "Hi"}]},
                            {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"}],
                 "usage": {"input_tokens": 5, "output_tokens": 2, "total_tokens": 7,
                           "input_tokens_details": {"cached_tokens": 1}, "output_tokens_details": {"reasoning_tokens": 1}}}},
            ]),
        ),
        (
            WireApi::Messages,
            json!([
                {"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "content": [],
                 "usage": {"input_tokens": 10, "output_tokens": 1, "cache_read_input_tokens": 4, "cache_creation_input_tokens": 2}}},
                {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}},
                {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hmm"}},
                {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": "s"}},
                {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
                {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Hi"}},
                {"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}},
                {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\"c\":1}"}},
                {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 7}},
                {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
                {"type": "message_stop"},
            ]),
        ),
    ]
}

/// Realistic whole bodies and requests, for every API.
fn body_fixtures() -> Vec<Value> {
    vec![
        json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "m", "prompt_token_ids": [1, 2],
               "prompt_logprobs": [null, {"2": {"logprob": -1.0}}], "sglext": {"input_ids": [1], "output_ids": [[7]]},
               "choices": [{"index": 0, "finish_reason": "tool_calls", "token_ids": [7], "prompt_token_ids": [1, 2],
                 "logprobs": {"content": [{"token": "a", "logprob": -0.1}], "token_logprobs": [-0.1]},
                 "message": {"role": "assistant", "content": "ok", "reasoning_content": "r",
                   "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": "{\"c\":1}"}}]}}],
               "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13, "prompt_tokens_details": {"cached_tokens": 4}}}),
        json!({"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "x", "finish_reason": "length",
               "logprobs": {"tokens": ["x"], "token_logprobs": [-0.2]}}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}),
        json!({"object": "response", "status": "failed", "error": {"message": "no"}, "incomplete_details": {"reason": "content_filter"},
               "output": [{"type": "message", "content": [{"text": "a"}]}], "usage": {"input_tokens": 1, "output_tokens": 1}}),
        json!({"type": "message", "content": [{"type": "text", "text": "a"}, {"type": "tool_use", "id": "t", "name": "n", "input": {"a": 1}}],
               "stop_reason": "tool_use", "usage": {"input_tokens": 1, "output_tokens": 1, "cache_read_input_tokens": 1}}),
        json!({"type": "error", "error": {"type": "api_error", "message": "Internal"}}),
        // Requests.
        json!({"model": "m", "stream": true, "instructions": "be brief", "previous_response_id": null, "top_logprobs": 2,
               "max_output_tokens": 9, "text": {"format": {"type": "json_schema", "name": "x", "schema": {}}},
               "input": [
                   {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
                   {"type": "message", "role": "user", "content": [{"type": "input_image", "image_url": "data:x", "detail": "low"}]},
                   {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}], "encrypted_content": null},
                   {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "a"}]},
                   {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
                   {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "/w"}]},
               ],
               "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
               "tool_choice": {"type": "function", "name": "shell"}}),
        json!({"model": "m", "max_tokens": 64, "stream": true, "stop_sequences": ["x"],
               "system": [{"type": "text", "text": "sys"}],
               "messages": [
                   {"role": "user", "content": [{"type": "text", "text": "hi"},
                     {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}]},
                   {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
                     {"type": "text", "text": "a"}, {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"c": 1}}]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "ok"}]}]},
               ],
               "tools": [{"name": "Bash", "description": "d", "input_schema": {"type": "object"}}],
               "tool_choice": {"type": "tool", "name": "Bash", "disable_parallel_tool_use": true}}),
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}], "logprobs": false,
               "top_logprobs": 1, "return_token_ids": "true", "echo": 1, "prompt": "p"}),
    ]
}

/// Replace the `n`th node (pre-order, modulo their count) of `v` for which
/// `pick` holds by `with`.
fn replace_nth(v: &mut Value, n: usize, with: Value, pick: fn(&Value) -> bool) {
    fn count(v: &Value, pick: fn(&Value) -> bool) -> usize {
        usize::from(pick(v))
            + match v {
                Value::Array(a) => a.iter().map(|c| count(c, pick)).sum(),
                Value::Object(o) => o.values().map(|c| count(c, pick)).sum(),
                _ => 0,
            }
    }
    fn walk(v: &mut Value, n: &mut usize, with: &mut Option<Value>, pick: fn(&Value) -> bool) {
        if pick(v) {
            if *n == 0 {
                if let Some(w) = with.take() {
                    *v = w;
                }
                return;
            }
            *n -= 1;
        }
        let children: Vec<&mut Value> = match v {
            Value::Array(a) => a.iter_mut().collect(),
            Value::Object(o) => o.values_mut().collect(),
            _ => Vec::new(),
        };
        for c in children {
            if with.is_none() {
                return;
            }
            walk(c, n, with, pick);
        }
    }
    let total = count(v, pick);
    if total > 0 {
        walk(v, &mut (n % total), &mut Some(with), pick);
    }
}

fn extreme() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(i64::MAX),
        Just(i64::MIN),
        Just(-1),
        Just(i64::from(i32::MAX) + 1),
        Just(1 << 62),
    ]
    .prop_map(Value::from)
}

/// `base` with a few of its nodes replaced by arbitrary JSON, and a few of
/// its numbers by extreme ones.
fn mutated(base: Value) -> impl Strategy<Value = Value> {
    (
        prop::collection::vec((any::<usize>(), json()), 0..4),
        prop::collection::vec((any::<usize>(), extreme()), 0..3),
    )
        .prop_map(move |(edits, numbers)| {
            let mut v = base.clone();
            for (n, with) in numbers {
                replace_nth(&mut v, n, with, Value::is_number);
            }
            for (n, with) in edits {
                replace_nth(&mut v, n, with, |_| true);
            }
            v
        })
}

/// Normalize `req`; a Responses or Messages request that translates must
/// be recorded with the messages it is translated to.
fn same_messages_as_translated(api: WireApi, req: &Value) -> Result<(), TestCaseError> {
    let n = api.normalize_request(req.clone());
    if let Ok(t) = translate::to_chat(api, req, Unsupported::Drop) {
        prop_assert_eq!(&n.messages, &t.request["messages"]);
    }
    Ok(())
}

/// One API's realistic stream, mutated, rendered as SSE (the `event:` line
/// is the event's `type`, when it has one).
fn mutated_stream() -> impl Strategy<Value = (WireApi, Vec<u8>)> {
    prop::sample::select(stream_fixtures()).prop_flat_map(|(api, events)| {
        mutated(events).prop_map(move |v| {
            let mut out = Vec::new();
            for ev in v.as_array().into_iter().flatten() {
                if let Some(t) = ev.get("type").and_then(Value::as_str) {
                    out.extend_from_slice(format!("event: {t}\n").as_bytes());
                }
                out.extend_from_slice(format!("data: {ev}\n\n").as_bytes());
            }
            out.extend_from_slice(b"data: [DONE]\n\n");
            (api, out)
        })
    })
}

fn mutated_body() -> impl Strategy<Value = Value> {
    prop::sample::select(body_fixtures()).prop_flat_map(mutated)
}

/// An object with a real `type` (most events have one), else any JSON.
fn event_data() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => (prop::sample::select(EVENTS), json()).prop_map(|(kind, v)| {
            let mut obj = match v {
                Value::Object(m) => m,
                other => Map::from_iter([("response".to_owned(), other)]),
            };
            obj.insert("type".into(), kind.into());
            Value::Object(obj)
        }),
        2 => json(),
    ]
}

/// An SSE body of events: `event:` lines drawn from the real names, data
/// that is JSON, `[DONE]`, or not JSON at all.
fn stream_body() -> impl Strategy<Value = Vec<u8>> {
    let data = prop_oneof![
        8 => event_data().prop_map(|v| v.to_string()),
        1 => Just("[DONE]".to_owned()),
        1 => ".{0,12}",
    ];
    let event = (proptest::option::of(prop::sample::select(EVENTS)), data);
    prop::collection::vec(event, 0..8).prop_map(|events| {
        let mut out = Vec::new();
        for (name, data) in events {
            if let Some(n) = name {
                out.extend_from_slice(format!("event: {n}\n").as_bytes());
            }
            out.extend_from_slice(format!("data: {data}\n\n").as_bytes());
        }
        out
    })
}

/// Bytes rich in what SSE cares about.
fn sse_bytes() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![
        3 => any::<u8>(),
        2 => prop::sample::select(b"\n\r: datevn".to_vec()),
    ];
    prop::collection::vec(byte, 0..256)
}

fn asked() -> impl Strategy<Value = Asked> {
    prop::collection::vec(any::<bool>(), 7).prop_map(|b| Asked {
        stream: b[0],
        echo: b[1],
        logprobs: b[2],
        token_ids: b[3],
        prompt_token_ids: b[4],
        sglext_input_ids: b[5],
        sglext_output_ids: b[6],
        added: Vec::new(),
    })
}

/// Feed `bytes` to `p` in pieces cut at `cuts` (cycled), then finish.
fn parse_split(mut p: Parser, bytes: &[u8], cuts: &[usize]) -> Vec<sse::Event> {
    let mut out = Vec::new();
    let mut at = 0;
    for c in cuts.iter().cycle() {
        if at >= bytes.len() {
            break;
        }
        let end = (at + c).min(bytes.len());
        p.feed(&bytes[at..end], &mut out);
        at = end;
    }
    p.finish(&mut out);
    out
}

fn parse_whole(mut p: Parser, bytes: &[u8]) -> Vec<sse::Event> {
    let mut out = Vec::new();
    p.feed(bytes, &mut out);
    p.finish(&mut out);
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn sse_parses_the_same_at_any_split(bytes in sse_bytes(), cuts in prop::collection::vec(1usize..40, 1..6), limit in 1usize..24) {
        prop_assert_eq!(parse_split(Parser::default(), &bytes, &cuts), sse::parse_all(&bytes));
        let bounded = parse_split(Parser::with_limit(limit), &bytes, &cuts);
        prop_assert_eq!(&bounded, &parse_whole(Parser::with_limit(limit), &bytes));
        for ev in &bounded {
            prop_assert!(ev.data.len() <= limit);
        }
    }

    #[test]
    fn streams_and_bodies_assemble_without_panic(body in stream_body(), raw in sse_bytes(), whole in json()) {
        let whole = whole.to_string();
        for api in APIS {
            for stream in [true, false] {
                api.assemble(&body, stream);
                api.assemble(&raw, stream);
                api.assemble(whole.as_bytes(), stream);
            }
            for ev in sse::parse_all(&body) {
                api.assemble(ev.data.as_bytes(), false);
            }
        }
    }

    #[test]
    fn translated_streams_reassemble(body in stream_body()) {
        for api in [WireApi::Responses, WireApi::Messages] {
            let mut t = StreamTranslator::new(api);
            let mut out = Vec::new();
            for ev in sse::parse_all(&body) {
                out.extend(t.feed(&ev));
            }
            out.extend(t.feed(&sse::Event { event: None, data: "[DONE]".into(), truncated: false }));
            prop_assert!(t.is_done());
            for ev in sse::parse_all(&out) {
                prop_assert!(serde_json::from_str::<Value>(&ev.data).is_ok(), "not JSON: {}", ev.data);
            }
            let a = api.assemble(&out, true);
            prop_assert!(a.response.is_some());
        }
    }

    #[test]
    fn mutated_streams_assemble_and_translate(stream in mutated_stream()) {
        let (api, body) = stream;
        for api in [api, WireApi::ChatCompletions] {
            api.assemble(&body, true);
        }
        for api in [WireApi::Responses, WireApi::Messages] {
            let mut t = StreamTranslator::new(api);
            let mut out = Vec::new();
            for ev in sse::parse_all(&body) {
                out.extend(t.feed(&ev));
            }
            prop_assert!(t.is_done());
            prop_assert!(api.assemble(&out, true).response.is_some());
        }
    }

    #[test]
    fn mutated_bodies_and_requests(v in mutated_body(), asked in asked()) {
        let text = v.to_string();
        for api in APIS {
            api.assemble(text.as_bytes(), false);
            for policy in [Unsupported::Drop, Unsupported::Reject] {
                let _ = translate::to_chat(api, &v, policy);
            }
            translate::response_from_chat(api, &v);
            same_messages_as_translated(api, &v)?;
            tokens::read(api, &v);
            for kind in [CaptureKind::Vllm, CaptureKind::Sglang] {
                let mut map = v.as_object().cloned().unwrap_or_default();
                let _ = capture::prepare(kind, api, &mut map);
                let mut r = v.clone();
                capture::strip(kind, api, &asked, &mut r);
                capture::strip_chunk(kind, api, &asked, &mut r);
                capture::extract(api, &asked, &v);
            }
        }
    }

    #[test]
    fn requests_translate_without_panic(req in json(), chat in json()) {
        for api in APIS {
            for policy in [Unsupported::Drop, Unsupported::Reject] {
                let _ = translate::to_chat(api, &req, policy);
            }
            translate::response_from_chat(api, &chat);
            same_messages_as_translated(api, &req)?;
            tokens::read(api, &chat);
        }
    }

    #[test]
    fn capture_never_panics(req in json(), resp in json(), asked in asked()) {
        for kind in [CaptureKind::Vllm, CaptureKind::Sglang] {
            for api in APIS {
                let mut map = req.as_object().cloned().unwrap_or_default();
                let _ = capture::prepare(kind, api, &mut map);
                let mut r = resp.clone();
                capture::strip(kind, api, &asked, &mut r);
                let mut r = resp.clone();
                capture::strip_chunk(kind, api, &asked, &mut r);
                capture::extract(api, &asked, &resp);
            }
        }
    }
}
