// GGUF weight blocks read from `wq` (binding 1: the bytes of whole rows of one matrix, padded
// to whole words plus one), as little-endian u32 words. Blocks are not 4-byte aligned in
// every format (Q4_0 18, Q5_0 22, Q8_0 34, Q3_K 110, Q6_K 210 bytes), so multi-byte fields
// go through `u32_at` (two loads and a funnel shift) or `u16_at`.
//
// Every format exposes `head_<fmt>(a, s) -> Head` and `pair_<fmt>(a, s, h, w) -> Pair`: for
// unit `s` of the block starting at byte `a` (32-value formats have one unit per block,
// K-quants eight), pair w (0..4) holds the quantized values q of 4w..4w+4 (`lo`) and
// 16+4w..16+4w+4 (`hi`) as floats, offset included, and the head what the unit's pairs share:
// value = d.x * lo + m.x (first 16 values), d.y * hi + m.y (last 16), by the same expressions
// as ferrite_gguf's reference dequantization. A product applies d and m once per pair and
// row (`MINS`, prepended per format, says whether m can be non-zero). A pair is one or two
// word loads and vector bit operations: small integers become floats through the exponent
// bits (`uf`), not conversion instructions, and there are no per-value arrays (which shader
// compilers may keep in local memory).
//
// The formats with 8-bit products (those of the CPU's and CUDA's q8 mode: Q4_0, Q4_1, Q5_0,
// Q5_1, Q8_0, Q4_K, Q6_K) also expose `ipair_<fmt>(a, s, h, w) -> vec2<u32>`: the same eight
// values (offset included) as two words of four signed bytes, for `dot4I8Packed` (Q8 of
// matvec.wgsl).

@group(0) @binding(1) var<storage, read> wq: array<u32>;

// Branch-free (both words are always read: the padding word makes that safe), so a
// product's loads of several units can be issued together.
fn u32_at(a: u32) -> u32 {
    let i = a >> 2u;
    let s = (a & 3u) * 8u;
    let lo = wq[i];
    let hi = wq[i + 1u];
    return select((lo >> s) | (hi << (32u - s)), lo, s == 0u);
}

// `a` even.
fn u16_at(a: u32) -> u32 {
    return (wq[a >> 2u] >> ((a & 2u) * 8u)) & 0xffffu;
}

// The f16 with bits h, exactly. `matvec_source` (qmatrix.rs) makes this
// `unpack2x16float(h).x` (one instruction where the bit operations below are a dozen) on
// adapters with that capability (`DownlevelFlags::SHADER_F16_IN_F32`; Mesa's Vulkan drivers
// lack it without `shader-f16`).
fn half(h: u32) -> f32 {
    return half_bits(h);
}

fn half_bits(h: u32) -> f32 {
    let s = (h & 0x8000u) << 16u;
    let e = (h >> 10u) & 31u;
    let m = h & 1023u;
    let sub = bitcast<f32>(s | bitcast<u32>(uf1(m) * 5.9604645e-8));
    let special = bitcast<f32>(s | 0x7f800000u | (m << 13u));
    let normal = bitcast<f32>(s | ((e + 112u) << 23u) | (m << 13u));
    return select(select(normal, special, e == 31u), sub, e == 0u);
}

fn f16_at(a: u32) -> f32 {
    return half(u16_at(a));
}

fn byte_at(a: u32) -> u32 {
    return (wq[a >> 2u] >> ((a & 3u) * 8u)) & 0xffu;
}

// What the four pairs of a unit share: scales (and mins) of values 0..16 (.x) and 16..32 (.y),
// and one format-specific word.
struct Head {
    d: vec2<f32>,
    m: vec2<f32>,
    aux: u32,
}

