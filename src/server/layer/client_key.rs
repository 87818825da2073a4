//! Client keys: when `server.client_keys_env` names keys, every request
//! but `/healthz` and `/metrics` must present one (`Authorization: Bearer`
//! or `x-api-key`), or it is answered 401 in its API's format.

use super::{ready, Dispatch, Kind};
use crate::dialect::ApiError;
use crate::http::ProxyBody;
use crate::server::{call, State};
use futures_util::future::{BoxFuture, Either};
use http::{header, HeaderMap, Request, Response};
use std::collections::HashSet;
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

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

/// Whether a request with `headers` and `dispatch` may pass, given the
/// accepted `keys` (`None`: no keys are required).
pub fn admits(keys: Option<&HashSet<String>>, d: &Dispatch, headers: &HeaderMap) -> bool {
    match (keys, &d.kind) {
        // Control and the job API check their own (admin) keys.
        (None, _) | (_, Kind::Health | Kind::Malformed(_) | Kind::Control | Kind::Jobs) => true,
        (Some(keys), _) => client_key(headers).is_some_and(|k| keys.contains(k)),
    }
}

#[derive(Clone)]
pub struct ClientKeyLayer {
    state: Arc<State>,
}

impl ClientKeyLayer {
    pub fn new(state: Arc<State>) -> Self {
        Self { state }
    }
}

impl<S> tower::Layer<S> for ClientKeyLayer {
    type Service = ClientKey<S>;
    fn layer(&self, inner: S) -> ClientKey<S> {
        ClientKey {
            inner,
            state: self.state.clone(),
        }
    }
}

#[derive(Clone)]
pub struct ClientKey<S> {
    inner: S,
    state: Arc<State>,
}

impl<S, B> tower::Service<Request<B>> for ClientKey<S>
where
    S: tower::Service<Request<B>, Response = Response<ProxyBody>, Error = Infallible>,
    S: Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    /// The inner service's own future, or a refusal's.
    type Future = Either<S::Future, BoxFuture<'static, Result<Response<ProxyBody>, Infallible>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // Only a refused request's dispatch is copied, for its record.
        let refused = req
            .extensions()
            .get::<Dispatch>()
            .filter(|d| !admits(self.state.client_keys.as_ref(), d, req.headers()))
            .map(|d| (d.api, d.rollout.clone()));
        let Some((api, rollout)) = refused else {
            return Either::Left(self.inner.call(req));
        };
        let state = self.state.clone();
        Either::Right(Box::pin(async move {
            let err = ApiError::new(
                401,
                "authentication_error",
                "invalid_api_key",
                "missing or unknown client key: send one of the configured keys as `Authorization: Bearer <key>` or `x-api-key`",
            );
            Ok(call::reject(&state, api, rollout.as_deref(), &err).await)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::classify::classify;
    use super::*;
    use http::Method;

    #[test]
    fn keys_guard_everything_but_health() {
        let keys: HashSet<String> = ["k1".to_owned()].into();
        let mut h = HeaderMap::new();
        let call = classify(&Method::POST, "/v1/chat/completions");
        let health = classify(&Method::GET, "/healthz");
        assert!(admits(None, &call, &h));
        assert!(!admits(Some(&keys), &call, &h));
        assert!(admits(Some(&keys), &health, &h));
        h.insert(header::AUTHORIZATION, "Bearer k1".parse().unwrap());
        assert!(admits(Some(&keys), &call, &h));
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "k2".parse().unwrap());
        assert!(!admits(Some(&keys), &call, &h));
    }
}
