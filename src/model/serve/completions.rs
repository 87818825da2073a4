//! `POST /v1/completions` in vLLM's shape: a prompt (text, or token ids)
//! continued, whole or streamed.
//!
//! - `logprobs: N` gives OpenAI's legacy object (`tokens`,
//!   `token_logprobs`, `top_logprobs` with the token and its N most likely
//!   alternatives, `text_offset`), logprobs floored at -9999 as vLLM does;
//! - `echo` puts the prompt first in `text`, and with `logprobs` in the
//!   logprob lists too, its first token `null`. `max_tokens: 0` with
//!   `echo` scores a prompt without generating: what a teacher is asked;
//! - vLLM's `prompt_logprobs` and `return_token_ids` (per choice:
//!   `prompt_logprobs`, `prompt_token_ids`, `token_ids`).
//!
//! One prompt per request (a list of one is taken).

use super::answer::Answer;
use super::params::{params, Api, Params};
use super::{begin, error_body, json_response, now, reject, respond, sse, Reject};
use crate::http::{Chunk, ProxyBody};
use crate::model::checkpoint::Text;
use crate::model::{Model, Step};
use bytes::Bytes;
use http::Response;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use tokio::sync::mpsc;

/// vLLM's floor for a logprob in the legacy object.
const FLOOR: f32 = -9999.0;

/// The prompt's token ids: a string (tokenized with the special tokens the
/// model puts first), a list of ids, or a list of one of either.
fn prompt_ids(text: &Text, body: &Map<String, Value>) -> Result<Vec<u32>, Reject> {
    let ids_of = |a: &[Value]| -> Option<Vec<u32>> {
        a.iter()
            .map(|t| {
                t.as_u64()
                    .filter(|&t| t < text.vocab.len() as u64)
                    .map(|t| t as u32)
            })
            .collect()
    };
    let one = match body.get("prompt") {
        Some(Value::Array(a)) if a.len() == 1 && (a[0].is_string() || a[0].is_array()) => &a[0],
        Some(v) => v,
        None => return reject(400, "`prompt` is required"),
    };
    let ids = match one {
        Value::String(s) => text
            .vocab
            .encode(s, true)
            .map_err(|e| Reject(400, e.to_string()))?,
        Value::Array(a) if a.iter().all(Value::is_number) => match ids_of(a) {
            Some(ids) => ids,
            None => {
                return reject(
                    400,
                    "`prompt` token ids must be integers below the vocabulary size",
                )
            }
        },
        Value::Array(_) => return reject(400, "the embedded model takes one prompt per request"),
        _ => return reject(400, "`prompt` must be a string or a list of token ids"),
    };
    if ids.is_empty() {
        return reject(400, "`prompt` must not be empty");
    }
    Ok(ids)
}

/// A token, with its logprob and the most likely tokens there when it has
/// one (the prompt's first has none).
type Scored<'a> = (u32, Option<(f32, &'a [(u32, f32)])>);

