//! Attention on CUDA (kernels in attention.cu): forward and backward, with the semantics of
//! ferrite-cpu's attention.rs (grouped-query heads; the causal mask aligned to the last key,
//! every query seeing at least key 0; NaN rows only when there are no keys).
//!
//! - Forward, f16/bf16 with d == dv in {64, 96, 128, 256} and 16-byte aligned rows: a
//!   FlashAttention-2 style kernel on tensor cores (f32 accumulation): wgmma for 64-wide heads
//!   on sm_90a (Hopper), mma.sync otherwise; the backward's tensor-core kernels likewise (one
//!   body per kernel, `SyncTC` / `WgTC` in attention.cu).
//!   Other f32/f16/bf16 cases with head sizes ≤ 256: a flash-attention style tiled kernel on
//!   CUDA cores (64 queries per block, K/V tiles of 64 keys in shared memory, online softmax,
//!   f32 accumulation). f64 and larger heads: a warp-per-query kernel.
//! - With `Op::Attention`'s second output requested (a recorded forward), the per-query lse:
//!   from the tensor-core forward itself, else from a row pass (`attn_rows` mode 2).
//! - Backward (gradients stored [b, l, h, d], `grad_row` in attention.cu): per-query
//!   statistics (max, sum, D = g·o), then dq by query tiles and dk/dv by
//!   key tiles, each recomputing the probabilities, so every output row has one writer and
//!   results are deterministic without atomics. The tensor-core path's statistics are (lse, D):
//!   given the forward's saved output and lse, one warp a row computes D (`attn_delta`);
//!   otherwise a forward pass recomputes them (`attn_mmas`). Tiles a warp sees whole skip
//!   the masks. f32/f16/bf16 with head sizes ≤ 128 use tiled
//!   CUDA-core kernels (the statistics from the tiled forward kernel); f64 and larger heads
//!   use warp-per-row kernels (statistics by a warp per query).
//!
//! Every kernel reads its inputs through their strides: views are never copied.
//!
//! The key-padding mask (bool [b, lk], true = padding; `Op::Attention`'s `key_mask`) reaches
//! every kernel family through `Dims` (a device pointer, null without a mask, and its
//! strides): each skips masked keys where it applies the causal limit, so masked calls take
//! the same kernels as unmasked ones (the tensor-core forward included). A query with no
//! visible unmasked key gets a NaN row forward and zero dq (nothing added to dk, dv) backward.

use crate::device::CudaBackend;
use crate::kernels::{suffix, Args, Cfg, KernelSource};
use crate::norm::float_dtype;
use ferrite_core::{DType, Error, Result, Storage, Tensor};
use std::sync::Arc;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "attention",
    src: include_str!("attention.cu"),
    prebuilt: crate::prebuilt::ATTENTION,
};

/// Sizes and strides of the operands (`AttnDims` in attention.cu). Strides in elements, per
/// dim (b, h, l, last).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Dims {
    b: u32,
    hq: u32,
    hkv: u32,
    lq: u32,
    lk: u32,
    d: u32,
    dv: u32,
    causal: u32,
    sq: [i64; 4],
    sk: [i64; 4],
    sv: [i64; 4],
    sg: [i64; 4],
    /// Key-padding mask: device address of bool [b, lk] (0 = none) and its strides.
    mask: u64,
    sm: [i64; 2],
    /// Head slots a token of the dq and of the dk/dv gradient rows holds: hq and hkv, or
    /// three times them where the three share rows (`packed`).
    gq: u32,
    gk: u32,
}

/// Warps (rows) per block of the row kernels.
const ROW_WARPS: usize = 4;
/// Tile of the forward kernel: queries per block and keys per step; threads per block.
const TILE: usize = 64;
const TILE_THREADS: u32 = 256;
/// Row stride of the probability tile (`AT_PS`); head sizes the tiled kernel takes.
const TILE_PS: usize = 68;
const TILE_MAX_HEAD: usize = 256;
/// Head sizes the tiled backward kernels take (larger ones use the warp-per-row kernels).
const TILE_MAX_BWD_HEAD: usize = 128;

