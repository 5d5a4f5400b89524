#line 1 "paged.cu"
// The engine's batched kernels around the products (quant.cuh in front): one
// launch serves every row of a step, each row a token of some sequence at its own position.
//
// Paged KV cache: keys and values are f16 [block][n_layer][n_kv_head][KV_BS][head_dim] (two
// buffers); a sequence's position p lies in block tables[toff + p / KV_BS], slot p % KV_BS.
// Row metadata (u32 [rows][2], 8-byte aligned): the row's position (PAD_ROW: a padding row of
// a graph bucket, skipped) and the offset of its sequence's block table in `tables`.

#define KV_BS 16
#define PAD_ROW 0xffffffffu
// Block offsets paged_attn keeps in shared memory: a chunk of up to PA_TB blocks (1,024 keys)
// is looked up before the kernel waits on the previous one; a longer one tile by tile.
#define PA_TB 64

#define HD_MAX 512
#define AT_T 128
#define AT_TILE 128   // keys per tile: one per thread for the scores
#define AT_GMAX 8     // query heads per block (heads sharing a KV head; more go to more blocks)

// Keys lo..=pos split into nact chunks of `chunk` (a multiple of `keys`, a power of two) over
// at most maxsplit blocks.
__device__ __forceinline__ void attn_range(u32 pos, u32 window, u32 maxsplit, u32 keys, u32* lo,
                                           u32* chunk, u32* nact) {
    const u32 n = pos + 1;
    *lo = (window > 0 && n > window) ? n - window : 0;
    const u32 len = n - *lo;
    u32 c = (len + maxsplit - 1) / maxsplit;
    c = (c + keys - 1) & ~(keys - 1);
    *chunk = c;
    *nact = (len + c - 1) / c;
}

__device__ __forceinline__ void unpack8(U4 w, float* f) {
    f[0] = h2f(w.x & 0xffffu);
    f[1] = h2f(w.x >> 16);
    f[2] = h2f(w.y & 0xffffu);
    f[3] = h2f(w.y >> 16);
    f[4] = h2f(w.z & 0xffffu);
    f[5] = h2f(w.z >> 16);
    f[6] = h2f(w.w & 0xffffu);
    f[7] = h2f(w.w >> 16);
}

// A float written by another block of this grid (bypasses L1).
__device__ __forceinline__ float ld_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

// Heads x[h * hd + d] (h < nheads) in shared memory: each head RMS-normed with weight w, as
// the CPU model. Called by all threads of the block; `tmp` holds nheads floats.
__device__ void head_norms(float* x, u32 nheads, u32 hd, const float* w, float eps, float* tmp) {
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    for (u32 h = warp; h < nheads; h += nw) {
        float ss = 0.f;
        for (u32 d = lane; d < hd; d += 32) ss += x[h * hd + d] * x[h * hd + d];
        ss = warp_sum(ss);
        if (lane == 0) tmp[h] = 1.0f / sqrtf(ss / (float)hd + eps);
    }
    __syncthreads();
    for (u32 i = tid; i < nheads * hd; i += blockDim.x) x[i] = x[i] * tmp[i / hd] * w[i % hd];
    __syncthreads();
}

// The rotation of the first rope_dim values of each head (pairs (j, j + rope_dim / 2) with
// neox, else (2j, 2j + 1)) by the angle whose cosine and sine cs(j) returns.
template <typename CS>
__device__ __forceinline__ void rope_heads(float* x, u32 nheads, u32 hd, u32 rope_dim, u32 neox, CS cs) {
    const u32 half = rope_dim >> 1;
    for (u32 i = threadIdx.x; i < nheads * half; i += blockDim.x) {
        const u32 h = i / half, j = i % half;
        const u32 ia = neox ? j : 2 * j, ib = neox ? j + half : 2 * j + 1;
        const float2 r = cs(j);
        const float c = r.x, s = r.y;
        float* xh = x + h * hd;
        const float x0 = xh[ia], x1 = xh[ib];
        xh[ia] = x0 * c - x1 * s;
        xh[ib] = x0 * s + x1 * c;
    }
    __syncthreads();
}

// The angle of rotary pair j at position p (pos times the position scale): cos, sin.
__device__ __forceinline__ float2 rope_cs(float p, const float* inv, u32 j) {
    const float ang = p * inv[j];
    return make_float2(cosf(ang), sinf(ang));
}

