#line 1 "matvec.cu"
// Matrix-vector products over GGUF weight blocks for batch-1 decode (quant.cuh in front),
// with a fused prologue (RMS norm of the input) and epilogues (bias, residual add,
// SwiGLU/GeGLU, per-block argmax partials); the token embedding and the final argmax.
//
// matvec: a tile is `rpb` rows of one segment (GLU: `rpb` rows of gate and the same rows of
// up); a thread block takes one tile (matvec_persist: several, see matvec_body). Its MV_T
// threads form NR = rpb (GLU: 2 * rpb) groups of G = MV_T / NR;
// group k owns row slot k and splits the row's 32-element units among its threads (split-K
// inside the block, reduced in a fixed order: results are deterministic). Columns go in
// chunks of `chunk` elements: the block stages each of its rows' chunk bytes into shared
// memory with 16-byte asynchronous copies of the 16-byte aligned cover of the byte range, in a
// ring of MV_S stages (the copies of the next MV_S - 1 steps are in flight while one step is
// computed: enough bytes in flight per multiprocessor to stream HBM), then every thread
// dequantizes its units into registers and takes the dot product with the f32 input, which
// the prologue put in shared memory at XPAD floats per unit (consecutive units: 16-byte reads
// without bank conflicts).

#define MV_T 128
#define MV_LPT 8
#define MV_STAGE (MV_T * 16 * MV_LPT)  // bytes of one stage
#define MV_S 3                           // stages in the ring
#define XPAD 36
#define MV_RED 64

#define MV_STORE 0
#define MV_ADD 1
#define MV_GLU_SILU 2
#define MV_GLU_GELU 3

// One weight matrix of a launch (layout of `MvSeg` in gpu/matvec.rs).
struct MvSeg {
    u64 w;          // rows x row_bytes of GGUF blocks; 16-byte aligned, readable 16 bytes past the end
    u64 bias;       // f32 [rows] added to the products, or 0
    u32 fmt;        // FMT_*
    u32 rows;
    u32 row_bytes;
    u32 out_off;    // output element of row 0
    u32 blocks;     // tiles of this segment: ceil(rows / rpb)
    u32 pad;
};

// Layout of `MvArgs` in gpu/matvec.rs.
struct MvArgs {
    MvSeg seg[3];
    u32 nseg;       // plain modes: 1..3 segments in grid order; GLU: seg[0] gate, seg[1] up
    u32 mode;       // MV_*
    u32 cols;       // elements per row (multiple of 32; of 256 when a K-quant is present)
    u32 rpb;        // rows per block and segment; NR = rpb (GLU: 2 * rpb) divides MV_T, NR <= 32
    u32 chunk;      // columns per staged chunk (multiple of every segment's block size)
    u32 stride;     // staging bytes per row slot: multiple of 16, >= chunk bytes + 32; NR * stride <= MV_STAGE;
                    // 0: packed (chunk == cols): a tile's rows of a matrix are contiguous in
                    // memory and staged as one copy, rpb * row_bytes + 16 <= MV_STAGE (GLU:
                    // MV_STAGE / 2, gate rows in the first half of the stage, up rows in the second)
    u64 x;          // f32 [cols], 16-byte aligned
    u64 norm;       // f32 [cols] RMS-norm weight applied to x first, or 0
    float eps;
    u32 tiles;      // rpb-row tiles: sum of seg[i].blocks (GLU: seg[0].blocks)
    u64 out;        // f32 output: out[out_off + row] (GLU: seg[0].out_off)
    u64 argmax;     // if not 0: ArgPart [tiles], the largest output of each tile
    u32 xstride;    // bytes between the inputs of consecutive rows of the batch
    u32 ostride;    // bytes between their outputs
    u32 nrows;      // input rows of the batch (>= 1), each multiplied by the same weights
    u32 rpg;        // rows per group: a block computes its tile for `rpg` consecutive rows
};

// A batch of input rows: the launch has gridDim.x = (blocks of one row) x (row groups), the
// row group fastest, so the blocks of one weight tile for every group run side by side and
// read the tile from DRAM once (the others from L2). mv_bx / mv_gx: the block index and grid
// size of the one-row launch; mv_row0: the first row of this block's group.
__device__ __forceinline__ u32 mv_groups(const MvArgs& a) { return (a.nrows + a.rpg - 1) / a.rpg; }
__device__ __forceinline__ u32 mv_bx(const MvArgs& a) { return blockIdx.x / mv_groups(a); }
__device__ __forceinline__ u32 mv_gx(const MvArgs& a) { return gridDim.x / mv_groups(a); }
__device__ __forceinline__ u32 mv_row0(const MvArgs& a) { return (blockIdx.x % mv_groups(a)) * a.rpg; }
__device__ __forceinline__ u64 x_row(const MvArgs& a) { return a.x + (u64)mv_row0(a) * a.xstride; }
__device__ __forceinline__ u64 out_row(const MvArgs& a) { return a.out + (u64)mv_row0(a) * a.ostride; }

struct ArgPart {
    float v;
    u32 i;
};

// dot(y[0..32], x[0..32]); x 16-byte aligned in shared memory.
__device__ __forceinline__ float dot32(const float* y, const float* x) {
    const F4* x4 = (const F4*)x;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        F4 v = x4[i];
        s += y[4 * i] * v.x;
        s += y[4 * i + 1] * v.y;
        s += y[4 * i + 2] * v.z;
        s += y[4 * i + 3] * v.w;
    }
    return s;
}

// Units j, j + G, ... (< nunits) of one staged row chunk: `base` is the chunk's first block,
// `xs` the input of its first unit.
template <int F>
__device__ __forceinline__ float mv_units(const u8* base, u32 nunits, u32 j, u32 G, const float* xs) {
    constexpr u32 UPB = fmt_bs(F) / 32;
    constexpr u32 TS = fmt_ts(F);
    float acc = 0.f;
    for (u32 u = j; u < nunits; u += G) {
        float y[32];
        deq<F>(base + (u / UPB) * TS, (int)(u % UPB), y);
        acc += dot32(y, xs + u * XPAD);
    }
    return acc;
}

// ---- 8-bit activations (fast mode) ----
// The input of a product quantized once (kernel quantize_q8) into units of Q8U bytes: qs[32]
// (i8), d (f32), s = d * sum(qs) (f32), 8 bytes of padding (48-byte units: 16-byte reads of
// consecutive units without bank conflicts). x[i] ~= d * qs[i], as the CPU's quantize_q8
// (scale max|x| / 127, round half away from zero). Weight units are then dotted with __dp4a
// on packed 4/5/6/8-bit integers and scaled once per unit by the two scales.
#define Q8U 48
// The two-level form (kernel quantize_q8x2, the CPU's q8x2): units of Q8X2U bytes, a Q8U unit
// (hi's qs, d, and s = hi's s + lo's s) followed by lo's qs[32] (i8): the rounding residual in
// steps of exactly d / 256, so x[i] ~= d * (qs[i] + lo[i] / 256) (~16 bits).
#define Q8X2U 80

// A unit's qs as 8 ints (16-byte aligned unit in shared memory: two 16-byte loads).
struct Q8W {
    int w[8];
};
__device__ __forceinline__ Q8W q8ld(const u8* xq) {
    const int4 a = ((const int4*)xq)[0], b = ((const int4*)xq)[1];
    Q8W r;
    r.w[0] = a.x, r.w[1] = a.y, r.w[2] = a.z, r.w[3] = a.w;
    r.w[4] = b.x, r.w[5] = b.y, r.w[6] = b.z, r.w[7] = b.w;
    return r;
}

// 16 bytes at p (2-byte aligned, in shared memory) as 4 words: 4-byte aligned loads joined by
// funnel shifts (may read up to 3 bytes past p + 16).
__device__ __forceinline__ void ld16_a2(const u8* p, u32* v) {
    const u32* a = (const u32*)((size_t)p & ~(size_t)3);
    const u32 sh = ((u32)(size_t)p & 3u) * 8u;
    const u32 w0 = a[0], w1 = a[1], w2 = a[2], w3 = a[3], w4 = a[4];
    v[0] = __funnelshift_r(w0, w1, sh);
    v[1] = __funnelshift_r(w1, w2, sh);
    v[2] = __funnelshift_r(w2, w3, sh);
    v[3] = __funnelshift_r(w3, w4, sh);
}

// Bit 4 of bytes 0..3 from bits 0..3 of h.
__device__ __forceinline__ int bits4(u32 h) {
    return (int)(((h << 4) & 0x10u) | ((h << 11) & 0x1000u) | ((h << 18) & 0x100000u) | ((h << 25) & 0x10000000u));
}

// dot(weights of unit `sub` of the block at b, activations of the q8 unit at xq).
template <int F> __device__ __forceinline__ float dq8(const u8* b, int sub, const u8* xq);

template <> __device__ __forceinline__ float dq8<FMT_Q4_0>(const u8* b, int, const u8* xq) {
    const Q8W xv = q8ld(xq);
    const float2 ds = *(const float2*)(xq + 32);
    u32 q[4];
    ld16_a2(b + 2, q);
    int acc = 0;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        acc = __dp4a((int)(q[w] & 0x0f0f0f0fu), xv.w[w], acc);
        acc = __dp4a((int)((q[w] >> 4) & 0x0f0f0f0fu), xv.w[w + 4], acc);
    }
    return ldh(b) * (ds.x * (float)acc - 8.0f * ds.y);
}

template <> __device__ __forceinline__ float dq8<FMT_Q4_1>(const u8* b, int, const u8* xq) {
    const Q8W xv = q8ld(xq);
    const float2 ds = *(const float2*)(xq + 32);
    int acc = 0;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        const u32 v = ld4(b + 4 + 4 * w);
        acc = __dp4a((int)(v & 0x0f0f0f0fu), xv.w[w], acc);
        acc = __dp4a((int)((v >> 4) & 0x0f0f0f0fu), xv.w[w + 4], acc);
    }
    return ldh(b) * ds.x * (float)acc + ldh(b + 2) * ds.y;
}

template <> __device__ __forceinline__ float dq8<FMT_Q5_0>(const u8* b, int, const u8* xq) {
    const Q8W xv = q8ld(xq);
    const float2 ds = *(const float2*)(xq + 32);
    const u32 qh = ld4(b + 2);
    int acc = 0;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        const u32 v = ld4(b + 6 + 4 * w);
        acc = __dp4a((int)(v & 0x0f0f0f0fu) | bits4(qh >> (4 * w)), xv.w[w], acc);
        acc = __dp4a((int)((v >> 4) & 0x0f0f0f0fu) | bits4(qh >> (16 + 4 * w)), xv.w[w + 4], acc);
    }
    return ldh(b) * (ds.x * (float)acc - 16.0f * ds.y);
}

