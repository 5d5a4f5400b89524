//! Activation quantization: f32 rows -> 8-bit blocks, once per matrix product, so that the
//! weight dot products run in integer arithmetic (llama.cpp's q8_0/q8_1/q8_K scheme).

/// 32 activations: `x[i] ~= d * qs[i]`; `s = d * sum(qs)` (used by formats with an offset,
/// Q4_0/Q4_1/Q5_0/Q5_1). `d` is kept in f32 (ggml rounds it to f16).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct BlockQ8 {
    pub d: f32,
    pub s: f32,
    pub qs: [i8; 32],
}

/// 256 activations for the K-quants: `x[i] ~= d * qs[i]`; `bsums[j]` = sum of qs[16j..16j+16].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; 256],
    pub bsums: [i16; 16],
}

impl Default for BlockQ8K {
    fn default() -> Self {
        BlockQ8K { d: 0.0, qs: [0; 256], bsums: [0; 16] }
    }
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
            let r = (v * id).round() as i32;
            *q = r as i8;
            sum += r;
        }
        b.d = d;
        b.s = d * sum as f32;
    }
}

/// Quantizes `x` (a multiple of 256 long) into `x.len() / 256` Q8_K blocks (ggml's
/// `quantize_row_q8_K_ref`: the element of largest magnitude maps to -127 exactly).
pub fn quantize_q8k(x: &[f32], out: &mut [BlockQ8K]) {
    debug_assert_eq!(x.len(), out.len() * 256);
    for (xb, b) in x.chunks_exact(256).zip(out.iter_mut()) {
        let mut max = 0f32;
        let mut amax = 0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *b = BlockQ8K::default();
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(xb) {
            *q = ((iscale * v).round() as i32).min(127) as i8;
        }
        for (j, s) in b.bsums.iter_mut().enumerate() {
            *s = b.qs[16 * j..16 * j + 16].iter().map(|&q| q as i16).sum();
        }
        b.d = 1.0 / iscale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_round_trip_error_is_half_a_step() {
        let x: Vec<f32> = (0..96).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
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
    fn q8k_bsums_and_scale() {
        let x: Vec<f32> = (0..512).map(|i| ((i * 53 % 211) as f32 - 105.0) * 0.01).collect();
        let mut b = vec![BlockQ8K::default(); 2];
        quantize_q8k(&x, &mut b);
        for (i, &v) in x.iter().enumerate() {
            let blk = &b[i / 256];
            let r = blk.d * blk.qs[i % 256] as f32;
            assert!((r - v).abs() <= blk.d.abs() * 0.5 + 1e-6, "{i}: {r} vs {v}");
        }
        let s: i16 = b[0].qs[16..32].iter().map(|&q| q as i16).sum();
        assert_eq!(b[0].bsums[1], s);
    }
}
