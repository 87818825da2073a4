//! The proxy path of one call: tag it, forward it, pass the answer back as
//! it arrives, and record it.
//!
//! The last bytes the harness receives (the whole body when not streaming,
//! the chunk that completes the terminal event when streaming) are released
//! only after the call's end is in the write-ahead log.

use super::body::{Abort, Chunk, ProxyBody};
use super::metrics::{ApiLabel, CallLabels, ClassLabel, ReasonLabel};
use super::routes::error_response;
use super::State;
use crate::config::{OnWalError, Untagged};
use crate::dialect::capture::{self, Asked, CaptureKind, ChunkFate};
use crate::dialect::sse;
use crate::dialect::terminal::Detector;
use crate::dialect::translate::{self, StreamTranslator};
use crate::dialect::{ApiError, WireApi};
use crate::record::{CallBegin, CallMeta, CallOutcome, CallStatus, FailureClass};
use crate::redact::redacted;
use crate::upstream::{error_chain, BodyError, Route, UpstreamError};
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
///
/// A call ends exactly once. Every path through the proxy ends it
/// explicitly; when its future or task is dropped instead (the harness hung
/// up, or a bug unwound it), `Drop` records it as `client_disconnected` (or
/// `internal`) at once, so that no call stays open in the write-ahead log.
type BeginWritten = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<(), crate::record::RecordError>> + Send>,
>;

struct Call {
    state: Arc<State>,
    api: WireApi,
    begin: Arc<CallBegin>,
    started: Instant,
    first_byte_at: Option<i64>,
    began: bool,
    /// Resolves once its start is in the WAL (taken by `start_written`).
    begin_written: Option<BeginWritten>,
    /// Its end is queued for the WAL.
    ended: bool,
    /// The upstream's body, recorded beside the harness's when they differ.
    upstream_response: Option<Bytes>,
}

impl Call {
    fn new(state: &Arc<State>, api: WireApi, begin: CallBegin, started: Instant) -> Self {
        Self {
            state: state.clone(),
            api,
            begin: Arc::new(begin),
            started,
            first_byte_at: None,
            began: false,
            begin_written: None,
            ended: false,
            upstream_response: None,
        }
    }

    async fn log_begin(&mut self) {
        if !self.began {
            match self.state.recorder.begin(self.begin.clone()).await {
                Ok(written) => self.begin_written = Some(Box::pin(written)),
                Err(e) => tracing::error!(error = %e, "could not log call start"),
            }
            self.began = true;
        }
    }

    /// Wait until the call's start is in the WAL, so that a stream's head
    /// is never seen by a client for a call that has no record (a SIGKILL
    /// then leaves an `incomplete` row). Usually already done: the start
    /// was queued before the upstream was asked. Under
    /// `on_wal_error = "fail"`, a start the WAL could not take is the
    /// harness's 503 instead of the head.
    async fn start_written(&mut self) -> Result<(), ApiError> {
        self.log_begin().await;
        let Some(written) = self.begin_written.take() else {
            return Ok(());
        };
        let Err(e) = written.await else {
            return Ok(());
        };
        tracing::error!(error = %e, call_id = %self.begin.meta.call_id, "could not record the call's start");
        match self.state.config.shards.on_wal_error {
            OnWalError::Serve => Ok(()),
            OnWalError::Fail => Err(crate::record::unrecorded_error(&e)),
        }
    }

    fn count(&self, status: CallStatus, class: Option<FailureClass>) {
        let m = &self.state.metrics;
        let wire_api = self.api.as_str();
        m.calls
            .get_or_create(&CallLabels {
                wire_api,
                status: status.as_str(),
            })
            .inc();
        m.duration
            .get_or_create(&ApiLabel { wire_api })
            .observe(self.started.elapsed().as_secs_f64());
        if let Some(class) = class {
            m.errors
                .get_or_create(&ClassLabel {
                    class: class.as_str(),
                })
                .inc();
        }
    }

    fn outcome(
        &self,
        status: CallStatus,
        http_status: Option<u16>,
        failure: Option<(FailureClass, String)>,
    ) -> CallOutcome {
        let (failure_class, failure_message) =
            failure.map_or((None, None), |(c, m)| (Some(c), Some(redacted(&m))));
        CallOutcome {
            call_id: self.begin.meta.call_id.clone(),
            status,
            http_status,
            failure_class,
            failure_message,
            first_byte_at: self.first_byte_at,
            done_at: crate::now_micros(),
        }
    }