// Element offset of (block, layer, kv head g, slot) in the key or value buffer.
__device__ __forceinline__ u64 kv_at(u32 blk, u32 layer, u32 n_layer, u32 nkv, u32 g, u32 slot, u32 hd) {
    return ((((u64)blk * n_layer + layer) * nkv + g) * KV_BS + slot) * hd;
}

// Layout of `RopeStoreArgs` in paged.rs.
struct RopeStoreArgs {
    u64 qkv;        // f32 [rows][qkv_w]: q (nh*hd) | k (nkv*hd) | v (nkv*hd) of each row
    u64 kc, vc;     // the paged cache
    u64 rows;       // u32 [rows][2]: pos, table offset
    u64 tables;     // u32 block ids
    u64 inv_freq;   // f32 [rope_dim / 2]
    u32 nh, nkv, hd, layer;
    u32 n_layer, rope_dim, neox, qkv_w;
    float pos_scale;
    float eps;      // of the q/k head norms
    u64 qnorm;      // f32 [hd]: per-head RMS norm of q before RoPE (gemma3), or 0
    u64 knorm;      // same for k
    u64 qh;         // f16 [rows][nh * hd]: each row's rotated q for the flash op, or 0
    u64 kh, vh;     // f16 [nkv][lk][hd]: k and v of rows f0..f1 at their positions, or 0
    u32 f0, f1, lk, pad2;
};

// Four floats as four f16 (8 bytes).
__device__ __forceinline__ uint2 f16x4(F4 v) {
    return make_uint2((u32)f32_to_f16(v.x).x | ((u32)f32_to_f16(v.y).x << 16),
                      (u32)f32_to_f16(v.z).x | ((u32)f32_to_f16(v.w).x << 16));
}

// 16-byte loads of a row a thread issues together.
#define RS_J 4

