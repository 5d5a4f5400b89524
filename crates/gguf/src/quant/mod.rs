//! Reference dequantization (block bytes -> f32) and quantization (f32 -> block bytes) for
//! F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K.
//!
//! Dequantization evaluates the same f32 expressions in the same order as ggml and PyPI
//! `gguf` (`gguf.quants.dequantize`), so results are bit-identical to both.
//! Quantization of Q4_0..Q8_0 is ggml's `quantize_row_*_ref` (bit-identical to PyPI `gguf`);
//! Q8_1 and Q8_K follow ggml's reference too. The K-quants (Q2_K..Q6_K) use a simpler
//! reference than ggml's iterative search. Q2_K/Q4_K/Q5_K: per group a range-covering scale
//! and min, rounded up to the 4/6-bit sub-scales so nothing clips. Q3_K/Q6_K: per group the
//! largest-magnitude weight maps to the most negative level (as Q4_0), sub-scales rounded to
//! nearest. Then each group takes the neighbouring sub-scale of least squared error that keeps
//! its worst error within the first choice's bound. `max_error_bound` states it per format.

mod blocks;
mod kquants;

pub use blocks::*;

use half::{bf16, f16};

use crate::error::{Error, Result};
use crate::types::GgmlType;

fn unsupported(op: &'static str, ty: GgmlType) -> Error {
    Error::UnsupportedType { op, ty: ty.name() }
}

/// Number of bytes `n_elements` values of `ty` take, or an error naming `op`.
pub fn row_bytes(op: &'static str, ty: GgmlType, n_elements: usize) -> Result<usize> {
    let bs = ty.block_size();
    if !n_elements.is_multiple_of(bs) {
        return Err(Error::Length {
            op,
            what: format!("{n_elements} elements is not a multiple of the {ty} block size {bs}"),
        });
    }
    (n_elements / bs)
        .checked_mul(ty.type_size())
        .ok_or_else(|| Error::Length {
            op,
            what: format!("{n_elements} {ty} elements overflow"),
        })
}

