//! K-quants: 256-weight super-blocks of 8 or 16 groups, each group with its own quantized
//! scale (and min). Dequantization follows ggml's `dequantize_row_q*_K` expression by
//! expression; quantization is the simple reference described in `quant/mod.rs`.

use half::f16;

use super::blocks::*;
use super::inv;
use crate::types::QK_K;

pub(super) fn dequant_q2k(b: &BlockQ2K, y: &mut [f32]) {
    let (d, min) = (b.d.to_f32(), b.dmin.to_f32());
    for (e, y) in y.iter_mut().enumerate().take(QK_K) {
        let (n, j, l) = (e / 128, (e % 128) / 32, e % 32);
        let sc = b.scales[e / 16];
        let dl = d * f32::from(sc & 0xF);
        let ml = min * f32::from(sc >> 4);
        let q = (b.qs[32 * n + l] >> (2 * j)) & 3;
        *y = dl * f32::from(q) - ml;
    }
}

pub(super) fn dequant_q3k(b: &BlockQ3K, y: &mut [f32]) {
    let d = b.d.to_f32();
    let scales = scales_q3k(&b.scales);
    for (e, y) in y.iter_mut().enumerate().take(QK_K) {
        let (n, j, l) = (e / 128, (e % 128) / 32, e % 32);
        let dl = d * f32::from(scales[e / 16] as i8 - 32);
        let low = ((b.qs[32 * n + l] >> (2 * j)) & 3) as i8;
        let high = (b.hmask[l] >> (e / 32)) & 1;
        let q = if high == 1 { low } else { low - 4 };
        *y = dl * f32::from(q);
    }
}

pub(super) fn dequant_q4k(b: &BlockQ4K, y: &mut [f32]) {
    let (d, min) = (b.d.to_f32(), b.dmin.to_f32());
    for (e, y) in y.iter_mut().enumerate().take(QK_K) {
        let (c, h, l) = (e / 64, (e % 64) / 32, e % 32);
        let (sc, m) = scale_min_k4(e / 32, &b.scales);
        let d1 = d * f32::from(sc);
        let m1 = min * f32::from(m);
        let q = (b.qs[32 * c + l] >> (4 * h)) & 0xF;
        *y = d1 * f32::from(q) - m1;
    }
}

pub(super) fn dequant_q5k(b: &BlockQ5K, y: &mut [f32]) {
    let (d, min) = (b.d.to_f32(), b.dmin.to_f32());
    for (e, y) in y.iter_mut().enumerate().take(QK_K) {
        let (c, h, l) = (e / 64, (e % 64) / 32, e % 32);
        let (sc, m) = scale_min_k4(e / 32, &b.scales);
        let d1 = d * f32::from(sc);
        let m1 = min * f32::from(m);
        let q = ((b.qs[32 * c + l] >> (4 * h)) & 0xF) | (((b.qh[l] >> (e / 32)) & 1) << 4);
        *y = d1 * f32::from(q) - m1;
    }
}

pub(super) fn dequant_q6k(b: &BlockQ6K, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (e, y) in y.iter_mut().enumerate().take(QK_K) {
        let (n, r) = (e / 128, e % 128);
        let low = (b.ql[64 * n + r % 64] >> (4 * (r / 64))) & 0xF;
        let high = (b.qh[32 * n + r % 32] >> (2 * (r / 32))) & 3;
        let q = (low | (high << 4)) as i8 - 32;
        *y = d * f32::from(b.scales[e / 16]) * f32::from(q);
    }
}

/// `v` as f16, rounded away from zero, so that `v / result` never exceeds the intended
/// number of sub-scale steps (matters for subnormal f16 scales).
fn f16_up(v: f32) -> f16 {
    let h = f16::from_f32(v);
    if h.to_f32().abs() < v.abs() && h.is_finite() {
        f16::from_bits(h.to_bits() + 1)
    } else {
        h
    }
}

