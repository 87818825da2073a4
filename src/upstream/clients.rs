//! One HTTP client per thread. A pooled upstream connection is driven by a
//! task on the runtime that opened it; a call served on another thread
//! would hand every read and write across threads. The server serves each
//! connection on one thread of its own (`server::accept`), so each thread
//! keeps its own client, and with it its own connection pool.

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
    pub(super) fn build(&self) -> reqwest::Result<reqwest::Client> {
        reqwest::Client::builder()
            .connect_timeout(self.connect_timeout)
            .pool_max_idle_per_host(self.pool_max_idle)
            .pool_idle_timeout(Duration::from_secs(90))
            .tcp_nodelay(true)
            .no_proxy()
            // A proxy passes redirects back to the harness, and retries
            // nothing but connection errors (the route's own retries).
            .redirect(reqwest::redirect::Policy::none())
            .retry(reqwest::retry::never())
            .build()
    }
}

/// A route's clients, one per thread, built on first use.
pub(super) struct Clients {
    options: ClientOptions,
    /// Built with the route: proof that the options build, and the client
    /// of a thread whose own could not be built.
    first: reqwest::Client,
    slots: Vec<OnceLock<reqwest::Client>>,
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
            first: options.build()?,
            options,
            slots: (0..SLOTS).map(|_| OnceLock::new()).collect(),
        })
    }

    /// This thread's client.
    pub(super) fn get(&self) -> &reqwest::Client {
        let Some(cell) = self.slots.get(slot()) else {
            return &self.first;
        };
        cell.get_or_init(|| self.options.build().unwrap_or_else(|_| self.first.clone()))
    }
}
