//! Convolutions as im2col + gemm, per batch item and group (f16/bf16 compute in f32):
//! - conv2d: y[n, g] [o/g, oh ow] = w[g] [o/g, K] · cols(x[n, g]) [K, oh ow], K = c/g kh kw;
//! - conv_transpose2d (conv2d's input gradient): cols = w[g]ᵀ · x[n, g], then col2im adds
//!   every column entry back into the pixel it was read from;
//! - conv2d_backward_weight: dw[g] = Σ_n g[n, g] · cols(x[n, g])ᵀ.
//!
//! A 1x1 kernel with stride 1 and no padding reads x as its own columns. Batch items run in
//! parallel with single-threaded gemm calls when there are at least as many as threads; else
//! each gemm call uses every thread. For small planes (< 256 output pixels) the forward pass
//! and both gradients run one threaded GEMM over the whole batch, columns of all items side
//! by side.

use crate::storage::float_kernel;
use ferrite_core::{Conv2dParams, Error, HostBuffer, Result, Shape, Tensor};
use gemm::Parallelism;
use num_traits::Float;
use rayon::prelude::*;

type Geo = ferrite_core::ConvGeometry;

/// Whether to run one product per batch item (enough items for every thread) rather than one
/// over the whole batch.
fn per_item(g: &Geo) -> bool {
    g.n >= rayon::current_num_threads()
}

/// The output indices `lo..hi` along axis `a` whose kernel tap `t` reads inside the input
/// (`len` long), and the input index the first of them reads: output `o` reads
/// `first + (o - lo) * stride`. Outside `lo..hi` the tap reads padding.
fn span(g: &Geo, a: usize, t: usize, len: usize, out: usize) -> (usize, usize, usize) {
    let (s, off) = (
        g.p.stride[a] as i64,
        (t * g.p.dilation[a]) as i64 - g.p.padding[a] as i64,
    );
    let lo = if off < 0 { (-off + s - 1) / s } else { 0 };
    let last = len as i64 - 1 - off;
    let hi = if last < 0 {
        0
    } else {
        (last / s + 1).min(out as i64)
    };
    let lo = lo.min(hi);
    let first = (lo * s + off).clamp(0, len as i64);
    (lo as usize, hi as usize, first as usize)
}

/// cols [K, oh ow] of the planes x[n, g] (`xg`: c/g planes of h w); row r of cols starts
/// at `r * ld` (ld ≥ oh ow: several items' columns side by side).
fn im2col<F: Float>(g: &Geo, xg: &[F], cols: &mut [F], ld: usize) {
    let (hw, taps) = (g.h * g.w, g.kh * g.kw);
    for c in 0..g.cg() {
        im2col_plane(g, &xg[c * hw..(c + 1) * hw], &mut cols[c * taps * ld..], ld);
    }
}

/// The kh kw rows of cols that one input plane (h w) contributes; row t at `t * ld`.
fn im2col_plane<F: Float>(g: &Geo, plane: &[F], rows: &mut [F], ld: usize) {
    let (pix, sw) = (g.pix(), g.p.stride[1]);
    for ki in 0..g.kh {
        let (ilo, ihi, ih0) = span(g, 0, ki, g.h, g.oh);
        for kj in 0..g.kw {
            let (jlo, jhi, iw0) = span(g, 1, kj, g.w, g.ow);
            let r = ki * g.kw + kj;
            let row = &mut rows[r * ld..r * ld + pix];
            row[..ilo * g.ow].fill(F::zero());
            row[ihi * g.ow..].fill(F::zero());
            for oi in ilo..ihi {
                let ih = ih0 + (oi - ilo) * g.p.stride[0];
                let line = &plane[ih * g.w..(ih + 1) * g.w];
                let dst = &mut row[oi * g.ow..(oi + 1) * g.ow];
                dst[..jlo].fill(F::zero());
                dst[jhi..].fill(F::zero());
                let dst = &mut dst[jlo..jhi];
                if sw == 1 {
                    dst.copy_from_slice(&line[iw0..iw0 + dst.len()]);
                } else {
                    for (d, &v) in dst.iter_mut().zip(line[iw0..].iter().step_by(sw)) {
                        *d = v;
                    }
                }
            }
        }
    }
}

