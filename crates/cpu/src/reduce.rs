//! Reductions over a set of axes: the reduced axes are moved last (a view, copied only if not
//! contiguous then), so each output element reduces one contiguous row.

use crate::elementwise::{Int, PAR_MIN};
use crate::storage::{contig, floats, from_f32, Floats};
use ferrite_core::{DType, Error, HostBuffer, ReduceOp, Result, Tensor, WithDType};
use num_traits::Float;
use rayon::prelude::*;

/// Sum with 16 independent accumulators: vectorizes, and its error grows like n/16 sums.
fn sum_row<F: Float>(x: &[F]) -> F {
    let mut acc = [F::zero(); 16];
    let chunks = x.chunks_exact(16);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..16 {
            acc[i] = acc[i] + c[i];
        }
    }
    let mut s = F::zero();
    for &r in rest {
        s = s + r;
    }
    // Pairwise combine of the lanes.
    let mut w = 16;
    while w > 1 {
        w /= 2;
        for i in 0..w {
            acc[i] = acc[i] + acc[i + w];
        }
    }
    acc[0] + s
}

fn sum_big<F: Float + Send + Sync>(x: &[F]) -> F {
    if x.len() < PAR_MIN * 4 {
        return sum_row(x);
    }
    let parts: Vec<F> = x.par_chunks(1 << 16).map(sum_row).collect();
    sum_row(&parts)
}

fn is_nan<T: PartialEq>(x: T) -> bool {
    #[allow(clippy::eq_op)]
    let nan = x != x;
    nan
}

/// Max (or min with `min`) propagating NaN.
fn extreme_row<T: Copy + PartialOrd>(x: &[T], min: bool) -> T {
    let mut m = x[0];
    for &v in &x[1..] {
        if is_nan(v) {
            return v;
        }
        if (min && v < m) || (!min && v > m) {
            m = v;
        }
    }
    m
}

/// Index of the first max (min) in the row; NaN counts as the extreme.
fn arg_row<T: Copy + PartialOrd>(x: &[T], min: bool) -> u32 {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if is_nan(v) {
            return i as u32;
        }
        if (min && v < x[best]) || (!min && v > x[best]) {
            best = i;
        }
    }
    best as u32
}

fn rows<T: Sync, U: Send>(
    x: &[T],
    r: usize,
    n_rows: usize,
    f: impl Fn(&[T]) -> U + Sync + Send,
) -> Vec<U> {
    if r == 0 {
        return Vec::new();
    }
    if n_rows > 1 && x.len() >= PAR_MIN {
        x.par_chunks(r).map(f).collect()
    } else {
        x.chunks(r).map(f).collect()
    }
}

fn generic<T: WithDType>(op: ReduceOp, x: &[T], r: usize, n: usize) -> Result<HostBuffer> {
    Ok(match op {
        ReduceOp::Max => T::wrap(rows(x, r, n, |row| extreme_row(row, false))),
        ReduceOp::Min => T::wrap(rows(x, r, n, |row| extreme_row(row, true))),
        ReduceOp::ArgMax => HostBuffer::U32(rows(x, r, n, |row| arg_row(row, false))),
        ReduceOp::ArgMin => HostBuffer::U32(rows(x, r, n, |row| arg_row(row, true))),
        ReduceOp::Sum => return Err(Error::backend("sum", "internal: generic sum")),
    })
}

fn int_sum<I: Int + WithDType>(x: &[I], r: usize, n: usize) -> HostBuffer {
    if r == 0 {
        return I::wrap(vec![I::ZERO; n]);
    }
    I::wrap(rows(x, r, n, |row| {
        row.iter().fold(I::ZERO, |a, &b| a.wadd(b))
    }))
}

pub(crate) fn reduce(op: ReduceOp, x: &Tensor, axes: &[usize]) -> Result<HostBuffer> {
    let name = op.name();
    let kept: Vec<usize> = (0..x.rank()).filter(|a| !axes.contains(a)).collect();
    let perm: Vec<usize> = kept.iter().chain(axes).copied().collect();
    let xt = x.permute(&perm)?;
    let r: usize = axes.iter().map(|&a| x.dims()[a]).product();
    let n: usize = kept.iter().map(|&a| x.dims()[a]).product();
    if matches!(op, ReduceOp::ArgMax | ReduceOp::ArgMin) && r > u32::MAX as usize {
        return Err(Error::shape(
            name,
            format!("axis of {r} elements exceeds u32 indices"),
        ));
    }
    let dt = x.dtype();
    match op {
        ReduceOp::Sum => Ok(match dt {
            DType::I32 => int_sum(&contig::<i32>(&xt, name)?, r, n),
            DType::I64 => int_sum(&contig::<i64>(&xt, name)?, r, n),
            DType::U32 => int_sum(&contig::<u32>(&xt, name)?, r, n),
            DType::U8 => int_sum(&contig::<u8>(&xt, name)?, r, n),
            DType::Bool => return Err(Error::dtype(name, dt, "needs a numeric dtype")),
            _ => match floats(&xt, name)? {
                Floats::F32(_) if r == 0 => from_f32(vec![0.0; n], dt),
                Floats::F64(_) if r == 0 => HostBuffer::F64(vec![0.0; n]),
                Floats::F32(v) if n == 1 => from_f32(vec![sum_big(&v)], dt),
                Floats::F64(v) if n == 1 => HostBuffer::F64(vec![sum_big(&v)]),
                Floats::F32(v) => from_f32(rows(&v, r, n, sum_row), dt),
                Floats::F64(v) => HostBuffer::F64(rows(&v, r, n, sum_row)),
            },
        }),
        _ => match dt {
            DType::F32 => generic(op, &contig::<f32>(&xt, name)?, r, n),
            DType::F64 => generic(op, &contig::<f64>(&xt, name)?, r, n),
            DType::F16 => generic(op, &contig::<half::f16>(&xt, name)?, r, n),
            DType::BF16 => generic(op, &contig::<half::bf16>(&xt, name)?, r, n),
            DType::I32 => generic(op, &contig::<i32>(&xt, name)?, r, n),
            DType::I64 => generic(op, &contig::<i64>(&xt, name)?, r, n),
            DType::U32 => generic(op, &contig::<u32>(&xt, name)?, r, n),
            DType::U8 => generic(op, &contig::<u8>(&xt, name)?, r, n),
            DType::Bool => Err(Error::dtype(name, dt, "needs a numeric dtype")),
        },
    }
}
