//! Weights on the device: each matrix's GGUF block bytes uploaded once, as they are in the
//! file, into its own buffer (16-byte aligned, 16 bytes of slack for the kernels' aligned
//! loads). Norm weights, biases and RoPE tables go up as f32.

use std::borrow::Cow;

use ferrite_cuda::{Buffer, CudaDevice};
use ferrite_gguf::{GgmlType, GgufFile};

use super::decode::AttnShape;
use super::{upload_f32, CudaResult};
use crate::error::{Error, Result};
use crate::model::{Arch, Config, Model};

/// Weight formats with a GPU kernel (`FMT_*` in quant.cuh).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum Fmt {
    F32 = 0,
    F16 = 1,
    BF16 = 2,
    Q4_0 = 3,
    Q4_1 = 4,
    Q5_0 = 5,
    Q5_1 = 6,
    Q8_0 = 7,
    Q4_K = 8,
    Q5_K = 9,
    Q6_K = 10,
    /// Not a file format: Q4_K rows converted for the prefill's int8 tensor-core products
    /// (`FMT_Q4_KU` in quant.cuh, `GpuMatrix::q4k_units_view`).
    Q4_KU = 11,
    /// Not a file format: Q6_K rows converted for the same products (`FMT_Q6_KU`,
    /// `GpuMatrix::k_units_view`).
    Q6_KU = 12,
}

impl Fmt {
    /// The kernel format of a GGUF type, if there is one.
    pub fn of(ty: GgmlType) -> Option<Fmt> {
        Some(match ty {
            GgmlType::F32 => Fmt::F32,
            GgmlType::F16 => Fmt::F16,
            GgmlType::BF16 => Fmt::BF16,
            GgmlType::Q4_0 => Fmt::Q4_0,
            GgmlType::Q4_1 => Fmt::Q4_1,
            GgmlType::Q5_0 => Fmt::Q5_0,
            GgmlType::Q5_1 => Fmt::Q5_1,
            GgmlType::Q8_0 => Fmt::Q8_0,
            GgmlType::Q4_K => Fmt::Q4_K,
            GgmlType::Q5_K => Fmt::Q5_K,
            GgmlType::Q6_K => Fmt::Q6_K,
            _ => return None,
        })
    }

    /// Elements per block as the kernels read them (F32/F16/BF16: pseudo-blocks of 32).
    pub fn block_elems(self) -> usize {
        match self {
            Fmt::Q4_K | Fmt::Q5_K | Fmt::Q6_K => 256,
            _ => 32,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            Fmt::F32 => 128,
            Fmt::F16 | Fmt::BF16 => 64,
            Fmt::Q4_0 => 18,
            Fmt::Q4_1 => 20,
            Fmt::Q5_0 => 22,
            Fmt::Q5_1 => 24,
            Fmt::Q8_0 => 34,
            Fmt::Q4_K => 144,
            Fmt::Q5_K => 176,
            Fmt::Q6_K => 210,
            Fmt::Q4_KU => 24,
            Fmt::Q6_KU => 40,
        }
    }

    /// Whether this is a kernel-only format of 32-element units converted from a K-quant
    /// (`Q4_KU`, `Q6_KU`).
    pub(crate) fn is_units(self) -> bool {
        matches!(self, Fmt::Q4_KU | Fmt::Q6_KU)
    }

    pub(crate) fn code(self) -> u32 {
        self as u32
    }
}

/// A `rows x cols` weight matrix on the device (row r: `row_bytes` bytes from byte
/// r * row_bytes), in GGUF block layout or, where `split`, each row's blocks rearranged so
/// that the decode products load them straight into registers (`split_rows`).
pub struct GpuMatrix {
    pub fmt: Fmt,
    /// The type in the file (differs from `fmt` where the weights were converted to f16).
    pub file_type: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    /// Rows read by the register kernels (`mvr*` in matvec.cu): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0
    /// and Q6_K rearranged by `split_rows` (`FMT_SPLIT` in quant.cuh); Q4_K as in the file (its
    /// 144-byte blocks are 16-byte aligned already).
    pub split: bool,
    buf: Buffer,
}