template <> __device__ __forceinline__ float dq8<FMT_Q5_1>(const u8* b, int, const u8* xq) {
    const Q8W xv = q8ld(xq);
    const float2 ds = *(const float2*)(xq + 32);
    const u32 qh = ld4(b + 4);
    int acc = 0;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        const u32 v = ld4(b + 8 + 4 * w);
        acc = __dp4a((int)(v & 0x0f0f0f0fu) | bits4(qh >> (4 * w)), xv.w[w], acc);
        acc = __dp4a((int)((v >> 4) & 0x0f0f0f0fu) | bits4(qh >> (16 + 4 * w)), xv.w[w + 4], acc);
    }
    return ldh(b) * ds.x * (float)acc + ldh(b + 2) * ds.y;
}

template <> __device__ __forceinline__ float dq8<FMT_Q8_0>(const u8* b, int, const u8* xq) {
    const Q8W xv = q8ld(xq);
    const float dx = *(const float*)(xq + 32);
    int acc = 0;
    u32 q[8];
    ld16_a2(b + 2, q);
    ld16_a2(b + 18, q + 4);
#pragma unroll
    for (int w = 0; w < 8; ++w) acc = __dp4a((int)q[w], xv.w[w], acc);
    return ldh(b) * dx * (float)acc;
}

template <> __device__ __forceinline__ float dq8<FMT_Q4_K>(const u8* b, int g, const u8* xq) {
    const Q8W xv = q8ld(xq);
    const float2 ds = *(const float2*)(xq + 32);
    int sc, mn;
    scale_min_k4(g, b + 4, &sc, &mn);
    const u8* q = b + 16 + 32 * (g >> 1);
    const int sh = 4 * (g & 1);
    int acc = 0;
#pragma unroll
    for (int w = 0; w < 8; ++w) acc = __dp4a((int)((ld4(q + 4 * w) >> sh) & 0x0f0f0f0fu), xv.w[w], acc);
    return ldh(b) * (float)sc * ds.x * (float)acc - ldh(b + 2) * (float)mn * ds.y;
}

template <> __device__ __forceinline__ float dq8<FMT_Q6_K>(const u8* b, int g, const u8* xq) {
    const Q8W xv = q8ld(xq);
    const float dx = *(const float*)(xq + 32);
    const int n = g >> 2;
    const u8* ql = b + 64 * n + 32 * (g & 1);
    const int lsh = 4 * ((g & 3) >> 1);
    const u8* qh = b + 128 + 32 * n;
    const int hsh = 2 * (g & 3);
    const signed char* sc = (const signed char*)(b + 192);
    int a0 = 0, a1 = 0;
#pragma unroll
    for (int w = 0; w < 8; ++w) {
        const u32 q = ((ld4(ql + 4 * w) >> lsh) & 0x0f0f0f0fu) | (((ld4(qh + 4 * w) >> hsh) & 0x03030303u) << 4);
        const int x = xv.w[w];
        // sum (q - 32) x = sum q x - 32 sum x
        if (w < 4) {
            a0 = __dp4a((int)q, x, a0);
            a0 = __dp4a((int)0xe0e0e0e0u, x, a0);  // bytes of -32
        } else {
            a1 = __dp4a((int)q, x, a1);
            a1 = __dp4a((int)0xe0e0e0e0u, x, a1);
        }
    }
    return ldh(b + 208) * dx * ((float)sc[2 * g] * (float)a0 + (float)sc[2 * g + 1] * (float)a1);
}

#define FMT_DISPATCH_Q8(f, CALL) \
    switch (f) { \
    case FMT_Q4_0: CALL(FMT_Q4_0); break; \
    case FMT_Q4_1: CALL(FMT_Q4_1); break; \
    case FMT_Q5_0: CALL(FMT_Q5_0); break; \
    case FMT_Q5_1: CALL(FMT_Q5_1); break; \
    case FMT_Q8_0: CALL(FMT_Q8_0); break; \
    case FMT_Q4_K: CALL(FMT_Q4_K); break; \
    case FMT_Q6_K: CALL(FMT_Q6_K); break; \
    }

// mv_units over q8 activations: `xq` the q8 unit of the chunk's first unit.
template <int F>
__device__ __forceinline__ float mv_units_q8(const u8* base, u32 nunits, u32 j, u32 G, const u8* xq) {
    constexpr u32 UPB = fmt_bs(F) / 32;
    constexpr u32 TS = fmt_ts(F);
    float acc = 0.f;
    for (u32 u = j; u < nunits; u += G) acc += dq8<F>(base + (u / UPB) * TS, (int)(u % UPB), xq + u * Q8U);
    return acc;
}

