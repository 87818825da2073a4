use super::response::{messages_usage, responses_usage};
use super::*;
use crate::dialect::sse;
use proptest::prelude::*;

#[test]
fn codex_style_responses_request_becomes_chat() {
    let req = json!({
        "model": "m", "stream": true, "store": false, "instructions": "be brief",
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "k", "reasoning": {"effort": "low"},
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "think"}]},
            {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{\"cmd\":\"ls\"}"},
            {"type": "function_call", "call_id": "c2", "name": "shell", "arguments": "{\"cmd\":\"pwd\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
            {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "/w"}]},
        ],
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}},
                  {"type": "web_search"}, {"type": "namespace", "name": "multi_agent_v1"}],
        "tool_choice": "auto", "parallel_tool_calls": true, "max_output_tokens": 100,
    });
    let t = responses_to_chat(&req, Unsupported::Drop).unwrap();
    let m = &t.request["messages"];
    assert_eq!(m[0], json!({"role": "system", "content": "be brief"}));
    assert_eq!(m[1], json!({"role": "system", "content": "rules"}));
    assert_eq!(
        m[2]["content"],
        json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])
    );
    assert_eq!(m[3]["role"], "assistant");
    assert_eq!(m[3]["reasoning_content"], "think");
    assert_eq!(m[3]["tool_calls"].as_array().unwrap().len(), 2);
    assert_eq!(
        m[4],
        json!({"role": "tool", "tool_call_id": "c1", "content": "a.txt"})
    );
    assert_eq!(
        m[5],
        json!({"role": "tool", "tool_call_id": "c2", "content": "/w"})
    );
    assert_eq!(t.request["tools"].as_array().unwrap().len(), 1);
    assert_eq!(t.request["max_tokens"], 100);
    assert_eq!(t.request["stream_options"], json!({"include_usage": true}));
    assert!(t.request.get("store").is_none() && t.request.get("include").is_none());
    assert_eq!(
        t.dropped,
        vec![
            "a web_search tool".to_owned(),
            "a namespace tool \"multi_agent_v1\"".to_owned(),
            "the field \"reasoning\"".to_owned()
        ]
    );
    let err = responses_to_chat(&req, Unsupported::Reject).unwrap_err();
    assert_eq!(err, TranslateError::Unsupported("a web_search tool".into()));
    let prev = json!({"model": "m", "input": "x", "previous_response_id": "resp_1"});
    assert!(responses_to_chat(&prev, Unsupported::Drop).is_err());
}

#[test]
fn claude_code_style_messages_request_becomes_chat() {
    let req = json!({
        "model": "m", "max_tokens": 512, "stream": true, "metadata": {"user_id": "u"},
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}, {"type": "text", "text": "Be safe."}],
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "a reminder"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                {"type": "text", "text": "running"},
                {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}},
                {"type": "tool_use", "id": "toolu_2", "name": "Bash", "input": {"command": "pwd"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": "/w"}], "is_error": true},
                {"type": "text", "text": "go on"}]},
        ],
        "tools": [{"name": "Bash", "description": "run", "input_schema": {"type": "object"}},
                  {"type": "web_search_20250305", "name": "web_search"}],
        "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
        "stop_sequences": ["END"], "thinking": {"type": "enabled", "budget_tokens": 100},
    });
    let t = messages_to_chat(&req, Unsupported::Drop).unwrap();
    let m = t.request["messages"].as_array().unwrap();
    assert_eq!(
        m[0],
        json!({"role": "system", "content": "You are Claude Code.\nBe safe."})
    );
    assert_eq!(m[1], json!({"role": "user", "content": "hi"}));
    assert_eq!(m[2], json!({"role": "system", "content": "a reminder"}));
    assert_eq!(m[3]["content"], "running");
    assert_eq!(m[3]["reasoning_content"], "hmm");
    assert_eq!(
        m[3]["tool_calls"][1]["function"]["arguments"],
        "{\"command\":\"pwd\"}"
    );
    assert_eq!(
        m[4],
        json!({"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt"})
    );
    assert_eq!(
        m[5],
        json!({"role": "tool", "tool_call_id": "toolu_2", "content": "/w"})
    );
    assert_eq!(m[6], json!({"role": "user", "content": "go on"}));
    assert_eq!(
        t.request["tools"][0]["function"]["parameters"],
        json!({"type": "object"})
    );
    assert_eq!(t.request["tool_choice"], "required");
    assert_eq!(t.request["parallel_tool_calls"], false);
    assert_eq!(t.request["stop"], json!(["END"]));
    assert_eq!(t.request["max_tokens"], 512);
    assert_eq!(
        t.dropped,
        vec![
            "the server tool \"web_search\" (web_search_20250305)".to_owned(),
            "the field \"thinking\"".to_owned()
        ]
    );
}

