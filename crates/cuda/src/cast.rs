//! `Op::Cast` on CUDA (kernels in cast.cu): every dtype pair, Rust `as` semantics; contiguous
//! casts between f32, f16 and bf16 take the vectorized `cast_c` kernels. `Op::CastEach`:
//! contiguous tensors of such a pair, up to `CE_MAX` a launch (`cast_each`); others one by one.

use crate::device::{CudaBackend, Out};
use crate::elementwise::grid;
use crate::kernels::{suffix, Args, Cfg, Idx, KernelSource};
use ferrite_core::{DType, Error, Result, Storage, Tensor};
use std::sync::Arc;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "cast",
    src: include_str!("cast.cu"),
    prebuilt: crate::prebuilt::CAST,
};

/// `CE_MAX` and `CE_CHUNK` of cast.cu.
const CE_MAX: usize = 64;
const CE_CHUNK: usize = 8192;

/// `CastList` of cast.cu (field order and types match).
#[repr(C)]
#[derive(Clone, Copy)]
struct CastList {
    x: [u64; CE_MAX],
    y: [u64; CE_MAX],
    n: [u64; CE_MAX],
    block0: [u32; CE_MAX + 1],
    count: u32,
}

fn half_pair(a: DType, b: DType) -> bool {
    a != b
        && [a, b]
            .iter()
            .all(|d| matches!(d, DType::F32 | DType::F16 | DType::BF16))
}

/// `Op::CastEach`: each of `xs` (one dtype) cast to `to`. Contiguous tensors of an
/// f32/f16/bf16 pair go `CE_MAX` a launch, a block per `CE_CHUNK` elements; the others (and
/// empty ones) through `cast`.
pub(crate) fn cast_each(
    dev: &CudaBackend,
    xs: &[&Tensor],
    to: DType,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "cast_each";
    let mut outs: Vec<Option<Arc<dyn Storage>>> = vec![None; xs.len()];
    let mut batch: Vec<(usize, u64, Out)> = Vec::new();
    for (i, x) in xs.iter().enumerate() {
        let n = x.elem_count();
        if n == 0 || !x.is_contiguous() || !half_pair(x.dtype(), to) {
            outs[i] = cast(dev, x, to)?.pop();
            continue;
        }
        let s = dev.input(x, op)?;
        batch.push((i, CudaBackend::ptr(x, s), dev.alloc_out(n, to, op)?));
    }
    for group in batch.chunks(CE_MAX) {
        let mut l = CastList {
            x: [0; CE_MAX],
            y: [0; CE_MAX],
            n: [0; CE_MAX],
            block0: [0; CE_MAX + 1],
            count: group.len() as u32,
        };
        let mut blocks = 0usize;
        for (k, (i, ptr, out)) in group.iter().enumerate() {
            let n = xs[*i].elem_count();
            l.x[k] = *ptr;
            l.y[k] = out.ptr();
            l.n[k] = n as u64;
            l.block0[k] = blocks as u32;
            blocks += n.div_ceil(CE_CHUNK);
        }
        if blocks > u32::MAX as usize {
            return Err(Error::backend(
                op,
                format!("{blocks} blocks of {CE_CHUNK} elements exceed one launch"),
            ));
        }
        l.block0[group.len()] = blocks as u32;
        let name = format!("cast_each_{}_{}", suffix(xs[0].dtype()), suffix(to));
        let cfg = Cfg::new((blocks as u32, 1, 1), (256, 1, 1), 0);
        dev.launch(op, &SOURCE, &name, cfg, Args::new().arg(l))?;
    }
    let (slots, done): (Vec<usize>, Vec<Out>) =
        batch.into_iter().map(|(i, _, out)| (i, out)).unzip();
    for (i, s) in slots.into_iter().zip(dev.finish(done)?) {
        outs[i] = Some(s);
    }
    outs.into_iter()
        .map(|o| o.ok_or_else(|| Error::backend(op, "an output is missing")))
        .collect()
}

pub(crate) fn cast(dev: &CudaBackend, x: &Tensor, to: DType) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "cast";
    let s = dev.input(x, op)?;
    let n = x.elem_count();
    let out = dev.alloc_out(n, to, op)?;
    if n > 0 && x.is_contiguous() && half_pair(x.dtype(), to) {
        let args = Args::new()
            .arg(n as u64)
            .arg(CudaBackend::ptr(x, s))
            .arg(out.ptr());
        let name = format!("cast_c_{}_{}", suffix(x.dtype()), suffix(to));
        dev.launch(op, &SOURCE, &name, grid(dev, n as u64, 8), args)?;
    } else if n > 0 {
        let ix = Idx::new(op, x.dims(), &[(x.layout().strides(), x.layout().offset())])?;
        let args = Args::new().arg(ix).arg(s.device_ptr()).arg(out.ptr());
        let name = format!("cast_{}_{}", suffix(x.dtype()), suffix(to));
        dev.launch(op, &SOURCE, &name, grid(dev, n as u64, 1), args)?;
    }
    dev.finish_one(out)
}