// Where row slot k's chunk [e0, e0 + ne) lies in global memory: start byte and length.
__device__ __forceinline__ void chunk_range(const MvSeg& s, u32 row, u32 e0, u32 ne, u64* start, u32* len) {
    const u32 bs = fmt_bs(s.fmt), ts = fmt_ts(s.fmt);
    *start = s.w + (u64)row * s.row_bytes + (u64)(e0 / bs) * ts;
    *len = (ne / bs) * ts;
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float gelu_tanh_f(float x) {
    const float c = 0.7978846f;  // sqrt(2/pi), as the CPU's gelu_tanh
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

// GLU row `row` from its gate sum v and up sum u (segments sa, sb): act(v + bias) (u + bias),
// the value mv_epilogue stores (written out there: in this form the tensor-core kernels take
// other registers, and run slower).
__device__ __forceinline__ float mv_glu(const MvArgs& a, const MvSeg& sa, const MvSeg& sb, u32 row, float v, float u) {
    if (sa.bias) v += ((const float*)sa.bias)[row];
    if (sb.bias) u += ((const float*)sb.bias)[row];
    return (a.mode == MV_GLU_SILU ? silu_f(v) : gelu_tanh_f(v)) * u;
}

// Row `row` of segment sa (GLU: and of sb) from its product v (GLU: gate v, up u): bias,
// activation, residual add; stores it and returns the stored value.
__device__ __forceinline__ float mv_epilogue(const MvArgs& a, const MvSeg& sa, const MvSeg& sb, u32 row,
                                             float v, float u, u64 out_base) {
    float* out = (float*)out_base;
    if (sa.bias) v += ((const float*)sa.bias)[row];
    if (a.mode >= MV_GLU_SILU) {
        if (sb.bias) u += ((const float*)sb.bias)[row];
        v = (a.mode == MV_GLU_SILU ? silu_f(v) : gelu_tanh_f(v)) * u;
        out[sa.out_off + row] = v;
    } else {
        float* o = out + sa.out_off + row;
        if (a.mode == MV_ADD) v = *o + v;
        *o = v;
    }
    return v;
}

// Tile t of a launch: its segment (plain modes: segments in order, seg.blocks tiles each) and
// first row.
__device__ __forceinline__ void tile_of(const MvArgs& a, bool glu, u32 t, MvSeg* sa, u32* r0) {
    u32 si = 0;
    if (!glu && a.nseg > 1 && t >= a.seg[0].blocks) {
        t -= a.seg[0].blocks;
        si = 1;
        if (a.nseg > 2 && t >= a.seg[1].blocks) {
            t -= a.seg[1].blocks;
            si = 2;
        }
    }
    *sa = si == 0 ? a.seg[0] : (si == 1 ? a.seg[1] : a.seg[2]);
    *r0 = t * a.rpb;
}

// x (f32 [a.cols]), RMS-normed by a.norm if not 0, into xs at XPAD floats per 32-element unit.
// Every thread of the block (MV_T) takes part; red: MV_RED floats of scratch.
__device__ __forceinline__ void stage_x(const MvArgs& a, float* xs, float* red) {
    const u32 tid = threadIdx.x;
    const F4* x4 = (const F4*)x_row(a);
    const F4* g4 = (const F4*)a.norm;
    float ss = 0.f;
    for (u32 i = tid; i < (a.cols >> 2); i += MV_T) {
        F4 v = x4[i];
        const u32 e = 4 * i;
        *(F4*)(xs + (e >> 5) * XPAD + (e & 31)) = v;
        ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    if (a.norm) {
        ss = block_sum(ss, red);
        const float inv = 1.0f / sqrtf(ss / (float)a.cols + a.eps);
        for (u32 i = tid; i < (a.cols >> 2); i += MV_T) {
            const u32 e = 4 * i;
            F4* p = (F4*)(xs + (e >> 5) * XPAD + (e & 31));
            F4 v = *p, g = g4[i];
            v.x = v.x * inv * g.x;
            v.y = v.y * inv * g.y;
            v.z = v.z * inv * g.z;
            v.w = v.w * inv * g.w;
            *p = v;
        }
    }
    __syncthreads();
}

// PERSIST: at most `tiles` blocks; block b takes tiles b, b + gridDim.x, ... (the input is
// prepared once per block, and the next tile's first weights load while a tile ends): for
// products with more tiles than resident blocks. Otherwise one block per tile.
template <bool PERSIST, bool Q8>
__device__ __forceinline__ void matvec_body(const MvArgs& a) {
    extern __shared__ __align__(16) u8 smem[];
    const u32 tid = threadIdx.x;
    const u32 units = a.cols >> 5;
    float* xs = (float*)smem;                     // units * XPAD floats (a multiple of 16 bytes)
    u8* stage = smem + (Q8 ? units * Q8U : units * XPAD * 4);  // MV_S * MV_STAGE bytes
    float* red = (float*)(stage + MV_S * MV_STAGE);      // MV_RED floats

    const bool glu = a.mode >= MV_GLU_SILU;
    const MvSeg sb = a.seg[1];
    const u32 rpb = a.rpb;
    const u32 nr = glu ? 2 * rpb : rpb;
    const u32 G = MV_T / nr;
    // This thread's row slot (in every tile).
    const u32 k = tid / G, j = tid % G;
    const bool kb = glu && k >= rpb;

    const u32 slot16 = a.stride >> 4;
    const u32 nslots = nr * slot16;
    const u32 nchunks = (a.cols + a.chunk - 1) / a.chunk;
    const u32 bx = mv_bx(a), gx = mv_gx(a);
    const u32 ntile = PERSIST ? (a.tiles - bx + gx - 1) / gx : 1;
    const u32 total = ntile * nchunks;

    // Copies the weights of step `it` (tile bx + (it / nchunks) * gx, chunk
    // it % nchunks) into stage it % MV_S; then commits a group (empty past the last step, so
    // that every step is one group).
    auto issue = [&](u32 it) {
        if (it < total) {
            MvSeg sa;
            u32 r0;
            tile_of(a, glu, PERSIST ? bx + (it / nchunks) * gx : bx, &sa, &r0);
            const u32 e0 = (PERSIST ? it % nchunks : it) * a.chunk;
            const u32 ne = min(a.chunk, a.cols - e0);
            u8* st = stage + (it % MV_S) * MV_STAGE;
            if (a.stride == 0) {
                // One 16-byte aligned cover of rows r0.. of sa (GLU: and of sb) per copy.
                const u32 nm = glu ? 2 : 1;
                const u32 cap16 = MV_STAGE / 16 / nm;
#pragma unroll
                for (u32 m = 0; m < nm; ++m) {
                    const MvSeg seg = m ? sb : sa;
                    const u64 start = seg.w + (u64)r0 * seg.row_bytes;
                    const u64 al = start & ~(u64)15;
                    const u64 end = start + (u64)min(rpb, seg.rows - r0) * seg.row_bytes;
                    const u32 n16 = (u32)((end - al + 15) >> 4);
#pragma unroll
                    for (int q = 0; q < MV_LPT; ++q) {
                        const u32 s = tid + q * MV_T;
                        if (s < n16 && s < cap16) cp16(st + m * (MV_STAGE / 2) + 16 * s, al + 16 * (u64)s);
                    }
                }
                cp_commit();
                return;
            }
#pragma unroll
            for (int q = 0; q < MV_LPT; ++q) {
                const u32 s = tid + q * MV_T;
                if (s < nslots) {
                    const u32 kk = s / slot16, c16 = s % slot16;
                    const bool b2 = glu && kk >= rpb;
                    const MvSeg seg = b2 ? sb : sa;
                    const u32 row = r0 + (b2 ? kk - rpb : kk);
                    if (row < seg.rows) {
                        u64 start;
                        u32 len;
                        chunk_range(seg, row, e0, ne, &start, &len);
                        const u64 al = start & ~(u64)15;
                        const u64 end = (start + len + 15) & ~(u64)15;
                        const u64 p = al + 16 * (u64)c16;
                        if (p < end) cp16(st + kk * a.stride + c16 * 16, p);
                    }
                }
            }
        }
        cp_commit();
    };

    // The first MV_S - 1 steps' weights are in flight while the kernels before finish and the
    // input is prepared (weights are never written: safe before pdl_wait).
#pragma unroll
    for (u32 q = 0; q + 1 < MV_S; ++q) issue(q);
    pdl_wait();
    pdl_launch();

    // Prologue: x (optionally RMS-normed) into shared memory; Q8: the quantized input.
    if (Q8) {
        const U4* q4 = (const U4*)x_row(a);
        for (u32 i = tid; i < units * (Q8U / 16); i += MV_T) ((U4*)smem)[i] = q4[i];
    } else {
        stage_x(a, xs, red);
    }

    float* wpart = red;        // MV_T / 32 warp sums
    float* rowv = red + 32;    // nr row values
    const u32 lane = tid & 31, warp = tid >> 5;
    float acc = 0.f;
    for (u32 it = 0; it < total; ++it) {
        const u32 tile = PERSIST ? bx + (it / nchunks) * gx : bx;
        const u32 c = PERSIST ? it % nchunks : it;
        MvSeg sa;
        u32 r0;
        tile_of(a, glu, tile, &sa, &r0);
        const MvSeg sk = kb ? sb : sa;
        const u32 krow = r0 + (kb ? k - rpb : k);
        cp_wait<MV_S - 2>();  // this thread's copies of step it have landed
        // Every thread's copies of step it are visible, xs is complete, and step it - 1's
        // readers are done with the stage that step it + MV_S - 1 refills.
        __syncthreads();
        issue(it + MV_S - 1);
        const u8* st = stage + (it % MV_S) * MV_STAGE;
        if (krow < sk.rows) {
            const u32 e0 = c * a.chunk;
            const u32 ne = min(a.chunk, a.cols - e0);
            u64 start;
            u32 len;
            chunk_range(sk, krow, e0, ne, &start, &len);
            const u32 kk = kb ? k - rpb : k;
            const u8* base = a.stride ? st + k * a.stride + (u32)(start & 15)
                                      : st + (kb ? MV_STAGE / 2 : 0) + (u32)((sk.w + (u64)r0 * sk.row_bytes) & 15) +
                                            kk * sk.row_bytes;
            const float* xc = xs + (e0 >> 5) * XPAD;
            const u32 nu = ne >> 5;
            if (Q8) {
#define MV_CALL(F) acc += mv_units_q8<F>(base, nu, j, G, smem + (e0 >> 5) * Q8U)
                FMT_DISPATCH_Q8(sk.fmt, MV_CALL)
#undef MV_CALL
            } else {
#define MV_CALL(F) acc += mv_units<F>(base, nu, j, G, xc)
                FMT_DISPATCH(sk.fmt, MV_CALL)
#undef MV_CALL
            }
        }
        if (c + 1 < nchunks) continue;

        // End of a tile: sum over the G threads of each group, in a fixed order.
        const u32 gw = G < 32 ? G : 32;
        for (u32 o = gw >> 1; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (G > 32) {
            if (lane == 0) wpart[warp] = acc;
            __syncthreads();
            if (j == 0) {
                float sum = 0.f;
                for (u32 w = 0; w < G / 32; ++w) sum += wpart[k * (G / 32) + w];
                rowv[k] = sum;
            }
        } else if (j == 0) {
            rowv[k] = acc;
        }
        acc = 0.f;
        __syncthreads();
        if (tid < rpb) {
            const u32 row = r0 + tid;
            if (row < sa.rows) rowv[tid] = mv_epilogue(a, sa, sb, row, rowv[tid], glu ? rowv[rpb + tid] : 0.f, out_row(a));
        }
        if (a.argmax) {
            __syncthreads();
            if (tid == 0) {
                float best = neg_inf<float>();
                u32 bidx = r0;
                for (u32 t = 0; t < rpb && r0 + t < sa.rows; ++t) {
                    if (rowv[t] > best) {
                        best = rowv[t];
                        bidx = r0 + t;
                    }
                }
                ArgPart p;
                p.v = best;
                p.i = bidx;
                ((ArgPart*)a.argmax)[tile] = p;
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(MV_T, 6) matvec(const MvArgs a) { matvec_body<false, false>(a); }
extern "C" __global__ void __launch_bounds__(MV_T, 6) matvec_persist(const MvArgs a) { matvec_body<true, false>(a); }
// a.x: the q8 units of the input (quantize_q8), a.norm unused.
extern "C" __global__ void __launch_bounds__(MV_T, 6) matvec_q8(const MvArgs a) { matvec_body<false, true>(a); }
extern "C" __global__ void __launch_bounds__(MV_T, 6) matvec_q8_persist(const MvArgs a) { matvec_body<true, true>(a); }

// ---- Register kernels: weights straight into registers ----
// Products over split rows (quant.cuh) or Q4_K rows (as in the file), gate and up of one format
// (Mvr<F> below): no staging. A block's MVR_W warps each take one tile of
// R = a.rpb rows of a segment (GLU: R rows of gate and the same rows of up), NS row streams (R,
// GLU 2R). Lane l takes items (Mvr<F>: a block, or half a Q4_K block) l, l + 32, ... of each of
// its rows, K of them a step; the next step's weights load while one step is
// computed (two register buffers), and the first step's before pdl_wait. Each row's sum is
// reduced over the warp in a fixed order (deterministic). Q8: the input's q8 units are read from
// global memory through L1 (the block's warps share them); else x, RMS-normed, is staged in
// shared memory as in matvec. Argmax partials: one per tile.
#define MVR_W 4
// Row streams per warp (R = 2 rows, GLU 1 row of gate and 1 of up): more warps beat more
// independent loads per thread (on an H100 80GB HBM3, 8B-shaped Q4_0 decode at 4 streams:
// 398 tok/s, at 2: 417).
#define MVR_NS 2

// dot(split block, q8 unit): dq8<F> term for term.
template <int F>
__device__ __forceinline__ float sp_dq8(const SpUnit& s, const Q8W& xv, const float2 ds) {
    int acc = 0;
    if (F == FMT_Q8_0) {
#pragma unroll
        for (int w = 0; w < 8; ++w) acc = __dp4a((int)sp_word(s, w), xv.w[w], acc);
        return h2f(s.h & 0xffffu) * ds.x * (float)acc;
    }
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        const u32 v = sp_word(s, w);
        int lo = (int)(v & 0x0f0f0f0fu), hi = (int)((v >> 4) & 0x0f0f0f0fu);
        if (sp_qh<F>()) {
            lo |= bits4(s.qh >> (4 * w));
            hi |= bits4(s.qh >> (16 + 4 * w));
        }
        acc = __dp4a(lo, xv.w[w], acc);
        acc = __dp4a(hi, xv.w[w + 4], acc);
    }
    const float d = h2f(s.h & 0xffffu);
    if (F == FMT_Q4_0) return d * (ds.x * (float)acc - 8.0f * ds.y);
    if (F == FMT_Q5_0) return d * (ds.x * (float)acc - 16.0f * ds.y);
    return d * ds.x * (float)acc + h2f(s.h >> 16) * ds.y;  // Q4_1, Q5_1
}

__device__ __forceinline__ bool arg_better(float v, u32 i, float bv, u32 bi) {
    return v > bv || (v == bv && i < bi);
}

// What the register kernels read of a row of format F: items of UPI 32-element units, K items
// a step per lane. 32-element split formats: an item is a block (SpUnit). Q4_K (GGUF layout: its
// 144-byte blocks keep 16-byte alignment): an item is half a block, 4 units, loaded as the
// block's 16-byte header and the 64 quant bytes of those units.
template <int F> struct Mvr {
    static constexpr int UPI = 1;
    // Blocks a lane loads a step (double-buffered): 1 is fastest for 8B-shaped Q4_0 decode on an
    // H100 (tok/s at K = 1, 2, 3, 4: 418, 403, 388, 410); Q4_K's 4-unit items at K = 2: 293 vs 337.
    static constexpr int K = 1;
    typedef SpUnit Item;
    static __device__ __forceinline__ Item load(u64 row, u32 units, u32 t) { return sp_load<F>(row, units, t); }
    static __device__ __forceinline__ float q8(const Item& it, int, const Q8W& xv, float2 ds) {
        return sp_dq8<F>(it, xv, ds);
    }
    static __device__ __forceinline__ void f32(const Item& it, int, float* y) { sp_deq<F>(it, y); }
};

struct K4Item {
    U4 h;     // d, dmin (f16), scales[12]
    U4 q[4];  // qs[64 hh .. 64 hh + 64)
    u32 hh;   // which half of the block
};

template <> struct Mvr<FMT_Q4_K> {
    static constexpr int UPI = 4;
    static constexpr int K = 1;
    typedef K4Item Item;
    static __device__ __forceinline__ Item load(u64 row, u32, u32 t) {
        Item it;
        const u64 b = row + (u64)(t >> 1) * 144;
        it.hh = t & 1;
        it.h = ld_stream(b);
#pragma unroll
        for (int i = 0; i < 4; ++i) it.q[i] = ld_stream(b + 16 + 64 * it.hh + 16 * i);
        return it;
    }
    // Unit g = 4 hh + i of the block: scale_min_k4 on the header words; its quants are nibble
    // (i & 1) of q[2 (i >> 1)], q[2 (i >> 1) + 1].
    static __device__ __forceinline__ void scale_min(const Item& it, int i, int* sc, int* mn) {
        const u32 lo = (it.h.y >> (8 * i)) & 0xffu, mid = (it.h.z >> (8 * i)) & 0xffu, hi = (it.h.w >> (8 * i)) & 0xffu;
        *sc = (int)(it.hh ? (hi & 0xFu) | ((lo >> 6) << 4) : lo & 63u);
        *mn = (int)(it.hh ? (hi >> 4) | ((mid >> 6) << 4) : mid & 63u);
    }
    static __device__ __forceinline__ u32 word(const Item& it, int i, int w) {
        const U4& v = it.q[2 * (i >> 1) + (w >> 2)];
        const u32 x = (w & 3) == 0 ? v.x : (w & 3) == 1 ? v.y : (w & 3) == 2 ? v.z : v.w;
        return x >> (4 * (i & 1));
    }
    // dq8<FMT_Q4_K> term for term.
    static __device__ __forceinline__ float q8(const Item& it, int i, const Q8W& xv, float2 ds) {
        int sc, mn;
        scale_min(it, i, &sc, &mn);
        int acc = 0;
#pragma unroll
        for (int w = 0; w < 8; ++w) acc = __dp4a((int)(word(it, i, w) & 0x0f0f0f0fu), xv.w[w], acc);
        return h2f(it.h.x & 0xffffu) * (float)sc * ds.x * (float)acc - h2f(it.h.x >> 16) * (float)mn * ds.y;
    }
    // deq<FMT_Q4_K> term for term.
    static __device__ __forceinline__ void f32(const Item& it, int i, float* y) {
        int sc, mn;
        scale_min(it, i, &sc, &mn);
        const float d1 = h2f(it.h.x & 0xffffu) * (float)sc, m1 = h2f(it.h.x >> 16) * (float)mn;
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const u32 v = word(it, i, w);
#pragma unroll
            for (int k = 0; k < 4; ++k) y[4 * w + k] = d1 * qf((v >> (8 * k)) & 15u, 0.0f) - m1;
        }
    }
};

// Q6_K split rows: an item is half a block, 4 units (quant.cuh, Q6Item).
template <> struct Mvr<FMT_Q6_K> {
    static constexpr int UPI = 4;
    static constexpr int K = 1;
    typedef Q6Item Item;
    static __device__ __forceinline__ Item load(u64 row, u32 units, u32 t) {
        return q6s_load(row, units >> 3, t >> 1, t & 1);
    }
    // dq8<FMT_Q6_K> term for term.
    static __device__ __forceinline__ float q8(const Item& it, int i, const Q8W& xv, float2 ds) {
        int s0, s1;
        q6s_scales(it, i, &s0, &s1);
        int a0 = 0, a1 = 0;
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const int q = (int)q6s_word(it, i, w);
            // sum (q - 32) x = sum q x - 32 sum x
            if (w < 4) {
                a0 = __dp4a(q, xv.w[w], a0);
                a0 = __dp4a((int)0xe0e0e0e0u, xv.w[w], a0);
            } else {
                a1 = __dp4a(q, xv.w[w], a1);
                a1 = __dp4a((int)0xe0e0e0e0u, xv.w[w], a1);
            }
        }
        return h2f(it.d) * ds.x * ((float)s0 * (float)a0 + (float)s1 * (float)a1);
    }
    static __device__ __forceinline__ void f32(const Item& it, int i, float* y) { q6s_deq(it, i, y); }
};

// F32: the caller has waited for the kernels before (pdl_wait) and staged x (stage_x: a
// block-wide step, taken once before a launch's warps go their formats' ways). Q8: the first
// step's weights load before pdl_wait.
// NB > 1 (Q8 only): the block's warps take their tiles for up to NB input rows of the batch
// (a.rpg rows from mv_row0), each weight item loaded once for all of them; every row's sum
// takes the same terms in the same order as with NB = 1 (bit for bit the one-row result).
template <bool Q8, int NS, int F, int NB>
__device__ __forceinline__ void mvr_run(const MvArgs& a) {
    extern __shared__ __align__(16) u8 smem[];
    typedef Mvr<F> M;
    constexpr int K = M::K, UPI = M::UPI;
    typedef typename M::Item Item;
    const u32 lane = threadIdx.x & 31;
    const u32 tile = mv_bx(a) * MVR_W + (threadIdx.x >> 5);
    const u32 nb = NB == 1 ? 1u : min((u32)NB, a.nrows - mv_row0(a));
    const u64 xbase = x_row(a);
    const bool live = tile < a.tiles;
    const bool glu = a.mode >= MV_GLU_SILU;
    const u32 units = a.cols >> 5;
    const u32 n = units / UPI;  // items a row
    const u32 R = a.rpb;
    MvSeg sa;
    u32 r0;
    tile_of(a, glu, live ? tile : 0, &sa, &r0);
    const MvSeg sb = a.seg[1];
    u64 rp[NS];
#pragma unroll
    for (int s = 0; s < NS; ++s) {
        const bool up = glu && (u32)s >= R;
        const MvSeg& g = up ? sb : sa;
        const u32 row = min(r0 + (up ? (u32)s - R : (u32)s), g.rows - 1);  // past the end: a copy, unused
        rp[s] = g.w + (u64)row * g.row_bytes;
    }
    const u32 steps = live ? (n + 32 * K - 1) / (32 * K) : 0;

    Item wa[K][NS], wb[K][NS];
    auto load = [&](Item (&w)[K][NS], u32 st) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const u32 t = (st * K + k) * 32 + lane;
            if (t < n) {
#pragma unroll
                for (int s = 0; s < NS; ++s) w[k][s] = M::load(rp[s], units, t);
            }
        }
    };
    float acc[NB][NS];
#pragma unroll
    for (int b = 0; b < NB; ++b) {
#pragma unroll
        for (int s = 0; s < NS; ++s) acc[b][s] = 0.f;
    }
    const float* xs = (const float*)smem;
    auto comp = [&](const Item (&w)[K][NS], u32 st) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            const u32 t = (st * K + k) * 32 + lane;
            if (t < n) {
#pragma unroll
                for (int i = 0; i < UPI; ++i) {
                    const u32 u = t * UPI + i;
                    if (Q8) {
#pragma unroll
                        for (int b = 0; b < NB; ++b) {
                            if ((u32)b < nb) {
                                const int4* xq = (const int4*)(xbase + (u64)b * a.xstride + (u64)u * Q8U);
                                const int4 lo = __ldg(xq), hi = __ldg(xq + 1);
                                const float2 ds = __ldg((const float2*)(xq + 2));
                                Q8W xv;
                                xv.w[0] = lo.x, xv.w[1] = lo.y, xv.w[2] = lo.z, xv.w[3] = lo.w;
                                xv.w[4] = hi.x, xv.w[5] = hi.y, xv.w[6] = hi.z, xv.w[7] = hi.w;
#pragma unroll
                                for (int s = 0; s < NS; ++s) acc[b][s] += M::q8(w[k][s], i, xv, ds);
                            }
                        }
                    } else {
#pragma unroll
                        for (int s = 0; s < NS; ++s) {
                            float y[32];
                            M::f32(w[k][s], i, y);
                            acc[0][s] += dot32(y, xs + u * XPAD);
                        }
                    }
                }
            }
        }
    };

    if (steps) load(wa, 0);  // weights are never written: safe before pdl_wait
    if (Q8) {
        pdl_wait();
        pdl_launch();
    }
    for (u32 st = 0; st < steps; st += 2) {
        if (st + 1 < steps) load(wb, st + 1);
        comp(wa, st);
        if (st + 2 < steps) load(wa, st + 2);
        if (st + 1 < steps) comp(wb, st + 1);
    }
    if (!live) return;

    const u32 row = r0 + lane;
    const bool mine = lane < R && row < sa.rows;
    float v = 0.f;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
        if ((u32)b >= nb) break;
#pragma unroll
        for (int s = 0; s < NS; ++s) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[b][s] += __shfl_xor_sync(0xffffffffu, acc[b][s], o);
        }
        // Lane i < R finishes row r0 + i.
        float u = 0.f;
        v = 0.f;
#pragma unroll
        for (int s = 0; s < NS; ++s) {
            if ((u32)s == lane) v = acc[b][s];
            if (glu && (u32)s == lane + R) u = acc[b][s];
        }
        if (mine) v = mv_epilogue(a, sa, sb, row, v, u, out_row(a) + (u64)b * a.ostride);
    }
    if (a.argmax) {  // one-row launches only
        float best = mine ? v : neg_inf<float>();
        u32 bi = mine ? row : r0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (arg_better(ov, oi, best, bi)) {
                best = ov;
                bi = oi;
            }
        }
        if (lane == 0) {
            ArgPart p;
            p.v = best;
            p.i = bi;
            ((ArgPart*)a.argmax)[tile] = p;
        }
    }
}

