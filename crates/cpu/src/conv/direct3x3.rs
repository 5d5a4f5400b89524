//! Direct 3x3 convolutions (padding 1, dilation 1, one group) in f32 with AVX-512: conv2d
//! with stride 1 or 2, its weight gradient, and its input gradient at stride 1
//! (conv_transpose2d of the same geometry, which is a conv2d of the output gradient with the
//! kernel flipped and its channel axes swapped), without im2col's 9x copy or gemm's packing
//! of it.
//!
//! Layout: each input plane is zero-padded by 1 and, at stride 2, split into its 4 phases
//! (even/odd rows x even/odd columns of the padded plane), each phase stored as rows of `ws`
//! (the padded width at stride 1, half of it rounded up at stride 2) and followed by zeros.
//! Output pixel (i, j) sits at q = i ws + j, and tap (ki, kj) reads its phase plane at
//! q + (ki / s) ws + kj / s: each tap is a constant shift, so 16 consecutive q are one vector
//! load. Columns j >= ow of the q space are junk: computed, never stored.

use crate::alloc;
use rayon::prelude::*;
use std::mem::MaybeUninit;

type Geo = ferrite_core::ConvGeometry;

/// Lanes of a vector.
const L: usize = 16;
/// Output pixel vectors x output channels of the forward microkernel (24 accumulators).
const MV: usize = 2;
const NO: usize = 12;
/// Output channels per weight-gradient microkernel call (one input channel, one kernel row).
const NW: usize = 6;

/// `FERRITE_CPU_CONV=im2col` turns this path off (for benchmarking it against im2col + gemm).
static ENABLED: std::sync::LazyLock<bool> = std::sync::LazyLock::new(|| {
    std::env::var("FERRITE_CPU_CONV").map_or(true, |v| v != "im2col")
        && std::arch::is_x86_feature_detected!("avx512f")
});

/// Whether this path takes the convolution `g`, for the input gradient when `input_grad`
/// (f32 is the caller's check). Fewer than 8 channels on either side (a stem's single input
/// channel, whose input gradient would fill 1 of 12 rows of a block) stay with im2col + gemm,
/// and so do more than 96: a tile then reads weights (c 9 x 12) and input rows from more
/// than L1 holds, and ResNet-50's 128-512-channel 3x3 layers measured up to 1.7x slower than
/// gemm's packed panels (2-core Xeon; fashion-cnn's 24-96 and ResNet-50's 64 are faster).
pub(super) fn applies(g: &Geo, input_grad: bool) -> bool {
    let s = g.p.stride[0];
    *ENABLED
        && g.kh == 3
        && g.kw == 3
        && g.p.stride[1] == s
        && (s == 1 || (s == 2 && !input_grad))
        && g.p.padding == [1, 1]
        && g.p.dilation == [1, 1]
        && g.p.groups == 1
        && g.h > 0
        && g.w > 0
        && g.oh == (g.h - 1) / s + 1
        && g.ow == (g.w - 1) / s + 1
        && g.n > 0
        && (8..=96).contains(&g.c)
        && (8..=96).contains(&g.o)
}

/// A pooled scratch buffer, given back to the pool when dropped.
struct Scratch(Vec<f32>);

impl Drop for Scratch {
    fn drop(&mut self) {
        alloc::give_back(std::mem::take(&mut self.0));
    }
}

/// The layout of one channel: an h x w input plane, stride s (1 or 2), output oh x ow.
#[derive(Clone, Copy)]
struct Rows {
    s: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    /// Row length of the q space and of each phase plane (ow + 2 at stride 1, ow + 1 at 2).
    ws: usize,
    /// Vectors of q that cover the oh ws positions, rounded up to whole microkernel tiles.
    nv: usize,
    /// Elements per phase plane: its (oh + 3 - s) rows of ws, and every load of a tile
    /// (q < nv L, shifted by up to (3 - s) (ws + 1)) stays inside it.
    phase: usize,
    /// Elements per channel: s² phase planes.
    plane: usize,
}

impl Rows {
    fn new(g: &Geo) -> Rows {
        let s = g.p.stride[0];
        let ws = g.ow + 3 - s;
        let nv = (g.oh * ws).div_ceil(L).next_multiple_of(MV);
        let phase = nv * L + (3 - s) * (ws + 1);
        Rows {
            s,
            h: g.h,
            w: g.w,
            oh: g.oh,
            ow: g.ow,
            ws,
            nv,
            phase,
            plane: s * s * phase,
        }
    }

    /// The shift of each tap (ki, kj), row-major, from the start of a channel.
    fn taps(&self) -> [usize; 9] {
        let s = self.s;
        std::array::from_fn(|t| {
            let (ki, kj) = (t / 3, t % 3);
            ((ki % s) * s + kj % s) * self.phase + (ki / s) * self.ws + kj / s
        })
    }

    /// Copies the h x w plane `src` into `dst` (`plane` long): padded, split into phases.
    fn pad(&self, src: &[f32], dst: &mut [f32]) {
        let (w, ws) = (self.w, self.ws);
        if self.s == 1 {
            dst[..ws + 1].fill(0.0);
            for i in 0..self.h {
                let row = &mut dst[(i + 1) * ws + 1..(i + 2) * ws + 1];
                row[..w].copy_from_slice(&src[i * w..(i + 1) * w]);
                row[w..].fill(0.0);
            }
            dst[(self.h + 1) * ws + 1..].fill(0.0);
            return;
        }
        // Padded pixel (pi, pj) = x[pi - 1, pj - 1] goes to phase (pi % 2, pj % 2) at
        // (pi / 2, pj / 2).
        dst[..self.plane].fill(0.0);
        for i in 0..self.h {
            let pi = i + 1;
            let row = &src[i * w..(i + 1) * w];
            let base = (pi % 2) * 2 * self.phase + (pi / 2) * ws;
            for (j, &v) in row.iter().enumerate() {
                let pj = j + 1;
                dst[base + (pj % 2) * self.phase + pj / 2] = v;
            }
        }
    }

