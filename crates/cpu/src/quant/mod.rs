//! Quantized matrix products computed directly on GGUF blocks (no dequantized copy).
//!
//! A weight matrix `W` is `rows x cols` in GGUF layout: row r is `cols` contiguous elements,
//! i.e. `cols / block_size` blocks. `matmul` computes `out[t][r] = dot(W[r], x[t])` for a
//! batch of `t` activation rows. Activations are quantized once per product ([`Acts`]) to
//! 8-bit blocks of 32 (one scale each) for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q6_K; other formats (F32, F16, BF16, Q2_K, Q3_K, Q5_K) dequantize
//! each row and take an f32 dot product. Rows are split across the thread pool in chunks;
//! each chunk runs every activation row, so a chunk of weights stays in cache for the batch.
//!
//! Every SIMD kernel has a scalar reference in the same file and a test comparing them. Q4_1,
//! Q5_0 and Q8_0 run in tiles of up to four weight rows by four activation rows
//! (`q4::dot_q4_1_tile`, `q8_0::dot_q8_0_tile`; on AVX-512 one kernel per format serves every
//! tile shape, elsewhere the tiles are composed of the four-row, four-activation-row and
//! one-row kernels). Every tile shape gives each (weight row, activation row) the same bits
//! as the one-row kernel of the same [`Isa`], so a row's product never depends on the rows
//! batched with it (the engine's batched logits equal the single-sequence ones). Different
//! instruction sets may differ in the last bits (their float summation orders differ).
//! On AVX-512 a matrix may also carry a [`packed`] copy of its whole 16-row groups (Q4_0,
//! Q4_1, Q5_0, Q8_0; the CPU model makes one per weight): those rows run the packed kernel
//! for every batch size instead of the tiles, so a row's bits still do not depend on its
//! batch. Two or more activation rows run the packed rows eight at a time, with the AVX-512
//! kernel's bits: on AMX ([`Isa::Amx`]) on the tiles (`packed::group_amx`), else, for q8x2
//! activations, as 16-bit pairs `256 hi + lo` through `vpdpwssd` (`packed::group_w16`).

pub mod arena;
pub mod exp;
pub mod float;
pub mod k_quants;
pub mod packed;
pub mod q4;
pub mod q5;
pub mod q8;
pub mod q8_0;

use ferrite_gguf::GgmlType;

use q8::BlockQ8;

/// Instruction set a kernel runs with, weakest first. `Avx2` means avx2 + fma + f16c were
/// detected at run time; `Vnni` additionally avx-vnni (the Q4_1 row kernels use 256-bit
/// `vpdpbusd`); `Avx512` avx2 + fma + f16c and avx512f/bw/vl/vnni (the Q4_1, Q5_0 and Q8_0 kernels
/// take two blocks per 512-bit `vpdpbusd`; other formats run their AVX2 kernels); `Amx`
/// everything `Avx512` has plus AMX-INT8 tiles, with the process's permission to use them
/// (the [`packed`] products of two or more activation rows run on the tiles; every other
/// kernel is `Avx512`'s). A tier's kernels may assume every tier below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    Scalar,
    Avx2,
    Vnni,
    Avx512,
    Amx,
}

impl Isa {
    /// The best instruction set of this CPU; `FERRITE_ISA=scalar|avx2|vnni|avx512|amx` caps
    /// it (the best available one not above the cap).
    pub fn detect() -> Isa {
        let avail = Isa::available();
        let cap = match crate::env::isa().ok().flatten() {
            Some("scalar") => Isa::Scalar,
            Some("avx2") => Isa::Avx2,
            Some("vnni") => Isa::Vnni,
            Some("avx512") => Isa::Avx512,
            _ => Isa::Amx,
        };
        avail
            .into_iter()
            .filter(|&i| i <= cap)
            .max()
            .unwrap_or(Isa::Scalar)
    }

    /// The name users see: scalar, avx2, avx-vnni, avx-512, amx.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Vnni => "avx-vnni",
            Isa::Avx512 => "avx-512",
            Isa::Amx => "amx",
        }
    }

    /// Every instruction set usable on this CPU, weakest first (for tests comparing kernels).
    pub fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Scalar];
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
        {
            v.push(Isa::Avx2);
            if is_x86_feature_detected!("avxvnni") {
                v.push(Isa::Vnni);
            }
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
            {
                v.push(Isa::Avx512);
                if packed::amx_permitted() {
                    v.push(Isa::Amx);
                }
            }
        }
        v
    }

    /// [`Isa::detect`], computed once per process (for code without an `Isa` at hand whose
    /// result does not depend on it, such as the activation quantizers).
    pub fn cached() -> Isa {
        static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *ISA.get_or_init(Isa::detect)
    }

    /// Whether the AVX2 kernels may run.
    pub fn avx2(self) -> bool {
        self != Isa::Scalar
    }
}

