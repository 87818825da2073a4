//! A route's replicas: which one takes a call, and which are up.
//!
//! - **Policies** ([`Policy`]): `affinity` pins a rollout to one replica,
//!   chosen on a consistent-hash ring of the replicas (so adding or removing
//!   one moves few rollouts), and re-pins it when that replica is down, has
//!   left the pool, or has `margin` more calls in flight than the
//!   least-loaded healthy one; `least_loaded` and `round_robin` look at
//!   healthy replicas only.
//! - **Health**: a replica is down until a deadline: a failed call (connect
//!   error, 5xx) marks it down for `cooldown`, a failed probe for twice the
//!   probe interval; a good probe brings it back at once. When every
//!   replica is down, calls still go to the one the policy prefers (an
//!   error from it is better than refusing).
//! - **Joins and leaves** ([`Pool::replace`], from `POST /v1/admin/resume`
//!   with `urls`): a replica is known by its URL. One whose URL stays keeps
//!   its state (health, calls in flight, the rollouts pinned to it); new
//!   ones join the ring; one that leaves takes no new calls, while the calls
//!   already on it finish (a [`Lease`] holds its [`Replica`], not a place in
//!   the set). The ring is rebuilt from the URLs, so a join takes about
//!   1/(n+1) of the ring (new rollouts, and those whose replica left), and a
//!   leave moves only the rollouts pinned to the replica that left (re-pinned
//!   on their next call, and recorded as such).
//!
//! The set is an `Arc<ReplicaSet>` behind an `RwLock`: a pick holds the read
//! lock only to clone the `Arc` and works on that snapshot, so calls never
//! wait on each other, and a replacement swaps in a whole new set.
//!
//! Untagged calls (no rollout) go to the least-loaded replica.

use crate::config::Policy;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Points per replica on the hash ring: enough that the rollouts spread
/// evenly and a replica's departure spreads its share over all the others.
const VNODES: u64 = 128;
/// Rollouts whose pin is remembered; past it the oldest half is forgotten
/// (a forgotten rollout goes back to its ring replica).
const MAX_PINS: usize = 65_536;
/// The API endpoints under a replica's base URL, parsed once.
const ENDPOINTS: [&str; 5] = [
    "/chat/completions",
    "/responses",
    "/completions",
    "/messages",
    "/models",
];

