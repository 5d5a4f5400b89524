//! Convolutions and max pooling on CUDA (kernels in conv.cu).
//!
//! Convolutions are im2col + cuBLASLt matmul, so f16/bf16 run on tensor cores (f32 as the
//! device's matmul runs it, TF32 when enabled):
//! - conv2d: cols [n, g, K, oh ow] (K = c/g kh kw), then w [g, o/g, K] (broadcast over n) ·
//!   cols -> [n, g, o/g, oh ow], which is y [n, o, oh, ow] as it lies;
//! - conv_transpose2d (conv2d's input gradient): cols = wᵀ · x, then col2im;
//! - conv2d_backward_weight: cols [g, K, n oh ow] and g [g, o/g, n oh ow], then
//!   dw [g, o/g, K] = g · colsᵀ, one GEMM per group reducing over the batch too.
//!
//! A 1x1 kernel with stride 1 and no padding reads x as its own columns (no im2col), and
//! its transposed form writes the matmul result as dx. Planes under 256 output pixels use
//! the `[g, K, n oh ow]` column layout for the forward pass and the input gradient too: one
//! GEMM per group over the batch, then a permuting copy (forward) or col2im with those
//! strides (input gradient). The matmuls go through the `Tensor`
//! API on this device (graph recording off), intermediates return to the pool when dropped.
//! Each of the three ops tries cuDNN first (cudnn.rs); this path runs where cuDNN is absent,
//! turned off, or rejects the problem, and is the reference the GPU tests compare it with.

use crate::device::CudaBackend;
use crate::elementwise::grid;
use crate::kernels::{suffix, Args, Cfg, KernelSource};
use ferrite_core::{
    no_grad, Conv2dParams, DType, Error, Layout, Pool2dParams, Result, Shape, Storage, Tensor,
};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Below this many output pixels per plane, conv2d and its input gradient run one GEMM per
/// group over the whole batch (columns of all items side by side) rather than a batched GEMM
/// of oh ow columns per item, which fills few tensor-core tiles.
const WHOLE_BATCH_PIX: usize = 256;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "conv",
    src: include_str!("conv.cu"),
    prebuilt: crate::prebuilt::CONV,
};

/// `ConvGeo` in conv.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct ConvGeo {
    n: i64,
    c: i64,
    h: i64,
    w: i64,
    oh: i64,
    ow: i64,
    kh: i64,
    kw: i64,
    s0: i64,
    s1: i64,
    p0: i64,
    p1: i64,
    d0: i64,
    d1: i64,
    cg: i64,
}

/// `PoolGeo` in conv.cu.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct PoolGeo {
    planes: i64,
    h: i64,
    w: i64,
    oh: i64,
    ow: i64,
    k0: i64,
    k1: i64,
    s0: i64,
    s1: i64,
    p0: i64,
    p1: i64,
    d0: i64,
    d1: i64,
    adaptive: i64,
}

type Geo = ferrite_core::ConvGeometry;

/// The geometry as the kernels take it (`ConvGeo` in conv.cu).
fn kernel_geo(g: &Geo) -> ConvGeo {
    let i = |v: usize| v as i64;
    ConvGeo {
        n: i(g.n),
        c: i(g.c),
        h: i(g.h),
        w: i(g.w),
        oh: i(g.oh),
        ow: i(g.ow),
        kh: i(g.kh),
        kw: i(g.kw),
        s0: i(g.p.stride[0]),
        s1: i(g.p.stride[1]),
        p0: i(g.p.padding[0]),
        p1: i(g.p.padding[1]),
        d0: i(g.p.dilation[0]),
        d1: i(g.p.dilation[1]),
        cg: i(g.cg()),
    }
}

/// A contiguous tensor on this device over a fresh storage.
fn wrap(x: &Tensor, storage: Arc<dyn Storage>, dims: Vec<usize>) -> Tensor {
    Tensor::from_storage(
        storage,
        Layout::contiguous(Shape::new(dims)),
        x.device().clone(),
    )
}

/// The storage of `t` when it is exactly a contiguous tensor of `dims` (else a copy's).
fn storage_of(t: Tensor, dims: &[usize]) -> Result<Vec<Arc<dyn Storage>>> {
    let t = t.reshape(dims.to_vec())?.contiguous()?;
    Ok(vec![t.storage_arc().clone()])
}

