//! Wrappers of `matvec.cu`: the quantized matrix-vector product with its fused prologue and
//! epilogues, the token embedding, and the final argmax.
//!
//! Launch plan of a product (see the kernel's header): 128 threads per block; G threads per
//! row, the power of two nearest half the row's 32-element units (4..=128), so each thread
//! takes one or two units per row and short rows still fill a block with several rows
//! (NR = 128 / G rows per block). Columns are staged in chunks that fit 8 KiB of shared
//! memory for the block's rows; the input vector takes another cols * 4.5 bytes (fast mode:
//! cols * 1.5 bytes of 8-bit units, quantized beforehand by `quantize_q8`; see `with_q8`).
//!
//! Matrices for the register kernels (`GpuMatrix::split`: split rows, or Q4_K rows) go to the
//! `mvr*` kernels instead: no staging, each warp takes `MVR_NS` row streams (2 rows; GLU a row
//! of gate and one of up),
//! loading its blocks straight into registers, 4 warps a block; in the fast mode the 8-bit
//! input is read from global memory, so those launches need no shared memory at all.

use crate::{Buffer, CudaDevice, KernelArgs, KernelSource, LaunchConfig};

use ferrite_core::{Error, Result};

use crate::qmatrix::{Fmt, GpuMatrix};

pub static SOURCE: KernelSource = KernelSource {
    name: "matvec",
    src: concat!(include_str!("quant.cuh"), include_str!("matvec.cu")),
    prebuilt: crate::prebuilt::MATVEC,
};

/// Threads per block (`MV_T`).
const MV_T: u32 = 128;
/// Staging bytes per block (`MV_STAGE` = MV_T * 16 * MV_LPT).
const MV_STAGE: usize = 128 * 16 * 8;
/// Stages in the ring of staged weights (`MV_S`).
const MV_S: usize = 3;
/// Floats per 32-element unit of the input in shared memory (`XPAD`).
const XPAD: usize = 36;
/// Scratch floats (`MV_RED`).
const MV_RED: usize = 64;
/// Dynamic shared memory a block may have on sm_90 (227 KiB).
pub const SMEM_MAX: usize = 227 * 1024;

/// What the product does with its results (`MV_*` in matvec.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// out[off + r] = W[r] . x (+ bias)
    Store = 0,
    /// out[off + r] += W[r] . x (+ bias): the residual add
    Add = 1,
    /// out[r] = silu(gate[r] . x) * (up[r] . x)
    GluSilu = 2,
    /// out[r] = gelu_tanh(gate[r] . x) * (up[r] . x)
    GluGelu = 3,
}

/// `MvSeg` in matvec.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct MvSeg {
    w: u64,
    bias: u64,
    fmt: u32,
    rows: u32,
    row_bytes: u32,
    out_off: u32,
    blocks: u32,
    pad: u32,
}

/// `MvArgs` in matvec.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct MvArgs {
    seg: [MvSeg; 3],
    nseg: u32,
    mode: u32,
    cols: u32,
    rpb: u32,
    chunk: u32,
    stride: u32,
    x: u64,
    norm: u64,
    eps: f32,
    tiles: u32,
    out: u64,
    argmax: u64,
    /// Bytes between the inputs, and between the outputs, of consecutive rows of a batch.
    xstride: u32,
    ostride: u32,
    /// Input rows of the batch, and rows per block group (`MVR_NB` for the batched register
    /// kernels, else 1).
    nrows: u32,
    rpg: u32,
}

const _: () = {
    assert!(std::mem::size_of::<MvSeg>() == 40);
    assert!(std::mem::size_of::<MvArgs>() == 200);
    assert!(std::mem::size_of::<EmbedArgs>() == 56);
};

/// One matrix of a product: its weights, optional bias (f32 [rows]) and the output element
/// of its row 0.
#[derive(Clone, Copy)]
pub struct Seg<'a> {
    pub w: &'a GpuMatrix,
    pub bias: Option<&'a Buffer>,
    pub out_off: usize,
}

/// A planned product.
#[derive(Clone, Copy, Debug)]
pub struct MvLaunch {
    args: MvArgs,
    grid: u32,
    smem: u32,
    /// `matvec_persist`: fewer blocks than tiles, each taking several.
    persist: bool,
    /// Fast mode: the input is first quantized to 8-bit units (`quantize_q8`), and the
    /// product takes integer dot products (`matvec_q8*`).
    q8: Option<QuantLaunch>,
    /// Register kernels (`mvr*`, else the staged `matvec*`): the one of this format (None: of
    /// mixed formats).
    split: bool,
    regs_fmt: Option<Fmt>,
    /// Input rows of the batch (gridDim.y), each multiplied by the same weights.
    rows: u32,
    /// The tensor-core kernels (`mmq_*_n{mma}`): 8-row input tiles a block group; 0: not.
    mma: u32,
    /// Two-level 8-bit inputs (`quantize_q8x2`, `mmq2_*`): the CPU's q8x2.
    x2: bool,
    /// Whether `enqueue` quantizes the input first (false: an earlier launch of the same
    /// input left it in the scratch, `reusing_input`).
    quantize: bool,
    /// The split-K sums also quantize the finished rows for the next product
    /// (`mmq_reduce_q8x2`, `quantizing_next`): norm weight (0: none), eps, two-level scratch.
    then_q8x2: Option<(u64, f32, u64)>,
}

/// Most outputs a row of a product whose split-K sums quantize the next input (`MQR_MAX`).
const MQR_MAX: usize = 4096;

/// `quantize_q8` in matvec.cu: x (f32 [cols], optionally RMS-normed) into cols / 32 units of
/// `Q8_UNIT` bytes.
#[derive(Clone, Copy, Debug)]
pub struct QuantLaunch {
    x: u64,
    norm: u64,
    eps: f32,
    cols: u32,
    out: u64,
    grid: u32,
    /// `x` holds f16 rows (`quantize_q8x2_h`), not f32.
    half: bool,
}

/// Bytes per 32-element unit of a quantized input (`Q8U`).
pub const Q8_UNIT: usize = 48;

