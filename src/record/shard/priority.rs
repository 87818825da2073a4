//! The shard writer's scheduling class, chosen by how far behind it is.
//!
//! While the shard writer keeps up, it runs as an idle-class thread
//! (`SCHED_IDLE`): a serving thread that wakes on its core takes the core at
//! once. Under the normal and batch classes the kernel lets a running thread
//! finish its slice first, so on a small machine a call that woke behind a
//! Parquet page being encoded waited for milliseconds: at one connection on
//! the 2-core bench machine, one call in a hundred (wrk's p99 went from
//! about 0.5 to 1.2 ms; see the README's bench section).
//!
//! An idle-class thread gets almost no CPU while the cores are busy, so
//! when rows back up (a quarter of the shard queue) the writer moves to the
//! batch class (`SCHED_BATCH`), a fair share that never preempts a serving
//! thread on wake-up, and it stays there until it has emptied the queue.
//! No row waits on the class: the queue's backpressure is unchanged.
//!
//! Leaving the idle class takes `CAP_SYS_NICE` or an `RLIMIT_NICE` that
//! allows the thread's nice value (a Docker container has neither by
//! default). So the writer first tries the round trip on a throwaway
//! thread, and where it fails it stays in the batch class for good rather
//! than be stuck idle.

/// The two classes the shard writer moves between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    /// `SCHED_IDLE`: it runs when a core would otherwise be idle.
    Idle,
    /// `SCHED_BATCH`: a fair share, without wake-up preemption.
    Batch,
}

/// The backlog, as a fraction of the queue's capacity, at which an idle
/// writer moves to the batch class: a quarter.
const BEHIND_DIVISOR: usize = 4;

/// The class a writer now in `current` should run in, with `backlog` rows
/// queued out of `capacity`. It goes back to idle only with the queue empty,
/// so that it does not flap around the threshold.
pub(crate) fn next(current: Class, backlog: usize, capacity: usize) -> Class {
    match current {
        Class::Idle if backlog >= (capacity / BEHIND_DIVISOR).max(1) => Class::Batch,
        Class::Batch if backlog == 0 => Class::Idle,
        c => c,
    }
}

/// The calling thread's class, changed only when it must be.
pub(crate) struct Priority {
    current: Option<Class>,
    /// Whether a thread may leave the idle class again.
    can_idle: bool,
}

impl Priority {
    /// A thread whose class has not been set yet.
    pub(crate) fn new() -> Self {
        let can_idle = std::thread::Builder::new()
            .name("rollcall-probe".into())
            .spawn(|| set(Class::Idle) && set(Class::Batch))
            .ok()
            .and_then(|t| t.join().ok())
            .unwrap_or(false);
        Self {
            current: None,
            can_idle,
        }
    }

    /// Move the calling thread to the class its backlog calls for.
    pub(crate) fn follow(&mut self, backlog: usize, capacity: usize) {
        let want = if self.can_idle {
            next(self.current.unwrap_or(Class::Idle), backlog, capacity)
        } else {
            Class::Batch
        };
        if self.current != Some(want) {
            set(want);
            self.current = Some(want);
        }
    }
}

/// Put the calling thread in `class`; false when the kernel refused.
fn set(class: Class) -> bool {
    let policy = match class {
        Class::Idle => libc::SCHED_IDLE,
        Class::Batch => libc::SCHED_BATCH,
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sets this thread's own policy; `param` outlives the call.
    let ok = unsafe { libc::sched_setscheduler(0, policy, &param) } == 0;
    if !ok {
        tracing::debug!(error = %std::io::Error::last_os_error(), ?class, "the shard writer keeps its scheduling class");
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moves_to_batch_at_a_quarter_and_back_to_idle_when_empty() {
        assert_eq!(next(Class::Idle, 0, 1024), Class::Idle);
        assert_eq!(next(Class::Idle, 255, 1024), Class::Idle);
        assert_eq!(next(Class::Idle, 256, 1024), Class::Batch);
        // Hysteresis: a writer that fell behind stays batch until empty.
        assert_eq!(next(Class::Batch, 10, 1024), Class::Batch);
        assert_eq!(next(Class::Batch, 0, 1024), Class::Idle);
        // A tiny queue still has a threshold of one row.
        assert_eq!(next(Class::Idle, 1, 2), Class::Batch);
    }

    /// The thread's policy really changes, and back; where leaving the
    /// idle class is not allowed, it stays batch.
    #[test]
    fn sets_the_calling_threads_policy() {
        std::thread::spawn(|| {
            let policy = || unsafe { libc::sched_getscheduler(0) };
            let mut p = Priority::new();
            p.follow(0, 1024);
            if !p.can_idle {
                assert_eq!(policy(), libc::SCHED_BATCH);
                return;
            }
            assert_eq!(policy(), libc::SCHED_IDLE);
            p.follow(512, 1024);
            assert_eq!(policy(), libc::SCHED_BATCH);
            p.follow(0, 1024);
            assert_eq!(policy(), libc::SCHED_IDLE);
        })
        .join()
        .unwrap();
    }
}