// F32 mode, before the warps of a block go their formats' ways: wait for the kernels before,
// then stage x (a block-wide step).
__device__ __forceinline__ void mvr_stage_f32(const MvArgs& a) {
    extern __shared__ __align__(16) u8 smem[];
    pdl_wait();
    pdl_launch();
    stage_x(a, (float*)smem, (float*)(smem + (a.cols >> 5) * XPAD * 4));
}

// The segments of a launch may differ in format (not gate and up): each warp runs its tile's.
template <bool Q8, int NS, int NB>
__device__ __forceinline__ void mvr_body(const MvArgs& a) {
    if (!Q8) mvr_stage_f32(a);
    const u32 tile = mv_bx(a) * MVR_W + (threadIdx.x >> 5);
    MvSeg sa;
    u32 r0;
    tile_of(a, a.mode >= MV_GLU_SILU, tile < a.tiles ? tile : 0, &sa, &r0);
    // the register kernels' formats are the fast mode's
#define MVR_CALL(F) mvr_run<Q8, NS, F, NB>(a)
    FMT_DISPATCH_Q8(sa.fmt & 15u, MVR_CALL)
#undef MVR_CALL
}

// Launches of one format take that format's kernel (registers as that format needs: one kernel
// holding every format's path takes the most any needs, and the Q4_0 products lost 13% that
// way); launches mixing formats take mvr_mixed / mvr_q8_mixed.
template <bool Q8, int F, int NB>
__device__ __forceinline__ void mvr_one(const MvArgs& a) {
    if (!Q8) mvr_stage_f32(a);
    mvr_run<Q8, MVR_NS, F, NB>(a);
}

