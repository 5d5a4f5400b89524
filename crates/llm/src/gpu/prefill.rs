//! Batched prefill (kernels in `prefill.cu`): a chunk of L prompt tokens at positions
//! p0..p0+L through every layer at once. Per layer: RMS norm of the f32 residual rows into
//! operand rows; each weight matrix dequantized from its GGUF blocks into one operand scratch
//! matrix (Q, K and V side by side, gate and up side by side) and multiplied by cuBLASLt
//! (f32 accumulation, f32 out); RoPE as the decode step, K and V rows written into
//! the f16 KV cache in place; the CUDA attention op (flash forward on tensor cores for head
//! sizes 64/96/128) over the cache prefix [0, p0+L) with causal alignment; the output and down
//! products accumulated onto the residual rows by the product itself.
//!
//! The operand type: f32 for a model on f32 activations (`Precision::Exact`, the default up to
//! 1 GiB of weights: its prompt then gives the decode steps' answers; no TF32), else 16-bit on
//! tensor cores: f16 (11-bit significands), bf16 for Gemma-3 (activations beyond f16's range)
//! or with `FERRITE_GPU_PREFILL_BF16=1`. The attention's q, k and v are f16 in every mode (the
//! KV cache is f16).

use ferrite_core::{DType, Tensor};
use ferrite_cuda::{Buffer, CudaDevice, KernelArgs, KernelSource, LaunchConfig};

use super::weights::{GpuMatrix, GpuModel};
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
        Ok(Prefill {
            chunk,
            dt,
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
            self.norm(dev, &self.x, &l.attn_norm, n, d, c.eps)?;
            self.dequant(dev, &l.wq, 0, l.wq.rows, 0)?;
            self.dequant(dev, &l.wk, 0, l.wk.rows, l.wq.rows)?;
            self.dequant(dev, &l.wv, 0, l.wv.rows, l.wq.rows + l.wk.rows)?;
            let qkv = nq + 2 * nk;
            self.gemm(dev, &self.h, n, d, qkv, (&self.y, 0, qkv), false)?;
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
            self.dequant(dev, &l.wo, 0, l.wo.rows, 0)?;
            match &l.post_attn_norm {
                Some(pn) => {
                    self.gemm(dev, &self.h, n, nq, d, (&self.y, 0, d), false)?;
                    self.add(dev, n, d, Some(pn), c.eps)?;
                }
                None => self.gemm(dev, &self.h, n, nq, d, (&self.x, 0, d), true)?,
            }
            // Feed-forward block.
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
            self.dequant(dev, &l.w_down, 0, d, 0)?;
            match &l.post_ffn_norm {
                Some(pn) => {
                    self.gemm(dev, &self.h, n, ff, d, (&self.y, 0, d), false)?;
                    self.add(dev, n, d, Some(pn), c.eps)?;
                }
                None => self.gemm(dev, &self.h, n, ff, d, (&self.x, 0, d), true)?,
            }
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