/// The contract of a tile product (`dot_*_tile`): every activation row (`hi`, and `lo` for
/// q8x2) holds the same number of blocks, every weight row at least that many blocks of
/// `block_bytes`, and the tile is at most 4 x 4 rows.
///
/// # Panics
/// Where the rows break that contract (a caller's bug: `matmul` sizes them), naming `op`.
pub(crate) fn check_tile<const R: usize, const K: usize>(
    op: &str,
    block_bytes: usize,
    w: &[&[u8]; R],
    hi: &[&[BlockQ8]; K],
    lo: Option<&[&[BlockQ8]; K]>,
) {
    let nb = hi.first().map_or(0, |h| h.len());
    assert!(
        hi.iter()
            .chain(lo.into_iter().flatten())
            .all(|x| x.len() == nb)
            && w.iter().all(|r| r.len() >= nb * block_bytes)
            && R <= 4
            && K <= 4,
        "{op}: activation rows of unequal length, a short weight row, R > 4 or K > 4"
    );
}

/// The little-endian f16 at byte `off` of `b`, as f32.
#[inline]
pub fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use std::arch::x86_64::*;

    /// The little-endian f16 at `p`, as f32 (F16C).
    ///
    /// # Safety
    /// f16c must be available and 2 bytes readable at `p`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_load(p: *const u8) -> f32 {
        // SAFETY: 2 readable bytes at p (caller's contract).
        let h = unsafe { (p as *const u16).read_unaligned() };
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h as i32)))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn hsum_ps(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// `((v0 + v1) + (v2 + v3)) + ((v4 + v5) + (v6 + v7))`: the order in which the four-row
    /// kernels' `hadd` reduction sums each row, for single-row kernels that must match them.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub fn hsum_tree(v: __m256) -> f32 {
        let h = _mm256_hadd_ps(v, v);
        let h = _mm256_hadd_ps(h, h);
        _mm_cvtss_f32(_mm_add_ss(
            _mm256_castps256_ps128(h),
            _mm256_extractf128_ps(h, 1),
        ))
    }

    /// How many tiles of weight rows ahead the AVX-512 tile kernels prefetch.
    pub const TILES_AHEAD: usize = 2;

    /// The sum of the 16 lanes of `v` in a fixed order (halves, then quarters, then pairs):
    /// the reduction every AVX-512 tile kernel ends with, so a row's result does not depend
    /// on the tile shape that computed it.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub fn reduce16(v: __m512) -> f32 {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
        let s = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
        let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        _mm_cvtss_f32(s)
    }

    /// The activation side of block pair (i, i + 1) of one Q8 row for the AVX-512 tiles:
    /// `qs` 64 i8 lanes (block i's 32, then block i + 1's; zeros when `two` is false) and
    /// `ds` the f32 lanes `[d_i, s_i, d_i+1, s_i+1]` (zeros for a missing block). With `lo`
    /// (q8x2), `qs` are hi's, `qs_lo` lo's, and `ds` `[hi.d / 256, hi.s + lo.s, ..]`.
    ///
    /// # Safety
    /// avx512f/bw/vl and avx2 must be available; blocks i (and i + 1 when `two`) exist in
    /// `hi` and, when given, `lo`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    pub unsafe fn act_pair(
        hi: *const super::q8::BlockQ8,
        lo: Option<*const super::q8::BlockQ8>,
        i: usize,
        two: bool,
    ) -> (__m512i, __m512i, __m128) {
        // SAFETY: blocks i and (when two) i + 1 exist (caller's contract); BlockQ8 is
        // repr(C) {d, s, qs}, so d and s are 8 contiguous bytes.
        unsafe {
            let load = |b: *const super::q8::BlockQ8| -> (__m512i, __m128) {
                let b0 = b.add(i);
                let q0 = _mm256_loadu_si256((*b0).qs.as_ptr() as *const __m256i);
                let ds0 = _mm_castpd_ps(_mm_load_sd(b0 as *const f64));
                if two {
                    let b1 = b.add(i + 1);
                    let q1 = _mm256_loadu_si256((*b1).qs.as_ptr() as *const __m256i);
                    let ds = _mm_castpd_ps(_mm_loadh_pd(_mm_castps_pd(ds0), b1 as *const f64));
                    (_mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1), ds)
                } else {
                    (_mm512_zextsi256_si512(q0), ds0)
                }
            };
            let (qh, dh) = load(hi);
            match lo {
                None => (qh, _mm512_setzero_si512(), dh),
                Some(lo) => {
                    let (ql, dl) = load(lo);
                    let scale = _mm_setr_ps(1.0 / 256.0, 1.0, 1.0 / 256.0, 1.0);
                    let ds = _mm_add_ps(
                        _mm_mul_ps(dh, scale),
                        _mm_blend_ps(_mm_setzero_ps(), dl, 0b1010),
                    );
                    (qh, ql, ds)
                }
            }
        }
    }

    /// `K <= 4` activation-pair scale vectors (`act_pair`'s `ds`) side by side: lanes
    /// `4k..4k + 4` hold activation row k's, the rest zeros.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub fn pack_ds<const K: usize>(ds: [__m128; K]) -> __m512 {
        let mut v = _mm512_setzero_ps();
        for (k, &d) in ds.iter().enumerate() {
            v = match k {
                0 => _mm512_insertf32x4::<0>(v, d),
                1 => _mm512_insertf32x4::<1>(v, d),
                2 => _mm512_insertf32x4::<2>(v, d),
                _ => _mm512_insertf32x4::<3>(v, d),
            };
        }
        v
    }

    /// The permutation that spreads lane `4k` of a `pack_ds`-shaped vector over lanes 0..8
    /// and lane `4k + 2` over lanes 8..16 (block i's scale, then block i + 1's).
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub fn pair_scale_index(k: usize) -> __m512i {
        let a = 4 * k as i32;
        let b = a + 2;
        _mm512_setr_epi32(a, a, a, a, a, a, a, a, b, b, b, b, b, b, b, b)
    }

    /// 16 bytes at `p` -> 32 u8 lanes: lanes 0..16 the low nibbles, lanes 16..32 the high.
    ///
    /// # Safety
    /// avx2 must be available and 16 bytes readable at `p`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn unpack_nibbles(p: *const u8) -> __m256i {
        // SAFETY: 16 readable bytes at p (caller's contract).
        let q = unsafe { _mm_loadu_si128(p as *const __m128i) };
        let m = _mm_set1_epi8(0x0F);
        let lo = _mm_and_si128(q, m);
        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
        _mm256_set_m128i(hi, lo)
    }
}

