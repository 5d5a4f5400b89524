//! Batched prefill (kernels in `prefill.cu`): a chunk of L prompt tokens at positions
//! p0..p0+L through every layer at once. Per layer: RMS norm of the f32 residual rows into
//! operand rows; each weight matrix dequantized from its GGUF blocks into one operand scratch
//! matrix (Q, K and V side by side, gate and up side by side) and multiplied by cuBLASLt
//! (f32 accumulation, f32 out); RoPE as the decode step, K and V rows written into
//! the f16 KV cache in place; the CUDA attention op (flash forward on tensor cores for head
//! sizes 64/96/128/256) over the cache prefix [0, p0+L) with causal alignment; the output and down
//! products accumulated onto the residual rows by the product itself.
//!
//! The operand type: for a model on f32 activations (`Precision::Exact`, the default up to 1 GiB
//! of weights: its prompt then gives the decode steps' answers) the products of Q4_0, Q4_1,
//! Q5_0, Q5_1, Q8_0, Q4_K and Q6_K matrices take two-level 8-bit inputs (the CPU's q8x2, ~16
//! bits) on int8 tensor cores (`Prefill::mmq`, over copies made at set-up: `mmq_copy`), the
//! others f32 operands (no TF32); else 16-bit on tensor cores: f16 (11-bit significands), bf16 for
//! Gemma-3 (activations beyond f16's range) or with `FERRITE_GPU_PREFILL_BF16=1`. The
//! attention's q, k and v are f16 in every mode (the KV cache is f16).

use ferrite_core::{DType, Tensor};
use ferrite_cuda::{Buffer, CudaDevice, KernelArgs, KernelSource, LaunchConfig};

use super::matvec::{self, Mode, Seg};
use super::weights::{split_fields, Fmt, GpuMatrix, GpuModel};
use super::{zeros, CudaResult};
use crate::error::{Error, Result};
use crate::model::Arch;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "llm_prefill",
    src: concat!(
        include_str!("quant.cuh"),
        include_str!("decode.cu"),
        include_str!("prefill.cu")
    ),
    prebuilt: crate::prebuilt::LLM_PREFILL,
};

/// Tokens per prefill chunk (at most).
pub const CHUNK: usize = 512;

/// `RopeKvArgs` in prefill.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct RopeKvArgs {
    qkv: u64,
    bq: u64,
    bk: u64,
    bv: u64,
    qnorm: u64,
    knorm: u64,
    inv_freq: u64,
    q: u64,
    kc: u64,
    vc: u64,
    nh: u32,
    nkv: u32,
    hd: u32,
    ctx: u32,
    p0: u32,
    rope_dim: u32,
    neox: u32,
    pad: u32,
    pos_scale: f32,
    eps: f32,
    pad1: f32,
    pad2: f32,
}

const _: () = assert!(std::mem::size_of::<RopeKvArgs>() == 128);

fn launch(dev: &CudaDevice, name: &str, cfg: LaunchConfig, args: KernelArgs) -> Result<()> {
    dev.launch("llm prefill", &SOURCE, name, cfg, args).gpu()
}

/// Rows [r0, r0 + rows) of `mat` dequantized into f16, bf16 or f32 values (`mode` 0, 1, 2),
/// row-major, at device address `out` (room for rows x mat.cols values).
pub(crate) fn dequant_rows(
    dev: &CudaDevice,
    mat: &GpuMatrix,
    r0: usize,
    rows: usize,
    out: u64,
    mode: u32,
) -> Result<()> {
    if r0 + rows > mat.rows {
        return Err(Error::Other(format!(
            "pf_dequant: rows {r0}..{} of a {}-row matrix",
            r0 + rows,
            mat.rows
        )));
    }
    let args = KernelArgs::new()
        .arg(mat.buffer().ptr() + (r0 * mat.row_bytes) as u64)
        .arg(mat.kernel_fmt())
        .arg(mat.row_bytes as u32)
        .arg(mat.cols as u32)
        .arg(rows as u32)
        .arg(out)
        .arg(mode);
    // PFD_T = 128 units per block and round
    let blocks = (rows * mat.cols / 32)
        .div_ceil(128)
        .clamp(1, dev.sm_count() as usize * 16);
    let cfg = LaunchConfig::new((blocks as u32, 1, 1), (128, 1, 1), 0);
    launch(dev, "pf_dequant", cfg, args)
}

