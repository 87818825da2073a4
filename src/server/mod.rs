//! The HTTP server: the accept loop, graceful shutdown, and the tower stack
//! (`stack`) of layers (`layer`) around the router (`router`), which sends
//! each request to the proxy path (`call`) or to the endpoints beside it
//! (`admin`).
//!
//! Every connection's writes time out after twice
//! `server.client_idle_timeout_secs` without progress (a harness that stopped
//! reading a whole body; a stream's pump gives up on such a reader after
//! the idle timeout itself), and its request head after 30 s.
//!
//! The server is handed its parts already built (`app` composes them): its
//! own config sections, the routes, the recorder.

mod accept;
mod admin;
pub mod attempts;
pub mod budget;
pub mod call;
mod control;
pub mod feed;
mod jobs;
mod layer;
pub mod metrics;
pub mod pause;
mod router;
pub mod sequencer;
mod stack;
mod state;

pub use sequencer::Sequencer;
pub use state::State;

use crate::config::{OnWalError, RolloutConfig, ServerConfig};
use crate::record::{Recorder, RecorderTask};
use crate::upstream::RouteTable;
use hyper_util::rt::TokioTimer;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// What a server is built from.
pub struct Parts {
    pub server: ServerConfig,
    pub rollouts: RolloutConfig,
    pub on_wal_error: OnWalError,
    pub routes: RouteTable,
    pub recorder: Recorder,
    pub recorder_task: RecorderTask,
    /// Each rollout's next sequence number, from the shards on disk.
    pub next_sequence: HashMap<String, i64>,
    /// Accepted client keys, when keys are required.
    pub client_keys: Option<HashSet<String>>,
    /// Accepted admin keys; `None` refuses `/v1/admin/*`.
    pub admin_keys: Option<HashSet<String>>,
}

/// could not listen on {addr}: {source}
#[derive(Debug, thiserror::Error)]
#[error("could not listen on {addr}: {source}")]
pub struct ListenError {
    pub addr: SocketAddr,
    pub source: std::io::Error,
}

/// A running server.
pub struct Server {
    pub addr: SocketAddr,
    pub state: Arc<State>,
    listener: TcpListener,
    recorder_task: RecorderTask,
}

impl Server {
    /// Bind the listener.
    pub async fn bind(p: Parts) -> Result<Server, ListenError> {
        let addr = p.server.listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ListenError { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| ListenError { addr, source })?;
        let attempts = attempts::Attempts::new(
            Duration::try_from_secs_f64(p.rollouts.retry_window_secs).unwrap_or(Duration::ZERO),
        );
        let budgets = budget::Budgets::new(p.rollouts.budget);
        let gates = pause::Gates::new(p.routes.all().iter().map(|r| r.name.as_str()));
        let state = Arc::new(State {
            metrics: metrics::Metrics::new(p.recorder.stats.clone()),
            sequencer: Sequencer::new(p.next_sequence),
            server: p.server,
            rollouts: p.rollouts,
            on_wal_error: p.on_wal_error,
            routes: p.routes,
            recorder: p.recorder,
            client_keys: p.client_keys,
            admin_keys: p.admin_keys,
            attempts,
            budgets,
            gates,
            tasks: tokio_util::task::TaskTracker::new(),
            jobs: std::sync::OnceLock::new(),
            stopping: tokio_util::sync::CancellationToken::new(),
        });
        Ok(Server {
            addr,
            state,
            listener,
            recorder_task: p.recorder_task,
        })
    }

    /// Serve until `shutdown` resolves, then drain in-flight calls (up to
    /// `server.shutdown_grace_secs`) and publish every pending row.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()>) {
        let Server {
            state,
            listener,
            recorder_task,
            ..
        } = self;
        let service = stack::build(state.clone());
        // The backstop for whole bodies; a stream's pump gives up on a reader
        // that stopped reading first, at the idle timeout, and records why.
        let write_timeout = Duration::from_secs_f64(2.0 * state.server.client_idle_timeout_secs);
        // HTTP/1.1: what harnesses speak to an http:// base URL.
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .max_header_size(state.server.max_header_bytes)
            .max_buf_size(state.server.max_header_bytes.max(8192))
            // Head and body in one buffer and one write(2), not writev(2):
            // answers are mostly small, and in an interleaved A/B at 64 and
            // 256 connections (both sides flattened) the proxy spent 3-4 %
            // less CPU per call.
            .writev(false)
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(30));
        let grace = Duration::from_secs(state.server.shutdown_grace_secs);
        let l = accept::Loop {
            service,
            builder,
            write_timeout,
            stop: tokio_util::sync::CancellationToken::new(),
            grace,
            draining: tokio_util::task::TaskTracker::new(),
            done: tokio_util::sync::CancellationToken::new(),
        };
        let (stop, draining, done) = (l.stop.clone(), l.draining.clone(), l.done.clone());
        let loops = match l.start(listener, state.server.threads()) {
            Ok(loops) => loops,
            Err(e) => {
                tracing::error!(error = %e, "could not start the server's threads");
                recorder_task.shutdown().await;
                return;
            }
        };
        shutdown.await;
        stop.cancel();
        state.stopping.cancel();
        tracing::info!("shutting down: draining in-flight calls");
        let deadline = tokio::time::Instant::now() + grace;
        draining.close();
        let _ = tokio::time::timeout_at(deadline, draining.wait()).await;
        // Streams finish in their own tasks; give them the rest of the grace period.
        state.tasks.close();
        let _ = tokio::time::timeout_at(deadline, state.tasks.wait()).await;
        recorder_task.shutdown().await;
        done.cancel();
        let _ = tokio::task::spawn_blocking(move || {
            for l in loops {
                let _ = l.join();
            }
        })
        .await;
        tracing::info!("all rows published");
    }
}
