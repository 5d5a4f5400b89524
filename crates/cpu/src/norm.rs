//! Fused row ops over the last axis: softmax, log_softmax, layer_norm, rms_norm, and RoPE.
//! Each row is independent; rows run in parallel. f16/bf16 compute in f32.

use crate::storage::{float_kernel, float_kernel_many};
use ferrite_core::{HostBuffer, Result, Tensor};
use num_traits::Float;
use rayon::prelude::*;

/// Applies `f(row_index, src_row, dst_row)` to every row of length `n`.
fn per_row<F: Float + ferrite_core::WithDType>(
    x: &[F],
    n: usize,
    f: impl Fn(usize, &[F], &mut [F]) + Sync + Send,
) -> Vec<F> {
    let mut out = crate::alloc::full(x.len(), F::zero());
    if n == 0 {
        return out;
    }
    if x.len() >= crate::elementwise::PAR_MIN {
        out.par_chunks_mut(n)
            .zip(x.par_chunks(n))
            .enumerate()
            .for_each(|(r, (d, s))| f(r, s, d));
    } else {
        out.chunks_mut(n)
            .zip(x.chunks(n))
            .enumerate()
            .for_each(|(r, (d, s))| f(r, s, d));
    }
    out
}

fn last(x: &Tensor) -> usize {
    x.dims().last().copied().unwrap_or(1)
}

fn softmax_rows<F: Float + ferrite_core::WithDType>(x: &[F], n: usize, log: bool) -> Vec<F> {
    per_row(x, n, |_, s, d| {
        let m = s.iter().fold(
            F::neg_infinity(),
            |a, &b| if b > a || b.is_nan() { b } else { a },
        );
        // An all -inf row: shift by 0 so that it yields NaN like the composed form, not a crash.
        let m = if m.is_infinite() { F::zero() } else { m };
        let mut sum = F::zero();
        for (o, &v) in d.iter_mut().zip(s) {
            *o = (v - m).exp();
            sum = sum + *o;
        }
        if log {
            let ls = sum.ln();
            for (o, &v) in d.iter_mut().zip(s) {
                *o = v - m - ls;
            }
        } else {
            let inv = F::one() / sum;
            for o in d.iter_mut() {
                *o = *o * inv;
            }
        }
    })
}

pub(crate) fn softmax(x: &Tensor, log: bool) -> Result<HostBuffer> {
    let n = last(x);
    Ok(float_kernel!("softmax", x.dtype(), [x], |v| softmax_rows(
        v, n, log
    )))
}

fn layer_norm_rows<F: Float + ferrite_core::WithDType>(
    x: &[F],
    w: &[F],
    b: &[F],
    n: usize,
    eps: f64,
) -> Vec<F> {
    let eps = F::from(eps).unwrap_or(F::zero());
    let nf = F::from(n).unwrap_or(F::one());
    per_row(x, n, |_, s, d| {
        let mean = s.iter().fold(F::zero(), |a, &v| a + v) / nf;
        let var = s
            .iter()
            .fold(F::zero(), |a, &v| a + (v - mean) * (v - mean))
            / nf;
        let r = F::one() / (var + eps).sqrt();
        for i in 0..n {
            d[i] = (s[i] - mean) * r * w[i] + b[i];
        }
    })
}

pub(crate) fn layer_norm(x: &Tensor, w: &Tensor, b: &Tensor, eps: f64) -> Result<HostBuffer> {
    let n = last(x);
    Ok(float_kernel!(
        "layer_norm",
        x.dtype(),
        [x, w, b],
        |xv, wv, bv| layer_norm_rows(xv, wv, bv, n, eps)
    ))
}

fn rms_norm_rows<F: Float + ferrite_core::WithDType>(
    x: &[F],
    w: &[F],
    n: usize,
    eps: f64,
) -> Vec<F> {
    let eps = F::from(eps).unwrap_or(F::zero());
    let nf = F::from(n).unwrap_or(F::one());
    per_row(x, n, |_, s, d| {
        let ms = s.iter().fold(F::zero(), |a, &v| a + v * v) / nf;
        let r = F::one() / (ms + eps).sqrt();
        for i in 0..n {
            d[i] = s[i] * r * w[i];
        }
    })
}

