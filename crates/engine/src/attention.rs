//! Attention of query rows over their sequences' cached keys and values.
//!
//! Decoding reads the whole KV cache for every token, so the work is laid
//! out around reading it once:
//! - the query heads that share a key/value head (grouped-query attention)
//!   are computed together, so each cached key and value row is read once
//!   for all of them;
//! - a row's positions are cut into spans of [`SPAN`]; each span is a task
//!   of its own that keeps its own softmax maximum, sum and weighted values,
//!   and the spans are then joined exactly as one softmax over all of them
//!   (rescaled to the largest maximum). Long contexts thus spread over every
//!   thread even when one sequence decodes alone.
//!
//! How a row is cut depends on its position only, never on the batch, so a
//! sequence gets the same numbers alone and batched.

use crate::quant::{self, Simd};
use rayon::prelude::*;

/// Positions one task attends over.
pub const SPAN: usize = 256;

/// The layout shared by every task of one layer.
pub struct Layout {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub scale: f32,
}

/// One query row: the queries of all its heads, and the sequence's cached
/// keys and values (`kv_heads·head_dim` values per position) up to and
/// including its position.
pub struct Query<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub len: usize,
}

/// What one span gives for each of a group's heads: its softmax maximum,
/// the sum of exp(w - max), and the values weighted by those.
struct Part {
    max: Vec<f32>,
    sum: Vec<f32>,
    acc: Vec<f32>,
}

/// The vector operations a span is computed with. The SIMD ones are only
/// ever called from a function compiled for their instructions (below),
/// where they inline into the loops.
trait Ops {
    fn dot(a: &[f32], b: &[f32]) -> f32;
    fn axpy(a: f32, x: &[f32], y: &mut [f32]);
}

struct Portable;

impl Ops for Portable {
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        quant::dot(Simd::None, a, b)
    }
    #[inline(always)]
    fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        quant::axpy(Simd::None, a, x, y)
    }
}

#[cfg(target_arch = "x86_64")]
struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Ops for Avx2 {
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: called only from `part_avx2`, which runs where AVX2 and
        // FMA are present.
        unsafe { quant::avx2::dot(a, b) }
    }
    #[inline(always)]
    fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        // SAFETY: as for `dot`.
        unsafe { quant::avx2::axpy(a, x, y) }
    }
}

#[cfg(target_arch = "x86_64")]
struct Avx512;

#[cfg(target_arch = "x86_64")]
impl Ops for Avx512 {
    #[inline(always)]
    fn dot(a: &[f32], b: &[f32]) -> f32 {
        // SAFETY: called only from `part_avx512`, which runs where
        // AVX-512F is present.
        unsafe { quant::avx512::dot(a, b) }
    }
    #[inline(always)]
    fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        // SAFETY: as for `dot`.
        unsafe { quant::avx512::axpy(a, x, y) }
    }
}

