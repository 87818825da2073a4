//! Wire APIs: which one a call speaks, how its streams are parsed and
//! assembled back into one response, how requests are normalized to chat
//! messages, and how errors are written in each API's own format.

mod canonical;
pub mod capture;
pub mod chat;
pub mod completions;
pub mod head;
pub mod messages;
pub mod responses;
pub mod side_call;
pub mod sse;
pub mod terminal;
pub mod tokens;
pub mod translate;

#[cfg(test)]
mod fuzz_tests;
#[cfg(test)]
mod tests;

use serde_json::{json, Value};

/// The wire API a harness spoke for one call; written as its `as_str`
/// name (`chat_completions`, `responses`, `completions`, `messages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireApi {
    #[serde(alias = "chat")]
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
        if !stream && self == Self::ChatCompletions {
            if let Some(a) = chat::assemble_whole(body) {
                return a;
            }
        }
        self.assemble_tree(body, stream)
    }

    /// [`WireApi::assemble`] by way of a `Value` tree of the whole body.
    fn assemble_tree(self, body: &[u8], stream: bool) -> Assembled {
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
                    failure: self.body_failure(&v),
                    response: Some(v),
                    error: None,
                },
                Err(_) => StreamOutcome::default(),
            }
        };
        let mut out = Assembled {
            error: value.error,
            failure: value.failure,
            ..Assembled::default()
        };
        if let Some(resp) = value.response {
            out.answer = self.is_answer(&resp);
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

    /// The failure a whole (HTTP 200) body reports: an error object, or a
    /// Responses `status` of `failed` / `incomplete`.
    fn body_failure(self, v: &Value) -> Option<StreamFailure> {
        let error = match self {
            Self::Messages => (v.get("type").and_then(Value::as_str) == Some("error"))
                .then(|| v.get("error").unwrap_or(v)),
            Self::Responses => {
                if let Some(f) = responses::status_failure(v) {
                    return Some(f);
                }
                v.get("error").filter(|e| !e.is_null())
            }
            Self::ChatCompletions | Self::Completions => v.get("error").filter(|e| !e.is_null()),
        };
        error.map(StreamFailure::error)
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

    /// Whether `v` has the shape of this API's answer: the field that holds
    /// the answer is there with the right type (`choices` for Chat
    /// Completions and Completions, `output` for Responses, `content` for
    /// Messages).
    pub fn is_answer(self, v: &Value) -> bool {
        let key = match self {
            Self::ChatCompletions | Self::Completions => "choices",
            Self::Responses => "output",
            Self::Messages => "content",
        };
        v.get(key).is_some_and(Value::is_array)
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
    /// The last error event, as JSON text.
    pub error: Option<String>,
    /// The last failure the stream reported (error events included).
    pub failure: Option<StreamFailure>,
}

impl StreamOutcome {
    /// Note an error event (or the error object it carries).
    pub(crate) fn note_error(&mut self, e: &Value) {
        self.error = Some(e.to_string());
        self.failure = Some(StreamFailure::error(e));
    }
}

/// How an answer that came with HTTP 200 ended in failure, as the upstream
/// reported it inside the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamFailureKind {
    /// Responses `response.failed`, or a `response` whose `status` is `failed`.
    Failed,
    /// Responses `response.incomplete`, or `status: incomplete`. The reason
    /// also sets the finish reason (`max_output_tokens` is `length`), so a
    /// caller may treat an `Incomplete` with finish reason `length` as a
    /// normal stop.
    Incomplete,
    /// An error event or body: Messages `event: error` / `{"type":"error"}`,
    /// the Responses `error` event, a Chat Completions or Completions chunk
    /// (or body) with an `error` object.
    Error,
}

impl StreamFailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Failed => "failed",
            Self::Incomplete => "incomplete",
            Self::Error => "error",
        }
    }
}

/// A terminal failure reported inside an answer, with the upstream's words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamFailure {
    pub kind: StreamFailureKind,
    pub message: String,
}

impl StreamFailure {
    /// An error event or body `e` (an error object, or an event carrying one).
    pub(crate) fn error(e: &Value) -> Self {
        Self {
            kind: StreamFailureKind::Error,
            message: error_message(e),
        }
    }
}

/// The message of an error object (`message`, or `error.message`), else the
/// error's text.
pub(crate) fn error_message(e: &Value) -> String {
    e.get("message")
        .and_then(Value::as_str)
        .or_else(|| at(e, &["error", "message"]).and_then(Value::as_str))
        .or_else(|| e.as_str())
        .map_or_else(|| e.to_string(), str::to_owned)
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
    /// The response as one object. `None` for a whole Chat Completions
    /// body read by its parts (see `chat::assemble_whole`): that body is
    /// kept as its bytes, and the fields below hold what is read of it.
    pub response: Option<Value>,
    /// The response has its API's answer shape ([`WireApi::is_answer`]).
    pub answer: bool,
    /// The assistant's answer as a chat message (content, reasoning_content, tool_calls).
    pub message: Option<Value>,
    pub tool_calls: Option<Value>,
    /// Instead of `message` and `tool_calls`, their compact JSON text, where
    /// a whole Chat Completions body already holds exactly that text
    /// (`canonical`): kept, not built into a tree and written out again.
    pub message_text: Option<String>,
    pub tool_calls_text: Option<String>,
    pub finish_reason: Option<String>,
    pub usage: Usage,
    pub tokens: Tokens,
    /// An error event found inside a stream, as JSON text (the last one).
    pub error: Option<String>,
    /// A failure the upstream reported inside an HTTP 200 answer (stream or
    /// whole body): error events as in `error`, and Responses `failed` /
    /// `incomplete`.
    pub failure: Option<StreamFailure>,
}

impl Assembled {
    /// There is a message (`null` included).
    pub fn has_message(&self) -> bool {
        self.message.is_some() || self.message_text.is_some()
    }

    /// The message as compact JSON text, `None` for none or `null`; its
    /// text is taken, not copied.
    pub fn take_message_json(&mut self) -> Option<String> {
        self.message_text
            .take()
            .or_else(|| self.message.as_ref().and_then(json_text))
    }

    /// The tool calls as compact JSON text, `None` for none or `null`; their
    /// text is taken, not copied.
    pub fn take_tool_calls_json(&mut self) -> Option<String> {
        self.tool_calls_text
            .take()
            .or_else(|| self.tool_calls.as_ref().and_then(json_text))
    }
}

/// `v` as compact JSON (written into a byte buffer, not grown through the
/// formatter a piece at a time), `None` for `null`.
pub fn json_text(v: &Value) -> Option<String> {
    (!v.is_null()).then(|| serde_json::to_string(v).unwrap_or_default())
}

/// The value at a path such as `["choices", "0", "message"]`: a key of an
/// object, or the index of an array. What `Value::pointer` finds, without
/// its two allocations per step (it was about 3 % of the shard thread).
pub(crate) fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| match v {
        Value::Array(a) => k.parse::<usize>().ok().and_then(|i| a.get(i)),
        _ => v.get(k),
    })
}

/// Read an integer field path such as `["usage", "prompt_tokens"]`.
pub(crate) fn int_at(v: &Value, path: &[&str]) -> Option<i64> {
    at(v, path)?.as_i64()
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
