//! Q4_0 and Q4_1 weights times Q8 activations.
//!
//! Block layouts (ggml): Q4_0 = {f16 d, u8 qs[16]} (18 bytes), w = d * (q - 8);
//! Q4_1 = {f16 d, f16 m, u8 qs[16]} (20 bytes), w = d * q + m. In both, element j (0..16)
//! is the low nibble of qs[j] and element j + 16 its high nibble.

use super::q8::BlockQ8;
use super::{f16_at, Isa};

pub const Q4_0_BYTES: usize = 18;
pub const Q4_1_BYTES: usize = 20;

/// Dot product of one Q4_0 row (`a.len()` blocks) with Q8 activations.
pub fn dot_q4_0(isa: Isa, w: &[u8], a: &[BlockQ8]) -> f32 {
    assert!(w.len() >= a.len() * Q4_0_BYTES);
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: Isa::Avx2 is only produced after runtime detection of avx2, fma and f16c;
        // the length check above covers every block read.
        return unsafe { x86::dot_q4_0(w, a) };
    }
    let _ = isa;
    dot_q4_0_scalar(w, a)
}

/// Dot product of one Q4_1 row (`a.len()` blocks) with Q8 activations.
pub fn dot_q4_1(isa: Isa, w: &[u8], a: &[BlockQ8]) -> f32 {
    assert!(w.len() >= a.len() * Q4_1_BYTES);
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f/bw/vl/vnni, avx2, fma and
        // f16c; lengths checked above.
        return unsafe { avx512::tile::<avx512::Q4_1, _, _>([w], [a], None) }[0][0];
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: as in dot_q4_0.
        return unsafe { x86::dot_q4_1(w, a) };
    }
    let _ = isa;
    dot_q4_1_scalar(w, a)
}

/// Four dot products of one Q4_1 row with four activation rows at once (the weight blocks
/// are unpacked once for all four): `[dot(w, a[0]), .., dot(w, a[3])]`.
pub fn dot_q4_1_x4(isa: Isa, w: &[u8], a: [&[BlockQ8]; 4]) -> [f32; 4] {
    let nb = a[0].len();
    assert!(a.iter().all(|x| x.len() == nb) && w.len() >= nb * Q4_1_BYTES);
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f/bw/vl/vnni, avx2, fma and
        // f16c; lengths checked above.
        return unsafe { avx512::tile::<avx512::Q4_1, _, _>([w], a, None) }[0];
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: as in dot_q4_0; all four activation rows have nb blocks.
        return unsafe { x86::dot_q4_1_x4(w, a) };
    }
    let _ = isa;
    a.map(|ai| dot_q4_1_scalar(w, ai))
}

/// `dot_q4_1_x4` with q8x2 activations (`hi[k]` and `lo[k]` per activation row, see
/// `dot_q4_1_x2`), in one pass over the weights.
pub fn dot_q4_1_x4_x2(isa: Isa, w: &[u8], hi: [&[BlockQ8]; 4], lo: [&[BlockQ8]; 4]) -> [f32; 4] {
    let nb = hi[0].len();
    assert!(
        hi.iter().chain(&lo).all(|x| x.len() == nb) && w.len() >= nb * Q4_1_BYTES,
        "dot_q4_1_x4_x2: activation rows of unequal length or a short weight row"
    );
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f/bw/vl/vnni, avx2, fma and
        // f16c; lengths checked above.
        return unsafe { avx512::tile::<avx512::Q4_1, _, _>([w], hi, Some(lo)) }[0];
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: as in dot_q4_0; all eight activation rows have nb blocks.
        return unsafe { x86::dot_q4_1_x4_x2(w, hi, lo) };
    }
    let _ = isa;
    [0, 1, 2, 3].map(|k| dot_q4_1_scalar(w, hi[k]) + dot_q4_1_scalar(w, lo[k]))
}

/// Dot products of four Q4_1 rows with one activation row (each activation block is loaded
/// once for the four rows): `[dot(w[0], a), .., dot(w[3], a)]`.
pub fn dot_q4_1_rows4(isa: Isa, w: [&[u8]; 4], a: &[BlockQ8]) -> [f32; 4] {
    assert!(w.iter().all(|r| r.len() >= a.len() * Q4_1_BYTES));
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f/bw/vl/vnni, avx2, fma and
        // f16c; lengths checked above.
        return unsafe { avx512::tile::<avx512::Q4_1, _, _>(w, [a], None) }.map(|o| o[0]);
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Vnni {
        // SAFETY: Isa::Vnni implies runtime-detected avx2/fma/f16c/avxvnni; lengths checked.
        return unsafe { x86::dot_q4_1_rows4_vnni(w, a) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: as in dot_q4_0; lengths checked above.
        return unsafe { x86::dot_q4_1_rows4(w, a) };
    }
    let _ = isa;
    w.map(|r| dot_q4_1_scalar(r, a))
}

/// `dot_q4_1` with q8x2 activations (`hi` and its residual `lo`, `lo[i].d == hi[i].d / 256`
/// as `quantize_q8x2` writes them) in one pass over the weights: each block's integer sums
/// combine as `256 * sum(q * hi) + sum(q * lo)` before one float scaling.
pub fn dot_q4_1_x2(isa: Isa, w: &[u8], hi: &[BlockQ8], lo: &[BlockQ8]) -> f32 {
    assert!(w.len() >= hi.len() * Q4_1_BYTES && lo.len() == hi.len());
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f/bw/vl/vnni, avx2, fma and
        // f16c; lengths checked above.
        return unsafe { avx512::tile::<avx512::Q4_1, _, _>([w], [hi], Some([lo])) }[0][0];
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: as in dot_q4_0; lengths checked above.
        let [r, ..] = unsafe { x86::dot_q4_1_rows4_x2([w, w, w, w], hi, lo) };
        return r;
    }
    let _ = isa;
    dot_q4_1_scalar(w, hi) + dot_q4_1_scalar(w, lo)
}