// Input rows per block of the batched register kernels (mvrb_q8_*: fast mode, 2..MVR_NB rows
// a group).
#define MVR_NB 8

#define MVR_KERNELS(F, NAME) \
    extern "C" __global__ void __launch_bounds__(MVR_W * 32) mvr_##NAME(const MvArgs a) { mvr_one<false, F, 1>(a); } \
    extern "C" __global__ void __launch_bounds__(MVR_W * 32) mvr_q8_##NAME(const MvArgs a) { mvr_one<true, F, 1>(a); } \
    extern "C" __global__ void __launch_bounds__(MVR_W * 32) mvrb_q8_##NAME(const MvArgs a) { mvr_one<true, F, MVR_NB>(a); }
MVR_KERNELS(FMT_Q4_0, q4_0)
MVR_KERNELS(FMT_Q4_1, q4_1)
MVR_KERNELS(FMT_Q5_0, q5_0)
MVR_KERNELS(FMT_Q5_1, q5_1)
MVR_KERNELS(FMT_Q8_0, q8_0)
MVR_KERNELS(FMT_Q4_K, q4_k)
MVR_KERNELS(FMT_Q6_K, q6_k)
#undef MVR_KERNELS
extern "C" __global__ void __launch_bounds__(MVR_W * 32) mvr_mixed(const MvArgs a) { mvr_body<false, MVR_NS, 1>(a); }
extern "C" __global__ void __launch_bounds__(MVR_W * 32) mvr_q8_mixed(const MvArgs a) { mvr_body<true, MVR_NS, 1>(a); }
extern "C" __global__ void __launch_bounds__(MVR_W * 32) mvrb_q8_mixed(const MvArgs a) { mvr_body<true, MVR_NS, MVR_NB>(a); }

// A compile-time bool as a type (a generic lambda's argument).
template <bool B> struct BoolK {
    static constexpr bool value = B;
};

// ---- Tensor-core batched products (fast mode, split 32-element formats) ----
// mmq_<fmt>_n<NT>: a batch of input rows (8-bit units) times a split matrix of Q4_0, Q4_1,
// Q5_0, Q5_1 or Q8_0 on int8 tensor cores. One mma.m16n8k32 (s8 x s8 -> s32) takes one
// 32-element unit of 16 weight rows (their quants as bytes: 0..15 / 0..31 unsigned, Q8_0's
// signed) and of 8 input rows (their qs); each unit's integer sums are then scaled as the
// dp4a kernels scale theirs (Q4_0: d_w (d_x acc - 8 s_x), Q5_0: -16, Q4_1/Q5_1:
// d_w d_x acc + m_w s_x, Q8_0: d_w d_x acc) and added in f32, unit after unit.
// Tiles: MQ_W weight tiles a block, WX warps each (1, or 2 for the mmq2_*_n2_w2 kernels); a
// warp takes its tile's 32 rows of one segment as two 16-row m-tiles (GLU: 16 rows of gate and
// the same 16 rows of up; a.rpb = 32, GLU 16) for NT 8-row n-tiles of input rows, the tile's
// WX warps each their own (a.rpg = 8 NT WX rows a block group). Each stage of MQ_KU units is
// copied into shared memory (cp.async, two buffers: the next stage's copies fly while one is
// computed): the group's input units, shared by the block's warps (rows MQ_XS bytes apart),
// and each tile's weight rows, copied by its WX warps (whole 16-byte pieces of the split rows;
// padded rows: fragment reads without bank conflicts).
// Split K: with a.chunk = KS > 1 splits, the blocks of a tile take KS slices of the units
// (grid: group fastest, then split, then the block's tiles) and store their sums as partials
// f32 [KS][input rows][a.stride] at a.argmax (output row p of the launch: segment rows back to
// back; GLU: gate rows, then up rows); mmq_reduce adds them in split order and applies the
// epilogue. Deterministic, but not the register kernels' summation order: a row's result
// differs from the one-row launch's in the last bits.
#define MQ_W 4
#define MQ_KU 4
// Bytes of an input unit (Q8U, or Q8X2U for the two-level inputs), and between input rows of
// a stage in shared memory.
template <bool X2> __device__ __forceinline__ constexpr u32 mq_xu() { return X2 ? Q8X2U : Q8U; }
template <bool X2> __device__ __forceinline__ constexpr u32 mq_xs() { return MQ_KU * mq_xu<X2>() + 16; }

// Shared memory of a warp's weights for one stage: 32 rows of MQ_KU units' quants
// (mq_qs(F) bytes a row, padded: fragment reads without bank conflicts), their d (and m)
// fields (MQ_KU * sp_h) and qh words (Q5 formats: MQ_KU * 4).
template <int F> __device__ __forceinline__ constexpr u32 mq_qs() { return MQ_KU * sp_q<F>() + 16; }
template <int F> __device__ __forceinline__ constexpr u32 mq_wbytes() {
    return 32 * (mq_qs<F>() + MQ_KU * sp_h<F>() + MQ_KU * sp_qh<F>());
}

// 8 bytes from global to shared memory (asynchronously on sm_80+).
__device__ __forceinline__ void cp8(u8* dst, u64 src) {
#if __CUDA_ARCH__ >= 800
    const u32 d = (u32)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(d), "l"(src) : "memory");
#else
    *(unsigned long long*)dst = *(const unsigned long long*)src;
#endif
}

// The A-fragment bytes of thread t for a unit of a staged row: elements 4t..4t+3 (lo) and
// 16+4t..16+4t+3 (hi). q: the unit's staged quants; qh: its qh word (Q5 formats).
template <int F> __device__ __forceinline__ void mq_frag(const u8* q, u32 qh, u32 t, u32* lo, u32* hi) {
    if (F == FMT_Q8_0 || F == FMT_Q6_KU) {
        *lo = *(const u32*)(q + 4 * t);
        *hi = *(const u32*)(q + 16 + 4 * t);
        return;
    }
    const u32 w = *(const u32*)(q + 4 * t);
    u32 l = w & 0x0f0f0f0fu, h = (w >> 4) & 0x0f0f0f0fu;
    if (sp_qh<F>()) {
        l |= (u32)bits4(qh >> (4 * t));
        h |= (u32)bits4(qh >> (16 + 4 * t));
    }
    *lo = l;
    *hi = h;
}

// The input unit's term that does not depend on the weights' quants: -8 s (Q4_0), -16 s
// (Q5_0), s (Q4_1, Q5_1: times the row's m), 0 (Q8_0).
template <int F> __device__ __forceinline__ float mq_off(float s) {
    return F == FMT_Q4_0 ? -8.0f * s : F == FMT_Q5_0 ? -16.0f * s : (F == FMT_Q8_0 || F == FMT_Q6_KU) ? 0.0f : s;
}

// acc + one unit's contribution from its integer sum c, the weight row's scale d (and m) and
// the input unit's scale dx and offset term o (mq_off): sp_dq8's scaling, as fused multiply-adds.
template <int F> __device__ __forceinline__ float mq_add(float acc, float d, float m, int c, float dx, float o) {
    if (F == FMT_Q4_1 || F == FMT_Q5_1 || F == FMT_Q4_KU) return fmaf(d, dx * (float)c, fmaf(m, o, acc));
    return fmaf(d, fmaf(dx, (float)c, o), acc);
}

