//! Wrappers of `decode.cu`: the attention step (RoPE, KV append, split-K decode attention,
//! merge of the splits) and RMS norms.

use crate::{Buffer, CudaDevice, KernelArgs, KernelSource, LaunchConfig};
use ferrite_core::{Error, Result};

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "llm_decode",
    src: concat!(include_str!("../quant.cuh"), include_str!("decode.cu")),
    prebuilt: crate::prebuilt::LLM_DECODE,
};

/// Largest head size the kernels take (`HD_MAX`).
pub const HD_MAX: usize = 512;
/// Query heads per attention block (`AT_GMAX`).
const AT_GMAX: usize = 8;
const AT_T: u32 = 128;
/// Most KV-length splits of one head group.
const MAX_SPLIT: usize = 64;

/// Errors (naming `op`) where the attention kernels cannot take these heads: head_dim a
/// multiple of 8 up to `HD_MAX`, query heads a multiple of KV heads.
pub fn check_heads(op: &'static str, nh: usize, nkv: usize, hd: usize) -> Result<()> {
    if nkv == 0 || !nh.is_multiple_of(nkv) || hd == 0 || !hd.is_multiple_of(8) || hd > HD_MAX {
        return Err(Error::backend(op, format!(
            "needs head_dim a multiple of 8 up to {HD_MAX} and query heads a multiple of KV heads; found {nh} heads, {nkv} KV heads, head_dim {hd}"
        )));
    }
    Ok(())
}

/// Head counts and sizes of one attention layer, and the KV cache capacity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    /// Positions in the KV cache.
    pub ctx: usize,
}

impl AttnShape {
    pub fn check(&self) -> Result<()> {
        let (nh, nkv, hd) = (self.n_head, self.n_kv_head, self.head_dim);
        check_heads("attention", nh, nkv, hd)?;
        if self.ctx == 0 {
            return Err(Error::backend("attention", "a KV cache of 0 positions"));
        }
        if u32::try_from(nkv * self.ctx * hd).is_err() {
            return Err(Error::backend(
                "attention",
                format!(
                    "a KV cache of {} positions is too large for the kernels",
                    self.ctx
                ),
            ));
        }
        Ok(())
    }

    /// Bytes of one layer's keys (or values): f16 [n_kv_head][ctx][head_dim].
    pub fn kv_layer_bytes(&self) -> usize {
        self.n_kv_head * self.ctx * self.head_dim * 2
    }

    /// (blocks per KV head, KV-length splits) for a device with `sm_count` multiprocessors
    /// and splits of at least `keys` keys: about two blocks per multiprocessor once the
    /// context is long enough to split.
    pub fn splits(&self, sm_count: u32, keys: usize) -> (usize, usize) {
        let group = self.n_head / self.n_kv_head;
        let ngrp = group.div_ceil(AT_GMAX);
        let want = (2 * sm_count.max(1) as usize).div_ceil(self.n_kv_head * ngrp);
        let split = want
            .clamp(1, MAX_SPLIT)
            .min(self.ctx.div_ceil(keys.max(1)))
            .max(1);
        (ngrp, split)
    }

    /// Bytes of the partial results of attention with `maxsplit` splits.
    pub fn part_bytes(&self, maxsplit: usize) -> usize {
        self.n_head * maxsplit * (self.head_dim + 2) * 4
    }
}

fn check_len(buf: &Buffer, need: usize, what: &str) -> Result<()> {
    if buf.bytes() < need {
        return Err(Error::backend(
            "llm decode",
            format!("{what} holds {} bytes, needs {need}", buf.bytes()),
        ));
    }
    Ok(())
}

/// One layer's keys and values inside the cache buffers: byte offset `off` of `k` and `v`.
#[derive(Clone, Copy)]
pub struct KvLayer<'a> {
    pub k: &'a Buffer,
    pub v: &'a Buffer,
    pub off: usize,
}

impl KvLayer<'_> {
    fn ptrs(&self, shape: &AttnShape) -> Result<(u64, u64)> {
        let need = self.off + shape.kv_layer_bytes();
        check_len(self.k, need, "key cache")?;
        check_len(self.v, need, "value cache")?;
        Ok((
            self.k.ptr() + self.off as u64,
            self.v.ptr() + self.off as u64,
        ))
    }
}