// Row blockIdx.x: q and k normed per head (gemma3) and rotated at the row's position (q in
// place), k and v stored as f16 into the row's slot of the cache. hd % 4 == 0. Dynamic shared
// memory: rope_store_smem(nh, nkv, hd, rope_dim) bytes (paged.rs): the row (q | k | v),
// the heads' RMS factors, and the (cos, sin) of each rotary pair.
extern "C" __global__ void __launch_bounds__(128) rope_store(const RopeStoreArgs a) {
    extern __shared__ __align__(16) float rs_sm[];
    const u32 r = blockIdx.x, tid = threadIdx.x;
    const u32 nq = a.nh * a.hd, nk = a.nkv * a.hd;
    const u32 nq4 = nq / 4, nk4 = nk / 4, hd4 = a.hd / 4, w4 = nq4 + 2 * nk4;
    float* x = rs_sm;
    F4* x4 = (F4*)rs_sm;
    float* tmp = x + nq + 2 * nk;
    float2* cs = (float2*)(tmp + ((a.nh + a.nkv + 1) & ~1u));
    // The step's row metadata and block tables and the frequencies are written before the
    // step's first kernel, never by a kernel: read (and the angles computed) before waiting
    // on the previous kernel, so that only the row's own loads follow the wait.
    const u32 pos = ((const u32*)a.rows)[2 * r];
    u32 blk = 0;
    if (pos != PAD_ROW) {
        blk = ((const u32*)a.tables)[((const u32*)a.rows)[2 * r + 1] + pos / KV_BS];
        const float p = (float)pos * a.pos_scale;
        for (u32 j = tid; j < a.rope_dim / 2; j += blockDim.x) cs[j] = rope_cs(p, (const float*)a.inv_freq, j);
    }
    pdl_wait();
    pdl_launch();
    if (pos == PAD_ROW) {
        // A padding row of a prefill graph's chunk (rows f0..f1 from position 0): zeros for
        // the flash op's q, k and v, so its masked keys hold finite values.
        if (a.qh) {
            f16* qh = (f16*)a.qh + (u64)r * nq;
            for (u32 i = tid; i < nq; i += blockDim.x) qh[i] = f32_to_f16(0.f);
        }
        if (a.kh && r >= a.f0 && r < a.f1) {
            for (u32 i = tid; i < nk; i += blockDim.x) {
                const u64 at = ((u64)(i / a.hd) * a.lk + (r - a.f0)) * a.hd + i % a.hd;
                ((f16*)a.kh)[at] = f32_to_f16(0.f);
                ((f16*)a.vh)[at] = f32_to_f16(0.f);
            }
        }
        return;
    }
    F4* row = (F4*)((float*)a.qkv + (u64)r * a.qkv_w);
    for (u32 i0 = tid; i0 < w4; i0 += RS_J * blockDim.x) {
        F4 v[RS_J];
#pragma unroll
        for (int j = 0; j < RS_J; ++j) {
            if (i0 + j * blockDim.x < w4) v[j] = row[i0 + j * blockDim.x];
        }
#pragma unroll
        for (int j = 0; j < RS_J; ++j) {
            if (i0 + j * blockDim.x < w4) x4[i0 + j * blockDim.x] = v[j];
        }
    }
    __syncthreads();
    if (a.qnorm) {
        head_norms(x, a.nh, a.hd, (const float*)a.qnorm, a.eps, tmp);
        head_norms(x + nq, a.nkv, a.hd, (const float*)a.knorm, a.eps, tmp + a.nh);
    }
    rope_heads(x, a.nh + a.nkv, a.hd, a.rope_dim, a.neox, [&](u32 j) { return cs[j]; });
    for (u32 i = tid; i < nq4; i += blockDim.x) row[i] = x4[i];
    if (a.qh) {
        uint2* qh = (uint2*)((f16*)a.qh + (u64)r * nq);
        for (u32 i = tid; i < nq4; i += blockDim.x) qh[i] = f16x4(x4[i]);
    }
    if (a.kh && r >= a.f0 && r < a.f1) {
        for (u32 i = tid; i < nk4; i += blockDim.x) {
            const u64 at = ((u64)(i / hd4) * a.lk + pos) * hd4 + i % hd4;
            ((uint2*)a.kh)[at] = f16x4(x4[nq4 + i]);
            ((uint2*)a.vh)[at] = f16x4(x4[nq4 + nk4 + i]);
        }
    }
    const u32 slot = pos % KV_BS;
    for (u32 i = tid; i < nk4; i += blockDim.x) {
        const u64 at = kv_at(blk, a.layer, a.n_layer, a.nkv, i / hd4, slot, a.hd) / 4 + i % hd4;
        ((uint2*)a.kc)[at] = f16x4(x4[nq4 + i]);
        ((uint2*)a.vc)[at] = f16x4(x4[nq4 + nk4 + i]);
    }
}

// Layout of `PagedAttnArgs` in paged.rs.
struct PagedAttnArgs {
    u64 q;          // f32, row r's q heads at q + r * q_stride floats (rotated by rope_store)
    u64 kc, vc;
    u64 rows, tables;
    u64 part;       // f32 [rows][nh][maxsplit][hd + 2]
    u64 count;      // u32 [rows][nkv * ngrp]: 0 before and after each launch
    u64 out;        // f32 [rows][nh * hd]
    u32 nh, nkv, hd, layer;
    u32 n_layer, maxsplit, window, ngrp;
    u32 q_stride;
    float scale;
    // fused (decode-only steps: one row per sequence): q is the row's unrotated q | k | v;
    // each block rotates its q heads, and the block whose split ends at pos rotates k and
    // stores k and v first, so no rope_store launch is needed.
    u64 inv_freq;
    u32 rope_dim, neox;
    float pos_scale;
    u32 fused;
    u64 qnorm, knorm;  // fused: per-head RMS norms of q and k before RoPE (gemma3), or 0
    float eps;
    u32 split_keys; // a split's keys are a multiple of this (a power of two, >= KV_BS)
};