fn strides(t: &Tensor) -> [i64; 4] {
    let s = t.layout().strides();
    [s[0] as i64, s[1] as i64, s[2] as i64, s[3] as i64]
}

fn dims(
    op: &'static str,
    (q, k, v): (&Tensor, &Tensor, &Tensor),
    g: Option<&Tensor>,
    mask: Option<(&Tensor, u64)>,
    causal: bool,
) -> Result<Dims> {
    let bad = || {
        Error::shape(
            op,
            format!(
                "q, k, v must be [b, hq, lq, d], [b, hkv, lk, d], [b, hkv, lk, dv] with hq % hkv == 0; got {}, {}, {}",
                q.shape(),
                k.shape(),
                v.shape()
            ),
        )
    };
    if q.rank() != 4 || k.rank() != 4 || v.rank() != 4 {
        return Err(bad());
    }
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    if qd[0] != kd[0]
        || kd[0] != vd[0]
        || kd[1] != vd[1]
        || kd[2] != vd[2]
        || qd[3] != kd[3]
        || kd[1] == 0
        || !qd[1].is_multiple_of(kd[1])
    {
        return Err(bad());
    }
    if let Some(g) = g {
        if g.dims() != [qd[0], qd[1], qd[2], vd[3]] {
            return Err(Error::shape(
                op,
                format!("upstream gradient {} does not match the output", g.shape()),
            ));
        }
    }
    if let Some((m, _)) = mask {
        if m.dtype() != DType::Bool || m.dims() != [qd[0], kd[2]] {
            return Err(Error::shape(
                op,
                format!(
                    "key mask must be bool [{}, {}], got {} {}",
                    qd[0],
                    kd[2],
                    m.dtype(),
                    m.shape()
                ),
            ));
        }
    }
    let small = |x: usize| {
        u32::try_from(x).map_err(|_| {
            Error::backend(
                op,
                format!("size {x} exceeds the CUDA kernels' 32-bit sizes"),
            )
        })
    };
    Ok(Dims {
        b: small(qd[0])?,
        hq: small(qd[1])?,
        hkv: small(kd[1])?,
        lq: small(qd[2])?,
        lk: small(kd[2])?,
        d: small(qd[3])?,
        dv: small(vd[3])?,
        causal: causal as u32,
        sq: strides(q),
        sk: strides(k),
        sv: strides(v),
        sg: g.map_or([0; 4], strides),
        mask: mask.map_or(0, |(_, p)| p),
        sm: mask.map_or([0; 2], |(m, _)| {
            let s = m.layout().strides();
            [s[0] as i64, s[1] as i64]
        }),
        gq: small(qd[1])?,
        gk: small(kd[1])?,
    })
}

/// Appends a scalar in the kernels' compute type (f64 for f64, else f32).
fn arg_compute(args: Args, dt: DType, v: f64) -> Args {
    if dt == DType::F64 {
        args.arg(v)
    } else {
        args.arg(v as f32)
    }
}

/// Blocks of ROW_WARPS rows for `rows_per` rows in each of `groups` (batch, kv head) pairs.
fn row_grid(op: &'static str, groups: usize, rows_per: usize) -> Result<Cfg> {
    let blocks = groups * rows_per.div_ceil(ROW_WARPS);
    if blocks > i32::MAX as usize {
        return Err(Error::backend(
            op,
            format!("{blocks} blocks exceed the CUDA grid"),
        ));
    }
    Ok(Cfg::new(
        (blocks as u32, 1, 1),
        ((ROW_WARPS * 32) as u32, 1, 1),
        0,
    ))
}

/// Threads per block of the tensor-core kernels.
const MMA_THREADS: u32 = 128;
/// Head sizes the tensor-core forward kernel is built for (`attn_mma{64,96,128,256}`).
const MMA_HEADS: [usize; 4] = [64, 96, 128, 256];
/// Head sizes of the tensor-core backward (`attn_mmas`, `attn_mmadq`, `attn_mmadkv`).
const MMA_BWD_HEADS: [usize; 3] = [64, 96, 128];

