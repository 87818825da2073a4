//! The HTTP server: accept loop, graceful shutdown, and the tower stack
//! around the router.
//!
//! Layers, outermost first: a concurrency limit (`server.max_concurrent_calls`)
//! and the router (`routes::Router`), which dispatches to the proxy path
//! (`call`), the rollout finish endpoint, `/v1/models`, `/healthz` and
//! `/metrics`.

pub mod body;
pub mod call;
pub mod metrics;
pub mod routes;

use crate::config::Config;
use crate::record::{Recorder, RecorderTask};
use crate::upstream::RouteTable;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

/// Per-rollout sequence numbers, in arrival order.
#[derive(Default)]
pub struct Sequencer {
    next: Mutex<HashMap<String, i64>>,
}

impl Sequencer {
    pub fn new(start: HashMap<String, i64>) -> Self {
        Self {
            next: Mutex::new(start),
        }
    }

    /// Take the next sequence number of `rollout`.
    pub fn take(&self, rollout: &str) -> i64 {
        let mut m = self.next.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(rollout) {
            *n += 1;
            return *n - 1;
        }
        m.insert(rollout.to_owned(), 1);
        0
    }

    /// Calls sequenced so far for `rollout`.
    pub fn count(&self, rollout: &str) -> i64 {
        let m = self.next.lock().unwrap_or_else(|p| p.into_inner());
        m.get(rollout).copied().unwrap_or(0)
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
                Some(
                    v.split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect(),
                )
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
        let state = Arc::new(State {
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
        let service = tower::ServiceBuilder::new()
            .concurrency_limit(state.config.server.max_concurrent_calls)
            .service(routes::Router::new(state.clone()));
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
                    let conn = builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(service.clone()));
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

/// Serve `handler` on `addr` (HTTP/1 and HTTP/2) until the process ends,
/// for the model servers that run beside the proxy: the scripted upstream
/// and the embedded model. Returns the bound address and the accept loop.
pub async fn serve_plain<F, Fut>(
    addr: SocketAddr,
    handler: F,
) -> std::io::Result<(SocketAddr, impl std::future::Future<Output = ()>)>
where
    F: Fn(http::Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = http::Response<body::ProxyBody>> + Send + 'static,
{
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let fut = async move {
        let builder =
            hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let handler = handler.clone();
            let svc = hyper::service::service_fn(move |req| {
                let fut = handler(req);
                async move { Ok::<_, std::convert::Infallible>(fut.await) }
            });
            let conn = builder
                .serve_connection(TokioIo::new(stream), svc)
                .into_owned();
            tokio::spawn(async move {
                let _ = conn.await;
            });
        }
    };
    Ok((local, fut))
}