/// Where the split layout takes each region of a row from a block of `fmt`: the byte ranges
/// of the block's quants, of its `qh` word (Q5_0, Q5_1; empty elsewhere) and of its scale
/// fields (d, or d and m; Q6_K: d), for the formats that have a split layout.
pub(crate) fn split_fields(fmt: Fmt) -> Option<[std::ops::Range<usize>; 3]> {
    Some(match fmt {
        Fmt::Q4_0 => [2..18, 0..0, 0..2],
        Fmt::Q4_1 => [4..20, 0..0, 0..4],
        Fmt::Q5_0 => [6..22, 2..6, 0..2],
        Fmt::Q5_1 => [8..24, 4..8, 0..4],
        Fmt::Q8_0 => [2..34, 0..0, 0..2],
        // ql, qh and scales stay together (208 bytes); d apart
        Fmt::Q6_K => [0..208, 0..0, 208..210],
        _ => return None,
    })
}

/// Rows of `n` blocks of `fmt` (GGUF bytes, `data`) in the split layout: each row as
/// [quants of every block][qh of every block (Q5_0, Q5_1)][scale fields of every block], each
/// field's bytes as in the block (`split_fields`).
pub fn split_rows(fmt: Fmt, n: usize, data: &[u8]) -> Option<Vec<u8>> {
    use rayon::prelude::*;
    let fields = split_fields(fmt)?;
    let ts = fmt.block_bytes();
    let row_bytes = n * ts;
    if row_bytes == 0 || !data.len().is_multiple_of(row_bytes) {
        return None;
    }
    let mut out = vec![0u8; data.len()];
    out.par_chunks_mut(row_bytes)
        .zip(data.par_chunks(row_bytes))
        .for_each(|(dst, src)| {
            let mut start = 0;
            for f in &fields {
                let len = f.len();
                for (b, blk) in src.chunks_exact(ts).enumerate() {
                    dst[start + b * len..start + (b + 1) * len].copy_from_slice(&blk[f.clone()]);
                }
                start += n * len;
            }
        });
    Some(out)
}

impl GpuMatrix {
    /// Bytes a `rows x cols` matrix of `ty` takes on the device (after any conversion).
    pub fn device_bytes(ty: GgmlType, rows: usize, cols: usize) -> usize {
        let f = Fmt::of(ty).unwrap_or(Fmt::F16);
        rows * (cols / f.block_elems()) * f.block_bytes() + 16
    }

    /// Whether rows of `cols` elements of `ty` can be read by the register kernels: Q4_K, or a
    /// format with a split layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q6_K) in rows of a multiple
    /// of 16 bytes.
    pub fn splittable(ty: GgmlType, cols: usize) -> bool {
        Fmt::of(ty).is_some_and(|f| {
            (split_fields(f).is_some() || f == Fmt::Q4_K)
                && cols.is_multiple_of(f.block_elems())
                && (cols / f.block_elems() * f.block_bytes()).is_multiple_of(16)
        })
    }