pub use ferrite_core::quant::{is_supported, ActFormat};

/// A borrowed `rows x cols` weight matrix in GGUF block layout.
#[derive(Clone, Copy, Debug)]
pub struct QMat<'a> {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub data: &'a [u8],
    row_bytes: usize,
    /// The whole 16-row groups in the layout of [`packed`] (used on AVX-512 with 8-bit
    /// activations), where the owner made one.
    packed: Option<&'a [u8]>,
}

impl<'a> QMat<'a> {
    /// Checks that `data` holds exactly `rows` rows of `cols` elements of `ty`.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: &'a [u8]) -> Result<QMat<'a>, String> {
        if !is_supported(ty) {
            return Err(format!("unsupported weight type {ty}"));
        }
        let bs = ty.block_size();
        if !cols.is_multiple_of(bs) {
            return Err(format!(
                "row length {cols} is not a multiple of the {ty} block size {bs}"
            ));
        }
        let row_bytes = cols / bs * ty.type_size();
        if Some(data.len()) != row_bytes.checked_mul(rows) {
            return Err(format!(
                "{rows}x{cols} {ty} needs {} bytes, found {}",
                row_bytes * rows,
                data.len()
            ));
        }
        Ok(QMat {
            ty,
            rows,
            cols,
            data,
            row_bytes,
            packed: None,
        })
    }

    /// This matrix with its whole 16-row groups also in the [`packed`] layout (what
    /// [`packed::pack`] made of `data`).
    ///
    /// # Panics
    /// Where `packed` is not that size for this matrix.
    pub fn with_packed(self, packed: &'a [u8]) -> QMat<'a> {
        let unit = packed::unit_bytes(self.ty).unwrap_or(0);
        assert_eq!(
            packed.len(),
            self.rows / packed::ROWS * (self.cols / 32) * unit,
            "QMat::with_packed: {} bytes for a {}x{} {}",
            packed.len(),
            self.rows,
            self.cols,
            self.ty
        );
        QMat {
            packed: Some(packed),
            ..self
        }
    }

    pub fn row(&self, r: usize) -> &'a [u8] {
        &self.data[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// Row `r` dequantized into `out` (`cols` long).
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        // Cannot fail: the type is supported and the lengths were checked in `new`.
        let _ = ferrite_gguf::quant::dequantize(self.ty, self.row(r), out);
    }
}

/// A batch of `t` activation rows of `cols` values, quantized to the formats requested.
/// Buffers are reused across calls (no allocation once grown to the largest batch).
#[derive(Default)]
pub struct Acts {
    t: usize,
    cols: usize,
    q8: Vec<BlockQ8>,
    q8_lo: Vec<BlockQ8>,
    /// The sum of each block's `qs` in `q8` and `q8_lo` (the packed Q8_0 kernel's correction).
    sums: Vec<i32>,
    sums_lo: Vec<i32>,
    f32: Vec<f32>,
    has: [bool; 3],
    /// The eight-row layouts' buffers ([`lay_out_rows`]), reused by every product that needs them
    /// (one at a time), so none allocates or zeroes its own.
    laid: std::sync::Mutex<Vec<packed::GroupActs>>,
}

/// The sum of each block's `qs`.
fn block_sums(blocks: &[BlockQ8], out: &mut Vec<i32>) {
    out.clear();
    out.extend(
        blocks
            .iter()
            .map(|b| b.qs.iter().map(|&q| q as i32).sum::<i32>()),
    );
}

