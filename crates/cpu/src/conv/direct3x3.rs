//! Direct 3x3 convolutions (stride 1, padding 1, dilation 1, one group) in f32 with AVX-512:
//! conv2d, its input gradient (conv_transpose2d of the same geometry, which is a conv2d of
//! the output gradient with the kernel flipped and its channel axes swapped) and its weight
//! gradient, without im2col's 9x copy or gemm's packing of it.
//!
//! Layout ("padded rows"): an input plane of h x w is copied into a plane of (h + 2) rows of
//! wp = w + 2 (a zero column each side, a zero row above and below), followed by zeros up to
//! `plane` elements. Output pixel (i, j) sits at q = i wp + j; tap (ki, kj) reads the padded
//! plane at q + ki wp + kj, so each tap is a constant shift and 16 consecutive q are one
//! vector load. Columns j >= w of the q space are junk: computed, never stored.

use crate::alloc;
use rayon::prelude::*;
use std::mem::MaybeUninit;

type Geo = ferrite_core::ConvGeometry;

/// Lanes of a vector.
const L: usize = 16;
/// Output pixel vectors x output channels of the forward microkernel (24 accumulators).
const MV: usize = 2;
const NO: usize = 12;
/// Output channels per weight-gradient microkernel call (one input channel, 9 taps).
const NW: usize = 6;

/// `FERRITE_CPU_CONV=im2col` turns this path off (for benchmarking it against im2col + gemm).
static ENABLED: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
    std::env::var("FERRITE_CPU_CONV").map_or(true, |v| v != "im2col")
        && std::arch::is_x86_feature_detected!("avx512f")
});

/// Whether this path takes the convolution `g` (f32 is the caller's check). Fewer than 8
/// channels on either side (a stem's single input channel, whose input gradient would fill
/// 1 of 12 rows of a block) stay with im2col + gemm.
pub(super) fn applies(g: &Geo) -> bool {
    *ENABLED
        && g.kh == 3
        && g.kw == 3
        && g.p.stride == [1, 1]
        && g.p.padding == [1, 1]
        && g.p.dilation == [1, 1]
        && g.p.groups == 1
        && g.oh == g.h
        && g.ow == g.w
        && g.n > 0
        && g.c >= 8
        && g.o >= 8
        && g.h > 0
        && g.w > 0
}

/// A pooled scratch buffer, given back to the pool when dropped.
struct Scratch(Vec<f32>);

impl Drop for Scratch {
    fn drop(&mut self) {
        alloc::give_back(std::mem::take(&mut self.0));
    }
}

/// The padded-rows geometry of one h x w plane.
#[derive(Clone, Copy)]
struct Rows {
    h: usize,
    w: usize,
    wp: usize,
    /// Vectors of q that cover the h wp positions, rounded up to whole microkernel tiles.
    nv: usize,
    /// Elements per padded plane: every load of a tile (q < nv L, shifted by up to 2 wp + 2)
    /// stays inside it.
    plane: usize,
}

impl Rows {
    fn new(h: usize, w: usize) -> Rows {
        let wp = w + 2;
        let nv = (h * wp).div_ceil(L).next_multiple_of(MV);
        Rows {
            h,
            w,
            wp,
            nv,
            plane: nv * L + 2 * wp + 2,
        }
    }

    /// The shift of each tap (ki, kj), row-major.
    fn taps(&self) -> [usize; 9] {
        std::array::from_fn(|t| (t / 3) * self.wp + t % 3)
    }

    /// Copies the h x w plane `src` into `dst` (`plane` long) in the padded layout.
    fn pad(&self, src: &[f32], dst: &mut [f32]) {
        let (w, wp) = (self.w, self.wp);
        dst[..wp + 1].fill(0.0);
        for i in 0..self.h {
            let row = &mut dst[(i + 1) * wp + 1..(i + 2) * wp + 1];
            row[..w].copy_from_slice(&src[i * w..(i + 1) * w]);
            row[w..].fill(0.0);
        }
        dst[(self.h + 1) * wp + 1..].fill(0.0);
    }

    /// Copies the h x w plane `src` into `dst` (nv L long) at q = i wp + j, junk columns and
    /// the tail zero.
    fn spread(&self, src: &[f32], dst: &mut [f32]) {
        let (w, wp) = (self.w, self.wp);
        for i in 0..self.h {
            let row = &mut dst[i * wp..(i + 1) * wp];
            row[..w].copy_from_slice(&src[i * w..(i + 1) * w]);
            row[w..].fill(0.0);
        }
        dst[self.h * wp..].fill(0.0);
    }
}

