//! Q4_K and Q6_K weights times Q8_K activations (super-blocks of 256).
//!
//! Q4_K (144 bytes): {f16 d, f16 dmin, u8 scales[12], u8 qs[128]}; 8 groups of 32 with 6-bit
//! (scale, min) pairs; group 2j is the low nibbles of qs[32j..32j+32], group 2j+1 the high
//! nibbles; w = d * sc * q - dmin * m.
//! Q6_K (210 bytes): {u8 ql[128], u8 qh[64], i8 scales[16], f16 d}; 16 groups of 16 with an
//! i8 scale each; w = d * sc * (q - 32), q 6-bit (see `unpack_q6k` for the bit layout).

use ferrite_gguf::quant::scale_min_k4;

use super::f16_at;
use super::q8::BlockQ8K;
use super::Isa;

pub const Q4_K_BYTES: usize = 144;
pub const Q6_K_BYTES: usize = 210;

pub fn dot_q4_k(isa: Isa, w: &[u8], a: &[BlockQ8K]) -> f32 {
    assert!(w.len() >= a.len() * Q4_K_BYTES);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
        // SAFETY: Isa::Avx2 implies runtime-detected avx2/fma/f16c; length checked above.
        return unsafe { x86::dot_q4_k(w, a) };
    }
    let _ = isa;
    dot_q4_k_scalar(w, a)
}