/// OpenAI's legacy logprobs object over `tokens`: each `(id, logprob,
/// alternatives)`, `None` where there is none (the prompt's first token).
fn legacy(text: &Text, top: usize, tokens: &[Scored<'_>]) -> Value {
    let piece = |id: u32| text.vocab.decode(&[id], false).unwrap_or_default();
    let (mut strs, mut lps, mut tops, mut offsets) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut offset = 0;
    for &(id, scored) in tokens {
        let s = piece(id);
        offsets.push(offset);
        offset += s.chars().count();
        match scored {
            None => {
                lps.push(Value::Null);
                tops.push(Value::Null);
            }
            Some((lp, alternatives)) => {
                lps.push(json!(lp.max(FLOOR)));
                // The token itself, then the `top` most likely.
                let mut m = Map::new();
                m.insert(s.clone(), json!(lp.max(FLOOR)));
                for &(alt, alp) in alternatives.iter().take(top) {
                    m.entry(piece(alt)).or_insert(json!(alp.max(FLOOR)));
                }
                tops.push(Value::Object(m));
            }
        }
        strs.push(Value::String(s));
    }
    json!({"text_offset": offsets, "token_logprobs": lps, "tokens": strs, "top_logprobs": tops})
}

pub(super) async fn completions(
    model: &Arc<Model>,
    body: &Map<String, Value>,
) -> Result<Response<ProxyBody>, Reject> {
    let text = model.text();
    let prompt = prompt_ids(&text, body)?;
    let p = params(model, Api::Completions, body, prompt.len())?;
    let (mut steps, name) = begin(model, body, &prompt, None, &p)?;
    let id = format!("cmpl-{}", uuid::Uuid::new_v4().simple());
    if p.stream {
        let (tx, rx) = mpsc::channel::<Chunk>(64);
        tokio::spawn(async move { stream(&text, &p, &prompt, &id, &name, &mut steps, tx).await });
        return Ok(respond(200, ProxyBody::Stream(rx), "text/event-stream"));
    }
    let mut a = Answer::whole(&text.vocab, &p, steps).await?;
    let prompt_text = if p.echo {
        text.vocab
            .decode(&prompt, false)
            .map_err(|e| Reject(500, e.to_string()))?
    } else {
        String::new()
    };
    let logprobs = p.logprobs.then(|| {
        let mut tokens: Vec<Scored<'_>> = Vec::new();
        if p.echo {
            tokens.push((prompt[0], None));
            tokens.extend(
                a.scored
                    .iter()
                    .map(|s| (s.token, Some((s.logprob, &s.top[..])))),
            );
        }
        tokens.extend(
            a.ids
                .iter()
                .zip(&a.sampled)
                .map(|(&id, (lp, alt))| (id, Some((*lp, &alt[..])))),
        );
        legacy(&text, p.top_logprobs, &tokens)
    });
    let choice = json!({"index": 0, "text": prompt_text + &a.text,
        "logprobs": logprobs, "finish_reason": a.finish.unwrap_or("stop"), "stop_reason": a.stop_reason,
        "prompt_logprobs": a.prompt_logprobs.take(),
        "prompt_token_ids": if p.token_ids { json!(prompt) } else { Value::Null },
        "token_ids": if p.token_ids { json!(a.ids) } else { Value::Null }});
    Ok(json_response(
        &json!({"id": id, "object": "text_completion", "created": now(), "model": name,
        "choices": [choice], "usage": a.usage(&prompt)}),
    ))
}

/// Stream a generation as Completions chunks, text released as it becomes
/// safe to send (not a partial character, not a possible stop string).
async fn stream(
    text: &Text,
    p: &Params,
    prompt: &[u32],
    id: &str,
    name: &str,
    steps: &mut mpsc::UnboundedReceiver<Step>,
    tx: mpsc::Sender<Chunk>,
) {
    let created = now();
    let send = |v: Value| sse(&tx, v);
    let chunk = |piece: &str, ids: &[u32], a: &Answer, from: usize, finish: Value| {
        let logprobs = p.logprobs.then(|| {
            let tokens: Vec<_> = ids
                .iter()
                .zip(&a.sampled[from..])
                .map(|(&id, (lp, alt))| (id, Some((*lp, &alt[..]))))
                .collect();
            legacy(text, p.top_logprobs, &tokens)
        });
        let mut choice = json!({"index": 0, "text": piece, "logprobs": logprobs, "finish_reason": finish,
            "stop_reason": if finish.is_null() { Value::Null } else { json!(a.stop_reason) }});
        choice["token_ids"] = if p.token_ids { json!(ids) } else { Value::Null };
        json!({"id": id, "object": "text_completion", "created": created, "model": name, "choices": [choice]})
    };
    let mut a = Answer::new();
    let (mut released, mut sent_ids) = (0, 0);
    let hold = p.stop.iter().map(String::len).max().unwrap_or(1) - 1;
    let mut opening = String::new();
    if p.echo {
        opening = text.vocab.decode(prompt, false).unwrap_or_default();
    }
    let mut first = true;
    loop {
        let step = steps.recv().await;
        let failed = match step {
            Some(s) => a.step(&text.vocab, p, s).err(),
            None if a.finish.is_none() => Some("the model thread stopped".to_owned()),
            None => None,
        };
        if let Some(e) = failed {
            let _ = send(error_body(500, &e)).await;
            break;
        }
        let done = a.finish.is_some();
        let mut safe = if done {
            a.text.len()
        } else {
            a.text.len().saturating_sub(hold)
        };
        while !a.text.is_char_boundary(safe) {
            safe -= 1;
        }
        let piece = a.text.get(released..safe).unwrap_or("").to_owned();
        if !piece.is_empty() || done || (first && (p.echo || p.token_ids)) {
            released = released.max(safe);
            let finish = a.finish.map_or(Value::Null, Value::from);
            let mut c = chunk(
                &(std::mem::take(&mut opening) + &piece),
                &a.ids[sent_ids..],
                &a,
                sent_ids,
                finish,
            );
            if first && p.token_ids {
                c["choices"][0]["prompt_token_ids"] = json!(prompt);
            }
            first = false;
            sent_ids = a.ids.len();
            if !send(c).await {
                return; // the client went away: dropping `steps` cancels
            }
        }
        if done {
            steps.close();
            if p.include_usage {
                let u = json!({"id": id, "object": "text_completion", "created": created, "model": name,
                    "choices": [], "usage": a.usage(prompt)});
                if !send(u).await {
                    return;
                }
            }
            break;
        }
    }
    let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
}