// Values 4w..4w+4 and 16+4w..16+4w+4 of a unit.
struct Pair {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

const SH8: vec4<u32> = vec4<u32>(0u, 8u, 16u, 24u);

// Unsigned integers below 2^23 as floats, minus `off`, exactly: the integer is the mantissa of
// 2^23 + v (its exponent bits or-ed in), from which 2^23 + off is subtracted.
fn uf(v: vec4<u32>, off: f32) -> vec4<f32> {
    return bitcast<vec4<f32>>(v | vec4<u32>(0x4b000000u)) - (8388608.0 + off);
}

fn uf1(v: u32) -> f32 {
    return bitcast<f32>(v | 0x4b000000u) - 8388608.0;
}

// The four bytes of q, low byte first.
fn bytes4(q: u32) -> vec4<u32> {
    return (vec4<u32>(q) >> SH8) & vec4<u32>(255u);
}

// The four bytes of q as signed values (the sign bit flipped makes them v + 128).
fn sbytes4(q: u32) -> vec4<f32> {
    return uf(bytes4(q ^ 0x80808080u), 128.0);
}

fn no_head() -> Head {
    return Head(vec2<f32>(1.0), vec2<f32>(0.0), 0u);
}

fn head_f32(a: u32, s: u32) -> Head {
    return no_head();
}

fn pair_f32(a: u32, s: u32, h: Head, w: u32) -> Pair {
    let i = (a >> 2u) + 4u * w;
    let lo = vec4<u32>(wq[i], wq[i + 1u], wq[i + 2u], wq[i + 3u]);
    let hi = vec4<u32>(wq[i + 16u], wq[i + 17u], wq[i + 18u], wq[i + 19u]);
    return Pair(bitcast<vec4<f32>>(lo), bitcast<vec4<f32>>(hi));
}

fn halves(q: u32) -> vec2<f32> {
    return vec2<f32>(half(q & 0xffffu), half(q >> 16u));
}

fn head_f16(a: u32, s: u32) -> Head {
    return no_head();
}

fn pair_f16(a: u32, s: u32, h: Head, w: u32) -> Pair {
    let b = a + 8u * w;
    let lo = vec4<f32>(halves(u32_at(b)), halves(u32_at(b + 4u)));
    let hi = vec4<f32>(halves(u32_at(b + 32u)), halves(u32_at(b + 36u)));
    return Pair(lo, hi);
}

fn bf2(q: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(q << 16u), bitcast<f32>(q & 0xffff0000u));
}

fn head_bf16(a: u32, s: u32) -> Head {
    return no_head();
}

fn pair_bf16(a: u32, s: u32, h: Head, w: u32) -> Pair {
    let b = a + 8u * w;
    let lo = vec4<f32>(bf2(u32_at(b)), bf2(u32_at(b + 4u)));
    let hi = vec4<f32>(bf2(u32_at(b + 32u)), bf2(u32_at(b + 36u)));
    return Pair(lo, hi);
}

// Low and high nibbles of the four bytes of q.
fn nib_lo(q: u32) -> vec4<u32> {
    return (vec4<u32>(q) >> SH8) & vec4<u32>(15u);
}

fn nib_hi(q: u32) -> vec4<u32> {
    return (vec4<u32>(q) >> (SH8 + vec4<u32>(4u))) & vec4<u32>(15u);
}

// Bytes of v (each at most 127) minus `off`, as signed bytes: no byte borrows from the next.
fn sub_bytes(v: u32, off: u32) -> u32 {
    return ((v | 0x80808080u) - off * 0x01010101u) ^ 0x80808080u;
}

const M4: u32 = 0x0f0f0f0fu;

// Bits 0..4 of b as bit 4 of the four bytes (the fifth bit of four Q5 values).
fn bit4(b: u32) -> u32 {
    return (((b & 15u) * 0x00204081u) & 0x01010101u) << 4u;
}

// Q4_0 (18 bytes): d, qs[16]; y[j] = d * (lo(qs[j]) - 8), y[j + 16] = d * (hi(qs[j]) - 8).
fn head_q4_0(a: u32, s: u32) -> Head {
    let d = f16_at(a);
    return Head(vec2<f32>(d), vec2<f32>(0.0), 0u);
}

fn pair_q4_0(a: u32, s: u32, h: Head, w: u32) -> Pair {
    let q = u32_at(a + 2u + 4u * w);
    return Pair(uf(nib_lo(q), 8.0), uf(nib_hi(q), 8.0));
}

