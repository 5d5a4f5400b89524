//! f32 dot product, used by formats without an integer kernel (their rows are dequantized
//! first) and by attention.

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::Isa;

/// The element of KV rows the attention kernels read: f32, or f16 widened exactly to f32.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// Whether the type is f16 (else f32).
    const F16: bool;
    /// The rows as f32 where they are f32.
    fn as_f32(s: &[Self]) -> Option<&[f32]>;
    /// Widens `s` into `out` (as long as `s`).
    fn widen(s: &[Self], out: &mut [f32]);
    /// One value as f32.
    fn to_f32(self) -> f32;

    /// `f` of the row `r` as f32: `r` itself where it is f32, else widened into a buffer on
    /// the stack (rows of up to 256 values; longer ones on the heap).
    fn with_f32<R>(r: &[Self], f: impl FnOnce(&[f32]) -> R) -> R {
        if let Some(x) = Self::as_f32(r) {
            return f(x);
        }
        let (mut stack, mut heap) = ([0f32; 256], Vec::new());
        let buf = if r.len() <= stack.len() {
            &mut stack[..r.len()]
        } else {
            heap.resize(r.len(), 0.0);
            &mut heap[..]
        };
        Self::widen(r, buf);
        f(buf)
    }
}

impl KvElem for f32 {
    const F16: bool = false;
    fn as_f32(s: &[f32]) -> Option<&[f32]> {
        Some(s)
    }
    fn widen(s: &[f32], out: &mut [f32]) {
        out.copy_from_slice(s);
    }
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvElem for f16 {
    const F16: bool = true;
    fn as_f32(_: &[f16]) -> Option<&[f32]> {
        None
    }
    fn widen(s: &[f16], out: &mut [f32]) {
        s.convert_to_f32_slice(out);
    }
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
}

/// sum(a[i] * b[i]) over the shorter length.
pub fn dot_f32(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: Isa::Avx2 implies runtime-detected avx2/fma; n bounds both slices.
        return unsafe { x86::dot_f32(&a[..n], &b[..n]) };
    }
    let _ = isa;
    dot_f32_scalar(&a[..n], &b[..n])
}

pub fn dot_f32_scalar(a: &[f32], b: &[f32]) -> f32 {
    // 8 partial sums: lets the compiler vectorize and bounds rounding growth.
    let mut s = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for k in 0..8 {
            s[k] += x[k] * y[k];
        }
    }
    let tail: f32 = ra.iter().zip(rb).map(|(x, y)| x * y).sum();
    s.iter().sum::<f32>() + tail
}

/// Attention scores over a run of keys: `out[j] = dot(q, rows[j * n..(j + 1) * n]) * scale`
/// for every `j < out.len()` (`n = q.len()`; f16 keys widened to f32 exactly); returns the
/// largest (`-inf` for none). On AVX-512 with `n` a multiple of 16, one 512-bit pass per
/// row; elsewhere `dot_f32` per row.
///
/// # Panics
/// Where `rows` holds fewer than `out.len()` rows of `n`, naming the op.
pub fn dot_rows<T: KvElem>(isa: Isa, q: &[f32], rows: &[T], scale: f32, out: &mut [f32]) -> f32 {
    let n = q.len();
    assert!(
        rows.len() >= out.len() * n,
        "dot_rows: {} rows of {n} need {} values, found {}",
        out.len(),
        out.len() * n,
        rows.len()
    );
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 && n.is_multiple_of(16) {
        // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f and f16c; lengths
        // checked.
        return unsafe { x86::dot_rows512(q, rows, scale, out) };
    }
    let mut max = f32::NEG_INFINITY;
    for (j, o) in out.iter_mut().enumerate() {
        *o = T::with_f32(&rows[j * n..(j + 1) * n], |row| dot_f32(isa, q, row)) * scale;
        max = max.max(*o);
    }
    max
}

/// y[i] += alpha * x[i] over the shorter length.
pub fn axpy(isa: Isa, alpha: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: as in dot_f32.
        unsafe { x86::axpy(alpha, &x[..n], &mut y[..n]) };
        return;
    }
    let _ = isa;
    for (yi, xi) in y[..n].iter_mut().zip(&x[..n]) {
        *yi += alpha * xi;
    }
}

