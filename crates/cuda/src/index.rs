//! Index ops on CUDA (kernels in index.cu): index_select, gather, scatter_add, cat.
//!
//! Value and index operands may have any layout (walked by `Idx`); outputs are contiguous.
//! Index values (i32, i64, u32, u8) are checked on the device: an index outside the axis is
//! not followed, it records a device fault (`fault::*` in device.rs) that the next host wait
//! reports as an error naming the op, and its element reads as 0 (scatter_add skips it).
//! scatter_add copies base, then adds with atomics (f16/bf16/u8 by CAS on the 32-bit word).

use crate::device::CudaBackend;
use crate::elementwise::{copy_into, grid};
use crate::kernels::{suffix, Args, Idx, KernelSource};
use ferrite_core::{DType, Error, Result, Shape, Storage, Tensor};
use std::sync::Arc;

pub(crate) static SOURCE: KernelSource = KernelSource {
    name: "index",
    src: include_str!("index.cu"),
    prebuilt: crate::prebuilt::INDEX,
};

/// Kernel-name suffix of an index dtype; the CPU's error for any other.
fn index_suffix(op: &'static str, idx: &Tensor) -> Result<&'static str> {
    match idx.dtype() {
        DType::I32 => Ok("i32"),
        DType::I64 => Ok("i64"),
        DType::U32 => Ok("u32"),
        DType::U8 => Ok("u8"),
        dt => Err(Error::dtype(op, dt, "index must be an integer dtype")),
    }
}

/// Kernels that only move values are named by element size in bytes.
fn width(bytes: usize) -> &'static str {
    match bytes {
        1 => "b1",
        2 => "b2",
        4 => "b4",
        8 => "b8",
        _ => "b16",
    }
}

/// `CAT_MAX` and `CatArgs` of index.cu: the inputs of one `cat_copy_*` launch.
const CAT_MAX: usize = 8;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CatArgs {
    w: [Idx; CAT_MAX],
    x: [u64; CAT_MAX],
    end: [u64; CAT_MAX],
    count: u32,
}

/// An operand of a walk: strides and offset, in elements.
type Operand = (Vec<usize>, usize);

/// The same walk over words of 16, 8 or 4 bytes (the widest that fits, wider than `esz`):
/// possible when the innermost dim is contiguous in every operand and its length, every
/// other stride, every offset and each of `extra` are multiples of the word. Returns
/// (elements per word, dims, operands) in words. Device buffers are 512-byte aligned.
fn widen(
    esz: usize,
    dims: &[usize],
    ops: &[Operand],
    extra: &[usize],
) -> Option<(usize, Vec<usize>, Vec<Operand>)> {
    let last = dims.len().checked_sub(1)?;
    for w in [16, 8, 4] {
        let k = w / esz;
        if k < 2 {
            continue;
        }
        let fits = dims[last].is_multiple_of(k)
            && extra.iter().all(|e| e.is_multiple_of(k))
            && ops.iter().all(|(st, off)| {
                st[last] == 1
                    && off.is_multiple_of(k)
                    && (0..last).all(|d| dims[d] == 1 || st[d].is_multiple_of(k))
            });
        if fits {
            let mut d = dims.to_vec();
            d[last] /= k;
            let o = ops
                .iter()
                .map(|(st, off)| {
                    let mut s: Vec<usize> = st.iter().map(|&v| v / k).collect();
                    s[last] = 1;
                    (s, off / k)
                })
                .collect();
            return Some((k, d, o));
        }
    }
    None
}

fn check_axis(op: &'static str, x: &Tensor, axis: usize) -> Result<()> {
    if axis >= x.rank() {
        return Err(Error::backend(
            op,
            format!("axis {axis} out of range for {}", x.shape()),
        ));
    }
    Ok(())
}

/// `strides` with the axis entry set to 0 (the axis coordinate comes from the index).
fn without_axis(strides: &[usize], axis: usize) -> Vec<usize> {
    let mut s = strides.to_vec();
    s[axis] = 0;
    s
}

