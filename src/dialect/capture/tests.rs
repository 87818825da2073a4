//! Token capture against each server's response shapes ([`servers`]).

mod servers;

use super::*;
use crate::dialect::WireApi::{ChatCompletions as Chat, Completions as Cmpl};
use serde_json::json;
use servers::*;

fn req(v: Value) -> Map<String, Value> {
    v.as_object().cloned().unwrap()
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
    let mut r = req(json!({"messages": [], "logprobs": true, "top_logprobs": 5, "stream": true}));
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