    /// Uploads `data` (`rows x cols` of `ty`, GGUF block bytes) in GGUF layout. Types without a
    /// GPU kernel (Q2_K, Q3_K) are dequantized and stored as f16 (`GpuModel::load` prints a
    /// notice).
    pub fn upload(
        dev: &CudaDevice,
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Result<GpuMatrix> {
        Self::upload_with(dev, name, ty, rows, cols, data, false)
    }

    /// `upload`, in the split layout if `split` (which needs `splittable(ty, cols)`).
    pub fn upload_with(
        dev: &CudaDevice,
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: &[u8],
        split: bool,
    ) -> Result<GpuMatrix> {
        if split && !Self::splittable(ty, cols) {
            return Err(Error::Model(format!(
                "tensor {name}: rows of {cols} {ty} elements have no split layout"
            )));
        }
        if rows == 0 || cols == 0 || !cols.is_multiple_of(32) {
            return Err(Error::Model(format!(
                "tensor {name}: {rows} rows of {cols} elements; the GPU kernels need rows of a multiple of 32 elements"
            )));
        }
        let (fmt, bytes): (Fmt, Cow<'_, [u8]>) = match Fmt::of(ty) {
            Some(f) => (f, Cow::Borrowed(data)),
            None => {
                let v = ferrite_gguf::quant::dequantize_to_vec(ty, data)?;
                let b: Vec<u8> = v
                    .iter()
                    .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
                    .collect();
                (Fmt::F16, Cow::Owned(b))
            }
        };
        if !cols.is_multiple_of(fmt.block_elems()) {
            return Err(Error::Model(format!(
                "tensor {name}: rows of {cols} elements are not whole {ty} blocks"
            )));
        }
        let row_bytes = cols / fmt.block_elems() * fmt.block_bytes();
        if Some(bytes.len()) != rows.checked_mul(row_bytes) {
            return Err(Error::Model(format!(
                "tensor {name}: {rows}x{cols} {ty} needs {} bytes, found {}",
                rows.saturating_mul(row_bytes),
                bytes.len()
            )));
        }
        if u32::try_from(rows).is_err() || u32::try_from(row_bytes).is_err() {
            return Err(Error::Model(format!(
                "tensor {name}: {rows}x{cols} is too large for the GPU kernels"
            )));
        }
        // Q4_K: read as in the file
        let bytes = match split && split_fields(fmt).is_some() {
            true => Cow::Owned(
                split_rows(fmt, cols / fmt.block_elems(), &bytes)
                    .ok_or_else(|| Error::Model(format!("tensor {name}: cannot split its rows")))?,
            ),
            false => bytes,
        };
        let buf = dev.alloc_bytes(bytes.len() + 16, "llm weights").gpu()?;
        dev.write_bytes(&buf, 0, &bytes).gpu()?;
        Ok(GpuMatrix {
            fmt,
            file_type: ty,
            rows,
            cols,
            row_bytes,
            split,
            buf,
        })
    }

    /// The format code the kernels take (`FMT_*`, with `FMT_SPLIT` for rearranged rows).
    pub(crate) fn kernel_fmt(&self) -> u32 {
        let rearranged = self.split && (split_fields(self.fmt).is_some() || self.fmt.is_units());
        self.fmt.code() | if rearranged { 16 } else { 0 }
    }

    /// Bytes of the weights (what one product reads).
    pub fn bytes(&self) -> usize {
        self.rows * self.row_bytes
    }

    pub fn buffer(&self) -> &Buffer {
        &self.buf
    }

    /// This Q4_K or Q6_K matrix's shape over `buf`, which holds (or will hold) its rows as
    /// `Q4_KU` or `Q6_KU` units (the prefill's `pf_q4k_units` / `pf_q6k_units` write them).
    /// None for another format or a `buf` too small.
    pub(crate) fn k_units_view(&self, buf: Buffer) -> Option<GpuMatrix> {
        let fmt = match self.fmt {
            Fmt::Q4_K => Fmt::Q4_KU,
            Fmt::Q6_K => Fmt::Q6_KU,
            _ => return None,
        };
        self.view_as(fmt, self.cols / 32 * fmt.block_bytes(), buf)
    }

    /// Row bytes of this matrix's split copy (`split_view`): its rows padded to 16 bytes, so
    /// that every row of the copy starts 16-byte aligned.
    pub(crate) fn split_row_bytes(&self) -> usize {
        self.row_bytes.next_multiple_of(16)
    }

    /// This matrix's shape and format over `buf`, which holds (or will hold) its rows in the
    /// split layout (`split_rows`), `split_row_bytes` apart (the prefill's `pf_split` writes
    /// it). None where the format has no split layout or `buf` is too small.
    pub(crate) fn split_view(&self, buf: Buffer) -> Option<GpuMatrix> {
        split_fields(self.fmt)?;
        self.view_as(self.fmt, self.split_row_bytes(), buf)
    }

    /// This matrix's shape as split rows of `fmt`, `row_bytes` apart, over `buf` (None if
    /// `buf` is too small).
    fn view_as(&self, fmt: Fmt, row_bytes: usize, buf: Buffer) -> Option<GpuMatrix> {
        (buf.bytes() >= self.rows * row_bytes).then(|| GpuMatrix {
            fmt,
            file_type: self.file_type,
            rows: self.rows,
            cols: self.cols,
            row_bytes,
            split: true,
            buf,
        })
    }
}

/// One layer's weights on the device.
pub(crate) struct GpuLayer {
    pub attn_norm: Buffer,
    pub wq: GpuMatrix,
    pub wk: GpuMatrix,
    pub wv: GpuMatrix,
    pub wo: GpuMatrix,
    pub bq: Option<Buffer>,
    pub bk: Option<Buffer>,
    pub bv: Option<Buffer>,
    pub q_norm: Option<Buffer>,
    pub k_norm: Option<Buffer>,
    pub post_attn_norm: Option<Buffer>,
    pub ffn_norm: Buffer,
    pub w_gate: GpuMatrix,
    pub w_up: GpuMatrix,
    pub w_down: GpuMatrix,
    pub post_ffn_norm: Option<Buffer>,
}

/// A model's weights on one CUDA device, for sessions of up to `ctx` positions.
pub struct GpuModel {
    pub cfg: Config,
    pub(crate) dev: CudaDevice,
    pub(crate) ctx: usize,
    pub(crate) tok_embd: GpuMatrix,
    /// None: the output projection is the embedding matrix (tied).
    pub(crate) output: Option<GpuMatrix>,
    pub(crate) output_norm: Buffer,
    pub(crate) layers: Vec<GpuLayer>,
    /// RoPE inverse frequencies of global and of sliding-window layers.
    pub(crate) inv_freq: Buffer,
    pub(crate) inv_freq_local: Buffer,
    weight_bytes: usize,
    /// Activations of the decode step's products: the CPU model's precision at load
    /// (`Q8`: 8-bit, the fast mode; `Exact` and `Q8x2`: f32).
    pub(crate) precision: crate::Precision,
    /// The matrices' copies for the int8 tensor-core products of prompts (`mmq_copies`),
    /// made at the first use and shared by every session and engine of this model.
    mmq: std::sync::OnceLock<super::prefill::MmqCopies>,
}

/// Names of the matrices of layer `il`.
const LAYER_MATS: [&str; 7] = [
    "attn_q",
    "attn_k",
    "attn_v",
    "attn_output",
    "ffn_gate",
    "ffn_up",
    "ffn_down",
];

/// (rows, cols, type, bytes) of a 2-D tensor.
fn mat_info<'f>(f: &'f GgufFile, name: &str) -> Result<(usize, usize, GgmlType, &'f [u8])> {
    let info = f
        .tensor(name)
        .ok_or_else(|| Error::Model(format!("missing tensor {name}")))?;
    if info.dims.len() != 2 {
        return Err(Error::Model(format!(
            "tensor {name}: expected 2 dimensions, found {:?}",
            info.dims
        )));
    }
    Ok((
        info.dims[1] as usize,
        info.dims[0] as usize,
        info.ty,
        f.tensor_data(info),
    ))
}

