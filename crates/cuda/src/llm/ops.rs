//! The kernels of the decode step one at a time, on buffers the caller owns: for tests against
//! the CPU references and for benchmarks. Each call plans one launch and enqueues it on the
//! device's compute stream (reads of the outputs wait for it).

pub use super::decode::{AttnShape, HD_MAX};
pub use crate::matvec::{Mode, Seg};

use super::{decode, zeros, Launch};
use crate::matvec;
use crate::qmatrix::GpuMatrix;
use crate::{Buffer, CudaDevice};
use ferrite_core::{Error, Result};

/// `out` (16-bit [w.rows][w.cols], row-major; bf16 if `bf16`, else f16) = the weights of `w`
/// dequantized: the batched prefill's weight operand of its tensor-core products.
pub fn dequant(dev: &CudaDevice, w: &GpuMatrix, out: &Buffer, bf16: bool) -> Result<()> {
    if out.bytes() < w.rows * w.cols * 2 {
        return Err(Error::backend(
            "pf_dequant",
            format!(
                "output holds {} bytes, needs {}",
                out.bytes(),
                w.rows * w.cols * 2
            ),
        ));
    }
    super::prefill::dequant_rows(dev, w, 0, w.rows, out.ptr(), u32::from(bf16))
}

/// `out[off + r] = W[r] . norm(x)` for the rows of every segment (Store/Add), or the gated
/// product of `[gate, up]` (Glu modes). `norm`: RMS-norm weight (f32 [cols]) and epsilon.
pub fn matvec(
    dev: &CudaDevice,
    segs: &[Seg<'_>],
    mode: Mode,
    x: &Buffer,
    norm: Option<(&Buffer, f32)>,
    out: &Buffer,
) -> Result<()> {
    matvec::plan(dev.sm_count(), segs, mode, x, norm, out, None)?.enqueue(dev)
}

/// `matvec` in the fast mode: norm(x) quantized to 8-bit units (32 values, a scale and their
/// sum: the CPU's `quantize_q8`), then integer dot products per unit scaled by the weight's
/// and the unit's scales. An error for formats without an integer kernel (F32, F16, BF16,
/// Q5_K and the formats stored as f16).
pub fn matvec_q8(
    dev: &CudaDevice,
    segs: &[Seg<'_>],
    mode: Mode,
    x: &Buffer,
    norm: Option<(&Buffer, f32)>,
    out: &Buffer,
) -> Result<()> {
    let cols = segs.first().map_or(0, |s| s.w.cols);
    let scratch = zeros(dev, matvec::q8_bytes(cols), "quantized input")?;
    let l = matvec::plan(dev.sm_count(), segs, mode, x, norm, out, None)?
        .with_q8(dev.sm_count(), &scratch)?;
    if !l.is_q8() {
        return Err(Error::backend(
            "matvec_q8",
            "a format without an 8-bit activation kernel",
        ));
    }
    l.enqueue(dev)?;
    // the scratch is freed at return: wait for the launch that reads it
    dev.synchronize()
}

/// `matvec` (`q8`: `matvec_q8`) for `rows` input rows at once, the engine's batched product:
/// row i reads `x` from element i * cols and writes `out` from element i * ostride (offsets
/// of the segments inside each output row). In the fast mode on split rows this is the
/// batched register kernel (8 rows per block).
#[allow(clippy::too_many_arguments)]
pub fn matvec_rows(
    dev: &CudaDevice,
    segs: &[Seg<'_>],
    mode: Mode,
    x: &Buffer,
    norm: Option<(&Buffer, f32)>,
    out: &Buffer,
    rows: usize,
    ostride: usize,
    q8: bool,
) -> Result<()> {
    matvec_rows_with(dev, segs, mode, x, norm, out, rows, ostride, q8, None)
}

/// `matvec_rows` in the fast mode on the int8 tensor-core kernels (`MvLaunch::with_mma`),
/// with split K where it pays (`split`) or never; an error where they do not apply (one row,
/// formats without them, GGUF rows, pre-sm_80).
#[allow(clippy::too_many_arguments)]
pub fn matvec_rows_mma(
    dev: &CudaDevice,
    segs: &[Seg<'_>],
    mode: Mode,
    x: &Buffer,
    norm: Option<(&Buffer, f32)>,
    out: &Buffer,
    rows: usize,
    ostride: usize,
    split: bool,
) -> Result<()> {
    matvec_rows_with(
        dev,
        segs,
        mode,
        x,
        norm,
        out,
        rows,
        ostride,
        true,
        Some(split),
    )
}

/// `matvec_rows` with two-level 8-bit inputs (the CPU's q8x2) on the int8 tensor-core
/// kernels (`MvLaunch::with_q8x2_mma`, the prefill's products of models on f32 activations);
/// matrices are first copied as the prefill copies them (`prefill::mmq_copy`: split rows of
/// GGUF-layout matrices, Q4_K as `Q4_KU` units).
/// An error where the kernels do not apply (one row, formats without them, pre-sm_80).
#[allow(clippy::too_many_arguments)]
pub fn matvec_rows_q8x2(
    dev: &CudaDevice,
    segs: &[Seg<'_>],
    mode: Mode,
    x: &Buffer,
    norm: Option<(&Buffer, f32)>,
    out: &Buffer,
    rows: usize,
    ostride: usize,
) -> Result<()> {
    let cols = check_rows("matvec_rows_q8x2", segs, x, out, rows, ostride)?;
    let copies = segs
        .iter()
        .map(|s| super::prefill::mmq_copy(dev, s.w))
        .collect::<Result<Vec<_>>>()?;
    let segs: Vec<Seg<'_>> = segs
        .iter()
        .zip(&copies)
        .map(|(s, c)| on_copy(s, c))
        .collect();
    let segs = &segs[..];
    let (major, minor) = dev.compute_capability();
    let rows_out: usize = segs.iter().map(|s| s.w.rows).sum();
    let scratch = zeros(dev, matvec::q8x2_bytes(cols) * rows, "two-level input")?;
    let part = zeros(dev, 8 * rows * rows_out.max(1) * 4, "split-K partials")?;
    let l = matvec::plan(dev.sm_count(), segs, mode, x, norm, out, None)?
        .with_rows(rows, cols * 4, ostride * 4)?
        .with_q8x2_mma(
            (major.max(0) as u32, minor.max(0) as u32),
            dev.sm_count(),
            &scratch,
            Some(&part),
        )?
        .ok_or_else(|| {
            Error::backend(
                "matvec_rows_q8x2",
                "the tensor-core kernels do not apply to this product",
            )
        })?;
    l.enqueue(dev)?;
    dev.synchronize()
}

/// Two products on the int8 tensor cores with two-level inputs, the second reading the
/// first's output: `out_a = a(x)` (by `mode_a`; GLU: `a` is gate and up), then
/// `out_b = b(norm_b(out_a))` (Store), each over `rows` packed rows. With `fuse`, the first
/// quantizes the second's input as it sums its splits (`MvLaunch::quantizing_next`) where it
/// can (a GLU launch then leaves `out_a` as it was). Returns whether it did, and the two-level
/// rows of the second's input (the shared scratch after both).
#[allow(clippy::too_many_arguments)]
pub fn matvec_rows_q8x2_pair(
    dev: &CudaDevice,
    (a, mode_a): (&[Seg<'_>], Mode),
    b: &Seg<'_>,
    x: &Buffer,
    norm_b: Option<(&Buffer, f32)>,
    (out_a, out_b): (&Buffer, &Buffer),
    rows: usize,
    fuse: bool,
) -> Result<(bool, Vec<u8>)> {
    let op = "matvec_rows_q8x2_pair";
    let glu = matches!(mode_a, Mode::GluSilu | Mode::GluGelu);
    if a.is_empty() || (glu && a.len() != 2) {
        return Err(Error::backend(
            op,
            format!("{} matrices for {mode_a:?}", a.len()),
        ));
    }
    let (na, nb) = (a[0].w.rows, b.w.rows);
    let outs_a = if glu {
        na
    } else {
        a.iter().map(|s| s.w.rows).sum()
    };
    let ca = check_rows(op, a, x, out_a, rows, outs_a)?;
    let cb = check_rows(op, std::slice::from_ref(b), out_a, out_b, rows, nb)?;
    let copies = a
        .iter()
        .map(|s| super::prefill::mmq_copy(dev, s.w))
        .collect::<Result<Vec<_>>>()?;
    let wb = super::prefill::mmq_copy(dev, b.w)?;
    let sa: Vec<Seg<'_>> = a.iter().zip(&copies).map(|(s, c)| on_copy(s, c)).collect();
    let sb = on_copy(b, &wb);
    let (major, minor) = dev.compute_capability();
    let cc = (major.max(0) as u32, minor.max(0) as u32);
    let qb = matvec::q8x2_bytes(ca.max(cb)) * rows;
    let scratch = zeros(dev, qb, "two-level input")?;
    let part = zeros(dev, 8 * rows * 2 * na.max(nb) * 4, "split-K partials")?;
    let none = || Error::backend(op, "the tensor-core kernels do not apply to this product");
    let mut la = matvec::plan(dev.sm_count(), &sa, mode_a, x, None, out_a, None)?
        .with_rows(rows, ca * 4, outs_a * 4)?
        .with_q8x2_mma(cc, dev.sm_count(), &scratch, Some(&part))?
        .ok_or_else(none)?;
    let mut lb = matvec::plan(
        dev.sm_count(),
        &[sb],
        Mode::Store,
        out_a,
        norm_b,
        out_b,
        None,
    )?
    .with_rows(rows, cb * 4, nb * 4)?
    .with_q8x2_mma(cc, dev.sm_count(), &scratch, Some(&part))?
    .ok_or_else(none)?;
    let mut fused = false;
    if fuse {
        if let Some(f) = la.quantizing_next(cb, norm_b, &scratch)? {
            (la, lb, fused) = (f, lb.reusing_input(), true);
        }
    }
    la.enqueue(dev)?;
    lb.enqueue(dev)?;
    let q = dev.read_bytes(&scratch, 0, matvec::q8x2_bytes(cb) * rows)?;
    Ok((fused, q))
}

/// The two-level tensor-core product `out = a(x)` (Store) over `rows` packed rows, twice:
/// quantizing the f32 rows `x`, then the f16 rows `x16` (the same values; the attention
/// output's product, `MvLaunch::quantizing_half_input`). Returns each run's two-level input
/// bytes and the bytes of `out`.
pub fn matvec_rows_q8x2_half_input(
    dev: &CudaDevice,
    a: &Seg<'_>,
    (x, x16): (&Buffer, &Buffer),
    out: &Buffer,
    rows: usize,
) -> Result<[(Vec<u8>, Vec<u8>); 2]> {
    let op = "matvec_rows_q8x2_half_input";
    let (n, cols) = (
        a.w.rows,
        check_rows(op, std::slice::from_ref(a), x, out, rows, a.w.rows)?,
    );
    if x16.bytes() < rows * cols * 2 {
        return Err(Error::backend(
            op,
            format!("{} bytes of f16 rows", x16.bytes()),
        ));
    }
    let wa = super::prefill::mmq_copy(dev, a.w)?;
    let sa = on_copy(a, &wa);
    let (major, minor) = dev.compute_capability();
    let cc = (major.max(0) as u32, minor.max(0) as u32);
    let scratch = zeros(dev, matvec::q8x2_bytes(cols) * rows, "two-level input")?;
    let part = zeros(dev, 8 * rows * n * 4, "split-K partials")?;
    let none = || Error::backend(op, "the tensor-core kernels do not apply to this product");
    let l = matvec::plan(dev.sm_count(), &[sa], Mode::Store, x, None, out, None)?
        .with_rows(rows, cols * 4, n * 4)?
        .with_q8x2_mma(cc, dev.sm_count(), &scratch, Some(&part))?
        .ok_or_else(none)?;
    let half = l.quantizing_half_input(x16.ptr()).ok_or_else(none)?;
    let mut runs = Vec::with_capacity(2);
    for l in [l, half] {
        l.enqueue(dev)?;
        runs.push((
            dev.read_bytes(&scratch, 0, scratch.bytes())?,
            dev.read_bytes(out, 0, rows * n * 4)?,
        ));
    }
    let [f, h]: [(Vec<u8>, Vec<u8>); 2] = runs.try_into().map_err(|_| none())?;
    Ok([f, h])
}

/// `s` reading `copy` (the int8 kernels' copy of its matrix, `prefill::mmq_copy`) where there is one.
fn on_copy<'a>(s: &Seg<'a>, copy: &'a Option<GpuMatrix>) -> Seg<'a> {
    Seg {
        w: copy.as_ref().unwrap_or(s.w),
        ..*s
    }
}

/// The columns of `segs`, after checking that `x` holds `rows` f32 rows of them and `out`
/// `rows` rows of `ostride` floats.
fn check_rows(
    op: &'static str,
    segs: &[Seg<'_>],
    x: &Buffer,
    out: &Buffer,
    rows: usize,
    ostride: usize,
) -> Result<usize> {
    let cols = segs.first().map_or(0, |s| s.w.cols);
    if x.bytes() < rows * cols * 4 || out.bytes() < rows * ostride * 4 {
        return Err(Error::backend(
            op,
            format!(
                "buffers of {} and {} bytes for {rows} rows of {cols} in, {ostride} out",
                x.bytes(),
                out.bytes()
            ),
        ));
    }
    Ok(cols)
}

#[allow(clippy::too_many_arguments)]
fn matvec_rows_with(
    dev: &CudaDevice,
    segs: &[Seg<'_>],
    mode: Mode,
    x: &Buffer,
    norm: Option<(&Buffer, f32)>,
    out: &Buffer,
    rows: usize,
    ostride: usize,
    q8: bool,
    mma: Option<bool>,
) -> Result<()> {
    let cols = check_rows("matvec_rows", segs, x, out, rows, ostride)?;
    let mut l = matvec::plan(dev.sm_count(), segs, mode, x, norm, out, None)?.with_rows(
        rows,
        cols * 4,
        ostride * 4,
    )?;
    let scratch = zeros(dev, matvec::q8_bytes(cols) * rows, "quantized input")?;
    if q8 {
        l = l.with_q8(dev.sm_count(), &scratch)?;
        if !l.is_q8() {
            return Err(Error::backend(
                "matvec_rows",
                "a format without an 8-bit activation kernel",
            ));
        }
        if let Some(split) = mma {
            let (major, minor) = dev.compute_capability();
            let rows_out: usize = segs.iter().map(|s| s.w.rows).sum();
            let part = zeros(
                dev,
                8 * rows.max(1) * rows_out.max(1) * 4,
                "split-K partials",
            )?;
            l = l.with_mma(
                (major.max(0) as u32, minor.max(0) as u32),
                dev.sm_count(),
                split.then_some(&part),
            )?;
            if !l.is_mma() {
                return Err(Error::backend(
                    "matvec_rows",
                    "the tensor-core kernels do not apply to this product",
                ));
            }
        }
    }
    l.enqueue(dev)?;
    dev.synchronize()
}

/// `logits = W . norm(x)` and the index of the largest logit (u32) into `token` at byte 0.
pub fn matvec_argmax(
    dev: &CudaDevice,
    w: &GpuMatrix,
    x: &Buffer,
    norm: Option<(&Buffer, f32)>,
    logits: &Buffer,
    token: &Buffer,
) -> Result<()> {
    let part = zeros(dev, matvec::blocks_for(w.rows) * 8, "argmax partials")?;
    let seg = [Seg {
        w,
        bias: None,
        out_off: 0,
    }];
    let l = matvec::plan(
        dev.sm_count(),
        &seg,
        Mode::Store,
        x,
        norm,
        logits,
        Some(&part),
    )?;
    Launch::Matvec(l).enqueue(dev)?;
    Launch::Argmax(matvec::plan_argmax(&part, l.tiles(), token, 0)?).enqueue(dev)
}

/// `out = w[params[0]] * scale` (the embedding of the token in the parameter block).
pub fn embed(
    dev: &CudaDevice,
    w: &GpuMatrix,
    params: &Buffer,
    out: &Buffer,
    scale: f32,
) -> Result<()> {
    matvec::plan_embed(w, params, out, scale, None)?.enqueue(dev)
}

/// `y = x / rms(x) * w` over `n` values.
pub fn rms_norm(
    dev: &CudaDevice,
    x: &Buffer,
    w: &Buffer,
    y: &Buffer,
    n: usize,
    eps: f32,
) -> Result<()> {
    decode::plan_norm(x, y, w, n, eps, false)?.enqueue(dev)
}

/// `x += y / rms(y) * w` over `n` values.
pub fn rms_norm_add(
    dev: &CudaDevice,
    x: &Buffer,
    y: &Buffer,
    w: &Buffer,
    n: usize,
    eps: f32,
) -> Result<()> {
    decode::plan_norm(x, y, w, n, eps, true)?.enqueue(dev)
}
