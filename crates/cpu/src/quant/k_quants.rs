//! Q4_K and Q6_K weights times activations quantized to Q8 blocks of 32 (8 per super-block),
//! so each 32-value group has its own activation scale: finer than ggml's Q8_K (one scale per
//! 256), which measurably hurt Gemma-3's perplexity.
//!
//! Q4_K (144 bytes): {f16 d, f16 dmin, u8 scales[12], u8 qs[128]}; 8 groups of 32 with 6-bit
//! (scale, min) pairs; group 2j is the low nibbles of qs[32j..32j+32], group 2j+1 the high
//! nibbles; w = d * sc * q - dmin * m.
//! Q6_K (210 bytes): {u8 ql[128], u8 qh[64], i8 scales[16], f16 d}; 16 groups of 16 with an
//! i8 scale each; w = d * sc * (q - 32), q 6-bit (see `unpack_q6k` for the bit layout).

use ferrite_gguf::quant::scale_min_k4;

use super::f16_at;
use super::q8::BlockQ8;
use super::Isa;

pub const Q4_K_BYTES: usize = 144;
pub const Q6_K_BYTES: usize = 210;

pub fn dot_q4_k(isa: Isa, w: &[u8], a: &[BlockQ8]) -> f32 {
    assert!(a.len().is_multiple_of(8) && w.len() >= a.len() / 8 * Q4_K_BYTES);
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: Isa::Avx2 implies runtime-detected avx2/fma/f16c; lengths checked above.
        return unsafe { x86::dot_q4_k(w, a) };
    }
    let _ = isa;
    dot_q4_k_scalar(w, a)
}

pub fn dot_q6_k(isa: Isa, w: &[u8], a: &[BlockQ8]) -> f32 {
    assert!(a.len().is_multiple_of(8) && w.len() >= a.len() / 8 * Q6_K_BYTES);
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: as in dot_q4_k.
        return unsafe { x86::dot_q6_k(w, a) };
    }
    let _ = isa;
    dot_q6_k_scalar(w, a)
}

