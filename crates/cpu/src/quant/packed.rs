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
    let mut out = vec![0u8; packed_len(ty, rows, cols)?];
    pack_into(ty, rows, cols, data, &mut out).then_some(out)
}

/// The bytes of [`pack`]'s result; `None` where there is none.
pub fn packed_len(ty: GgmlType, rows: usize, cols: usize) -> Option<usize> {
    let n = rows / ROWS * (cols / 32) * unit_bytes(ty)?;
    (n > 0).then_some(n)
}

/// [`pack`] into `out` (every byte written); false, `out` untouched, where there is no packed
/// form or `out` or `data` is not of the length of the matrix's.
pub fn pack_into(ty: GgmlType, rows: usize, cols: usize, data: &[u8], out: &mut [u8]) -> bool {
    let (Some(unit), Some(len)) = (unit_bytes(ty), packed_len(ty, rows, cols)) else {
        return false;
    };
    let groups = rows / ROWS;
    let nb = cols / 32;
    let bb = unit / ROWS;
    if data.len() < rows * nb * bb || out.len() != len {
        return false;
    }
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
    true
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
    if isa >= Isa::Avx512 {
        // SAFETY: Isa::Avx512 and above are only produced after runtime detection of avx512f/bw/vl/vnni,
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

/// Activation rows per AMX pass ([`group_amx`]): the A tile's 16 rows hold 8 rows' `hi`
/// blocks and, for q8x2, their `lo` blocks.
pub const AMX_ROWS: usize = 8;

/// Whether this process may use AMX-INT8 tiles: the CPU has them (cpuid) and the kernel
/// granted the permission to use their state (Linux `arch_prctl(ARCH_REQ_XCOMP_PERM)`,
/// asked once per process).
pub fn amx_permitted() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
        {
            // Leaf 7: EDX bit 24 AMX-TILE, bit 25 AMX-INT8.
            let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
            if (leaf7.edx >> 24) & 3 != 3 {
                return false;
            }
            const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
            const XFEATURE_XTILEDATA: libc::c_long = 18;
            // SAFETY: the call only asks the kernel to enable a state component for this
            // process; it touches no memory of ours.
            unsafe {
                libc::syscall(
                    libc::SYS_arch_prctl,
                    ARCH_REQ_XCOMP_PERM,
                    XFEATURE_XTILEDATA,
                ) == 0
            }
        }
        #[cfg(not(all(target_os = "linux", target_arch = "x86_64")))]
        false
    })
}

/// The AMX tile configuration of [`group_amx`], loaded on this thread (tmm0: A, 16 rows of
/// 32 activation bytes; tmm1: B, 8 rows of 64 weight bytes, one unit; tmm2: C, 16 x 16
/// 32-bit sums; tmm3-5 the same for a second unit) and released when dropped. Not `Send`: the configuration is the thread's.
pub struct AmxTiles(std::marker::PhantomData<*const ()>);

impl AmxTiles {
    /// Loads the configuration; `None` below [`Isa::Amx`].
    pub fn load(isa: Isa) -> Option<AmxTiles> {
        #[cfg(target_arch = "x86_64")]
        if isa >= Isa::Amx {
            #[repr(C, align(64))]
            struct Cfg([u8; 64]);
            let mut cfg = Cfg([0; 64]);
            cfg.0[0] = 1; // palette 1
            for (t, colsb, rows) in [(0, 32u16, 16u8), (1, 64, 8), (2, 64, 16)] {
                // tmm3-5 as tmm0-2 (the second unit of a pass).
                for t in [t, t + 3] {
                    cfg.0[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
                    cfg.0[48 + t] = rows;
                }
            }
            // SAFETY: Isa::Amx is only produced where the CPU has AMX and the process has
            // the permission (amx_permitted); cfg is a valid 64-byte palette-1 configuration.
            unsafe {
                std::arch::asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly))
            };
            return Some(AmxTiles(std::marker::PhantomData));
        }
        let _ = isa;
        None
    }
}

impl Drop for AmxTiles {
    fn drop(&mut self) {
        // SAFETY: a configuration was loaded on this thread (AmxTiles exists only then).
        #[cfg(target_arch = "x86_64")]
        unsafe {
            std::arch::asm!("tilerelease", options(nostack, nomem))
        };
    }
}

/// One block's A tile: row k is activation row k's `hi.qs`, row 8 + k its `lo.qs`.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct ATile([[i8; 32]; 16]);