fn ipair_q4_0(a: u32, s: u32, h: Head, w: u32) -> vec2<u32> {
    let q = u32_at(a + 2u + 4u * w);
    return vec2<u32>(sub_bytes(q & M4, 8u), sub_bytes((q >> 4u) & M4, 8u));
}

// Q4_1 (20 bytes): d, m, qs[16]; y = d * q + m.
fn head_q4_1(a: u32, s: u32) -> Head {
    return Head(vec2<f32>(f16_at(a)), vec2<f32>(f16_at(a + 2u)), 0u);
}

fn pair_q4_1(a: u32, s: u32, h: Head, w: u32) -> Pair {
    let q = wq[(a >> 2u) + 1u + w];
    return Pair(uf(nib_lo(q), 0.0), uf(nib_hi(q), 0.0));
}

fn ipair_q4_1(a: u32, s: u32, h: Head, w: u32) -> vec2<u32> {
    let q = wq[(a >> 2u) + 1u + w];
    return vec2<u32>(q & M4, (q >> 4u) & M4);
}

// Bit 4 of weights j..j+4 (bits j.. of qh).
fn high4(qh: u32, j: u32) -> vec4<u32> {
    return ((vec4<u32>(qh) >> (vec4<u32>(j) + vec4<u32>(0u, 1u, 2u, 3u))) & vec4<u32>(1u)) << vec4<u32>(4u);
}

// Q5_0 (22 bytes): d, qh (bit j: bit 4 of weight j), qs[16]; y = d * (q - 16).
fn head_q5_0(a: u32, s: u32) -> Head {
    return Head(vec2<f32>(f16_at(a)), vec2<f32>(0.0), u32_at(a + 2u));
}

fn pair_q5_0(a: u32, s: u32, h: Head, w: u32) -> Pair {
    let q = u32_at(a + 6u + 4u * w);
    let lo = uf(nib_lo(q) | high4(h.aux, 4u * w), 16.0);
    let hi = uf(nib_hi(q) | high4(h.aux, 4u * w + 16u), 16.0);
    return Pair(lo, hi);
}

fn ipair_q5_0(a: u32, s: u32, h: Head, w: u32) -> vec2<u32> {
    let q = u32_at(a + 6u + 4u * w);
    let lo = (q & M4) | bit4(h.aux >> (4u * w));
    let hi = ((q >> 4u) & M4) | bit4(h.aux >> (4u * w + 16u));
    return vec2<u32>(sub_bytes(lo, 16u), sub_bytes(hi, 16u));
}

// Q5_1 (24 bytes): d, m, qh, qs[16]; y = d * q + m.
fn head_q5_1(a: u32, s: u32) -> Head {
    return Head(vec2<f32>(f16_at(a)), vec2<f32>(f16_at(a + 2u)), wq[(a >> 2u) + 1u]);
}

fn pair_q5_1(a: u32, s: u32, h: Head, w: u32) -> Pair {
    let q = wq[(a >> 2u) + 2u + w];
    let lo = uf(nib_lo(q) | high4(h.aux, 4u * w), 0.0);
    let hi = uf(nib_hi(q) | high4(h.aux, 4u * w + 16u), 0.0);
    return Pair(lo, hi);
}

fn ipair_q5_1(a: u32, s: u32, h: Head, w: u32) -> vec2<u32> {
    let q = wq[(a >> 2u) + 2u + w];
    let lo = (q & M4) | bit4(h.aux >> (4u * w));
    let hi = ((q >> 4u) & M4) | bit4(h.aux >> (4u * w + 16u));
    return vec2<u32>(lo, hi);
}

// Q8_0 (34 bytes): d, qs[32] (i8); y = d * q.
fn head_q8_0(a: u32, s: u32) -> Head {
    return Head(vec2<f32>(f16_at(a)), vec2<f32>(0.0), 0u);
}

