//! The shard writer's CPU priority, chosen by how far behind it is.
//!
//! While it keeps up, the writer runs in the idle scheduling class
//! (`SCHED_IDLE`): a serving thread, the upstream or the harness that wakes
//! on its core takes the core at once. In the batch class at nice 19 (the
//! previous choice) a wake-up that the scheduler did not find eligible
//! still waited for the rest of the writer's slice, and at one connection
//! on the 2-core bench VM wrk's p99 through rollcall was 0.77-1.16 ms,
//! against 0.42-0.73 ms in the idle class (interleaved runs; the upstream
//! alone gave 0.2-0.5 ms in its calm rounds). At nice 0 it was worse still
//! (see `docs/bench-history.md`).
//!
//! The idle class alone starved the writer for 37 s while twenty harnesses
//! kept both cores busy, so it does not stay there when it falls behind:
//! with a quarter of the shard queue backed up, or with rows waiting and
//! no wait on an empty queue for [`STARVED`] (the writer runs now and then
//! even in the idle class, and checks then), it moves to the batch class
//! at nice 0, and stays there until it has emptied the queue. No row waits
//! on the priority: the queue's backpressure is unchanged, and a full
//! queue stops the serving threads, which leaves the cores to the writer.
//!
//! A writer in the idle class may not run at all while other work keeps
//! every core busy, so it cannot be the one to notice: under twenty
//! harnesses it once held a batch for 53 s without reaching its next
//! check. A watcher thread (`rollcall-shard-watch`) looks every
//! [`STARVED`]: a writer that has held one batch for [`HELD`] in the idle
//! class is moved to the batch class at nice 0 from outside (Linux keeps a
//! policy per thread, named by its id). The writer's class is kept behind
//! one lock that both take, so the two never disagree about it.
//!
//! Returning from the idle class takes `CAP_SYS_NICE` or an `RLIMIT_NICE`
//! that allows nice 0 (a Docker container has neither by default). So the
//! writer first tries the round trip on a throwaway thread, and where it
//! fails it stays in the batch class at nice 0 for good rather than be
//! stuck low.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// The two priorities the shard writer moves between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// The idle class: the cores when nothing else wants them.
    Low,
    /// The batch class at nice 0: a fair share, and its wake-ups preempt
    /// nobody.
    Fair,
}

/// The backlog, as a fraction of the queue's capacity, at which a low
/// writer moves to a fair share: a quarter.
const BEHIND_DIVISOR: usize = 4;

/// How long a low writer may go with rows waiting, without once finding
/// the queue empty (taking every row, or waiting for one), before it
/// moves to a fair share.
pub(crate) const STARVED: Duration = Duration::from_millis(200);

/// How long a writer in the idle class may hold one batch before the
/// watcher moves it to a fair share: short against the 30 s after which
/// `/healthz` calls the stage stuck, and longer than a normal batch or
/// shard publication takes. At 200 ms, wrk's p99 at 1 connection was worse
/// in four interleaved rounds (0.53-4.1 ms against 0.44-0.51 ms without
/// the watcher), most likely from writers moved in the middle of a slow
/// publication, which then took the core from a serving thread.
pub(crate) const HELD: Duration = Duration::from_secs(5);

/// The class a writer now in `current` should run in, with `backlog` rows
/// queued out of `capacity`, and `behind` since it last found the queue
/// empty. It goes back to low only with the queue empty, so that it does
/// not flap around the threshold.
pub(crate) fn next(current: Class, backlog: usize, capacity: usize, behind: Duration) -> Class {
    match current {
        Class::Low if backlog >= (capacity / BEHIND_DIVISOR).max(1) => Class::Fair,
        Class::Low if backlog > 0 && behind >= STARVED => Class::Fair,
        Class::Fair if backlog == 0 => Class::Low,
        c => c,
    }
}

/// The calling thread's priority, changed only when it must be.
pub(crate) struct Priority {
    /// The thread's class, shared with the watcher; `None` until set.
    shared: Arc<Shared>,
    /// Whether a thread may return from the idle class to nice 0.
    can_lower: bool,
    /// When the writer last found the queue empty.
    caught_up: Instant,
}

/// What the writer and its watcher share.
struct Shared {
    /// The writer's thread id.
    tid: libc::pid_t,
    class: Mutex<Option<Class>>,
}

