//! Q5_0 and Q5_1 weights times Q8 activations.
//!
//! Block layouts (ggml): Q5_0 = {f16 d, u32 qh, u8 qs[16]} (22 bytes), w = d * (q - 16);
//! Q5_1 = {f16 d, f16 m, u32 qh, u8 qs[16]} (24 bytes), w = d * q + m. The 5-bit q of
//! element j (0..16) is the low nibble of qs[j] plus bit j of qh as bit 4; element j + 16 is
//! the high nibble plus bit j + 16.

#[cfg(target_arch = "x86_64")]
use super::q4::avx512 as pair_tile;
use super::q8::BlockQ8;
use super::{f16_at, Isa};

pub const Q5_0_BYTES: usize = 22;
pub const Q5_1_BYTES: usize = 24;

pub fn dot_q5_0(isa: Isa, w: &[u8], a: &[BlockQ8]) -> f32 {
    assert!(w.len() >= a.len() * Q5_0_BYTES);
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f/bw/vl/vnni, avx2, fma and
        // f16c; length checked above.
        return unsafe { pair_tile::tile::<avx512::Q5_0, 1, 1>([w], [a], None) }[0][0];
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: Isa::Avx2 implies runtime-detected avx2/fma/f16c; length checked above.
        return unsafe { x86::dot_q5(w, a, Q5_0_BYTES, false) };
    }
    let _ = isa;
    dot_q5_scalar(w, a, false)
}

/// Products of `R` Q5_0 rows with `K` activation rows (q8, or q8x2 with `lo`), as
/// `q4::dot_q4_1_tile`: each `(r, k)` has the bits of the one-row kernel of the same
/// instruction set (on AVX2 and scalar, q8x2 is two passes of `dot_q5_0`).
pub fn dot_q5_0_tile<const R: usize, const K: usize>(
    isa: Isa,
    w: [&[u8]; R],
    hi: [&[BlockQ8]; K],
    lo: Option<[&[BlockQ8]; K]>,
) -> [[f32; K]; R] {
    super::check_tile("dot_q5_0_tile", Q5_0_BYTES, &w, &hi, lo.as_ref());
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above are only produced after runtime detection of avx512f/bw/vl/vnni,
        // avx2, fma and f16c; every row holds nb blocks (checked above).
        return unsafe { pair_tile::tile::<avx512::Q5_0, R, K>(w, hi, lo) };
    }
    let mut out = [[0f32; K]; R];
    for (o, &wr) in out.iter_mut().zip(&w) {
        for k in 0..K {
            o[k] = match lo {
                Some(l) => dot_q5_0(isa, wr, hi[k]) + dot_q5_0(isa, wr, l[k]),
                None => dot_q5_0(isa, wr, hi[k]),
            };
        }
    }
    out
}

pub fn dot_q5_1(isa: Isa, w: &[u8], a: &[BlockQ8]) -> f32 {
    assert!(w.len() >= a.len() * Q5_1_BYTES);
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: as in dot_q5_0.
        return unsafe { x86::dot_q5(w, a, Q5_1_BYTES, true) };
    }
    let _ = isa;
    dot_q5_scalar(w, a, true)
}

