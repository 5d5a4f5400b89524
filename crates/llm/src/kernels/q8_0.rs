//! Q8_0 weights times Q8 activations. Block layout (ggml): {f16 d, i8 qs[32]} (34 bytes),
//! w = d * q.

use super::q8::BlockQ8;
use super::{f16_at, Isa};

pub const Q8_0_BYTES: usize = 34;

pub fn dot_q8_0(isa: Isa, w: &[u8], a: &[BlockQ8]) -> f32 {
    assert!(w.len() >= a.len() * Q8_0_BYTES);
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
    if isa.avx2() {
        // SAFETY: Isa::Avx2 implies runtime-detected avx2/fma/f16c; lengths checked above.
        return unsafe { x86::dot_q8_0_x4(w, a) };
    }
    let _ = isa;
    a.map(|ai| dot_q8_0_scalar(w, ai))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::test_util::{acts_q8, rand_blocks};

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
