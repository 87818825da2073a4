//! Weight matrices kept in their GGUF block formats (Q4_0, Q4_1, Q8_0) and
//! multiplied with f32 activations.
//!
//! The weights stay quantized in memory (a quarter to an eighth of f32's
//! bytes, which is what decoding waits on), but every product is computed
//! in f32 on the exact dequantized values: a block's `d·q + m` is never
//! rounded to fewer bits, and the activations are never quantized (unlike
//! llama.cpp's kernels, which round them to 8 bits). So the answers match
//! `transformers`, which dequantizes GGUF files to f32, up to the order of
//! f32 additions.
//!
//! A row's product with `x` is `Σ_b d_b·(q_b·x_b) + Σ_b m_b·(Σ x_b)`: the
//! block sums of `x` are computed once per vector ([`Prepared`]). The
//! kernels use AVX2 and FMA where the CPU has them, and portable loops
//! elsewhere; both are tested against the plain dequantized product.

use half::f16;

/// Values per quantization block (every format here).
pub const BLOCK: usize = 32;

/// A GGUF weight format this module multiplies without dequantizing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// 32 4-bit values `d·(q − 8)`: f16 `d`, 16 bytes.
    Q4_0,
    /// 32 4-bit values `d·q + m`: f16 `d`, f16 `m`, 16 bytes.
    Q4_1,
    /// 32 8-bit values `d·q`: f16 `d`, 32 signed bytes.
    Q8_0,
}

impl Format {
    /// Bytes of one block in the file.
    pub fn block_bytes(self) -> usize {
        match self {
            Format::Q4_0 => 18,
            Format::Q4_1 => 20,
            Format::Q8_0 => 34,
        }
    }

    /// Bytes of one block's values (after the scales).
    fn value_bytes(self) -> usize {
        match self {
            Format::Q4_0 | Format::Q4_1 => 16,
            Format::Q8_0 => 32,
        }
    }
}

/// Why a tensor cannot become a [`Matrix`].
#[derive(Debug, thiserror::Error)]
pub enum MatrixError {
    /// a quantized row of {cols} values is not a whole number of 32-value blocks
    #[error("a quantized row of {cols} values is not a whole number of 32-value blocks")]
    Ragged { cols: usize },
    /// the tensor holds {got} bytes where {rows}x{cols} needs {want}
    #[error("the tensor holds {got} bytes where {rows}x{cols} needs {want}")]
    Size {
        rows: usize,
        cols: usize,
        got: usize,
        want: usize,
    },
}

enum Data {
    /// Per block: `d`, `m` (Q4_1 only, else empty), and the packed values.
    Quant {
        format: Format,
        d: Vec<f32>,
        m: Vec<f32>,
        q: Vec<u8>,
    },
    F32(Vec<f32>),
}

/// A `rows × cols` weight matrix (`cols` is the input width): `y = W·x`.
pub struct Matrix {
    rows: usize,
    cols: usize,
    data: Data,
    simd: Simd,
}

/// An input vector with its per-block sums, ready for [`Matrix::row_dot`].
pub struct Prepared<'a> {
    pub x: &'a [f32],
    sums: Vec<f32>,
}

impl<'a> Prepared<'a> {
    pub fn new(x: &'a [f32]) -> Prepared<'a> {
        let sums = x.chunks(BLOCK).map(|c| c.iter().sum()).collect();
        Prepared { x, sums }
    }
}

/// The vector instructions the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Simd {
    /// Portable loops.
    None,
    /// AVX2 and FMA: 8 lanes.
    Avx2,
    /// AVX-512F: 16 lanes.
    Avx512,
}

/// The widest vector level this CPU has, capped by `ROLLCALL_ENGINE_SIMD`
/// (`avx2` or `none`; for comparisons with builds that stop there).
fn simd_available() -> Simd {
    let cap = std::env::var("ROLLCALL_ENGINE_SIMD").unwrap_or_default();
    if cap.eq_ignore_ascii_case("none") {
        return Simd::None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") && !cap.eq_ignore_ascii_case("avx2") {
            return Simd::Avx512;
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            return Simd::Avx2;
        }
    }
    Simd::None
}