impl Acts {
    /// Quantizes `x` (`t x cols`, row-major) for every format in `formats`.
    pub fn quantize(&mut self, x: &[f32], t: usize, cols: usize, formats: &[ActFormat]) {
        assert_eq!(x.len(), t * cols, "Acts::quantize: x is not t x cols");
        self.t = t;
        self.cols = cols;
        self.has = [false; 3];
        for &f in formats {
            let i = f as usize;
            if self.has[i] {
                continue;
            }
            match f {
                ActFormat::Q8 => {
                    assert_eq!(
                        cols % 32,
                        0,
                        "Acts::quantize: cols {cols} not a multiple of 32"
                    );
                    self.q8.resize(t * cols / 32, BlockQ8::default());
                    q8::quantize_q8(x, &mut self.q8);
                    block_sums(&self.q8, &mut self.sums);
                }
                ActFormat::Q8x2 => {
                    assert_eq!(
                        cols % 32,
                        0,
                        "Acts::quantize: cols {cols} not a multiple of 32"
                    );
                    self.q8.resize(t * cols / 32, BlockQ8::default());
                    self.q8_lo.resize(t * cols / 32, BlockQ8::default());
                    q8::quantize_q8x2(x, &mut self.q8, &mut self.q8_lo);
                    block_sums(&self.q8, &mut self.sums);
                    block_sums(&self.q8_lo, &mut self.sums_lo);
                    // The hi half is plain Q8 of x.
                    self.has[ActFormat::Q8 as usize] = true;
                }
                ActFormat::F32 => {
                    self.f32.clear();
                    self.f32.extend_from_slice(x);
                }
            }
            self.has[i] = true;
        }
    }

    pub fn t(&self) -> usize {
        self.t
    }
}

/// Row chunks per thread of a product. Few: a decode step's products are memory-bound and
/// short (a few microseconds), and every claimed chunk costs two cross-core atomics; at 8
/// per thread SmolLM2 decoded 379-389 tok/s on 2 threads against 412 at 2 (AVX-512 host).
const CHUNKS: usize = 2;

/// Output pointer shared by the row-chunk tasks of one product.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements (distinct rows) of the buffer, which outlives them.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// One product of a fused group: weight `w` and its output (`t x w.rows`, row-major).
pub struct MatOut<'a, 'b> {
    pub w: QMat<'a>,
    pub out: &'b mut [f32],
}

/// `out[t][r] = dot(w[r], x[t])` for every product in `ops` (all sharing the activations
/// `acts`), as one parallel pass over all their rows. Each weight uses its integer kernel if
/// `acts` holds its format, else the exact f32 path (which `acts` must then hold).
pub fn matmul(isa: Isa, acts: &Acts, ops: &mut [MatOut<'_, '_>]) {
    let t = acts.t;
    for op in ops.iter() {
        assert_eq!(
            op.w.cols, acts.cols,
            "matmul: weight has {} columns, activations {}",
            op.w.cols, acts.cols
        );
        assert_eq!(
            op.out.len(),
            t * op.w.rows,
            "matmul: output is not t x rows"
        );
        let native =
            ActFormat::for_weight(op.w.ty) == ActFormat::Q8 && acts.has[ActFormat::Q8 as usize];
        assert!(
            native || acts.has[ActFormat::F32 as usize],
            "matmul: activations not prepared for {}",
            op.w.ty
        );
    }
    let total_rows: usize = ops.iter().map(|o| o.w.rows).sum();
    let pool = crate::spin_pool::Pool::global();
    let threads = pool.threads();
    // Chunks: `CHUNKS` per thread, at least 16 rows, and for big batches
    // small enough that a chunk's weights stay in L2 while every activation row passes.
    let row_bytes = ops.first().map_or(1, |o| o.w.row_bytes.max(1));
    let mut chunk = total_rows.div_ceil(threads * CHUNKS).max(16);
    if t > 1 {
        chunk = chunk.min((128 * 1024 / row_bytes).max(4));
    }
    // Whole tiles of four weight rows (Q4_1, Q5_0, Q8_0), or whole groups of 16 where a
    // matrix is packed, in every chunk but a matrix's last.
    let any_packed = isa >= Isa::Avx512 && ops.iter().any(|o| o.w.packed.is_some());
    let chunk = chunk.next_multiple_of(if any_packed { packed::ROWS } else { 4 });
    let mut tasks: Vec<(usize, usize, usize)> = Vec::new();
    for (k, op) in ops.iter().enumerate() {
        let mut r = 0;
        while r < op.w.rows {
            let e = (r + chunk).min(op.w.rows);
            tasks.push((k, r, e));
            r = e;
        }
    }
    let ptrs: Vec<OutPtr> = ops.iter_mut().map(|o| OutPtr(o.out.as_mut_ptr())).collect();
    let ws: Vec<QMat<'_>> = ops.iter().map(|o| o.w).collect();
    // Two or more activation rows on AMX, or q8x2 rows on AVX-512: eight rows at a time laid
    // out once for every task (`packed::group_amx`, `packed::group_w16`).
    let mut laid_bufs = acts.laid.lock().unwrap_or_else(|e| e.into_inner());
    let wide = isa >= Isa::Amx || (isa >= Isa::Avx512 && acts.has[ActFormat::Q8x2 as usize]);
    let laid: &[packed::GroupActs] = if wide && t >= 2 && any_packed {
        lay_out_rows(acts, isa, &mut laid_bufs)
    } else {
        &[]
    };
    let run = |&(k, r0, r1): &(usize, usize, usize)| {
        let w = &ws[k];
        let out = ptrs[k];
        if !acts.has[ActFormat::Q8 as usize] || ActFormat::for_weight(w.ty) == ActFormat::F32 {
            // f32 path: dequantize each row once for the whole batch.
            let mut row = vec![0f32; w.cols];
            for r in r0..r1 {
                w.dequantize_row(r, &mut row);
                for ti in 0..t {
                    let v = float::dot_f32(isa, &row, &acts.f32[ti * w.cols..(ti + 1) * w.cols]);
                    // SAFETY: (ti, r) is inside the t x rows output, and row r belongs to
                    // this task only, so no other task writes this element.
                    unsafe { *out.0.add(ti * w.rows + r) = v };
                }
            }
            return;
        }
        let x2 = acts.has[ActFormat::Q8x2 as usize];
        let nb = w.cols / 32;
        let a = |ti: usize| &acts.q8[ti * nb..(ti + 1) * nb];
        let lo = |ti: usize| &acts.q8_lo[ti * nb..(ti + 1) * nb];
        let mut r0 = r0;
        if let (Some(p), true) = (w.packed, isa >= Isa::Avx512) {
            let end = r1.min(w.rows / packed::ROWS * packed::ROWS);
            if r0 < end {
                groups(isa, w, p, acts, laid, x2, r0, end, out);
                r0 = end;
            }
        }
        if r0 == r1 {
            return;
        }
        if matches!(w.ty, GgmlType::Q4_1 | GgmlType::Q8_0 | GgmlType::Q5_0) {
            tiles(isa, w, x2, r0, r1, t, &a, &lo, out);
            return;
        }
        for ti in 0..t {
            for r in r0..r1 {
                let v = if x2 {
                    dot_row_x2(isa, w, r, a(ti), lo(ti))
                } else {
                    dot_row(isa, w, r, a(ti))
                };
                // SAFETY: as above.
                unsafe { *out.0.add(ti * w.rows + r) = v };
            }
        }
    };
    if tasks.len() == 1 || threads == 1 || total_rows * t < 64 {
        tasks.iter().for_each(run);
    } else {
        pool.run(tasks.len(), &|i| run(&tasks[i]));
    }
}

