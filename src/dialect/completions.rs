//! OpenAI legacy Completions: assemble a stream into one `text_completion`.

use super::{chat, sse::Event, tokens, Assembled, StreamOutcome, WireApi};
use serde_json::{json, Map, Value};

pub fn assemble_stream(events: &[Event]) -> StreamOutcome {
    let mut head = Map::new();
    let mut text = String::new();
    let mut finish = Value::Null;
    let mut usage = Value::Null;
    let mut lp_tokens: Vec<Value> = Vec::new();
    let mut lp_values: Vec<Value> = Vec::new();
    let mut token_ids: Option<Vec<Value>> = None;
    let mut choice_extra = Map::new();
    let mut outcome = StreamOutcome::default();
    let mut seen = false;
    for ev in events {
        if ev.data == "[DONE]" {
            continue;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(&ev.data) else {
            continue;
        };
        if let Some(e) = chunk.get("error").filter(|e| !e.is_null()) {
            outcome.note_error(e);
            continue;
        }
        seen = true;
        for key in [
            "id",
            "created",
            "model",
            "system_fingerprint",
            "prompt_token_ids",
        ] {
            if let Some(v) = chunk.get(key).filter(|v| !v.is_null()) {
                head.insert(key.into(), v.clone());
            }
        }
        if let Some(u) = chunk.get("usage").filter(|u| !u.is_null()) {
            usage = u.clone();
        }
        if let Some(c) = super::at(&chunk, &["choices", "0"]) {
            text.push_str(c.get("text").and_then(Value::as_str).unwrap_or(""));
            if let Some(f) = c.get("finish_reason").filter(|f| !f.is_null()) {
                finish = f.clone();
            }
            if let Some(lp) = c.get("logprobs") {
                lp_tokens.extend(
                    lp.get("tokens")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .cloned(),
                );
                lp_values.extend(
                    lp.get("token_logprobs")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                        .cloned(),
                );
            }
            if let Some(t) = c.get("token_ids").and_then(Value::as_array) {
                token_ids
                    .get_or_insert_with(Vec::new)
                    .extend(t.iter().cloned());
            }
            // vLLM and SGLang put prompt ids on the choice of the first chunk.
            for key in ["prompt_token_ids", "prompt_logprobs"] {
                if let Some(v) = c.get(key).filter(|v| !v.is_null()) {
                    choice_extra.entry(key).or_insert_with(|| v.clone());
                }
            }
        }
    }
    if !seen {
        return outcome;
    }
    let mut choice =
        json!({"index": 0, "text": text, "finish_reason": finish, "logprobs": Value::Null});
    if !lp_values.is_empty() {
        choice["logprobs"] = json!({"tokens": lp_tokens, "token_logprobs": lp_values});
    }
    if let Some(t) = token_ids {
        choice["token_ids"] = Value::Array(t);
    }
    if let Some(c) = choice.as_object_mut() {
        c.extend(choice_extra);
    }
    let mut obj = head;
    obj.insert("object".into(), json!("text_completion"));
    obj.insert("choices".into(), json!([choice]));
    obj.insert("usage".into(), usage);
    outcome.response = Some(Value::Object(obj));
    outcome
}

pub fn extract(resp: &Value, out: &mut Assembled) {
    let choice = super::at(resp, &["choices", "0"]);
    let text = choice
        .and_then(|c| c.get("text"))
        .cloned()
        .unwrap_or(Value::Null);
    out.message = Some(json!({"role": "assistant", "content": text}));
    out.finish_reason = choice
        .and_then(|c| c.get("finish_reason"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    out.usage = chat::usage(resp.get("usage").unwrap_or(&Value::Null));
    out.tokens = tokens::read(WireApi::Completions, resp);
}