/// Up to [`AMX_ROWS`] activation rows laid out for [`group_amx`] and [`group_w16`]: per
/// block, the per-row scalars of [`group`]'s kernels (`hi.d`, `/ 256` for q8x2; `hi.s +
/// lo.s`; the Q8_0 correction), computed as those kernels compute them; then the A tile
/// (for AMX) or, for q8x2 rows, the 16-bit pairs of [`group_w16`].
#[derive(Default)]
pub struct GroupActs {
    k: usize,
    x2: bool,
    tiles: Vec<ATile>,
    /// Per block and row, 16 pairs of 16-bit integers `x = 256 hi.qs + lo.qs` (|x| <= 32639):
    /// pair `2c + p` (c < 8, p < 2) is `x[4c + p]` (low half) and `x[4c + p + 2]` (high),
    /// the elements a `vpdpwssd` meets in chunk c's even (p = 0) or odd bytes.
    pairs: Vec<[[u32; 16]; AMX_ROWS]>,
    xd: Vec<[f32; AMX_ROWS]>,
    xs: Vec<[f32; AMX_ROWS]>,
    corr: Vec<[i32; AMX_ROWS]>,
}

impl GroupActs {
    /// Lays out the activation rows `hi` (1 to 8; `lo` for q8x2, as `quantize_q8x2` writes
    /// it) and their block sums (`sums`, `sums_lo`: as for [`group`]): the A tiles on
    /// [`Isa::Amx`], else (q8x2 only) the 16-bit pairs.
    ///
    /// # Panics
    /// Where there are no rows or more than 8, or the rows' lengths disagree, naming the op.
    pub fn fill(
        &mut self,
        hi: &[&[BlockQ8]],
        lo: Option<&[&[BlockQ8]]>,
        sums: &[&[i32]],
        sums_lo: Option<&[&[i32]]>,
        isa: Isa,
    ) {
        let k = hi.len();
        let nb = hi.first().map_or(0, |h| h.len());
        assert!(
            (1..=AMX_ROWS).contains(&k)
                && hi
                    .iter()
                    .chain(lo.iter().copied().flatten())
                    .all(|a| a.len() == nb)
                && sums
                    .iter()
                    .chain(sums_lo.iter().copied().flatten())
                    .all(|s| s.len() == nb)
                && lo.is_none_or(|l| l.len() == k)
                && sums.len() == k
                && sums_lo.is_none_or(|s| s.len() == k)
                && lo.is_some() == sums_lo.is_some(),
            "packed::GroupActs::fill: {k} activation rows (1 to {AMX_ROWS}) or rows, blocks and \
             sums of unequal lengths"
        );
        self.k = k;
        self.x2 = lo.is_some();
        // Rows past k keep what they held: their sums land in C rows no kernel reads (AMX),
        // and group_w16 reads no row past k.
        let amx = isa >= Isa::Amx;
        let pairs = !amx && lo.is_some();
        self.tiles
            .resize(if amx { nb } else { 0 }, ATile([[0; 32]; 16]));
        self.pairs
            .resize(if pairs { nb } else { 0 }, [[0; 16]; AMX_ROWS]);
        self.xd.resize(nb, [0.0; AMX_ROWS]);
        self.xs.resize(nb, [0.0; AMX_ROWS]);
        self.corr.resize(nb, [0; AMX_ROWS]);
        for b in 0..nb {
            for r in 0..k {
                let h = &hi[r][b];
                if amx {
                    self.tiles[b].0[r] = h.qs;
                }
                let mut corr = 128 * sums[r][b];
                if let (Some(lo), Some(sl)) = (lo, sums_lo) {
                    let l = &lo[r][b];
                    if amx {
                        self.tiles[b].0[AMX_ROWS + r] = l.qs;
                    } else {
                        pairs_w16(isa, &h.qs, &l.qs, &mut self.pairs[b][r]);
                    }
                    corr = 256 * corr + 128 * sl[r][b];
                    self.xd[b][r] = h.d * (1.0 / 256.0);
                    self.xs[b][r] = h.s + l.s;
                } else {
                    self.xd[b][r] = h.d;
                    self.xs[b][r] = h.s;
                }
                self.corr[b][r] = corr;
            }
        }
    }

    /// The number of activation rows laid out.
    pub fn rows(&self) -> usize {
        self.k
    }
}

