//! Wire APIs: which one a call speaks, how its streams are parsed and
//! assembled back into one response, how requests are normalized to chat
//! messages, and how errors are written in each API's own format.

pub mod chat;
pub mod completions;
pub mod messages;
pub mod responses;
pub mod sse;
pub mod terminal;
pub mod tokens;
pub mod translate;

use serde_json::{json, Value};

/// The wire API a harness spoke for one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireApi {
    ChatCompletions,
    Responses,
    Completions,
    /// Anthropic Messages (`/v1/messages`), what Claude Code speaks.
    Messages,
}

impl WireApi {
    /// The API for a path below the version prefix (`/chat/completions`, …).
    pub fn from_endpoint(endpoint: &str) -> Option<Self> {
        match endpoint {
            "/chat/completions" => Some(Self::ChatCompletions),
            "/responses" => Some(Self::Responses),
            "/completions" => Some(Self::Completions),
            "/messages" => Some(Self::Messages),
            _ => None,
        }
    }

    pub fn endpoint(self) -> &'static str {
        match self {
            Self::ChatCompletions => "/chat/completions",
            Self::Responses => "/responses",
            Self::Completions => "/completions",
            Self::Messages => "/messages",
        }
    }

    /// The name stored in the `wire_api` column.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ChatCompletions => "chat_completions",
            Self::Responses => "responses",
            Self::Completions => "completions",
            Self::Messages => "messages",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        [
            Self::ChatCompletions,
            Self::Responses,
            Self::Completions,
            Self::Messages,
        ]
        .into_iter()
        .find(|w| w.as_str() == name)
    }

    /// Assemble a response body (a whole SSE stream when `stream`) into
    /// one response object plus the fields a trainer reads.
    pub fn assemble(self, body: &[u8], stream: bool) -> Assembled {
        let value = if stream {
            let events = sse::parse_all(body);
            match self {
                Self::ChatCompletions => chat::assemble_stream(&events),
                Self::Responses => responses::assemble_stream(&events),
                Self::Completions => completions::assemble_stream(&events),
                Self::Messages => messages::assemble_stream(&events),
            }
        } else {
            match serde_json::from_slice::<Value>(body) {
                Ok(v) => StreamOutcome {
                    response: Some(v),
                    error: None,
                },
                Err(_) => StreamOutcome::default(),
            }
        };
        let mut out = Assembled {
            error: value.error,
            ..Assembled::default()
        };
        if let Some(resp) = value.response {
            match self {
                Self::ChatCompletions => chat::extract(&resp, &mut out),
                Self::Responses => responses::extract(&resp, &mut out),
                Self::Completions => completions::extract(&resp, &mut out),
                Self::Messages => messages::extract(&resp, &mut out),
            }
            out.response = Some(resp);
        }
        out
    }

    /// Normalize a request body to chat-format messages and tool definitions.
    pub fn normalize_request(self, mut request: Value) -> Normalized {
        let mut take = |k: &str| request.get_mut(k).map(Value::take);
        match self {
            Self::ChatCompletions => Normalized {
                messages: take("messages").unwrap_or(json!([])),
                tools: take("tools"),
            },
            Self::Responses => responses::normalize_request(&request),
            Self::Messages => messages::normalize_request(&request),
            Self::Completions => Normalized {
                messages: json!([{"role": "user", "content": take("prompt").unwrap_or(Value::Null)}]),
                tools: None,
            },
        }
    }

    /// Whether `v` is an error body in this API's format.
    pub fn is_error_body(self, v: &Value) -> bool {
        match self {
            Self::Messages => v.get("type").and_then(Value::as_str) == Some("error"),
            _ => v.get("error").is_some(),
        }
    }

    /// An error body in this API's format.
    pub fn error_body(self, err: &ApiError) -> Vec<u8> {
        if self == Self::Messages {
            return serde_json::to_vec(&anthropic_error(err)).unwrap_or_default();
        }
        serde_json::to_vec(&json!({
            "error": {
                "message": err.message,
                "type": err.kind,
                "param": Value::Null,
                "code": err.code,
            }
        }))
        .unwrap_or_default()
    }

    /// An error as one event of this API's stream, for a stream that breaks
    /// after its headers were sent.
    pub fn error_event(self, err: &ApiError) -> Vec<u8> {
        let inner = json!({"message": err.message, "type": err.kind, "code": err.code, "param": Value::Null});
        match self {
            Self::Responses => {
                let data = json!({
                    "type": "error",
                    "code": err.code,
                    "message": err.message,
                    "param": Value::Null,
                    "error": inner,
                });
                format!("event: error\ndata: {data}\n\n").into_bytes()
            }
            Self::ChatCompletions | Self::Completions => {
                format!("data: {}\n\n", json!({ "error": inner })).into_bytes()
            }
            Self::Messages => {
                format!("event: error\ndata: {}\n\n", anthropic_error(err)).into_bytes()
            }
        }
    }
}