// Causal attention of row blockIdx.z (at position pos) over its sequence's keys lo..=pos in
// layer `layer`, keys and values read through the block table. Block (kv head g, head
// subgroup, split s = blockIdx.y) takes up to AT_GMAX query heads sharing KV head g and its
// chunk of keys (a multiple of split_keys):
// 1. its q heads into shared memory (fused: normed and rotated here; the block whose chunk
//    ends at pos also rotates this token's k and stores k and v before reading its keys);
// 2. online softmax over tiles of AT_TILE keys. Scores: one thread per key (16-byte loads),
//    all the block's heads at once. Values: hd/4 threads per key row (4 dims each),
//    AT_T / (hd/4) key slices, each a run of consecutive rows of the tile, summed in a fixed
//    order at the end;
// 3. one split: the normalized output. Several: unnormalized partials; the last block of the
//    head group to finish (a counter) merges them and resets the counter.
// The splits of a row depend only on its position, maxsplit and split_keys (fixed per
// engine), so a row's result does not depend on the other rows of the step. Requires
// hd % 8 == 0, hd <= HD_MAX.
extern "C" __global__ void __launch_bounds__(AT_T) paged_attn(const PagedAttnArgs a) {
    __shared__ __align__(16) float qs[AT_GMAX * HD_MAX];
    __shared__ float sc[AT_GMAX][AT_TILE];
    __shared__ __align__(16) float red[AT_GMAX * 4 * AT_T];
    __shared__ float m_s[AT_GMAX], l_s[AT_GMAX], alpha_s[AT_GMAX], tmp[AT_GMAX];
    __shared__ __align__(16) float cur[2 * HD_MAX];
    __shared__ u64 tb[PA_TB];
    __shared__ float2 csm[HD_MAX / 2];  // fused: (cos, sin) of each rotary pair at pos
    __shared__ u32 last;

    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 hd = a.hd;
    const u32 r = blockIdx.z;
    const u32 g = blockIdx.x / a.ngrp, sub = blockIdx.x % a.ngrp;
    const u32 group = a.nh / a.nkv;
    const u32 h0 = g * group + sub * AT_GMAX;
    const u32 nhb = min((u32)AT_GMAX, group - sub * AT_GMAX);
    // The step data is written before the step's first kernel (never by a kernel): read
    // before waiting on the previous kernel, so blocks with no keys leave at once.
    const uint2 row = ((const uint2*)a.rows)[r];  // (pos, table offset): one load
    const u32 pos = row.x;
    if (pos == PAD_ROW) return;
    const u32* tab = (const u32*)a.tables + row.y;
    u32 lo, chunk, nact;
    attn_range(pos, a.window, a.maxsplit, a.split_keys, &lo, &chunk, &nact);
    const u32 s = blockIdx.y;
    if (s >= nact) return;
    const u32 k0 = lo + s * chunk;
    const u32 k1 = min(k0 + chunk, pos + 1);
    // The element offset of slot 0 of each block of keys k0..k1 (this layer, head g), from
    // the block table, before the wait where they all fit (else per tile, below).
    const u32 kb0 = k0 / KV_BS, nkb = (k1 - 1) / KV_BS - kb0 + 1;
    const bool pre = nkb <= PA_TB;
    if (pre) {
        for (u32 i = tid; i < nkb; i += AT_T) tb[i] = kv_at(tab[kb0 + i], a.layer, a.n_layer, a.nkv, g, 0, hd);
    }
    if (a.fused) {
        // the rotary angles depend on the position and the frequencies only (written before
        // the step): computed before the wait too
        const float p = (float)pos * a.pos_scale;
        for (u32 j = tid; j < a.rope_dim / 2; j += AT_T) csm[j] = rope_cs(p, (const float*)a.inv_freq, j);
    }
    pdl_wait();
    pdl_launch();
    const f16* kc = (const f16*)a.kc;
    const f16* vc = (const f16*)a.vc;
    const u32 tpr = hd / 4;
    const u32 ks = AT_T / tpr;
    const u32 slice = tid / tpr, dq = tid % tpr;

    const float* q = (const float*)a.q + (u64)r * a.q_stride;
    for (u32 i = tid; i < nhb * hd; i += AT_T) qs[i] = q[h0 * hd + i];
    const bool own = a.fused && s == nact - 1;
    if (own) {
        for (u32 d = tid; d < hd; d += AT_T) {
            cur[d] = q[a.nh * hd + g * hd + d];
            cur[HD_MAX + d] = q[(a.nh + a.nkv) * hd + g * hd + d];
        }
    }
    if (tid < AT_GMAX) {
        m_s[tid] = neg_inf<float>();
        l_s[tid] = 0.f;
    }
    __syncthreads();
    if (a.fused) {
        const auto cs = [&](u32 j) { return csm[j]; };
        if (a.qnorm) head_norms(qs, nhb, hd, (const float*)a.qnorm, a.eps, tmp);
        rope_heads(qs, nhb, hd, a.rope_dim, a.neox, cs);
        if (own) {
            if (a.knorm) head_norms(cur, 1, hd, (const float*)a.knorm, a.eps, tmp);
            rope_heads(cur, 1, hd, a.rope_dim, a.neox, cs);
            const u64 at = (pre ? tb[pos / KV_BS - kb0] : kv_at(tab[pos / KV_BS], a.layer, a.n_layer, a.nkv, g, 0, hd)) +
                           (pos % KV_BS) * hd;
            for (u32 d = tid; d < hd; d += AT_T) {
                ((f16*)a.kc)[at + d] = f32_to_f16(cur[d]);
                ((f16*)a.vc)[at + d] = f32_to_f16(cur[HD_MAX + d]);
            }
            __syncthreads();  // read back below by this block
        }
    }

    float acc[AT_GMAX][4];
#pragma unroll
    for (int h = 0; h < AT_GMAX; ++h) acc[h][0] = acc[h][1] = acc[h][2] = acc[h][3] = 0.f;

    for (u32 t0 = k0; t0 < k1; t0 += AT_TILE) {
        const u32 nt = min((u32)AT_TILE, k1 - t0);
        // block offsets of the tile's keys, where they were not all read before the wait
        const u32 b0 = pre ? kb0 : t0 / KV_BS;
        if (!pre) {
            if (tid <= (t0 + nt - 1) / KV_BS - b0) tb[tid] = kv_at(tab[b0 + tid], a.layer, a.n_layer, a.nkv, g, 0, hd);
            __syncthreads();
        }
        if (tid < nt) {
            const u32 j = t0 + tid;
            const U4* krow = (const U4*)(kc + tb[j / KV_BS - b0] + (j % KV_BS) * hd);
            float d[AT_GMAX];
#pragma unroll
            for (int h = 0; h < AT_GMAX; ++h) d[h] = 0.f;
            // the row's 16-byte words eight at a time, all loads issued before the products
            for (u32 c0 = 0; c0 < hd / 8; c0 += 8) {
                U4 kw[8];
#pragma unroll
                for (u32 u = 0; u < 8; ++u) {
                    if (c0 + u < hd / 8) kw[u] = krow[c0 + u];
                }
#pragma unroll
                for (u32 u = 0; u < 8; ++u) {
                    if (c0 + u < hd / 8) {
                        float kf[8];
                        unpack8(kw[u], kf);
#pragma unroll
                        for (int h = 0; h < AT_GMAX; ++h) {
                            if ((u32)h < nhb) {
                                const float* qh = qs + h * hd + 8 * (c0 + u);
#pragma unroll
                                for (int e = 0; e < 8; ++e) d[h] += qh[e] * kf[e];
                            }
                        }
                    }
                }
            }
#pragma unroll
            for (int h = 0; h < AT_GMAX; ++h) {
                if ((u32)h < nhb) sc[h][tid] = d[h] * a.scale;
            }
        }
        __syncthreads();
        for (u32 h = warp; h < nhb; h += AT_T / 32) {
            float mx = neg_inf<float>();
            for (u32 i = lane; i < nt; i += 32) mx = fmaxf(mx, sc[h][i]);
            mx = warp_max(mx);
            const float mold = m_s[h];
            const float mnew = fmaxf(mold, mx);
            float sum = 0.f;
            for (u32 i = lane; i < nt; i += 32) {
                const float p = expf(sc[h][i] - mnew);
                sc[h][i] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            if (lane == 0) {
                const float al = expf(mold - mnew);
                alpha_s[h] = al;
                l_s[h] = l_s[h] * al + sum;
                m_s[h] = mnew;
            }
        }
        __syncthreads();
        if (slice < ks) {
#pragma unroll
            for (int h = 0; h < AT_GMAX; ++h) {
                if ((u32)h < nhb) {
                    const float al = alpha_s[h];
                    acc[h][0] *= al;
                    acc[h][1] *= al;
                    acc[h][2] *= al;
                    acc[h][3] *= al;
                }
            }
            // slice takes the tile's rows i0..i1 in order: the next row of a block is hd
            // further, and the block table is read once a block
            const u32 per = (nt + ks - 1) / ks;
            const u32 i0 = min(slice * per, nt), i1 = min(i0 + per, nt);
            u32 j = t0 + i0;
            const f16* vr = i0 < i1 ? vc + tb[j / KV_BS - b0] + (j % KV_BS) * hd + 4 * dq : vc;
#pragma unroll 4
            for (u32 i = i0; i < i1; ++i, ++j) {
                if (j % KV_BS == 0) vr = vc + tb[j / KV_BS - b0] + 4 * dq;
                const H4 w = *(const H4*)vr;
                vr += hd;
                const float v0 = h2f(w.x), v1 = h2f(w.y), v2 = h2f(w.z), v3 = h2f(w.w);
#pragma unroll
                for (int h = 0; h < AT_GMAX; ++h) {
                    if ((u32)h < nhb) {
                        const float p = sc[h][i];
                        acc[h][0] += p * v0;
                        acc[h][1] += p * v1;
                        acc[h][2] += p * v2;
                        acc[h][3] += p * v3;
                    }
                }
            }
        }
        __syncthreads();
    }

    if (slice < ks) {
#pragma unroll
        for (int h = 0; h < AT_GMAX; ++h) {
            if ((u32)h < nhb) {
                float* rr = red + (slice * AT_GMAX + h) * hd + 4 * dq;
                rr[0] = acc[h][0];
                rr[1] = acc[h][1];
                rr[2] = acc[h][2];
                rr[3] = acc[h][3];
            }
        }
    }
    __syncthreads();
    float* out = (float*)a.out + (u64)r * a.nh * hd;
    if (nact == 1) {
        for (u32 i = tid; i < nhb * hd; i += AT_T) {
            const u32 h = i / hd, d = i % hd;
            float o = 0.f;
            for (u32 sl = 0; sl < ks; ++sl) o += red[(sl * AT_GMAX + h) * hd + d];
            out[(h0 + h) * hd + d] = o / l_s[h];
        }
        return;
    }
    float* part = (float*)a.part + (u64)r * a.nh * a.maxsplit * (hd + 2);
    for (u32 i = tid; i < nhb * hd; i += AT_T) {
        const u32 h = i / hd, d = i % hd;
        float o = 0.f;
        for (u32 sl = 0; sl < ks; ++sl) o += red[(sl * AT_GMAX + h) * hd + d];
        part[((u64)(h0 + h) * a.maxsplit + s) * (hd + 2) + d] = o;
    }
    if (tid < nhb) {
        const u64 base = ((u64)(h0 + tid) * a.maxsplit + s) * (hd + 2);
        part[base + hd] = m_s[tid];
        part[base + hd + 1] = l_s[tid];
    }
    __threadfence();
    __syncthreads();
    u32* count = (u32*)a.count + (u64)r * gridDim.x + blockIdx.x;
    if (tid == 0) last = atomicAdd(count, 1u) == nact - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (u32 h = warp; h < nhb; h += AT_T / 32) {
        const float* ph = part + (u64)(h0 + h) * a.maxsplit * (hd + 2);
        float mx = neg_inf<float>();
        for (u32 t = lane; t < nact; t += 32) mx = fmaxf(mx, ld_cg(ph + t * (hd + 2) + hd));
        mx = warp_max(mx);
        float l = 0.f;
        for (u32 t = lane; t < nact; t += 32) {
            l += ld_cg(ph + t * (hd + 2) + hd + 1) * expf(ld_cg(ph + t * (hd + 2) + hd) - mx);
        }
        l = warp_sum(l);
        for (u32 t = lane; t < nact; t += 32) sc[h][t] = expf(ld_cg(ph + t * (hd + 2) + hd) - mx) / l;
    }
    __syncthreads();
    for (u32 i = tid; i < nhb * hd; i += AT_T) {
        const u32 h = i / hd, d = i % hd;
        const float* ph = part + (u64)(h0 + h) * a.maxsplit * (hd + 2);
        float o = 0.f;
        for (u32 t = 0; t < nact; ++t) o += ld_cg(ph + t * (hd + 2) + d) * sc[h][t];
        out[(h0 + h) * hd + d] = o;
    }
    if (tid == 0) *count = 0;
}

// RMS norm of each of the `heads` heads (hd values) of every row, in place: row r's heads at
// x + r * stride floats (gemma3's q and k norms). One warp per (row, head): block blockIdx.x
// takes (row blockIdx.x / heads, head blockIdx.x % heads).
extern "C" __global__ void __launch_bounds__(32) head_norm_rows(u64 x, u64 w, u32 stride, u32 heads, u32 hd,
                                                               float eps) {
    pdl_wait();
    pdl_launch();
    const u32 r = blockIdx.x / heads, h = blockIdx.x % heads;
    float* p = (float*)x + (u64)r * stride + (u64)h * hd;
    float ss = 0.f;
    for (u32 d = threadIdx.x; d < hd; d += 32) ss += p[d] * p[d];
    ss = warp_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)hd + eps);
    for (u32 d = threadIdx.x; d < hd; d += 32) p[d] = p[d] * inv * ((const float*)w)[d];
}

