//! The service stack, wired in one place: the layers of `layer`, outermost
//! first, around the router.

use super::layer::classify::ClassifyLayer;
use super::layer::client_key::ClientKeyLayer;
use super::layer::in_flight::InFlightLayer;
use super::layer::limit::LimitLayer;
use super::layer::rollout::RolloutLayer;
use super::router::Router;
use super::State;
use std::sync::Arc;
use tower::ServiceBuilder;

/// The whole stack for one server; cloned per connection.
pub fn build(
    state: Arc<State>,
) -> impl tower::Service<
    http::Request<hyper::body::Incoming>,
    Response = http::Response<
        impl http_body::Body<Data = bytes::Bytes, Error = std::io::Error> + Send + 'static,
    >,
    Error = std::convert::Infallible,
    Future = impl Send,
> + Clone
       + Send
       + 'static {
    ServiceBuilder::new()
        .layer(ClassifyLayer)
        .layer(LimitLayer::new(state.clone()))
        .layer(InFlightLayer::new(state.metrics.in_flight.clone()))
        .layer(ClientKeyLayer::new(state.clone()))
        .layer(RolloutLayer::new(state.clone()))
        .service(Router::new(state))
}
