//! The embedded model over HTTP: an OpenAI-compatible Chat Completions and
//! Completions server in vLLM's shape, on a loopback port inside the rollcall process.
//! A route of kind `embedded` points at it and is treated as a vLLM route,
//! so token capture, stripping and recording are the same code paths a real
//! vLLM server goes through. `rollcall model serve` runs it alone.
//!
//! | path | what |
//! |---|---|
//! | `POST /v1/chat/completions` | streaming or not; `tools`, `tool_choice: "none"`, `max_tokens` / `max_completion_tokens`, `temperature`, `top_p`, `top_k`, `seed`, `stop`, `logprobs`, `top_logprobs`, `return_token_ids`, `stream_options.include_usage` |
//! | `POST /v1/completions` | a prompt (text or token ids) continued, streaming or not; `echo`, `logprobs: N` (OpenAI's legacy object), `max_tokens: 0` with `echo` to score a prompt, vLLM's `prompt_logprobs` and `return_token_ids` ([`completions`]) |
//! | `POST /tokenize` | vLLM's: `{"prompt"}` or `{"messages", "tools"}` → `{"tokens", "count", "max_model_len"}` |
//! | `POST /detokenize` | `{"tokens"}` → `{"prompt"}` |
//! | `POST /update_weights_from_disk` | SGLang's: `{"model_path", "force"?}` → `{"success", "message"}`; new weights while serving ([`Model::reload`]) |
//! | `GET /v1/models`, `GET /health` | |
//!
//! Errors are OpenAI error bodies; a prompt longer than the context is a
//! 400, as vLLM answers it.
//!
//! This file holds the server: binding, routing, errors, `/tokenize`,
//! `/detokenize` and the whole (non-streamed) chat answer. The checked
//! request parameters are in `params`, a generation as it is taken in step
//! by step in `answer`, the streamed chat answer in `stream`.

mod answer;
mod completions;
mod params;
mod reload;
mod stream;

use super::checkpoint::Text;
use super::tools;
use super::Model;
use crate::http::{Chunk, ProxyBody};
use answer::Answer;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use params::{params, Api};
use serde_json::{json, Map, Value};
use std::net::SocketAddr;
use std::sync::Arc;
use stream::stream;
use tokio::sync::mpsc;

/// Largest request body accepted.
const MAX_BODY: usize = 32 << 20;

/// Bind `addr` and serve `model` until the process ends; returns the
/// address and the serving future.
pub async fn bind(
    model: Arc<Model>,
    addr: SocketAddr,
) -> std::io::Result<(SocketAddr, impl std::future::Future<Output = ()>)> {
    crate::http::serve_plain(addr, move |req| handle(req, model.clone())).await
}

/// A 4xx/5xx answer with an OpenAI error body.
#[derive(Debug)]
struct Reject(u16, String);

fn reject<T>(status: u16, msg: impl Into<String>) -> Result<T, Reject> {
    Err(Reject(status, msg.into()))
}

fn respond(status: u16, body: ProxyBody, ct: &'static str) -> Response<ProxyBody> {
    let mut r = Response::new(body);
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static(ct));
    r
}

fn json_response(v: &Value) -> Response<ProxyBody> {
    crate::http::json_response(200, v)
}

fn error_body(status: u16, msg: &str) -> Value {
    let kind = match status {
        404 => "NotFoundError",
        s if s >= 500 => "InternalServerError",
        _ => "BadRequestError",
    };
    json!({"error": {"message": msg, "type": kind, "param": null, "code": status}})
}