// c += A B over one 32-element unit: mma.m16n8k32, s8 x s8 -> s32, A fragment a0..a3, B
// fragment b0, b1.
__device__ __forceinline__ void mma_s8(int* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One unit's integer sums c of the A fragment a0..a3 and the B fragment b0, b1; X2: then
// shifted left by 8 and the residual bytes' product (l0, l1) accumulated onto them: 256 hi + lo.
template <bool X2>
__device__ __forceinline__ void mq_mma(u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1, u32 l0, u32 l1, int* c) {
    c[0] = c[1] = c[2] = c[3] = 0;
    mma_s8(c, a0, a1, a2, a3, b0, b1);
    if (X2) {
#pragma unroll
        for (int k = 0; k < 4; ++k) c[k] <<= 8;
        mma_s8(c, a0, a1, a2, a3, l0, l1);
    }
}

// mq_mma<true> with the two products independent (each from zero), then 256 hi + lo: the
// same integers without the second product waiting on the first.
__device__ __forceinline__ void mq_mma_hl(u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1, u32 l0, u32 l1, int* c) {
    int h[4] = {0, 0, 0, 0}, l[4] = {0, 0, 0, 0};
    mma_s8(h, a0, a1, a2, a3, b0, b1);
    mma_s8(l, a0, a1, a2, a3, l0, l1);
#pragma unroll
    for (int k = 0; k < 4; ++k) c[k] = h[k] * 256 + l[k];
}

// The launch's output row (partials index) of row `row` of the segment of tile t.
__device__ __forceinline__ u32 mq_prow(const MvArgs& a, bool glu, u32 t, u32 row) {
    if (glu || a.nseg == 1 || t < a.seg[0].blocks) return row;
    if (a.nseg == 2 || t < a.seg[0].blocks + a.seg[1].blocks) return a.seg[0].rows + row;
    return a.seg[0].rows + a.seg[1].rows + row;
}

// X2: two-level inputs (Q8X2U units): per unit the hi product c, then the lo bytes' product
// accumulated onto 256 c in the same integers (|256 c| < 2^28 for every format), scaled by
// d / 256: the CPU's fused q8x2 sum.
template <int F, int NT, bool X2, int WX = 1>
__device__ __forceinline__ void mmq_run(const MvArgs& a) {
#if __CUDA_ARCH__ >= 800
    // dynamic: inputs [2][8 NT WX][MQ_XS], then weights [2][MQ_W][mq_wbytes]
    extern __shared__ __align__(16) u8 smem[];
    constexpr u32 MQ_XS = mq_xs<X2>(), XU = mq_xu<X2>(), XP = XU / 16;
    constexpr u32 XB = 8 * NT * WX * MQ_XS, WB = mq_wbytes<F>(), QS = mq_qs<F>();
    constexpr u32 SQ = sp_q<F>(), SH = sp_h<F>(), SQH = sp_qh<F>();
    // two-level products as independent hi and lo chains (mq_mma_hl) where the registers allow:
    // with WX = 1 the extra sums cost a block a multiprocessor
    constexpr bool HL = X2 && WX > 1;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    // warp (wt, xg): weight tile wt of the block's MQ_W, input rows [8 NT xg, 8 NT (xg + 1))
    const u32 wt = warp % MQ_W, xg = warp / MQ_W;
    const u32 groups = mv_groups(a), ks_n = max(a.chunk, 1u);
    const u32 grp = blockIdx.x % groups, ks = (blockIdx.x / groups) % ks_n, tb = blockIdx.x / groups / ks_n;
    const u32 tile = tb * MQ_W + wt;
    const bool live = tile < a.tiles;
    const bool glu = a.mode >= MV_GLU_SILU;
    const u32 row0 = grp * a.rpg;
    const u32 nb = min((u32)(8 * NT * WX), a.nrows - row0);
    // this warp's input rows: [wrow0, wrow0 + wnb)
    const u32 wrow0 = row0 + 8 * NT * xg;
    const u32 wnb = nb > 8 * NT * xg ? min((u32)(8 * NT), nb - 8 * NT * xg) : 0u;
    const u32 units = a.cols >> 5;
    // this split's units: [ub, ue), whole stages
    const u32 per = ((units + ks_n - 1) / ks_n + MQ_KU - 1) / MQ_KU * MQ_KU;
    const u32 ub = min(units, ks * per), ue = min(units, ub + per);
    const u32 su = ue - ub;  // stage st covers units [st MQ_KU, st MQ_KU + MQ_KU) of these
    const u32 stages = (su + MQ_KU - 1) / MQ_KU;
    MvSeg sa;
    u32 r0;
    tile_of(a, glu, live ? tile : 0, &sa, &r0);
    const MvSeg sb = a.seg[1];
    float acc[2][NT][4];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
#pragma unroll
        for (int j = 0; j < NT; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.f;
        }
    }
    const u64 xbase = a.x + (u64)row0 * a.xstride + (u64)ub * XU;
    // Stage st into buffer st & 1: the block's input units (rows past nb are left as they
    // are: their columns are never stored), and this warp's share (1 / WX, with the other
    // warps of its weight tile) of the tile's 32 weight rows (local row lr:
    // r0 + lr; GLU: gate rows r0 + lr, lr < 16, then up rows r0 + lr - 16; rows past the
    // segment's end read its last row, unused).
    auto stage_in = [&](u32 st) {
        u8* xd = smem + (st & 1) * XB;
        const u32 n = nb * MQ_KU * XP;
        for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
            const u32 r = i / (MQ_KU * XP), rem = i % (MQ_KU * XP), uu = rem / XP, p = rem % XP;
            const u32 u = st * MQ_KU + uu;
            if (u < su) cp16(xd + r * MQ_XS + uu * XU + p * 16, xbase + (u64)r * a.xstride + (u64)u * XU + p * 16);
        }
        u8* wd = smem + 2 * XB + ((st & 1) * MQ_W + wt) * WB;
        const u32 u0 = ub + st * MQ_KU;
        constexpr u32 QP = MQ_KU * SQ / 16;  // 16-byte pieces of a row's quants
        for (u32 i = lane + 32 * xg; i < 32 * QP; i += 32 * WX) {
            const u32 lr = i / QP, p = i % QP;
            const bool up = glu && lr >= 16;
            const MvSeg& s = up ? sb : sa;
            const u32 row = min(r0 + (up ? lr - 16 : lr), s.rows - 1);
            const u64 rp = s.w + (u64)row * s.row_bytes;
            if (u0 + (p * 16) / SQ < ue) cp16(wd + lr * QS + p * 16, rp + (u64)u0 * SQ + p * 16);
        }
        // d (and m) fields, then qh words: MQ_KU * SH and MQ_KU * 4 bytes a row, 8 at a time
        constexpr u32 HP = MQ_KU * SH / 8, QHP = MQ_KU * SQH / 8;
        for (u32 i = lane + 32 * xg; i < 32 * (HP + QHP); i += 32 * WX) {
            const u32 lr = i / (HP + QHP), p = i % (HP + QHP);
            const bool up = glu && lr >= 16;
            const MvSeg& s = up ? sb : sa;
            const u32 row = min(r0 + (up ? lr - 16 : lr), s.rows - 1);
            const u64 rp = s.w + (u64)row * s.row_bytes;
            if (p < HP) {
                if (u0 + p * 8 / SH < ue)
                    cp8(wd + 32 * QS + lr * MQ_KU * SH + p * 8, rp + (u64)units * (SQ + SQH) + (u64)u0 * SH + p * 8);
            } else {
                const u32 q = p - HP;
                if (u0 + q * 2 < ue)
                    cp8(wd + 32 * (QS + MQ_KU * SH) + lr * MQ_KU * 4 + q * 8, rp + (u64)units * SQ + (u64)u0 * 4 + q * 8);
            }
        }
        cp_commit();
    };
    // full: every unit of the stage is in this split, so the stage runs without a test per
    // unit and the compiler may interleave one unit's products with another's sums
    auto comp = [&](u32 st, auto full) {
        const u8* x = smem + (st & 1) * XB + 8 * NT * xg * MQ_XS;
        const u8* wq = smem + 2 * XB + ((st & 1) * MQ_W + wt) * WB;
        const u8* wh = wq + 32 * QS;
        const u8* wqh = wh + 32 * MQ_KU * SH;
#pragma unroll
        for (int uu = 0; uu < MQ_KU; ++uu) {
            if (!decltype(full)::value && st * MQ_KU + uu >= su) break;
            u32 af[2][4];
            float dw[2][2], mw[2][2];
#pragma unroll
            for (int m = 0; m < 2; ++m) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const u32 lr = 16 * m + g + 8 * h;
                    const u32 qh = SQH ? *(const u32*)(wqh + lr * MQ_KU * 4 + uu * 4) : 0u;
                    mq_frag<F>(wq + lr * QS + uu * SQ, qh, t, &af[m][h], &af[m][2 + h]);
                    if (SH == 8) {
                        const float2 f = *(const float2*)(wh + lr * MQ_KU * 8 + uu * 8);
                        dw[m][h] = f.x;
                        mw[m][h] = f.y;
                    } else {
                        const u32 hw = SH == 4 ? *(const u32*)(wh + lr * MQ_KU * 4 + uu * 4)
                                               : (u32) * (const unsigned short*)(wh + lr * MQ_KU * 2 + uu * 2);
                        dw[m][h] = h2f(hw & 0xffffu);
                        mw[m][h] = SH == 4 ? h2f(hw >> 16) : 0.f;
                    }
                }
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const u8* xr = x + (8 * j + g) * MQ_XS + uu * XU;
                const u32 b0 = *(const u32*)(xr + 4 * t), b1 = *(const u32*)(xr + 16 + 4 * t);
                u32 l0 = 0, l1 = 0;
                if (X2) {
                    l0 = *(const u32*)(xr + Q8U + 4 * t);
                    l1 = *(const u32*)(xr + Q8U + 16 + 4 * t);
                }
                // (d, s) of input rows 8 j + 2 t and 8 j + 2 t + 1: the columns this thread holds
                const float2 d0 = *(const float2*)(x + (8 * j + 2 * t) * MQ_XS + uu * XU + 32);
                const float2 d1 = *(const float2*)(x + (8 * j + 2 * t + 1) * MQ_XS + uu * XU + 32);
                const float o0 = mq_off<F>(d0.y), o1 = mq_off<F>(d1.y);
                // X2: the sums are 256 hi + lo, in steps of d / 256 (exact: a power of two)
                const float x0 = X2 ? d0.x * (1.0f / 256.0f) : d0.x, x1 = X2 ? d1.x * (1.0f / 256.0f) : d1.x;
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                    if (F == FMT_Q6_KU) {
                        // elements 0..16 and 16..32 have their own scales (dw, mw): one
                        // product per half, the other half's weight bytes zero
                        int c[4], e[4];
                        mq_mma<X2>(af[m][0], af[m][1], 0u, 0u, b0, b1, l0, l1, c);
                        mq_mma<X2>(0u, 0u, af[m][2], af[m][3], b0, b1, l0, l1, e);
                        acc[m][j][0] = fmaf(dw[m][0], x0 * (float)c[0], fmaf(mw[m][0], x0 * (float)e[0], acc[m][j][0]));
                        acc[m][j][1] = fmaf(dw[m][0], x1 * (float)c[1], fmaf(mw[m][0], x1 * (float)e[1], acc[m][j][1]));
                        acc[m][j][2] = fmaf(dw[m][1], x0 * (float)c[2], fmaf(mw[m][1], x0 * (float)e[2], acc[m][j][2]));
                        acc[m][j][3] = fmaf(dw[m][1], x1 * (float)c[3], fmaf(mw[m][1], x1 * (float)e[3], acc[m][j][3]));
                        continue;
                    }
                    int c[4];
                    if (HL)
                        mq_mma_hl(af[m][0], af[m][1], af[m][2], af[m][3], b0, b1, l0, l1, c);
                    else
                        mq_mma<X2>(af[m][0], af[m][1], af[m][2], af[m][3], b0, b1, l0, l1, c);
                    // c[0], c[1]: weight row g, input rows 2t, 2t + 1; c[2], c[3]: weight row g + 8
                    acc[m][j][0] = mq_add<F>(acc[m][j][0], dw[m][0], mw[m][0], c[0], x0, o0);
                    acc[m][j][1] = mq_add<F>(acc[m][j][1], dw[m][0], mw[m][0], c[1], x1, o1);
                    acc[m][j][2] = mq_add<F>(acc[m][j][2], dw[m][1], mw[m][1], c[2], x0, o0);
                    acc[m][j][3] = mq_add<F>(acc[m][j][3], dw[m][1], mw[m][1], c[3], x1, o1);
                }
            }
        }
    };

    pdl_wait();
    pdl_launch();
    if (stages) stage_in(0);
    for (u32 st = 0; st < stages; ++st) {
        if (st + 1 < stages) {
            stage_in(st + 1);
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        if ((st + 1) * MQ_KU <= su)
            comp(st, BoolK<true>{});
        else
            comp(st, BoolK<false>{});
        __syncthreads();  // buffer st & 1 is restaged at st + 2
    }
    if (!live) return;
#pragma unroll
    for (int m = 0; m < 2; ++m) {
        if (ks_n == 1 && glu && m == 1) break;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 row = r0 + (glu ? 0u : 16u * m) + g + 8u * h;
            if (row >= sa.rows) continue;
            // partials: gate rows, then up rows (GLU); segments back to back
            const u32 p = glu ? row + (u32)m * sa.rows : mq_prow(a, glu, tile, row);
#pragma unroll
            for (int j = 0; j < NT; ++j) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const u32 col = 8 * j + 2 * t + e;
                    if (col >= wnb) continue;
                    const float v = acc[m][j][2 * h + e];
                    if (ks_n > 1) {
                        ((float*)a.argmax)[((u64)ks * a.nrows + wrow0 + col) * a.stride + p] = v;
                    } else {
                        const float u = glu ? acc[1][j][2 * h + e] : 0.f;
                        mv_epilogue(a, sa, sb, row, v, u, a.out + (u64)(wrow0 + col) * a.ostride);
                    }
                }
            }
        }
    }
