//! Fused cross-entropy over class indices on CUDA (kernels in cross_entropy.cu): a forward
//! that reads each row of logits once and a backward that reads it once more and writes
//! dlogits. Semantics are ferrite-cpu's cross_entropy.rs; f16/bf16 compute in f32 and keep
//! (loss, lse, w[t]) in f32.

use crate::device::CudaBackend;
use crate::kernels::{suffix, Args, Cfg, KernelSource};
use ferrite_core::{Error, Result, Storage, Tensor};
use std::sync::Arc;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "cross_entropy",
    src: include_str!("cross_entropy.cu"),
    prebuilt: crate::prebuilt::CROSS_ENTROPY,
};

/// Largest block (the kernels' launch bound is 1024; 512 keeps two blocks per SM resident).
const MAX_BLOCK: usize = 512;

struct Prepared {
    x: Tensor,
    t: Tensor,
    w: Tensor,
    /// Σ weight as the kernels' accumulator type (only with label smoothing).
    wsum: Option<Tensor>,
    n: usize,
    c: usize,
    vec16: bool,
    cfg: Cfg,
}

fn prepare(
    dev: &CudaBackend,
    inputs: [&Tensor; 3],
    eps: f64,
    op: &'static str,
) -> Result<Prepared> {
    let [x, t, w] = inputs;
    let (n, c) = match x.dims() {
        [n, c] => (*n, *c),
        _ => {
            return Err(Error::shape(
                op,
                format!("logits must be [n, classes], got {}", x.shape()),
            ))
        }
    };
    if c > u32::MAX as usize {
        return Err(Error::shape(op, format!("{c} classes exceed u32")));
    }
    let (x, t, w) = (x.contiguous()?, t.contiguous()?, w.contiguous()?);
    let wsum = match eps > 0.0 {
        true => Some(w.cast(x.dtype().accumulator())?.sum_all()?.contiguous()?),
        false => None,
    };
    let esz = x.dtype().size_in_bytes();
    let v = 16 / esz;
    let sx = dev.input(&x, op)?;
    let vec16 = c.is_multiple_of(v) && CudaBackend::ptr(&x, sx).is_multiple_of(16);
    let per_thread = if vec16 { v } else { 1 };
    let threads = c.div_ceil(per_thread).div_ceil(32).clamp(1, MAX_BLOCK / 32) * 32;
    let blocks = n.clamp(1, dev.sm_count.max(1) as usize * 32);
    Ok(Prepared {
        x,
        t,
        w,
        wsum,
        n,
        c,
        vec16,
        cfg: Cfg::new((blocks as u32, 1, 1), (threads as u32, 1, 1), 0),
    })
}

fn ptr(dev: &CudaBackend, t: &Tensor, op: &'static str) -> Result<u64> {
    let s = dev.input(t, op)?;
    Ok(CudaBackend::ptr(t, s))
}

/// `Op::CrossEntropy`: (logits [n, c], target [n], weight [c]) -> [n, 3] (loss, lse, w[t])
/// in the logits' accumulator dtype.
pub(crate) fn cross_entropy(
    dev: &CudaBackend,
    inputs: [&Tensor; 3],
    ignore_index: i64,
    eps: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "cross_entropy";
    let p = prepare(dev, inputs, eps, op)?;
    let out = dev.alloc_out(p.n * 3, p.x.dtype().accumulator(), op)?;
    if p.n > 0 {
        let wsum = match &p.wsum {
            Some(s) => ptr(dev, s, op)?,
            None => 0,
        };
        let args = Args::new()
            .arg(ptr(dev, &p.x, op)?)
            .arg(p.n as u64)
            .arg(p.c as u32)
            .arg(ptr(dev, &p.t, op)?)
            .arg(ptr(dev, &p.w, op)?)
            .arg(wsum)
            .arg(ignore_index)
            .arg(eps)
            .arg(p.vec16 as u32)
            .arg(out.ptr())
            .arg(dev.fault_dev);
        let name = format!("ce_fwd_{}_{}", suffix(p.x.dtype()), suffix(p.t.dtype()));
        dev.launch(op, &SOURCE, &name, p.cfg, args)?;
    }
    dev.finish_one(out)
}

/// `Op::CrossEntropyBackward`: (logits, target, weight, out [n, 3], g [n, 3], any strides)
/// -> dlogits.
pub(crate) fn cross_entropy_backward(
    dev: &CudaBackend,
    inputs: [&Tensor; 5],
    ignore_index: i64,
    eps: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "cross_entropy_backward";
    let [x, t, w, saved, g] = inputs;
    let p = prepare(dev, [x, t, w], eps, op)?;
    // Only g's loss column is read: any row stride (0 for a broadcast gradient, as a mean
    // loss's backward gives) is passed as is, without a copy.
    let saved = saved.contiguous()?;
    let g_rows = g.layout().strides()[0] as u64;
    let out = dev.alloc_out(p.n * p.c, p.x.dtype(), op)?;
    let vec16 = p.vec16 && out.ptr().is_multiple_of(16);
    if p.n > 0 && p.c > 0 {
        let wsum = match &p.wsum {
            Some(s) => ptr(dev, s, op)?,
            None => 0,
        };
        let args = Args::new()
            .arg(ptr(dev, &p.x, op)?)
            .arg(p.n as u64)
            .arg(p.c as u32)
            .arg(ptr(dev, &p.t, op)?)
            .arg(ptr(dev, &p.w, op)?)
            .arg(wsum)
            .arg(ignore_index)
            .arg(eps)
            .arg(ptr(dev, &saved, op)?)
            .arg(ptr(dev, g, op)?)
            .arg(g_rows)
            .arg(vec16 as u32)
            .arg(out.ptr())
            .arg(dev.fault_dev);
        let name = format!("ce_bwd_{}_{}", suffix(p.x.dtype()), suffix(p.t.dtype()));
        dev.launch(op, &SOURCE, &name, p.cfg, args)?;
    }
    dev.finish_one(out)
}