/// `AttnArgs` in decode.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AttnArgs {
    qkv: u64,
    kc: u64,
    vc: u64,
    params: u64,
    part: u64,
    count: u64,
    out: u64,
    inv_freq: u64,
    qnorm: u64,
    knorm: u64,
    nh: u32,
    nkv: u32,
    hd: u32,
    ctx: u32,
    maxsplit: u32,
    window: u32,
    ngrp: u32,
    rope_dim: u32,
    neox: u32,
    pad: u32,
    scale: f32,
    pos_scale: f32,
    eps: f32,
    pad2: f32,
}

const _: () = assert!(std::mem::size_of::<AttnArgs>() == 136);

/// RoPE settings of a layer.
#[derive(Clone, Copy)]
pub struct RopeSpec<'a> {
    /// f32 [rope_dim / 2]: inverse frequencies (with any per-pair factors applied).
    pub inv_freq: &'a Buffer,
    pub rope_dim: usize,
    /// Pairs (i, i + rope_dim/2) when true, (2i, 2i + 1) when false.
    pub neox: bool,
    /// Positions are multiplied by this before the angles.
    pub pos_scale: f32,
    /// Per-head RMS-norm weights of q and k (f32 [head_dim]) and epsilon (gemma3).
    pub qk_norm: Option<(&'a Buffer, &'a Buffer, f32)>,
}

/// Scratch of the attention step: split partials and per-head-group counters (zeroed once;
/// each step leaves them zero).
pub struct AttnScratch {
    pub part: Buffer,
    pub count: Buffer,
    pub ngrp: usize,
    pub maxsplit: usize,
}

impl AttnScratch {
    /// For `shape` on a device of `sm_count` multiprocessors, or with at most `splits` splits.
    pub fn new(dev: &CudaDevice, shape: &AttnShape, splits: Option<usize>) -> Result<AttnScratch> {
        shape.check()?;
        let (ngrp, auto) = shape.splits(dev.sm_count(), 64);
        let maxsplit = splits.unwrap_or(auto).clamp(1, MAX_SPLIT);
        Ok(AttnScratch {
            part: super::zeros(dev, shape.part_bytes(maxsplit), "llm attention")?,
            count: super::zeros(dev, shape.n_kv_head * ngrp * 4, "llm attention")?,
            ngrp,
            maxsplit,
        })
    }
}

#[derive(Clone, Copy, Debug)]
pub struct AttnLaunch {
    args: AttnArgs,
    grid: (u32, u32),
}

