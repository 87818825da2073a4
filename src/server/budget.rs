//! Per-rollout budgets: the most calls, total tokens and prompt tokens a
//! rollout may use (`[rollouts.budget]` for every rollout; a rollout's own
//! through `PUT /v1/rollouts/<id>/budget`, which `rollcall run` and
//! `rollcall batch` use, or the `x-rollcall-budget` header on a call).
//!
//! A call past a limit is refused before it is sent, in the harness's own
//! API format, and recorded as `budget_exceeded`:
//! - past `max_prompt_tokens`, with the context-length error the harness's
//!   API returns for an over-long prompt, so that its own compaction starts;
//! - past `max_calls` or `max_total_tokens`, with a 400 `budget_exceeded`.
//!
//! Calls count once per logical call: a retry (an attempt) and a side call
//! are not turns. Tokens are what the upstream reported in each answer's
//! usage, retries and side calls included; an answer without usage (a Chat
//! Completions stream that did not ask for it) counts none. A prompt's size
//! is known only once the upstream has answered, so a call's prompt is
//! sized beforehand from its request's bytes, at the rollout's own bytes per
//! prompt token (from its last answered call), or `bytes_per_token` (4)
//! before that.
//!
//! A rollout's spending is kept until it finishes, for at most
//! [`MAX_ROLLOUTS`] rollouts (the oldest forgotten first).

use crate::config::Budget;
use crate::dialect::Usage;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Rollouts whose spending is kept.
pub const MAX_ROLLOUTS: usize = 262_144;

/// Request bytes per prompt token before a rollout has a ratio of its own.
const BYTES_PER_TOKEN: f64 = 4.0;

/// The header that sets a call's rollout's budget.
pub const HEADER: &str = "x-rollcall-budget";
/// [`HEADER`] as a header name: a lookup by it skips checking and
/// lower-casing the name's text on every call.
pub const HEADER_NAME: http::HeaderName = http::HeaderName::from_static(HEADER);

/// Which limit a call would pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    Calls { max: u64 },
    Tokens { max: u64, used: u64 },
    Prompt { max: u64, estimated: u64 },
}

impl std::fmt::Display for Over {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Over::Calls { max } => write!(f, "the rollout has made {max} calls, all its budget allows (max_calls)"),
            Over::Tokens { max, used } => write!(
                f,
                "the rollout has used {used} tokens of its {max} (budget max_total_tokens)"
            ),
            Over::Prompt { max, estimated } => write!(
                f,
                "the prompt is about {estimated} tokens, over the rollout's {max} (budget max_prompt_tokens)"
            ),
        }
    }
}

#[derive(Default)]
struct Spent {
    /// The rollout's own limits, over the default.
    own: Budget,
    calls: u64,
    tokens: u64,
    /// Request bytes per prompt token of its last answered call.
    ratio: Option<f64>,
    /// The last call refused for `max_calls` (its first attempt's sequence
    /// number): its retries are refused too.
    refused: Option<i64>,
}

/// A call as a budget sees it.
#[derive(Debug, Clone, Copy)]
pub struct Ask {
    /// Its request's bytes.
    pub request_len: usize,
    /// The sequence number of its first attempt.
    pub call: i64,
    /// A first attempt of a trajectory call (not a retry, not a side call).
    pub turn: bool,
}

#[derive(Default)]
struct Book {
    spent: HashMap<String, Spent>,
    /// Rollouts in the order they were first seen, for eviction (with the
    /// names of some forgotten ones, at most twice the bound in all).
    order: VecDeque<String>,
}

impl Book {
    fn entry(&mut self, rollout: &str) -> &mut Spent {
        if !self.spent.contains_key(rollout) {
            while self.spent.len() >= MAX_ROLLOUTS {
                match self.order.pop_front() {
                    Some(old) => {
                        self.spent.remove(&old);
                    }
                    None => break,
                }
            }
            if self.order.len() >= 2 * MAX_ROLLOUTS {
                // Names of forgotten rollouts linger here; drop them.
                let spent = &self.spent;
                self.order.retain(|r| spent.contains_key(r));
            }
            self.order.push_back(rollout.to_owned());
        }
        self.spent.entry(rollout.to_owned()).or_default()
    }
}

/// What a rollout may still spend, and has spent.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Standing {
    pub budget: Budget,
    pub calls: u64,
    pub total_tokens: u64,
}

/// Every rollout's budget and spending.
pub struct Budgets {
    default: Budget,
    /// Some rollout has a budget of its own.
    any_own: AtomicBool,
    book: Mutex<Book>,
}