/// Bytes of the quantized input of rows of `cols` elements (the fast mode's scratch).
pub fn q8_bytes(cols: usize) -> usize {
    cols / 32 * Q8_UNIT
}

/// Bytes per 32-element unit of a two-level input (`Q8X2U`: a `Q8_UNIT` unit, then the
/// residual's 32 bytes).
pub const Q8X2_UNIT: usize = 80;

/// Bytes of the two-level input of one row of `cols` elements.
pub fn q8x2_bytes(cols: usize) -> usize {
    cols / 32 * Q8X2_UNIT
}

/// The formats the fast mode has an integer kernel for (`FMT_DISPATCH_Q8`): those the CPU's
/// Q8 mode takes 8-bit activations for.
const Q8_FMTS: [Fmt; 7] = [
    Fmt::Q4_0,
    Fmt::Q4_1,
    Fmt::Q5_0,
    Fmt::Q5_1,
    Fmt::Q8_0,
    Fmt::Q4_K,
    Fmt::Q6_K,
];

/// The formats of the two-level tensor-core kernels (`mmq2_*`), on split rows; the first five
/// are those of the 8-bit ones (`mmq_*`) too.
pub const MMQ2_FMTS: [Fmt; 7] = [
    Fmt::Q4_0,
    Fmt::Q4_1,
    Fmt::Q5_0,
    Fmt::Q5_1,
    Fmt::Q8_0,
    Fmt::Q4_KU,
    Fmt::Q6_KU,
];

/// Blocks of the kernel one multiprocessor holds by registers (`__launch_bounds__(MV_T, 6)`).
const MV_BLOCKS_PER_SM: usize = 6;

fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::backend("matvec", format!("{what} = {v} exceeds u32")))
}

fn check_len(buf: &Buffer, need: usize, what: &str) -> Result<()> {
    if buf.bytes() < need {
        return Err(Error::backend(
            "matvec",
            format!("{what} holds {} bytes, needs {need}", buf.bytes()),
        ));
    }
    Ok(())
}

/// Units (32 elements) per thread that a tile aims at (`FERRITE_GPU_MV_UPT`, 1..=64; default
/// 8): more give larger tiles, so fewer steps (each with a fixed cost) per byte streamed.
fn units_per_thread() -> usize {
    static U: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *U.get_or_init(|| crate::step::int("FERRITE_GPU_MV_UPT", 1, 64).unwrap_or(8))
}

/// Blocks per multiprocessor that the tensor-core kernels' K splits aim at
/// (`FERRITE_GPU_MMA_BLOCKS`, 1..=16). Default 2 for the 8-bit kernels (on an H100,
/// 8B-shaped Q4_0 at batch 32, 2, 4 and 8 gave 3,929, 3,875 and 3,900 tok/s) and 3 for the
/// two-level ones (`x2`; SmolLM2-shaped pp512 on an H200, 2, 3 and 4 gave 144,270, 151,064
/// and 147,943 tok/s: the 1,536-wide down product splits in three).
fn mma_blocks_per_sm(x2: bool) -> u32 {
    static B: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    B.get_or_init(|| crate::step::int("FERRITE_GPU_MMA_BLOCKS", 1, 16).map(|v| v as u32))
        .unwrap_or(if x2 { 3 } else { 2 })
}

/// Warps a weight tile of the two-level tensor-core kernels where a block has two 8-row input
/// tiles (`FERRITE_GPU_MMQ_WX`: 1 or 2; default 2, the `mmq2_*_n2_w2` kernels: SmolLM2-shaped
/// pp512 on an H200, 1 and 2 gave 157,832 and 164,172 tok/s).
fn mmq_x2_wx() -> u32 {
    static W: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *W.get_or_init(|| crate::step::int("FERRITE_GPU_MMQ_WX", 1, 2).map_or(2, |v| v as u32))
}

/// Most 8-row input tiles a block of the two-level tensor-core kernels takes
/// (`FERRITE_GPU_MMQ_TILES`: 1, 2, 4 or 8; default 2: SmolLM2-shaped pp512 on an H100,
/// 1, 2, 4 and 8 gave 130,798, 145,390, 140,413 and 114,851 tok/s; more blocks, each
/// restaging its weights, beat fewer blocks with more rows each at these sizes).
fn mmq_x2_tiles() -> u32 {
    static T: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *T.get_or_init(|| match crate::step::int("FERRITE_GPU_MMQ_TILES", 1, 8) {
        Some(n) if n.is_power_of_two() => n as u32,
        _ => 2,
    })
}

/// Rows per tile (GLU: of gate and of up each) for matrices of `rows` rows (GLU: gate rows; a
/// multi-matrix launch: all rows) of `cols` elements, at most `row_bytes` bytes a row, and
/// whether the tiles are packed (whole rows staged in one copy per matrix). About
/// units_per_thread() units per thread, whole rows in a stage where they fit, and at least
/// `sm_count` tiles where the rows allow.
pub fn tile_rows(
    cols: usize,
    row_bytes: usize,
    rows: usize,
    glu: bool,
    sm_count: u32,
) -> (u32, bool) {
    let units = cols / 32;
    let g = units
        .div_ceil(units_per_thread())
        .next_power_of_two()
        .clamp(4, MV_T as usize);
    let m = if glu { 2 } else { 1 };
    let mut per = (MV_T as usize / g).max(m) / m;
    let cap = MV_STAGE / m;
    while per > 1 && per * row_bytes + 16 > cap {
        per /= 2;
    }
    let packed = per * row_bytes + 16 <= cap;
    while per > 1 && rows.div_ceil(per) < sm_count as usize {
        per /= 2;
    }
    (per as u32, packed)
}

