//! The HTTP server: accept loop, graceful shutdown, and the tower stack
//! around the router.
//!
//! The router (`routes::Router`) dispatches to the proxy path (`call`),
//! each call in a slot of `server.max_concurrent_calls` held until its last
//! byte (`slots`), and to the rollout finish endpoint, `/v1/models`,
//! `/healthz` and `/metrics`. Every connection's writes time out after twice
//! `server.client_idle_timeout_secs` without progress (a harness that stopped
//! reading a whole body; a stream's pump gives up on such a reader after
//! the idle timeout itself), and its request head after 30 s.

pub mod call;
pub mod metrics;
pub mod routes;
pub mod slots;

use crate::config::Config;
use crate::record::{Recorder, RecorderTask};
use crate::upstream::RouteTable;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

/// Per-rollout sequence numbers, in arrival order.
///
/// A finished rollout leaves the live map for a bounded map of finished
/// ones (the oldest evicted first), so that memory follows the rollouts in
/// progress, while a late call of a recently finished rollout still
/// continues its numbering.
pub struct Sequencer {
    inner: Mutex<Seqs>,
}

#[derive(Default)]
struct Seqs {
    live: HashMap<String, i64>,
    /// Finished rollouts: next number, and the finish's generation.
    finished: HashMap<String, (i64, u64)>,
    /// Finishes, oldest first, for eviction; an entry whose generation is
    /// no longer the rollout's (it was revived and finished again) is stale.
    order: VecDeque<(String, u64)>,
    generation: u64,
    keep: usize,
}

/// Finished rollouts whose next sequence number is remembered.
pub const FINISHED_KEPT: usize = 65_536;

impl Sequencer {
    /// Start from the numbering recovered from the shards: those rollouts
    /// count as finished (they are kept whatever their number).
    pub fn new(start: HashMap<String, i64>) -> Self {
        Self::with_capacity(start, FINISHED_KEPT)
    }

