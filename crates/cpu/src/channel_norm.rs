//! Batch norm and group norm over `[n, c, s]` (s: the product of the trailing dims), forward
//! and backward; f16/bf16 compute in f32. Statistics are two-pass (mean, then the mean of
//! squared deviations); variances are biased.
//! - batch norm: one statistic per channel over (n, s);
//! - group norm: one per (sample, group) over its contiguous c/groups * s elements.

use crate::storage::float_kernel_many;
use ferrite_core::{HostBuffer, Result, Tensor};
use num_traits::Float;
use rayon::prelude::*;

/// (n, c, s) of x [n, c, ...].
fn ncs(x: &Tensor) -> (usize, usize, usize) {
    let d = x.dims();
    (d[0], d[1], d[2..].iter().product())
}

fn cast<F: Float>(v: usize) -> F {
    F::from(v).unwrap_or_else(F::nan)
}

/// (mean, 1 / sqrt(var + eps)) of the values `it` yields (called twice).
fn stats<F: Float, I: Iterator<Item = F>>(it: impl Fn() -> I, m: usize, eps: f64) -> (F, F) {
    let mf = cast::<F>(m);
    let mean = it().fold(F::zero(), |a, v| a + v) / mf;
    let var = it().fold(F::zero(), |a, v| a + (v - mean) * (v - mean)) / mf;
    let eps = F::from(eps).unwrap_or_else(F::zero);
    (mean, F::one() / (var + eps).sqrt())
}

/// Values of channel `ch` of x [n, c, s] (all samples).
fn channel<F: Float>(
    x: &[F],
    (n, c, s): (usize, usize, usize),
    ch: usize,
) -> impl Iterator<Item = F> + '_ {
    (0..n).flat_map(move |ni| x[(ni * c + ch) * s..(ni * c + ch + 1) * s].iter().copied())
}

fn bn_forward<F: Float + ferrite_core::WithDType + Send + Sync>(
    x: &[F],
    w: &[F],
    b: &[F],
    dims: (usize, usize, usize),
    eps: f64,
) -> Vec<Vec<F>> {
    let (n, c, s) = dims;
    let m = n * s;
    let st: Vec<(F, F, F)> = (0..c)
        .into_par_iter()
        .map(|ch| {
            let (mean, inv) = stats(|| channel(x, dims, ch), m, eps);
            let var = channel(x, dims, ch).fold(F::zero(), |a, v| a + (v - mean) * (v - mean))
                / cast::<F>(m);
            (mean, inv, var)
        })
        .collect();
    let mut y = crate::alloc::full(x.len(), F::zero());
    if s > 0 {
        y.par_chunks_mut(s)
            .zip(x.par_chunks(s))
            .enumerate()
            .for_each(|(r, (yr, xr))| {
                let ch = r % c;
                let (mean, inv, _) = st[ch];
                for (o, &v) in yr.iter_mut().zip(xr) {
                    *o = (v - mean) * inv * w[ch] + b[ch];
                }
            });
    }
    vec![
        y,
        st.iter().map(|t| t.0).collect(),
        st.iter().map(|t| t.2).collect(),
    ]
}

fn bn_backward<F: Float + ferrite_core::WithDType + Send + Sync>(
    x: &[F],
    w: &[F],
    g: &[F],
    dims: (usize, usize, usize),
    eps: f64,
) -> Vec<Vec<F>> {
    let (n, c, s) = dims;
    let m = n * s;
    // Per channel: mean, inv, Σg, Σ g xhat.
    let st: Vec<(F, F, F, F)> = (0..c)
        .into_par_iter()
        .map(|ch| {
            let (mean, inv) = stats(|| channel(x, dims, ch), m, eps);
            let (sg, sgx) = channel(x, dims, ch)
                .zip(channel(g, dims, ch))
                .fold((F::zero(), F::zero()), |(a, b), (xv, gv)| {
                    (a + gv, b + gv * (xv - mean) * inv)
                });
            (mean, inv, sg, sgx)
        })
        .collect();
    let mut dx = crate::alloc::full(x.len(), F::zero());
    let mf = cast::<F>(m);
    if s > 0 {
        dx.par_chunks_mut(s).enumerate().for_each(|(r, d)| {
            let ch = r % c;
            let (mean, inv, sg, sgx) = st[ch];
            let k = w[ch] * inv / mf;
            for (j, o) in d.iter_mut().enumerate() {
                let xh = (x[r * s + j] - mean) * inv;
                *o = k * (mf * g[r * s + j] - sg - xh * sgx);
            }
        });
    }
    vec![
        dx,
        st.iter().map(|t| t.3).collect(),
        st.iter().map(|t| t.2).collect(),
    ]
}

