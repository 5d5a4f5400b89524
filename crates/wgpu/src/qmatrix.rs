//! Quantized matrices on a wgpu device ([`WgpuQMat`], a `QTensor`'s storage here) and the
//! WGSL modules that read them: `quant.wgsl` (each GGUF block format's readers), `matvec.wgsl`
//! (the products, and the embedding lookup) and `quantize_q8.wgsl` (the 8-bit activations of
//! the products of the formats that have integer kernels).
//!
//! A matrix is uploaded in its GGUF blocks (read by the shaders as `array<u32>`), split by
//! rows over as many buffers ([`QChunk`]) as the adapter's largest storage binding needs. The
//! 32-value formats whose blocks are not 4-byte aligned are regrouped on upload (`regroup`).
//! The products' modules are generated per format and tuning (`matvec_source`): each is
//! `quant.wgsl` and `matvec.wgsl` under a few prepended constants. `qmatmul.rs` runs them as
//! the backend's `qmatmul`; the LLM engine's wgpu kernel set records them in its own steps.

use std::any::Any;
use std::borrow::Cow;
use std::sync::Arc;

use ferrite_core::quant::{ActFormat, QBytes, QStorage, QTensor, QType};
use ferrite_core::{Error, Result};

use crate::WgpuDevice;

/// The block readers, one `head_*` / `pair_*` (and `ipair_*`) per format.
pub const QUANT: &str = include_str!("quant.wgsl");
/// The products and the embedding lookup, over `quant.wgsl`'s readers.
pub const MATVEC: &str = include_str!("matvec.wgsl");
/// `quantize_q8`: a product's input as 8-bit blocks (standalone).
pub const QUANTIZE_Q8: &str = include_str!("quantize_q8.wgsl");

/// Activation rows a product workgroup takes (`ROWS` of `matvec.wgsl`): 1 for one row, 4 for
/// up to 7 rows, else 8 (each weight unit is dequantized once per ROWS rows); see
/// [`rows_variant`].
pub const ROW_VARIANTS: [u32; 3] = [1, 4, 8];
/// Output rows per product workgroup (`OUTS` of `matvec.wgsl`) at one output row a subgroup.
pub const MATVEC_OUTS: usize = 4;

/// The `ROWS` variant a product over `rows` activation rows takes.
pub fn rows_variant(rows: usize) -> u32 {
    match rows {
        0 | 1 => 1,
        2..8 => 4,
        _ => 8,
    }
}

/// How a weight type is read: its `head_*` / `pair_*` functions (`quant.wgsl`), bytes of a
/// block, 32-value units per block and values per block (float types as blocks of 32 values).
/// `grouped`: eight GGUF blocks regrouped on upload (`regroup`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Format {
    pub ty: QType,
    pub name: &'static str,
    pub block_bytes: usize,
    pub units: usize,
    pub values: usize,
    pub grouped: bool,
}

/// Every weight type the products read.
pub const WEIGHT_TYPES: [QType; 13] = {
    use QType::*;
    [
        F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
    ]
};

fn format_of(ty: QType) -> Option<Format> {
    use QType::*;
    let name = match ty {
        F32 => "f32",
        F16 => "f16",
        BF16 => "bf16",
        Q4_0 => "q4_0",
        Q4_1 => "q4_1",
        Q5_0 => "q5_0",
        Q5_1 => "q5_1",
        Q8_0 => "q8_0",
        Q2_K => "q2_k",
        Q3_K => "q3_k",
        Q4_K => "q4_k",
        Q5_K => "q5_k",
        Q6_K => "q6_k",
        _ => return None,
    };
    let values = ty.block_size().max(32);
    Some(Format {
        ty,
        name,
        block_bytes: ty.type_size() * values / ty.block_size(),
        units: values / 32,
        values,
        grouped: false,
    })
}

/// The 32-value formats whose blocks are not 4-byte aligned and open with an f16 scale
/// (Q4_0 18 bytes, Q5_0 22, Q8_0 34): rows of a whole number of 256 values are uploaded in
/// groups of eight blocks, their eight scales first (16 bytes) and then the rest of each block
/// in order (`regroup`). Every field is then read by aligned word loads, where the GGUF
/// layout needs two loads and a shift for most of them; the bytes and the values, and the
/// order the products add them in, are the same.
fn grouped_name(ty: QType) -> Option<&'static str> {
    match ty {
        QType::Q4_0 => Some("q4_0x8"),
        QType::Q5_0 => Some("q5_0x8"),
        QType::Q8_0 => Some("q8_0x8"),
        _ => None,
    }
}

