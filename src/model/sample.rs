//! Choosing the next token from the model's logits: greedy at temperature
//! 0, else seeded sampling with temperature, top-k and top-p. The logprobs
//! reported are those of the model's own distribution (log-softmax of the
//! raw logits, before temperature), as vLLM reports them by default.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Debug, Clone, PartialEq)]
pub struct Sampling {
    pub temperature: f64,
    pub top_p: f64,
    /// 0 = all tokens.
    pub top_k: usize,
    pub seed: Option<u64>,
}

impl Default for Sampling {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
        }
    }
}

pub struct Sampler {
    cfg: Sampling,
    rng: StdRng,
}

/// `log_softmax(logits)`, in f64 for the sums.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let lse = max + sum.ln();
    logits.iter().map(|&l| (l as f64 - lse) as f32).collect()
}

/// The `n` most likely tokens, most likely first (lowest id first on ties).
pub fn top(logprobs: &[f32], n: usize) -> Vec<(u32, f32)> {
    let mut idx: Vec<u32> = (0..logprobs.len() as u32).collect();
    let n = n.min(idx.len());
    let key = |&i: &u32| (std::cmp::Reverse(OrdF32(logprobs[i as usize])), i);
    if n < idx.len() && n > 0 {
        idx.select_nth_unstable_by_key(n - 1, key);
    }
    idx.truncate(n);
    idx.sort_by_key(key);
    idx.into_iter().map(|i| (i, logprobs[i as usize])).collect()
}

struct OrdF32(f32);
impl PartialEq for OrdF32 {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o).is_eq()
    }
}
impl Eq for OrdF32 {}
impl PartialOrd for OrdF32 {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for OrdF32 {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&o.0)
    }
}

impl Sampler {
    pub fn new(cfg: Sampling) -> Self {
        let rng = match cfg.seed {
            Some(s) => StdRng::seed_from_u64(s),
            None => StdRng::from_os_rng(),
        };
        Self { cfg, rng }
    }

    /// The next token, given the log-softmax of the logits.
    pub fn next(&mut self, logprobs: &[f32]) -> u32 {
        if self.cfg.temperature <= 0.0 {
            return argmax(logprobs);
        }
        let t = self.cfg.temperature as f32;
        // Sorting is needed only to cut the tail (top-k, top-p).
        let candidates: Vec<(u32, f32)> = if self.cfg.top_k == 0 && self.cfg.top_p >= 1.0 {
            logprobs
                .iter()
                .enumerate()
                .map(|(i, &lp)| (i as u32, lp))
                .collect()
        } else {
            let k = if self.cfg.top_k == 0 {
                logprobs.len()
            } else {
                self.cfg.top_k
            };
            top(logprobs, k)
        };
        let max = candidates
            .iter()
            .map(|c| c.1)
            .fold(f32::NEG_INFINITY, f32::max)
            / t;
        let mut probs: Vec<(u32, f64)> = candidates
            .iter()
            .map(|&(i, lp)| (i, ((lp / t - max) as f64).exp()))
            .collect();
        let total: f64 = probs.iter().map(|p| p.1).sum();
        if self.cfg.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = probs
                .iter()
                .position(|p| {
                    acc += p.1 / total;
                    acc >= self.cfg.top_p
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
        }
        let total: f64 = probs.iter().map(|p| p.1).sum();
        let mut x = self.rng.random::<f64>() * total;
        for &(i, p) in &probs {
            if x < p {
                return i;
            }
            x -= p;
        }
        probs.last().map_or(0, |p| p.0)
    }
}

/// The most likely token; the lowest id on ties, as `torch.argmax`.
pub fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_normalizes() {
        let lp = log_softmax(&[1.0, 2.0, 3.0]);
        let s: f32 = lp.iter().map(|x| x.exp()).sum();
        assert!((s - 1.0).abs() < 1e-6);
        assert_eq!(argmax(&lp), 2);
        assert_eq!(
            top(&lp, 2).iter().map(|t| t.0).collect::<Vec<_>>(),
            vec![2, 1]
        );
    }

    #[test]
    fn greedy_and_seeded_sampling() {
        let lp = log_softmax(&[0.0, 0.1, 0.2, 0.3]);
        let mut g = Sampler::new(Sampling {
            temperature: 0.0,
            ..Default::default()
        });
        assert_eq!(g.next(&lp), 3);
        let draw = |seed| {
            let mut s = Sampler::new(Sampling {
                seed: Some(seed),
                ..Default::default()
            });
            (0..50).map(|_| s.next(&lp)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        let seen: std::collections::BTreeSet<_> = draw(7).into_iter().collect();
        assert_eq!(seen.len(), 4, "temperature 1 reaches every token");
        let mut narrow = Sampler::new(Sampling {
            top_p: 0.2,
            seed: Some(1),
            ..Default::default()
        });
        assert!(
            (0..50).all(|_| narrow.next(&lp) == 3),
            "top_p keeps only the head"
        );
        let mut k1 = Sampler::new(Sampling {
            top_k: 1,
            seed: Some(1),
            ..Default::default()
        });
        assert!((0..50).all(|_| k1.next(&lp) == 3));
    }
}
