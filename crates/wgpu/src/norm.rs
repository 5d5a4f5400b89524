//! Row kernels (`norm.wgsl`): softmax, log-softmax and their backward, layer and RMS norm and
//! their backward, RoPE, and the fused cross entropy and its backward. Inputs are made
//! contiguous (copies only for strided views); one workgroup reduces each row in f32.

use crate::device::WgpuBackend;
use crate::errors;
use crate::shader::{self, kernel, Kernel, Variant};
use crate::util::{contig, fw, groups, uw};
use ferrite_core::{DType, Error, Result, Storage, Tensor};
use std::sync::Arc;

pub(crate) static NORM: Kernel = kernel!(
    "norm",
    &[
        "softmax",
        "softmax_backward",
        "layer_norm",
        "norm_backward_rows",
        "norm_backward_cols",
        "rope",
        "cross_entropy",
        "cross_entropy_backward"
    ],
    &[("T", shader::FLOATS), ("I", shader::INDEX)],
    &[
        &["SM"],
        &["SMB"],
        &["LN"],
        &["LNB"],
        &["LNC"],
        &["ROPE"],
        &["CE", "CET"],
        &["CEB", "CET"]
    ]
);

fn float(op: &'static str, x: &Tensor) -> Result<DType> {
    if !x.dtype().is_float() {
        return Err(Error::dtype(op, x.dtype(), "needs a float dtype"));
    }
    Ok(x.dtype())
}

/// (rows, n) of x viewed as [rows, last dim].
fn rows_of(x: &Tensor) -> (usize, usize) {
    let n = x.dims().last().copied().unwrap_or(1);
    let rows = x.elem_count().checked_div(n).unwrap_or(0);
    (rows, n)
}

