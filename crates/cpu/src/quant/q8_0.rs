//! Q8_0 weights times Q8 activations. Block layout (ggml): {f16 d, i8 qs[32]} (34 bytes),
//! w = d * q.

use super::q8::BlockQ8;
use super::{f16_at, Isa};

pub const Q8_0_BYTES: usize = 34;

pub fn dot_q8_0(isa: Isa, w: &[u8], a: &[BlockQ8]) -> f32 {
    assert!(w.len() >= a.len() * Q8_0_BYTES);
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f/bw/vl/vnni, avx2, fma and
        // f16c; lengths checked above.
        return unsafe { avx512::tile([w], [a], None) }[0][0];
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: Isa::Avx2 implies runtime-detected avx2/fma/f16c; length checked above.
        return unsafe { x86::dot_q8_0(w, a) };
    }
    let _ = isa;
    dot_q8_0_scalar(w, a)
}

/// Dot products of one Q8_0 row with four activation rows (each weight block is loaded once
/// for the four): `[dot(w, a[0]), .., dot(w, a[3])]`, each bit for bit what [`dot_q8_0`]
/// gives (same float operations in the same order).
pub fn dot_q8_0_x4(isa: Isa, w: &[u8], a: [&[BlockQ8]; 4]) -> [f32; 4] {
    let nb = a[0].len();
    assert!(a.iter().all(|x| x.len() == nb) && w.len() >= nb * Q8_0_BYTES);
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f/bw/vl/vnni, avx2, fma and
        // f16c; lengths checked above.
        return unsafe { avx512::tile([w], a, None) }[0];
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: Isa::Avx2 implies runtime-detected avx2/fma/f16c; lengths checked above.
        return unsafe { x86::dot_q8_0_x4(w, a) };
    }
    let _ = isa;
    a.map(|ai| dot_q8_0_scalar(w, ai))
}

/// `dot_q8_0` with q8x2 activations (`lo[i].d == hi[i].d / 256`, as `quantize_q8x2` writes
/// them) in one pass over the weights: `256 * sum(w * hi) + sum(w * lo)` per block in integers.
pub fn dot_q8_0_x2(isa: Isa, w: &[u8], hi: &[BlockQ8], lo: &[BlockQ8]) -> f32 {
    assert!(w.len() >= hi.len() * Q8_0_BYTES && lo.len() == hi.len());
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f/bw/vl/vnni, avx2, fma and
        // f16c; lengths checked above.
        return unsafe { avx512::tile([w], [hi], Some([lo])) }[0][0];
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Vnni {
        // SAFETY: Isa::Vnni implies runtime-detected avx2/fma/f16c/avxvnni; lengths checked.
        return unsafe { x86::dot_q8_0_x2_vnni(w, hi, lo) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: Isa::Avx2 implies runtime-detected avx2/fma/f16c; lengths checked above.
        return unsafe { x86::dot_q8_0_x2(w, hi, lo) };
    }
    let _ = isa;
    dot_q8_0_scalar(w, hi) + dot_q8_0_scalar(w, lo)
}

/// Products of `R` Q8_0 rows with `K` activation rows: `out[r][k] = dot(w[r], hi[k])`, or,
/// with q8x2 activations (`lo`, see [`dot_q8_0_x2`]), `dot(w[r], hi[k] + lo[k])`. Each
/// `(r, k)` has the bits of the one-row kernel of the same instruction set, whatever `R` and
/// `K`; on AVX-512 one pass over the blocks serves the whole tile, elsewhere the tile is
/// composed of [`dot_q8_0_x4`] and the one-row kernels.
pub fn dot_q8_0_tile<const R: usize, const K: usize>(
    isa: Isa,
    w: [&[u8]; R],
    hi: [&[BlockQ8]; K],
    lo: Option<[&[BlockQ8]; K]>,
) -> [[f32; K]; R] {
    super::check_tile("dot_q8_0_tile", Q8_0_BYTES, &w, &hi, lo.as_ref());
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above are only produced after runtime detection of avx512f/bw/vl/vnni,
        // avx2, fma and f16c; every row holds nb blocks (checked above).
        return unsafe { avx512::tile(w, hi, lo) };
    }
    let mut out = [[0f32; K]; R];
    for (o, &wr) in out.iter_mut().zip(&w) {
        if K == 4 && lo.is_none() {
            let v = dot_q8_0_x4(isa, wr, std::array::from_fn(|k| hi[k]));
            o.copy_from_slice(&v[..K]);
        } else {
            for k in 0..K {
                o[k] = match lo {
                    Some(l) => dot_q8_0_x2(isa, wr, hi[k], l[k]),
                    None => dot_q8_0(isa, wr, hi[k]),
                };
            }
        }
    }
    out
}

