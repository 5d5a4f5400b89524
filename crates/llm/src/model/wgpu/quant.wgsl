// GGUF weight blocks read from `wq` (binding 1: the bytes of whole rows of one matrix, padded
// to whole words plus one), as little-endian u32 words. Blocks are not 4-byte aligned in
// every format (Q4_0 18, Q5_0 22, Q8_0 34, Q3_K 110, Q6_K 210 bytes), so multi-byte fields
// go through `u32_at` (two loads and a funnel shift) or `u16_at`.
//
// Every format exposes `deq_<fmt>(a, s) -> array<f32, 32>`: the 32 values of unit `s` of the
// block starting at byte `a` (32-value formats have one unit per block, K-quants eight), by
// the same expressions as ferrite_gguf's reference dequantization.

@group(0) @binding(1) var<storage, read> wq: array<u32>;

fn u32_at(a: u32) -> u32 {
    let i = a >> 2u;
    let s = (a & 3u) * 8u;
    let lo = wq[i];
    if (s == 0u) {
        return lo;
    }
    return (lo >> s) | (wq[i + 1u] << (32u - s));
}

// `a` even.
fn u16_at(a: u32) -> u32 {
    return (wq[a >> 2u] >> ((a & 2u) * 8u)) & 0xffffu;
}

// The f16 with bits h, exactly (bit operations: unpack2x16float needs a capability that not
// every adapter has).
fn half(h: u32) -> f32 {
    let s = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 31u;
    let m = h & 1023u;
    if (e == 0u) {
        return bitcast<f32>(s | bitcast<u32>(f32(m) * 5.9604645e-8));
    }
    if (e == 31u) {
        return bitcast<f32>(s | 0x7f800000u | (m << 13u));
    }
    return bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
}

fn f16_at(a: u32) -> f32 {
    return half(u16_at(a));
}

fn byte_at(a: u32) -> u32 {
    return (wq[a >> 2u] >> ((a & 3u) * 8u)) & 0xffu;
}

// Byte k (0..4) of word w.
fn byte_of(w: u32, k: u32) -> u32 {
    return (w >> (8u * k)) & 0xffu;
}

fn deq_f32(a: u32, s: u32) -> array<f32, 32> {
    var y: array<f32, 32>;
    let i = a >> 2u;
    for (var j = 0u; j < 32u; j++) {
        y[j] = bitcast<f32>(wq[i + j]);
    }
    return y;
}

fn deq_f16(a: u32, s: u32) -> array<f32, 32> {
    var y: array<f32, 32>;
    for (var j = 0u; j < 16u; j++) {
        let w = u32_at(a + 4u * j);
        y[2u * j] = half(w & 0xffffu);
        y[2u * j + 1u] = half(w >> 16u);
    }
    return y;
}

fn deq_bf16(a: u32, s: u32) -> array<f32, 32> {
    var y: array<f32, 32>;
    for (var j = 0u; j < 16u; j++) {
        let w = u32_at(a + 4u * j);
        y[2u * j] = bitcast<f32>(w << 16u);
        y[2u * j + 1u] = bitcast<f32>(w & 0xffff0000u);
    }
    return y;
}

// Q4_0 (18 bytes): d, qs[16]; y[j] = d * (lo(qs[j]) - 8), y[j + 16] = d * (hi(qs[j]) - 8).
fn deq_q4_0(a: u32, s: u32) -> array<f32, 32> {
    var y: array<f32, 32>;
    let d = f16_at(a);
    for (var w = 0u; w < 4u; w++) {
        let q = u32_at(a + 2u + 4u * w);
        for (var k = 0u; k < 4u; k++) {
            let b = byte_of(q, k);
            y[4u * w + k] = d * (f32(b & 15u) - 8.0);
            y[4u * w + k + 16u] = d * (f32(b >> 4u) - 8.0);
        }
    }
    return y;
}

// Q4_1 (20 bytes): d, m, qs[16]; y = d * q + m.
fn deq_q4_1(a: u32, s: u32) -> array<f32, 32> {
    var y: array<f32, 32>;
    let d = f16_at(a);
    let m = f16_at(a + 2u);
    for (var w = 0u; w < 4u; w++) {
        let q = u32_at(a + 4u + 4u * w);
        for (var k = 0u; k < 4u; k++) {
            let b = byte_of(q, k);
            y[4u * w + k] = d * f32(b & 15u) + m;
            y[4u * w + k + 16u] = d * f32(b >> 4u) + m;
        }
    }
    return y;
}

