//! A scripted model server: a real HTTP server on loopback that answers
//! OpenAI Chat Completions, Responses and Completions calls and Anthropic
//! Messages calls (streaming or not) with deterministic text and tool calls.
//!
//! It stands in for a real model server, the one component we cannot run at
//! scale here, in tests and benchmarks. Nothing in it is
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
//! | `fault=500\|429\|400` | answer that status with an error body (OpenAI's format; Anthropic's on `/v1/messages`) |
//! | `fault=timeout` | never answer |
//! | `fault=drop` | send part of the body, then reset the connection |
//! | `fault=stream_error` | stream a delta, then an error event |
//! | `fault=garbage` | answer 200 with a body that is not JSON |
//! | `fault=malformed` | answer 200 with the API's shape broken: a stream whose events have the wrong types (a Responses `response` that is a string, a chat `choices` that is a number, bytes that are not JSON) and no terminal event; a whole body of the wrong shape |
//! | `fault=failed` | stream a delta, then Responses `response.failed` (chat: a chunk with an `error` object, then `[DONE]`) |
//!
//! The APIs it serves, each in its provider's own format:
//!
//! | path | API | `--apis` name |
//! |---|---|---|
//! | `POST /v1/chat/completions` | OpenAI Chat Completions | `chat` |
//! | `POST /v1/responses` | OpenAI Responses | `responses` |
//! | `POST /v1/completions` | OpenAI Completions | `completions` |
//! | `POST /v1/messages` (any query, e.g. `?beta=true`) | Anthropic Messages | `messages` |
//! | `POST /v1/messages/count_tokens` | Anthropic token count | `messages` |
//! | `GET /v1/models` | model list | always |
//!
//! `rollcall scripted-upstream --apis chat` serves only the APIs named (all by
//! default), to test translation against, say, a Chat-Completions-only
//! server; the others answer 404 with an OpenAI error body.
//!
//! The answer text is `Reply to: <last user text>`, so tests can tell calls
//! apart (on Messages, `role: "system"` messages, `<system-reminder>` text
//! blocks and the text blocks beside `tool_result` blocks are not user text). When the request offers tools and its last message is not a tool
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
//! vLLM-style `prompt_token_ids` and `token_ids`: byte values of the prompt
//! rendered by a toy chat template (`chat_prompt`; Chat Completions only) and
//! of the generated text (`generated_text`), so ids extend turn by turn.

use crate::http::{Chunk, ProxyBody};
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
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

/// The APIs a scripted upstream serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Apis {
    pub chat: bool,
    pub responses: bool,
    pub completions: bool,
    pub messages: bool,
}

impl Apis {
    /// Every API.
    pub const ALL: Apis = Apis {
        chat: true,
        responses: true,
        completions: true,
        messages: true,
    };

    fn serves(&self, kind: Kind) -> bool {
        match kind {
            Kind::Chat => self.chat,
            Kind::Responses => self.responses,
            Kind::Completions => self.completions,
            Kind::Messages | Kind::CountTokens => self.messages,
        }
    }

    fn names(&self) -> String {
        let mut out = vec![];
        for (on, name) in [
            (self.chat, "chat"),
            (self.responses, "responses"),
            (self.completions, "completions"),
            (self.messages, "messages"),
        ] {
            if on {
                out.push(name);
            }
        }
        out.join(",")
    }
}

impl Default for Apis {
    fn default() -> Self {
        Apis::ALL
    }
}

impl std::str::FromStr for Apis {
    type Err = String;

    /// A comma-separated list of `chat`, `responses`, `completions`,
    /// `messages`, or `all`.
    fn from_str(s: &str) -> Result<Apis, String> {
        let mut a = Apis {
            chat: false,
            responses: false,
            completions: false,
            messages: false,
        };
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "chat" => a.chat = true,
                "responses" => a.responses = true,
                "completions" => a.completions = true,
                "messages" => a.messages = true,
                "all" => a = Apis::ALL,
                other => {
                    return Err(format!(
                        "unknown API {other:?}; known: chat, responses, completions, messages, all"
                    ))
                }
            }
        }
        if a == (Apis {
            chat: false,
            responses: false,
            completions: false,
            messages: false,
        }) {
            return Err("no API named".into());
        }
        Ok(a)
    }
}

