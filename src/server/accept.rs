//! The accept loops: `server.threads` threads, each with a single-threaded
//! runtime of its own, accept connections from the one listener and serve
//! each connection, and every call on it, on that thread.
//!
//! A call's work hops between tasks (the connection, the upstream
//! connection, the answer's body). On one multi-threaded runtime each hop
//! may wake another worker thread, and on a small or virtual machine those
//! wake-ups cost more than the call's own work: measured on the 2-core
//! bench machine, about 45 µs of the proxy's added latency at one
//! connection, and 7 µs of CPU per call under load. A thread per core, as
//! nginx runs a worker process per core, keeps each call on one thread; the
//! kernel spreads connections over the threads as they accept.

use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// What every accept loop needs; cloned into each thread.
#[derive(Clone)]
pub(super) struct Loop<S> {
    pub service: S,
    pub builder: hyper::server::conn::http1::Builder,
    pub write_timeout: Duration,
    /// Cancelled when the server stops accepting; each thread then drains
    /// its connections for up to `grace`.
    pub stop: CancellationToken,
    pub grace: Duration,
    /// Held by each thread until its connections are drained.
    pub draining: tokio_util::task::TaskTracker,
    /// Cancelled once every call is drained: the threads may end.
    pub done: CancellationToken,
}

impl<S, B> Loop<S>
where
    S: tower::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<B>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes, Error = std::io::Error> + Send + 'static,
{
    /// Start `threads` accept loops on `listener`.
    pub(super) fn start(
        self,
        listener: TcpListener,
        threads: usize,
    ) -> std::io::Result<Vec<std::thread::JoinHandle<()>>> {
        let listener = listener.into_std()?;
        let mut handles = Vec::with_capacity(threads);
        for i in 0..threads.max(1) {
            let listener = listener.try_clone()?;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let l = self.clone();
            let draining = l.draining.token();
            let handle = std::thread::Builder::new()
                .name(format!("rollcall-serve-{i}"))
                .spawn(move || {
                    rt.block_on(async move {
                        match TcpListener::from_std(listener) {
                            Ok(listener) => l.accept(listener).await,
                            Err(e) => tracing::error!(error = %e, "could not listen"),
                        }
                        drop(draining);
                        // Connections and streams still draining run on this
                        // runtime: it runs until the server says they are done.
                        l.done.cancelled().await;
                    })
                })?;
            handles.push(handle);
        }
        Ok(handles)
    }

    /// Accept and serve until `stop`, then drain this thread's connections.
    async fn accept(&self, listener: TcpListener) {
        let graceful = GracefulShutdown::new();
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = self.stop.cancelled() => break,
            };
            let stream = match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            // A harness that stops reading stalls our writes: bound them.
            let mut io = tokio_io_timeout::TimeoutStream::new(stream);
            io.set_write_timeout(Some(self.write_timeout));
            let io = TokioIo::new(Box::pin(io));
            let conn = self
                .builder
                .serve_connection(io, TowerToHyperService::new(self.service.clone()));
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
            });
        }
        drop(listener);
        if tokio::time::timeout(self.grace, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(
                "calls still in flight after the grace period; they will be replayed as incomplete"
            );
        }
    }
}