/// The activation rows of `acts` (q8, with q8x2's `lo` where it has them) laid out for
/// [`packed::group_amx`] (on [`Isa::Amx`]) or [`packed::group_w16`], eight rows per entry, in
/// `bufs` (grown as needed).
fn lay_out_rows<'b>(
    acts: &Acts,
    isa: Isa,
    bufs: &'b mut Vec<packed::GroupActs>,
) -> &'b [packed::GroupActs] {
    let (t, nb) = (acts.t, acts.cols / 32);
    let x2 = acts.has[ActFormat::Q8x2 as usize];
    if !acts.has[ActFormat::Q8 as usize] {
        return &[];
    }
    fn rows<T>(v: &[T], r: std::ops::Range<usize>, nb: usize) -> Vec<&[T]> {
        r.map(|ti| &v[ti * nb..(ti + 1) * nb]).collect()
    }
    let groups = t.div_ceil(packed::AMX_ROWS);
    if bufs.len() < groups {
        bufs.resize_with(groups, Default::default);
    }
    for (g, a) in bufs[..groups].iter_mut().enumerate() {
        let r = g * packed::AMX_ROWS..((g + 1) * packed::AMX_ROWS).min(t);
        let (lo, sl) = if x2 {
            (
                rows(&acts.q8_lo, r.clone(), nb),
                rows(&acts.sums_lo, r.clone(), nb),
            )
        } else {
            (Vec::new(), Vec::new())
        };
        a.fill(
            &rows(&acts.q8, r.clone(), nb),
            x2.then_some(&lo[..]),
            &rows(&acts.sums, r, nb),
            x2.then_some(&sl[..]),
            isa,
        );
    }
    &bufs[..groups]
}

