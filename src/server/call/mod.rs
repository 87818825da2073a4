//! The proxy path of one call: prepare it, send it, pass the answer back as
//! it arrives (`whole` or `stream`), and record it (`record`). Every way it
//! can fail is one [`ProxyError`] or [`StreamError`] (`error`).
//!
//! The last bytes the harness receives (the whole body when not streaming,
//! the chunk that completes the terminal event when streaming) are released
//! only after the call's end is in the write-ahead log.

mod error;
mod prepare;
mod record;
mod resume;
mod stream;
mod whole;

pub use error::{ProxyError, StreamError};
pub use prepare::upstream_headers;
pub use record::error_response;

use super::{budget, State};
use crate::config::RouteKind;
use crate::dialect::{ApiError, WireApi};
use crate::http::ProxyBody;
use crate::record::{CallBegin, CallMeta};
use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use record::Call;
use std::sync::Arc;
use std::time::Instant;

/// Hop-by-hop headers of the upstream's answer.
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

/// The header in which an OpenAI SDK numbers its retries.
const SDK_RETRY: http::HeaderName = http::HeaderName::from_static("x-stainless-retry-count");

/// A new call's metadata: its id, and its place in its rollout.
fn meta(state: &State, api: WireApi, rollout: &str, user_agent: Option<String>) -> CallMeta {
    CallMeta {
        // Written into a buffer: `to_string` goes through a formatter.
        call_id: uuid::Uuid::now_v7()
            .hyphenated()
            .encode_lower(&mut uuid::Uuid::encode_buffer())
            .to_owned(),
        sequence: state.sequencer.take(rollout),
        rollout_id: rollout.to_owned(),
        wire_api: api,
        route: None,
        model: None,
        upstream_model: None,
        stream: false,
        received_at: crate::now_micros(),
        user_agent,
        upstream_api: None,
        attempt: 0,
        attempt_of: None,
        side_call: false,
    }
}

/// Proxy and record one call of `rollout`.
pub async fn proxy(
    state: Arc<State>,
    api: WireApi,
    rollout: &str,
    req: Request<Incoming>,
) -> Response<ProxyBody> {
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let user_agent = parts
        .headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let meta = meta(&state, api, rollout, user_agent);
    let mut p = match prepare::prepare(&state, api, meta, parts.uri.query(), body).await {
        Ok(p) => p,
        Err((begin, e)) => return Call::new(&state, api, begin, started).fail(e).await,
    };
    // An SDK's retry (or the same body again soon) is an attempt, not a turn.
    let sdk_retry = parts
        .headers
        .get(SDK_RETRY)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u32>().ok());
    let m = &mut p.begin.meta;
    let a = state
        .attempts
        .observe(rollout, m.sequence, &p.begin.request, sdk_retry);
    (m.attempt, m.attempt_of) = (a.attempt, a.attempt_of);
    let turn = m.attempt == 0 && !m.side_call;
    let (sequence, attempt_of) = (m.sequence, m.attempt_of);
    let request_len = p.begin.request.len();
    let translated = p.translated();
    let body = p.body();
    let mut call = Call::new(&state, api, p.begin, started);
    let ask = budget::Ask {
        request_len,
        call: attempt_of.unwrap_or(sequence),
        turn,
    };
    match state
        .budgets
        .check(rollout, parts.headers.get(budget::HEADER_NAME), ask)
    {
        Ok(charge) => call.charge_usage(charge),
        Err(budget::Refusal::Header(msg)) => {
            let err = ApiError::new(400, "invalid_request_error", "invalid_budget", msg);
            return call.fail(ProxyError::Refused(err)).await;
        }
        Err(budget::Refusal::Over(over)) => {
            return call.fail(ProxyError::BudgetExceeded { api, over }).await
        }
    }
    call.log_begin().await;
    let headers = upstream_headers(&parts.headers, state.client_keys.is_some());
    let gate = state.gates.get(&p.route.name).cloned();
    let max_wait = std::time::Duration::try_from_secs_f64(state.server.pause_max_wait_secs)
        .unwrap_or(std::time::Duration::ZERO);
    // Weight sync: wait while the route is paused; an `abort` pause cuts
    // the call upstream until the resume, and it goes again.
    let sent = loop {
        if let Some(g) = &gate {
            match g.open(max_wait).await {
                Ok(version) => call.sent_under(g, version),
                Err(held) => {
                    let mut resp = call.fail(ProxyError::Held(held.0)).await;
                    resp.headers_mut()
                        .insert(header::RETRY_AFTER, http::HeaderValue::from_static("5"));
                    return resp;
                }
            }
        }
        let send = p.route.send(
            Method::POST,
            &p.endpoint,
            &headers,
            body.clone(),
            translated,
            Some(rollout),
        );
        match &gate {
            Some(g) => tokio::select! {
                sent = send => break sent,
                () = g.aborted() => {
                    tracing::info!(route = %p.route.name, "call cut by an abort pause; it goes again after the resume");
                    call.cut();
                }
            },
            None => break send.await,
        }
    };
    let resp = match sent {
        Ok(s) => {
            call.set_lease(s.lease);
            s.resp
        }
        Err(e) => return call.fail(e.into()).await,
    };
    call.mark_first_byte();
    let status = resp.status();
    let mut out = Response::new(ProxyBody::Full(None));
    *out.status_mut() = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let kept = out.headers_mut();
    kept.reserve(resp.headers().len());
    for (k, v) in resp.headers() {
        if !DROP_RESPONSE.contains(&k.as_str()) {
            kept.append(k.clone(), v.clone());
        }
    }
    let is_sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("text/event-stream"));
    if !(is_sse && status.is_success()) {
        return whole::answer(call, &p.route, resp, translated, p.strip, out).await;
    }
    // The head goes out now, before the end: the start must be on disk.
    if let Err(e) = call.start_written().await {
        return call.fail(e).await;
    }
    let translate = translated.then_some(api);
    // An `abort` pause may cut this stream and continue it, where the
    // upstream can (`resume`).
    let continuable = p.target == WireApi::ChatCompletions
        && p.route.capture.is_some()
        && matches!(p.route.kind, RouteKind::Vllm | RouteKind::Sglang);
    let resume = gate.filter(|_| continuable).map(|gate| resume::Resume {
        gate,
        endpoint: p.endpoint.clone(),
        headers,
        body,
        translated,
        rollout: rollout.to_owned(),
        max_wait,
    });
    *out.body_mut() = stream::start(call, p.route, resp, translate, p.strip, resume);
    out
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
        .get_or_create(&super::metrics::ReasonLabel { reason: err.code })
        .inc();
    let Some(rollout) = rollout else {
        return error_response(api, err);
    };
    let begin = CallBegin {
        meta: meta(state, api, rollout, None),
        request: Bytes::new(),
        upstream_request: None,
        spans: None,
    };
    let mut resp = Call::new(state, api, begin, Instant::now())
        .fail(ProxyError::Refused(err.clone()))
        .await;
    if err.status == 503 {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, http::HeaderValue::from_static("1"));
    }
    resp
}