fn upload_mat(dev: &CudaDevice, f: &GgufFile, name: &str, layout: Layout) -> Result<GpuMatrix> {
    upload_group(dev, f, &[name], layout, true).map(|mut v| v.remove(0))
}

/// How `GpuModel::load_with` lays out the weight matrices of the decode products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Split rows (register kernels) where the format allows and the product has rows enough
    /// to fill the device; GGUF rows (staged kernel) elsewhere, or everywhere with
    /// `FERRITE_GPU_SPLIT=0` (for comparisons).
    Auto,
    /// GGUF rows everywhere.
    Gguf,
    /// Split rows wherever the format allows, whatever the size.
    Split,
}

/// Matrices that one decode product reads together (they share a kernel, so a layout): split
/// (for the register kernels) where all are splittable (and of one format if `one_format`:
/// gate and up) and they have rows enough
/// to fill the device: a warp takes two rows, and with fewer than 8 warps per multiprocessor the
/// staged kernel (which splits rows over threads) is faster (Gemma-3-270M's 640-row products:
/// 818 tok/s split, 928 staged).
fn upload_group(
    dev: &CudaDevice,
    f: &GgufFile,
    names: &[&str],
    layout: Layout,
    one_format: bool,
) -> Result<Vec<GpuMatrix>> {
    let infos = names
        .iter()
        .map(|n| mat_info(f, n))
        .collect::<Result<Vec<_>>>()?;
    let (_, cols0, ty0, _) = infos[0];
    let rows: usize = infos.iter().map(|i| i.0).sum();
    let wanted = match layout {
        Layout::Gguf => false,
        Layout::Split => true,
        Layout::Auto => {
            crate::env::flag_or("FERRITE_GPU_SPLIT", true) && rows >= 16 * dev.sm_count() as usize
        }
    };
    let split = wanted
        && infos.iter().all(|&(_, cols, ty, _)| {
            (ty == ty0 || !one_format) && cols == cols0 && GpuMatrix::splittable(ty, cols)
        });
    names
        .iter()
        .zip(infos)
        .map(|(name, (rows, cols, ty, data))| {
            GpuMatrix::upload_with(dev, name, ty, rows, cols, data, split)
        })
        .collect()
}

