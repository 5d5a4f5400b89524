//! Weight rows interleaved sixteen at a time, for the AVX-512 products (decode and small
//! batches): one 512-bit lane per weight row, so a `vpdpbusd` multiplies four elements of
//! sixteen rows by four activation values broadcast from memory, and the per-block scales
//! of the sixteen rows are one vector. The GGUF layout needs the block's 32 elements of one
//! row in a vector instead, then per-block scale permutations and a horizontal sum per row.
//!
//! Layout: a matrix's first `rows / 16 * 16` rows become groups of 16 rows; group g is `nb`
//! units (one per block, `nb = cols / 32`), unit b holding block b of rows `16g..16g + 16`:
//! - Q4_1 (320 bytes = 16 x 20, as in the file): 4 chunks of 64 bytes, chunk c lane n (bytes
//!   `4n..4n + 4`) = row n's nibble bytes `4c..4c + 4` (low nibbles: elements `4c..4c + 4`,
//!   high nibbles: elements `16 + 4c..`); then the 16 rows' `d` (f16), then their `m` (f16).
//! - Q4_0 (288 bytes = 16 x 18): the same without `m` (`w = d * (q - 8)`: the offset is
//!   `-8 d`).
//! - Q5_0 (352 bytes = 16 x 22): the Q4 chunks of the low four bits, then per row a u32 of
//!   the fifth bits rearranged so that byte j, bit c is element `4c + j`'s (chunk c's lane
//!   byte j: one shift and a mask put chunk c's fifth bits at bit 4 of its bytes), then the
//!   16 `d` (`w = d * (q - 16)`: the offset is `-16 d`).
//! - Q8_0 (544 bytes = 16 x 34): 8 chunks of 64 bytes, chunk c lane n = row n's elements
//!   `4c..4c + 4` plus 128 (as u8, the unsigned operand of `vpdpbusd`); then the 16 `d`.
//!   `sum((w + 128) * x) - 128 * sum(x)` recovers the signed sum ([`Acts`]'s block sums).
//!
//! Every activation row of a group sees the same operations in the same order whatever the
//! number of rows computed together (`K`), so a row's product does not depend on its batch.
//! Rows past the last whole group stay in the GGUF layout (the tile kernels).
//!
//! [`Acts`]: super::Acts

use ferrite_gguf::GgmlType;

use super::q4::{Q4_0_BYTES, Q4_1_BYTES};
use super::q5::Q5_0_BYTES;
use super::q8::BlockQ8;
use super::q8_0::Q8_0_BYTES;
use super::{f16_at, Isa};

/// Weight rows per group.
pub const ROWS: usize = 16;

/// Bytes of one unit (16 rows, one block) of `ty`; `None` where `ty` has no packed form.
pub fn unit_bytes(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q4_0 => Some(ROWS * Q4_0_BYTES),
        GgmlType::Q4_1 => Some(ROWS * Q4_1_BYTES),
        GgmlType::Q5_0 => Some(ROWS * Q5_0_BYTES),
        GgmlType::Q8_0 => Some(ROWS * Q8_0_BYTES),
        _ => None,
    }
}