pub fn plan(
    sm_count: u32,
    segs: &[Seg<'_>],
    mode: Mode,
    x: &Buffer,
    norm: Option<(&Buffer, f32)>,
    out: &Buffer,
    argmax: Option<&Buffer>,
) -> Result<MvLaunch> {
    let glu = matches!(mode, Mode::GluSilu | Mode::GluGelu);
    let first = segs
        .first()
        .ok_or_else(|| Error::backend("matvec", "no matrices"))?;
    if segs.len() > 3 || (glu && segs.len() != 2) {
        return Err(Error::backend(
            "matvec",
            format!(
                "{} matrices for {mode:?} (1..=3, or gate and up)",
                segs.len()
            ),
        ));
    }
    let cols = first.w.cols;
    for s in segs {
        if s.w.cols != cols {
            return Err(Error::backend(
                "matvec",
                format!(
                    "matrices of one launch share the input: {} vs {cols} columns",
                    s.w.cols
                ),
            ));
        }
        if let Some(b) = s.bias {
            check_len(b, s.w.rows * 4, "bias")?;
        }
        let end = s.out_off + s.w.rows;
        check_len(out, end * 4, "output")?;
    }
    if glu && segs[0].w.rows != segs[1].w.rows {
        return Err(Error::backend(
            "matvec",
            format!("gate has {} rows, up {}", segs[0].w.rows, segs[1].w.rows),
        ));
    }
    check_len(x, cols * 4, "input")?;
    if let Some((w, _)) = norm {
        check_len(w, cols * 4, "norm weight")?;
    }
    let rows = if glu {
        first.w.rows
    } else {
        segs.iter().map(|s| s.w.rows).sum()
    };
    if segs.iter().any(|s| s.w.split) {
        if !segs.iter().all(|s| s.w.split) {
            return Err(Error::backend(
                "matvec",
                "split rows and GGUF rows in one launch (the matrices of a launch take one layout)",
            ));
        }
        if glu && segs[0].w.fmt != segs[1].w.fmt {
            return Err(Error::backend(
                "matvec",
                format!(
                    "gate ({:?}) and up ({:?}) on split rows must share a format",
                    segs[0].w.fmt, segs[1].w.fmt
                ),
            ));
        }
        return plan_split(segs, mode, glu, x, norm, out, argmax);
    }
    let max_rb = segs.iter().map(|s| s.w.row_bytes).max().unwrap_or(0);
    let (rpb, packed) = tile_rows(cols, max_rb, rows, glu, sm_count);
    let nr = if glu { 2 * rpb } else { rpb } as usize;
    let stride = MV_STAGE / nr;
    let granule = if segs.iter().any(|s| s.w.fmt.block_elems() == 256) {
        256
    } else {
        32
    };
    let gb = segs
        .iter()
        .map(|s| granule / s.w.fmt.block_elems() * s.w.fmt.block_bytes())
        .max()
        .unwrap_or(1);
    // Room for the 16-byte aligned cover of a row's chunk: its bytes plus up to 30.
    let per = (stride - 32) / gb;
    if per == 0 {
        return Err(Error::backend(
            "matvec",
            format!("{nr} rows of {gb}-byte granules do not fit the staging buffer"),
        ));
    }
    let chunk = if packed {
        cols
    } else {
        (per * granule).min(cols)
    };
    let units = cols / 32;
    let smem = units * XPAD * 4 + MV_S * MV_STAGE + MV_RED * 4;
    if smem > SMEM_MAX {
        return Err(Error::backend("matvec", format!(
            "rows of {cols} elements need {smem} bytes of shared memory for the input; at most {SMEM_MAX}"
        )));
    }
    let (seg, tiles) = segments(segs, rpb as usize, glu, argmax)?;
    let (grid, persist) = grid_for(sm_count, smem, tiles);
    let args = MvArgs {
        rpb,
        chunk: u32_of(chunk, "chunk")?,
        stride: if packed { 0 } else { stride as u32 },
        ..args_of(seg, tiles, segs.len(), mode, cols, x, norm, out, argmax)?
    };
    Ok(MvLaunch {
        args,
        grid,
        smem: smem as u32,
        persist,
        q8: None,
        split: false,
        regs_fmt: None,
        rows: 1,
        mma: 0,
        x2: false,
        quantize: true,
        then_q8x2: None,
    })
}

/// The kernel's view of `segs` in tiles of `rpb` rows, and the launch's tiles (GLU: gate's);
/// checks that `argmax` (one partial a tile) suits the launch.
fn segments(
    segs: &[Seg<'_>],
    rpb: usize,
    glu: bool,
    argmax: Option<&Buffer>,
) -> Result<([MvSeg; 3], u32)> {
    let mut seg = [MvSeg::default(); 3];
    let mut tiles = 0u32;
    for (i, s) in segs.iter().enumerate() {
        let blocks = u32_of(s.w.rows.div_ceil(rpb), "tiles")?;
        seg[i] = MvSeg {
            w: s.w.buffer().ptr(),
            bias: s.bias.map_or(0, |b| b.ptr()),
            fmt: s.w.kernel_fmt(),
            rows: u32_of(s.w.rows, "rows")?,
            row_bytes: u32_of(s.w.row_bytes, "row bytes")?,
            out_off: u32_of(s.out_off, "output offset")?,
            blocks,
            pad: 0,
        };
        if !glu || i == 0 {
            tiles = tiles
                .checked_add(blocks)
                .ok_or_else(|| Error::backend("matvec", "too many tiles"))?;
        }
    }
    if let Some(a) = argmax {
        if segs.len() != 1 || glu {
            return Err(Error::backend(
                "matvec",
                "argmax partials need a single stored matrix",
            ));
        }
        check_len(a, tiles as usize * 8, "argmax partials")?;
    }
    Ok((seg, tiles))
}

/// The launch arguments both kernels share (rpb, chunk and stride 0: the caller's to set).
#[allow(clippy::too_many_arguments)]
fn args_of(
    seg: [MvSeg; 3],
    tiles: u32,
    nseg: usize,
    mode: Mode,
    cols: usize,
    x: &Buffer,
    norm: Option<(&Buffer, f32)>,
    out: &Buffer,
    argmax: Option<&Buffer>,
) -> Result<MvArgs> {
    Ok(MvArgs {
        seg,
        nseg: nseg as u32,
        mode: mode as u32,
        cols: u32_of(cols, "columns")?,
        rpb: 0,
        chunk: 0,
        stride: 0,
        x: x.ptr(),
        norm: norm.map_or(0, |(b, _)| b.ptr()),
        eps: norm.map_or(0.0, |(_, e)| e),
        tiles,
        out: out.ptr(),
        argmax: argmax.map_or(0, |b| b.ptr()),
        xstride: 0,
        ostride: 0,
        nrows: 1,
        rpg: 1,
    })
}

/// Warps per block of the register kernels (`MVR_W`).
const MVR_W: u32 = 4;
/// Row streams per warp of the register kernels (`MVR_NS`).
const MVR_NS: usize = 2;
/// Input rows per block of the batched register kernels (`MVR_NB`).
const MVR_NB: u32 = 8;

/// `plan` for matrices read by the register kernels (`mvr*`).
#[allow(clippy::too_many_arguments)]
fn plan_split(
    segs: &[Seg<'_>],
    mode: Mode,
    glu: bool,
    x: &Buffer,
    norm: Option<(&Buffer, f32)>,
    out: &Buffer,
    argmax: Option<&Buffer>,
) -> Result<MvLaunch> {
    let cols = segs[0].w.cols;
    let rpb = if glu { MVR_NS / 2 } else { MVR_NS };
    let smem = cols / 32 * XPAD * 4 + MV_RED * 4;
    if smem > SMEM_MAX {
        return Err(Error::backend("matvec", format!(
            "rows of {cols} elements need {smem} bytes of shared memory for the input; at most {SMEM_MAX}"
        )));
    }
    let (seg, tiles) = segments(segs, rpb, glu, argmax)?;
    let args = MvArgs {
        rpb: rpb as u32,
        ..args_of(seg, tiles, segs.len(), mode, cols, x, norm, out, argmax)?
    };
    Ok(MvLaunch {
        args,
        grid: tiles.div_ceil(MVR_W),
        smem: smem as u32,
        persist: false,
        q8: None,
        split: true,
        regs_fmt: segs
            .iter()
            .all(|s| s.w.fmt == segs[0].w.fmt)
            .then_some(segs[0].w.fmt),
        rows: 1,
        mma: 0,
        x2: false,
        quantize: true,
        then_q8x2: None,
    })
}

/// Blocks a row of the input quantization (`quantize_rows`: 8 warps a block, 8 lanes a
/// 32-element unit, so 32 units a block).
fn quantize_blocks(units: usize) -> Result<u32> {
    u32_of(units.div_ceil(32).max(1), "blocks")
}

/// Blocks of a launch of `tiles` tiles, and whether they persist (take several tiles each):
/// when there are more tiles than blocks fit the multiprocessors at once, by registers and by
/// shared memory (228 KiB per SM, 1 KiB reserved per block).
fn grid_for(sm_count: u32, smem: usize, tiles: u32) -> (u32, bool) {
    let per_sm = MV_BLOCKS_PER_SM.min(228 * 1024 / (smem + 1024)).max(1);
    let resident = (per_sm * sm_count.max(1) as usize).min(u32::MAX as usize) as u32;
    if tiles > resident {
        (resident, true)
    } else {
        (tiles, false)
    }
}

impl MvLaunch {
    /// Row tiles (= argmax partials written).
    pub fn tiles(&self) -> u32 {
        self.args.tiles
    }

    /// The same product in the fast mode, if every segment's format is `q8_capable` (else
    /// unchanged): a `quantize_q8` launch puts norm(x) as 8-bit units into `scratch` (at least
    /// `q8_bytes(cols)`), from which `matvec_q8` takes integer dot products.
    pub fn with_q8(self, sm_count: u32, scratch: &Buffer) -> Result<MvLaunch> {
        self.quantized(sm_count, scratch, &Q8_FMTS)
    }

    /// `with_q8` where every segment's format is one of `fmts`.
    fn quantized(mut self, sm_count: u32, scratch: &Buffer, fmts: &[Fmt]) -> Result<MvLaunch> {
        let a = self.args;
        let capable = a.seg[..a.nseg as usize]
            .iter()
            .all(|s| fmts.iter().any(|f| f.code() == s.fmt & 15));
        if !capable || self.q8.is_some() {
            return Ok(self);
        }
        let cols = a.cols as usize;
        check_len(scratch, q8_bytes(cols), "quantized input")?;
        let units = cols / 32;
        let (smem, grid, persist) = if self.split {
            // the q8 units are read from global memory
            (0, self.grid, false)
        } else {
            let smem = units * Q8_UNIT + MV_S * MV_STAGE + MV_RED * 4;
            let (grid, persist) = grid_for(sm_count, smem, a.tiles);
            (smem, grid, persist)
        };
        self.q8 = Some(QuantLaunch {
            x: a.x,
            norm: a.norm,
            eps: a.eps,
            cols: a.cols,
            out: scratch.ptr(),
            grid: quantize_blocks(units)?,
            half: false,
        });
        check_len(
            scratch,
            q8_bytes(cols) * self.rows as usize,
            "quantized input",
        )?;
        if self.rows > 1 && a.xstride as usize != cols * 4 {
            return Err(Error::backend("matvec", format!(
                "the fast mode quantizes packed input rows ({} bytes apart), not rows {} bytes apart",
                cols * 4,
                a.xstride
            )));
        }
        self.args.x = scratch.ptr();
        self.args.xstride = u32_of(q8_bytes(cols), "quantized row stride")?;
        if self.split && self.rows > 1 {
            // the batched register kernels: each weight item once for MVR_NB rows
            self.args.rpg = MVR_NB;
        }
        self.args.norm = 0;
        self.smem = smem as u32;
        self.grid = grid;
        self.persist = persist;
        Ok(self)
    }

    /// The same fast-mode product of a batch on int8 tensor cores (`mmq_*` in matvec.cu), where
    /// it applies: more than one input row, split rows of one 32-element format (Q4_0, Q4_1,
    /// Q5_0, Q5_1, Q8_0), a device of compute capability 8.0 or later; else unchanged. Call
    /// after `with_q8`. Its sums take another order than the register kernels': a row's
    /// result differs from its one-row launch's in the last bits.
    ///
    /// Where the tiles give fewer blocks than `FERRITE_GPU_MMA_BLOCKS` (2; 3 for the
    /// two-level kernels) per multiprocessor, the units are split among up to
    /// `MQ_MAX_SPLITS` blocks a tile (split K) whose partial sums go to `part` (f32; a split
    /// count whose partials do not fit is not taken) and are added by `mmq_reduce`.
    pub fn with_mma(
        self,
        cc: (u32, u32),
        sm_count: u32,
        part: Option<&Buffer>,
    ) -> Result<MvLaunch> {
        self.with_mma_tiles(cc, sm_count, part, 8, &MMQ2_FMTS[..5])
    }

    /// `with_mma` with at most `max_nt` 8-row input tiles a block (1, 2, 4 or 8), for split
    /// matrices of `fmts` (those the kernel family has: the 8-bit `mmq_*` lack the K-quant
    /// unit formats). A two-level launch (`x2`, set first) takes that family's split target
    /// and shared memory, and with two input tiles and more than 64 rows `mmq_x2_wx()` warps a
    /// weight tile (the split target counts blocks of `MQ_W` warps).
    fn with_mma_tiles(
        mut self,
        cc: (u32, u32),
        sm_count: u32,
        part: Option<&Buffer>,
        max_nt: u32,
        fmts: &[Fmt],
    ) -> Result<MvLaunch> {
        let x2 = self.x2;
        let a = &mut self.args;
        let glu = a.mode >= Mode::GluSilu as u32;
        let fmt_ok = a.seg[..a.nseg as usize]
            .iter()
            .all(|s| s.fmt & 16 != 0 && fmts.iter().any(|f| f.code() == s.fmt & 15));
        if self.q8.is_none()
            || !self.split
            || self.rows < 2
            || cc.0 < 8
            || !fmt_ok
            || self.regs_fmt.is_none()
            || self.mma != 0
        {
            return Ok(self);
        }
        let rpb = if glu { MQ_ROWS / 2 } else { MQ_ROWS };
        let mut tiles = 0u32;
        for (i, s) in a.seg[..a.nseg as usize].iter_mut().enumerate() {
            s.blocks = s.rows.div_ceil(rpb);
            if !glu || i == 0 {
                tiles = tiles
                    .checked_add(s.blocks)
                    .ok_or_else(|| Error::backend("matvec", "too many tiles"))?;
            }
        }
        let nt = self
            .rows
            .min(MQ_MAX_ROWS)
            .div_ceil(8)
            .next_power_of_two()
            .min(max_nt);
        // warps a weight tile, each on its own 8 nt input rows (64 rows or fewer: fewer block
        // groups with two warps a tile than with one, and slower; SmolLM2-shaped on an H200,
        // one warp against two: pp32 20,268 / 19,299, pp64 35,146 / 34,454, pp128 60,012 /
        // 63,334 tok/s)
        let wx = if x2 && nt == 2 && self.rows > 64 {
            mmq_x2_wx()
        } else {
            1
        };
        let blocks = tiles.div_ceil(MQ_W) * self.rows.div_ceil(8 * nt * wx);
        // output rows a split writes per input row: segments back to back (GLU: gate, up)
        let prow: u32 = a.seg[..a.nseg as usize].iter().map(|s| s.rows).sum();
        let stages = (a.cols / 32).div_ceil(MQ_KU);
        // the split target counts blocks of MQ_W warps
        let mut ks = (mma_blocks_per_sm(x2) * sm_count)
            .div_ceil(blocks.max(1) * wx)
            .clamp(1, MQ_MAX_SPLITS)
            .min((stages / 2).max(1));
        let fits = |k: u32| {
            part.is_some_and(|b| k as usize * self.rows as usize * prow as usize * 4 <= b.bytes())
        };
        while ks > 1 && !fits(ks) {
            ks -= 1;
        }
        a.rpb = rpb;
        a.tiles = tiles;
        a.rpg = 8 * nt * wx;
        a.chunk = ks;
        if ks > 1 {
            a.stride = prow;
            a.argmax = part.map_or(0, |b| b.ptr());
        }
        self.mma = nt;
        self.grid = tiles.div_ceil(MQ_W) * ks;
        self.smem = mmq_smem(self.regs_fmt, nt * wx, x2);
        Ok(self)
    }

    /// The same product of a batch (`with_rows`, more than one row) on the int8 tensor cores
    /// with two-level inputs: `quantize_q8x2` puts norm(x) into `scratch` (at least
    /// `q8x2_bytes(cols)` a row) as the CPU's q8x2 (8 bits plus an 8-bit residual, ~16 bits),
    /// and `mmq2_*` sums `256 w.hi + w.lo` per unit in integers: the CPU's default precision,
    /// without dequantized weights. None where `with_mma` would not apply (formats, layout,
    /// compute capability). Split-K partials as `with_mma`.
    pub fn with_q8x2_mma(
        self,
        cc: (u32, u32),
        sm_count: u32,
        scratch: &Buffer,
        part: Option<&Buffer>,
    ) -> Result<Option<MvLaunch>> {
        if self.q8.is_some() {
            return Err(Error::backend(
                "matvec",
                "with_q8x2_mma on a launch already quantized",
            ));
        }
        let cols = self.args.cols as usize;
        let rows = self.rows as usize;
        check_len(scratch, q8x2_bytes(cols) * rows, "two-level input")?;
        let mut l = self.quantized(sm_count, scratch, &MMQ2_FMTS)?;
        if l.q8.is_none() {
            return Ok(None);
        }
        // two-level inputs: their kernels, split target and shared memory
        l.x2 = true;
        l = l.with_mma_tiles(cc, sm_count, part, mmq_x2_tiles(), &MMQ2_FMTS)?;
        if l.mma == 0 {
            return Ok(None);
        }
        l.args.xstride = u32_of(q8x2_bytes(cols), "two-level row stride")?;
        Ok(Some(l))
    }

    /// The same launch without its quantization: an earlier launch of the same input, rows
    /// and precision (its `enqueue` first, on the same stream) left the units in the scratch.
    pub fn reusing_input(mut self) -> MvLaunch {
        self.quantize = false;
        self
    }

    /// The same two-level product quantizing its input from the f16 rows at `x16` (packed
    /// rows of its columns: the attention's output) instead of f32 rows holding the same
    /// values: the same bytes. None where that does not apply: not a two-level product that
    /// quantizes its input, or one that RMS-norms it.
    pub fn quantizing_half_input(mut self, x16: u64) -> Option<MvLaunch> {
        let q = self.q8.as_mut().filter(|q| q.norm == 0)?;
        if !self.x2 || !self.quantize {
            return None;
        }
        q.x = x16;
        q.half = true;
        Some(self)
    }

    /// The same two-level tensor-core product with its split-K sums (`mmq_reduce_q8x2`) also
    /// RMS-norming (by `norm`, if given) and quantizing each finished output row into `q8`
    /// (`q8x2_bytes(outputs)` a row), as `quantize_q8x2` would for a next product that takes
    /// these rows as its input (which then runs `reusing_input`): the same bytes, one launch
    /// fewer. A GLU launch then writes no f32 outputs. None where that does not apply: no
    /// split-K sums, neither one segment of a plain mode nor GLU, an output offset, a plain
    /// launch whose row stride is not its outputs, outputs other than `next_cols`, more than
    /// `MQR_MAX` or not a multiple of 32, outputs, partials, bias or norm not 16-byte aligned.
    pub fn quantizing_next(
        mut self,
        next_cols: usize,
        norm: Option<(&Buffer, f32)>,
        q8: &Buffer,
    ) -> Result<Option<MvLaunch>> {
        let a = &self.args;
        let outs = a.seg[0].rows as usize;
        let glu = a.mode >= Mode::GluSilu as u32;
        let plain = a.mode == Mode::Store as u32 || a.mode == Mode::Add as u32;
        let shape = if glu {
            a.nseg == 2 && a.seg[1].out_off == 0
        } else {
            plain && a.nseg == 1 && a.stride as usize == outs && a.ostride as usize == 4 * outs
        };
        let biases = a.seg[0].bias | if glu { a.seg[1].bias } else { 0 };
        if self.mma == 0
            || !self.x2
            || a.chunk <= 1
            || !shape
            || a.seg[0].out_off != 0
            || outs != next_cols
            || outs > MQR_MAX
            || !outs.is_multiple_of(32)
            || !(a.out | a.argmax | biases | norm.map_or(0, |(w, _)| w.ptr())).is_multiple_of(16)
        {
            return Ok(None);
        }
        check_len(q8, q8x2_bytes(outs) * self.rows as usize, "two-level input")?;
        if let Some((w, _)) = norm {
            check_len(w, outs * 4, "norm weight")?;
        }
        self.then_q8x2 = Some((
            norm.map_or(0, |(w, _)| w.ptr()),
            norm.map_or(0.0, |n| n.1),
            q8.ptr(),
        ));
        Ok(Some(self))
    }

    /// The same product for `rows` input rows: row i reads its input `xstride` bytes after
    /// row i - 1's (f32 rows; in the fast mode the quantized rows follow each other) and
    /// writes its outputs `ostride` bytes after row i - 1's. The caller sized the buffers for
    /// `rows` rows. Call before `with_q8`.
    pub fn with_rows(mut self, rows: usize, xstride: usize, ostride: usize) -> Result<MvLaunch> {
        if self.q8.is_some() {
            return Err(Error::backend(
                "matvec",
                "with_rows must come before with_q8",
            ));
        }
        if self.args.argmax != 0 && rows > 1 {
            return Err(Error::backend("matvec", "argmax partials are for one row"));
        }
        self.rows = u32_of(rows.max(1), "rows")?;
        self.args.nrows = self.rows;
        self.args.xstride = u32_of(xstride, "input row stride")?;
        self.args.ostride = u32_of(ostride, "output row stride")?;
        Ok(self)
    }

    /// Whether `enqueue` quantizes the input before the product.
    pub fn quantizes(&self) -> bool {
        self.q8.is_some() && self.quantize
    }

    /// Warps a weight tile of the tensor-core kernels (`mmq2_*_n2_w2`: 2), each on its own 8
    /// `mma` input rows of the block group's `rpg`.
    fn mma_wx(&self) -> u32 {
        self.args.rpg / (8 * self.mma)
    }

    /// Whether the product runs on the int8 tensor-core kernels.
    pub fn is_mma(&self) -> bool {
        self.mma != 0
    }

    /// Whether the product runs in the fast mode (8-bit activations).
    pub fn is_q8(&self) -> bool {
        self.q8.is_some()
    }

    pub fn enqueue(&self, dev: &CudaDevice) -> Result<()> {
        if let Some(q) = self.q8.as_ref().filter(|_| self.quantize) {
            let cfg = LaunchConfig::new((q.grid, self.rows, 1), (256, 1, 1), 0);
            let args = KernelArgs::new()
                .arg(q.x)
                .arg(q.norm)
                .arg(q.eps)
                .arg(q.cols)
                .arg(q.out);
            let name = match (self.x2, q.half) {
                (true, true) => "quantize_q8x2_h",
                (true, false) => "quantize_q8x2",
                _ => "quantize_q8",
            };
            crate::step::launch(dev, "matvec", &SOURCE, name, cfg, args)?;
        }
        let groups = self.args.nrows.div_ceil(self.args.rpg);
        let grid = self
            .grid
            .checked_mul(groups)
            .ok_or_else(|| Error::backend("matvec", "too many blocks"))?;
        let threads = if self.mma != 0 {
            MQ_W * 32 * self.mma_wx()
        } else {
            MV_T
        };
        let cfg = LaunchConfig::new((grid, 1, 1), (threads, 1, 1), self.smem);
        let q8 = self.q8.is_some();
        let name = match (self.split, q8, self.persist) {
            _ if self.mma != 0 => mmq_kernel(self.regs_fmt, self.mma, self.x2, self.mma_wx())?,
            (true, _, _) => mvr_kernel(self.regs_fmt, q8, self.args.rpg > 1),
            (false, false, false) => "matvec",
            (false, false, true) => "matvec_persist",
            (false, true, false) => "matvec_q8",
            (false, true, true) => "matvec_q8_persist",
        };
        crate::step::launch(
            dev,
            "matvec",
            &SOURCE,
            name,
            cfg,
            KernelArgs::new().arg(self.args),
        )?;
        if let Some((norm, eps, q)) = self
            .then_q8x2
            .filter(|_| self.mma != 0 && self.args.chunk > 1)
        {
            // 8 lanes a 32-element unit of the outputs (seg[0]'s rows: `quantizing_next` set
            // this only where a plain launch's row stride is its outputs)
            let threads = (self.args.seg[0].rows / 32).div_ceil(4) * 32;
            let cfg = LaunchConfig::new((self.rows, 1, 1), (threads, 1, 1), 0);
            let args = KernelArgs::new().arg(self.args).arg(norm).arg(eps).arg(q);
            return crate::step::launch(dev, "matvec", &SOURCE, "mmq_reduce_q8x2", cfg, args);
        }
        if self.mma != 0 && self.args.chunk > 1 {
            let a = &self.args;
            let outs = if a.mode >= Mode::GluSilu as u32 {
                a.seg[0].rows
            } else {
                a.stride
            };
            let n = (a.nrows as u64 * outs as u64).div_ceil(256);
            let cfg = LaunchConfig::new((u32_of(n as usize, "blocks")?, 1, 1), (256, 1, 1), 0);
            crate::step::launch(
                dev,
                "matvec",
                &SOURCE,
                "mmq_reduce",
                cfg,
                KernelArgs::new().arg(self.args),
            )?;
        }
        Ok(())
    }
}

/// Warps per block of the tensor-core kernels (`MQ_W`), weight rows per warp tile, and input
/// rows per block group at most (8 per n-tile, `NT` <= 8).
const MQ_W: u32 = 4;
const MQ_ROWS: u32 = 32;
const MQ_MAX_ROWS: u32 = 64;
/// Units a stage of the tensor-core kernels (`MQ_KU`), and most K splits of a tile.
const MQ_KU: u32 = 4;
const MQ_MAX_SPLITS: u32 = 8;

/// Dynamic shared memory of the tensor-core kernels (`mmq_run`): two stages of the inputs
/// (8 nt rows of `MQ_KU` units, nt counting the input tiles of all the block's warps, padded
/// by 16 bytes: `Q8_UNIT`, or `Q8X2_UNIT` with `x2`) and of each of the `MQ_W` weight tiles'
/// 32 rows (quants padded by 16 bytes, d (and m) fields, qh words).
fn mmq_smem(fmt: Option<Fmt>, nt: u32, x2: bool) -> u32 {
    let (q, h, qh) = match fmt {
        Some(Fmt::Q8_0) => (32, 2, 0),
        Some(Fmt::Q4_1) => (16, 4, 0),
        Some(Fmt::Q5_0) => (16, 2, 4),
        Some(Fmt::Q5_1) => (16, 4, 4),
        Some(Fmt::Q4_KU) => (16, 8, 0),
        Some(Fmt::Q6_KU) => (32, 8, 0),
        _ => (16, 2, 0),
    };
    let unit = if x2 { Q8X2_UNIT } else { Q8_UNIT } as u32;
    let xb = 8 * nt * (MQ_KU * unit + 16);
    let wb = 32 * (MQ_KU * q + 16 + MQ_KU * h + MQ_KU * qh);
    2 * xb + 2 * MQ_W * wb
}

/// The tensor-core kernel for split matrices of `fmt` and `nt` 8-row input tiles a block
/// (`wx` warps a weight tile: 2 only for two-level inputs and `nt` = 2).
fn mmq_kernel(fmt: Option<Fmt>, nt: u32, x2: bool, wx: u32) -> Result<&'static str> {
    const W2: [&str; 7] = [
        "mmq2_q4_0_n2_w2",
        "mmq2_q4_1_n2_w2",
        "mmq2_q5_0_n2_w2",
        "mmq2_q5_1_n2_w2",
        "mmq2_q8_0_n2_w2",
        "mmq2_q4_ku_n2_w2",
        "mmq2_q6_ku_n2_w2",
    ];
    const NAMES: [[[&str; 4]; 7]; 2] = [
        [
            ["mmq_q4_0_n1", "mmq_q4_0_n2", "mmq_q4_0_n4", "mmq_q4_0_n8"],
            ["mmq_q4_1_n1", "mmq_q4_1_n2", "mmq_q4_1_n4", "mmq_q4_1_n8"],
            ["mmq_q5_0_n1", "mmq_q5_0_n2", "mmq_q5_0_n4", "mmq_q5_0_n8"],
            ["mmq_q5_1_n1", "mmq_q5_1_n2", "mmq_q5_1_n4", "mmq_q5_1_n8"],
            ["mmq_q8_0_n1", "mmq_q8_0_n2", "mmq_q8_0_n4", "mmq_q8_0_n8"],
            ["", "", "", ""],
            ["", "", "", ""],
        ],
        [
            [
                "mmq2_q4_0_n1",
                "mmq2_q4_0_n2",
                "mmq2_q4_0_n4",
                "mmq2_q4_0_n8",
            ],
            [
                "mmq2_q4_1_n1",
                "mmq2_q4_1_n2",
                "mmq2_q4_1_n4",
                "mmq2_q4_1_n8",
            ],
            [
                "mmq2_q5_0_n1",
                "mmq2_q5_0_n2",
                "mmq2_q5_0_n4",
                "mmq2_q5_0_n8",
            ],
            [
                "mmq2_q5_1_n1",
                "mmq2_q5_1_n2",
                "mmq2_q5_1_n4",
                "mmq2_q5_1_n8",
            ],
            [
                "mmq2_q8_0_n1",
                "mmq2_q8_0_n2",
                "mmq2_q8_0_n4",
                "mmq2_q8_0_n8",
            ],
            [
                "mmq2_q4_ku_n1",
                "mmq2_q4_ku_n2",
                "mmq2_q4_ku_n4",
                "mmq2_q4_ku_n8",
            ],
            [
                "mmq2_q6_ku_n1",
                "mmq2_q6_ku_n2",
                "mmq2_q6_ku_n4",
                "mmq2_q6_ku_n8",
            ],
        ],
    ];
    let f = match fmt {
        Some(Fmt::Q4_0) => 0,
        Some(Fmt::Q4_1) => 1,
        Some(Fmt::Q5_0) => 2,
        Some(Fmt::Q5_1) => 3,
        Some(Fmt::Q8_0) => 4,
        Some(Fmt::Q4_KU) => 5,
        Some(Fmt::Q6_KU) => 6,
        _ => usize::MAX,
    };
    let n = match nt {
        1 => 0,
        2 => 1,
        4 => 2,
        8 => 3,
        _ => usize::MAX,
    };
    let name = match wx {
        1 => NAMES[x2 as usize].get(f).and_then(|r| r.get(n)),
        2 if x2 && nt == 2 => W2.get(f),
        _ => None,
    };
    name.copied().filter(|s| !s.is_empty()).ok_or_else(|| {
        Error::backend(
            "matvec",
            format!(
                "no tensor-core kernel for {fmt:?} x {nt} tiles x {wx} warps a tile{}",
                if x2 { " (two-level inputs)" } else { "" }
            ),
        )
    })
}

/// The register kernel for matrices of `fmt` (None: of mixed formats), f32 or q8 input,
/// one row or `MVR_NB` rows per block (`batched`, q8 only).
fn mvr_kernel(fmt: Option<Fmt>, q8: bool, batched: bool) -> &'static str {
    let (f32_name, q8_name, batched_name) = match fmt {
        Some(Fmt::Q4_0) => ("mvr_q4_0", "mvr_q8_q4_0", "mvrb_q8_q4_0"),
        Some(Fmt::Q4_1) => ("mvr_q4_1", "mvr_q8_q4_1", "mvrb_q8_q4_1"),
        Some(Fmt::Q5_0) => ("mvr_q5_0", "mvr_q8_q5_0", "mvrb_q8_q5_0"),
        Some(Fmt::Q5_1) => ("mvr_q5_1", "mvr_q8_q5_1", "mvrb_q8_q5_1"),
        Some(Fmt::Q8_0) => ("mvr_q8_0", "mvr_q8_q8_0", "mvrb_q8_q8_0"),
        Some(Fmt::Q4_K) => ("mvr_q4_k", "mvr_q8_q4_k", "mvrb_q8_q4_k"),
        Some(Fmt::Q6_K) => ("mvr_q6_k", "mvr_q8_q6_k", "mvrb_q8_q6_k"),
        _ => ("mvr_mixed", "mvr_q8_mixed", "mvrb_q8_mixed"),
    };
    match (q8, batched) {
        (true, true) => batched_name,
        (true, false) => q8_name,
        (false, _) => f32_name,
    }
}

/// Most tiles of the product of `rows` rows (one matrix, Store/Add modes): room for its argmax
/// partials.
pub fn blocks_for(rows: usize) -> usize {
    rows
}

/// `EmbedArgs` in matvec.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EmbedArgs {
    w: u64,
    params: u64,
    out: u64,
    fmt: u32,
    row_bytes: u32,
    cols: u32,
    rows: u32,
    scale: f32,
    pad: u32,
    /// u32 [rows]: the previous step's picks, read for rows whose token is
    /// `step::PREV_TOKEN`; or 0.
    prev: u64,
}

