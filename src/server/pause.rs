//! Weight sync without lost work: a gate per route that the trainer closes
//! while it loads new weights (`POST /v1/admin/pause`) and opens with the
//! new policy version (`POST /v1/admin/resume`).
//!
//! - `hold`: new calls wait here, neither refused nor failed, while calls
//!   already sent finish; a call held past `server.pause_max_wait_secs` gets
//!   the harness's own API's 503 with `Retry-After`.
//! - `abort`: calls still waiting for the upstream's answer are cut upstream
//!   (the request is dropped, which vLLM and SGLang take as an abort) and
//!   sent again once the gate opens; the harness sees one answer. A stream
//!   whose head has already reached the harness is cut and continued where
//!   the upstream can (`call::resume`), else finishes as it is.
//! - `keep` (vLLM routes): new calls wait here as with `hold`, and the
//!   route's servers freeze the calls they are generating where they are
//!   (vLLM's `/pause?mode=keep`); the resume lets them go on under the new
//!   weights. Nothing is cut or sent twice, and a stream records after how
//!   many completion tokens the new version took over (`call::stream`).
//!
//! The gate's policy version is what each call records at its start and its
//! end (`policy_version`, `policy_version_end`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How a gate is closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    Hold,
    Abort,
    Keep,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shut {
    paused: Option<Mode>,
    version: i64,
    /// `keep` pauses ended so far.
    kept: u64,
}

/// One route's gate.
#[derive(Debug)]
pub struct Gate {
    tx: watch::Sender<Shut>,
    /// Calls waiting at the gate now.
    waiting: AtomicUsize,
}

/// A call waited past the pause's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldTooLong(pub Duration);

impl Gate {
    fn new() -> Gate {
        Gate {
            tx: watch::Sender::new(Shut {
                paused: None,
                version: 0,
                kept: 0,
            }),
            waiting: AtomicUsize::new(0),
        }
    }

    /// The policy version now.
    pub fn version(&self) -> i64 {
        self.tx.borrow().version
    }

    pub fn paused(&self) -> Option<Mode> {
        self.tx.borrow().paused
    }

    pub fn pause(&self, mode: Mode) {
        self.tx.send_modify(|s| s.paused = Some(mode));
    }

    /// Open the gate; a new policy version when given.
    pub fn resume(&self, version: Option<i64>) {
        self.tx.send_modify(|s| {
            if s.paused == Some(Mode::Keep) {
                s.kept += 1;
            }
            s.paused = None;
            if let Some(v) = version {
                s.version = v;
            }
        });
    }

    /// Wait (at most `max`) until the gate is open; returns the policy
    /// version then.
    pub async fn open(&self, max: Duration) -> Result<i64, HeldTooLong> {
        let mut rx = self.tx.subscribe();
        if rx.borrow().paused.is_none() {
            return Ok(rx.borrow().version);
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let r = tokio::time::timeout(max, rx.wait_for(|s| s.paused.is_none())).await;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        match r {
            Ok(Ok(s)) => Ok(s.version),
            _ => Err(HeldTooLong(max)),
        }
    }

    /// Resolves when an `abort` pause begins.
    pub async fn aborted(&self) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|s| s.paused == Some(Mode::Abort)).await;
    }

    /// `keep` pauses ended so far: what [`Gate::kept`] waits past.
    pub fn kept_count(&self) -> u64 {
        self.tx.borrow().kept
    }

    /// Resolves when a `keep` pause ends after `seen` had (the count from
    /// [`Gate::kept_count`]), with the policy version it resumed with.
    pub async fn kept(&self, seen: u64) -> (u64, i64) {
        let mut rx = self.tx.subscribe();
        let seen = rx
            .wait_for(|s| s.kept > seen)
            .await
            .map(|s| (s.kept, s.version));
        match seen {
            Ok(s) => s,
            Err(_) => std::future::pending().await,
        }
    }

    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

/// Every route's gate.
#[derive(Debug, Default)]
pub struct Gates {
    gates: BTreeMap<String, Arc<Gate>>,
}

impl Gates {
    pub fn new<'a>(routes: impl Iterator<Item = &'a str>) -> Gates {
        Gates {
            gates: routes
                .map(|r| (r.to_owned(), Arc::new(Gate::new())))
                .collect(),
        }
    }

    pub fn get(&self, route: &str) -> Option<&Arc<Gate>> {
        self.gates.get(route)
    }

    pub fn all(&self) -> impl Iterator<Item = (&String, &Arc<Gate>)> {
        self.gates.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_held_call_waits_for_the_resume_and_gets_the_new_version() {
        let g = Arc::new(Gate::new());
        assert_eq!(g.open(Duration::from_millis(10)).await, Ok(0));
        g.pause(Mode::Hold);
        let waiter = {
            let g = g.clone();
            tokio::spawn(async move { g.open(Duration::from_secs(5)).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(g.waiting(), 1);
        g.resume(Some(7));
        assert_eq!(waiter.await.unwrap(), Ok(7));
        g.pause(Mode::Hold);
        assert_eq!(
            g.open(Duration::from_millis(20)).await,
            Err(HeldTooLong(Duration::from_millis(20)))
        );
        assert_eq!(g.waiting(), 0);
    }

    #[tokio::test]
    async fn the_end_of_a_keep_pause_is_seen_once_with_its_version() {
        let g = Arc::new(Gate::new());
        let seen = g.kept_count();
        let waiter = {
            let g = g.clone();
            tokio::spawn(async move { g.kept(seen).await })
        };
        g.pause(Mode::Hold);
        g.resume(Some(1));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "a hold pause is not a keep pause");
        g.pause(Mode::Keep);
        g.resume(Some(2));
        // Missed in between (the waiter not polled) still counts.
        g.pause(Mode::Keep);
        g.resume(Some(3));
        let (kept, version) = tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((kept, version), (2, 3));
        assert_eq!(g.kept_count(), 2);
    }

    #[tokio::test]
    async fn abort_wakes_the_calls_in_flight() {
        let g = Arc::new(Gate::new());
        let cut = {
            let g = g.clone();
            tokio::spawn(async move { g.aborted().await })
        };
        g.pause(Mode::Hold);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!cut.is_finished());
        g.pause(Mode::Abort);
        tokio::time::timeout(Duration::from_secs(1), cut)
            .await
            .unwrap()
            .unwrap();
    }
}
