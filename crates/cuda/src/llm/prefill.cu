#line 1 "prefill.cu"
// Batched prefill (quant.cuh and decode.cu in front): the row kernels around the tensor-core
// products of a chunk of L prompt tokens. Activations: the residual stream is f32 [L][d]; the
// operands of the products (normed activations, GLU outputs, dequantized weights) are f16, bf16
// or f32 (`mode` 0, 1, 2; named `bf` where only 0 and 1 occur), row-major; the products
// (cuBLASLt, f32 accumulation) write f32.

__device__ __forceinline__ unsigned short to_h(float v, u32 bf) {
    return bf ? f32_to_bf16(v).x : f32_to_f16(v).x;
}

// Element i of a product operand at `out`, by `mode`: f16 (0), bf16 (1) or f32 (2).
__device__ __forceinline__ void st_act(u64 out, u64 i, float v, u32 mode) {
    if (mode == 2) {
        ((float*)out)[i] = v;
    } else {
        ((unsigned short*)out)[i] = to_h(v, mode);
    }
}

// out[r][c] (by `bf` as a mode, row-major rows x cols) = weight r, c of the GGUF matrix at w (rows
// packed: row_bytes = cols / block size * block bytes, so unit u = r * cols / 32 + c / 32 of
// the matrix is unit u of the flat block sequence, and its 32 outputs are out[32u .. 32u + 32)).
// A block of PFD_T threads takes PFD_T consecutive units: their block bytes (one contiguous
// range) staged into shared memory with 16-byte loads (split rows, `fmt` with FMT_SPLIT: read
// straight from the row), a unit per thread dequantized into shared memory, then written out
// with coalesced 16-byte stores.
#define PFD_T 128
#define PFD_WB (PFD_T * 128 + 32)  // staged weight bytes: 128 bytes a unit at most (f32), + alignment
extern "C" __global__ void __launch_bounds__(PFD_T) pf_dequant(u64 w, u32 fmt, u32 row_bytes, u32 cols,
                                                               u32 rows, u64 out, u32 bf) {
    __shared__ __align__(16) u8 wsm[PFD_WB];
    __shared__ __align__(16) U4 osm[PFD_T * 4];  // chunk q of unit t at 4t + ((q + t) & 3)
    const u32 tid = threadIdx.x;
    const u64 units = (u64)rows * (cols >> 5);
    const bool split = fmt & FMT_SPLIT;
    fmt &= 15;
    const u32 upb = fmt_bs(fmt) / 32, ts = fmt_ts(fmt);
    for (u64 u0 = (u64)blockIdx.x * PFD_T; u0 < units; u0 += (u64)gridDim.x * PFD_T) {
        const u32 n = (u32)min((u64)PFD_T, units - u0);
        if (!split) {
            const u64 b0 = u0 / upb, b1 = (u0 + n - 1) / upb + 1;
            const u64 al = (w + b0 * ts) & ~(u64)15;
            const u32 n16 = (u32)((w + b1 * ts - al + 15) >> 4);  // weights readable 16 bytes past the end
            for (u32 i = tid; i < n16; i += PFD_T) ((U4*)wsm)[i] = ld_stream(al + 16 * (u64)i);
            __syncthreads();
        }
        if (tid < n) {
            const u64 u = u0 + tid;
            float y[32];
            if (split) {
                // split rows: 32-element blocks read straight from the row (aligned loads)
                const u32 nu = cols >> 5;
                const u64 row = w + (u / nu) * row_bytes;
                const u32 c = (u32)(u % nu);
                if (fmt == FMT_Q6_K) {
                    q6s_deq(q6s_load(row, nu >> 3, c >> 3, (c >> 2) & 1), c & 3, y);
                } else {
#define PF_SP(F) sp_deq<F>(sp_load<F>(row, nu, c), y)
                    FMT_DISPATCH_SPLIT(fmt, PF_SP)
#undef PF_SP
                }
            } else {
                const u64 b0 = u0 / upb;
                const u8* blk = wsm + (u32)((w + b0 * ts) & 15) + (u32)(u / upb - b0) * ts;
#define PF_DEQ(F) deq<F>(blk, (int)(u % upb), y)
                FMT_DISPATCH(fmt, PF_DEQ)
#undef PF_DEQ
            }
            if (bf == 2) {
                // f32 operands: the unit's 32 values straight out (128 contiguous bytes)
                U4* o = (U4*)out + u * 8;
#pragma unroll
                for (int q = 0; q < 8; ++q) {
                    U4 v;
                    v.x = __float_as_uint(y[4 * q]);
                    v.y = __float_as_uint(y[4 * q + 1]);
                    v.z = __float_as_uint(y[4 * q + 2]);
                    v.w = __float_as_uint(y[4 * q + 3]);
                    o[q] = v;
                }
            }
#pragma unroll
            for (int q = 0; q < 4 && bf != 2; ++q) {
                U4 v;
                v.x = to_h(y[8 * q], bf) | ((u32)to_h(y[8 * q + 1], bf) << 16);
                v.y = to_h(y[8 * q + 2], bf) | ((u32)to_h(y[8 * q + 3], bf) << 16);
                v.z = to_h(y[8 * q + 4], bf) | ((u32)to_h(y[8 * q + 5], bf) << 16);
                v.w = to_h(y[8 * q + 6], bf) | ((u32)to_h(y[8 * q + 7], bf) << 16);
                osm[4 * tid + ((q + tid) & 3)] = v;
            }
        }
        __syncthreads();
        U4* o = (U4*)out + u0 * 4;
        for (u32 i = tid; i < 4 * n && bf != 2; i += PFD_T) o[i] = osm[(i & ~3u) + (((i & 3) + (i >> 2)) & 3)];
        __syncthreads();  // wsm and osm are refilled by the next round
    }
}