type Span = std::ops::Range<usize>;

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn part_avx2(l: &Layout, query: &Query<'_>, kvh: usize, span: Span) -> Part {
    part_with::<Avx2>(l, query, kvh, span)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn part_avx512(l: &Layout, query: &Query<'_>, kvh: usize, span: Span) -> Part {
    part_with::<Avx512>(l, query, kvh, span)
}

fn part(l: &Layout, query: &Query<'_>, kvh: usize, span: Span, simd: Simd) -> Part {
    #[cfg(target_arch = "x86_64")]
    match simd {
        // SAFETY: `simd` names instructions this CPU has (`quant::simd`).
        Simd::Avx512 => return unsafe { part_avx512(l, query, kvh, span) },
        Simd::Avx2 => return unsafe { part_avx2(l, query, kvh, span) },
        Simd::None => {}
    }
    let _ = simd;
    part_with::<Portable>(l, query, kvh, span)
}

#[inline(always)]
fn part_with<O: Ops>(l: &Layout, query: &Query<'_>, kvh: usize, span: Span) -> Part {
    let (hd, group) = (l.head_dim, l.heads / l.kv_heads);
    let kvw = l.kv_heads * hd;
    let off = kvh * hd;
    let n = span.len();
    // w[g * n + j]: head g's score at the span's j-th position.
    let mut w = vec![0.0f32; group * n];
    for (j, pos) in span.clone().enumerate() {
        let key = &query.k[pos * kvw + off..][..hd];
        for g in 0..group {
            let qh = &query.q[(kvh * group + g) * hd..][..hd];
            w[g * n + j] = O::dot(qh, key) * l.scale;
        }
    }
    let mut max = vec![f32::NEG_INFINITY; group];
    let mut sum = vec![0.0f32; group];
    for g in 0..group {
        let row = &mut w[g * n..(g + 1) * n];
        max[g] = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for e in row.iter_mut() {
            *e = (*e - max[g]).exp();
            sum[g] += *e;
        }
    }
    let mut acc = vec![0.0f32; group * hd];
    for (j, pos) in span.enumerate() {
        let value = &query.v[pos * kvw + off..][..hd];
        for g in 0..group {
            O::axpy(w[g * n + j], value, &mut acc[g * hd..(g + 1) * hd]);
        }
    }
    Part { max, sum, acc }
}

/// Attention for every row: `out` holds `heads·head_dim` values per row.
pub fn attend(l: &Layout, queries: &[Query<'_>], out: &mut [f32]) {
    attend_with(l, queries, out, quant::simd())
}

fn attend_with(l: &Layout, queries: &[Query<'_>], out: &mut [f32], simd: Simd) {
    let (hd, group) = (l.head_dim, l.heads / l.kv_heads);
    // Every (row, key/value head, span), in order.
    let tasks: Vec<(usize, usize, usize)> = queries
        .iter()
        .enumerate()
        .flat_map(|(r, q)| {
            (0..l.kv_heads).flat_map(move |kvh| (0..q.len.div_ceil(SPAN)).map(move |s| (r, kvh, s)))
        })
        .collect();
    let parts: Vec<Part> = tasks
        .par_iter()
        .map(|&(r, kvh, s)| {
            let q = &queries[r];
            part(l, q, kvh, s * SPAN..((s + 1) * SPAN).min(q.len), simd)
        })
        .collect();
    // Where each (row, key/value head)'s parts begin.
    let mut first = Vec::with_capacity(queries.len() * l.kv_heads + 1);
    first.push(0);
    for q in queries {
        for _ in 0..l.kv_heads {
            first.push(first.last().copied().unwrap_or(0) + q.len.div_ceil(SPAN));
        }
    }
    out.par_chunks_mut(group * hd)
        .enumerate()
        .for_each(|(i, o)| {
            let ps = &parts[first[i]..first[i + 1]];
            o.fill(0.0);
            for g in 0..group {
                let top = ps
                    .iter()
                    .map(|p| p.max[g])
                    .fold(f32::NEG_INFINITY, f32::max);
                let mut total = 0.0;
                let og = &mut o[g * hd..(g + 1) * hd];
                for p in ps {
                    let f = (p.max[g] - top).exp();
                    total += p.sum[g] * f;
                    quant::axpy(simd, f, &p.acc[g * hd..(g + 1) * hd], og);
                }
                let inv = 1.0 / total;
                og.iter_mut().for_each(|x| *x *= inv);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel levels this CPU runs.
    fn levels() -> Vec<Simd> {
        let mut l = vec![Simd::None];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                l.push(Simd::Avx2);
            }
            if std::is_x86_feature_detected!("avx512f") {
                l.push(Simd::Avx512);
            }
        }
        l
    }

    /// Plain softmax attention in f64.
    fn reference(l: &Layout, q: &Query<'_>) -> Vec<f64> {
        let (hd, group, kvw) = (l.head_dim, l.heads / l.kv_heads, l.kv_heads * l.head_dim);
        let mut out = vec![0.0; l.heads * hd];
        for h in 0..l.heads {
            let off = (h / group) * hd;
            let w: Vec<f64> = (0..q.len)
                .map(|j| {
                    (0..hd)
                        .map(|d| q.q[h * hd + d] as f64 * q.k[j * kvw + off + d] as f64)
                        .sum::<f64>()
                        * l.scale as f64
                })
                .collect();
            let m = w.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = w.iter().map(|x| (x - m).exp()).collect();
            let s: f64 = e.iter().sum();
            for (j, ej) in e.iter().enumerate() {
                for d in 0..hd {
                    out[h * hd + d] += ej / s * q.v[j * kvw + off + d] as f64;
                }
            }
        }
        out
    }

    #[test]
    fn spans_join_into_one_softmax() {
        let l = Layout {
            heads: 6,
            kv_heads: 2,
            head_dim: 8,
            scale: 0.35,
        };
        let kvw = l.kv_heads * l.head_dim;
        // Lengths within one span, at its edge, and over several.
        for len in [1, 5, SPAN, SPAN + 1, 3 * SPAN + 17] {
            let f = |i: usize, m: usize| ((i * m % 97) as f32 - 48.0) / 19.0;
            let q: Vec<f32> = (0..l.heads * l.head_dim).map(|i| f(i, 31)).collect();
            let k: Vec<f32> = (0..len * kvw).map(|i| f(i, 7)).collect();
            let v: Vec<f32> = (0..len * kvw).map(|i| f(i, 13)).collect();
            let query = Query {
                q: &q,
                k: &k,
                v: &v,
                len,
            };
            let want = reference(&l, &query);
            for simd in levels() {
                let mut out = vec![0.0; l.heads * l.head_dim];
                attend_with(&l, std::slice::from_ref(&query), &mut out, simd);
                for (got, want) in out.iter().zip(&want) {
                    assert!(
                        (*got as f64 - want).abs() < 1e-4,
                        "{simd:?} len {len}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
