//! Activation quantization: f32 rows -> 8-bit blocks, once per matrix product, so that the
//! weight dot products run in integer arithmetic (llama.cpp's q8_0/q8_1 scheme).

/// 32 activations: `x[i] ~= d * qs[i]`; `s = d * sum(qs)` (used by formats with an offset,
/// Q4_0/Q4_1/Q5_0/Q5_1). `d` is kept in f32 (ggml rounds it to f16).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockQ8 {
    pub d: f32,
    pub s: f32,
    pub qs: [i8; 32],
}

/// Quantizes `x` (a multiple of 32 long) into `out` (`x.len() / 32` blocks), symmetric,
/// scale = max|x| / 127, round to nearest.
///
/// On AVX-512 CPUs (unless `FERRITE_ISA` caps below it) a vector form writes the same bits.
pub fn quantize_q8(x: &[f32], out: &mut [BlockQ8]) {
    assert_eq!(
        x.len(),
        out.len() * 32,
        "quantize_q8: x is not 32 x out.len()"
    );
    #[cfg(target_arch = "x86_64")]
    if super::Isa::cached() >= super::Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f/bw/vl and avx2; lengths
        // checked above.
        unsafe { avx512::quantize::<false>(x, out, &mut []) };
        return;
    }
    quantize_q8_scalar(x, out);
}

/// The scalar reference of [`quantize_q8`].
pub fn quantize_q8_scalar(x: &[f32], out: &mut [BlockQ8]) {
    for (xb, b) in x.chunks_exact(32).zip(out.iter_mut()) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            // Round half away from zero without a libm call (`f32::round` is one on x86-64).
            let r = v * id;
            let r = (r + 0.5f32.copysign(r)) as i32;
            *q = r as i8;
            sum += r;
        }
        b.d = d;
        b.s = d * sum as f32;
    }
}

/// Quantizes `x` twice: `hi` as `quantize_q8`, then `lo` the rounding residual
/// `x - hi.d * hi.qs` in steps of exactly `hi.d / 256` (|residual| <= hi.d / 2, so the 8-bit
/// range holds it; the rare value at +128 is clamped to 127). `hi + lo` carries ~16 bits per
/// value and every dot product is linear in the activations, so `dot(w, hi) + dot(w, lo)` is
/// the product with that finer x: two passes of the plain kernels, or one pass of a fused
/// kernel that sums `256 * sum(w * hi) + sum(w * lo)` in integers (the fixed ratio is what
/// makes that possible).
///
/// On AVX-512 CPUs (unless `FERRITE_ISA` caps below it) a vector form writes the same bits.
pub fn quantize_q8x2(x: &[f32], hi: &mut [BlockQ8], lo: &mut [BlockQ8]) {
    assert!(
        x.len() == hi.len() * 32 && lo.len() == hi.len(),
        "quantize_q8x2: x is not 32 x hi.len() or lo is not as long as hi"
    );
    #[cfg(target_arch = "x86_64")]
    if super::Isa::cached() >= super::Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f/bw/vl and avx2; lengths
        // checked above.
        unsafe { avx512::quantize::<true>(x, hi, lo) };
        return;
    }
    quantize_q8x2_scalar(x, hi, lo);
}

