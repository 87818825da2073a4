//! A thread's own HTTP/1 connections to plain-HTTP replicas: hyper's
//! connection API (`client::conn::http1`) under a small pool of its own.
//!
//! hyper-util's pooled client, used here before, keys one shared pool by a
//! hashed (scheme, authority) behind a lock, and hands each connection back
//! through a task it spawns per call: about 5,000 instructions a call (of
//! some 100,000), for a pool that here never leaves its thread. This one:
//!
//! - **Per thread.** [`Conns`] is one serving thread's (`clients`), so its
//!   lock is never contended. Idle connections are kept per [`Origin`] in a
//!   short list searched by equality, newest last; a call takes the newest
//!   ready one, or opens a new one.
//! - **Back when read.** A connection goes with its answer ([`Held`], in
//!   [`super::Body::Plain`]) and back to the pool when the body's end is
//!   read, if the server kept it open. A body dropped before its end drops
//!   the connection, which hyper then closes.
//! - **Bounded.** At most `pool_max_idle` idle connections per origin (the
//!   oldest goes first); a sweep every [`SWEEP`] closes those idle for
//!   [`POOL_IDLE`], and stops while the pool is empty.
//! - **Retried only when unsent.** A request hyper hands back unwritten
//!   (its pooled connection ended first) is sent once more on a new
//!   connection, as hyper-util's client does. Nothing the server may have
//!   seen is sent again: a pooled connection its server closes just as a
//!   call takes it fails that call, with either client.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// How long an idle connection is kept.
pub(super) const POOL_IDLE: Duration = Duration::from_secs(90);

/// How often idle connections are looked over.
const SWEEP: Duration = Duration::from_secs(30);

type Sender = SendRequest<Full<Bytes>>;

/// Where a plain-HTTP replica listens: what its connections are opened to,
/// and pooled under.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Origin {
    /// A name or an IP address (an IPv6 one without its brackets).
    host: Box<str>,
    port: u16,
}

impl Origin {
    /// The origin of an `http://` URI.
    pub(super) fn of(uri: &http::Uri) -> Option<Origin> {
        let host = uri.host()?;
        let host = host.strip_prefix('[').unwrap_or(host);
        let host = host.strip_suffix(']').unwrap_or(host);
        Some(Origin {
            host: host.into(),
            port: uri.port_u16().unwrap_or(80),
        })
    }
}