/// `out` (rows of nh * hd: f16, bf16 or f32 by `mode` 0, 1, 2) = the attention op's f16
/// `[1, nh, n, hd]` output at `o` (`pf_attn_out`).
pub(crate) fn attn_out(
    dev: &CudaDevice,
    o: u64,
    nh: u32,
    n: u32,
    hd: u32,
    out: u64,
    mode: u32,
) -> Result<()> {
    let a = KernelArgs::new()
        .arg(o)
        .arg(nh)
        .arg(n)
        .arg(hd)
        .arg(out)
        .arg(mode);
    launch(dev, "pf_attn_out", flat(dev, (n * nh * hd) as usize), a)
}

/// `out` (rows of ff: f16, bf16 or f32 by `mode` 0, 1, 2) = act(gate) * up of `n` f32 rows
/// of `2 * ff` (gate | up side by side) at `gu`; tanh-GELU if `gelu`, else SiLU (`pf_glu`).
pub(crate) fn glu(
    dev: &CudaDevice,
    gu: u64,
    n: u32,
    ff: u32,
    gelu: bool,
    out: u64,
    mode: u32,
) -> Result<()> {
    let a = KernelArgs::new()
        .arg(gu)
        .arg(n)
        .arg(ff)
        .arg(gelu as u32)
        .arg(out)
        .arg(mode);
    launch(dev, "pf_glu", flat(dev, n as usize * ff as usize), a)
}

/// Grid for `n` independent items, 256 threads a block.
fn flat(dev: &CudaDevice, n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, dev.sm_count() as usize * 16);
    LaunchConfig::new((blocks as u32, 1, 1), (256, 1, 1), 0)
}

fn ptr(b: &Option<Buffer>) -> u64 {
    b.as_ref().map_or(0, |b| b.ptr())
}

/// Buffers of the batched prefill of one session (allocated at its first prompt).
pub(crate) struct Prefill {
    pub chunk: usize,
    dt: DType,
    tokens: Buffer,
    /// f32 [chunk][d]: the residual stream.
    pub x: Buffer,
    /// Operand rows [chunk][max(d, nh*hd, ff)] (`dt`): product inputs.
    h: Buffer,
    /// f32 [chunk][max(qkv, 2 ff, d)]: product outputs.
    y: Buffer,
    /// f16 [chunk][nh][hd]: rotated queries.
    q: Buffer,
    /// Dequantized weights (`dt`).
    w: Buffer,
    w_elems: usize,
    /// f32 [chunk][vocab] (all-position logits; allocated on first use).
    logits: Option<Buffer>,
    /// The int8 tensor-core products of a model on f32 activations (None: off, or no such
    /// device).
    mmq: Option<Mmq>,
}

/// Scratch of the prefill's int8 tensor-core products (`Prefill::mmq`).
struct Mmq {
    /// Two-level 8-bit input rows ([chunk][max cols / 32] units of `Q8X2_UNIT` bytes).
    q8: Buffer,
    /// Split-K partials (f32).
    part: Buffer,
    /// (major, minor) compute capability.
    cc: (u32, u32),
}

/// Per layer, per matrix (`SLOT_*`): the copy `mmq_copy` made of it (split rows or 32-element
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