/// `dot_q4_1_rows4` with q8x2 activations, in one pass (see `dot_q4_1_x2`).
pub fn dot_q4_1_rows4_x2(isa: Isa, w: [&[u8]; 4], hi: &[BlockQ8], lo: &[BlockQ8]) -> [f32; 4] {
    assert!(w.iter().all(|r| r.len() >= hi.len() * Q4_1_BYTES) && lo.len() == hi.len());
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above imply runtime-detected avx512f/bw/vl/vnni, avx2, fma and
        // f16c; lengths checked above.
        return unsafe { avx512::tile::<avx512::Q4_1, _, _>(w, [hi], Some([lo])) }.map(|o| o[0]);
    }
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Vnni {
        // SAFETY: Isa::Vnni implies runtime-detected avx2/fma/f16c/avxvnni; lengths checked.
        return unsafe { x86::dot_q4_1_rows4_x2_vnni(w, hi, lo) };
    }
    #[cfg(target_arch = "x86_64")]
    if isa.avx2() {
        // SAFETY: as in dot_q4_0; lengths checked above.
        return unsafe { x86::dot_q4_1_rows4_x2(w, hi, lo) };
    }
    let _ = isa;
    w.map(|r| dot_q4_1_scalar(r, hi) + dot_q4_1_scalar(r, lo))
}

/// Products of `R` Q4_1 rows with `K` activation rows: `out[r][k] = dot(w[r], hi[k])`, or,
/// with q8x2 activations (`lo`, see [`dot_q4_1_x2`]), `dot(w[r], hi[k] + lo[k])`. Each
/// `(r, k)` has the bits of the one-row kernel of the same instruction set, whatever `R` and
/// `K`; on AVX-512 one pass over the blocks serves the whole tile, elsewhere the tile is
/// composed of the four-row, four-activation-row and one-row kernels.
pub fn dot_q4_1_tile<const R: usize, const K: usize>(
    isa: Isa,
    w: [&[u8]; R],
    hi: [&[BlockQ8]; K],
    lo: Option<[&[BlockQ8]; K]>,
) -> [[f32; K]; R] {
    super::check_tile("dot_q4_1_tile", Q4_1_BYTES, &w, &hi, lo.as_ref());
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above are only produced after runtime detection of avx512f/bw/vl/vnni,
        // avx2, fma and f16c; every row holds nb blocks (checked above).
        return unsafe { avx512::tile::<avx512::Q4_1, _, _>(w, hi, lo) };
    }
    let mut out = [[0f32; K]; R];
    if R == 4 && K == 1 {
        let w4: [&[u8]; 4] = std::array::from_fn(|r| w[r]);
        let v = match lo {
            Some(l) => dot_q4_1_rows4_x2(isa, w4, hi[0], l[0]),
            None => dot_q4_1_rows4(isa, w4, hi[0]),
        };
        for (o, x) in out.iter_mut().zip(v) {
            o[0] = x;
        }
        return out;
    }
    for (o, &wr) in out.iter_mut().zip(&w) {
        if K == 4 {
            let h4: [&[BlockQ8]; 4] = std::array::from_fn(|k| hi[k]);
            let v = match lo {
                Some(l) => dot_q4_1_x4_x2(isa, wr, h4, std::array::from_fn(|k| l[k])),
                None => dot_q4_1_x4(isa, wr, h4),
            };
            o.copy_from_slice(&v[..K]);
        } else {
            for k in 0..K {
                o[k] = match lo {
                    Some(l) => dot_q4_1_x2(isa, wr, hi[k], l[k]),
                    None => dot_q4_1(isa, wr, hi[k]),
                };
            }
        }
    }
    out
}

pub fn dot_q4_0_scalar(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut sum = 0f32;
    for (i, b) in a.iter().enumerate() {
        let blk = &w[i * Q4_0_BYTES..(i + 1) * Q4_0_BYTES];
        let d = f16_at(blk, 0);
        let qs = &blk[2..18];
        let mut acc = 0i32;
        for (j, &q) in qs.iter().enumerate() {
            acc += ((q & 0xF) as i32 - 8) * b.qs[j] as i32;
            acc += ((q >> 4) as i32 - 8) * b.qs[j + 16] as i32;
        }
        sum += d * b.d * acc as f32;
    }
    sum
}

