//! The proxy path of one call: tag it, forward it, pass the answer back as
//! it arrives, and record it.
//!
//! The last bytes the harness receives (the whole body when not streaming,
//! the chunk that completes the terminal event when streaming) are released
//! only after the call's end is in the write-ahead log.

use super::body::{Chunk, ProxyBody};
use super::metrics::{ApiLabel, CallLabels, ClassLabel};
use super::routes::error_response;
use super::State;
use crate::config::Untagged;
use crate::dialect::sse;
use crate::dialect::terminal::Detector;
use crate::dialect::translate::{self, StreamTranslator};
use crate::dialect::{ApiError, WireApi};
use crate::record::{CallBegin, CallMeta, CallOutcome, CallStatus, FailureClass};
use crate::upstream::capture::{self, Asked, CaptureKind, ChunkFate};
use crate::upstream::{error_chain, Route, UpstreamError};
use bytes::{Bytes, BytesMut};
use http::{header, HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::value::RawValue;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Hop-by-hop headers, and those the proxy sets itself.
const DROP_REQUEST: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
    "accept-encoding",
    "x-rollout-id",
];
const DROP_RESPONSE: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

/// Headers to send upstream: the client's, less hop-by-hop ones; the client's
/// credentials only when they are not rollcall's own client keys.
pub fn upstream_headers(client: &HeaderMap, keys_are_ours: bool) -> HeaderMap {
    let mut h = HeaderMap::with_capacity(client.len());
    for (k, v) in client {
        let name = k.as_str();
        if DROP_REQUEST.contains(&name)
            || (keys_are_ours && (k == header::AUTHORIZATION || name == "x-api-key"))
        {
            continue;
        }
        h.append(k.clone(), v.clone());
    }
    h
}

fn response_headers(up: &HeaderMap, out: &mut HeaderMap) {
    for (k, v) in up {
        if !DROP_RESPONSE.contains(&k.as_str()) {
            out.append(k.clone(), v.clone());
        }
    }
}

#[derive(Deserialize)]
struct Head {
    model: Option<serde_json::Value>,
    stream: Option<bool>,
}

/// A top-level JSON object with each value kept as its raw bytes.
struct RawObject(Vec<(String, Box<RawValue>)>);

impl<'de> Deserialize<'de> for RawObject {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawObject;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<RawObject, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, Box<RawValue>>()? {
                    out.push((k, v));
                }
                Ok(RawObject(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// Replace the top-level `model` field, keeping every other value's bytes.
pub fn rewrite_model(body: &[u8], model: &str) -> Option<Bytes> {
    let obj: RawObject = serde_json::from_slice(body).ok()?;
    let mut out = Vec::with_capacity(body.len() + model.len());
    out.push(b'{');
    for (i, (k, v)) in obj.0.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, k).ok()?;
        out.push(b':');
        if k == "model" {
            serde_json::to_writer(&mut out, model).ok()?;
        } else {
            out.extend_from_slice(v.get().as_bytes());
        }
    }
    out.push(b'}');
    Some(Bytes::from(out))
}

/// One call in flight: what is recorded about it, and how it ends.
struct Call {
    state: Arc<State>,
    api: WireApi,
    begin: Arc<CallBegin>,
    started: Instant,
    first_byte_at: Option<i64>,
    began: bool,
    /// The upstream's body, recorded beside the harness's when they differ.
    upstream_response: Option<Bytes>,
}

impl Call {
    async fn log_begin(&mut self) {
        if !self.began {
            self.began = true;
            if let Err(e) = self.state.recorder.begin(self.begin.clone()).await {
                tracing::error!(error = %e, "could not log call start");
            }
        }
    }