    /// Record the call's end; returns once it is in the WAL. When the WAL
    /// cannot take it and `shards.on_wal_error = "fail"`, returns the error
    /// the harness gets instead of its answer; the call is then recorded as
    /// that failure once the WAL takes writes again.
    async fn end(
        &mut self,
        status: CallStatus,
        http_status: u16,
        failure: Option<(FailureClass, String)>,
        response: Bytes,
    ) -> Result<(), ApiError> {
        self.log_begin().await;
        self.count(status, failure.as_ref().map(|f| f.0));
        if let Some((class, msg)) = &failure {
            tracing::info!(
                call_id = %self.begin.meta.call_id,
                rollout = %self.begin.meta.rollout_id,
                class = class.as_str(),
                "call failed: {msg}"
            );
        }
        let outcome = self.outcome(status, Some(http_status), failure);
        let upstream = self.upstream_response.take();
        let recorder = &self.state.recorder;
        let result = match recorder.submit_end(outcome, response, upstream).await {
            Ok(ack) => {
                self.ended = true;
                ack.await
            }
            Err(e) => {
                self.ended = true;
                Err(e)
            }
        };
        let Err(e) = result else {
            return Ok(());
        };
        self.state.metrics.unrecorded.inc();
        tracing::error!(error = %e, call_id = %self.begin.meta.call_id, "could not record the call's end");
        // The WAL writes the end again once the disk takes writes, as what
        // the harness got: the answer, or under "fail" this 503.
        match self.state.config.shards.on_wal_error {
            OnWalError::Serve => Ok(()),
            OnWalError::Fail => Err(crate::record::unrecorded_error(&e)),
        }
    }

    /// Answer with an error in the harness's API format, and record it.
    async fn fail(mut self, class: FailureClass, mut err: ApiError) -> Response<ProxyBody> {
        err.message = redacted(&err.message);
        let body = Bytes::from(self.api.error_body(&err));
        let msg = err.message.clone();
        if let Err(e) = self
            .end(
                CallStatus::Failed,
                err.status,
                Some((class, msg)),
                body.clone(),
            )
            .await
        {
            return error_response(self.api, &e);
        }
        super::routes::bytes_response(err.status, "application/json", body)
    }

