//! Fused row ops on CUDA (kernels in norm.cu): softmax, log_softmax, layer_norm, rms_norm,
//! RoPE, and the backward kernels of the norms and softmax. Semantics are ferrite-cpu's
//! norm.rs; f16/bf16 compute in f32.
//!
//! Inputs are read in place when their rows are one stride apart with a unit inner stride
//! (contiguous tensors, narrowed views, broadcast rows); other views (e.g. transposed) are
//! first copied contiguous. Each op picks one of three launch shapes by row length (see
//! norm.cu): a warp (or a part of one) per row for short rows, a block per row with the row
//! held in registers, or a block per row that re-reads it per pass (very long rows).
//! Weight and bias gradients are column sums over rows: per-chunk partial sums into a
//! temporary buffer, then one ordered sum per column (deterministic, no atomics).

use crate::device::{CudaBackend, Out};
use crate::elementwise::copy_into;
use crate::kernels::{suffix, Args, Cfg, KernelSource};
use ferrite_core::{DType, Error, Result, Storage, Tensor};
use std::sync::Arc;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "norm",
    src: include_str!("norm.cu"),
    prebuilt: crate::prebuilt::NORM,
};

/// 16-byte chunks each thread holds in registers (`E_WARP`, `E_FWD`, `E_BWD` in norm.cu): per
/// lane in the warp shape; per thread in the block shape, one-input and two-input ops.
const E_WARP: usize = 4;
const E_FWD: usize = 8;
const E_BWD: usize = 4;
/// Largest block of the register-cached block-per-row kernels (`_b`'s launch bound).
const MAX_CACHED_BLOCK: usize = 512;
/// Block of the re-reading block-per-row kernels (`_l`).
const LOOP_BLOCK: usize = 1024;
/// Chunks per thread the block-per-row shape aims for.
const CHUNKS_PER_THREAD: usize = 4;
const MAX_GRID: usize = i32::MAX as usize;

/// The float dtype shared by all inputs; the CPU's errors otherwise.
pub(crate) fn float_dtype(op: &'static str, ts: &[&Tensor]) -> Result<DType> {
    let dt = ts[0].dtype();
    for t in ts {
        if !t.dtype().is_float() {
            return Err(Error::dtype(op, t.dtype(), "needs a float dtype"));
        }
        if t.dtype() != dt {
            return Err(Error::backend(op, "inputs of mixed precision"));
        }
    }
    Ok(dt)
}

/// (rows, n): the tensor as rows of its last dim (a scalar is one row of one element).
fn rows_of(t: &Tensor) -> (usize, usize) {
    match t.dims().split_last() {
        Some((&n, lead)) => (lead.iter().product(), n),
        None => (1, 1),
    }
}

/// The row stride (elements) of `t` seen as rows of its last dim: its last dim has unit
/// stride (or size 1) and its other dims, size-1 dims aside, step by one stride.
fn row_stride(t: &Tensor) -> Option<usize> {
    let (dims, st) = (t.dims(), t.layout().strides());
    let Some((&n, lead)) = dims.split_last() else {
        return Some(1);
    };
    if n > 1 && st[lead.len()] != 1 {
        return None;
    }
    let mut stride = None;
    let mut next = 0;
    for k in (0..lead.len()).rev() {
        if dims[k] == 1 {
            continue;
        }
        if stride.is_some() && st[k] != next {
            return None;
        }
        stride.get_or_insert(st[k]);
        next = st[k] * dims[k];
    }
    Some(stride.unwrap_or(n))
}

/// One operand as rows: address of row 0, row stride in elements, and the contiguous copy
/// the address points into when the view needed one (kept alive until the launch is queued).
struct Rows {
    ptr: u64,
    stride: usize,
    _copy: Option<Out>,
}