pub(crate) fn index_select(
    dev: &CudaBackend,
    x: &Tensor,
    idx: &Tensor,
    axis: usize,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "index_select";
    let isfx = index_suffix(op, idx)?;
    check_axis(op, x, axis)?;
    if idx.rank() != 1 {
        return Err(Error::shape(
            op,
            format!("index must be 1-D, got {}", idx.shape()),
        ));
    }
    let (sx, si) = (dev.input(x, op)?, dev.input(idx, op)?);
    let mut dims = x.dims().to_vec();
    let k = idx.elem_count();
    dims[axis] = k;
    let n: usize = dims.iter().product();
    let out = dev.alloc_out(n, x.dtype(), op)?;
    if n > 0 {
        let esz = x.dtype().size_in_bytes();
        let xst = x.layout().strides();
        let mut inner: usize = dims[axis + 1..].iter().product();
        let mut sa = xst[axis];
        let mut walk = (dims, vec![(without_axis(xst, axis), x.layout().offset())]);
        let mut word = esz;
        // Rows of contiguous elements move as 4- to 16-byte words.
        if let Some((f, d, o)) = widen(esz, &walk.0, &walk.1, &[inner, sa]) {
            (walk, word, inner, sa) = ((d, o), esz * f, inner / f, sa / f);
        }
        let (wd, wo) = &walk;
        let xw = Idx::new(op, wd, &[(&wo[0].0, wo[0].1)])?;
        let args = Args::new()
            .arg(xw)
            .arg(sx.device_ptr())
            .arg(CudaBackend::ptr(idx, si))
            .arg(idx.layout().strides()[0] as i64)
            .arg(k as u64)
            .arg(inner as u64)
            .arg(sa as i64)
            .arg(x.dims()[axis] as i64)
            .arg(out.ptr())
            .arg(dev.fault_dev);
        let name = format!("index_select_{}_{isfx}", width(word));
        dev.launch(op, &SOURCE, &name, grid(dev, xw.n, 1), args)?;
    }
    dev.finish_one(out)
}

/// An index of x's rank, no larger than `x` outside the axis (the CPU's precondition).
fn check_fits(op: &'static str, x: &Tensor, idx: &Tensor, axis: usize) -> Result<()> {
    let fits = idx.rank() == x.rank()
        && idx
            .dims()
            .iter()
            .zip(x.dims())
            .enumerate()
            .all(|(i, (&d, &s))| i == axis || d <= s);
    if !fits {
        return Err(Error::shape(
            op,
            format!(
                "index {} does not fit {} along axis {axis}",
                idx.shape(),
                x.shape()
            ),
        ));
    }
    Ok(())
}

pub(crate) fn gather(
    dev: &CudaBackend,
    x: &Tensor,
    idx: &Tensor,
    axis: usize,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "gather";
    let isfx = index_suffix(op, idx)?;
    check_axis(op, x, axis)?;
    check_fits(op, x, idx, axis)?;
    let (sx, si) = (dev.input(x, op)?, dev.input(idx, op)?);
    let n = idx.elem_count();
    let out = dev.alloc_out(n, x.dtype(), op)?;
    if n > 0 {
        let xst = x.layout().strides();
        let w = Idx::new(
            op,
            idx.dims(),
            &[
                (&without_axis(xst, axis), x.layout().offset()),
                (idx.layout().strides(), idx.layout().offset()),
            ],
        )?;
        let args = Args::new()
            .arg(w)
            .arg(sx.device_ptr())
            .arg(si.device_ptr())
            .arg(xst[axis] as i64)
            .arg(x.dims()[axis] as i64)
            .arg(out.ptr())
            .arg(dev.fault_dev);
        let name = format!("gather_{}_{isfx}", width(x.dtype().size_in_bytes()));
        dev.launch(op, &SOURCE, &name, grid(dev, n as u64, 1), args)?;
    }
    dev.finish_one(out)
}

