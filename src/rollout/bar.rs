//! Balanced Adaptive Rollout, as Orchard-SWE uses it for RL (slime's
//! progressive rollout): sample a task in strides, up to `n_max` samples,
//! until the finished samples can fill a group of `n` whose count of
//! positives lies in `[ceil(r_min·n), floor(r_max·n)]`, choosing the count
//! closest to the middle. If the ratio cannot be met by `n_max`, it is
//! relaxed to `[0, 1]`. Groups with an aborted sample, zero reward variance
//! or no positive are dropped.
//!
//! Pure: [`decide`] looks at the samples so far and says what to do next.

use serde::Serialize;

/// The knobs, with Orchard's defaults.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bar {
    /// Samples kept per group.
    pub n: usize,
    /// Most samples generated per group.
    pub n_max: usize,
    /// Samples generated per stride.
    pub stride: usize,
    pub r_min: f64,
    pub r_max: f64,
}

impl Default for Bar {
    fn default() -> Bar {
        Bar {
            n: 4,
            n_max: 8,
            stride: 8,
            r_min: 0.25,
            r_max: 0.75,
        }
    }
}

/// A finished sample, as BAR sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sample {
    Positive,
    Negative,
    /// It never produced a usable reward (an infrastructure fault after
    /// every retry, or an ungraded timeout).
    Aborted,
}

/// Why a sample is in the group or not, recorded in its finish metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Why {
    Kept,
    SurplusPositive,
    SurplusNegative,
    Aborted,
    GroupDropped,
}

/// Why a whole group was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dropped {
    AbortedSample,
    ZeroVariance,
    NoPositive,
    TooFewSamples,
}

/// What to do after the samples so far.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Generate this many more samples.
    More(usize),
    /// The group is settled: one verdict per sample, in sample order.
    Settled {
        verdicts: Vec<Why>,
        positives: usize,
        /// The ratio had to be relaxed to [0, 1].
        relaxed: bool,
        dropped: Option<Dropped>,
    },
}

impl Bar {
    /// The first stride.
    pub fn first(&self) -> usize {
        self.stride.min(self.n_max).max(1)
    }

    fn pick(&self, lo: usize, hi: usize, pos: usize, neg: usize) -> Option<usize> {
        let mid = self.n as f64 / 2.0;
        (lo..=hi.min(self.n))
            .filter(|&c| c <= pos && self.n - c <= neg)
            .min_by(|a, b| {
                let (da, db) = ((*a as f64 - mid).abs(), (*b as f64 - mid).abs());
                da.total_cmp(&db).then(b.cmp(a))
            })
    }