    /// Record the call's end; returns once it is in the WAL.
    async fn end(
        &mut self,
        status: CallStatus,
        http_status: u16,
        failure: Option<(FailureClass, String)>,
        response: Bytes,
    ) {
        self.log_begin().await;
        let m = &self.state.metrics;
        let label = ApiLabel {
            wire_api: self.api.as_str(),
        };
        m.calls
            .get_or_create(&CallLabels {
                wire_api: self.api.as_str(),
                status: status.as_str(),
            })
            .inc();
        m.duration
            .get_or_create(&label)
            .observe(self.started.elapsed().as_secs_f64());
        if let Some((class, msg)) = &failure {
            m.errors
                .get_or_create(&ClassLabel {
                    class: class.as_str(),
                })
                .inc();
            tracing::info!(
                call_id = %self.begin.meta.call_id,
                rollout = %self.begin.meta.rollout_id,
                class = class.as_str(),
                "call failed: {msg}"
            );
        }
        let (failure_class, failure_message) =
            failure.map_or((None, None), |(c, m)| (Some(c), Some(m)));
        let outcome = CallOutcome {
            call_id: self.begin.meta.call_id.clone(),
            status,
            http_status: Some(http_status),
            failure_class,
            failure_message,
            first_byte_at: self.first_byte_at,
            done_at: crate::now_micros(),
        };
        let upstream = self.upstream_response.take();
        if let Err(e) = self.state.recorder.end(outcome, response, upstream).await {
            tracing::error!(error = %e, call_id = %self.begin.meta.call_id, "could not record call");
        }
    }

    /// Answer with an error in the harness's API format, and record it.
    async fn fail(mut self, class: FailureClass, err: ApiError) -> Response<ProxyBody> {
        let body = Bytes::from(self.api.error_body(&err));
        self.end(
            CallStatus::Failed,
            err.status,
            Some((class, err.message.clone())),
            body.clone(),
        )
        .await;
        super::routes::bytes_response(err.status, "application/json", body)
    }

    /// Record a stream the harness walked away from.
    async fn client_gone(&mut self, response: Bytes) {
        let msg = "the client disconnected before the stream ended".to_owned();
        let failure = Some((FailureClass::ClientDisconnected, msg));
        self.end(CallStatus::Failed, 200, failure, response).await;
    }

    fn mark_first_byte(&mut self) {
        if self.first_byte_at.is_none() {
            self.first_byte_at = Some(crate::now_micros());
            self.state
                .metrics
                .ttfb
                .get_or_create(&ApiLabel {
                    wire_api: self.api.as_str(),
                })
                .observe(self.started.elapsed().as_secs_f64());
        }
    }
}

struct InFlight(Arc<State>);
impl InFlight {
    fn new(s: &Arc<State>) -> Self {
        s.metrics.in_flight.inc();
        Self(s.clone())
    }
}
impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.metrics.in_flight.dec();
    }
}

fn rollout_of(
    state: &State,
    path_rollout: Option<String>,
    headers: &HeaderMap,
) -> Result<String, ApiError> {
    if let Some(r) = path_rollout {
        return Ok(r);
    }
    if let Some(h) = headers.get("x-rollout-id") {
        let id = h.to_str().unwrap_or("").to_owned();
        super::routes::check_rollout_id(&id)?;
        return Ok(id);
    }
    match state.config.rollouts.untagged {
        Untagged::Default => Ok(state.config.rollouts.default_rollout.clone()),
        Untagged::Reject => Err(ApiError::new(
            400,
            "invalid_request_error",
            "missing_rollout_id",
            "this call names no rollout: use the base URL http://HOST:PORT/rollouts/<rollout_id>/v1 or send an X-Rollout-Id header",
        )),
    }
}

