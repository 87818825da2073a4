//! rollcall's embedded model: a llama-architecture transformer's forward
//! pass on the CPU, on weights kept in their GGUF formats ([`quant`]), on a
//! pool of `threads` threads. rollcall reads the GGUF file and builds the
//! [`Engine`] (`rollcall::model::load`); this crate only computes.
//!
//! One call of [`Engine::forward`] takes a batch of sequences, each with
//! its own KV cache ([`Cache`]) and its new tokens: a prompt to read, or
//! the one token each decoding sequence sampled last. Their matrix
//! products run together, so that the weights, which is what decoding
//! waits on, are read once per step for the whole batch.
//!
//! [`quant`] holds the weight matrices and their products.
//!
//! Every product, norm and softmax is computed in f32 on exactly the
//! dequantized weights, the way `transformers` runs a GGUF file, so the
//! engine's answers match it to the token (the tests in
//! `tests/python/test_embedded.py`).

mod attention;
pub mod quant;

use quant::{Matrix, Prepared};
use rayon::prelude::*;

/// The shape of a llama model.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    pub layers: usize,
    pub dim: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub eps: f32,
    pub rope_theta: f32,
    /// Positions the model attends over (the rotary table's length).
    pub context: usize,
}

/// One transformer block's weights. Matrices are `rows × cols` with `cols`
/// the input width: `q` and `o` are `dim × dim`, `k` and `v`
/// `kv_heads·head_dim × dim`, `gate` and `up` `ffn × dim`, `down`
/// `dim × ffn`; the norms hold `dim` values.
pub struct Layer {
    pub attn_norm: Vec<f32>,
    pub q: Matrix,
    pub k: Matrix,
    pub v: Matrix,
    pub o: Matrix,
    pub ffn_norm: Vec<f32>,
    pub gate: Matrix,
    pub up: Matrix,
    pub down: Matrix,
}

/// A loaded model, ready to run batches.
pub struct Engine {
    pub shape: Shape,
    embed: Matrix,
    layers: Vec<Layer>,
    norm: Vec<f32>,
    /// `None`: the output projection is the embedding (tied).
    output: Option<Matrix>,
    /// `cos, sin` per position and rotary pair.
    rope: Vec<(f32, f32)>,
    pool: rayon::ThreadPool,
}

/// Query rows whose attention is computed at once.
const ATTENTION_ROWS: usize = 64;

/// One sequence's keys and values, per layer, position after position.
#[derive(Clone, Default)]
pub struct Cache {
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    len: usize,
}

impl Cache {
    /// Positions held.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forget every position from `n` on.
    pub fn truncate(&mut self, n: usize, shape: &Shape) {
        let w = shape.kv_heads * shape.head_dim;
        self.len = self.len.min(n);
        for t in self.k.iter_mut().chain(self.v.iter_mut()) {
            t.truncate(self.len * w);
        }
    }
}

/// Which rows of hidden states a sequence wants back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// None: the tokens only fill the cache.
    Nothing,
    /// The last token's (to sample the next one).
    Last,
    /// Every token's (prompt logprobs).
    All,
}

/// A sequence's part of a batch.
pub struct Seq<'a> {
    pub cache: &'a mut Cache,
    pub tokens: &'a [u32],
    pub want: Want,
}

/// Why an engine cannot be built from the weights given.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// {0}
    #[error("{0}")]
    Shape(String),
    /// cannot start the model's threads: {0}
    #[error("cannot start the model's threads: {0}")]
    Threads(#[from] rayon::ThreadPoolBuildError),
}

/// Why a batch could not run.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// token id {0} is outside the model's vocabulary
    #[error("token id {0} is outside the model's vocabulary")]
    Token(u32),
    /// the sequence would reach {0} positions, beyond the model's context
    #[error("the sequence would reach {0} positions, beyond the model's context")]
    Context(usize),
}

/// Up to this many rows in a step, every product is computed on the packed
/// blocks, row by row, the way a single decoding token is; beyond it (a
/// prompt) each weight row is dequantized once for all the rows. So a
/// batch of up to this many decoding sequences computes exactly what each
/// would alone.
pub const PACKED_ROWS: usize = 16;

/// Rows of a batch: which sequence and position each belongs to.
struct Row {
    seq: usize,
    pos: usize,
}

fn rms_norm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let r = 1.0 / (ms + eps).sqrt();
    for ((o, v), w) in out.iter_mut().zip(x).zip(w) {
        *o = w * (v * r);
    }
}

