//! 2-d max pooling (fixed or adaptive windows) with indices; planes (n, c) run in parallel. f16/bf16 go through f32
//! (exact for a maximum).

use crate::storage::{floats, from_f32, Floats};
use ferrite_core::{HostBuffer, Pool2dParams, Result, Shape, Tensor};
use num_traits::Float;
use rayon::prelude::*;

/// Window taps along one axis for output `o`: input indices inside [0, len).
fn taps(p: &Pool2dParams, a: usize, o: usize, len: usize) -> impl Iterator<Item = usize> {
    let (k, s, pad, d) = (p.kernel[a], p.stride[a], p.padding[a], p.dilation[a]);
    (0..k).filter_map(move |t| (o * s + t * d).checked_sub(pad).filter(|&i| i < len))
}

/// Window taps of output `o` of `n` over `len` inputs (PyTorch's adaptive windows).
fn adaptive(o: usize, n: usize, len: usize) -> std::ops::Range<usize> {
    (o * len / n)..((o + 1) * len).div_ceil(n)
}

/// Max pooling where `rows(oi)` and `cols(oj)` list each window's input rows and columns.
fn max_windows<F: Float + ferrite_core::WithDType + Send + Sync, R, C>(
    x: &[F],
    planes: usize,
    (h, w): (usize, usize),
    (oh, ow): (usize, usize),
    rows: impl Fn(usize) -> R + Sync,
    cols: impl Fn(usize) -> C + Sync,
) -> (Vec<F>, Vec<u32>)
where
    R: Iterator<Item = usize>,
    C: Iterator<Item = usize>,
{
    let mut vals = crate::alloc::full(planes * oh * ow, F::zero());
    let mut idx = crate::alloc::full(planes * oh * ow, 0u32);
    if oh * ow == 0 {
        return (vals, idx);
    }
    vals.par_chunks_mut(oh * ow)
        .zip(idx.par_chunks_mut(oh * ow))
        .enumerate()
        .for_each(|(pl, (v, ix))| {
            let src = &x[pl * h * w..(pl + 1) * h * w];
            for oi in 0..oh {
                for oj in 0..ow {
                    let mut best = F::neg_infinity();
                    let mut at: Option<usize> = None;
                    for ih in rows(oi) {
                        for iw in cols(oj) {
                            let val = src[ih * w + iw];
                            let better = match at {
                                None => true,
                                Some(_) => val > best || (val.is_nan() && !best.is_nan()),
                            };
                            if better {
                                best = val;
                                at = Some(ih * w + iw);
                            }
                        }
                    }
                    v[oi * ow + oj] = best;
                    ix[oi * ow + oj] = at.unwrap_or(0) as u32;
                }
            }
        });
    (vals, idx)
}

fn max_pool_typed<F: Float + ferrite_core::WithDType + Send + Sync>(
    x: &[F],
    planes: usize,
    hw: (usize, usize),
    ohw: (usize, usize),
    p: &Pool2dParams,
) -> (Vec<F>, Vec<u32>) {
    let (h, w) = hw;
    max_windows(
        x,
        planes,
        hw,
        ohw,
        |oi| taps(p, 0, oi, h),
        |oj| taps(p, 1, oj, w),
    )
}

fn pool_any<F: Float + ferrite_core::WithDType + Send + Sync>(
    x: &[F],
    planes: usize,
    hw: (usize, usize),
    ohw: (usize, usize),
    p: Option<&Pool2dParams>,
) -> (Vec<F>, Vec<u32>) {
    match p {
        Some(p) => max_pool_typed(x, planes, hw, ohw, p),
        None => {
            let ((h, w), (oh, ow)) = (hw, ohw);
            max_windows(
                x,
                planes,
                hw,
                ohw,
                |oi| adaptive(oi, oh, h),
                |oj| adaptive(oj, ow, w),
            )
        }
    }
}

/// `p` = None: adaptive windows.
pub(crate) fn max_pool2d(
    x: &Tensor,
    p: Option<&Pool2dParams>,
    out: &Shape,
) -> Result<Vec<HostBuffer>> {
    let op = if p.is_some() {
        "max_pool2d"
    } else {
        "adaptive_max_pool2d"
    };
    let d = x.dims();
    let planes = d[0] * d[1];
    let (hw, ohw) = ((d[2], d[3]), (out.dims()[2], out.dims()[3]));
    if d[2] * d[3] > u32::MAX as usize {
        return Err(ferrite_core::Error::shape(
            op,
            format!("planes of {} do not fit u32 indices", x.shape()),
        ));
    }
    let (v, i) = match floats(x, op)? {
        Floats::F32(xs) => {
            let (v, i) = pool_any(&xs, planes, hw, ohw, p);
            (from_f32(v, x.dtype()), i)
        }
        Floats::F64(xs) => {
            let (v, i) = pool_any(&xs, planes, hw, ohw, p);
            (HostBuffer::F64(v), i)
        }
    };
    debug_assert_eq!(v.dtype(), x.dtype());
    Ok(vec![v, HostBuffer::U32(i)])
}