/// Scalar reference for both formats (`has_min` selects Q5_1).
pub fn dot_q5_scalar(w: &[u8], a: &[BlockQ8], has_min: bool) -> f32 {
    let bytes = if has_min { Q5_1_BYTES } else { Q5_0_BYTES };
    let h = if has_min { 4 } else { 2 };
    let mut sum = 0f32;
    for (i, b) in a.iter().enumerate() {
        let blk = &w[i * bytes..(i + 1) * bytes];
        let d = f16_at(blk, 0);
        let qh = u32::from_le_bytes([blk[h], blk[h + 1], blk[h + 2], blk[h + 3]]);
        let qs = &blk[h + 4..h + 20];
        let mut acc = 0i32;
        for (j, &q) in qs.iter().enumerate() {
            let lo = (q & 0xF) as i32 | ((((qh >> j) & 1) as i32) << 4);
            let hi = (q >> 4) as i32 | ((((qh >> (j + 16)) & 1) as i32) << 4);
            acc += lo * b.qs[j] as i32 + hi * b.qs[j + 16] as i32;
        }
        let m = if has_min { f16_at(blk, 2) } else { -16.0 * d };
        sum += d * b.d * acc as f32 + m * b.s;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::q4::x86::mul_u8_i8;
    use super::super::q8::BlockQ8;
    use super::super::x86::{f16_load, hsum_ps, unpack_nibbles};

    /// 0xFF in byte lane j where bit j of the little-endian u32 at `p` is set.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn bytes_from_bits_32(p: *const u8) -> __m256i {
        // SAFETY: caller guarantees 4 readable bytes at p.
        let x = unsafe { (p as *const u32).read_unaligned() } as i32;
        let shuf = _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0x0000000000000000,
        );
        let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x), shuf);
        let bits = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
        _mm256_cmpeq_epi8(bits, _mm256_set1_epi64x(-1))
    }

    /// # Safety
    /// avx2, fma and f16c must be available; `w` holds at least `a.len()` blocks of `bytes`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q5(w: &[u8], a: &[BlockQ8], bytes: usize, has_min: bool) -> f32 {
        let h = if has_min { 4 } else { 2 };
        let mut acc = _mm256_setzero_ps();
        let mut offs = 0f32;
        for (i, b) in a.iter().enumerate() {
            // SAFETY: block i lies within w (caller's contract).
            unsafe {
                let p = w.as_ptr().add(i * bytes);
                let d = f16_load(p);
                let hb = _mm256_and_si256(bytes_from_bits_32(p.add(h)), _mm256_set1_epi8(0x10));
                let q = _mm256_or_si256(unpack_nibbles(p.add(h + 4)), hb);
                let qa = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                let s = _mm256_cvtepi32_ps(mul_u8_i8(q, qa));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d * b.d), s, acc);
                let m = if has_min {
                    f16_load(p.add(2))
                } else {
                    -16.0 * d
                };
                offs += m * b.s;
            }
        }
        hsum_ps(acc) + offs
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    use super::super::q4::avx512::Pair;
    use super::Q5_0_BYTES;

    pub(crate) struct Q5_0;

    impl Pair for Q5_0 {
        const BYTES: usize = Q5_0_BYTES;
        /// d twice per block: `w = d * q + m` with `m = -16 d` (`HDR_MUL`, exact).
        const HDR_IDX: [i16; 32] = {
            let mut a = [0i16; 32];
            let mut k = 0;
            while k < 32 {
                a[k] = [0, 0, 11, 11][k % 4];
                k += 1;
            }
            a
        };
        const HDR_MUL: [f32; 4] = [1.0, -16.0, 1.0, -16.0];

        /// The pair is 44 contiguous bytes (22 words: d, 2 words of high bits, 8 words of
        /// nibbles, twice): one masked load, the nibble words spread by one permutation, the
        /// fifth bits (`qh` bit e is element e's) set from a 64-bit mask of both `qh`.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
        unsafe fn weight_pair(p: *const u8, two: bool) -> (__m512i, __m512i) {
            // Words 3..11 are block i's nibbles, 14..22 block i + 1's; each set twice, the
            // second copy shifted right by 4 (the high nibbles: elements 16..32).
            const IDX_Q: [i16; 32] = [
                3, 4, 5, 6, 7, 8, 9, 10, 3, 4, 5, 6, 7, 8, 9, 10, 14, 15, 16, 17, 18, 19, 20, 21,
                14, 15, 16, 17, 18, 19, 20, 21,
            ];
            // SAFETY: a 64-byte array.
            let idx_q = unsafe { _mm512_loadu_si512(IDX_Q.as_ptr() as *const __m512i) };
            let mask: __mmask32 = if two { 0x3F_FFFF } else { 0x7FF };
            // SAFETY: the words loaded (mask) and the qh words read lie at p (caller's
            // contract); masked-off words are not read.
            let (v, qh) = unsafe {
                let v = _mm512_maskz_loadu_epi16(mask, p as *const i16);
                let h0 = (p.add(2) as *const u32).read_unaligned() as u64;
                let h1 = if two {
                    (p.add(Q5_0_BYTES + 2) as *const u32).read_unaligned() as u64
                } else {
                    0
                };
                (v, h0 | (h1 << 32))
            };
            let q = _mm512_permutexvar_epi16(idx_q, v);
            let q = _mm512_mask_srli_epi16::<4>(q, 0xFF00_FF00, q);
            let q = _mm512_and_si512(q, _mm512_set1_epi8(0x0F));
            (_mm512_mask_add_epi8(q, qh, q, _mm512_set1_epi8(0x10)), v)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::test_util::{acts_q8, rand_blocks};
    use ferrite_gguf::GgmlType;

    /// The Q5_0 tiles (4x4, 1x4, 4x1; q8 and q8x2) give each pair the one-row bits and stay
    /// within rounding of the scalar reference, on every instruction set.
    #[test]
    fn q5_0_tiles_agree_bit_for_bit_and_match_scalar() {
        crate::quant::check_tiles!(
            tile: dot_q5_0_tile,
            block: Q5_0_BYTES,
            scales: &[0],
            nbs: [1usize, 2, 3, 20, 33],
            seeds: (150, 160),
            scalar: |w, a| dot_q5_scalar(w, a, false)
        );
    }

    #[test]
    fn simd_matches_scalar_odd_sizes() {
        for nb in [1usize, 2, 5, 20, 33] {
            let a = acts_q8(nb, 100 + nb as u64);
            let w0 = rand_blocks(nb, Q5_0_BYTES, &[0], 5 + nb as u64);
            let w1 = rand_blocks(nb, Q5_1_BYTES, &[0, 2], 6 + nb as u64);
            for isa in Isa::available() {
                let (r0, s0) = (dot_q5_0(isa, &w0, &a), dot_q5_scalar(&w0, &a, false));
                let (r1, s1) = (dot_q5_1(isa, &w1, &a), dot_q5_scalar(&w1, &a, true));
                assert!(
                    (r0 - s0).abs() <= 1e-4 * (1.0 + s0.abs()),
                    "{isa:?} nb={nb}: {r0} {s0}"
                );
                assert!(
                    (r1 - s1).abs() <= 1e-4 * (1.0 + s1.abs()),
                    "{isa:?} nb={nb}: {r1} {s1}"
                );
            }
        }
    }

    #[test]
    fn scalar_matches_dequantized_dot() {
        for (ty, bytes, hdr, has_min) in [
            (GgmlType::Q5_0, Q5_0_BYTES, &[0][..], false),
            (GgmlType::Q5_1, Q5_1_BYTES, &[0, 2][..], true),
        ] {
            let nb = 4;
            let a = acts_q8(nb, 1);
            let w = rand_blocks(nb, bytes, hdr, 2);
            let mut wf = vec![0f32; nb * 32];
            ferrite_gguf::quant::dequantize(ty, &w, &mut wf).unwrap();
            let want: f32 = (0..nb * 32)
                .map(|i| wf[i] * a[i / 32].d * a[i / 32].qs[i % 32] as f32)
                .sum();
            let got = dot_q5_scalar(&w, &a, has_min);
            assert!(
                (got - want).abs() <= 1e-3 * (1.0 + want.abs()),
                "{ty}: {got} vs {want}"
            );
        }
    }
}
