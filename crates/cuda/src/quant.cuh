#line 1 "quant.cuh"
// GGUF weight formats on the GPU: one 32-weight unit dequantized into registers.
//
// A weight row is `cols` elements in GGUF blocks (BS elements, TS bytes each). F32/F16/BF16 use
// pseudo-blocks of 32 elements, so every format is read in units of 32 elements: unit `sub`
// of a block (K-quants have 8 units per 256-element block, the others 1).
// Pointers into block bytes are only 2-byte aligned (18-, 22-, 34-, 210-byte blocks), so words
// are read as two 16-bit halves. Expressions follow the CPU reference
// (ferrite_gguf::quant::dequantize) term for term.

// Format codes, shared with gpu/weights.rs (`Fmt`).
#define FMT_F32 0
#define FMT_F16 1
#define FMT_BF16 2
#define FMT_Q4_0 3
#define FMT_Q4_1 4
#define FMT_Q5_0 5
#define FMT_Q5_1 6
#define FMT_Q8_0 7
#define FMT_Q4_K 8
#define FMT_Q5_K 9
#define FMT_Q6_K 10
// Not a file format: Q4_K rows converted for the prefill's int8 tensor-core products
// (`pf_q4k_units`, split rows only): per 32-element unit 16 bytes of Q4_1-ordered nibbles,
// then per unit f32 d1 = d sc and f32 m1 = -dmin m (x = d1 q + m1).
#define FMT_Q4_KU 11
// Not a file format either: Q6_K rows converted for the same products (`pf_q6k_units`): per
// unit 32 signed bytes q - 32 in element order, then per unit f32 d sc for elements 0..16 and
// for 16..32.
#define FMT_Q6_KU 12

// Programmatic dependent launch (sm_90+; no-ops before): every kernel of the decode step waits
// for the kernels before it (pdl_wait) before it reads activations or writes anything, and then
// lets the next one be scheduled (pdl_launch), whose weight loads then overlap this one.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

struct __align__(16) U4 { u32 x, y, z, w; };
struct __align__(16) F4 { float x, y, z, w; };

// 16 bytes of weights, read once: bypass L1.
__device__ __forceinline__ U4 ld_stream(u64 p) {
    U4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// 16 bytes from global (read once: L2 only) to shared memory, asynchronously where the
// architecture has cp.async (sm_80+; completed by cp_wait), else through registers.
__device__ __forceinline__ void cp16(u8* dst, u64 src) {
#if __CUDA_ARCH__ >= 800
    const u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src) : "memory");
#else
    *(U4*)dst = ld_stream(src);
#endif
}
__device__ __forceinline__ void cp_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups are pending.
template <int N> __device__ __forceinline__ void cp_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}
struct __align__(8) H4 { unsigned short x, y, z, w; };

// Elements per block.
__device__ __forceinline__ constexpr u32 fmt_bs(u32 f) { return f >= FMT_Q4_K ? 256u : 32u; }

// Bytes per block.
__device__ __forceinline__ constexpr u32 fmt_ts(u32 f) {
    switch (f) {
    case FMT_F32: return 128;
    case FMT_F16: return 64;
    case FMT_BF16: return 64;
    case FMT_Q4_0: return 18;
    case FMT_Q4_1: return 20;
    case FMT_Q5_0: return 22;
    case FMT_Q5_1: return 24;
    case FMT_Q8_0: return 34;
    case FMT_Q4_K: return 144;
    case FMT_Q5_K: return 176;
    default: return 210;  // FMT_Q6_K
    }
}

__device__ __forceinline__ u32 ld2(const u8* p) { return *(const unsigned short*)p; }
// 4 little-endian bytes at a 2-byte aligned address.
__device__ __forceinline__ u32 ld4(const u8* p) { return ld2(p) | (ld2(p + 2) << 16); }
__device__ __forceinline__ float ldh(const u8* p) {
    f16 h;
    h.x = (unsigned short)ld2(p);
    return f16_to_f32(h);
}
__device__ __forceinline__ float h2f(u32 bits) {
    f16 h;
    h.x = (unsigned short)bits;
    return f16_to_f32(h);
}