/// Head size of the tensor-core kernels when they apply: f16/bf16, d == dv in `heads`, unit
/// last-dim strides, and every row 16-byte aligned (pointers aligned, the strides of dims
/// larger than 1 multiples of 8 elements). `ts` and `ptrs` are the operands the kernels read
/// through shared memory (q, k, v; and g for the backward).
fn mma_head(dt: DType, a: &Dims, heads: &[usize], ts: &[(&Tensor, u64)]) -> Option<usize> {
    let hd = a.d as usize;
    if !matches!(dt, DType::F16 | DType::BF16) || a.d != a.dv || !heads.contains(&hd) {
        return None;
    }
    let rows_ok = |t: &Tensor, p: u64| {
        let st = t.layout().strides();
        p.is_multiple_of(16)
            && st[3] == 1
            && (0..3).all(|i| t.dims()[i] == 1 || st[i].is_multiple_of(8))
    };
    ts.iter().all(|&(t, p)| rows_ok(t, p)).then_some(hd)
}

/// Whether the tensor-core kernels for head size `hd` are the wgmma ones (`attn_wg*64`,
/// compiled where the device's architecture is sm_90a: 64-wide heads) rather than mma.sync's.
fn wgmma(dev: &CudaBackend, hd: usize) -> bool {
    hd == 64 && dev.kernels.arch == "sm_90a"
}

/// Dynamic shared memory of a tensor-core kernel holding `tiles` 64-row tiles of head size
/// `hd` (the wgmma kernels' tiles are unpadded, plus 1 KiB to align the first to 1,024 bytes).
fn mma_smem(dev: &CudaBackend, hd: usize, dt: DType, tiles: usize) -> usize {
    match wgmma(dev, hd) {
        true => tiles * TILE * hd * dt.size_in_bytes() + 1024,
        false => tiles * TILE * (hd + 8) * dt.size_in_bytes(),
    }
}

/// A tensor-core kernel's name: `attn_<wg|mma><kind><hd>_<dtype>`.
fn mma_kernel(dev: &CudaBackend, kind: &str, hd: usize, dt: DType) -> String {
    let family = if wgmma(dev, hd) { "wg" } else { "mma" };
    format!("attn_{family}{kind}{hd}_{}", suffix(dt))
}

fn tile_ld(d: usize) -> usize {
    let mut ld = d.next_multiple_of(4);
    if (ld / 4).is_multiple_of(2) {
        ld += 4;
    }
    ld.max(TILE_PS)
}