pub fn dot_q4_1_scalar(w: &[u8], a: &[BlockQ8]) -> f32 {
    let mut sum = 0f32;
    for (i, b) in a.iter().enumerate() {
        let blk = &w[i * Q4_1_BYTES..(i + 1) * Q4_1_BYTES];
        let d = f16_at(blk, 0);
        let m = f16_at(blk, 2);
        let qs = &blk[4..20];
        let mut acc = 0i32;
        for (j, &q) in qs.iter().enumerate() {
            acc += (q & 0xF) as i32 * b.qs[j] as i32;
            acc += (q >> 4) as i32 * b.qs[j + 16] as i32;
        }
        sum += d * b.d * acc as f32 + m * b.s;
    }
    sum
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    use super::super::q8::BlockQ8;
    use super::super::x86::{f16_load, hsum_ps, hsum_tree, unpack_nibbles};
    use super::{Q4_0_BYTES, Q4_1_BYTES};

    /// Sum over 32 lanes of u8 `q` times i8 `a`, as 8 i32 lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) fn mul_u8_i8(q: __m256i, a: __m256i) -> __m256i {
        // maddubs cannot saturate here: q <= 31, |a| <= 127, 2 * 31 * 127 < 32767.
        _mm256_madd_epi16(_mm256_maddubs_epi16(q, a), _mm256_set1_epi16(1))
    }

    /// # Safety
    /// avx2, fma and f16c must be available; `w` holds at least `a.len()` Q4_0 blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_0(w: &[u8], a: &[BlockQ8]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mut offs = 0f32;
        for (i, b) in a.iter().enumerate() {
            // SAFETY: block i lies within w (caller's contract); loads are unaligned.
            unsafe {
                let p = w.as_ptr().add(i * Q4_0_BYTES);
                let d = f16_load(p);
                let q = unpack_nibbles(p.add(2));
                let qa = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                let s = _mm256_cvtepi32_ps(mul_u8_i8(q, qa));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(d * b.d), s, acc);
                // sum (q - 8) a = sum q a - 8 sum a.
                offs -= 8.0 * d * b.s;
            }
        }
        hsum_ps(acc) + offs
    }

    /// # Safety
    /// avx2, fma and f16c must be available; `w` holds at least `a.len()` Q4_1 blocks.
    ///
    /// The same float operations in the same order as each row of [`dot_q4_1_rows4`] and
    /// [`dot_q4_1_x4`] (one accumulator, `hsum_tree` = their `reduce4`, the offsets summed
    /// with fused multiply-adds), so a row's result does not depend on which kernel a batch
    /// sends it through.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_1(w: &[u8], a: &[BlockQ8]) -> f32 {
        let mut acc = _mm256_setzero_ps();
        let mut offs = 0f32;
        for (i, b) in a.iter().enumerate() {
            // SAFETY: block i lies within w (caller's contract).
            unsafe {
                let p = w.as_ptr().add(i * Q4_1_BYTES);
                let q = unpack_nibbles(p.add(4));
                let qa = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                let s = _mm256_cvtepi32_ps(mul_u8_i8(q, qa));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_load(p) * b.d), s, acc);
                offs = f16_load(p.add(2)).mul_add(b.s, offs);
            }
        }
        hsum_tree(acc) + offs
    }

    /// Lane k: the sum of the 8 lanes of `acc[k]`, in `hsum_tree`'s order.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    fn reduce4(acc: [__m256; 4]) -> [f32; 4] {
        let h01 = _mm256_hadd_ps(acc[0], acc[1]);
        let h23 = _mm256_hadd_ps(acc[2], acc[3]);
        let h = _mm256_hadd_ps(h01, h23);
        let r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
        let mut o = [0f32; 4];
        // SAFETY: o holds 4 f32.
        unsafe { _mm_storeu_ps(o.as_mut_ptr(), r) };
        o
    }

    /// The body of the four-row Q4_1 kernel; `$mul` sums u8 x i8 products into 8 i32 lanes.
    macro_rules! rows4_body {
        ($w:expr, $a:expr, $mul:expr) => {{
            let (w, a) = ($w, $a);
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut offs = [0f32; 4];
            for (i, b) in a.iter().enumerate() {
                // SAFETY: block i lies within every row (caller's contract).
                unsafe {
                    let qa = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                    for k in 0..4 {
                        let p = w[k].as_ptr().add(i * Q4_1_BYTES);
                        // Prefetch 16 blocks (320 bytes) ahead in each row; a hint only, so
                        // running past the row's end is harmless.
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(16 * Q4_1_BYTES) as *const i8);
                        let q = unpack_nibbles(p.add(4));
                        let s = _mm256_cvtepi32_ps($mul(q, qa));
                        acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(f16_load(p) * b.d), s, acc[k]);
                        offs[k] = f16_load(p.add(2)).mul_add(b.s, offs[k]);
                    }
                }
            }
            let o = reduce4(acc);
            [
                o[0] + offs[0],
                o[1] + offs[1],
                o[2] + offs[2],
                o[3] + offs[3],
            ]
        }};
    }

    /// # Safety
    /// avx2, fma and f16c must be available; every row holds at least `a.len()` blocks.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_1_rows4(w: [&[u8]; 4], a: &[BlockQ8]) -> [f32; 4] {
        rows4_body!(w, a, mul_u8_i8)
    }

    /// # Safety
    /// avx2, fma, f16c and avxvnni must be available; every row holds at least `a.len()`
    /// blocks.
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub unsafe fn dot_q4_1_rows4_vnni(w: [&[u8]; 4], a: &[BlockQ8]) -> [f32; 4] {
        rows4_body!(w, a, |q, x| _mm256_dpbusd_avx_epi32(
            _mm256_setzero_si256(),
            q,
            x
        ))
    }

    /// The body of the four-row Q4_1 kernel over q8x2 activations; `$mul2(q, hi, lo)` gives
    /// `256 * sum(q * hi) + sum(q * lo)` as 8 i32 lanes (at most 4 * 15 * 127 * 257 per lane:
    /// no overflow).
    macro_rules! rows4_x2_body {
        ($w:expr, $hi:expr, $lo:expr, $mul2:expr) => {{
            let (w, hi, lo) = ($w, $hi, $lo);
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut offs = [0f32; 4];
            for (i, (b, l)) in hi.iter().zip(lo.iter()).enumerate() {
                // SAFETY: block i lies within every row (caller's contract).
                unsafe {
                    let qh = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                    let ql = _mm256_loadu_si256(l.qs.as_ptr() as *const __m256i);
                    let (dx, sx) = (b.d * (1.0 / 256.0), b.s + l.s);
                    for k in 0..4 {
                        let p = w[k].as_ptr().add(i * Q4_1_BYTES);
                        // A hint only, as in rows4_body.
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(16 * Q4_1_BYTES) as *const i8);
                        let q = unpack_nibbles(p.add(4));
                        let s = _mm256_cvtepi32_ps($mul2(q, qh, ql));
                        acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(f16_load(p) * dx), s, acc[k]);
                        offs[k] += f16_load(p.add(2)) * sx;
                    }
                }
            }
            let h01 = _mm256_hadd_ps(acc[0], acc[1]);
            let h23 = _mm256_hadd_ps(acc[2], acc[3]);
            let h = _mm256_hadd_ps(h01, h23);
            let r = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
            let mut o = [0f32; 4];
            // SAFETY: o holds 4 f32.
            unsafe { _mm_storeu_ps(o.as_mut_ptr(), r) };
            [
                o[0] + offs[0],
                o[1] + offs[1],
                o[2] + offs[2],
                o[3] + offs[3],
            ]
        }};
    }

    /// # Safety
    /// avx2, fma and f16c must be available; every row holds at least `hi.len()` blocks and
    /// `lo` is as long as `hi`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_1_rows4_x2(w: [&[u8]; 4], hi: &[BlockQ8], lo: &[BlockQ8]) -> [f32; 4] {
        rows4_x2_body!(w, hi, lo, |q, h, l| _mm256_add_epi32(
            _mm256_slli_epi32(mul_u8_i8(q, h), 8),
            mul_u8_i8(q, l)
        ))
    }

    /// # Safety
    /// avx2, fma, f16c and avxvnni must be available; lengths as in `dot_q4_1_rows4_x2`.
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    pub unsafe fn dot_q4_1_rows4_x2_vnni(
        w: [&[u8]; 4],
        hi: &[BlockQ8],
        lo: &[BlockQ8],
    ) -> [f32; 4] {
        rows4_x2_body!(w, hi, lo, |q, h, l| _mm256_dpbusd_avx_epi32(
            _mm256_slli_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), q, h), 8),
            q,
            l
        ))
    }

    /// # Safety
    /// avx2, fma and f16c must be available; `w` holds at least `hi[k].len()` Q4_1 blocks and
    /// the eight activation rows have equal length.
    ///
    /// Row k equals [`dot_q4_1_rows4_x2`] (and its vnni form) bit for bit: the same float
    /// operations in the same order.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_1_x4_x2(w: &[u8], hi: [&[BlockQ8]; 4], lo: [&[BlockQ8]; 4]) -> [f32; 4] {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut offs = [0f32; 4];
        for i in 0..hi[0].len() {
            // SAFETY: block i lies within w and within every activation row.
            unsafe {
                let p = w.as_ptr().add(i * Q4_1_BYTES);
                let (d, m) = (f16_load(p), f16_load(p.add(2)));
                let q = unpack_nibbles(p.add(4));
                for k in 0..4 {
                    let (b, l) = (hi[k].get_unchecked(i), lo[k].get_unchecked(i));
                    let qh = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                    let ql = _mm256_loadu_si256(l.qs.as_ptr() as *const __m256i);
                    // 256 * sum(q hi) + sum(q lo): as in rows4_x2_body.
                    let s =
                        _mm256_add_epi32(_mm256_slli_epi32(mul_u8_i8(q, qh), 8), mul_u8_i8(q, ql));
                    let s = _mm256_cvtepi32_ps(s);
                    acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(d * b.d * (1.0 / 256.0)), s, acc[k]);
                    offs[k] += m * (b.s + l.s);
                }
            }
        }
        // reduce4: the same summation order as rows4_x2_body, so a row's result does not
        // depend on which kernel a batch sends it through.
        let r = reduce4(acc);
        [
            r[0] + offs[0],
            r[1] + offs[1],
            r[2] + offs[2],
            r[3] + offs[3],
        ]
    }

    /// # Safety
    /// avx2, fma and f16c must be available; `w` holds at least `a[k].len()` Q4_1 blocks and
    /// the four activation rows have equal length.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_1_x4(w: &[u8], a: [&[BlockQ8]; 4]) -> [f32; 4] {
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut offs = _mm_setzero_ps();
        for i in 0..a[0].len() {
            // SAFETY: block i lies within w and within every activation row.
            unsafe {
                let p = w.as_ptr().add(i * Q4_1_BYTES);
                let (d, m) = (f16_load(p), f16_load(p.add(2)));
                let q = unpack_nibbles(p.add(4));
                let (b0, b1, b2, b3) = (
                    a[0].get_unchecked(i),
                    a[1].get_unchecked(i),
                    a[2].get_unchecked(i),
                    a[3].get_unchecked(i),
                );
                for (k, b) in [b0, b1, b2, b3].into_iter().enumerate() {
                    let qa = _mm256_loadu_si256(b.qs.as_ptr() as *const __m256i);
                    let s = _mm256_cvtepi32_ps(mul_u8_i8(q, qa));
                    acc[k] = _mm256_fmadd_ps(_mm256_set1_ps(d * b.d), s, acc[k]);
                }
                offs = _mm_fmadd_ps(_mm_set1_ps(m), _mm_setr_ps(b0.s, b1.s, b2.s, b3.s), offs);
            }
        }
        let mut o = [0f32; 4];
        // SAFETY: o holds 4 f32.
        unsafe { _mm_storeu_ps(o.as_mut_ptr(), offs) };
        let r = reduce4(acc);
        [r[0] + o[0], r[1] + o[1], r[2] + o[2], r[3] + o[3]]
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    use super::super::q8::BlockQ8;
    use super::super::x86::{act_pair, pair_scale_index, reduce16, TILES_AHEAD};
    use super::Q4_1_BYTES;

    /// A block format of unsigned 4- or 5-bit values with a per-block offset (`w = d * q + m`)
    /// whose block pair the AVX-512 tile reads: Q4_1 here, Q5_0 in `q5`.
    pub(crate) trait Pair {
        /// Bytes per block.
        const BYTES: usize;
        /// Word 4r + j of the header vector takes word `HDR_IDX[4r + j]` of row r's pair
        /// words (converted from f16 then multiplied by `HDR_MUL[j]`: `[d, m, d, m]` for
        /// block i and block i + 1).
        const HDR_IDX: [i16; 32];
        const HDR_MUL: [f32; 4];

        /// Block pair (i, i + 1), `p` at block i: 64 u8 lanes (block i's elements 0..32,
        /// then block i + 1's; zeros when `two` is false) and the pair's words as read.
        ///
        /// # Safety
        /// avx512f/bw/vl and avx2 must be available; block i (and i + 1 when `two`) lies at
        /// `p`.
        unsafe fn weight_pair(p: *const u8, two: bool) -> (__m512i, __m512i);
    }

    pub(crate) struct Q4_1;

    impl Pair for Q4_1 {
        const BYTES: usize = Q4_1_BYTES;
        const HDR_IDX: [i16; 32] = {
            let mut a = [0i16; 32];
            let mut k = 0;
            while k < 32 {
                a[k] = [0, 1, 10, 11][k % 4];
                k += 1;
            }
            a
        };
        const HDR_MUL: [f32; 4] = [1.0; 4];

        /// The pair is 40 contiguous bytes (20 words: d, m, 8 words of nibbles, twice): one
        /// masked load, then the nibble words spread by one word permutation.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
        unsafe fn weight_pair(p: *const u8, two: bool) -> (__m512i, __m512i) {
            // Words 2..10 are block i's nibbles, 12..20 block i + 1's; each set twice, the
            // second copy shifted right by 4 (the high nibbles).
            const IDX_Q: [i16; 32] = [
                2, 3, 4, 5, 6, 7, 8, 9, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 14, 15, 16, 17, 18, 19, 12,
                13, 14, 15, 16, 17, 18, 19,
            ];
            // SAFETY: a 64-byte array.
            let idx_q = unsafe { _mm512_loadu_si512(IDX_Q.as_ptr() as *const __m512i) };
            let mask: __mmask32 = if two { 0xF_FFFF } else { 0x3FF };
            // SAFETY: the words loaded (mask) lie at p (caller's contract); masked-off words
            // are not read.
            let v = unsafe { _mm512_maskz_loadu_epi16(mask, p as *const i16) };
            let q = _mm512_permutexvar_epi16(idx_q, v);
            let q = _mm512_mask_srli_epi16::<4>(q, 0xFF00_FF00, q);
            (_mm512_and_si512(q, _mm512_set1_epi8(0x0F)), v)
        }
    }

    /// `out[r][k] = dot(w[r], hi[k])`, or `dot(w[r], hi[k] + lo[k])` with `lo` (q8x2), over
    /// `hi[0].len()` blocks. Per block pair and `(r, k)`: one 512-bit `vpdpbusd` (q8x2: two
    /// and a shift, `256 * sum(q * hi) + sum(q * lo)`, at most 8 * 15 * 127 * 257 per lane),
    /// scaled by `d * a.d` into a 16-lane accumulator. The headers of the R rows are converted
    /// together (lanes `4r..4r + 4`: d, m, d, m), multiplied per activation row k by its
    /// `[a.d, a.s, a.d, a.s]`; the offsets `m * a.s` accumulate in lanes `4r + 1` and
    /// `4r + 3` of one vector per k. Every `(r, k)` sees the same float operations in the
    /// same order whatever `R` and `K` are.
    ///
    /// # Safety
    /// avx512f/bw/vl/vnni, avx2, fma and f16c must be available; `R <= 4`, `K <= 4`; every
    /// activation row has `hi[0].len()` blocks and every weight row at least that many.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn tile<F: Pair, const R: usize, const K: usize>(
        w: [&[u8]; R],
        hi: [&[BlockQ8]; K],
        lo: Option<[&[BlockQ8]; K]>,
    ) -> [[f32; K]; R] {
        // SAFETY: the caller's contract.
        unsafe {
            match lo {
                Some(lo) => tile_impl::<F, R, K, true>(w, hi, lo),
                None => tile_impl::<F, R, K, false>(w, hi, hi),
            }
        }
    }

    /// `tile`, with `X2` choosing q8x2 (`lo` read) or q8 (`lo` ignored) at compile time.
    ///
    /// # Safety
    /// As `tile`; `lo` rows as long as `hi` rows.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn tile_impl<F: Pair, const R: usize, const K: usize, const X2: bool>(
        w: [&[u8]; R],
        hi: [&[BlockQ8]; K],
        lo: [&[BlockQ8]; K],
    ) -> [[f32; K]; R] {
        let nb = hi.first().map_or(0, |h| h.len());
        let mut acc = [[_mm512_setzero_ps(); K]; R];
        let mut offs = [_mm512_setzero_ps(); K];
        let mut idx = [_mm512_setzero_si512(); R];
        for (r, x) in idx.iter_mut().enumerate() {
            *x = pair_scale_index(r);
        }
        // SAFETY: a 64-byte array.
        let hdr_idx = unsafe { _mm512_loadu_si512(F::HDR_IDX.as_ptr() as *const __m512i) };
        let [m0, m1, m2, m3] = F::HDR_MUL;
        let hdr_mul = _mm512_broadcast_f32x4(_mm_setr_ps(m0, m1, m2, m3));
        // Prefetch distance: the same block TILES_AHEAD tiles of rows further on (the rows
        // of a matrix are contiguous, so that is where this walk of the matrix goes next).
        let ahead = TILES_AHEAD * R * w.first().map_or(0, |r| r.len());
        let zero = _mm512_setzero_si512();
        let mut i = 0;
        while i < nb {
            let two = i + 1 < nb;
            let mut q = [zero; R];
            let mut hdr = zero;
            for r in 0..R {
                // SAFETY: block i (and i + 1) lies within row r (caller's contract); the
                // prefetch is a hint only and may point past the matrix.
                let (qr, v) = unsafe {
                    let p = w[r].as_ptr().add(i * F::BYTES);
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead) as *const i8);
                    F::weight_pair(p, two)
                };
                q[r] = qr;
                hdr = _mm512_mask_permutexvar_epi16(hdr, 0xF << (4 * r), hdr_idx, v);
            }
            let dm = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(hdr)), hdr_mul);
            for k in 0..K {
                // SAFETY: blocks i (and i + 1 when two) exist in every activation row.
                let (qh, ql, ds) =
                    unsafe { act_pair(hi[k].as_ptr(), X2.then(|| lo[k].as_ptr()), i, two) };
                let prod = _mm512_mul_ps(dm, _mm512_broadcast_f32x4(ds));
                offs[k] = _mm512_add_ps(offs[k], prod);
                for r in 0..R {
                    let s = if X2 {
                        let h = _mm512_dpbusd_epi32(zero, q[r], qh);
                        _mm512_dpbusd_epi32(_mm512_slli_epi32::<8>(h), q[r], ql)
                    } else {
                        _mm512_dpbusd_epi32(zero, q[r], qh)
                    };
                    let scale = _mm512_permutexvar_ps(idx[r], prod);
                    acc[r][k] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), acc[r][k]);
                }
            }
            i += 2;
        }
        let mut out = [[0f32; K]; R];
        for k in 0..K {
            let mut o = [0f32; 16];
            // SAFETY: o holds 16 f32.
            unsafe { _mm512_storeu_ps(o.as_mut_ptr(), offs[k]) };
            for r in 0..R {
                out[r][k] = reduce16(acc[r][k]) + (o[4 * r + 1] + o[4 * r + 3]);
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
        for nb in [1usize, 2, 3, 7, 18, 33, 48] {
            let a = acts_q8(nb, nb as u64);
            let w0 = rand_blocks(nb, Q4_0_BYTES, &[0], 7 + nb as u64);
            let w1 = rand_blocks(nb, Q4_1_BYTES, &[0, 2], 9 + nb as u64);
            for isa in Isa::available() {
                let (r0, s0) = (dot_q4_0(isa, &w0, &a), dot_q4_0_scalar(&w0, &a));
                let (r1, s1) = (dot_q4_1(isa, &w1, &a), dot_q4_1_scalar(&w1, &a));
                assert!(
                    (r0 - s0).abs() <= 1e-4 * (1.0 + s0.abs()),
                    "{isa:?} q4_0 nb={nb}: {r0} {s0}"
                );
                assert!(
                    (r1 - s1).abs() <= 1e-4 * (1.0 + s1.abs()),
                    "{isa:?} q4_1 nb={nb}: {r1} {s1}"
                );
            }
        }
    }

    #[test]
    fn rows4_matches_single_odd_sizes() {
        for nb in [1usize, 2, 18, 33] {
            let a = acts_q8(nb, 90 + nb as u64);
            let ws: Vec<Vec<u8>> = (0..4)
                .map(|k| rand_blocks(nb, Q4_1_BYTES, &[0, 2], 20 + k + nb as u64))
                .collect();
            for isa in Isa::available() {
                let got = dot_q4_1_rows4(isa, [&ws[0], &ws[1], &ws[2], &ws[3]], &a);
                for k in 0..4 {
                    let want = dot_q4_1_scalar(&ws[k], &a);
                    assert!(
                        (got[k] - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{isa:?} nb={nb} k={k}"
                    );
                }
            }
        }
    }

    #[test]
    fn x2_kernels_match_two_scalar_passes() {
        use crate::quant::q8::quantize_q8x2;
        for nb in [1usize, 2, 18, 33] {
            let x: Vec<f32> = crate::quant::test_util::rand_f32(nb * 32, 60 + nb as u64)
                .iter()
                .enumerate()
                .map(|(i, v)| if i % 29 == 3 { v * 40.0 } else { *v })
                .collect();
            let (mut hi, mut lo) = (vec![BlockQ8::default(); nb], vec![BlockQ8::default(); nb]);
            quantize_q8x2(&x, &mut hi, &mut lo);
            let ws: Vec<Vec<u8>> = (0..4)
                .map(|k| rand_blocks(nb, Q4_1_BYTES, &[0, 2], 50 + k + nb as u64))
                .collect();
            for isa in Isa::available() {
                let got = dot_q4_1_rows4_x2(isa, [&ws[0], &ws[1], &ws[2], &ws[3]], &hi, &lo);
                for k in 0..4 {
                    let want = dot_q4_1_scalar(&ws[k], &hi) + dot_q4_1_scalar(&ws[k], &lo);
                    let one = dot_q4_1_x2(isa, &ws[k], &hi, &lo);
                    let x4 = dot_q4_1_x4_x2(isa, &ws[k], [&hi; 4], [&lo; 4])[k];
                    for v in [got[k], one, x4] {
                        assert!(
                            (v - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{isa:?} nb={nb} k={k}: {v} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn x4_matches_single_odd_sizes() {
        for nb in [1usize, 3, 18, 33] {
            let acts: Vec<Vec<BlockQ8>> = (0..4).map(|k| acts_q8(nb, 70 + k + nb as u64)).collect();
            let w = rand_blocks(nb, Q4_1_BYTES, &[0, 2], 3 + nb as u64);
            for isa in Isa::available() {
                let got = dot_q4_1_x4(isa, &w, [&acts[0], &acts[1], &acts[2], &acts[3]]);
                for k in 0..4 {
                    let want = dot_q4_1_scalar(&w, &acts[k]);
                    assert!(
                        (got[k] - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{isa:?} nb={nb} k={k}"
                    );
                }
            }
        }
    }

    /// A batch row's product must not depend on the kernel the batch sends it through (the
    /// engine's batched logits equal the single-sequence ones): bit for bit.
    #[test]
    fn q4_1_kernels_agree_bit_for_bit() {
        for nb in [1usize, 3, 18, 33] {
            let acts: Vec<Vec<BlockQ8>> = (0..4).map(|k| acts_q8(nb, 40 + k + nb as u64)).collect();
            let ws: Vec<Vec<u8>> = (0..4)
                .map(|k| rand_blocks(nb, Q4_1_BYTES, &[0, 2], 60 + k + nb as u64))
                .collect();
            for isa in Isa::available() {
                let x4 = dot_q4_1_x4(isa, &ws[1], [&acts[0], &acts[1], &acts[2], &acts[3]]);
                let r4 = dot_q4_1_rows4(isa, [&ws[0], &ws[1], &ws[2], &ws[3]], &acts[2]);
                for k in 0..4 {
                    let one = dot_q4_1(isa, &ws[1], &acts[k]);
                    assert_eq!(x4[k].to_bits(), one.to_bits(), "{isa:?} nb={nb} x4 row {k}");
                    let one = dot_q4_1(isa, &ws[k], &acts[2]);
                    assert_eq!(
                        r4[k].to_bits(),
                        one.to_bits(),
                        "{isa:?} nb={nb} rows4 row {k}"
                    );
                }
            }
        }
    }

    /// The q8x2 kernels: one activation row through `dot_q4_1_x4_x2` gives the bits of
    /// `dot_q4_1_x2` and of `dot_q4_1_rows4_x2`, on every instruction set (a request's
    /// tokens must not depend on how many others share its batch).
    #[test]
    fn q4_1_x2_kernels_agree_bit_for_bit() {
        for nb in [1usize, 3, 18, 33] {
            let hi: Vec<Vec<BlockQ8>> = (0..4).map(|k| acts_q8(nb, 70 + k + nb as u64)).collect();
            let lo: Vec<Vec<BlockQ8>> = hi
                .iter()
                .enumerate()
                .map(|(k, h)| {
                    let mut l = acts_q8(nb, 90 + k as u64 + nb as u64);
                    for (lb, hb) in l.iter_mut().zip(h) {
                        lb.d = hb.d / 256.0;
                    }
                    l
                })
                .collect();
            let ws: Vec<Vec<u8>> = (0..4)
                .map(|k| rand_blocks(nb, Q4_1_BYTES, &[0, 2], 80 + k + nb as u64))
                .collect();
            for isa in Isa::available() {
                let x4 = dot_q4_1_x4_x2(
                    isa,
                    &ws[1],
                    [&hi[0], &hi[1], &hi[2], &hi[3]],
                    [&lo[0], &lo[1], &lo[2], &lo[3]],
                );
                let r4 = dot_q4_1_rows4_x2(isa, [&ws[0], &ws[1], &ws[2], &ws[3]], &hi[2], &lo[2]);
                for k in 0..4 {
                    let one = dot_q4_1_x2(isa, &ws[1], &hi[k], &lo[k]);
                    assert_eq!(
                        x4[k].to_bits(),
                        one.to_bits(),
                        "{isa:?} nb={nb} x4_x2 row {k}"
                    );
                    let one = dot_q4_1_x2(isa, &ws[k], &hi[2], &lo[2]);
                    assert_eq!(
                        r4[k].to_bits(),
                        one.to_bits(),
                        "{isa:?} nb={nb} rows4_x2 row {k}"
                    );
                }
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
            tile: dot_q4_1_tile,
            block: Q4_1_BYTES,
            scales: &[0, 2],
            nbs: [1usize, 2, 3, 18, 33, 48],
            seeds: (110, 120),
            scalar: dot_q4_1_scalar,
            direct: |isa, w, h, l: Option<&[BlockQ8]>| match l {
                Some(l) => dot_q4_1_x2(isa, w, h, l),
                None => dot_q4_1(isa, w, h),
            }
        );
    }

    #[test]
    fn scalar_matches_dequantized_dot() {
        use ferrite_gguf::GgmlType;
        for (ty, bytes, hdr) in [
            (GgmlType::Q4_0, Q4_0_BYTES, &[0][..]),
            (GgmlType::Q4_1, Q4_1_BYTES, &[0, 2][..]),
        ] {
            let nb = 5;
            let a = acts_q8(nb, 3);
            let w = rand_blocks(nb, bytes, hdr, 11);
            let mut wf = vec![0f32; nb * 32];
            ferrite_gguf::quant::dequantize(ty, &w, &mut wf).unwrap();
            let want: f32 = (0..nb * 32)
                .map(|i| wf[i] * a[i / 32].d * a[i / 32].qs[i % 32] as f32)
                .sum();
            let got = if ty == GgmlType::Q4_0 {
                dot_q4_0_scalar(&w, &a)
            } else {
                dot_q4_1_scalar(&w, &a)
            };
            assert!(
                (got - want).abs() <= 1e-3 * (1.0 + want.abs()),
                "{ty}: {got} vs {want}"
            );
        }
    }
}