/// Adds cols [K, oh ow] (row r at `r * ld`) into the planes dx[n, g] (the adjoint of
/// `im2col`).
fn col2im<F: Float>(g: &Geo, cols: &[F], dxg: &mut [F], ld: usize) {
    let (pix, hw, sw) = (g.pix(), g.h * g.w, g.p.stride[1]);
    for c in 0..g.cg() {
        let plane = &mut dxg[c * hw..(c + 1) * hw];
        for ki in 0..g.kh {
            let (ilo, ihi, ih0) = span(g, 0, ki, g.h, g.oh);
            for kj in 0..g.kw {
                let (jlo, jhi, iw0) = span(g, 1, kj, g.w, g.ow);
                let r = (c * g.kh + ki) * g.kw + kj;
                let row = &cols[r * ld..r * ld + pix];
                for oi in ilo..ihi {
                    let ih = ih0 + (oi - ilo) * g.p.stride[0];
                    let line = &mut plane[ih * g.w..(ih + 1) * g.w];
                    let src = &row[oi * g.ow + jlo..oi * g.ow + jhi];
                    if sw == 1 {
                        for (d, &v) in line[iw0..iw0 + src.len()].iter_mut().zip(src) {
                            *d = *d + v;
                        }
                    } else {
                        for (d, &v) in line[iw0..].iter_mut().step_by(sw).zip(src) {
                            *d = *d + v;
                        }
                    }
                }
            }
        }
    }
}

/// A matrix operand: data with its row and column strides (elements).
struct Mat<'a, F> {
    d: &'a [F],
    rs: usize,
    cs: usize,
}

/// dst [m, n] (row-major, contiguous) = a [m, k] · b [k, n], or += when `acc`.
fn mm<F: Float + 'static>(
    (m, n, k): (usize, usize, usize),
    dst: &mut [F],
    acc: bool,
    a: Mat<F>,
    b: Mat<F>,
    par: Parallelism,
) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !acc {
            dst[..m * n].fill(F::zero());
        }
        return;
    }
    let last = |r: usize, c: usize, mat: &Mat<F>| (r - 1) * mat.rs + (c - 1) * mat.cs;
    assert!(dst.len() >= m * n && a.d.len() > last(m, k, &a) && b.d.len() > last(k, n, &b));
    // SAFETY: the assert above bounds the largest offset each operand is read at (strides
    // are non-negative), and `dst` is an exclusive m x n row-major buffer.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            acc,
            a.d.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.d.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            F::one(),
            F::one(),
            false,
            false,
            false,
            par,
        );
    }
}

/// Below this many output pixels per plane, each pass runs one GEMM over the whole batch
/// (columns of every item side by side) instead of one per item: per-item GEMMs of such
/// planes re-pack a large weight (forward, input gradient) or re-read a large accumulator
/// (weight gradient) for only oh ow columns or reduction steps.
const WHOLE_BATCH_PIX: usize = 256;

/// `t` [n, o, pix] as [o, n pix] (item ni at columns ni pix..).
fn channels_first<F: Float + ferrite_core::WithDType + Send + Sync>(
    t: &[F],
    n: usize,
    o: usize,
    pix: usize,
) -> Vec<F> {
    let mut out = crate::alloc::full(o * n * pix, F::zero());
    if pix == 0 {
        return out;
    }
    out.par_chunks_mut(n * pix)
        .enumerate()
        .for_each(|(oc, row)| {
            for (ni, dst) in row.chunks_mut(pix).enumerate() {
                dst.copy_from_slice(&t[(ni * o + oc) * pix..(ni * o + oc + 1) * pix]);
            }
        });
    out
}

/// Column matrices of group `gi` of every item side by side: [K, n pix].
fn im2col_batch<F: Float + ferrite_core::WithDType>(g: &Geo, x: &[F], gi: usize) -> Vec<F> {
    let (pix, k, cg, hw) = (g.pix(), g.k(), g.cg(), g.h * g.w);
    let ld = g.n * pix;
    let mut cols = crate::alloc::full(k * ld, F::zero());
    if cols.is_empty() {
        return cols;
    }
    // Channel c of the group owns rows c kh kw.. of cols: one task per channel.
    cols.par_chunks_mut(g.kh * g.kw * ld)
        .enumerate()
        .for_each(|(c, rows)| {
            for ni in 0..g.n {
                let p = (ni * g.c + gi * cg + c) * hw;
                im2col_plane(g, &x[p..p + hw], &mut rows[ni * pix..], ld);
            }
        });
    cols
}

