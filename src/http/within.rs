//! A timeout that costs nothing when the awaited future is ready at once.
//!
//! `tokio::time::timeout` reads the clock to set its deadline when it is
//! made, whether or not the future then waits. The pieces of a body mostly
//! are there already (a request's body came in with its head, a chunk fits
//! the harness's socket), so the clock is read only for one that waits.

use std::future::Future;
use std::task::Poll;
use std::time::Duration;
use tokio::time::error::Elapsed;

/// `fut`'s output, or `Elapsed` when it waited longer than `limit`; the
/// limit counts from its first wait.
pub async fn within<F: Future>(limit: Duration, fut: F) -> Result<F::Output, Elapsed> {
    let mut fut = std::pin::pin!(fut);
    if let Poll::Ready(out) = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await {
        return Ok(out);
    }
    tokio::time::timeout(limit, fut).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn ready_at_once_or_within_the_limit() {
        assert_eq!(within(Duration::ZERO, async { 7 }).await.ok(), Some(7));
        let slow = tokio::time::sleep(Duration::from_millis(50));
        assert!(within(Duration::from_millis(5), slow).await.is_err());
        let quick = async {
            tokio::task::yield_now().await;
            8
        };
        assert_eq!(within(Duration::from_secs(5), quick).await.ok(), Some(8));
    }
}