fn variant(dt: DType, defines: &[&'static str]) -> Variant {
    Variant::new(&[("T", dt), ("I", DType::I32)], defines)
}

pub(crate) fn softmax(dev: &WgpuBackend, x: &Tensor, log: bool) -> Result<Vec<Arc<dyn Storage>>> {
    let name = if log { "log_softmax" } else { "softmax" };
    let dt = float(name, x)?;
    let (rows, n) = rows_of(x);
    let out = dev.alloc(name, dt, x.elem_count())?;
    let xc = contig(dev, x, name)?;
    let p = [uw(name, rows)?, uw(name, n)?, log as u32, xc.offset()];
    dev.launch(
        name,
        &NORM,
        "softmax",
        &variant(dt, &["SM"]),
        &p,
        &[&out],
        &[xc.buffer()],
        false,
        rows,
    )?;
    Ok(vec![Arc::new(out)])
}

pub(crate) fn softmax_backward(
    dev: &WgpuBackend,
    y: &Tensor,
    g: &Tensor,
    log: bool,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = if log {
        "log_softmax_backward"
    } else {
        "softmax_backward"
    };
    let dt = float(name, y)?;
    let (rows, n) = rows_of(y);
    let out = dev.alloc(name, dt, y.elem_count())?;
    let yc = contig(dev, y, name)?;
    let gc = contig(dev, g, name)?;
    let p = [
        uw(name, rows)?,
        uw(name, n)?,
        log as u32,
        yc.offset(),
        gc.offset(),
    ];
    dev.launch(
        name,
        &NORM,
        "softmax_backward",
        &variant(dt, &["SMB"]),
        &p,
        &[&out],
        &[yc.buffer(), gc.buffer()],
        false,
        rows,
    )?;
    Ok(vec![Arc::new(out)])
}

/// Layer norm (with `b`) or, with `rms`, RMS norm (no bias).
pub(crate) fn layer_norm(
    dev: &WgpuBackend,
    x: &Tensor,
    w: &Tensor,
    b: Option<&Tensor>,
    eps: f64,
    rms: bool,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = if rms { "rms_norm" } else { "layer_norm" };
    let dt = float(name, x)?;
    let (rows, n) = rows_of(x);
    let out = dev.alloc(name, dt, x.elem_count())?;
    let xc = contig(dev, x, name)?;
    let wc = contig(dev, w, name)?;
    let bc = match b {
        Some(b) => contig(dev, b, name)?,
        None => contig(dev, w, name)?,
    };
    let p = [
        uw(name, rows)?,
        uw(name, n)?,
        rms as u32,
        fw(eps),
        xc.offset(),
        wc.offset(),
        bc.offset(),
    ];
    dev.launch(
        name,
        &NORM,
        "layer_norm",
        &variant(dt, &["LN"]),
        &p,
        &[&out],
        &[xc.buffer(), wc.buffer(), bc.buffer()],
        false,
        rows,
    )?;
    Ok(vec![Arc::new(out)])
}

/// Backward of layer norm -> (dx, dweight, dbias), or of RMS norm -> (dx, dweight).
pub(crate) fn norm_backward(
    dev: &WgpuBackend,
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    eps: f64,
    rms: bool,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = if rms {
        "rms_norm_backward"
    } else {
        "layer_norm_backward"
    };
    let dt = float(name, x)?;
    let (rows, n) = rows_of(x);
    let dx = dev.alloc(name, dt, x.elem_count())?;
    let stats = dev.alloc(name, DType::F32, 2 * rows)?;
    let dw = dev.alloc(name, dt, n)?;
    let db = dev.alloc(name, dt, n)?;
    let xc = contig(dev, x, name)?;
    let wc = contig(dev, w, name)?;
    let gc = contig(dev, g, name)?;
    let p = [
        uw(name, rows)?,
        uw(name, n)?,
        rms as u32,
        fw(eps),
        xc.offset(),
        wc.offset(),
        gc.offset(),
    ];
    dev.launch(
        name,
        &NORM,
        "norm_backward_rows",
        &variant(dt, &["LNB"]),
        &p,
        &[&dx, &stats],
        &[xc.buffer(), wc.buffer(), gc.buffer()],
        false,
        rows,
    )?;
    let p = [
        uw(name, rows)?,
        uw(name, n)?,
        rms as u32,
        xc.offset(),
        gc.offset(),
    ];
    dev.launch(
        name,
        &NORM,
        "norm_backward_cols",
        &variant(dt, &["LNC"]),
        &p,
        &[&dw, &db],
        &[xc.buffer(), stats.buffer(), gc.buffer()],
        false,
        groups(n),
    )?;
    Ok(if rms {
        vec![Arc::new(dx), Arc::new(dw)]
    } else {
        vec![Arc::new(dx), Arc::new(dw), Arc::new(db)]
    })
}

pub(crate) fn rope(
    dev: &WgpuBackend,
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    interleaved: bool,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = "rope";
    let dt = float(name, x)?;
    let r = x.rank();
    if r < 2 {
        return Err(Error::shape(name, "expected x [..., l, d]"));
    }
    let (l, d) = (x.dims()[r - 2], x.dims()[r - 1]);
    let out = dev.alloc(name, dt, x.elem_count())?;
    let pairs = x.elem_count() / 2;
    let xc = contig(dev, x, name)?;
    let cc = contig(dev, cos, name)?;
    let sc = contig(dev, sin, name)?;
    let p = [
        uw(name, pairs)?,
        uw(name, l.max(1))?,
        uw(name, d)?,
        interleaved as u32,
        xc.offset(),
        cc.offset(),
        sc.offset(),
    ];
    dev.launch(
        name,
        &NORM,
        "rope",
        &variant(dt, &["ROPE"]),
        &p,
        &[&out],
        &[xc.buffer(), cc.buffer(), sc.buffer()],
        false,
        groups(pairs),
    )?;
    Ok(vec![Arc::new(out)])
}

/// The parameter head shared by both cross-entropy kernels.
fn ce_head(
    name: &'static str,
    logits: &Tensor,
    ignore_index: i64,
    label_smoothing: f64,
    offs: [u32; 3],
) -> Result<(Vec<u32>, usize)> {
    let (rows, c) = (logits.dims()[0], logits.dims()[1]);
    let (ignore, has) = match i32::try_from(ignore_index) {
        Ok(i) => (i as u32, 1),
        // Targets are stored as i32: an ignore_index beyond it can match none.
        Err(_) => (0, 0),
    };
    let p = vec![
        uw(name, rows)?,
        uw(name, c)?,
        fw(label_smoothing),
        ignore,
        has,
        offs[0],
        offs[1],
        offs[2],
        errors::CROSS_ENTROPY,
    ];
    Ok((p, rows))
}

fn target_dtype(name: &'static str, t: &Tensor) -> Result<DType> {
    match t.dtype() {
        DType::I32 | DType::I64 | DType::U32 | DType::U8 => Ok(t.dtype()),
        dt => Err(Error::dtype(name, dt, "targets must be an integer dtype")),
    }
}

pub(crate) fn cross_entropy(
    dev: &WgpuBackend,
    [x, t, w]: [&Tensor; 3],
    ignore_index: i64,
    label_smoothing: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = "cross_entropy";
    let dt = float(name, x)?;
    let idt = target_dtype(name, t)?;
    let xc = contig(dev, x, name)?;
    let tc = contig(dev, t, name)?;
    let wc = contig(dev, w, name)?;
    let (p, rows) = ce_head(
        name,
        x,
        ignore_index,
        label_smoothing,
        [xc.offset(), tc.offset(), wc.offset()],
    )?;
    let out = dev.alloc(name, dt.accumulator(), 3 * rows)?;
    let v = Variant::new(&[("T", dt), ("I", idt)], &["CE", "CET"]);
    dev.launch(
        name,
        &NORM,
        "cross_entropy",
        &v,
        &p,
        &[&out],
        &[xc.buffer(), tc.buffer(), wc.buffer()],
        true,
        rows,
    )?;
    Ok(vec![Arc::new(out)])
}

pub(crate) fn cross_entropy_backward(
    dev: &WgpuBackend,
    [x, t, w, o, g]: [&Tensor; 5],
    ignore_index: i64,
    label_smoothing: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = "cross_entropy_backward";
    let dt = float(name, x)?;
    let idt = target_dtype(name, t)?;
    let xc = contig(dev, x, name)?;
    let tc = contig(dev, t, name)?;
    let wc = contig(dev, w, name)?;
    let oc = contig(dev, o, name)?;
    let gc = contig(dev, g, name)?;
    let (mut p, rows) = ce_head(
        name,
        x,
        ignore_index,
        label_smoothing,
        [xc.offset(), tc.offset(), wc.offset()],
    )?;
    p.push(oc.offset());
    p.push(gc.offset());
    let out = dev.alloc(name, dt, x.elem_count())?;
    let v = Variant::new(&[("T", dt), ("I", idt)], &["CEB", "CET"]);
    dev.launch(
        name,
        &NORM,
        "cross_entropy_backward",
        &v,
        &p,
        &[&out],
        &[
            xc.buffer(),
            tc.buffer(),
            wc.buffer(),
            oc.buffer(),
            gc.buffer(),
        ],
        false,
        rows,
    )?;
    Ok(vec![Arc::new(out)])
}