fn conv2d_typed<F: Float + ferrite_core::WithDType + Send + Sync + 'static>(
    g: &Geo,
    x: &[F],
    w: &[F],
) -> Vec<F> {
    let (pix, k, og, cg, hw) = (g.pix(), g.k(), g.og(), g.cg(), g.h * g.w);
    let mut y = crate::alloc::full(g.n * g.o * pix, F::zero());
    let item = |ni: usize, yn: &mut [F], cols: &mut Vec<F>, par: Parallelism| {
        for gi in 0..g.p.groups {
            let xg = &x[(ni * g.c + gi * cg) * hw..(ni * g.c + (gi + 1) * cg) * hw];
            let cols: &[F] = if g.direct() {
                xg
            } else {
                cols.resize(k * pix, F::zero());
                im2col(g, xg, cols, pix);
                cols
            };
            let a = Mat {
                d: &w[gi * og * k..],
                rs: k,
                cs: 1,
            };
            let b = Mat {
                d: cols,
                rs: pix,
                cs: 1,
            };
            mm(
                (og, pix, k),
                &mut yn[gi * og * pix..(gi + 1) * og * pix],
                false,
                a,
                b,
                par,
            );
        }
    };
    let plane = g.o * pix;
    if plane == 0 {
        return y;
    }
    if pix < WHOLE_BATCH_PIX {
        // One GEMM per group over the batch, [o/g, n pix], then back to [n, o, pix].
        let ld = g.n * pix;
        let mut yb = crate::alloc::full(g.o * ld, F::zero());
        for gi in 0..g.p.groups {
            let cols = im2col_batch(g, x, gi);
            let a = Mat {
                d: &w[gi * og * k..],
                rs: k,
                cs: 1,
            };
            let b = Mat {
                d: &cols,
                rs: ld,
                cs: 1,
            };
            let dst = &mut yb[gi * og * ld..(gi + 1) * og * ld];
            mm((og, ld, k), dst, false, a, b, Parallelism::Rayon(0));
        }
        y.par_chunks_mut(plane).enumerate().for_each(|(ni, yn)| {
            for (oc, dst) in yn.chunks_mut(pix).enumerate() {
                dst.copy_from_slice(&yb[oc * ld + ni * pix..oc * ld + (ni + 1) * pix]);
            }
        });
        return y;
    }
    if per_item(g) {
        y.par_chunks_mut(plane)
            .enumerate()
            .for_each_init(Vec::new, |cols, (ni, yn)| {
                item(ni, yn, cols, Parallelism::None)
            });
    } else {
        let mut cols = Vec::new();
        for (ni, yn) in y.chunks_mut(plane).enumerate() {
            item(ni, yn, &mut cols, Parallelism::Rayon(0));
        }
    }
    y
}

/// `gy` [n, o, oh, ow] -> dx [n, c, h, w].
fn conv_transpose2d_typed<F: Float + ferrite_core::WithDType + Send + Sync + 'static>(
    g: &Geo,
    gy: &[F],
    w: &[F],
) -> Vec<F> {
    let (pix, k, og, cg, hw) = (g.pix(), g.k(), g.og(), g.cg(), g.h * g.w);
    let mut dx = crate::alloc::full(g.n * g.c * hw, F::zero());
    let item = |ni: usize, dxn: &mut [F], cols: &mut Vec<F>, par: Parallelism| {
        for gi in 0..g.p.groups {
            let gyg = &gy[(ni * g.o + gi * og) * pix..];
            // w[g]ᵀ: [K, o/g] with row stride 1 and column stride K.
            let a = Mat {
                d: &w[gi * og * k..],
                rs: 1,
                cs: k,
            };
            let b = Mat {
                d: gyg,
                rs: pix,
                cs: 1,
            };
            let dxg = &mut dxn[gi * cg * hw..(gi + 1) * cg * hw];
            if g.direct() {
                mm((k, pix, og), dxg, false, a, b, par);
            } else {
                cols.resize(k * pix, F::zero());
                mm((k, pix, og), cols, false, a, b, par);
                col2im(g, cols, dxg, pix);
            }
        }
    };
    let plane = g.c * hw;
    if plane == 0 {
        return dx;
    }
    if pix < WHOLE_BATCH_PIX && pix > 0 {
        let ld = g.n * pix;
        let gyb = channels_first(gy, g.n, g.o, pix);
        let mut cols = crate::alloc::full(k * ld, F::zero());
        for gi in 0..g.p.groups {
            let a = Mat {
                d: &w[gi * og * k..],
                rs: 1,
                cs: k,
            };
            let b = Mat {
                d: &gyb[gi * og * ld..],
                rs: ld,
                cs: 1,
            };
            mm((k, ld, og), &mut cols, false, a, b, Parallelism::Rayon(0));
            dx.par_chunks_mut(plane).enumerate().for_each(|(ni, dxn)| {
                let dxg = &mut dxn[gi * cg * hw..(gi + 1) * cg * hw];
                col2im(g, &cols[ni * pix..], dxg, ld);
            });
        }
        return dx;
    }
    if per_item(g) {
        dx.par_chunks_mut(plane)
            .enumerate()
            .for_each_init(Vec::new, |cols, (ni, dxn)| {
                item(ni, dxn, cols, Parallelism::None)
            });
    } else {
        let mut cols = Vec::new();
        for (ni, dxn) in dx.chunks_mut(plane).enumerate() {
            item(ni, dxn, &mut cols, Parallelism::Rayon(0));
        }
    }
    dx
}