// (float)q - off for an integer 0 <= q < 2^22, exactly: the bits of 2^23 + q as a float, minus
// 2^23 + off (one logic op and one add; an int-to-float conversion runs at a fraction of the
// FMA rate and made the quantized products issue-bound).
__device__ __forceinline__ float qf(u32 q, float off) {
    return __uint_as_float(0x4B000000u | q) - (8388608.0f + off);
}

// y[0..32] = the 32 weights of unit `sub` of the block at `b`.
template <int F> __device__ __forceinline__ void deq(const u8* b, int sub, float* y);

template <> __device__ __forceinline__ void deq<FMT_F32>(const u8* b, int, float* y) {
    const float* p = (const float*)b;  // 4-byte aligned: rows of f32 are
#pragma unroll
    for (int l = 0; l < 32; ++l) y[l] = p[l];
}

template <> __device__ __forceinline__ void deq<FMT_F16>(const u8* b, int, float* y) {
#pragma unroll
    for (int w = 0; w < 16; ++w) {
        u32 v = ld4(b + 4 * w);
        y[2 * w] = h2f(v & 0xffffu);
        y[2 * w + 1] = h2f(v >> 16);
    }
}

template <> __device__ __forceinline__ void deq<FMT_BF16>(const u8* b, int, float* y) {
#pragma unroll
    for (int w = 0; w < 16; ++w) {
        u32 v = ld4(b + 4 * w);
        y[2 * w] = __uint_as_float(v << 16);
        y[2 * w + 1] = __uint_as_float(v & 0xffff0000u);
    }
}

// Q4_0: d (f16), qs[16]; weight j = low nibble of qs[j], weight j+16 = high nibble; d * (q - 8).
template <> __device__ __forceinline__ void deq<FMT_Q4_0>(const u8* b, int, float* y) {
    const float d = ldh(b);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        u32 v = ld4(b + 2 + 4 * w);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            u32 q = (v >> (8 * k)) & 0xffu;
            y[4 * w + k] = d * qf(q & 15u, 8.0f);
            y[4 * w + k + 16] = d * qf(q >> 4, 8.0f);
        }
    }
}

// Q4_1: d, m (f16), qs[16]; d * q + m.
template <> __device__ __forceinline__ void deq<FMT_Q4_1>(const u8* b, int, float* y) {
    const float d = ldh(b), m = ldh(b + 2);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        u32 v = ld4(b + 4 + 4 * w);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            u32 q = (v >> (8 * k)) & 0xffu;
            y[4 * w + k] = d * qf(q & 15u, 0.0f) + m;
            y[4 * w + k + 16] = d * qf(q >> 4, 0.0f) + m;
        }
    }
}

// Q5_0: d, qh (u32: bit j = bit 4 of weight j), qs[16]; d * (q - 16).
template <> __device__ __forceinline__ void deq<FMT_Q5_0>(const u8* b, int, float* y) {
    const float d = ldh(b);
    const u32 qh = ld4(b + 2);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        u32 v = ld4(b + 6 + 4 * w);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int j = 4 * w + k;
            u32 q = (v >> (8 * k)) & 0xffu;
            u32 lo = (q & 15u) | (((qh >> j) & 1u) << 4);
            u32 hi = (q >> 4) | (((qh >> (j + 16)) & 1u) << 4);
            y[j] = d * qf(lo, 16.0f);
            y[j + 16] = d * qf(hi, 16.0f);
        }
    }
}

// Q5_1: d, m, qh, qs[16]; d * q + m.
template <> __device__ __forceinline__ void deq<FMT_Q5_1>(const u8* b, int, float* y) {
    const float d = ldh(b), m = ldh(b + 2);
    const u32 qh = ld4(b + 4);
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        u32 v = ld4(b + 8 + 4 * w);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int j = 4 * w + k;
            u32 q = (v >> (8 * k)) & 0xffu;
            u32 lo = (q & 15u) | (((qh >> j) & 1u) << 4);
            u32 hi = (q >> 4) | (((qh >> (j + 16)) & 1u) << 4);
            y[j] = d * qf(lo, 0.0f) + m;
            y[j + 16] = d * qf(hi, 0.0f) + m;
        }
    }
}