/// [`group`] on AMX tiles for the activation rows of `a`: row k of the result is
/// `group`'s row k, bit for bit (the same 32-bit sums, from one `tdpbsud` per unit, then
/// the same float operations in the same order); rows past `a.rows()` are zero.
///
/// # Panics
/// Where `units` is not a whole number of units of `ty` or not as many as `a` has blocks,
/// or `ty` has no packed form, naming the op.
pub fn group_amx(
    tiles: &AmxTiles,
    ty: GgmlType,
    units: &[u8],
    a: &GroupActs,
) -> [[f32; ROWS]; AMX_ROWS] {
    let unit =
        unit_bytes(ty).unwrap_or_else(|| panic!("packed::group_amx: {ty} has no packed form"));
    let nb = a.tiles.len();
    assert!(
        nb == a.xd.len(),
        "packed::group_amx: the activation rows were laid out without their A tiles"
    );
    assert!(
        units.len() == nb * unit && a.k >= 1,
        "packed::group_amx: {} bytes of {ty} units for {nb} activation blocks",
        units.len()
    );
    let _ = tiles;
    #[cfg(target_arch = "x86_64")]
    {
        type Kernel = unsafe fn(*const u8, &GroupActs) -> [[f32; ROWS]; AMX_ROWS];
        fn pick<const X2: bool, const F: u8>(k: usize) -> Kernel {
            match k {
                1 => amx::product::<1, X2, F>,
                2 => amx::product::<2, X2, F>,
                3 => amx::product::<3, X2, F>,
                4 => amx::product::<4, X2, F>,
                5 => amx::product::<5, X2, F>,
                6 => amx::product::<6, X2, F>,
                7 => amx::product::<7, X2, F>,
                _ => amx::product::<8, X2, F>,
            }
        }
        use avx512::{Q4_0, Q4_1, Q5_0, Q8_0};
        let f = match (ty, a.x2) {
            (GgmlType::Q4_0, false) => pick::<false, Q4_0>(a.k),
            (GgmlType::Q4_0, true) => pick::<true, Q4_0>(a.k),
            (GgmlType::Q4_1, false) => pick::<false, Q4_1>(a.k),
            (GgmlType::Q4_1, true) => pick::<true, Q4_1>(a.k),
            (GgmlType::Q5_0, false) => pick::<false, Q5_0>(a.k),
            (GgmlType::Q5_0, true) => pick::<true, Q5_0>(a.k),
            (_, false) => pick::<false, Q8_0>(a.k),
            (_, true) => pick::<true, Q8_0>(a.k),
        };
        // SAFETY: `tiles` proves Isa::Amx (hence avx512f/bw/vl/vnni, avx2, fma, f16c) and
        // this thread's tile configuration; `units` holds nb units of ty (checked above)
        // and `a` nb blocks of each of its rows.
        unsafe { f(units.as_ptr(), a) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("packed::group_amx: AmxTiles exists only on x86-64")
}

/// One block's 16-bit pairs of [`GroupActs`] from its q8x2 `hi` and `lo` quants.
fn pairs_w16(isa: Isa, hi: &[i8; 32], lo: &[i8; 32], out: &mut [u32; 16]) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        // SAFETY: Isa::Avx512 is only produced after runtime detection of avx512f/bw.
        unsafe { avx512::pairs_w16(hi, lo, out) };
        return;
    }
    let x = |j: usize| (256 * hi[j] as i32 + lo[j] as i32) as u16 as u32;
    for (i, p) in out.iter_mut().enumerate() {
        let j = 4 * (i / 2) + i % 2;
        *p = x(j) | x(j + 2) << 16;
    }
}