impl Engine {
    /// An engine over these weights, computing on `threads` threads (0: one
    /// per core). `output` is `None` when the output projection is the
    /// embedding (tied weights). Every shape is checked against `shape`.
    pub fn new(
        shape: Shape,
        embed: Matrix,
        layers: Vec<Layer>,
        norm: Vec<f32>,
        output: Option<Matrix>,
        threads: usize,
    ) -> Result<Engine, BuildError> {
        let s = &shape;
        let kvw = s.kv_heads * s.head_dim;
        let check = |what: &str, m: &Matrix, rows: usize, cols: usize| {
            if (m.rows(), m.cols()) == (rows, cols) {
                return Ok(());
            }
            Err(BuildError::Shape(format!(
                "{what} is {}x{}, not {rows}x{cols}",
                m.rows(),
                m.cols()
            )))
        };
        if s.heads == 0
            || s.kv_heads == 0
            || !s.heads.is_multiple_of(s.kv_heads)
            || s.heads * s.head_dim != s.dim
            || !s.head_dim.is_multiple_of(2)
            || layers.len() != s.layers
        {
            return Err(BuildError::Shape(format!("inconsistent shape {s:?}")));
        }
        check("the embedding", &embed, s.vocab, s.dim)?;
        if let Some(o) = &output {
            check("the output projection", o, s.vocab, s.dim)?;
        }
        for (i, l) in layers.iter().enumerate() {
            check(&format!("layer {i}'s q"), &l.q, s.dim, s.dim)?;
            check(&format!("layer {i}'s k"), &l.k, kvw, s.dim)?;
            check(&format!("layer {i}'s v"), &l.v, kvw, s.dim)?;
            check(&format!("layer {i}'s o"), &l.o, s.dim, s.dim)?;
            check(&format!("layer {i}'s gate"), &l.gate, s.ffn, s.dim)?;
            check(&format!("layer {i}'s up"), &l.up, s.ffn, s.dim)?;
            check(&format!("layer {i}'s down"), &l.down, s.dim, s.ffn)?;
            if l.attn_norm.len() != s.dim || l.ffn_norm.len() != s.dim {
                return Err(BuildError::Shape(format!(
                    "layer {i}'s norms are not {} wide",
                    s.dim
                )));
            }
        }
        if norm.len() != s.dim {
            return Err(BuildError::Shape(format!(
                "the final norm is not {} wide",
                s.dim
            )));
        }
        let half = s.head_dim / 2;
        let mut rope = Vec::with_capacity(s.context * half);
        for pos in 0..s.context {
            for i in 0..half {
                // As transformers computes it: the inverse frequency, then
                // the angle, in f32.
                let inv = 1.0f32 / s.rope_theta.powf((2 * i) as f32 / s.head_dim as f32);
                let a = pos as f32 * inv;
                rope.push((a.cos(), a.sin()));
            }
        }
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("rollcall-model-{i}"))
            .build()?;
        Ok(Engine {
            shape,
            embed,
            layers,
            norm,
            output,
            rope,
            pool,
        })
    }

    /// Threads in the engine's pool.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// `y = W·x` for every row of `xs` (`n × W.cols`), into `n × W.rows`,
    /// for each of `ws` (which share their input width) in one parallel
    /// step.
    fn matmul<const K: usize>(&self, ws: [&Matrix; K], xs: &[f32], n: usize) -> [Vec<f32>; K] {
        let cols = ws[0].cols();
        let mut outs: [Vec<f32>; K] = std::array::from_fn(|i| vec![0.0f32; n * ws[i].rows()]);
        let threads = self.threads();
        if n > PACKED_ROWS {
            // Many rows (a prompt): each thread takes a run of tokens and
            // reads every weight row once for them, dequantized.
            let per = n.div_ceil(threads).clamp(1, 64);
            for (w, out) in ws.iter().zip(outs.iter_mut()) {
                let rows = w.rows();
                out.par_chunks_mut(per * rows)
                    .zip(xs.par_chunks(per * cols))
                    .for_each(|(o, x)| {
                        let mut row = vec![0.0f32; cols];
                        let simd = quant::simd();
                        for r in 0..rows {
                            w.dequantize_row(r, &mut row);
                            for (t, xt) in x.chunks_exact(cols).enumerate() {
                                o[t * rows + r] = quant::dot(simd, &row, xt);
                            }
                        }
                    });
            }
        } else {
            // Few rows (decoding): the weight rows of every matrix are
            // split between the threads, each product computed on the
            // packed blocks.
            let prepared: Vec<Prepared<'_>> = xs.chunks_exact(cols).map(Prepared::new).collect();
            let total: usize = ws.iter().map(|w| w.rows()).sum();
            let chunk = total.div_ceil(threads * 2).max(16);
            // (matrix, first row, last row) runs of at most `chunk` rows
            let mut runs = Vec::new();
            for (i, w) in ws.iter().enumerate() {
                let mut lo = 0;
                while lo < w.rows() {
                    let hi = (lo + chunk).min(w.rows());
                    runs.push((i, lo, hi));
                    lo = hi;
                }
            }
            let parts: Vec<Vec<f32>> = runs
                .par_iter()
                .map(|&(i, lo, hi)| {
                    let mut part = Vec::with_capacity((hi - lo) * n);
                    for p in &prepared {
                        part.extend((lo..hi).map(|r| ws[i].row_dot(r, p)));
                    }
                    part
                })
                .collect();
            for (&(i, lo, hi), part) in runs.iter().zip(parts) {
                let rows = ws[i].rows();
                let width = hi - lo;
                for t in 0..n {
                    outs[i][t * rows + lo..t * rows + hi]
                        .copy_from_slice(&part[t * width..(t + 1) * width]);
                }
            }
        }
        outs
    }

    fn rotate(&self, x: &mut [f32], heads: usize, pos: usize) {
        let hd = self.shape.head_dim;
        let table = &self.rope[pos * (hd / 2)..(pos + 1) * (hd / 2)];
        for h in 0..heads {
            let v = &mut x[h * hd..(h + 1) * hd];
            for (i, &(c, s)) in table.iter().enumerate() {
                let (a, b) = (v[2 * i], v[2 * i + 1]);
                v[2 * i] = a * c - b * s;
                v[2 * i + 1] = a * s + b * c;
            }
        }
    }

    /// Run a batch: every sequence's tokens are appended to its cache, and
    /// the final-norm hidden states it wants come back (`dim` values per
    /// row), one vector per sequence.
    pub fn forward(&self, batch: &mut [Seq<'_>]) -> Result<Vec<Vec<f32>>, ForwardError> {
        self.pool.install(|| self.forward_in_pool(batch))
    }

    fn forward_in_pool(&self, batch: &mut [Seq<'_>]) -> Result<Vec<Vec<f32>>, ForwardError> {
        let s = &self.shape;
        let (dim, hd) = (s.dim, s.head_dim);
        let kvw = s.kv_heads * hd;
        let mut rows = Vec::new();
        for (i, seq) in batch.iter().enumerate() {
            let end = seq.cache.len + seq.tokens.len();
            if end > s.context {
                return Err(ForwardError::Context(end));
            }
            if let Some(&t) = seq.tokens.iter().find(|&&t| t as usize >= s.vocab) {
                return Err(ForwardError::Token(t));
            }
            rows.extend((seq.cache.len..end).map(|pos| Row { seq: i, pos }));
        }
        let n = rows.len();
        for seq in batch.iter_mut() {
            if seq.cache.k.len() != s.layers {
                seq.cache.k = vec![Vec::new(); s.layers];
                seq.cache.v = vec![Vec::new(); s.layers];
                seq.cache.len = 0;
            }
        }
        let mut x = vec![0.0f32; n * dim];
        let tokens: Vec<u32> = batch
            .iter()
            .flat_map(|q| q.tokens.iter().copied())
            .collect();
        // Runs of rows short enough that a thread's share of the work
        // outweighs handing it over (decoding runs them on one thread).
        let few = 8;
        x.par_chunks_mut(dim)
            .zip(tokens.par_iter())
            .with_min_len(few)
            .for_each(|(row, &t)| self.embed.dequantize_row(t as usize, row));
        let mut h = vec![0.0f32; n * dim];
        let layout = attention::Layout {
            heads: s.heads,
            kv_heads: s.kv_heads,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
        };
        for (li, layer) in self.layers.iter().enumerate() {
            h.par_chunks_mut(dim)
                .zip(x.par_chunks(dim))
                .with_min_len(few)
                .for_each(|(o, xi)| rms_norm(xi, &layer.attn_norm, s.eps, o));
            let [mut q, mut k, v] = self.matmul([&layer.q, &layer.k, &layer.v], &h, n);
            q.par_chunks_mut(s.heads * hd)
                .zip(k.par_chunks_mut(kvw))
                .zip(rows.par_iter())
                .with_min_len(few)
                .for_each(|((qi, ki), r)| {
                    self.rotate(qi, s.heads, r.pos);
                    self.rotate(ki, s.kv_heads, r.pos);
                });
            for (r, (ki, vi)) in rows
                .iter()
                .zip(k.chunks_exact(kvw).zip(v.chunks_exact(kvw)))
            {
                let c = &mut batch[r.seq].cache;
                c.k[li].extend_from_slice(ki);
                c.v[li].extend_from_slice(vi);
            }
            let caches: Vec<&Cache> = batch.iter().map(|q| &*q.cache).collect();
            let queries: Vec<attention::Query<'_>> = rows
                .iter()
                .zip(q.chunks_exact(dim))
                .map(|(r, qi)| attention::Query {
                    q: qi,
                    k: &caches[r.seq].k[li],
                    v: &caches[r.seq].v[li],
                    len: r.pos + 1,
                })
                .collect();
            let mut att = vec![0.0f32; n * dim];
            // Rows at a time, so that the spans' partial results stay small.
            for (qs, out) in queries
                .chunks(ATTENTION_ROWS)
                .zip(att.chunks_mut(ATTENTION_ROWS * dim))
            {
                attention::attend(&layout, qs, out);
            }
            let [o] = self.matmul([&layer.o], &att, n);
            let elems = few * dim;
            x.par_iter_mut()
                .zip(o.par_iter())
                .with_min_len(elems)
                .for_each(|(a, b)| *a += b);
            h.par_chunks_mut(dim)
                .zip(x.par_chunks(dim))
                .with_min_len(few)
                .for_each(|(o, xi)| rms_norm(xi, &layer.ffn_norm, s.eps, o));
            let [mut g, u] = self.matmul([&layer.gate, &layer.up], &h, n);
            g.par_iter_mut()
                .zip(u.par_iter())
                .with_min_len(elems)
                .for_each(|(g, u)| {
                    *g = *g / (1.0 + (-*g).exp()) * u;
                });
            let [d] = self.matmul([&layer.down], &g, n);
            x.par_iter_mut()
                .zip(d.par_iter())
                .with_min_len(elems)
                .for_each(|(a, b)| *a += b);
        }
        for seq in batch.iter_mut() {
            seq.cache.len += seq.tokens.len();
        }
        let mut out = Vec::with_capacity(batch.len());
        let mut start = 0;
        for seq in batch.iter() {
            let m = seq.tokens.len();
            let pick = match seq.want {
                Want::Nothing => start..start,
                Want::Last => start + m.saturating_sub(1)..start + m,
                Want::All => start..start + m,
            };
            let mut hs = vec![0.0f32; pick.len() * dim];
            for (o, t) in hs.chunks_exact_mut(dim).zip(pick) {
                rms_norm(&x[t * dim..(t + 1) * dim], &self.norm, s.eps, o);
            }
            out.push(hs);
            start += m;
        }
        Ok(out)
    }

    /// The logits of final hidden states (`dim` values each, one state
    /// after another): `vocab` values per state.
    pub fn logits(&self, hidden: &[f32]) -> Vec<f32> {
        let w = self.output.as_ref().unwrap_or(&self.embed);
        let n = hidden.len() / self.shape.dim;
        let hidden = &hidden[..n * self.shape.dim];
        self.pool.install(|| {
            let [out] = self.matmul([w], hidden, n);
            out
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small model of pseudo-random f32 weights.
    fn model(threads: usize) -> Engine {
        let shape = Shape {
            layers: 2,
            dim: 64,
            heads: 4,
            kv_heads: 2,
            head_dim: 16,
            ffn: 96,
            vocab: 101,
            eps: 1e-5,
            rope_theta: 10_000.0,
            context: 64,
        };
        let mut seed = 7u64;
        let mut m = |rows: usize, cols: usize| {
            let v = (0..rows * cols)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.4
                })
                .collect();
            Matrix::dense(rows, cols, v).unwrap()
        };
        let s = &shape;
        let kvw = s.kv_heads * s.head_dim;
        let embed = m(s.vocab, s.dim);
        let layers = (0..s.layers)
            .map(|_| Layer {
                attn_norm: vec![1.0; s.dim],
                q: m(s.dim, s.dim),
                k: m(kvw, s.dim),
                v: m(kvw, s.dim),
                o: m(s.dim, s.dim),
                ffn_norm: vec![0.9; s.dim],
                gate: m(s.ffn, s.dim),
                up: m(s.ffn, s.dim),
                down: m(s.dim, s.ffn),
            })
            .collect();
        Engine::new(shape, embed, layers, vec![1.1; 64], None, threads).unwrap()
    }

    fn argmax(v: &[f32]) -> u32 {
        v.iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .map_or(0, |(i, _)| i as u32)
    }

    /// Greedy tokens after `prompt`, decoded alone.
    fn alone(e: &Engine, prompt: &[u32], steps: usize) -> Vec<u32> {
        let mut cache = Cache::default();
        let mut want = e
            .forward(&mut [Seq {
                cache: &mut cache,
                tokens: prompt,
                want: Want::Last,
            }])
            .unwrap();
        let mut out = Vec::new();
        for _ in 0..steps {
            let t = argmax(&e.logits(&want[0]));
            out.push(t);
            want = e
                .forward(&mut [Seq {
                    cache: &mut cache,
                    tokens: &[t],
                    want: Want::Last,
                }])
                .unwrap();
        }
        out
    }

    #[test]
    fn batched_decoding_gives_each_sequence_its_own_tokens() {
        let e = model(2);
        let prompts: [&[u32]; 4] = [
            &[1, 2, 3],
            &[4, 5, 6, 7, 8, 9, 10],
            &[11],
            &[12, 13, 14, 15, 16],
        ];
        let solo: Vec<Vec<u32>> = prompts.iter().map(|p| alone(&e, p, 12)).collect();
        let mut caches: Vec<Cache> = vec![Cache::default(); 4];
        let mut last: Vec<u32> = Vec::new();
        for (c, p) in caches.iter_mut().zip(prompts) {
            let h = e
                .forward(&mut [Seq {
                    cache: c,
                    tokens: p,
                    want: Want::Last,
                }])
                .unwrap();
            last.push(argmax(&e.logits(&h[0])));
        }
        let mut got: Vec<Vec<u32>> = last.iter().map(|&t| vec![t]).collect();
        for _ in 1..12 {
            let toks = last.clone();
            let mut batch: Vec<Seq<'_>> = caches
                .iter_mut()
                .zip(&toks)
                .map(|(c, t)| Seq {
                    cache: c,
                    tokens: std::slice::from_ref(t),
                    want: Want::Last,
                })
                .collect();
            let hs = e.forward(&mut batch).unwrap();
            for (i, h) in hs.iter().enumerate() {
                last[i] = argmax(&e.logits(h));
                got[i].push(last[i]);
            }
        }
        assert_eq!(got, solo);
    }

    #[test]
    fn a_prompt_read_at_once_matches_one_token_at_a_time() {
        let e = model(2);
        let prompt: Vec<u32> = (0..20).map(|i| (i * 37 % 101) as u32).collect();
        let mut whole = Cache::default();
        let all = e
            .forward(&mut [Seq {
                cache: &mut whole,
                tokens: &prompt,
                want: Want::All,
            }])
            .unwrap();
        assert_eq!(all[0].len(), prompt.len() * 64);
        let mut step = Cache::default();
        for (i, t) in prompt.iter().enumerate() {
            let h = e
                .forward(&mut [Seq {
                    cache: &mut step,
                    tokens: std::slice::from_ref(t),
                    want: Want::Last,
                }])
                .unwrap();
            for (a, b) in h[0].iter().zip(&all[0][i * 64..(i + 1) * 64]) {
                assert!((a - b).abs() < 1e-4, "position {i}: {a} vs {b}");
            }
        }
        assert_eq!(whole.len(), step.len());
        // Cut back and read again: the same states.
        whole.truncate(10, &e.shape);
        let again = e
            .forward(&mut [Seq {
                cache: &mut whole,
                tokens: &prompt[10..],
                want: Want::All,
            }])
            .unwrap();
        for (a, b) in again[0].iter().zip(&all[0][10 * 64..]) {
            assert!((a - b).abs() < 1e-4);
        }
    }

    #[test]
    fn threads_do_not_change_the_answer() {
        let prompt = [3u32, 1, 4, 1, 5, 9, 2, 6];
        assert_eq!(alone(&model(1), &prompt, 10), alone(&model(3), &prompt, 10));
    }

    #[test]
    fn bad_tokens_and_overlong_sequences_are_errors() {
        let e = model(1);
        let mut c = Cache::default();
        let r = e.forward(&mut [Seq {
            cache: &mut c,
            tokens: &[500],
            want: Want::Last,
        }]);
        assert!(matches!(r, Err(ForwardError::Token(500))));
        let long = vec![1u32; 65];
        let r = e.forward(&mut [Seq {
            cache: &mut c,
            tokens: &long,
            want: Want::Last,
        }]);
        assert!(matches!(r, Err(ForwardError::Context(65))));
        assert!(c.is_empty(), "a refused batch leaves the cache as it was");
    }
}