// dst row i (width floats) = src row ids[i]. Block blockIdx.x copies row i.
extern "C" __global__ void gather_rows(u64 src, u64 dst, u64 ids, u32 width) {
    pdl_wait();
    pdl_launch();
    const u32 i = blockIdx.x;
    const float* s = (const float*)src + (u64)((const u32*)ids)[i] * width;
    float* d = (float*)dst + (u64)i * width;
    for (u32 c = threadIdx.x; c < width; c += blockDim.x) d[c] = s[c];
}

// (best, bi) = the better of itself and (ov, oi): larger value, then lower index.
__device__ __forceinline__ void am_pick(float& best, u32& bi, float ov, u32 oi) {
    if (ov > best || (ov == best && oi < bi)) {
        best = ov;
        bi = oi;
    }
}

// (best, bi) reduced over the block (AM_T threads); the result in thread 0.
#define AM_T 256
__device__ __forceinline__ void am_block(float& best, u32& bi) {
    __shared__ float sv[AM_T / 32];
    __shared__ u32 si[AM_T / 32];
    const u32 lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        am_pick(best, bi, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, bi, o));
    }
    if (lane == 0) {
        sv[wid] = best;
        si[wid] = bi;
    }
    __syncthreads();
    if (wid == 0) {
        best = lane < AM_T / 32 ? sv[lane] : neg_inf<float>();
        bi = lane < AM_T / 32 ? si[lane] : 0xffffffffu;
        for (int o = 16; o > 0; o >>= 1) {
            am_pick(best, bi, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, bi, o));
        }
    }
}