impl Matrix {
    /// A matrix from a tensor's bytes in `format` (rows of `cols` values,
    /// row after row, as GGUF stores them).
    pub fn quantized(
        format: Format,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Matrix, MatrixError> {
        if !cols.is_multiple_of(BLOCK) {
            return Err(MatrixError::Ragged { cols });
        }
        let blocks = rows * (cols / BLOCK);
        let want = blocks * format.block_bytes();
        if bytes.len() != want {
            return Err(MatrixError::Size {
                rows,
                cols,
                got: bytes.len(),
                want,
            });
        }
        let half = |b: &[u8]| f16::from_le_bytes([b[0], b[1]]).to_f32();
        let vb = format.value_bytes();
        let mut d = Vec::with_capacity(blocks);
        let mut m = Vec::new();
        let mut q = Vec::with_capacity(blocks * vb);
        for block in bytes.chunks_exact(format.block_bytes()) {
            d.push(half(&block[0..2]));
            let values = match format {
                Format::Q4_1 => {
                    m.push(half(&block[2..4]));
                    &block[4..]
                }
                Format::Q4_0 | Format::Q8_0 => &block[2..],
            };
            q.extend_from_slice(values);
        }
        Ok(Matrix {
            rows,
            cols,
            data: Data::Quant { format, d, m, q },
            simd: simd(),
        })
    }

    /// A matrix of f32 values, row after row.
    pub fn dense(rows: usize, cols: usize, values: Vec<f32>) -> Result<Matrix, MatrixError> {
        if values.len() != rows * cols {
            return Err(MatrixError::Size {
                rows,
                cols,
                got: values.len() * 4,
                want: rows * cols * 4,
            });
        }
        Ok(Matrix {
            rows,
            cols,
            data: Data::F32(values),
            simd: simd(),
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Row `r` dequantized into `out` (`cols` values).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        let out = &mut out[..self.cols];
        match &self.data {
            Data::F32(v) => out.copy_from_slice(&v[r * self.cols..(r + 1) * self.cols]),
            Data::Quant { format, d, m, q } => {
                let nb = self.cols / BLOCK;
                let vb = format.value_bytes();
                for b in 0..nb {
                    let i = r * nb + b;
                    let qs = &q[i * vb..(i + 1) * vb];
                    let o = &mut out[b * BLOCK..(b + 1) * BLOCK];
                    match format {
                        Format::Q4_0 => {
                            for j in 0..16 {
                                o[j] = d[i] * ((qs[j] & 0x0F) as f32 - 8.0);
                                o[j + 16] = d[i] * ((qs[j] >> 4) as f32 - 8.0);
                            }
                        }
                        Format::Q4_1 => {
                            for j in 0..16 {
                                o[j] = d[i] * (qs[j] & 0x0F) as f32 + m[i];
                                o[j + 16] = d[i] * (qs[j] >> 4) as f32 + m[i];
                            }
                        }
                        Format::Q8_0 => {
                            for j in 0..32 {
                                o[j] = d[i] * (qs[j] as i8) as f32;
                            }
                        }
                    }
                }
            }
        }
    }

    /// Row `r` times `x`.
    pub fn row_dot(&self, r: usize, x: &Prepared<'_>) -> f32 {
        let cols = self.cols;
        assert!(
            r < self.rows && x.x.len() == cols,
            "row_dot: shape mismatch"
        );
        match &self.data {
            Data::F32(v) => dot(self.simd, &v[r * cols..(r + 1) * cols], x.x),
            Data::Quant { format, d, m, q } => {
                let nb = cols / BLOCK;
                let vb = format.value_bytes();
                let d = &d[r * nb..(r + 1) * nb];
                let q = &q[r * nb * vb..(r + 1) * nb * vb];
                let body = kernel(self.simd, *format, d, q, x);
                match format {
                    // The mins' part, Σ_b m_b·(Σ x_b), in block order.
                    Format::Q4_1 => m[r * nb..(r + 1) * nb]
                        .iter()
                        .zip(&x.sums)
                        .fold(body, |acc, (m, s)| acc + m * s),
                    Format::Q4_0 | Format::Q8_0 => body,
                }
            }
        }
    }
}

/// `Σ_b d_b·(q_b·x_b)`, with Q4_0's values already shifted by −8.
fn kernel(simd: Simd, format: Format, d: &[f32], q: &[u8], x: &Prepared<'_>) -> f32 {
    #[cfg(target_arch = "x86_64")]
    match simd {
        // SAFETY: the CPU has the instructions (checked when the matrix was
        // built); `row_dot` passed slices of exactly `nb` blocks, and the
        // kernels check the lengths again.
        Simd::Avx512 => {
            return unsafe {
                match format {
                    Format::Q4_0 => avx512::q4(d, q, x.x, 8),
                    Format::Q4_1 => avx512::q4(d, q, x.x, 0),
                    Format::Q8_0 => avx512::q8(d, q, x.x),
                }
            }
        }
        Simd::Avx2 => {
            return unsafe {
                match format {
                    Format::Q4_0 => avx2::q4(d, q, x.x, 8),
                    Format::Q4_1 => avx2::q4(d, q, x.x, 0),
                    Format::Q8_0 => avx2::q8(d, q, x.x),
                }
            }
        }
        Simd::None => {}
    }
    let _ = simd;
    let mut total = 0.0f32;
    let vb = format.value_bytes();
    for (b, &db) in d.iter().enumerate() {
        let qs = &q[b * vb..(b + 1) * vb];
        let xs = &x.x[b * BLOCK..(b + 1) * BLOCK];
        let mut s = 0.0f32;
        match format {
            Format::Q4_0 | Format::Q4_1 => {
                let shift = if format == Format::Q4_0 { 8 } else { 0 };
                for j in 0..16 {
                    s += ((qs[j] & 0x0F) as i32 - shift) as f32 * xs[j];
                    s += ((qs[j] >> 4) as i32 - shift) as f32 * xs[j + 16];
                }
            }
            Format::Q8_0 => {
                for j in 0..32 {
                    s += (qs[j] as i8) as f32 * xs[j];
                }
            }
        }
        total += db * s;
    }
    total
}

/// `a·b` in f32.
pub fn dot(simd: Simd, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    #[cfg(target_arch = "x86_64")]
    match simd {
        // SAFETY: the instructions are present; both slices hold `n` values.
        Simd::Avx512 => return unsafe { avx512::dot(&a[..n], &b[..n]) },
        Simd::Avx2 => return unsafe { avx2::dot(&a[..n], &b[..n]) },
        Simd::None => {}
    }
    let _ = simd;
    a[..n].iter().zip(&b[..n]).map(|(x, y)| x * y).sum()
}

/// `y += a·x` in f32 (fused multiply-adds where the CPU has them).
pub fn axpy(simd: Simd, a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    #[cfg(target_arch = "x86_64")]
    match simd {
        // SAFETY: the instructions are present; both slices hold `n` values.
        Simd::Avx512 => return unsafe { avx512::axpy(a, &x[..n], &mut y[..n]) },
        Simd::Avx2 => return unsafe { avx2::axpy(a, &x[..n], &mut y[..n]) },
        Simd::None => {}
    }
    let _ = simd;
    for (y, x) in y[..n].iter_mut().zip(&x[..n]) {
        *y += a * x;
    }
}

/// The vector instructions this CPU offers the kernels.
pub fn simd() -> Simd {
    static SIMD: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
    *SIMD.get_or_init(simd_available)
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::BLOCK;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// 4-bit blocks: low nibbles are values 0..16, high nibbles 16..32;
    /// `shift` is subtracted from each (8 for Q4_0).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn q4(d: &[f32], q: &[u8], x: &[f32], shift: i8) -> f32 {
        let nb = d.len();
        assert!(q.len() >= nb * 16 && x.len() >= nb * BLOCK);
        let mask = _mm_set1_epi8(0x0F);
        let off = _mm_set1_epi8(shift);
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let qp = q.as_ptr();
        let xp = x.as_ptr();
        for b in 0..nb {
            let qs = _mm_loadu_si128(qp.add(b * 16) as *const __m128i);
            let lo = _mm_sub_epi8(_mm_and_si128(qs, mask), off);
            let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(qs, 4), mask), off);
            let xb = xp.add(b * BLOCK);
            let f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
            let f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
            let f2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
            let f3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
            let s0 = _mm256_mul_ps(f0, _mm256_loadu_ps(xb));
            let s1 = _mm256_mul_ps(f1, _mm256_loadu_ps(xb.add(8)));
            let s0 = _mm256_fmadd_ps(f2, _mm256_loadu_ps(xb.add(16)), s0);
            let s1 = _mm256_fmadd_ps(f3, _mm256_loadu_ps(xb.add(24)), s1);
            let db = _mm256_set1_ps(*d.get_unchecked(b));
            acc0 = _mm256_fmadd_ps(db, s0, acc0);
            acc1 = _mm256_fmadd_ps(db, s1, acc1);
        }
        hsum(_mm256_add_ps(acc0, acc1))
    }

