//! The response body type: a whole buffer, or chunks forwarded from a task
//! as they arrive (an `Err` aborts the response mid-stream).

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

pub type Chunk = Result<Bytes, std::io::Error>;

pub enum ProxyBody {
    Full(Option<Bytes>),
    Stream(mpsc::Receiver<Chunk>),
    /// A stream whose task may cut it off: once the channel is drained and
    /// closed, a set `Abort` ends the body in an error, so that the client
    /// cannot mistake a cut stream for a complete one. The task never has
    /// to wait for channel space to say so. The error comes a moment
    /// ([`ABORT_GRACE`]) after the last chunk, so that the connection has
    /// flushed it: the last chunk is usually the error event that says why.
    Abortable(
        mpsc::Receiver<Chunk>,
        Abort,
        Option<Pin<Box<tokio::time::Sleep>>>,
    ),
}

/// How long a cut stream's last chunk has to reach the socket.
pub const ABORT_GRACE: std::time::Duration = std::time::Duration::from_millis(20);

/// The flag that cuts off an [`ProxyBody::Abortable`] stream.
#[derive(Clone, Default)]
pub struct Abort(Arc<AtomicBool>);

impl Abort {
    pub fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
    fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

impl ProxyBody {
    pub fn full(b: impl Into<Bytes>) -> Self {
        Self::Full(Some(b.into()))
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Self::Full(b) => Poll::Ready(
                b.take()
                    .filter(|b| !b.is_empty())
                    .map(|b| Ok(Frame::data(b))),
            ),
            Self::Stream(rx) => rx.poll_recv(cx).map(|c| c.map(|r| r.map(Frame::data))),
            Self::Abortable(rx, abort, grace) => match rx.poll_recv(cx) {
                Poll::Ready(None) if abort.is_set() => {
                    let sleep =
                        grace.get_or_insert_with(|| Box::pin(tokio::time::sleep(ABORT_GRACE)));
                    sleep
                        .as_mut()
                        .poll(cx)
                        .map(|()| Some(Err(std::io::Error::other("the stream was cut off"))))
                }
                other => other.map(|c| c.map(|r| r.map(Frame::data))),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self, Self::Full(b) if b.as_ref().is_none_or(|b| b.is_empty()))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Full(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
            Self::Stream(_) | Self::Abortable(..) => SizeHint::default(),
        }
    }
}

/// A body that holds `T` (a call slot, an in-flight count) until it is
/// dropped: when its last byte is written, or when the client goes away.
pub struct Held<B, T> {
    body: B,
    _held: Option<T>,
}

impl<B, T> Held<B, T> {
    pub fn new(body: B, held: Option<T>) -> Self {
        Self { body, _held: held }
    }
}

impl<B, T> From<ProxyBody> for Held<B, T>
where
    B: From<ProxyBody>,
{
    fn from(body: ProxyBody) -> Self {
        Self::new(B::from(body), None)
    }
}

impl<B: Body + Unpin, T: Unpin> Body for Held<B, T> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