/// Why one try on a plain-HTTP replica failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum SendError {
    /// tcp connect error
    #[error("tcp connect error")]
    Connect(#[source] std::io::Error),
    /// tcp connect timed out after {0:?}
    #[error("tcp connect timed out after {0:?}")]
    ConnectTimeout(Duration),
    /// the HTTP/1 handshake failed
    #[error("the HTTP/1 handshake failed")]
    Handshake(#[source] hyper::Error),
    /// the request failed
    #[error("the request failed")]
    Request(#[source] hyper::Error),
}

impl SendError {
    /// No connection was made: the replica may be down, and another may
    /// take the call.
    pub(super) fn is_connect(&self) -> bool {
        !matches!(self, SendError::Request(_))
    }
}

/// Idle connections to one origin, oldest first, each with the time it
/// went idle.
type Queue = VecDeque<(Sender, Instant)>;

/// One thread's idle connections, per origin.
#[derive(Default)]
struct Idle {
    by_origin: Vec<(Arc<Origin>, Queue)>,
    /// A sweep task is running.
    sweeping: bool,
}

impl Idle {
    fn list(&mut self, origin: &Arc<Origin>) -> Option<&mut Queue> {
        self.by_origin
            .iter_mut()
            .find(|(o, _)| Arc::ptr_eq(o, origin) || **o == **origin)
            .map(|(_, l)| l)
    }

    /// Close what the server closed and what has been idle for
    /// [`POOL_IDLE`]; forget origins with nothing left.
    fn sweep(&mut self, now: Instant) {
        for (_, list) in &mut self.by_origin {
            list.retain(|(s, since)| !s.is_closed() && now.duration_since(*since) < POOL_IDLE);
        }
        self.by_origin.retain(|(_, l)| !l.is_empty());
    }
}

/// One thread's connections to plain-HTTP replicas.
pub(super) struct Conns {
    connect_timeout: Duration,
    max_idle: usize,
    idle: Arc<Mutex<Idle>>,
}

impl Conns {
    pub(super) fn new(connect_timeout: Duration, max_idle: usize) -> Conns {
        Conns {
            connect_timeout,
            max_idle,
            idle: Arc::default(),
        }
    }

    /// Send `req` (origin-form URI, `Host` set) to `origin`, and wait for
    /// the answer's head. The connection goes with the answer ([`Held`]).
    pub(super) async fn send(
        &self,
        origin: &Arc<Origin>,
        req: http::Request<Full<Bytes>>,
    ) -> Result<(http::Response<Incoming>, Held), SendError> {
        let (mut sender, reused) = match self.checkout(origin) {
            Some(s) => (s, true),
            None => (self.connect(origin).await?, false),
        };
        let resp = match sender.try_send_request(req).await {
            Ok(resp) => resp,
            Err(mut e) => match e.take_message() {
                Some(req) if reused => {
                    sender = self.connect(origin).await?;
                    sender.send_request(req).await.map_err(SendError::Request)?
                }
                _ => return Err(SendError::Request(e.into_error())),
            },
        };
        let held = Held {
            sender,
            origin: origin.clone(),
            idle: self.idle.clone(),
            max_idle: self.max_idle,
        };
        Ok((resp, held))
    }

    /// The newest idle connection to `origin` that can take a request now;
    /// those the server closed are dropped on the way.
    fn checkout(&self, origin: &Arc<Origin>) -> Option<Sender> {
        let mut idle = self.idle.lock().ok()?;
        let list = idle.list(origin)?;
        let mut i = list.len();
        while i > 0 {
            i -= 1;
            let Some((s, _)) = list.get(i) else { break };
            if s.is_ready() {
                return list.remove(i).map(|(s, _)| s);
            }
            if s.is_closed() {
                list.remove(i);
            }
        }
        None
    }

    async fn connect(&self, origin: &Origin) -> Result<Sender, SendError> {
        let connect = tokio::net::TcpStream::connect((&*origin.host, origin.port));
        let stream = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| SendError::ConnectTimeout(self.connect_timeout))?
            .map_err(SendError::Connect)?;
        // Calls are small writes answered at once: Nagle would hold them.
        stream.set_nodelay(true).map_err(SendError::Connect)?;
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            // One write(2) per request, as the server side does (its note).
            .writev(false)
            .handshake(TokioIo::new(stream))
            .await
            .map_err(SendError::Handshake)?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "an upstream connection ended with an error");
            }
        });
        Ok(sender)
    }
}

/// A connection lent to one call until its answer has been read whole.
pub struct Held {
    sender: Sender,
    origin: Arc<Origin>,
    idle: Arc<Mutex<Idle>>,
    max_idle: usize,
}

impl Held {
    /// The answer was read to its end: the connection goes back to its
    /// pool, unless the server closed it or the pool is full of newer ones.
    pub(super) fn release(self) {
        if self.sender.is_closed() || self.max_idle == 0 {
            return;
        }
        let Ok(mut idle) = self.idle.lock() else {
            return;
        };
        let now = Instant::now();
        match idle.list(&self.origin) {
            Some(list) => {
                if list.len() >= self.max_idle {
                    list.pop_front();
                }
                list.push_back((self.sender, now));
            }
            None => idle
                .by_origin
                .push((self.origin, VecDeque::from([(self.sender, now)]))),
        }
        if !idle.sweeping {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                idle.sweeping = true;
                rt.spawn(sweep(Arc::downgrade(&self.idle)));
            }
        }
    }
}

/// Every [`SWEEP`], close idle connections past [`POOL_IDLE`] or closed by
/// their server; stop when the pool is empty or gone.
async fn sweep(idle: Weak<Mutex<Idle>>) {
    loop {
        tokio::time::sleep(SWEEP).await;
        let Some(idle) = idle.upgrade() else { return };
        let Ok(mut idle) = idle.lock() else { return };
        idle.sweep(Instant::now());
        if idle.by_origin.is_empty() {
            idle.sweeping = false;
            return;
        }
    }
}

#[cfg(test)]
#[path = "plain_tests.rs"]
mod tests;
