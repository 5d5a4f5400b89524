//! Models of the llama family, qwen2 and gemma3 over quantized GGUF weights that stay
//! memory-mapped in their blocks.
//!
//! [`Model`] holds the file and validated weight descriptions; [`step`] is the model
//! definition (one batched step over a kernel set), [`cpu`] the CPU kernel set. A [`Session`]
//! runs one sequence through them on any kernel set; [`crate::engine`] runs many.

mod config;
pub mod cpu;
pub mod cuda;
pub mod step;
pub mod wgpu;

pub use crate::session::Session;
pub use config::{Arch, Config};
pub use cpu::CpuKernels;
pub use cuda::{CudaKernels, CudaKvStore, CudaLimits};
pub use step::{Batch, Out};
pub use wgpu::{WgpuKernels, WgpuKvStore, WgpuModel};

use std::sync::Arc;

use ferrite_core::{HostBytes, QBytes, QTensor};
use ferrite_cpu::qmatmul::CpuQMat;
use ferrite_cpu::quant::{ActFormat, Isa, QMat};
use ferrite_gguf::{GgmlType, GgufFile, TensorInfo};

use crate::error::{Error, Result};

/// A validated `rows x cols` weight in the file, as a CPU [`QTensor`] over the mapped bytes
/// (the CPU products' packed copy made at first use, `ferrite_cpu::qmatmul`).
#[derive(Clone, Debug)]
struct Weight {
    info: TensorInfo,
    q: QTensor,
}

impl Weight {
    fn rows(&self) -> usize {
        self.q.rows()
    }
    fn cols(&self) -> usize {
        self.q.cols()
    }
}

/// One tensor's bytes in the mapped file, shared with the file's owner.
struct FileTensor {
    file: Arc<GgufFile>,
    info: TensorInfo,
}

impl FileTensor {
    /// `info`'s bytes in `file`, shared.
    fn bytes_of(file: &Arc<GgufFile>, info: &TensorInfo) -> QBytes {
        QBytes::new(Arc::new(FileTensor {
            file: Arc::clone(file),
            info: info.clone(),
        }))
    }
}

impl HostBytes for FileTensor {
    fn bytes(&self) -> &[u8] {
        self.file.tensor_data(&self.info)
    }
    fn release(&self) {
        self.file.release(&self.info)
    }
}

struct Layer {
    attn_norm: Vec<f32>,
    wq: Weight,
    wk: Weight,
    wv: Weight,
    wo: Weight,
    bq: Option<Vec<f32>>,
    bk: Option<Vec<f32>>,
    bv: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    post_attn_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    w_gate: Weight,
    w_up: Weight,
    w_down: Weight,
    post_ffn_norm: Option<Vec<f32>>,
}

/// A loaded model: hyperparameters, the mapped file, and weight descriptions.
pub struct Model {
    pub cfg: Config,
    file: Arc<GgufFile>,
    tok_embd: Weight,
    output: Weight,
    output_norm: Vec<f32>,
    layers: Vec<Layer>,
    /// Per-pair RoPE frequency divisors (`rope_freqs.weight`, Llama 3.1), rope_dim/2 long.
    rope_freq_factors: Option<Vec<f32>>,
    isa: Isa,
    precision: Precision,
    /// Activation format of each product, derived from `precision` (or set directly).
    plan: PrecisionPlan,
    precision_explicit: bool,
}

/// The quantized products of one layer, in graph order (index into a [`PrecisionPlan`] row).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Product {
    /// q, k and v projections (one activation row shared).
    Qkv = 0,
    /// Attention output projection.
    AttnOut = 1,
    /// FFN gate and up projections.
    GateUp = 2,
    /// FFN down projection.
    Down = 3,
}

/// Activation format of every quantized product: `layers[il][Product as usize]` and the
/// output head. Products whose weight has no integer kernel take f32 whatever is asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrecisionPlan {
    pub layers: Vec<[ActFormat; 4]>,
    pub output: ActFormat,
}

impl PrecisionPlan {
    /// Every product in `f`.
    pub fn uniform(n_layer: usize, f: ActFormat) -> PrecisionPlan {
        PrecisionPlan {
            layers: vec![[f; 4]; n_layer],
            output: f,
        }
    }
}