/// The packed form of the whole groups of a `rows x cols` matrix of `ty` in GGUF layout
/// (`data`, `rows * cols / 32` blocks); `None` where `ty` has no packed form or the matrix
/// has fewer than 16 rows.
pub fn pack(ty: GgmlType, rows: usize, cols: usize, data: &[u8]) -> Option<Vec<u8>> {
    let unit = unit_bytes(ty)?;
    let groups = rows / ROWS;
    let nb = cols / 32;
    let bb = unit / ROWS;
    if groups == 0 || data.len() < rows * nb * bb {
        return None;
    }
    let mut out = vec![0u8; groups * nb * unit];
    for g in 0..groups {
        for b in 0..nb {
            let u = &mut out[(g * nb + b) * unit..][..unit];
            for n in 0..ROWS {
                let blk = &data[((g * ROWS + n) * nb + b) * bb..][..bb];
                match ty {
                    GgmlType::Q4_0 | GgmlType::Q4_1 => {
                        // The nibbles follow d (and m).
                        let q = if ty == GgmlType::Q4_0 { 2 } else { 4 };
                        for c in 0..4 {
                            u[64 * c + 4 * n..][..4].copy_from_slice(&blk[q + 4 * c..][..4]);
                        }
                        u[256 + 2 * n..][..2].copy_from_slice(&blk[0..2]);
                        if ty == GgmlType::Q4_1 {
                            u[288 + 2 * n..][..2].copy_from_slice(&blk[2..4]);
                        }
                    }
                    GgmlType::Q5_0 => {
                        for c in 0..4 {
                            u[64 * c + 4 * n..][..4].copy_from_slice(&blk[6 + 4 * c..][..4]);
                        }
                        let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
                        let mut h = 0u32;
                        for j in 0..4 {
                            for c in 0..8 {
                                h |= ((qh >> (4 * c + j)) & 1) << (8 * j + c);
                            }
                        }
                        u[256 + 4 * n..][..4].copy_from_slice(&h.to_le_bytes());
                        u[320 + 2 * n..][..2].copy_from_slice(&blk[0..2]);
                    }
                    _ => {
                        for c in 0..8 {
                            for j in 0..4 {
                                u[64 * c + 4 * n + j] = blk[2 + 4 * c + j] ^ 0x80;
                            }
                        }
                        u[512 + 2 * n..][..2].copy_from_slice(&blk[0..2]);
                    }
                }
            }
        }
    }
    Some(out)
}

/// One group's products with `K` activation rows: `out[k][n] = dot(row 16g + n, hi[k] +
/// lo[k])` (`lo` for q8x2, as `quantize_q8x2` writes it: `lo.d == hi.d / 256`). `units` is
/// the group's `nb` units; `sums[k][b]` (and `sums_lo`) the sum of block b's `qs` (used by
/// Q8_0 only).
///
/// # Panics
/// Where the lengths disagree (`units` not `nb` units of `ty`, activation rows or sums of
/// another length), naming the op.
#[allow(clippy::too_many_arguments)]
pub fn group<const K: usize>(
    isa: Isa,
    ty: GgmlType,
    units: &[u8],
    hi: [&[BlockQ8]; K],
    lo: Option<[&[BlockQ8]; K]>,
    sums: [&[i32]; K],
    sums_lo: Option<[&[i32]; K]>,
) -> [[f32; ROWS]; K] {
    let unit = unit_bytes(ty).unwrap_or_else(|| panic!("packed::group: {ty} has no packed form"));
    let nb = units.len() / unit;
    assert!(
        units.len() == nb * unit
            && hi.iter().chain(lo.iter().flatten()).all(|a| a.len() == nb)
            && sums
                .iter()
                .chain(sums_lo.iter().flatten())
                .all(|s| s.len() == nb)
            && lo.is_some() == sums_lo.is_some()
            && K <= 4,
        "packed::group: {nb} units of {ty}, activation rows or block sums of another length, \
         or K > 4"
    );
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: Isa::Avx512 is only produced after runtime detection of avx512f/bw/vl/vnni,
        // avx2, fma and f16c; the lengths were checked above.
        return unsafe {
            let hp = hi.map(|a| a.as_ptr());
            let sp = sums.map(|s| s.as_ptr());
            match (ty, lo, sums_lo) {
                (GgmlType::Q4_0, Some(lo), _) => avx512::q4::<K, true, { avx512::Q4_0 }>(
                    units.as_ptr(),
                    nb,
                    hp,
                    lo.map(|a| a.as_ptr()),
                ),
                (GgmlType::Q4_0, None, _) => {
                    avx512::q4::<K, false, { avx512::Q4_0 }>(units.as_ptr(), nb, hp, hp)
                }
                (GgmlType::Q4_1, Some(lo), _) => avx512::q4::<K, true, { avx512::Q4_1 }>(
                    units.as_ptr(),
                    nb,
                    hp,
                    lo.map(|a| a.as_ptr()),
                ),
                (GgmlType::Q4_1, None, _) => {
                    avx512::q4::<K, false, { avx512::Q4_1 }>(units.as_ptr(), nb, hp, hp)
                }
                (GgmlType::Q5_0, Some(lo), _) => avx512::q4::<K, true, { avx512::Q5_0 }>(
                    units.as_ptr(),
                    nb,
                    hp,
                    lo.map(|a| a.as_ptr()),
                ),
                (GgmlType::Q5_0, None, _) => {
                    avx512::q4::<K, false, { avx512::Q5_0 }>(units.as_ptr(), nb, hp, hp)
                }
                (_, Some(lo), Some(sl)) => avx512::q8_0::<K, true>(
                    units.as_ptr(),
                    nb,
                    hp,
                    lo.map(|a| a.as_ptr()),
                    sp,
                    sl.map(|s| s.as_ptr()),
                ),
                _ => avx512::q8_0::<K, false>(units.as_ptr(), nb, hp, hp, sp, sp),
            }
        };
    }
    let _ = isa;
    std::array::from_fn(|k| group_scalar(ty, units, hi[k], lo.map(|l| l[k])))
}

