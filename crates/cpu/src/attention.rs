//! Scaled dot-product attention with an optional causal mask, an optional key-padding mask
//! (bool [b, lk], true = padding) and grouped-query heads. One task per (batch, head, query
//! row): scores, softmax, weighted sum of values. A query with no visible unmasked key gets a
//! NaN row forward and contributes nothing backward (`Op::Attention`).

use crate::storage::{contig, float_kernel, float_kernel_many};
use ferrite_core::{Error, HostBuffer, Layout, Result, Tensor};
use num_traits::Float;
use rayon::prelude::*;
use std::borrow::Cow;

/// The output, stored [b, lq, hq, dv] (`Op::Attention`), and, with `with_lse`, each query's
/// lse [b, hq, lq] (natural log of the sum of exp(score) over its keys; +inf where it sees
/// none).
#[allow(clippy::too_many_arguments)]
fn attend<F: Float + ferrite_core::WithDType>(
    q: &[F],
    k: &[F],
    v: &[F],
    (b, hq, lq, d): (usize, usize, usize, usize),
    (hkv, lk, dv): (usize, usize, usize),
    causal: bool,
    mask: Option<&[bool]>,
    scale: f64,
    with_lse: bool,
) -> (Vec<F>, Vec<f32>) {
    let scale = F::from(scale).unwrap_or(F::one());
    let group = hq / hkv.max(1);
    let rows = b * hq * lq;
    let mut out = crate::alloc::full(rows * dv, F::zero());
    let mut lse = vec![0f32; if with_lse { rows } else { 0 }];
    // Output row `row` (storage order: (b, i, h)) into `o` (dv values); returns its lse.
    let attend_row = |row: usize, o: &mut [F]| -> f32 {
        let h = row % hq;
        let i = (row / hq) % lq;
        let bi = row / (lq * hq);
        let kvh = h / group;
        let qi = (bi * hq + h) * lq + i;
        let qrow = &q[qi * d..(qi + 1) * d];
        let kbase = (bi * hkv + kvh) * lk;
        // Keys visible to query i: all, or j <= i + lk - lq when causal.
        let visible = if causal {
            (i + lk).saturating_sub(lq).saturating_add(1).min(lk)
        } else {
            lk
        };
        let keys = unmasked(mask, bi, lk, visible);
        if keys.is_empty() {
            // No visible key: the softmax of an empty row; NaN like the composed form.
            o.iter_mut().for_each(|x| *x = F::nan());
            return f32::INFINITY;
        }
        let mut s: Vec<F> = keys
            .iter()
            .map(|&j| {
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
        for (&j, &p) in keys.iter().zip(&s) {
            let vrow = &v[(kbase + j) * dv..(kbase + j + 1) * dv];
            for (acc, &x) in o.iter_mut().zip(vrow) {
                *acc = *acc + p * x;
            }
        }
        let inv = F::one() / sum;
        o.iter_mut().for_each(|x| *x = *x * inv);
        (m + sum.ln()).to_f32().unwrap_or(f32::NAN)
    };
    match (with_lse, dv) {
        (false, 0) => {}
        (false, _) => out.par_chunks_mut(dv).enumerate().for_each(|(row, o)| {
            attend_row(row, o);
        }),
        (true, 0) => lse
            .par_iter_mut()
            .enumerate()
            .for_each(|(row, l)| *l = attend_row(row, &mut [])),
        (true, _) => out
            .par_chunks_mut(dv)
            .zip(lse.par_iter_mut())
            .enumerate()
            .for_each(|(row, (o, l))| *l = attend_row(row, o)),
    }
    // lse from (b, i, h) order to [b, hq, lq].
    let lse = (0..lse.len())
        .map(|r| {
            let (bi, h, i) = (r / (hq * lq), (r / lq) % hq, r % lq);
            lse[(bi * lq + i) * hq + h]
        })
        .collect();
    (out, lse)
}

/// The keys among the first `visible` that batch row `bi`'s mask leaves unmasked, in order.
fn unmasked(mask: Option<&[bool]>, bi: usize, lk: usize, visible: usize) -> Vec<usize> {
    match mask {
        Some(m) => (0..visible).filter(|&j| !m[bi * lk + j]).collect(),
        None => (0..visible).collect(),
    }
}

/// The key-padding mask's elements, row-major [b, lk] for q [b, ..] and k [b, hkv, lk, d].
fn mask_of<'a>(
    mask: Option<&'a Tensor>,
    (q, k): (&Tensor, &Tensor),
    op: &'static str,
) -> Result<Option<Cow<'a, [bool]>>> {
    let Some(m) = mask else { return Ok(None) };
    if m.dims() != [q.dims()[0], k.dims()[2]] {
        return Err(Error::shape(
            op,
            format!(
                "key mask {} does not match q {} and k {}",
                m.shape(),
                q.shape(),
                k.shape()
            ),
        ));
    }
    contig::<bool>(m, op).map(Some)
}

/// `Op::Attention`: the output and, with `with_lse`, the f32 lse per query row.
pub(crate) fn attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    causal: bool,
    scale: f64,
    with_lse: bool,
) -> Result<Vec<HostBuffer>> {
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    let qs = (qd[0], qd[1], qd[2], qd[3]);
    let ks = (kd[1], kd[2], vd[3]);
    let mask = mask_of(mask, (q, k), "attention")?;
    let mask = mask.as_deref();
    let lse: Vec<f32>;
    let out = float_kernel!("attention", q.dtype(), [q, k, v], |qv, kv, vv| {
        let (o, l) = attend(qv, kv, vv, qs, ks, causal, mask, scale, with_lse);
        lse = l;
        o
    });
    let mut outs = vec![out];
    if with_lse {
        outs.push(HostBuffer::F32(lse));
    }
    Ok(outs)
}