/// Rows `r0..r1` (whole groups: `r0` and `r1` multiples of 16) of a product whose weight
/// is packed (`p`, [`packed`]), for all activation rows: eight at a time where `laid` holds
/// them laid out ([`lay_out_rows`]: on AMX tiles, or in 16-bit pairs on AVX-512), else four at a
/// time.
#[allow(clippy::too_many_arguments)]
fn groups(
    isa: Isa,
    w: &QMat<'_>,
    p: &[u8],
    acts: &Acts,
    laid: &[packed::GroupActs],
    x2: bool,
    r0: usize,
    r1: usize,
    out: OutPtr,
) {
    let nb = w.cols / 32;
    let unit = packed::unit_bytes(w.ty).unwrap_or(0) * nb;
    fn row<T>(v: &[T], ti: usize, nb: usize) -> &[T] {
        &v[ti * nb..(ti + 1) * nb]
    }
    let store = |ti: usize, r: usize, v: &[f32; packed::ROWS]| {
        // SAFETY: (ti, r..r + 16) is inside the t x rows output, and these rows belong to
        // this task only (the caller's contract), so no other task writes these elements.
        unsafe {
            std::ptr::copy_nonoverlapping(v.as_ptr(), out.0.add(ti * w.rows + r), packed::ROWS)
        };
    };
    let t = acts.t;
    // Eight activation rows at a time, laid out once per product: through the AMX tiles where
    // the layout holds them, else as 16-bit pairs; both the bits of the AVX-512 kernels below
    // (`packed::group_amx`, `packed::group_w16`).
    if !laid.is_empty() {
        let tiles = packed::AmxTiles::load(isa);
        let mut t0 = 0;
        for a in laid {
            for r in (r0..r1).step_by(packed::ROWS) {
                let units = &p[r / packed::ROWS * unit..][..unit];
                let v = match &tiles {
                    Some(tiles) => packed::group_amx(tiles, w.ty, units, a),
                    None => packed::group_w16(isa, w.ty, units, a),
                };
                for (k, v) in v[..a.rows()].iter().enumerate() {
                    store(t0 + k, r, v);
                }
            }
            t0 += a.rows();
        }
        return;
    }
    let mut t0 = 0;
    while t0 < t {
        let kn = (t - t0).min(4);
        for r in (r0..r1).step_by(packed::ROWS) {
            let units = &p[r / packed::ROWS * unit..][..unit];
            macro_rules! k {
                ($k:literal) => {{
                    let hi: [&[BlockQ8]; $k] = std::array::from_fn(|k| row(&acts.q8, t0 + k, nb));
                    let s: [&[i32]; $k] = std::array::from_fn(|k| row(&acts.sums, t0 + k, nb));
                    let lo = x2.then(|| std::array::from_fn(|k| row(&acts.q8_lo, t0 + k, nb)));
                    let sl = x2.then(|| std::array::from_fn(|k| row(&acts.sums_lo, t0 + k, nb)));
                    let v = packed::group::<$k>(isa, w.ty, units, hi, lo, s, sl);
                    for (k, v) in v.iter().enumerate() {
                        store(t0 + k, r, v);
                    }
                }};
            }
            match kn {
                1 => k!(1),
                2 => k!(2),
                3 => k!(3),
                _ => k!(4),
            }
        }
        t0 += kn;
    }
}

/// Rows `r0..r1` of a Q4_1, Q5_0 or Q8_0 product for all `t` activation rows, in tiles of four
/// weight rows by four activation rows, then the weight rows left over by four activation rows,
/// then the activation rows left over by four weight rows and one; every tile shape gives a
/// row the bits of the one-row kernel. `a(ti)` / `lo(ti)` are activation row ti's blocks
/// (`lo` read only when `x2`); `out` is the product's `t x w.rows` output.
#[allow(clippy::too_many_arguments)]
fn tiles<'x>(
    isa: Isa,
    w: &QMat<'_>,
    x2: bool,
    r0: usize,
    r1: usize,
    t: usize,
    a: &dyn Fn(usize) -> &'x [BlockQ8],
    lo: &dyn Fn(usize) -> &'x [BlockQ8],
    out: OutPtr,
) {
    fn tile<const R: usize, const K: usize>(
        isa: Isa,
        ty: GgmlType,
        w: [&[u8]; R],
        hi: [&[BlockQ8]; K],
        lo: Option<[&[BlockQ8]; K]>,
    ) -> [[f32; K]; R] {
        match ty {
            GgmlType::Q4_1 => q4::dot_q4_1_tile(isa, w, hi, lo),
            GgmlType::Q5_0 => q5::dot_q5_0_tile(isa, w, hi, lo),
            _ => q8_0::dot_q8_0_tile(isa, w, hi, lo),
        }
    }
    let store = |ti: usize, r: usize, v: f32| {
        // SAFETY: (ti, r) is inside the t x rows output, and row r belongs to this task only
        // (the caller's contract), so no other task writes this element.
        unsafe { *out.0.add(ti * w.rows + r) = v };
    };
    let mut t0 = 0;
    while t0 + 4 <= t {
        let hi: [&[BlockQ8]; 4] = std::array::from_fn(|k| a(t0 + k));
        let l = x2.then(|| std::array::from_fn(|k| lo(t0 + k)));
        let mut r = r0;
        while r + 4 <= r1 {
            let v = tile::<4, _>(isa, w.ty, std::array::from_fn(|j| w.row(r + j)), hi, l);
            for (j, vr) in v.iter().enumerate() {
                for (k, &x) in vr.iter().enumerate() {
                    store(t0 + k, r + j, x);
                }
            }
            r += 4;
        }
        for r in r..r1 {
            let [v] = tile(isa, w.ty, [w.row(r)], hi, l);
            for (k, &x) in v.iter().enumerate() {
                store(t0 + k, r, x);
            }
        }
        t0 += 4;
    }
    for ti in t0..t {
        let hi = [a(ti)];
        let l = x2.then(|| [lo(ti)]);
        let mut r = r0;
        while r + 4 <= r1 {
            let v = tile::<4, _>(isa, w.ty, std::array::from_fn(|j| w.row(r + j)), hi, l);
            for (j, vr) in v.iter().enumerate() {
                store(ti, r + j, vr[0]);
            }
            r += 4;
        }
        for r in r..r1 {
            let [[v]] = tile(isa, w.ty, [w.row(r)], hi, l);
            store(ti, r, v);
        }
    }
}