/// The copies of every layer's matrices (`mmq_copy`).
pub(crate) fn mmq_copies(m: &GpuModel) -> Result<MmqCopies> {
    let mut copies = Vec::with_capacity(m.layers.len());
    for l in &m.layers {
        let mut c: [Option<GpuMatrix>; 7] = Default::default();
        for (slot, c) in c.iter_mut().enumerate() {
            *c = mmq_copy(&m.dev, layer_mat(l, slot))?;
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

impl Prefill {
    pub(crate) fn new(m: &GpuModel, chunk: usize) -> Result<Prefill> {
        let dev = &m.dev;
        let c = &m.cfg;
        let (d, hd, nh, nkv, ff) = (c.d_model, c.head_dim, c.n_head, c.n_kv_head, c.n_ff);
        // A model on f32 activations (exact precision: the default up to 1 GiB of weights)
        // keeps them in its prompt's products too, so its answers are the decode steps'
        // (16-bit operands flipped Gemma-3's near ties); otherwise 16-bit operands: bf16 for
        // Gemma-3 (activations beyond f16's range).
        let bf = c.arch == Arch::Gemma3 || crate::env::flag_or("FERRITE_GPU_PREFILL_BF16", false);
        let dt = if m.precision == crate::Precision::Exact {
            DType::F32
        } else if bf {
            DType::BF16
        } else {
            DType::F16
        };
        let es = dt.size_in_bytes();
        let qkv = (nh + 2 * nkv) * hd;
        let w_elems = m
            .layers
            .iter()
            .flat_map(|l| {
                [
                    (l.wq.rows + l.wk.rows + l.wv.rows) * l.wq.cols,
                    l.wo.rows * l.wo.cols,
                    (l.w_gate.rows + l.w_up.rows) * l.w_gate.cols,
                    l.w_down.rows * l.w_down.cols,
                ]
            })
            .max()
            .unwrap_or(0)
            .max(d * 256);
        let mmq = if dt == DType::F32 && crate::env::flag_or("FERRITE_GPU_PREFILL_MMQ", true) {
            let (major, minor) = dev.compute_capability();
            let cc = (major.max(0) as u32, minor.max(0) as u32);
            (cc.0 >= 8).then_some(cc)
        } else {
            None
        };
        let mmq = match mmq {
            Some(cc) => {
                let max_cols = d.max(nh * hd).max(ff);
                let max_out = (nh + 2 * nkv) * hd;
                let max_out = max_out.max(2 * ff).max(d);
                // the copies are made now, with the prefill's scratch
                m.mmq_copies()?;
                Some(Mmq {
                    q8: zeros(
                        dev,
                        chunk * matvec::q8x2_bytes(max_cols),
                        "llm prefill q8x2",
                    )?,
                    // two K splits of every output row
                    part: zeros(dev, 2 * chunk * max_out * 4, "llm prefill partials")?,
                    cc,
                })
            }
            None => None,
        };
        Ok(Prefill {
            chunk,
            dt,
            mmq,
            tokens: zeros(dev, chunk * 4, "llm prefill")?,
            x: zeros(dev, chunk * d * 4, "llm prefill")?,
            h: zeros(dev, chunk * d.max(nh * hd).max(ff) * es, "llm prefill")?,
            y: zeros(dev, chunk * qkv.max(2 * ff).max(d) * 4, "llm prefill")?,
            q: zeros(dev, chunk * nh * hd * 2, "llm prefill")?,
            w: dev
                .alloc_bytes(w_elems * es + 64, "llm prefill weights")
                .gpu()?,
            w_elems,
            logits: None,
        })
    }

    /// The operand mode of the prefill kernels: f16 (0), bf16 (1), f32 (2).
    fn bf(&self) -> u32 {
        match self.dt {
            DType::BF16 => 1,
            DType::F32 => 2,
            _ => 0,
        }
    }

    /// One product of the chunk's `n` rows on the int8 tensor cores with two-level (q8x2)
    /// inputs, the CPU's default precision: layer `il`'s `mats` (matrix, `SLOT_*`, first
    /// output element) times norm(x) (f32 rows of the matrices' columns) into `out` (f32 rows
    /// of `ostride` elements) by `mode`. Matrices kept in GGUF blocks are read from their split
    /// copies (`Mmq::copies`); consecutive matrices of one format share a launch, and later
    /// launches reuse the quantized input. Returns false, having launched nothing, where a
    /// matrix's format has no such kernel (Q5_K, f16) or the prefill has none (`mmq`):
    /// the caller takes the dequantizing path.
    #[allow(clippy::too_many_arguments)]
    fn mmq(
        &self,
        m: &GpuModel,
        il: usize,
        mats: &[(&GpuMatrix, usize, usize)],
        mode: Mode,
        x: &Buffer,
        norm: Option<(&Buffer, f32)>,
        out: &Buffer,
        ostride: usize,
        n: usize,
    ) -> Result<bool> {
        let Some(mq) = &self.mmq else {
            return Ok(false);
        };
        let (dev, copies) = (&m.dev, m.mmq_copies()?);
        let mut segs = Vec::with_capacity(mats.len());
        for &(w, slot, out_off) in mats {
            let Some(w) = mmq_matrix(copies, il, slot, w) else {
                return Ok(false);
            };
            segs.push(Seg {
                w,
                bias: None,
                out_off,
            });
        }
        let scratch = (&mq.q8, &mq.part, mq.cc);
        let Some(ls) = mmq_launches(dev, &segs, mode, (x, norm), (out, ostride), n, scratch)?
        else {
            return Ok(false);
        };
        for l in ls {
            l.enqueue(dev)?;
        }
        Ok(true)
    }

    /// Rows [0, rows) of `mat` from row `r0` into the scratch from row `at` (`mat.cols` wide).
    fn dequant(
        &self,
        dev: &CudaDevice,
        mat: &GpuMatrix,
        r0: usize,
        rows: usize,
        at: usize,
    ) -> Result<()> {
        if (at + rows) * mat.cols > self.w_elems {
            return Err(Error::Other("prefill: weight scratch overflow".into()));
        }
        dequant_rows(
            dev,
            mat,
            r0,
            rows,
            self.w.ptr() + (at * mat.cols * self.dt.size_in_bytes()) as u64,
            self.bf(),
        )
    }

    /// out[n rows][w_rows] (f32, row stride ldo, from byte `off`) (+)= in[n][k] . scratch^T.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        dev: &CudaDevice,
        input: &Buffer,
        n: usize,
        k: usize,
        w_rows: usize,
        out: (&Buffer, usize, usize),
        acc: bool,
    ) -> Result<()> {
        dev.gemm_nt_f32(
            self.dt,
            (input, 0, k),
            (&self.w, 0, k),
            out,
            (n, w_rows, k),
            acc,
        )
        .gpu()
    }

    fn norm(
        &self,
        dev: &CudaDevice,
        x: &Buffer,
        w: &Buffer,
        n: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let args = KernelArgs::new()
            .arg(x.ptr())
            .arg(w.ptr())
            .arg(dim as u32)
            .arg(eps)
            .arg(self.h.ptr())
            .arg(self.bf());
        launch(
            dev,
            "pf_norm",
            LaunchConfig::new((n as u32, 1, 1), (256, 1, 1), 0),
            args,
        )
    }

    /// x += y, or x += norm(y) * w.
    fn add(
        &self,
        dev: &CudaDevice,
        n: usize,
        dim: usize,
        w: Option<&Buffer>,
        eps: f32,
    ) -> Result<()> {
        let args = KernelArgs::new()
            .arg(self.x.ptr())
            .arg(self.y.ptr())
            .arg(w.map_or(0, |w| w.ptr()))
            .arg(dim as u32)
            .arg(eps);
        launch(
            dev,
            "pf_add",
            LaunchConfig::new((n as u32, 1, 1), (256, 1, 1), 0),
            args,
        )
    }

    /// Runs `tokens` (at most `chunk`) at positions p0.. through every layer: K/V rows stored
    /// into the cache (`kc`, `vc`: f16 [layer][nkv][ctx][hd]), `x` left holding the final
    /// residual rows (before the output norm).
    pub(crate) fn run(
        &self,
        m: &GpuModel,
        kc: &Buffer,
        vc: &Buffer,
        tokens: &[u32],
        p0: usize,
    ) -> Result<()> {
        let dev = &m.dev;
        let c = &m.cfg;
        let n = tokens.len();
        if n == 0 || n > self.chunk {
            return Err(Error::Other(format!(
                "prefill: chunk of {n} tokens (1..={})",
                self.chunk
            )));
        }
        let (d, hd, nh, nkv, ff) = (c.d_model, c.head_dim, c.n_head, c.n_kv_head, c.n_ff);
        let (nq, nk) = (nh * hd, nkv * hd);
        let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
        dev.write_bytes(&self.tokens, 0, &bytes).gpu()?;
        let e = &m.tok_embd;
        launch(
            dev,
            "pf_embed",
            flat(dev, n * e.cols / 32),
            KernelArgs::new()
                .arg(e.buffer().ptr())
                .arg(e.fmt.code())
                .arg(e.row_bytes as u32)
                .arg(e.cols as u32)
                .arg(e.rows as u32)
                .arg(self.tokens.ptr())
                .arg(n as u32)
                .arg(c.embed_scale)
                .arg(self.x.ptr()),
        )?;
        let layer_bytes = nkv * m.ctx * hd * 2;
        let lk = p0 + n;
        for (il, l) in m.layers.iter().enumerate() {
            // Attention block.
            let qkv = nq + 2 * nk;
            let mats = [
                (&l.wq, SLOT_Q, 0),
                (&l.wk, SLOT_K, nq),
                (&l.wv, SLOT_V, nq + nk),
            ];
            let norm = Some((&l.attn_norm, c.eps));
            if !self.mmq(m, il, &mats, Mode::Store, &self.x, norm, &self.y, qkv, n)? {
                self.norm(dev, &self.x, &l.attn_norm, n, d, c.eps)?;
                self.dequant(dev, &l.wq, 0, l.wq.rows, 0)?;
                self.dequant(dev, &l.wk, 0, l.wk.rows, l.wq.rows)?;
                self.dequant(dev, &l.wv, 0, l.wv.rows, l.wq.rows + l.wk.rows)?;
                self.gemm(dev, &self.h, n, d, qkv, (&self.y, 0, qkv), false)?;
            }
            let local = c.is_local(il);
            let (qn, kn) = match (&l.q_norm, &l.k_norm) {
                (Some(q), Some(k)) => (q.ptr(), k.ptr()),
                _ => (0, 0),
            };
            let a = RopeKvArgs {
                qkv: self.y.ptr(),
                bq: ptr(&l.bq),
                bk: ptr(&l.bk),
                bv: ptr(&l.bv),
                qnorm: qn,
                knorm: kn,
                inv_freq: if local {
                    m.inv_freq_local.ptr()
                } else {
                    m.inv_freq.ptr()
                },
                q: self.q.ptr(),
                kc: kc.ptr() + (il * layer_bytes) as u64,
                vc: vc.ptr() + (il * layer_bytes) as u64,
                nh: nh as u32,
                nkv: nkv as u32,
                hd: hd as u32,
                ctx: m.ctx as u32,
                p0: p0 as u32,
                rope_dim: c.rope_dim as u32,
                neox: c.rope_neox as u32,
                pad: 0,
                pos_scale: if local { 1.0 } else { 1.0 / c.rope_scale },
                eps: c.eps,
                pad1: 0.0,
                pad2: 0.0,
            };
            let smem = ((nq + nk + nh) * 4) as u32;
            launch(
                dev,
                "pf_rope_kv",
                LaunchConfig::new((n as u32, 1, 1), (256, 1, 1), smem),
                KernelArgs::new().arg(a),
            )?;
            let qt = dev
                .tensor(&self.q, 0, &[1, n, nh, hd], DType::F16)
                .gpu()?
                .transpose(1, 2)
                .gpu()?;
            let off = il * layer_bytes;
            let kt = dev
                .tensor(kc, off, &[1, nkv, m.ctx, hd], DType::F16)
                .gpu()?
                .narrow(2, 0, lk)
                .gpu()?;
            let vt = dev
                .tensor(vc, off, &[1, nkv, m.ctx, hd], DType::F16)
                .gpu()?
                .narrow(2, 0, lk)
                .gpu()?;
            let o = Tensor::attention(&qt, &kt, &vt, true, Some(c.attn_scale as f64)).gpu()?;
            let (ob, ooff) = dev.buffer_of(&o).gpu()?;
            attn_out(
                dev,
                ob.ptr() + ooff as u64,
                nh as u32,
                n as u32,
                hd as u32,
                self.h.ptr(),
                self.bf(),
            )?;
            drop(o);
            self.residual(m, il, &l.wo, SLOT_O, l.post_attn_norm.as_ref(), n, c.eps)?;
            // Feed-forward block.
            let mats = [(&l.w_gate, SLOT_GATE, 0), (&l.w_up, SLOT_UP, 0)];
            let act = if c.arch == Arch::Gemma3 {
                Mode::GluGelu
            } else {
                Mode::GluSilu
            };
            let norm = Some((&l.ffn_norm, c.eps));
            if !self.mmq(m, il, &mats, act, &self.x, norm, &self.h, ff, n)? {
                self.norm(dev, &self.x, &l.ffn_norm, n, d, c.eps)?;
                self.dequant(dev, &l.w_gate, 0, ff, 0)?;
                self.dequant(dev, &l.w_up, 0, ff, ff)?;
                self.gemm(dev, &self.h, n, d, 2 * ff, (&self.y, 0, 2 * ff), false)?;
                glu(
                    dev,
                    self.y.ptr(),
                    n as u32,
                    ff as u32,
                    c.arch == Arch::Gemma3,
                    self.h.ptr(),
                    self.bf(),
                )?;
            }
            self.residual(
                m,
                il,
                &l.w_down,
                SLOT_DOWN,
                l.post_ffn_norm.as_ref(),
                n,
                c.eps,
            )?;
        }
        Ok(())
    }

    /// The residual rows x += w . h (`n` rows of h, the product's operand rows), or with a
    /// post-norm x += norm(w . h) * pn (through y).
    #[allow(clippy::too_many_arguments)]
    fn residual(
        &self,
        m: &GpuModel,
        il: usize,
        w: &GpuMatrix,
        slot: usize,
        post_norm: Option<&Buffer>,
        n: usize,
        eps: f32,
    ) -> Result<()> {
        let (k, d) = (w.cols, w.rows);
        let (mode, out) = match post_norm {
            Some(_) => (Mode::Store, &self.y),
            None => (Mode::Add, &self.x),
        };
        let dev = &m.dev;
        if !self.mmq(m, il, &[(w, slot, 0)], mode, &self.h, None, out, d, n)? {
            self.dequant(dev, w, 0, d, 0)?;
            self.gemm(dev, &self.h, n, k, d, (out, 0, d), post_norm.is_none())?;
        }
        if let Some(pn) = post_norm {
            self.add(dev, n, d, Some(pn), eps)?;
        }
        Ok(())
    }

    /// Copies residual row `row` into `dst` (f32 [d]).
    pub(crate) fn copy_row(
        &self,
        dev: &CudaDevice,
        row: usize,
        d: usize,
        dst: &Buffer,
    ) -> Result<()> {
        launch(
            dev,
            "pf_copy",
            flat(dev, d),
            KernelArgs::new()
                .arg(self.x.ptr() + (row * d * 4) as u64)
                .arg(dst.ptr())
                .arg(d as u32),
        )
    }

    /// Logits of the first `n` residual rows (after `run`): f32 [n][vocab], read back.
    pub(crate) fn logits(&mut self, m: &GpuModel, n: usize) -> Result<Vec<f32>> {
        let dev = &m.dev;
        let c = &m.cfg;
        let (d, vocab) = (c.d_model, c.vocab);
        if self.logits.is_none() {
            self.logits = Some(
                dev.alloc_bytes(self.chunk * vocab * 4, "llm prefill logits")
                    .gpu()?,
            );
        }
        let lg = self.logits.as_ref().expect("allocated above");
        self.norm(dev, &self.x, &m.output_norm, n, d, c.eps)?;
        let out = m.output_matrix();
        let tile = (self.w_elems / out.cols).min(out.rows);
        let mut r0 = 0;
        while r0 < out.rows {
            let t = tile.min(out.rows - r0);
            self.dequant(dev, out, r0, t, 0)?;
            self.gemm(dev, &self.h, n, d, t, (lg, r0 * 4, vocab), false)?;
            r0 += t;
        }
        super::read_f32(dev, lg, n * vocab)
    }
}

/// The launches of one product of `rows` rows on the int8 tensor cores with two-level (q8x2)
/// inputs (`MvLaunch::with_q8x2_mma`): `segs` (matrices as `mmq_matrix` gives them) times
/// norm(x) (f32 rows of their columns) into `out` (f32 rows of `ostride` elements) by `mode`,
/// with `(q8, part, cc)` the two-level input scratch, the split-K partials and the device's
/// compute capability. Consecutive matrices of one format share a launch; the first
/// quantizes the input, the others reuse it. None where the kernels do not apply (one row,
/// GLU halves of two formats).
pub(crate) fn mmq_launches(
    dev: &CudaDevice,
    segs: &[Seg<'_>],
    mode: Mode,
    (x, norm): (&Buffer, Option<(&Buffer, f32)>),
    (out, ostride): (&Buffer, usize),
    rows: usize,
    (q8, part, cc): (&Buffer, &Buffer, (u32, u32)),
) -> Result<Option<Vec<matvec::MvLaunch>>> {
    let glu = matches!(mode, Mode::GluSilu | Mode::GluGelu);
    if rows < 2 || segs.is_empty() || (glu && segs[0].w.fmt != segs[1].w.fmt) {
        return Ok(None);
    }
    // launches: GLU is one; else runs of one format
    let mut groups: Vec<&[Seg<'_>]> = Vec::new();
    if glu {
        groups.push(segs);
    } else {
        let mut start = 0;
        for i in 1..=segs.len() {
            if i == segs.len() || segs[i].w.fmt != segs[start].w.fmt {
                groups.push(&segs[start..i]);
                start = i;
            }
        }
    }
    let cols = segs[0].w.cols;
    let mut ls = Vec::with_capacity(groups.len());
    for (i, g) in groups.iter().enumerate() {
        let l = matvec::plan(dev.sm_count(), g, mode, x, norm, out, None)?
            .with_rows(rows, cols * 4, ostride * 4)?
            .with_q8x2_mma(cc, dev.sm_count(), q8, Some(part))?
            .ok_or_else(|| {
                Error::Other(format!(
                    "prefill: no int8 tensor-core launch for {:?} matrices",
                    g[0].w.fmt
                ))
            })?;
        ls.push(if i > 0 { l.reusing_input() } else { l });
    }
    Ok(Some(ls))
}

/// The matrix of `l` in scratch slot `slot` (`SLOT_*`).
fn layer_mat(l: &super::weights::GpuLayer, slot: usize) -> &GpuMatrix {
    match slot {
        SLOT_Q => &l.wq,
        SLOT_K => &l.wk,
        SLOT_V => &l.wv,
        SLOT_O => &l.wo,
        SLOT_GATE => &l.w_gate,
        SLOT_UP => &l.w_up,
        _ => &l.w_down,
    }
}

/// The copy of `w` the int8 tensor-core products read, made now: split rows for a matrix of a
/// 32-element format kept in GGUF blocks, `Q4_KU` / `Q6_KU` units for Q4_K / Q6_K; None where `w` is read as it
/// is (split already) or has no such kernel.
pub(crate) fn mmq_copy(dev: &CudaDevice, w: &GpuMatrix) -> Result<Option<GpuMatrix>> {
    if matches!(w.fmt, Fmt::Q4_K | Fmt::Q6_K) {
        let units = w.rows * w.cols / 32;
        let unit_bytes = if w.fmt == Fmt::Q4_K {
            Fmt::Q4_KU.block_bytes()
        } else {
            Fmt::Q6_KU.block_bytes()
        };
        let buf = dev
            .alloc_bytes(units * unit_bytes, "llm prefill K-quant units")
            .gpu()?;
        let v = w
            .k_units_view(buf)
            .ok_or_else(|| Error::Other("prefill: no K-quant unit view".into()))?;
        let mut args = KernelArgs::new()
            .arg(w.buffer().ptr())
            .arg(w.rows as u32)
            .arg((w.cols / 256) as u32);
        let name = if w.fmt == Fmt::Q4_K {
            "pf_q4k_units"
        } else {
            // Q6_K's split layout moves the d fields to the row's end
            args = args.arg(w.split as u32);
            "pf_q6k_units"
        };
        let args = args.arg(v.row_bytes as u32).arg(v.buffer().ptr());
        launch(
            dev,
            name,
            LaunchConfig::new((units.div_ceil(256) as u32, 1, 1), (256, 1, 1), 0),
            args,
        )?;
        return Ok(Some(v));
    }
    if w.split || !matvec::MMQ2_FMTS.contains(&w.fmt) {
        return Ok(None);
    }
    let buf = dev
        .alloc_bytes(w.rows * w.split_row_bytes(), "llm prefill split rows")
        .gpu()?;
    let v = w
        .split_view(buf)
        .ok_or_else(|| Error::Other(format!("prefill: no split layout for {:?}", w.fmt)))?;
    split_into(dev, w, &v)?;
    Ok(Some(v))
}

/// `w`'s GGUF rows rearranged into `dst`'s buffer in the split layout (`pf_split`), rows
/// `dst.row_bytes` apart.
fn split_into(dev: &CudaDevice, w: &GpuMatrix, dst: &GpuMatrix) -> Result<()> {
    let [q, qh, h] = split_fields(w.fmt)
        .ok_or_else(|| Error::Other(format!("prefill: {:?} has no split layout", w.fmt)))?;
    let nb = w.cols / w.fmt.block_elems();
    let total = w.rows * nb;
    let args = KernelArgs::new()
        .arg(w.buffer().ptr())
        .arg(w.rows as u32)
        .arg(nb as u32)
        .arg(w.fmt.block_bytes() as u32)
        .arg(q.start as u32)
        .arg(q.len() as u32)
        .arg(qh.start as u32)
        .arg(qh.len() as u32)
        .arg(h.start as u32)
        .arg(h.len() as u32)
        .arg(dst.row_bytes as u32)
        .arg(dst.buffer().ptr());
    launch(
        dev,
        "pf_split",
        LaunchConfig::new((total.div_ceil(256) as u32, 1, 1), (256, 1, 1), 0),
        args,
    )
}