impl std::fmt::Display for Apis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.names())
    }
}

/// Bind and serve every API until the process ends. Prints nothing; returns
/// the address.
pub async fn bind(
    addr: SocketAddr,
) -> std::io::Result<(SocketAddr, impl std::future::Future<Output = ()>)> {
    bind_with(addr, Apis::ALL).await
}

/// Bind and serve only `apis` until the process ends. Prints nothing;
/// returns the address.
pub async fn bind_with(
    addr: SocketAddr,
    apis: Apis,
) -> std::io::Result<(SocketAddr, impl std::future::Future<Output = ()>)> {
    let counter = Arc::new(AtomicU64::new(0));
    crate::http::serve_plain(addr, move |req| {
        let counter = counter.clone();
        async move {
            match handle(req, counter, apis).await {
                Ok(r) => r,
                Err(never) => match never {},
            }
        }
    })
    .await
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

/// Anthropic's error type for an HTTP status.
fn anthropic_error_type(status: u16) -> &'static str {
    match status {
        429 => "rate_limit_error",
        401 => "authentication_error",
        404 => "not_found_error",
        s if s >= 500 => "api_error",
        _ => "invalid_request_error",
    }
}

/// An error in the format of the API that was called.
fn error_for(kind: Option<Kind>, status: u16, msg: &str) -> Response<ProxyBody> {
    match kind {
        Some(Kind::Messages | Kind::CountTokens) => {
            let body = json!({"type": "error", "error": {"type": anthropic_error_type(status), "message": msg}});
            respond(status, "application/json", body.to_string())
        }
        _ => error(status, msg),
    }
}

/// The API a request path calls.
fn kind_of(path: &str) -> Option<Kind> {
    Some(match path.trim_end_matches('/') {
        p if p.ends_with("/chat/completions") => Kind::Chat,
        p if p.ends_with("/responses") => Kind::Responses,
        p if p.ends_with("/completions") => Kind::Completions,
        p if p.ends_with("/messages/count_tokens") => Kind::CountTokens,
        p if p.ends_with("/messages") => Kind::Messages,
        _ => return None,
    })
}