/// Asymmetric super-block quantization shared by Q2_K, Q4_K and Q5_K: groups of `group`
/// weights, q in 0..=qmax, sub-scales and sub-mins in 0..=smax. Returns (d, dmin, scales,
/// mins, q) with `x ~ d*scales[g]*q - dmin*mins[g]`; scales and mins are rounded up so the
/// group's range is always covered (no clipping).
fn quant_asym(
    x: &[f32],
    group: usize,
    qmax: u8,
    smax: u8,
) -> (f16, f16, Vec<u8>, Vec<u8>, Vec<u8>) {
    let n_groups = QK_K / group;
    let mut lo = vec![0f32; n_groups];
    let mut hi = vec![0f32; n_groups];
    for (g, xs) in x.chunks_exact(group).enumerate() {
        let (mn, mx) = super::min_max(xs);
        lo[g] = (-mn).max(0.0);
        hi[g] = mx;
    }
    let smaxf = f32::from(smax);
    let dmin = f16_up(lo.iter().fold(0f32, |a, &v| a.max(v)) / smaxf);
    let idmin = inv(dmin.to_f32());
    let mins: Vec<u8> = lo
        .iter()
        .map(|&v| (v * idmin).ceil().min(smaxf) as u8)
        .collect();
    let need: Vec<f32> = (0..n_groups)
        .map(|g| ((hi[g] + dmin.to_f32() * f32::from(mins[g])) / f32::from(qmax)).max(0.0))
        .collect();
    let d = f16_up(need.iter().fold(0f32, |a, &v| a.max(v)) / smaxf);
    let id = inv(d.to_f32());
    let mut scales: Vec<u8> = need
        .iter()
        .map(|&v| (v * id).ceil().min(smaxf) as u8)
        .collect();
    let mut mins = mins;
    let (d, dm) = (d.to_f32(), dmin.to_f32());
    let mut q = vec![0u8; QK_K];
    for (g, xs) in x.chunks_exact(group).enumerate() {
        // The covering (rounded-up) pair keeps every error within half its step. Smaller
        // pairs often fit the group better; take the one of least squared error among those
        // that keep that bound.
        let limit = 0.5 * d * f32::from(scales[g]) * (1.0 + 1e-6);
        let mut best = (f32::INFINITY, scales[g], mins[g]);
        for sc in scales[g].saturating_sub(2)..=scales[g] {
            for m in mins[g].saturating_sub(1)..=mins[g] {
                let (dl, ml) = (d * f32::from(sc), dm * f32::from(m));
                let (mut sse, mut worst) = (0f32, 0f32);
                for &v in xs {
                    let qv = ((v + ml) * inv(dl)).round().clamp(0.0, f32::from(qmax));
                    let err = (dl * qv - ml - v).abs();
                    sse += err * err;
                    worst = worst.max(err);
                }
                let keeps_bound = worst <= limit || (sc, m) == (scales[g], mins[g]);
                if keeps_bound && sse < best.0 {
                    best = (sse, sc, m);
                }
            }
        }
        (scales[g], mins[g]) = (best.1, best.2);
        let (dl, ml) = (d * f32::from(scales[g]), dm * f32::from(mins[g]));
        for (q, &v) in q[g * group..(g + 1) * group].iter_mut().zip(xs) {
            *q = ((v + ml) * inv(dl)).round().clamp(0.0, f32::from(qmax)) as u8;
        }
    }
    let (d, dmin) = (f16::from_f32(d), f16::from_f32(dm));
    (d, dmin, scales, mins, q)
}

/// Symmetric super-block quantization shared by Q3_K and Q6_K: groups of 16, q in
/// -qneg..qneg, signed sub-scales in -sneg..sneg. Each group's largest-magnitude weight maps
/// to -qneg (as ggml's Q4_0), so that only the opposite end can clip, by at most one step.
fn quant_sym(x: &[f32], qneg: i32, sneg: i32) -> (f16, Vec<i32>, Vec<i32>) {
    let scale: Vec<f32> = x
        .chunks_exact(16)
        .map(|xs| super::signed_absmax(xs) / -(qneg as f32))
        .collect();
    let d = f16_up(super::signed_absmax(&scale) / -(sneg as f32));
    let id = inv(d.to_f32());
    let df = d.to_f32();
    // Per group (sum of squared errors, worst error, q) for sub-scale `sc`.
    let fit = |xs: &[f32], sc: i32| {
        let dl = df * sc as f32;
        let (mut sse, mut worst) = (0f32, 0f32);
        let q: Vec<i32> = xs
            .iter()
            .map(|&v| {
                let q = ((v * inv(dl)).round() as i32).clamp(-qneg, qneg - 1);
                let err = (dl * q as f32 - v).abs();
                sse += err * err;
                worst = worst.max(err);
                q
            })
            .collect();
        (sse, worst, q)
    };
    let mut sc = Vec::with_capacity(scale.len());
    let mut q = Vec::with_capacity(QK_K);
    for (xs, &s) in x.chunks_exact(16).zip(&scale) {
        // The rounded sub-scale, or a neighbour that fits the group better without a larger
        // worst error (so the documented bound holds).
        let s0 = ((s * id).round() as i32).clamp(-sneg, sneg - 1);
        let mut best = (s0, fit(xs, s0));
        for cand in [s0 - 1, s0 + 1] {
            if (-sneg..sneg).contains(&cand) && cand != 0 {
                let f = fit(xs, cand);
                if f.0 < best.1 .0 && f.1 <= best.1 .1 {
                    best = (cand, f);
                }
            }
        }
        sc.push(best.0);
        q.extend(best.1 .2);
    }
    (d, sc, q)
}