// Q8_0: d, qs[32] (i8); q * d.
template <> __device__ __forceinline__ void deq<FMT_Q8_0>(const u8* b, int, float* y) {
    const float d = ldh(b);
#pragma unroll
    for (int w = 0; w < 8; ++w) {
        u32 v = ld4(b + 2 + 4 * w);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            // the i8 q as q + 128 (flip the sign bit), minus 128
            y[4 * w + k] = qf(((v >> (8 * k)) & 0xffu) ^ 0x80u, 128.0f) * d;
        }
    }
}

// The 6-bit (scale, min) of group `j` (0..8) of Q4_K/Q5_K (`scale_min_k4`).
__device__ __forceinline__ void scale_min_k4(int j, const u8* s, int* sc, int* m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

// Q4_K: d, dmin, scales[12], qs[128]; weight 64c + 32h + l is nibble h of qs[32c + l];
// unit g = 2c + h: d * sc[g] * q - dmin * m[g].
template <> __device__ __forceinline__ void deq<FMT_Q4_K>(const u8* b, int g, float* y) {
    const float d = ldh(b), dmin = ldh(b + 2);
    int sc, mn;
    scale_min_k4(g, b + 4, &sc, &mn);
    const float d1 = d * (float)sc, m1 = dmin * (float)mn;
    const u8* q = b + 16 + 32 * (g >> 1);
    const int sh = 4 * (g & 1);
#pragma unroll
    for (int w = 0; w < 8; ++w) {
        u32 v = ld4(q + 4 * w);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            y[4 * w + k] = d1 * qf((v >> (8 * k + sh)) & 15u, 0.0f) - m1;
        }
    }
}

// Q5_K: Q4_K plus qh[32] at byte 16 (bit g of qh[l] = bit 4 of weight 32g + l); qs at 48.
template <> __device__ __forceinline__ void deq<FMT_Q5_K>(const u8* b, int g, float* y) {
    const float d = ldh(b), dmin = ldh(b + 2);
    int sc, mn;
    scale_min_k4(g, b + 4, &sc, &mn);
    const float d1 = d * (float)sc, m1 = dmin * (float)mn;
    const u8* q = b + 48 + 32 * (g >> 1);
    const u8* h = b + 16;
    const int sh = 4 * (g & 1);
#pragma unroll
    for (int w = 0; w < 8; ++w) {
        u32 v = ld4(q + 4 * w), hv = ld4(h + 4 * w);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            u32 qq = ((v >> (8 * k + sh)) & 15u) | (((hv >> (8 * k + g)) & 1u) << 4);
            y[4 * w + k] = d1 * qf(qq, 0.0f) - m1;
        }
    }
}

// Q6_K: ql[128], qh[64], scales[16] (i8), d. Weight e = 128n + r: low 4 bits from
// ql[64n + r % 64] >> 4 * (r / 64), high 2 from qh[32n + r % 32] >> 2 * (r / 32);
// d * scales[e / 16] * (q - 32). Unit g covers e = 32g..32g+32 (n = g / 4, r / 32 = g % 4).
template <> __device__ __forceinline__ void deq<FMT_Q6_K>(const u8* b, int g, float* y) {
    const float d = ldh(b + 208);
    const int n = g >> 2;
    const u8* ql = b + 64 * n + 32 * (g & 1);
    const int lsh = 4 * ((g & 3) >> 1);
    const u8* qh = b + 128 + 32 * n;
    const int hsh = 2 * (g & 3);
    const signed char* sc = (const signed char*)(b + 192);
    const float d0 = d * (float)sc[2 * g], d1 = d * (float)sc[2 * g + 1];
#pragma unroll
    for (int w = 0; w < 8; ++w) {
        u32 lv = ld4(ql + 4 * w), hv = ld4(qh + 4 * w);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const u32 q = ((lv >> (8 * k + lsh)) & 15u) | (((hv >> (8 * k + hsh)) & 3u) << 4);
            y[4 * w + k] = (w < 4 ? d0 : d1) * qf(q, 32.0f);
        }
    }
}