/// The scalar reference of [`group`] for one activation row, reading the packed layout:
/// per block and row, `d * (hi.d * sum(q * hi) + lo.d * sum(q * lo))` (plus `m * (hi.s +
/// lo.s)` for Q4_1), summed in f32 over the blocks.
pub fn group_scalar(
    ty: GgmlType,
    units: &[u8],
    hi: &[BlockQ8],
    lo: Option<&[BlockQ8]>,
) -> [f32; ROWS] {
    let unit = unit_bytes(ty).unwrap_or_else(|| panic!("packed::group: {ty} has no packed form"));
    let mut out = [0f32; ROWS];
    for (b, u) in units.chunks_exact(unit).enumerate() {
        let acts = std::iter::once(&hi[b]).chain(lo.map(|l| &l[b]));
        for (n, o) in out.iter_mut().enumerate() {
            let mut v = 0f32;
            for a in acts.clone() {
                let mut s = 0i32;
                match ty {
                    GgmlType::Q4_0 | GgmlType::Q4_1 => {
                        for c in 0..4 {
                            for j in 0..4 {
                                let q = u[64 * c + 4 * n + j];
                                s += (q & 0xF) as i32 * a.qs[4 * c + j] as i32;
                                s += (q >> 4) as i32 * a.qs[16 + 4 * c + j] as i32;
                            }
                        }
                        let d = f16_at(u, 256 + 2 * n);
                        let m = match ty {
                            GgmlType::Q4_0 => -8.0 * d,
                            _ => f16_at(u, 288 + 2 * n),
                        };
                        v += d * a.d * s as f32 + m * a.s;
                    }
                    GgmlType::Q5_0 => {
                        let h = u32::from_le_bytes([
                            u[256 + 4 * n],
                            u[257 + 4 * n],
                            u[258 + 4 * n],
                            u[259 + 4 * n],
                        ]);
                        for c in 0..8 {
                            for j in 0..4 {
                                let b = u[64 * (c % 4) + 4 * n + j];
                                let nib = if c < 4 { b & 0xF } else { b >> 4 };
                                let q = nib as i32 | ((((h >> (8 * j + c)) & 1) as i32) << 4);
                                s += q * a.qs[4 * c + j] as i32;
                            }
                        }
                        let d = f16_at(u, 320 + 2 * n);
                        v += d * a.d * s as f32 - 16.0 * d * a.s;
                    }
                    _ => {
                        for c in 0..8 {
                            for j in 0..4 {
                                let q = (u[64 * c + 4 * n + j] ^ 0x80) as i8;
                                s += q as i32 * a.qs[4 * c + j] as i32;
                            }
                        }
                        v += f16_at(u, 512 + 2 * n) * a.d * s as f32;
                    }
                }
            }
            *o += v;
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::super::q8::BlockQ8;
    use super::ROWS;

    /// How many units ahead the kernels prefetch (the walk is sequential; the hardware
    /// prefetcher alone leaves the first lines of each unit late).
    const AHEAD: usize = 16;

    /// The four bytes `4c..4c + 4` of a block's `qs`, broadcast to 16 lanes.
    ///
    /// # Safety
    /// `a` points at a valid block; `c < 8`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn quad(a: *const BlockQ8, c: usize) -> __m512i {
        // SAFETY: qs is 32 bytes and c < 8 (caller's contract).
        unsafe { _mm512_set1_epi32(((*a).qs.as_ptr() as *const i32).add(c).read_unaligned()) }
    }

    /// `sum(q * a)` per lane over the 8 chunks of `q` (chunk c times `a`'s quad c) in two
    /// chains of four.
    ///
    /// # Safety
    /// avx512f/vnni must be available; `a` points at a valid block.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn dot8(q: &[__m512i; 8], a: *const BlockQ8) -> __m512i {
        let z = _mm512_setzero_si512();
        // SAFETY: a is a valid block (caller's contract).
        unsafe {
            let mut s0 = z;
            let mut s1 = z;
            for c in 0..4 {
                s0 = _mm512_dpbusd_epi32(s0, q[c], quad(a, c));
                s1 = _mm512_dpbusd_epi32(s1, q[4 + c], quad(a, 4 + c));
            }
            _mm512_add_epi32(s0, s1)
        }
    }

    /// The formats of [`q4`].
    pub const Q4_1: u8 = 0;
    pub const Q4_0: u8 = 1;
    pub const Q5_0: u8 = 2;

    /// Q4_1, Q4_0 or Q5_0 units (`F`): lane n of `out[k]` is row n's product with activation
    /// row k. Per unit and k: `s = sum(q * hi)` (q8x2: `256 * sum(q * hi) + sum(q * lo)`) in
    /// 32-bit integers (at most 32 * 31 * 127 * 257), then `acc += (d * hi.d') * s` and
    /// `offs += m * (hi.s + lo.s)` with `hi.d' = hi.d / 256` for q8x2 and `m = -8 d` (Q4_0),
    /// `-16 d` (Q5_0); the result is `acc + offs`.
    ///
    /// # Safety
    /// avx512f/bw/vl/vnni, avx2, fma and f16c must be available; `p` points at `nb` units of
    /// the format; every `hi[k]` (and `lo[k]` when `X2`) at `nb` blocks.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn q4<const K: usize, const X2: bool, const F: u8>(
        p: *const u8,
        nb: usize,
        hi: [*const BlockQ8; K],
        lo: [*const BlockQ8; K],
    ) -> [[f32; ROWS]; K] {
        let (unit, d_at): (usize, usize) = match F {
            Q4_0 => (288, 256),
            Q5_0 => (352, 320),
            _ => (320, 256),
        };
        let mask = _mm512_set1_epi8(0x0F);
        let mut acc = [_mm512_setzero_ps(); K];
        let mut offs = [_mm512_setzero_ps(); K];
        for b in 0..nb {
            // SAFETY: unit b lies at p (caller's contract); the prefetch is a hint only and
            // may point past the matrix; blocks b of the activation rows exist.
            unsafe {
                let u = p.add(b * unit);
                for line in 0..unit.div_ceil(64) {
                    let a = u.wrapping_add(AHEAD * unit + 64 * line);
                    _mm_prefetch::<_MM_HINT_T0>(a as *const i8);
                }
                // Chunk c's low nibbles are elements 4c.. (quad c), its high nibbles
                // elements 16 + 4c.. (quad 4 + c).
                let mut q = [_mm512_setzero_si512(); 8];
                for c in 0..4 {
                    let w = _mm512_loadu_si512(u.add(64 * c) as *const __m512i);
                    q[c] = _mm512_and_si512(w, mask);
                    q[4 + c] = _mm512_and_si512(_mm512_srli_epi16::<4>(w), mask);
                }
                if F == Q5_0 {
                    // Chunk c's fifth bits are bit c of each byte of h: to bit 4.
                    let h = _mm512_loadu_si512(u.add(256) as *const __m512i);
                    let b4 = _mm512_set1_epi8(0x10);
                    for (c, qc) in q.iter_mut().enumerate() {
                        let at4 = match c {
                            0 => _mm512_slli_epi32::<4>(h),
                            1 => _mm512_slli_epi32::<3>(h),
                            2 => _mm512_slli_epi32::<2>(h),
                            3 => _mm512_slli_epi32::<1>(h),
                            4 => h,
                            5 => _mm512_srli_epi32::<1>(h),
                            6 => _mm512_srli_epi32::<2>(h),
                            _ => _mm512_srli_epi32::<3>(h),
                        };
                        *qc = _mm512_or_si512(*qc, _mm512_and_si512(at4, b4));
                    }
                }
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(u.add(d_at) as *const __m256i));
                let m = match F {
                    Q4_0 => _mm512_mul_ps(d, _mm512_set1_ps(-8.0)),
                    Q5_0 => _mm512_mul_ps(d, _mm512_set1_ps(-16.0)),
                    _ => _mm512_cvtph_ps(_mm256_loadu_si256(u.add(288) as *const __m256i)),
                };
                for k in 0..K {
                    let h = hi[k].add(b);
                    let mut s = dot8(&q, h);
                    let (xd, xs) = if X2 {
                        let l = lo[k].add(b);
                        s = _mm512_add_epi32(_mm512_slli_epi32::<8>(s), dot8(&q, l));
                        ((*h).d * (1.0 / 256.0), (*h).s + (*l).s)
                    } else {
                        ((*h).d, (*h).s)
                    };
                    let scale = _mm512_mul_ps(d, _mm512_set1_ps(xd));
                    acc[k] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), acc[k]);
                    offs[k] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs), offs[k]);
                }
            }
        }
        let mut out = [[0f32; ROWS]; K];
        for k in 0..K {
            // SAFETY: out[k] holds 16 f32.
            unsafe { _mm512_storeu_ps(out[k].as_mut_ptr(), _mm512_add_ps(acc[k], offs[k])) };
        }
        out
    }

    /// Q8_0 units: as [`q4`], with `s = sum((w + 128) * hi) - 128 * sum(hi)` (q8x2:
    /// `256 * (..hi..) + (..lo..)`, at most 32 * 255 * 128 * 257 before the correction) and
    /// no offset term. `sums[k][b]` / `sums_lo[k][b]` are block b's sums of `qs`.
    ///
    /// # Safety
    /// As [`q4`], with `p` at `nb` Q8_0 units and `sums[k]` (and `sums_lo[k]` when `X2`)
    /// at `nb` values.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn q8_0<const K: usize, const X2: bool>(
        p: *const u8,
        nb: usize,
        hi: [*const BlockQ8; K],
        lo: [*const BlockQ8; K],
        sums: [*const i32; K],
        sums_lo: [*const i32; K],
    ) -> [[f32; ROWS]; K] {
        const UNIT: usize = 544;
        let mut acc = [_mm512_setzero_ps(); K];
        for b in 0..nb {
            // SAFETY: as in q4; sums[k] (and sums_lo[k]) hold nb values.
            unsafe {
                let u = p.add(b * UNIT);
                for line in 0..9 {
                    let a = u.wrapping_add(AHEAD * UNIT + 64 * line);
                    _mm_prefetch::<_MM_HINT_T0>(a as *const i8);
                }
                let mut q = [_mm512_setzero_si512(); 8];
                for (c, qc) in q.iter_mut().enumerate() {
                    *qc = _mm512_loadu_si512(u.add(64 * c) as *const __m512i);
                }
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(u.add(512) as *const __m256i));
                for k in 0..K {
                    let h = hi[k].add(b);
                    let mut s = dot8(&q, h);
                    let mut corr = 128 * *sums[k].add(b);
                    let xd = if X2 {
                        let l = lo[k].add(b);
                        s = _mm512_add_epi32(_mm512_slli_epi32::<8>(s), dot8(&q, l));
                        corr = 256 * corr + 128 * *sums_lo[k].add(b);
                        (*h).d * (1.0 / 256.0)
                    } else {
                        (*h).d
                    };
                    let s = _mm512_sub_epi32(s, _mm512_set1_epi32(corr));
                    let scale = _mm512_mul_ps(d, _mm512_set1_ps(xd));
                    acc[k] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), acc[k]);
                }
            }
        }
        let mut out = [[0f32; ROWS]; K];
        for k in 0..K {
            // SAFETY: out[k] holds 16 f32.
            unsafe { _mm512_storeu_ps(out[k].as_mut_ptr(), acc[k]) };
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::q4::{dot_q4_0_scalar, dot_q4_1_scalar};
    use crate::kernels::q5::dot_q5_scalar;
    use crate::kernels::q8::quantize_q8x2;
    use crate::kernels::q8_0::dot_q8_0_scalar;
    use crate::kernels::test_util::{rand_blocks, rand_f32};

    fn sums(a: &[BlockQ8]) -> Vec<i32> {
        a.iter()
            .map(|b| b.qs.iter().map(|&q| q as i32).sum())
            .collect()
    }

    /// On every instruction set, q8 and q8x2, every K: each (row, activation row) of a
    /// group gives the K = 1 bits, within rounding of the scalar dot product on the GGUF
    /// rows (so the packing is checked too), and the scalar reference on the packed layout
    /// agrees with it.
    #[test]
    fn groups_match_gguf_rows_for_every_k() {
        for (ty, bytes, scales, dot) in [
            (
                GgmlType::Q4_0,
                Q4_0_BYTES,
                &[0usize][..],
                dot_q4_0_scalar as fn(&[u8], &[BlockQ8]) -> f32,
            ),
            (
                GgmlType::Q4_1,
                Q4_1_BYTES,
                &[0usize, 2][..],
                dot_q4_1_scalar as fn(&[u8], &[BlockQ8]) -> f32,
            ),
            (GgmlType::Q8_0, Q8_0_BYTES, &[0][..], dot_q8_0_scalar),
            (GgmlType::Q5_0, Q5_0_BYTES, &[0][..], |w, a| {
                dot_q5_scalar(w, a, false)
            }),
        ] {
            for nb in [1usize, 2, 3, 18] {
                let rows = 2 * ROWS + 5;
                let data = rand_blocks(rows * nb, bytes, scales, 11 + nb as u64);
                let packed = pack(ty, rows, nb * 32, &data).unwrap();
                let unit = unit_bytes(ty).unwrap();
                assert_eq!(packed.len(), 2 * nb * unit);
                let (mut hi, mut lo) = (Vec::new(), Vec::new());
                for k in 0..4u64 {
                    let x = rand_f32(nb * 32, 100 + k + nb as u64);
                    let (mut h, mut l) =
                        (vec![BlockQ8::default(); nb], vec![BlockQ8::default(); nb]);
                    quantize_q8x2(&x, &mut h, &mut l);
                    hi.push(h);
                    lo.push(l);
                }
                let sh: Vec<Vec<i32>> = hi.iter().map(|h| sums(h)).collect();
                let sl: Vec<Vec<i32>> = lo.iter().map(|l| sums(l)).collect();
                let h4: [&[BlockQ8]; 4] = std::array::from_fn(|k| &hi[k][..]);
                let l4: [&[BlockQ8]; 4] = std::array::from_fn(|k| &lo[k][..]);
                let s4: [&[i32]; 4] = std::array::from_fn(|k| &sh[k][..]);
                let sl4: [&[i32]; 4] = std::array::from_fn(|k| &sl[k][..]);
                for isa in Isa::available() {
                    for x2 in [false, true] {
                        for g in 0..2 {
                            let units = &packed[g * nb * unit..(g + 1) * nb * unit];
                            let l = x2.then_some(l4);
                            let all = group(isa, ty, units, h4, l, s4, x2.then_some(sl4));
                            for k in 0..4 {
                                let what = format!("{ty} {isa:?} x2={x2} nb={nb} g={g} k={k}");
                                let [one] = group(
                                    isa,
                                    ty,
                                    units,
                                    [h4[k]],
                                    l.map(|l| [l[k]]),
                                    [s4[k]],
                                    x2.then_some([sl4[k]]),
                                );
                                let refp = group_scalar(ty, units, h4[k], l.map(|l| l[k]));
                                for n in 0..ROWS {
                                    assert_eq!(all[k][n].to_bits(), one[n].to_bits(), "{what}");
                                    let row = &data[(g * ROWS + n) * nb * bytes..][..nb * bytes];
                                    let mut want = dot(row, h4[k]);
                                    if x2 {
                                        want += dot(row, l4[k]);
                                    }
                                    let tol = 1e-4 * (1.0 + want.abs());
                                    assert!(
                                        (one[n] - want).abs() <= tol,
                                        "{what} n={n}: {} vs {want}",
                                        one[n]
                                    );
                                    assert!((refp[n] - want).abs() <= tol, "{what} n={n} scalar");
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn pack_refuses_what_it_cannot_pack() {
        assert!(pack(GgmlType::Q5_1, 32, 32, &[0; 32 * 24]).is_none());
        assert!(pack(GgmlType::Q4_1, 15, 32, &[0; 15 * 20]).is_none());
        assert!(pack(GgmlType::Q4_1, 16, 32, &[0; 16 * 20 - 1]).is_none());
    }
}
