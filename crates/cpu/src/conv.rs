//! Convolutions as im2col + gemm over blocks of batch items (f16/bf16 compute in f32). A
//! block of nb items lays its column matrices side by side, cols [K, nb oh ow]
//! (K = c/g kh kw), and per group:
//! - conv2d: y[block, g] [o/g, nb oh ow] = w[g] [o/g, K] · cols;
//! - conv_transpose2d (conv2d's input gradient): cols = w[g]ᵀ · gy[block, g], then col2im
//!   adds every column entry back into the pixel it was read from;
//! - conv2d_backward_weight: dw[g] += gy[block, g] · colsᵀ, summed over blocks.
//!
//! Blocks are sized so that the product has enough columns to amortize packing the weight
//! (`block_items`); they run in parallel with single-threaded
//! gemm calls when the batch has an item per thread, else one after another with threaded
//! gemm calls. Each thread reuses its scratch buffers across blocks. A 1x1 kernel with stride
//! 1 and no padding in a one-item block reads x as its own columns.
//!
//! f32 3x3 convolutions with padding 1 (stride 1; stride 2 but for the input gradient) take
//! a direct AVX-512 path instead (`direct3x3`) on CPUs that have it.

#[cfg(target_arch = "x86_64")]
mod direct3x3;

use crate::storage::float_kernel;
use ferrite_core::{Conv2dParams, Error, HostBuffer, Result, Shape, Tensor};
use gemm::Parallelism;
use num_traits::Float;
use rayon::prelude::*;
use std::mem::MaybeUninit;

type Geo = ferrite_core::ConvGeometry;

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

/// Which pass of a convolution a kernel computes.
#[derive(Clone, Copy)]
enum Pass {
    Forward,
    InputGrad,
    WeightGrad,
}

/// Per-type fast paths ahead of im2col + gemm.
trait Direct: Float + ferrite_core::WithDType + Send + Sync + 'static {
    /// `pass` of `g` over (a, b) by a direct kernel, where one takes the problem.
    fn direct(g: &Geo, pass: Pass, a: &[Self], b: &[Self]) -> Option<Vec<Self>>;
}

impl Direct for f64 {
    fn direct(_: &Geo, _: Pass, _: &[f64], _: &[f64]) -> Option<Vec<f64>> {
        None
    }
}