// Expands CALL(F) with F the compile-time constant of the runtime format code `f`.
#define FMT_DISPATCH(f, CALL) \
    switch (f) { \
    case FMT_F32: CALL(FMT_F32); break; \
    case FMT_F16: CALL(FMT_F16); break; \
    case FMT_BF16: CALL(FMT_BF16); break; \
    case FMT_Q4_0: CALL(FMT_Q4_0); break; \
    case FMT_Q4_1: CALL(FMT_Q4_1); break; \
    case FMT_Q5_0: CALL(FMT_Q5_0); break; \
    case FMT_Q5_1: CALL(FMT_Q5_1); break; \
    case FMT_Q8_0: CALL(FMT_Q8_0); break; \
    case FMT_Q4_K: CALL(FMT_Q4_K); break; \
    case FMT_Q5_K: CALL(FMT_Q5_K); break; \
    case FMT_Q6_K: CALL(FMT_Q6_K); break; \
    }

// ---- Split rows ----
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q6_K matrices whose rows are a multiple of 16 bytes are
// rearranged at upload (gpu/weights.rs, `split_rows`), each row of n blocks as
//   [quants: n x SQ bytes][qh: n x 4 bytes, Q5_0/Q5_1 only][d, or d and m: n x SH bytes]
// (every field's bytes as in the block; SQ = 16, 32 for Q8_0, 208 for Q6_K (ql, qh and
// scales); SH = 2, 4 for Q4_1/Q5_1), so a block's quants are one or more aligned 16-byte loads
// and its other fields aligned loads too. A format code with FMT_SPLIT set names such a
// matrix.
#define FMT_SPLIT 16

template <int F> __device__ __forceinline__ constexpr u32 sp_q() {
    return (F == FMT_Q8_0 || F == FMT_Q6_KU) ? 32u : 16u;
}
template <int F> __device__ __forceinline__ constexpr u32 sp_qh() {
    return (F == FMT_Q5_0 || F == FMT_Q5_1) ? 4u : 0u;
}
template <int F> __device__ __forceinline__ constexpr u32 sp_h() {
    return (F == FMT_Q4_KU || F == FMT_Q6_KU) ? 8u : (F == FMT_Q4_1 || F == FMT_Q5_1) ? 4u : 2u;
}

__device__ __forceinline__ u32 ld_nc16(u64 p) {
    unsigned short v;
    asm("ld.global.nc.L1::no_allocate.u16 %0, [%1];" : "=h"(v) : "l"(p));
    return v;
}
__device__ __forceinline__ u32 ld_nc32(u64 p) {
    u32 v;
    asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

// One block of a split row in registers: quant words q0 (q1: Q8_0's second 16 bytes), h = d
// (bits 0..16) and m (bits 16..32), qh.
struct SpUnit {
    U4 q0, q1;
    u32 h, qh;
};

__device__ __forceinline__ u32 sp_word(const SpUnit& s, int w) {
    const U4& v = w < 4 ? s.q0 : s.q1;
    switch (w & 3) {
    case 0: return v.x;
    case 1: return v.y;
    case 2: return v.z;
    default: return v.w;
    }
}

// Block b of the split row at `row` (16-byte aligned) of n blocks.
template <int F> __device__ __forceinline__ SpUnit sp_load(u64 row, u32 n, u32 b) {
    SpUnit s;
    s.q0 = ld_stream(row + (u64)b * sp_q<F>());
    if (F == FMT_Q8_0) s.q1 = ld_stream(row + (u64)b * 32 + 16);
    if (sp_qh<F>()) s.qh = ld_nc32(row + (u64)n * 16 + 4 * (u64)b);
    const u64 hp = row + (u64)n * (sp_q<F>() + sp_qh<F>()) + (u64)b * sp_h<F>();
    s.h = sp_h<F>() == 4 ? ld_nc32(hp) : ld_nc16(hp);
    return s;
}

// y[0..32] = the weights of a split block: deq<F> term for term.
template <int F> __device__ __forceinline__ void sp_deq(const SpUnit& s, float* y) {
    const float d = h2f(s.h & 0xffffu);
    const float m = h2f(s.h >> 16);
    if (F == FMT_Q8_0) {
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const u32 v = sp_word(s, w);
#pragma unroll
            for (int k = 0; k < 4; ++k) y[4 * w + k] = qf(((v >> (8 * k)) & 0xffu) ^ 0x80u, 128.0f) * d;
        }
        return;
    }
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        const u32 v = sp_word(s, w);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int j = 4 * w + k;
            const u32 q = (v >> (8 * k)) & 0xffu;
            u32 lo = q & 15u, hi = q >> 4;
            if (sp_qh<F>()) {
                lo |= ((s.qh >> j) & 1u) << 4;
                hi |= ((s.qh >> (j + 16)) & 1u) << 4;
            }
            if (F == FMT_Q4_0) {
                y[j] = d * qf(lo, 8.0f);
                y[j + 16] = d * qf(hi, 8.0f);
            } else if (F == FMT_Q5_0) {
                y[j] = d * qf(lo, 16.0f);
                y[j + 16] = d * qf(hi, 16.0f);
            } else {  // Q4_1, Q5_1
                y[j] = d * qf(lo, 0.0f) + m;
                y[j + 16] = d * qf(hi, 0.0f) + m;
            }
        }
    }
}