/// dot(w[r], a) with the integer kernel for w's type; `a` is one activation row.
#[inline]
fn dot_row(isa: Isa, w: &QMat<'_>, r: usize, a: &[BlockQ8]) -> f32 {
    let row = w.row(r);
    match w.ty {
        GgmlType::Q4_0 => q4::dot_q4_0(isa, row, a),
        GgmlType::Q4_1 => q4::dot_q4_1(isa, row, a),
        GgmlType::Q5_0 => q5::dot_q5_0(isa, row, a),
        GgmlType::Q5_1 => q5::dot_q5_1(isa, row, a),
        GgmlType::Q8_0 => q8_0::dot_q8_0(isa, row, a),
        GgmlType::Q4_K => k_quants::dot_q4_k(isa, row, a),
        GgmlType::Q6_K => k_quants::dot_q6_k(isa, row, a),
        other => unreachable!("dot_row: {other} has no integer kernel (ActFormat::for_weight)"),
    }
}

/// dot(w[r], hi + lo) for q8x2 activations: one fused pass where the type has a fused
/// kernel, else two passes of `dot_row`.
#[inline]
fn dot_row_x2(isa: Isa, w: &QMat<'_>, r: usize, hi: &[BlockQ8], lo: &[BlockQ8]) -> f32 {
    match w.ty {
        GgmlType::Q4_1 => q4::dot_q4_1_x2(isa, w.row(r), hi, lo),
        GgmlType::Q8_0 => q8_0::dot_q8_0_x2(isa, w.row(r), hi, lo),
        _ => dot_row(isa, w, r, hi) + dot_row(isa, w, r, lo),
    }
}