fn rows_in(dev: &CudaBackend, t: &Tensor, op: &'static str) -> Result<Rows> {
    let s = dev.input(t, op)?;
    Ok(match row_stride(t) {
        Some(stride) => Rows {
            ptr: CudaBackend::ptr(t, s),
            stride,
            _copy: None,
        },
        None => {
            let c = copy_into(dev, s, t.layout(), op)?;
            Rows {
                ptr: c.ptr(),
                stride: rows_of(t).1,
                _copy: Some(c),
            }
        }
    })
}

/// Whether every row start and vector is 16-byte aligned and rows are whole 16-byte chunks
/// (the kernels' `vec`).
fn aligned(dt: DType, rows: usize, n: usize, ins: &[&Rows], ptrs: &[u64]) -> bool {
    let esz = dt.size_in_bytes();
    (n * esz).is_multiple_of(16)
        && ins
            .iter()
            .all(|r| r.ptr % 16 == 0 && (rows <= 1 || (r.stride * esz).is_multiple_of(16)))
        && ptrs.iter().all(|p| p % 16 == 0)
}

/// Kernel-name infix and launch shape for `rows` rows of `n` elements, `e` cached chunks per
/// thread in the block shape (norm.cu's `_w`, `_b`, `_l`).
fn plan(rows: usize, n: usize, dt: DType, e: usize) -> (&'static str, Cfg) {
    let nc = n.div_ceil(16 / dt.size_in_bytes());
    if n <= 1024 && nc <= 32 * E_WARP {
        let rows_per_block = 8 * (32 / warp_group(nc));
        let grid = rows.div_ceil(rows_per_block).min(MAX_GRID) as u32;
        return ("w", Cfg::new((grid, 1, 1), (256, 1, 1), 0));
    }
    let grid = rows.min(MAX_GRID) as u32;
    let p = nc
        .div_ceil(CHUNKS_PER_THREAD.min(e))
        .next_multiple_of(32)
        .min(MAX_CACHED_BLOCK);
    if p * e >= nc {
        ("b", Cfg::new((grid, 1, 1), (p as u32, 1, 1), 0))
    } else {
        ("l", Cfg::new((grid, 1, 1), (LOOP_BLOCK as u32, 1, 1), 0))
    }
}

/// E of the f32 layer norm kernels with a warp per row (`layer_norm*_r{E}_f32`, n <= 128 E):
/// f32 rows of 129 to 1024 elements in 16-byte chunks (`vec`), E rounded up to 2, 3, 4, 6 or 8.
fn rows_kernel(dt: DType, vec: bool, n: usize) -> Option<usize> {
    if dt != DType::F32 || !vec {
        return None;
    }
    match n.div_ceil(128) {
        e @ (2..=4) => Some(e),
        5 | 6 => Some(6),
        7 | 8 => Some(8),
        _ => None,
    }
}

/// Lanes per row in the warp shape: a power of two ≤ 32 giving each lane about two chunks
/// (`warp_group` in norm.cu).
fn warp_group(nc: usize) -> usize {
    let mut g = 1;
    while g < 32 && 2 * g < nc {
        g *= 2;
    }
    g
}

/// Row lengths the kernels index with 32-bit chunk numbers.
fn check_row_len(op: &'static str, n: usize) -> Result<()> {
    if n > i32::MAX as usize {
        return Err(Error::backend(
            op,
            format!("rows of {n} elements exceed the CUDA kernels' limit of 2^31 - 1"),
        ));
    }
    Ok(())
}

/// The kernel-name infix for f32 rows whose partner (`role` "o": the output, "g": the
/// gradient) is `other`: "" when it is f32 too, `_obf16`, `_gf16`, ... for 16-bit.
fn half_partner(op: &'static str, dt: DType, other: DType, role: &str) -> Result<String> {
    match (dt, other) {
        (a, b) if a == b => Ok(String::new()),
        (DType::F32, DType::BF16 | DType::F16) => Ok(format!("_{role}{}", suffix(other))),
        _ => Err(Error::dtype(
            op,
            other,
            format!("a {dt} norm takes {dt}, or f16/bf16 with f32"),
        )),
    }
}

