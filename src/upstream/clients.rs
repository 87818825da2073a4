//! One pair of HTTP clients per thread. A pooled upstream connection is
//! driven by a task on the runtime that opened it; a call served on another
//! thread would hand every read and write across threads. The server serves
//! each connection on one thread of its own (`server::accept`), so each
//! thread keeps its own clients, and with them its own connection pools.
//!
//! Plain-HTTP replicas (a model server on the host or in the cluster, the
//! usual case) are called over hyper's HTTP/1 connections, pooled per
//! thread (`plain`): reqwest and hyper-util's pooled client cost a call
//! microseconds it does not need (URL parsing, redirect and retry layers, a
//! shared pool). `https://` replicas go through reqwest, with rustls and
//! the platform's roots.

use super::plain::{Conns, POOL_IDLE};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Threads beyond this many share clients (round robin).
const SLOTS: usize = 64;

/// How a route's clients are built.
#[derive(Clone)]
pub(super) struct ClientOptions {
    pub connect_timeout: Duration,
    pub pool_max_idle: usize,
}

impl ClientOptions {
    fn tls(&self) -> reqwest::Result<reqwest::Client> {
        reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .pool_max_idle_per_host(self.pool_max_idle)
            .pool_idle_timeout(POOL_IDLE)
            .tcp_nodelay(true)
            .no_proxy()
            // A proxy passes redirects back to the harness, and retries
            // nothing but connection errors (the route's own retries).
            .redirect(reqwest::redirect::Policy::none())
            .retry(reqwest::retry::never())
            .build()
    }

    fn plain(&self) -> Conns {
        Conns::new(self.connect_timeout, self.pool_max_idle)
    }
}

/// One thread's clients. The reqwest client is built on its first call: it
/// loads the platform's root certificates (about 19 million instructions,
/// milliseconds of a serving thread), which a route of plain-HTTP replicas,
/// the usual case, never needs.
pub(super) struct Pair {
    pub plain: Conns,
    tls: OnceLock<reqwest::Client>,
}

/// A route's clients, one pair per thread, built on first use.
pub(super) struct Clients {
    options: ClientOptions,
    /// Built with the route: proof that the options build, and the client
    /// of a thread whose own could not be built.
    first: reqwest::Client,
    slots: Vec<OnceLock<Pair>>,
}

fn slot() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static SLOT: usize = NEXT.fetch_add(1, Ordering::Relaxed) % SLOTS;
    }
    SLOT.with(|s| *s)
}

impl Clients {
    pub(super) fn new(options: ClientOptions) -> reqwest::Result<Clients> {
        Ok(Clients {
            first: options.tls()?,
            options,
            slots: (0..SLOTS).map(|_| OnceLock::new()).collect(),
        })
    }

    /// This thread's clients.
    pub(super) fn get(&self) -> &Pair {
        self.slots[slot()].get_or_init(|| Pair {
            plain: self.options.plain(),
            tls: OnceLock::new(),
        })
    }

    /// This thread's reqwest client, built on first use.
    pub(super) fn tls(&self) -> &reqwest::Client {
        self.get()
            .tls
            .get_or_init(|| self.options.tls().unwrap_or_else(|_| self.first.clone()))
    }
}
