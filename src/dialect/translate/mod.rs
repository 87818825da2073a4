//! Translation between wire APIs, for routes whose upstream speaks only Chat
//! Completions: a Responses or Messages request becomes a Chat Completions
//! request, and the answer (a whole body or a stream, chunk by chunk) is
//! translated back into the harness's API.
//!
//! What has no Chat Completions equivalent (Codex's `web_search` and
//! `namespace` tools, Anthropic server tools, documents, …) is dropped and
//! listed in [`ChatRequest::dropped`], or rejected, as the route's
//! `unsupported` setting says. Nothing is changed silently.
//!
//! The same conversions give the recorded `messages` column of Responses and
//! Messages calls (with `drop`), whatever the route: [`responses_messages`],
//! [`messages_to_chat`].
//!
//! This file holds the shared part: the policy ([`Unsupported`]), the
//! errors, the translated request, [`to_chat`] and the helpers both request
//! directions use. The rest, each direction in its own file:
//!
//! | file | what |
//! |---|---|
//! | `from_responses` | a Responses request as a chat request ([`responses_to_chat`]), and its conversation as chat messages ([`responses_messages`]) |
//! | `from_messages` | a Messages request as a chat request ([`messages_to_chat`]) |
//! | `response` | a whole `chat.completion` back into a Responses `response` or an Anthropic `message` ([`response_from_chat`]) |
//! | `stream` | a chat chunk stream back into Responses or Messages events, event by event ([`StreamTranslator`]) |

mod from_messages;
mod from_responses;
mod response;
mod stream;

pub use from_messages::messages_to_chat;
pub use from_responses::{function_tool, responses_messages, responses_to_chat};
pub use response::{chat_to_messages, chat_to_responses, response_from_chat};
pub use stream::StreamTranslator;

use super::WireApi;
use serde_json::{json, Map, Value};

/// What to do with a construct that has no Chat Completions equivalent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Unsupported {
    /// Leave it out, and log a warning naming it.
    #[default]
    Drop,
    /// Answer 400 naming it.
    Reject,
}

/// Why a request could not be translated.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TranslateError {
    /// the request uses {0}, which Chat Completions cannot express
    #[error("the request uses {0}, which the route's Chat Completions upstream cannot express (route setting unsupported = \"reject\")")]
    Unsupported(String),
    /// the request is not valid for its API: {0}
    #[error("the request is not valid for its API: {0}")]
    Invalid(String),
}

/// A request translated to Chat Completions.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    pub request: Value,
    /// Constructs left out, for the warning log.
    pub dropped: Vec<String>,
}

struct Builder {
    policy: Unsupported,
    dropped: Vec<String>,
}

impl Builder {
    fn unsupported(&mut self, what: String) -> Result<(), TranslateError> {
        match self.policy {
            Unsupported::Drop => {
                self.dropped.push(what);
                Ok(())
            }
            Unsupported::Reject => Err(TranslateError::Unsupported(what)),
        }
    }
}

/// Translate a request of `api` into Chat Completions.
pub fn to_chat(
    api: WireApi,
    req: &Value,
    policy: Unsupported,
) -> Result<ChatRequest, TranslateError> {
    match api {
        WireApi::Responses => responses_to_chat(req, policy),
        WireApi::Messages => messages_to_chat(req, policy),
        WireApi::ChatCompletions | WireApi::Completions => Err(TranslateError::Invalid(format!(
            "{} needs no translation",
            api.as_str()
        ))),
    }
}

/// Chat content from a list of parts: a string when all parts are text and
/// there is one, else a list of chat parts.
fn chat_content(parts: Vec<Value>) -> Value {
    if parts.len() == 1 && parts[0]["type"] == "text" {
        return parts[0]["text"].clone();
    }
    Value::Array(parts)
}

/// Top-level fields both APIs share, copied as they are.
fn copy(from: &Map<String, Value>, to: &mut Map<String, Value>, keys: &[&str]) {
    for k in keys {
        if let Some(v) = from.get(*k) {
            to.insert((*k).into(), v.clone());
        }
    }
}

fn stream_fields(obj: &Map<String, Value>, out: &mut Map<String, Value>) {
    if obj.get("stream").and_then(Value::as_bool) == Some(true) {
        out.insert("stream".into(), json!(true));
        // Usage arrives in a last chunk; both target APIs report it.
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
}

#[cfg(test)]
mod tests;