// CALL(F) for the base format of a split format code (f & 15).
#define FMT_DISPATCH_SPLIT(f, CALL) \
    switch (f) { \
    case FMT_Q4_0: CALL(FMT_Q4_0); break; \
    case FMT_Q4_1: CALL(FMT_Q4_1); break; \
    case FMT_Q5_0: CALL(FMT_Q5_0); break; \
    case FMT_Q5_1: CALL(FMT_Q5_1); break; \
    case FMT_Q8_0: CALL(FMT_Q8_0); break; \
    }

// Half `hh` of block b of a split Q6_K row (units 4 hh .. 4 hh + 4): ql[64 hh .. + 64),
// qh[32 hh .. + 32), scales[8 hh .. + 8) (i8) and d.
struct Q6Item {
    U4 ql[4], qh[2];
    u32 sc0, sc1;  // scales 8 hh + 0..4, 8 hh + 4..8
    u32 d;
};

__device__ __forceinline__ Q6Item q6s_load(u64 row, u32 nb, u32 b, u32 hh) {
    Q6Item it;
    const u64 base = row + (u64)b * 208;
#pragma unroll
    for (int i = 0; i < 4; ++i) it.ql[i] = ld_stream(base + 64 * hh + 16 * i);
#pragma unroll
    for (int i = 0; i < 2; ++i) it.qh[i] = ld_stream(base + 128 + 32 * hh + 16 * i);
    const u64 sp = base + 192 + 8 * hh;
    asm("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(it.sc0), "=r"(it.sc1) : "l"(sp));
    it.d = ld_nc16(row + (u64)nb * 208 + 2 * (u64)b);
    return it;
}

__device__ __forceinline__ u32 u4_word(const U4& v, int w) {
    return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

// Unit i (0..4) of a Q6_K half block: word w (0..8) of its 6-bit quants, 4 to a word, and its
// two scales (weights 0..16 and 16..32 of the unit). Unit g = 4 hh + i of the block reads ql
// from 32 (g & 1) in the half's 64 bytes, shifted by 4 ((g & 3) >> 1), and qh shifted by 2 (g & 3).
__device__ __forceinline__ u32 q6s_word(const Q6Item& it, int i, int w) {
    const u32 lv = u4_word(it.ql[2 * (i & 1) + (w >> 2)], w & 3);
    const u32 hv = u4_word(it.qh[w >> 2], w & 3);
    return ((lv >> (4 * (i >> 1))) & 0x0f0f0f0fu) | (((hv >> (2 * i)) & 0x03030303u) << 4);
}
__device__ __forceinline__ void q6s_scales(const Q6Item& it, int i, int* s0, int* s1) {
    const u32 v = i < 2 ? it.sc0 : it.sc1;
    const int sh = 16 * (i & 1);
    *s0 = (int)(signed char)((v >> sh) & 0xffu);
    *s1 = (int)(signed char)((v >> (sh + 8)) & 0xffu);
}

// y[0..32] = unit i of the half block: deq<FMT_Q6_K> term for term.
__device__ __forceinline__ void q6s_deq(const Q6Item& it, int i, float* y) {
    const float d = h2f(it.d);
    int s0, s1;
    q6s_scales(it, i, &s0, &s1);
    const float d0 = d * (float)s0, d1 = d * (float)s1;
#pragma unroll
    for (int w = 0; w < 8; ++w) {
        const u32 q = q6s_word(it, i, w);
#pragma unroll
        for (int k = 0; k < 4; ++k) y[4 * w + k] = (w < 4 ? d0 : d1) * qf((q >> (8 * k)) & 0xffu, 32.0f);
    }
}