/// The regrouped format of `ty`, if it has one.
fn grouped_format(ty: QType) -> Option<Format> {
    let (name, f) = (grouped_name(ty)?, format_of(ty)?);
    Some(Format {
        ty,
        name,
        block_bytes: 8 * f.block_bytes,
        units: 8,
        values: 8 * f.values,
        grouped: true,
    })
}

/// The format a matrix of `ty` with rows of `cols` values is uploaded in.
pub fn format_for(ty: QType, cols: usize) -> Option<Format> {
    match grouped_format(ty) {
        Some(g) if cols.is_multiple_of(g.values) => Some(g),
        _ => format_of(ty),
    }
}

/// Every format the products read: each weight type's, and the regrouped ones.
pub fn formats() -> Vec<Format> {
    let types = WEIGHT_TYPES.iter();
    types
        .clone()
        .filter_map(|&ty| format_of(ty))
        .chain(types.filter_map(|&ty| grouped_format(ty)))
        .collect()
}

/// `data` (whole rows of `f`'s GGUF type) in `f`'s upload layout: as it is, or (`f.grouped`)
/// each group of eight blocks as their eight 2-byte scales, then the other bytes of each block.
fn regroup<'d>(f: &Format, data: &'d [u8]) -> Cow<'d, [u8]> {
    if !f.grouped {
        return Cow::Borrowed(data);
    }
    let block = f.block_bytes / 8;
    let mut out = Vec::with_capacity(data.len());
    for g in data.chunks_exact(f.block_bytes) {
        for b in g.chunks_exact(block) {
            out.extend_from_slice(&b[..2]);
        }
        for b in g.chunks_exact(block) {
            out.extend_from_slice(&b[2..]);
        }
    }
    Cow::Owned(out)
}

/// Output rows per product subgroup (`OPW` of `matvec.wgsl`) for a chunk of `n` output rows
/// and a product of `rows` rows, with 8-bit activations (`q8`) or not: for single-row
/// products of tall matrices 2 (each activation load serves two output rows), and 4 with 8-bit
/// activations from 8,192 rows (8B-shaped decode +3% on an H200; from 4,096 rows -3%); else
/// 1 (a short matrix needs its rows spread over enough workgroups to keep a large GPU busy;
/// SmolLM2's 576-row products get 144).
pub fn outs_per_subgroup(n: usize, rows: u32, q8: bool) -> u32 {
    match (rows, n) {
        (1, 8192..) if q8 => 4,
        (1, 2048..) => 2,
        _ => 1,
    }
}

/// Whether `f` has 8-bit products (`ipair_*` of `quant.wgsl`): the weight types the CPU's
/// and CUDA's q8 mode multiply with 8-bit activations; the others keep f32 activations there
/// too.
pub fn has_q8(f: &Format) -> bool {
    ActFormat::for_weight(f.ty) == ActFormat::Q8
}

/// Words of one row of `cols` values quantized by `quantize_q8`: the values as four signed
/// bytes a word, a block scale per 32 values, and (a normed input) a sum of squares per 32
/// values.
pub fn q8_row_words(cols: usize) -> usize {
    cols / 4 + 2 * (cols / 32)
}

/// `matvec.wgsl`'s flags (parameter 6): add the sums to the output instead of storing them.
pub const FLAG_ADD: u32 = 1;
/// Add the bias (binding 4).
pub const FLAG_BIAS: u32 = 2;
/// Output rows 2i, 2i + 1 are gate and up of unit i: store the gated unit (SiLU).
pub const FLAG_GLU: u32 = 4;
/// With `FLAG_GLU`: tanh-GELU instead of SiLU.
pub const FLAG_GELU: u32 = 8;

/// A size as a parameter word of `op`'s dispatch.
pub(crate) fn word(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::backend(op, format!("{what} = {v} exceeds u32")))
}

/// One product `out[:, col0 + ..] (+)= x @ W^T` over `rows` activation rows (`x_stride`
/// floats apart; `out` rows `out_stride` apart), as `matvec.wgsl` takes it.
pub struct Matvec {
    pub rows: usize,
    pub x_stride: usize,
    pub out_stride: usize,
    pub col0: usize,
    /// `FLAG_*`.
    pub flags: u32,
    /// The folded RMS norm's epsilon (`NORM` modules).
    pub eps: f32,
}

