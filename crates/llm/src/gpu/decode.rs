//! Wrappers of `decode.cu`: RoPE + KV append, split-K decode attention and its combine, RMS
//! norms.

use ferrite_cuda::{Buffer, CudaDevice, KernelArgs, KernelSource, LaunchConfig};

use super::CudaResult;
use crate::error::{Error, Result};

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "llm_decode",
    src: concat!(include_str!("quant.cuh"), include_str!("decode.cu")),
};

/// Largest head size the kernels take (`HD_MAX`).
pub const HD_MAX: usize = 512;
/// Query heads per attention block (`AT_GMAX`).
const AT_GMAX: usize = 8;
const AT_T: u32 = 128;
/// Most KV-length splits of one head group.
const MAX_SPLIT: usize = 64;

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
        if nkv == 0
            || !nh.is_multiple_of(nkv)
            || hd == 0
            || !hd.is_multiple_of(8)
            || hd > HD_MAX
            || self.ctx == 0
        {
            return Err(Error::Model(format!(
                "GPU attention needs head_dim a multiple of 8 up to {HD_MAX} and query heads a multiple of KV heads; found {nh} heads, {nkv} KV heads, head_dim {hd}"
            )));
        }
        if u32::try_from(nkv * self.ctx * hd).is_err() {
            return Err(Error::Context(format!(
                "KV cache of {} positions is too large for the GPU kernels",
                self.ctx
            )));
        }
        Ok(())
    }

    /// Bytes of one layer's keys (or values): f16 [n_kv_head][ctx][head_dim].
    pub fn kv_layer_bytes(&self) -> usize {
        self.n_kv_head * self.ctx * self.head_dim * 2
    }

    /// (blocks per KV head, KV-length splits) for a device with `sm_count` multiprocessors:
    /// about two blocks per multiprocessor once the context is long enough to split.
    pub fn splits(&self, sm_count: u32) -> (usize, usize) {
        let group = self.n_head / self.n_kv_head;
        let ngrp = group.div_ceil(AT_GMAX);
        let want = (2 * sm_count.max(1) as usize).div_ceil(self.n_kv_head * ngrp);
        let split = want.clamp(1, MAX_SPLIT).min(self.ctx.div_ceil(64)).max(1);
        (ngrp, split)
    }

    /// Bytes of the partial results of attention with `maxsplit` splits.
    pub fn part_bytes(&self, maxsplit: usize) -> usize {
        self.n_head * maxsplit * (self.head_dim + 2) * 4
    }
}

fn check_len(buf: &Buffer, need: usize, what: &str) -> Result<()> {
    if buf.bytes() < need {
        return Err(Error::Other(format!(
            "decode kernels: {what} holds {} bytes, needs {need}",
            buf.bytes()
        )));
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

/// `RopeArgs` in decode.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct RopeArgs {
    qkv: u64,
    kc: u64,
    vc: u64,
    params: u64,
    inv_freq: u64,
    qnorm: u64,
    knorm: u64,
    nh: u32,
    nkv: u32,
    hd: u32,
    rope_dim: u32,
    neox: u32,
    ctx: u32,
    pos_scale: f32,
    eps: f32,
}

/// `AttnArgs` in decode.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnArgs {
    q: u64,
    kc: u64,
    vc: u64,
    params: u64,
    part: u64,
    nh: u32,
    nkv: u32,
    hd: u32,
    ctx: u32,
    maxsplit: u32,
    window: u32,
    ngrp: u32,
    scale: f32,
}

/// `CombineArgs` in decode.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct CombineArgs {
    part: u64,
    params: u64,
    out: u64,
    hd: u32,
    maxsplit: u32,
    window: u32,
    pad: u32,
}

const _: () = {
    assert!(std::mem::size_of::<RopeArgs>() == 88);
    assert!(std::mem::size_of::<AttnArgs>() == 72);
    assert!(std::mem::size_of::<CombineArgs>() == 40);
};

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

#[derive(Clone, Copy, Debug)]
pub(crate) struct RopeLaunch {
    args: RopeArgs,
    grid: u32,
    block: u32,
}

/// q and k of `qkv` (f32 [nh*hd | nkv*hd | nkv*hd]) rotated for position `params[1]` (q in
/// place), k and v stored into the layer's cache at that position.
pub(crate) fn plan_rope(
    shape: &AttnShape,
    rope: &RopeSpec<'_>,
    qkv: &Buffer,
    kv: &KvLayer<'_>,
    params: &Buffer,
) -> Result<RopeLaunch> {
    shape.check()?;
    let (nh, nkv, hd) = (shape.n_head, shape.n_kv_head, shape.head_dim);
    if rope.rope_dim == 0 || !rope.rope_dim.is_multiple_of(2) || rope.rope_dim > hd {
        return Err(Error::Model(format!(
            "rope dimension {} must be even and at most the head size {hd}",
            rope.rope_dim
        )));
    }
    check_len(qkv, (nh + 2 * nkv) * hd * 4, "q/k/v")?;
    check_len(rope.inv_freq, rope.rope_dim / 2 * 4, "rope frequencies")?;
    check_len(params, 8, "parameters")?;
    if let Some((qn, kn, _)) = rope.qk_norm {
        check_len(qn, hd * 4, "q norm")?;
        check_len(kn, hd * 4, "k norm")?;
    }
    let (kc, vc) = kv.ptrs(shape)?;
    Ok(RopeLaunch {
        args: RopeArgs {
            qkv: qkv.ptr(),
            kc,
            vc,
            params: params.ptr(),
            inv_freq: rope.inv_freq.ptr(),
            qnorm: rope.qk_norm.map_or(0, |(q, _, _)| q.ptr()),
            knorm: rope.qk_norm.map_or(0, |(_, k, _)| k.ptr()),
            nh: nh as u32,
            nkv: nkv as u32,
            hd: hd as u32,
            rope_dim: rope.rope_dim as u32,
            neox: rope.neox as u32,
            ctx: shape.ctx as u32,
            pos_scale: rope.pos_scale,
            eps: rope.qk_norm.map_or(0.0, |(_, _, e)| e),
        },
        grid: (nh + 2 * nkv) as u32,
        block: hd.div_ceil(32) as u32 * 32,
    })
}