    /// 8-bit blocks.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn q8(d: &[f32], q: &[u8], x: &[f32]) -> f32 {
        let nb = d.len();
        assert!(q.len() >= nb * 32 && x.len() >= nb * BLOCK);
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let qp = q.as_ptr();
        let xp = x.as_ptr();
        for b in 0..nb {
            let a = _mm_loadu_si128(qp.add(b * 32) as *const __m128i);
            let c = _mm_loadu_si128(qp.add(b * 32 + 16) as *const __m128i);
            let xb = xp.add(b * BLOCK);
            let f0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(a));
            let f1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(a, 8)));
            let f2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c));
            let f3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(c, 8)));
            let s0 = _mm256_mul_ps(f0, _mm256_loadu_ps(xb));
            let s1 = _mm256_mul_ps(f1, _mm256_loadu_ps(xb.add(8)));
            let s0 = _mm256_fmadd_ps(f2, _mm256_loadu_ps(xb.add(16)), s0);
            let s1 = _mm256_fmadd_ps(f3, _mm256_loadu_ps(xb.add(24)), s1);
            let db = _mm256_set1_ps(*d.get_unchecked(b));
            acc0 = _mm256_fmadd_ps(db, s0, acc0);
            acc1 = _mm256_fmadd_ps(db, s1, acc1);
        }
        hsum(_mm256_add_ps(acc0, acc1))
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (ap, bp) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(
                    _mm256_loadu_ps(ap.add(i + 8 * k)),
                    _mm256_loadu_ps(bp.add(i + 8 * k)),
                    *a,
                );
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(
                _mm256_loadu_ps(ap.add(i)),
                _mm256_loadu_ps(bp.add(i)),
                acc[0],
            );
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(
            _mm256_add_ps(acc[0], acc[1]),
            _mm256_add_ps(acc[2], acc[3]),
        ));
        while i < n {
            s += *ap.add(i) * *bp.add(i);
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len().min(y.len());
        let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
        let av = _mm256_set1_ps(a);
        let mut i = 0;
        while i + 8 <= n {
            let r = _mm256_fmadd_ps(av, _mm256_loadu_ps(xp.add(i)), _mm256_loadu_ps(yp.add(i)));
            _mm256_storeu_ps(yp.add(i), r);
            i += 8;
        }
        while i < n {
            *yp.add(i) = a.mul_add(*xp.add(i), *yp.add(i));
            i += 1;
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use super::BLOCK;
    use std::arch::x86_64::*;

    /// 4-bit blocks, as `avx2::q4`, 16 values a vector.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn q4(d: &[f32], q: &[u8], x: &[f32], shift: i8) -> f32 {
        let nb = d.len();
        assert!(q.len() >= nb * 16 && x.len() >= nb * BLOCK);
        let mask = _mm_set1_epi8(0x0F);
        let off = _mm_set1_epi8(shift);
        let mut acc0 = _mm512_setzero_ps();
        let mut acc1 = _mm512_setzero_ps();
        let qp = q.as_ptr();
        let xp = x.as_ptr();
        for b in 0..nb {
            let qs = _mm_loadu_si128(qp.add(b * 16) as *const __m128i);
            let lo = _mm_sub_epi8(_mm_and_si128(qs, mask), off);
            let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(qs, 4), mask), off);
            let xb = xp.add(b * BLOCK);
            let f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(lo));
            let f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(hi));
            let s = _mm512_mul_ps(f0, _mm512_loadu_ps(xb));
            let s = _mm512_fmadd_ps(f1, _mm512_loadu_ps(xb.add(16)), s);
            let db = _mm512_set1_ps(*d.get_unchecked(b));
            if b % 2 == 0 {
                acc0 = _mm512_fmadd_ps(db, s, acc0);
            } else {
                acc1 = _mm512_fmadd_ps(db, s, acc1);
            }
        }
        _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
    }

    /// 8-bit blocks.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn q8(d: &[f32], q: &[u8], x: &[f32]) -> f32 {
        let nb = d.len();
        assert!(q.len() >= nb * 32 && x.len() >= nb * BLOCK);
        let mut acc0 = _mm512_setzero_ps();
        let mut acc1 = _mm512_setzero_ps();
        let qp = q.as_ptr();
        let xp = x.as_ptr();
        for b in 0..nb {
            let a = _mm_loadu_si128(qp.add(b * 32) as *const __m128i);
            let c = _mm_loadu_si128(qp.add(b * 32 + 16) as *const __m128i);
            let xb = xp.add(b * BLOCK);
            let f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(a));
            let f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c));
            let s = _mm512_mul_ps(f0, _mm512_loadu_ps(xb));
            let s = _mm512_fmadd_ps(f1, _mm512_loadu_ps(xb.add(16)), s);
            let db = _mm512_set1_ps(*d.get_unchecked(b));
            if b % 2 == 0 {
                acc0 = _mm512_fmadd_ps(db, s, acc0);
            } else {
                acc1 = _mm512_fmadd_ps(db, s, acc1);
            }
        }
        _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (ap, bp) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm512_setzero_ps(); 2];
        let mut i = 0;
        while i + 32 <= n {
            acc[0] = _mm512_fmadd_ps(
                _mm512_loadu_ps(ap.add(i)),
                _mm512_loadu_ps(bp.add(i)),
                acc[0],
            );
            acc[1] = _mm512_fmadd_ps(
                _mm512_loadu_ps(ap.add(i + 16)),
                _mm512_loadu_ps(bp.add(i + 16)),
                acc[1],
            );
            i += 32;
        }
        let mut s = _mm512_reduce_add_ps(_mm512_add_ps(acc[0], acc[1]));
        while i < n {
            s += *ap.add(i) * *bp.add(i);
            i += 1;
        }
        s
    }

    #[target_feature(enable = "avx512f")]
    pub unsafe fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len().min(y.len());
        let (xp, yp) = (x.as_ptr(), y.as_mut_ptr());
        let av = _mm512_set1_ps(a);
        let mut i = 0;
        while i + 16 <= n {
            let r = _mm512_fmadd_ps(av, _mm512_loadu_ps(xp.add(i)), _mm512_loadu_ps(yp.add(i)));
            _mm512_storeu_ps(yp.add(i), r);
            i += 16;
        }
        while i < n {
            *yp.add(i) = a.mul_add(*xp.add(i), *yp.add(i));
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of pseudo-random bytes with small, finite f16 scales.
    fn blocks(format: Format, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut next = move || {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (s >> 33) as u32
        };
        let mut out = Vec::new();
        for _ in 0..rows * cols / BLOCK {
            let scale = f16::from_f32((next() % 1000) as f32 / 20000.0 + 0.001);
            out.extend_from_slice(&scale.to_le_bytes());
            if format == Format::Q4_1 {
                let min = f16::from_f32(-((next() % 1000) as f32) / 10000.0);
                out.extend_from_slice(&min.to_le_bytes());
            }
            for _ in 0..format.value_bytes() {
                out.push(next() as u8);
            }
        }
        out
    }

    /// Every vector level this CPU runs, so that each kernel is tested
    /// where it can be.
    fn supported_levels() -> Vec<Simd> {
        let mut levels = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                levels.push(Simd::Avx2);
            }
            if std::is_x86_feature_detected!("avx512f") {
                levels.push(Simd::Avx512);
            }
        }
        levels
    }

    #[test]
    fn products_match_the_dequantized_rows() {
        let (rows, cols) = (7, 96);
        let x: Vec<f32> = (0..cols)
            .map(|i| ((i * 37 % 23) as f32 - 11.0) / 7.0)
            .collect();
        let px = Prepared::new(&x);
        for format in [Format::Q4_0, Format::Q4_1, Format::Q8_0] {
            let bytes = blocks(format, rows, cols, 42);
            let mut portable = Matrix::quantized(format, rows, cols, &bytes).unwrap();
            portable.simd = Simd::None;
            let levels = supported_levels();
            let fast: Vec<Matrix> = levels
                .iter()
                .map(|&l| {
                    let mut m = Matrix::quantized(format, rows, cols, &bytes).unwrap();
                    m.simd = l;
                    m
                })
                .collect();
            let mut row = vec![0.0; cols];
            for r in 0..rows {
                portable.dequantize_row(r, &mut row);
                let want: f64 = row.iter().zip(&x).map(|(a, b)| *a as f64 * *b as f64).sum();
                for m in std::iter::once(&portable).chain(&fast) {
                    let got = m.row_dot(r, &px) as f64;
                    assert!(
                        (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "{format:?} row {r}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn dot_and_axpy_agree_at_every_level() {
        // Lengths that leave tails after the vectors.
        for n in [1, 7, 64, 67, 100] {
            let a: Vec<f32> = (0..n).map(|i| ((i * 13 % 17) as f32 - 8.0) / 5.0).collect();
            let b: Vec<f32> = (0..n).map(|i| ((i * 7 % 11) as f32 - 5.0) / 3.0).collect();
            let want: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            for level in std::iter::once(Simd::None).chain(supported_levels()) {
                let got = dot(level, &a, &b) as f64;
                assert!(
                    (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "{level:?} n={n}"
                );
                let mut y = b.clone();
                axpy(level, 0.75, &a, &mut y);
                for ((yi, ai), bi) in y.iter().zip(&a).zip(&b) {
                    assert!((yi - (bi + 0.75 * ai)).abs() <= 1e-6, "{level:?} n={n}");
                }
            }
        }
    }

    #[test]
    fn q4_1_values_are_d_times_q_plus_m() {
        // One block: d = 0.5, m = -1, values 0..16 in the low nibbles and
        // 15..0 in the high ones.
        let mut b = Vec::new();
        b.extend_from_slice(&f16::from_f32(0.5).to_le_bytes());
        b.extend_from_slice(&f16::from_f32(-1.0).to_le_bytes());
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let m = Matrix::quantized(Format::Q4_1, 1, 32, &b).unwrap();
        let mut row = vec![0.0; 32];
        m.dequantize_row(0, &mut row);
        assert_eq!(row[0], -1.0);
        assert_eq!(row[15], 6.5);
        assert_eq!(row[16], 6.5);
        assert_eq!(row[31], -1.0);
    }

    #[test]
    fn bad_shapes_are_errors() {
        assert!(matches!(
            Matrix::quantized(Format::Q8_0, 2, 33, &[]),
            Err(MatrixError::Ragged { cols: 33 })
        ));
        assert!(matches!(
            Matrix::quantized(Format::Q8_0, 2, 32, &[0; 10]),
            Err(MatrixError::Size { want: 68, .. })
        ));
    }
}