/// `y += sum_j w[j] * rows[j]`, where row j is `rows[j * n..(j + 1) * n]` (f16 widened to
/// f32 exactly) and `n = y.len()` (attention's weighted sum of values): per element the same
/// operations in the same order as `axpy(isa, w[j], row j, y)` for j = 0, 1, .., so the bits
/// are those of that loop, with `y` held in registers across the rows instead of read and
/// written per row.
pub fn axpy_rows<T: KvElem>(isa: Isa, w: &[f32], rows: &[T], y: &mut [f32]) {
    let n = y.len();
    assert!(
        rows.len() >= w.len() * n,
        "axpy_rows: {} rows of {n} need {} values, found {}",
        w.len(),
        w.len() * n,
        rows.len()
    );
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 && n.is_multiple_of(16) {
        // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f and f16c; lengths
        // checked.
        unsafe { x86::axpy_rows512(w, rows, y) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: Isa::Avx2 implies runtime-detected avx2/fma/f16c; lengths checked above.
        unsafe { x86::axpy_rows(w, rows, y) };
        return;
    }
    for (j, &a) in w.iter().enumerate() {
        T::with_f32(&rows[j * n..(j + 1) * n], |row| axpy(isa, a, row, y));
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::KvElem;

    /// Eight values at `p` as f32 (f16 widened).
    ///
    /// # Safety
    /// avx2 and f16c must be available; `p` points at 8 values.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn ph8<T: KvElem>(p: *const T) -> __m256 {
        // SAFETY: 8 values at p (caller's contract), f16 where T::F16, else f32.
        unsafe {
            if T::F16 {
                _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
            } else {
                _mm256_loadu_ps(p as *const f32)
            }
        }
    }

    /// Sixteen values at `p` as f32 (f16 widened).
    ///
    /// # Safety
    /// avx512f must be available; `p` points at 16 values.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn ph16<T: KvElem>(p: *const T) -> __m512 {
        // SAFETY: 16 values at p (caller's contract), f16 where T::F16, else f32.
        unsafe {
            if T::F16 {
                _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
            } else {
                _mm512_loadu_ps(p as *const f32)
            }
        }
    }

    use super::super::x86::hsum_ps;

    /// # Safety
    /// avx2 and fma must be available; `a` and `b` have equal length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len();
        let (mut s0, mut s1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        // SAFETY: every load reads [i, i + 8) with i + 8 <= n.
        unsafe {
            while i + 16 <= n {
                s0 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i)),
                    _mm256_loadu_ps(b.as_ptr().add(i)),
                    s0,
                );
                s1 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i + 8)),
                    _mm256_loadu_ps(b.as_ptr().add(i + 8)),
                    s1,
                );
                i += 16;
            }
            while i + 8 <= n {
                s0 = _mm256_fmadd_ps(
                    _mm256_loadu_ps(a.as_ptr().add(i)),
                    _mm256_loadu_ps(b.as_ptr().add(i)),
                    s0,
                );
                i += 8;
            }
        }
        let mut s = hsum_ps(_mm256_add_ps(s0, s1));
        while i < n {
            s += a[i] * b[i];
            i += 1;
        }
        s
    }

    /// # Safety
    /// avx2 and fma must be available; `x` and `y` have equal length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy(alpha: f32, x: &[f32], y: &mut [f32]) {
        let n = x.len();
        let va = _mm256_set1_ps(alpha);
        let mut i = 0;
        // SAFETY: every access covers [i, i + 8) with i + 8 <= n.
        unsafe {
            while i + 8 <= n {
                let p = y.as_mut_ptr().add(i);
                _mm256_storeu_ps(
                    p,
                    _mm256_fmadd_ps(va, _mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(p)),
                );
                i += 8;
            }
        }
        while i < n {
            y[i] += alpha * x[i];
            i += 1;
        }
    }

    /// # Safety
    /// avx2 and fma must be available; `rows` holds `w.len()` rows of `y.len()` values.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn axpy_rows<T: KvElem>(w: &[f32], rows: &[T], y: &mut [f32]) {
        let n = y.len();
        let (yp, rp) = (y.as_mut_ptr(), rows.as_ptr());
        let mut c = 0;
        // SAFETY: every access covers columns [c, c + width) with c + width <= n, of rows
        // j < w.len() (caller's contract).
        unsafe {
            while c + 64 <= n {
                let mut acc = [_mm256_setzero_ps(); 8];
                for (k, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_loadu_ps(yp.add(c + 8 * k));
                }
                for (j, &wj) in w.iter().enumerate() {
                    let va = _mm256_set1_ps(wj);
                    let p = rp.add(j * n + c);
                    for (k, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(va, ph8(p.add(8 * k)), *a);
                    }
                }
                for (k, a) in acc.iter().enumerate() {
                    _mm256_storeu_ps(yp.add(c + 8 * k), *a);
                }
                c += 64;
            }
            while c + 8 <= n {
                let mut a = _mm256_loadu_ps(yp.add(c));
                for (j, &wj) in w.iter().enumerate() {
                    a = _mm256_fmadd_ps(_mm256_set1_ps(wj), ph8(rp.add(j * n + c)), a);
                }
                _mm256_storeu_ps(yp.add(c), a);
                c += 8;
            }
        }
        // The tail as `axpy`'s: a product, then a sum.
        for e in c..n {
            for (j, &wj) in w.iter().enumerate() {
                y[e] += wj * rows[j * n + e].to_f32();
            }
        }
    }

    /// [`super::dot_rows`] on AVX-512: per row two chains of 512-bit FMAs, added, then one
    /// reduction.
    ///
    /// # Safety
    /// avx512f must be available; `q.len()` is a multiple of 16 and `rows` holds
    /// `out.len()` rows of it.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn dot_rows512<T: KvElem>(
        q: &[f32],
        rows: &[T],
        scale: f32,
        out: &mut [f32],
    ) -> f32 {
        let n = q.len();
        let mut max = f32::NEG_INFINITY;
        for (j, o) in out.iter_mut().enumerate() {
            // SAFETY: row j spans rows[j * n..(j + 1) * n] (caller's contract); every load
            // reads [c, c + 16) with c + 16 <= n.
            unsafe {
                let r = rows.as_ptr().add(j * n);
                let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
                let mut c = 0;
                while c + 32 <= n {
                    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(q.as_ptr().add(c)), ph16(r.add(c)), s0);
                    s1 = _mm512_fmadd_ps(
                        _mm512_loadu_ps(q.as_ptr().add(c + 16)),
                        ph16(r.add(c + 16)),
                        s1,
                    );
                    c += 32;
                }
                if c < n {
                    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(q.as_ptr().add(c)), ph16(r.add(c)), s0);
                }
                *o = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1)) * scale;
            }
            max = max.max(*o);
        }
        max
    }

    /// [`super::axpy_rows`] on AVX-512, 64 columns per pass: per element the same fused
    /// multiply-adds in the same order as `axpy`, so the same bits.
    ///
    /// # Safety
    /// avx512f must be available; `y.len()` is a multiple of 16 and `rows` holds
    /// `w.len()` rows of it.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn axpy_rows512<T: KvElem>(w: &[f32], rows: &[T], y: &mut [f32]) {
        let n = y.len();
        let (yp, rp) = (y.as_mut_ptr(), rows.as_ptr());
        let mut c = 0;
        // SAFETY: every access covers columns [c, c + width) with c + width <= n, of rows
        // j < w.len() (caller's contract).
        unsafe {
            while c + 64 <= n {
                let mut acc = [_mm512_setzero_ps(); 4];
                for (k, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_loadu_ps(yp.add(c + 16 * k));
                }
                for (j, &wj) in w.iter().enumerate() {
                    let va = _mm512_set1_ps(wj);
                    let p = rp.add(j * n + c);
                    for (k, a) in acc.iter_mut().enumerate() {
                        *a = _mm512_fmadd_ps(va, ph16(p.add(16 * k)), *a);
                    }
                }
                for (k, a) in acc.iter().enumerate() {
                    _mm512_storeu_ps(yp.add(c + 16 * k), *a);
                }
                c += 64;
            }
            while c + 16 <= n {
                let mut a = _mm512_loadu_ps(yp.add(c));
                for (j, &wj) in w.iter().enumerate() {
                    a = _mm512_fmadd_ps(_mm512_set1_ps(wj), ph16(rp.add(j * n + c)), a);
                }
                _mm512_storeu_ps(yp.add(c), a);
                c += 16;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_util::rand_f32;

    #[test]
    fn simd_matches_scalar_odd_sizes() {
        for n in [1usize, 7, 8, 31, 33, 64, 65, 256] {
            let a = rand_f32(n, n as u64);
            let b = rand_f32(n, 99 + n as u64);
            let want = dot_f32_scalar(&a, &b);
            for isa in Isa::available() {
                let got = dot_f32(isa, &a, &b);
                assert!(
                    (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "{isa:?} n={n}"
                );
                let mut y1 = b.clone();
                let mut y2 = b.clone();
                axpy(isa, 0.37, &a, &mut y1);
                axpy(Isa::Scalar, 0.37, &a, &mut y2);
                for (u, v) in y1.iter().zip(&y2) {
                    assert!((u - v).abs() <= 1e-6);
                }
            }
        }
    }

    /// `dot_rows` stays within rounding of the scalar dot product per row (f32 keys, and f16
    /// keys widened), on every instruction set, and returns the largest score.
    #[test]
    fn dot_rows_match_scalar_dots() {
        for n in [8usize, 16, 48, 64, 65, 256] {
            for rows in [0usize, 1, 5, 17] {
                let q = rand_f32(n, 3 + n as u64);
                let x: Vec<f16> = rand_f32(rows * n, 4 + rows as u64)
                    .into_iter()
                    .map(f16::from_f32)
                    .collect();
                let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
                for (isa, half) in Isa::available()
                    .into_iter()
                    .flat_map(|i| [(i, false), (i, true)])
                {
                    let mut out = vec![0f32; rows];
                    let max = if half {
                        dot_rows(isa, &q, &x, 0.125, &mut out)
                    } else {
                        dot_rows(isa, &q, &xf, 0.125, &mut out)
                    };
                    for (j, &o) in out.iter().enumerate() {
                        let want = dot_f32_scalar(&q, &xf[j * n..(j + 1) * n]) * 0.125;
                        assert!(
                            (o - want).abs() <= 1e-5 * (1.0 + want.abs()),
                            "{isa:?} n={n} row {j}: {o} vs {want}"
                        );
                    }
                    let want_max = out.iter().fold(f32::NEG_INFINITY, |m, &o| m.max(o));
                    assert_eq!(max, want_max, "{isa:?} n={n} rows={rows}");
                }
            }
        }
    }

    /// `axpy_rows` gives the bits of the `axpy` loop it replaces (over f32 rows, and over f16
    /// rows widened), on every instruction set.
    #[test]
    fn axpy_rows_equals_axpy_loop_bit_for_bit() {
        for n in [1usize, 7, 8, 64, 65, 80, 136] {
            for rows in [0usize, 1, 5, 17] {
                let x: Vec<f16> = rand_f32(rows * n, 5 + n as u64)
                    .into_iter()
                    .map(f16::from_f32)
                    .collect();
                let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
                let w = rand_f32(rows, 6 + rows as u64);
                let y0 = rand_f32(n, 7);
                for isa in Isa::available() {
                    let mut want = y0.clone();
                    for (j, &a) in w.iter().enumerate() {
                        axpy(isa, a, &xf[j * n..(j + 1) * n], &mut want);
                    }
                    let (mut got, mut got_f32) = (y0.clone(), y0.clone());
                    axpy_rows(isa, &w, &x, &mut got);
                    axpy_rows(isa, &w, &xf, &mut got_f32);
                    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "{isa:?} n={n} rows={rows} f16");
                    assert_eq!(bits(&got_f32), bits(&want), "{isa:?} n={n} rows={rows} f32");
                }
            }
        }
    }
}
