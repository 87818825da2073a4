//! A route's replicas: which one takes a call, and which are up.
//!
//! - **Policies** ([`Policy`]): `affinity` pins a rollout to one replica,
//!   chosen on a consistent-hash ring of the replicas (so adding or removing
//!   one moves few rollouts), and re-pins it when that replica is down or
//!   has `margin` more calls in flight than the least-loaded healthy one;
//!   `least_loaded` and `round_robin` look at healthy replicas only.
//! - **Health**: a replica is down until a deadline: a failed call (connect
//!   error, 5xx) marks it down for `cooldown`, a failed probe for twice the
//!   probe interval; a good probe brings it back at once. When every
//!   replica is down, calls still go to the one the policy prefers (an
//!   error from it is better than refusing).
//!
//! Untagged calls (no rollout) go to the least-loaded replica.

use crate::config::Policy;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Points per replica on the hash ring: enough that the rollouts spread
/// evenly and a replica's departure spreads its share over all the others.
const VNODES: u64 = 128;
/// Rollouts whose pin is remembered; past it the oldest half is forgotten
/// (a forgotten rollout goes back to its ring replica).
const MAX_PINS: usize = 65_536;

/// One model server of a pool.
#[derive(Debug)]
pub struct Replica {
    /// Its base URL, e.g. `http://10.0.0.7:8000/v1`.
    pub url: String,
    /// Calls in flight on it now.
    in_flight: AtomicUsize,
    /// Down until this many ms after the pool's epoch (0: up).
    down_until: AtomicU64,
}

