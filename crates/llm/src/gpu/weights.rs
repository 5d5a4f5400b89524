//! Weights on the device: each matrix's GGUF block bytes uploaded once, as they are in the
//! file, into its own buffer (16-byte aligned, 16 bytes of slack for the kernels' aligned
//! loads). Norm weights, biases and RoPE tables go up as f32.

use ferrite_core::QTensor;
use ferrite_cuda::llm::decode::AttnShape;
use ferrite_cuda::llm::prefill;
use ferrite_cuda::matvec;
use ferrite_cuda::qmatmul::CudaQMat;
use ferrite_cuda::qmatrix::GpuMatrix;
use ferrite_cuda::{Buffer, CudaDevice};
use ferrite_gguf::{GgmlType, GgufFile};

use super::upload_f32;
use crate::error::{Error, Result};
use crate::model::{rope_inv_freq, Arch, Config, Model};

/// The CUDA form of a matrix of a [`GpuModel`] (each is a CUDA `QTensor`, made in
/// `upload_group`).
pub(crate) fn gm(q: &QTensor) -> &GpuMatrix {
    CudaQMat::of(q, "GpuModel")
        .map(CudaQMat::matrix)
        .unwrap_or_else(|e| unreachable!("a GpuModel matrix is on CUDA: {e}"))
}

/// One layer's weights on the device (matrices as CUDA `QTensor`s over the file's bytes).
pub(crate) struct GpuLayer {
    pub attn_norm: Buffer,
    pub wq: QTensor,
    pub wk: QTensor,
    pub wv: QTensor,
    pub wo: QTensor,
    pub bq: Option<Buffer>,
    pub bk: Option<Buffer>,
    pub bv: Option<Buffer>,
    pub q_norm: Option<Buffer>,
    pub k_norm: Option<Buffer>,
    pub post_attn_norm: Option<Buffer>,
    pub ffn_norm: Buffer,
    pub w_gate: QTensor,
    pub w_up: QTensor,
    pub w_down: QTensor,
    pub post_ffn_norm: Option<Buffer>,
}

/// A model's weights on one CUDA device, for sessions of up to `ctx` positions.
pub struct GpuModel {
    pub cfg: Config,
    pub(crate) dev: CudaDevice,
    pub(crate) ctx: usize,
    pub(crate) tok_embd: QTensor,
    /// None: the output projection is the embedding matrix (tied).
    pub(crate) output: Option<QTensor>,
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
    mmq: std::sync::OnceLock<MmqCopies>,
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

fn upload_mat(dev: &CudaDevice, m: &Model, name: &str, layout: Layout) -> Result<QTensor> {
    upload_group(dev, m, &[name], layout, true).map(|mut v| v.remove(0))
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
    m: &Model,
    names: &[&str],
    layout: Layout,
    one_format: bool,
) -> Result<Vec<QTensor>> {
    let f = m.gguf();
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
            let g = GpuMatrix::upload_with(dev, name, ty, rows, cols, data, split)
                .map_err(model_err)?;
            Ok(CudaQMat::qtensor(dev, g, m.tensor_bytes(name)?)?)
        })
        .collect()
}

