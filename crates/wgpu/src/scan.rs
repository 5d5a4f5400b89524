//! cumsum and sort along an axis (`scan.wgsl`). Sort ranks each element by counting those
//! that precede it (stable, O(len²) per line): simple and exact, fast for the short axes it
//! meets (top-k, argsort of logits rows); a bitonic sort would serve long axes better.

use crate::device::WgpuBackend;
use crate::shader::{self, kernel, Kernel, Variant};
use crate::util::{contig, groups, uw};
use ferrite_core::{DType, Result, Storage, Tensor};
use std::sync::Arc;

pub(crate) static SCAN: Kernel = kernel!(
    "scan",
    &["cumsum", "sort"],
    &[("T", shader::ALL)],
    &[&[], &["SORT"]]
);

fn geometry(x: &Tensor, axis: usize) -> (usize, usize, usize) {
    let dims = x.dims();
    let outer: usize = dims[..axis].iter().product();
    let inner: usize = dims[axis + 1..].iter().product();
    (outer, dims[axis], inner)
}

pub(crate) fn cumsum(dev: &WgpuBackend, x: &Tensor, axis: usize) -> Result<Vec<Arc<dyn Storage>>> {
    let name = "cumsum";
    let (outer, len, inner) = geometry(x, axis);
    let out = dev.alloc(name, x.dtype(), x.elem_count())?;
    let xc = contig(dev, x, name)?;
    let lines = outer * inner;
    let p = [
        uw(name, lines)?,
        uw(name, len)?,
        uw(name, inner)?,
        0,
        xc.offset(),
    ];
    let v = Variant::new(&[("T", x.dtype())], &[]);
    dev.launch(
        name,
        &SCAN,
        "cumsum",
        &v,
        &p,
        &[&out],
        &[xc.buffer()],
        false,
        groups(lines),
    )?;
    Ok(vec![Arc::new(out)])
}

pub(crate) fn sort(
    dev: &WgpuBackend,
    x: &Tensor,
    axis: usize,
    descending: bool,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = "sort";
    let (outer, len, inner) = geometry(x, axis);
    let n = x.elem_count();
    let values = dev.alloc(name, x.dtype(), n)?;
    let indices = dev.alloc(name, DType::U32, n)?;
    let xc = contig(dev, x, name)?;
    let p = [
        uw(name, outer * inner)?,
        uw(name, len)?,
        uw(name, inner)?,
        descending as u32,
        xc.offset(),
    ];
    let v = Variant::new(&[("T", x.dtype())], &["SORT"]);
    dev.launch(
        name,
        &SCAN,
        "sort",
        &v,
        &p,
        &[&values, &indices],
        &[xc.buffer()],
        false,
        groups(n),
    )?;
    Ok(vec![Arc::new(values), Arc::new(indices)])
}
