//! Shutdown signals.

/// SIGTERM or Ctrl-C. The handlers are installed when this is called, not
/// when the future is first polled, so that a signal that comes right after
/// a ready line (printed after this call) is never the default action,
/// which would kill the process without publishing its shards.
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let term = signal(SignalKind::terminate()).ok();
    let int = signal(SignalKind::interrupt()).ok();
    async move {
        let wait = |s: Option<tokio::signal::unix::Signal>| async move {
            match s {
                Some(mut s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = wait(int) => {},
            _ = wait(term) => {},
        }
    }
}