fn float_suffix(op: &'static str, dt: DType) -> Result<&'static str> {
    match dt {
        DType::F32 | DType::F64 | DType::F16 | DType::BF16 => Ok(suffix(dt)),
        other => Err(Error::dtype(op, other, "needs a float dtype")),
    }
}

/// cols of contiguous `x` with element (n, g, k, p) at n sn + g sg + k sk + p.
fn im2col(
    dev: &CudaBackend,
    op: &'static str,
    x: &Tensor,
    geo: &Geo,
    strides: [usize; 3],
    dims: Vec<usize>,
) -> Result<Tensor> {
    let sfx = float_suffix(op, x.dtype())?;
    let total = geo.n * geo.groups() * geo.k() * geo.pix();
    let out = dev.alloc_out(total, x.dtype(), op)?;
    if total > 0 {
        let sx = dev.input(x, op)?;
        let args = Args::new()
            .arg(kernel_geo(geo))
            .arg(CudaBackend::ptr(x, sx))
            .arg(out.ptr())
            .arg(strides[0] as i64)
            .arg(strides[1] as i64)
            .arg(strides[2] as i64);
        dev.launch(
            op,
            &SOURCE,
            &format!("im2col_{sfx}"),
            grid(dev, total as u64, 1),
            args,
        )?;
    }
    let s = dev.finish_one(out)?.pop();
    let s = s.ok_or_else(|| Error::backend(op, "no output"))?;
    Ok(wrap(x, s, dims))
}

pub(crate) fn conv2d(
    dev: &CudaBackend,
    x: &Tensor,
    w: &Tensor,
    p: &Conv2dParams,
    out: &Shape,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "conv2d";
    let geo = Geo::new(x.dims(), w.dims(), out.dims(), *p);
    if dev.conv_settings().imp == crate::ConvImpl::Auto && small_forward(&geo, x.dtype()) {
        return conv_small(dev, x, w, &geo);
    }
    if let Some(y) = crate::cudnn::conv2d(dev, x, w, p, out)? {
        return Ok(y);
    }
    dev.conv_im2col_calls.fetch_add(1, Ordering::Relaxed);
    let (n, g, k, pix) = (geo.n, geo.groups(), geo.k(), geo.pix());
    no_grad(|| {
        let x = x.contiguous()?;
        if pix < WHOLE_BATCH_PIX {
            // cols [g, K, n pix]; one GEMM per group, then [g, o/g, n, pix] -> [n, o, pix].
            let cols = im2col(
                dev,
                op,
                &x,
                &geo,
                [pix, k * n * pix, n * pix],
                vec![g, k, n * pix],
            )?;
            let yb = w.reshape([g, geo.o / g, k])?.matmul(&cols)?;
            let y = yb
                .reshape([g, geo.o / g, n, pix])?
                .permute(&[2, 0, 1, 3])?
                .contiguous()?;
            return storage_of(y, out.dims());
        }
        let cols = if geo.direct() {
            x.reshape([n, g, k, pix])?
        } else {
            im2col(
                dev,
                op,
                &x,
                &geo,
                [g * k * pix, k * pix, pix],
                vec![n, g, k, pix],
            )?
        };
        let wg = w
            .reshape([1, g, geo.o / g, k])?
            .broadcast_to([n, g, geo.o / g, k])?;
        storage_of(wg.matmul(&cols)?, out.dims())
    })
}

/// Filters a `conv_small` thread computes at most (`WF_O` in conv.cu); most taps of one
/// output (input channels x kernel positions) it takes.
const WF_O: usize = 16;
const WF_TAPS: usize = 64;

/// Whether conv2d's forward is a small filter (one group, at most `WF_O` filters of at most
/// `WF_TAPS` taps) over at least 1,024 positions, which `conv_small` computes directly (the
/// seed CNN's 3 -> 8 3x3 layer: 7M multiply-adds, for which cuDNN's implicit GEMM took ~7 us
/// on an H200); indices fit 32 bits.
fn small_forward(g: &Geo, dt: DType) -> bool {
    let taps = g.c * g.kh * g.kw;
    g.groups() == 1
        && g.o <= WF_O
        && taps <= WF_TAPS
        && g.o * taps * dt.accumulator().size_in_bytes() <= 32 << 10
        && direct_sizes(g)
}

/// The sizes both small-filter kernels need: at least 1,024 output positions, and x and y
/// indexed in 32 bits.
fn direct_sizes(g: &Geo) -> bool {
    let fits_i32 = |n: usize| n < 1 << 31;
    g.n * g.oh * g.ow >= 1024
        && fits_i32(g.n * g.c * g.h * g.w)
        && fits_i32(g.n * g.o * g.oh * g.ow)
}

/// conv2d's forward through `conv_small`: one thread per output position, 128 a block.
fn conv_small(
    dev: &CudaBackend,
    x: &Tensor,
    w: &Tensor,
    geo: &Geo,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "conv2d";
    let sfx = float_suffix(op, x.dtype())?;
    dev.conv_direct_calls.fetch_add(1, Ordering::Relaxed);
    let positions = geo.n * geo.oh * geo.ow;
    no_grad(|| {
        let (x, w) = (x.contiguous()?, w.contiguous()?);
        let y = dev.alloc_out(geo.n * geo.o * geo.oh * geo.ow, x.dtype(), op)?;
        let (sx, sw) = (dev.input(&x, op)?, dev.input(&w, op)?);
        let smem = geo.o * geo.c * geo.kh * geo.kw * x.dtype().accumulator().size_in_bytes();
        let args = Args::new()
            .arg(kernel_geo(geo))
            .arg(geo.o as i64)
            .arg(CudaBackend::ptr(&x, sx))
            .arg(CudaBackend::ptr(&w, sw))
            .arg(y.ptr());
        let blocks = positions.div_ceil(128) as u32;
        let cfg = Cfg::new((blocks, 1, 1), (128, 1, 1), smem as u32);
        dev.launch(op, &SOURCE, &format!("conv_small_{sfx}"), cfg, args)?;
        dev.finish_one(y)
    })
}

/// `x` [n, o, oh, ow] plays conv2d's output gradient; `out` is the input's shape.
pub(crate) fn conv_transpose2d(
    dev: &CudaBackend,
    x: &Tensor,
    w: &Tensor,
    p: &Conv2dParams,
    out: &Shape,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "conv_transpose2d";
    if let Some(dx) = crate::cudnn::conv_transpose2d(dev, x, w, p, out)? {
        return Ok(dx);
    }
    dev.conv_im2col_calls.fetch_add(1, Ordering::Relaxed);
    let sfx = float_suffix(op, x.dtype())?;
    let geo = Geo::new(out.dims(), w.dims(), x.dims(), *p);
    let (n, g, k, pix) = (geo.n, geo.groups(), geo.k(), geo.pix());
    let og = geo.o / g;
    no_grad(|| {
        if pix < WHOLE_BATCH_PIX && pix > 0 {
            // gy as [g, o/g, n pix]; cols [g, K, n pix] = w[g]ᵀ · gy[g], then col2im.
            let gyb = x
                .reshape([n, g, og, pix])?
                .permute(&[1, 2, 0, 3])?
                .contiguous()?
                .reshape([g, og, n * pix])?;
            let wt = w.reshape([g, og, k])?.transpose(-1, -2)?;
            let cols = wt.matmul(&gyb)?;
            return col2im(dev, op, sfx, &cols, &geo, [pix, k * n * pix, n * pix], out);
        }
        let gy = x.reshape([n, g, og, pix])?;
        let wt = w
            .reshape([1, g, og, k])?
            .broadcast_to([n, g, og, k])?
            .transpose(-1, -2)?;
        let cols = wt.matmul(&gy)?.contiguous()?;
        if geo.direct() {
            return storage_of(cols, out.dims());
        }
        col2im(dev, op, sfx, &cols, &geo, [g * k * pix, k * pix, pix], out)
    })
}

/// dx of shape `out` from `cols` with element (n, g, k, p) at n sn + g sg + k sk + p once
/// contiguous.
fn col2im(
    dev: &CudaBackend,
    op: &'static str,
    sfx: &str,
    cols: &Tensor,
    geo: &Geo,
    strides: [usize; 3],
    out: &Shape,
) -> Result<Vec<Arc<dyn Storage>>> {
    let total = out.elem_count();
    let dx = dev.alloc_out(total, cols.dtype(), op)?;
    if total > 0 {
        let cols = cols.contiguous()?;
        let sc = dev.input(&cols, op)?;
        let args = Args::new()
            .arg(kernel_geo(geo))
            .arg(CudaBackend::ptr(&cols, sc))
            .arg(dx.ptr())
            .arg(strides[0] as i64)
            .arg(strides[1] as i64)
            .arg(strides[2] as i64);
        dev.launch(
            op,
            &SOURCE,
            &format!("col2im_{sfx}"),
            grid(dev, total as u64, 1),
            args,
        )?;
    }
    dev.finish_one(dx)
}

/// (x [n, c, h, w], gy [n, o, oh, ow]) -> dw of shape `out` [o, c/g, kh, kw].
pub(crate) fn conv2d_backward_weight(
    dev: &CudaBackend,
    x: &Tensor,
    gy: &Tensor,
    p: &Conv2dParams,
    out: &Shape,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "conv2d_backward_weight";
    let geo = Geo::new(x.dims(), out.dims(), gy.dims(), *p);
    if dev.conv_settings().imp == crate::ConvImpl::Auto && small_filter(&geo, x.dtype()) {
        return wgrad_small(dev, x, gy, &geo);
    }
    if let Some(dw) = crate::cudnn::conv2d_backward_weight(dev, x, gy, p, out)? {
        return Ok(dw);
    }
    dev.conv_im2col_calls.fetch_add(1, Ordering::Relaxed);
    let (n, g, k, pix) = (geo.n, geo.groups(), geo.k(), geo.pix());
    let og = geo.o / g;
    no_grad(|| {
        let x = x.contiguous()?;
        // cols [g, K, n, pix] and gy as [g, o/g, n, pix]: one reduction over n pix per group.
        let cols = im2col(
            dev,
            op,
            &x,
            &geo,
            [pix, k * n * pix, n * pix],
            vec![g, k, n * pix],
        )?;
        let gyt = gy
            .reshape([n, g, og, pix])?
            .permute(&[1, 2, 0, 3])?
            .contiguous()?
            .reshape([g, og, n * pix])?;
        storage_of(gyt.matmul(&cols.transpose(-1, -2)?)?, out.dims())
    })
}

/// Positions `wgrad_small` stages at a time, at least and at most (`WG_RMAX` in conv.cu);
/// outputs per thread, most input taps (`WG_PER`, `WG_CK`); threads per block; shared memory
/// of a stage, at most.
const WG_R: usize = 32;
const WG_RMAX: usize = 256;
const WG_PER: usize = 4;
const WG_CK: usize = 512;
const WG_THREADS: usize = 256;
const WG_SMEM: usize = 48 << 10;

/// Whether the weight gradient is a small filter over a long reduction, which `wgrad_small`
/// computes directly (the seed CNN's 8 x 3 x 3 x 3 filter over 32 x 32 x 32 positions: GEMM
/// shapes of 8 or 27 rows by 32,768, which leave cuDNN's and cuBLAS's kernels mostly idle).
/// Every thread of a block owns at most `WG_PER` of the filter's entries, and the staged
/// positions (the output gradient of every filter and the tap of every input channel) fit
/// in 24 KiB of shared memory; indices fit 32 bits.
fn small_filter(g: &Geo, dt: DType) -> bool {
    let kk = g.kh * g.kw;
    g.o * g.cg() * kk <= WG_PER * WG_THREADS
        && g.c * kk <= WG_CK
        && wg_stage_bytes(g, dt, WG_R) <= 24 << 10
        && direct_sizes(g)
}

/// Shared memory of one `wgrad_small` stage: `r` positions of the output gradient of every
/// filter and of the tap of every input channel, in the accumulator type.
fn wg_stage_bytes(g: &Geo, dt: DType, r: usize) -> usize {
    (g.o + g.c * g.kh * g.kw) * r * dt.accumulator().size_in_bytes()
}

/// conv2d's weight gradient through `wgrad_small` (per-block sums over a range of output
/// positions) and `wgrad_sum` (the blocks' sums added in a fixed order: deterministic).
fn wgrad_small(
    dev: &CudaBackend,
    x: &Tensor,
    gy: &Tensor,
    geo: &Geo,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "conv2d_backward_weight";
    let sfx = float_suffix(op, x.dtype())?;
    dev.conv_direct_calls.fetch_add(1, Ordering::Relaxed);
    let acc = x.dtype().accumulator();
    let w_total = geo.o * geo.cg() * geo.kh * geo.kw;
    let r = geo.n * geo.oh * geo.ow;
    // About 256 blocks, each one stage of up to WG_RMAX positions (its loads in flight
    // together) where the stage fits WG_SMEM, else whole stages of fewer.
    let per_block = r.div_ceil(256).next_power_of_two();
    let mut stage = WG_R;
    while stage < WG_RMAX.min(per_block) && wg_stage_bytes(geo, x.dtype(), 2 * stage) <= WG_SMEM {
        stage *= 2;
    }
    let len = stage * r.div_ceil(stage * 256).max(1);
    let blocks = r.div_ceil(len);
    no_grad(|| {
        let (x, gy) = (x.contiguous()?, gy.contiguous()?);
        let part = dev.alloc_out(blocks * w_total, acc, op)?;
        let dw = dev.alloc_out(w_total, x.dtype(), op)?;
        let (sx, sg) = (dev.input(&x, op)?, dev.input(&gy, op)?);
        let smem = wg_stage_bytes(geo, x.dtype(), stage);
        let args = Args::new()
            .arg(kernel_geo(geo))
            .arg(geo.o as i64)
            .arg(CudaBackend::ptr(&x, sx))
            .arg(CudaBackend::ptr(&gy, sg))
            .arg(part.ptr())
            .arg(len as i64)
            .arg(stage.trailing_zeros());
        dev.launch(
            op,
            &SOURCE,
            &format!("wgrad_small_{sfx}"),
            Cfg::new(
                (blocks as u32, 1, 1),
                (WG_THREADS as u32, 1, 1),
                smem as u32,
            ),
            args,
        )?;
        let args = Args::new()
            .arg(part.ptr())
            .arg(blocks as i64)
            .arg(w_total as i64)
            .arg(dw.ptr());
        dev.launch(
            op,
            &SOURCE,
            &format!("wgrad_sum_{sfx}"),
            Cfg::new((w_total as u32, 1, 1), (WG_THREADS as u32, 1, 1), 0),
            args,
        )?;
        drop(part);
        dev.finish_one(dw)
    })
}

/// Fixed windows `Some(p)`, or PyTorch's adaptive windows for `None`.
pub(crate) fn max_pool2d(
    dev: &CudaBackend,
    x: &Tensor,
    p: Option<&Pool2dParams>,
    out: &Shape,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = if p.is_some() {
        "max_pool2d"
    } else {
        "adaptive_max_pool2d"
    };
    let unit = Pool2dParams {
        kernel: [1, 1],
        stride: [1, 1],
        padding: [0, 0],
        dilation: [1, 1],
        ceil_mode: false,
    };
    let adaptive = p.is_none();
    let p = p.unwrap_or(&unit);
    let sfx = float_suffix(op, x.dtype())?;
    let d = x.dims();
    if d[2] * d[3] > u32::MAX as usize {
        return Err(Error::shape(
            op,
            format!("planes of {} do not fit u32 indices", x.shape()),
        ));
    }
    let x = no_grad(|| x.contiguous())?;
    let total = out.elem_count();
    let vals = dev.alloc_out(total, x.dtype(), op)?;
    let idx = dev.alloc_out(total, DType::U32, op)?;
    if total > 0 {
        let i = |v: usize| v as i64;
        let geo = PoolGeo {
            planes: i(d[0] * d[1]),
            h: i(d[2]),
            w: i(d[3]),
            oh: i(out.dims()[2]),
            ow: i(out.dims()[3]),
            k0: i(p.kernel[0]),
            k1: i(p.kernel[1]),
            s0: i(p.stride[0]),
            s1: i(p.stride[1]),
            p0: i(p.padding[0]),
            p1: i(p.padding[1]),
            d0: i(p.dilation[0]),
            d1: i(p.dilation[1]),
            adaptive: adaptive as i64,
        };
        let sx = dev.input(&x, op)?;
        let args = Args::new()
            .arg(geo)
            .arg(CudaBackend::ptr(&x, sx))
            .arg(vals.ptr())
            .arg(idx.ptr());
        dev.launch(
            op,
            &SOURCE,
            &format!("max_pool2d_{sfx}"),
            grid(dev, total as u64, 1),
            args,
        )?;
    }
    dev.finish(vec![vals, idx])
}