/// A replica taken for a call: counted in flight until dropped.
#[derive(Debug)]
pub struct Lease {
    pub replica: Arc<Replica>,
    pub index: usize,
    /// The rollout was moved here from its pinned replica.
    pub repinned: bool,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.replica.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The replicas of one route.
#[derive(Debug)]
pub struct Pool {
    replicas: Vec<Arc<Replica>>,
    /// (point, replica index), sorted by point.
    ring: Vec<(u64, usize)>,
    policy: Policy,
    margin: usize,
    cooldown: Duration,
    next: AtomicUsize,
    pins: Mutex<HashMap<String, (usize, u64)>>,
    pin_clock: AtomicU64,
    epoch: Instant,
}

fn hash<T: Hash + ?Sized>(t: &T) -> u64 {
    let mut h = DefaultHasher::new();
    t.hash(&mut h);
    h.finish()
}

impl Pool {
    pub fn new(urls: &[String], policy: Policy, margin: usize, cooldown: Duration) -> Pool {
        let replicas: Vec<Arc<Replica>> = urls
            .iter()
            .map(|u| {
                Arc::new(Replica {
                    url: u.trim_end_matches('/').to_owned(),
                    in_flight: AtomicUsize::new(0),
                    down_until: AtomicU64::new(0),
                })
            })
            .collect();
        let mut ring: Vec<(u64, usize)> = replicas
            .iter()
            .enumerate()
            .flat_map(|(i, r)| (0..VNODES).map(move |v| (hash(&(r.url.as_str(), v)), i)))
            .collect();
        ring.sort_unstable();
        Pool {
            replicas,
            ring,
            policy,
            margin,
            cooldown,
            next: AtomicUsize::new(0),
            pins: Mutex::new(HashMap::new()),
            pin_clock: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    pub fn replicas(&self) -> &[Arc<Replica>] {
        &self.replicas
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    pub fn is_up(&self, i: usize) -> bool {
        self.replicas
            .get(i)
            .is_some_and(|r| r.down_until.load(Ordering::Relaxed) <= self.now_ms())
    }

    /// A call to replica `i` failed: no new calls for the cooldown.
    pub fn mark_down(&self, i: usize) {
        self.down_for(i, self.cooldown);
    }

    /// Down for `d` (a failed probe).
    pub fn down_for(&self, i: usize, d: Duration) {
        if let Some(r) = self.replicas.get(i) {
            let until = self.now_ms() + d.as_millis().max(1) as u64;
            r.down_until.store(until, Ordering::Relaxed);
        }
    }

    /// A probe found replica `i` up.
    pub fn mark_up(&self, i: usize) {
        if let Some(r) = self.replicas.get(i) {
            r.down_until.store(0, Ordering::Relaxed);
        }
    }

    pub fn in_flight(&self, i: usize) -> usize {
        self.replicas
            .get(i)
            .map_or(0, |r| r.in_flight.load(Ordering::Relaxed))
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

    fn least_loaded(&self, candidates: impl Iterator<Item = usize>) -> Option<usize> {
        candidates.min_by_key(|&i| (self.in_flight(i), i))
    }

    fn lease(&self, index: usize, repinned: bool) -> Option<Lease> {
        let replica = self.replicas.get(index)?.clone();
        replica.in_flight.fetch_add(1, Ordering::Relaxed);
        Some(Lease {
            replica,
            index,
            repinned,
        })
    }

    /// The replica for a call of `rollout`, not one of `exclude` (replicas
    /// that already failed this call). `None` when every replica is
    /// excluded.
    pub fn pick(&self, rollout: Option<&str>, exclude: &[usize]) -> Option<Lease> {
        let allowed = |i: &usize| !exclude.contains(i);
        let healthy: Vec<usize> = (0..self.replicas.len())
            .filter(allowed)
            .filter(|&i| self.is_up(i))
            .collect();
        let fallback = || (0..self.replicas.len()).find(allowed);
        let least = self.least_loaded(healthy.iter().copied());
        match (self.policy, rollout) {
            (Policy::RoundRobin, _) => {
                let i = if healthy.is_empty() {
                    fallback()?
                } else {
                    healthy[self.next.fetch_add(1, Ordering::Relaxed) % healthy.len()]
                };
                self.lease(i, false)
            }
            (Policy::LeastLoaded, _) | (Policy::Affinity, None) => {
                self.lease(least.or_else(fallback)?, false)
            }
            (Policy::Affinity, Some(r)) => self.pick_affine(r, &healthy, least, exclude),
        }
    }

    fn pick_affine(
        &self,
        rollout: &str,
        healthy: &[usize],
        least: Option<usize>,
        exclude: &[usize],
    ) -> Option<Lease> {
        let floor = least.map_or(0, |i| self.in_flight(i));
        let fits = |i: usize| healthy.contains(&i) && self.in_flight(i) <= floor + self.margin;
        let mut pins = self.pins.lock().unwrap_or_else(|p| p.into_inner());
        let pinned = pins.get(rollout).map(|p| p.0);
        if let Some(i) = pinned.filter(|&i| fits(i) && !exclude.contains(&i)) {
            return self.lease(i, false);
        }
        let order = self.ring_order(rollout);
        let choice = order
            .iter()
            .copied()
            .find(|&i| fits(i) && !exclude.contains(&i))
            .or_else(|| order.iter().copied().find(|i| !exclude.contains(i)))?;
        let repinned = pinned.is_some_and(|p| p != choice);
        let tick = self.pin_clock.fetch_add(1, Ordering::Relaxed);
        if pins.len() >= MAX_PINS {
            let cut = tick.saturating_sub(MAX_PINS as u64 / 2);
            pins.retain(|_, (_, t)| *t >= cut);
        }
        pins.insert(rollout.to_owned(), (choice, tick));
        drop(pins);
        self.lease(choice, repinned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(n: usize, policy: Policy) -> Pool {
        let urls: Vec<String> = (0..n)
            .map(|i| format!("http://10.0.0.{i}:8000/v1"))
            .collect();
        Pool::new(&urls, policy, 2, Duration::from_secs(60))
    }

    #[test]
    fn affinity_sticks_and_spreads() {
        let p = pool(4, Policy::Affinity);
        let mut counts = [0usize; 4];
        for r in 0..400 {
            let id = format!("rollout-{r}");
            let first = p.pick(Some(&id), &[]).unwrap().index;
            for _ in 0..5 {
                assert_eq!(p.pick(Some(&id), &[]).unwrap().index, first);
            }
            counts[first] += 1;
        }
        assert!(counts.iter().all(|&c| c > 50), "{counts:?}");
    }

    #[test]
    fn removing_a_replica_moves_only_its_rollouts() {
        let four = pool(4, Policy::Affinity);
        let urls: Vec<String> = (0..3)
            .map(|i| format!("http://10.0.0.{i}:8000/v1"))
            .collect();
        let three = Pool::new(&urls, Policy::Affinity, 2, Duration::from_secs(60));
        let mut moved = 0;
        for r in 0..1000 {
            let id = format!("r{r}");
            let a = four.ring_order(&id)[0];
            let b = three.ring_order(&id)[0];
            if a != 3 {
                assert_eq!(a, b, "a rollout of a staying replica moved");
            } else {
                moved += 1;
            }
        }
        assert!(moved > 150 && moved < 350, "{moved}");
    }

    #[test]
    fn a_down_or_overloaded_replica_is_left_and_the_move_recorded() {
        let p = pool(3, Policy::Affinity);
        let first = p.pick(Some("r"), &[]).unwrap();
        let home = first.index;
        drop(first);
        p.mark_down(home);
        let moved = p.pick(Some("r"), &[]).unwrap();
        assert!(moved.repinned && moved.index != home);
        let new_home = moved.index;
        drop(moved);
        // It stays on its new replica after the old one recovers.
        p.mark_up(home);
        let again = p.pick(Some("r"), &[]).unwrap();
        assert_eq!((again.index, again.repinned), (new_home, false));
        // Overload: three more calls in flight than the least-loaded.
        let held: Vec<Lease> = (0..3).map(|_| p.lease(new_home, false).unwrap()).collect();
        let off = p.pick(Some("r"), &[]).unwrap();
        assert!(off.repinned && off.index != new_home);
        drop(held);
        // A failed attempt is excluded.
        let other = p.pick(Some("r"), &[off.index]).unwrap();
        assert_ne!(other.index, off.index);
    }

    #[test]
    fn least_loaded_and_round_robin_skip_down_replicas() {
        let p = pool(3, Policy::LeastLoaded);
        let a = p.pick(None, &[]).unwrap();
        let b = p.pick(None, &[]).unwrap();
        assert_ne!(a.index, b.index);
        p.mark_down(2);
        let c = p.pick(None, &[]).unwrap();
        assert_ne!(c.index, 2);
        let rr = pool(3, Policy::RoundRobin);
        rr.mark_down(1);
        let got: Vec<usize> = (0..4)
            .map(|_| rr.pick(Some("x"), &[]).unwrap().index)
            .collect();
        assert_eq!(got, [0, 2, 0, 2]);
        // Everything down: still an answer.
        rr.mark_down(0);
        rr.mark_down(2);
        assert!(rr.pick(None, &[]).is_some());
        assert!(rr.pick(None, &[0, 1, 2]).is_none());
    }
}