/// Proxy and record one call.
pub async fn proxy(
    state: Arc<State>,
    api: WireApi,
    path_rollout: Option<String>,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let started = Instant::now();
    let received_at = crate::now_micros();
    let in_flight = InFlight::new(&state);
    let rollout = match rollout_of(&state, path_rollout, req.headers()) {
        Ok(r) => r,
        Err(e) => return error_response(api, &e),
    };
    let (parts, body) = req.into_parts();
    let endpoint = match parts.uri.query() {
        Some(q) => format!("{}?{q}", api.endpoint()),
        None => api.endpoint().to_owned(),
    };
    let user_agent = parts
        .headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let mut meta = CallMeta {
        call_id: uuid::Uuid::now_v7().to_string(),
        sequence: state.sequencer.take(&rollout),
        rollout_id: rollout,
        wire_api: api.as_str().into(),
        route: None,
        model: None,
        upstream_model: None,
        stream: false,
        received_at,
        user_agent,
        upstream_api: None,
    };
    let max = state.config.server.max_body_bytes;
    let read = Limited::new(body, max)
        .collect()
        .await
        .map(|b| b.to_bytes());
    let bad = |meta: CallMeta, request: Bytes| Call {
        state: state.clone(),
        api,
        begin: Arc::new(CallBegin {
            meta,
            request,
            upstream_request: None,
        }),
        started,
        first_byte_at: None,
        began: false,
        upstream_response: None,
    };
    let request = match read {
        Ok(b) => b,
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            let err = ApiError::new(
                413,
                "invalid_request_error",
                "body_too_large",
                format!("request body exceeds the limit of {max} bytes (server.max_body_bytes)"),
            );
            return bad(meta, Bytes::new())
                .fail(FailureClass::BodyTooLarge, err)
                .await;
        }
        Err(e) => {
            let msg = format!("could not read the request body: {e}");
            let err = ApiError::new(400, "invalid_request_error", "bad_body", msg);
            return bad(meta, Bytes::new())
                .fail(FailureClass::BadRequest, err)
                .await;
        }
    };
    let head: Head = match serde_json::from_slice(&request) {
        Ok(h) => h,
        Err(e) => {
            let err = ApiError::new(
                400,
                "invalid_request_error",
                "invalid_json",
                format!("request body is not a valid JSON object: {e}"),
            );
            return bad(meta, request).fail(FailureClass::BadRequest, err).await;
        }
    };
    let model = match head.model {
        Some(serde_json::Value::String(m)) => Some(m),
        None => None,
        Some(other) => {
            let err = ApiError::new(
                400,
                "invalid_request_error",
                "invalid_model",
                format!("`model` must be a string, got {other}"),
            );
            return bad(meta, request).fail(FailureClass::BadRequest, err).await;
        }
    };
    meta.stream = head.stream.unwrap_or(false);
    meta.model = model.clone();
    let Some(route) = state.routes.select(model.as_deref()).cloned() else {
        let err = ApiError::new(
            404,
            "invalid_request_error",
            "model_not_found",
            format!("no route serves model {model:?} and there is no default route"),
        );
        return bad(meta, request)
            .fail(FailureClass::UnknownRoute, err)
            .await;
    };
    meta.route = Some(route.name.clone());
    let upstream_model = model.as_deref().map(|m| route.upstream_model(m).to_owned());
    let Some(target) = route.plan(api) else {
        let err = ApiError::new(
            400,
            "invalid_request_error",
            "unsupported_api",
            format!(
                "route {:?} serves {} and cannot take a {} call",
                route.name,
                route.api_names(),
                api.as_str()
            ),
        );
        return bad(meta, request).fail(FailureClass::BadRequest, err).await;
    };
    let translated = target != api;
    let (upstream_request, endpoint) = if translated {
        let parsed: serde_json::Value = serde_json::from_slice(&request).unwrap_or_default();
        match translate::to_chat(api, &parsed, route.unsupported) {
            Ok(mut t) => {
                if !t.dropped.is_empty() {
                    tracing::warn!(
                        call_id = %meta.call_id,
                        rollout = %meta.rollout_id,
                        route = %route.name,
                        dropped = ?t.dropped,
                        "left out of the request translated to Chat Completions"
                    );
                }
                if let Some(u) = &upstream_model {
                    t.request["model"] = serde_json::json!(u);
                }
                meta.upstream_api = Some(target.as_str().into());
                let body = serde_json::to_vec(&t.request).unwrap_or_default();
                (Some(Bytes::from(body)), target.endpoint().to_owned())
            }
            Err(e) => {
                let err = ApiError::new(
                    400,
                    "invalid_request_error",
                    "untranslatable",
                    e.to_string(),
                );
                return bad(meta, request).fail(FailureClass::BadRequest, err).await;
            }
        }
    } else {
        let rewritten = match (&model, &upstream_model) {
            (Some(m), Some(u)) if m != u => rewrite_model(&request, u),
            _ => None,
        };
        (rewritten, endpoint)
    };
    // vLLM and SGLang routes: ask for token ids and logprobs.
    let mut strip: Option<(CaptureKind, WireApi, Asked)> = None;
    let upstream_request = match route.capture.filter(|_| capture::applies(target)) {
        Some(kind) => {
            let base = upstream_request.clone().unwrap_or_else(|| request.clone());
            match serde_json::from_slice::<serde_json::Value>(&base) {
                Ok(serde_json::Value::Object(mut m)) => {
                    match capture::prepare(kind, target, &mut m) {
                        Ok(asked) => {
                            strip = Some((kind, target, asked));
                            let body = serde_json::to_vec(&serde_json::Value::Object(m))
                                .unwrap_or_default();
                            Some(Bytes::from(body))
                        }
                        Err(_) => upstream_request,
                    }
                }
                _ => upstream_request,
            }
        }
        None => upstream_request,
    };
    meta.upstream_model = upstream_model;
    let mut call = Call {
        state: state.clone(),
        api,
        begin: Arc::new(CallBegin {
            meta,
            request: request.clone(),
            upstream_request: upstream_request.clone(),
        }),
        started,
        first_byte_at: None,
        began: false,
        upstream_response: None,
    };
    call.log_begin().await;
    let mut headers = upstream_headers(&parts.headers, state.client_keys.is_some());
    if translated {
        // A Chat Completions server takes its key as a Bearer token.
        if let Some(k) = headers.remove("x-api-key") {
            if !headers.contains_key(header::AUTHORIZATION) {
                if let Ok(v) = http::HeaderValue::from_bytes(&[b"Bearer ", k.as_bytes()].concat()) {
                    headers.insert(header::AUTHORIZATION, v);
                }
            }
        }
    }
    let body = upstream_request.unwrap_or(request);
    let resp = match route.send(Method::POST, &endpoint, headers, body).await {
        Ok(r) => r,
        Err(e) => {
            let (class, err) = match &e {
                UpstreamError::Connect(_) => (
                    FailureClass::UpstreamConnect,
                    ApiError::new(502, "server_error", "upstream_connect", e.to_string()),
                ),
                UpstreamError::Timeout(_) => (
                    FailureClass::UpstreamTimeout,
                    ApiError::new(504, "server_error", "upstream_timeout", e.to_string()),
                ),
                UpstreamError::Request(_) => (
                    FailureClass::UpstreamDropped,
                    ApiError::new(502, "server_error", "upstream_error", e.to_string()),
                ),
            };
            return call.fail(class, err).await;
        }
    };
    call.mark_first_byte();
    let status = resp.status();
    let is_sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("text/event-stream"));
    let mut out = Response::new(ProxyBody::Full(None));
    *out.status_mut() = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    response_headers(resp.headers(), out.headers_mut());
    if is_sse && status.is_success() {
        let (tx, rx) = mpsc::channel(64);
        *out.body_mut() = ProxyBody::Stream(rx);
        let stage = (translated || strip.is_some()).then(|| Stage {
            parser: sse::Parser::default(),
            translator: translated.then(|| StreamTranslator::new(api)),
            strip,
            upstream: BytesMut::new(),
            flushed: false,
        });
        let source = Source { resp, stage };
        tokio::spawn(pump(call, route, source, tx, in_flight));
        return out;
    }
    // A whole body: read it, record it, then release it.
    let body = match read_whole(&route, resp, max.max(64 << 20)).await {
        Ok(b) => b,
        Err((class, msg)) => {
            let code = if class == FailureClass::UpstreamTimeout {
                504
            } else {
                502
            };
            let err = ApiError::new(code, "server_error", class.as_str(), msg);
            return call.fail(class, err).await;
        }
    };
    if status.is_success() {
        let body = if translated {
            let Ok(chat) = serde_json::from_slice::<serde_json::Value>(&body) else {
                let msg =
                    "the upstream answered 200 with a body that is not a Chat Completions object"
                        .to_owned();
                call.upstream_response = Some(body);
                let err = ApiError::new(502, "server_error", "upstream_invalid", msg);
                return call.fail(FailureClass::UpstreamInvalid, err).await;
            };
            let answer = translate::response_from_chat(api, &chat);
            call.upstream_response = Some(body);
            out.headers_mut().insert(
                header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            Bytes::from(serde_json::to_vec(&answer).unwrap_or_default())
        } else if let Some((kind, target, asked)) = &strip {
            match serde_json::from_slice::<serde_json::Value>(&body) {
                Ok(mut v) => {
                    capture::strip(*kind, *target, asked, &mut v);
                    call.upstream_response = Some(body);
                    Bytes::from(serde_json::to_vec(&v).unwrap_or_default())
                }
                Err(_) => body,
            }
        } else {
            body
        };
        call.end(CallStatus::Ok, status.as_u16(), None, body.clone())
            .await;
        *out.body_mut() = ProxyBody::full(body);
        return out;
    }
    let class = if status.is_server_error() {
        FailureClass::UpstreamServerError
    } else {
        FailureClass::UpstreamClientError
    };
    let upstream_msg = upstream_error_message(&body);
    let msg = format!("upstream answered {status}: {upstream_msg}");
    // Pass the upstream's error through when it is already in the API's
    // format; otherwise wrap it.
    let passthrough = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .is_some_and(|v| api.is_error_body(&v));
    if !passthrough {
        call.upstream_response = Some(body.clone());
    }
    let body = if passthrough {
        body
    } else {
        let kind = if status.is_server_error() {
            "server_error"
        } else {
            "invalid_request_error"
        };
        let err = ApiError::new(status.as_u16(), kind, "upstream_error", msg.clone());
        out.headers_mut().insert(
            header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        Bytes::from(api.error_body(&err))
    };
    call.end(
        CallStatus::Failed,
        status.as_u16(),
        Some((class, msg)),
        body.clone(),
    )
    .await;
    *out.body_mut() = ProxyBody::full(body);
    drop(in_flight);
    out
}

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

async fn read_whole(
    route: &Route,
    mut resp: reqwest::Response,
    limit: usize,
) -> Result<Bytes, (FailureClass, String)> {
    let mut buf = BytesMut::new();
    loop {
        match tokio::time::timeout(route.idle_timeout, resp.chunk()).await {
            Err(_) => {
                return Err((
                    FailureClass::UpstreamTimeout,
                    format!("the upstream's body stalled for {:?}", route.idle_timeout),
                ))
            }
            Ok(Ok(Some(c))) => {
                if buf.len() + c.len() > limit {
                    return Err((
                        FailureClass::UpstreamDropped,
                        format!("upstream body exceeds {limit} bytes"),
                    ));
                }
                buf.extend_from_slice(&c);
            }
            Ok(Ok(None)) => return Ok(buf.freeze()),
            Ok(Err(e)) => {
                return Err((
                    FailureClass::UpstreamDropped,
                    format!(
                        "the upstream closed the response midway: {}",
                        error_chain(&e)
                    ),
                ))
            }
        }
    }
}

enum Next {
    Chunk(Bytes),
    End,
    Broken(FailureClass, String),
    ClientGone,
}

/// How a stream that ran to its end is recorded: an error event inside it
/// makes it an upstream stream error; an end without a terminal event
/// (`[DONE]`, `response.completed`, …) means the upstream cut it short.
fn stream_verdict(d: &Detector, terminal: bool) -> (CallStatus, Option<(FailureClass, String)>) {
    if d.saw_error {
        let msg = "the upstream's stream carried an error event".to_owned();
        (
            CallStatus::Failed,
            Some((FailureClass::UpstreamStreamError, msg)),
        )
    } else if !terminal {
        let msg = "the upstream ended the stream without its terminal event".to_owned();
        (
            CallStatus::Failed,
            Some((FailureClass::UpstreamDropped, msg)),
        )
    } else {
        (CallStatus::Ok, None)
    }
}

/// A stream the proxy changes on its way: token-capture fields taken out,
/// and/or Chat Completions chunks translated into the harness's API.
struct Stage {
    parser: sse::Parser,
    translator: Option<StreamTranslator>,
    strip: Option<(CaptureKind, WireApi, Asked)>,
    /// The upstream's bytes, for the record.
    upstream: BytesMut,
    flushed: bool,
}

impl Stage {
    /// The bytes one upstream event becomes for the harness.
    fn event(&mut self, mut ev: sse::Event, out: &mut Vec<u8>) {
        if let Some((kind, api, asked)) = &self.strip {
            if ev.data != "[DONE]" {
                if let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&ev.data) {
                    if capture::strip_chunk(*kind, *api, asked, &mut v) == ChunkFate::Drop {
                        return;
                    }
                    ev.data = v.to_string();
                }
            }
        }
        match &mut self.translator {
            Some(t) => out.extend(t.feed(&ev)),
            None => sse::write_event(&ev, out),
        }
    }
}

