//! The router: a tower `Service` that dispatches each request by path.
//!
//! ```text
//! GET  /healthz                              200 when recording works, else 503 and why
//! GET  /metrics                              Prometheus text
//! POST /v1/rollouts/<id>/finish              a rollout's outcome
//! GET  [/rollouts/<id>]/v1/models            forwarded to the default route
//! POST [/rollouts/<id>]/v1/chat/completions  ┐
//! POST [/rollouts/<id>]/v1/responses         │ proxied and recorded (`call`),
//! POST [/rollouts/<id>]/v1/completions       │ each in a call slot (`slots`)
//! POST [/rollouts/<id>]/v1/messages          ┘
//! ```

use super::slots::Slotted;
use super::{call, State};
use crate::dialect::{ApiError, WireApi};
use crate::http::{bytes_response, json_response, ProxyBody};
use crate::record::RolloutFinish;
use bytes::Bytes;
use futures_util::future::BoxFuture;
use http::{header, HeaderMap, Method, Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde::Deserialize;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

#[derive(Clone)]
pub struct Router {
    state: Arc<State>,
}

impl Router {
    pub fn new(state: Arc<State>) -> Self {
        Self { state }
    }
}

impl tower::Service<Request<Incoming>> for Router {
    type Response = Response<Slotted>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let state = self.state.clone();
        Box::pin(async move { Ok(route(state, req).await) })
    }
}

/// The largest `/v1/models` answer passed on.
const MAX_MODELS_BYTES: usize = 4 << 20;

/// Route a request; proxied calls run in a call slot held until the last
/// byte of their answer.
async fn route(state: Arc<State>, req: Request<Incoming>) -> Response<Slotted> {
    match dispatch(&state, &req) {
        Dispatch::Admin => admin(state, req).await.map(Slotted::from),
        Dispatch::Reject(api, rollout, err) => call::reject(&state, api, rollout.as_deref(), &err)
            .await
            .map(Slotted::from),
        Dispatch::Proxy(api, rollout) => {
            let Some(slot) = state.slots.take().await else {
                let err = ApiError::new(
                    503,
                    "server_error",
                    "overloaded",
                    format!(
                        "rollcall is handling server.max_concurrent_calls ({}) calls and none finished within server.queue_timeout_secs; retry later",
                        state.config.server.max_concurrent_calls
                    ),
                );
                return call::reject(&state, api, rollout.as_deref(), &err)
                    .await
                    .map(Slotted::from);
            };
            call::proxy(state, api, rollout, req)
                .await
                .map(|b| Slotted::new(b, Some(slot)))
        }
    }
}

/// An error in the given API's format.
pub fn error_response(api: WireApi, err: &ApiError) -> Response<ProxyBody> {
    bytes_response(err.status, "application/json", api.error_body(err))
}

/// The client's key, from `Authorization: Bearer` or `x-api-key`.
pub fn client_key(h: &HeaderMap) -> Option<&str> {
    h.get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .or_else(|| h.get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim)
}

/// Rollout ids: 1–200 characters of letters, digits and `._:-@+=`.
pub fn check_rollout_id(id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty()
        && id.len() <= 200
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-@+=".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ApiError::new(
            400,
            "invalid_request_error",
            "invalid_rollout_id",
            format!(
                "invalid rollout id {id:?}: use 1-200 characters of letters, digits and ._:-@+="
            ),
        ))
    }
}

fn not_found(path: &str) -> ApiError {
    ApiError::new(
        404,
        "invalid_request_error",
        "unknown_url",
        format!("rollcall does not serve {path}; endpoints are /v1/chat/completions, /v1/responses, /v1/completions, /v1/messages and /v1/models, optionally under /rollouts/<id>"),
    )
}

/// What a request is, decided from its head alone.
enum Dispatch {
    /// Health, metrics, finish, models: handled by [`admin`].
    Admin,
    /// A call to proxy, with the rollout its path names.
    Proxy(WireApi, Option<String>),
    /// A call refused before it is proxied.
    Reject(WireApi, Option<String>, ApiError),
}

fn dispatch(state: &State, req: &Request<Incoming>) -> Dispatch {
    let path = req.uri().path();
    let method = req.method();
    let chat = WireApi::ChatCompletions;
    if matches!(path, "/healthz" | "/metrics") && method == Method::GET {
        return Dispatch::Admin;
    }
    // The rollout a path names, when it is well-formed: a refused call is
    // recorded under it.
    let (rollout, rest) = match path.strip_prefix("/rollouts/") {
        Some(r) => match r.split_once('/') {
            Some((id, rest)) => (Some(id), rest),
            None => return Dispatch::Reject(chat, None, not_found(path)),
        },
        None => (None, path.strip_prefix('/').unwrap_or(path)),
    };
    let endpoint = rest.strip_prefix("v1").unwrap_or(rest);
    let api = WireApi::from_endpoint(endpoint).unwrap_or(chat);
    let known = rollout.filter(|id| check_rollout_id(id).is_ok());
    let owned = known.map(str::to_owned);
    if let Some(keys) = &state.client_keys {
        if !client_key(req.headers()).is_some_and(|k| keys.contains(k)) {
            let err = ApiError::new(
                401,
                "authentication_error",
                "invalid_api_key",
                "missing or unknown client key: send one of the configured keys as `Authorization: Bearer <key>` or `x-api-key`",
            );
            // Only calls to a wire API are recorded.
            let owned = owned.filter(|_| WireApi::from_endpoint(endpoint).is_some());
            return Dispatch::Reject(api, owned, err);
        }
    }
    if path.starts_with("/v1/rollouts/") && path.ends_with("/finish") {
        return Dispatch::Admin;
    }
    if let (Some(id), None) = (rollout, known) {
        let err = check_rollout_id(id)
            .err()
            .unwrap_or_else(|| not_found(path));
        return Dispatch::Reject(chat, None, err);
    }
    if rest == "v1/models" {
        return Dispatch::Admin;
    }
    match WireApi::from_endpoint(endpoint) {
        Some(api) if method == Method::POST => Dispatch::Proxy(api, owned),
        Some(api) => Dispatch::Reject(
            api,
            None,
            ApiError::new(
                405,
                "invalid_request_error",
                "method_not_allowed",
                format!("{endpoint} takes POST"),
            ),
        ),
        None => Dispatch::Reject(chat, None, not_found(path)),
    }
}