pub(crate) fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> Result<HostBuffer> {
    let n = last(x);
    Ok(float_kernel!("rms_norm", x.dtype(), [x, w], |xv, wv| {
        rms_norm_rows(xv, wv, n, eps)
    }))
}

/// `x [..., l, d]`, `cos`/`sin` `[l, d/2]`: each pair (a, b) becomes
/// (a cos - b sin, a sin + b cos); pairs are (2i, 2i+1) interleaved or (i, i + d/2).
fn rope_rows<F: Float + ferrite_core::WithDType>(
    x: &[F],
    cos: &[F],
    sin: &[F],
    l: usize,
    d: usize,
    interleaved: bool,
) -> Vec<F> {
    let h = d / 2;
    per_row(x, d, |r, s, o| {
        let p = r % l.max(1);
        let (c, sn) = (&cos[p * h..(p + 1) * h], &sin[p * h..(p + 1) * h]);
        for i in 0..h {
            let (ia, ib) = if interleaved {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + h)
            };
            let (a, b) = (s[ia], s[ib]);
            o[ia] = a * c[i] - b * sn[i];
            o[ib] = a * sn[i] + b * c[i];
        }
    })
}

pub(crate) fn rope(
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    interleaved: bool,
) -> Result<HostBuffer> {
    let r = x.rank();
    let (l, d) = (x.dims()[r - 2], x.dims()[r - 1]);
    Ok(float_kernel!(
        "rope",
        x.dtype(),
        [x, cos, sin],
        |xv, c, s| rope_rows(xv, c, s, l, d, interleaved)
    ))
}

fn softmax_backward_rows<F: Float + ferrite_core::WithDType>(
    y: &[F],
    g: &[F],
    n: usize,
    log: bool,
) -> Vec<F> {
    let mut out = crate::alloc::full(y.len(), F::zero());
    if n == 0 {
        return out;
    }
    let row = |((d, y), g): ((&mut [F], &[F]), &[F])| {
        if log {
            let s = g.iter().fold(F::zero(), |a, &v| a + v);
            for i in 0..n {
                d[i] = g[i] - y[i].exp() * s;
            }
        } else {
            let s = g.iter().zip(y).fold(F::zero(), |a, (&gv, &yv)| a + gv * yv);
            for i in 0..n {
                d[i] = y[i] * (g[i] - s);
            }
        }
    };
    if y.len() >= crate::elementwise::PAR_MIN {
        out.par_chunks_mut(n)
            .zip(y.par_chunks(n))
            .zip(g.par_chunks(n))
            .for_each(row);
    } else {
        out.chunks_mut(n)
            .zip(y.chunks(n))
            .zip(g.chunks(n))
            .for_each(row);
    }
    out
}

pub(crate) fn softmax_backward(y: &Tensor, g: &Tensor, log: bool) -> Result<HostBuffer> {
    let n = last(y);
    Ok(float_kernel!(
        "softmax_backward",
        y.dtype(),
        [y, g],
        |yv, gv| softmax_backward_rows(yv, gv, n, log)
    ))
}

/// Sums per-row weight gradients over all rows: rows split across threads, each thread
/// accumulating its own `k` vectors of length `n`, then added.
fn norm_backward_rows<F: Float + ferrite_core::WithDType>(
    x: &[F],
    g: &[F],
    n: usize,
    k: usize,
    row: impl Fn(&[F], &[F], &mut [F], &mut [Vec<F>]) + Sync + Send,
) -> (Vec<F>, Vec<Vec<F>>) {
    let mut dx = crate::alloc::full(x.len(), F::zero());
    let zero = || vec![vec![F::zero(); n]; k];
    if n == 0 {
        return (dx, zero());
    }
    let rows_per_task = (crate::elementwise::PAR_CHUNK / n).max(1);
    let partials: Vec<Vec<Vec<F>>> = dx
        .par_chunks_mut(n * rows_per_task)
        .zip(x.par_chunks(n * rows_per_task))
        .zip(g.par_chunks(n * rows_per_task))
        .map(|((d, xs), gs)| {
            let mut acc = zero();
            for ((dr, xr), gr) in d.chunks_mut(n).zip(xs.chunks(n)).zip(gs.chunks(n)) {
                row(xr, gr, dr, &mut acc);
            }
            acc
        })
        .collect();
    let mut total = zero();
    for p in partials {
        for (t, q) in total.iter_mut().zip(p) {
            for (a, b) in t.iter_mut().zip(q) {
                *a = *a + b;
            }
        }
    }
    (dx, total)
}

