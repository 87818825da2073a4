//! In-flight counting: `rollcall_calls_in_flight` counts each proxied call
//! from its arrival to the last byte of its answer (the count travels with
//! the body).

use super::holding::Holding;
use super::{ready, Dispatch, Kind};
use crate::http::Held;
use http::{Request, Response};
use prometheus_client::metrics::gauge::Gauge;
use std::convert::Infallible;
use std::task::{Context, Poll};

/// One call counted in the gauge until it is dropped.
pub struct Counted(Gauge);

impl Counted {
    pub fn new(g: &Gauge) -> Self {
        g.inc();
        Self(g.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The layer, counting in `gauge`.
#[derive(Clone)]
pub struct InFlightLayer {
    gauge: Gauge,
}

impl InFlightLayer {
    pub fn new(gauge: Gauge) -> Self {
        Self { gauge }
    }
}

impl<S> tower::Layer<S> for InFlightLayer {
    type Service = InFlight<S>;
    fn layer(&self, inner: S) -> InFlight<S> {
        InFlight {
            inner,
            gauge: self.gauge.clone(),
        }
    }
}

#[derive(Clone)]
pub struct InFlight<S> {
    inner: S,
    gauge: Gauge,
}

impl<S, B, RB> tower::Service<Request<B>> for InFlight<S>
where
    S: tower::Service<Request<B>, Response = Response<RB>, Error = Infallible>,
    S: Clone + Send + 'static,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = Response<Held<RB, Counted>>;
    type Error = Infallible;
    type Future = Holding<S::Future, Counted>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let is_call = req
            .extensions()
            .get::<Dispatch>()
            .is_some_and(|d| matches!(d.kind, Kind::Call));
        let counted = is_call.then(|| Counted::new(&self.gauge));
        Holding::new(self.inner.call(req), counted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::ProxyBody;
    use tower::{Layer, Service, ServiceExt};

    #[tokio::test]
    async fn a_call_counts_until_its_body_is_dropped() {
        let gauge = Gauge::default();
        let inner = tower::service_fn(|_req: Request<()>| async {
            Ok::<_, Infallible>(Response::new(ProxyBody::full("x")))
        });
        let mut svc = InFlightLayer::new(gauge.clone()).layer(inner);
        let mut req = Request::new(());
        req.extensions_mut()
            .insert(super::super::classify::classify(
                &http::Method::POST,
                "/v1/chat/completions",
            ));
        let resp = svc.ready().await.unwrap().call(req).await.unwrap();
        assert_eq!(gauge.get(), 1, "counted while its body lives");
        drop(resp);
        assert_eq!(gauge.get(), 0);
        let mut req = Request::new(());
        req.extensions_mut()
            .insert(super::super::classify::classify(
                &http::Method::GET,
                "/healthz",
            ));
        let _resp = svc.ready().await.unwrap().call(req).await.unwrap();
        assert_eq!(gauge.get(), 0, "health checks are not calls");
    }
}