/// How activations enter the quantized matrix products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Precision {
    /// 8-bit activation blocks (llama.cpp's scheme): fastest. Its rounding noise moves
    /// SmolLM2's logits by ~0.4-0.5 rms and its perplexity by up to ~1-2% either way on short
    /// windows (which way depends on rounding details, not on a bias).
    Q8,
    /// 8-bit plus an 8-bit residual in steps of 1/256 of the first (~16-bit activations),
    /// summed in one integer pass by the fused Q4_1/Q8_0 kernels (two passes for other
    /// formats); logits within ~0.01 of f32, perplexity within 0.01%. The default.
    Q8x2,
    /// f32 activations, each weight row dequantized: slow; a reference mode.
    Exact,
}

impl Precision {
    /// Every precision, in the order `--help` lists them.
    pub const ALL: [Precision; 3] = [Precision::Q8, Precision::Q8x2, Precision::Exact];

    /// The name `--precision` takes and output shows.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Q8 => "q8",
            Precision::Q8x2 => "q8x2",
            Precision::Exact => "exact",
        }
    }

    /// The activation format of each product of a model with `cfg` under this precision.
    pub fn plan(self, cfg: &Config) -> PrecisionPlan {
        match self {
            Precision::Q8 => PrecisionPlan::uniform(cfg.n_layer, ActFormat::Q8),
            Precision::Q8x2 => PrecisionPlan::uniform(cfg.n_layer, ActFormat::Q8x2),
            Precision::Exact => PrecisionPlan::uniform(cfg.n_layer, ActFormat::F32),
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Precision, String> {
        Precision::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Precision::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown precision \"{s}\" (expected one of: {})",
                    names.join(", ")
                )
            })
    }
}

impl Model {
    /// Opens a GGUF file and validates every tensor the graph needs (names, shapes, types).
    pub fn load(path: impl AsRef<std::path::Path>) -> Result<Model> {
        let file = GgufFile::open(path)?;
        Model::from_gguf(file)
    }

    pub fn from_gguf(file: GgufFile) -> Result<Model> {
        let file = Arc::new(file);
        let mut cfg = Config::from_gguf(&file)?;
        let tok_embd = weight(&file, "token_embd.weight", None, Some(cfg.d_model))?;
        cfg.vocab = tok_embd.rows();
        let output = match file.tensor("output.weight") {
            Some(_) => weight(&file, "output.weight", Some(cfg.vocab), Some(cfg.d_model))?,
            None => tok_embd.clone(),
        };
        check_token_ids(&file, cfg.vocab)?;
        let (d, hd, nh, nkv, ff) = (
            cfg.d_model,
            cfg.head_dim,
            cfg.n_head,
            cfg.n_kv_head,
            cfg.n_ff,
        );
        let output_norm = vector(&file, "output_norm.weight", d)?;
        let mut layers = Vec::with_capacity(cfg.n_layer.min(256));
        for il in 0..cfg.n_layer {
            let n = |s: &str| format!("blk.{il}.{s}");
            let opt_vec = |s: &str, len: usize| -> Result<Option<Vec<f32>>> {
                match file.tensor(&n(s)) {
                    Some(_) => Ok(Some(vector(&file, &n(s), len)?)),
                    None => Ok(None),
                }
            };
            let gemma = cfg.arch == Arch::Gemma3;
            let req_vec = |s: &str, len: usize| vector(&file, &n(s), len);
            let layer = Layer {
                attn_norm: req_vec("attn_norm.weight", d)?,
                wq: weight(&file, &n("attn_q.weight"), Some(nh * hd), Some(d))?,
                wk: weight(&file, &n("attn_k.weight"), Some(nkv * hd), Some(d))?,
                wv: weight(&file, &n("attn_v.weight"), Some(nkv * hd), Some(d))?,
                wo: weight(&file, &n("attn_output.weight"), Some(d), Some(nh * hd))?,
                bq: opt_vec("attn_q.bias", nh * hd)?,
                bk: opt_vec("attn_k.bias", nkv * hd)?,
                bv: opt_vec("attn_v.bias", nkv * hd)?,
                q_norm: if gemma {
                    Some(req_vec("attn_q_norm.weight", hd)?)
                } else {
                    None
                },
                k_norm: if gemma {
                    Some(req_vec("attn_k_norm.weight", hd)?)
                } else {
                    None
                },
                post_attn_norm: if gemma {
                    Some(req_vec("post_attention_norm.weight", d)?)
                } else {
                    None
                },
                ffn_norm: req_vec("ffn_norm.weight", d)?,
                w_gate: weight(&file, &n("ffn_gate.weight"), Some(ff), Some(d))?,
                w_up: weight(&file, &n("ffn_up.weight"), Some(ff), Some(d))?,
                w_down: weight(&file, &n("ffn_down.weight"), Some(d), Some(ff))?,
                post_ffn_norm: if gemma {
                    Some(req_vec("post_ffw_norm.weight", d)?)
                } else {
                    None
                },
            };
            layers.push(layer);
        }
        let rope_freq_factors = match file.tensor("rope_freqs.weight") {
            Some(_) => Some(vector(&file, "rope_freqs.weight", cfg.rope_dim / 2)?),
            None => None,
        };
        let mut m = Model {
            cfg,
            file,
            tok_embd,
            output,
            output_norm,
            layers,
            rope_freq_factors,
            isa: Isa::detect(),
            precision: Precision::Q8x2,
            plan: PrecisionPlan::uniform(0, ActFormat::Q8),
            precision_explicit: std::env::var_os("FERRITE_PRECISION").is_some(),
        };
        m.precision = Model::default_precision()?;
        m.plan = m.precision.plan(&m.cfg);
        Ok(m)
    }

