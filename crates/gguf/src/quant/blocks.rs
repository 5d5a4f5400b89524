//! Block layouts, field for field as ggml's `ggml-common.h` (`#[repr(C)]`, little-endian in
//! files). `read` takes exactly one block's bytes (`ty.type_size()`); `write` appends one.

use half::f16;

use crate::types::QK_K;

fn f16_at(b: &[u8], i: usize) -> f16 {
    f16::from_le_bytes([b[i], b[i + 1]])
}

fn arr<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// Q4_0: 32 weights, `y = d * (q - 8)`; qs[j] holds weight j (low nibble) and j+16 (high).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; 16],
}

/// Q4_1: 32 weights, `y = d * q + m`; nibbles as Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; 16],
}

/// Q5_0: 32 weights, `y = d * (q - 16)`; low 4 bits as Q4_0, bit 4 of weight j is bit j of qh.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

/// Q5_1: 32 weights, `y = d * q + m`; bits as Q5_0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; 16],
}

/// Q8_0: 32 weights, `y = d * q`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; 32],
}

/// Q8_1: 32 weights, `y = d * q`; `s = d * sum(q)` (used by dot products).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; 32],
}

/// Q2_K: 256 weights in 16 groups of 16; `y = d * (scales[g] & 15) * q - dmin * (scales[g] >> 4)`,
/// q (2 bits) of weight 128n + 32j + l is bits 2j..2j+2 of qs[32n + l].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: f16,
    pub dmin: f16,
}

/// Q3_K: 256 weights in 16 groups of 16; `y = d * (s6[g] - 32) * (q - 4 * !hbit)`; the 6-bit
/// scales are packed in 12 bytes (low nibbles in bytes 0..8, high pairs in bytes 8..12).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: f16,
}

/// Q4_K: 256 weights in 8 groups of 32; `y = d * sc[g] * q - dmin * m[g]`, 6-bit sc/m packed
/// in 12 bytes; q of weight 64c + 32h + l is nibble h of qs[32c + l].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}

/// Q5_K: Q4_K plus bit 4 of weight 32g + l in bit g of qh[l].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// Q6_K: 256 weights in 16 groups of 16; `y = d * scales[g] * (q - 32)`, q = 4 low bits from
/// ql and 2 high bits from qh.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}

/// Q8_K: 256 weights, `y = d * q` (d is f32); bsums[g] = sum of q over group g of 16.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

const _: () = {
    assert!(std::mem::size_of::<BlockQ4_0>() == 18);
    assert!(std::mem::size_of::<BlockQ4_1>() == 20);
    assert!(std::mem::size_of::<BlockQ5_0>() == 22);
    assert!(std::mem::size_of::<BlockQ5_1>() == 24);
    assert!(std::mem::size_of::<BlockQ8_0>() == 34);
    assert!(std::mem::size_of::<BlockQ8_1>() == 36);
    assert!(std::mem::size_of::<BlockQ2K>() == 84);
    assert!(std::mem::size_of::<BlockQ3K>() == 110);
    assert!(std::mem::size_of::<BlockQ4K>() == 144);
    assert!(std::mem::size_of::<BlockQ5K>() == 176);
    assert!(std::mem::size_of::<BlockQ6K>() == 210);
    assert!(std::mem::size_of::<BlockQ8K>() == 292);
};

fn i8s<const N: usize>(b: &[u8], at: usize) -> [i8; N] {
    arr::<N>(b, at).map(|v| v as i8)
}

fn put_f16(out: &mut Vec<u8>, v: f16) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_i8s(out: &mut Vec<u8>, v: &[i8]) {
    out.extend(v.iter().map(|&x| x as u8));
}

impl BlockQ4_0 {
    pub fn read(b: &[u8]) -> Self {
        Self {
            d: f16_at(b, 0),
            qs: arr(b, 2),
        }
    }
    pub fn write(&self, out: &mut Vec<u8>) {
        put_f16(out, self.d);
        out.extend_from_slice(&self.qs);
    }
}

impl BlockQ4_1 {
    pub fn read(b: &[u8]) -> Self {
        Self {
            d: f16_at(b, 0),
            m: f16_at(b, 2),
            qs: arr(b, 4),
        }
    }
    pub fn write(&self, out: &mut Vec<u8>) {
        put_f16(out, self.d);
        put_f16(out, self.m);
        out.extend_from_slice(&self.qs);
    }
}

impl BlockQ5_0 {
    pub fn read(b: &[u8]) -> Self {
        Self {
            d: f16_at(b, 0),
            qh: arr(b, 2),
            qs: arr(b, 6),
        }
    }
    pub fn write(&self, out: &mut Vec<u8>) {
        put_f16(out, self.d);
        out.extend_from_slice(&self.qh);
        out.extend_from_slice(&self.qs);
    }
}

