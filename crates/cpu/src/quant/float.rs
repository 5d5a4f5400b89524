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

/// Attention scores of `heads = max.len()` query heads over a run of keys. With
/// `n = q.len() / heads`, query head h `q[h * n..(h + 1) * n]` and `len = rows.len() / n` keys
/// (row j `rows[j * n..(j + 1) * n]`, f16 widened to f32 exactly):
/// `out[h * stride + j] = dot(q_h, row j) * scale` for j < len, and `max[h]` raised to the
/// largest of them. A score's bits depend only on its query head and key, not on the run or
/// the heads beside it. On AVX-512 with `n` a multiple of 16, each key is widened once for up
/// to four heads and sixteen keys' sums are reduced together; elsewhere `dot_f32` per score.
///
/// # Panics
/// Where `q` does not hold `heads` rows of n or `out` is too short, naming the op.
pub fn dot_rows<T: KvElem>(
    isa: Isa,
    q: &[f32],
    rows: &[T],
    scale: f32,
    out: &mut [f32],
    stride: usize,
    max: &mut [f32],
) {
    let heads = max.len();
    if heads == 0 {
        return;
    }
    let n = q.len() / heads;
    assert!(
        n > 0 && q.len() == heads * n,
        "dot_rows: {} query values are not {heads} heads",
        q.len()
    );
    let len = rows.len() / n;
    assert!(
        (heads == 1 || stride >= len) && out.len() >= (heads - 1) * stride + len,
        "dot_rows: {heads} heads of {len} scores at stride {stride} need more than {} values",
        out.len()
    );
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 && n.is_multiple_of(16) {
        let rows = &rows[..len * n];
        let mut h0 = 0;
        while h0 < heads {
            let hn = (heads - h0).min(4);
            let (q, out, max) = (
                &q[h0 * n..(h0 + hn) * n],
                &mut out[h0 * stride..],
                &mut max[h0..h0 + hn],
            );
            // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f and f16c; q holds
            // hn heads of n, rows len keys of n, and out (checked above) hn runs of len
            // scores at `stride`.
            unsafe {
                match hn {
                    1 => x86::dot_rows512::<T, 1>(q, rows, scale, out, stride, max),
                    2 => x86::dot_rows512::<T, 2>(q, rows, scale, out, stride, max),
                    3 => x86::dot_rows512::<T, 3>(q, rows, scale, out, stride, max),
                    _ => x86::dot_rows512::<T, 4>(q, rows, scale, out, stride, max),
                }
            }
            h0 += hn;
        }
        return;
    }
    for j in 0..len {
        T::with_f32(&rows[j * n..(j + 1) * n], |row| {
            for (h, m) in max.iter_mut().enumerate() {
                let o = dot_f32(isa, &q[h * n..(h + 1) * n], row) * scale;
                out[h * stride + j] = o;
                *m = m.max(o);
            }
        });
    }
}