/// Dequantizes `bytes` (whole blocks of `ty`) into `out`, which must hold exactly the number
/// of values the bytes encode.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<()> {
    const OP: &str = "dequantize";
    if !ty.is_supported() {
        return Err(unsupported(OP, ty));
    }
    let need = row_bytes(OP, ty, out.len())?;
    if bytes.len() != need {
        return Err(Error::Length {
            op: OP,
            what: format!(
                "{} values of {ty} need {need} bytes, got {} bytes",
                out.len(),
                bytes.len()
            ),
        });
    }
    let bs = ty.block_size();
    let blocks = bytes
        .chunks_exact(ty.type_size())
        .zip(out.chunks_exact_mut(bs));
    match ty {
        GgmlType::F32 => {
            for (b, y) in blocks {
                y[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (b, y) in blocks {
                y[0] = f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::BF16 => {
            for (b, y) in blocks {
                y[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::Q4_0 => blocks.for_each(|(b, y)| dequant_q4_0(&BlockQ4_0::read(b), y)),
        GgmlType::Q4_1 => blocks.for_each(|(b, y)| dequant_q4_1(&BlockQ4_1::read(b), y)),
        GgmlType::Q5_0 => blocks.for_each(|(b, y)| dequant_q5_0(&BlockQ5_0::read(b), y)),
        GgmlType::Q5_1 => blocks.for_each(|(b, y)| dequant_q5_1(&BlockQ5_1::read(b), y)),
        GgmlType::Q8_0 => blocks.for_each(|(b, y)| {
            let blk = BlockQ8_0::read(b);
            let d = blk.d.to_f32();
            for (y, &q) in y.iter_mut().zip(&blk.qs) {
                *y = f32::from(q) * d;
            }
        }),
        GgmlType::Q8_1 => blocks.for_each(|(b, y)| {
            let blk = BlockQ8_1::read(b);
            let d = blk.d.to_f32();
            for (y, &q) in y.iter_mut().zip(&blk.qs) {
                *y = f32::from(q) * d;
            }
        }),
        GgmlType::Q2_K => blocks.for_each(|(b, y)| kquants::dequant_q2k(&BlockQ2K::read(b), y)),
        GgmlType::Q3_K => blocks.for_each(|(b, y)| kquants::dequant_q3k(&BlockQ3K::read(b), y)),
        GgmlType::Q4_K => blocks.for_each(|(b, y)| kquants::dequant_q4k(&BlockQ4K::read(b), y)),
        GgmlType::Q5_K => blocks.for_each(|(b, y)| kquants::dequant_q5k(&BlockQ5K::read(b), y)),
        GgmlType::Q6_K => blocks.for_each(|(b, y)| kquants::dequant_q6k(&BlockQ6K::read(b), y)),
        GgmlType::Q8_K => blocks.for_each(|(b, y)| {
            let blk = BlockQ8K::read(b);
            for (y, &q) in y.iter_mut().zip(&blk.qs) {
                *y = blk.d * f32::from(q);
            }
        }),
        _ => return Err(unsupported(OP, ty)),
    }
    Ok(())
}

/// Dequantizes into a new vector; `bytes` must be whole blocks.
pub fn dequantize_to_vec(ty: GgmlType, bytes: &[u8]) -> Result<Vec<f32>> {
    if !ty.is_supported() {
        return Err(unsupported("dequantize", ty));
    }
    if !bytes.len().is_multiple_of(ty.type_size()) {
        return Err(Error::Length {
            op: "dequantize",
            what: format!("{} bytes is not a whole number of {ty} blocks", bytes.len()),
        });
    }
    let mut out = vec![0f32; bytes.len() / ty.type_size() * ty.block_size()];
    dequantize(ty, bytes, &mut out)?;
    Ok(out)
}

fn dequant_q4_0(b: &BlockQ4_0, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (j, &q) in b.qs.iter().enumerate() {
        y[j] = d * f32::from((q & 0xF) as i8 - 8);
        y[j + 16] = d * f32::from((q >> 4) as i8 - 8);
    }
}

fn dequant_q4_1(b: &BlockQ4_1, y: &mut [f32]) {
    let (d, m) = (b.d.to_f32(), b.m.to_f32());
    for (j, &q) in b.qs.iter().enumerate() {
        y[j] = d * f32::from(q & 0xF) + m;
        y[j + 16] = d * f32::from(q >> 4) + m;
    }
}

/// The 5-bit values of a Q5 block (0..32).
fn q5_values(qh: [u8; 4], qs: &[u8; 16]) -> [u8; 32] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; 32];
    for (j, &b) in qs.iter().enumerate() {
        q[j] = (b & 0xF) | ((((qh >> j) & 1) as u8) << 4);
        q[j + 16] = (b >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
    }
    q
}

fn dequant_q5_0(b: &BlockQ5_0, y: &mut [f32]) {
    let d = b.d.to_f32();
    for (y, q) in y.iter_mut().zip(q5_values(b.qh, &b.qs)) {
        *y = d * f32::from(q as i8 - 16);
    }
}

fn dequant_q5_1(b: &BlockQ5_1, y: &mut [f32]) {
    let (d, m) = (b.d.to_f32(), b.m.to_f32());
    for (y, q) in y.iter_mut().zip(q5_values(b.qh, &b.qs)) {
        *y = d * f32::from(q) + m;
    }
}

/// Quantizes `src` (a whole number of `ty` blocks) and appends the bytes to `out`.
/// Block formats reject non-finite values and scales that overflow f16.
pub fn quantize(ty: GgmlType, src: &[f32], out: &mut Vec<u8>) -> Result<()> {
    const OP: &str = "quantize";
    if !ty.is_supported() {
        return Err(unsupported(OP, ty));
    }
    let need = row_bytes(OP, ty, src.len())?;
    if ty.is_quantized() {
        if let Some(i) = src.iter().position(|x| !x.is_finite()) {
            return Err(Error::Length {
                op: OP,
                what: format!("{ty}: value {} at index {i} is not finite", src[i]),
            });
        }
    }
    out.reserve(need);
    let start = out.len();
    let blocks = src.chunks_exact(ty.block_size());
    match ty {
        GgmlType::F32 => src
            .iter()
            .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        GgmlType::F16 => src
            .iter()
            .for_each(|&x| out.extend_from_slice(&f16::from_f32(x).to_le_bytes())),
        GgmlType::BF16 => src
            .iter()
            .for_each(|&x| out.extend_from_slice(&f32_to_bf16(x))),
        GgmlType::Q4_0 => blocks.for_each(|x| quant_q4_0(x).write(out)),
        GgmlType::Q4_1 => blocks.for_each(|x| quant_q4_1(x).write(out)),
        GgmlType::Q5_0 => blocks.for_each(|x| quant_q5_0(x).write(out)),
        GgmlType::Q5_1 => blocks.for_each(|x| quant_q5_1(x).write(out)),
        GgmlType::Q8_0 => blocks.for_each(|x| {
            let (d, qs) = quant_q8(x);
            BlockQ8_0 {
                d: f16::from_f32(d),
                qs,
            }
            .write(out)
        }),
        GgmlType::Q8_1 => blocks.for_each(|x| {
            let (d, qs) = quant_q8(x);
            let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
            BlockQ8_1 {
                d: f16::from_f32(d),
                s: f16::from_f32(sum as f32 * d),
                qs,
            }
            .write(out)
        }),
        GgmlType::Q2_K => blocks.for_each(|x| kquants::quant_q2k(x).write(out)),
        GgmlType::Q3_K => blocks.for_each(|x| kquants::quant_q3k(x).write(out)),
        GgmlType::Q4_K => blocks.for_each(|x| kquants::quant_q4k(x).write(out)),
        GgmlType::Q5_K => blocks.for_each(|x| kquants::quant_q5k(x).write(out)),
        GgmlType::Q6_K => blocks.for_each(|x| kquants::quant_q6k(x).write(out)),
        GgmlType::Q8_K => blocks.for_each(|x| kquants::quant_q8k(x).write(out)),
        _ => return Err(unsupported(OP, ty)),
    }
    debug_assert_eq!(out.len() - start, need);
    if ty.is_quantized() {
        check_scales_finite(ty, &out[start..])?;
    }
    Ok(())
}

/// Quantizes into a new vector.
pub fn quantize_to_vec(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    quantize(ty, src, &mut out)?;
    Ok(out)
}

/// Rejects a quantization whose f16 scales overflowed (inputs beyond about 65504 x levels).
fn check_scales_finite(ty: GgmlType, bytes: &[u8]) -> Result<()> {
    let mut y = vec![0f32; ty.block_size()];
    for (i, b) in bytes.chunks_exact(ty.type_size()).enumerate() {
        dequantize(ty, b, &mut y)?;
        if y.iter().any(|v| !v.is_finite()) {
            return Err(Error::Length {
                op: "quantize",
                what: format!("{ty}: block {i} has values too large for its f16 scales"),
            });
        }
    }
    Ok(())
}

/// f32 -> bf16 bytes as ggml's `ggml_compute_fp32_to_bf16`: NaN made quiet, round to nearest
/// even.
fn f32_to_bf16(x: f32) -> [u8; 2] {
    let n = x.to_bits();
    let h = if n & 0x7fff_ffff > 0x7f80_0000 {
        ((n >> 16) | 64) as u16
    } else {
        ((u64::from(n) + (0x7fff + u64::from((n >> 16) & 1))) >> 16) as u16
    };
    h.to_le_bytes()
}

/// The value of largest magnitude (the first one on ties), with its sign.
fn signed_absmax(x: &[f32]) -> f32 {
    let mut best = 0f32;
    for &v in x {
        if v.abs() > best.abs() {
            best = v;
        }
    }
    best
}

fn inv(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

fn quant_q4_0(x: &[f32]) -> BlockQ4_0 {
    let d = signed_absmax(x) / -8.0;
    let id = inv(d);
    let q = |v: f32| ((v * id + 8.5) as u8).min(15);
    let mut qs = [0u8; 16];
    for (j, b) in qs.iter_mut().enumerate() {
        *b = q(x[j]) | (q(x[j + 16]) << 4);
    }
    BlockQ4_0 {
        d: f16::from_f32(d),
        qs,
    }
}

fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        })
}

fn quant_q4_1(x: &[f32]) -> BlockQ4_1 {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = inv(d);
    let q = |v: f32| (((v - min) * id + 0.5) as u8).min(15);
    let mut qs = [0u8; 16];
    for (j, b) in qs.iter_mut().enumerate() {
        *b = q(x[j]) | (q(x[j + 16]) << 4);
    }
    BlockQ4_1 {
        d: f16::from_f32(d),
        m: f16::from_f32(min),
        qs,
    }
}

/// Packs 32 5-bit values into (qh, qs).
fn pack_q5(q: &[u8; 32]) -> ([u8; 4], [u8; 16]) {
    let mut qs = [0u8; 16];
    let mut qh = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0xF) | ((q[j + 16] & 0xF) << 4);
        qh |= u32::from(q[j] >> 4) << j;
        qh |= u32::from(q[j + 16] >> 4) << (j + 16);
    }
    (qh.to_le_bytes(), qs)
}

fn quant_q5_0(x: &[f32]) -> BlockQ5_0 {
    let d = signed_absmax(x) / -16.0;
    let id = inv(d);
    let mut q = [0u8; 32];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = ((v * id + 16.5) as u8).min(31);
    }
    let (qh, qs) = pack_q5(&q);
    BlockQ5_0 {
        d: f16::from_f32(d),
        qh,
        qs,
    }
}

