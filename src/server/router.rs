//! The innermost service: each request to its handler, by the [`Dispatch`]
//! the `classify` layer gave it.
//!
//! ```text
//! GET  /healthz, /metrics, POST /v1/rollouts/<id>/finish,
//! GET  [/rollouts/<id>]/v1/models               ─▶ admin
//! *    /v1/admin/*                              ─▶ control
//! *    /v1/jobs[/...]                           ─▶ jobs (the mounted job API)
//! POST [/rollouts/<id>]/v1/chat/completions     ┐
//! POST [/rollouts/<id>]/v1/responses            │ call::proxy: proxied
//! POST [/rollouts/<id>]/v1/completions          │ and recorded
//! POST [/rollouts/<id>]/v1/messages             ┘
//! ```

use super::layer::rollout::Rollout;
use super::layer::{Dispatch, Kind};
use super::{admin, call, State};
use crate::dialect::{ApiError, WireApi};
use crate::http::ProxyBody;
use futures_util::future::BoxFuture;
use http::{Request, Response};
use hyper::body::Incoming;
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
    type Response = Response<ProxyBody>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<ProxyBody>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        // The route's future built straight into its box: it is several KB,
        // and each move is a copy of all of it.
        let state = self.state.clone();
        crate::http::pinned(move || route(state, req))
    }
}

async fn route(
    state: Arc<State>,
    mut req: Request<Incoming>,
) -> Result<Response<ProxyBody>, Infallible> {
    let Some(d) = req.extensions_mut().remove::<Dispatch>() else {
        let err = ApiError::new(
            500,
            "server_error",
            "internal",
            "the request was not classified",
        );
        return Ok(call::error_response(WireApi::ChatCompletions, &err));
    };
    Ok(match d.kind {
        Kind::Health | Kind::Admin => admin::handle(state, req).await,
        Kind::Control => super::control::handle(state, req).await,
        Kind::Jobs => super::jobs::handle(state, req).await,
        Kind::Malformed(err) => call::reject(&state, d.api, None, &err).await,
        Kind::Refused(api, err) => call::reject(&state, api, None, &err).await,
        Kind::Call => {
            let rollout = req.extensions_mut().remove::<Rollout>().map(|r| r.0);
            let rollout = rollout.unwrap_or_else(|| state.rollouts.default_rollout.clone());
            call::proxy(state, d.api, &rollout, req).await
        }
    })
}
