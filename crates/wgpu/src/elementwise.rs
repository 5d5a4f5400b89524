//! Unary, binary, comparison and select ops, strided copies and casts (`elementwise.wgsl`,
//! `cast.wgsl`): one thread per output element, inputs read through their strided layouts.

use crate::device::WgpuBackend;
use crate::shader::{self, kernel, Kernel, Variant};
use crate::storage::WgpuStorage;
use crate::util::{groups, layout_words, storage, uw};
use ferrite_core::{
    BinaryOp, CmpOp, DType, Error, Layout, Result, Shape, Storage, Tensor, UnaryOp,
};
use std::sync::Arc;

pub(crate) static ELEMENTWISE: Kernel = kernel!(
    "elementwise",
    &["unary", "binary", "cmp", "where_", "copy"],
    &[("T", shader::ALL)],
    &[&[], &["DIV_CHECK"], &["V4"]]
);

pub(crate) static CAST: Kernel = kernel!(
    "cast",
    &["cast_"],
    &[("S", shader::ALL), ("T", shader::ALL)],
    &[&[]]
);

/// Raw-word kernels (copy, where) are one variant whatever the dtype.
fn raw() -> Variant {
    Variant::new(&[("T", DType::U32)], &[])
}

fn code<T: PartialEq>(all: &[T], x: T) -> u32 {
    all.iter().position(|a| *a == x).unwrap_or(0) as u32
}

/// The offset of `t`'s first element in vec4 units, where the `V4` kernels can read it: a
/// contiguous layout starting at a multiple of 4 elements.
fn vec4_offset(t: &Tensor) -> Option<u32> {
    let l = t.layout();
    (l.is_contiguous() && l.offset().is_multiple_of(4))
        .then(|| u32::try_from(l.offset() / 4).ok())
        .flatten()
}

pub(crate) fn unary(dev: &WgpuBackend, op: UnaryOp, x: &Tensor) -> Result<Vec<Arc<dyn Storage>>> {
    let name = op.name();
    let dt = x.dtype();
    let n = x.elem_count();
    let out = dev.alloc(name, dt, n)?;
    let code = code(&UnaryOp::ALL, op);
    // (parameters, defines, threads)
    let (p, defines, threads) = match vec4_offset(x) {
        Some(o) => (
            vec![uw(name, n.div_ceil(4))?, code, o],
            &["V4"][..],
            n.div_ceil(4),
        ),
        None => {
            let mut p = vec![uw(name, n)?, code];
            p.extend(layout_words(name, x.layout())?);
            (p, &[][..], n)
        }
    };
    dev.launch(
        name,
        &ELEMENTWISE,
        "unary",
        &Variant::new(&[("T", dt)], defines),
        &p,
        &[&out],
        &[storage(x, name)?.buffer()],
        false,
        groups(threads),
    )?;
    Ok(vec![Arc::new(out)])
}

pub(crate) fn binary(
    dev: &WgpuBackend,
    op: BinaryOp,
    a: &Tensor,
    b: &Tensor,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = op.name();
    let dt = a.dtype();
    if op.float_only() && !dt.is_float() {
        return Err(Error::dtype(name, dt, "needs a float dtype"));
    }
    let n = a.elem_count();
    let out = dev.alloc(name, dt, n)?;
    let code = code(&BinaryOp::ALL, op);
    // Integer division checks for zero divisors, which the V4 variants (reading the buffers'
    // padding past n) must not meet.
    let check = op == BinaryOp::Div && !dt.is_float();
    let (p, defines, threads) = match (vec4_offset(a), vec4_offset(b), check) {
        (Some(oa), Some(ob), false) => {
            let q = n.div_ceil(4);
            (vec![uw(name, q)?, code, oa, ob], &["V4"][..], q)
        }
        _ => {
            let mut p = vec![uw(name, n)?, code];
            p.extend(layout_words(name, a.layout())?);
            p.extend(layout_words(name, b.layout())?);
            (p, if check { &["DIV_CHECK"][..] } else { &[][..] }, n)
        }
    };
    dev.launch(
        name,
        &ELEMENTWISE,
        "binary",
        &Variant::new(&[("T", dt)], defines),
        &p,
        &[&out],
        &[storage(a, name)?.buffer(), storage(b, name)?.buffer()],
        check,
        groups(threads),
    )?;
    Ok(vec![Arc::new(out)])
}