impl Direct for f32 {
    #[cfg(target_arch = "x86_64")]
    fn direct(g: &Geo, pass: Pass, a: &[f32], b: &[f32]) -> Option<Vec<f32>> {
        if !direct3x3::applies(g, matches!(pass, Pass::InputGrad))
            || (matches!(pass, Pass::WeightGrad) && !direct3x3::weight_grad_pays(g))
        {
            return None;
        }
        Some(match pass {
            Pass::Forward => direct3x3::conv2d(g, a, b),
            Pass::InputGrad => direct3x3::conv_transpose2d(g, a, b),
            Pass::WeightGrad => direct3x3::conv2d_backward_weight(g, a, b),
        })
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn direct(_: &Geo, _: Pass, _: &[f32], _: &[f32]) -> Option<Vec<f32>> {
        None
    }
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
///
/// # Safety
/// `dst` is valid for writes of m n elements and not aliased by `a` or `b`; when `acc`, those
/// elements are initialized.
unsafe fn mm_raw<F: Float + ferrite_core::WithDType>(
    (m, n, k): (usize, usize, usize),
    dst: *mut F,
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
            for i in 0..m * n {
                // SAFETY: i < m n (function contract).
                unsafe { dst.add(i).write(F::zero()) };
            }
        }
        return;
    }
    let last = |r: usize, c: usize, mat: &Mat<F>| (r - 1) * mat.rs + (c - 1) * mat.cs;
    assert!(a.d.len() > last(m, k, &a) && b.d.len() > last(k, n, &b));
    // SAFETY: the assert above bounds the largest offset each operand is read at (strides
    // are non-negative); `dst` is an exclusive m x n row-major buffer (function contract),
    // read only when `acc`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
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

/// dst [m, n] = a · b, overwriting (dst may be uninitialized).
fn mm_into<F: Float + ferrite_core::WithDType>(
    mnk: (usize, usize, usize),
    dst: &mut [MaybeUninit<F>],
    a: Mat<F>,
    b: Mat<F>,
    par: Parallelism,
) {
    assert!(dst.len() >= mnk.0 * mnk.1);
    // SAFETY: dst is an exclusive buffer of at least m n elements; not read (acc = false).
    unsafe { mm_raw(mnk, dst.as_mut_ptr() as *mut F, false, a, b, par) }
}

/// dst [m, n] += a · b.
fn mm_acc<F: Float + ferrite_core::WithDType>(
    mnk: (usize, usize, usize),
    dst: &mut [F],
    a: Mat<F>,
    b: Mat<F>,
    par: Parallelism,
) {
    assert!(dst.len() >= mnk.0 * mnk.1);
    // SAFETY: dst is an exclusive, initialized buffer of at least m n elements.
    unsafe { mm_raw(mnk, dst.as_mut_ptr(), true, a, b, par) }
}

/// An initialized slice viewed as possibly-uninitialized slots (to be overwritten).
fn as_uninit<F>(v: &mut [F]) -> &mut [MaybeUninit<F>] {
    // SAFETY: MaybeUninit<F> has F's layout; writing initialized values through it keeps
    // the slice initialized.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut MaybeUninit<F>, v.len()) }
}

/// Aim for at least this many product columns per block: packing the weight (o/g x K) and
/// the product's fixed costs are amortized over them. Planes of at least this many pixels
/// run one item per block (their columns stay out of any copy into a block layout); more
/// items per block measured no faster (fashion-cnn's and ResNet-50's shapes, 2-core Xeon).
const MIN_COLS: usize = 512;

/// Items per block: enough for `MIN_COLS` columns, but no more than an equal share of the
/// batch per thread; then evened out so the number of blocks is a multiple of the thread
/// count where the batch allows.
fn block_items(g: &Geo, threads: usize) -> usize {
    let threads = threads.max(1);
    let want = MIN_COLS.div_ceil(g.pix().max(1));
    let nb = want.min(g.n.div_ceil(threads)).max(1);
    let blocks = g.n.div_ceil(nb).next_multiple_of(threads);
    g.n.div_ceil(blocks).max(1)
}

/// How blocks run: in parallel with single-threaded products when every thread gets one,
/// else in sequence with threaded products.
fn parallel_blocks(g: &Geo) -> bool {
    g.n >= rayon::current_num_threads()
}

/// A thread's reusable buffers: column matrices and a channels-first block (pooled: taken
/// from and given back to `crate::alloc`'s pool, so repeated ops reuse backed pages).
struct Scratch<F: ferrite_core::WithDType> {
    cols: Vec<F>,
    mat: Vec<F>,
}

impl<F: ferrite_core::WithDType> Scratch<F> {
    fn new() -> Self {
        Scratch {
            cols: Vec::new(),
            mat: Vec::new(),
        }
    }
}

impl<F: ferrite_core::WithDType> Drop for Scratch<F> {
    fn drop(&mut self) {
        crate::alloc::give_back(std::mem::take(&mut self.cols));
        crate::alloc::give_back(std::mem::take(&mut self.mat));
    }
}

/// `buf` as `len` elements, replaced by a pooled buffer of exactly `len` when shorter
/// (contents are unspecified: callers overwrite what they read).
fn grow<F: ferrite_core::WithDType>(buf: &mut Vec<F>, len: usize) -> &mut [F] {
    if buf.len() < len {
        let old = std::mem::replace(buf, crate::alloc::scratch(len));
        crate::alloc::give_back(old);
    }
    &mut buf[..len]
}

/// cols [K, nb pix] of group `gi` of items n0..n0 + nb (row stride nb pix).
fn im2col_block<F: Float>(g: &Geo, x: &[F], gi: usize, n0: usize, nb: usize, cols: &mut [F]) {
    let (pix, cg, hw) = (g.pix(), g.cg(), g.h * g.w);
    for j in 0..nb {
        let base = ((n0 + j) * g.c + gi * cg) * hw;
        im2col(g, &x[base..base + cg * hw], &mut cols[j * pix..], nb * pix);
    }
}

/// t [n, o, pix] items n0..n0 + nb as [o, nb pix] (item j at columns j pix..).
fn channels_first_block<F: Float>(t: &[F], g: &Geo, n0: usize, nb: usize, out: &mut [F]) {
    let (pix, o) = (g.pix(), g.o);
    for j in 0..nb {
        for oc in 0..o {
            let src = ((n0 + j) * o + oc) * pix;
            let dst = oc * nb * pix + j * pix;
            out[dst..dst + pix].copy_from_slice(&t[src..src + pix]);
        }
    }
}

/// y for the nb items n0.. (`yb`: their [o, pix] planes, overwritten).
fn conv2d_block<F: Float + ferrite_core::WithDType>(
    g: &Geo,
    (x, w): (&[F], &[F]),
    n0: usize,
    yb: &mut [MaybeUninit<F>],
    s: &mut Scratch<F>,
    par: Parallelism,
) {
    let (pix, k, og, cg, hw) = (g.pix(), g.k(), g.og(), g.cg(), g.h * g.w);
    let nb = yb.len() / (g.o * pix);
    let ld = nb * pix;
    // One item: the product writes y directly; else into `mat` [o, nb pix], copied out.
    let out: &mut [MaybeUninit<F>] = if nb == 1 {
        &mut *yb
    } else {
        as_uninit(grow(&mut s.mat, g.o * ld))
    };
    for gi in 0..g.p.groups {
        let cols: &[F] = if nb == 1 && g.direct() {
            let base = (n0 * g.c + gi * cg) * hw;
            &x[base..base + cg * hw]
        } else {
            let cols = grow(&mut s.cols, k * ld);
            im2col_block(g, x, gi, n0, nb, cols);
            cols
        };
        let a = Mat {
            d: &w[gi * og * k..],
            rs: k,
            cs: 1,
        };
        let b = Mat {
            d: cols,
            rs: ld,
            cs: 1,
        };
        mm_into((og, ld, k), &mut out[gi * og * ld..], a, b, par);
    }
    if nb > 1 {
        let mat = &s.mat;
        for (j, item) in yb.chunks_mut(g.o * pix).enumerate() {
            for (oc, dst) in item.chunks_mut(pix).enumerate() {
                let src = &mat[oc * ld + j * pix..oc * ld + (j + 1) * pix];
                for (d, &v) in dst.iter_mut().zip(src) {
                    d.write(v);
                }
            }
        }
    }
}

fn conv2d_typed<F: Direct>(g: &Geo, x: &[F], w: &[F]) -> Vec<F> {
    let plane = g.o * g.pix();
    if plane == 0 || g.n == 0 {
        return crate::alloc::full(g.n * plane, F::zero());
    }
    if let Some(y) = F::direct(g, Pass::Forward, x, w) {
        return y;
    }
    let threads = rayon::current_num_threads();
    let nb = block_items(g, threads);
    crate::alloc::filled(g.n * plane, |y| {
        let run = |bi: usize, yb: &mut [MaybeUninit<F>], s: &mut Scratch<F>, par| {
            conv2d_block(g, (x, w), bi * nb, yb, s, par)
        };
        if parallel_blocks(g) {
            y.par_chunks_mut(nb * plane)
                .enumerate()
                .for_each_init(Scratch::new, |s, (bi, yb)| {
                    run(bi, yb, s, Parallelism::None)
                });
        } else {
            let mut s = Scratch::new();
            for (bi, yb) in y.chunks_mut(nb * plane).enumerate() {
                run(bi, yb, &mut s, Parallelism::Rayon(0));
            }
        }
    })
}

/// dx of the nb items n0.. (`dxb`: their [c, h, w] planes, overwritten).
fn conv_transpose2d_block<F: Float + ferrite_core::WithDType>(
    g: &Geo,
    (gy, w): (&[F], &[F]),
    n0: usize,
    dxb: &mut [MaybeUninit<F>],
    s: &mut Scratch<F>,
    par: Parallelism,
) {
    let (pix, k, og, cg, hw) = (g.pix(), g.k(), g.og(), g.cg(), g.h * g.w);
    let nb = dxb.len() / (g.c * hw);
    let ld = nb * pix;
    // The block's gradient channels-first, [o, nb pix] (one item: gy itself).
    let gyb: &[F] = if nb == 1 {
        &gy[n0 * g.o * pix..(n0 + 1) * g.o * pix]
    } else {
        let m = grow(&mut s.mat, g.o * ld);
        channels_first_block(gy, g, n0, nb, m);
        m
    };
    let direct = nb == 1 && g.direct();
    if !direct {
        for d in dxb.iter_mut() {
            d.write(F::zero());
        }
    }
    for gi in 0..g.p.groups {
        // w[g]ᵀ: [K, o/g] with row stride 1 and column stride K.
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
        if direct {
            mm_into((k, ld, og), &mut dxb[gi * cg * hw..], a, b, par);
            continue;
        }
        let cols = grow(&mut s.cols, k * ld);
        mm_into((k, ld, og), as_uninit(cols), a, b, par);
        // SAFETY: every element of dxb was written (zeroed) above.
        let dx: &mut [F] =
            unsafe { std::slice::from_raw_parts_mut(dxb.as_mut_ptr() as *mut F, dxb.len()) };
        for j in 0..nb {
            let item = &mut dx[j * g.c * hw..(j + 1) * g.c * hw];
            col2im(
                g,
                &cols[j * pix..],
                &mut item[gi * cg * hw..(gi + 1) * cg * hw],
                ld,
            );
        }
    }
}

/// `gy` [n, o, oh, ow] -> dx [n, c, h, w].
fn conv_transpose2d_typed<F: Direct>(g: &Geo, gy: &[F], w: &[F]) -> Vec<F> {
    let plane = g.c * g.h * g.w;
    if plane == 0 || g.n == 0 || g.pix() == 0 {
        return crate::alloc::full(g.n * plane, F::zero());
    }
    if let Some(dx) = F::direct(g, Pass::InputGrad, gy, w) {
        return dx;
    }
    let nb = block_items(g, rayon::current_num_threads());
    crate::alloc::filled(g.n * plane, |dx| {
        let run = |bi: usize, dxb: &mut [MaybeUninit<F>], s: &mut Scratch<F>, par| {
            conv_transpose2d_block(g, (gy, w), bi * nb, dxb, s, par)
        };
        if parallel_blocks(g) {
            dx.par_chunks_mut(nb * plane)
                .enumerate()
                .for_each_init(Scratch::new, |s, (bi, dxb)| {
                    run(bi, dxb, s, Parallelism::None)
                });
        } else {
            let mut s = Scratch::new();
            for (bi, dxb) in dx.chunks_mut(nb * plane).enumerate() {
                run(bi, dxb, &mut s, Parallelism::Rayon(0));
            }
        }
    })
}

/// acc [o, K] += the weight gradient of items n0..n0 + nb.
fn backward_weight_block<F: Float + ferrite_core::WithDType>(
    g: &Geo,
    (x, gy): (&[F], &[F]),
    (n0, nb): (usize, usize),
    acc: &mut [F],
    s: &mut Scratch<F>,
    par: Parallelism,
) {
    let (pix, k, og, cg, hw) = (g.pix(), g.k(), g.og(), g.cg(), g.h * g.w);
    let ld = nb * pix;
    let gyb: &[F] = if nb == 1 {
        &gy[n0 * g.o * pix..(n0 + 1) * g.o * pix]
    } else {
        let m = grow(&mut s.mat, g.o * ld);
        channels_first_block(gy, g, n0, nb, m);
        m
    };
    for gi in 0..g.p.groups {
        let cols: &[F] = if nb == 1 && g.direct() {
            let base = (n0 * g.c + gi * cg) * hw;
            &x[base..base + cg * hw]
        } else {
            let cols = grow(&mut s.cols, k * ld);
            im2col_block(g, x, gi, n0, nb, cols);
            cols
        };
        let a = Mat {
            d: &gyb[gi * og * ld..],
            rs: ld,
            cs: 1,
        };
        // colsᵀ: [nb pix, K].
        let b = Mat {
            d: cols,
            rs: 1,
            cs: ld,
        };
        mm_acc(
            (og, k, ld),
            &mut acc[gi * og * k..(gi + 1) * og * k],
            a,
            b,
            par,
        );
    }
}

/// (x [n, c, h, w], gy [n, o, oh, ow]) -> dw [o, c/g, kh, kw].
fn conv2d_backward_weight_typed<F: Direct>(g: &Geo, x: &[F], gy: &[F]) -> Vec<F> {
    let len = g.o * g.k();
    if len == 0 || g.n == 0 || g.pix() == 0 {
        return crate::alloc::full(len, F::zero());
    }
    if let Some(dw) = F::direct(g, Pass::WeightGrad, x, gy) {
        return dw;
    }
    let nb = block_items(g, rayon::current_num_threads());
    let blocks = g.n.div_ceil(nb);
    let span = |bi: usize| (bi * nb, nb.min(g.n - bi * nb));
    if parallel_blocks(g) {
        (0..blocks)
            .into_par_iter()
            .fold(
                || (vec![F::zero(); len], Scratch::new()),
                |(mut acc, mut s), bi| {
                    backward_weight_block(
                        g,
                        (x, gy),
                        span(bi),
                        &mut acc,
                        &mut s,
                        Parallelism::None,
                    );
                    (acc, s)
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
        let mut s = Scratch::new();
        for bi in 0..blocks {
            backward_weight_block(
                g,
                (x, gy),
                span(bi),
                &mut acc,
                &mut s,
                Parallelism::Rayon(0),
            );
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
