//! The streamed chat answer: a generation as Chat Completions chunks, text
//! released as it becomes safe to send (not a partial character, not a
//! possible stop string or tool call), tool calls and usage at the end.

use super::answer::Answer;
use super::params::Params;
use super::{error_body, now, sse, tool_call_json};
use crate::http::Chunk;
use crate::model::checkpoint::Text;
use crate::model::tools::{self, Splitter};
use crate::model::Step;
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::mpsc;

/// Stream a generation as Chat Completions chunks. Token ids and logprobs
/// ride on the chunk that releases their text; tokens whose text is held
/// back (a partial character, a possible tool call) ride on a later one.
#[allow(clippy::too_many_arguments)]
pub(super) async fn stream(
    text: &Text,
    p: &Params,
    prompt: &[u32],
    tools: bool,
    id: &str,
    name: &str,
    steps: &mut tokio::sync::mpsc::UnboundedReceiver<Step>,
    tx: mpsc::Sender<Chunk>,
) {
    let created = now();
    let chunk = |delta: Value, finish: Value, ids: &[u32], lps: &[Value]| {
        let mut choice = json!({"index": 0, "delta": delta,
            "logprobs": if p.logprobs { json!({"content": lps}) } else { Value::Null },
            "finish_reason": finish});
        choice["token_ids"] = if p.token_ids { json!(ids) } else { Value::Null };
        json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": name, "choices": [choice]})
    };
    let send = |v: Value| sse(&tx, v);
    let mut first = chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
        &[],
        &[],
    );
    first["prompt_token_ids"] = if p.token_ids {
        json!(prompt)
    } else {
        Value::Null
    };
    if !send(first).await {
        return;
    }
    let mut a = Answer::new();
    let mut splitter = Splitter::default();
    let mut released = 0; // bytes of text sent when there are no tools
    let mut sent_ids = 0;
    let hold = p.stop.iter().map(String::len).max().unwrap_or(1) - 1;
    while a.finish.is_none() {
        let Some(step) = steps.recv().await else {
            break;
        };
        if let Err(e) = a.step(&text.vocab, p, step) {
            let _ = send(error_body(500, &e)).await;
            let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
            return;
        }
        if a.finish.is_some() {
            break;
        }
        // Hold back what may be the start of a stop string.
        let mut safe = a.text.len().saturating_sub(hold);
        while !a.text.is_char_boundary(safe) {
            safe -= 1;
        }
        let new = if tools {
            splitter.release(&a.text[..safe]).to_owned()
        } else {
            let s = a.text.get(released..safe).unwrap_or("").to_owned();
            released = released.max(safe);
            s
        };
        if !new.is_empty() {
            let c = chunk(
                json!({"content": new}),
                Value::Null,
                &a.ids[sent_ids..],
                &a.logprobs[sent_ids.min(a.logprobs.len())..],
            );
            sent_ids = a.ids.len();
            if !send(c).await {
                return; // the client went away: dropping `steps` cancels
            }
        }
    }
    let Some(finish) = a.finish else {
        let _ = send(error_body(500, "the model thread stopped")).await;
        return;
    };
    steps.close();
    let mut finish = Value::from(finish);
    let mut tail = json!({});
    if tools {
        let (text, calls) = tools::parse(splitter.rest(&a.text));
        if !calls.is_empty() {
            finish = Value::from("tool_calls");
            if !text.is_empty() {
                tail["content"] = Value::String(text);
            }
            tail["tool_calls"] = calls
                .iter()
                .enumerate()
                .map(|(i, c)| tool_call_json(i, c))
                .collect();
        } else if !text.is_empty() {
            tail["content"] = Value::String(text);
        }
    } else if let Some(rest) = a.text.get(released..).filter(|r| !r.is_empty()) {
        tail["content"] = Value::String(rest.to_owned());
    }
    let lps = &a.logprobs[sent_ids.min(a.logprobs.len())..];
    let mut last = chunk(tail, finish, &a.ids[sent_ids..], lps);
    last["choices"][0]["stop_reason"] = json!(a.stop_reason);
    if !send(last).await {
        return;
    }
    if p.include_usage {
        let u = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": name,
            "choices": [], "usage": a.usage(prompt)});
        if !send(u).await {
            return;
        }
    }
    let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
}