pub(crate) fn cmp(
    dev: &WgpuBackend,
    op: CmpOp,
    a: &Tensor,
    b: &Tensor,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = op.name();
    let n = a.elem_count();
    let out = dev.alloc(name, DType::Bool, n)?;
    let mut p = vec![uw(name, n)?, code(&CmpOp::ALL, op)];
    p.extend(layout_words(name, a.layout())?);
    p.extend(layout_words(name, b.layout())?);
    let v = Variant::new(&[("T", a.dtype())], &[]);
    dev.launch(
        name,
        &ELEMENTWISE,
        "cmp",
        &v,
        &p,
        &[&out],
        &[storage(a, name)?.buffer(), storage(b, name)?.buffer()],
        false,
        groups(n),
    )?;
    Ok(vec![Arc::new(out)])
}

pub(crate) fn where_cond(
    dev: &WgpuBackend,
    c: &Tensor,
    a: &Tensor,
    b: &Tensor,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = "where";
    let n = a.elem_count();
    let out = dev.alloc(name, a.dtype(), n)?;
    let mut p = vec![uw(name, n)?, 0];
    p.extend(layout_words(name, c.layout())?);
    p.extend(layout_words(name, a.layout())?);
    p.extend(layout_words(name, b.layout())?);
    dev.launch(
        name,
        &ELEMENTWISE,
        "where_",
        &raw(),
        &p,
        &[&out],
        &[
            storage(c, name)?.buffer(),
            storage(a, name)?.buffer(),
            storage(b, name)?.buffer(),
        ],
        false,
        groups(n),
    )?;
    Ok(vec![Arc::new(out)])
}

/// Copies the elements `src_layout` selects from `src` into `dst` at `dst_layout` (same
/// shape), in batch order.
pub(crate) fn copy_into(
    dev: &WgpuBackend,
    src: &WgpuStorage,
    src_layout: &Layout,
    dst: &WgpuStorage,
    dst_layout: &Layout,
) -> Result<()> {
    let name = "contiguous";
    let n = src_layout.shape().elem_count();
    let mut p = vec![uw(name, n)?, 0];
    p.extend(layout_words(name, src_layout)?);
    p.extend(layout_words(name, dst_layout)?);
    dev.launch(
        name,
        &ELEMENTWISE,
        "copy",
        &raw(),
        &p,
        &[dst],
        &[src.buffer()],
        false,
        groups(n),
    )
}

/// A contiguous copy of what `layout` selects from `src`.
pub(crate) fn copy_layout(
    dev: &WgpuBackend,
    src: &WgpuStorage,
    layout: &Layout,
) -> Result<WgpuStorage> {
    let n = layout.shape().elem_count();
    let out = dev.alloc("contiguous", src.dtype(), n)?;
    copy_into(
        dev,
        src,
        layout,
        &out,
        &Layout::contiguous(layout.shape().clone()),
    )?;
    Ok(out)
}

pub(crate) fn contiguous(dev: &WgpuBackend, x: &Tensor) -> Result<Vec<Arc<dyn Storage>>> {
    Ok(vec![Arc::new(copy_layout(
        dev,
        storage(x, "contiguous")?,
        x.layout(),
    )?)])
}

pub(crate) fn write_into(dev: &WgpuBackend, dst: &Tensor, src: &Tensor) -> Result<()> {
    let d = storage(dst, "copy_")?;
    let dl = Layout::new(
        Shape::new(dst.dims().to_vec()),
        dst.shape().contiguous_strides(),
        dst.layout().offset(),
    );
    copy_into(dev, storage(src, "copy_")?, src.layout(), d, &dl)
}

pub(crate) fn cast(dev: &WgpuBackend, x: &Tensor, to: DType) -> Result<Vec<Arc<dyn Storage>>> {
    let name = "cast";
    let n = x.elem_count();
    let out = dev.alloc(name, to, n)?;
    let mut p = vec![uw(name, n)?, 0];
    p.extend(layout_words(name, x.layout())?);
    let v = Variant::new(&[("S", x.dtype()), ("T", to)], &[]);
    dev.launch(
        name,
        &CAST,
        "cast_",
        &v,
        &p,
        &[&out],
        &[storage(x, name)?.buffer()],
        false,
        groups(n),
    )?;
    Ok(vec![Arc::new(out)])
}
