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
pub fn quantize_q8(x: &[f32], out: &mut [BlockQ8]) {
    debug_assert_eq!(x.len(), out.len() * 32);
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
pub fn quantize_q8x2(x: &[f32], hi: &mut [BlockQ8], lo: &mut [BlockQ8]) {
    quantize_q8(x, hi);
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