pub(super) fn quant_q2k(x: &[f32]) -> BlockQ2K {
    let (d, dmin, sc, m, q) = quant_asym(x, 16, 3, 15);
    let mut b = BlockQ2K {
        scales: [0; 16],
        qs: [0; 64],
        d,
        dmin,
    };
    for g in 0..16 {
        b.scales[g] = sc[g] | (m[g] << 4);
    }
    for (e, &q) in q.iter().enumerate() {
        let (n, j, l) = (e / 128, (e % 128) / 32, e % 32);
        b.qs[32 * n + l] |= q << (2 * j);
    }
    b
}

pub(super) fn quant_q3k(x: &[f32]) -> BlockQ3K {
    let (d, sc, q) = quant_sym(x, 4, 32);
    let mut stored = [0u8; 16];
    for (s, &v) in stored.iter_mut().zip(&sc) {
        *s = (v + 32) as u8;
    }
    let mut b = BlockQ3K {
        hmask: [0; 32],
        qs: [0; 64],
        scales: pack_scales_q3k(&stored),
        d,
    };
    for (e, &q) in q.iter().enumerate() {
        let u = (q + 4) as u8;
        let (n, j, l) = (e / 128, (e % 128) / 32, e % 32);
        b.qs[32 * n + l] |= (u & 3) << (2 * j);
        b.hmask[l] |= (u >> 2) << (e / 32);
    }
    b
}

fn pack_k4(sc: &[u8], m: &[u8]) -> [u8; 12] {
    let mut s8 = [0u8; 8];
    let mut m8 = [0u8; 8];
    s8.copy_from_slice(sc);
    m8.copy_from_slice(m);
    pack_scale_min_k4(&s8, &m8)
}

pub(super) fn quant_q4k(x: &[f32]) -> BlockQ4K {
    let (d, dmin, sc, m, q) = quant_asym(x, 32, 15, 63);
    let mut b = BlockQ4K {
        d,
        dmin,
        scales: pack_k4(&sc, &m),
        qs: [0; 128],
    };
    for (e, &q) in q.iter().enumerate() {
        let (c, h, l) = (e / 64, (e % 64) / 32, e % 32);
        b.qs[32 * c + l] |= q << (4 * h);
    }
    b
}

pub(super) fn quant_q5k(x: &[f32]) -> BlockQ5K {
    let (d, dmin, sc, m, q) = quant_asym(x, 32, 31, 63);
    let mut b = BlockQ5K {
        d,
        dmin,
        scales: pack_k4(&sc, &m),
        qh: [0; 32],
        qs: [0; 128],
    };
    for (e, &q) in q.iter().enumerate() {
        let (c, h, l) = (e / 64, (e % 64) / 32, e % 32);
        b.qs[32 * c + l] |= (q & 0xF) << (4 * h);
        b.qh[l] |= (q >> 4) << (e / 32);
    }
    b
}

pub(super) fn quant_q6k(x: &[f32]) -> BlockQ6K {
    let (d, sc, q) = quant_sym(x, 32, 128);
    let mut b = BlockQ6K {
        ql: [0; 128],
        qh: [0; 64],
        scales: [0; 16],
        d,
    };
    for (s, &v) in b.scales.iter_mut().zip(&sc) {
        *s = v as i8;
    }
    for (e, &q) in q.iter().enumerate() {
        let u = (q + 32) as u8;
        let (n, r) = (e / 128, e % 128);
        b.ql[64 * n + r % 64] |= (u & 0xF) << (4 * (r / 64));
        b.qh[32 * n + r % 32] |= (u >> 4) << (2 * (r / 32));
    }
    b
}

/// ggml's `quantize_row_q8_K_ref`: the largest-magnitude weight maps to -127.
pub(super) fn quant_q8k(x: &[f32]) -> BlockQ8K {
    let max = super::signed_absmax(x);
    let mut b = BlockQ8K {
        d: 0.0,
        qs: [0; QK_K],
        bsums: [0; 16],
    };
    if max == 0.0 {
        return b;
    }
    let iscale = -127.0 / max;
    for (q, &v) in b.qs.iter_mut().zip(x) {
        *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
    }
    for (g, s) in b.bsums.iter_mut().enumerate() {
        *s = b.qs[16 * g..16 * g + 16]
            .iter()
            .map(|&q| i16::from(q))
            .sum();
    }
    b.d = 1.0 / iscale;
    b
}