#[derive(Clone, Copy, Debug)]
pub struct EmbedLaunch {
    args: EmbedArgs,
    grid: u32,
    /// Rows of a batch: tokens `params[0..rows]`, outputs `[rows][cols]`.
    rows: u32,
}

/// out (f32 [cols]) = row `params[0]` of `w` times `scale`.
pub fn plan_embed(
    w: &GpuMatrix,
    params: &Buffer,
    out: &Buffer,
    scale: f32,
    prev: Option<&Buffer>,
) -> Result<EmbedLaunch> {
    if w.split {
        return Err(Error::backend(
            "embed",
            "the embedding matrix must be in GGUF layout, not split rows",
        ));
    }
    check_len(out, w.cols * 4, "embedding output")?;
    check_len(params, 8, "parameters")?;
    Ok(EmbedLaunch {
        args: EmbedArgs {
            w: w.buffer().ptr(),
            params: params.ptr(),
            out: out.ptr(),
            fmt: w.kernel_fmt(),
            row_bytes: u32_of(w.row_bytes, "row bytes")?,
            cols: u32_of(w.cols, "columns")?,
            rows: u32_of(w.rows, "rows")?,
            scale,
            pad: 0,
            prev: prev.map_or(0, |b| b.ptr()),
        },
        grid: u32_of((w.cols / 32).div_ceil(128).max(1), "blocks")?,
        rows: 1,
    })
}