#else
    __trap();  // the host takes these kernels on sm_80 and later only
#endif
}

// The split-K partials of an mmq launch (a.chunk splits, a.stride output rows a split and input
// row) added in split order, then the epilogue. One thread per (input row, output row; GLU: gate
// row).
extern "C" __global__ void __launch_bounds__(256) mmq_reduce(const MvArgs a) {
    pdl_wait();
    pdl_launch();
    const bool glu = a.mode >= MV_GLU_SILU;
    const u32 outs = glu ? a.seg[0].rows : a.stride;
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)a.nrows * outs) return;
    const u32 r = (u32)(i / outs), p = (u32)(i % outs);
    const float* part = (const float*)a.argmax;
    float v = 0.f, u = 0.f;
#pragma unroll 4
    for (u32 k = 0; k < a.chunk; ++k) {
        const float* q = part + ((u64)k * a.nrows + r) * a.stride;
        v += q[p];
        if (glu) u += q[a.seg[0].rows + p];
    }
    u32 si = 0, row = p;
    if (!glu) {
        while (si + 1 < a.nseg && row >= a.seg[si].rows) {
            row -= a.seg[si].rows;
            ++si;
        }
    }
    const MvSeg sa = si == 0 ? a.seg[0] : (si == 1 ? a.seg[1] : a.seg[2]);
    mv_epilogue(a, sa, a.seg[1], row, v, u, a.out + (u64)r * a.ostride);
}

#define MMQ_KERNELS(F, NAME) \
    extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmq_##NAME##_n1(const MvArgs a) { mmq_run<F, 1, false>(a); } \
    extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmq_##NAME##_n2(const MvArgs a) { mmq_run<F, 2, false>(a); } \
    extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmq_##NAME##_n4(const MvArgs a) { mmq_run<F, 4, false>(a); } \
    extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmq_##NAME##_n8(const MvArgs a) { mmq_run<F, 8, false>(a); } \
    extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmq2_##NAME##_n1(const MvArgs a) { mmq_run<F, 1, true>(a); } \
    extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmq2_##NAME##_n2(const MvArgs a) { mmq_run<F, 2, true>(a); } \
    extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmq2_##NAME##_n4(const MvArgs a) { mmq_run<F, 4, true>(a); } \
    extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmq2_##NAME##_n8(const MvArgs a) { mmq_run<F, 8, true>(a); }
MMQ_KERNELS(FMT_Q4_0, q4_0)
MMQ_KERNELS(FMT_Q4_1, q4_1)
MMQ_KERNELS(FMT_Q5_0, q5_0)
MMQ_KERNELS(FMT_Q5_1, q5_1)
MMQ_KERNELS(FMT_Q8_0, q8_0)
#undef MMQ_KERNELS
extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmq2_q4_ku_n1(const MvArgs a) { mmq_run<FMT_Q4_KU, 1, true>(a); }
extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmq2_q4_ku_n2(const MvArgs a) { mmq_run<FMT_Q4_KU, 2, true>(a); }
extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmq2_q4_ku_n4(const MvArgs a) { mmq_run<FMT_Q4_KU, 4, true>(a); }
extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmq2_q4_ku_n8(const MvArgs a) { mmq_run<FMT_Q4_KU, 8, true>(a); }
extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmq2_q6_ku_n1(const MvArgs a) { mmq_run<FMT_Q6_KU, 1, true>(a); }
extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmq2_q6_ku_n2(const MvArgs a) { mmq_run<FMT_Q6_KU, 2, true>(a); }
extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmq2_q6_ku_n4(const MvArgs a) { mmq_run<FMT_Q6_KU, 4, true>(a); }
extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmq2_q6_ku_n8(const MvArgs a) { mmq_run<FMT_Q6_KU, 8, true>(a); }
// mmq2_<fmt>_n2_w2: two warps a weight tile, each on its own 16 input rows (WX = 2): the tile's
// weights staged once for 32 input rows.
#define MMQ_W2_KERNEL(F, NAME) \
    extern "C" __global__ void __launch_bounds__(MQ_W * 64) mmq2_##NAME##_n2_w2(const MvArgs a) { mmq_run<F, 2, true, 2>(a); }
MMQ_W2_KERNEL(FMT_Q4_0, q4_0)
MMQ_W2_KERNEL(FMT_Q4_1, q4_1)
MMQ_W2_KERNEL(FMT_Q5_0, q5_0)
MMQ_W2_KERNEL(FMT_Q5_1, q5_1)
MMQ_W2_KERNEL(FMT_Q8_0, q8_0)
MMQ_W2_KERNEL(FMT_Q4_KU, q4_ku)
MMQ_W2_KERNEL(FMT_Q6_KU, q6_ku)
#undef MMQ_W2_KERNEL

// out (cols / 32 units of Q8U bytes) = x (f32 [cols], 16-byte aligned), RMS-normed first by
// `norm` (f32 [cols]) if not 0, quantized as the CPU's quantize_q8 (IEEE division and no
// contraction, so the same bytes for the same input). 8 lanes a unit (quantize_unit8);
// blockIdx.y: the row of a batch of inputs (f32 [rows][cols] into [rows][cols / 32] units);
// with a norm every block sums the squares of the whole row (rms_inv_units: blocks agree).
// X2 (quantize_q8x2): units of Q8X2U bytes, quantized twice as the CPU's quantize_q8x2: hi as
// above, then lo the residual x - d hi in steps of d / 256 (round half away from zero, clamped
// to +-127), the same operations unfused, so the same bytes. Units: hi's qs, d, s = d sum(hi)
// + (d / 256) sum(lo), 8 unused bytes, lo's qs.

// Quantization by groups of 8 lanes: a unit's 32 values as 8 lanes of 4 (lane l of the group
// holds elements 4l..4l+3), four units a warp; the group's maxima and sums are taken with
// shuffles within the group (exact: integer sums and a maximum), so the bytes do not depend
// on how lanes share a unit. Every lane of the warp takes part.
template <typename A>
__device__ __forceinline__ A group8_sum(A v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    return v;
}

// A unit's sum of squares: each lane's four rounded squares added in order, then the group's
// sums (every lane of the group gets the same bits).
__device__ __forceinline__ float sumsq8(const float* e) {
    return group8_sum(
        __fadd_rn(__fadd_rn(__fadd_rn(__fmul_rn(e[0], e[0]), __fmul_rn(e[1], e[1])), __fmul_rn(e[2], e[2])),
                  __fmul_rn(e[3], e[3])));
}

// Bytes b0..b3 of the low bits of q[0..4] as one word.
__device__ __forceinline__ u32 pack4(const int* q) {
    return (u32)(q[0] & 0xff) | ((u32)(q[1] & 0xff) << 8) | ((u32)(q[2] & 0xff) << 16) | ((u32)(q[3] & 0xff) << 24);
}

