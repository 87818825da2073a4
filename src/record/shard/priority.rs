//! The shard writer's CPU priority, chosen by how far behind it is.
//!
//! The writer runs in the batch scheduling class (`SCHED_BATCH`: its
//! wake-ups never preempt a serving thread). While it keeps up it also runs
//! at the lowest priority, nice 19: a serving thread that wakes on its core
//! is owed the core at once, instead of waiting while the writer finishes
//! its slice. At nice 0 a call that woke behind a Parquet page being
//! encoded waited for milliseconds: at one connection on the 2-core bench
//! machine, wrk's p99 went from about 0.5 to 1.2 ms (see the README's bench
//! section).
//!
//! When rows back up (a quarter of the shard queue) the writer moves back
//! to nice 0 and stays there until it has emptied the queue. Even at nice
//! 19 it keeps a small share of a busy machine (the idle class, tried
//! first, starved it for 37 s while twenty harnesses kept both cores busy).
//! No row waits on the priority: the queue's backpressure is unchanged.
//!
//! Returning to nice 0 takes `CAP_SYS_NICE` or an `RLIMIT_NICE` that
//! allows it (a Docker container has neither by default). So the writer
//! first tries the round trip on a throwaway thread, and where it fails it
//! stays at nice 0 for good rather than be stuck low.

/// The two priorities the shard writer moves between, both in the batch
/// class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// Nice 19: a small share while the cores are busy.
    Low,
    /// Nice 0: a fair share.
    Fair,
}

/// The backlog, as a fraction of the queue's capacity, at which a low
/// writer moves to a fair share: a quarter.
const BEHIND_DIVISOR: usize = 4;

/// The class a writer now in `current` should run in, with `backlog` rows
/// queued out of `capacity`. It goes back to low only with the queue empty,
/// so that it does not flap around the threshold.
pub(crate) fn next(current: Class, backlog: usize, capacity: usize) -> Class {
    match current {
        Class::Low if backlog >= (capacity / BEHIND_DIVISOR).max(1) => Class::Fair,
        Class::Fair if backlog == 0 => Class::Low,
        c => c,
    }
}

/// The calling thread's priority, changed only when it must be.
pub(crate) struct Priority {
    current: Option<Class>,
    /// Whether a thread may return from nice 19 to nice 0.
    can_lower: bool,
}

impl Priority {
    /// A thread whose class has not been set yet.
    pub(crate) fn new() -> Self {
        let can_lower = std::thread::Builder::new()
            .name("rollcall-probe".into())
            .spawn(|| set(Class::Low) && set(Class::Fair))
            .ok()
            .and_then(|t| t.join().ok())
            .unwrap_or(false);
        Self {
            current: None,
            can_lower,
        }
    }

    /// Move the calling thread to the class its backlog calls for.
    pub(crate) fn follow(&mut self, backlog: usize, capacity: usize) {
        let want = if self.can_lower {
            next(self.current.unwrap_or(Class::Low), backlog, capacity)
        } else {
            Class::Fair
        };
        if self.current != Some(want) {
            set(want);
            self.current = Some(want);
        }
    }
}

/// Put the calling thread in the batch class at `class`'s nice value;
/// false when the kernel refused.
fn set(class: Class) -> bool {
    let nice = match class {
        Class::Low => 19,
        Class::Fair => 0,
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: both calls change only this thread (Linux keeps a nice value
    // per thread, named by its id); `param` outlives the call.
    let ok = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) == 0
            && libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice) == 0
    };
    if !ok {
        tracing::debug!(error = %std::io::Error::last_os_error(), ?class, "the shard writer keeps its priority");
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_to_fair_at_a_quarter_and_back_to_low_when_empty() {
        assert_eq!(next(Class::Low, 0, 1024), Class::Low);
        assert_eq!(next(Class::Low, 255, 1024), Class::Low);
        assert_eq!(next(Class::Low, 256, 1024), Class::Fair);
        // Hysteresis: a writer that fell behind stays fair until empty.
        assert_eq!(next(Class::Fair, 10, 1024), Class::Fair);
        assert_eq!(next(Class::Fair, 0, 1024), Class::Low);
        // A tiny queue still has a threshold of one row.
        assert_eq!(next(Class::Low, 1, 2), Class::Fair);
    }

    /// The thread's policy and nice value really change, and back; where
    /// returning to nice 0 is not allowed, it stays there.
    #[test]
    fn sets_the_calling_threads_priority() {
        std::thread::spawn(|| {
            let policy = || unsafe { libc::sched_getscheduler(0) };
            let nice =
                || unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) };
            let mut p = Priority::new();
            p.follow(0, 1024);
            assert_eq!(policy(), libc::SCHED_BATCH);
            if !p.can_lower {
                assert_eq!(nice(), 0);
                return;
            }
            assert_eq!(nice(), 19);
            p.follow(512, 1024);
            assert_eq!((policy(), nice()), (libc::SCHED_BATCH, 0));
            p.follow(0, 1024);
            assert_eq!(nice(), 19);
        })
        .join()
        .unwrap();
    }
}
