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

/// Independent partial sums per slice: the compiler vectorizes these folds, which a single
/// running sum (a serial dependency) would prevent.
const LANES: usize = 16;

/// Σ f(a[i], b[i]) over equal-length slices, in `LANES` interleaved partial sums.
fn sum2<F: Float>(a: &[F], b: &[F], f: impl Fn(F, F) -> F) -> F {
    let mut acc = [F::zero(); LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] = acc[l] + f(x[l], y[l]);
        }
    }
    let tail = ra.iter().zip(rb).fold(F::zero(), |s, (&x, &y)| s + f(x, y));
    acc.iter().fold(tail, |s, &v| s + v)
}

/// Σ f(a[i]).
fn sum1<F: Float>(a: &[F], f: impl Fn(F) -> F) -> F {
    sum2(a, a, |x, _| f(x))
}

/// The n planes (s values each) of channel `ch` of x [n, c, s].
fn planes<F>(x: &[F], (n, c, s): (usize, usize, usize), ch: usize) -> impl Iterator<Item = &[F]> {
    (0..n).map(move |ni| &x[(ni * c + ch) * s..(ni * c + ch + 1) * s])
}

/// (mean, biased variance) of channel `ch` of x [n, c, s], two-pass.
fn channel_stats<F: Float>(x: &[F], dims: (usize, usize, usize), ch: usize) -> (F, F) {
    let mf = cast::<F>(dims.0 * dims.2);
    let mean = planes(x, dims, ch).fold(F::zero(), |a, p| a + sum1(p, |v| v)) / mf;
    let var =
        planes(x, dims, ch).fold(F::zero(), |a, p| a + sum1(p, |v| (v - mean) * (v - mean))) / mf;
    (mean, var)
}

fn inv_std<F: Float>(var: F, eps: f64) -> F {
    F::one() / (var + F::from(eps).unwrap_or_else(F::zero)).sqrt()
}

fn bn_forward<F: Float + ferrite_core::WithDType + Send + Sync>(
    x: &[F],
    w: &[F],
    b: &[F],
    dims: (usize, usize, usize),
    eps: f64,
) -> Vec<Vec<F>> {
    let (_, c, s) = dims;
    let st: Vec<(F, F)> = (0..c)
        .into_par_iter()
        .map(|ch| channel_stats(x, dims, ch))
        .collect();
    let y = crate::alloc::filled(x.len(), |y| {
        if s == 0 {
            return;
        }
        y.par_chunks_mut(s)
            .zip(x.par_chunks(s))
            .enumerate()
            .for_each(|(r, (yr, xr))| {
                let ch = r % c;
                let (mean, var) = st[ch];
                // y = x k + (b - mean k), k = w / std.
                let k = inv_std(var, eps) * w[ch];
                let o = b[ch] - mean * k;
                for (d, &v) in yr.iter_mut().zip(xr) {
                    d.write(v * k + o);
                }
            });
    });
    vec![
        y,
        st.iter().map(|t| t.0).collect(),
        st.iter().map(|t| t.1).collect(),
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
    let mf = cast::<F>(n * s);
    // Per channel: mean, inv, Σg, Σ g xhat (xhat = (x - mean) inv).
    let st: Vec<(F, F, F, F)> = (0..c)
        .into_par_iter()
        .map(|ch| {
            let mean = planes(x, dims, ch).fold(F::zero(), |a, p| a + sum1(p, |v| v)) / mf;
            let (mut sq, mut sg, mut sgx) = (F::zero(), F::zero(), F::zero());
            for (xp, gp) in planes(x, dims, ch).zip(planes(g, dims, ch)) {
                sq = sq + sum1(xp, |v| (v - mean) * (v - mean));
                sg = sg + sum1(gp, |v| v);
                sgx = sgx + sum2(xp, gp, |v, gv| gv * (v - mean));
            }
            let inv = inv_std(sq / mf, eps);
            (mean, inv, sg, sgx * inv)
        })
        .collect();
    let dx = crate::alloc::filled(x.len(), |dx| {
        if s == 0 {
            return;
        }
        dx.par_chunks_mut(s)
            .zip(x.par_chunks(s).zip(g.par_chunks(s)))
            .enumerate()
            .for_each(|(r, (d, (xr, gr)))| {
                let ch = r % c;
                let (mean, inv, sg, sgx) = st[ch];
                // dx = k (m g - Σg - xhat Σ g xhat), k = w inv / m.
                let k = w[ch] * inv / mf;
                let (kx, o) = (k * inv * sgx, k * sg);
                let km = k * mf;
                for (dv, (&xv, &gv)) in d.iter_mut().zip(xr.iter().zip(gr)) {
                    dv.write(km * gv - o - (xv - mean) * kx);
                }
            });
    });
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