/// (x [n, c, h, w], gy [n, o, oh, ow]) -> dw [o, c/g, kh, kw].
fn conv2d_backward_weight_typed<F: Float + ferrite_core::WithDType + Send + Sync + 'static>(
    g: &Geo,
    x: &[F],
    gy: &[F],
) -> Vec<F> {
    let (pix, k, og, cg, hw) = (g.pix(), g.k(), g.og(), g.cg(), g.h * g.w);
    let len = g.o * k;
    // Accumulates batch item ni into acc [o, K].
    let item = |ni: usize, acc: &mut [F], cols: &mut Vec<F>, par: Parallelism| {
        for gi in 0..g.p.groups {
            let xg = &x[(ni * g.c + gi * cg) * hw..(ni * g.c + (gi + 1) * cg) * hw];
            let cols: &[F] = if g.direct() {
                xg
            } else {
                cols.resize(k * pix, F::zero());
                im2col(g, xg, cols, pix);
                cols
            };
            let a = Mat {
                d: &gy[(ni * g.o + gi * og) * pix..],
                rs: pix,
                cs: 1,
            };
            // colsᵀ: [oh ow, K].
            let b = Mat {
                d: cols,
                rs: 1,
                cs: pix,
            };
            mm(
                (og, k, pix),
                &mut acc[gi * og * k..(gi + 1) * og * k],
                true,
                a,
                b,
                par,
            );
        }
    };
    if len == 0 || g.n == 0 {
        return crate::alloc::full(len, F::zero());
    }
    if pix < WHOLE_BATCH_PIX && pix > 0 {
        let ld = g.n * pix;
        let gyb = channels_first(gy, g.n, g.o, pix);
        let mut dw = crate::alloc::full(len, F::zero());
        for gi in 0..g.p.groups {
            let cols = im2col_batch(g, x, gi);
            let a = Mat {
                d: &gyb[gi * og * ld..],
                rs: ld,
                cs: 1,
            };
            // colsᵀ: [n pix, K].
            let b = Mat {
                d: &cols,
                rs: 1,
                cs: ld,
            };
            let dst = &mut dw[gi * og * k..(gi + 1) * og * k];
            mm((og, k, ld), dst, false, a, b, Parallelism::Rayon(0));
        }
        return dw;
    }
    if per_item(g) {
        (0..g.n)
            .into_par_iter()
            .fold(
                || (vec![F::zero(); len], Vec::new()),
                |(mut acc, mut cols), ni| {
                    item(ni, &mut acc, &mut cols, Parallelism::None);
                    (acc, cols)
                },
            )
            .map(|(acc, _)| acc)
            .reduce_with(|mut a, b| {
                a.iter_mut().zip(&b).for_each(|(p, &q)| *p = *p + q);
                a
            })
            .unwrap_or_else(|| vec![F::zero(); len])
    } else {
        let mut acc = crate::alloc::full(len, F::zero());
        let mut cols = Vec::new();
        for ni in 0..g.n {
            item(ni, &mut acc, &mut cols, Parallelism::Rayon(0));
        }
        acc
    }
}

pub(crate) fn conv2d(x: &Tensor, w: &Tensor, p: &Conv2dParams, out: &Shape) -> Result<HostBuffer> {
    let op = "conv2d";
    let g = Geo::new(x.dims(), w.dims(), out.dims(), *p);
    Ok(float_kernel!(op, x.dtype(), [x, w], |xs, ws| conv2d_typed(
        &g, xs, ws
    )))
}

/// The op's input `x` plays the output gradient of a conv2d from `out`'s shape.
pub(crate) fn conv_transpose2d(
    x: &Tensor,
    w: &Tensor,
    p: &Conv2dParams,
    out: &Shape,
) -> Result<HostBuffer> {
    let op = "conv_transpose2d";
    let g = Geo::new(out.dims(), w.dims(), x.dims(), *p);
    Ok(float_kernel!(op, x.dtype(), [x, w], |xs, ws| {
        conv_transpose2d_typed(&g, xs, ws)
    }))
}

pub(crate) fn conv2d_backward_weight(
    x: &Tensor,
    gy: &Tensor,
    p: &Conv2dParams,
    out: &Shape,
) -> Result<HostBuffer> {
    let op = "conv2d_backward_weight";
    if out.dims().len() != 4 {
        return Err(Error::backend(op, "weight spec must be rank 4"));
    }
    let g = Geo::new(x.dims(), out.dims(), gy.dims(), *p);
    Ok(float_kernel!(op, x.dtype(), [x, gy], |xs, gs| {
        conv2d_backward_weight_typed(&g, xs, gs)
    }))
}
