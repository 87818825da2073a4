//! The rollout tag: the rollout a proxied call is recorded under, from its
//! path (`/rollouts/<id>/v1/...`), else its `X-Rollout-Id` header, else
//! `rollouts.untagged` (record it under `rollouts.default_rollout`, or
//! refuse it). The id goes into the request's extensions as [`Rollout`].

use super::{ready, Dispatch, Kind};
use crate::config::{RolloutConfig, Untagged};
use crate::dialect::ApiError;
use crate::http::ProxyBody;
use crate::record::check_rollout_id;
use crate::server::{call, State};
use futures_util::future::{BoxFuture, Either};
use http::{HeaderMap, Request, Response};
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

/// The rollout a call is recorded under.
#[derive(Debug, Clone)]
pub struct Rollout(pub String);

/// The rollout of a call whose path names `path_rollout` (already checked).
pub fn resolve(
    cfg: &RolloutConfig,
    path_rollout: Option<&str>,
    headers: &HeaderMap,
) -> Result<String, ApiError> {
    if let Some(r) = path_rollout {
        return Ok(r.to_owned());
    }
    if let Some(h) = headers.get("x-rollout-id") {
        let id = h.to_str().unwrap_or("").to_owned();
        check_rollout_id(&id)?;
        return Ok(id);
    }
    match cfg.untagged {
        Untagged::Default => Ok(cfg.default_rollout.clone()),
        Untagged::Reject => Err(ApiError::new(
            400,
            "invalid_request_error",
            "missing_rollout_id",
            "this call names no rollout: use the base URL http://HOST:PORT/rollouts/<rollout_id>/v1 or send an X-Rollout-Id header",
        )),
    }
}

#[derive(Clone)]
pub struct RolloutLayer {
    state: Arc<State>,
}

impl RolloutLayer {
    pub fn new(state: Arc<State>) -> Self {
        Self { state }
    }
}

impl<S> tower::Layer<S> for RolloutLayer {
    type Service = Tag<S>;
    fn layer(&self, inner: S) -> Tag<S> {
        Tag {
            inner,
            state: self.state.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Tag<S> {
    inner: S,
    state: Arc<State>,
}

impl<S, B> tower::Service<Request<B>> for Tag<S>
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

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        let Some(d) = req
            .extensions()
            .get::<Dispatch>()
            .filter(|d| matches!(d.kind, Kind::Call))
        else {
            return Either::Left(self.inner.call(req));
        };
        let api = d.api;
        match resolve(&self.state.rollouts, d.rollout.as_deref(), req.headers()) {
            Ok(r) => {
                req.extensions_mut().insert(Rollout(r));
                Either::Left(self.inner.call(req))
            }
            Err(err) => {
                let state = self.state.clone();
                Either::Right(Box::pin(async move {
                    Ok(call::reject(&state, api, None, &err).await)
                }))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_then_header_then_the_untagged_policy() {
        let mut cfg = RolloutConfig::default();
        let mut h = HeaderMap::new();
        assert_eq!(resolve(&cfg, Some("p"), &h).unwrap(), "p");
        assert_eq!(resolve(&cfg, None, &h).unwrap(), "untagged");
        h.insert("x-rollout-id", "hdr".parse().unwrap());
        assert_eq!(resolve(&cfg, Some("p"), &h).unwrap(), "p");
        assert_eq!(resolve(&cfg, None, &h).unwrap(), "hdr");
        h.insert("x-rollout-id", "bad id".parse().unwrap());
        assert_eq!(
            resolve(&cfg, None, &h).unwrap_err().code,
            "invalid_rollout_id"
        );
        cfg.untagged = Untagged::Reject;
        assert_eq!(
            resolve(&cfg, None, &HeaderMap::new()).unwrap_err().code,
            "missing_rollout_id"
        );
    }
}
