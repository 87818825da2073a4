//! The embedded model over HTTP: an OpenAI-compatible Chat Completions
//! server in vLLM's shape, on a loopback port inside the rollcall process.
//! A route of kind `embedded` points at it and is treated as a vLLM route,
//! so token capture, stripping and recording are the same code paths a real
//! vLLM server goes through. `rollcall model serve` runs it alone.
//!
//! | path | what |
//! |---|---|
//! | `POST /v1/chat/completions` | streaming or not; `tools`, `tool_choice: "none"`, `max_tokens` / `max_completion_tokens`, `temperature`, `top_p`, `top_k`, `seed`, `stop`, `logprobs`, `top_logprobs`, `return_token_ids`, `stream_options.include_usage` |
//! | `POST /tokenize` | vLLM's: `{"prompt"}` or `{"messages", "tools"}` → `{"tokens", "count", "max_model_len"}` |
//! | `POST /detokenize` | `{"tokens"}` → `{"prompt"}` |
//! | `GET /v1/models`, `GET /health` | |
//!
//! Errors are OpenAI error bodies; a prompt longer than the context is a
//! 400, as vLLM answers it.

use super::sample::Sampling;
use super::tools::{self, Splitter};
use super::{Finish, Model, Step};
use crate::http::{Chunk, ProxyBody};
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{json, Map, Value};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Largest request body accepted.
const MAX_BODY: usize = 32 << 20;
/// Most `top_logprobs` served (OpenAI's limit).
const MAX_TOP_LOGPROBS: usize = 20;

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
            "data": [{"id": model.name, "object": "model", "created": now(), "owned_by": "rollcall-embedded", "max_model_len": model.context}],
        }))),
        (&Method::GET, "/health") => Ok(crate::http::bytes_response(200, "text/plain", "")),
        (&Method::POST, "/v1/chat/completions" | "/tokenize" | "/detokenize") => {
            match read_json(req).await {
                Ok(body) => match path.as_str() {
                    "/tokenize" => tokenize(&model, &body).map(|v| json_response(&v)),
                    "/detokenize" => detokenize(&model, &body).map(|v| json_response(&v)),
                    _ => chat(&model, &body).await,
                },
                Err(r) => Err(r),
            }
        }
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
    model: &Model,
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
        let text = model
            .template
            .render_with(messages, tools, open)
            .map_err(|e| Reject(400, e.to_string()))?;
        model
            .vocab
            .encode(&text, false)
            .map_err(|e| Reject(400, e.to_string()))
    };
    let ids = tokens(true)?;
    let conversation = tokens(false).ok();
    let checkpoint = conversation
        .filter(|c| !c.is_empty() && c.len() < ids.len() && ids.starts_with(c))
        .map(|c| c.len());
    Ok((ids, checkpoint))
}

fn tokenize(model: &Model, body: &Map<String, Value>) -> Result<Value, Reject> {
    let tokens = match body.get("prompt") {
        Some(Value::String(p)) => {
            let special = body
                .get("add_special_tokens")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            model
                .vocab
                .encode(p, special)
                .map_err(|e| Reject(400, e.to_string()))?
        }
        Some(_) => return reject(400, "`prompt` must be a string"),
        None => chat_prompt(model, body, &tools_of(body))?.0,
    };
    Ok(
        json!({"count": tokens.len(), "max_model_len": model.context, "tokens": tokens, "token_strs": null}),
    )
}

fn detokenize(model: &Model, body: &Map<String, Value>) -> Result<Value, Reject> {
    let ids: Option<Vec<u32>> = body
        .get("tokens")
        .and_then(Value::as_array)
        .and_then(|a| a.iter().map(|t| t.as_u64().map(|t| t as u32)).collect());
    let Some(ids) = ids else {
        return reject(400, "`tokens` must be a list of token ids");
    };
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= model.vocab.len()) {
        return reject(400, format!("token id {bad} is out of vocabulary"));
    }
    let text = model
        .vocab
        .decode(&ids, false)
        .map_err(|e| Reject(400, e.to_string()))?;
    Ok(json!({"prompt": text}))
}