/// Asks for `s` in L2 ahead of its use (a hint: attention's next KV block, whose address
/// the hardware prefetchers cannot guess). L2 rather than L1: T0 prefetches of whole blocks
/// stalled on the fill buffers (batch 8 at 512-token contexts: 476 / 486 -> 505 / 540 tok/s).
#[inline]
pub fn prefetch<T>(s: &[T]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let p = s.as_ptr() as *const i8;
        for off in (0..std::mem::size_of_val(s)).step_by(64) {
            // SAFETY: prefetch never faults; the address lies inside `s`.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(p.add(off)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = s;
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

/// Attention's weighted sums of values for `heads` query heads: with `n = y.len() / heads`
/// and `len = rows.len() / n`, `y_h += sum_j w[h * stride + j] * rows[j]` for each head h
/// (`y_h = y[h * n..(h + 1) * n]`, row j `rows[j * n..(j + 1) * n]`, f16 widened to f32
/// exactly): per element the same operations in the same order as
/// `axpy(isa, w[h * stride + j], row j, y_h)` for j = 0, 1, .., so the bits are those of that
/// loop, with `y` held in registers across the rows instead of read and written per row. On
/// AVX-512 each row is widened once for up to four heads.
///
/// # Panics
/// Where `y` does not hold `heads` rows or `w` is too short, naming the op.
pub fn axpy_rows<T: KvElem>(
    isa: Isa,
    w: &[f32],
    stride: usize,
    rows: &[T],
    y: &mut [f32],
    heads: usize,
) {
    if heads == 0 || y.is_empty() {
        return;
    }
    let n = y.len() / heads;
    assert!(
        y.len() == heads * n,
        "axpy_rows: {} output values are not {heads} heads",
        y.len()
    );
    let len = rows.len() / n;
    assert!(
        (heads == 1 || stride >= len) && w.len() >= (heads - 1) * stride + len,
        "axpy_rows: {heads} heads of {len} weights at stride {stride} need more than {} values",
        w.len()
    );
    let rows = &rows[..len * n];
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 && n.is_multiple_of(16) {
        let mut h0 = 0;
        while h0 < heads {
            let hn = (heads - h0).min(4);
            let (w, y) = (&w[h0 * stride..], &mut y[h0 * n..(h0 + hn) * n]);
            // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f and f16c; y holds
            // hn heads of n, rows len rows of n, and w (checked above) hn runs of len
            // weights at `stride`.
            unsafe {
                match hn {
                    1 => x86::axpy_rows512::<T, 1>(w, stride, rows, y),
                    2 => x86::axpy_rows512::<T, 2>(w, stride, rows, y),
                    3 => x86::axpy_rows512::<T, 3>(w, stride, rows, y),
                    _ => x86::axpy_rows512::<T, 4>(w, stride, rows, y),
                }
            }
            h0 += hn;
        }
        return;
    }
    for (h, yh) in y.chunks_exact_mut(n).enumerate() {
        let wh = &w[h * stride..h * stride + len];
        #[cfg(target_arch = "x86_64")]
        if isa.avx2() {
            // SAFETY: Isa::Avx2 implies runtime-detected avx2/fma/f16c; rows holds len rows
            // of n.
            unsafe { x86::axpy_rows(wh, rows, yh) };
            continue;
        }
        for (j, &a) in wh.iter().enumerate() {
            T::with_f32(&rows[j * n..(j + 1) * n], |row| axpy(isa, a, row, yh));
        }
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

    /// Lane k: the sum of `v[k]`'s sixteen lanes, pairing lanes (i, i + 8), then (i, i + 4),
    /// (i, i + 2) and (i, i + 1): the same tree for every k.
    ///
    /// # Safety
    /// avx512f must be available.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn sum16(v: &[__m512; 16]) -> __m512 {
        // Pairs of vectors: [a's 8 sums | b's 8 sums].
        let mut t = [_mm512_setzero_ps(); 8];
        for (i, t) in t.iter_mut().enumerate() {
            let (a, b) = (v[2 * i], v[2 * i + 1]);
            *t = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x44>(a, b),
                _mm512_shuffle_f32x4::<0xEE>(a, b),
            );
        }
        // Four sums of one vector per 128-bit lane: u[i] holds v[4i..4i + 4]'s.
        let mut u = [_mm512_setzero_ps(); 4];
        for (i, u) in u.iter_mut().enumerate() {
            let (a, b) = (t[2 * i], t[2 * i + 1]);
            *u = _mm512_add_ps(
                _mm512_shuffle_f32x4::<0x88>(a, b),
                _mm512_shuffle_f32x4::<0xDD>(a, b),
            );
        }
        // Lane L of w[0]: two sums each of v[L] and v[4 + L]; of w[1]: of v[8 + L], v[12 + L].
        let mut w = [_mm512_setzero_ps(); 2];
        for (i, w) in w.iter_mut().enumerate() {
            let (a, b) = (_mm512_castps_pd(u[2 * i]), _mm512_castps_pd(u[2 * i + 1]));
            *w = _mm512_add_ps(
                _mm512_castpd_ps(_mm512_unpacklo_pd(a, b)),
                _mm512_castpd_ps(_mm512_unpackhi_pd(a, b)),
            );
        }
        // Lane 4L + m: v[4m + L]'s sum; permuted to lane k: v[k]'s.
        let r = _mm512_add_ps(
            _mm512_shuffle_ps::<0x88>(w[0], w[1]),
            _mm512_shuffle_ps::<0xDD>(w[0], w[1]),
        );
        let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        _mm512_permutexvar_ps(idx, r)
    }

    /// [`super::dot_rows`] on AVX-512 for `H` heads: per (head, key) two chains of 512-bit
    /// FMAs over the columns, added; then sixteen keys' sums reduced at once ([`sum16`]).
    ///
    /// # Safety
    /// avx512f and f16c must be available; `q` holds H heads of n (a multiple of 16),
    /// `rows` whole keys of n, and `out` H runs of `rows.len() / n` at `stride`.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn dot_rows512<T: KvElem, const H: usize>(
        q: &[f32],
        rows: &[T],
        scale: f32,
        out: &mut [f32],
        stride: usize,
        max: &mut [f32],
    ) {
        let n = q.len() / H;
        let len = rows.len() / n;
        let zero = _mm512_setzero_ps();
        let mut part = [[zero; 16]; H];
        let mut j0 = 0;
        while j0 < len {
            let m = (len - j0).min(16);
            for jj in 0..16 {
                if jj >= m {
                    part.iter_mut().for_each(|p| p[jj] = zero);
                    continue;
                }
                // SAFETY: key j0 + jj < len spans rows[(j0 + jj) * n..][..n]; every load
                // reads columns [c, c + 16) with c + 16 <= n of a key or a query head.
                unsafe {
                    let r = rows.as_ptr().add((j0 + jj) * n);
                    let (mut s0, mut s1) = ([zero; H], [zero; H]);
                    let mut c = 0;
                    while c + 32 <= n {
                        let (k0, k1) = (ph16(r.add(c)), ph16(r.add(c + 16)));
                        for h in 0..H {
                            let qh = q.as_ptr().add(h * n + c);
                            s0[h] = _mm512_fmadd_ps(_mm512_loadu_ps(qh), k0, s0[h]);
                            s1[h] = _mm512_fmadd_ps(_mm512_loadu_ps(qh.add(16)), k1, s1[h]);
                        }
                        c += 32;
                    }
                    if c < n {
                        let k0 = ph16(r.add(c));
                        for (h, s) in s0.iter_mut().enumerate() {
                            let qh = q.as_ptr().add(h * n + c);
                            *s = _mm512_fmadd_ps(_mm512_loadu_ps(qh), k0, *s);
                        }
                    }
                    for ((p, a), b) in part.iter_mut().zip(s0).zip(s1) {
                        p[jj] = _mm512_add_ps(a, b);
                    }
                }
            }
            for (h, mx) in max.iter_mut().enumerate() {
                // SAFETY: sum16 needs avx512f only.
                let v = _mm512_mul_ps(unsafe { sum16(&part[h]) }, _mm512_set1_ps(scale));
                let mut lanes = [0f32; 16];
                // SAFETY: 16 floats.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), v) };
                out[h * stride + j0..h * stride + j0 + m].copy_from_slice(&lanes[..m]);
                let keys = _mm512_mask_blend_ps(
                    ((1u32 << m) - 1) as u16,
                    _mm512_set1_ps(f32::NEG_INFINITY),
                    v,
                );
                *mx = mx.max(_mm512_reduce_max_ps(keys));
            }
            j0 += 16;
        }
    }

    /// [`super::axpy_rows`] on AVX-512 for `H` heads, 64 columns per pass: each row's
    /// columns widened once, then per head and element the same fused multiply-adds in the
    /// same order as `axpy`, so the same bits.
    ///
    /// # Safety
    /// avx512f and f16c must be available; `y` holds H heads of n (a multiple of 16),
    /// `rows` whole rows of n, and `w` H runs of `rows.len() / n` at `stride`.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn axpy_rows512<T: KvElem, const H: usize>(
        w: &[f32],
        stride: usize,
        rows: &[T],
        y: &mut [f32],
    ) {
        let n = y.len() / H;
        let len = rows.len() / n;
        let (yp, rp, wp) = (y.as_mut_ptr(), rows.as_ptr(), w.as_ptr());
        let mut c = 0;
        // SAFETY: every access covers columns [c, c + width) with c + width <= n of head
        // h < H's output or of row j < len, and weights h * stride + j (caller's contract).
        unsafe {
            while c + 64 <= n {
                let mut acc = [[_mm512_setzero_ps(); 4]; H];
                for (h, a) in acc.iter_mut().enumerate() {
                    for (k, a) in a.iter_mut().enumerate() {
                        *a = _mm512_loadu_ps(yp.add(h * n + c + 16 * k));
                    }
                }
                for j in 0..len {
                    let p = rp.add(j * n + c);
                    let x = [ph16(p), ph16(p.add(16)), ph16(p.add(32)), ph16(p.add(48))];
                    for (h, a) in acc.iter_mut().enumerate() {
                        let va = _mm512_set1_ps(*wp.add(h * stride + j));
                        for (k, a) in a.iter_mut().enumerate() {
                            *a = _mm512_fmadd_ps(va, x[k], *a);
                        }
                    }
                }
                for (h, a) in acc.iter().enumerate() {
                    for (k, a) in a.iter().enumerate() {
                        _mm512_storeu_ps(yp.add(h * n + c + 16 * k), *a);
                    }
                }
                c += 64;
            }
            while c + 16 <= n {
                let mut acc = [_mm512_setzero_ps(); H];
                for (h, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_loadu_ps(yp.add(h * n + c));
                }
                for j in 0..len {
                    let x = ph16(rp.add(j * n + c));
                    for (h, a) in acc.iter_mut().enumerate() {
                        *a = _mm512_fmadd_ps(_mm512_set1_ps(*wp.add(h * stride + j)), x, *a);
                    }
                }
                for (h, a) in acc.iter().enumerate() {
                    _mm512_storeu_ps(yp.add(h * n + c), *a);
                }
                c += 16;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::test_util::rand_f32;

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

    /// `dot_rows` stays within rounding of the scalar dot product per (head, key) (f32 keys,
    /// and f16 keys widened), on every instruction set, raises each head's max to its largest
    /// score, and gives a score the same bits alone as in a longer run or beside other heads.
    #[test]
    fn dot_rows_match_scalar_dots() {
        for n in [8usize, 16, 48, 64, 65, 256] {
            for rows in [0usize, 1, 5, 17, 40] {
                for heads in [1usize, 3, 4, 7] {
                    let q = rand_f32(heads * n, 3 + n as u64);
                    let x: Vec<f16> = rand_f32(rows * n, 4 + rows as u64)
                        .into_iter()
                        .map(f16::from_f32)
                        .collect();
                    let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
                    let stride = rows + 3;
                    for (isa, half) in Isa::available()
                        .into_iter()
                        .flat_map(|i| [(i, false), (i, true)])
                    {
                        let run = |q: &[f32], from: usize, heads: usize| {
                            let mut out = vec![f32::NAN; heads * stride];
                            let mut max = vec![-1e30f32; heads];
                            if half {
                                dot_rows(isa, q, &x[from * n..], 0.125, &mut out, stride, &mut max);
                            } else {
                                dot_rows(
                                    isa,
                                    q,
                                    &xf[from * n..],
                                    0.125,
                                    &mut out,
                                    stride,
                                    &mut max,
                                );
                            }
                            (out, max)
                        };
                        let (out, max) = run(&q, 0, heads);
                        let tag = format!("{isa:?} n={n} rows={rows} heads={heads} f16={half}");
                        for h in 0..heads {
                            let qh = &q[h * n..(h + 1) * n];
                            for j in 0..rows {
                                let o = out[h * stride + j];
                                let want = dot_f32_scalar(qh, &xf[j * n..(j + 1) * n]) * 0.125;
                                assert!(
                                    (o - want).abs() <= 1e-5 * (1.0 + want.abs()),
                                    "{tag} head {h} key {j}: {o} vs {want}"
                                );
                            }
                            assert!(out[h * stride + rows..(h + 1) * stride]
                                .iter()
                                .all(|v| v.is_nan()));
                            let run_max = out[h * stride..h * stride + rows]
                                .iter()
                                .fold(-1e30f32, |m, &o| m.max(o));
                            assert_eq!(max[h], run_max, "{tag} head {h}");
                            let (alone, _) = run(qh, rows.min(3), 1);
                            for j in rows.min(3)..rows {
                                assert_eq!(
                                    alone[j - rows.min(3)].to_bits(),
                                    out[h * stride + j].to_bits(),
                                    "{tag} head {h} key {j} alone"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// `axpy_rows` gives the bits of the `axpy` loop it replaces per head (over f32 rows, and
    /// over f16 rows widened), on every instruction set.
    #[test]
    fn axpy_rows_equals_axpy_loop_bit_for_bit() {
        for n in [1usize, 7, 8, 64, 65, 80, 136] {
            for rows in [0usize, 1, 5, 17] {
                for heads in [1usize, 3, 4, 7] {
                    let x: Vec<f16> = rand_f32(rows * n, 5 + n as u64)
                        .into_iter()
                        .map(f16::from_f32)
                        .collect();
                    let xf: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
                    let stride = rows + 2;
                    let w = rand_f32(heads * stride, 6 + rows as u64);
                    let y0 = rand_f32(heads * n, 7);
                    for isa in Isa::available() {
                        let mut want = y0.clone();
                        for (h, yh) in want.chunks_exact_mut(n).enumerate() {
                            for j in 0..rows {
                                axpy(isa, w[h * stride + j], &xf[j * n..(j + 1) * n], yh);
                            }
                        }
                        let (mut got, mut got_f32) = (y0.clone(), y0.clone());
                        axpy_rows(isa, &w, stride, &x, &mut got, heads);
                        axpy_rows(isa, &w, stride, &xf, &mut got_f32, heads);
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        let tag = format!("{isa:?} n={n} rows={rows} heads={heads}");
                        assert_eq!(bits(&got), bits(&want), "{tag} f16");
                        assert_eq!(bits(&got_f32), bits(&want), "{tag} f32");
                    }
                }
            }
        }
    }
}
