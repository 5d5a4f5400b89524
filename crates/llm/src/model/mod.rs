//! The transformer graph for the llama family and gemma3, over quantized GGUF weights that
//! stay memory-mapped in their blocks.
//!
//! [`Model`] holds the file and validated weight descriptions; a [`Session`] holds the KV
//! cache and scratch buffers and runs batches of tokens (prefill) or one token (decode).

mod config;

pub use config::{Arch, Config};

use ferrite_gguf::{GgmlType, GgufFile, TensorInfo};

use crate::error::{Error, Result};
use crate::kernels::float::{axpy, dot_f32};
use crate::kernels::{self, ActFormat, Acts, Isa, MatOut, QMat};
use crate::kv_cache::KvCache;

/// A validated `rows x cols` weight in the file.
#[derive(Clone, Debug)]
struct Weight {
    info: TensorInfo,
    rows: usize,
    cols: usize,
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
    file: GgufFile,
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
        let mut cfg = Config::from_gguf(&file)?;
        let tok_embd = weight(&file, "token_embd.weight", None, Some(cfg.d_model))?;
        cfg.vocab = tok_embd.rows;
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

    fn mat(&self, w: &Weight) -> QMat<'_> {
        // Validated in `weight` at load: the type is supported and the bytes match the shape.
        QMat::new(w.info.ty, w.rows, w.cols, self.file.tensor_data(&w.info))
            .unwrap_or_else(|e| unreachable!("weight {} validated at load: {e}", w.info.name))
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
fn weight(f: &GgufFile, name: &str, rows: Option<usize>, cols: Option<usize>) -> Result<Weight> {
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
    if !kernels::is_supported(info.ty) {
        return Err(Error::Model(format!(
            "tensor {name}: unsupported type {}",
            info.ty
        )));
    }
    QMat::new(info.ty, r, c, f.tensor_data(info))
        .map_err(|e| Error::Model(format!("tensor {name}: {e}")))?;
    Ok(Weight {
        info: info.clone(),
        rows: r,
        cols: c,
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

/// Scratch buffers for a batch of up to `cap` tokens; grown on demand, never shrunk.
#[derive(Default)]
struct Scratch {
    cap: usize,
    x: Vec<f32>,
    xb: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    att: Vec<f32>,
    tmp: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
    scores: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    cos_local: Vec<f32>,
    sin_local: Vec<f32>,
    acts: Acts,
}

/// Inference state over one model: the KV cache (`ctx` positions) and scratch space.
pub struct Session<'m> {
    model: &'m Model,
    kv: KvCache,
    s: Scratch,
    logits: Vec<f32>,
}

impl<'m> Session<'m> {
    /// A session whose KV cache holds `ctx` positions (1..=the model's context length).
    pub fn new(model: &'m Model, ctx: usize) -> Result<Session<'m>> {
        let c = &model.cfg;
        if ctx == 0 || ctx > c.ctx_train {
            return Err(Error::Context(format!(
                "context size {ctx} must be between 1 and the model's context length {}",
                c.ctx_train
            )));
        }
        let kv = KvCache::new(c.n_layer, c.n_kv_head, c.head_dim, ctx)?;
        Ok(Session {
            model,
            kv,
            s: Scratch::default(),
            logits: Vec::new(),
        })
    }

    pub fn model(&self) -> &'m Model {
        self.model
    }

    /// Tokens processed so far (the position of the next token).
    pub fn pos(&self) -> usize {
        self.kv.len()
    }

    /// Capacity of the KV cache in tokens.
    pub fn ctx(&self) -> usize {
        self.kv.capacity()
    }

    /// Forgets every position from `pos` on (`pos <= self.pos()`).
    pub fn truncate(&mut self, pos: usize) {
        self.kv.truncate(pos);
    }

    /// Runs `tokens` at positions `pos()..pos() + tokens.len()`, appending them to the KV
    /// cache, and returns the logits asked for. Errors (before any work) if the tokens do not
    /// fit the cache or an id is outside the vocabulary.
    pub fn forward(&mut self, tokens: &[u32], which: Logits) -> Result<&[f32]> {
        let vocab = self.model.cfg.vocab;
        if tokens.is_empty() {
            return Err(Error::Other("forward: no tokens".into()));
        }
        let need = self.pos() + tokens.len();
        if need > self.ctx() {
            return Err(Error::Context(format!(
                "{} tokens already in the cache plus {} new need {need} positions, but the context size is {}",
                self.pos(),
                tokens.len(),
                self.ctx()
            )));
        }
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(Error::Token { id, vocab });
        }
        let n_out = if which == Logits::All {
            tokens.len()
        } else {
            1
        };
        self.logits.resize(n_out * vocab, 0.0);
        let mut done = 0;
        for chunk in tokens.chunks(MAX_BATCH) {
            let last = done + chunk.len() == tokens.len();
            let out_rows = match which {
                Logits::All => Some(done * vocab),
                Logits::Last if last => Some(0),
                Logits::Last => None,
            };
            self.forward_batch(chunk, out_rows, which == Logits::All)?;
            done += chunk.len();
        }
        Ok(&self.logits)
    }

    /// One batch through every layer. With `out_at = Some(off)`, writes logits at
    /// `self.logits[off..]`: for every token when `all`, else for the last one.
    fn forward_batch(&mut self, tokens: &[u32], out_at: Option<usize>, all: bool) -> Result<()> {
        let m = self.model;
        let c = &m.cfg;
        let isa = m.isa;
        let t = tokens.len();
        let p0 = self.kv.len();
        let (d, hd, nh, nkv, ff) = (c.d_model, c.head_dim, c.n_head, c.n_kv_head, c.n_ff);
        let s = &mut self.s;
        if s.cap < t {
            s.cap = t;
            s.x.resize(t * d, 0.0);
            s.xb.resize(t * d, 0.0);
            s.q.resize(t * nh * hd, 0.0);
            s.k.resize(t * nkv * hd, 0.0);
            s.v.resize(t * nkv * hd, 0.0);
            s.att.resize(t * nh * hd, 0.0);
            s.tmp.resize(t * d, 0.0);
            s.gate.resize(t * ff, 0.0);
            s.up.resize(t * ff, 0.0);
        }
        if s.scores.len() < nh * self.kv.capacity() {
            s.scores.resize(nh * self.kv.capacity(), 0.0);
        }
        for (i, &tok) in tokens.iter().enumerate() {
            m.embed(tok, &mut s.x[i * d..(i + 1) * d])?;
        }
        let freq = |base: f32| rope_inv_freq(c.rope_dim, base, m.rope_freq_factors.as_deref());
        rope_table(
            &freq(c.rope_base),
            p0,
            t,
            1.0 / c.rope_scale,
            &mut s.cos,
            &mut s.sin,
        );
        if c.sliding_window > 0 {
            rope_table(
                &freq(c.rope_base_local),
                p0,
                t,
                1.0,
                &mut s.cos_local,
                &mut s.sin_local,
            );
        }
        let (x, xb) = (&mut s.x[..t * d], &mut s.xb[..t * d]);
        let (q, k, v) = (
            &mut s.q[..t * nh * hd],
            &mut s.k[..t * nkv * hd],
            &mut s.v[..t * nkv * hd],
        );
        let (att, tmp) = (&mut s.att[..t * nh * hd], &mut s.tmp[..t * d]);
        let (gate, up) = (&mut s.gate[..t * ff], &mut s.up[..t * ff]);
        for (il, l) in m.layers.iter().enumerate() {
            rms_norm_rows(x, xb, &l.attn_norm, d, c.eps);
            let (wq, wk, wv) = (m.mat(&l.wq), m.mat(&l.wk), m.mat(&l.wv));
            s.acts.quantize(
                xb,
                t,
                d,
                &m.formats(&[&wq, &wk, &wv], m.plan.layers[il][Product::Qkv as usize]),
            );
            kernels::matmul(
                isa,
                &s.acts,
                &mut [
                    MatOut {
                        w: wq,
                        out: &mut *q,
                    },
                    MatOut {
                        w: wk,
                        out: &mut *k,
                    },
                    MatOut {
                        w: wv,
                        out: &mut *v,
                    },
                ],
            );
            add_bias(q, l.bq.as_deref());
            add_bias(k, l.bk.as_deref());
            add_bias(v, l.bv.as_deref());
            if let (Some(qn), Some(kn)) = (&l.q_norm, &l.k_norm) {
                rms_norm_in_place(q, qn, hd, c.eps);
                rms_norm_in_place(k, kn, hd, c.eps);
            }
            let local = c.is_local(il);
            let (cos, sin) = if local {
                (&s.cos_local, &s.sin_local)
            } else {
                (&s.cos, &s.sin)
            };
            rope(q, nh, hd, c.rope_dim, c.rope_neox, cos, sin);
            rope(k, nkv, hd, c.rope_dim, c.rope_neox, cos, sin);
            self.kv.store(il, p0, k, v);
            let window = if local { c.sliding_window } else { 0 };
            attention(
                isa,
                &self.kv,
                il,
                p0,
                t,
                q,
                att,
                &mut s.scores,
                nh,
                nkv,
                hd,
                c.attn_scale,
                window,
            );

            let wo = m.mat(&l.wo);
            s.acts.quantize(
                att,
                t,
                nh * hd,
                &m.formats(&[&wo], m.plan.layers[il][Product::AttnOut as usize]),
            );
            kernels::matmul(
                isa,
                &s.acts,
                &mut [MatOut {
                    w: wo,
                    out: &mut *tmp,
                }],
            );
            if let Some(pn) = &l.post_attn_norm {
                rms_norm_in_place(tmp, pn, d, c.eps);
            }
            x.iter_mut().zip(tmp.iter()).for_each(|(a, b)| *a += b);

            rms_norm_rows(x, xb, &l.ffn_norm, d, c.eps);
            let (wg, wu) = (m.mat(&l.w_gate), m.mat(&l.w_up));
            s.acts.quantize(
                xb,
                t,
                d,
                &m.formats(&[&wg, &wu], m.plan.layers[il][Product::GateUp as usize]),
            );
            kernels::matmul(
                isa,
                &s.acts,
                &mut [
                    MatOut {
                        w: wg,
                        out: &mut *gate,
                    },
                    MatOut {
                        w: wu,
                        out: &mut *up,
                    },
                ],
            );
            if c.arch == Arch::Gemma3 {
                gate.iter_mut()
                    .zip(up.iter())
                    .for_each(|(g, u)| *g = gelu_tanh(*g) * u);
            } else {
                gate.iter_mut()
                    .zip(up.iter())
                    .for_each(|(g, u)| *g = silu(*g) * u);
            }
            let wd = m.mat(&l.w_down);
            s.acts.quantize(
                gate,
                t,
                ff,
                &m.formats(&[&wd], m.plan.layers[il][Product::Down as usize]),
            );
            kernels::matmul(
                isa,
                &s.acts,
                &mut [MatOut {
                    w: wd,
                    out: &mut *tmp,
                }],
            );
            if let Some(pn) = &l.post_ffn_norm {
                rms_norm_in_place(tmp, pn, d, c.eps);
            }
            x.iter_mut().zip(tmp.iter()).for_each(|(a, b)| *a += b);
        }
        self.kv.advance(t);
        let Some(off) = out_at else { return Ok(()) };
        let (first, n) = if all { (0, t) } else { (t - 1, 1) };
        let xs = &x[first * d..(first + n) * d];
        let xo = &mut xb[..n * d];
        rms_norm_rows(xs, xo, &m.output_norm, d, c.eps);
        let wout = m.mat(&m.output);
        s.acts
            .quantize(xo, n, d, &m.formats(&[&wout], m.plan.output));
        let out = &mut self.logits[off..off + n * c.vocab];
        kernels::matmul(isa, &s.acts, &mut [MatOut { w: wout, out }]);
        Ok(())
    }
}

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

fn add_bias(x: &mut [f32], b: Option<&[f32]>) {
    if let Some(b) = b {
        for row in x.chunks_exact_mut(b.len()) {
            row.iter_mut().zip(b).for_each(|(a, b)| *a += b);
        }
    }
}

/// `y[r] = x[r] / rms(x[r]) * w` for each row of `n` values.
pub fn rms_norm_rows(x: &[f32], y: &mut [f32], w: &[f32], n: usize, eps: f32) {
    for (xr, yr) in x.chunks_exact(n).zip(y.chunks_exact_mut(n)) {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let inv = 1.0 / (ss + eps).sqrt();
        for ((o, &v), &g) in yr.iter_mut().zip(xr).zip(w) {
            *o = v * inv * g;
        }
    }
}

/// RMS norm of each `n`-value piece of `x`, in place.
pub fn rms_norm_in_place(x: &mut [f32], w: &[f32], n: usize, eps: f32) {
    for xr in x.chunks_exact_mut(n) {
        let ss: f32 = xr.iter().map(|v| v * v).sum::<f32>() / n as f32;
        let inv = 1.0 / (ss + eps).sqrt();
        xr.iter_mut().zip(w).for_each(|(v, &g)| *v = *v * inv * g);
    }
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// GELU, tanh approximation (`gelu_pytorch_tanh`).
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * x * (1.0 + (C * (x + 0.044715 * x * x * x)).tanh())
}

/// Inverse frequencies `base^(-2i/rope_dim)` (f32, as transformers computes them), divided by
/// the optional per-pair factors.
fn rope_inv_freq(rope_dim: usize, base: f32, factors: Option<&[f32]>) -> Vec<f32> {
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

/// cos/sin tables `[t][rope_dim/2]` for positions p0..p0+t (each position times `pos_scale`).
fn rope_table(
    inv: &[f32],
    p0: usize,
    t: usize,
    pos_scale: f32,
    cos: &mut Vec<f32>,
    sin: &mut Vec<f32>,
) {
    cos.clear();
    sin.clear();
    for i in 0..t {
        let p = (p0 + i) as f32 * pos_scale;
        for &f in inv {
            let a = p * f;
            cos.push(a.cos());
            sin.push(a.sin());
        }
    }
}

/// Rotates the first `rope_dim` values of each of the `n_heads` heads of every token row of
/// `x` (`[t][n_heads * hd]`) by the angles of the token's row in `cos`/`sin`.
fn rope(
    x: &mut [f32],
    n_heads: usize,
    hd: usize,
    rope_dim: usize,
    neox: bool,
    cos: &[f32],
    sin: &[f32],
) {
    let half = rope_dim / 2;
    for (ti, row) in x.chunks_exact_mut(n_heads * hd).enumerate() {
        let (c, s) = (
            &cos[ti * half..(ti + 1) * half],
            &sin[ti * half..(ti + 1) * half],
        );
        for h in row.chunks_exact_mut(hd) {
            for i in 0..half {
                let (a, b) = if neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (h[a], h[b]);
                h[a] = x0 * c[i] - x1 * s[i];
                h[b] = x0 * s[i] + x1 * c[i];
            }
        }
    }
}

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
// SAFETY: attention tasks write disjoint (head) slices of the buffer, which outlives them.
unsafe impl Send for SendPtr {}
// SAFETY: as above.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Causal attention for `t` queries at positions p0..p0+t over the cached keys/values of
/// layer `il`. q: `[t][nh * hd]`; out: `[t][nh * hd]`; scores: scratch of nh * ctx. With
/// `window > 0`, query p sees keys in (p - window, p].
#[allow(clippy::too_many_arguments)]
fn attention(
    isa: Isa,
    kv: &KvCache,
    il: usize,
    p0: usize,
    t: usize,
    q: &[f32],
    out: &mut [f32],
    scores: &mut [f32],
    nh: usize,
    nkv: usize,
    hd: usize,
    scale: f32,
    window: usize,
) {
    let ctx = kv.capacity();
    let group = nh / nkv;
    let outp = SendPtr(out.as_mut_ptr());
    let work = |(h, sc): (usize, &mut [f32])| {
        let g = h / group;
        let (keys, vals) = (kv.keys(il, g), kv.values(il, g));
        for ti in 0..t {
            let p = p0 + ti;
            let lo = if window > 0 {
                (p + 1).saturating_sub(window)
            } else {
                0
            };
            let qh = &q[ti * nh * hd + h * hd..ti * nh * hd + (h + 1) * hd];
            let sc = &mut sc[lo..=p];
            let mut max = f32::NEG_INFINITY;
            for (j, s) in sc.iter_mut().enumerate() {
                let kj = &keys[(lo + j) * hd..(lo + j + 1) * hd];
                *s = dot_f32(isa, qh, kj) * scale;
                max = max.max(*s);
            }
            let mut sum = 0f32;
            for s in sc.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            // SAFETY: this task alone writes head h of every token row; the slice lies
            // inside `out` (t x nh*hd).
            let o = unsafe {
                std::slice::from_raw_parts_mut(outp.get().add(ti * nh * hd + h * hd), hd)
            };
            o.fill(0.0);
            let inv = 1.0 / sum;
            for (j, &s) in sc.iter().enumerate() {
                axpy(isa, s * inv, &vals[(lo + j) * hd..(lo + j + 1) * hd], o);
            }
        }
    };
    if t * (p0 + t) * nh * hd < 32 * 1024 {
        scores[..nh * ctx]
            .chunks_mut(ctx)
            .enumerate()
            .for_each(work);
    } else {
        let sp = SendPtr(scores.as_mut_ptr());
        crate::pool::Pool::global().run(nh, &|h| {
            // SAFETY: task h alone uses scores[h * ctx..(h + 1) * ctx], inside `scores`.
            let sc = unsafe { std::slice::from_raw_parts_mut(sp.get().add(h * ctx), ctx) };
            work((h, sc));
        });
    }
}