impl Priority {
    /// A thread whose class has not been set yet. `busy_since` says since
    /// when (µs of `crate::now_micros`, 0 for not) the writer has held a
    /// batch; where the thread may come back from the idle class, a
    /// watcher thread moves it to a fair share when that lasts [`HELD`].
    pub(crate) fn new(busy_since: impl Fn() -> i64 + Send + 'static) -> Self {
        let can_lower = std::thread::Builder::new()
            .name("rollcall-probe".into())
            .spawn(|| set(0, Class::Low) && set(0, Class::Fair))
            .ok()
            .and_then(|t| t.join().ok())
            .unwrap_or(false);
        let shared = Arc::new(Shared {
            // SAFETY: gettid has no preconditions.
            tid: unsafe { libc::gettid() },
            class: Mutex::new(None),
        });
        if can_lower {
            let watched = Arc::downgrade(&shared);
            let spawned = std::thread::Builder::new()
                .name("rollcall-shard-watch".into())
                .spawn(move || watch(watched, busy_since));
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "no watcher for the shard writer's priority");
            }
        }
        Self {
            shared,
            can_lower,
            caught_up: Instant::now(),
        }
    }

    /// Move the calling thread to the class its backlog calls for.
    pub(crate) fn follow(&mut self, backlog: usize, capacity: usize) {
        let now = Instant::now();
        if backlog == 0 {
            self.caught_up = now;
        }
        let mut class = self.shared.class.lock().unwrap_or_else(|p| p.into_inner());
        let want = if self.can_lower {
            let behind = now.saturating_duration_since(self.caught_up);
            next(class.unwrap_or(Class::Low), backlog, capacity, behind)
        } else {
            Class::Fair
        };
        if *class != Some(want) {
            set(0, want);
            *class = Some(want);
        }
    }

    /// The writer found the queue empty: it took every row, or waited
    /// for one until now.
    pub(crate) fn emptied(&mut self) {
        self.follow(0, 1);
    }
}

/// The watcher: every [`STARVED`], a writer in the idle class that has
/// held one batch for [`HELD`] moves to a fair share. Ends with the
/// writer.
/// A handle that moves the writer to a fair share from another thread (the
/// WAL writer, once it has queued a publication someone waits for); the
/// writer goes back to the idle class by itself once its queue is empty.
pub(crate) struct Boost(Weak<Shared>);

impl std::fmt::Debug for Boost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Boost")
    }
}

impl Boost {
    pub(crate) fn boost(&self) {
        let Some(shared) = self.0.upgrade() else {
            return;
        };
        let mut class = shared.class.lock().unwrap_or_else(|p| p.into_inner());
        if *class == Some(Class::Low) && set(shared.tid, Class::Fair) {
            *class = Some(Class::Fair);
        }
    }
}

impl Priority {
    pub(crate) fn boost(&self) -> Boost {
        Boost(Arc::downgrade(&self.shared))
    }
}

fn watch(shared: Weak<Shared>, busy_since: impl Fn() -> i64) {
    let held = i64::try_from(HELD.as_micros()).unwrap_or(i64::MAX);
    loop {
        std::thread::sleep(STARVED);
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let since = busy_since();
        if since == 0 || crate::now_micros() - since < held {
            continue;
        }
        let mut class = shared.class.lock().unwrap_or_else(|p| p.into_inner());
        if *class == Some(Class::Low) && set(shared.tid, Class::Fair) {
            *class = Some(Class::Fair);
            tracing::debug!(
                "the shard writer was starved in the idle class; moved to a fair share"
            );
        }
    }
}