async fn handle(
    req: Request<Incoming>,
    counter: Arc<AtomicU64>,
    apis: Apis,
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
    let kind = kind_of(&path);
    if let Some(k) = kind {
        if !apis.serves(k) {
            return Ok(error(
                404,
                &format!("scripted upstream does not serve {path} (--apis {apis})"),
            ));
        }
    }
    let Ok(body) = req.into_body().collect().await else {
        return Ok(error_for(kind, 400, "could not read body"));
    };
    let Ok(body) = serde_json::from_slice::<Value>(&body.to_bytes()) else {
        return Ok(error_for(kind, 400, "body is not JSON"));
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
        Some("500") => return Ok(error_for(kind, 500, "scripted internal error")),
        Some("429") => return Ok(error_for(kind, 429, "scripted rate limit")),
        Some("400") => return Ok(error_for(kind, 400, "scripted bad request")),
        Some("timeout") => {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Some("garbage") => return Ok(respond(200, "application/json", "<html>not json</html>")),
        _ => {}
    }
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    if o.fault.as_deref() == Some("malformed") {
        return Ok(malformed(kind, stream));
    }
    let Some(kind) = kind else {
        return Ok(error(
            404,
            &format!("scripted upstream does not serve {path}"),
        ));
    };
    if kind == Kind::CountTokens {
        let n = body.to_string().split_whitespace().count();
        return Ok(respond(
            200,
            "application/json",
            json!({"input_tokens": n}).to_string(),
        ));
    }
    let answer = Answer::decide(kind, &body, &model_full, n);
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
            if fault.as_deref() == Some("failed") && i == 2 {
                let event = match kind {
                    Kind::Responses => {
                        let r = json!({"type": "response.failed", "response": {"id": "resp_failed", "object": "response", "status": "failed",
                            "error": {"code": "server_error", "message": "scripted failure"}, "output": []}});
                        format!("event: response.failed\ndata: {r}\n\n")
                    }
                    _ => {
                        let err = json!({"error": {"message": "scripted failure", "type": "server_error", "code": "500"}});
                        format!("data: {err}\n\ndata: [DONE]\n\n")
                    }
                };
                let _ = tx.send(Ok(Bytes::from(event))).await;
                return;
            }
            if fault.as_deref() == Some("stream_error") && i == 2 {
                let event = if kind == Kind::Messages {
                    let err = json!({"type": "error", "error": {"type": "api_error", "message": "scripted stream error"}});
                    format!("event: error\ndata: {err}\n\n")
                } else {
                    let err = json!({"error": {"message": "scripted stream error", "type": "server_error", "code": "500"}});
                    format!("data: {err}\n\n")
                };
                let _ = tx.send(Ok(Bytes::from(event))).await;
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

/// `fault=malformed`: the API's shape broken in the ways real servers
/// have broken it, with no terminal event.
fn malformed(kind: Option<Kind>, stream: bool) -> Response<ProxyBody> {
    if !stream {
        return respond(
            200,
            "application/json",
            json!({"choices": 7, "output": "none", "content": {"x": null}}).to_string(),
        );
    }
    let events = match kind {
        Some(Kind::Responses) => concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"response\":\"not an object\"}\n\n",
            "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"output_index\":\"zero\",\"delta\":5}\n\n",
            "data: {not json\n\n",
        ),
        Some(Kind::Messages) => concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":5}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":\"a\",\"delta\":[]}\n\n",
            "data: \u{1}\u{2}\n\n",
        ),
        _ => concat!(
            "data: {\"id\":7,\"choices\":5}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":\"x\",\"function\":{\"name\":3}}]}}]}\n\n",
            "data: {not json\n\n",
        ),
    };
    respond(200, "text/event-stream", events)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Responses,
    Completions,
    /// Anthropic Messages.
    Messages,
    /// Anthropic's `/v1/messages/count_tokens`.
    CountTokens,
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
    /// Chat: the prompt rendered by [`chat_prompt`], whose bytes are the
    /// prompt token ids.
    prompt: String,
    include_usage: bool,
}

/// What an assistant message "generated": its content text, then each tool
/// call as `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, with the
/// arguments string verbatim. Its bytes are the completion token ids.
fn generated_text(content: &str, calls: &[(&str, &str)]) -> String {
    let mut s = content.to_owned();
    for (name, args) in calls {
        s.push_str(&format!(
            "<tool_call>{{\"name\": {}, \"arguments\": {}}}</tool_call>",
            Value::from(*name),
            args
        ));
    }
    s
}

/// A toy chat template for Chat Completions requests: `<|role|>text<|end|>`
/// per message, an assistant message as `<|assistant|>` plus its generated
/// text (no end marker, exactly what it completed), then `<|assistant|>`.
/// So the next turn's prompt starts with this prompt plus the completion,
/// as with a real model server, and token ids (bytes) extend turn by turn.
fn chat_prompt(body: &Value) -> String {
    let mut out = String::new();
    for m in body["messages"].as_array().into_iter().flatten() {
        let role = m["role"].as_str().unwrap_or("user");
        out.push_str(&format!("<|{role}|>"));
        let text = text_of(&m["content"]);
        if role == "assistant" {
            let calls: Vec<(&str, &str)> = m["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    (
                        c["function"]["name"].as_str().unwrap_or(""),
                        c["function"]["arguments"].as_str().unwrap_or(""),
                    )
                })
                .collect();
            out.push_str(&generated_text(&text, &calls));
        } else {
            out.push_str(&text);
            out.push_str("<|end|>");
        }
    }
    out.push_str("<|assistant|>");
    out
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