/// A weight that the device cannot hold as given (shape, format) is the model's fault.
fn model_err(e: ferrite_core::Error) -> Error {
    match e {
        ferrite_core::Error::Backend {
            op: "GpuMatrix::upload",
            msg,
        } => Error::Model(msg),
        e => Error::Other(format!("cuda: {e}")),
    }
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

const MIB: f64 = 1024.0 * 1024.0;

/// Per layer, per matrix (`SLOT_*`): the copy `prefill::mmq_copy` made of it (split rows or 32-element
/// units) for the int8 tensor-core products; None where the matrix is read as it is or has
/// no such kernel.
pub(crate) type MmqCopies = Vec<[Option<GpuMatrix>; 7]>;

/// The matrices of a layer by slot (`MmqCopies`).
pub(crate) const SLOT_Q: usize = 0;
pub(crate) const SLOT_K: usize = 1;
pub(crate) const SLOT_V: usize = 2;
pub(crate) const SLOT_O: usize = 3;
pub(crate) const SLOT_GATE: usize = 4;
pub(crate) const SLOT_UP: usize = 5;
pub(crate) const SLOT_DOWN: usize = 6;

/// The copies of every layer's matrices (`prefill::mmq_copy`).
fn mmq_copies(m: &GpuModel) -> Result<MmqCopies> {
    let mut copies = Vec::with_capacity(m.layers.len());
    for l in &m.layers {
        let mut c: [Option<GpuMatrix>; 7] = Default::default();
        for (slot, c) in c.iter_mut().enumerate() {
            *c = prefill::mmq_copy(&m.dev, layer_mat(l, slot))?;
        }
        copies.push(c);
    }
    Ok(copies)
}

/// The matrix the int8 tensor-core products read for `w` (layer `il`'s slot `slot`): its copy
/// in `copies`, or `w` itself where it is split already; None where it has no such kernel.
pub(crate) fn mmq_matrix<'a>(
    copies: &'a MmqCopies,
    il: usize,
    slot: usize,
    w: &'a GpuMatrix,
) -> Option<&'a GpuMatrix> {
    let m = copies.get(il).and_then(|c| c[slot].as_ref()).unwrap_or(w);
    (m.split && matvec::MMQ2_FMTS.contains(&m.fmt)).then_some(m)
}

/// The matrix of `l` in scratch slot `slot` (`SLOT_*`).
fn layer_mat(l: &GpuLayer, slot: usize) -> &GpuMatrix {
    match slot {
        SLOT_Q => gm(&l.wq),
        SLOT_K => gm(&l.wk),
        SLOT_V => gm(&l.wv),
        SLOT_O => gm(&l.wo),
        SLOT_GATE => gm(&l.w_gate),
        SLOT_UP => gm(&l.w_up),
        _ => gm(&l.w_down),
    }
}

impl GpuModel {
    /// The copies of the layers' matrices the prompts' int8 tensor-core products read
    /// (`prefill::mmq_copy`: split rows or 32-element units), made at the first call.
    pub(crate) fn mmq_copies(&self) -> Result<&MmqCopies> {
        if let Some(c) = self.mmq.get() {
            return Ok(c);
        }
        let c = mmq_copies(self)?;
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
        shape.check().map_err(|e| Error::Model(e.to_string()))?;
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
        dev.empty_cache()?;
        let (free, total) = dev.mem_info()?;
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
        let tok_embd =
            upload_group(dev, model, &["token_embd.weight"], Layout::Gguf, true)?.remove(0);
        let output = match f.tensor("output.weight") {
            Some(_) => Some(upload_mat(dev, model, "output.weight", layout)?),
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
            let [wq, wk, wv]: [QTensor; 3] = upload_group(
                dev,
                model,
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
            let [w_gate, w_up]: [QTensor; 2] = upload_group(
                dev,
                model,
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
                wo: upload_mat(dev, model, &n("attn_output.weight"), layout)?,
                bq: upload_opt(dev, f, &n("attn_q.bias"))?,
                bk: upload_opt(dev, f, &n("attn_k.bias"))?,
                bv: upload_opt(dev, f, &n("attn_v.bias"))?,
                q_norm: req_gemma("attn_q_norm.weight")?,
                k_norm: req_gemma("attn_k_norm.weight")?,
                post_attn_norm: req_gemma("post_attention_norm.weight")?,
                ffn_norm: upload_vec(dev, f, &n("ffn_norm.weight"))?,
                w_gate,
                w_up,
                w_down: upload_mat(dev, model, &n("ffn_down.weight"), layout)?,
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
        for w in m
            .matrices()
            .filter(|w| ferrite_cuda::qmatrix::Fmt::of(w.file_type).is_none())
        {
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
            .map(gm)
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
        self.layers
            .iter()
            .flat_map(|l| [&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down])
            .map(|w| gm(w).bytes())
            .sum::<usize>()
            + self.output_matrix().bytes()
            + self.embedding().row_bytes
    }

    pub(crate) fn output_matrix(&self) -> &GpuMatrix {
        gm(self.output.as_ref().unwrap_or(&self.tok_embd))
    }

    pub(crate) fn embedding(&self) -> &GpuMatrix {
        gm(&self.tok_embd)
    }
}