impl BlockQ5_1 {
    pub fn read(b: &[u8]) -> Self {
        Self {
            d: f16_at(b, 0),
            m: f16_at(b, 2),
            qh: arr(b, 4),
            qs: arr(b, 8),
        }
    }
    pub fn write(&self, out: &mut Vec<u8>) {
        put_f16(out, self.d);
        put_f16(out, self.m);
        out.extend_from_slice(&self.qh);
        out.extend_from_slice(&self.qs);
    }
}

impl BlockQ8_0 {
    pub fn read(b: &[u8]) -> Self {
        Self {
            d: f16_at(b, 0),
            qs: i8s(b, 2),
        }
    }
    pub fn write(&self, out: &mut Vec<u8>) {
        put_f16(out, self.d);
        put_i8s(out, &self.qs);
    }
}

impl BlockQ8_1 {
    pub fn read(b: &[u8]) -> Self {
        Self {
            d: f16_at(b, 0),
            s: f16_at(b, 2),
            qs: i8s(b, 4),
        }
    }
    pub fn write(&self, out: &mut Vec<u8>) {
        put_f16(out, self.d);
        put_f16(out, self.s);
        put_i8s(out, &self.qs);
    }
}

impl BlockQ2K {
    pub fn read(b: &[u8]) -> Self {
        Self {
            scales: arr(b, 0),
            qs: arr(b, 16),
            d: f16_at(b, 80),
            dmin: f16_at(b, 82),
        }
    }
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.scales);
        out.extend_from_slice(&self.qs);
        put_f16(out, self.d);
        put_f16(out, self.dmin);
    }
}

impl BlockQ3K {
    pub fn read(b: &[u8]) -> Self {
        Self {
            hmask: arr(b, 0),
            qs: arr(b, 32),
            scales: arr(b, 96),
            d: f16_at(b, 108),
        }
    }
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.hmask);
        out.extend_from_slice(&self.qs);
        out.extend_from_slice(&self.scales);
        put_f16(out, self.d);
    }
}

impl BlockQ4K {
    pub fn read(b: &[u8]) -> Self {
        Self {
            d: f16_at(b, 0),
            dmin: f16_at(b, 2),
            scales: arr(b, 4),
            qs: arr(b, 16),
        }
    }
    pub fn write(&self, out: &mut Vec<u8>) {
        put_f16(out, self.d);
        put_f16(out, self.dmin);
        out.extend_from_slice(&self.scales);
        out.extend_from_slice(&self.qs);
    }
}

impl BlockQ5K {
    pub fn read(b: &[u8]) -> Self {
        Self {
            d: f16_at(b, 0),
            dmin: f16_at(b, 2),
            scales: arr(b, 4),
            qh: arr(b, 16),
            qs: arr(b, 48),
        }
    }
    pub fn write(&self, out: &mut Vec<u8>) {
        put_f16(out, self.d);
        put_f16(out, self.dmin);
        out.extend_from_slice(&self.scales);
        out.extend_from_slice(&self.qh);
        out.extend_from_slice(&self.qs);
    }
}

impl BlockQ6K {
    pub fn read(b: &[u8]) -> Self {
        Self {
            ql: arr(b, 0),
            qh: arr(b, 128),
            scales: i8s(b, 192),
            d: f16_at(b, 208),
        }
    }
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.ql);
        out.extend_from_slice(&self.qh);
        put_i8s(out, &self.scales);
        put_f16(out, self.d);
    }
}

impl BlockQ8K {
    pub fn read(b: &[u8]) -> Self {
        let mut bsums = [0i16; QK_K / 16];
        for (i, s) in bsums.iter_mut().enumerate() {
            *s = i16::from_le_bytes([b[260 + 2 * i], b[261 + 2 * i]]);
        }
        Self {
            d: f32::from_le_bytes(arr(b, 0)),
            qs: i8s(b, 4),
            bsums,
        }
    }
    pub fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_le_bytes());
        put_i8s(out, &self.qs);
        for s in self.bsums {
            out.extend_from_slice(&s.to_le_bytes());
        }
    }
}

/// Unpacks the 6-bit (scale, min) pair of group `j` (0..8) of Q4_K/Q5_K.
pub fn scale_min_k4(j: usize, s: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// Packs 8 (scale, min) pairs of 6 bits each; the inverse of `scale_min_k4`.
pub fn pack_scale_min_k4(sc: &[u8; 8], m: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..4 {
        s[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6);
        s[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6);
        s[j + 8] = (sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4);
    }
    s
}

/// Unpacks the 16 signed 6-bit scales of Q3_K (as stored, 0..64; subtract 32).
pub fn scales_q3k(s: &[u8; 12]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low = (s[i % 8] >> (4 * (i / 8))) & 0xF;
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = low | (high << 4);
    }
    out
}

/// Packs 16 6-bit values (0..64); the inverse of `scales_q3k`.
pub fn pack_scales_q3k(v: &[u8; 16]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for (i, &x) in v.iter().enumerate() {
        s[i % 8] |= (x & 0xF) << (4 * (i / 8));
        s[8 + i % 4] |= ((x >> 4) & 3) << (2 * (i / 4));
    }
    s
}