/// One model server of a pool.
#[derive(Debug)]
pub struct Replica {
    /// Its base URL, e.g. `http://10.0.0.7:8000/v1`.
    pub url: String,
    /// The same, redacted (its userinfo and secret-looking query values
    /// masked): what rows and logs name it by.
    pub redacted: String,
    /// The base URL + each of [`ENDPOINTS`].
    endpoints: Vec<(&'static str, reqwest::Url)>,
    /// The path and query of each, as an origin-form URI, when the replica
    /// speaks plain HTTP (and is called over `plain`'s connections).
    plain: Vec<(&'static str, http::Uri)>,
    /// Where its plain-HTTP connections go.
    pub(super) origin: Option<Arc<super::plain::Origin>>,
    /// The `Host` header for those calls, made once.
    pub host: Option<http::HeaderValue>,
    /// Calls in flight on it now.
    in_flight: AtomicUsize,
    /// Down until this many ms after the pool's epoch (0: up).
    down_until: AtomicU64,
}

impl Replica {
    fn new(url: &str) -> Result<Replica, String> {
        let url = url.trim_end_matches('/');
        let endpoints = ENDPOINTS
            .into_iter()
            .map(|e| {
                reqwest::Url::parse(&format!("{url}{e}"))
                    .map(|u| (e, u))
                    .map_err(|err| format!("url {url:?}: {err}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let absolute: Vec<(&'static str, http::Uri)> = endpoints
            .iter()
            // reqwest sends a URL's credentials as Basic auth; hyper does not.
            .filter(|(_, u)| {
                u.scheme() == "http" && u.username().is_empty() && u.password().is_none()
            })
            .filter_map(|(e, u)| Some((*e, u.as_str().parse().ok()?)))
            .collect();
        let first = absolute.first().map(|(_, u)| u);
        let host = first.and_then(host_header);
        let origin = first.and_then(super::plain::Origin::of).map(Arc::new);
        let plain = match origin {
            Some(_) => absolute
                .iter()
                .filter_map(|(e, u)| Some((*e, origin_form(u)?)))
                .collect(),
            None => Vec::new(),
        };
        Ok(Replica {
            url: url.to_owned(),
            redacted: crate::redact::redacted(url),
            endpoints,
            plain,
            origin,
            host,
            in_flight: AtomicUsize::new(0),
            down_until: AtomicU64::new(0),
        })
    }

    /// Its URL for one of the API endpoints (`/chat/completions`, …,
    /// `/models`).
    pub fn endpoint(&self, endpoint: &str) -> Option<&reqwest::Url> {
        self.endpoints
            .iter()
            .find(|(e, _)| *e == endpoint)
            .map(|(_, u)| u)
    }

    /// Its origin-form URI (path and query) for one of the API endpoints,
    /// when it speaks plain HTTP.
    pub fn plain_endpoint(&self, endpoint: &str) -> Option<&http::Uri> {
        self.plain
            .iter()
            .find(|(e, _)| *e == endpoint)
            .map(|(_, u)| u)
    }

    /// It speaks plain HTTP.
    pub fn is_plain(&self) -> bool {
        !self.plain.is_empty()
    }

    /// Calls in flight on it now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// The path and query of an absolute URI, as the URI an HTTP/1 request
/// to its origin carries.
pub(super) fn origin_form(u: &http::Uri) -> Option<http::Uri> {
    Some(http::Uri::from(u.path_and_query()?.clone()))
}

/// `Host` for a plain-HTTP URI, as hyper-util's client set it: the host,
/// and the port unless it is 80.
fn host_header(u: &http::Uri) -> Option<http::HeaderValue> {
    let host = u.host()?;
    let value = match u.port_u16() {
        Some(port) if port != 80 => format!("{host}:{port}"),
        _ => host.to_owned(),
    };
    http::HeaderValue::from_str(&value).ok()
}

/// A replica taken for a call: counted in flight until dropped. It holds
/// the replica itself, so it stays valid when the replica leaves the pool.
#[derive(Debug)]
pub struct Lease {
    pub replica: Arc<Replica>,
    /// The rollout was moved here from its pinned replica.
    pub repinned: bool,
}

impl Lease {
    fn new(replica: &Arc<Replica>, repinned: bool) -> Lease {
        replica.in_flight.fetch_add(1, Ordering::Relaxed);
        Lease {
            replica: replica.clone(),
            repinned,
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.replica.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The replicas of a pool at one moment, and their ring.
#[derive(Debug)]
pub struct ReplicaSet {
    replicas: Vec<Arc<Replica>>,
    /// (point, replica index), sorted by point.
    ring: Vec<(u64, usize)>,
}

fn hash<T: Hash + ?Sized>(t: &T) -> u64 {
    let mut h = DefaultHasher::new();
    t.hash(&mut h);
    h.finish()
}

impl ReplicaSet {
    fn new(replicas: Vec<Arc<Replica>>) -> ReplicaSet {
        // A replica's points hash its URL, so they are the same in every set
        // it is part of: that is what keeps the moves few.
        let mut ring: Vec<(u64, usize)> = replicas
            .iter()
            .enumerate()
            .flat_map(|(i, r)| (0..VNODES).map(move |v| (hash(&(r.url.as_str(), v)), i)))
            .collect();
        ring.sort_unstable();
        ReplicaSet { replicas, ring }
    }

    pub fn replicas(&self) -> &[Arc<Replica>] {
        &self.replicas
    }

    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    pub fn is_empty(&self) -> bool {
        self.replicas.is_empty()
    }

    fn index_of(&self, r: &Arc<Replica>) -> Option<usize> {
        self.replicas.iter().position(|x| Arc::ptr_eq(x, r))
    }

    /// The replicas in `rollout`'s ring order (its preference list).
    fn ring_order(&self, rollout: &str) -> Vec<usize> {
        let h = hash(rollout);
        let start = self.ring.partition_point(|(p, _)| *p < h);
        let mut out = Vec::with_capacity(self.replicas.len());
        for k in 0..self.ring.len() {
            let (_, i) = self.ring[(start + k) % self.ring.len()];
            if !out.contains(&i) {
                out.push(i);
                if out.len() == self.replicas.len() {
                    break;
                }
            }
        }
        out
    }
}

/// What [`Pool::replace`] changed: the URLs that joined and left.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Change {
    pub joined: Vec<String>,
    pub left: Vec<String>,
}

/// The replicas of one route.
#[derive(Debug)]
pub struct Pool {
    set: RwLock<Arc<ReplicaSet>>,
    policy: Policy,
    margin: usize,
    cooldown: Duration,
    next: AtomicUsize,
    /// Each rollout's replica and when it was pinned there.
    pins: Mutex<HashMap<String, (Arc<Replica>, u64)>>,
    pin_clock: AtomicU64,
    epoch: Instant,
}

impl Pool {
    pub fn new(
        urls: &[String],
        policy: Policy,
        margin: usize,
        cooldown: Duration,
    ) -> Result<Pool, String> {
        let replicas = urls
            .iter()
            .map(|u| Replica::new(u).map(Arc::new))
            .collect::<Result<_, _>>()?;
        Ok(Pool {
            set: RwLock::new(Arc::new(ReplicaSet::new(replicas))),
            policy,
            margin,
            cooldown,
            next: AtomicUsize::new(0),
            pins: Mutex::new(HashMap::new()),
            pin_clock: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    /// The replicas now (a snapshot: a later [`Pool::replace`] does not
    /// change it).
    pub fn snapshot(&self) -> Arc<ReplicaSet> {
        self.set.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Replace the replica set with `urls` (checked as the config checks a
    /// route's `urls`). Replicas whose URL stays are kept as they are; the
    /// others join or leave. Calls already sent to a replica that leaves
    /// finish on it; its pinned rollouts are re-pinned on their next call.
    pub fn replace(&self, urls: &[String]) -> Result<Change, String> {
        crate::config::check_replica_urls(urls)?;
        let mut set = self.set.write().unwrap_or_else(|p| p.into_inner());
        let mut replicas = Vec::with_capacity(urls.len());
        let mut change = Change::default();
        for u in urls {
            let url = u.trim_end_matches('/');
            match set.replicas.iter().find(|r| r.url == url) {
                Some(r) => replicas.push(r.clone()),
                None => {
                    replicas.push(Arc::new(Replica::new(url)?));
                    change.joined.push(url.to_owned());
                }
            }
        }
        change.left = set
            .replicas
            .iter()
            .filter(|r| !replicas.iter().any(|n| Arc::ptr_eq(n, r)))
            .map(|r| r.url.clone())
            .collect();
        *set = Arc::new(ReplicaSet::new(replicas));
        Ok(change)
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub fn is_up(&self, r: &Replica) -> bool {
        r.down_until.load(Ordering::Relaxed) <= self.now_ms()
    }

    /// A call to `r` failed: no new calls for the cooldown.
    pub fn mark_down(&self, r: &Replica) {
        self.down_for(r, self.cooldown);
    }

    /// Down for `d` (a failed probe).
    pub fn down_for(&self, r: &Replica, d: Duration) {
        let until = self.now_ms() + d.as_millis().max(1) as u64;
        r.down_until.store(until, Ordering::Relaxed);
    }

    /// A probe found `r` up.
    pub fn mark_up(&self, r: &Replica) {
        r.down_until.store(0, Ordering::Relaxed);
    }

    /// The replica for a call of `rollout`, not one of `exclude` (replicas
    /// that already failed this call). `None` when every replica is
    /// excluded.
    pub fn pick(&self, rollout: Option<&str>, exclude: &[Arc<Replica>]) -> Option<Lease> {
        let set = self.snapshot();
        let rs = &set.replicas;
        let allowed = |i: &usize| !exclude.iter().any(|e| Arc::ptr_eq(e, &rs[*i]));
        let healthy: Vec<usize> = (0..rs.len())
            .filter(allowed)
            .filter(|&i| self.is_up(&rs[i]))
            .collect();
        let fallback = || (0..rs.len()).find(allowed);
        let least = healthy
            .iter()
            .copied()
            .min_by_key(|&i| (rs[i].in_flight(), i));
        match (self.policy, rollout) {
            (Policy::RoundRobin, _) => {
                let i = if healthy.is_empty() {
                    fallback()?
                } else {
                    healthy[self.next.fetch_add(1, Ordering::Relaxed) % healthy.len()]
                };
                Some(Lease::new(&rs[i], false))
            }
            (Policy::LeastLoaded, _) | (Policy::Affinity, None) => {
                Some(Lease::new(&rs[least.or_else(fallback)?], false))
            }
            (Policy::Affinity, Some(r)) => self.pick_affine(&set, r, &healthy, least, allowed),
        }
    }

    fn pick_affine(
        &self,
        set: &ReplicaSet,
        rollout: &str,
        healthy: &[usize],
        least: Option<usize>,
        allowed: impl Fn(&usize) -> bool,
    ) -> Option<Lease> {
        let rs = &set.replicas;
        let floor = least.map_or(0, |i| rs[i].in_flight());
        // `healthy` holds allowed replicas only.
        let fits = |i: &usize| healthy.contains(i) && rs[*i].in_flight() <= floor + self.margin;
        let mut pins = self.pins.lock().unwrap_or_else(|p| p.into_inner());
        let pinned = pins.get(rollout).map(|p| p.0.clone());
        // A pinned replica that has left the pool is in no set's index.
        if let Some(i) = pinned
            .as_ref()
            .and_then(|p| set.index_of(p))
            .filter(|i| fits(i))
        {
            return Some(Lease::new(&rs[i], false));
        }
        let order = set.ring_order(rollout);
        let choice = order
            .iter()
            .copied()
            .find(|i| fits(i))
            .or_else(|| order.iter().copied().find(|i| allowed(i)))?;
        let chosen = &rs[choice];
        // Known by URL: a rollout whose replica left and came back under the
        // same URL has not moved.
        let repinned = pinned.is_some_and(|p| p.url != chosen.url);
        let tick = self.pin_clock.fetch_add(1, Ordering::Relaxed);
        if pins.len() >= MAX_PINS {
            let cut = tick.saturating_sub(MAX_PINS as u64 / 2);
            pins.retain(|_, (_, t)| *t >= cut);
        }
        pins.insert(rollout.to_owned(), (chosen.clone(), tick));
        drop(pins);
        Some(Lease::new(chosen, repinned))
    }
}

#[cfg(test)]
mod tests;