    /// Record a stream the harness walked away from.
    async fn client_gone(&mut self, response: Bytes) {
        let msg = "the client disconnected before the stream ended".to_owned();
        let failure = Some((FailureClass::ClientDisconnected, msg));
        let _ = self.end(CallStatus::Failed, 200, failure, response).await;
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

impl Drop for Call {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (class, msg) = if std::thread::panicking() {
            (
                FailureClass::Internal,
                "the proxy failed while handling this call",
            )
        } else {
            (
                FailureClass::ClientDisconnected,
                "the client disconnected before the answer was ready",
            )
        };
        self.count(CallStatus::Failed, Some(class));
        let outcome = self.outcome(CallStatus::Failed, None, Some((class, msg.into())));
        let recorder = self.state.recorder.clone();
        let begin = (!self.began).then(|| self.begin.clone());
        let upstream = self.upstream_response.take();
        rt.spawn(async move {
            if let Some(b) = begin {
                // Queued ahead of the end; no need to wait for it.
                let _ = recorder.begin(b).await;
            }
            let _ = recorder.end(outcome, Bytes::new(), upstream).await;
        });
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
        Err(e) => return reject(&state, api, None, &e).await,
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
    let server = &state.config.server;
    let max = server.max_body_bytes;
    let client_idle = Duration::from_secs_f64(server.client_idle_timeout_secs);
    let bad = |meta: CallMeta, request: Bytes| {
        let begin = CallBegin {
            meta,
            request,
            upstream_request: None,
        };
        Call::new(&state, api, begin, started)
    };
    let request = match read_request(body, max, client_idle).await {
        Ok(b) => b,
        Err((class, err)) => return bad(meta, Bytes::new()).fail(class, err).await,
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
    let begin = CallBegin {
        meta,
        request: request.clone(),
        upstream_request: upstream_request.clone(),
    };
    let mut call = Call::new(&state, api, begin, started);
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
    let mut resp = match route.send(Method::POST, &endpoint, headers, body).await {
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
    let max_response = state.config.server.max_response_bytes;
    if is_sse && status.is_success() {
        // The head goes out now, before the end: the start must be on disk.
        if let Err(err) = call.start_written().await {
            return call.fail(FailureClass::Internal, err).await;
        }
        let (tx, rx) = mpsc::channel(64);
        let abort = Abort::default();
        *out.body_mut() = ProxyBody::Abortable(rx, abort.clone(), None);
        let stage = (translated || strip.is_some()).then(|| Stage {
            parser: sse::Parser::default(),
            translator: translated.then(|| StreamTranslator::new(api)),
            strip,
            upstream: BytesMut::new(),
            flushed: false,
        });
        let source = Source { resp, stage };
        let out_chan = Outlet {
            tx,
            abort,
            idle: client_idle,
        };
        tokio::spawn(pump(call, route, source, out_chan, in_flight));
        return out;
    }
    // A whole body: read it, record it, then release it.
    let body = match crate::upstream::read_body(&mut resp, max_response, route.idle_timeout).await {
        Ok(b) => b,
        Err(e) => {
            let (code, class) = match e {
                BodyError::Stalled(_) => (504, FailureClass::UpstreamTimeout),
                BodyError::TooLarge(_) => (502, FailureClass::ResponseTooLarge),
                BodyError::Dropped(_) => (502, FailureClass::UpstreamDropped),
            };
            let err = ApiError::new(code, "server_error", class.as_str(), e.to_string());
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
        if let Err(err) = call
            .end(CallStatus::Ok, status.as_u16(), None, body.clone())
            .await
        {
            return error_response(api, &err);
        }
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
    if let Err(err) = call
        .end(
            CallStatus::Failed,
            status.as_u16(),
            Some((class, msg)),
            body.clone(),
        )
        .await
    {
        return error_response(api, &err);
    }
    *out.body_mut() = ProxyBody::full(body);
    drop(in_flight);
    out
}

/// Read the harness's request body: at most `max` bytes, with no silence
/// longer than `idle` between two pieces.
async fn read_request(
    body: Incoming,
    max: usize,
    idle: Duration,
) -> Result<Bytes, (FailureClass, ApiError)> {
    let mut body = Limited::new(body, max);
    let mut buf = BytesMut::new();
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => {
                let msg = format!(
                    "the request body stalled for {idle:?} (server.client_idle_timeout_secs)"
                );
                let err = ApiError::new(408, "invalid_request_error", "request_timeout", msg);
                return Err((FailureClass::ClientTimeout, err));
            }
            Ok(None) => return Ok(buf.freeze()),
            Ok(Some(f)) => f,
        };
        match frame {
            Ok(f) => {
                if let Ok(d) = f.into_data() {
                    buf.extend_from_slice(&d);
                }
            }
            Err(e)
                if e.downcast_ref::<http_body_util::LengthLimitError>()
                    .is_some() =>
            {
                let err = ApiError::new(
                    413,
                    "invalid_request_error",
                    "body_too_large",
                    format!(
                        "request body exceeds the limit of {max} bytes (server.max_body_bytes)"
                    ),
                );
                return Err((FailureClass::BodyTooLarge, err));
            }
            Err(e) => {
                let msg = format!("could not read the request body: {e}");
                let err = ApiError::new(400, "invalid_request_error", "bad_body", msg);
                return Err((FailureClass::BadRequest, err));
            }
        }
    }
}

/// Answer a call that is refused before it is proxied (a bad client key,
/// rollout id or path; no free slot), counted in `rollcall_rejected_calls_total`
/// by reason, and recorded as a failed call when its rollout is known.
pub async fn reject(
    state: &Arc<State>,
    api: WireApi,
    rollout: Option<&str>,
    err: &ApiError,
) -> Response<ProxyBody> {
    state
        .metrics
        .rejected
        .get_or_create(&ReasonLabel { reason: err.code })
        .inc();
    let Some(rollout) = rollout else {
        return error_response(api, err);
    };
    let class = match err.status {
        401 | 403 => FailureClass::Unauthorized,
        503 => FailureClass::Overloaded,
        _ => FailureClass::BadRequest,
    };
    let meta = CallMeta {
        call_id: uuid::Uuid::now_v7().to_string(),
        sequence: state.sequencer.take(rollout),
        rollout_id: rollout.to_owned(),
        wire_api: api.as_str().into(),
        route: None,
        model: None,
        upstream_model: None,
        stream: false,
        received_at: crate::now_micros(),
        user_agent: None,
        upstream_api: None,
    };
    let begin = CallBegin {
        meta,
        request: Bytes::new(),
        upstream_request: None,
    };
    let mut resp = Call::new(state, api, begin, Instant::now())
        .fail(class, err.clone())
        .await;
    if err.status == 503 {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
    }
    resp
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
    if d.failed {
        let msg = "the upstream reported the response failed (response.failed)".to_owned();
        (
            CallStatus::Failed,
            Some((FailureClass::UpstreamFailed, msg)),
        )
    } else if d.incomplete {
        let msg = "the upstream reported the response incomplete (response.incomplete)".to_owned();
        (
            CallStatus::Failed,
            Some((FailureClass::UpstreamIncomplete, msg)),
        )
    } else if d.saw_error {
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

    /// How many of the upstream's bytes are held for the record.
    fn upstream_len(&self) -> usize {
        self.stage.as_ref().map_or(0, |t| t.upstream.len())
    }
}

/// Where a stream's chunks go: the harness's body, which the pump can cut
/// off, and how long the harness may take to accept the next chunk.
struct Outlet {
    tx: mpsc::Sender<Chunk>,
    abort: Abort,
    idle: Duration,
}

/// What sending a chunk to the harness came to.
enum Sent {
    Ok,
    /// The harness went away.
    Gone,
    /// The harness stopped reading for longer than the idle timeout.
    Stalled,
}

impl Outlet {
    async fn send(&self, chunk: Bytes) -> Sent {
        match tokio::time::timeout(self.idle, self.tx.send(Ok(chunk))).await {
            Ok(Ok(())) => Sent::Ok,
            Ok(Err(_)) => Sent::Gone,
            Err(_) => Sent::Stalled,
        }
    }

    /// Send `event` (an error in the harness's stream format) if the harness
    /// takes it in time, then cut the stream off, so that it cannot be
    /// mistaken for a complete one.
    async fn cut(self, event: Option<Bytes>) {
        self.abort.set();
        if let Some(e) = event {
            let _ = self.send(e).await;
        }
    }
}

/// Forward a stream chunk by chunk, collecting a copy for the record.
async fn pump(
    mut call: Call,
    route: Arc<Route>,
    mut resp: Source,
    out: Outlet,
    in_flight: InFlight,
) {
    let _in_flight = in_flight;
    let server = &call.state.config.server;
    let max_stream = Duration::from_secs(server.max_stream_secs);
    let max_bytes = server.max_response_bytes;
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
            _ = out.tx.closed() => Next::ClientGone,
        };
        let next = match next {
            Next::Chunk(c)
                if collected.len() + c.len() > max_bytes || resp.upstream_len() > max_bytes =>
            {
                let msg = format!(
                    "the upstream's stream exceeds {max_bytes} bytes (server.max_response_bytes)"
                );
                Next::Broken(FailureClass::ResponseTooLarge, msg)
            }
            next => next,
        };
        match next {
            Next::Chunk(chunk) => {
                if recorded {
                    // After the terminal event: the call is on disk.
                    match out.send(chunk).await {
                        Sent::Ok => continue,
                        Sent::Gone => return,
                        Sent::Stalled => return out.cut(None).await,
                    }
                }
                collected.extend_from_slice(&chunk);
                if detector.feed(&chunk) {
                    recorded = true;
                    call.upstream_response = resp.upstream();
                    if out.tx.is_closed() {
                        call.client_gone(collected.split().freeze()).await;
                        return;
                    }
                    let (status, failure) = stream_verdict(&detector, true);
                    if let Err(err) = call
                        .end(status, 200, failure, collected.split().freeze())
                        .await
                    {
                        // Not on disk: the terminal chunk is withheld.
                        let event = Bytes::from(api.error_event(&err));
                        return out.cut(Some(event)).await;
                    }
                }
                match out.send(chunk).await {
                    Sent::Ok => {}
                    Sent::Gone => {
                        if !recorded {
                            call.upstream_response = resp.upstream();
                            call.client_gone(collected.freeze()).await;
                        }
                        return;
                    }
                    Sent::Stalled => {
                        if !recorded {
                            let msg = format!(
                                "the client stopped reading the stream for {:?} (server.client_idle_timeout_secs)",
                                out.idle
                            );
                            call.upstream_response = resp.upstream();
                            let failure = Some((FailureClass::ClientTimeout, msg));
                            let _ = call
                                .end(CallStatus::Failed, 200, failure, collected.freeze())
                                .await;
                        }
                        return out.cut(None).await;
                    }
                }
            }
            Next::End => {
                if !recorded {
                    let (status, failure) = stream_verdict(&detector, false);
                    call.upstream_response = resp.upstream();
                    let _ = call.end(status, 200, failure, collected.freeze()).await;
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
                    return out.cut(None).await;
                }
                let code = match class {
                    FailureClass::UpstreamTimeout | FailureClass::StreamTimeout => "stream_timeout",
                    FailureClass::ResponseTooLarge => "response_too_large",
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
                let _ = call
                    .end(
                        CallStatus::Failed,
                        200,
                        Some((class, msg)),
                        collected.freeze(),
                    )
                    .await;
                // Tell the harness in its own format, then cut the body off.
                return out.cut(Some(event)).await;
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