/// The forward kernel's weights: `[o blocks][c][9][NO]` (channel rows past `o` zero) from
/// `at(o, c, t)`.
fn pack_forward(o: usize, c: usize, at: impl Fn(usize, usize, usize) -> f32) -> Vec<f32> {
    let blocks = o.div_ceil(NO);
    let mut p = alloc::scratch(blocks * c * 9 * NO);
    for (i, v) in p.iter_mut().enumerate() {
        let (r, t, ci, b) = (i % NO, i / NO % 9, i / (NO * 9) % c, i / (NO * 9 * c));
        let oc = b * NO + r;
        *v = if oc < o { at(oc, ci, t) } else { 0.0 };
    }
    p
}

/// y [n, o, h, w] = conv(x [n, c, h, w], weights packed by `pack_forward`), 3x3, stride 1,
/// padding 1.
fn forward(n: usize, (c, o): (usize, usize), r: Rows, x: &[f32], wp: &[f32]) -> Vec<f32> {
    let (hw, taps) = (r.h * r.w, r.taps());
    let out = alloc::filled(n * o * hw, |y| {
        y.par_chunks_mut(o * hw).enumerate().for_each_init(
            || Scratch(alloc::scratch(c * r.plane)),
            |Scratch(xp), (ni, yn)| {
                for ci in 0..c {
                    let src = &x[(ni * c + ci) * hw..(ni * c + ci + 1) * hw];
                    r.pad(src, &mut xp[ci * r.plane..(ci + 1) * r.plane]);
                }
                forward_item(&r, &taps, (c, o), xp, wp, yn);
            },
        );
    });
    out
}

/// One item's output planes `y` ([o, h, w], each element written once) from its padded
/// input planes `xp` ([c][plane]).
fn forward_item(
    r: &Rows,
    taps: &[usize; 9],
    (c, o): (usize, usize),
    xp: &[f32],
    wpk: &[f32],
    y: &mut [MaybeUninit<f32>],
) {
    assert!(xp.len() >= c * r.plane && wpk.len() >= o.div_ceil(NO) * c * 9 * NO);
    assert!(y.len() == o * r.h * r.w);
    let mut tile = [0f32; NO * MV * L];
    for v0 in (0..r.nv).step_by(MV) {
        for b in 0..o.div_ceil(NO) {
            // SAFETY: the CPU has AVX-512F (`applies`); the tile's loads read xp at
            // ci plane + v0 L + shift + < MV L for ci < c, all below c plane (`Rows::plane`),
            // and the weights at b c 9 NO + < c 9 NO (asserted above).
            unsafe {
                forward_tile(
                    xp.as_ptr().add(v0 * L),
                    r.plane,
                    c,
                    taps,
                    wpk.as_ptr().add(b * c * 9 * NO),
                    &mut tile,
                );
            }
            // Store the tile's valid pixels: rows of q in [q0, q1) with j < w.
            let (q0, q1) = (v0 * L, ((v0 + MV) * L).min(r.h * r.wp));
            for ro in 0..NO.min(o - b * NO) {
                let plane = &mut y[(b * NO + ro) * r.h * r.w..(b * NO + ro + 1) * r.h * r.w];
                let t = &tile[ro * MV * L..(ro + 1) * MV * L];
                let mut q = q0;
                while q < q1 {
                    let (i, j) = (q / r.wp, q % r.wp);
                    let end = (i * r.wp + r.w).min(q1);
                    if j < r.w {
                        let dst = &mut plane[i * r.w + j..i * r.w + j + (end - q)];
                        for (d, &s) in dst.iter_mut().zip(&t[q - q0..end - q0]) {
                            d.write(s);
                        }
                    }
                    q = (i + 1) * r.wp;
                }
            }
        }
    }
}