/// The endpoints beside the proxy path.
async fn admin(state: Arc<State>, req: Request<Incoming>) -> Response<ProxyBody> {
    let path = req.uri().path().to_owned();
    let chat = WireApi::ChatCompletions;
    match path.as_str() {
        "/healthz" => {
            let lag = state.recorder.unpublished_rows();
            return match state.recorder.stats.unhealthy() {
                None => json_response(200, &json!({"status": "ok", "shard_lag_rows": lag})),
                Some(reason) => json_response(
                    503,
                    &json!({"status": "unhealthy", "reason": reason, "shard_lag_rows": lag}),
                ),
            };
        }
        "/metrics" => {
            return bytes_response(
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                state.metrics.render(),
            );
        }
        _ => {}
    }
    if let Some(id) = path
        .strip_prefix("/v1/rollouts/")
        .and_then(|r| r.strip_suffix("/finish"))
    {
        if req.method() != Method::POST {
            return error_response(
                chat,
                &ApiError::new(
                    405,
                    "invalid_request_error",
                    "method_not_allowed",
                    "use POST",
                ),
            );
        }
        let id = id.to_owned();
        return finish(&state, &id, req).await;
    }
    models(&state, req).await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FinishBody {
    status: String,
    reward: Option<f64>,
    metadata: Option<Value>,
}

async fn finish(state: &State, id: &str, req: Request<Incoming>) -> Response<ProxyBody> {
    let chat = WireApi::ChatCompletions;
    if let Err(e) = check_rollout_id(id) {
        return error_response(chat, &e);
    }
    let body = match Limited::new(req.into_body(), 1 << 20).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => {
            let err = ApiError::new(
                400,
                "invalid_request_error",
                "bad_body",
                format!("could not read the body: {e}"),
            );
            return error_response(chat, &err);
        }
    };
    let parsed: FinishBody = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            let err = ApiError::new(
                400,
                "invalid_request_error",
                "invalid_finish",
                format!("finish body must be JSON {{\"status\": string, \"reward\"?: number, \"metadata\"?: any}}: {e}"),
            );
            return error_response(chat, &err);
        }
    };
    if parsed.reward.is_some_and(|r| !r.is_finite()) {
        let err = ApiError::new(
            400,
            "invalid_request_error",
            "invalid_finish",
            "reward must be a finite number",
        );
        return error_response(chat, &err);
    }
    let calls = state.sequencer.finish(id);
    let fin = RolloutFinish {
        record_id: uuid::Uuid::now_v7().to_string(),
        rollout_id: id.to_owned(),
        status: parsed.status,
        reward: parsed.reward,
        metadata: parsed.metadata.map(|m| m.to_string()),
        finished_at: crate::now_micros(),
        calls,
    };
    let record_id = fin.record_id.clone();
    match state.recorder.finish(fin).await {
        Ok(()) => json_response(
            200,
            &json!({"rollout_id": id, "record_id": record_id, "calls": calls}),
        ),
        Err(e) => error_response(
            chat,
            &ApiError::new(503, "server_error", "recorder_unavailable", e.to_string()),
        ),
    }
}

/// Forward `GET /v1/models` to the default route; if it fails, list the
/// models named in the configuration.
async fn models(state: &State, req: Request<Incoming>) -> Response<ProxyBody> {
    let chat = WireApi::ChatCompletions;
    let headers = call::upstream_headers(req.headers(), state.client_keys.is_some());
    let upstream_err = match state.routes.default_route() {
        Some(route) => match route
            .send(Method::GET, "/models", headers, Bytes::new())
            .await
        {
            Ok(mut resp) if resp.status().is_success() => {
                let ct = resp
                    .headers()
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("application/json")
                    .to_owned();
                let read =
                    crate::upstream::read_body(&mut resp, MAX_MODELS_BYTES, route.idle_timeout);
                match read.await {
                    Ok(b) => return bytes_response(200, &ct, b),
                    Err(e) => e.to_string(),
                }
            }
            Ok(resp) => format!("upstream answered {}", resp.status()),
            Err(e) => e.to_string(),
        },
        None => "no default route".into(),
    };
    let data: Vec<Value> = state
        .routes
        .all()
        .iter()
        .flat_map(|r| {
            r.listed_models()
                .map(|m| json!({"id": m, "object": "model", "owned_by": r.name}))
                .collect::<Vec<_>>()
        })
        .collect();
    if data.is_empty() {
        let err = ApiError::new(
            502,
            "server_error",
            "upstream_unavailable",
            format!("could not list models: {upstream_err}"),
        );
        return error_response(chat, &err);
    }
    json_response(200, &json!({"object": "list", "data": data}))
}