// out[i][h*hd + d] (by mode `bf`) = o[i][h][d] (f16, the attention op's output, stored
// [1, L, nh, hd]).
extern "C" __global__ void pf_attn_out(u64 o, u32 nh, u32 n, u32 hd, u64 out, u32 bf) {
    const u64 total = (u64)n * nh * hd;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (u64)gridDim.x * blockDim.x)
        st_act(out, e, f16_to_f32(((const f16*)o)[e]), bf);
}

// As matvec.cu's (the CPU's expressions).
__device__ __forceinline__ float pf_silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float pf_gelu(float x) {
    const float c = 0.7978846f;
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

// out[i][j] (by mode `bf`) = act(gu[i][j]) * gu[i][ff + j]: gate and up products side by side.
extern "C" __global__ void pf_glu(u64 gu, u32 n, u32 ff, u32 gelu, u64 out, u32 bf) {
    const u64 total = (u64)n * ff;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total;
         e += (u64)gridDim.x * blockDim.x) {
        const u64 i = e / ff, j = e % ff;
        const float g = ((const float*)gu)[i * 2 * ff + j];
        const float u = ((const float*)gu)[i * 2 * ff + ff + j];
        st_act(out, e, (gelu ? pf_gelu(g) : pf_silu(g)) * u, bf);
    }
}

// Rows of GGUF blocks (`rows` rows of `nb` blocks of `ts` bytes at w) rearranged into the split
// layout at out, rows `orb` bytes apart (>= nb ts; weights.rs, `split_rows`): each row as
// [every block's quants][every block's qh][every block's scale fields], field f of a block being
// its bytes [off_f, off_f + len_f). One thread per (row, block); byte copies (the blocks are
// 2-byte aligned at most).
extern "C" __global__ void pf_split(u64 w, u32 rows, u32 nb, u32 ts, u32 q_off, u32 q_len, u32 qh_off,
                                    u32 qh_len, u32 h_off, u32 h_len, u32 orb, u64 out) {
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)rows * nb) return;
    const u64 r = i / nb, b = i % nb;
    const u8* src = (const u8*)w + r * nb * ts + b * ts;
    u8* dst = (u8*)out + r * orb;
    for (u32 k = 0; k < q_len; ++k) dst[b * q_len + k] = src[q_off + k];
    dst += (u64)nb * q_len;
    for (u32 k = 0; k < qh_len; ++k) dst[b * qh_len + k] = src[qh_off + k];
    dst += (u64)nb * qh_len;
    for (u32 k = 0; k < h_len; ++k) dst[b * h_len + k] = src[h_off + k];
}

