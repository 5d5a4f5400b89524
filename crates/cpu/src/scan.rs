//! Ops along one axis, computed with that axis moved last: cumsum and sort.

use crate::elementwise::{gather_strided, Int};
use crate::storage::{contig, floats, Floats};
use ferrite_core::{DType, Error, HostBuffer, Layout, Result, Tensor, WithDType};
use std::cmp::Ordering;

/// Row-major data computed in the axis-last order back to the original order.
fn restore<T: ferrite_core::WithDType>(v: Vec<T>, x: &Tensor, axis: usize) -> Result<Vec<T>> {
    let last = x.rank() - 1;
    if axis == last {
        return Ok(v);
    }
    let mut dims = x.dims().to_vec();
    dims.swap(axis, last);
    let l = Layout::contiguous(dims).permute(&swap_perm(x.rank(), axis))?;
    Ok(gather_strided(&v, &l))
}

fn swap_perm(rank: usize, axis: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..rank).collect();
    p.swap(axis, rank - 1);
    p
}

fn axis_last(x: &Tensor, axis: usize) -> Result<Tensor> {
    x.permute(&swap_perm(x.rank(), axis))
}

pub(crate) fn cumsum(x: &Tensor, axis: usize) -> Result<HostBuffer> {
    let op = "cumsum";
    let xt = axis_last(x, axis)?;
    let len = x.dims()[axis];
    fn scan<T: Copy, A: Copy>(
        v: &[T],
        len: usize,
        zero: A,
        add: impl Fn(A, T) -> A,
        out: impl Fn(A) -> T,
    ) -> Vec<T> {
        let mut o = Vec::with_capacity(v.len());
        for row in v.chunks(len.max(1)) {
            let mut acc = zero;
            for &x in row {
                acc = add(acc, x);
                o.push(out(acc));
            }
        }
        o
    }
    fn int<I: Int + WithDType>(
        xt: &Tensor,
        x: &Tensor,
        axis: usize,
        len: usize,
    ) -> Result<HostBuffer> {
        let v = contig::<I>(xt, "cumsum")?;
        Ok(I::wrap(restore(
            scan(&v, len, I::ZERO, |a, b| a.wadd(b), |a| a),
            x,
            axis,
        )?))
    }
    Ok(match x.dtype() {
        DType::I32 => int::<i32>(&xt, x, axis, len)?,
        DType::I64 => int::<i64>(&xt, x, axis, len)?,
        DType::U32 => int::<u32>(&xt, x, axis, len)?,
        DType::U8 => int::<u8>(&xt, x, axis, len)?,
        DType::Bool => return Err(Error::dtype(op, DType::Bool, "needs a numeric dtype")),
        dt => match floats(&xt, op)? {
            Floats::F32(v) => crate::storage::from_f32(
                restore(scan(&v, len, 0f32, |a, b| a + b, |a| a), x, axis)?,
                dt,
            ),
            Floats::F64(v) => {
                HostBuffer::F64(restore(scan(&v, len, 0f64, |a, b| a + b, |a| a), x, axis)?)
            }
        },
    })
}

/// Total order with NaN above every number.
fn order<T: PartialOrd>(a: &T, b: &T) -> Ordering {
    #[allow(clippy::eq_op)]
    let (an, bn) = (a != a, b != b);
    match a.partial_cmp(b) {
        Some(o) => o,
        None => an.cmp(&bn),
    }
}

pub(crate) fn sort(x: &Tensor, axis: usize, descending: bool) -> Result<(HostBuffer, HostBuffer)> {
    let len = x.dims()[axis];
    if len > u32::MAX as usize {
        return Err(Error::shape(
            "sort",
            format!("axis of {len} elements exceeds u32 indices"),
        ));
    }
    let xt = axis_last(x, axis)?;
    fn go<T: WithDType>(
        xt: &Tensor,
        x: &Tensor,
        axis: usize,
        len: usize,
        desc: bool,
    ) -> Result<(HostBuffer, HostBuffer)> {
        let v = contig::<T>(xt, "sort")?;
        let mut idx: Vec<u32> = Vec::with_capacity(v.len());
        let mut vals: Vec<T> = Vec::with_capacity(v.len());
        for row in v.chunks(len.max(1)) {
            let mut p: Vec<u32> = (0..row.len() as u32).collect();
            if desc {
                p.sort_by(|&i, &j| order(&row[j as usize], &row[i as usize]));
            } else {
                p.sort_by(|&i, &j| order(&row[i as usize], &row[j as usize]));
            }
            vals.extend(p.iter().map(|&i| row[i as usize]));
            idx.extend_from_slice(&p);
        }
        Ok((
            T::wrap(restore(vals, x, axis)?),
            HostBuffer::U32(restore(idx, x, axis)?),
        ))
    }
    match x.dtype() {
        DType::F32 => go::<f32>(&xt, x, axis, len, descending),
        DType::F64 => go::<f64>(&xt, x, axis, len, descending),
        DType::F16 => go::<half::f16>(&xt, x, axis, len, descending),
        DType::BF16 => go::<half::bf16>(&xt, x, axis, len, descending),
        DType::I32 => go::<i32>(&xt, x, axis, len, descending),
        DType::I64 => go::<i64>(&xt, x, axis, len, descending),
        DType::U32 => go::<u32>(&xt, x, axis, len, descending),
        DType::U8 => go::<u8>(&xt, x, axis, len, descending),
        DType::Bool => go::<bool>(&xt, x, axis, len, descending),
    }
}