/// An error in Anthropic's format: `{"type":"error","error":{"type","message"}}`.
fn anthropic_error(err: &ApiError) -> Value {
    let kind = match (err.kind, err.status) {
        (_, 401) => "authentication_error",
        (_, 403) => "permission_error",
        (_, 404) => "not_found_error",
        (_, 413) => "request_too_large",
        (_, 429) => "rate_limit_error",
        (_, 529) => "overloaded_error",
        ("invalid_request_error", _) => "invalid_request_error",
        (_, s) if s < 500 => "invalid_request_error",
        _ => "api_error",
    };
    json!({"type": "error", "error": {"type": kind, "message": err.message}})
}

/// An error the proxy itself answers with.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: u16,
    /// OpenAI's error `type`: `invalid_request_error`, `authentication_error`,
    /// `not_found_error`, `server_error`, …
    pub kind: &'static str,
    /// A stable machine-readable code, e.g. `body_too_large`.
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(
        status: u16,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind,
            code,
            message: message.into(),
        }
    }
}

/// What a stream parser recovered: the response object, and an error event if
/// the stream carried one.
#[derive(Debug, Default)]
pub struct StreamOutcome {
    pub response: Option<Value>,
    pub error: Option<String>,
}

/// A request normalized to chat format.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalized {
    pub messages: Value,
    pub tools: Option<Value>,
}

/// Token usage as reported by the upstream.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Usage {
    pub prompt: Option<i64>,
    pub completion: Option<i64>,
    pub total: Option<i64>,
    pub cached: Option<i64>,
    pub reasoning: Option<i64>,
}

/// Token ids and logprobs, when the upstream returned them.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Tokens {
    pub prompt_ids: Option<Vec<i32>>,
    pub completion_ids: Option<Vec<i32>>,
    pub prompt_logprobs: Option<Vec<f64>>,
    pub completion_logprobs: Option<Vec<f64>>,
}

impl Tokens {
    /// The `token_capture` column: what the row holds.
    pub fn capture(&self) -> &'static str {
        let ids = self.completion_ids.is_some() || self.prompt_ids.is_some();
        match (ids, self.completion_logprobs.is_some()) {
            (true, true) => "ids_and_logprobs",
            (true, false) => "ids",
            (false, true) => "logprobs",
            (false, false) => "none",
        }
    }
}

/// A response assembled into one object, with the fields a trainer reads.
#[derive(Debug, Default)]
pub struct Assembled {
    pub response: Option<Value>,
    /// The assistant's answer as a chat message (content, reasoning_content, tool_calls).
    pub message: Option<Value>,
    pub tool_calls: Option<Value>,
    pub finish_reason: Option<String>,
    pub usage: Usage,
    pub tokens: Tokens,
    /// An error event found inside a stream.
    pub error: Option<String>,
}

/// Read an integer field path such as `["usage", "prompt_tokens"]`.
pub(crate) fn int_at(v: &Value, path: &[&str]) -> Option<i64> {
    path.iter().try_fold(v, |v, k| v.get(k))?.as_i64()
}

/// Read an array of integers as token ids; `None` if any is not an `i32`.
pub(crate) fn ids(v: Option<&Value>) -> Option<Vec<i32>> {
    let arr = v?.as_array()?;
    arr.iter()
        .map(|x| x.as_i64().and_then(|i| i32::try_from(i).ok()))
        .collect()
}

/// Add a streamed tool call's name piece to the name so far. llama.cpp's
/// server repeats the whole name (and id) in every delta of a call; a piece
/// equal to the whole non-empty name so far is such a repeat, not a
/// continuation. (A name split into two equal halves, `ab` + `ab`, reads as
/// `ab`: no server is known to split names so.)
pub(crate) fn push_name(acc: &mut Option<String>, piece: &str) {
    match acc {
        Some(name) if !name.is_empty() && name == piece => {}
        _ => acc.get_or_insert_with(String::new).push_str(piece),
    }
}

/// Append JSON string `piece` to an optional accumulated string.
pub(crate) fn push_str(acc: &mut Option<String>, piece: Option<&Value>) {
    if let Some(s) = piece.and_then(Value::as_str) {
        acc.get_or_insert_with(String::new).push_str(s);
    }
}
