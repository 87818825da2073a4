//! Futures boxed where they are built.
//!
//! `Box::pin(make())` builds the value on the stack and then copies all of
//! it into the box. An async fn's future is as large as the most it holds
//! at any await, several KB for a call, and copying it was most of the
//! 25-30 KB that a proxied call moved with `memcpy` (a uprobe on `memmove`
//! with its callers, at 8 connections). Allocating first lets the compiler
//! build the value in the box.

use std::pin::Pin;

/// `make()` in a box allocated before it is built.
pub fn pinned<T>(make: impl FnOnce() -> T) -> Pin<Box<T>> {
    Box::into_pin(Box::write(Box::new_uninit(), make()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pinned_future_runs() {
        let n = 41;
        assert_eq!(pinned(|| async move { n + 1 }).await, 42);
    }
}