impl Matvec {
    /// The parameter words and workgroups of the dispatch over chunk `ch` of `m` by the module
    /// of `outs_per_subgroup` `opw` (and `rows_variant(self.rows)` rows a workgroup).
    pub fn dispatch(&self, m: &WgpuQMat, ch: &QChunk, opw: u32) -> Result<([u32; 10], usize)> {
        const OP: &str = "matvec";
        let params = [
            word(OP, "rows", self.rows)?,
            word(OP, "cols", m.cols)?,
            word(OP, "rows of a chunk", ch.rows)?,
            word(OP, "first row of a chunk", ch.row0)?,
            word(OP, "output stride", self.out_stride)?,
            word(OP, "row bytes", m.row_bytes)?,
            self.flags,
            word(OP, "input stride", self.x_stride)?,
            word(OP, "output column", self.col0)?,
            self.eps.to_bits(),
        ];
        let row_groups = self.rows.div_ceil(rows_variant(self.rows) as usize);
        let groups = ch.rows.div_ceil(MATVEC_OUTS * opw as usize) * row_groups;
        Ok((params, groups))
    }
}

/// The parameter words and workgroups of `embed` (`matvec.wgsl`) over chunk `ch` of `m`: row
/// r of `y` (`[rows][m.cols]`) is the row of token `sdata[tokens_at + r]` times `scale`, where
/// that row lies in the chunk (a token of `0xffffffff` is the previous step's pick `prev[r]`).
pub fn embed_dispatch(
    m: &WgpuQMat,
    ch: &QChunk,
    rows: usize,
    tokens_at: usize,
    scale: f32,
) -> Result<([u32; 7], usize)> {
    const OP: &str = "embed";
    let params = [
        word(OP, "rows", rows)?,
        word(OP, "cols", m.cols)?,
        word(OP, "rows of a chunk", ch.rows)?,
        word(OP, "first row of a chunk", ch.row0)?,
        word(OP, "row bytes", m.row_bytes)?,
        word(OP, "token offset", tokens_at)?,
        scale.to_bits(),
    ];
    // A thread per 32-value unit, 64 a workgroup.
    Ok((params, (rows * (m.cols / 32)).div_ceil(64)))
}

/// The parameter words and workgroups of `quantize_q8` over `rows` rows of `cols` values,
/// `x_stride` floats apart, times the norm weights where `norm`.
pub fn quantize_q8_dispatch(
    cols: usize,
    rows: usize,
    norm: bool,
    x_stride: usize,
) -> Result<([u32; 5], usize)> {
    const OP: &str = "quantize_q8";
    // QB of quantize_q8.wgsl: blocks of 32 values a workgroup.
    let per_row = (cols / 32).div_ceil(64);
    let params = [
        word(OP, "cols", cols)?,
        word(OP, "rows", rows)?,
        u32::from(norm),
        word(OP, "input stride", x_stride)?,
        word(OP, "workgroups per row", per_row)?,
    ];
    Ok((params, rows * per_row))
}

/// `half` of `quant.wgsl` as the bit operations it is written with.
const HALF_BITS: &str = "fn half(h: u32) -> f32 {\n    return half_bits(h);\n}";
/// `half` as one conversion (adapters with `DownlevelFlags::SHADER_F16_IN_F32`).
const HALF_UNPACK: &str = "fn half(h: u32) -> f32 {\n    return unpack2x16float(h).x;\n}";