/// `Op::Attention`; with `with_lse`, its second output (f32 lse per query row) too: written
/// by the tensor-core forward, by a row pass (`attn_rows` mode 2) for the other families.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    dev: &CudaBackend,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: f64,
    with_lse: bool,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "attention";
    let dt = float_dtype(op, &[q, k, v])?;
    let mask = match mask {
        Some(m) => Some((m, CudaBackend::ptr(m, dev.input(m, op)?))),
        None => None,
    };
    let a = dims(op, (q, k, v), None, mask, causal)?;
    let (sq, sk, sv) = (dev.input(q, op)?, dev.input(k, op)?, dev.input(v, op)?);
    let (b, hq, hkv, lq, d, dv) = (
        a.b as usize,
        a.hq as usize,
        a.hkv as usize,
        a.lq as usize,
        a.d as usize,
        a.dv as usize,
    );
    let out = dev.alloc_out(b * hq * lq * dv, dt, op)?;
    let lse = match with_lse {
        true => Some(dev.alloc_out(b * hq * lq, DType::F32, op)?),
        false => None,
    };
    let lse_ptr = lse.as_ref().map_or(0, |l| l.ptr());
    // Whether the kernel that wrote the output wrote the lse too.
    let mut lse_done = false;
    if b * hq * lq * dv > 0 {
        let (qp, kp, vp) = (
            CudaBackend::ptr(q, sq),
            CudaBackend::ptr(k, sk),
            CudaBackend::ptr(v, sv),
        );
        let blocks = b * hq * lq.div_ceil(TILE);
        if let Some(hd) = mma_head(dt, &a, &MMA_HEADS, &[(q, qp), (k, kp), (v, vp)])
            .filter(|_| blocks <= i32::MAX as usize)
        {
            let smem = mma_smem(dev, hd, dt, 5);
            let cfg = Cfg::new((blocks as u32, 1, 1), (MMA_THREADS, 1, 1), smem as u32);
            let args = Args::new()
                .arg(a)
                .arg((scale * std::f64::consts::LOG2_E) as f32)
                .arg(qp)
                .arg(kp)
                .arg(vp)
                .arg(out.ptr())
                .arg(lse_ptr);
            dev.launch(op, &SOURCE, &mma_kernel(dev, "", hd, dt), cfg, args)?;
            lse_done = true;
        } else if dt != DType::F64
            && d <= TILE_MAX_HEAD
            && dv <= TILE_MAX_HEAD
            && blocks <= i32::MAX as usize
        {
            let dvc = match dv {
                0..=64 => 1,
                65..=128 => 2,
                _ => 4,
            };
            let ld = tile_ld(d);
            let smem = (TILE * ld * 2 + TILE * dvc * 64) * 4;
            let cfg = Cfg::new((blocks as u32, 1, 1), (TILE_THREADS, 1, 1), smem as u32);
            let args = Args::new()
                .arg(a)
                .arg(ld as u32)
                .arg((scale * std::f64::consts::LOG2_E) as f32)
                .arg(qp)
                .arg(kp)
                .arg(vp)
                .arg(out.ptr());
            let name = format!("attn_fwd{dvc}_{}", suffix(dt));
            dev.launch(op, &SOURCE, &name, cfg, args)?;
        } else {
            let args = arg_compute(Args::new().arg(a), dt, scale)
                .arg(qp)
                .arg(kp)
                .arg(vp)
                .arg(0u64)
                .arg(out.ptr())
                .arg(0u64)
                .arg(0u32)
                .arg(0u64);
            let cfg = row_grid(op, b * hkv, (hq / hkv) * lq)?;
            let name = format!("attn_rows_{}", suffix(dt));
            dev.launch(op, &SOURCE, &name, cfg, args)?;
        }
    }
    let Some(lse) = lse else {
        return dev.finish_one(out);
    };
    if !lse_done && b * hq * lq > 0 {
        let (qp, kp, vp) = (
            CudaBackend::ptr(q, sq),
            CudaBackend::ptr(k, sk),
            CudaBackend::ptr(v, sv),
        );
        let args = arg_compute(Args::new().arg(a), dt, scale)
            .arg(qp)
            .arg(kp)
            .arg(vp)
            .arg(0u64)
            .arg(0u64)
            .arg(0u64)
            .arg(2u32)
            .arg(lse.ptr());
        let cfg = row_grid(op, b * hkv, (hq / hkv) * lq)?;
        dev.launch(op, &SOURCE, &format!("attn_rows_{}", suffix(dt)), cfg, args)?;
    }
    dev.finish(vec![out, lse])
}