pub fn dot_q8_0_scalar(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut sum = 0f32;
    for (i, b) in a.iter().enumerate() {
        let blk = &w[i * Q8_0_BYTES..(i + 1) * Q8_0_BYTES];
        let d = f16_at(blk, 0);
        let acc: i32 = blk[2..34]
            .iter()
            .zip(&b.qs)
            .map(|(&q, &x)| q as i8 as i32 * x as i32)
            .sum();
        sum += d * b.d * acc as f32;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::super::q8::BlockQ8;
    use super::super::x86::{f16_load, hsum_ps};
    use super::Q8_0_BYTES;

    /// Sum over 32 lanes of i8 `x` times i8 `y`, as 8 i32 lanes (sign moved onto y so that
    /// maddubs sees an unsigned operand; |x| <= 128 and |y| <= 127 keep pairs in i16).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn mul_i8_i8(x: __m256i, y: __m256i) -> __m256i {
        let ax = _mm256_sign_epi8(x, x);
        let sy = _mm256_sign_epi8(y, x);
        _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
    }

    /// The q8x2 Q8_0 kernel; `$mul(ax, sy)` sums u8 `ax` x i8 `sy` into 8 i32 lanes. Per
    /// lane at most 4 * 128 * 127 * 257: no overflow.
    macro_rules! x2_body {
        ($w:expr, $hi:expr, $lo:expr, $mul:expr) => {{
            let (w, hi, lo) = ($w, $hi, $lo);
            let mut acc = _mm256_setzero_ps();
            for (i, (b, l)) in hi.iter().zip(lo.iter()).enumerate() {
                // SAFETY: block i lies within w (caller's contract).
                unsafe {
                    let p = w.as_ptr().add(i * Q8_0_BYTES);
                    let q = _mm256_loadu_si256(p.add(2) as *const __m256i);
                    let qh = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                    let ql = _mm256_loadu_si256(l.qs.as_ptr() as *const __m256i);
                    // Sign moved onto the activations so the weights are the unsigned operand.
                    let aq = _mm256_sign_epi8(q, q);
                    let sh = $mul(aq, _mm256_sign_epi8(qh, q));
                    let sl = $mul(aq, _mm256_sign_epi8(ql, q));
                    let s = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_slli_epi32(sh, 8), sl));
                    let d = f16_load(p) * b.d * (1.0 / 256.0);
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(d), s, acc);
                }
            }
            hsum_ps(acc)
        }};
    }

    /// # Safety
    /// avx2, fma and f16c must be available; `w` holds at least `hi.len()` Q8_0 blocks and
    /// `lo` is as long as `hi`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q8_0_x2(w: &[u8], hi: &[BlockQ8], lo: &[BlockQ8]) -> f32 {
        x2_body!(w, hi, lo, |a, b| _mm256_madd_epi16(
            _mm256_maddubs_epi16(a, b),
            _mm256_set1_epi16(1)
        ))
    }

    /// # Safety
    /// avx2, fma, f16c and avxvnni must be available; lengths as in `dot_q8_0_x2`.
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub unsafe fn dot_q8_0_x2_vnni(w: &[u8], hi: &[BlockQ8], lo: &[BlockQ8]) -> f32 {
        x2_body!(w, hi, lo, |a, b| _mm256_dpbusd_avx_epi32(
            _mm256_setzero_si256(),
            a,
            b
        ))
    }

    /// # Safety
    /// avx2, fma and f16c must be available; `w` holds at least `a.len()` Q8_0 blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q8_0(w: &[u8], a: &[BlockQ8]) -> f32 {
        let mut acc0 = _mm256_setzero_ps();
        let mut acc1 = _mm256_setzero_ps();
        let n = a.len();
        let mut i = 0;
        // SAFETY: every block index < a.len() lies within w (caller's contract).
        unsafe {
            while i + 1 < n {
                let p0 = w.as_ptr().add(i * Q8_0_BYTES);
                let p1 = p0.add(Q8_0_BYTES);
                let q0 = _mm256_loadu_si256(p0.add(2) as *const __m256i);
                let q1 = _mm256_loadu_si256(p1.add(2) as *const __m256i);
                let a0 = _mm256_loadu_si256(a[i].qs.as_ptr() as *const __m256i);
                let a1 = _mm256_loadu_si256(a[i + 1].qs.as_ptr() as *const __m256i);
                let s0 = _mm256_cvtepi32_ps(mul_i8_i8(q0, a0));
                let s1 = _mm256_cvtepi32_ps(mul_i8_i8(q1, a1));
                acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16_load(p0) * a[i].d), s0, acc0);
                acc1 = _mm256_fmadd_ps(_mm256_set1_ps(f16_load(p1) * a[i + 1].d), s1, acc1);
                i += 2;
            }
            if i < n {
                let p = w.as_ptr().add(i * Q8_0_BYTES);
                let q = _mm256_loadu_si256(p.add(2) as *const __m256i);
                let qa = _mm256_loadu_si256(a[i].qs.as_ptr() as *const __m256i);
                let s = _mm256_cvtepi32_ps(mul_i8_i8(q, qa));
                acc0 = _mm256_fmadd_ps(_mm256_set1_ps(f16_load(p) * a[i].d), s, acc0);
            }
        }
        hsum_ps(_mm256_add_ps(acc0, acc1))
    }

    /// # Safety
    /// avx2, fma and f16c must be available; `w` holds at least `a[k].len()` Q8_0 blocks and
    /// the four activation rows have equal length.
    ///
    /// Row k's operations are those of [`dot_q8_0`] on `a[k]`, in the same order (even and odd
    /// blocks in two accumulators, `hsum_ps` of their sum).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q8_0_x4(w: &[u8], a: [&[BlockQ8]; 4]) -> [f32; 4] {
        let mut acc0 = [_mm256_setzero_ps(); 4];
        let mut acc1 = [_mm256_setzero_ps(); 4];
        let n = a[0].len();
        let mut i = 0;
        // SAFETY: every block index < n lies within w and every activation row.
        unsafe {
            while i + 1 < n {
                let p0 = w.as_ptr().add(i * Q8_0_BYTES);
                let p1 = p0.add(Q8_0_BYTES);
                let q0 = _mm256_loadu_si256(p0.add(2) as *const __m256i);
                let q1 = _mm256_loadu_si256(p1.add(2) as *const __m256i);
                let (d0, d1) = (f16_load(p0), f16_load(p1));
                let (aq0, aq1) = (_mm256_sign_epi8(q0, q0), _mm256_sign_epi8(q1, q1));
                for k in 0..4 {
                    let (b0, b1) = (a[k].get_unchecked(i), a[k].get_unchecked(i + 1));
                    let x0 = _mm256_loadu_si256(b0.qs.as_ptr() as *const __m256i);
                    let x1 = _mm256_loadu_si256(b1.qs.as_ptr() as *const __m256i);
                    let s0 = _mm256_cvtepi32_ps(mul_abs(aq0, q0, x0));
                    let s1 = _mm256_cvtepi32_ps(mul_abs(aq1, q1, x1));
                    acc0[k] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * b0.d), s0, acc0[k]);
                    acc1[k] = _mm256_fmadd_ps(_mm256_set1_ps(d1 * b1.d), s1, acc1[k]);
                }
                i += 2;
            }
            if i < n {
                let p = w.as_ptr().add(i * Q8_0_BYTES);
                let q = _mm256_loadu_si256(p.add(2) as *const __m256i);
                let d = f16_load(p);
                let aq = _mm256_sign_epi8(q, q);
                for k in 0..4 {
                    let b = a[k].get_unchecked(i);
                    let x = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                    let s = _mm256_cvtepi32_ps(mul_abs(aq, q, x));
                    acc0[k] = _mm256_fmadd_ps(_mm256_set1_ps(d * b.d), s, acc0[k]);
                }
            }
        }
        [0, 1, 2, 3].map(|k| hsum_ps(_mm256_add_ps(acc0[k], acc1[k])))
    }

    /// [`mul_i8_i8`]`(x, y)` with `ax = |x|` computed once by the caller.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn mul_abs(ax: __m256i, x: __m256i, y: __m256i) -> __m256i {
        let sy = _mm256_sign_epi8(y, x);
        _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    use super::super::q8::BlockQ8;
    use super::super::x86::{act_pair, pack_ds, pair_scale_index, reduce16, TILES_AHEAD};
    use super::Q8_0_BYTES;

    /// Block pair (i, i + 1) of a Q8_0 row, `p` at block i: 64 u8 lanes `q + 128` (block i's
    /// 32, then block i + 1's; zeros when `two` is false) and the f32 lanes
    /// `[d_i, 0, d_i+1, 0]`.
    ///
    /// # Safety
    /// avx512f/bw/vl, avx2 and f16c must be available; block i (and i + 1 when `two`) lies
    /// at `p`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn weight_pair(p: *const u8, two: bool) -> (__m512i, __m128) {
        // SAFETY: the blocks read lie at p (caller's contract); loads are unaligned.
        unsafe {
            let d0 = (p as *const u16).read_unaligned() as i32;
            let q0 = _mm256_loadu_si256(p.add(2) as *const __m256i);
            let (d1, q) = if two {
                let p1 = p.add(Q8_0_BYTES);
                let q1 = _mm256_loadu_si256(p1.add(2) as *const __m256i);
                (
                    (p1 as *const u16).read_unaligned() as i32,
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(q0), q1),
                )
            } else {
                (0, _mm512_zextsi256_si512(q0))
            };
            // The sign bit flipped: i8 q -> u8 q + 128 (vpdpbusd takes unsigned weights). A
            // missing block flips to 128s; its activations are zeros.
            let q = _mm512_xor_si512(q, _mm512_set1_epi8(-128));
            (q, _mm_cvtph_ps(_mm_setr_epi32(d0, d1, 0, 0)))
        }
    }

    /// `out[r][k] = dot(w[r], hi[k])`, or `dot(w[r], hi[k] + lo[k])` with `lo` (q8x2), over
    /// `hi[0].len()` blocks. Per block pair and `(r, k)`: `vpdpbusd` of the shifted weights
    /// `q + 128` (q8x2: `256 * sum((q + 128) hi) + sum((q + 128) lo)`, at most
    /// 4 * 255 * 127 * 257 per lane), minus `128 * sum(a)` per lane computed once per
    /// activation pair, scaled by `d * a.d` into a 16-lane accumulator. Every `(r, k)` sees
    /// the same float operations in the same order whatever `R` and `K` are.
    ///
    /// # Safety
    /// avx512f/bw/vl/vnni, avx2, fma and f16c must be available; `K <= 4`; every activation
    /// row has `hi[0].len()` blocks and every weight row at least that many.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn tile<const R: usize, const K: usize>(
        w: [&[u8]; R],
        hi: [&[BlockQ8]; K],
        lo: Option<[&[BlockQ8]; K]>,
    ) -> [[f32; K]; R] {
        // SAFETY: the caller's contract.
        unsafe {
            match lo {
                Some(lo) => tile_impl::<R, K, true>(w, hi, lo),
                None => tile_impl::<R, K, false>(w, hi, hi),
            }
        }
    }

    /// `tile`, with `X2` choosing q8x2 (`lo` read) or q8 (`lo` ignored) at compile time.
    ///
    /// # Safety
    /// As `tile`; `lo` rows as long as `hi` rows.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn tile_impl<const R: usize, const K: usize, const X2: bool>(
        w: [&[u8]; R],
        hi: [&[BlockQ8]; K],
        lo: [&[BlockQ8]; K],
    ) -> [[f32; K]; R] {
        let nb = hi.first().map_or(0, |h| h.len());
        let mut acc = [[_mm512_setzero_ps(); K]; R];
        let mut idx = [_mm512_setzero_si512(); K];
        for (k, x) in idx.iter_mut().enumerate() {
            *x = pair_scale_index(k);
        }
        // Prefetch distance: the same block TILES_AHEAD tiles of rows further on (the rows
        // of a matrix are contiguous, so that is where this walk of the matrix goes next).
        let ahead = TILES_AHEAD * R * w.first().map_or(0, |r| r.len());
        let zero = _mm512_setzero_si512();
        let bias = _mm512_set1_epi8(-128);
        let mut i = 0;
        while i < nb {
            let two = i + 1 < nb;
            let mut qh = [zero; K];
            let mut ql = [zero; K];
            let mut corr = [zero; K];
            let mut ds = [_mm_setzero_ps(); K];
            for k in 0..K {
                // SAFETY: blocks i (and i + 1 when two) exist in every activation row.
                let (h, l, d) =
                    unsafe { act_pair(hi[k].as_ptr(), X2.then(|| lo[k].as_ptr()), i, two) };
                (qh[k], ql[k], ds[k]) = (h, l, d);
                // What the +128 shift of the weights adds, per lane.
                let c = _mm512_dpbusd_epi32(zero, bias, h);
                corr[k] = if X2 {
                    _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(c), bias, l)
                } else {
                    c
                };
            }
            let ds = pack_ds(ds);
            for r in 0..R {
                // SAFETY: block i (and i + 1) lies within row r (caller's contract); the
                // prefetch is a hint only and may point past the matrix.
                let (q, dm) = unsafe {
                    let p = w[r].as_ptr().add(i * Q8_0_BYTES);
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead + 64) as *const i8);
                    weight_pair(p, two)
                };
                let prod = _mm512_mul_ps(_mm512_broadcast_f32x4(dm), ds);
                for k in 0..K {
                    let s = if X2 {
                        let h = _mm512_dpbusd_epi32(zero, q, qh[k]);
                        _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(h), q, ql[k])
                    } else {
                        _mm512_dpbusd_epi32(zero, q, qh[k])
                    };
                    let s = _mm512_sub_epi32(s, corr[k]);
                    let scale = _mm512_permutexvar_ps(idx[k], prod);
                    acc[r][k] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), acc[r][k]);
                }
            }
            i += 2;
        }
        let mut out = [[0f32; K]; R];
        for r in 0..R {
            for k in 0..K {
                out[r][k] = reduce16(acc[r][k]);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::test_util::{acts_q8, rand_blocks};

    #[test]
    fn simd_matches_scalar_odd_sizes() {
        for nb in [1usize, 2, 3, 18, 21] {
            let a = acts_q8(nb, 40 + nb as u64);
            let w = rand_blocks(nb, Q8_0_BYTES, &[0], 41 + nb as u64);
            for isa in Isa::available() {
                let (r, s) = (dot_q8_0(isa, &w, &a), dot_q8_0_scalar(&w, &a));
                assert!(
                    (r - s).abs() <= 1e-4 * (1.0 + s.abs()),
                    "{isa:?} nb={nb}: {r} {s}"
                );
            }
        }
    }

    /// A batch row's product must not depend on the kernel the batch sends it through.
    #[test]
    fn x4_equals_single_bit_for_bit() {
        for nb in [1usize, 2, 3, 18, 21] {
            let acts: Vec<Vec<BlockQ8>> = (0..4).map(|k| acts_q8(nb, 50 + k + nb as u64)).collect();
            let w = rand_blocks(nb, Q8_0_BYTES, &[0], 51 + nb as u64);
            for isa in Isa::available() {
                let got = dot_q8_0_x4(isa, &w, [&acts[0], &acts[1], &acts[2], &acts[3]]);
                for k in 0..4 {
                    let one = dot_q8_0(isa, &w, &acts[k]);
                    assert_eq!(got[k].to_bits(), one.to_bits(), "{isa:?} nb={nb} row {k}");
                }
            }
        }
    }

    #[test]
    fn x2_matches_two_scalar_passes() {
        use crate::quant::q8::quantize_q8x2;
        for nb in [1usize, 2, 3, 18, 21] {
            let x: Vec<f32> = crate::quant::test_util::rand_f32(nb * 32, 80 + nb as u64)
                .iter()
                .enumerate()
                .map(|(i, v)| if i % 31 == 7 { v * 50.0 } else { *v })
                .collect();
            let (mut hi, mut lo) = (vec![BlockQ8::default(); nb], vec![BlockQ8::default(); nb]);
            quantize_q8x2(&x, &mut hi, &mut lo);
            let w = rand_blocks(nb, Q8_0_BYTES, &[0], 81 + nb as u64);
            let want = dot_q8_0_scalar(&w, &hi) + dot_q8_0_scalar(&w, &lo);
            for isa in Isa::available() {
                let got = dot_q8_0_x2(isa, &w, &hi, &lo);
                assert!(
                    (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "{isa:?} nb={nb}: {got} vs {want}"
                );
            }
        }
    }

    /// Every tile shape the product uses (4x4, 1x4, 4x1, 1x1; q8 and q8x2) gives each
    /// (weight row, activation row) the bits of the one-row kernel, on every instruction
    /// set, and stays within rounding of the scalar reference; odd block counts exercise
    /// the AVX-512 kernels' lone last block.
    #[test]
    fn tiles_agree_bit_for_bit_and_match_scalar() {
        crate::quant::check_tiles!(
            tile: dot_q8_0_tile,
            block: Q8_0_BYTES,
            scales: &[0],
            nbs: [1usize, 2, 3, 18, 33, 48],
            seeds: (130, 140),
            scalar: dot_q8_0_scalar,
            direct: |isa, w, h, l: Option<&[BlockQ8]>| match l {
                Some(l) => dot_q8_0_x2(isa, w, h, l),
                None => dot_q8_0(isa, w, h),
            }
        );
    }

    #[test]
    fn scalar_matches_dequantized_dot() {
        let nb = 3;
        let a = acts_q8(nb, 8);
        let w = rand_blocks(nb, Q8_0_BYTES, &[0], 9);
        let mut wf = vec![0f32; nb * 32];
        ferrite_gguf::quant::dequantize(ferrite_gguf::GgmlType::Q8_0, &w, &mut wf).unwrap();
        let want: f32 = (0..nb * 32)
            .map(|i| wf[i] * a[i / 32].d * a[i / 32].qs[i % 32] as f32)
            .sum();
        let got = dot_q8_0_scalar(&w, &a);
        assert!(
            (got - want).abs() <= 1e-3 * (1.0 + want.abs()),
            "{got} vs {want}"
        );
    }
}