/// The generation parameters of a chat request, checked.
struct Params {
    stream: bool,
    include_usage: bool,
    max_tokens: usize,
    sampling: Sampling,
    stop: Vec<String>,
    logprobs: bool,
    top_logprobs: usize,
    token_ids: bool,
}

fn number(body: &Map<String, Value>, key: &str) -> Result<Option<f64>, Reject> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) => Ok(Some(x)),
            None => reject(400, format!("`{key}` must be a number")),
        },
    }
}

fn params(model: &Model, body: &Map<String, Value>, prompt_len: usize) -> Result<Params, Reject> {
    let flag = |k: &str| body.get(k).and_then(Value::as_bool).unwrap_or(false);
    if number(body, "n")?.is_some_and(|n| n != 1.0) {
        return reject(400, "the embedded model serves n = 1 only");
    }
    let temperature = number(body, "temperature")?.unwrap_or(model.options.default_temperature);
    let top_p = number(body, "top_p")?.unwrap_or(1.0);
    if !((0.0..=2.0).contains(&temperature) && top_p > 0.0 && top_p <= 1.0) {
        return reject(400, "`temperature` must be in [0, 2] and `top_p` in (0, 1]");
    }
    let top_k = number(body, "top_k")?.filter(|k| *k > 0.0).unwrap_or(0.0) as usize;
    let seed = number(body, "seed")?.map(|s| s as i64 as u64);
    let room = model.context.saturating_sub(prompt_len);
    if room == 0 {
        return reject(
            400,
            format!(
                "This model's maximum context length is {} tokens. However, your request has {prompt_len} input tokens. Please reduce the length of the input messages.",
                model.context
            ),
        );
    }
    let asked = number(body, "max_completion_tokens")?.or(number(body, "max_tokens")?);
    let max_tokens = match asked {
        Some(m) if m < 1.0 => return reject(400, "`max_tokens` must be at least 1"),
        Some(m) if m as usize > room => {
            return reject(
                400,
                format!(
                    "This model's maximum context length is {} tokens. However, you requested {} tokens ({prompt_len} in the messages, {} in the completion). Please reduce the length of the messages or completion.",
                    model.context,
                    prompt_len + m as usize,
                    m as usize
                ),
            )
        }
        Some(m) => m as usize,
        None => model.options.default_max_tokens.min(room),
    };
    let stop = match body.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect(),
        Some(_) => return reject(400, "`stop` must be a string or a list of strings"),
    };
    let top_logprobs = number(body, "top_logprobs")?.unwrap_or(0.0) as usize;
    if top_logprobs > MAX_TOP_LOGPROBS {
        return reject(
            400,
            format!("`top_logprobs` must be at most {MAX_TOP_LOGPROBS}"),
        );
    }
    Ok(Params {
        stream: flag("stream"),
        include_usage: body
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            .unwrap_or(false),
        max_tokens,
        sampling: Sampling {
            temperature,
            top_p,
            top_k,
            seed,
        },
        stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
        logprobs: flag("logprobs"),
        top_logprobs,
        token_ids: flag("return_token_ids"),
    })
}

/// A generation in progress: the tokens so far, their text, and why it
/// ended.
struct Answer {
    ids: Vec<u32>,
    logprobs: Vec<Value>,
    text: String,
    cached: usize,
    finish: Option<&'static str>,
    /// The stop string that ended it.
    stop_reason: Option<String>,
}

impl Answer {
    fn new() -> Self {
        Self {
            ids: Vec::new(),
            logprobs: Vec::new(),
            text: String::new(),
            cached: 0,
            finish: None,
            stop_reason: None,
        }
    }

