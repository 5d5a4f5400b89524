//! Index ops: index_select, gather, scatter_add, cat. Index values are checked against the
//! axis size; out-of-range (or negative) indices are errors naming the op.

use crate::elementwise::materialize;
use crate::storage::{host, indices};
use ferrite_core::{map_host_same, Error, HostBuffer, Result, Tensor};

fn check(op: &'static str, idx: &[i64], axis: usize, size: usize) -> Result<()> {
    match idx.iter().find(|&&i| i < 0 || i as usize >= size) {
        Some(&index) => Err(Error::Index {
            op,
            index,
            axis,
            size,
        }),
        None => Ok(()),
    }
}

fn contiguous_host(t: &Tensor, op: &'static str) -> Result<HostBuffer> {
    Ok(materialize(host(t.storage(), op)?, t.layout()))
}

/// (outer, axis size, inner) of a contiguous shape split at `axis`.
fn split_at(dims: &[usize], axis: usize) -> (usize, usize, usize) {
    (
        dims[..axis].iter().product(),
        dims[axis],
        dims[axis + 1..].iter().product(),
    )
}

pub(crate) fn index_select(x: &Tensor, index: &Tensor, axis: usize) -> Result<HostBuffer> {
    let op = "index_select";
    let idx = indices(index, op)?;
    let (outer, size, inner) = split_at(x.dims(), axis);
    check(op, &idx, axis, size)?;
    let src = contiguous_host(x, op)?;
    Ok(map_host_same!(&src, v => {
        let mut out = Vec::with_capacity(outer * idx.len() * inner);
        for o in 0..outer {
            for &i in &idx {
                let start = (o * size + i as usize) * inner;
                out.extend_from_slice(&v[start..start + inner]);
            }
        }
        out
    }))
}

/// Contiguous strides of a shape.
fn strides(dims: &[usize]) -> Vec<usize> {
    ferrite_core::Shape::new(dims).contiguous_strides()
}

/// For each element of `index` (row-major), the storage offset in a contiguous `x` with the
/// axis coordinate replaced by the index value.
fn targets(op: &'static str, x_dims: &[usize], index: &Tensor, axis: usize) -> Result<Vec<usize>> {
    let idx = indices(index, op)?;
    check(op, &idx, axis, x_dims[axis])?;
    let xs = strides(x_dims);
    let id = index.dims();
    let mut coord = vec![0usize; id.len()];
    let mut out = Vec::with_capacity(idx.len());
    for &i in &idx {
        let mut off = 0;
        for k in 0..id.len() {
            off += if k == axis { i as usize } else { coord[k] } * xs[k];
        }
        out.push(off);
        for k in (0..id.len()).rev() {
            coord[k] += 1;
            if coord[k] < id[k] {
                break;
            }
            coord[k] = 0;
        }
    }
    Ok(out)
}

pub(crate) fn gather(x: &Tensor, index: &Tensor, axis: usize) -> Result<HostBuffer> {
    let op = "gather";
    let t = targets(op, x.dims(), index, axis)?;
    let src = contiguous_host(x, op)?;
    Ok(map_host_same!(&src, v => t.iter().map(|&o| v[o]).collect()))
}

pub(crate) fn scatter_add(
    base: &Tensor,
    index: &Tensor,
    src: &Tensor,
    axis: usize,
) -> Result<HostBuffer> {
    let op = "scatter_add";
    let t = targets(op, base.dims(), index, axis)?;
    let mut out = contiguous_host(base, op)?;
    let s = contiguous_host(src, op)?;
    macro_rules! add {
        ($($v:ident: $add:expr),*) => {
            match (&mut out, &s) {
                $((HostBuffer::$v(o), HostBuffer::$v(s)) => {
                    for (&ti, &x) in t.iter().zip(s.iter()) {
                        o[ti] = $add(o[ti], x);
                    }
                })*
                _ => return Err(Error::dtype(op, base.dtype(), "needs a numeric dtype")),
            }
        };
    }
    add!(
        F32: |a: f32, b: f32| a + b, F64: |a: f64, b: f64| a + b,
        F16: |a: half::f16, b: half::f16| a + b, BF16: |a: half::bf16, b: half::bf16| a + b,
        I32: |a: i32, b: i32| a.wrapping_add(b), I64: |a: i64, b: i64| a.wrapping_add(b),
        U32: |a: u32, b: u32| a.wrapping_add(b), U8: |a: u8, b: u8| a.wrapping_add(b)
    );
    Ok(out)
}

pub(crate) fn cat(xs: &[&Tensor], axis: usize) -> Result<HostBuffer> {
    let op = "cat";
    let parts = xs
        .iter()
        .map(|t| contiguous_host(t, op))
        .collect::<Result<Vec<_>>>()?;
    let first = xs
        .first()
        .ok_or_else(|| Error::shape(op, "needs at least one tensor"))?;
    let outer: usize = first.dims()[..axis].iter().product();
    let inner: usize = first.dims()[axis + 1..].iter().product();
    let total: usize = xs.iter().map(|t| t.elem_count()).sum();
    macro_rules! join {
        ($($v:ident),*) => {
            match &parts[0] {
                $(HostBuffer::$v(_) => {
                    let mut out = Vec::with_capacity(total);
                    for o in 0..outer {
                        for (t, p) in xs.iter().zip(&parts) {
                            let HostBuffer::$v(p) = p else {
                                return Err(Error::DTypeMismatch { op, lhs: first.dtype(), rhs: t.dtype() });
                            };
                            let w = t.dims()[axis] * inner;
                            out.extend_from_slice(&p[o * w..(o + 1) * w]);
                        }
                    }
                    HostBuffer::$v(out)
                })*
            }
        };
    }
    Ok(join!(F32, F16, BF16, F64, I32, I64, U32, U8, Bool))
}