fn gn_forward<F: Float + ferrite_core::WithDType + Send + Sync>(
    x: &[F],
    w: &[F],
    b: &[F],
    (n, c, s): (usize, usize, usize),
    groups: usize,
    eps: f64,
) -> Vec<F> {
    let len = c / groups * s;
    let mut y = crate::alloc::full(x.len(), F::zero());
    if len == 0 || n == 0 {
        return y;
    }
    y.par_chunks_mut(len)
        .zip(x.par_chunks(len))
        .enumerate()
        .for_each(|(seg, (yr, xr))| {
            let (mean, inv) = stats(|| xr.iter().copied(), len, eps);
            let c0 = (seg % groups) * (c / groups);
            for (j, (o, &v)) in yr.iter_mut().zip(xr).enumerate() {
                let ch = c0 + j / s.max(1);
                *o = (v - mean) * inv * w[ch] + b[ch];
            }
        });
    y
}

fn gn_backward<F: Float + ferrite_core::WithDType + Send + Sync>(
    x: &[F],
    w: &[F],
    g: &[F],
    (n, c, s): (usize, usize, usize),
    groups: usize,
    eps: f64,
) -> Vec<Vec<F>> {
    let cg = c / groups;
    let len = cg * s;
    let mut dx = crate::alloc::full(x.len(), F::zero());
    if len == 0 || n == 0 {
        return vec![dx, vec![F::zero(); c], vec![F::zero(); c]];
    }
    let st: Vec<(F, F)> = x
        .par_chunks(len)
        .map(|xr| stats(|| xr.iter().copied(), len, eps))
        .collect();
    let mf = cast::<F>(len);
    dx.par_chunks_mut(len).enumerate().for_each(|(seg, d)| {
        let (mean, inv) = st[seg];
        let c0 = (seg % groups) * cg;
        let base = seg * len;
        let (mut sgw, mut sgwx) = (F::zero(), F::zero());
        for j in 0..len {
            let gw = g[base + j] * w[c0 + j / s];
            sgw = sgw + gw;
            sgwx = sgwx + gw * (x[base + j] - mean) * inv;
        }
        for (j, o) in d.iter_mut().enumerate() {
            let gw = g[base + j] * w[c0 + j / s];
            let xh = (x[base + j] - mean) * inv;
            *o = inv / mf * (mf * gw - sgw - xh * sgwx);
        }
    });
    let sums: Vec<(F, F)> = (0..c)
        .into_par_iter()
        .map(|ch| {
            (0..n).fold((F::zero(), F::zero()), |(a, b), ni| {
                let (mean, inv) = st[ni * groups + ch / cg];
                let off = (ni * c + ch) * s;
                (0..s).fold((a, b), |(a, b), j| {
                    let gv = g[off + j];
                    (a + gv * (x[off + j] - mean) * inv, b + gv)
                })
            })
        })
        .collect();
    vec![
        dx,
        sums.iter().map(|t| t.0).collect(),
        sums.iter().map(|t| t.1).collect(),
    ]
}

pub(crate) fn batch_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<Vec<HostBuffer>> {
    let dims = ncs(x);
    Ok(float_kernel_many!(
        "batch_norm",
        x.dtype(),
        [x, w, b],
        |xs, ws, bs| { bn_forward(xs, ws, bs, dims, eps) }
    ))
}

pub(crate) fn batch_norm_backward(
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    eps: f64,
) -> Result<Vec<HostBuffer>> {
    let dims = ncs(x);
    Ok(float_kernel_many!(
        "batch_norm_backward",
        x.dtype(),
        [x, w, g],
        |xs, ws, gs| { bn_backward(xs, ws, gs, dims, eps) }
    ))
}

pub(crate) fn group_norm(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    groups: usize,
    eps: f64,
) -> Result<Vec<HostBuffer>> {
    let dims = ncs(x);
    Ok(float_kernel_many!(
        "group_norm",
        x.dtype(),
        [x, w, b],
        |xs, ws, bs| { vec![gn_forward(xs, ws, bs, dims, groups, eps)] }
    ))
}

pub(crate) fn group_norm_backward(
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    groups: usize,
    eps: f64,
) -> Result<Vec<HostBuffer>> {
    let dims = ncs(x);
    Ok(float_kernel_many!(
        "group_norm_backward",
        x.dtype(),
        [x, w, g],
        |xs, ws, gs| { gn_backward(xs, ws, gs, dims, groups, eps) }
    ))
}
