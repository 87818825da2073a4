//! A scripted model server: a real HTTP server on loopback that answers
//! OpenAI Chat Completions, Responses and Completions calls (streaming or
//! not) with deterministic text and tool calls.
//!
//! It stands in for a real model server, the one component we cannot run at
//! scale here, in tests, benchmarks and `make demo`. Nothing in it is
//! consulted by the proxy.
//!
//! Behaviour is chosen per request through options appended to the model
//! name, `name@key=value@key=value`:
//!
//! | option | effect |
//! |---|---|
//! | `events=N` | split the answer into N stream deltas (default 4) |
//! | `delay_ms=N` | sleep N ms between stream events |
//! | `ttfb_ms=N` | sleep N ms before answering |
//! | `fault=500\|429\|400` | answer that status with an OpenAI error body |
//! | `fault=timeout` | never answer |
//! | `fault=drop` | send part of the body, then reset the connection |
//! | `fault=stream_error` | stream a delta, then an error event |
//! | `fault=garbage` | answer 200 with a body that is not JSON |
//!
//! The answer text is `Reply to: <last user text>`, so tests can tell calls
//! apart. When the request offers tools and its last message is not a tool
//! result, the answer is a call to a tool instead: a shell-like tool when one
//! is offered (`bash`, `shell`, `exec_command`, ...), else the first function
//! tool, with its required arguments filled from its JSON schema.
//!
//! **Scripted tasks.** A user message may carry commands as `[[run: CMD]]`.
//! The model then runs them in order, one tool call per turn (the number of
//! tool results so far says which is next), and once all have run it answers
//! `Done. The command printed: <last tool result>`. That is how the
//! end-to-end tests give a real harness a two-turn tool-call task. A request with
//! `logprobs: true` gets per-token logprobs; `return_token_ids: true` gets
//! vLLM-style `prompt_token_ids` and `token_ids` (ids are byte values).

use crate::server::body::{Chunk, ProxyBody};
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

#[derive(Default, Clone)]
struct Opts {
    events: usize,
    delay: Duration,
    ttfb: Duration,
    fault: Option<String>,
}

fn opts(model: &str) -> (String, Opts) {
    let mut parts = model.split('@');
    let name = parts.next().unwrap_or("").to_owned();
    let mut o = Opts {
        events: 4,
        ..Opts::default()
    };
    for p in parts {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        match k {
            "events" => o.events = v.parse().unwrap_or(4).max(1),
            "delay_ms" => o.delay = Duration::from_millis(v.parse().unwrap_or(0)),
            "ttfb_ms" => o.ttfb = Duration::from_millis(v.parse().unwrap_or(0)),
            "fault" => o.fault = Some(v.to_owned()),
            _ => {}
        }
    }
    (name, o)
}

/// Bind and serve until the process ends. Prints nothing; returns the address.
pub async fn bind(
    addr: SocketAddr,
) -> std::io::Result<(SocketAddr, impl std::future::Future<Output = ()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let counter = Arc::new(AtomicU64::new(0));
    let fut = async move {
        let builder = auto::Builder::new(TokioExecutor::new());
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let counter = counter.clone();
            let svc = hyper::service::service_fn(move |req| handle(req, counter.clone()));
            let conn = builder
                .serve_connection(TokioIo::new(stream), svc)
                .into_owned();
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
    };
    Ok((local, fut))
}