pub(crate) fn scatter_add(
    dev: &CudaBackend,
    base: &Tensor,
    idx: &Tensor,
    src: &Tensor,
    axis: usize,
) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "scatter_add";
    let isfx = index_suffix(op, idx)?;
    let dt = base.dtype();
    if dt == DType::Bool {
        return Err(Error::dtype(op, dt, "needs a numeric dtype"));
    }
    if src.dtype() != dt {
        return Err(Error::DTypeMismatch {
            op,
            lhs: dt,
            rhs: src.dtype(),
        });
    }
    check_axis(op, base, axis)?;
    check_fits(op, base, idx, axis)?;
    if src.dims() != idx.dims() {
        return Err(Error::shape(
            op,
            format!(
                "src {} must have the index's shape {}",
                src.shape(),
                idx.shape()
            ),
        ));
    }
    let (sb, si, ss) = (
        dev.input(base, op)?,
        dev.input(idx, op)?,
        dev.input(src, op)?,
    );
    let out = copy_into(dev, sb, base.layout(), op)?;
    let n = idx.elem_count();
    if n > 0 {
        let yst = Shape::new(base.dims()).contiguous_strides();
        let w = Idx::new(
            op,
            idx.dims(),
            &[
                (&without_axis(&yst, axis), 0),
                (idx.layout().strides(), idx.layout().offset()),
                (src.layout().strides(), src.layout().offset()),
            ],
        )?;
        let args = Args::new()
            .arg(w)
            .arg(out.ptr())
            .arg(si.device_ptr())
            .arg(ss.device_ptr())
            .arg(yst[axis] as i64)
            .arg(base.dims()[axis] as i64)
            .arg(dev.fault_dev);
        let name = format!("scatter_add_{}_{isfx}", suffix(dt));
        dev.launch(op, &SOURCE, &name, grid(dev, n as u64, 1), args)?;
    }
    dev.finish_one(out)
}

pub(crate) fn cat(dev: &CudaBackend, xs: &[&Tensor], axis: usize) -> Result<Vec<Arc<dyn Storage>>> {
    let op = "cat";
    let first = xs
        .first()
        .ok_or_else(|| Error::shape(op, "needs at least one tensor"))?;
    check_axis(op, first, axis)?;
    let dt = first.dtype();
    let mut dims = first.dims().to_vec();
    let mut total = 0;
    for t in xs {
        if t.dtype() != dt {
            return Err(Error::DTypeMismatch {
                op,
                lhs: dt,
                rhs: t.dtype(),
            });
        }
        let same = t.rank() == first.rank()
            && t.dims()
                .iter()
                .zip(first.dims())
                .enumerate()
                .all(|(i, (a, b))| i == axis || a == b);
        if !same {
            return Err(Error::shape(
                op,
                format!(
                    "shapes differ outside axis {axis}: {} and {}",
                    first.shape(),
                    t.shape()
                ),
            ));
        }
        total += t.dims()[axis];
    }
    dims[axis] = total;
    let storages = xs
        .iter()
        .map(|t| dev.input(t, op))
        .collect::<Result<Vec<_>>>()?;
    let n: usize = dims.iter().product();
    let out = dev.alloc_out(n, dt, op)?;
    let yst = Shape::new(dims.as_slice()).contiguous_strides();
    // Each non-empty input's walk: its shape with its strides, and y's strides offset to its
    // slab along the axis.
    let esz = dt.size_in_bytes();
    let mut pieces = Vec::new();
    let mut start = 0;
    for (t, s) in xs.iter().zip(&storages) {
        if t.elem_count() > 0 {
            let ops = vec![
                (t.layout().strides().to_vec(), t.layout().offset()),
                (yst.clone(), start * yst[axis]),
            ];
            pieces.push((t.dims().to_vec(), ops, s.device_ptr()));
        }
        start += t.dims()[axis];
    }
    for group in pieces.chunks(CAT_MAX) {
        // Contiguous rows move as 4- to 16-byte words when every input of the launch allows
        // the same word; else element by element.
        let wide: Vec<_> = group
            .iter()
            .map(|(d, ops, _)| widen(esz, d, ops, &[]))
            .collect();
        let k0 = wide[0].as_ref().map(|w| w.0);
        let same = k0.is_some() && wide.iter().all(|w| w.as_ref().map(|w| w.0) == k0);
        let mut a = CatArgs::default();
        let mut n = 0u64;
        for (p, ((d, ops, ptr), w)) in group.iter().zip(&wide).enumerate() {
            let (d, o) = match (same, w) {
                (true, Some((_, d, o))) => (d, o),
                _ => (d, ops),
            };
            let ix = Idx::new(op, d, &[(&o[0].0, o[0].1), (&o[1].0, o[1].1)])?;
            n += ix.n;
            a.w[p] = ix;
            a.x[p] = *ptr;
            a.end[p] = n;
        }
        a.count = group.len() as u32;
        let word = if same { esz * k0.unwrap_or(1) } else { esz };
        let name = format!("cat_copy_{}", width(word));
        let args = Args::new().arg(a).arg(out.ptr());
        dev.launch(op, &SOURCE, &name, grid(dev, n, 1), args)?;
    }
    dev.finish_one(out)
}