// One unit: lane `sub` (0..8) of its group holds elements e[0..4] = 4 sub..4 sub + 3; the
// unit's bytes go to o (written only if `store`).
template <bool X2>
__device__ __forceinline__ void quantize_unit8(const float* e, u8* o, u32 sub, bool store) {
    // |v| >= 0: its bits order as the values
    int m = max(max(__float_as_int(fabsf(e[0])), __float_as_int(fabsf(e[1]))),
                max(__float_as_int(fabsf(e[2])), __float_as_int(fabsf(e[3]))));
    m = max(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = max(m, __shfl_xor_sync(0xffffffffu, m, 2));
    m = max(m, __shfl_xor_sync(0xffffffffu, m, 4));
    const float d = __fdiv_rn(__int_as_float(m), 127.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    int q[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const float r = __fmul_rn(e[i], id);
        q[i] = (int)__fadd_rn(r, copysignf(0.5f, r));
    }
    float s = __fmul_rn(d, (float)group8_sum(q[0] + q[1] + q[2] + q[3]));
    if (store) *(u32*)(o + 4 * sub) = pack4(q);
    if (X2) {
        const float dl = __fmul_rn(d, 1.0f / 256.0f);
        const float idl = d != 0.0f ? __fdiv_rn(256.0f, d) : 0.0f;
        int ql[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float rl = __fmul_rn(__fsub_rn(e[i], __fmul_rn(d, (float)q[i])), idl);
            ql[i] = max(-127, min(127, (int)__fadd_rn(rl, copysignf(0.5f, rl))));
        }
        s = __fadd_rn(s, __fmul_rn(dl, (float)group8_sum(ql[0] + ql[1] + ql[2] + ql[3])));
        if (store) *(u32*)(o + Q8U + 4 * sub) = pack4(ql);
    }
    if (store && sub == 0) {
        ((float*)(o + 32))[0] = d;
        ((float*)(o + 32))[1] = s;
    }
}

// Four consecutive values as f32 (16-byte aligned f32, or 8-byte aligned f16: exact).
__device__ __forceinline__ void ld4(const float* p, float* e) {
    const F4 v = *(const F4*)p;
    e[0] = v.x, e[1] = v.y, e[2] = v.z, e[3] = v.w;
}
__device__ __forceinline__ void ld4(const f16* p, float* e) {
    const uint2 v = *(const uint2*)p;
    f16 h;
    h.x = (unsigned short)(v.x & 0xffffu), e[0] = f16_to_f32(h);
    h.x = (unsigned short)(v.x >> 16), e[1] = f16_to_f32(h);
    h.x = (unsigned short)(v.y & 0xffffu), e[2] = f16_to_f32(h);
    h.x = (unsigned short)(v.y >> 16), e[3] = f16_to_f32(h);
}

// Most outputs a row of the quantizing split-K sums takes (MQR_MAX / 32 units).
#define MQR_MAX 4096

// The RMS factor 1 / sqrt(mean(x^2) + eps) of a row of `cols` values from its units' sums of
// squares us[0..cols / 32) (sumsq8): lane l adds us[l], us[l + 32], ... in order, then the
// warp's sum. Every warp and lane of every block gets the same bits for the same row.
__device__ __forceinline__ float rms_inv_units(const float* us, u32 cols, float eps) {
    float s = 0.f;
    for (u32 u = threadIdx.x & 31; u < (cols >> 5); u += 32) s += us[u];
    s = warp_sum(s);
    return 1.0f / sqrtf(s / (float)cols + eps);
}

// A row x of `cols` In values (float, or f16 without a norm: the RMS factor is summed over f32
// rows only), RMS-normed by `norm` if not 0, into `out` (cols / 32 units of Q8U, X2: Q8X2U
// bytes). Units 4 w .. 4 w + 3 for the block's warps w of gridDim.x * warps (8 lanes a unit);
// with a norm every block (of 8 warps) first sums the squares of every unit of the row.
template <bool X2, typename In = float>
__device__ __forceinline__ void quantize_rows(u64 x, u64 norm, float eps, u32 cols, u64 out) {
    // with a norm: one chunk's 32 unit sums, and the running sum of units l, l + 32, ... (lane l)
    __shared__ float us[32], acc[32];
    constexpr u32 XU = X2 ? Q8X2U : Q8U;
    pdl_wait();
    pdl_launch();
    // row blockIdx.y of a batch: x rows of cols In values, out rows of cols / 32 units
    const In* xf = (const In*)(x + (u64)blockIdx.y * cols * sizeof(In));
    u8* o = (u8*)(out + (u64)blockIdx.y * (cols >> 5) * XU);
    const u32 warps = blockDim.x >> 5, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u32 sub = lane & 7, units = cols >> 5;
    const float* g = (const float*)norm;
    float inv = 1.0f;
    if constexpr (sizeof(In) == 4) {
        if (g) {
            // rms_inv_units' order for any row length, 32 units (the block's 8 warps) at a time
            if (threadIdx.x < 32) acc[threadIdx.x] = 0.f;
            for (u32 c = 0; c < units; c += 32) {
                const u32 i = 4 * warp + (lane >> 3), u = c + i;
                float e[4] = {0.f, 0.f, 0.f, 0.f};
                if (u < units) ld4(xf + 32 * u + 4 * sub, e);
                const float ss = sumsq8(e);
                if (sub == 0) us[i] = ss;
                __syncthreads();
                if (threadIdx.x < 32 && c + threadIdx.x < units) acc[threadIdx.x] += us[threadIdx.x];
                __syncthreads();
            }
            inv = 1.0f / sqrtf(warp_sum(acc[lane]) / (float)cols + eps);
        }
    }
    for (u32 u4 = 4 * (blockIdx.x * warps + warp); u4 < units; u4 += 4 * gridDim.x * warps) {
        const u32 u = u4 + (lane >> 3), uc = u < units ? u : u4;
        float e[4];
        ld4(xf + 32 * uc + 4 * sub, e);
        if (g) {
            float w[4];
            ld4(g + 32 * uc + 4 * sub, w);
#pragma unroll
            for (int i = 0; i < 4; ++i) e[i] = __fmul_rn(__fmul_rn(e[i], inv), w[i]);
        }
        quantize_unit8<X2>(e, o + (u64)uc * XU, sub, u < units);
    }
}

extern "C" __global__ void __launch_bounds__(256) quantize_q8(u64 x, u64 norm, float eps, u32 cols, u64 out) {
    quantize_rows<false>(x, norm, eps, cols, out);
}
extern "C" __global__ void __launch_bounds__(256) quantize_q8x2(u64 x, u64 norm, float eps, u32 cols, u64 out) {
    quantize_rows<true>(x, norm, eps, cols, out);
}
// quantize_q8x2 of f16 rows (x: f16 [rows][cols], the attention's output), without a norm
// (`norm` must be 0): the bytes quantize_q8x2 writes for the same values as f32 rows.
extern "C" __global__ void __launch_bounds__(256) quantize_q8x2_h(u64 x, u64 norm, float eps, u32 cols, u64 out) {
    quantize_rows<true, f16>(x, 0, eps, cols, out);
}

// mmq_reduce for a product whose output rows are the rows of the next product's input, each
// finished row then RMS-normed by `norm` (f32 [outputs], or 0 for none) and quantized as
// quantize_q8x2 into `q` (row r at r * outputs / 32 units): the next product's quantization
// without its own launch, the same bytes. Outputs: a one-segment plain product's a.stride, or
// a GLU product's seg[0].rows (its f32 outputs are not written); a multiple of 32, at most
// MQR_MAX; a.out, its rows, the partials and the bias 16-byte aligned. One block per input
// row, 8 lanes a unit (blockDim.x = 32 ceil(units / 4)): a lane holds 4 outputs in registers
// from the sums to the quantization. The epilogue is mv_epilogue's (plain: bias, then residual
// + value), written out so that the residuals load with the partials.
extern "C" __global__ void __launch_bounds__(1024) mmq_reduce_q8x2(const MvArgs a, u64 norm, float eps, u64 q) {
    __shared__ float us[MQR_MAX / 32];
    pdl_wait();
    pdl_launch();
    const bool glu = a.mode >= MV_GLU_SILU;
    const u32 outs = glu ? a.seg[0].rows : a.stride;
    const u32 r = blockIdx.x, units = outs >> 5;
    const u32 sub = threadIdx.x & 7, u = threadIdx.x >> 3;
    const bool live = u < units;
    const u32 p = 32 * (live ? u : 0) + 4 * sub;  // a lane past the units works on unit 0
    const float* part = (const float*)a.argmax + (u64)r * a.stride + p;
    const u64 kstep = (u64)a.nrows * a.stride;
    float* orow = (float*)(a.out + (u64)r * a.ostride) + p;
    const float* bias = (const float*)a.seg[0].bias;
    const bool add = a.mode == MV_ADD;
    float o[4] = {0.f, 0.f, 0.f, 0.f}, v[4] = {0.f, 0.f, 0.f, 0.f}, w[4] = {0.f, 0.f, 0.f, 0.f};
    if (add) ld4(orow, o);
    // the partials of up to 4 splits loaded before they are added (in split order); GLU: the
    // up rows' partials follow the gate rows'
    for (u32 k0 = 0; k0 < a.chunk; k0 += 4) {
        float t[4][4], tu[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            if (k0 + kk < a.chunk) {
                ld4(part + (k0 + kk) * kstep, t[kk]);
                if (glu) ld4(part + (k0 + kk) * kstep + outs, tu[kk]);
            }
        }
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            if (k0 + kk >= a.chunk) break;
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                v[i] += t[kk][i];
                if (glu) w[i] += tu[kk][i];
            }
        }
    }
    if (glu) {
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = mv_glu(a, a.seg[0], a.seg[1], p + i, v[i], w[i]);
    } else {
        float b[4] = {0.f, 0.f, 0.f, 0.f};
        if (bias) ld4(bias + p, b);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float x = v[i];
            if (bias) x += b[i];
            if (add) x = o[i] + x;
            v[i] = x;
        }
        if (live) *(F4*)orow = F4{v[0], v[1], v[2], v[3]};
    }
    const float ss = sumsq8(v);
    if (live && sub == 0) us[u] = ss;
    __syncthreads();
    const float* g = (const float*)norm;
    if (g) {
        const float inv = rms_inv_units(us, outs, eps);
        float nw[4];
        ld4(g + p, nw);
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = __fmul_rn(__fmul_rn(v[i], inv), nw[i]);
    }
    quantize_unit8<true>(v, (u8*)q + ((u64)r * units + (live ? u : 0)) * Q8X2U, sub, live);
}

// Layout of `EmbedArgs` in gpu/matvec.rs.
struct EmbedArgs {
    u64 w;          // rows x row_bytes of GGUF blocks
    u64 params;     // u32 [token, pos]
    u64 out;        // f32 [cols]
    u32 fmt;
    u32 row_bytes;
    u32 cols;       // multiple of 32
    u32 rows;
    float scale;    // multiplies every value unless 1
    u32 pad;
    u64 prev;       // u32 [rows]: the previous step's picks (PREV_TOKEN rows read theirs), or 0
};

// out = row `token` of w, dequantized, times scale. One thread per 32-element unit.
// blockIdx.y: the row of a batch (params: u32 tokens [rows], out: f32 [rows][cols]). A token
// of 0xffffffff (PREV_TOKEN in model/step.rs) is the previous step's pick of the same row, `prev`.
extern "C" __global__ void embed(const EmbedArgs a) {
    pdl_wait();
    pdl_launch();
    u32 tok = ((const u32*)a.params)[blockIdx.y];
    if (tok == 0xffffffffu && a.prev) tok = ((const u32*)a.prev)[blockIdx.y];
    if (tok >= a.rows) tok = 0;  // validated by the host; this only keeps the reads in bounds
    const u8* row = (const u8*)a.w + (u64)tok * a.row_bytes;
    const u32 units = a.cols >> 5;
    const u32 upb = fmt_bs(a.fmt) / 32, ts = fmt_ts(a.fmt);
    for (u32 u = blockIdx.x * blockDim.x + threadIdx.x; u < units; u += gridDim.x * blockDim.x) {
        float y[32];
        const u8* blk = row + (u / upb) * ts;
        const int sub = (int)(u % upb);
#define EMB_CALL(F) deq<F>(blk, sub, y)
        FMT_DISPATCH(a.fmt, EMB_CALL)
#undef EMB_CALL
        float* o = (float*)a.out + (u64)blockIdx.y * a.cols + u * 32;
        if (a.scale != 1.0f) {
#pragma unroll
            for (int l = 0; l < 32; ++l) o[l] = y[l] * a.scale;
        } else {
#pragma unroll
            for (int l = 0; l < 32; ++l) o[l] = y[l];
        }
    }
}

// The index of the largest of n partials (lowest index on ties, NaN never chosen) into
// out[0]. One block of 1024 threads.
extern "C" __global__ void __launch_bounds__(1024) argmax_final(u64 part, u32 n, u64 out) {
    __shared__ float sv[32];
    __shared__ u32 si[32];
    pdl_wait();
    pdl_launch();
    const ArgPart* p = (const ArgPart*)part;
    float best = neg_inf<float>();
    u32 bi = 0xffffffffu;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
        ArgPart q = p[i];
        if (arg_better(q.v, q.i, best, bi)) {
            best = q.v;
            bi = q.i;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, best, o);
        u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (arg_better(ov, oi, best, bi)) {
            best = ov;
            bi = oi;
        }
    }
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    if (lane == 0) {
        sv[warp] = best;
        si[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        best = lane < nw ? sv[lane] : neg_inf<float>();
        bi = lane < nw ? si[lane] : 0xffffffffu;
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, best, o);
            u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (arg_better(ov, oi, best, bi)) {
                best = ov;
                bi = oi;
            }
        }
        if (lane == 0) *(u32*)out = bi == 0xffffffffu ? 0u : bi;
    }
}