fn respond(status: u16, ct: &str, body: impl Into<Bytes>) -> Response<ProxyBody> {
    let mut r = Response::new(ProxyBody::full(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        ct.parse().expect("valid content type"),
    );
    r
}

fn error(status: u16, msg: &str) -> Response<ProxyBody> {
    let body = json!({"error": {"message": msg, "type": if status >= 500 {"server_error"} else {"invalid_request_error"}, "param": null, "code": status.to_string()}});
    respond(status, "application/json", body.to_string())
}

async fn handle(
    req: Request<Incoming>,
    counter: Arc<AtomicU64>,
) -> Result<Response<ProxyBody>, Infallible> {
    let path = req.uri().path().to_owned();
    if req.method() == Method::GET {
        return Ok(match path.as_str() {
            "/v1/models" => respond(
                200,
                "application/json",
                json!({"object": "list", "data": [{"id": "scripted", "object": "model", "owned_by": "rollcall-scripted"}]}).to_string(),
            ),
            _ => error(404, "not found"),
        });
    }
    let Ok(body) = req.into_body().collect().await else {
        return Ok(error(400, "could not read body"));
    };
    let Ok(body) = serde_json::from_slice::<Value>(&body.to_bytes()) else {
        return Ok(error(400, "body is not JSON"));
    };
    let n = counter.fetch_add(1, Ordering::Relaxed);
    let model_full = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("scripted")
        .to_owned();
    let (_, o) = opts(&model_full);
    if !o.ttfb.is_zero() {
        tokio::time::sleep(o.ttfb).await;
    }
    match o.fault.as_deref() {
        Some("500") => return Ok(error(500, "scripted internal error")),
        Some("429") => return Ok(error(429, "scripted rate limit")),
        Some("400") => return Ok(error(400, "scripted bad request")),
        Some("timeout") => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Some("garbage") => return Ok(respond(200, "application/json", "<html>not json</html>")),
        _ => {}
    }
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let answer = Answer::decide(&path, &body, &model_full, n);
    let Some(answer) = answer else {
        return Ok(error(
            404,
            &format!("scripted upstream does not serve {path}"),
        ));
    };
    if !stream {
        let text = answer.whole().to_string();
        if o.fault.as_deref() == Some("drop") {
            let (tx, rx) = mpsc::channel::<Chunk>(2);
            let half = Bytes::from(text[..text.len() / 2].to_owned());
            tokio::spawn(async move {
                let _ = tx.send(Ok(half)).await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                let _ = tx.send(Err(std::io::Error::other("scripted drop"))).await;
            });
            let mut r = Response::new(ProxyBody::Stream(rx));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                "application/json".parse().expect("ct"),
            );
            r.headers_mut()
                .insert(header::CONTENT_LENGTH, text.len().into());
            return Ok(r);
        }
        return Ok(respond(200, "application/json", text));
    }
    let events = answer.events(o.events);
    let (tx, rx) = mpsc::channel::<Chunk>(16);
    let fault = o.fault.clone();
    let delay = o.delay;
    tokio::spawn(async move {
        let total = events.len();
        for (i, ev) in events.into_iter().enumerate() {
            if fault.as_deref() == Some("drop") && i == total / 2 {
                let _ = tx.send(Err(std::io::Error::other("scripted drop"))).await;
                return;
            }
            if fault.as_deref() == Some("stream_error") && i == 2 {
                let err = json!({"error": {"message": "scripted stream error", "type": "server_error", "code": "500"}});
                let _ = tx.send(Ok(Bytes::from(format!("data: {err}\n\n")))).await;
                return;
            }
            if tx.send(Ok(Bytes::from(ev))).await.is_err() {
                return;
            }
            if !delay.is_zero() && i + 1 < total {
                tokio::time::sleep(delay).await;
            }
        }
    });
    let mut r = Response::new(ProxyBody::Stream(rx));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        "text/event-stream".parse().expect("ct"),
    );
    r.headers_mut()
        .insert(header::CACHE_CONTROL, "no-cache".parse().expect("cc"));
    Ok(r)
}

enum Kind {
    Chat,
    Responses,
    Completions,
}

/// What the scripted model says to one request.
struct Answer {
    kind: Kind,
    n: u64,
    model: String,
    text: String,
    tool: Option<(String, String)>,
    prompt_words: i64,
    logprobs: bool,
    token_ids: bool,
    include_usage: bool,
}

fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// Names of tools that run a shell command, in order of preference.
const SHELL_TOOLS: &[&str] = &[
    "bash",
    "shell",
    "exec_command",
    "exec",
    "run_shell_command",
    "shell_command",
    "run_command",
    "terminal",
];