/// The scalar reference of [`quantize_q8x2`].
pub fn quantize_q8x2_scalar(x: &[f32], hi: &mut [BlockQ8], lo: &mut [BlockQ8]) {
    quantize_q8_scalar(x, hi);
    for ((xb, h), l) in x.chunks_exact(32).zip(hi.iter()).zip(lo.iter_mut()) {
        let d = h.d * (1.0 / 256.0);
        let id = if h.d != 0.0 { 256.0 / h.d } else { 0.0 };
        let mut sum = 0i32;
        for ((q, &xi), &qh) in l.qs.iter_mut().zip(xb).zip(&h.qs) {
            let r = (xi - h.d * qh as f32) * id;
            let r = ((r + 0.5f32.copysign(r)) as i32).clamp(-127, 127);
            *q = r as i8;
            sum += r;
        }
        l.d = d;
        l.s = d * sum as f32;
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::BlockQ8;

    /// `quantize_q8` (`X2` false; `lo` unused) or `quantize_q8x2` (`X2` true), 16 lanes at a
    /// time with the scalar forms' operations (a product, then `+ copysign(0.5)`, truncation;
    /// for the residual a product and a subtraction, unfused), so the bits are theirs.
    ///
    /// # Safety
    /// avx512f/bw/vl and avx2 must be available; `x.len() == 32 * hi.len()`, and with `X2`
    /// `lo.len() == hi.len()`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn quantize<const X2: bool>(x: &[f32], hi: &mut [BlockQ8], lo: &mut [BlockQ8]) {
        let sign = _mm512_set1_epi32(i32::MIN);
        let half = _mm512_castps_si512(_mm512_set1_ps(0.5));
        // Round half away from zero, then truncate: as the scalar `(r + 0.5f32.copysign(r))
        // as i32` for the in-range values quantization produces.
        let round = |r: __m512| {
            let h = _mm512_or_si512(half, _mm512_and_si512(_mm512_castps_si512(r), sign));
            let h = _mm512_castsi512_ps(h);
            _mm512_cvttps_epi32(_mm512_add_ps(r, h))
        };
        for b in 0..hi.len() {
            // SAFETY: block b's 32 values lie in x (caller's contract).
            let (x0, x1) = unsafe {
                let p = x.as_ptr().add(32 * b);
                (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
            };
            let a = _mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1));
            let amax = _mm512_reduce_max_ps(a);
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let vid = _mm512_set1_ps(id);
            let (q0, q1) = (round(_mm512_mul_ps(x0, vid)), round(_mm512_mul_ps(x1, vid)));
            let h = &mut hi[b];
            // SAFETY: qs holds 32 bytes; each conversion stores 16.
            unsafe {
                _mm_storeu_si128(h.qs.as_mut_ptr() as *mut __m128i, _mm512_cvtepi32_epi8(q0));
                _mm_storeu_si128(
                    h.qs.as_mut_ptr().add(16) as *mut __m128i,
                    _mm512_cvtepi32_epi8(q1),
                );
            }
            h.d = d;
            h.s = d * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)) as f32;
            if X2 {
                let dl = d * (1.0 / 256.0);
                let idl = _mm512_set1_ps(if d != 0.0 { 256.0 / d } else { 0.0 });
                let vd = _mm512_set1_ps(d);
                let (lim_lo, lim_hi) = (_mm512_set1_epi32(-127), _mm512_set1_epi32(127));
                let res = |xv: __m512, q: __m512i| {
                    let r = _mm512_sub_ps(xv, _mm512_mul_ps(vd, _mm512_cvtepi32_ps(q)));
                    let r = round(_mm512_mul_ps(r, idl));
                    _mm512_min_epi32(_mm512_max_epi32(r, lim_lo), lim_hi)
                };
                let (l0, l1) = (res(x0, q0), res(x1, q1));
                let l = &mut lo[b];
                // SAFETY: as above.
                unsafe {
                    _mm_storeu_si128(l.qs.as_mut_ptr() as *mut __m128i, _mm512_cvtepi32_epi8(l0));
                    _mm_storeu_si128(
                        l.qs.as_mut_ptr().add(16) as *mut __m128i,
                        _mm512_cvtepi32_epi8(l1),
                    );
                }
                l.d = dl;
                l.s = dl * _mm512_reduce_add_epi32(_mm512_add_epi32(l0, l1)) as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_round_trip_error_is_half_a_step() {
        let x: Vec<f32> = (0..96)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013)
            .collect();
        let mut b = vec![BlockQ8::default(); 3];
        quantize_q8(&x, &mut b);
        for (i, &v) in x.iter().enumerate() {
            let blk = &b[i / 32];
            let r = blk.d * blk.qs[i % 32] as f32;
            assert!((r - v).abs() <= blk.d * 0.5 + 1e-7, "{i}: {r} vs {v}");
        }
        let s: i32 = b[1].qs.iter().map(|&q| q as i32).sum();
        assert!((b[1].s - b[1].d * s as f32).abs() < 1e-6);
    }

    /// The dispatched quantizers (AVX-512 where available) write the scalar references'
    /// bits, for values of every magnitude, exact halves and all-zero blocks.
    #[test]
    fn quantizers_equal_scalar_references_bit_for_bit() {
        let mut x = crate::quant::test_util::rand_f32(32 * 40, 5);
        for (i, v) in x.iter_mut().enumerate() {
            match i / 32 {
                0 => *v = 0.0,
                1 => *v *= 1e-30,
                2 => *v *= 3e4,
                3 => *v = (i % 32) as f32 - 15.5,
                _ if i % 7 == 0 => *v *= 37.0,
                _ => {}
            }
        }
        let nb = x.len() / 32;
        let (mut a, mut b) = (vec![BlockQ8::default(); nb], vec![BlockQ8::default(); nb]);
        quantize_q8(&x, &mut a);
        quantize_q8_scalar(&x, &mut b);
        let bits = |v: &[BlockQ8]| -> Vec<(u32, u32, [i8; 32])> {
            v.iter()
                .map(|b| (b.d.to_bits(), b.s.to_bits(), b.qs))
                .collect()
        };
        assert_eq!(bits(&a), bits(&b), "quantize_q8");
        let (mut al, mut bl) = (vec![BlockQ8::default(); nb], vec![BlockQ8::default(); nb]);
        quantize_q8x2(&x, &mut a, &mut al);
        quantize_q8x2_scalar(&x, &mut b, &mut bl);
        assert_eq!(bits(&a), bits(&b), "quantize_q8x2 hi");
        assert_eq!(bits(&al), bits(&bl), "quantize_q8x2 lo");
    }

    #[test]
    fn q8x2_residual_is_far_finer() {
        let x: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013 + if i == 5 { 9.0 } else { 0.0 })
            .collect();
        let (mut hi, mut lo) = (vec![BlockQ8::default(); 2], vec![BlockQ8::default(); 2]);
        quantize_q8x2(&x, &mut hi, &mut lo);
        for (i, &v) in x.iter().enumerate() {
            let (h, l) = (&hi[i / 32], &lo[i / 32]);
            let r = h.d * h.qs[i % 32] as f32 + l.d * l.qs[i % 32] as f32;
            assert!(
                (r - v).abs() <= h.d / 256.0 * 1.01 + 1e-7 && l.d == h.d / 256.0,
                "{i}: {r} vs {v}"
            );
        }
    }
}