/// The tile test of a format (`dot_*_tile`): for each block count in `nbs`, four q8x2
/// activation rows (seeded from `act_seed`) and four weight rows of `block` bytes with f16
/// scales at `scales` (seeded from `w_seed`); on every instruction set, q8 and q8x2, the 4x4,
/// 1x4 and 4x1 tiles give each (weight row, activation row) the 1x1 tile's bits, the 1x1 tile
/// gives the one-row kernel's (`direct(isa, w, hi, lo)`, where given), and it stays within
/// rounding of the scalar reference (`scalar(w, acts)`, summed over hi and lo).
#[cfg(test)]
macro_rules! check_tiles {
    (tile: $tile:path, block: $block:expr, scales: $scales:expr, nbs: $nbs:expr,
     seeds: ($act_seed:expr, $w_seed:expr), scalar: $scalar:expr $(, direct: $direct:expr)?) => {{
        use crate::quant::q8::{quantize_q8x2, BlockQ8};
        use crate::quant::test_util::{rand_blocks, rand_f32};
        use crate::quant::Isa;
        for nb in $nbs {
            let (mut hi, mut lo) = (Vec::new(), Vec::new());
            for k in 0..4u64 {
                let x = rand_f32(nb * 32, $act_seed + k + nb as u64);
                let (mut h, mut l) = (vec![BlockQ8::default(); nb], vec![BlockQ8::default(); nb]);
                quantize_q8x2(&x, &mut h, &mut l);
                hi.push(h);
                lo.push(l);
            }
            let ws: Vec<Vec<u8>> = (0..4)
                .map(|k| rand_blocks(nb, $block, $scales, $w_seed + k + nb as u64))
                .collect();
            let w4 = [&ws[0][..], &ws[1], &ws[2], &ws[3]];
            let h4 = [&hi[0][..], &hi[1], &hi[2], &hi[3]];
            let l4 = [&lo[0][..], &lo[1], &lo[2], &lo[3]];
            for isa in Isa::available() {
                for x2 in [false, true] {
                    let l = x2.then_some(l4);
                    let t44 = $tile(isa, w4, h4, l);
                    let t41 = $tile(isa, w4, [h4[2]], l.map(|l| [l[2]]));
                    for r in 0..4 {
                        let [t14] = $tile(isa, [w4[r]], h4, l);
                        for k in 0..4 {
                            let [[one]] = $tile(isa, [w4[r]], [h4[k]], l.map(|l| [l[k]]));
                            let what = format!("{isa:?} x2={x2} nb={nb} r={r} k={k}");
                            $(
                                let direct: f32 = $direct(isa, w4[r], h4[k], x2.then_some(l4[k]));
                                assert_eq!(one.to_bits(), direct.to_bits(), "1x1 {what}");
                            )?
                            assert_eq!(t44[r][k].to_bits(), one.to_bits(), "4x4 {what}");
                            assert_eq!(t14[k].to_bits(), one.to_bits(), "1x4 {what}");
                            if k == 2 {
                                assert_eq!(t41[r][0].to_bits(), one.to_bits(), "4x1 {what}");
                            }
                            let mut want: f32 = $scalar(w4[r], h4[k]);
                            if x2 {
                                want += $scalar(w4[r], l4[k]);
                            }
                            assert!(
                                (one - want).abs() <= 1e-4 * (1.0 + want.abs()),
                                "{what}: {one} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }};
}
#[cfg(test)]
pub(crate) use check_tiles;

#[cfg(test)]
pub(crate) mod test_util {
    use super::q8::{quantize_q8, BlockQ8};

    /// Deterministic pseudo-random numbers (splitmix64).
    pub fn rand_u64(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    }

    /// `n` values uniform in [-1, 1).
    pub fn rand_f32(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| (rand_u64(&mut s) >> 40) as f32 / (1u64 << 23) as f32 - 1.0)
            .collect()
    }

    /// `nb` random blocks of `bytes` bytes each, with small positive f16 scales at the byte
    /// offsets `f16_offsets` of each block.
    pub fn rand_blocks(nb: usize, bytes: usize, f16_offsets: &[usize], seed: u64) -> Vec<u8> {
        let mut s = seed;
        let mut v: Vec<u8> = (0..nb * bytes).map(|_| rand_u64(&mut s) as u8).collect();
        for b in 0..nb {
            for &o in f16_offsets {
                let x = 0.001 + (rand_u64(&mut s) % 1000) as f32 * 1e-5;
                let h = half::f16::from_f32(x).to_bits().to_le_bytes();
                v[b * bytes + o] = h[0];
                v[b * bytes + o + 1] = h[1];
            }
        }
        v
    }

    pub fn acts_q8(nb: usize, seed: u64) -> Vec<BlockQ8> {
        let x = rand_f32(nb * 32, seed);
        let mut a = vec![BlockQ8::default(); nb];
        quantize_q8(&x, &mut a);
        a
    }
}

#[cfg(test)]
mod tests {
    use super::test_util::rand_f32;
    use super::*;

    /// The parallel, fused product against a plain dequantize-then-dot loop, for every
    /// supported format, odd row counts and batches of 1, 3 and 33 rows; Q4_1 and Q8_0 also
    /// with their packed groups (rows past the last whole group on the tile kernels).
    #[test]
    fn matmul_matches_dequantized_reference() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
            GgmlType::F32,
            GgmlType::F16,
            GgmlType::Q5_K,
        ] {
            let cols = 512;
            for (rows, t, pack) in [
                (1usize, 1usize, false),
                (31, 3, false),
                (45, 33, false),
                (97, 1, false),
                (45, 33, true),
                (97, 1, true),
                (64, 6, true),
            ] {
                let wf = rand_f32(rows * cols, rows as u64);
                let data = ferrite_gguf::quant::quantize_to_vec(ty, &wf).unwrap();
                let w = QMat::new(ty, rows, cols, &data).unwrap();
                let packed = pack.then(|| packed::pack(ty, rows, cols, &data)).flatten();
                if pack && packed.is_none() {
                    continue;
                }
                let w = packed.as_deref().map_or(w, |p| w.with_packed(p));
                let x = rand_f32(t * cols, 7 + t as u64);
                let mut acts = Acts::default();
                acts.quantize(&x, t, cols, &[ActFormat::for_weight(ty)]);
                let mut acts2 = Acts::default();
                acts2.quantize(&x, t, cols, &[ActFormat::Q8x2, ActFormat::F32]);
                let mut row = vec![0f32; cols];
                for isa in Isa::available() {
                    let mut out = vec![0f32; t * rows];
                    matmul(isa, &acts, &mut [MatOut { w, out: &mut out }]);
                    let mut out2 = vec![0f32; t * rows];
                    matmul(isa, &acts2, &mut [MatOut { w, out: &mut out2 }]);
                    for r in 0..rows {
                        w.dequantize_row(r, &mut row);
                        for ti in 0..t {
                            let want: f32 =
                                row.iter().zip(&x[ti * cols..]).map(|(a, b)| a * b).sum();
                            let got = out[ti * rows + r];
                            // Hard bound of 8-bit activation rounding: each x moves by at
                            // most half a step, amax / 254.
                            let xr = &x[ti * cols..(ti + 1) * cols];
                            let amax = xr.iter().fold(0f32, |m, v| m.max(v.abs()));
                            let l1: f32 = row.iter().map(|v| v.abs()).sum();
                            let tol = l1 * amax / 254.0 * 1.01 + 1e-3 * (1.0 + want.abs());
                            assert!(
                                (got - want).abs() <= tol,
                                "{ty} {isa:?} rows={rows} t={t} pack={pack} r={r}: {got} vs {want}"
                            );
                            let got2 = out2[ti * rows + r];
                            let tol2 = l1 * amax / 254.0 / 254.0 * 1.01 + 1e-3 * (1.0 + want.abs());
                            assert!(
                                (got2 - want).abs() <= tol2,
                                "q8x2 {ty} {isa:?} rows={rows} pack={pack} r={r}: {got2} vs {want}"
                            );
                        }
                    }
                }
            }
        }
    }
}