// out[r] = the index of the largest of row r's n logits (lowest index on ties; NaN and -inf
// never chosen, 0 if every logit is): the CPU sampler's greedy pick. Block (slice
// blockIdx.x of gridDim.x, row blockIdx.y) of AM_T threads takes its slice of the row and
// writes its (value, index) to part (u32 [rows][gridDim.x][2]); the row's last block to
// finish (count: u32 [rows], 0 before and after each launch) merges the slices in order.
// Where `mail` is not 0 (host memory) the pick also goes to u32 slot * mail_stride + r of it,
// slot the u32 at `mail_slot` (step data, written before the step).
extern "C" __global__ void __launch_bounds__(AM_T) argmax_rows(u64 logits, u32 n, u64 out, u64 part, u64 count,
                                                               u64 mail, u64 mail_slot, u32 mail_stride) {
    __shared__ u32 last;
    pdl_wait();
    pdl_launch();
    const u32 r = blockIdx.y, ns = gridDim.x;
    const u32 per = (n + ns - 1) / ns;
    const u32 lo = blockIdx.x * per, hi = min(n, lo + per);
    const float* p = (const float*)logits + (u64)r * n;
    float best = neg_inf<float>();
    u32 bi = 0xffffffffu;
    for (u32 i = lo + threadIdx.x; i < hi; i += AM_T) {
        const float v = p[i];
        if (v > best) {  // false for NaN; i rises, so ties keep the lowest
            best = v;
            bi = i;
        }
    }
    am_block(best, bi);
    u32* pr = (u32*)part + (u64)r * ns * 2;
    if (threadIdx.x == 0) {
        pr[2 * blockIdx.x] = __float_as_uint(best);
        pr[2 * blockIdx.x + 1] = bi;
        __threadfence();
        last = atomicAdd((u32*)count + r, 1u) == ns - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    best = neg_inf<float>();
    bi = 0xffffffffu;
    for (u32 t = threadIdx.x; t < ns; t += AM_T) {
        am_pick(best, bi, ld_cg((const float*)pr + 2 * t), ((volatile const u32*)pr)[2 * t + 1]);
    }
    am_block(best, bi);
    if (threadIdx.x == 0) {
        const u32 tok = bi == 0xffffffffu ? 0u : bi;
        ((u32*)out)[r] = tok;
        if (mail) ((volatile u32*)mail)[(u64)*(const u32*)mail_slot * mail_stride + r] = tok;
        ((u32*)count)[r] = 0;
    }
}

// Copies block `src` of the key and value buffers onto block `dst` (n16: 16-byte words per
// block per buffer): copy-on-write of a shared block.
extern "C" __global__ void kv_copy_block(u64 kc, u64 vc, u32 src, u32 dst, u64 n16) {
    pdl_wait();
    pdl_launch();
    const U4* ks = (const U4*)kc + (u64)src * n16;
    const U4* vs = (const U4*)vc + (u64)src * n16;
    U4* kd = (U4*)kc + (u64)dst * n16;
    U4* vd = (U4*)vc + (u64)dst * n16;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (u64)gridDim.x * blockDim.x) {
        kd[i] = ks[i];
        vd[i] = vs[i];
    }
}

