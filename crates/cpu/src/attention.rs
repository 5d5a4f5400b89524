//! Scaled dot-product attention with an optional causal mask and grouped-query heads.
//! One task per (batch, head, query row): scores, softmax, weighted sum of values.

use crate::storage::float_kernel;
use ferrite_core::{HostBuffer, Result, Tensor};
use num_traits::Float;
use rayon::prelude::*;

#[allow(clippy::too_many_arguments)]
fn attend<F: Float + ferrite_core::WithDType>(
    q: &[F],
    k: &[F],
    v: &[F],
    (b, hq, lq, d): (usize, usize, usize, usize),
    (hkv, lk, dv): (usize, usize, usize),
    causal: bool,
    scale: f64,
) -> Vec<F> {
    let scale = F::from(scale).unwrap_or(F::one());
    let group = hq / hkv.max(1);
    let mut out = crate::alloc::full(b * hq * lq * dv, F::zero());
    if dv == 0 {
        return out;
    }
    out.par_chunks_mut(dv).enumerate().for_each(|(row, o)| {
        let i = row % lq;
        let h = (row / lq) % hq;
        let bi = row / (lq * hq);
        let kvh = h / group;
        let qrow = &q[row * d..(row + 1) * d];
        let kbase = (bi * hkv + kvh) * lk;
        // Keys visible to query i: all, or j <= i + lk - lq when causal.
        let visible = if causal {
            (i + lk).saturating_sub(lq).saturating_add(1).min(lk)
        } else {
            lk
        };
        if visible == 0 {
            // No visible key: the softmax of an empty row; NaN like the composed form.
            o.iter_mut().for_each(|x| *x = F::nan());
            return;
        }
        let mut s: Vec<F> = (0..visible)
            .map(|j| {
                let krow = &k[(kbase + j) * d..(kbase + j + 1) * d];
                qrow.iter()
                    .zip(krow)
                    .fold(F::zero(), |a, (&x, &y)| a + x * y)
                    * scale
            })
            .collect();
        let m = s
            .iter()
            .fold(F::neg_infinity(), |a, &x| if x > a { x } else { a });
        let mut sum = F::zero();
        for x in s.iter_mut() {
            *x = (*x - m).exp();
            sum = sum + *x;
        }
        for (j, &p) in s.iter().enumerate() {
            let vrow = &v[(kbase + j) * dv..(kbase + j + 1) * dv];
            for (acc, &x) in o.iter_mut().zip(vrow) {
                *acc = *acc + p * x;
            }
        }
        let inv = F::one() / sum;
        o.iter_mut().for_each(|x| *x = *x * inv);
    });
    out
}

pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    causal: bool,
    scale: f64,
) -> Result<HostBuffer> {
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    let qs = (qd[0], qd[1], qd[2], qd[3]);
    let ks = (kd[1], kd[2], vd[3]);
    Ok(float_kernel!(
        "attention",
        q.dtype(),
        [q, k, v],
        |qv, kv, vv| attend(qv, kv, vv, qs, ks, causal, scale)
    ))
}
