//! Fused cross-entropy over class indices (`Op::CrossEntropy` and its backward): one pass over
//! each row of logits for (loss, logsumexp, the target's class weight), one for the gradient;
//! probabilities are never stored. Rows run in parallel; f16/bf16 compute in f32, and their
//! outputs stay f32.

use crate::storage::{float_kernel, indices};
use ferrite_core::{Error, HostBuffer, Result, Tensor};
use num_traits::Float;
use rayon::prelude::*;

/// The targets as indices, each in [0, c) or equal to `ignore_index` (then `None`).
fn targets(
    target: &Tensor,
    c: usize,
    ignore_index: i64,
    op: &'static str,
) -> Result<Vec<Option<usize>>> {
    indices(target, op)?
        .into_iter()
        .map(|t| {
            if t == ignore_index {
                Ok(None)
            } else if t < 0 || t as usize >= c {
                Err(Error::Index {
                    op,
                    index: t,
                    axis: 1,
                    size: c,
                })
            } else {
                Ok(Some(t as usize))
            }
        })
        .collect()
}

/// logsumexp of a row, shifted by its max (by 0 when the max is infinite).
fn lse<F: Float>(row: &[F]) -> F {
    let m = row.iter().fold(
        F::neg_infinity(),
        |a, &b| if b > a || b.is_nan() { b } else { a },
    );
    let m = if m.is_infinite() { F::zero() } else { m };
    row.iter().fold(F::zero(), |a, &v| a + (v - m).exp()).ln() + m
}

fn forward_rows<F: Float + Send + Sync + ferrite_core::WithDType>(
    x: &[F],
    w: &[F],
    t: &[Option<usize>],
    c: usize,
    eps: f64,
) -> Vec<F> {
    let eps_f = F::from(eps).unwrap_or(F::zero());
    let cf = F::from(c).unwrap_or(F::one());
    let mut out = vec![F::zero(); t.len() * 3];
    if c == 0 {
        return out;
    }
    out.par_chunks_mut(3)
        .zip(x.par_chunks(c))
        .zip(t.par_iter())
        .for_each(|((o, row), &ti)| {
            let l = lse(row);
            o[1] = l;
            o[2] = ti.map_or(F::zero(), |ti| w[ti]);
            o[0] = match ti {
                None => F::zero(),
                Some(ti) => {
                    let nll = (F::one() - eps_f) * w[ti] * (l - row[ti]);
                    if eps > 0.0 {
                        let s = row
                            .iter()
                            .zip(w)
                            .fold(F::zero(), |a, (&v, &wj)| a + wj * (l - v));
                        nll + eps_f / cf * s
                    } else {
                        nll
                    }
                }
            };
        });
    out
}

pub(crate) fn cross_entropy(
    logits: &Tensor,
    target: &Tensor,
    weight: &Tensor,
    ignore_index: i64,
    eps: f64,
) -> Result<HostBuffer> {
    let op = "cross_entropy";
    let c = logits.dims().get(1).copied().unwrap_or(0);
    let t = targets(target, c, ignore_index, op)?;
    Ok(float_kernel!(
        op,
        logits.dtype().accumulator(),
        [logits, weight],
        |x, w| forward_rows(x, w, &t, c, eps)
    ))
}

#[allow(clippy::too_many_arguments)]
fn backward_rows<F: Float + Send + Sync + ferrite_core::WithDType>(
    x: &[F],
    w: &[F],
    out: &[F],
    g: &[F],
    t: &[Option<usize>],
    c: usize,
    eps: f64,
) -> Vec<F> {
    let eps_f = F::from(eps).unwrap_or(F::zero());
    let cf = F::from(c).unwrap_or(F::one());
    let wsum = w.iter().fold(F::zero(), |a, &v| a + v);
    let mut dx = vec![F::zero(); x.len()];
    if c == 0 {
        return dx;
    }
    dx.par_chunks_mut(c)
        .zip(x.par_chunks(c))
        .enumerate()
        .for_each(|(i, (d, row))| {
            let Some(ti) = t[i] else { return };
            let gi = g[3 * i];
            let l = out[3 * i + 1];
            let a = (F::one() - eps_f) * w[ti];
            let coef = a + eps_f / cf * wsum;
            for (j, (dj, &v)) in d.iter_mut().zip(row).enumerate() {
                let mut r = (v - l).exp() * coef;
                if eps > 0.0 {
                    r = r - eps_f / cf * w[j];
                }
                if j == ti {
                    r = r - a;
                }
                *dj = gi * r;
            }
        });
    dx
}

pub(crate) fn cross_entropy_backward(
    inputs: [&Tensor; 5],
    ignore_index: i64,
    eps: f64,
) -> Result<HostBuffer> {
    let op = "cross_entropy_backward";
    let [logits, target, weight, out, g] = inputs;
    let c = logits.dims().get(1).copied().unwrap_or(0);
    let t = targets(target, c, ignore_index, op)?;
    Ok(float_kernel!(
        op,
        logits.dtype(),
        [logits, weight, out, g],
        |x, w, o, gv| backward_rows(x, w, o, gv, &t, c, eps)
    ))
}