/// `Op::AttentionBackward`. With `saved` (the forward's output and lse), the tensor-core path
/// takes its statistics from them (`attn_delta`) instead of recomputing the forward; the other
/// families recompute. `packed` (hq = hkv, lq = lk, d = dv: checked by `Tensor`): one output
/// [b, l, 3, h, d], each token's dq, dk and dv rows side by side.
pub(crate) fn attention_backward(
    dev: &CudaBackend,
    [q, k, v, g]: [&Tensor; 4],
    mask: Option<&Tensor>,
    saved: Option<(&Tensor, &Tensor)>,
    causal: bool,
    scale: f64,
    packed: bool,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "attention_backward";
    let dt = float_dtype(op, &[q, k, v, g])?;
    let mask = match mask {
        Some(m) => Some((m, CudaBackend::ptr(m, dev.input(m, op)?))),
        None => None,
    };
    let mut a = dims(op, (q, k, v), Some(g), mask, causal)?;
    let (sq, sk, sv, sg) = (
        dev.input(q, op)?,
        dev.input(k, op)?,
        dev.input(v, op)?,
        dev.input(g, op)?,
    );
    let (b, hq, hkv, lq, lk, d, dv) = (
        a.b as usize,
        a.hq as usize,
        a.hkv as usize,
        a.lq as usize,
        a.lk as usize,
        a.d as usize,
        a.dv as usize,
    );
    let group = hq / hkv;
    // The outputs, and where dq, dk and dv start in them.
    let (outs, [dq, dk, dvo]) = match packed {
        true => {
            let all = dev.alloc_out(3 * b * hq * lq * d, dt, op)?;
            let (p, slot) = (all.ptr(), (hq * d * dt.size_in_bytes()) as u64);
            a.gq = 3 * a.hq;
            a.gk = 3 * a.hkv;
            (vec![all], [p, p + slot, p + 2 * slot])
        }
        false => {
            let outs = vec![
                dev.alloc_out(b * hq * lq * d, dt, op)?,
                dev.alloc_out(b * hkv * lk * d, dt, op)?,
                dev.alloc_out(b * hkv * lk * dv, dt, op)?,
            ];
            let ptrs = [outs[0].ptr(), outs[1].ptr(), outs[2].ptr()];
            (outs, ptrs)
        }
    };
    // Like the CPU: any empty operand makes every gradient zero.
    if b * hkv == 0 || group * lq * d == 0 || lk * d == 0 || lk * dv == 0 {
        for o in &outs {
            let bytes = o.len * dt.size_in_bytes();
            if bytes > 0 {
                // SAFETY: the range is the whole new block; ordered on the compute stream.
                unsafe { cudarc::driver::sys::cuMemsetD8Async(o.ptr(), 0, bytes, dev.compute.0) }
                    .result()
                    .map_err(|e| crate::driver::drv(op, e))?;
            }
        }
        return dev.finish(outs);
    }
    let ptrs = (
        CudaBackend::ptr(q, sq),
        CudaBackend::ptr(k, sk),
        CudaBackend::ptr(v, sv),
        CudaBackend::ptr(g, sg),
    );
    let (qp, kp, vp, gp) = ptrs;
    let sfx = suffix(dt);
    let q_blocks = b * hq * lq.div_ceil(TILE);
    let k_blocks = b * hkv * lk.div_ceil(TILE);
    let sl2 = (scale * std::f64::consts::LOG2_E) as f32;
    let mma = mma_head(
        dt,
        &a,
        &MMA_BWD_HEADS,
        &[(q, qp), (k, kp), (v, vp), (g, gp)],
    );
    if let Some(hd) = mma.filter(|_| q_blocks.max(k_blocks) <= i32::MAX as usize) {
        // Statistics from the tensor-core forward (lse, D per query row), then dq and dk/dv
        // on tensor cores.
        let stats = dev.alloc_out(2 * b * hq * lq, DType::F32, op)?;
        let cfg = |blocks: usize, bytes: usize| {
            Cfg::new((blocks as u32, 1, 1), (MMA_THREADS, 1, 1), bytes as u32)
        };
        // attn_delta reads o's rows 16 bytes at a time.
        let saved = match saved {
            Some((o, lse)) => {
                let po = CudaBackend::ptr(o, dev.input(o, op)?);
                po.is_multiple_of(16).then_some((po, lse))
            }
            None => None,
        };
        if let Some((po, lse)) = saved {
            let sl = dev.input(lse, op)?;
            let args = Args::new()
                .arg(a)
                .arg(po)
                .arg(CudaBackend::ptr(lse, sl))
                .arg(gp)
                .arg(stats.ptr());
            // Eight threads a row, 256 a block.
            let blocks = (b * hq * lq).div_ceil(32);
            let cfg = Cfg::new((blocks as u32, 1, 1), (256, 1, 1), 0);
            dev.launch(op, &SOURCE, &format!("attn_delta_{sfx}"), cfg, args)?;
        } else {
            let args = Args::new()
                .arg(a)
                .arg(sl2)
                .arg(qp)
                .arg(kp)
                .arg(vp)
                .arg(gp)
                .arg(stats.ptr());
            dev.launch(
                op,
                &SOURCE,
                &mma_kernel(dev, "s", hd, dt),
                cfg(q_blocks, mma_smem(dev, hd, dt, 5)),
                args,
            )?;
        }
        let tail = |args: Args| {
            args.arg(sl2)
                .arg(scale as f32)
                .arg(qp)
                .arg(kp)
                .arg(vp)
                .arg(gp)
                .arg(stats.ptr())
        };
        let args = tail(Args::new().arg(a)).arg(dq);
        dev.launch(
            op,
            &SOURCE,
            &mma_kernel(dev, "dq", hd, dt),
            cfg(q_blocks, mma_smem(dev, hd, dt, 6)),
            args,
        )?;
        let args = tail(Args::new().arg(a)).arg(dk).arg(dvo);
        // Six tiles, then the query tiles' statistics [2][64] (float2).
        let bytes = mma_smem(dev, hd, dt, 6) + 2 * TILE * 2 * 4;
        dev.launch(
            op,
            &SOURCE,
            &mma_kernel(dev, "dkv", hd, dt),
            cfg(k_blocks, bytes),
            args,
        )?;
        return dev.finish(outs);
    }
    // (max, sum, D) per query row, in the compute type.
    let stats = dev.alloc_out(3 * b * hq * lq, dt.accumulator(), op)?;
    if dt != DType::F64
        && d <= TILE_MAX_BWD_HEAD
        && dv <= TILE_MAX_BWD_HEAD
        && q_blocks.max(k_blocks) <= i32::MAX as usize
    {
        let (dc, dvc) = (d.div_ceil(64), dv.div_ceil(64));
        let grid = |blocks: usize, floats: usize| {
            Cfg::new(
                (blocks as u32, 1, 1),
                (TILE_THREADS, 1, 1),
                (floats * 4) as u32,
            )
        };
        // Statistics: the forward kernel with (max, sum, D) instead of its output.
        let ld = tile_ld(d);
        let args = Args::new()
            .arg(a)
            .arg(ld as u32)
            .arg(sl2)
            .arg(qp)
            .arg(kp)
            .arg(vp)
            .arg(gp)
            .arg(stats.ptr());
        let cfg = grid(q_blocks, TILE * ld * 2 + TILE * dvc * 64);
        dev.launch(op, &SOURCE, &format!("attn_fwds{dvc}_{sfx}"), cfg, args)?;
        let (ldq, ldv) = (tile_ld(64 * dc), tile_ld(64 * dvc));
        let tail = |args: Args| {
            args.arg(ldq as u32)
                .arg(ldv as u32)
                .arg(sl2)
                .arg(scale as f32)
                .arg(qp)
                .arg(kp)
                .arg(vp)
                .arg(gp)
                .arg(stats.ptr())
        };
        let cfg = grid(q_blocks, 2 * TILE * (ldq + ldv));
        let args = tail(Args::new().arg(a)).arg(dq);
        dev.launch(op, &SOURCE, &format!("attn_bdq{dc}_{sfx}"), cfg, args)?;
        let cfg = grid(
            k_blocks,
            2 * TILE * (ldq + ldv) + 2 * TILE * TILE_PS + 3 * TILE,
        );
        let args = tail(Args::new().arg(a)).arg(dk).arg(dvo);
        dev.launch(op, &SOURCE, &format!("attn_bdkv{dc}{dvc}_{sfx}"), cfg, args)?;
        return dev.finish(outs);
    }
    let base = || {
        arg_compute(Args::new().arg(a), dt, scale)
            .arg(qp)
            .arg(kp)
            .arg(vp)
            .arg(gp)
    };
    let rows = row_grid(op, b * hkv, group * lq)?;
    let args = base().arg(0u64).arg(stats.ptr()).arg(1u32).arg(0u64);
    dev.launch(op, &SOURCE, &format!("attn_rows_{sfx}"), rows, args)?;
    let args = base().arg(stats.ptr()).arg(dq);
    dev.launch(op, &SOURCE, &format!("attn_dq_{sfx}"), rows, args)?;
    let keys = row_grid(op, b * hkv, lk)?;
    let args = base().arg(stats.ptr()).arg(dk).arg(dvo);
    dev.launch(op, &SOURCE, &format!("attn_dkv_{sfx}"), keys, args)?;
    dev.finish(outs)
}