/// [`group`] for the q8x2 activation rows of `a` (laid out without AMX tiles), all in one
/// pass over the units: per unit and row, sixteen `vpdpwssd` multiply the weights (widened to
/// 16 bits) by `256 hi + lo` in 16 bits, which gives the 32-bit sum of [`group`]'s two
/// passes (`256 sum(q hi) + sum(q lo)`) exactly; the float steps are [`group`]'s, so row k
/// of the result is `group`'s row k, bit for bit. Rows past `a.rows()` are zero.
///
/// # Panics
/// Below [`Isa::Avx512`], where `a` holds no 16-bit pairs (not q8x2, or laid out for AMX),
/// or where `units` is not as many units of `ty` as `a` has blocks, naming the op.
pub fn group_w16(isa: Isa, ty: GgmlType, units: &[u8], a: &GroupActs) -> [[f32; ROWS]; AMX_ROWS] {
    let unit =
        unit_bytes(ty).unwrap_or_else(|| panic!("packed::group_w16: {ty} has no packed form"));
    let nb = a.xd.len();
    assert!(
        isa >= Isa::Avx512 && a.x2 && a.pairs.len() == nb && units.len() == nb * unit && a.k >= 1,
        "packed::group_w16: {} bytes of {ty} units for {nb} activation blocks (q8x2 rows laid \
         out without AMX tiles, on AVX-512)",
        units.len()
    );
    #[cfg(target_arch = "x86_64")]
    {
        type Kernel = unsafe fn(*const u8, &GroupActs) -> [[f32; ROWS]; AMX_ROWS];
        fn pick<const F: u8>(k: usize) -> Kernel {
            match k {
                1 => avx512::w16::<1, F>,
                2 => avx512::w16::<2, F>,
                3 => avx512::w16::<3, F>,
                4 => avx512::w16::<4, F>,
                5 => avx512::w16::<5, F>,
                6 => avx512::w16::<6, F>,
                7 => avx512::w16::<7, F>,
                _ => avx512::w16::<8, F>,
            }
        }
        use avx512::{Q4_0, Q4_1, Q5_0, Q8_0};
        let f = match ty {
            GgmlType::Q4_0 => pick::<Q4_0>(a.k),
            GgmlType::Q4_1 => pick::<Q4_1>(a.k),
            GgmlType::Q5_0 => pick::<Q5_0>(a.k),
            _ => pick::<Q8_0>(a.k),
        };
        // SAFETY: Isa::Avx512 and above are only produced after runtime detection of
        // avx512f/bw/vl/vnni, avx2, fma and f16c; `units` holds nb units of ty and `a` nb
        // blocks of pairs and scalars for each of its rows (checked above).
        unsafe { f(units.as_ptr(), a) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("packed::group_w16: Isa::Avx512 exists only on x86-64")
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
    /// Q8_0, for the AMX products (the AVX-512 ones have [`q8_0`]).
    pub const Q8_0: u8 = 3;

    /// Bytes of one unit of format `F`.
    pub const fn unit_q4<const F: u8>() -> usize {
        match F {
            Q4_0 => 288,
            Q5_0 => 352,
            _ => 320,
        }
    }

    /// Prefetches the unit `AHEAD` units past `u` (a hint: it may point past the matrix).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    fn prefetch(u: *const u8, unit: usize) {
        for line in 0..unit.div_ceil(64) {
            let a = u.wrapping_add(AHEAD * unit + 64 * line);
            // A prefetch never faults.
            _mm_prefetch::<_MM_HINT_T1>(a as *const i8);
        }
    }

    /// One Q4_1, Q4_0 or Q5_0 unit (`F`) at `u`, prefetching ahead: its 8 chunks of weights
    /// as bytes 0..32 (chunk c lane n = row n's elements `4c..4c + 4`, chunk 4 + c its
    /// elements `16 + 4c..`; the layout of a `vpdpbusd` operand and of an AMX B tile), its
    /// 16 `d` and its 16 offsets `m` (`-8 d` for Q4_0, `-16 d` for Q5_0).
    ///
    /// # Safety
    /// avx512f/bw/vl/vnni, avx2, fma and f16c must be available; `u` points at a unit of `F`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn unpack_q4<const F: u8>(u: *const u8) -> ([__m512i; 8], __m512, __m512) {
        let d_at = if F == Q5_0 { 320 } else { 256 };
        prefetch(u, unit_q4::<F>());
        let mask = _mm512_set1_epi8(0x0F);
        // SAFETY: the unit lies at u (caller's contract).
        unsafe {
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
            (q, d, m)
        }
    }

    /// One Q8_0 unit at `u`, prefetching ahead: its 8 chunks (weights plus 128, as u8) and
    /// its 16 `d`.
    ///
    /// # Safety
    /// As [`unpack_q4`], with `u` at a Q8_0 unit.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn unpack_q8_0(u: *const u8) -> ([__m512i; 8], __m512) {
        prefetch(u, Q8_0_UNIT);
        // SAFETY: the unit lies at u (caller's contract).
        unsafe {
            let mut q = [_mm512_setzero_si512(); 8];
            for (c, qc) in q.iter_mut().enumerate() {
                *qc = _mm512_loadu_si512(u.add(64 * c) as *const __m512i);
            }
            (
                q,
                _mm512_cvtph_ps(_mm256_loadu_si256(u.add(512) as *const __m256i)),
            )
        }
    }

    /// Bytes of one Q8_0 unit.
    pub const Q8_0_UNIT: usize = 544;

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
        let mut acc = [_mm512_setzero_ps(); K];
        let mut offs = [_mm512_setzero_ps(); K];
        for b in 0..nb {
            // SAFETY: unit b lies at p (caller's contract); blocks b of the activation rows
            // exist.
            unsafe {
                let (q, d, m) = unpack_q4::<F>(p.add(b * unit_q4::<F>()));
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
        let mut acc = [_mm512_setzero_ps(); K];
        for b in 0..nb {
            // SAFETY: as in q4; sums[k] (and sums_lo[k]) hold nb values.
            unsafe {
                let (q, d) = unpack_q8_0(p.add(b * Q8_0_UNIT));
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
    /// [`super::pairs_w16`]: `x = 256 hi + lo` as 32 words, then words `4c + p`, `4c + p + 2`
    /// side by side (one `vpermw`).
    ///
    /// # Safety
    /// avx512f/bw must be available.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn pairs_w16(hi: &[i8; 32], lo: &[i8; 32], out: &mut [u32; 16]) {
        // SAFETY: hi and lo are 32 bytes, out 64.
        unsafe {
            let h = _mm512_cvtepi8_epi16(_mm256_loadu_si256(hi.as_ptr() as *const __m256i));
            let l = _mm512_cvtepi8_epi16(_mm256_loadu_si256(lo.as_ptr() as *const __m256i));
            let x = _mm512_add_epi16(_mm512_slli_epi16::<8>(h), l);
            // word 2i + e of the result is x[4 (i / 2) + i % 2 + 2 e]
            let idx: [i16; 32] = std::array::from_fn(|w| {
                let (i, e) = (w / 2, w % 2);
                (4 * (i / 2) + i % 2 + 2 * e) as i16
            });
            let idx = _mm512_loadu_si512(idx.as_ptr() as *const __m512i);
            _mm512_storeu_si512(
                out.as_mut_ptr() as *mut __m512i,
                _mm512_permutexvar_epi16(idx, x),
            );
        }
    }

    /// `acc + a * b` by 16-bit pairs (`vpdpwssd`, `b` broadcast from memory), written as
    /// assembly: LLVM splits the intrinsic into `vpmaddwd` and `vpaddd`, twice the uops.
    ///
    /// # Safety
    /// avx512f/vnni must be available.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn dpwssd(acc: __m512i, a: __m512i, b: &u32) -> __m512i {
        let mut acc = acc;
        // SAFETY: reads the 4 bytes of b; the caller guarantees avx512vnni.
        unsafe {
            std::arch::asm!(
                "vpdpwssd {acc}, {a}, dword ptr [{b}]{{1to16}}",
                acc = inout(zmm_reg) acc,
                a = in(zmm_reg) a,
                b = in(reg) b,
                options(pure, readonly, nostack, preserves_flags)
            )
        };
        acc
    }

    /// [`super::group_w16`] for `K` rows of format `F`: per unit, chunk c of the weights
    /// (c < 8: row n's elements `4c..4c + 4` in lane n, as [`unpack_q4`] and
    /// [`unpack_q8_0`] give them) split into its even and odd bytes as 16-bit lanes, each
    /// multiplied by the row's pair `2c` or `2c + 1` ([`super::GroupActs`]); then [`q4`]'s
    /// (or [`q8_0`]'s) float steps on the sums.
    ///
    /// # Safety
    /// avx512f/bw/vl/vnni, avx2, fma and f16c must be available; `p` points at as many
    /// units of `F` as `a` has blocks of pairs; `K <= a.k`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn w16<const K: usize, const F: u8>(
        p: *const u8,
        a: &super::GroupActs,
    ) -> [[f32; ROWS]; super::AMX_ROWS] {
        let nb = a.pairs.len();
        let unit = if F == Q8_0 { Q8_0_UNIT } else { unit_q4::<F>() };
        let even = _mm512_set1_epi32(0x00FF_00FF);
        let mut acc = [_mm512_setzero_ps(); K];
        let mut offs = [_mm512_setzero_ps(); K];
        for b in 0..nb {
            // SAFETY: unit b lies at p and block b of the pairs exists (caller's contract).
            unsafe {
                let u = p.add(b * unit);
                let pr = &a.pairs[b];
                let mut s = [_mm512_setzero_si512(); K];
                macro_rules! dp {
                    ($c:expr, $q:expr) => {{
                        let (c, q) = ($c, $q);
                        let (ev, od) = (_mm512_and_si512(q, even), _mm512_srli_epi16::<8>(q));
                        for k in 0..K {
                            s[k] = dpwssd(s[k], ev, &pr[k][2 * c]);
                            s[k] = dpwssd(s[k], od, &pr[k][2 * c + 1]);
                        }
                    }};
                }
                if F == Q8_0 {
                    prefetch(u, Q8_0_UNIT);
                    for c in 0..8 {
                        dp!(c, _mm512_loadu_si512(u.add(64 * c) as *const __m512i));
                    }
                    let d = _mm512_cvtph_ps(_mm256_loadu_si256(u.add(512) as *const __m256i));
                    for k in 0..K {
                        let s = _mm512_sub_epi32(s[k], _mm512_set1_epi32(a.corr[b][k]));
                        let scale = _mm512_mul_ps(d, _mm512_set1_ps(a.xd[b][k]));
                        acc[k] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), acc[k]);
                    }
                    continue;
                }
                // The chunks are decoded one at a time as unpack_q4 decodes them (not through
                // it): its eight chunks live at once with the K sums spill registers at K = 8.
                prefetch(u, unit_q4::<F>());
                let mask = _mm512_set1_epi8(0x0F);
                let h = if F == Q5_0 {
                    _mm512_loadu_si512(u.add(256) as *const __m512i)
                } else {
                    _mm512_setzero_si512()
                };
                let b4 = _mm512_set1_epi8(0x10);
                for c in 0..4 {
                    let w = _mm512_loadu_si512(u.add(64 * c) as *const __m512i);
                    let mut lo = _mm512_and_si512(w, mask);
                    let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(w), mask);
                    if F == Q5_0 {
                        // As unpack_q4: chunk c's fifth bits are bit c of h's bytes, chunk
                        // 4 + c's bit 4 + c.
                        let (l5, h5) = match c {
                            0 => (_mm512_slli_epi32::<4>(h), h),
                            1 => (_mm512_slli_epi32::<3>(h), _mm512_srli_epi32::<1>(h)),
                            2 => (_mm512_slli_epi32::<2>(h), _mm512_srli_epi32::<2>(h)),
                            _ => (_mm512_slli_epi32::<1>(h), _mm512_srli_epi32::<3>(h)),
                        };
                        lo = _mm512_or_si512(lo, _mm512_and_si512(l5, b4));
                        hi = _mm512_or_si512(hi, _mm512_and_si512(h5, b4));
                    }
                    dp!(c, lo);
                    dp!(4 + c, hi);
                }
                let d_at = if F == Q5_0 { 320 } else { 256 };
                let d = _mm512_cvtph_ps(_mm256_loadu_si256(u.add(d_at) as *const __m256i));
                let m = match F {
                    Q4_0 => _mm512_mul_ps(d, _mm512_set1_ps(-8.0)),
                    Q5_0 => _mm512_mul_ps(d, _mm512_set1_ps(-16.0)),
                    _ => _mm512_cvtph_ps(_mm256_loadu_si256(u.add(288) as *const __m256i)),
                };
                for k in 0..K {
                    let scale = _mm512_mul_ps(d, _mm512_set1_ps(a.xd[b][k]));
                    acc[k] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s[k]), acc[k]);
                    offs[k] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.xs[b][k]), offs[k]);
                }
            }
        }
        eight_rows::<K, F>(&acc, &offs)
    }

    /// The eight-row kernels' result: row k < K is `acc[k] + offs[k]` (`acc[k]` alone for
    /// Q8_0, which has no offset term), the rows past K zero.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub fn eight_rows<const K: usize, const F: u8>(
        acc: &[__m512; K],
        offs: &[__m512; K],
    ) -> [[f32; ROWS]; super::AMX_ROWS] {
        let mut out = [[0f32; ROWS]; super::AMX_ROWS];
        for k in 0..K {
            let v = if F == Q8_0 {
                acc[k]
            } else {
                _mm512_add_ps(acc[k], offs[k])
            };
            // SAFETY: out[k] holds 16 f32.
            unsafe { _mm512_storeu_ps(out[k].as_mut_ptr(), v) };
        }
        out
    }
}