impl EmbedLaunch {
    /// The embedding of `rows` tokens (`params`: u32 [rows], output f32 [rows][cols]; sized by
    /// the caller).
    pub fn with_rows(mut self, rows: u32) -> EmbedLaunch {
        self.rows = rows.max(1);
        self
    }

    pub fn enqueue(&self, dev: &CudaDevice) -> Result<()> {
        let cfg = LaunchConfig::new((self.grid, self.rows, 1), (128, 1, 1), 0);
        crate::step::launch(
            dev,
            "embed",
            &SOURCE,
            "embed",
            cfg,
            KernelArgs::new().arg(self.args),
        )
    }
}

/// The final argmax over `n` partials (ArgPart) into a u32 at `out` (byte offset `off`).
#[derive(Clone, Copy, Debug)]
pub struct ArgmaxLaunch {
    part: u64,
    n: u32,
    out: u64,
}

pub fn plan_argmax(part: &Buffer, n: u32, out: &Buffer, off: usize) -> Result<ArgmaxLaunch> {
    check_len(part, n as usize * 8, "argmax partials")?;
    check_len(out, off + 4, "argmax output")?;
    Ok(ArgmaxLaunch {
        part: part.ptr(),
        n,
        out: out.ptr() + off as u64,
    })
}

impl ArgmaxLaunch {
    pub fn enqueue(&self, dev: &CudaDevice) -> Result<()> {
        let cfg = LaunchConfig::new((1, 1, 1), (1024, 1, 1), 0);
        let args = KernelArgs::new().arg(self.part).arg(self.n).arg(self.out);
        crate::step::launch(dev, "argmax", &SOURCE, "argmax_final", cfg, args)
    }
}