#[test]
fn whole_answers_translate_back() {
    let chat = json!({"id": "chatcmpl-9", "object": "chat.completion", "created": 5, "model": "m",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant",
            "content": "ok", "reasoning_content": "r",
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "Bash", "arguments": "{\"command\":\"ls\"}"}}]}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13, "prompt_tokens_details": {"cached_tokens": 4}}});
    let r = chat_to_responses(&chat);
    assert_eq!(r["status"], "completed");
    assert_eq!(r["output"][0]["type"], "reasoning");
    assert_eq!(r["output"][1]["content"][0]["text"], "ok");
    assert_eq!(r["output"][2]["call_id"], "call_1");
    assert_eq!(r["usage"]["input_tokens_details"]["cached_tokens"], 4);
    let m = chat_to_messages(&chat);
    assert_eq!(m["stop_reason"], "tool_use");
    assert_eq!(m["content"][2]["input"], json!({"command": "ls"}));
    assert_eq!(
        m["usage"],
        json!({"input_tokens": 6, "output_tokens": 3, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 4})
    );
    let long = json!({"id": "x", "choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": "cut"}}]});
    assert_eq!(chat_to_responses(&long)["status"], "incomplete");
    assert_eq!(chat_to_messages(&long)["stop_reason"], "max_tokens");
}

/// A llama.cpp-server stream (llama-cpp-python 0.3.x): every tool-call
/// delta repeats the call's `id` and whole `function.name`; the arguments
/// come in pieces.
fn llama_cpp_tool_stream() -> Vec<u8> {
    let mut s = String::new();
    for args in ["", "{\"loc", "ation\": ", "\"Paris\"}"] {
        let c = json!({"id": "chatcmpl-l", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"role": null, "content": null, "tool_calls": [{"index": 0,
                "id": "call__0_get_weather_cmpl-1", "type": "function",
                "function": {"name": "get_weather", "arguments": args}}]},
                "logprobs": null, "finish_reason": null}]});
        s += &format!("data: {c}\n\n");
    }
    let c = json!({"id": "chatcmpl-l", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "tool_calls"}]});
    s += &format!("data: {c}\n\ndata: [DONE]\n\n");
    s.into_bytes()
}

/// Events of `api`'s stream translated from `upstream`, as JSON values.
fn translated_events(api: WireApi, upstream: &[u8]) -> (Vec<u8>, Vec<Value>) {
    let mut t = StreamTranslator::new(api);
    let mut out = Vec::new();
    for ev in sse::parse_all(upstream) {
        out.extend(t.feed(&ev));
    }
    let events = sse::parse_all(&out)
        .iter()
        .map(|e| serde_json::from_str(&e.data).unwrap())
        .collect();
    (out, events)
}

