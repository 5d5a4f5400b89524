//! Direct 2-d convolutions (forward, transpose / input gradient, weight gradient) and max
//! pooling (`conv.wgsl`): one thread per output element over contiguous inputs. Correct for
//! every geometry; an implicit-GEMM kernel through workgroup memory is the fast path still to
//! come for large channel counts.

use crate::device::WgpuBackend;
use crate::shader::{self, kernel, Kernel, Variant};
use crate::util::{contig, groups, uw};
use ferrite_core::{
    Conv2dParams, ConvGeometry, DType, Error, Pool2dParams, Result, Shape, Storage, Tensor,
};
use std::sync::Arc;

pub(crate) static CONV: Kernel = kernel!(
    "conv",
    &[
        "conv2d",
        "conv_transpose2d",
        "conv2d_backward_weight",
        "max_pool2d"
    ],
    &[("T", shader::FLOATS)],
    &[&[], &["POOL"]]
);

fn float(op: &'static str, x: &Tensor) -> Result<DType> {
    if !x.dtype().is_float() {
        return Err(Error::dtype(op, x.dtype(), "needs a float dtype"));
    }
    Ok(x.dtype())
}

/// Runs one convolution entry: `a` and `b` are its two inputs, `g` the geometry, `total` the
/// output element count.
#[allow(clippy::too_many_arguments)]
fn run(
    dev: &WgpuBackend,
    name: &'static str,
    entry: &'static str,
    a: &Tensor,
    b: &Tensor,
    g: &ConvGeometry,
    total: usize,
) -> Result<Vec<Arc<dyn Storage>>> {
    let dt = float(name, a)?;
    let out = dev.alloc(name, dt, total)?;
    let ac = contig(dev, a, name)?;
    let bc = contig(dev, b, name)?;
    let p = g.p;
    let mut w = Vec::new();
    for v in [
        total,
        g.n,
        g.c,
        g.h,
        g.w,
        g.o,
        g.kh,
        g.kw,
        g.oh,
        g.ow,
        p.stride[0],
        p.stride[1],
        p.padding[0],
        p.padding[1],
        p.dilation[0],
        p.dilation[1],
        p.groups,
    ] {
        w.push(uw(name, v)?);
    }
    w.push(ac.offset());
    w.push(bc.offset());
    let v = Variant::new(&[("T", dt)], &[]);
    dev.launch(
        name,
        &CONV,
        entry,
        &v,
        &w,
        &[&out],
        &[ac.buffer(), bc.buffer()],
        false,
        groups(total),
    )?;
    Ok(vec![Arc::new(out)])
}

pub(crate) fn conv2d(
    dev: &WgpuBackend,
    x: &Tensor,
    w: &Tensor,
    p: &Conv2dParams,
    out: &Shape,
) -> Result<Vec<Arc<dyn Storage>>> {
    let g = ConvGeometry::new(x.dims(), w.dims(), out.dims(), *p);
    run(dev, "conv2d", "conv2d", x, w, &g, out.elem_count())
}

pub(crate) fn conv_transpose2d(
    dev: &WgpuBackend,
    x: &Tensor,
    w: &Tensor,
    p: &Conv2dParams,
    out: &Shape,
) -> Result<Vec<Arc<dyn Storage>>> {
    // x plays the output gradient [n, o, oh, ow]; the result is [n, c, h, w].
    let g = ConvGeometry::new(out.dims(), w.dims(), x.dims(), *p);
    run(
        dev,
        "conv_transpose2d",
        "conv_transpose2d",
        x,
        w,
        &g,
        out.elem_count(),
    )
}

pub(crate) fn conv2d_backward_weight(
    dev: &WgpuBackend,
    x: &Tensor,
    gy: &Tensor,
    p: &Conv2dParams,
    out: &Shape,
) -> Result<Vec<Arc<dyn Storage>>> {
    let g = ConvGeometry::new(x.dims(), out.dims(), gy.dims(), *p);
    run(
        dev,
        "conv2d_backward_weight",
        "conv2d_backward_weight",
        x,
        gy,
        &g,
        out.elem_count(),
    )
}

/// Max pooling with `p`, or adaptive max pooling (`None`) to the output spec's size.
pub(crate) fn max_pool2d(
    dev: &WgpuBackend,
    x: &Tensor,
    p: Option<&Pool2dParams>,
    out: &Shape,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = if p.is_some() {
        "max_pool2d"
    } else {
        "adaptive_max_pool2d"
    };
    let dt = float(name, x)?;
    let (d, o) = (x.dims(), out.dims());
    if d.len() != 4 || o.len() != 4 {
        return Err(Error::shape(name, "expected x [n, c, h, w]"));
    }
    let total = out.elem_count();
    let values = dev.alloc(name, dt, total)?;
    let indices = dev.alloc(name, DType::U32, total)?;
    let xc = contig(dev, x, name)?;
    let q = p.copied().unwrap_or(Pool2dParams {
        kernel: [1, 1],
        stride: [1, 1],
        padding: [0, 0],
        dilation: [1, 1],
        ceil_mode: false,
    });
    let mut w = Vec::new();
    for v in [
        total,
        d[0] * d[1],
        d[2],
        d[3],
        o[2],
        o[3],
        q.kernel[0],
        q.kernel[1],
        q.stride[0],
        q.stride[1],
        q.padding[0],
        q.padding[1],
        q.dilation[0],
        q.dilation[1],
        p.is_none() as usize,
    ] {
        w.push(uw(name, v)?);
    }
    w.push(xc.offset());
    let v = Variant::new(&[("T", dt)], &["POOL"]);
    dev.launch(
        name,
        &CONV,
        "max_pool2d",
        &v,
        &w,
        &[&values, &indices],
        &[xc.buffer()],
        false,
        groups(total),
    )?;
    Ok(vec![Arc::new(values), Arc::new(indices)])
}
