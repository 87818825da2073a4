//! Call slots: `server.max_concurrent_calls` calls at once, each holding
//! its slot until the last byte of its answer has gone out (a stream's slot
//! travels with its body), and a bounded wait for a free one.

use crate::http::ProxyBody;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use std::pin::Pin;
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

    /// A free slot, or `None` when none came free within the wait.
    pub async fn take(&self) -> Option<OwnedSemaphorePermit> {
        tokio::time::timeout(self.wait, self.sem.clone().acquire_owned())
            .await
            .ok()?
            .ok()
    }

    /// Slots free now.
    pub fn free(&self) -> usize {
        self.sem.available_permits()
    }
}

/// A response body that holds its call's slot until it is dropped: when its
/// last byte is written, or when the client goes away.
pub struct Slotted {
    body: ProxyBody,
    _slot: Option<OwnedSemaphorePermit>,
}

impl Slotted {
    pub fn new(body: ProxyBody, slot: Option<OwnedSemaphorePermit>) -> Self {
        Self { body, _slot: slot }
    }
}

impl From<ProxyBody> for Slotted {
    fn from(body: ProxyBody) -> Self {
        Self::new(body, None)
    }
}

impl Body for Slotted {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn a_slot_is_held_until_the_body_is_dropped() {
        let slots = Slots::new(1, Duration::from_millis(50));
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let body = Slotted::new(ProxyBody::Stream(rx), slots.take().await);
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