fn vector(f: &GgufFile, name: &str) -> Result<Vec<f32>> {
    let info = f
        .tensor(name)
        .ok_or_else(|| Error::Model(format!("missing tensor {name}")))?;
    Ok(f.dequantize(info)?)
}

fn upload_vec(dev: &CudaDevice, f: &GgufFile, name: &str) -> Result<Buffer> {
    upload_f32(dev, &vector(f, name)?, "llm weights")
}

fn upload_opt(dev: &CudaDevice, f: &GgufFile, name: &str) -> Result<Option<Buffer>> {
    match f.tensor(name) {
        Some(_) => Ok(Some(upload_vec(dev, f, name)?)),
        None => Ok(None),
    }
}

/// Inverse RoPE frequencies `base^(-2i/rope_dim)` divided by optional per-pair factors: the
/// CPU model's expression, so the angles agree bit for bit.
/// Weights up to this size decode with f32 activations by default; larger ones with 8-bit
/// (dp4a) activations.
pub const F32_ACTS_MAX_WEIGHT_BYTES: usize = 1 << 30;

/// The GPU's precision when none was chosen, by the bytes of the weight matrices. The GPU has
/// two activation modes, f32 and 8-bit (dp4a); `Q8x2` and `Exact` both mean f32. Small models
/// decode at the same speed in either (SmolLM2 1,194 vs 1,200 tok/s on an H100: launches and
/// latency decide, not bandwidth), so they take f32 and keep the exact path's answers; above
/// 1 GiB bandwidth decides (8B Q4_0: 417 vs 261 tok/s) and the 8-bit mode stays.
pub fn default_precision(weight_bytes: usize) -> crate::Precision {
    if weight_bytes <= F32_ACTS_MAX_WEIGHT_BYTES {
        crate::Precision::Exact
    } else {
        crate::Precision::Q8
    }
}

pub(crate) fn rope_inv_freq(rope_dim: usize, base: f32, factors: Option<&[f32]>) -> Vec<f32> {
    (0..rope_dim / 2)
        .map(|i| {
            let f = 1.0 / base.powf((2 * i) as f32 / rope_dim as f32);
            match factors {
                Some(fs) => f / fs[i],
                None => f,
            }
        })
        .collect()
}

const MIB: f64 = 1024.0 * 1024.0;

impl GpuModel {
    /// The copies of the layers' matrices the prompts' int8 tensor-core products read
    /// (`prefill::mmq_copies`: split rows or 32-element units), made at the first call.
    pub(crate) fn mmq_copies(&self) -> Result<&super::prefill::MmqCopies> {
        if let Some(c) = self.mmq.get() {
            return Ok(c);
        }
        let c = super::prefill::mmq_copies(self)?;
        Ok(self.mmq.get_or_init(|| c))
    }