// ---- Large steps (many prompt rows): tensor-core products on dequantized weights ----

// out row r (n operands of `mode`: 0 f16, 1 bf16, 2 f32) = row r of x (f32 [rows][n]),
// RMS-normed with weight w first if w is not 0. One block per row.
extern "C" __global__ void rows_to_h(u64 x, u64 w, u32 n, float eps, u64 out, u32 mode) {
    __shared__ float sh[32];
    pdl_wait();
    pdl_launch();
    const float* xp = (const float*)x + (u64)blockIdx.x * n;
    float inv = 1.0f;
    if (w) {
        float ss = 0.f;
        for (u32 i = threadIdx.x; i < n; i += blockDim.x) ss += xp[i] * xp[i];
        ss = block_sum(ss, sh);
        inv = 1.0f / sqrtf(ss / (float)n + eps);
    }
    const u64 o = (u64)blockIdx.x * n;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = w ? xp[i] * inv * ((const float*)w)[i] : xp[i];
        if (mode == 2) {
            ((float*)out)[o + i] = v;
        } else {
            ((unsigned short*)out)[o + i] = mode ? f32_to_bf16(v).x : f32_to_f16(v).x;
        }
    }
}

// kout, vout (f16 [nkv][lk][hd]) = the keys and values of positions 0..lk of one sequence in
// layer `layer`, read through its block table (a prompt chunk's attention on the flash op).
// One thread per 8 values; hd % 8 == 0.
extern "C" __global__ void kv_gather(u64 kc, u64 vc, u64 table, u32 layer, u32 n_layer, u32 nkv, u32 hd,
                                     u32 lk, u64 kout, u64 vout) {
    pdl_wait();
    pdl_launch();
    const u32 h8 = hd / 8;
    const u64 total = (u64)nkv * lk * h8;
    const u32* tab = (const u32*)table;
    for (u64 e = (u64)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (u64)gridDim.x * blockDim.x) {
        const u32 c = (u32)(e % h8);
        const u32 j = (u32)((e / h8) % lk);
        const u32 g = (u32)(e / ((u64)h8 * lk));
        const u64 at = kv_at(tab[j / KV_BS], layer, n_layer, nkv, g, j % KV_BS, hd) + 8 * c;
        ((U4*)kout)[e] = *(const U4*)((const f16*)kc + at);
        ((U4*)vout)[e] = *(const U4*)((const f16*)vc + at);
    }
}

// out[r * stride + off + j] += bias[j] for j < n. One block per row.
extern "C" __global__ void bias_rows(u64 out, u64 bias, u32 stride, u32 off, u32 n) {
    pdl_wait();
    pdl_launch();
    float* o = (float*)out + (u64)blockIdx.x * stride + off;
    for (u32 j = threadIdx.x; j < n; j += blockDim.x) o[j] += ((const float*)bias)[j];
}
