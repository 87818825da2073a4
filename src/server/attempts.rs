//! Retries are retries: an SDK's automatic retry of a call (the OpenAI and
//! Anthropic SDKs send `x-stainless-retry-count: N`), or the same request
//! body again from the same rollout within `rollouts.retry_window_secs`, is
//! another attempt of the rollout's last call, not a new turn. Its row
//! records `attempt` (1, 2, …) and `attempt_of` (the sequence number of the
//! first attempt); the datasets use the last successful attempt.
//!
//! Only a rollout's latest call is remembered (a retry repeats the request
//! that just failed), for at most [`MAX_ROLLOUTS`] rollouts.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Rollouts whose last call is remembered; past it the map starts over.
const MAX_ROLLOUTS: usize = 65_536;

struct Last {
    hash: u64,
    first_sequence: i64,
    attempts: u32,
    at: Instant,
}

/// The last call of each rollout.
pub struct Attempts {
    window: Duration,
    last: Mutex<HashMap<String, Last>>,
}

/// Which attempt a call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    /// 0 for a first attempt.
    pub attempt: u32,
    /// The sequence number of the first attempt, for a retry.
    pub attempt_of: Option<i64>,
}

impl Attempts {
    pub fn new(window: Duration) -> Attempts {
        Attempts {
            window,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// A call of `rollout` numbered `sequence`, with request body `body`,
    /// and the SDK's retry count when it sent one.
    pub fn observe(
        &self,
        rollout: &str,
        sequence: i64,
        body: &[u8],
        sdk_retry: Option<u32>,
    ) -> Attempt {
        // The body's length and CRC-32 (the WAL's checksum, hardware-fast):
        // every call pays it, and agent bodies run to megabytes.
        let hash = (body.len() as u64) << 32 | u64::from(crc32fast::hash(body));
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(l) = last.get_mut(rollout) {
            let retry = sdk_retry.is_some_and(|n| n > 0) || now.duration_since(l.at) <= self.window;
            if l.hash == hash && retry {
                l.attempts += 1;
                l.at = now;
                return Attempt {
                    attempt: l.attempts,
                    attempt_of: Some(l.first_sequence),
                };
            }
        }
        if last.len() >= MAX_ROLLOUTS && !last.contains_key(rollout) {
            last.clear();
        }
        last.insert(
            rollout.to_owned(),
            Last {
                hash,
                first_sequence: sequence,
                attempts: 0,
                at: now,
            },
        );
        Attempt {
            attempt: 0,
            attempt_of: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_body_again_is_an_attempt_a_new_body_a_turn() {
        let a = Attempts::new(Duration::from_secs(30));
        assert_eq!(a.observe("r", 0, b"x", None).attempt, 0);
        assert_eq!(
            a.observe("r", 1, b"x", Some(1)),
            Attempt {
                attempt: 1,
                attempt_of: Some(0)
            }
        );
        assert_eq!(a.observe("r", 2, b"x", None).attempt_of, Some(0));
        assert_eq!(a.observe("r", 3, b"y", None).attempt, 0);
        // Another rollout's identical body is its own call.
        assert_eq!(a.observe("s", 0, b"y", None).attempt, 0);
        // Past the window, without the SDK's header: a new turn.
        let b = Attempts::new(Duration::ZERO);
        b.observe("r", 0, b"x", None);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(b.observe("r", 1, b"x", None).attempt, 0);
        assert_eq!(b.observe("r", 2, b"x", Some(2)).attempt, 1);
    }
}
