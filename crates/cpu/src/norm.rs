//! Fused row ops over the last axis: softmax, log_softmax, layer_norm, rms_norm, and RoPE.
//! Each row is independent; rows run in parallel. f16/bf16 compute in f32.

use crate::storage::float_kernel;
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