fn is_command_field(name: &str) -> bool {
    name == "command" || name == "cmd" || name == "commands"
}

/// Arguments for a tool call, made from the tool's JSON schema: the command
/// field (if any) carries `command`, other required fields get a plain value
/// of their type (the first `enum` value when there is one).
fn arguments_for(params: Option<&Value>, command: &str) -> String {
    let mut args = serde_json::Map::new();
    let props = params
        .and_then(|p| p.get("properties"))
        .and_then(Value::as_object);
    let required: Vec<&str> = params
        .and_then(|p| p.get("required"))
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for (name, schema) in props.into_iter().flatten() {
        let is_cmd = is_command_field(name);
        if !is_cmd && !required.contains(&name.as_str()) {
            continue;
        }
        let ty = match schema.get("type") {
            Some(Value::Array(ts)) => ts.iter().find_map(Value::as_str).unwrap_or("string"),
            Some(t) => t.as_str().unwrap_or("string"),
            None => "string",
        };
        let v = if let Some(first) = schema.get("enum").and_then(|e| e.get(0)) {
            first.clone()
        } else {
            match ty {
                "integer" | "number" => json!(1),
                "boolean" => json!(false),
                "array" if is_cmd => json!(["bash", "-lc", command]),
                "array" => json!([]),
                "object" => json!({}),
                _ if is_cmd => json!(command),
                _ if name == "description" => json!("Run a command"),
                _ => json!("scripted"),
            }
        };
        args.insert(name.clone(), v);
    }
    Value::Object(args).to_string()
}

/// The tool the scripted model calls: a shell-like tool if offered, else the
/// first function tool. Returns its name and parameter schema.
fn pick_tool(tools: &[Value]) -> Option<(String, Option<&Value>)> {
    let functions: Vec<(&str, Option<&Value>)> = tools
        .iter()
        .filter_map(|t| {
            let ty = t.get("type").and_then(Value::as_str).unwrap_or("function");
            if ty != "function" && ty != "custom_function" {
                return None;
            }
            let f = t.get("function").unwrap_or(t);
            let name = f.get("name").and_then(Value::as_str)?;
            let params = f.get("parameters").or_else(|| f.get("input_schema"));
            Some((name, params))
        })
        .collect();
    let shell = SHELL_TOOLS
        .iter()
        .find_map(|want| functions.iter().find(|(n, _)| n == want));
    shell
        .or(functions.first())
        .map(|(n, p)| ((*n).to_owned(), *p))
}

/// The `[[run: CMD]]` commands of a scripted task, in order.
fn scripted_commands(texts: &[String]) -> Vec<String> {
    let mut out = vec![];
    for t in texts {
        let mut rest = t.as_str();
        while let Some(i) = rest.find("[[run:") {
            let after = &rest[i + 6..];
            let Some(end) = after.find("]]") else { break };
            out.push(after[..end].trim().to_owned());
            rest = &after[end + 2..];
        }
    }
    out
}

/// What a request's conversation holds, as far as the scripted model cares.
#[derive(Default)]
struct Conversation<'a> {
    user_texts: Vec<String>,
    tool_results: Vec<String>,
    last_is_tool_result: bool,
    tools: Option<&'a Vec<Value>>,
}

impl<'a> Conversation<'a> {
    fn of(kind: &Kind, body: &'a Value) -> Conversation<'a> {
        let mut c = Conversation {
            tools: body.get("tools").and_then(Value::as_array),
            ..Conversation::default()
        };
        match kind {
            Kind::Chat => {
                for m in body
                    .get("messages")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    match m["role"].as_str() {
                        Some("user") => c.user_texts.push(text_of(&m["content"])),
                        Some("tool") => c.tool_results.push(text_of(&m["content"])),
                        _ => {}
                    }
                    c.last_is_tool_result = m["role"] == "tool";
                }
            }
            Kind::Responses => match body.get("input") {
                Some(Value::String(s)) => c.user_texts.push(s.clone()),
                Some(Value::Array(items)) => {
                    for i in items {
                        if i.get("role").and_then(Value::as_str) == Some("user") {
                            c.user_texts.push(text_of(&i["content"]));
                        }
                        let is_out = i["type"] == "function_call_output";
                        if is_out {
                            c.tool_results.push(match &i["output"] {
                                Value::String(s) => s.clone(),
                                other => text_of(other),
                            });
                        }
                        c.last_is_tool_result = is_out;
                    }
                }
                _ => {}
            },
            Kind::Completions => {
                c.user_texts
                    .push(text_of(body.get("prompt").unwrap_or(&Value::Null)));
                c.tools = None;
            }
        }
        c
    }
}

