//! Batch norm and group norm on CUDA (kernels in channel_norm.cu), semantics of ferrite-cpu's
//! channel_norm.rs: one block per channel (batch norm) or per (sample, group) segment (group
//! norm); group norm's weight and bias gradients take a second kernel, one block per channel,
//! over per-segment statistics the first one stores. Inputs are made contiguous first.

use crate::device::CudaBackend;
use crate::kernels::{suffix, Args, Cfg, KernelSource};
use ferrite_core::{no_grad, DType, Error, Result, Storage, Tensor};
use std::sync::Arc;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "channel_norm",
    src: include_str!("channel_norm.cu"),
    prebuilt: crate::prebuilt::CHANNEL_NORM,
};

/// `NORM_BLOCK` in channel_norm.cu.
const BLOCK: u32 = 256;

fn blocks(op: &'static str, n: usize) -> Result<Cfg> {
    let g = u32::try_from(n)
        .ok()
        .filter(|&g| g <= i32::MAX as u32)
        .ok_or_else(|| Error::backend(op, format!("{n} blocks exceed the grid")))?;
    Ok(Cfg::new((g, 1, 1), (BLOCK, 1, 1), 0))
}

/// Contiguous inputs, the float suffix and (n, c, s).
type Prepared = ([Tensor; 3], &'static str, (usize, usize, usize));

fn prepare(op: &'static str, ts: [&Tensor; 3]) -> Result<Prepared> {
    let dt = ts[0].dtype();
    if !matches!(dt, DType::F32 | DType::F64 | DType::F16 | DType::BF16) {
        return Err(Error::dtype(op, dt, "needs a float dtype"));
    }
    let c = no_grad(|| -> Result<[Tensor; 3]> {
        Ok([
            ts[0].contiguous()?,
            ts[1].contiguous()?,
            ts[2].contiguous()?,
        ])
    })?;
    let d = ts[0].dims();
    Ok((c, suffix(dt), (d[0], d[1], d[2..].iter().product())))
}

pub(crate) fn batch_norm(
    dev: &CudaBackend,
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    eps: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "batch_norm";
    let ([x, w, b], sfx, (n, c, s)) = prepare(op, [x, w, b])?;
    let dt = x.dtype();
    let y = dev.alloc_out(x.elem_count(), dt, op)?;
    let mean = dev.alloc_out(c, dt, op)?;
    let var = dev.alloc_out(c, dt, op)?;
    if c > 0 {
        let (sx, sw, sb) = (dev.input(&x, op)?, dev.input(&w, op)?, dev.input(&b, op)?);
        let args = Args::new()
            .arg(n as i64)
            .arg(c as i64)
            .arg(s as i64)
            .arg(eps)
            .arg(CudaBackend::ptr(&x, sx))
            .arg(CudaBackend::ptr(&w, sw))
            .arg(CudaBackend::ptr(&b, sb))
            .arg(y.ptr())
            .arg(mean.ptr())
            .arg(var.ptr());
        dev.launch(op, &SOURCE, &format!("bn_fwd_{sfx}"), blocks(op, c)?, args)?;
    }
    dev.finish(vec![y, mean, var])
}

pub(crate) fn batch_norm_backward(
    dev: &CudaBackend,
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    eps: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "batch_norm_backward";
    let ([x, w, g], sfx, (n, c, s)) = prepare(op, [x, w, g])?;
    let dt = x.dtype();
    let dx = dev.alloc_out(x.elem_count(), dt, op)?;
    let dw = dev.alloc_out(c, dt, op)?;
    let db = dev.alloc_out(c, dt, op)?;
    if c > 0 {
        let (sx, sw, sg) = (dev.input(&x, op)?, dev.input(&w, op)?, dev.input(&g, op)?);
        let args = Args::new()
            .arg(n as i64)
            .arg(c as i64)
            .arg(s as i64)
            .arg(eps)
            .arg(CudaBackend::ptr(&x, sx))
            .arg(CudaBackend::ptr(&w, sw))
            .arg(CudaBackend::ptr(&g, sg))
            .arg(dx.ptr())
            .arg(dw.ptr())
            .arg(db.ptr());
        dev.launch(op, &SOURCE, &format!("bn_bwd_{sfx}"), blocks(op, c)?, args)?;
    }
    dev.finish(vec![dx, dw, db])
}

pub(crate) fn group_norm(
    dev: &CudaBackend,
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    groups: usize,
    eps: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "group_norm";
    let ([x, w, b], sfx, (n, c, s)) = prepare(op, [x, w, b])?;
    let y = dev.alloc_out(x.elem_count(), x.dtype(), op)?;
    if n * groups > 0 && c * s > 0 {
        let (sx, sw, sb) = (dev.input(&x, op)?, dev.input(&w, op)?, dev.input(&b, op)?);
        let args = Args::new()
            .arg(c as i64)
            .arg(s as i64)
            .arg(groups as i64)
            .arg(eps)
            .arg(CudaBackend::ptr(&x, sx))
            .arg(CudaBackend::ptr(&w, sw))
            .arg(CudaBackend::ptr(&b, sb))
            .arg(y.ptr());
        dev.launch(
            op,
            &SOURCE,
            &format!("gn_fwd_{sfx}"),
            blocks(op, n * groups)?,
            args,
        )?;
    }
    dev.finish_one(y)
}

pub(crate) fn group_norm_backward(
    dev: &CudaBackend,
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    groups: usize,
    eps: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "group_norm_backward";
    let ([x, w, g], sfx, (n, c, s)) = prepare(op, [x, w, g])?;
    let dt = x.dtype();
    let dx = dev.alloc_out(x.elem_count(), dt, op)?;
    let dw = dev.alloc_out(c, dt, op)?;
    let db = dev.alloc_out(c, dt, op)?;
    let stat_dt = dt.accumulator();
    let stats = dev.alloc_out(2 * n * groups, stat_dt, op)?;
    if n * groups > 0 && c * s > 0 {
        let (sx, sw, sg) = (dev.input(&x, op)?, dev.input(&w, op)?, dev.input(&g, op)?);
        let (px, pw, pg) = (
            CudaBackend::ptr(&x, sx),
            CudaBackend::ptr(&w, sw),
            CudaBackend::ptr(&g, sg),
        );
        let args = Args::new()
            .arg(c as i64)
            .arg(s as i64)
            .arg(groups as i64)
            .arg(eps)
            .arg(px)
            .arg(pw)
            .arg(pg)
            .arg(dx.ptr())
            .arg(stats.ptr());
        dev.launch(
            op,
            &SOURCE,
            &format!("gn_bwd_dx_{sfx}"),
            blocks(op, n * groups)?,
            args,
        )?;
        let args = Args::new()
            .arg(n as i64)
            .arg(c as i64)
            .arg(s as i64)
            .arg(groups as i64)
            .arg(px)
            .arg(pg)
            .arg(stats.ptr())
            .arg(dw.ptr())
            .arg(db.ptr());
        dev.launch(
            op,
            &SOURCE,
            &format!("gn_bwd_dw_{sfx}"),
            blocks(op, c)?,
            args,
        )?;
    } else if c > 0 {
        // No elements: zero gradients for the parameters.
        drop(stats);
        let mut out = dev.finish(vec![dx])?;
        let z = crate::create::fill(dev, 0.0, &(ferrite_core::Shape::new([c]), dt))?;
        let z2 = crate::create::fill(dev, 0.0, &(ferrite_core::Shape::new([c]), dt))?;
        drop((dw, db));
        out.extend(z);
        out.extend(z2);
        return Ok(out);
    }
    // The statistics buffer returns to the pool in stream order once its storage drops.
    let mut out = dev.finish(vec![dx, dw, db, stats])?;
    out.truncate(3);
    Ok(out)
}