/// The product module of format `f` for `rows` activation rows and `opw` output rows per
/// subgroup, with the RMS norm of its input folded in (`norm`) or not, f16 fields read
/// with `unpack2x16float` (`unpack`) or bit operations, and 8-bit activations (`q8`, formats
/// with `has_q8`, inputs quantized by `quantize_q8`, times the norm weights where `norm`) or
/// f32. Entry points `matvec` and `embed`.
pub fn matvec_source(
    f: &Format,
    rows: u32,
    norm: bool,
    opw: u32,
    unpack: bool,
    q8: bool,
) -> String {
    // Formats whose values carry a min (`d * q + m`, `quant.wgsl`).
    let mins = matches!(f.name, "q4_1" | "q5_1" | "q2_k" | "q4_k" | "q5_k");
    let quant = if unpack {
        QUANT.replace(HALF_BITS, HALF_UNPACK)
    } else {
        QUANT.to_string()
    };
    debug_assert!(!q8 || has_q8(f), "Q8 products of a format without them");
    let ipair = if has_q8(f) {
        format!("return ipair_{}(a, s, h, w);", f.name)
    } else {
        // Q8 is false and nothing calls it.
        "return vec2<u32>(0u);".to_string()
    };
    format!(
        "const ROWS: u32 = {rows}u;\nconst BLOCK_BYTES: u32 = {}u;\nconst UNITS: u32 = {}u;\n\
         const MINS: bool = {mins};\nconst NORM: bool = {norm};\nconst OPW: u32 = {opw}u;\n\
         const Q8: bool = {q8};\n{quant}\n\
         fn head(a: u32, s: u32) -> Head {{\n    return head_{n}(a, s);\n}}\n\
         fn pair(a: u32, s: u32, h: Head, w: u32) -> Pair {{\n    return pair_{n}(a, s, h, w);\n}}\n\
         fn ipair(a: u32, s: u32, h: Head, w: u32) -> vec2<u32> {{\n    {ipair}\n}}\n{MATVEC}",
        f.block_bytes,
        f.units,
        n = f.name
    )
}

/// The cache key of [`matvec_source`]'s module for these arguments.
pub fn matvec_key(f: &Format, rows: u32, norm: bool, opw: u32, unpack: bool, q8: bool) -> String {
    format!(
        "matvec.wgsl {} rows {rows} opw {opw}{}{}{}",
        f.name,
        if norm { " norm" } else { "" },
        if unpack { " unpack" } else { "" },
        if q8 { " q8" } else { "" }
    )
}

/// Every module this file generates, as (name, entry points, source, whether it needs naga's
/// `SHADER_FLOAT16_IN_FLOAT32` capability): each format's products for every row variant,
/// outputs a subgroup, with and without the norm, f16 fields by bit operations or
/// `unpack2x16float`, 8-bit activations where the format has them; and `quantize_q8`.
pub fn shader_sources() -> Vec<(String, &'static [&'static str], String, bool)> {
    let mut out = Vec::new();
    for f in formats() {
        for rows in ROW_VARIANTS {
            for norm in [false, true] {
                for opw in if rows == 1 { &[1, 2, 4][..] } else { &[1][..] } {
                    for unpack in [false, true] {
                        let q8s = if has_q8(&f) {
                            &[false, true][..]
                        } else {
                            &[false][..]
                        };
                        for q8 in q8s {
                            // Four output rows a subgroup only with 8-bit activations.
                            if *opw == 4 && !q8 {
                                continue;
                            }
                            out.push((
                                matvec_key(&f, rows, norm, *opw, unpack, *q8),
                                &["matvec", "embed"][..],
                                matvec_source(&f, rows, norm, *opw, unpack, *q8),
                                unpack,
                            ));
                        }
                    }
                }
            }
        }
    }
    out.push((
        "quantize_q8.wgsl".into(),
        &["quantize_q8"][..],
        QUANTIZE_Q8.to_string(),
        false,
    ));
    out
}

/// One buffer of whole rows of a matrix: rows `row0..row0 + rows`, padded to whole words
/// plus one (`u32_at` of `quant.wgsl` reads the word after a field).
pub struct QChunk {
    pub buf: wgpu::Buffer,
    pub row0: usize,
    pub rows: usize,
}

/// A quantized matrix on a wgpu device: `rows x cols` of `fmt`, `row_bytes` a row, in
/// `chunks` of whole rows.
pub struct WgpuQMat {
    pub fmt: Format,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    pub chunks: Vec<QChunk>,
}