    pub fn gguf(&self) -> &GgufFile {
        &self.file
    }

    /// The bytes of tensor `name` in the mapped file, shared (no copy): the host side of a
    /// device's `QTensor`.
    pub(crate) fn tensor_bytes(&self, name: &str) -> Result<QBytes> {
        let info = self
            .file
            .tensor(name)
            .ok_or_else(|| Error::Model(format!("missing tensor {name}")))?;
        Ok(FileTensor::bytes_of(&self.file, info))
    }

    /// The precision used unless set: `FERRITE_PRECISION` when given (checked: an unknown
    /// name is an error naming the variable), else `Q8x2` for every model. Plain 8-bit
    /// activations (llama.cpp's scheme) move SmolLM2's logits by 0.27 rms and change the
    /// greedy answer to 7 of 24 simple chat questions (among them "What is the capital of
    /// France?"); `Q8x2` keeps all 24 equal to the exact path's (logits within 0.008) at
    /// ~11% of the decode time on the CPU with the fused kernels. Measurements:
    /// docs/benchmarks.md, "Default precision".
    pub fn default_precision() -> Result<Precision> {
        match std::env::var("FERRITE_PRECISION") {
            Ok(v) => v
                .parse()
                .map_err(|e| Error::Other(format!("FERRITE_PRECISION: {e}"))),
            Err(std::env::VarError::NotPresent) => Ok(Precision::Q8x2),
            Err(std::env::VarError::NotUnicode(_)) => {
                Err(Error::Other("FERRITE_PRECISION is not valid UTF-8".into()))
            }
        }
    }

    /// Whether the precision was chosen (`set_precision`, `FERRITE_PRECISION`) rather than
    /// left at the default; the GPU picks its own default when it was not.
    pub fn precision_is_explicit(&self) -> bool {
        self.precision_explicit
    }

    pub fn precision(&self) -> Precision {
        self.precision
    }

    pub fn set_precision(&mut self, p: Precision) {
        self.precision = p;
        self.precision_explicit = true;
        self.plan = p.plan(&self.cfg);
    }

    /// The activation format of each product.
    pub fn plan(&self) -> &PrecisionPlan {
        &self.plan
    }

    /// Sets the activation format of each product directly (measurements); `precision()`
    /// keeps its last value. The plan must have one row per layer.
    pub fn set_plan(&mut self, plan: PrecisionPlan) -> Result<()> {
        if plan.layers.len() != self.cfg.n_layer {
            return Err(Error::Other(format!(
                "set_plan: {} layer rows for a model of {} layers",
                plan.layers.len(),
                self.cfg.n_layer
            )));
        }
        self.plan = plan;
        Ok(())
    }

    /// Instruction set the kernels use.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// Bytes of KV cache per token of context (f32 keys and values, all layers).
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.cfg.n_layer * self.cfg.n_kv_head * self.cfg.head_dim * 4
    }

    fn mat<'s>(&'s self, w: &'s Weight) -> QMat<'s> {
        self.cpu_mat(w).qmat()
    }

    /// `mat(w)` for a CPU product: with its packed copy on AVX-512 (made by the first call,
    /// once per weight; `ferrite_cpu::quant::packed`).
    fn product_mat<'s>(&'s self, w: &'s Weight) -> QMat<'s> {
        self.cpu_mat(w).product_qmat(self.isa)
    }

    fn cpu_mat<'s>(&'s self, w: &'s Weight) -> &'s CpuQMat {
        // Made on the CPU in `weight` at load.
        CpuQMat::of(&w.q, "Model::mat")
            .unwrap_or_else(|e| unreachable!("weight {} is a CPU matrix: {e}", w.info.name))
    }

    /// Embedding of `token` into `out` (d_model long), times the embedding scale.
    fn embed(&self, token: u32, out: &mut [f32]) -> Result<()> {
        let id = token as usize;
        if id >= self.cfg.vocab {
            return Err(Error::Token {
                id: token,
                vocab: self.cfg.vocab,
            });
        }
        self.mat(&self.tok_embd).dequantize_row(id, out);
        if self.cfg.embed_scale != 1.0 {
            out.iter_mut().for_each(|v| *v *= self.cfg.embed_scale);
        }
        Ok(())
    }
}