/// Appends a scalar in the kernels' compute type (f64 for f64, else f32).
fn arg_compute(args: Args, dt: DType, v: f64) -> Args {
    if dt == DType::F64 {
        args.arg(v)
    } else {
        args.arg(v as f32)
    }
}

fn compute_dtype(dt: DType) -> DType {
    if dt == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

pub(crate) fn softmax(dev: &CudaBackend, x: &Tensor, log: bool) -> Result<Vec<Arc<dyn Storage>>> {
    let op = if log { "log_softmax" } else { "softmax" };
    let dt = float_dtype(op, &[x])?;
    let (rows, n) = rows_of(x);
    let xr = rows_in(dev, x, op)?;
    let out = dev.alloc_out(rows * n, dt, op)?;
    if rows * n > 0 {
        check_row_len(op, n)?;
        let vec = aligned(dt, rows, n, &[&xr], &[out.ptr()]);
        let (shape, cfg) = plan(rows, n, dt, E_FWD);
        let args = Args::new()
            .arg(rows as u64)
            .arg(n as u32)
            .arg(xr.ptr)
            .arg(xr.stride as u64)
            .arg(out.ptr())
            .arg(vec as u32)
            .arg(log as u32);
        let name = format!("softmax_{shape}_{}", suffix(dt));
        dev.launch(op, &SOURCE, &name, cfg, args)?;
    }
    dev.finish_one(out)
}

pub(crate) fn layer_norm(
    dev: &CudaBackend,
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f64,
    out_dt: DType,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "layer_norm";
    let dt = float_dtype(op, &[x, w, b])?;
    // f32 rows may be written as f16/bf16 (`layer_norm_o{bf16,f16}` kernels).
    let infix = half_partner(op, dt, out_dt, "o")?;
    let (rows, n) = rows_of(x);
    let (xr, wr, br) = (
        rows_in(dev, x, op)?,
        rows_in(dev, w, op)?,
        rows_in(dev, b, op)?,
    );
    let out = dev.alloc_out(rows * n, out_dt, op)?;
    if rows * n > 0 {
        check_row_len(op, n)?;
        let vec = aligned(dt, rows, n, &[&xr], &[wr.ptr, br.ptr, out.ptr()]);
        let (name, cfg) = match rows_kernel(dt, vec, n) {
            Some(e) => {
                // Four blocks of 256 threads a multiprocessor (two: 11.1 us on char-GPT's
                // rows against 9.3; eight: 9.5), at least two rows a warp where there are
                // rows enough.
                let blocks = (dev.sm_count.max(1) as usize * 4).min(rows.div_ceil(16));
                let cfg = Cfg::new((blocks as u32, 1, 1), (256, 1, 1), 0);
                (format!("layer_norm{infix}_r{e}_f32"), cfg)
            }
            None => {
                let (shape, cfg) = plan(rows, n, dt, E_FWD);
                (format!("layer_norm{infix}_{shape}_{}", suffix(dt)), cfg)
            }
        };
        let args = Args::new()
            .arg(rows as u64)
            .arg(n as u32)
            .arg(xr.ptr)
            .arg(xr.stride as u64)
            .arg(wr.ptr)
            .arg(br.ptr)
            .arg(out.ptr())
            .arg(vec as u32);
        let args = arg_compute(args, dt, eps);
        dev.launch(op, &SOURCE, &name, cfg, args)?;
    }
    dev.finish_one(out)
}

pub(crate) fn rms_norm(
    dev: &CudaBackend,
    x: &Tensor,
    w: &Tensor,
    eps: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "rms_norm";
    let dt = float_dtype(op, &[x, w])?;
    let (rows, n) = rows_of(x);
    let (xr, wr) = (rows_in(dev, x, op)?, rows_in(dev, w, op)?);
    let out = dev.alloc_out(rows * n, dt, op)?;
    if rows * n > 0 {
        check_row_len(op, n)?;
        let vec = aligned(dt, rows, n, &[&xr], &[wr.ptr, out.ptr()]);
        let (shape, cfg) = plan(rows, n, dt, E_FWD);
        let args = Args::new()
            .arg(rows as u64)
            .arg(n as u32)
            .arg(xr.ptr)
            .arg(xr.stride as u64)
            .arg(wr.ptr)
            .arg(out.ptr())
            .arg(vec as u32);
        let args = arg_compute(args, dt, eps);
        let name = format!("rms_norm_{shape}_{}", suffix(dt));
        dev.launch(op, &SOURCE, &name, cfg, args)?;
    }
    dev.finish_one(out)
}

pub(crate) fn rope(
    dev: &CudaBackend,
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    interleaved: bool,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "rope";
    let dt = float_dtype(op, &[x, cos, sin])?;
    let r = x.rank();
    if r < 2 {
        return Err(Error::shape(
            op,
            format!("x must be [..., l, d], got {}", x.shape()),
        ));
    }
    let (l, d) = (x.dims()[r - 2], x.dims()[r - 1]);
    let (rows, _) = rows_of(x);
    let (xr, cr, sr) = (
        rows_in(dev, x, op)?,
        rows_in(dev, cos, op)?,
        rows_in(dev, sin, op)?,
    );
    let out = dev.alloc_out(rows * d, dt, op)?;
    let h = d / 2;
    if rows * h > 0 {
        check_row_len(op, d)?;
        if l > u32::MAX as usize {
            return Err(Error::backend(op, format!("{l} positions exceed 2^32 - 1")));
        }
        let bx = h.next_multiple_of(32).min(256);
        let by = 256 / bx;
        let grid_x = rows.div_ceil(by).min(MAX_GRID) as u32;
        let grid_y = h.div_ceil(bx);
        if grid_y > u16::MAX as usize {
            return Err(Error::backend(op, format!("head dim {d} is too large")));
        }
        let cfg = Cfg::new((grid_x, grid_y as u32, 1), (bx as u32, by as u32, 1), 0);
        let args = Args::new()
            .arg(rows as u64)
            .arg(h as u32)
            .arg(l as u32)
            .arg(xr.ptr)
            .arg(xr.stride as u64)
            .arg(cr.ptr)
            .arg(cr.stride as u64)
            .arg(sr.ptr)
            .arg(sr.stride as u64)
            .arg(out.ptr())
            .arg(interleaved as u32);
        dev.launch(op, &SOURCE, &format!("rope_{}", suffix(dt)), cfg, args)?;
    }
    dev.finish_one(out)
}

pub(crate) fn softmax_backward(
    dev: &CudaBackend,
    y: &Tensor,
    g: &Tensor,
    log: bool,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = if log {
        "log_softmax_backward"
    } else {
        "softmax_backward"
    };
    let dt = float_dtype(op, &[y, g])?;
    let (rows, n) = rows_of(y);
    let (yr, gr) = (rows_in(dev, y, op)?, rows_in(dev, g, op)?);
    let out = dev.alloc_out(rows * n, dt, op)?;
    if rows * n > 0 {
        check_row_len(op, n)?;
        let vec = aligned(dt, rows, n, &[&yr, &gr], &[out.ptr()]);
        let (shape, cfg) = plan(rows, n, dt, E_BWD);
        let args = Args::new()
            .arg(rows as u64)
            .arg(n as u32)
            .arg(yr.ptr)
            .arg(yr.stride as u64)
            .arg(gr.ptr)
            .arg(gr.stride as u64)
            .arg(out.ptr())
            .arg(vec as u32)
            .arg(log as u32);
        let name = format!("softmax_bwd_{shape}_{}", suffix(dt));
        dev.launch(op, &SOURCE, &name, cfg, args)?;
    }
    dev.finish_one(out)
}

pub(crate) fn rms_norm_backward(
    dev: &CudaBackend,
    xwg: [&Tensor; 3],
    acc: Option<&Tensor>,
    eps: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    norm_backward(dev, "rms_norm_backward", xwg, acc, eps, false)
}

pub(crate) fn layer_norm_backward(
    dev: &CudaBackend,
    xwg: [&Tensor; 3],
    acc: Option<&Tensor>,
    eps: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    norm_backward(dev, "layer_norm_backward", xwg, acc, eps, true)
}

/// dx by a row kernel, with `acc` (x's dtype and shape, rows read through their stride) added
/// to it; then dweight (and dbias with `bias`) as column sums over rows in two ordered
/// stages: the warp-shaped row kernel sums its blocks' rows itself, the others write each
/// row's (mean, 1/std) (mean 0 for rms_norm) for a second kernel that sums row chunks.
fn norm_backward(
    dev: &CudaBackend,
    op: &'static str,
    [x, w, g]: [&Tensor; 3],
    acc: Option<&Tensor>,
    eps: f64,
    bias: bool,
) -> Result<Vec<Arc<dyn Storage>>> {
    let dt = float_dtype(op, &[x, w])?;
    // A 16-bit gradient of f32 rows (a layer norm whose output was 16-bit).
    let ginfix = match bias {
        true => half_partner(op, dt, g.dtype(), "g")?,
        false => float_dtype(op, &[x, g]).map(|_| String::new())?,
    };
    let (rows, n) = rows_of(x);
    let (xr, wr, gr) = (
        rows_in(dev, x, op)?,
        rows_in(dev, w, op)?,
        rows_in(dev, g, op)?,
    );
    let ar = acc.map(|a| rows_in(dev, a, op)).transpose()?;
    let dx = dev.alloc_out(rows * n, dt, op)?;
    let dw = dev.alloc_out(n, dt, op)?;
    let db = if bias {
        Some(dev.alloc_out(n, dt, op)?)
    } else {
        None
    };
    if n > 0 {
        check_row_len(op, n)?;
        let ct = compute_dtype(dt);
        let k = if bias { 2 } else { 1 };
        let (shape, mut cfg) = plan(rows, n, dt, E_BWD);
        // The warp-shaped row kernel (`w`: rows of at most 512 f32) also sums dw (and db)
        // over each block's rows into `part` (k * n values a block; its row groups' sums
        // meet in shared memory): two blocks of 256 threads a multiprocessor (four and eight
        // measured slower on char-GPT's rows), each of at least 16 rows. Otherwise a second
        // kernel reads x and g again: the block-shaped kernels hold one row a block, and
        // enough of them to keep the device busy would leave too many partial sums.
        let sm = dev.sm_count.max(1) as usize;
        let mut ins = vec![&xr, &gr];
        ins.extend(&ar);
        let vec = aligned(dt, rows, n, &ins, &[wr.ptr, dx.ptr()]);
        // The row kernels' parameters: `stats` for the separate weight sums, `part` for the
        // block sums.
        let args = |stats: u64, part: u64| {
            let args = Args::new()
                .arg(rows as u64)
                .arg(n as u32)
                .arg(xr.ptr)
                .arg(xr.stride as u64)
                .arg(wr.ptr)
                .arg(gr.ptr)
                .arg(gr.stride as u64)
                .arg(dx.ptr())
                .arg(ar.as_ref().map_or(0, |a| a.ptr))
                .arg(ar.as_ref().map_or(0, |a| a.stride) as u64)
                .arg(stats)
                .arg(part)
                .arg(vec as u32);
            arg_compute(args, dt, eps)
        };
        // f32 layer norms of 129 to 1024 columns: `layer_norm_bwd*_r{E}_f32`, a warp per
        // row with E chunks a lane (E rounded up to 2, 3, 4, 6 or 8), two blocks of 256
        // threads a multiprocessor (three and four measured 5-7% slower), at least two rows
        // a warp where there are rows enough, dw and db summed per block.
        let rows_e = match bias && rows > 0 {
            true => rows_kernel(dt, vec, n),
            false => None,
        };
        if let Some(e) = rows_e {
            let blocks = (sm * 2).min(rows.div_ceil(16));
            let part = dev.alloc_out(blocks * 2 * n, ct, op)?;
            let name = format!("layer_norm_bwd{ginfix}_r{e}_f32");
            let cfg = Cfg::new((blocks as u32, 1, 1), (256, 1, 1), 0);
            dev.launch(op, &SOURCE, &name, cfg, args(0, part.ptr()))?;
            dw_final(dev, op, dt, n, blocks, true, &part, &dw, db.as_ref())?;
            let mut outs = vec![dx, dw];
            outs.extend(db);
            return dev.finish(outs);
        }
        let groups = 256 / warp_group(n.div_ceil(16 / dt.size_in_bytes()));
        let shared = groups * k * n * ct.size_in_bytes();
        let fused = rows > 0 && shape == "w" && shared <= 48 * 1024;
        let (chunks, stats) = match fused {
            true => {
                let blocks = (sm * 2).min(rows.div_ceil(16)).max(1);
                cfg.grid.0 = blocks as u32;
                cfg.smem = shared as u32;
                (blocks, None)
            }
            false => {
                // Stage 1's chunks: enough to fill the device, each at least 64 rows.
                let tiles = n.div_ceil(32);
                let chunks = (sm * 8)
                    .div_ceil(tiles)
                    .min(rows.div_ceil(64))
                    .clamp(1, u16::MAX as usize);
                (chunks, Some(dev.alloc_out(2 * rows, ct, op)?))
            }
        };
        let part = dev.alloc_out(chunks * k * n, ct, op)?;
        if rows > 0 {
            let args = args(
                stats.as_ref().map_or(0, |s| s.ptr()),
                if fused { part.ptr() } else { 0 },
            );
            let kind = if bias {
                "layer_norm_bwd"
            } else {
                "rms_norm_bwd"
            };
            let name = format!("{kind}{ginfix}_{shape}_{}", suffix(dt));
            dev.launch(op, &SOURCE, &name, cfg, args)?;
        }
        if let Some(stats) = &stats {
            // Stage 1: column sums over row chunks.
            let rpc = rows.div_ceil(chunks).max(1);
            let cfg = Cfg::new(
                (n.div_ceil(32).min(MAX_GRID) as u32, chunks as u32, 1),
                (32, 8, 1),
                0,
            );
            let args = Args::new()
                .arg(rows as u64)
                .arg(n as u32)
                .arg(rpc as u64)
                .arg(xr.ptr)
                .arg(xr.stride as u64)
                .arg(gr.ptr)
                .arg(gr.stride as u64)
                .arg(stats.ptr())
                .arg(bias as u32)
                .arg(part.ptr());
            let name = format!("norm_dw_part{ginfix}_{}", suffix(dt));
            dev.launch(op, &SOURCE, &name, cfg, args)?;
        }
        dw_final(dev, op, dt, n, chunks, bias, &part, &dw, db.as_ref())?;
    }
    let mut outs = vec![dx, dw];
    outs.extend(db);
    dev.finish(outs)
}

/// Stage 2 of a norm's weight (and bias) gradient: one sum per column of dw (and of db) over
/// the `chunks` partial sums in `part` ([chunks][1 + bias][n], compute dtype), in a fixed order.
#[allow(clippy::too_many_arguments)]
fn dw_final(
    dev: &CudaBackend,
    op: &'static str,
    dt: DType,
    n: usize,
    chunks: usize,
    bias: bool,
    part: &Out,
    dw: &Out,
    db: Option<&Out>,
) -> Result<()> {
    let blocks = (n.div_ceil(32).min(MAX_GRID) as u32, 1 + bias as u32, 1);
    let lanes = chunks.next_power_of_two().clamp(8, 32) as u32;
    let args = Args::new()
        .arg(n as u32)
        .arg(chunks as u32)
        .arg(bias as u32)
        .arg(part.ptr())
        .arg(dw.ptr())
        .arg(db.map_or(0, |o| o.ptr()));
    let name = format!("norm_dw_final_{}", suffix(dt));
    dev.launch(
        op,
        &SOURCE,
        &name,
        Cfg::new(blocks, (32, lanes, 1), 0),
        args,
    )
}
