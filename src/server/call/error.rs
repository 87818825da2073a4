//! Why a call failed, as one enum, and the one place that decides what each
//! failure is recorded as (its `failure_class`) and what the harness is told
//! (an [`ApiError`], written in the harness's own API format).

use crate::dialect::ApiError;
use crate::record::{FailureClass, RecordError};
use crate::server::budget::Over;
use crate::upstream::{BodyError, UpstreamError};
use std::time::Duration;

/// Why the proxy could not pass a call's answer on.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// the request body stalled for {0:?} (server.client_idle_timeout_secs)
    #[error("the request body stalled for {0:?} (server.client_idle_timeout_secs)")]
    RequestStalled(Duration),
    /// request body exceeds the limit of {0} bytes (server.max_body_bytes)
    #[error("request body exceeds the limit of {0} bytes (server.max_body_bytes)")]
    RequestTooLarge(usize),
    /// could not read the request body: {0}
    #[error("could not read the request body: {0}")]
    RequestUnreadable(String),
    /// request body is not a valid JSON object: {0}
    #[error("request body is not a valid JSON object: {0}")]
    InvalidJson(serde_json::Error),
    /// `model` must be a string, got {0}
    #[error("`model` must be a string, got {0}")]
    InvalidModel(serde_json::Value),
    /// no route serves model {0:?} and there is no default route
    #[error("no route serves model {0:?} and there is no default route")]
    NoRoute(Option<String>),
    /// route {route:?} serves {serves} and cannot take a {api} call
    #[error("route {route:?} serves {serves} and cannot take a {api} call")]
    UnsupportedApi {
        route: String,
        serves: String,
        api: &'static str,
    },
    /// the request cannot be translated: {0}
    #[error("{0}")]
    Untranslatable(crate::dialect::translate::TranslateError),
    /// the upstream could not be asked: {0}
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// the upstream's body could not be read: {0}
    #[error(transparent)]
    UpstreamBody(#[from] BodyError),
    /// the upstream answered 200 with a body that is not a Chat Completions object
    #[error("the upstream answered 200 with a body that is not a Chat Completions object")]
    UpstreamInvalid,
    /// upstream answered {status}: {message}
    #[error("upstream answered {status}: {message}")]
    UpstreamStatus {
        status: http::StatusCode,
        message: String,
    },
    /// the call's start could not be recorded: {0}
    #[error("{}", crate::record::unrecorded_error(.0).message)]
    Unrecorded(RecordError),
    /// refused before it was proxied (client key, rollout id, path, no slot)
    #[error("{}", .0.message)]
    Refused(ApiError),
    /// the call would pass its rollout's budget: {over}
    #[error("{}", budget_message(*.api, .over))]
    BudgetExceeded {
        api: crate::dialect::WireApi,
        over: crate::server::budget::Over,
    },
    /// the route is paused for a weight update and stayed paused past {0:?}
    #[error("the route is paused for a weight update and stayed paused past {0:?} (server.pause_max_wait_secs)")]
    Held(Duration),
}

impl ProxyError {
    /// What the call is recorded as, and what the harness is told.
    pub fn classify(&self) -> (FailureClass, ApiError) {
        use FailureClass as C;
        let msg = self.to_string();
        let bad = |code| ApiError::new(400, "invalid_request_error", code, msg.clone());
        let server = |status, code| ApiError::new(status, "server_error", code, msg.clone());
        match self {
            Self::RequestStalled(_) => (
                C::ClientTimeout,
                ApiError::new(408, "invalid_request_error", "request_timeout", msg),
            ),
            Self::RequestTooLarge(_) => (
                C::BodyTooLarge,
                ApiError::new(413, "invalid_request_error", "body_too_large", msg),
            ),
            Self::RequestUnreadable(_) => (C::BadRequest, bad("bad_body")),
            Self::InvalidJson(_) => (C::BadRequest, bad("invalid_json")),
            Self::InvalidModel(_) => (C::BadRequest, bad("invalid_model")),
            Self::NoRoute(_) => (
                C::UnknownRoute,
                ApiError::new(404, "invalid_request_error", "model_not_found", msg),
            ),
            Self::UnsupportedApi { .. } => (C::BadRequest, bad("unsupported_api")),
            Self::Untranslatable(_) => (C::BadRequest, bad("untranslatable")),
            Self::Upstream(e) => match e {
                UpstreamError::Connect(_) => (C::UpstreamConnect, server(502, "upstream_connect")),
                UpstreamError::Timeout(_) => (C::UpstreamTimeout, server(504, "upstream_timeout")),
                UpstreamError::Request(_) => (C::UpstreamDropped, server(502, "upstream_error")),
            },
            Self::UpstreamBody(e) => {
                let (status, class) = match e {
                    BodyError::Stalled(_) => (504, C::UpstreamTimeout),
                    BodyError::TooLarge(_) => (502, C::ResponseTooLarge),
                    BodyError::Dropped(_) => (502, C::UpstreamDropped),
                };
                (class, server(status, class.as_str()))
            }
            Self::UpstreamInvalid => (C::UpstreamInvalid, server(502, "upstream_invalid")),
            Self::UpstreamStatus { status, .. } => {
                let (class, kind) = if status.is_server_error() {
                    (C::UpstreamServerError, "server_error")
                } else {
                    (C::UpstreamClientError, "invalid_request_error")
                };
                (
                    class,
                    ApiError::new(status.as_u16(), kind, "upstream_error", msg),
                )
            }
            Self::Unrecorded(e) => (C::Internal, crate::record::unrecorded_error(e)),
            Self::Held(_) => (C::Overloaded, server(503, "paused")),
            Self::BudgetExceeded { over, .. } => {
                let code = match over {
                    Over::Prompt { .. } => "context_length_exceeded",
                    _ => "budget_exceeded",
                };
                (C::BudgetExceeded, bad(code))
            }
            Self::Refused(err) => {
                let class = match err.status {
                    401 | 403 => C::Unauthorized,
                    503 => C::Overloaded,
                    _ => C::BadRequest,
                };
                (class, err.clone())
            }
        }
    }
}