#[cfg(target_arch = "x86_64")]
mod amx {
    use std::arch::asm;
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;

    use super::avx512::{eight_rows, unit_q4, unpack_q4, unpack_q8_0, Q8_0, Q8_0_UNIT};
    use super::{GroupActs, AMX_ROWS, ROWS};

    #[repr(C, align(64))]
    #[derive(Clone, Copy)]
    struct Buf<const N: usize>([u8; N]);

    /// [`super::group_amx`] for `K` rows of format `F` (q8x2 when `X2`): per unit, the
    /// weights decoded as the AVX-512 kernels decode them are stored as the B tile, one
    /// `tdpbsud` (activations signed, weights unsigned) makes the 32-bit sums of every
    /// (activation row, weight row), and the AVX-512 kernels' float steps follow on them.
    ///
    /// # Safety
    /// avx512f/bw/vl/vnni, avx2, fma, f16c and AMX-INT8 must be available with this
    /// thread's tile configuration loaded ([`super::AmxTiles`]); `p` points at as many
    /// units of `F` as `a` has blocks; `K <= a.k`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    pub unsafe fn product<const K: usize, const X2: bool, const F: u8>(
        p: *const u8,
        a: &GroupActs,
    ) -> [[f32; ROWS]; AMX_ROWS] {
        let unit = if F == Q8_0 { Q8_0_UNIT } else { unit_q4::<F>() };
        let nb = a.tiles.len();
        // Passes of two units on two sets of tiles (tmm0-2, tmm3-5), software-pipelined:
        // pass i's tile work runs on weights decoded (stored as B tiles) during pass i - 1,
        // and its sums are read back during pass i + 1, so that no tile load waits for
        // vector stores just made and no vector load for a tile store just made.
        let passes = nb.div_ceil(2);
        let width = |i: usize| if 2 * i + 1 < nb { 2 } else { 1 };
        // Uninitialized: every byte is written (decode, tilestored) before it is read.
        let mut wb = [MaybeUninit::<Buf<1024>>::uninit(); 2];
        let mut cb = [MaybeUninit::<Buf<2048>>::uninit(); 2];
        let zero = _mm512_setzero_ps();
        // Decodes pass i's units into wb[i % 2]; their (d, m).
        let decode = |wb: &mut MaybeUninit<Buf<1024>>, i: usize| {
            let mut dm = [(zero, zero); 2];
            for (j, dm) in dm.iter_mut().enumerate().take(width(i)) {
                // SAFETY: unit 2i + j < nb lies at p (caller's contract); wb holds two
                // 8 x 64-byte B tiles.
                unsafe {
                    let u = p.add((2 * i + j) * unit);
                    let (q, d, m) = if F == Q8_0 {
                        let (q, d) = unpack_q8_0(u);
                        (q, d, d)
                    } else {
                        unpack_q4::<F>(u)
                    };
                    for (c, qc) in q.iter().enumerate() {
                        let at = (wb.as_mut_ptr() as *mut u8).add(512 * j + 64 * c) as *mut __m512i;
                        _mm512_store_si512(at, *qc);
                    }
                    *dm = (d, m);
                }
            }
            dm
        };
        let mut acc = [zero; K];
        let mut offs = [zero; K];
        let mut dm_next = decode(&mut wb[0], 0);
        let mut dm_prev = [(zero, zero); 2];
        for i in 0..=passes {
            let dm_cur = dm_next;
            if i < passes {
                let w = wb[i % 2].as_ptr() as *const u8;
                let c = cb[i % 2].as_mut_ptr() as *mut u8;
                // SAFETY: a.tiles[2i] (and 2i + 1 when the pass has two units) are 16 x
                // 32-byte A tiles; w holds the pass's B tiles, c room for its C tiles.
                unsafe {
                    let at = a.tiles.as_ptr().add(2 * i) as *const u8;
                    // The first unit on tmm0-2; the next (`$second`, its store `$store`) on
                    // tmm3-5, its product issued before the first's sums are stored.
                    macro_rules! pass {
                        ([$($second:literal),*], [$($store:literal),*]) => {
                            asm!(
                                "tileloadd tmm1, [{w} + {s64}*1]",
                                "tileloadd tmm0, [{a} + {s32}*1]",
                                "tilezero tmm2",
                                "tdpbsud tmm2, tmm0, tmm1",
                                $($second,)*
                                "tilestored [{c} + {s64}*1], tmm2",
                                $($store,)*
                                w = in(reg) w,
                                a = in(reg) at,
                                c = in(reg) c,
                                s64 = in(reg) 64usize,
                                s32 = in(reg) 32usize,
                                options(nostack),
                            )
                        };
                    }
                    if width(i) == 2 {
                        pass!(
                            [
                                "tileloadd tmm4, [{w} + {s64}*1 + 512]",
                                "tileloadd tmm3, [{a} + {s32}*1 + 512]",
                                "tilezero tmm5",
                                "tdpbsud tmm5, tmm3, tmm4"
                            ],
                            ["tilestored [{c} + {s64}*1 + 1024], tmm5"]
                        );
                    } else {
                        pass!([], []);
                    }
                }
                if i + 1 < passes {
                    dm_next = decode(&mut wb[(i + 1) % 2], i + 1);
                }
            }
            if i >= 1 {
                let pi = i - 1;
                for (j, &(d, m)) in dm_prev.iter().enumerate().take(width(pi)) {
                    let b = 2 * pi + j;
                    // SAFETY: cb[pi % 2] holds pass pi's C tiles (16 x 16 i32 each).
                    unsafe {
                        let c = (cb[pi % 2].as_ptr() as *const u8).add(1024 * j) as *const __m512i;
                        let (xd, xs, corr) = (&a.xd[b], &a.xs[b], &a.corr[b]);
                        for k in 0..K {
                            let mut s = _mm512_load_si512(c.add(k));
                            if X2 {
                                s = _mm512_add_epi32(
                                    _mm512_slli_epi32::<8>(s),
                                    _mm512_load_si512(c.add(AMX_ROWS + k)),
                                );
                            }
                            if F == Q8_0 {
                                s = _mm512_sub_epi32(s, _mm512_set1_epi32(corr[k]));
                            }
                            let scale = _mm512_mul_ps(d, _mm512_set1_ps(xd[k]));
                            acc[k] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(s), acc[k]);
                            if F != Q8_0 {
                                offs[k] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[k]), offs[k]);
                            }
                        }
                    }
                }
            }
            dm_prev = dm_cur;
        }
        eight_rows::<K, F>(&acc, &offs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q4::{dot_q4_0_scalar, dot_q4_1_scalar};
    use crate::quant::q5::dot_q5_scalar;
    use crate::quant::q8::quantize_q8x2;
    use crate::quant::q8_0::dot_q8_0_scalar;
    use crate::quant::test_util::{rand_blocks, rand_f32};

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

    /// One product per weight row of a group, for eight activation rows.
    type EightRows = [[f32; ROWS]; AMX_ROWS];

    /// Every format, 1 to 8 activation rows laid out at once (q8 and q8x2 on AMX tiles; q8x2
    /// in 16-bit pairs otherwise), run by `run`: each row's products must be the AVX-512
    /// kernel's bits for that row alone (so the engine's batched logits stay equal to the
    /// single-sequence ones), and rows past the filled ones 0.
    fn eight_rows_equal_avx512_bits(
        amx: bool,
        run: &dyn Fn(GgmlType, &[u8], &GroupActs) -> EightRows,
    ) {
        for (ty, bytes, scales) in [
            (GgmlType::Q4_0, Q4_0_BYTES, &[0usize][..]),
            (GgmlType::Q4_1, Q4_1_BYTES, &[0usize, 2][..]),
            (GgmlType::Q5_0, Q5_0_BYTES, &[0][..]),
            (GgmlType::Q8_0, Q8_0_BYTES, &[0][..]),
        ] {
            let nb = 18;
            let rows = 2 * ROWS;
            let data = rand_blocks(rows * nb, bytes, scales, 5);
            let packed = pack(ty, rows, nb * 32, &data).unwrap();
            let unit = unit_bytes(ty).unwrap() * nb;
            let (mut hi, mut lo) = (Vec::new(), Vec::new());
            for k in 0..AMX_ROWS as u64 {
                // Large values in one row exercise the sums' range.
                let mut x = rand_f32(nb * 32, 300 + k);
                if k == 3 {
                    x.iter_mut().for_each(|v| *v *= 1e4);
                }
                let (mut h, mut l) = (vec![BlockQ8::default(); nb], vec![BlockQ8::default(); nb]);
                quantize_q8x2(&x, &mut h, &mut l);
                hi.push(h);
                lo.push(l);
            }
            let sh: Vec<Vec<i32>> = hi.iter().map(|h| sums(h)).collect();
            let sl: Vec<Vec<i32>> = lo.iter().map(|l| sums(l)).collect();
            let mut acts = GroupActs::default();
            for x2 in [false, true].into_iter().filter(|&x2| amx || x2) {
                for k in 1..=AMX_ROWS {
                    let h: Vec<&[BlockQ8]> = hi[..k].iter().map(|v| &v[..]).collect();
                    let l: Vec<&[BlockQ8]> = lo[..k].iter().map(|v| &v[..]).collect();
                    let s: Vec<&[i32]> = sh[..k].iter().map(|v| &v[..]).collect();
                    let s_lo: Vec<&[i32]> = sl[..k].iter().map(|v| &v[..]).collect();
                    let isa = if amx { Isa::Amx } else { Isa::Avx512 };
                    acts.fill(&h, x2.then_some(&l[..]), &s, x2.then_some(&s_lo[..]), isa);
                    for g in 0..2 {
                        let units = &packed[g * unit..][..unit];
                        let got = run(ty, units, &acts);
                        for (r, got) in got.iter().enumerate() {
                            let what = format!("{ty} x2={x2} k={k} g={g} row {r}");
                            if r >= k {
                                assert!(got.iter().all(|&v| v == 0.0), "{what}: not zero");
                                continue;
                            }
                            let [want] = group(
                                Isa::Avx512,
                                ty,
                                units,
                                [h[r]],
                                x2.then(|| [l[r]]),
                                [s[r]],
                                x2.then(|| [s_lo[r]]),
                            );
                            for n in 0..ROWS {
                                assert_eq!(got[n].to_bits(), want[n].to_bits(), "{what} n={n}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn amx_groups_equal_avx512_bits() {
        if !Isa::available().contains(&Isa::Amx) {
            eprintln!("amx_groups_equal_avx512_bits: skipped, this CPU or OS offers no AMX-INT8");
            return;
        }
        let tiles = AmxTiles::load(Isa::Amx).expect("Isa::Amx is available");
        eight_rows_equal_avx512_bits(true, &|ty, units, a| group_amx(&tiles, ty, units, a));
    }

    #[test]
    fn w16_groups_equal_avx512_bits() {
        if !Isa::available().contains(&Isa::Avx512) {
            eprintln!("w16_groups_equal_avx512_bits: skipped, this CPU offers no AVX-512 VNNI");
            return;
        }
        eight_rows_equal_avx512_bits(false, &|ty, units, a| group_w16(Isa::Avx512, ty, units, a));
    }

    #[test]
    fn pairs_w16_avx512_equals_scalar() {
        if !Isa::available().contains(&Isa::Avx512) {
            eprintln!("pairs_w16_avx512_equals_scalar: skipped, this CPU offers no AVX-512");
            return;
        }
        let mut seed = 9u32;
        for case in 0..64 {
            let mut byte = || {
                seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
                (seed >> 24) as u8 as i8
            };
            let mut hi: [i8; 32] = std::array::from_fn(|_| byte());
            let lo: [i8; 32] = std::array::from_fn(|_| byte());
            // The extremes of quantize_q8x2's range.
            hi[case % 32] = if case % 2 == 0 { 127 } else { -127 };
            let (mut want, mut got) = ([0u32; 16], [0u32; 16]);
            pairs_w16(Isa::Scalar, &hi, &lo, &mut want);
            pairs_w16(Isa::Avx512, &hi, &lo, &mut got);
            assert_eq!(got, want, "case {case}");
            assert_eq!(
                want[3] >> 16,
                (256 * hi[7] as i32 + lo[7] as i32) as u16 as u32
            );
        }
    }

    #[test]
    fn pack_refuses_what_it_cannot_pack() {
        assert!(pack(GgmlType::Q5_1, 32, 32, &[0; 32 * 24]).is_none());
        assert!(pack(GgmlType::Q4_1, 15, 32, &[0; 15 * 20]).is_none());
        assert!(pack(GgmlType::Q4_1, 16, 32, &[0; 16 * 20 - 1]).is_none());
    }
}