/// The tool the scripted model calls: a shell-like tool if offered (names
/// compared without case, so Claude Code's `Bash` counts), else the first
/// function tool. Returns its name and parameter schema.
fn pick_tool(tools: &[Value]) -> Option<(String, Option<&Value>)> {
    let functions: Vec<(&str, Option<&Value>)> = tools
        .iter()
        .filter_map(|t| {
            let ty = t.get("type").and_then(Value::as_str).unwrap_or("function");
            // Anthropic client tools have no type, or `custom` with an
            // `input_schema`; its server tools (`web_search_...`) are skipped.
            let anthropic_custom = ty == "custom" && t.get("input_schema").is_some();
            if ty != "function" && ty != "custom_function" && !anthropic_custom {
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
        .find_map(|want| functions.iter().find(|(n, _)| n.eq_ignore_ascii_case(want)));
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
            Kind::Completions | Kind::CountTokens => {
                c.user_texts
                    .push(text_of(body.get("prompt").unwrap_or(&Value::Null)));
                c.tools = None;
            }
            Kind::Messages => {
                // `system` (top level, or `role: "system"` messages as
                // Claude Code sends them) is not user text.
                for m in body
                    .get("messages")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    match m["role"].as_str() {
                        Some("user") => {
                            let blocks = match &m["content"] {
                                Value::Array(b) => b.as_slice(),
                                content => {
                                    c.user_texts.push(text_of(content));
                                    c.last_is_tool_result = false;
                                    continue;
                                }
                            };
                            let mut results = 0;
                            for b in blocks.iter().filter(|b| b["type"] == "tool_result") {
                                c.tool_results.push(text_of(&b["content"]));
                                results += 1;
                            }
                            // Text beside tool results, and Claude Code's
                            // `<system-reminder>` blocks, are the harness's
                            // reminders, not the user's ask.
                            if results == 0 {
                                let text: Vec<&str> = blocks
                                    .iter()
                                    .filter(|b| b["type"] == "text")
                                    .filter_map(|b| b["text"].as_str())
                                    .filter(|t| !t.trim_start().starts_with("<system-reminder>"))
                                    .collect();
                                c.user_texts.push(text.join(""));
                            }
                            c.last_is_tool_result = results > 0;
                        }
                        Some("system") => {}
                        _ => c.last_is_tool_result = false,
                    }
                }
            }
        }
        c
    }
}