    /// Decide on `samples`, all generated so far, all finished.
    pub fn decide(&self, samples: &[Sample]) -> Decision {
        let pos = samples.iter().filter(|s| **s == Sample::Positive).count();
        let neg = samples.iter().filter(|s| **s == Sample::Negative).count();
        let aborted = samples.len() - pos - neg;
        let settle = |dropped: Option<Dropped>, keep: Option<usize>, relaxed: bool| {
            let (mut p_left, mut n_left) = match keep {
                Some(c) if dropped.is_none() => (c, self.n - c),
                _ => (0, 0),
            };
            let verdicts = samples
                .iter()
                .map(|s| match s {
                    Sample::Aborted => Why::Aborted,
                    _ if dropped.is_some() => Why::GroupDropped,
                    Sample::Positive if p_left > 0 => {
                        p_left -= 1;
                        Why::Kept
                    }
                    Sample::Negative if n_left > 0 => {
                        n_left -= 1;
                        Why::Kept
                    }
                    Sample::Positive => Why::SurplusPositive,
                    Sample::Negative => Why::SurplusNegative,
                })
                .collect();
            Decision::Settled {
                verdicts,
                positives: keep.unwrap_or(0),
                relaxed,
                dropped,
            }
        };
        if aborted > 0 {
            return settle(Some(Dropped::AbortedSample), None, false);
        }
        let lo = (self.r_min * self.n as f64 - 1e-9).ceil().max(0.0) as usize;
        let hi = (self.r_max * self.n as f64 + 1e-9).floor().max(0.0) as usize;
        if let Some(c) = self.pick(lo, hi, pos, neg) {
            return settle(None, Some(c), false);
        }
        if samples.len() < self.n_max {
            return Decision::More(self.stride.min(self.n_max - samples.len()).max(1));
        }
        match self.pick(0, self.n, pos, neg) {
            None => settle(Some(Dropped::TooFewSamples), None, true),
            Some(0) => settle(Some(Dropped::NoPositive), Some(0), true),
            Some(c) if c == self.n => settle(Some(Dropped::ZeroVariance), Some(c), true),
            Some(c) => settle(None, Some(c), true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Sample::{Aborted as A, Negative as N, Positive as P};
    use super::*;

    fn settled(d: Decision) -> (Vec<Why>, usize, bool, Option<Dropped>) {
        match d {
            Decision::Settled {
                verdicts,
                positives,
                relaxed,
                dropped,
            } => (verdicts, positives, relaxed, dropped),
            other => panic!("not settled: {other:?}"),
        }
    }

    #[test]
    fn keeps_the_count_closest_to_the_middle() {
        let bar = Bar::default();
        let (v, pos, relaxed, dropped) = settled(bar.decide(&[P, P, P, N, N, N, P, N]));
        assert_eq!((pos, relaxed, dropped), (2, false, None));
        use Why::*;
        assert_eq!(
            v,
            [
                Kept,
                Kept,
                SurplusPositive,
                Kept,
                Kept,
                SurplusNegative,
                SurplusPositive,
                SurplusNegative
            ]
        );
        // Only one negative: 3 positives + 1 negative is the middle-most fill.
        let (v, pos, ..) = settled(bar.decide(&[P, P, P, P, P, N, P, P]));
        assert_eq!(pos, 3);
        assert_eq!(v.iter().filter(|w| **w == Kept).count(), 4);
    }

    #[test]
    fn strides_until_the_ratio_can_be_met() {
        let bar = Bar {
            stride: 4,
            ..Bar::default()
        };
        assert_eq!(bar.first(), 4);
        assert_eq!(bar.decide(&[P, P, P, P]), Decision::More(4));
        let (_, pos, relaxed, dropped) = settled(bar.decide(&[P, P, P, P, N, P, P, P]));
        assert_eq!((pos, relaxed, dropped), (3, false, None));
    }

    #[test]
    fn drops_what_cannot_train() {
        let bar = Bar::default();
        let (v, _, relaxed, dropped) = settled(bar.decide(&[P; 8]));
        assert_eq!((relaxed, dropped), (true, Some(Dropped::ZeroVariance)));
        assert!(v.iter().all(|w| *w == Why::GroupDropped));
        let (.., dropped) = settled(bar.decide(&[N; 8]));
        assert_eq!(dropped, Some(Dropped::NoPositive));
        let (v, .., dropped) = settled(bar.decide(&[P, N, A, N, P, N, N, N]));
        assert_eq!(dropped, Some(Dropped::AbortedSample));
        assert_eq!(v[2], Why::Aborted);
        // Not enough samples to fill a group at all.
        let small = Bar {
            n: 4,
            n_max: 3,
            stride: 3,
            ..Bar::default()
        };
        let (.., dropped) = settled(small.decide(&[P, N, N]));
        assert_eq!(dropped, Some(Dropped::TooFewSamples));
    }

    #[test]
    fn relaxes_the_ratio_when_the_window_is_empty() {
        // n = 4 with r in [0.3, 0.45]: ceil(1.2) = 2 > floor(1.8) = 1.
        let bar = Bar {
            r_min: 0.3,
            r_max: 0.45,
            ..Bar::default()
        };
        let (_, pos, relaxed, dropped) = settled(bar.decide(&[P, P, N, N, N, N, N, N]));
        assert_eq!((pos, relaxed, dropped), (2, true, None));
    }
}