#[test]
fn repeated_tool_names_and_ids_are_taken_once() {
    let upstream = llama_cpp_tool_stream();
    let args = "{\"location\": \"Paris\"}";
    // The recorded assembly.
    let a = WireApi::ChatCompletions.assemble(&upstream, true);
    let calls = a.tool_calls.unwrap();
    assert_eq!(calls.as_array().unwrap().len(), 1);
    assert_eq!(calls[0]["id"], "call__0_get_weather_cmpl-1");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[0]["function"]["arguments"], args);
    // Responses: the item announced, done and completed carries the name once.
    let (out, events) = translated_events(WireApi::Responses, &upstream);
    let of = |kind: &str| {
        events
            .iter()
            .filter(|e| e["type"] == kind)
            .cloned()
            .collect::<Vec<_>>()
    };
    let done = of("response.output_item.done");
    assert_eq!(done.len(), 1);
    assert_eq!(done[0]["item"]["name"], "get_weather");
    assert_eq!(done[0]["item"]["call_id"], "call__0_get_weather_cmpl-1");
    assert_eq!(done[0]["item"]["arguments"], args);
    let completed = of("response.completed");
    assert_eq!(completed[0]["response"]["output"][0]["name"], "get_weather");
    assert_eq!(
        of("response.output_item.added")[0]["item"]["name"],
        "get_weather"
    );
    let r = WireApi::Responses.assemble(&out, true);
    assert_eq!(r.tool_calls.unwrap()[0]["function"]["name"], "get_weather");
    // Messages: one tool_use block, named once.
    let (out, events) = translated_events(WireApi::Messages, &upstream);
    let starts: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "content_block_start")
        .collect();
    assert_eq!(starts.len(), 1);
    assert_eq!(starts[0]["content_block"]["name"], "get_weather");
    assert_eq!(
        starts[0]["content_block"]["id"],
        "call__0_get_weather_cmpl-1"
    );
    let m = WireApi::Messages.assemble(&out, true);
    let got = m.tool_calls.unwrap()[0]["function"]["arguments"].clone();
    assert_eq!(
        serde_json::from_str::<Value>(got.as_str().unwrap()).unwrap(),
        json!({"location": "Paris"})
    );
}

#[test]
fn a_name_sent_in_pieces_is_still_joined() {
    let mut s = String::new();
    for (name, args) in [("get_", ""), ("weather", "{}")] {
        let c = json!({"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": name, "arguments": args}}]}}]});
        s += &format!("data: {c}\n\n");
    }
    s += "data: [DONE]\n\n";
    let a = WireApi::ChatCompletions.assemble(s.as_bytes(), true);
    assert_eq!(a.tool_calls.unwrap()[0]["function"]["name"], "get_weather");
}