/// Backward of `attend`: one task per (batch, kv head), covering the query heads that share it,
/// so each task owns its rows of dq, dk and dv. Probabilities are recomputed per query row.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn attend_backward<F: Float + ferrite_core::WithDType>(
    q: &[F],
    k: &[F],
    v: &[F],
    g: &[F],
    (b, hq, lq, d): (usize, usize, usize, usize),
    (hkv, lk, dv): (usize, usize, usize),
    causal: bool,
    mask: Option<&[bool]>,
    scale: f64,
) -> (Vec<F>, Vec<F>, Vec<F>) {
    let scale = F::from(scale).unwrap_or(F::one());
    let group = hq / hkv.max(1);
    let mut dq = crate::alloc::full(b * hq * lq * d, F::zero());
    let mut dk = crate::alloc::full(b * hkv * lk * d, F::zero());
    let mut dvv = crate::alloc::full(b * hkv * lk * dv, F::zero());
    if b * hkv == 0 || group * lq * d == 0 || lk * d == 0 || lk * dv == 0 {
        return (dq, dk, dvv);
    }
    dq.par_chunks_mut(group * lq * d)
        .zip(dk.par_chunks_mut(lk * d))
        .zip(dvv.par_chunks_mut(lk * dv))
        .enumerate()
        .for_each(|(task, ((dq_t, dk_t), dv_t))| {
            let (bi, kvh) = (task / hkv, task % hkv);
            let kbase = (bi * hkv + kvh) * lk;
            let (kk, vv) = (
                &k[kbase * d..(kbase + lk) * d],
                &v[kbase * dv..(kbase + lk) * dv],
            );
            let mut p = vec![F::zero(); lk];
            let mut dp = vec![F::zero(); lk];
            let all = unmasked(mask, bi, lk, lk);
            for hg in 0..group {
                let h = kvh * group + hg;
                for i in 0..lq {
                    let row = (bi * hq + h) * lq + i;
                    let (qi, gi) = (&q[row * d..(row + 1) * d], &g[row * dv..(row + 1) * dv]);
                    let visible = if causal {
                        (i + lk).saturating_sub(lq).saturating_add(1).min(lk)
                    } else {
                        lk
                    };
                    // The unmasked keys are ascending: those this query sees are a prefix.
                    let keys = &all[..all.partition_point(|&j| j < visible)];
                    if keys.is_empty() {
                        continue;
                    }
                    let dot =
                        |a: &[F], b: &[F]| a.iter().zip(b).fold(F::zero(), |s, (&x, &y)| s + x * y);
                    let mut m = F::neg_infinity();
                    for &j in keys {
                        p[j] = dot(qi, &kk[j * d..(j + 1) * d]) * scale;
                        m = if p[j] > m { p[j] } else { m };
                    }
                    let mut sum = F::zero();
                    for &j in keys {
                        p[j] = (p[j] - m).exp();
                        sum = sum + p[j];
                    }
                    let mut pdp = F::zero();
                    for &j in keys {
                        p[j] = p[j] / sum;
                        dp[j] = dot(gi, &vv[j * dv..(j + 1) * dv]);
                        pdp = pdp + p[j] * dp[j];
                        for (o, &x) in dv_t[j * dv..(j + 1) * dv].iter_mut().zip(gi) {
                            *o = *o + p[j] * x;
                        }
                    }
                    let dqi = &mut dq_t[(hg * lq + i) * d..(hg * lq + i + 1) * d];
                    for &j in keys {
                        let ds = p[j] * (dp[j] - pdp) * scale;
                        let kj = &kk[j * d..(j + 1) * d];
                        for t in 0..d {
                            dqi[t] = dqi[t] + ds * kj[t];
                        }
                        for (o, &x) in dk_t[j * d..(j + 1) * d].iter_mut().zip(qi) {
                            *o = *o + ds * x;
                        }
                    }
                }
            }
        });
    (dq, dk, dvv)
}

pub(crate) fn attention_backward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: Option<&Tensor>,
    g: &Tensor,
    causal: bool,
    scale: f64,
) -> Result<Vec<HostBuffer>> {
    let (qd, kd, vd) = (q.dims(), k.dims(), v.dims());
    let qs = (qd[0], qd[1], qd[2], qd[3]);
    let ks = (kd[1], kd[2], vd[3]);
    let mask = mask_of(mask, (q, k), "attention_backward")?;
    let mask = mask.as_deref();
    let grads = float_kernel_many!(
        "attention_backward",
        q.dtype(),
        [q, k, v, g],
        |qv, kv, vv, gv| {
            let (dq, dk, dv) = attend_backward(qv, kv, vv, gv, qs, ks, causal, mask, scale);
            vec![dq, dk, dv]
        }
    );
    // Computed [b, h, l, d]; the op stores them [b, l, h, d].
    grads
        .into_iter()
        .zip([q, k, v])
        .map(|(buf, t)| {
            let heads_first = Layout::contiguous(t.shape().clone());
            let l = heads_first.permute(&[0, 2, 1, 3])?;
            Ok(crate::elementwise::materialize(&buf, &l))
        })
        .collect()
}