impl Answer {
    fn decide(path: &str, body: &Value, model: &str, n: u64) -> Option<Answer> {
        let kind = match path.trim_end_matches('/') {
            p if p.ends_with("/chat/completions") => Kind::Chat,
            p if p.ends_with("/responses") => Kind::Responses,
            p if p.ends_with("/completions") => Kind::Completions,
            _ => return None,
        };
        let conv = Conversation::of(&kind, body);
        let last_user = conv.user_texts.last().cloned().unwrap_or_default();
        let script = scripted_commands(&conv.user_texts);
        let next_command = if script.is_empty() {
            (!conv.last_is_tool_result).then(|| "echo scripted".to_owned())
        } else {
            script.get(conv.tool_results.len()).cloned()
        };
        let tool = next_command.and_then(|cmd| {
            let (name, params) = pick_tool(conv.tools?)?;
            Some((name, arguments_for(params, &cmd)))
        });
        let text = if !script.is_empty() && !conv.tool_results.is_empty() {
            let last = conv.tool_results.last().map(String::as_str).unwrap_or("");
            let last: String = last.trim().chars().take(400).collect();
            format!("Done. The command printed: {last}")
        } else if conv.last_is_tool_result {
            format!("Done. Reply to: {last_user}")
        } else {
            format!("Reply to: {last_user}")
        };
        let prompt_words = body.to_string().split_whitespace().count() as i64;
        Some(Answer {
            kind,
            n,
            model: model.to_owned(),
            text,
            tool,
            prompt_words,
            logprobs: body
                .get("logprobs")
                .is_some_and(|v| v.as_bool() == Some(true) || v.is_number()),
            token_ids: body.get("return_token_ids").and_then(Value::as_bool) == Some(true),
            include_usage: body
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                == Some(true),
        })
    }

    fn pieces(&self, k: usize) -> Vec<String> {
        let chars: Vec<char> = self.text.chars().collect();
        let k = k.min(chars.len().max(1));
        let size = chars.len().div_ceil(k).max(1);
        chars.chunks(size).map(|c| c.iter().collect()).collect()
    }

    fn completion_tokens(&self) -> i64 {
        match &self.tool {
            Some((_, a)) => a.len() as i64,
            None => self.text.len() as i64,
        }
    }

