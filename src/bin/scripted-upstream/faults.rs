//! Errors and faults, each in the format of the API that was called,
//! written out here (not borrowed from the proxy): OpenAI's error body,
//! Anthropic's, their error stream events, and the broken answers of
//! `fault=malformed` and `fault=drop`.

use crate::options::Kind;
use bytes::Bytes;
use http::{header, Response};
use rollcall::http::{bytes_response, json_response, Chunk, ProxyBody};
use serde_json::json;
use std::time::Duration;
use tokio::sync::mpsc;

/// An OpenAI error body: `{"error": {"message", "type", "param", "code"}}`,
/// the code being the status as a string.
pub(crate) fn error(status: u16, msg: &str) -> Response<ProxyBody> {
    let body = json!({"error": {"message": msg, "type": if status >= 500 {"server_error"} else {"invalid_request_error"}, "param": null, "code": status.to_string()}});
    json_response(status, &body)
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

/// An error in the format of the API that was called: Anthropic's
/// `{"type": "error", "error": {"type", "message"}}` on Messages, else
/// OpenAI's.
pub(crate) fn error_for(kind: Option<Kind>, status: u16, msg: &str) -> Response<ProxyBody> {
    match kind {
        Some(Kind::Messages | Kind::CountTokens) => {
            let body = json!({"type": "error", "error": {"type": anthropic_error_type(status), "message": msg}});
            json_response(status, &body)
        }
        _ => error(status, msg),
    }
}

/// `fault=failed`, mid-stream: Responses' `response.failed` event; on the
/// other APIs a chat chunk that is an `error` object, then `[DONE]`.
pub(crate) fn failed_event(kind: Kind) -> String {
    match kind {
        Kind::Responses => {
            let r = json!({"type": "response.failed", "response": {"id": "resp_failed", "object": "response", "status": "failed",
                "error": {"code": "server_error", "message": "scripted failure"}, "output": []}});
            format!("event: response.failed\ndata: {r}\n\n")
        }
        _ => {
            let err = json!({"error": {"message": "scripted failure", "type": "server_error", "code": "500"}});
            format!("data: {err}\n\ndata: [DONE]\n\n")
        }
    }
}

/// `fault=stream_error`, mid-stream: Anthropic's `error` event on Messages,
/// else an OpenAI error object as a data line (and no terminal event).
pub(crate) fn stream_error_event(kind: Kind) -> String {
    if kind == Kind::Messages {
        let err = json!({"type": "error", "error": {"type": "api_error", "message": "scripted stream error"}});
        format!("event: error\ndata: {err}\n\n")
    } else {
        let err = json!({"error": {"message": "scripted stream error", "type": "server_error", "code": "500"}});
        format!("data: {err}\n\n")
    }
}

/// `fault=drop` on a whole answer: the first half of `text` under a
/// content length for all of it, then a reset connection.
pub(crate) fn dropped(text: String) -> Response<ProxyBody> {
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
    r
}

/// `fault=malformed`: the API's shape broken in the ways real servers
/// have broken it, with no terminal event.
pub(crate) fn malformed(kind: Option<Kind>, stream: bool) -> Response<ProxyBody> {
    if !stream {
        return json_response(
            200,
            &json!({"choices": 7, "output": "none", "content": {"x": null}}),
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
    bytes_response(200, "text/event-stream", events)
}