impl RopeLaunch {
    pub(crate) fn enqueue(&self, dev: &CudaDevice) -> Result<()> {
        let cfg = LaunchConfig::new((self.grid, 1, 1), (self.block, 1, 1), 0);
        dev.launch(
            "rope_kv",
            &SOURCE,
            "rope_kv",
            cfg,
            KernelArgs::new().arg(self.args),
        )
        .gpu()
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct AttnLaunch {
    args: AttnArgs,
    grid: (u32, u32),
}

/// Partial attention of q (f32 [nh * hd]) over keys 0..=params[1] of the layer's cache (or
/// the last `window` of them) into `part` (f32 [nh][maxsplit][hd + 2]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn plan_attn(
    shape: &AttnShape,
    window: usize,
    scale: f32,
    q: &Buffer,
    kv: &KvLayer<'_>,
    params: &Buffer,
    part: &Buffer,
    ngrp: usize,
    maxsplit: usize,
) -> Result<AttnLaunch> {
    shape.check()?;
    check_len(q, shape.n_head * shape.head_dim * 4, "q")?;
    check_len(part, shape.part_bytes(maxsplit), "attention partials")?;
    check_len(params, 8, "parameters")?;
    let (kc, vc) = kv.ptrs(shape)?;
    Ok(AttnLaunch {
        args: AttnArgs {
            q: q.ptr(),
            kc,
            vc,
            params: params.ptr(),
            part: part.ptr(),
            nh: shape.n_head as u32,
            nkv: shape.n_kv_head as u32,
            hd: shape.head_dim as u32,
            ctx: shape.ctx as u32,
            maxsplit: maxsplit as u32,
            window: u32::try_from(window).unwrap_or(u32::MAX),
            ngrp: ngrp as u32,
            scale,
        },
        grid: ((shape.n_kv_head * ngrp) as u32, maxsplit as u32),
    })
}

impl AttnLaunch {
    pub(crate) fn enqueue(&self, dev: &CudaDevice) -> Result<()> {
        let cfg = LaunchConfig::new((self.grid.0, self.grid.1, 1), (AT_T, 1, 1), 0);
        dev.launch(
            "attention",
            &SOURCE,
            "attn_decode",
            cfg,
            KernelArgs::new().arg(self.args),
        )
        .gpu()
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct CombineLaunch {
    args: CombineArgs,
    grid: u32,
}

/// out (f32 [nh * hd]) = the attention output merged from `part`.
pub(crate) fn plan_combine(
    shape: &AttnShape,
    window: usize,
    part: &Buffer,
    params: &Buffer,
    out: &Buffer,
    maxsplit: usize,
) -> Result<CombineLaunch> {
    check_len(part, shape.part_bytes(maxsplit), "attention partials")?;
    check_len(out, shape.n_head * shape.head_dim * 4, "attention output")?;
    Ok(CombineLaunch {
        args: CombineArgs {
            part: part.ptr(),
            params: params.ptr(),
            out: out.ptr(),
            hd: shape.head_dim as u32,
            maxsplit: maxsplit as u32,
            window: u32::try_from(window).unwrap_or(u32::MAX),
            pad: 0,
        },
        grid: shape.n_head as u32,
    })
}

impl CombineLaunch {
    pub(crate) fn enqueue(&self, dev: &CudaDevice) -> Result<()> {
        let cfg = LaunchConfig::new((self.grid, 1, 1), (128, 1, 1), 0);
        dev.launch(
            "attention",
            &SOURCE,
            "attn_combine",
            cfg,
            KernelArgs::new().arg(self.args),
        )
        .gpu()
    }
}

/// `y = x / rms(x) * w` (add: `x += y_in / rms(y_in) * w`) over n values.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NormLaunch {
    a: u64,
    b: u64,
    w: u64,
    n: u32,
    eps: f32,
    add: bool,
}

/// add = false: y = rms_norm(x) * w. add = true: x += rms_norm(y) * w.
pub(crate) fn plan_norm(
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
    let n = u32::try_from(n).map_err(|_| Error::Other(format!("rms_norm: {n} values")))?;
    Ok(NormLaunch {
        a: x.ptr(),
        b: y.ptr(),
        w: w.ptr(),
        n,
        eps,
        add,
    })
}

impl NormLaunch {
    pub(crate) fn enqueue(&self, dev: &CudaDevice) -> Result<()> {
        let cfg = LaunchConfig::new((1, 1, 1), (512, 1, 1), 0);
        if self.add {
            // rms_norm_add(x, y, w, n, eps)
            let args = KernelArgs::new()
                .arg(self.a)
                .arg(self.b)
                .arg(self.w)
                .arg(self.n)
                .arg(self.eps);
            dev.launch("rms_norm_add", &SOURCE, "rms_norm_add", cfg, args)
                .gpu()
        } else {
            // rms_norm(x, w, y, n, eps)
            let args = KernelArgs::new()
                .arg(self.a)
                .arg(self.w)
                .arg(self.b)
                .arg(self.n)
                .arg(self.eps);
            dev.launch("rms_norm", &SOURCE, "rms_norm", cfg, args).gpu()
        }
    }
}
