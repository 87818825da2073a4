//! A whole answer: read, translated or stripped of token-capture fields
//! when the call needs it, recorded, and only then released to the harness.

use super::error::ProxyError;
use super::prepare::Strip;
use super::record::{error_response, Call};
use crate::dialect::capture;
use crate::dialect::translate;
use crate::http::ProxyBody;
use crate::record::CallStatus;
use crate::upstream::Route;
use bytes::Bytes;
use http::{header, HeaderValue, Response};

/// Answer with the upstream's whole body, in `out` (status and headers
/// already set from the upstream's).
pub async fn answer(
    mut call: Call,
    route: &Route,
    mut resp: crate::upstream::Response,
    translated: bool,
    strip: Option<Strip>,
    mut out: Response<ProxyBody>,
) -> Response<ProxyBody> {
    let max = call.state.server.max_response_bytes;
    let body = match crate::upstream::read_body(resp.body_mut(), max, route.idle_timeout).await {
        Ok(b) => b,
        Err(e) => return call.fail(e.into()).await,
    };
    let status = resp.status();
    let api = call.api;
    let (body, record) = if status.is_success() {
        let body = if translated {
            let Ok(chat) = serde_json::from_slice::<serde_json::Value>(&body) else {
                call.upstream_response = Some(body);
                return call.fail(ProxyError::UpstreamInvalid).await;
            };
            let answer = translate::response_from_chat(api, &chat);
            call.upstream_response = Some(body);
            set_json(&mut out);
            Bytes::from(serde_json::to_vec(&answer).unwrap_or_default())
        } else if let Some(s) = &strip {
            match serde_json::from_slice::<serde_json::Value>(&body) {
                Ok(mut v) => {
                    capture::strip(s.kind, s.api, &s.asked, &mut v);
                    call.upstream_response = Some(body);
                    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
                }
                Err(_) => body,
            }
        } else {
            body
        };
        (body, (CallStatus::Ok, None))
    } else {
        let e = ProxyError::UpstreamStatus {
            status,
            message: upstream_error_message(&body),
        };
        let (class, err) = e.classify();
        // Pass the upstream's error through when it is already in the
        // API's format; otherwise wrap it.
        let passthrough = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .is_some_and(|v| api.is_error_body(&v));
        let body = if passthrough {
            body
        } else {
            call.upstream_response = Some(body);
            set_json(&mut out);
            Bytes::from(api.error_body(&err))
        };
        (body, (CallStatus::Failed, Some((class, err.message))))
    };
    let (status_rec, failure) = record;
    if let Err(err) = call
        .end(status_rec, status.as_u16(), failure, body.clone())
        .await
    {
        return error_response(api, &err);
    }
    *out.body_mut() = ProxyBody::full(body);
    out
}

fn set_json(out: &mut Response<ProxyBody>) {
    out.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
}

/// The message of an upstream's error body, whatever its shape.
fn upstream_error_message(body: &[u8]) -> String {
    let v: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    let from_json = v.as_ref().and_then(|v| {
        v.pointer("/error/message")
            .or_else(|| v.get("message"))
            .or_else(|| v.get("detail"))
            .or_else(|| v.get("error"))
            .map(|m| m.as_str().map_or_else(|| m.to_string(), str::to_owned))
    });
    from_json.unwrap_or_else(|| {
        let text = String::from_utf8_lossy(body);
        text.chars().take(500).collect()
    })
}
