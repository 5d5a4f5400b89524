//! index_select, gather, scatter_add (`index.wgsl`) and cat (strided copies into the output).

use crate::device::WgpuBackend;
use crate::elementwise::copy_into;
use crate::errors;
use crate::shader::{self, kernel, Kernel, Variant};
use crate::util::{contig, groups, storage, uw};
use ferrite_core::{DType, Error, Layout, Result, Shape, Storage, Tensor};
use std::sync::Arc;

pub(crate) static INDEX: Kernel = kernel!(
    "index",
    &["index_select", "gather", "scatter_add"],
    &[("T", shader::ALL), ("I", shader::INDEX)],
    &[&[], &["SCATTER"]]
);

/// Ranks the indexing kernels handle (their coordinate arrays).
const MAX_RANK: usize = 8;

fn check_rank(op: &'static str, r: usize) -> Result<()> {
    if r > MAX_RANK {
        return Err(Error::shape(
            op,
            format!("rank {r} exceeds the {MAX_RANK} the wgpu kernels handle"),
        ));
    }
    Ok(())
}

fn index_dtype(op: &'static str, dt: DType) -> Result<DType> {
    match dt {
        DType::I32 | DType::I64 | DType::U32 | DType::U8 => Ok(dt),
        _ => Err(Error::dtype(op, dt, "indices must be an integer dtype")),
    }
}

pub(crate) fn index_select(
    dev: &WgpuBackend,
    x: &Tensor,
    idx: &Tensor,
    axis: usize,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = "index_select";
    let idt = index_dtype(name, idx.dtype())?;
    let dims = x.dims();
    let outer: usize = dims[..axis].iter().product();
    let inner: usize = dims[axis + 1..].iter().product();
    let nidx = idx.elem_count();
    let n = outer * nidx * inner;
    let out = dev.alloc(name, x.dtype(), n)?;
    let xc = contig(dev, x, name)?;
    let ic = contig(dev, idx, name)?;
    let p = [
        uw(name, n)?,
        uw(name, outer)?,
        uw(name, dims[axis])?,
        uw(name, nidx)?,
        uw(name, inner)?,
        xc.offset(),
        ic.offset(),
        errors::INDEX_SELECT,
    ];
    let v = Variant::new(&[("T", DType::U32), ("I", idt)], &[]);
    dev.launch(
        name,
        &INDEX,
        "index_select",
        &v,
        &p,
        &[&out],
        &[xc.buffer(), ic.buffer()],
        true,
        groups(n),
    )?;
    Ok(vec![Arc::new(out)])
}

pub(crate) fn gather(
    dev: &WgpuBackend,
    x: &Tensor,
    idx: &Tensor,
    axis: usize,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = "gather";
    let idt = index_dtype(name, idx.dtype())?;
    check_rank(name, idx.rank())?;
    let n = idx.elem_count();
    let out = dev.alloc(name, x.dtype(), n)?;
    let ic = contig(dev, idx, name)?;
    let mut p = vec![
        uw(name, n)?,
        uw(name, idx.rank())?,
        uw(name, axis)?,
        uw(name, x.dims()[axis])?,
        ic.offset(),
        errors::GATHER,
        uw(name, x.layout().offset())?,
    ];
    for &d in idx.dims() {
        p.push(uw(name, d)?);
    }
    for &s in x.layout().strides() {
        p.push(uw(name, s)?);
    }
    let v = Variant::new(&[("T", DType::U32), ("I", idt)], &[]);
    dev.launch(
        name,
        &INDEX,
        "gather",
        &v,
        &p,
        &[&out],
        &[storage(x, name)?.buffer(), ic.buffer()],
        true,
        groups(n),
    )?;
    Ok(vec![Arc::new(out)])
}

pub(crate) fn scatter_add(
    dev: &WgpuBackend,
    base: &Tensor,
    idx: &Tensor,
    src: &Tensor,
    axis: usize,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = "scatter_add";
    let idt = index_dtype(name, idx.dtype())?;
    check_rank(name, base.rank())?;
    let n = base.elem_count();
    let out = dev.alloc(name, base.dtype(), n)?;
    let ic = contig(dev, idx, name)?;
    let mut p = vec![
        uw(name, n)?,
        uw(name, base.rank())?,
        uw(name, axis)?,
        uw(name, base.dims()[axis])?,
        ic.offset(),
        errors::SCATTER_ADD,
        uw(name, base.layout().offset())?,
        uw(name, src.layout().offset())?,
    ];
    for &d in base.dims() {
        p.push(uw(name, d)?);
    }
    for &d in idx.dims() {
        p.push(uw(name, d)?);
    }
    for &s in base.layout().strides() {
        p.push(uw(name, s)?);
    }
    for &s in src.layout().strides() {
        p.push(uw(name, s)?);
    }
    let v = Variant::new(&[("T", base.dtype()), ("I", idt)], &["SCATTER"]);
    dev.launch(
        name,
        &INDEX,
        "scatter_add",
        &v,
        &p,
        &[&out],
        &[
            storage(base, name)?.buffer(),
            ic.buffer(),
            storage(src, name)?.buffer(),
        ],
        true,
        groups(n),
    )?;
    Ok(vec![Arc::new(out)])
}

pub(crate) fn cat(
    dev: &WgpuBackend,
    inputs: &[&Tensor],
    axis: usize,
    spec: &(Shape, DType),
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = "cat";
    let (shape, dt) = spec;
    let out = dev.alloc(name, *dt, shape.elem_count())?;
    let full = Layout::contiguous(shape.clone());
    let mut start = 0;
    for t in inputs {
        let len = t.dims()[axis];
        let dst = full.narrow(axis, start, len)?;
        copy_into(dev, storage(t, name)?, t.layout(), &out, &dst)?;
        start += len;
    }
    Ok(vec![Arc::new(out)])
}