    fn chat_usage(&self) -> Value {
        let c = self.completion_tokens();
        json!({"prompt_tokens": self.prompt_words, "completion_tokens": c, "total_tokens": self.prompt_words + c,
               "prompt_tokens_details": {"cached_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 0}})
    }

    fn logprob_entries(text: &str) -> Value {
        Value::Array(
            text.bytes()
                .enumerate()
                .map(|(i, b)| json!({"token": (b as char).to_string(), "logprob": -0.25 * ((i % 4) as f64), "bytes": [b], "top_logprobs": []}))
                .collect(),
        )
    }

    fn token_ids(text: &str) -> Value {
        Value::Array(text.bytes().map(|b| json!(b)).collect())
    }

    fn whole(&self) -> Value {
        let id = format!("scripted-{}", self.n);
        match self.kind {
            Kind::Chat => {
                let message = match &self.tool {
                    Some((name, args)) => {
                        json!({"role": "assistant", "content": null, "tool_calls": [
                        {"id": format!("call_{}", self.n), "type": "function", "function": {"name": name, "arguments": args}}]})
                    }
                    None => json!({"role": "assistant", "content": self.text}),
                };
                let mut choice = json!({"index": 0, "message": message, "finish_reason": if self.tool.is_some() {"tool_calls"} else {"stop"}, "logprobs": null});
                if self.logprobs && self.tool.is_none() {
                    choice["logprobs"] = json!({"content": Self::logprob_entries(&self.text)});
                }
                let mut v = json!({"id": format!("chatcmpl-{id}"), "object": "chat.completion", "created": 1_700_000_000, "model": self.model,
                    "choices": [choice], "usage": self.chat_usage()});
                if self.token_ids {
                    v["prompt_token_ids"] = json!([1, 2, 3]);
                    v["choices"][0]["token_ids"] = Self::token_ids(&self.text);
                }
                v
            }
            Kind::Completions => {
                json!({"id": format!("cmpl-{id}"), "object": "text_completion", "created": 1_700_000_000, "model": self.model,
                "choices": [{"index": 0, "text": self.text, "finish_reason": "stop", "logprobs": null}], "usage": self.chat_usage()})
            }
            Kind::Responses => self.response_object("completed"),
        }
    }

    fn response_object(&self, status: &str) -> Value {
        let output = match &self.tool {
            Some((name, args)) => {
                json!([{"type": "function_call", "id": format!("fc_{}", self.n), "call_id": format!("call_{}", self.n),
                "name": name, "arguments": args, "status": "completed"}])
            }
            None => {
                json!([{"type": "message", "id": format!("msg_{}", self.n), "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": self.text, "annotations": []}]}])
            }
        };
        let c = self.completion_tokens();
        json!({"id": format!("resp_{}", self.n), "object": "response", "created_at": 1_700_000_000, "status": status,
            "model": self.model, "output": if status == "completed" { output } else { json!([]) },
            "usage": if status == "completed" { json!({"input_tokens": self.prompt_words, "output_tokens": c, "total_tokens": self.prompt_words + c,
                "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}) } else { Value::Null }})
    }

    fn events(&self, k: usize) -> Vec<String> {
        match self.kind {
            Kind::Chat => self.chat_events(k),
            Kind::Completions => {
                let id = format!("cmpl-scripted-{}", self.n);
                let mut out: Vec<String> = self
                    .pieces(k)
                    .into_iter()
                    .map(|p| {
                        let c = json!({"id": id, "object": "text_completion", "created": 1_700_000_000, "model": self.model,
                            "choices": [{"index": 0, "text": p, "finish_reason": null, "logprobs": null}]});
                        format!("data: {c}\n\n")
                    })
                    .collect();
                let c = json!({"id": id, "object": "text_completion", "created": 1_700_000_000, "model": self.model,
                    "choices": [{"index": 0, "text": "", "finish_reason": "stop", "logprobs": null}], "usage": self.chat_usage()});
                out.push(format!("data: {c}\n\ndata: [DONE]\n\n"));
                out
            }
            Kind::Responses => self.responses_events(k),
        }
    }

    fn chat_events(&self, k: usize) -> Vec<String> {
        let id = format!("chatcmpl-scripted-{}", self.n);
        let chunk = |delta: Value, finish: Value, extra: Option<(&str, Value)>| {
            let mut c = json!({"id": id, "object": "chat.completion.chunk", "created": 1_700_000_000, "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]});
            if let Some((k, v)) = extra {
                c["choices"][0][k] = v;
            }
            format!("data: {c}\n\n")
        };
        let mut out = vec![];
        let first_extra = self.token_ids.then(|| json!([1, 2, 3]));
        let mut first = json!({"id": id, "object": "chat.completion.chunk", "created": 1_700_000_000, "model": self.model,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null, "logprobs": null}]});
        if let Some(p) = first_extra {
            first["prompt_token_ids"] = p;
        }
        out.push(format!("data: {first}\n\n"));
        match &self.tool {
            Some((name, args)) => {
                out.push(chunk(json!({"tool_calls": [{"index": 0, "id": format!("call_{}", self.n), "type": "function",
                    "function": {"name": name, "arguments": ""}}]}), Value::Null, None));
                let chars: Vec<char> = args.chars().collect();
                let size = chars.len().div_ceil(k.max(1)).max(1);
                for piece in chars.chunks(size) {
                    let s: String = piece.iter().collect();
                    out.push(chunk(
                        json!({"tool_calls": [{"index": 0, "function": {"arguments": s}}]}),
                        Value::Null,
                        None,
                    ));
                }
                out.push(chunk(json!({}), json!("tool_calls"), None));
            }
            None => {
                for p in self.pieces(k) {
                    let mut extra = None;
                    if self.logprobs {
                        extra = Some(("logprobs", json!({"content": Self::logprob_entries(&p)})));
                    }
                    let mut c = chunk(json!({"content": p}), Value::Null, extra);
                    if self.token_ids {
                        let mut v: Value =
                            serde_json::from_str(c.trim_start_matches("data: ").trim())
                                .expect("own json");
                        v["choices"][0]["token_ids"] = Self::token_ids(&p);
                        c = format!("data: {v}\n\n");
                    }
                    out.push(c);
                }
                out.push(chunk(json!({}), json!("stop"), None));
            }
        }
        if self.include_usage {
            let u = json!({"id": id, "object": "chat.completion.chunk", "created": 1_700_000_000, "model": self.model,
                "choices": [], "usage": self.chat_usage()});
            out.push(format!("data: {u}\n\n"));
        }
        out.push("data: [DONE]\n\n".into());
        out
    }

    fn responses_events(&self, k: usize) -> Vec<String> {
        let mut seq = 0u64;
        let mut ev = |kind: &str, mut data: Value| {
            data["type"] = json!(kind);
            data["sequence_number"] = json!(seq);
            seq += 1;
            format!("event: {kind}\ndata: {data}\n\n")
        };
        let mut out = vec![
            ev(
                "response.created",
                json!({"response": self.response_object("in_progress")}),
            ),
            ev(
                "response.in_progress",
                json!({"response": self.response_object("in_progress")}),
            ),
        ];
        let done = self.response_object("completed");
        let item = done["output"][0].clone();
        match &self.tool {
            Some((_, args)) => {
                let mut added = item.clone();
                added["arguments"] = json!("");
                added["status"] = json!("in_progress");
                out.push(ev(
                    "response.output_item.added",
                    json!({"output_index": 0, "item": added}),
                ));
                let chars: Vec<char> = args.chars().collect();
                let size = chars.len().div_ceil(k.max(1)).max(1);
                for piece in chars.chunks(size) {
                    let s: String = piece.iter().collect();
                    out.push(ev(
                        "response.function_call_arguments.delta",
                        json!({"output_index": 0, "item_id": item["id"], "delta": s}),
                    ));
                }
                out.push(ev(
                    "response.function_call_arguments.done",
                    json!({"output_index": 0, "item_id": item["id"], "arguments": args}),
                ));
            }
            None => {
                let mut added = item.clone();
                added["content"] = json!([]);
                added["status"] = json!("in_progress");
                out.push(ev(
                    "response.output_item.added",
                    json!({"output_index": 0, "item": added}),
                ));
                out.push(ev(
                    "response.content_part.added",
                    json!({"output_index": 0, "item_id": item["id"], "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": []}}),
                ));
                for p in self.pieces(k) {
                    out.push(ev("response.output_text.delta", json!({"output_index": 0, "item_id": item["id"], "content_index": 0, "delta": p})));
                }
                out.push(ev("response.output_text.done", json!({"output_index": 0, "item_id": item["id"], "content_index": 0, "text": self.text})));
                out.push(ev(
                    "response.content_part.done",
                    json!({"output_index": 0, "item_id": item["id"], "content_index": 0,
                    "part": {"type": "output_text", "text": self.text, "annotations": []}}),
                ));
            }
        }
        out.push(ev(
            "response.output_item.done",
            json!({"output_index": 0, "item": item}),
        ));
        out.push(ev("response.completed", json!({"response": done})));
        out
    }
}
