//! Per-rollout sequence numbers, in arrival order.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

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