fn scales12(blk: &[u8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    s.copy_from_slice(&blk[4..16]);
    s
}

/// Scalar reference: `a` holds 8 Q8 blocks per Q4_K super-block.
pub fn dot_q4_k_scalar(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut sum = 0f32;
    for (i, ab) in a.chunks_exact(8).enumerate() {
        let blk = &w[i * Q4_K_BYTES..(i + 1) * Q4_K_BYTES];
        let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
        let sc = scales12(blk);
        for j in 0..4 {
            let q = &blk[16 + 32 * j..16 + 32 * j + 32];
            for (h, b) in [(0, &ab[2 * j]), (1, &ab[2 * j + 1])] {
                let (s, m) = scale_min_k4(2 * j + h, &sc);
                let dot: i32 = q
                    .iter()
                    .zip(&b.qs)
                    .map(|(&q, &x)| ((q >> (4 * h)) & 0xF) as i32 * x as i32)
                    .sum();
                sum += d * s as f32 * b.d * dot as f32 - dmin * m as f32 * b.s;
            }
        }
    }
    sum
}

/// The 256 6-bit values (0..64) of a Q6_K block, in element order.
pub fn unpack_q6k(blk: &[u8]) -> [u8; 256] {
    let mut q = [0u8; 256];
    for n in 0..2 {
        let ql = &blk[64 * n..64 * n + 64];
        let qh = &blk[128 + 32 * n..128 + 32 * n + 32];
        let y = &mut q[128 * n..128 * n + 128];
        for l in 0..32 {
            y[l] = (ql[l] & 0xF) | ((qh[l] & 3) << 4);
            y[l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
            y[l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
            y[l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
        }
    }
    q
}

/// Scalar reference: `a` holds 8 Q8 blocks per Q6_K super-block.
pub fn dot_q6_k_scalar(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut sum = 0f32;
    for (i, ab) in a.chunks_exact(8).enumerate() {
        let blk = &w[i * Q6_K_BYTES..(i + 1) * Q6_K_BYTES];
        let q = unpack_q6k(blk);
        let d = f16_at(blk, 208);
        for (k, b) in ab.iter().enumerate() {
            let mut acc = 0i32;
            for h in 0..2 {
                let g = 2 * k + h;
                let sc = blk[192 + g] as i8 as i32;
                let dot: i32 = q[16 * g..16 * g + 16]
                    .iter()
                    .zip(&b.qs[16 * h..16 * h + 16])
                    .map(|(&q, &x)| (q as i32 - 32) * x as i32)
                    .sum();
                acc += sc * dot;
            }
            sum += d * b.d * acc as f32;
        }
    }
    sum
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::q4::x86::mul_u8_i8;
    use super::super::q8::BlockQ8;
    use super::super::q8_0::x86::mul_i8_i8;
    use super::super::x86::{f16_load, hsum_ps};
    use super::{scale_min_k4, scales12, Q4_K_BYTES, Q6_K_BYTES};

    /// # Safety
    /// avx2, fma and f16c must be available; `w` holds at least `a.len() / 8` Q4_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_k(w: &[u8], a: &[BlockQ8]) -> f32 {
        let mask = _mm256_set1_epi8(0x0F);
        let mut acc = _mm256_setzero_ps();
        let mut mins = 0f32;
        for (i, ab) in a.chunks_exact(8).enumerate() {
            let blk = &w[i * Q4_K_BYTES..(i + 1) * Q4_K_BYTES];
            let sc = scales12(blk);
            // SAFETY: all loads stay inside blk (144 bytes) and the 32-byte act blocks.
            unsafe {
                let (d, dmin) = (f16_load(blk.as_ptr()), f16_load(blk.as_ptr().add(2)));
                for j in 0..4 {
                    let (s_lo, m_lo) = scale_min_k4(2 * j, &sc);
                    let (s_hi, m_hi) = scale_min_k4(2 * j + 1, &sc);
                    let (b0, b1) = (&ab[2 * j], &ab[2 * j + 1]);
                    let q = _mm256_loadu_si256(blk.as_ptr().add(16 + 32 * j) as *const __m256i);
                    let q_lo = _mm256_and_si256(q, mask);
                    let q_hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
                    let x0 = _mm256_loadu_si256(b0.qs.as_ptr() as *const __m256i);
                    let x1 = _mm256_loadu_si256(b1.qs.as_ptr() as *const __m256i);
                    let p0 = _mm256_cvtepi32_ps(mul_u8_i8(q_lo, x0));
                    let p1 = _mm256_cvtepi32_ps(mul_u8_i8(q_hi, x1));
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(d * s_lo as f32 * b0.d), p0, acc);
                    acc = _mm256_fmadd_ps(_mm256_set1_ps(d * s_hi as f32 * b1.d), p1, acc);
                    mins += dmin * (m_lo as f32 * b0.s + m_hi as f32 * b1.s);
                }
            }
        }
        hsum_ps(acc) - mins
    }

    /// # Safety
    /// avx2, fma and f16c must be available; `w` holds at least `a.len() / 8` Q6_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q6_k(w: &[u8], a: &[BlockQ8]) -> f32 {
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(0x03);
        let c32 = _mm256_set1_epi8(32);
        let mut acc = _mm256_setzero_ps();
        for (i, ab) in a.chunks_exact(8).enumerate() {
            let blk = &w[i * Q6_K_BYTES..(i + 1) * Q6_K_BYTES];
            // SAFETY: all loads stay inside blk (210 bytes) and the 32-byte act blocks.
            unsafe {
                let d = f16_load(blk.as_ptr().add(208));
                for n in 0..2 {
                    let ql0 = _mm256_loadu_si256(blk.as_ptr().add(64 * n) as *const __m256i);
                    let ql1 = _mm256_loadu_si256(blk.as_ptr().add(64 * n + 32) as *const __m256i);
                    let qh = _mm256_loadu_si256(blk.as_ptr().add(128 + 32 * n) as *const __m256i);
                    let h0 = _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4);
                    let h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4);
                    let h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4);
                    let h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4);
                    let q = [
                        _mm256_or_si256(_mm256_and_si256(ql0, m4), h0),
                        _mm256_or_si256(_mm256_and_si256(ql1, m4), h1),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), h2),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), h3),
                    ];
                    for (k, qk) in q.iter().enumerate() {
                        // 32 values = 16-groups 8n + 2k (i32 lanes 0..4) and 8n + 2k + 1 (4..8).
                        let b = &ab[4 * n + k];
                        let x = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                        let p = _mm256_cvtepi32_ps(mul_i8_i8(_mm256_sub_epi8(*qk, c32), x));
                        let s0 = blk[192 + 8 * n + 2 * k] as i8 as f32;
                        let s1 = blk[192 + 8 * n + 2 * k + 1] as i8 as f32;
                        let f = d * b.d;
                        let sv = _mm256_setr_ps(s0, s0, s0, s0, s1, s1, s1, s1);
                        acc = _mm256_fmadd_ps(_mm256_mul_ps(sv, _mm256_set1_ps(f)), p, acc);
                    }
                }
            }
        }
        hsum_ps(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8::quantize_q8;
    use crate::quant::test_util::{rand_blocks, rand_f32};
    use ferrite_gguf::GgmlType;

    fn acts(nb: usize, seed: u64) -> Vec<BlockQ8> {
        let x = rand_f32(nb * 256, seed);
        let mut a = vec![BlockQ8::default(); nb * 8];
        quantize_q8(&x, &mut a);
        a
    }

    fn deq_dot(ty: GgmlType, w: &[u8], a: &[BlockQ8]) -> f32 {
        let mut wf = vec![0f32; a.len() * 32];
        ferrite_gguf::quant::dequantize(ty, w, &mut wf).unwrap();
        (0..wf.len())
            .map(|i| wf[i] * a[i / 32].d * a[i / 32].qs[i % 32] as f32)
            .sum()
    }

    #[test]
    fn scalar_matches_dequantized_dot() {
        for nb in [1usize, 3] {
            let a = acts(nb, 5);
            let w4 = rand_blocks(nb, Q4_K_BYTES, &[0, 2], 1);
            let w6 = rand_blocks(nb, Q6_K_BYTES, &[208], 2);
            let (g4, e4) = (dot_q4_k_scalar(&w4, &a), deq_dot(GgmlType::Q4_K, &w4, &a));
            let (g6, e6) = (dot_q6_k_scalar(&w6, &a), deq_dot(GgmlType::Q6_K, &w6, &a));
            assert!(
                (g4 - e4).abs() <= 1e-3 * (1.0 + e4.abs()),
                "q4_k {g4} vs {e4}"
            );
            assert!(
                (g6 - e6).abs() <= 1e-3 * (1.0 + e6.abs()),
                "q6_k {g6} vs {e6}"
            );
        }
    }

    #[test]
    fn simd_matches_scalar_odd_sizes() {
        for nb in [1usize, 2, 5] {
            let a = acts(nb, 50 + nb as u64);
            let w4 = rand_blocks(nb, Q4_K_BYTES, &[0, 2], 3 + nb as u64);
            let w6 = rand_blocks(nb, Q6_K_BYTES, &[208], 4 + nb as u64);
            for isa in Isa::available() {
                let (r4, s4) = (dot_q4_k(isa, &w4, &a), dot_q4_k_scalar(&w4, &a));
                let (r6, s6) = (dot_q6_k(isa, &w6, &a), dot_q6_k_scalar(&w6, &a));
                assert!(
                    (r4 - s4).abs() <= 1e-4 * (1.0 + s4.abs()),
                    "{isa:?} q4_k: {r4} {s4}"
                );
                assert!(
                    (r6 - s6).abs() <= 1e-4 * (1.0 + s6.abs()),
                    "{isa:?} q6_k: {r6} {s6}"
                );
            }
        }
    }
}