// Q5_0 (22 bytes): d, qh (bit j: bit 4 of weight j), qs[16]; y = d * (q - 16).
fn deq_q5_0(a: u32, s: u32) -> array<f32, 32> {
    var y: array<f32, 32>;
    let d = f16_at(a);
    let qh = u32_at(a + 2u);
    for (var w = 0u; w < 4u; w++) {
        let q = u32_at(a + 6u + 4u * w);
        for (var k = 0u; k < 4u; k++) {
            let j = 4u * w + k;
            let b = byte_of(q, k);
            let q0 = (b & 15u) | (((qh >> j) & 1u) << 4u);
            let q1 = (b >> 4u) | (((qh >> (j + 16u)) & 1u) << 4u);
            y[j] = d * (f32(q0) - 16.0);
            y[j + 16u] = d * (f32(q1) - 16.0);
        }
    }
    return y;
}

// Q5_1 (24 bytes): d, m, qh, qs[16]; y = d * q + m.
fn deq_q5_1(a: u32, s: u32) -> array<f32, 32> {
    var y: array<f32, 32>;
    let d = f16_at(a);
    let m = f16_at(a + 2u);
    let qh = u32_at(a + 4u);
    for (var w = 0u; w < 4u; w++) {
        let q = u32_at(a + 8u + 4u * w);
        for (var k = 0u; k < 4u; k++) {
            let j = 4u * w + k;
            let b = byte_of(q, k);
            let q0 = (b & 15u) | (((qh >> j) & 1u) << 4u);
            let q1 = (b >> 4u) | (((qh >> (j + 16u)) & 1u) << 4u);
            y[j] = d * f32(q0) + m;
            y[j + 16u] = d * f32(q1) + m;
        }
    }
    return y;
}

// Q8_0 (34 bytes): d, qs[32] (i8); y = d * q.
fn deq_q8_0(a: u32, s: u32) -> array<f32, 32> {
    var y: array<f32, 32>;
    let d = f16_at(a);
    for (var w = 0u; w < 8u; w++) {
        let q = u32_at(a + 2u + 4u * w);
        for (var k = 0u; k < 4u; k++) {
            y[4u * w + k] = d * f32(bitcast<i32>(q << (24u - 8u * k)) >> 24u);
        }
    }
    return y;
}

// The 6-bit (scale, min) pair j of a Q4_K / Q5_K block whose 12 scale bytes start at `sa`.
fn scale_min_k4(j: u32, sa: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(byte_at(sa + j) & 63u, byte_at(sa + j + 4u) & 63u);
    }
    let sc = (byte_at(sa + j + 4u) & 15u) | ((byte_at(sa + j - 4u) >> 6u) << 4u);
    let m = (byte_at(sa + j + 4u) >> 4u) | ((byte_at(sa + j) >> 6u) << 4u);
    return vec2<u32>(sc, m);
}

// Q2_K (84 bytes): scales[16], qs[64], d, dmin. Unit s: weights 32s..32s+32.
fn deq_q2_k(a: u32, s: u32) -> array<f32, 32> {
    var y: array<f32, 32>;
    let d = f16_at(a + 80u);
    let dmin = f16_at(a + 82u);
    let n = s / 4u;
    let j = s % 4u;
    for (var h = 0u; h < 2u; h++) {
        let sc = byte_at(a + 2u * s + h);
        let dl = d * f32(sc & 15u);
        let ml = dmin * f32(sc >> 4u);
        for (var w = 0u; w < 4u; w++) {
            let q = u32_at(a + 16u + 32u * n + 16u * h + 4u * w);
            for (var k = 0u; k < 4u; k++) {
                let v = (byte_of(q, k) >> (2u * j)) & 3u;
                y[16u * h + 4u * w + k] = dl * f32(v) - ml;
            }
        }
    }
    return y;
}