fn pair_q8_0(a: u32, s: u32, h: Head, w: u32) -> Pair {
    let b = a + 2u + 4u * w;
    return Pair(sbytes4(u32_at(b)), sbytes4(u32_at(b + 16u)));
}

fn ipair_q8_0(a: u32, s: u32, h: Head, w: u32) -> vec2<u32> {
    let b = a + 2u + 4u * w;
    return vec2<u32>(u32_at(b), u32_at(b + 16u));
}

// Eight Q4_0 / Q5_0 / Q8_0 blocks regrouped (`regroup` in qmatrix.rs): the eight f16 scales d
// (16 bytes), then the rest of each block, so unit s's fields are aligned words.

// Q4_0 x8 (144 bytes): d[8], then qs[16] of each block.
fn head_q4_0x8(a: u32, s: u32) -> Head {
    return Head(vec2<f32>(f16_at(a + 2u * s)), vec2<f32>(0.0), 0u);
}

fn pair_q4_0x8(a: u32, s: u32, h: Head, w: u32) -> Pair {
    let q = wq[(a >> 2u) + 4u + 4u * s + w];
    return Pair(uf(nib_lo(q), 8.0), uf(nib_hi(q), 8.0));
}

fn ipair_q4_0x8(a: u32, s: u32, h: Head, w: u32) -> vec2<u32> {
    let q = wq[(a >> 2u) + 4u + 4u * s + w];
    return vec2<u32>(sub_bytes(q & M4, 8u), sub_bytes((q >> 4u) & M4, 8u));
}

// Q5_0 x8 (176 bytes): d[8], then (qh, qs[16]) of each block.
fn head_q5_0x8(a: u32, s: u32) -> Head {
    return Head(vec2<f32>(f16_at(a + 2u * s)), vec2<f32>(0.0), wq[(a >> 2u) + 4u + 5u * s]);
}

fn pair_q5_0x8(a: u32, s: u32, h: Head, w: u32) -> Pair {
    let q = wq[(a >> 2u) + 5u + 5u * s + w];
    let lo = uf(nib_lo(q) | high4(h.aux, 4u * w), 16.0);
    let hi = uf(nib_hi(q) | high4(h.aux, 4u * w + 16u), 16.0);
    return Pair(lo, hi);
}

fn ipair_q5_0x8(a: u32, s: u32, h: Head, w: u32) -> vec2<u32> {
    let q = wq[(a >> 2u) + 5u + 5u * s + w];
    let lo = (q & M4) | bit4(h.aux >> (4u * w));
    let hi = ((q >> 4u) & M4) | bit4(h.aux >> (4u * w + 16u));
    return vec2<u32>(sub_bytes(lo, 16u), sub_bytes(hi, 16u));
}

// Q8_0 x8 (272 bytes): d[8], then qs[32] of each block.
fn head_q8_0x8(a: u32, s: u32) -> Head {
    return Head(vec2<f32>(f16_at(a + 2u * s)), vec2<f32>(0.0), 0u);
}

fn pair_q8_0x8(a: u32, s: u32, h: Head, w: u32) -> Pair {
    let i = (a >> 2u) + 4u + 8u * s + w;
    return Pair(sbytes4(wq[i]), sbytes4(wq[i + 4u]));
}

fn ipair_q8_0x8(a: u32, s: u32, h: Head, w: u32) -> vec2<u32> {
    let i = (a >> 2u) + 4u + 8u * s + w;
    return vec2<u32>(wq[i], wq[i + 4u]);
}

// The 6-bit (scale, min) pair j of a Q4_K / Q5_K block whose 12 scale bytes start at `sa`.
// Branch-free: bytes j % 4, j % 4 + 4 and j % 4 + 8 hold pair j whatever j is.
fn scale_min_k4(j: u32, sa: u32) -> vec2<u32> {
    let jj = j % 4u;
    let b0 = byte_at(sa + jj);
    let b4 = byte_at(sa + jj + 4u);
    let b8 = byte_at(sa + jj + 8u);
    let low = vec2<u32>(b0 & 63u, b4 & 63u);
    let high = vec2<u32>((b8 & 15u) | ((b0 >> 6u) << 4u), (b8 >> 4u) | ((b4 >> 6u) << 4u));
    return select(high, low, j < 4u);
}

