//! The concurrency limit: `server.max_concurrent_calls` proxied calls at
//! once, each holding its slot until the last byte of its answer has gone
//! out (the slot travels with the body), and a bounded wait for a free one
//! (`server.queue_timeout_secs`), after which the call is answered 503 with
//! `Retry-After` (`overloaded`).

use super::holding::Holding;
use super::{ready, take, Dispatch, Kind};
use crate::dialect::ApiError;
use crate::http::{Held, ProxyBody};
use crate::server::{call, State};
use futures_util::future::{BoxFuture, Either};
use http::{Request, Response};
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The pool of call slots.
pub struct Slots {
    sem: Arc<Semaphore>,
    wait: Duration,
}

impl Slots {
    pub fn new(n: usize, wait: Duration) -> Self {
        Self {
            sem: Arc::new(Semaphore::new(n)),
            wait,
        }
    }

    /// A slot free now, without waiting (and without a timer).
    pub fn try_take(&self) -> Option<OwnedSemaphorePermit> {
        self.sem.clone().try_acquire_owned().ok()
    }

    /// A free slot, or `None` when none came free within the wait.
    pub async fn take(&self) -> Option<OwnedSemaphorePermit> {
        tokio::time::timeout(self.wait, self.sem.clone().acquire_owned())
            .await
            .ok()?
            .ok()
    }

    /// Slots free now.
    #[cfg(test)]
    pub fn free(&self) -> usize {
        self.sem.available_permits()
    }
}

/// The layer: one pool of slots shared by every connection.
#[derive(Clone)]
pub struct LimitLayer {
    state: Arc<State>,
    slots: Arc<Slots>,
}

impl LimitLayer {
    pub fn new(state: Arc<State>) -> Self {
        let s = &state.server;
        let slots = Slots::new(
            s.max_concurrent_calls,
            Duration::from_secs_f64(s.queue_timeout_secs),
        );
        Self {
            state,
            slots: Arc::new(slots),
        }
    }
}

impl<S> tower::Layer<S> for LimitLayer {
    type Service = Limit<S>;
    fn layer(&self, inner: S) -> Limit<S> {
        Limit {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct Limit<S> {
    inner: S,
    layer: LimitLayer,
}

impl<S, B, RB> tower::Service<Request<B>> for Limit<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    B: Send + 'static,
    RB: From<ProxyBody> + Send + 'static,
{
    type Response = Response<Held<RB, OwnedSemaphorePermit>>;
    type Error = Infallible;
    type Future = Either<
        Holding<S::Future, OwnedSemaphorePermit>,
        BoxFuture<'static, Result<Self::Response, Infallible>>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let is_call = req
            .extensions()
            .get::<Dispatch>()
            .is_some_and(|d| matches!(d.kind, Kind::Call));
        // Not a call, or a slot free now: the inner service is called at
        // once. Only a call that must wait for a slot takes a clone of it.
        let slot = match is_call {
            false => None,
            true => match self.layer.slots.try_take() {
                Some(slot) => Some(slot),
                None => return Either::Right(self.wait_for_slot(req)),
            },
        };
        Either::Left(Holding::new(self.inner.call(req), slot))
    }
}

impl<S> Limit<S> {
    /// A call that found no free slot: wait for one, up to
    /// `server.queue_timeout_secs`, then call the inner service, or answer
    /// 503 `overloaded`.
    fn wait_for_slot<B, RB>(
        &mut self,
        req: Request<B>,
    ) -> BoxFuture<'static, Result<Response<Held<RB, OwnedSemaphorePermit>>, Infallible>>
    where
        S: tower::Service<Request<B>, Response = Response<RB>, Error = Infallible>
            + Clone
            + Send
            + 'static,
        S::Future: Send,
        B: Send + 'static,
        RB: From<ProxyBody> + Send + 'static,
    {
        let mut inner = take(&mut self.inner);
        let layer = self.layer.clone();
        Box::pin(async move {
            let Some(slot) = layer.slots.take().await else {
                let d = req.extensions().get::<Dispatch>();
                let api = d.map_or(crate::dialect::WireApi::ChatCompletions, |d| d.api);
                let rollout = d.and_then(|d| d.rollout.as_deref());
                let err = ApiError::new(
                    503,
                    "server_error",
                    "overloaded",
                    format!(
                        "rollcall is handling server.max_concurrent_calls ({}) calls and none finished within server.queue_timeout_secs; retry later",
                        layer.state.server.max_concurrent_calls
                    ),
                );
                let resp = call::reject(&layer.state, api, rollout, &err).await;
                return Ok(resp.map(|b| Held::new(RB::from(b), None)));
            };
            Holding::new(inner.call(req), Some(slot)).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_slot_is_held_until_the_body_is_dropped() {
        let slots = Slots::new(1, Duration::from_millis(50));
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let body: Held<ProxyBody, _> = Held::new(ProxyBody::Stream(rx), slots.take().await);
        assert_eq!(slots.free(), 0);
        assert!(
            slots.take().await.is_none(),
            "no second slot while the stream lives"
        );
        tx.send(Ok(Bytes::from_static(b"x"))).await.unwrap();
        drop(tx);
        let got = body.collect().await.unwrap().to_bytes();
        assert_eq!(&got[..], b"x");
        assert_eq!(slots.free(), 1);
    }
}
