//! Batch norm and group norm and their backward (`channel_norm.wgsl`).

use crate::device::WgpuBackend;
use crate::shader::{self, kernel, Kernel, Variant};
use crate::util::{contig, fw, groups as wgroups, uw};
use ferrite_core::{DType, Error, Result, Storage, Tensor};
use std::sync::Arc;

pub(crate) static CHANNEL_NORM: Kernel = kernel!(
    "channel_norm",
    &[
        "channel_norm",
        "channel_norm_backward",
        "channel_norm_params"
    ],
    &[("T", shader::FLOATS)],
    &[&["CN"], &["CNB"], &["CNC"]]
);

/// (n, c, s, segments, segment length) of x [n, c, ...] normalized per channel (`groups` None)
/// or per sample and group.
fn geometry(
    op: &'static str,
    x: &Tensor,
    groups: Option<usize>,
) -> Result<(usize, usize, usize, usize, usize)> {
    let d = x.dims();
    if d.len() < 2 {
        return Err(Error::shape(
            op,
            format!("expected x [n, c, ...], got {}", x.shape()),
        ));
    }
    let (n, c) = (d[0], d[1]);
    let s: usize = d[2..].iter().product();
    Ok(match groups {
        None => (n, c, s, c, n * s),
        Some(g) => {
            if g == 0 || c % g != 0 {
                return Err(Error::shape(
                    op,
                    format!("{c} channels do not split into {g} groups"),
                ));
            }
            (n, c, s, n * g, (c / g) * s)
        }
    })
}

fn float(op: &'static str, x: &Tensor) -> Result<DType> {
    if !x.dtype().is_float() {
        return Err(Error::dtype(op, x.dtype(), "needs a float dtype"));
    }
    Ok(x.dtype())
}

/// Batch norm (`groups` None) -> (y, mean, var), or group norm -> y.
pub(crate) fn channel_norm(
    dev: &WgpuBackend,
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    groups: Option<usize>,
    eps: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = if groups.is_some() {
        "group_norm"
    } else {
        "batch_norm"
    };
    let dt = float(name, x)?;
    let (_, c, s, segs, len) = geometry(name, x, groups)?;
    let y = dev.alloc(name, dt, x.elem_count())?;
    let mean = dev.alloc(name, dt, segs)?;
    let var = dev.alloc(name, dt, segs)?;
    let xc = contig(dev, x, name)?;
    let wc = contig(dev, w, name)?;
    let bc = contig(dev, b, name)?;
    let p = [
        uw(name, segs)?,
        uw(name, len)?,
        groups.is_some() as u32,
        uw(name, c)?,
        uw(name, s)?,
        uw(name, groups.unwrap_or(1))?,
        fw(eps),
        xc.offset(),
        wc.offset(),
        bc.offset(),
    ];
    let v = Variant::new(&[("T", dt)], &["CN"]);
    dev.launch(
        name,
        &CHANNEL_NORM,
        "channel_norm",
        &v,
        &p,
        &[&y, &mean, &var],
        &[xc.buffer(), wc.buffer(), bc.buffer()],
        false,
        segs,
    )?;
    Ok(match groups {
        None => vec![Arc::new(y), Arc::new(mean), Arc::new(var)],
        Some(_) => vec![Arc::new(y)],
    })
}

/// Backward of batch / group norm's y: (x, weight, g) -> (dx, dweight, dbias).
pub(crate) fn channel_norm_backward(
    dev: &WgpuBackend,
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    groups: Option<usize>,
    eps: f64,
) -> Result<Vec<Arc<dyn Storage>>> {
    let name = if groups.is_some() {
        "group_norm_backward"
    } else {
        "batch_norm_backward"
    };
    let dt = float(name, x)?;
    let (n, c, s, segs, len) = geometry(name, x, groups)?;
    let dx = dev.alloc(name, dt, x.elem_count())?;
    let stats = dev.alloc(name, DType::F32, 2 * segs)?;
    let dw = dev.alloc(name, dt, c)?;
    let db = dev.alloc(name, dt, c)?;
    let xc = contig(dev, x, name)?;
    let wc = contig(dev, w, name)?;
    let gc = contig(dev, g, name)?;
    let mut p = [
        uw(name, segs)?,
        uw(name, len)?,
        groups.is_some() as u32,
        uw(name, c)?,
        uw(name, s)?,
        uw(name, groups.unwrap_or(1))?,
        fw(eps),
        xc.offset(),
        wc.offset(),
        gc.offset(),
    ];
    let v = Variant::new(&[("T", dt)], &["CNB"]);
    dev.launch(
        name,
        &CHANNEL_NORM,
        "channel_norm_backward",
        &v,
        &p,
        &[&dx, &stats],
        &[xc.buffer(), wc.buffer(), gc.buffer()],
        false,
        segs,
    )?;
    p[0] = uw(name, c)?;
    p[1] = uw(name, n)?;
    let v = Variant::new(&[("T", dt)], &["CNC"]);
    dev.launch(
        name,
        &CHANNEL_NORM,
        "channel_norm_params",
        &v,
        &p,
        &[&dw, &db],
        &[xc.buffer(), stats.buffer(), gc.buffer()],
        false,
        wgroups(c),
    )?;
    Ok(vec![Arc::new(dx), Arc::new(dw), Arc::new(db)])
}