// Q2_K (84 bytes): scales[16], qs[64], d, dmin. Unit s: weights 32s..32s+32; its values
// 16h.. use scale byte 2s + h; value bits 2(s % 4).. of qs[32(s / 4) + l].
fn head_q2_k(a: u32, s: u32) -> Head {
    let d = f16_at(a + 80u);
    let dmin = f16_at(a + 82u);
    let sc = vec2<u32>(byte_at(a + 2u * s), byte_at(a + 2u * s + 1u));
    let dm = vec2<f32>(uf1(sc.x & 15u), uf1(sc.y & 15u));
    let mm = vec2<f32>(uf1(sc.x >> 4u), uf1(sc.y >> 4u));
    return Head(d * dm, -dmin * mm, 0u);
}

fn pair_q2_k(a: u32, s: u32, h: Head, w: u32) -> Pair {
    let b = a + 16u + 32u * (s / 4u) + 4u * w;
    let sh = vec4<u32>(2u * (s % 4u));
    let lo = (bytes4(u32_at(b)) >> sh) & vec4<u32>(3u);
    let hi = (bytes4(u32_at(b + 16u)) >> sh) & vec4<u32>(3u);
    return Pair(uf(lo, 0.0), uf(hi, 0.0));
}

// Q3_K (110 bytes): hmask[32], qs[64], scales[12] (16 packed 6-bit), d.
fn q3_scale(a: u32, i: u32, d: f32) -> f32 {
    let lo = (byte_at(a + 96u + i % 8u) >> (4u * (i / 8u))) & 15u;
    let hi = (byte_at(a + 96u + 8u + i % 4u) >> (2u * (i / 4u))) & 3u;
    return d * (uf1(lo | (hi << 4u)) - 32.0);
}

fn head_q3_k(a: u32, s: u32) -> Head {
    let d = f16_at(a + 108u);
    return Head(vec2<f32>(q3_scale(a, 2u * s, d), q3_scale(a, 2u * s + 1u, d)), vec2<f32>(0.0), 0u);
}

// Quantized values 16h + 4w.. of unit s: the low two bits, minus 4 where the hmask bit is
// clear (low + 4 * high - 4).
fn q3_four(a: u32, s: u32, hh: u32, w: u32) -> vec4<f32> {
    let q = u32_at(a + 32u + 32u * (s / 4u) + 16u * hh + 4u * w);
    let hm = u32_at(a + 16u * hh + 4u * w);
    let low = (bytes4(q) >> vec4<u32>(2u * (s % 4u))) & vec4<u32>(3u);
    let high = (bytes4(hm) >> vec4<u32>(s)) & vec4<u32>(1u);
    return uf(low | (high << vec4<u32>(2u)), 4.0);
}

fn pair_q3_k(a: u32, s: u32, h: Head, w: u32) -> Pair {
    return Pair(q3_four(a, s, 0u, w), q3_four(a, s, 1u, w));
}

// Q4_K (144 bytes): d, dmin, scales[12], qs[128]; weight 64c + 32h + l is nibble h of
// qs[32c + l]; unit s = 2c + h.
fn head_q4_k(a: u32, s: u32) -> Head {
    let sm = scale_min_k4(s, a + 4u);
    let d1 = f16_at(a) * uf1(sm.x);
    let m1 = f16_at(a + 2u) * uf1(sm.y);
    return Head(vec2<f32>(d1), vec2<f32>(-m1), 0u);
}

fn pair_q4_k(a: u32, s: u32, h: Head, w: u32) -> Pair {
    let i = (a >> 2u) + 4u + 8u * (s / 2u) + w;
    let sh = vec4<u32>(4u * (s % 2u));
    let lo = (bytes4(wq[i]) >> sh) & vec4<u32>(15u);
    let hi = (bytes4(wq[i + 4u]) >> sh) & vec4<u32>(15u);
    return Pair(uf(lo, 0.0), uf(hi, 0.0));
}

