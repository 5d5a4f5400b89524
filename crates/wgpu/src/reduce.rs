//! Reductions over any set of axes (`reduce.wgsl`): the reduced axes are permuted last (a
//! copy when that view is not contiguous), then one workgroup reduces each row. A sum, max or
//! min over few long rows runs in two passes (f32 partials per chunk, then the rows).

use crate::device::WgpuBackend;
use crate::shader::{self, kernel, Kernel, Variant};
use crate::storage::WgpuStorage;
use crate::util::{contig, uw};
use ferrite_core::{DType, Error, ReduceOp, Result, Storage, Tensor};
use std::sync::Arc;

pub(crate) static REDUCE: Kernel = kernel!(
    "reduce",
    &["reduce"],
    &[("T", shader::ALL), ("O", shader::ALL)],
    &[&[]]
);

/// Elements one workgroup of the first pass reduces.
const CHUNK: usize = 8192;

fn code(op: ReduceOp) -> u32 {
    match op {
        ReduceOp::Sum => 0,
        ReduceOp::Max => 1,
        ReduceOp::Min => 2,
        ReduceOp::ArgMax => 3,
        ReduceOp::ArgMin => 4,
    }
}

/// Reduces `rows` contiguous rows of `m` elements of `dt` at word `off` of `x` into
/// one `out_dt` value per row.
#[allow(clippy::too_many_arguments)]
pub(crate) fn reduce_rows(
    dev: &WgpuBackend,
    name: &'static str,
    op: ReduceOp,
    x: &wgpu::Buffer,
    off: u32,
    dt: DType,
    rows: usize,
    m: usize,
    out_dt: DType,
) -> Result<WgpuStorage> {
    let out = dev.alloc(name, out_dt, rows)?;
    let arg = matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin);
    if !arg && m > 2 * CHUNK && rows < 256 {
        let chunks = m.div_ceil(CHUNK);
        let part_dt = if dt.is_float() { DType::F32 } else { dt };
        let part = dev.alloc(name, part_dt, rows * chunks)?;
        let p = [uw(name, rows)?, uw(name, m)?, code(op), off, CHUNK as u32];
        let v = Variant::new(&[("T", dt), ("O", part_dt)], &[]);
        dev.launch(
            name,
            &REDUCE,
            "reduce",
            &v,
            &p,
            &[&part],
            &[x],
            false,
            rows * chunks,
        )?;
        let p = [
            uw(name, rows)?,
            uw(name, chunks)?,
            code(op),
            0,
            uw(name, chunks)?,
        ];
        let v = Variant::new(&[("T", part_dt), ("O", out_dt)], &[]);
        dev.launch(
            name,
            &REDUCE,
            "reduce",
            &v,
            &p,
            &[&out],
            &[part.buffer()],
            false,
            rows,
        )?;
    } else {
        let p = [
            uw(name, rows)?,
            uw(name, m)?,
            code(op),
            off,
            uw(name, m.max(1))?,
        ];
        let v = Variant::new(&[("T", dt), ("O", out_dt)], &[]);
        dev.launch(name, &REDUCE, "reduce", &v, &p, &[&out], &[x], false, rows)?;
    }
    Ok(out)
}

pub(crate) fn reduce(
    dev: &WgpuBackend,
    op: ReduceOp,
    x: &Tensor,
    axes: &[usize],
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = op.name();
    let kept: Vec<usize> = (0..x.rank()).filter(|a| !axes.contains(a)).collect();
    let perm: Vec<usize> = kept.iter().chain(axes).copied().collect();
    let xt = x.permute(&perm)?;
    let m: usize = axes.iter().map(|&a| x.dims()[a]).product();
    let rows: usize = kept.iter().map(|&a| x.dims()[a]).product();
    let arg = matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin);
    if arg && m > u32::MAX as usize {
        return Err(Error::shape(
            name,
            format!("axis of {m} elements exceeds u32 indices"),
        ));
    }
    let out_dt = if arg { DType::U32 } else { x.dtype() };
    let c = contig(dev, &xt, name)?;
    let out = reduce_rows(
        dev,
        name,
        op,
        c.buffer(),
        c.offset(),
        x.dtype(),
        rows,
        m,
        out_dt,
    )?;
    Ok(vec![Arc::new(out)])
}
