//! A handler that a module above the server mounts on one of its paths
//! (the job API on `/v1/jobs`), so that the server serves it without
//! importing it: the request with its body read whole, the response.

use super::body::ProxyBody;
use ::http::{Request, Response};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use std::sync::Arc;

/// A mounted handler.
pub type Handler =
    Arc<dyn Fn(Request<Bytes>) -> BoxFuture<'static, Response<ProxyBody>> + Send + Sync>;
