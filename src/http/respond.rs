//! Whole responses: bytes with a content type, or a JSON value.

use super::body::ProxyBody;
use ::http::{header, Response, StatusCode};
use bytes::Bytes;

/// A JSON response.
pub fn json_response(status: u16, body: &serde_json::Value) -> Response<ProxyBody> {
    bytes_response(
        status,
        "application/json",
        serde_json::to_vec(body).unwrap_or_default(),
    )
}

/// A response of `body` with `content_type`; an invalid status becomes 500.
pub fn bytes_response(
    status: u16,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<ProxyBody> {
    let mut r = Response::new(ProxyBody::full(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}