// Q3_K (110 bytes): hmask[32], qs[64], scales[12] (16 packed 6-bit), d.
fn deq_q3_k(a: u32, s: u32) -> array<f32, 32> {
    var y: array<f32, 32>;
    let d = f16_at(a + 108u);
    let n = s / 4u;
    let j = s % 4u;
    for (var h = 0u; h < 2u; h++) {
        let i = 2u * s + h;
        let lo = (byte_at(a + 96u + i % 8u) >> (4u * (i / 8u))) & 15u;
        let hi = (byte_at(a + 96u + 8u + i % 4u) >> (2u * (i / 4u))) & 3u;
        let dl = d * f32(i32(lo | (hi << 4u)) - 32);
        for (var w = 0u; w < 4u; w++) {
            let q = u32_at(a + 32u + 32u * n + 16u * h + 4u * w);
            let hm = u32_at(a + 16u * h + 4u * w);
            for (var k = 0u; k < 4u; k++) {
                let low = i32((byte_of(q, k) >> (2u * j)) & 3u);
                let high = (byte_of(hm, k) >> s) & 1u;
                let v = select(low - 4, low, high == 1u);
                y[16u * h + 4u * w + k] = dl * f32(v);
            }
        }
    }
    return y;
}

// Q4_K (144 bytes): d, dmin, scales[12], qs[128]; weight 64c + 32h + l is nibble h of
// qs[32c + l]; unit s = 2c + h.
fn deq_q4_k(a: u32, s: u32) -> array<f32, 32> {
    var y: array<f32, 32>;
    let d = f16_at(a);
    let dmin = f16_at(a + 2u);
    let sm = scale_min_k4(s, a + 4u);
    let d1 = d * f32(sm.x);
    let m1 = dmin * f32(sm.y);
    let c = s / 2u;
    let h = s % 2u;
    for (var w = 0u; w < 8u; w++) {
        let q = u32_at(a + 16u + 32u * c + 4u * w);
        for (var k = 0u; k < 4u; k++) {
            let v = (byte_of(q, k) >> (4u * h)) & 15u;
            y[4u * w + k] = d1 * f32(v) - m1;
        }
    }
    return y;
}

// Q5_K (176 bytes): Q4_K plus qh[32] (bit s of qh[l]: bit 4 of weight 32s + l) before qs.
fn deq_q5_k(a: u32, s: u32) -> array<f32, 32> {
    var y: array<f32, 32>;
    let d = f16_at(a);
    let dmin = f16_at(a + 2u);
    let sm = scale_min_k4(s, a + 4u);
    let d1 = d * f32(sm.x);
    let m1 = dmin * f32(sm.y);
    let c = s / 2u;
    let h = s % 2u;
    for (var w = 0u; w < 8u; w++) {
        let q = u32_at(a + 48u + 32u * c + 4u * w);
        let qh = u32_at(a + 16u + 4u * w);
        for (var k = 0u; k < 4u; k++) {
            let v = ((byte_of(q, k) >> (4u * h)) & 15u) | (((byte_of(qh, k) >> s) & 1u) << 4u);
            y[4u * w + k] = d1 * f32(v) - m1;
        }
    }
    return y;
}

// Q6_K (210 bytes): ql[128], qh[64], scales[16] (i8), d; weight e = 32s + l:
// n = s / 4, r = e % 128: low = nibble (r / 64) of ql[64n + r % 64],
// high = bits 2(r / 32).. of qh[32n + l], y = d * scales[e / 16] * (low | high << 4 - 32).
fn deq_q6_k(a: u32, s: u32) -> array<f32, 32> {
    var y: array<f32, 32>;
    let d = f16_at(a + 208u);
    let n = s / 4u;
    let r = s % 4u;
    for (var h = 0u; h < 2u; h++) {
        let sb = byte_at(a + 192u + 2u * s + h);
        let sc = f32(bitcast<i32>(sb << 24u) >> 24u);
        for (var w = 0u; w < 4u; w++) {
            let l0 = 16u * h + 4u * w;
            let ql = u32_at(a + 64u * n + 32u * (r % 2u) + l0);
            let qh = u32_at(a + 128u + 32u * n + l0);
            for (var k = 0u; k < 4u; k++) {
                let low = (byte_of(ql, k) >> (4u * (r / 2u))) & 15u;
                let high = (byte_of(qh, k) >> (2u * r)) & 3u;
                let q = i32(low | (high << 4u)) - 32;
                y[l0 + k] = d * sc * f32(q);
            }
        }
    }
    return y;
}