fn ipair_q4_k(a: u32, s: u32, h: Head, w: u32) -> vec2<u32> {
    let i = (a >> 2u) + 4u + 8u * (s / 2u) + w;
    let sh = 4u * (s % 2u);
    return vec2<u32>((wq[i] >> sh) & M4, (wq[i + 4u] >> sh) & M4);
}

// Q5_K (176 bytes): Q4_K plus qh[32] (bit s of qh[l]: bit 4 of weight 32s + l) before qs.
fn head_q5_k(a: u32, s: u32) -> Head {
    return head_q4_k(a, s);
}

fn pair_q5_k(a: u32, s: u32, h: Head, w: u32) -> Pair {
    let i = (a >> 2u) + 12u + 8u * (s / 2u) + w;
    let j = (a >> 2u) + 4u + w;
    let sh = vec4<u32>(4u * (s % 2u));
    let hs = vec4<u32>(s);
    let lo = ((bytes4(wq[i]) >> sh) & vec4<u32>(15u)) | (((bytes4(wq[j]) >> hs) & vec4<u32>(1u)) << vec4<u32>(4u));
    let hi = ((bytes4(wq[i + 4u]) >> sh) & vec4<u32>(15u)) | (((bytes4(wq[j + 4u]) >> hs) & vec4<u32>(1u)) << vec4<u32>(4u));
    return Pair(uf(lo, 0.0), uf(hi, 0.0));
}

// Q6_K (210 bytes): ql[128], qh[64], scales[16] (i8), d; weight e = 32s + l:
// n = s / 4, r = e % 128: low = nibble (r / 64) of ql[64n + r % 64],
// high = bits 2(r / 32).. of qh[32n + l], y = d * scales[e / 16] * (low | high << 4 - 32).
fn head_q6_k(a: u32, s: u32) -> Head {
    let d = f16_at(a + 208u);
    let sb = vec2<u32>(byte_at(a + 192u + 2u * s), byte_at(a + 193u + 2u * s));
    let sc = vec2<f32>(uf1(sb.x ^ 0x80u), uf1(sb.y ^ 0x80u)) - 128.0;
    return Head(d * sc, vec2<f32>(0.0), 0u);
}

// Quantized values 16hh + 4w.. of unit s (offset included).
fn q6_four(a: u32, s: u32, hh: u32, w: u32) -> vec4<f32> {
    let n = s / 4u;
    let r = s % 4u;
    let l0 = 16u * hh + 4u * w;
    let ql = u32_at(a + 64u * n + 32u * (r % 2u) + l0);
    let qh = u32_at(a + 128u + 32u * n + l0);
    let low = (bytes4(ql) >> vec4<u32>(4u * (r / 2u))) & vec4<u32>(15u);
    let high = (bytes4(qh) >> vec4<u32>(2u * r)) & vec4<u32>(3u);
    return uf(low | (high << vec4<u32>(4u)), 32.0);
}

fn pair_q6_k(a: u32, s: u32, h: Head, w: u32) -> Pair {
    return Pair(q6_four(a, s, 0u, w), q6_four(a, s, 1u, w));
}

// Quantized values 16hh + 4w.. of unit s as signed bytes.
fn q6_ifour(a: u32, s: u32, hh: u32, w: u32) -> u32 {
    let n = s / 4u;
    let r = s % 4u;
    let l0 = 16u * hh + 4u * w;
    let ql = u32_at(a + 64u * n + 32u * (r % 2u) + l0);
    let qh = u32_at(a + 128u + 32u * n + l0);
    let low = (ql >> (4u * (r / 2u))) & M4;
    let high = (qh >> (2u * r)) & 0x03030303u;
    return sub_bytes(low | (high << 4u), 32u);
}

fn ipair_q6_k(a: u32, s: u32, h: Head, w: u32) -> vec2<u32> {
    return vec2<u32>(q6_ifour(a, s, 0u, w), q6_ifour(a, s, 1u, w));
}