/// The attention step of a layer at position `params[1]`: q and k of `qkv` (f32
/// [nh*hd | nkv*hd | nkv*hd]) normed (if `rope.qk_norm`) and rotated, k and v stored into the
/// layer's cache, and `out` (f32 [nh * hd]) = softmax(q.k * scale) . v over keys 0..=pos (the
/// last `window` of them if not 0).
#[allow(clippy::too_many_arguments)]
pub fn plan_attn(
    shape: &AttnShape,
    rope: &RopeSpec<'_>,
    window: usize,
    scale: f32,
    qkv: &Buffer,
    kv: &KvLayer<'_>,
    params: &Buffer,
    scratch: &AttnScratch,
    out: &Buffer,
) -> Result<AttnLaunch> {
    shape.check()?;
    let (nh, nkv, hd) = (shape.n_head, shape.n_kv_head, shape.head_dim);
    if rope.rope_dim == 0 || !rope.rope_dim.is_multiple_of(2) || rope.rope_dim > hd {
        return Err(Error::backend(
            "attention",
            format!(
                "rope dimension {} must be even and at most the head size {hd}",
                rope.rope_dim
            ),
        ));
    }
    check_len(qkv, (nh + 2 * nkv) * hd * 4, "q/k/v")?;
    check_len(rope.inv_freq, rope.rope_dim / 2 * 4, "rope frequencies")?;
    check_len(params, 8, "parameters")?;
    check_len(out, nh * hd * 4, "attention output")?;
    check_len(
        &scratch.part,
        shape.part_bytes(scratch.maxsplit),
        "attention partials",
    )?;
    check_len(&scratch.count, nkv * scratch.ngrp * 4, "attention counters")?;
    if let Some((qn, kn, _)) = rope.qk_norm {
        check_len(qn, hd * 4, "q norm")?;
        check_len(kn, hd * 4, "k norm")?;
    }
    let (kc, vc) = kv.ptrs(shape)?;
    Ok(AttnLaunch {
        args: AttnArgs {
            qkv: qkv.ptr(),
            kc,
            vc,
            params: params.ptr(),
            part: scratch.part.ptr(),
            count: scratch.count.ptr(),
            out: out.ptr(),
            inv_freq: rope.inv_freq.ptr(),
            qnorm: rope.qk_norm.map_or(0, |(q, _, _)| q.ptr()),
            knorm: rope.qk_norm.map_or(0, |(_, k, _)| k.ptr()),
            nh: nh as u32,
            nkv: nkv as u32,
            hd: hd as u32,
            ctx: shape.ctx as u32,
            maxsplit: scratch.maxsplit as u32,
            window: u32::try_from(window).unwrap_or(u32::MAX),
            ngrp: scratch.ngrp as u32,
            rope_dim: rope.rope_dim as u32,
            neox: rope.neox as u32,
            pad: 0,
            scale,
            pos_scale: rope.pos_scale,
            eps: rope.qk_norm.map_or(0.0, |(_, _, e)| e),
            pad2: 0.0,
        },
        grid: ((nkv * scratch.ngrp) as u32, scratch.maxsplit as u32),
    })
}

impl AttnLaunch {
    pub fn enqueue(&self, dev: &CudaDevice) -> Result<()> {
        let cfg = LaunchConfig::new((self.grid.0, self.grid.1, 1), (AT_T, 1, 1), 0);
        super::launch(
            dev,
            "attention",
            &SOURCE,
            "attn_step",
            cfg,
            KernelArgs::new().arg(self.args),
        )
    }
}

/// `y = x / rms(x) * w` (add: `x += y_in / rms(y_in) * w`) over n values.
#[derive(Clone, Copy, Debug)]
pub struct NormLaunch {
    a: u64,
    b: u64,
    w: u64,
    n: u32,
    eps: f32,
    add: bool,
    /// Rows of n values (one block each).
    rows: u32,
}

/// add = false: y = rms_norm(x) * w. add = true: x += rms_norm(y) * w.
pub fn plan_norm(
    x: &Buffer,
    y: &Buffer,
    w: &Buffer,
    n: usize,
    eps: f32,
    add: bool,
) -> Result<NormLaunch> {
    for (b, what) in [(x, "x"), (y, "y"), (w, "norm weight")] {
        check_len(b, n * 4, what)?;
    }
    let n = u32::try_from(n).map_err(|_| Error::backend("rms_norm", format!("{n} values")))?;
    Ok(NormLaunch {
        a: x.ptr(),
        b: y.ptr(),
        w: w.ptr(),
        n,
        eps,
        add,
        rows: 1,
    })
}

impl NormLaunch {
    /// The same norm over `rows` consecutive rows of n values of x and y (buffers checked by
    /// the caller).
    pub fn with_rows(mut self, rows: u32) -> NormLaunch {
        self.rows = rows.max(1);
        self
    }

    pub fn enqueue(&self, dev: &CudaDevice) -> Result<()> {
        let cfg = LaunchConfig::new((self.rows, 1, 1), (512, 1, 1), 0);
        if self.add {
            // rms_norm_add(x, y, w, n, eps)
            let args = KernelArgs::new()
                .arg(self.a)
                .arg(self.b)
                .arg(self.w)
                .arg(self.n)
                .arg(self.eps);
            super::launch(dev, "rms_norm_add", &SOURCE, "rms_norm_add", cfg, args)
        } else {
            // rms_norm(x, w, y, n, eps)
            let args = KernelArgs::new()
                .arg(self.a)
                .arg(self.w)
                .arg(self.b)
                .arg(self.n)
                .arg(self.eps);
            super::launch(dev, "rms_norm", &SOURCE, "rms_norm", cfg, args)
        }
    }
}