    pub fn with_capacity(start: HashMap<String, i64>, keep: usize) -> Self {
        let order = start.keys().map(|k| (k.clone(), 0)).collect();
        let keep = keep.max(start.len());
        let finished = start.into_iter().map(|(k, n)| (k, (n, 0))).collect();
        Self {
            inner: Mutex::new(Seqs {
                live: HashMap::new(),
                finished,
                order,
                generation: 1,
                keep,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seqs> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Take the next sequence number of `rollout`.
    pub fn take(&self, rollout: &str) -> i64 {
        let mut s = self.lock();
        if let Some(n) = s.live.get_mut(rollout) {
            *n += 1;
            return *n - 1;
        }
        let n = s.finished.remove(rollout).map_or(0, |(n, _)| n);
        s.live.insert(rollout.to_owned(), n + 1);
        n
    }

    /// Calls sequenced so far for `rollout`.
    pub fn count(&self, rollout: &str) -> i64 {
        let s = self.lock();
        s.live
            .get(rollout)
            .copied()
            .or_else(|| s.finished.get(rollout).map(|f| f.0))
            .unwrap_or(0)
    }

    /// The rollout finished: move it out of the live map. Returns its count.
    pub fn finish(&self, rollout: &str) -> i64 {
        let mut s = self.lock();
        let Some(n) = s.live.remove(rollout) else {
            return s.finished.get(rollout).map_or(0, |f| f.0);
        };
        s.generation += 1;
        let g = s.generation;
        s.finished.insert(rollout.to_owned(), (n, g));
        s.order.push_back((rollout.to_owned(), g));
        while s.finished.len() > s.keep || s.order.len() > 2 * s.keep {
            let Some((old, g)) = s.order.pop_front() else {
                break;
            };
            if s.finished.get(&old).is_some_and(|f| f.1 == g) {
                s.finished.remove(&old);
            }
        }
        n
    }

    /// Rollouts held: (in progress, finished).
    pub fn sizes(&self) -> (usize, usize) {
        let s = self.lock();
        (s.live.len(), s.finished.len())
    }
}

/// Everything a request handler needs.
pub struct State {
    pub config: Config,
    pub routes: RouteTable,
    pub recorder: Recorder,
    pub sequencer: Sequencer,
    pub metrics: metrics::Metrics,
    /// Accepted client keys, when keys are required.
    pub client_keys: Option<HashSet<String>>,
    /// Call slots (`server.max_concurrent_calls`).
    pub slots: slots::Slots,
}

/// Errors that stop the server from starting.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// {0}
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// could not start recording: {0}
    #[error("could not start recording: {0}")]
    Record(#[from] crate::record::RecordError),
    /// the embedded model did not start: {0}
    #[error("the embedded model did not start: {0}")]
    Model(#[from] crate::model::ModelError),
    /// could not listen on {addr}: {source}
    #[error("could not listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A running server.
pub struct Server {
    pub addr: SocketAddr,
    pub state: Arc<State>,
    listener: TcpListener,
    recorder_task: RecorderTask,
}

impl Server {
    /// Validate the config, replay the WAL, bind the listener.
    pub async fn bind(mut config: Config) -> Result<Server, ServeError> {
        config.validate()?;
        for route in &mut config.routes {
            if route.kind == crate::config::RouteKind::Embedded {
                crate::model::start_route(route).await?;
            }
        }
        let routes = RouteTable::from_config(&config)?;
        let client_keys = match &config.server.client_keys_env {
            Some(var) => {
                let v = std::env::var(var).map_err(|_| {
                    crate::config::ConfigError::Invalid(format!(
                        "server.client_keys_env: {var} is not set"
                    ))
                })?;
                let keys: HashSet<String> = v
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect();
                for k in &keys {
                    crate::redact::register_secret(k);
                }
                Some(keys)
            }
            None => None,
        };
        let (recorder, recorder_task, recovered) = Recorder::start(&config.shards)?;
        if recovered.replayed_calls > 0 {
            tracing::info!(
                replayed = recovered.replayed_calls,
                incomplete = recovered.incomplete_calls,
                "recovered calls from the write-ahead log"
            );
        }
        let addr = config.server.listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Listen { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| ServeError::Listen { addr, source })?;
        let slots = slots::Slots::new(
            config.server.max_concurrent_calls,
            Duration::from_secs_f64(config.server.queue_timeout_secs),
        );
        let state = Arc::new(State {
            slots,
            metrics: metrics::Metrics::new(recorder.stats.clone()),
            sequencer: Sequencer::new(recovered.next_sequence),
            config,
            routes,
            recorder,
            client_keys,
        });
        Ok(Server {
            addr,
            state,
            listener,
            recorder_task,
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
        let service = routes::Router::new(state.clone());
        // The backstop for whole bodies; a stream's pump gives up on a reader
        // that stopped reading first, at the idle timeout, and records why.
        let write_timeout =
            Duration::from_secs_f64(2.0 * state.config.server.client_idle_timeout_secs);
        // HTTP/1.1: what harnesses speak to an http:// base URL.
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .max_header_size(state.config.server.max_header_bytes)
            .max_buf_size(state.config.server.max_header_bytes.max(8192))
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_secs(30));
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let (stream, _) = match accepted {
                        Ok(s) => s,
                        Err(e) => {
                            tracing::warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    };
                    let _ = stream.set_nodelay(true);
                    // A harness that stops reading stalls our writes: bound them.
                    let mut io = tokio_io_timeout::TimeoutStream::new(stream);
                    io.set_write_timeout(Some(write_timeout));
                    let io = TokioIo::new(Box::pin(io));
                    let conn = builder.serve_connection(io, TowerToHyperService::new(service.clone()));
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move {
                        if let Err(e) = conn.await {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                    });
                }
                _ = &mut shutdown => break,
            }
        }
        drop(listener);
        tracing::info!("shutting down: draining in-flight calls");
        let grace = Duration::from_secs(state.config.server.shutdown_grace_secs);
        if tokio::time::timeout(grace, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(
                "calls still in flight after the grace period; they will be replayed as incomplete"
            );
        }
        // Streams finish in their own tasks; give them the rest of the grace period.
        let deadline = tokio::time::Instant::now() + grace;
        while state.metrics.in_flight.get() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        recorder_task.shutdown().await;
        tracing::info!("all rows published");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finished_rollouts_leave_the_live_map_and_keep_their_numbering() {
        let s = Sequencer::with_capacity(HashMap::from([("old".to_owned(), 7)]), 2);
        assert_eq!(s.take("old"), 7, "numbering continues from the shards");
        assert_eq!((s.take("a"), s.take("a"), s.take("b")), (0, 1, 0));
        assert_eq!(s.finish("a"), 2);
        assert_eq!(s.sizes(), (2, 1));
        // A late call of a finished rollout continues its numbering.
        assert_eq!(s.take("a"), 2);
        assert_eq!(s.finish("a"), 3);
        for r in ["b", "old"] {
            s.finish(r);
        }
        // Only `keep` finished rollouts are remembered, the oldest go first.
        assert_eq!(s.sizes(), (0, 2));
        assert_eq!(s.count("a"), 0, "the oldest finish was evicted");
        assert_eq!(s.count("old"), 8);
        for i in 0..1000 {
            let r = format!("r{i}");
            s.take(&r);
            s.finish(&r);
        }
        let (live, finished) = s.sizes();
        assert_eq!((live, finished), (0, 2));
        assert!(s.inner.lock().unwrap().order.len() <= 4);
    }
}