// Rows of Q4_K blocks (`rows` rows of `nsb` 144-byte blocks at w) as FMT_Q4_KU rows at out,
// `orb` bytes apart: unit j (32 elements: group j % 8 of block j / 8) as 16 bytes of nibbles in
// Q4_1's order (byte i: element i low, element i + 16 high), then after the row's 8 nsb units of
// quants, per unit f32 d sc and f32 -dmin m (the CPU's deq: x = d sc q - dmin m, both products
// exact in f32). One thread per (row, unit).
extern "C" __global__ void pf_q4k_units(u64 w, u32 rows, u32 nsb, u32 orb, u64 out) {
    const u32 units = 8 * nsb;
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)rows * units) return;
    const u64 r = i / units;
    const u32 j = (u32)(i % units), g = j & 7;
    const u8* b = (const u8*)w + (r * nsb + j / 8) * 144;
    int sc, mn;
    scale_min_k4((int)g, b + 4, &sc, &mn);
    const float d1 = ldh(b) * (float)sc, m1 = -(ldh(b + 2) * (float)mn);
    const u8* q = b + 16 + 32 * (g >> 1);
    const u32 sh = 4 * (g & 1);
    u8* o = (u8*)out + r * orb;
    for (u32 k = 0; k < 16; ++k) {
        const u32 lo = (q[k] >> sh) & 15u, hi = (q[k + 16] >> sh) & 15u;
        o[16 * j + k] = (u8)(lo | (hi << 4));
    }
    float* hd = (float*)(o + 16 * (u64)units) + 2 * j;
    hd[0] = d1;
    hd[1] = m1;
}

// Rows of Q6_K blocks (`rows` rows of `nsb` 210-byte blocks at w; `split`: in the split layout,
// each row's 208-byte block bodies, then their d fields) as FMT_Q6_KU rows at out,
// `orb` bytes apart: unit j (group j % 8 of block j / 8, as deq<FMT_Q6_K> reads it) as 32
// signed bytes q - 32, then after the row's 8 nsb units of bytes, per unit f32 d sc for its
// elements 0..16 and 16..32 (exact products). One thread per (row, unit).
extern "C" __global__ void pf_q6k_units(u64 w, u32 rows, u32 nsb, u32 split, u32 orb, u64 out) {
    const u32 units = 8 * nsb;
    const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (u64)rows * units) return;
    const u64 r = i / units;
    const u32 j = (u32)(i % units), g = j & 7;
    const u8* row = (const u8*)w + r * nsb * 210;
    const u8* b = row + (j / 8) * (split ? 208 : 210);
    const float d = ldh(split ? row + nsb * 208 + (j / 8) * 2 : b + 208);
    const u32 n = g >> 2;
    const u8* ql = b + 64 * n + 32 * (g & 1);
    const u32 lsh = 4 * ((g & 3) >> 1);
    const u8* qh = b + 128 + 32 * n;
    const u32 hsh = 2 * (g & 3);
    const signed char* sc = (const signed char*)(b + 192);
    u8* o = (u8*)out + r * orb;
    for (u32 k = 0; k < 32; ++k) {
        const int q = (int)(((ql[k] >> lsh) & 15u) | (((qh[k] >> hsh) & 3u) << 4)) - 32;
        o[32 * j + k] = (u8)(q & 0xff);
    }
    float* hd = (float*)(o + 32 * (u64)units) + 2 * j;
    hd[0] = d * (float)sc[2 * g];
    hd[1] = d * (float)sc[2 * g + 1];
}