    /// Copies the oh x ow plane `src` into `dst` (nv L long) at q = i ws + j, junk columns and
    /// the tail zero.
    fn spread(&self, src: &[f32], dst: &mut [f32]) {
        let (ow, ws) = (self.ow, self.ws);
        for i in 0..self.oh {
            let row = &mut dst[i * ws..(i + 1) * ws];
            row[..ow].copy_from_slice(&src[i * ow..(i + 1) * ow]);
            row[ow..].fill(0.0);
        }
        dst[self.oh * ws..].fill(0.0);
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

/// y [n, o, oh, ow] = conv(x [n, c, h, w], weights packed by `pack_forward`), 3x3, padding
/// 1, r's stride.
fn forward(n: usize, (c, o): (usize, usize), r: Rows, x: &[f32], wp: &[f32]) -> Vec<f32> {
    let (hw, ohw, taps) = (r.h * r.w, r.oh * r.ow, r.taps());
    let out = alloc::filled(n * o * ohw, |y| {
        y.par_chunks_mut(o * ohw).enumerate().for_each_init(
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

/// One item's output planes `y` ([o, oh, ow], each element written once) from its padded
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
    assert!(y.len() == o * r.oh * r.ow);
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
            // Store the tile's valid pixels: rows of q in [q0, q1) with j < ow.
            let (q0, q1, ohw) = (v0 * L, ((v0 + MV) * L).min(r.oh * r.ws), r.oh * r.ow);
            for ro in 0..NO.min(o - b * NO) {
                let plane = &mut y[(b * NO + ro) * ohw..(b * NO + ro + 1) * ohw];
                let t = &tile[ro * MV * L..(ro + 1) * MV * L];
                let mut q = q0;
                while q < q1 {
                    let (i, j) = (q / r.ws, q % r.ws);
                    let end = (i * r.ws + r.ow).min(q1);
                    if j < r.ow {
                        let dst = &mut plane[i * r.ow + j..i * r.ow + j + (end - q)];
                        for (d, &s) in dst.iter_mut().zip(&t[q - q0..end - q0]) {
                            d.write(s);
                        }
                    }
                    q = (i + 1) * r.ws;
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

/// conv2d: x [n, c, h, w], w [o, c, 3, 3] -> y [n, o, oh, ow].
pub(super) fn conv2d(g: &Geo, x: &[f32], w: &[f32]) -> Vec<f32> {
    let (c, o) = (g.c, g.o);
    let wpk = pack_forward(o, c, |oc, ci, t| w[(oc * c + ci) * 9 + t]);
    let y = forward(g.n, (c, o), Rows::new(g), x, &wpk);
    alloc::give_back(wpk);
    y
}

/// conv2d's input gradient at stride 1: gy [n, o, h, w], w [o, c, 3, 3] -> dx [n, c, h, w],
/// a conv2d of gy with weights w'[c, o, t] = w[o, c, 8 - t].
pub(super) fn conv_transpose2d(g: &Geo, gy: &[f32], w: &[f32]) -> Vec<f32> {
    let (c, o) = (g.c, g.o);
    let wpk = pack_forward(c, o, |ci, oc, t| w[(oc * c + ci) * 9 + 8 - t]);
    let dx = forward(g.n, (o, c), Rows::new(g), gy, &wpk);
    alloc::give_back(wpk);
    dx
}

/// conv2d's weight gradient: x [n, c, h, w], gy [n, o, oh, ow] -> dw [o, c, 3, 3] =
/// Σ over items and output pixels q of gy[n, o, q] x[n, c, q + shift t].
/// Whether the weight gradient of `g` (which `applies`) is faster here than through im2col +
/// gemm: on planes of fewer than 8 output vectors (7x7) summing each accumulator across its
/// lanes, once per input channel and block, costs more than it saves (measured at
/// fashion-cnn's shapes on the 2-core Xeon).
pub(super) fn weight_grad_pays(g: &Geo) -> bool {
    Rows::new(g).nv >= 8
}

pub(super) fn conv2d_backward_weight(g: &Geo, x: &[f32], gy: &[f32]) -> Vec<f32> {
    let (n, c, o) = (g.n, g.c, g.o);
    let r = Rows::new(g);
    let (hw, ohw, taps, len) = (r.h * r.w, r.oh * r.ow, r.taps(), o * c * 9);
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
                            let s = ((n0 + j) * o + oc) * ohw;
                            r.spread(&gy[s..s + ohw], dst);
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
        let row = [taps[3 * ki], taps[3 * ki + 1], taps[3 * ki + 2]];
        for j in 0..nb {
            // SAFETY (all pointer arithmetic below): within the ranges of the function
            // contract.
            let (xj, gj) = unsafe { (x.add(j * xs), g.add(j * gs)) };
            for v in 0..nv {
                let gv: [__m512; NW] = std::array::from_fn(|ro| unsafe {
                    _mm512_loadu_ps(gj.add(ro * nv * L + v * L))
                });
                for (kj, &shift) in row.iter().enumerate() {
                    let xv = unsafe { _mm512_loadu_ps(xj.add(shift + v * L)) };
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