/// xhat = x / rms; dx = (g w - xhat mean(g w xhat)) / rms; dw = sum over rows of g xhat.
fn rms_norm_backward_rows<F: Float + ferrite_core::WithDType>(
    x: &[F],
    w: &[F],
    g: &[F],
    n: usize,
    eps: f64,
) -> (Vec<F>, Vec<F>) {
    let eps = F::from(eps).unwrap_or(F::zero());
    let nf = F::from(n).unwrap_or(F::one());
    let (dx, mut acc) = norm_backward_rows(x, g, n, 1, |xr, gr, dr, acc| {
        let r = F::one() / (xr.iter().fold(F::zero(), |a, &v| a + v * v) / nf + eps).sqrt();
        let dot = (0..n).fold(F::zero(), |a, i| a + gr[i] * w[i] * xr[i] * r) / nf;
        for i in 0..n {
            let xhat = xr[i] * r;
            dr[i] = (gr[i] * w[i] - xhat * dot) * r;
            acc[0][i] = acc[0][i] + gr[i] * xhat;
        }
    });
    (dx, acc.pop().unwrap_or_default())
}

/// xhat = (x - mean) rstd; dx = rstd (g w - mean(g w) - xhat mean(g w xhat));
/// dw = sum of g xhat, db = sum of g over rows.
fn layer_norm_backward_rows<F: Float + ferrite_core::WithDType>(
    x: &[F],
    w: &[F],
    g: &[F],
    n: usize,
    eps: f64,
) -> (Vec<F>, Vec<F>, Vec<F>) {
    let eps = F::from(eps).unwrap_or(F::zero());
    let nf = F::from(n).unwrap_or(F::one());
    let (dx, mut acc) = norm_backward_rows(x, g, n, 2, |xr, gr, dr, acc| {
        let mean = xr.iter().fold(F::zero(), |a, &v| a + v) / nf;
        let var = xr
            .iter()
            .fold(F::zero(), |a, &v| a + (v - mean) * (v - mean))
            / nf;
        let r = F::one() / (var + eps).sqrt();
        let (mut m1, mut m2) = (F::zero(), F::zero());
        for i in 0..n {
            let gw = gr[i] * w[i];
            m1 = m1 + gw;
            m2 = m2 + gw * (xr[i] - mean) * r;
        }
        let (m1, m2) = (m1 / nf, m2 / nf);
        for i in 0..n {
            let xhat = (xr[i] - mean) * r;
            dr[i] = (gr[i] * w[i] - m1 - xhat * m2) * r;
            acc[0][i] = acc[0][i] + gr[i] * xhat;
            acc[1][i] = acc[1][i] + gr[i];
        }
    });
    let db = acc.pop().unwrap_or_default();
    let dw = acc.pop().unwrap_or_default();
    (dx, dw, db)
}

pub(crate) fn rms_norm_backward(
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    eps: f64,
) -> Result<Vec<HostBuffer>> {
    let n = last(x);
    Ok(float_kernel_many!(
        "rms_norm_backward",
        x.dtype(),
        [x, w, g],
        |xv, wv, gv| {
            let (dx, dw) = rms_norm_backward_rows(xv, wv, gv, n, eps);
            vec![dx, dw]
        }
    ))
}

pub(crate) fn layer_norm_backward(
    x: &Tensor,
    w: &Tensor,
    g: &Tensor,
    eps: f64,
) -> Result<Vec<HostBuffer>> {
    let n = last(x);
    Ok(float_kernel_many!(
        "layer_norm_backward",
        x.dtype(),
        [x, w, g],
        |xv, wv, gv| {
            let (dx, dw, db) = layer_norm_backward_rows(xv, wv, gv, n, eps);
            vec![dx, dw, db]
        }
    ))
}