fn quant_q5_1(x: &[f32]) -> BlockQ5_1 {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = inv(d);
    let mut q = [0u8; 32];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (((v - min) * id + 0.5) as u8).min(31);
    }
    let (qh, qs) = pack_q5(&q);
    BlockQ5_1 {
        d: f16::from_f32(d),
        m: f16::from_f32(min),
        qh,
        qs,
    }
}

/// Q8_0/Q8_1 reference: d = amax / 127, q = round-half-away(x / d).
fn quant_q8(x: &[f32]) -> (f32, [i8; 32]) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = inv(d);
    let mut qs = [0i8; 32];
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
    (d, qs)
}

/// An upper bound on `|x[i] - dequantize(quantize(x))[i]|` over one block `x` of `ty`
/// (any length for F32/F16/BF16), asserted by the tests. With `amax` the largest magnitude,
/// `range` = max - min, and `s = amax / 512 + 2^-17` for the rounding of f16 scales (the
/// absolute term covers subnormal f16 scales, spaced 2^-24, times up to 128 levels):
/// - Q4_0, Q5_0: `amax / 8`, `amax / 16` (one step at the end opposite the extreme) + s;
/// - Q8_0, Q8_1, Q8_K: `amax / 254` (half a step) + s;
/// - Q4_1, Q5_1: `range / 30`, `range / 62` + s;
/// - Q2_K, Q4_K, Q5_K (q levels `qmax` = 3, 15, 31; sub-scales up to `smax` = 15, 63, 63):
///   `(range0 + amax / smax) / (2 qmax) * (1 + 1 / smax)` + s, where `range0` is the range
///   widened to include 0 (their mins are offsets below 0);
/// - Q3_K, Q6_K (q from `-qneg`, sub-scales from `-sneg`: 4, 32 and 32, 128):
///   `amax / qneg + amax / sneg` + s;
/// - F16: `amax / 2048 + 2^-25`; BF16: `amax / 256`; F32: 0.
pub fn max_error_bound(ty: GgmlType, x: &[f32]) -> f32 {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let (lo, hi) = if x.is_empty() { (0.0, 0.0) } else { min_max(x) };
    let range = hi - lo;
    let s = amax / 512.0 + f32::powi(2.0, -17);
    let range0 = hi.max(0.0) - lo.min(0.0);
    let asym =
        |qmax: f32, smax: f32| (range0 + amax / smax) / (2.0 * qmax) * (1.0 + 1.0 / smax) + s;
    match ty {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => amax / 2048.0 + f32::powi(2.0, -25),
        GgmlType::BF16 => amax / 256.0,
        GgmlType::Q4_0 => amax / 8.0 + s,
        GgmlType::Q5_0 => amax / 16.0 + s,
        GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Q8_K => amax / 254.0 + s,
        GgmlType::Q4_1 => range / 30.0 + s,
        GgmlType::Q5_1 => range / 62.0 + s,
        GgmlType::Q2_K => asym(3.0, 15.0),
        GgmlType::Q4_K => asym(15.0, 63.0),
        GgmlType::Q5_K => asym(31.0, 63.0),
        GgmlType::Q3_K => amax / 4.0 + amax / 32.0 + s,
        GgmlType::Q6_K => amax / 32.0 + amax / 128.0 + s,
        _ => f32::INFINITY,
    }
}