    /// Take in one step; returns `Err` when the model failed.
    fn step(&mut self, model: &Model, p: &Params, step: Step) -> Result<(), String> {
        match step {
            Step::Started { cached } => self.cached = cached,
            Step::Token { id, logprob, top } => {
                self.ids.push(id);
                if p.logprobs {
                    let entry = |id: u32, lp: f32| {
                        let bytes = model
                            .vocab
                            .bytes
                            .get(id as usize)
                            .cloned()
                            .unwrap_or_default();
                        json!({"token": String::from_utf8_lossy(&bytes), "logprob": lp, "bytes": bytes})
                    };
                    let mut e = entry(id, logprob);
                    e["top_logprobs"] = top.iter().map(|&(i, lp)| entry(i, lp)).collect();
                    self.logprobs.push(e);
                }
                // Decode the whole answer again: a token may complete a
                // character an earlier one began. Wait while it is partial.
                let text = model
                    .vocab
                    .decode(&self.ids, true)
                    .map_err(|e| e.to_string())?;
                if !text.ends_with('\u{FFFD}') {
                    self.text = text;
                }
                if let Some((at, s)) = p
                    .stop
                    .iter()
                    .filter_map(|s| self.text.find(s.as_str()).map(|at| (at, s)))
                    .min()
                {
                    self.text.truncate(at);
                    self.finish = Some("stop");
                    self.stop_reason = Some(s.clone());
                }
            }
            Step::Done(f) => {
                self.text = model
                    .vocab
                    .decode(&self.ids, true)
                    .map_err(|e| e.to_string())?;
                self.finish = Some(match f {
                    Finish::Stop => "stop",
                    Finish::Length => "length",
                });
            }
            Step::Failed(e) => return Err(e),
        }
        Ok(())
    }

    fn usage(&self, prompt: &[u32]) -> Value {
        json!({
            "prompt_tokens": prompt.len(),
            "total_tokens": prompt.len() + self.ids.len(),
            "completion_tokens": self.ids.len(),
            "prompt_tokens_details": {"cached_tokens": self.cached},
        })
    }
}

fn tool_call_json(i: usize, c: &tools::ToolCall) -> Value {
    json!({"id": format!("call_{}", uuid::Uuid::new_v4().simple()), "type": "function", "index": i,
        "function": {"name": c.name, "arguments": c.arguments}})
}

async fn chat(
    model: &Arc<Model>,
    body: &Map<String, Value>,
) -> Result<Response<ProxyBody>, Reject> {
    let tools = tools_of(body);
    let (prompt, checkpoint) = chat_prompt(model, body, &tools)?;
    let p = params(model, body, prompt.len())?;
    let top = if p.logprobs { p.top_logprobs } else { 0 };
    let mut steps = model
        .generate(
            prompt.clone(),
            checkpoint,
            p.max_tokens,
            p.sampling.clone(),
            top,
        )
        .map_err(|e| Reject(503, e.to_string()))?;
    let id = format!("chatcmpl-{}", uuid::Uuid::new_v4().simple());
    let name = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(&model.name)
        .to_owned();
    if p.stream {
        let (tx, rx) = mpsc::channel::<Chunk>(64);
        let model = model.clone();
        tokio::spawn(async move {
            stream(
                &model,
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
    let mut a = Answer::new();
    while a.finish.is_none() {
        let Some(step) = steps.recv().await else {
            return reject(500, "the model thread stopped");
        };
        a.step(model, &p, step).map_err(|e| Reject(500, e))?;
    }
    drop(steps); // ends a generation cut by a stop string
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
    let v = json!({"id": id, "object": "chat.completion", "created": now(), "model": name,
        "choices": [choice], "usage": a.usage(&prompt),
        "prompt_token_ids": if p.token_ids { json!(prompt) } else { Value::Null }});
    Ok(json_response(&v))
}

/// Stream a generation as Chat Completions chunks. Token ids and logprobs
/// ride on the chunk that releases their text; tokens whose text is held
/// back (a partial character, a possible tool call) ride on a later one.
#[allow(clippy::too_many_arguments)]
async fn stream(
    model: &Model,
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
    let send = |v: Value| {
        let tx = tx.clone();
        async move {
            tx.send(Ok(Bytes::from(format!("data: {v}\n\n"))))
                .await
                .is_ok()
        }
    };
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
        if let Err(e) = a.step(model, p, step) {
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
