//! Batched matmul (`matmul.wgsl`): 64x64 output tiles through workgroup memory, inputs read
//! through their strides (no copies for transposed or broadcast views).

use crate::device::WgpuBackend;
use crate::shader::{self, kernel, Kernel, Variant};
use crate::util::{storage, uw};
use ferrite_core::{BinaryOp, DType, Error, Result, Shape, Storage, Tensor, UnaryOp};
use std::sync::Arc;

pub(crate) static MATMUL: Kernel = kernel!("matmul", &["matmul"], &[("T", shader::FLOATS)], &[&[]]);

pub(crate) fn matmul(
    dev: &WgpuBackend,
    a: &Tensor,
    b: &Tensor,
    out: &Shape,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = "matmul";
    let dt = a.dtype();
    if !dt.is_float() {
        return Err(Error::dtype(name, dt, "needs a float dtype"));
    }
    let r = a.rank();
    if r < 2 || b.rank() != r || out.rank() != r {
        return Err(Error::backend(
            name,
            "inputs must be [..., m, k] x [..., k, n]",
        ));
    }
    let (m, k, n) = (a.dims()[r - 2], a.dims()[r - 1], b.dims()[r - 1]);
    let batch_dims = &out.dims()[..r - 2];
    let batch: usize = batch_dims.iter().product();
    let y = dev.alloc(name, dt, out.elem_count())?;
    if out.elem_count() == 0 {
        return Ok(vec![Arc::new(y)]);
    }
    let (sa, sb) = (a.layout().strides(), b.layout().strides());
    let mut p = vec![
        uw(name, m)?,
        uw(name, n)?,
        uw(name, k)?,
        uw(name, batch)?,
        uw(name, sa[r - 2])?,
        uw(name, sa[r - 1])?,
        uw(name, sb[r - 2])?,
        uw(name, sb[r - 1])?,
        uw(name, a.layout().offset())?,
        uw(name, b.layout().offset())?,
        uw(name, r - 2)?,
    ];
    for &d in batch_dims {
        p.push(uw(name, d)?);
    }
    // Size-1 batch dims of an input contribute no offset whatever their stride.
    for (t, s) in [(a, sa), (b, sb)] {
        for (&d, &st) in t.dims()[..r - 2].iter().zip(s) {
            p.push(if d == 1 { 0 } else { uw(name, st)? });
        }
    }
    let groups = m.div_ceil(64) * n.div_ceil(64) * batch;
    let v = Variant::new(&[("T", dt)], &[]);
    dev.launch(
        name,
        &MATMUL,
        "matmul",
        &v,
        &p,
        &[&y],
        &[storage(a, name)?.buffer(), storage(b, name)?.buffer()],
        false,
        groups,
    )?;
    Ok(vec![Arc::new(y)])
}

/// `Op::Matmul` with output dtype `out_dt` (the operands' or f32 from f16/bf16) and
/// `Op::MatmulBias` (`bias` given, in `out_dt`). 16-bit operands with a bias or an f32
/// output are widened to f32 (exact) and multiplied in f32, the bias added in f32 and the sum
/// rounded once to `out_dt`.
pub(crate) fn matmul_to(
    dev: &WgpuBackend,
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    out: &Shape,
    out_dt: DType,
) -> Result<Vec<Arc<dyn Storage>>> {
    // Dtypes as the ops state them (checked by `Tensor`).
    let dt = a.dtype();
    let wide = matches!(dt, DType::F16 | DType::BF16) && (bias.is_some() || out_dt != dt);
    if !wide && bias.is_none() {
        return matmul(dev, a, b, out);
    }
    let tensor = |s: Vec<Arc<dyn Storage>>, shape: &Shape| crate::as_tensor(s, shape, a);
    let f32_of = |t: &Tensor| -> Result<Tensor> {
        match t.dtype() {
            DType::F32 => Ok(t.clone()),
            _ => tensor(crate::elementwise::cast(dev, t, DType::F32)?, t.shape()),
        }
    };
    let (a, b) = match wide {
        true => (f32_of(a)?, f32_of(b)?),
        false => (a.clone(), b.clone()),
    };
    let mut y = tensor(matmul(dev, &a, &b, out)?, out)?;
    if let Some(bias) = bias {
        let row = match wide {
            true => f32_of(bias)?,
            false => bias.clone(),
        };
        let row = row.broadcast_to(out.clone())?;
        y = tensor(
            crate::elementwise::binary(dev, BinaryOp::Add, &y, &row)?,
            out,
        )?;
    }
    match y.dtype() == out_dt {
        true => Ok(vec![y.storage_arc().clone()]),
        false => crate::elementwise::cast(dev, &y, out_dt),
    }
}

/// `Op::MatmulBiasGelu`: (gelu_tanh(p), p), p = a b + bias summed in f32 (`matmul_to`'s f32
/// output), each output rounded once from it to `out_dt`.
pub(crate) fn matmul_bias_gelu(
    dev: &WgpuBackend,
    a: &Tensor,
    b: &Tensor,
    bias: &Tensor,
    out: &Shape,
    out_dt: DType,
) -> Result<Vec<Arc<dyn Storage>>> {
    let tensor = |s: Vec<Arc<dyn Storage>>| crate::as_tensor(s, out, a);
    let p = tensor(matmul_to(dev, a, b, Some(bias), out, DType::F32)?)?;
    let y = tensor(crate::elementwise::unary(dev, UnaryOp::GeluTanh, &p)?)?;
    let low = |t: Tensor| match out_dt {
        DType::F32 => Ok(vec![t.storage_arc().clone()]),
        _ => crate::elementwise::cast(dev, &t, out_dt),
    };
    let mut o = low(y)?;
    o.extend(low(p)?);
    Ok(o)
}

/// `Op::MatmulGeluBackward`: gelu_tanh'(x) (g b), the product summed in f32 and multiplied
/// by the derivative before the one rounding to x's dtype.
pub(crate) fn matmul_gelu_backward(
    dev: &WgpuBackend,
    g: &Tensor,
    b: &Tensor,
    x: &Tensor,
    out: &Shape,
) -> Result<Vec<Arc<dyn Storage>>> {
    let tensor = |s: Vec<Arc<dyn Storage>>| crate::as_tensor(s, out, g);
    let q = tensor(matmul_to(dev, g, b, None, out, DType::F32)?)?;
    let xw = match x.dtype() {
        DType::F32 => x.clone(),
        _ => tensor(crate::elementwise::cast(dev, x, DType::F32)?)?,
    };
    let d = tensor(crate::elementwise::binary(
        dev,
        BinaryOp::GeluTanhBackward,
        &xw,
        &q,
    )?)?;
    match x.dtype() {
        DType::F32 => Ok(vec![d.storage_arc().clone()]),
        dt => crate::elementwise::cast(dev, &d, dt),
    }
}