/// Where a stream's chunks come from: the upstream's body, through a
/// [`Stage`] when the call needs one.
struct Source {
    resp: reqwest::Response,
    stage: Option<Stage>,
}

impl Source {
    async fn chunk(&mut self) -> Result<Option<Bytes>, reqwest::Error> {
        let Some(t) = &mut self.stage else {
            return self.resp.chunk().await;
        };
        let mut events = Vec::new();
        loop {
            match self.resp.chunk().await? {
                Some(c) => {
                    t.upstream.extend_from_slice(&c);
                    t.parser.feed(&c, &mut events);
                }
                None if t.flushed => return Ok(None),
                None => {
                    t.flushed = true;
                    t.parser.finish(&mut events);
                }
            }
            let mut out = Vec::new();
            for e in events.drain(..) {
                t.event(e, &mut out);
            }
            if !out.is_empty() {
                return Ok(Some(Bytes::from(out)));
            }
            if t.flushed {
                return Ok(None);
            }
        }
    }

    /// The upstream's bytes so far, when they differ from what the harness got.
    fn upstream(&mut self) -> Option<Bytes> {
        self.stage.as_mut().map(|t| t.upstream.split().freeze())
    }
}

/// Forward a stream chunk by chunk, collecting a copy for the record.
async fn pump(
    mut call: Call,
    route: Arc<Route>,
    mut resp: Source,
    tx: mpsc::Sender<Chunk>,
    in_flight: InFlight,
) {
    let _in_flight = in_flight;
    let max_stream = Duration::from_secs(call.state.config.server.max_stream_secs);
    let deadline = tokio::time::Instant::from_std(call.started) + max_stream;
    let mut detector = Detector::default();
    let mut collected = BytesMut::new();
    let mut recorded = false;
    let api = call.api;
    loop {
        let next = tokio::select! {
            r = tokio::time::timeout(route.idle_timeout, resp.chunk()) => match r {
                Ok(Ok(Some(c))) => Next::Chunk(c),
                Ok(Ok(None)) => Next::End,
                Ok(Err(e)) => Next::Broken(FailureClass::UpstreamDropped, format!("the upstream closed the stream midway: {}", error_chain(&e))),
                Err(_) => Next::Broken(FailureClass::UpstreamTimeout, format!("the upstream's stream stalled for {:?}", route.idle_timeout)),
            },
            _ = tokio::time::sleep_until(deadline) => Next::Broken(FailureClass::StreamTimeout, format!("the stream exceeded server.max_stream_secs ({max_stream:?})")),
            _ = tx.closed() => Next::ClientGone,
        };
        match next {
            Next::Chunk(chunk) => {
                if recorded {
                    if tx.send(Ok(chunk)).await.is_err() {
                        return;
                    }
                    continue;
                }
                collected.extend_from_slice(&chunk);
                if detector.feed(&chunk) {
                    recorded = true;
                    if tx.is_closed() {
                        call.upstream_response = resp.upstream();
                        call.client_gone(collected.split().freeze()).await;
                        return;
                    }
                    let (status, failure) = stream_verdict(&detector, true);
                    call.upstream_response = resp.upstream();
                    call.end(status, 200, failure, collected.split().freeze())
                        .await;
                }
                if tx.send(Ok(chunk)).await.is_err() && !recorded {
                    call.upstream_response = resp.upstream();
                    call.client_gone(collected.freeze()).await;
                    return;
                }
            }
            Next::End => {
                if !recorded {
                    let (status, failure) = stream_verdict(&detector, false);
                    call.upstream_response = resp.upstream();
                    call.end(status, 200, failure, collected.freeze()).await;
                }
                return;
            }
            Next::ClientGone => {
                if !recorded {
                    call.upstream_response = resp.upstream();
                    call.client_gone(collected.freeze()).await;
                }
                return;
            }
            Next::Broken(class, msg) => {
                if recorded {
                    let _ = tx.send(Err(std::io::Error::other(msg))).await;
                    return;
                }
                let code = match class {
                    FailureClass::UpstreamTimeout | FailureClass::StreamTimeout => "stream_timeout",
                    _ => "upstream_dropped",
                };
                let event = Bytes::from(api.error_event(&ApiError::new(
                    502,
                    "server_error",
                    code,
                    msg.clone(),
                )));
                collected.extend_from_slice(&event);
                call.upstream_response = resp.upstream();
                call.end(
                    CallStatus::Failed,
                    200,
                    Some((class, msg.clone())),
                    collected.freeze(),
                )
                .await;
                // Tell the harness in its own format, let the event reach the
                // socket, then abort the body so that it cannot be mistaken
                // for a complete stream.
                if tx.send(Ok(event)).await.is_ok() {
                    let waited = Instant::now();
                    while tx.capacity() < tx.max_capacity()
                        && waited.elapsed() < Duration::from_secs(1)
                    {
                        tokio::time::sleep(Duration::from_millis(2)).await;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    let _ = tx.send(Err(std::io::Error::other(msg))).await;
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrite_model_keeps_other_bytes() {
        let body = br#"{"model":"a","temperature":1.0e0,"messages":[{"role":"user","content":"h\u00e9"}],"x":{"y":[1,2]}}"#;
        let out = rewrite_model(body, "b").unwrap();
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"model":"b","temperature":1.0e0,"messages":[{"role":"user","content":"h\u00e9"}],"x":{"y":[1,2]}}"#
        );
    }

    #[test]
    fn client_keys_are_not_forwarded_when_they_are_ours() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer secret".parse().unwrap());
        h.insert("x-api-key", "secret".parse().unwrap());
        h.insert("x-custom", "1".parse().unwrap());
        h.insert(header::HOST, "x".parse().unwrap());
        let out = upstream_headers(&h, true);
        assert!(out.get(header::AUTHORIZATION).is_none() && out.get("x-api-key").is_none());
        assert!(out.get(header::HOST).is_none());
        assert_eq!(out["x-custom"], "1");
        assert!(upstream_headers(&h, false)
            .get(header::AUTHORIZATION)
            .is_some());
    }
}
