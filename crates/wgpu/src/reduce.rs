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
    &[
        &[],
        &["V4"],
        &[shader::SUBGROUPS],
        &["V4", shader::SUBGROUPS]
    ]
);

/// Elements one workgroup of the first pass of a two-pass reduction takes: enough
/// workgroups (about 1,024) to fill a large GPU, each at least 2,048 elements, at most 16,384.
fn chunk_of(rows: usize, m: usize) -> usize {
    (m * rows)
        .div_ceil(1024)
        .next_multiple_of(1024)
        .clamp(2048, 16384)
}

/// The variant reducing rows of `m` elements of `dt` at word `off` into `out` with `op` in
/// chunks of `chunk`: vec4 loads where the words align, subgroup sums where the adapter has
/// them.
fn variant(
    dev: &WgpuBackend,
    op: ReduceOp,
    dt: DType,
    out: DType,
    off: u32,
    m: usize,
    chunk: usize,
) -> Variant {
    let mut d: Vec<&'static str> = Vec::new();
    if off.is_multiple_of(4) && m.is_multiple_of(4) && chunk.is_multiple_of(4) {
        d.push("V4");
    }
    if op == ReduceOp::Sum && dev.subgroups() {
        d.push(shader::SUBGROUPS);
    }
    Variant::new(&[("T", dt), ("O", out)], &d)
}

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
    let chunk = chunk_of(rows, m);
    if !arg && m > 2 * chunk && rows < 256 {
        let chunks = m.div_ceil(chunk);
        let part_dt = if dt.is_float() { DType::F32 } else { dt };
        let part = dev.alloc(name, part_dt, rows * chunks)?;
        let p = [
            uw(name, rows)?,
            uw(name, m)?,
            code(op),
            off,
            uw(name, chunk)?,
        ];
        let v = variant(dev, op, dt, part_dt, off, m, chunk);
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
        let v = variant(dev, op, part_dt, out_dt, 0, chunks, chunks);
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
        let v = variant(dev, op, dt, out_dt, off, m, m);
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