/// Token ids named in the tokenizer metadata must lie inside the vocabulary.
fn check_token_ids(f: &GgufFile, vocab: usize) -> Result<()> {
    for key in [
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.unknown_token_id",
        "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.eot_token_id",
    ] {
        if f.get(key).is_some() {
            let id = f.get_u64(key)?;
            if id >= vocab as u64 {
                return Err(Error::Model(format!(
                    "{key} = {id} is out of range for a vocabulary of {vocab}"
                )));
            }
        }
    }
    if let Some(v) = f.get("tokenizer.ggml.tokens").and_then(|v| v.as_array()) {
        if v.len() > vocab {
            return Err(Error::Model(format!(
                "tokenizer.ggml.tokens has {} entries but token_embd.weight has {vocab} rows",
                v.len()
            )));
        }
    }
    Ok(())
}

/// Looks up a 2-D weight and checks its shape (`rows`/`cols` when given) and type.
fn weight(
    f: &Arc<GgufFile>,
    name: &str,
    rows: Option<usize>,
    cols: Option<usize>,
) -> Result<Weight> {
    let info = f
        .tensor(name)
        .ok_or_else(|| Error::Model(format!("missing tensor {name}")))?;
    if info.dims.len() != 2 {
        return Err(Error::Model(format!(
            "tensor {name}: expected 2 dimensions, found {:?}",
            info.dims
        )));
    }
    let (c, r) = (info.dims[0] as usize, info.dims[1] as usize);
    if rows.is_some_and(|x| x != r) || cols.is_some_and(|x| x != c) {
        return Err(Error::Model(format!(
            "tensor {name}: expected shape [{}, {}] (GGUF order), found {:?}",
            cols.map_or("*".to_string(), |x| x.to_string()),
            rows.map_or("*".to_string(), |x| x.to_string()),
            info.dims
        )));
    }
    if !ferrite_core::quant::is_supported(info.ty) {
        return Err(Error::Model(format!(
            "tensor {name}: unsupported type {}",
            info.ty
        )));
    }
    let q = QTensor::new(
        &ferrite_cpu::cpu(),
        info.ty,
        r,
        c,
        FileTensor::bytes_of(f, info),
    )
    .map_err(|e| Error::Model(format!("tensor {name}: {e}")))?;
    Ok(Weight {
        info: info.clone(),
        q,
    })
}

/// A 1-D tensor of `len` values, dequantized to f32.
fn vector(f: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let info = f
        .tensor(name)
        .ok_or_else(|| Error::Model(format!("missing tensor {name}")))?;
    if info.n_elements != len as u64 || info.dims.iter().filter(|&&x| x != 1).count() > 1 {
        return Err(Error::Model(format!(
            "tensor {name}: expected {len} values, found shape {:?}",
            info.dims
        )));
    }
    if !info.ty.is_supported() || info.ty == GgmlType::Q8_K {
        return Err(Error::Model(format!(
            "tensor {name}: unsupported type {}",
            info.ty
        )));
    }
    Ok(f.dequantize(info)?)
}

/// Which logits a forward pass returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// Only the last token's (vocab values).
    Last,
    /// Every token's (tokens x vocab, row-major).
    All,
}

/// Largest number of tokens run through the layers at once; longer inputs go in pieces.
pub const MAX_BATCH: usize = 256;

impl Model {
    /// Activation formats for products over `ws` taking `f` (f32 where a weight has no
    /// integer kernel).
    fn formats(&self, ws: &[&QMat<'_>], f: ActFormat) -> Vec<ActFormat> {
        ws.iter()
            .map(|w| match ActFormat::for_weight(w.ty) {
                ActFormat::F32 => ActFormat::F32,
                _ => f,
            })
            .collect()
    }
}

pub use ferrite_cpu::llm::norm::{rms_norm_in_place, rms_norm_rows};

/// RoPE inverse frequencies `base^(-2i/rope_dim)` (f32, as transformers computes them),
/// divided by the optional per-pair factors: every kernel set's angles start here.
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