async fn handle(req: Request<Incoming>, model: Arc<Model>) -> Response<ProxyBody> {
    let path = req.uri().path().trim_end_matches('/').to_owned();
    let result = match (req.method(), path.as_str()) {
        (&Method::GET, "/v1/models") => Ok(json_response(&json!({
            "object": "list",
            "data": [{"id": model.name, "object": "model", "created": now(), "owned_by": "rollcall-embedded", "max_model_len": model.text().context}],
        }))),
        (&Method::GET, "/health") => Ok(crate::http::bytes_response(200, "text/plain", "")),
        (&Method::POST, "/update_weights_from_disk") => match read_json(req).await {
            Ok(body) => Ok(reload::update_weights_from_disk(&model, &body).await),
            Err(r) => Err(r),
        },
        (
            &Method::POST,
            "/v1/chat/completions" | "/v1/completions" | "/tokenize" | "/detokenize",
        ) => match read_json(req).await {
            Ok(body) => match path.as_str() {
                "/v1/completions" => completions::completions(&model, &body).await,
                "/tokenize" => tokenize(&model.text(), &body).map(|v| json_response(&v)),
                "/detokenize" => detokenize(&model.text(), &body).map(|v| json_response(&v)),
                _ => chat(&model, &body).await,
            },
            Err(r) => Err(r),
        },
        _ => reject(404, format!("no route for {} {path}", req.method())),
    };
    result.unwrap_or_else(|Reject(status, msg)| {
        let mut r = respond(
            status,
            ProxyBody::full(error_body(status, &msg).to_string()),
            "application/json",
        );
        if status == 503 {
            r.headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        }
        r
    })
}

async fn read_json(req: Request<Incoming>) -> Result<Map<String, Value>, Reject> {
    let bytes = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return reject(413, format!("request body: {e}")),
    };
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => reject(400, "the request body must be a JSON object"),
        Err(e) => reject(400, format!("the request body is not valid JSON: {e}")),
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn tools_of(body: &Map<String, Value>) -> Vec<Value> {
    if body.get("tool_choice").and_then(Value::as_str) == Some("none") {
        return Vec::new();
    }
    body.get("tools")
        .and_then(Value::as_array)
        .map(|t| {
            t.iter()
                .filter(|t| t.get("function").is_some())
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// The prompt token ids of a chat request, and where the conversation
/// ends and the opening of the assistant's turn begins (a KV-cache
/// checkpoint: the next turn's prompt extends the conversation, not always
/// the opening).
fn chat_prompt(
    text: &Text,
    body: &Map<String, Value>,
    tools: &[Value],
) -> Result<(Vec<u32>, Option<usize>), Reject> {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return reject(400, "`messages` must be a list of messages");
    };
    if messages.is_empty() {
        return reject(400, "`messages` must not be empty");
    }
    let tokens = |open: bool| {
        let rendered = text
            .template
            .render_with(messages, tools, open)
            .map_err(|e| Reject(400, e.to_string()))?;
        text.vocab
            .encode(&rendered, false)
            .map_err(|e| Reject(400, e.to_string()))
    };
    let ids = tokens(true)?;
    let conversation = tokens(false).ok();
    let checkpoint = conversation
        .filter(|c| !c.is_empty() && c.len() < ids.len() && ids.starts_with(c))
        .map(|c| c.len());
    Ok((ids, checkpoint))
}

fn tokenize(text: &Text, body: &Map<String, Value>) -> Result<Value, Reject> {
    let tokens = match body.get("prompt") {
        Some(Value::String(p)) => {
            let special = body
                .get("add_special_tokens")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            text.vocab
                .encode(p, special)
                .map_err(|e| Reject(400, e.to_string()))?
        }
        Some(_) => return reject(400, "`prompt` must be a string"),
        None => chat_prompt(text, body, &tools_of(body))?.0,
    };
    Ok(
        json!({"count": tokens.len(), "max_model_len": text.context, "tokens": tokens, "token_strs": null}),
    )
}

fn detokenize(text: &Text, body: &Map<String, Value>) -> Result<Value, Reject> {
    let ids: Option<Vec<u32>> = body
        .get("tokens")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(|t| t.as_u64().map(|t| t as u32)).collect());
    let Some(ids) = ids else {
        return reject(400, "`tokens` must be a list of token ids");
    };
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= text.vocab.len()) {
        return reject(400, format!("token id {bad} is out of vocabulary"));
    }
    let decoded = text
        .vocab
        .decode(&ids, false)
        .map_err(|e| Reject(400, e.to_string()))?;
    Ok(json!({"prompt": decoded}))
}

