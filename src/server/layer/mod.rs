//! The tower layers around the router, outermost first (wired in
//! `server::stack`):
//!
//! ```text
//! classify ─▶ limit ─▶ in_flight ─▶ client_key ─▶ rollout ─▶ router
//! (path →     (call    (gauge,      (401 unless   (the call's
//!  Dispatch)   slots)   per call)    a known key)  rollout id)
//! ```
//!
//! `classify` reads the path once and puts a [`Dispatch`] in the request's
//! extensions; each later layer acts on proxied calls only (or, for client
//! keys, on everything but `/healthz` and `/metrics`) and passes the rest
//! through. A layer that refuses a call answers it through
//! `call::reject`, which counts it and records it under its rollout when
//! the rollout is known.

pub mod classify;
pub mod client_key;
mod holding;
pub mod in_flight;
pub mod limit;
pub mod rollout;

pub use classify::{Dispatch, Kind};

use std::convert::Infallible;
use std::task::{Context, Poll};

/// The `poll_ready` of every layer: the router is always ready, and so is
/// each layer around it (limits are applied per call, in `call`).
pub(super) fn ready(_cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
    Poll::Ready(Ok(()))
}

/// Take the inner service for one call, leaving a clone in its place (the
/// tower idiom: the clone that was polled ready is the one that is called).
/// Only a layer that calls its inner service after an await needs it: every
/// service here is always ready, so the others call theirs in `call`. A
/// clone of the stack is an increment of the shared `State`'s count per
/// layer under it, on a cache line both serving threads write.
pub(super) fn take<S: Clone>(inner: &mut S) -> S {
    let clone = inner.clone();
    std::mem::replace(inner, clone)
}