impl QStorage for WgpuQMat {
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The largest storage binding of an adapter with limits `l`, in whole words: the most bytes
/// one chunk may hold.
pub fn max_binding(l: &wgpu::Limits) -> u64 {
    l.max_storage_buffer_binding_size.min(l.max_buffer_size) / 4 * 4
}

/// Where the rows of a `rows x cols` matrix of `ty` named `name` go: its format and (first
/// row, rows) of each chunk, chunks of at most `max_bytes` (padding included) starting at
/// even rows where `pairs` (gate/up row pairs stay together). Errors name the matrix: a
/// type without products, rows not a whole number of units, a row over `max_bytes`.
pub fn plan_chunks(
    name: &str,
    ty: QType,
    rows: usize,
    cols: usize,
    pairs: bool,
    max_bytes: u64,
) -> Result<(Format, Vec<(usize, usize)>)> {
    const OP: &str = "upload_quant";
    let fmt = format_for(ty, cols).ok_or_else(|| {
        Error::backend(
            OP,
            format!(
                "tensor {name}: weight type {ty} has no wgpu kernel (supported: {})",
                WEIGHT_TYPES
                    .iter()
                    .map(|t| t.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })?;
    if !cols.is_multiple_of(fmt.values) {
        return Err(Error::backend(
            OP,
            format!(
                "tensor {name}: rows of {cols} values are not a whole number of {}-value units",
                fmt.values
            ),
        ));
    }
    let row_bytes = cols / fmt.values * fmt.block_bytes;
    // Each chunk is padded to whole words plus one.
    let mut per = (max_bytes.saturating_sub(8) / row_bytes.max(1) as u64) as usize;
    if pairs {
        per &= !1;
    }
    if per == 0 {
        return Err(Error::backend(
            OP,
            format!(
                "tensor {name}: one row takes {row_bytes} bytes, more than the adapter's \
                 largest storage binding ({max_bytes} bytes)"
            ),
        ));
    }
    let mut out = Vec::new();
    let mut r = 0;
    while r < rows {
        let n = per.min(rows - r);
        out.push((r, n));
        r += n;
    }
    Ok((fmt, out))
}

/// The buffer usages of every storage buffer the products bind.
pub fn storage_usage() -> wgpu::BufferUsages {
    wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC
}

/// A storage buffer holding `bytes`, padded with zeros to whole words plus one (written in
/// place: no padded copy).
pub fn upload_bytes(dev: &wgpu::Device, label: &str, bytes: &[u8]) -> Result<wgpu::Buffer> {
    let size = (bytes.len().div_ceil(4) + 1) * 4;
    let buf = dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some(label),
        size: size as u64,
        usage: storage_usage(),
        mapped_at_creation: true,
    });
    {
        let mut view = buf.get_mapped_range_mut(..).map_err(|e| {
            Error::backend(
                "upload_quant",
                format!("uploading {label}: mapping {size} bytes: {e}"),
            )
        })?;
        view.slice(..bytes.len()).copy_from_slice(bytes);
        view.slice(bytes.len()..)
            .copy_from_slice(&[0; 8][..size - bytes.len()]);
    }
    buf.unmap();
    Ok(buf)
}

impl WgpuQMat {
    /// Uploads `data` (a `rows x cols` matrix of `ty` in GGUF layout, named `name` in errors)
    /// in chunks of at most `max_bytes` (see [`plan_chunks`]).
    pub fn upload(
        dev: &wgpu::Device,
        name: &str,
        ty: QType,
        (rows, cols): (usize, usize),
        data: &[u8],
        pairs: bool,
        max_bytes: u64,
    ) -> Result<WgpuQMat> {
        let (fmt, plan) = plan_chunks(name, ty, rows, cols, pairs, max_bytes)?;
        let row_bytes = cols / fmt.values * fmt.block_bytes;
        if Some(data.len()) != row_bytes.checked_mul(rows) {
            return Err(Error::backend(
                "upload_quant",
                format!(
                    "tensor {name}: {} bytes for {rows} rows of {row_bytes}",
                    data.len()
                ),
            ));
        }
        let chunks = plan
            .into_iter()
            .map(|(row0, n)| {
                let bytes = &data[row0 * row_bytes..(row0 + n) * row_bytes];
                Ok(QChunk {
                    buf: upload_bytes(dev, name, &regroup(&fmt, bytes))?,
                    row0,
                    rows: n,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(WgpuQMat {
            fmt,
            rows,
            cols,
            row_bytes,
            chunks,
        })
    }

    /// `m` (uploaded from `host`'s bytes, in GGUF layout) as a `QTensor` on `dev`.
    pub fn qtensor(dev: &WgpuDevice, m: WgpuQMat, host: QBytes) -> Result<QTensor> {
        let (ty, rows, cols) = (m.fmt.ty, m.rows, m.cols);
        QTensor::from_storage(&dev.device(), ty, rows, cols, host, Arc::new(m))
    }

    /// The wgpu form of `w`; an error naming the op where `w` lives elsewhere.
    pub fn of<'a>(w: &'a QTensor, op: &'static str) -> Result<&'a WgpuQMat> {
        w.storage()
            .as_any()
            .downcast_ref::<WgpuQMat>()
            .ok_or_else(|| Error::backend(op, format!("{w:?} is not on a wgpu device")))
    }
}