fn tool_call_json(i: usize, c: &tools::ToolCall) -> Value {
    json!({"id": format!("call_{}", uuid::Uuid::new_v4().simple()), "type": "function", "index": i,
        "function": {"name": c.name, "arguments": c.arguments}})
}

/// Queue the generation a checked request asks for; its steps, and the
/// model name the answer gives (the request's, else the served one).
fn begin(
    model: &Model,
    body: &Map<String, Value>,
    prompt: &[u32],
    checkpoint: Option<usize>,
    p: &params::Params,
) -> Result<(mpsc::UnboundedReceiver<super::Step>, String), Reject> {
    let top = if p.logprobs { p.top_logprobs } else { 0 };
    let steps = model
        .generate(
            prompt.to_vec(),
            checkpoint,
            p.max_tokens,
            p.sampling.clone(),
            top,
            p.score(),
        )
        .map_err(|e| Reject(503, e.to_string()))?;
    let name = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(&model.name)
        .to_owned();
    Ok((steps, name))
}

/// Send one server-sent event's `data:` line; false once the client has
/// gone away.
async fn sse(tx: &mpsc::Sender<Chunk>, v: Value) -> bool {
    tx.send(Ok(bytes::Bytes::from(format!("data: {v}\n\n"))))
        .await
        .is_ok()
}

async fn chat(
    model: &Arc<Model>,
    body: &Map<String, Value>,
) -> Result<Response<ProxyBody>, Reject> {
    let tools = tools_of(body);
    let text = model.text();
    let (prompt, checkpoint) = chat_prompt(&text, body, &tools)?;
    let p = params(model, Api::Chat, body, prompt.len())?;
    let (mut steps, name) = begin(model, body, &prompt, checkpoint, &p)?;
    let id = format!("chatcmpl-{}", uuid::Uuid::new_v4().simple());
    if p.stream {
        let (tx, rx) = mpsc::channel::<Chunk>(64);
        tokio::spawn(async move {
            stream(
                &text,
                &p,
                &prompt,
                !tools.is_empty(),
                &id,
                &name,
                &mut steps,
                tx,
            )
            .await;
        });
        return Ok(respond(200, ProxyBody::Stream(rx), "text/event-stream"));
    }
    let mut a = Answer::whole(&text.vocab, &p, steps).await?;
    let (content, calls) = if tools.is_empty() {
        (a.text.clone(), Vec::new())
    } else {
        tools::parse(&a.text)
    };
    let mut message = json!({"role": "assistant", "content": if content.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(content) }});
    let finish = if calls.is_empty() {
        a.finish.unwrap_or("stop")
    } else {
        message["tool_calls"] = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut v = tool_call_json(i, c);
                v.as_object_mut().map(|o| o.remove("index"));
                v
            })
            .collect();
        "tool_calls"
    };
    let mut choice = json!({"index": 0, "message": message,
        "logprobs": if p.logprobs { json!({"content": a.logprobs}) } else { Value::Null },
        "finish_reason": finish, "stop_reason": a.stop_reason});
    // As vLLM: the fields are always there, null unless asked for.
    choice["token_ids"] = if p.token_ids {
        json!(a.ids)
    } else {
        Value::Null
    };
    let mut v = json!({"id": id, "object": "chat.completion", "created": now(), "model": name,
        "choices": [choice], "usage": a.usage(&prompt),
        "prompt_token_ids": if p.token_ids { json!(prompt) } else { Value::Null }});
    if let Some(scored) = a.prompt_logprobs.take() {
        v["prompt_logprobs"] = Value::Array(scored);
    }
    Ok(json_response(&v))
}