/// tile [NO][MV L] = Σ over c input channels and 9 taps of w[ci][t][r] x[ci][q + shift t],
/// for the MV L positions q starting at `x`.
///
/// # Safety
/// AVX-512F is available; `x` is readable at ci `plane` + taps[t] + [0, MV L) for ci < c,
/// t < 9, and `w` at [0, c 9 NO).
#[target_feature(enable = "avx512f")]
unsafe fn forward_tile(
    x: *const f32,
    plane: usize,
    c: usize,
    taps: &[usize; 9],
    w: *const f32,
    tile: &mut [f32; NO * MV * L],
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); MV]; NO];
    for ci in 0..c {
        // SAFETY (all pointer arithmetic below): within the ranges of the function contract.
        let (xc, wc) = unsafe { (x.add(ci * plane), w.add(ci * 9 * NO)) };
        for (t, &shift) in taps.iter().enumerate() {
            let xv: [__m512; MV] =
                std::array::from_fn(|v| unsafe { _mm512_loadu_ps(xc.add(shift + v * L)) });
            for (ro, a) in acc.iter_mut().enumerate() {
                let wv = _mm512_set1_ps(unsafe { *wc.add(t * NO + ro) });
                for v in 0..MV {
                    a[v] = _mm512_fmadd_ps(xv[v], wv, a[v]);
                }
            }
        }
    }
    for (ro, a) in acc.iter().enumerate() {
        for (v, &av) in a.iter().enumerate() {
            // SAFETY: (ro MV + v) L + L <= NO MV L, the tile's length.
            unsafe { _mm512_storeu_ps(tile.as_mut_ptr().add((ro * MV + v) * L), av) };
        }
    }
}

/// conv2d: x [n, c, h, w], w [o, c, 3, 3] -> y [n, o, h, w].
pub(super) fn conv2d(g: &Geo, x: &[f32], w: &[f32]) -> Vec<f32> {
    let (c, o) = (g.c, g.o);
    let wpk = pack_forward(o, c, |oc, ci, t| w[(oc * c + ci) * 9 + t]);
    let y = forward(g.n, (c, o), Rows::new(g.h, g.w), x, &wpk);
    alloc::give_back(wpk);
    y
}

/// conv2d's input gradient: gy [n, o, h, w], w [o, c, 3, 3] -> dx [n, c, h, w], a conv2d of
/// gy with weights w'[c, o, t] = w[o, c, 8 - t].
pub(super) fn conv_transpose2d(g: &Geo, gy: &[f32], w: &[f32]) -> Vec<f32> {
    let (c, o) = (g.c, g.o);
    let wpk = pack_forward(c, o, |ci, oc, t| w[(oc * c + ci) * 9 + 8 - t]);
    let dx = forward(g.n, (o, c), Rows::new(g.h, g.w), gy, &wpk);
    alloc::give_back(wpk);
    dx
}

/// conv2d's weight gradient: x [n, c, h, w], gy [n, o, h, w] -> dw [o, c, 3, 3] =
/// Σ over items and pixels of gy[n, o, q] x[n, c, q + shift t].
pub(super) fn conv2d_backward_weight(g: &Geo, x: &[f32], gy: &[f32]) -> Vec<f32> {
    let (n, c, o) = (g.n, g.c, g.o);
    let r = Rows::new(g.h, g.w);
    let (hw, taps, len) = (r.h * r.w, r.taps(), o * c * 9);
    let op = o.next_multiple_of(NW);
    // Items per block: at least 64 pixel vectors per accumulator before it is summed across
    // lanes, but no more than an even share of the batch per thread.
    let threads = rayon::current_num_threads().max(1);
    let nb = 64usize.div_ceil(r.nv).min(n.div_ceil(threads)).max(1);
    let blocks = n.div_ceil(nb);
    let acc = (0..blocks)
        .into_par_iter()
        .fold(
            || (alloc::full(len, 0f32), (Vec::new(), Vec::new())),
            |(mut dw, (mut xp, mut gq)), bi| {
                let (n0, nbi) = (bi * nb, nb.min(n - bi * nb));
                xp = regrow(xp, nbi * c * r.plane);
                gq = regrow(gq, nbi * op * r.nv * L);
                for j in 0..nbi {
                    for ci in 0..c {
                        let src = &x[((n0 + j) * c + ci) * hw..((n0 + j) * c + ci + 1) * hw];
                        let dst = (j * c + ci) * r.plane;
                        r.pad(src, &mut xp[dst..dst + r.plane]);
                    }
                    for oc in 0..op {
                        let dst = &mut gq[(j * op + oc) * r.nv * L..(j * op + oc + 1) * r.nv * L];
                        if oc < o {
                            let s = ((n0 + j) * o + oc) * hw;
                            r.spread(&gy[s..s + hw], dst);
                        } else {
                            dst.fill(0.0);
                        }
                    }
                }
                weight_block(&r, &taps, (c, o, op, nbi), &xp, &gq, &mut dw);
                (dw, (xp, gq))
            },
        )
        .map(|(dw, (xp, gq))| {
            alloc::give_back(xp);
            alloc::give_back(gq);
            dw
        })
        .reduce_with(|mut a, b| {
            a.iter_mut().zip(&b).for_each(|(p, &q)| *p += q);
            alloc::give_back(b);
            a
        });
    acc.unwrap_or_else(|| alloc::full(len, 0.0))
}