pub fn dot_q6_k(isa: Isa, w: &[u8], a: &[BlockQ8K]) -> f32 {
    assert!(w.len() >= a.len() * Q6_K_BYTES);
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx2 {
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

pub fn dot_q4_k_scalar(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (i, b) in a.iter().enumerate() {
        let blk = &w[i * Q4_K_BYTES..(i + 1) * Q4_K_BYTES];
        let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
        let sc = scales12(blk);
        let qs = &blk[16..144];
        let (mut isum, mut msum) = (0i32, 0i32);
        for j in 0..4 {
            let q = &qs[32 * j..32 * j + 32];
            let (s_lo, m_lo) = scale_min_k4(2 * j, &sc);
            let (s_hi, m_hi) = scale_min_k4(2 * j + 1, &sc);
            let x_lo = &b.qs[64 * j..64 * j + 32];
            let x_hi = &b.qs[64 * j + 32..64 * j + 64];
            let lo: i32 = q.iter().zip(x_lo).map(|(&q, &x)| (q & 0xF) as i32 * x as i32).sum();
            let hi: i32 = q.iter().zip(x_hi).map(|(&q, &x)| (q >> 4) as i32 * x as i32).sum();
            isum += s_lo as i32 * lo + s_hi as i32 * hi;
            let bs_lo = b.bsums[4 * j] as i32 + b.bsums[4 * j + 1] as i32;
            let bs_hi = b.bsums[4 * j + 2] as i32 + b.bsums[4 * j + 3] as i32;
            msum += m_lo as i32 * bs_lo + m_hi as i32 * bs_hi;
        }
        sum += b.d * (d * isum as f32 - dmin * msum as f32);
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

pub fn dot_q6_k_scalar(w: &[u8], a: &[BlockQ8K]) -> f32 {
    let mut sum = 0f32;
    for (i, b) in a.iter().enumerate() {
        let blk = &w[i * Q6_K_BYTES..(i + 1) * Q6_K_BYTES];
        let q = unpack_q6k(blk);
        let d = f16_at(blk, 208);
        let mut isum = 0i32;
        for g in 0..16 {
            let sc = blk[192 + g] as i8 as i32;
            let s: i32 =
                q[16 * g..16 * g + 16].iter().zip(&b.qs[16 * g..16 * g + 16]).map(|(&q, &x)| q as i32 * x as i32).sum();
            isum += sc * (s - 32 * b.bsums[g] as i32);
        }
        sum += d * b.d * isum as f32;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::q8::BlockQ8K;
    use super::super::x86::{f16_load, hsum_ps};
    use super::{scale_min_k4, scales12, Q4_K_BYTES, Q6_K_BYTES};

    /// # Safety
    /// avx2, fma and f16c must be available; `w` holds at least `a.len()` Q4_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
        let mask = _mm256_set1_epi8(0x0F);
        let mut acc = _mm256_setzero_ps();
        let mut mins = 0f32;
        for (i, b) in a.iter().enumerate() {
            let blk = &w[i * Q4_K_BYTES..(i + 1) * Q4_K_BYTES];
            let sc = scales12(blk);
            // SAFETY: all loads stay inside blk (144 bytes) and b.qs (256 bytes).
            unsafe {
                let (d, dmin) = (f16_load(blk.as_ptr()), f16_load(blk.as_ptr().add(2)));
                let mut isum = _mm256_setzero_si256();
                let mut msum = 0i32;
                for j in 0..4 {
                    let (s_lo, m_lo) = scale_min_k4(2 * j, &sc);
                    let (s_hi, m_hi) = scale_min_k4(2 * j + 1, &sc);
                    let q = _mm256_loadu_si256(blk.as_ptr().add(16 + 32 * j) as *const __m256i);
                    let q_lo = _mm256_and_si256(q, mask);
                    let q_hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), mask);
                    let x_lo = _mm256_loadu_si256(b.qs.as_ptr().add(64 * j) as *const __m256i);
                    let x_hi = _mm256_loadu_si256(b.qs.as_ptr().add(64 * j + 32) as *const __m256i);
                    let p_lo = _mm256_madd_epi16(_mm256_maddubs_epi16(q_lo, x_lo), _mm256_set1_epi16(s_lo as i16));
                    let p_hi = _mm256_madd_epi16(_mm256_maddubs_epi16(q_hi, x_hi), _mm256_set1_epi16(s_hi as i16));
                    isum = _mm256_add_epi32(isum, _mm256_add_epi32(p_lo, p_hi));
                    let bs_lo = b.bsums[4 * j] as i32 + b.bsums[4 * j + 1] as i32;
                    let bs_hi = b.bsums[4 * j + 2] as i32 + b.bsums[4 * j + 3] as i32;
                    msum += m_lo as i32 * bs_lo + m_hi as i32 * bs_hi;
                }
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d * b.d), _mm256_cvtepi32_ps(isum), acc);
                mins += dmin * b.d * msum as f32;
            }
        }
        hsum_ps(acc) - mins
    }

    /// # Safety
    /// avx2, fma and f16c must be available; `w` holds at least `a.len()` Q6_K blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q6_k(w: &[u8], a: &[BlockQ8K]) -> f32 {
        let m4 = _mm256_set1_epi8(0x0F);
        let m2 = _mm256_set1_epi8(0x03);
        let mut acc = _mm256_setzero_ps();
        for (i, b) in a.iter().enumerate() {
            let blk = &w[i * Q6_K_BYTES..(i + 1) * Q6_K_BYTES];
            // SAFETY: all loads stay inside blk (210 bytes) and b.qs (256 bytes).
            unsafe {
                let d = f16_load(blk.as_ptr().add(208));
                let mut isum = _mm256_setzero_si256();
                let mut offs = 0i32;
                for g in 0..16 {
                    offs += blk[192 + g] as i8 as i32 * b.bsums[g] as i32;
                }
                for n in 0..2 {
                    let ql0 = _mm256_loadu_si256(blk.as_ptr().add(64 * n) as *const __m256i);
                    let ql1 = _mm256_loadu_si256(blk.as_ptr().add(64 * n + 32) as *const __m256i);
                    let qh = _mm256_loadu_si256(blk.as_ptr().add(128 + 32 * n) as *const __m256i);
                    let hbits = |s: i32| match s {
                        0 => _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4),
                        2 => _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4),
                        4 => _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4),
                        _ => _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4),
                    };
                    let q = [
                        _mm256_or_si256(_mm256_and_si256(ql0, m4), hbits(0)),
                        _mm256_or_si256(_mm256_and_si256(ql1, m4), hbits(2)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), hbits(4)),
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), hbits(6)),
                    ];
                    for (k, qk) in q.iter().enumerate() {
                        // 32 elements = groups 8n + 2k and 8n + 2k + 1 (16 each).
                        let x = _mm256_loadu_si256(b.qs.as_ptr().add(128 * n + 32 * k) as *const __m256i);
                        let p16 = _mm256_maddubs_epi16(*qk, x);
                        let s0 = blk[192 + 8 * n + 2 * k] as i8 as i16;
                        let s1 = blk[192 + 8 * n + 2 * k + 1] as i8 as i16;
                        let scales = _mm256_set_m128i(_mm_set1_epi16(s1), _mm_set1_epi16(s0));
                        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p16, scales));
                    }
                }
                let tot = _mm256_cvtepi32_ps(isum);
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d * b.d), tot, acc);
                acc = _mm256_add_ps(acc, _mm256_setr_ps(-32.0 * d * b.d * offs as f32, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0));
            }
        }
        hsum_ps(acc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::q8::quantize_q8k;
    use crate::kernels::test_util::{rand_blocks, rand_f32};
    use ferrite_gguf::GgmlType;

    fn acts(nb: usize, seed: u64) -> Vec<BlockQ8K> {
        let x = rand_f32(nb * 256, seed);
        let mut a = vec![BlockQ8K::default(); nb];
        quantize_q8k(&x, &mut a);
        a
    }

    fn deq_dot(ty: GgmlType, w: &[u8], a: &[BlockQ8K]) -> f32 {
        let mut wf = vec![0f32; a.len() * 256];
        ferrite_gguf::quant::dequantize(ty, w, &mut wf).unwrap();
        (0..wf.len()).map(|i| wf[i] * a[i / 256].d * a[i / 256].qs[i % 256] as f32).sum()
    }

    #[test]
    fn scalar_matches_dequantized_dot() {
        for nb in [1usize, 3] {
            let a = acts(nb, 5);
            let w4 = rand_blocks(nb, Q4_K_BYTES, &[0, 2], 1);
            let w6 = rand_blocks(nb, Q6_K_BYTES, &[208], 2);
            let (g4, e4) = (dot_q4_k_scalar(&w4, &a), deq_dot(GgmlType::Q4_K, &w4, &a));
            let (g6, e6) = (dot_q6_k_scalar(&w6, &a), deq_dot(GgmlType::Q6_K, &w6, &a));
            assert!((g4 - e4).abs() <= 1e-3 * (1.0 + e4.abs()), "q4_k {g4} vs {e4}");
            assert!((g6 - e6).abs() <= 1e-3 * (1.0 + e6.abs()), "q6_k {g6} vs {e6}");
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
                assert!((r4 - s4).abs() <= 1e-4 * (1.0 + s4.abs()), "{isa:?} q4_k: {r4} {s4}");
                assert!((r6 - s6).abs() <= 1e-4 * (1.0 + s6.abs()), "{isa:?} q6_k: {r6} {s6}");
            }
        }
    }
}