/// Put thread `tid` (0: the calling thread) in `class`; false when the
/// kernel refused.
fn set(tid: libc::pid_t, class: Class) -> bool {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: both calls change only the one thread (Linux keeps a policy
    // and a nice value per thread, named by its id); `param` outlives the
    // call.
    let ok = unsafe {
        let tid = if tid == 0 { libc::gettid() } else { tid };
        match class {
            Class::Low => libc::sched_setscheduler(tid, libc::SCHED_IDLE, &param) == 0,
            Class::Fair => {
                libc::sched_setscheduler(tid, libc::SCHED_BATCH, &param) == 0
                    && libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 0) == 0
            }
        }
    };
    if !ok {
        tracing::debug!(error = %std::io::Error::last_os_error(), ?class, "the shard writer keeps its priority");
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's scheduling policy.
    fn policy() -> i32 {
        // SAFETY: reads the calling thread's own policy.
        unsafe { libc::sched_getscheduler(0) }
    }

    /// The calling thread's nice value.
    fn nice() -> i32 {
        // SAFETY: reads the calling thread's own nice value.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    #[test]
    fn moves_to_fair_at_a_quarter_or_when_starved_and_back_to_low_when_empty() {
        let now = Duration::ZERO;
        assert_eq!(next(Class::Low, 0, 1024, now), Class::Low);
        assert_eq!(next(Class::Low, 255, 1024, now), Class::Low);
        assert_eq!(next(Class::Low, 256, 1024, now), Class::Fair);
        // Rows waiting while the writer has not found the queue empty.
        assert_eq!(next(Class::Low, 1, 1024, STARVED / 2), Class::Low);
        assert_eq!(next(Class::Low, 1, 1024, STARVED), Class::Fair);
        assert_eq!(next(Class::Low, 0, 1024, STARVED * 10), Class::Low);
        // Hysteresis: a writer that fell behind stays fair until empty.
        assert_eq!(next(Class::Fair, 10, 1024, now), Class::Fair);
        assert_eq!(next(Class::Fair, 0, 1024, now), Class::Low);
        // A tiny queue still has a threshold of one row.
        assert_eq!(next(Class::Low, 1, 2, now), Class::Fair);
    }

    /// The thread's policy and nice value really change, and back; where
    /// returning to nice 0 is not allowed, it stays there.
    #[test]
    fn sets_the_calling_threads_priority() {
        std::thread::spawn(|| {
            let mut p = Priority::new(|| 0);
            p.follow(0, 1024);
            if !p.can_lower {
                assert_eq!((policy(), nice()), (libc::SCHED_BATCH, 0));
                return;
            }
            assert_eq!(policy(), libc::SCHED_IDLE);
            p.follow(512, 1024);
            assert_eq!((policy(), nice()), (libc::SCHED_BATCH, 0));
            p.follow(0, 1024);
            assert_eq!(policy(), libc::SCHED_IDLE);
            p.follow(512, 1024);
            p.emptied();
            assert_eq!(policy(), libc::SCHED_IDLE);
            // Behind for too long with a short backlog.
            p.caught_up = Instant::now() - STARVED;
            p.follow(3, 1024);
            assert_eq!((policy(), nice()), (libc::SCHED_BATCH, 0));
        })
        .join()
        .unwrap();
    }

    /// A writer that holds a batch for [`HELD`] in the idle class is moved
    /// to a fair share by the watcher, and one that holds none is left
    /// alone.
    #[test]
    fn the_watcher_moves_a_writer_starved_in_a_batch() {
        use std::sync::atomic::{AtomicI64, Ordering};
        std::thread::spawn(|| {
            let busy = Arc::new(AtomicI64::new(0));
            let seen = Arc::clone(&busy);
            let mut p = Priority::new(move || seen.load(Ordering::Relaxed));
            p.follow(0, 1024);
            if !p.can_lower {
                assert_eq!((policy(), nice()), (libc::SCHED_BATCH, 0));
                return;
            }
            assert_eq!(policy(), libc::SCHED_IDLE);
            std::thread::sleep(STARVED * 3);
            assert_eq!(policy(), libc::SCHED_IDLE, "moved while holding no batch");
            let long_ago = crate::now_micros() - 2 * HELD.as_micros() as i64;
            busy.store(long_ago, Ordering::Relaxed);
            let give_up = Instant::now() + Duration::from_secs(30);
            while policy() != libc::SCHED_BATCH && Instant::now() < give_up {
                std::thread::sleep(STARVED / 4);
            }
            assert_eq!((policy(), nice()), (libc::SCHED_BATCH, 0));
            // The writer's own next look starts from the class it is in.
            busy.store(0, Ordering::Relaxed);
            p.follow(0, 1024);
            assert_eq!(policy(), libc::SCHED_IDLE);
        })
        .join()
        .unwrap();
    }
}