impl Budgets {
    pub fn new(default: Budget) -> Budgets {
        Budgets {
            default,
            any_own: AtomicBool::new(false),
            book: Mutex::new(Book::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// No rollout has a budget: calls pay nothing for them.
    fn off(&self) -> bool {
        self.default.is_unlimited() && !self.any_own.load(Ordering::Relaxed)
    }

    /// Give `rollout` limits of its own (each field set replaces the one
    /// before it). Returns its standing.
    pub fn set(&self, rollout: &str, own: Budget) -> Standing {
        self.any_own.store(true, Ordering::Relaxed);
        let mut book = self.lock();
        let e = book.entry(rollout);
        e.own = e.own.overridden_by(own);
        Standing {
            budget: self.default.overridden_by(e.own),
            calls: e.calls,
            total_tokens: e.tokens,
        }
    }

    /// `rollout`'s limits and spending.
    pub fn standing(&self, rollout: &str) -> Standing {
        let book = self.lock();
        let e = book.spent.get(rollout);
        Standing {
            budget: self
                .default
                .overridden_by(e.map(|e| e.own).unwrap_or_default()),
            calls: e.map_or(0, |e| e.calls),
            total_tokens: e.map_or(0, |e| e.tokens),
        }
    }

    /// Admit a call of `rollout`, counting it when it is a turn. `Ok(true)`:
    /// the call's usage is to be charged when it ends.
    pub fn admit(&self, rollout: &str, ask: Ask) -> Result<bool, Over> {
        let Ask {
            request_len,
            call,
            turn,
        } = ask;
        if self.off() {
            return Ok(false);
        }
        let mut book = self.lock();
        if self.default.is_unlimited() && !book.spent.contains_key(rollout) {
            return Ok(false);
        }
        let e = book.entry(rollout);
        let limits = self.default.overridden_by(e.own);
        if limits.is_unlimited() {
            return Ok(false);
        }
        if let Some(max) = limits.max_calls {
            if (turn && e.calls >= max) || e.refused == Some(call) {
                e.refused = Some(call);
                return Err(Over::Calls { max });
            }
        }
        if let Some(max) = limits.max_total_tokens {
            if e.tokens >= max {
                return Err(Over::Tokens {
                    max,
                    used: e.tokens,
                });
            }
        }
        if let Some(max) = limits.max_prompt_tokens {
            let per_token = e
                .ratio
                .or(limits.bytes_per_token)
                .unwrap_or(BYTES_PER_TOKEN);
            let estimated = (request_len as f64 / per_token).ceil() as u64;
            if estimated > max {
                return Err(Over::Prompt { max, estimated });
            }
        }
        if turn {
            e.calls += 1;
        }
        Ok(true)
    }

    /// A call of `rollout` (request `request_len` bytes) ended with `usage`.
    pub fn charge(&self, rollout: &str, request_len: usize, usage: &Usage) {
        let prompt = usage.prompt.unwrap_or(0).max(0) as u64;
        let completion = usage.completion.unwrap_or(0).max(0) as u64;
        let total = usage
            .total
            .map_or(prompt.saturating_add(completion), |t| t.max(0) as u64);
        let mut book = self.lock();
        let Some(e) = book.spent.get_mut(rollout) else {
            return;
        };
        e.tokens = e.tokens.saturating_add(total);
        if prompt > 0 && request_len > 0 {
            e.ratio = Some(request_len as f64 / prompt as f64);
        }
    }

    /// The rollout finished: forget its spending.
    pub fn forget(&self, rollout: &str) {
        if self.off() {
            return;
        }
        // Its name stays in `order` until eviction or compaction passes it.
        self.lock().spent.remove(rollout);
    }
}

/// Why a call is refused before it is sent.
#[derive(Debug, PartialEq)]
pub enum Refusal {
    /// Its `x-rollcall-budget` header could not be read.
    Header(String),
    /// It would pass its rollout's budget.
    Over(Over),
}

impl Budgets {
    /// A call: take the budget its `x-rollcall-budget` header sets, if any,
    /// then [`Budgets::admit`] it.
    pub fn check(
        &self,
        rollout: &str,
        header: Option<&http::HeaderValue>,
        ask: Ask,
    ) -> Result<bool, Refusal> {
        if let Some(v) = header {
            let own = v
                .to_str()
                .map_err(|_| format!("{HEADER}: not text"))
                .and_then(parse_header)
                .map_err(Refusal::Header)?;
            self.set(rollout, own);
        }
        self.admit(rollout, ask).map_err(Refusal::Over)
    }
}

/// Read an `x-rollcall-budget` header: `max_calls=40, max_total_tokens=200000,
/// max_prompt_tokens=32000` (any of them).
pub fn parse_header(v: &str) -> Result<Budget, String> {
    let mut b = Budget::default();
    for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, n)) = part.split_once('=') else {
            return Err(format!("{HEADER}: {part:?} is not key=value"));
        };
        let n: u64 = n
            .trim()
            .parse()
            .map_err(|_| format!("{HEADER}: {:?} must be a whole number, got {n:?}", k.trim()))?;
        match k.trim() {
            "max_calls" => b.max_calls = Some(n),
            "max_total_tokens" => b.max_total_tokens = Some(n),
            "max_prompt_tokens" => b.max_prompt_tokens = Some(n),
            other => {
                return Err(format!(
                    "{HEADER}: unknown limit {other:?} (max_calls, max_total_tokens, max_prompt_tokens)"
                ))
            }
        }
    }
    Ok(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(prompt: i64, completion: i64) -> Usage {
        Usage {
            prompt: Some(prompt),
            completion: Some(completion),
            ..Usage::default()
        }
    }

    fn turn(n: usize) -> Ask {
        Ask {
            request_len: n,
            call: 0,
            turn: true,
        }
    }

    #[test]
    fn no_budget_costs_nothing_and_keeps_nothing() {
        let b = Budgets::new(Budget::default());
        assert_eq!(b.admit("r", turn(1 << 20)), Ok(false));
        assert!(b.lock().spent.is_empty());
    }

    #[test]
    fn calls_count_turns_only() {
        let b = Budgets::new(Budget {
            max_calls: Some(2),
            ..Budget::default()
        });
        let ask = |call, turn| Ask {
            request_len: 10,
            call,
            turn,
        };
        assert_eq!(b.admit("r", ask(0, true)), Ok(true));
        assert_eq!(
            b.admit("r", ask(0, false)),
            Ok(true),
            "a retry is not a turn"
        );
        assert_eq!(b.admit("r", ask(2, true)), Ok(true));
        assert_eq!(
            b.admit("r", ask(2, false)),
            Ok(true),
            "a retry of an admitted call"
        );
        assert_eq!(b.admit("r", ask(4, true)), Err(Over::Calls { max: 2 }));
        assert_eq!(
            b.admit("r", ask(4, false)),
            Err(Over::Calls { max: 2 }),
            "a retry of a refused call is refused"
        );
        assert_eq!(
            b.admit("other", ask(0, true)),
            Ok(true),
            "budgets are per rollout"
        );
        b.forget("r");
        assert_eq!(b.admit("r", ask(6, true)), Ok(true));
    }

    #[test]
    fn tokens_are_what_the_upstream_reported() {
        let b = Budgets::new(Budget::default());
        b.set(
            "r",
            Budget {
                max_total_tokens: Some(100),
                ..Budget::default()
            },
        );
        assert_eq!(b.admit("r", turn(10)), Ok(true));
        b.charge("r", 10, &usage(60, 30));
        assert_eq!(b.admit("r", turn(10)), Ok(true));
        b.charge("r", 10, &usage(5, 5));
        assert_eq!(
            b.admit("r", turn(10)),
            Err(Over::Tokens {
                max: 100,
                used: 100
            })
        );
        assert_eq!(b.standing("r").total_tokens, 100);
        assert_eq!(b.admit("no-budget", turn(10)), Ok(false));
    }

    #[test]
    fn prompts_are_sized_at_the_rollouts_own_ratio() {
        let b = Budgets::new(Budget {
            max_prompt_tokens: Some(100),
            ..Budget::default()
        });
        // Before any answer: 4 bytes a token.
        assert_eq!(b.admit("r", turn(400)), Ok(true));
        assert_eq!(
            b.admit("r", turn(404)),
            Err(Over::Prompt {
                max: 100,
                estimated: 101
            })
        );
        // The upstream said 400 bytes were 50 tokens: 8 bytes a token.
        b.charge("r", 400, &usage(50, 1));
        assert_eq!(b.admit("r", turn(800)), Ok(true));
        assert!(matches!(b.admit("r", turn(808)), Err(Over::Prompt { .. })));
    }

    #[test]
    fn own_limits_override_the_default_field_by_field() {
        let b = Budgets::new(Budget {
            max_calls: Some(1),
            max_total_tokens: Some(10),
            ..Budget::default()
        });
        let s = b.set(
            "r",
            Budget {
                max_calls: Some(3),
                ..Budget::default()
            },
        );
        assert_eq!(s.budget.max_calls, Some(3));
        assert_eq!(s.budget.max_total_tokens, Some(10));
    }

    #[test]
    fn the_book_is_bounded() {
        let b = Budgets::new(Budget {
            max_calls: Some(1),
            ..Budget::default()
        });
        for i in 0..MAX_ROLLOUTS + 10 {
            let _ = b.admit(&format!("r{i}"), turn(1));
        }
        assert_eq!(b.lock().spent.len(), MAX_ROLLOUTS);
        assert_eq!(b.admit("r0", turn(1)), Ok(true), "the oldest was forgotten");
    }

    #[test]
    fn headers_parse_or_say_why_not() {
        let b = parse_header("max_calls=4, max_prompt_tokens = 32000").unwrap();
        assert_eq!((b.max_calls, b.max_prompt_tokens), (Some(4), Some(32000)));
        assert!(parse_header("max_calls=-1")
            .unwrap_err()
            .contains("whole number"));
        assert!(parse_header("calls=1")
            .unwrap_err()
            .contains("unknown limit"));
        assert!(parse_header("max_calls").unwrap_err().contains("key=value"));
    }
}