impl Answer {
    fn decide(kind: Kind, body: &Value, model: &str, n: u64) -> Answer {
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
        Answer {
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
            prompt: if kind == Kind::Chat {
                chat_prompt(body)
            } else {
                String::new()
            },
            include_usage: body
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                == Some(true),
        }
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

    /// The text this answer generated (see [`generated_text`]).
    fn generated(&self) -> String {
        match &self.tool {
            Some((name, args)) => generated_text("", &[(name.as_str(), args.as_str())]),
            None => self.text.clone(),
        }
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
                if self.logprobs {
                    choice["logprobs"] =
                        json!({"content": Self::logprob_entries(&self.generated())});
                }
                let mut v = json!({"id": format!("chatcmpl-{id}"), "object": "chat.completion", "created": 1_700_000_000, "model": self.model,
                    "choices": [choice], "usage": self.chat_usage()});
                if self.token_ids {
                    v["prompt_token_ids"] = Self::token_ids(&self.prompt);
                    v["choices"][0]["token_ids"] = Self::token_ids(&self.generated());
                }
                v
            }
            Kind::Completions | Kind::CountTokens => {
                json!({"id": format!("cmpl-{id}"), "object": "text_completion", "created": 1_700_000_000, "model": self.model,
                "choices": [{"index": 0, "text": self.text, "finish_reason": "stop", "logprobs": null}], "usage": self.chat_usage()})
            }
            Kind::Responses => self.response_object("completed"),
            Kind::Messages => {
                let mut m = self.message_object();
                m["content"] = json!([self.message_block()]);
                m["stop_reason"] = json!(self.stop_reason());
                m["usage"]["output_tokens"] = json!(self.completion_tokens());
                m
            }
        }
    }

    /// An Anthropic message with no content yet, as in `message_start`.
    fn message_object(&self) -> Value {
        json!({"id": format!("msg_scripted_{}", self.n), "type": "message", "role": "assistant", "model": self.model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.prompt_words, "output_tokens": 0,
                "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}})
    }

    /// The one content block of an Anthropic answer, complete.
    fn message_block(&self) -> Value {
        match &self.tool {
            Some((name, args)) => {
                json!({"type": "tool_use", "id": format!("toolu_scripted_{}", self.n), "name": name,
                    "input": serde_json::from_str::<Value>(args).unwrap_or_else(|_| json!({}))})
            }
            None => json!({"type": "text", "text": self.text}),
        }
    }

    fn stop_reason(&self) -> &'static str {
        if self.tool.is_some() {
            "tool_use"
        } else {
            "end_turn"
        }
    }

    fn messages_events(&self, k: usize) -> Vec<String> {
        let ev = |kind: &str, mut data: Value| {
            data["type"] = json!(kind);
            format!("event: {kind}\ndata: {data}\n\n")
        };
        let mut out = vec![ev(
            "message_start",
            json!({"message": self.message_object()}),
        )];
        let mut start = self.message_block();
        let pieces = match &self.tool {
            Some((_, args)) => {
                start["input"] = json!({});
                let chars: Vec<char> = args.chars().collect();
                let size = chars.len().div_ceil(k.max(1)).max(1);
                chars
                    .chunks(size)
                    .map(|c| json!({"type": "input_json_delta", "partial_json": c.iter().collect::<String>()}))
                    .collect::<Vec<_>>()
            }
            None => {
                start["text"] = json!("");
                self.pieces(k)
                    .into_iter()
                    .map(|p| json!({"type": "text_delta", "text": p}))
                    .collect()
            }
        };
        out.push(ev(
            "content_block_start",
            json!({"index": 0, "content_block": start}),
        ));
        for delta in pieces {
            out.push(ev(
                "content_block_delta",
                json!({"index": 0, "delta": delta}),
            ));
        }
        out.push(ev("content_block_stop", json!({"index": 0})));
        out.push(ev(
            "message_delta",
            json!({"delta": {"stop_reason": self.stop_reason(), "stop_sequence": null},
                "usage": {"output_tokens": self.completion_tokens()}}),
        ));
        out.push(ev("message_stop", json!({})));
        out
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
            Kind::Messages => self.messages_events(k),
            Kind::CountTokens => vec![],
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
        let first_extra = self.token_ids.then(|| Self::token_ids(&self.prompt));
        let mut first = json!({"id": id, "object": "chat.completion.chunk", "created": 1_700_000_000, "model": self.model,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null, "logprobs": null}]});
        if let Some(p) = first_extra {
            first["prompt_token_ids"] = p;
        }
        out.push(format!("data: {first}\n\n"));
        match &self.tool {
            Some((name, args)) => {
                let gen = self.generated();
                let mut head = chunk(
                    json!({"tool_calls": [{"index": 0, "id": format!("call_{}", self.n), "type": "function",
                    "function": {"name": name, "arguments": ""}}]}),
                    Value::Null,
                    self.logprobs
                        .then(|| ("logprobs", json!({"content": Self::logprob_entries(&gen)}))),
                );
                if self.token_ids {
                    let mut v: Value =
                        serde_json::from_str(head.trim_start_matches("data: ").trim())
                            .expect("own json");
                    v["choices"][0]["token_ids"] = Self::token_ids(&gen);
                    head = format!("data: {v}\n\n");
                }
                out.push(head);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn bash_tools() -> Value {
        json!([
            {"name": "Read", "description": "read a file", "input_schema": {"type": "object",
                "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}},
            {"name": "Bash", "description": "run a command", "input_schema": {"type": "object",
                "properties": {"command": {"type": "string"}, "description": {"type": "string"},
                    "timeout": {"type": "number"}}, "required": ["command"]}},
            {"type": "web_search_20250305", "name": "web_search"}
        ])
    }

    /// (event name, data) of each SSE event.
    fn parse_events(events: &[String]) -> Vec<(String, Value)> {
        events
            .iter()
            .map(|e| {
                let mut lines = e.lines();
                let name = lines.next().unwrap().strip_prefix("event: ").unwrap();
                let data = lines.next().unwrap().strip_prefix("data: ").unwrap();
                (name.to_owned(), serde_json::from_str(data).unwrap())
            })
            .collect()
    }

    #[test]
    fn messages_tool_use_streams_in_order() {
        let body = json!({
            "model": "claude-x@events=3",
            "system": [{"type": "text", "text": "You are Claude Code."}],
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "<system-reminder>\nbe nice\n</system-reminder>"},
                    {"type": "text", "text": "Run [[run: echo rollcall-$((6*7))]] please"}]},
                {"role": "system", "content": "# Environment"}
            ],
            "tools": bash_tools(),
            "stream": true,
        });
        let (_, o) = opts("claude-x@events=3");
        let a = Answer::decide(Kind::Messages, &body, "claude-x@events=3", 7);
        let (name, args) = a.tool.clone().expect("a tool call");
        assert_eq!(name, "Bash");
        let args: Value = serde_json::from_str(&args).unwrap();
        assert_eq!(args, json!({"command": "echo rollcall-$((6*7))"}));

        let events = parse_events(&a.events(o.events));
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        for (n, d) in &events {
            assert_eq!(d["type"], json!(n), "every data line names its type");
        }
        let start = &events[0].1["message"];
        assert_eq!(start["content"], json!([]));
        assert_eq!(start["role"], "assistant");
        assert!(start["id"].as_str().unwrap().starts_with("msg_"));
        assert!(start["usage"]["input_tokens"].as_i64().unwrap() > 0);
        let block = &events[1].1["content_block"];
        assert_eq!(block["type"], "tool_use");
        assert_eq!(block["name"], "Bash");
        assert_eq!(block["input"], json!({}));
        assert!(block["id"].as_str().unwrap().starts_with("toolu_"));
        let json_text: String = events[2..5]
            .iter()
            .map(|(_, d)| {
                assert_eq!(d["delta"]["type"], "input_json_delta");
                d["delta"]["partial_json"].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(serde_json::from_str::<Value>(&json_text).unwrap(), args);
        let delta = &events[6].1;
        assert_eq!(
            delta["delta"],
            json!({"stop_reason": "tool_use", "stop_sequence": null})
        );
        assert!(delta["usage"]["output_tokens"].as_i64().unwrap() > 0);

        // The same answer, not streamed.
        let whole = a.whole();
        assert_eq!(whole["type"], "message");
        assert_eq!(whole["stop_reason"], "tool_use");
        assert_eq!(whole["stop_sequence"], Value::Null);
        assert_eq!(whole["content"][0]["type"], "tool_use");
        assert_eq!(whole["content"][0]["input"], args);
        assert_eq!(whole["usage"]["cache_read_input_tokens"], 0);
        assert_eq!(whole["usage"]["cache_creation_input_tokens"], 0);
    }

    #[test]
    fn messages_tool_result_gets_the_final_text() {
        let body = json!({
            "model": "m",
            "system": "sys",
            "messages": [
                {"role": "user", "content": "Run [[run: echo rollcall-$((6*7))]]"},
                {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash",
                    "input": {"command": "echo rollcall-$((6*7))"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": false,
                        "content": [{"type": "text", "text": "rollcall-42\n"}], "cache_control": {"type": "ephemeral"}},
                    {"type": "text", "text": "<system-reminder>x</system-reminder>"}]}
            ],
            "tools": bash_tools(),
        });
        let a = Answer::decide(Kind::Messages, &body, "m", 1);
        assert!(a.tool.is_none());
        let whole = a.whole();
        assert_eq!(whole["stop_reason"], "end_turn");
        assert_eq!(
            whole["content"],
            json!([{"type": "text", "text": "Done. The command printed: rollcall-42"}])
        );
        let events = parse_events(&a.events(2));
        assert_eq!(
            events[1].1["content_block"],
            json!({"type": "text", "text": ""})
        );
        let text: String = events
            .iter()
            .filter(|(n, _)| n == "content_block_delta")
            .map(|(_, d)| {
                assert_eq!(d["delta"]["type"], "text_delta");
                d["delta"]["text"].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(text, "Done. The command printed: rollcall-42");
        assert_eq!(events.last().unwrap().0, "message_stop");
    }

    #[test]
    fn messages_default_answer_reads_the_user_text() {
        let body = json!({"model": "m", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>r</system-reminder>"},
                {"type": "text", "text": "hi there"}]},
            {"role": "system", "content": "env"}]});
        let a = Answer::decide(Kind::Messages, &body, "m", 0);
        assert_eq!(a.text, "Reply to: hi there");
        // With tools, the default is one shell call, then a text answer.
        let mut body = body;
        body["tools"] = bash_tools();
        let a = Answer::decide(Kind::Messages, &body, "m", 0);
        assert_eq!(a.tool.unwrap().0, "Bash");
        body["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t", "content": "scripted", "is_error": true}]}));
        let a = Answer::decide(Kind::Messages, &body, "m", 0);
        assert!(a.tool.is_none());
        assert_eq!(a.text, "Done. Reply to: hi there");
    }

    #[test]
    fn apis_parse_and_route() {
        let a: Apis = "chat".parse().unwrap();
        assert!(a.serves(Kind::Chat) && !a.serves(Kind::Responses) && !a.serves(Kind::Messages));
        assert_eq!(a.to_string(), "chat");
        let a: Apis = "chat, messages".parse().unwrap();
        assert!(a.serves(Kind::CountTokens) && !a.serves(Kind::Completions));
        assert_eq!("all".parse::<Apis>().unwrap(), Apis::ALL);
        assert!("chat,nope".parse::<Apis>().is_err());
        assert!("".parse::<Apis>().is_err());
        assert_eq!(kind_of("/v1/messages"), Some(Kind::Messages));
        assert_eq!(kind_of("/rollouts/r/v1/messages/"), Some(Kind::Messages));
        assert_eq!(
            kind_of("/v1/messages/count_tokens"),
            Some(Kind::CountTokens)
        );
        assert_eq!(kind_of("/v1/chat/completions"), Some(Kind::Chat));
        assert_eq!(kind_of("/v1/completions"), Some(Kind::Completions));
        assert_eq!(kind_of("/v1/embeddings"), None);
    }

    #[test]
    fn pick_tool_prefers_a_shell_without_case() {
        let tools = bash_tools();
        let (name, params) = pick_tool(tools.as_array().unwrap()).unwrap();
        assert_eq!(name, "Bash");
        // Only the required fields and the command are filled.
        assert_eq!(arguments_for(params, "ls"), r#"{"command":"ls"}"#);
    }

    async fn serve(apis: Apis) -> String {
        let (addr, fut) = bind_with("127.0.0.1:0".parse().unwrap(), apis)
            .await
            .unwrap();
        tokio::spawn(fut);
        format!("http://{addr}")
    }

    #[tokio::test]
    async fn messages_over_http_with_errors_and_apis() {
        let base = serve(Apis::ALL).await;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::new();
        let body = json!({"model": "m", "max_tokens": 10,
            "messages": [{"role": "user", "content": "hello"}]});
        let r = client
            .post(format!("{base}/v1/messages?beta=true"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["content"][0]["text"], "Reply to: hello");
        assert_eq!(v["usage"]["output_tokens"], json!("Reply to: hello".len()));

        let mut stream = body.clone();
        stream["stream"] = json!(true);
        let r = client
            .post(format!("{base}/v1/messages"))
            .json(&stream)
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.headers()[reqwest::header::CONTENT_TYPE],
            "text/event-stream"
        );
        let text = r.text().await.unwrap();
        assert!(text.starts_with("event: message_start\ndata: {"));
        assert!(text.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));

        let mut faulty = body.clone();
        faulty["model"] = json!("m@fault=429");
        let r = client
            .post(format!("{base}/v1/messages"))
            .json(&faulty)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 429);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "rate_limit_error");

        faulty["model"] = json!("m@fault=stream_error");
        faulty["stream"] = json!(true);
        let text = client
            .post(format!("{base}/v1/messages"))
            .json(&faulty)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        // Compare the error event as JSON: serde_json keeps insertion order
        // (`preserve_order`), so its key order is not the test's business.
        let last = text
            .trim_end()
            .rsplit("\n\n")
            .next()
            .unwrap_or_default()
            .to_owned();
        let data = last
            .strip_prefix("event: error\ndata: ")
            .unwrap_or_default();
        assert_eq!(
            serde_json::from_str::<Value>(data).ok(),
            Some(
                json!({"type": "error", "error": {"type": "api_error", "message": "scripted stream error"}})
            ),
            "{text}"
        );

        let r = client
            .post(format!("{base}/v1/messages/count_tokens"))
            .json(&body)
            .send()
            .await
            .unwrap();
        let v: Value = r.json().await.unwrap();
        assert!(v["input_tokens"].as_i64().unwrap() > 0);

        // A chat-only upstream refuses the others with an OpenAI error.
        let chat_only = serve("chat".parse().unwrap()).await;
        let r = client
            .post(format!("{chat_only}/v1/messages?beta=true"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
        let v: Value = r.json().await.unwrap();
        assert_eq!(
            v["error"]["message"],
            "scripted upstream does not serve /v1/messages (--apis chat)"
        );
        let r = client
            .post(format!("{chat_only}/v1/chat/completions"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
}