    /// Activation precision of the decode step's products in sessions created from now on:
    /// `Q8` quantizes each product's input to 8-bit units and takes integer dot products (as
    /// the CPU's Q8 mode); `Exact` and `Q8x2` keep f32 activations.
    pub fn precision(&self) -> crate::Precision {
        self.precision
    }

    pub fn set_precision(&mut self, p: crate::Precision) {
        self.precision = p;
    }

    /// Uploads the weights of `model` to `dev` for sessions of `ctx` positions (1..=the
    /// model's context length). Refuses, before uploading anything, a model whose weights,
    /// KV cache and scratch buffers exceed the device's free memory.
    pub fn load(model: &Model, dev: &CudaDevice, ctx: usize) -> Result<GpuModel> {
        Self::load_with(model, dev, ctx, Layout::Auto)
    }

    /// `load`, with the weight layout chosen by `layout`.
    pub fn load_with(
        model: &Model,
        dev: &CudaDevice,
        ctx: usize,
        layout: Layout,
    ) -> Result<GpuModel> {
        let c = &model.cfg;
        let f = model.gguf();
        if ctx == 0 || ctx > c.ctx_train {
            return Err(Error::Context(format!(
                "context size {ctx} must be between 1 and the model's context length {}",
                c.ctx_train
            )));
        }
        let shape = AttnShape {
            n_head: c.n_head,
            n_kv_head: c.n_kv_head,
            head_dim: c.head_dim,
            ctx,
        };
        shape.check()?;
        if !c.d_model.is_multiple_of(32) || !c.n_ff.is_multiple_of(32) {
            return Err(Error::Model(format!(
                "GPU kernels need the embedding length ({}) and feed-forward length ({}) to be multiples of 32",
                c.d_model, c.n_ff
            )));
        }
        // Memory: everything, before the first upload.
        let mut mats: Vec<String> = vec!["token_embd.weight".into()];
        if f.tensor("output.weight").is_some() {
            mats.push("output.weight".into());
        }
        for il in 0..c.n_layer {
            mats.extend(LAYER_MATS.iter().map(|s| format!("blk.{il}.{s}.weight")));
        }
        let mut weights = 0usize;
        for name in &mats {
            let (rows, cols, ty, _) = mat_info(f, name)?;
            weights += GpuMatrix::device_bytes(ty, rows, cols);
        }
        // Norms, biases: a few vectors of d_model (or smaller) per layer.
        weights += (c.n_layer * 8 + 4) * (c.d_model.max(c.n_head * c.head_dim) * 4 + 256);
        let kv = c.n_layer * 2 * shape.kv_layer_bytes();
        let scratch = crate::model::cuda::step_scratch_bytes(
            c,
            crate::session::CUDA_ROWS,
            crate::session::cuda_out_rows(c.vocab),
        );
        dev.empty_cache().gpu()?;
        let (free, total) = dev.mem_info().gpu()?;
        let need = weights + kv + scratch;
        if need > free {
            return Err(Error::Other(format!(
                "the model does not fit the GPU: it needs {:.1} MiB (weights {:.1} MiB, KV cache {:.1} MiB for a context of {ctx}, scratch {:.1} MiB) but {:.1} MiB of {:.1} MiB are free; lower --ctx or use --device cpu",
                need as f64 / MIB,
                weights as f64 / MIB,
                kv as f64 / MIB,
                scratch as f64 / MIB,
                free as f64 / MIB,
                total as f64 / MIB
            )));
        }

        // The embedding rows are read by the embedding kernels, which take the GGUF layout.
        let (rows, cols, ty, data) = mat_info(f, "token_embd.weight")?;
        let tok_embd = GpuMatrix::upload(dev, "token_embd.weight", ty, rows, cols, data)?;
        let output = match f.tensor("output.weight") {
            Some(_) => Some(upload_mat(dev, f, "output.weight", layout)?),
            None => None,
        };
        let mut layers = Vec::with_capacity(c.n_layer);
        for il in 0..c.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}");
            let gemma = c.arch == Arch::Gemma3;
            let req_gemma = |s: &str| -> Result<Option<Buffer>> {
                if gemma {
                    Ok(Some(upload_vec(dev, f, &n(s))?))
                } else {
                    Ok(None)
                }
            };
            let [wq, wk, wv]: [GpuMatrix; 3] = upload_group(
                dev,
                f,
                &[
                    &n("attn_q.weight"),
                    &n("attn_k.weight"),
                    &n("attn_v.weight"),
                ],
                layout,
                false,
            )?
            .try_into()
            .map_err(|_| Error::Other("upload: three matrices expected".into()))?;
            let [w_gate, w_up]: [GpuMatrix; 2] = upload_group(
                dev,
                f,
                &[&n("ffn_gate.weight"), &n("ffn_up.weight")],
                layout,
                true,
            )?
            .try_into()
            .map_err(|_| Error::Other("upload: two matrices expected".into()))?;
            layers.push(GpuLayer {
                attn_norm: upload_vec(dev, f, &n("attn_norm.weight"))?,
                wq,
                wk,
                wv,
                wo: upload_mat(dev, f, &n("attn_output.weight"), layout)?,
                bq: upload_opt(dev, f, &n("attn_q.bias"))?,
                bk: upload_opt(dev, f, &n("attn_k.bias"))?,
                bv: upload_opt(dev, f, &n("attn_v.bias"))?,
                q_norm: req_gemma("attn_q_norm.weight")?,
                k_norm: req_gemma("attn_k_norm.weight")?,
                post_attn_norm: req_gemma("post_attention_norm.weight")?,
                ffn_norm: upload_vec(dev, f, &n("ffn_norm.weight"))?,
                w_gate,
                w_up,
                w_down: upload_mat(dev, f, &n("ffn_down.weight"), layout)?,
                post_ffn_norm: req_gemma("post_ffw_norm.weight")?,
            });
        }
        let factors = match f.tensor("rope_freqs.weight") {
            Some(_) => Some(vector(f, "rope_freqs.weight")?),
            None => None,
        };
        let inv = rope_inv_freq(c.rope_dim, c.rope_base, factors.as_deref());
        let inv_local = rope_inv_freq(c.rope_dim, c.rope_base_local, factors.as_deref());
        let mut m = GpuModel {
            cfg: c.clone(),
            dev: dev.clone(),
            ctx,
            tok_embd,
            output,
            output_norm: upload_vec(dev, f, "output_norm.weight")?,
            layers,
            inv_freq: upload_f32(dev, &inv, "llm weights")?,
            inv_freq_local: upload_f32(dev, &inv_local, "llm weights")?,
            weight_bytes: 0,
            precision: model.precision(),
            mmq: std::sync::OnceLock::new(),
        };

        m.weight_bytes = m.matrices().map(|w| w.bytes()).sum();
        if !model.precision_is_explicit() {
            m.precision = default_precision(m.weight_bytes);
        }
        let mut converted: Vec<(GgmlType, usize)> = Vec::new();
        for w in m.matrices().filter(|w| Fmt::of(w.file_type).is_none()) {
            match converted.iter_mut().find(|(t, _)| *t == w.file_type) {
                Some((_, n)) => *n += 1,
                None => converted.push((w.file_type, 1)),
            }
        }
        for (ty, n) in converted {
            eprintln!("note: no GPU kernel for {ty}: {n} weight matrices converted to F16 at load");
        }
        Ok(m)
    }

    fn matrices(&self) -> impl Iterator<Item = &GpuMatrix> {
        std::iter::once(&self.tok_embd)
            .chain(self.output.as_ref())
            .chain(
                self.layers
                    .iter()
                    .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down]),
            )
    }

    /// The device the weights live on.
    pub fn device(&self) -> &CudaDevice {
        &self.dev
    }

    /// Positions a session of this model holds.
    pub fn ctx(&self) -> usize {
        self.ctx
    }

    /// Bytes of weight matrices on the device.
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// Weight bytes one decode step reads: every layer matrix, the output projection, and one
    /// embedding row.
    pub fn bytes_per_token(&self) -> usize {
        let out = self.output.as_ref().unwrap_or(&self.tok_embd);
        self.layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down])
            .map(|w| w.bytes())
            .sum::<usize>()
            + out.bytes()
            + self.tok_embd.row_bytes
    }

    pub(crate) fn output_matrix(&self) -> &GpuMatrix {
        self.output.as_ref().unwrap_or(&self.tok_embd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field of every block lands where quant.cuh's `sp_load` / `q6s_load` read it.
    #[test]
    fn split_rows_places_every_field() {
        for fmt in [
            Fmt::Q4_0,
            Fmt::Q4_1,
            Fmt::Q5_0,
            Fmt::Q5_1,
            Fmt::Q8_0,
            Fmt::Q6_K,
        ] {
            let [q, qh, h] = split_fields(fmt).unwrap();
            let ts = fmt.block_bytes();
            assert_eq!(q.len() + qh.len() + h.len(), ts, "{fmt:?}");
            let (rows, n) = (3, 8);
            let data: Vec<u8> = (0..rows * n * ts).map(|i| (i * 7 % 251) as u8).collect();
            let out = split_rows(fmt, n, &data).unwrap();
            assert_eq!(out.len(), data.len());
            let (ql, qhl, hl) = (q.len(), qh.len(), h.len());
            for r in 0..rows {
                let row = &out[r * n * ts..(r + 1) * n * ts];
                for b in 0..n {
                    let blk = &data[(r * n + b) * ts..(r * n + b + 1) * ts];
                    assert_eq!(
                        &row[b * ql..(b + 1) * ql],
                        &blk[q.clone()],
                        "{fmt:?} quants"
                    );
                    let qs = n * ql + b * qhl;
                    assert_eq!(&row[qs..qs + qhl], &blk[qh.clone()], "{fmt:?} qh");
                    let hs = n * (ql + qhl) + b * hl;
                    assert_eq!(&row[hs..hs + hl], &blk[h.clone()], "{fmt:?} scales");
                }
            }
        }
        // Q6_K: ql, qh and scales of block 1 follow block 0's 208 bytes; d of block 1 at
        // n * 208 + 2.
        let data: Vec<u8> = (0..2 * 210).map(|i| (i % 256) as u8).collect();
        let out = split_rows(Fmt::Q6_K, 2, &data).unwrap();
        assert_eq!(&out[208..416], &data[210..418]);
        assert_eq!(&out[418..420], &data[418..420]);
        assert_eq!(&out[416..418], &data[208..210]);
        assert!(split_rows(Fmt::Q4_K, 1, &[0; 144]).is_none());
        assert!(split_rows(Fmt::Q4_0, 8, &[0; 100]).is_none());
    }

    #[test]
    fn splittable_needs_a_format_and_16_byte_rows() {
        assert!(GpuMatrix::splittable(GgmlType::Q4_0, 4096));
        assert!(GpuMatrix::splittable(GgmlType::Q8_0, 512));
        assert!(!GpuMatrix::splittable(GgmlType::Q8_0, 576)); // 18 blocks of 34 bytes
        assert!(!GpuMatrix::splittable(GgmlType::Q4_1, 576)); // 360 bytes
        assert!(GpuMatrix::splittable(GgmlType::Q4_K, 4096));
        assert!(GpuMatrix::splittable(GgmlType::Q6_K, 4096)); // 16 x 210 bytes
        assert!(!GpuMatrix::splittable(GgmlType::Q6_K, 768)); // 3 x 210 bytes
        assert!(!GpuMatrix::splittable(GgmlType::Q5_K, 4096));
        assert!(!GpuMatrix::splittable(GgmlType::F16, 4096));
    }
}