/// `v` when it holds at least `len` elements, else a pooled scratch buffer of `len`
/// (contents unspecified either way).
fn regrow(v: Vec<f32>, len: usize) -> Vec<f32> {
    if v.len() >= len {
        return v;
    }
    alloc::give_back(v);
    alloc::scratch(len)
}

/// dw [o, c, 9] += the weight gradient of nb items: their padded inputs `xp` ([nb][c][plane])
/// and spread output gradients `gq` ([nb][op][nv L], rows past o zero).
fn weight_block(
    r: &Rows,
    taps: &[usize; 9],
    (c, o, op, nb): (usize, usize, usize, usize),
    xp: &[f32],
    gq: &[f32],
    dw: &mut [f32],
) {
    assert!(xp.len() >= nb * c * r.plane && gq.len() >= nb * op * r.nv * L);
    assert!(dw.len() == o * c * 9 && op % NW == 0);
    let mut sums = [[0f32; L]; NW * 9];
    for b in 0..op / NW {
        for ci in 0..c {
            // SAFETY: AVX-512F is available (`applies`); for each item j < nb the kernel reads
            // gq at (j op + b NW + < NW) nv L + < nv L and xp at (j c + ci) plane + shift
            // + < nv L, inside the buffers (asserted above; `Rows::plane`).
            unsafe {
                weight_tile(
                    xp.as_ptr().add(ci * r.plane),
                    c * r.plane,
                    gq.as_ptr().add(b * NW * r.nv * L),
                    op * r.nv * L,
                    (r.nv, nb),
                    taps,
                    &mut sums,
                );
            }
            for ro in 0..NW.min(o - b * NW) {
                let dst = &mut dw[((b * NW + ro) * c + ci) * 9..][..9];
                for (d, s) in dst.iter_mut().zip(&sums[ro * 9..]) {
                    *d += s.iter().sum::<f32>();
                }
            }
        }
    }
}

/// sums [NW][9][lanes], summed over lanes = Σ over nb items j and nv L positions q of g[j][ro][q] x[j][q + taps[t]]
/// (`x`'s items `xs` apart, `g`'s `gs` apart, g's NW rows nv L apart). One row of taps (ki)
/// at a time: NW x 3 accumulators leave registers for the NW gradient vectors.
///
/// # Safety
/// AVX-512F is available; x is readable at j xs + taps[t] + [0, nv L) and g at
/// j gs + ro nv L + [0, nv L) for j < nb, ro < NW, t < 9.
#[target_feature(enable = "avx512f")]
unsafe fn weight_tile(
    x: *const f32,
    xs: usize,
    g: *const f32,
    gs: usize,
    (nv, nb): (usize, usize),
    taps: &[usize; 9],
    sums: &mut [[f32; L]; NW * 9],
) {
    use std::arch::x86_64::*;
    for ki in 0..3 {
        let mut acc = [[_mm512_setzero_ps(); 3]; NW];
        for j in 0..nb {
            // SAFETY (all pointer arithmetic below): within the ranges of the function
            // contract (taps[3 ki + kj] = taps[3 ki] + kj).
            let (xj, gj) = unsafe { (x.add(j * xs + taps[3 * ki]), g.add(j * gs)) };
            for v in 0..nv {
                let gv: [__m512; NW] = std::array::from_fn(|ro| unsafe {
                    _mm512_loadu_ps(gj.add(ro * nv * L + v * L))
                });
                for kj in 0..3 {
                    let xv = unsafe { _mm512_loadu_ps(xj.add(kj + v * L)) };
                    for (a, &gr) in acc.iter_mut().zip(&gv) {
                        a[kj] = _mm512_fmadd_ps(gr, xv, a[kj]);
                    }
                }
            }
        }
        // Stored, then summed across lanes by the caller: reducing in registers here (256-
        // and 128-bit steps, VEX-encoded without AVX-512VL) would confine the accumulators to
        // zmm0-15 and spill them.
        for ro in 0..NW {
            for kj in 0..3 {
                let dst = sums[ro * 9 + 3 * ki + kj].as_mut_ptr();
                // SAFETY: dst holds L floats.
                unsafe { _mm512_storeu_ps(dst, acc[ro][kj]) };
            }
        }
    }
}
