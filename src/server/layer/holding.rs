//! The response future of a layer that holds something for as long as its
//! call's answer lives (`in_flight`'s count, `limit`'s slot): the inner
//! service's future, whose response's body then carries what is held.
//!
//! It is a plain struct rather than a boxed async block, so a call through
//! the stack allocates nothing for these layers, and the router's future is
//! polled through them without a pointer hop each.

use crate::http::Held;
use http::Response;
use pin_project_lite::pin_project;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

pin_project! {
    /// `inner`'s response, with `held` moved into its body.
    pub struct Holding<F, T> {
        #[pin]
        inner: F,
        held: Option<T>,
    }
}

impl<F, T> Holding<F, T> {
    pub fn new(inner: F, held: Option<T>) -> Self {
        Self { inner, held }
    }
}

impl<F, RB, T> Future for Holding<F, T>
where
    F: Future<Output = Result<Response<RB>, Infallible>>,
{
    type Output = Result<Response<Held<RB, T>>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let resp = ready!(this.inner.poll(cx))?;
        let held = this.held.take();
        Poll::Ready(Ok(resp.map(|b| Held::new(b, held))))
    }
}