/// What the harness is told of a budget: past `max_prompt_tokens`, the
/// words its API uses for a prompt over the model's context (Anthropic's
/// `prompt is too long: N tokens > M maximum`, OpenAI's `maximum context
/// length`), which harnesses match to start compacting.
fn budget_message(api: crate::dialect::WireApi, over: &Over) -> String {
    use crate::dialect::WireApi as A;
    let Over::Prompt { max, estimated } = *over else {
        return format!("budget exceeded: {over}");
    };
    let why = "(rollcall: the rollout's max_prompt_tokens budget; the prompt's size is estimated)";
    match api {
        A::Messages => format!("prompt is too long: {estimated} tokens > {max} maximum {why}"),
        A::Responses => format!(
            "Your input exceeds the context window of this model: this model's maximum context length is {max} tokens, and your input is about {estimated} tokens. Please adjust your input and try again. {why}"
        ),
        A::ChatCompletions | A::Completions => format!(
            "This model's maximum context length is {max} tokens. However, your messages resulted in about {estimated} tokens. Please reduce the length of the messages. {why}"
        ),
    }
}

/// Why a stream that had started ended early, or ended wrong.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StreamError {
    /// the upstream closed the stream midway: {0}
    #[error("the upstream closed the stream midway: {0}")]
    UpstreamClosed(String),
    /// the upstream's stream stalled for {0:?}
    #[error("the upstream's stream stalled for {0:?}")]
    UpstreamStalled(Duration),
    /// the stream exceeded server.max_stream_secs ({0:?})
    #[error("the stream exceeded server.max_stream_secs ({0:?})")]
    TooLong(Duration),
    /// the upstream's stream exceeds {0} bytes (server.max_response_bytes)
    #[error("the upstream's stream exceeds {0} bytes (server.max_response_bytes)")]
    TooLarge(usize),
    /// the client stopped reading the stream for {0:?} (server.client_idle_timeout_secs)
    #[error("the client stopped reading the stream for {0:?} (server.client_idle_timeout_secs)")]
    ClientStalled(Duration),
    /// the client disconnected before the stream ended
    #[error("the client disconnected before the stream ended")]
    ClientGone,
    /// the upstream reported the response failed (response.failed)
    #[error("the upstream reported the response failed (response.failed)")]
    Failed,
    /// the upstream reported the response incomplete (response.incomplete)
    #[error("the upstream reported the response incomplete (response.incomplete)")]
    Incomplete,
    /// the upstream's stream carried an error event
    #[error("the upstream's stream carried an error event")]
    ErrorEvent,
    /// the upstream ended the stream without its terminal event
    #[error("the upstream ended the stream without its terminal event")]
    NoTerminal,
    /// an abort pause cut the stream and the route stayed paused past {0:?} (server.pause_max_wait_secs)
    #[error("an abort pause cut the stream and the route stayed paused past {0:?} (server.pause_max_wait_secs)")]
    HeldTooLong(Duration),
}

impl StreamError {
    /// What the call is recorded as.
    pub fn class(&self) -> FailureClass {
        use FailureClass as C;
        match self {
            Self::UpstreamClosed(_) | Self::NoTerminal => C::UpstreamDropped,
            Self::UpstreamStalled(_) => C::UpstreamTimeout,
            Self::TooLong(_) => C::StreamTimeout,
            Self::TooLarge(_) => C::ResponseTooLarge,
            Self::ClientStalled(_) => C::ClientTimeout,
            Self::ClientGone => C::ClientDisconnected,
            Self::Failed => C::UpstreamFailed,
            Self::Incomplete => C::UpstreamIncomplete,
            Self::ErrorEvent => C::UpstreamStreamError,
            Self::HeldTooLong(_) => C::Overloaded,
        }
    }

    /// The error event the harness gets in its stream before the cut, for
    /// the failures the proxy itself finds midway.
    pub fn event(&self) -> ApiError {
        let code = match self {
            Self::UpstreamStalled(_) | Self::TooLong(_) => "stream_timeout",
            Self::TooLarge(_) => "response_too_large",
            Self::HeldTooLong(_) => {
                return ApiError::new(503, "server_error", "paused", self.to_string())
            }
            _ => "upstream_dropped",
        };
        ApiError::new(502, "server_error", code, self.to_string())
    }
}

impl From<crate::record::InvalidRolloutId> for ApiError {
    fn from(e: crate::record::InvalidRolloutId) -> Self {
        ApiError::new(
            400,
            "invalid_request_error",
            "invalid_rollout_id",
            e.to_string(),
        )
    }
}