/// A chat stream that says "hi" and sends no usage.
fn stream_without_usage() -> Vec<u8> {
    let c = json!({"id": "chatcmpl-u", "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]});
    format!("data: {c}\n\ndata: [DONE]\n\n").into_bytes()
}

#[test]
fn usage_not_sent_is_not_invented() {
    let upstream = stream_without_usage();
    let none = crate::dialect::Usage::default();
    assert_eq!(
        WireApi::ChatCompletions.assemble(&upstream, true).usage,
        none
    );
    // Messages: the usage objects are there (SDKs read into them), empty.
    let (out, events) = translated_events(WireApi::Messages, &upstream);
    let start = events
        .iter()
        .find(|e| e["type"] == "message_start")
        .unwrap();
    assert_eq!(start["message"]["usage"], json!({}));
    let delta = events
        .iter()
        .find(|e| e["type"] == "message_delta")
        .unwrap();
    assert_eq!(delta["usage"], json!({}));
    let a = WireApi::Messages.assemble(&out, true);
    assert_eq!(a.usage, none);
    assert_eq!(a.message.unwrap()["content"], "hi");
    // Responses: usage is null.
    let (out, events) = translated_events(WireApi::Responses, &upstream);
    let done = events
        .iter()
        .find(|e| e["type"] == "response.completed")
        .unwrap();
    assert_eq!(done["response"]["usage"], Value::Null);
    assert_eq!(WireApi::Responses.assemble(&out, true).usage, none);
    // Whole answers likewise.
    let whole = WireApi::ChatCompletions
        .assemble(&upstream, true)
        .response
        .unwrap();
    let m = chat_to_messages(&whole);
    assert_eq!(m["usage"], json!({}));
    assert_eq!(
        WireApi::Messages
            .assemble(m.to_string().as_bytes(), false)
            .usage,
        none
    );
    let r = chat_to_responses(&whole);
    assert_eq!(r["usage"], Value::Null);
    assert_eq!(
        WireApi::Responses
            .assemble(r.to_string().as_bytes(), false)
            .usage,
        none
    );
}

#[test]
fn usage_sent_in_part_is_translated_in_part() {
    let u = json!({"prompt_tokens": 9});
    assert_eq!(
        messages_usage(&u),
        json!({"input_tokens": 9, "cache_creation_input_tokens": 0})
    );
    assert_eq!(responses_usage(&u), Value::Null);
    let u = json!({"completion_tokens": 2});
    assert_eq!(messages_usage(&u), json!({"output_tokens": 2}));
    let u = json!({"prompt_tokens": 9, "completion_tokens": 2});
    assert_eq!(
        responses_usage(&u),
        json!({"input_tokens": 9, "output_tokens": 2, "total_tokens": 11})
    );
    // Numbers at the edge of i64 neither panic nor wrap.
    let u = json!({"prompt_tokens": i64::MIN, "completion_tokens": i64::MAX, "prompt_tokens_details": {"cached_tokens": 5}});
    assert_eq!(messages_usage(&u)["input_tokens"], i64::MIN);
    let u = json!({"prompt_tokens": i64::MAX, "completion_tokens": i64::MAX});
    assert_eq!(responses_usage(&u)["total_tokens"], i64::MAX);
}

#[test]
fn usage_in_the_first_chunk_is_in_message_start() {
    let c = json!({"id": "chatcmpl-u", "usage": {"prompt_tokens": 4, "completion_tokens": 0},
        "choices": [{"index": 0, "delta": {"content": "hi"}}]});
    let upstream = format!("data: {c}\n\ndata: [DONE]\n\n");
    let (_, events) = translated_events(WireApi::Messages, upstream.as_bytes());
    assert_eq!(events[0]["type"], "message_start");
    assert_eq!(events[0]["message"]["usage"]["input_tokens"], 4);
}

// ---------------------------------------------------------------- properties

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 .,!?é☕\"\\n]{1,24}"
}

fn args() -> impl Strategy<Value = String> {
    proptest::collection::btree_map("[a-z]{1,6}", text(), 0..3)
        .prop_map(|m| serde_json::to_string(&m).unwrap())
}

/// One assistant turn: reasoning, text, and tool calls with their results
/// (`(output, is_error)`).
#[derive(Debug, Clone)]
struct Turn {
    user: String,
    reasoning: Option<String>,
    text: Option<String>,
    calls: Vec<(String, String, String, bool)>,
}

fn turns() -> impl Strategy<Value = Vec<Turn>> {
    let call = ("[A-Za-z_]{1,8}", args(), text(), any::<bool>());
    let turn = (
        text(),
        proptest::option::of(text()),
        proptest::option::of(text()),
        proptest::collection::vec(call, 0..4),
    )
        .prop_map(|(user, reasoning, text, calls)| Turn {
            user,
            reasoning,
            text,
            calls,
        });
    proptest::collection::vec(turn, 1..5)
}

fn call_id(t: usize, c: usize) -> String {
    format!("call_{t}_{c}")
}

fn as_messages(turns: &[Turn]) -> Value {
    let mut msgs = Vec::new();
    for (ti, t) in turns.iter().enumerate() {
        msgs.push(json!({"role": "user", "content": t.user}));
        let mut blocks = Vec::new();
        if let Some(r) = &t.reasoning {
            blocks.push(json!({"type": "thinking", "thinking": r, "signature": "sig"}));
        }
        if let Some(x) = &t.text {
            blocks.push(json!({"type": "text", "text": x}));
        }
        for (ci, (name, a, _, _)) in t.calls.iter().enumerate() {
            let input: Value = serde_json::from_str(a).unwrap();
            blocks.push(
                json!({"type": "tool_use", "id": call_id(ti, ci), "name": name, "input": input}),
            );
        }
        if !blocks.is_empty() {
            msgs.push(json!({"role": "assistant", "content": blocks}));
        }
        let results: Vec<Value> = t.calls.iter().enumerate().map(|(ci, (_, _, out, err))| {
            json!({"type": "tool_result", "tool_use_id": call_id(ti, ci), "content": out, "is_error": err})
        }).collect();
        if !results.is_empty() {
            msgs.push(json!({"role": "user", "content": results}));
        }
    }
    json!({"model": "m", "max_tokens": 64, "messages": msgs})
}

fn as_responses(turns: &[Turn]) -> Value {
    let mut items = Vec::new();
    for (ti, t) in turns.iter().enumerate() {
        items.push(json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": t.user}]}));
        if let Some(r) = &t.reasoning {
            items.push(
                json!({"type": "reasoning", "summary": [{"type": "summary_text", "text": r}]}),
            );
        }
        if let Some(x) = &t.text {
            items.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": x}]}));
        }
        for (ci, (name, a, _, _)) in t.calls.iter().enumerate() {
            items.push(json!({"type": "function_call", "call_id": call_id(ti, ci), "name": name, "arguments": a}));
        }
        for (ci, (_, _, out, _)) in t.calls.iter().enumerate() {
            items.push(
                json!({"type": "function_call_output", "call_id": call_id(ti, ci), "output": out}),
            );
        }
    }
    json!({"model": "m", "input": items})
}

/// Check that the chat messages carry every turn in order: user text,
/// reasoning, assistant text, tool calls (ids, names, arguments as JSON),
/// and tool results right after the calls they answer.
fn check_chat(turns: &[Turn], chat: &Value) {
    let msgs = chat["messages"].as_array().unwrap();
    let mut i = 0;
    for (ti, t) in turns.iter().enumerate() {
        assert_eq!(msgs[i], json!({"role": "user", "content": t.user}));
        i += 1;
        if t.reasoning.is_none() && t.text.is_none() && t.calls.is_empty() {
            continue;
        }
        let a = &msgs[i];
        i += 1;
        assert_eq!(a["role"], "assistant");
        assert_eq!(
            a.get("reasoning_content").and_then(Value::as_str),
            t.reasoning.as_deref()
        );
        let content = a["content"].as_str().filter(|c| !c.is_empty());
        assert_eq!(content, t.text.as_deref());
        let calls = a
            .get("tool_calls")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        assert_eq!(calls.len(), t.calls.len());
        for (ci, (name, args, _, _)) in t.calls.iter().enumerate() {
            assert_eq!(calls[ci]["id"], call_id(ti, ci));
            assert_eq!(calls[ci]["function"]["name"], json!(name));
            let got: Value =
                serde_json::from_str(calls[ci]["function"]["arguments"].as_str().unwrap()).unwrap();
            assert_eq!(got, serde_json::from_str::<Value>(args).unwrap());
        }
        for (ci, (_, _, out, _)) in t.calls.iter().enumerate() {
            assert_eq!(
                msgs[i],
                json!({"role": "tool", "tool_call_id": call_id(ti, ci), "content": out})
            );
            i += 1;
        }
    }
    assert_eq!(i, msgs.len());
}

/// A chat answer and the chunk stream a server would send for it, with
/// deltas cut at the given points.
#[derive(Debug, Clone)]
struct Answer {
    reasoning: Option<String>,
    text: Option<String>,
    calls: Vec<(String, String)>,
    finish: &'static str,
    cuts: Vec<usize>,
}

fn answers() -> impl Strategy<Value = Answer> {
    (
        proptest::option::of(text()),
        proptest::option::of(text()),
        proptest::collection::vec(("[A-Za-z_]{1,8}", args()), 0..4),
        prop_oneof![Just("stop"), Just("length"), Just("tool_calls")],
        proptest::collection::vec(1usize..6, 1..8),
    )
        .prop_map(|(reasoning, text, calls, finish, cuts)| Answer {
            reasoning,
            text,
            calls,
            finish,
            cuts,
        })
}

fn pieces(s: &str, cuts: &[usize]) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut at = 0;
    for (k, c) in cuts.iter().cycle().enumerate() {
        if at >= chars.len() || k > 64 {
            break;
        }
        let end = (at + c).min(chars.len());
        out.push(chars[at..end].iter().collect());
        at = end;
    }
    if at < chars.len() {
        out.push(chars[at..].iter().collect());
    }
    out
}

impl Answer {
    fn whole(&self) -> Value {
        let mut msg = json!({"role": "assistant", "content": self.text});
        if let Some(r) = &self.reasoning {
            msg["reasoning_content"] = json!(r);
        }
        if !self.calls.is_empty() {
            msg["tool_calls"] = Value::Array(self.calls.iter().enumerate().map(|(i, (n, a))| {
                json!({"id": format!("call_{i}"), "type": "function", "function": {"name": n, "arguments": a}})
            }).collect());
        }
        json!({"id": "chatcmpl-p", "object": "chat.completion", "created": 1, "model": "m",
               "choices": [{"index": 0, "message": msg, "finish_reason": self.finish}],
               "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}})
    }

    fn stream(&self) -> Vec<u8> {
        let chunk = |delta: Value, finish: Value| {
            let c = json!({"id": "chatcmpl-p", "object": "chat.completion.chunk", "created": 1, "model": "m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
            format!("data: {c}\n\n")
        };
        let mut s = chunk(json!({"role": "assistant", "content": ""}), Value::Null);
        if let Some(r) = &self.reasoning {
            for p in pieces(r, &self.cuts) {
                s += &chunk(json!({"reasoning_content": p}), Value::Null);
            }
        }
        if let Some(t) = &self.text {
            for p in pieces(t, &self.cuts) {
                s += &chunk(json!({"content": p}), Value::Null);
            }
        }
        for (i, (n, a)) in self.calls.iter().enumerate() {
            s += &chunk(
                json!({"tool_calls": [{"index": i, "id": format!("call_{i}"), "type": "function", "function": {"name": n, "arguments": ""}}]}),
                Value::Null,
            );
            for p in pieces(a, &self.cuts) {
                s += &chunk(
                    json!({"tool_calls": [{"index": i, "function": {"arguments": p}}]}),
                    Value::Null,
                );
            }
        }
        s += &chunk(json!({}), json!(self.finish));
        s += &format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-p", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}})
        );
        s += "data: [DONE]\n\n";
        s.into_bytes()
    }
}

/// Split `bytes` at byte offsets taken from `cuts` (any byte, even inside a
/// UTF-8 character).
fn split_bytes<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut k = 0;
    while at < bytes.len() {
        let step = cuts[k % cuts.len()] * 7 % 23 + 1;
        k += 1;
        let end = (at + step).min(bytes.len());
        out.push(&bytes[at..end]);
        at = end;
    }
    out
}

fn translate_stream(api: WireApi, upstream: &[u8], cuts: &[usize]) -> Vec<u8> {
    let mut parser = sse::Parser::default();
    let mut t = StreamTranslator::new(api);
    let mut out = Vec::new();
    let mut events = Vec::new();
    for piece in split_bytes(upstream, cuts) {
        parser.feed(piece, &mut events);
        for e in events.drain(..) {
            out.extend(t.feed(&e));
        }
    }
    parser.finish(&mut events);
    for e in events.drain(..) {
        out.extend(t.feed(&e));
    }
    assert!(t.is_done());
    out
}

/// The fields a harness relies on, from an assembled answer.
fn essentials(a: &crate::dialect::Assembled) -> (Value, Option<String>, Option<i64>, Option<i64>) {
    // A whole answer's message may be kept as its text.
    let kept = a
        .message_text
        .as_deref()
        .and_then(|t| serde_json::from_str(t).ok());
    let mut msg = a.message.clone().or(kept).unwrap_or_default();
    if msg["content"] == "" {
        msg["content"] = Value::Null;
    }
    for tc in msg
        .get_mut("tool_calls")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        let args = tc["function"]["arguments"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        tc["function"]["arguments"] = serde_json::from_str(&args).unwrap_or(json!(args));
    }
    (
        msg,
        a.finish_reason.clone(),
        a.usage.prompt,
        a.usage.completion,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn messages_requests_keep_every_turn(turns in turns()) {
        let t = messages_to_chat(&as_messages(&turns), Unsupported::Reject).unwrap();
        check_chat(&turns, &t.request);
    }

    #[test]
    fn responses_requests_keep_every_turn(turns in turns()) {
        let t = responses_to_chat(&as_responses(&turns), Unsupported::Reject).unwrap();
        check_chat(&turns, &t.request);
    }

    #[test]
    fn streamed_answers_translate_like_whole_ones(ans in answers(), cuts in proptest::collection::vec(0usize..50, 1..10)) {
        let upstream = ans.stream();
        // The upstream stream itself assembles to the whole answer...
        let chat = WireApi::ChatCompletions.assemble(&upstream, true);
        let whole = WireApi::ChatCompletions.assemble(ans.whole().to_string().as_bytes(), false);
        prop_assert_eq!(essentials(&chat), essentials(&whole));
        for api in [WireApi::Responses, WireApi::Messages] {
            // ... and its translation, fed and re-parsed at arbitrary byte
            // boundaries, assembles to the translation of the whole answer.
            let bytes = translate_stream(api, &upstream, &cuts);
            let mut events = Vec::new();
            let mut p = sse::Parser::default();
            for piece in split_bytes(&bytes, &ans.cuts) {
                p.feed(piece, &mut events);
            }
            p.finish(&mut events);
            prop_assert_eq!(&events, &sse::parse_all(&bytes));
            let streamed = api.assemble(&bytes, true);
            let direct = api.assemble(response_from_chat(api, &ans.whole()).to_string().as_bytes(), false);
            prop_assert_eq!(essentials(&streamed), essentials(&direct));
            prop_assert_eq!(streamed.message.as_ref().and_then(|m| m.get("reasoning_content")).cloned(),
                            ans.reasoning.clone().map(Value::String));
        }
    }
}

/// Reasoning is never lost nor put between a tool call and its result:
/// consecutive reasoning items are joined, and reasoning between an
/// assistant's text and its call joins that message (as a Responses answer
/// with these output items is assembled).
#[test]
fn responses_reasoning_joins_the_turn_it_belongs_to() {
    let items = json!([
        {"type": "message", "role": "user", "content": "go"},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "A"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "B"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "running"}]},
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "C"}]},
        {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "ok"},
    ]);
    let t = responses_to_chat(&json!({"input": items}), Unsupported::Reject).unwrap();
    let call =
        json!({"id": "c1", "type": "function", "function": {"name": "shell", "arguments": "{}"}});
    assert_eq!(
        t.request["messages"],
        json!([
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "running", "reasoning_content": "ABC", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ])
    );
    // The answer those items came from reads the same.
    let answer = json!({"object": "response", "status": "completed", "output": &items.as_array().unwrap()[1..6]});
    let a = WireApi::Responses.assemble(answer.to_string().as_bytes(), false);
    assert_eq!(Some(&t.request["messages"][1]), a.message.as_ref());
}
