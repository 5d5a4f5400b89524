#line 1 "decode.cu"
// The per-token kernels around the matrix products (quant.cuh in front): RoPE with the KV
// append, decode attention split over the KV length, its combine, and RMS norms.
// The KV cache of a layer is f16 [n_kv_head][ctx][head_dim] for keys and for values (one
// head's keys contiguous); the position comes from the device parameter block u32 [token, pos],
// so one captured graph serves every position.

#define HD_MAX 512

// Layout of `RopeArgs` in gpu/decode.rs.
struct RopeArgs {
    u64 qkv;        // f32 [nh*hd | nkv*hd | nkv*hd] (q, k, v): q rotated in place
    u64 kc;         // f16 keys of this layer: k rotated stored at [head][pos]
    u64 vc;         // f16 values of this layer: v stored at [head][pos]
    u64 params;     // u32 [token, pos]
    u64 inv_freq;   // f32 [rope_dim / 2]: angle of pair i = (pos * pos_scale) * inv_freq[i]
    u64 qnorm;      // f32 [hd]: per-head RMS norm of q before RoPE (gemma3), or 0
    u64 knorm;      // same for k
    u32 nh, nkv, hd, rope_dim;
    u32 neox;       // pairs (i, i + rope_dim/2) if 1, (2i, 2i + 1) if 0
    u32 ctx;
    float pos_scale, eps;
};

// Grid: nh + 2 * nkv blocks (q heads, k heads, v heads); block: hd rounded up to 32 threads.
extern "C" __global__ void rope_kv(const RopeArgs a) {
    __shared__ float sh[32];
    __shared__ float sx[HD_MAX];
    const u32 b = blockIdx.x, t = threadIdx.x, hd = a.hd;
    const u32 pos = ((const u32*)a.params)[1];
    u32 kind, h;  // 0: q, 1: k, 2: v
    if (b < a.nh) {
        kind = 0;
        h = b;
    } else if (b < a.nh + a.nkv) {
        kind = 1;
        h = b - a.nh;
    } else {
        kind = 2;
        h = b - a.nh - a.nkv;
    }
    float* src = (float*)a.qkv + (kind == 0 ? h * hd : a.nh * hd + (kind - 1) * a.nkv * hd + h * hd);
    float v = t < hd ? src[t] : 0.f;
    const u64 at = ((u64)h * a.ctx + pos) * hd + t;
    if (kind == 2) {  // the whole block: no barrier below is skipped by part of it
        if (t < hd) ((f16*)a.vc)[at] = f32_to_f16(v);
        return;
    }
    const u64 nw = kind == 0 ? a.qnorm : a.knorm;
    if (nw) {
        const float ss = block_sum(v * v, sh);
        const float inv = 1.0f / sqrtf(ss / (float)hd + a.eps);
        if (t < hd) v = v * inv * ((const float*)nw)[t];
    }
    if (t < hd) sx[t] = v;
    __syncthreads();
    const u32 half = a.rope_dim >> 1;
    if (t < a.rope_dim) {
        bool first;
        u32 i, partner;
        if (a.neox) {
            first = t < half;
            i = first ? t : t - half;
            partner = first ? t + half : t - half;
        } else {
            first = (t & 1) == 0;
            i = t >> 1;
            partner = first ? t + 1 : t - 1;
        }
        const float p = (float)pos * a.pos_scale;
        const float ang = p * ((const float*)a.inv_freq)[i];
        const float c = cosf(ang), s = sinf(ang);
        const float other = sx[partner];
        const float x0 = first ? v : other, x1 = first ? other : v;
        v = first ? x0 * c - x1 * s : x0 * s + x1 * c;
    }
    if (t < hd) {
        if (kind == 0) src[t] = v;
        else ((f16*)a.kc)[at] = f32_to_f16(v);
    }
}

#define AT_T 128
#define AT_TILE 128   // keys per tile: one per thread for the scores
#define AT_GMAX 8     // query heads per block (heads sharing a KV head; more go to more blocks)

// Layout of `AttnArgs` in gpu/decode.rs.
struct AttnArgs {
    u64 q;          // f32 [nh * hd], rotated
    u64 kc, vc;     // f16 [nkv][ctx][hd] of this layer
    u64 params;     // u32 [token, pos]: keys 0..=pos are filled
    u64 part;       // f32 [nh][maxsplit][hd + 2]: unnormalized output, then max and sum of exps
    u32 nh, nkv, hd, ctx;
    u32 maxsplit;   // gridDim.y
    u32 window;     // sliding window: keys in (pos - window, pos]; 0: all
    u32 ngrp;       // blocks per KV head (gridDim.x = nkv * ngrp)
    float scale;    // multiplies q.k
};

// Keys lo..=pos split into nact chunks of `chunk` (a multiple of 64) over at most maxsplit
// blocks.
__device__ __forceinline__ void attn_range(u32 pos, u32 window, u32 maxsplit, u32* lo, u32* chunk,
                                           u32* nact) {
    const u32 n = pos + 1;
    *lo = (window > 0 && n > window) ? n - window : 0;
    const u32 len = n - *lo;
    u32 c = (len + maxsplit - 1) / maxsplit;
    c = (c + 63) & ~63u;
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

// Block (kv head g, head subgroup, split s): the block's query heads over its chunk of keys,
// with an online softmax over tiles of AT_TILE keys. Scores: one thread per key (16-byte key
// loads), all the block's heads at once. Values: hd/4 threads per key row (4 dims each),
// AT_T / (hd/4) key slices, summed in order at the end. Requires hd % 8 == 0, hd <= HD_MAX.
extern "C" __global__ void __launch_bounds__(AT_T) attn_decode(const AttnArgs a) {
    __shared__ __align__(16) float qs[AT_GMAX * HD_MAX];
    __shared__ float sc[AT_GMAX][AT_TILE];
    __shared__ __align__(16) float red[AT_GMAX * 4 * AT_T];
    __shared__ float m_s[AT_GMAX], l_s[AT_GMAX], alpha_s[AT_GMAX];

    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 hd = a.hd;
    const u32 g = blockIdx.x / a.ngrp, sub = blockIdx.x % a.ngrp;
    const u32 group = a.nh / a.nkv;
    const u32 h0 = g * group + sub * AT_GMAX;
    const u32 nhb = min((u32)AT_GMAX, group - sub * AT_GMAX);
    const u32 pos = ((const u32*)a.params)[1];
    u32 lo, chunk, nact;
    attn_range(pos, a.window, a.maxsplit, &lo, &chunk, &nact);
    const u32 s = blockIdx.y;
    if (s >= nact) return;  // the whole block
    const u32 k0 = lo + s * chunk;
    const u32 k1 = min(k0 + chunk, pos + 1);

    for (u32 i = tid; i < nhb * hd; i += AT_T) qs[i] = ((const float*)a.q)[h0 * hd + i];
    if (tid < AT_GMAX) {
        m_s[tid] = neg_inf<float>();
        l_s[tid] = 0.f;
    }
    const u32 tpr = hd / 4;       // threads per value row
    const u32 ks = AT_T / tpr;    // key slices
    const u32 slice = tid / tpr, dq = tid % tpr;
    float acc[AT_GMAX][4];
#pragma unroll
    for (int h = 0; h < AT_GMAX; ++h) acc[h][0] = acc[h][1] = acc[h][2] = acc[h][3] = 0.f;
    const f16* kc = (const f16*)a.kc + (u64)g * a.ctx * hd;
    const f16* vc = (const f16*)a.vc + (u64)g * a.ctx * hd;
    __syncthreads();

    for (u32 t0 = k0; t0 < k1; t0 += AT_TILE) {
        const u32 nt = min((u32)AT_TILE, k1 - t0);
        if (tid < nt) {
            const U4* kr = (const U4*)(kc + (u64)(t0 + tid) * hd);
            float d[AT_GMAX];
#pragma unroll
            for (int h = 0; h < AT_GMAX; ++h) d[h] = 0.f;
#pragma unroll 8
            for (u32 c = 0; c < hd / 8; ++c) {
                float kf[8];
                unpack8(kr[c], kf);
#pragma unroll
                for (int h = 0; h < AT_GMAX; ++h) {
                    if ((u32)h < nhb) {
                        const float* qh = qs + h * hd + 8 * c;
#pragma unroll
                        for (int e = 0; e < 8; ++e) d[h] += qh[e] * kf[e];
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
#pragma unroll 4
            for (u32 i = slice; i < nt; i += ks) {
                const H4 w = *(const H4*)(vc + (u64)(t0 + i) * hd + 4 * dq);
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
        __syncthreads();  // sc is rewritten by the next tile
    }

    if (slice < ks) {
#pragma unroll
        for (int h = 0; h < AT_GMAX; ++h) {
            if ((u32)h < nhb) {
                float* r = red + (slice * AT_GMAX + h) * hd + 4 * dq;
                r[0] = acc[h][0];
                r[1] = acc[h][1];
                r[2] = acc[h][2];
                r[3] = acc[h][3];
            }
        }
    }
    __syncthreads();
    float* part = (float*)a.part;
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
}

// Layout of `CombineArgs` in gpu/decode.rs.
struct CombineArgs {
    u64 part;       // as AttnArgs
    u64 params;
    u64 out;        // f32 [nh * hd]
    u32 hd, maxsplit, window, pad;
};

// out[h] = the softmax-weighted values of head h, merged over the active splits.
// Grid: nh blocks.
extern "C" __global__ void attn_combine(const CombineArgs a) {
    const u32 h = blockIdx.x, hd = a.hd;
    const u32 pos = ((const u32*)a.params)[1];
    u32 lo, chunk, nact;
    attn_range(pos, a.window, a.maxsplit, &lo, &chunk, &nact);
    const float* p = (const float*)a.part + (u64)h * a.maxsplit * (hd + 2);
    float mx = neg_inf<float>();
    for (u32 s = 0; s < nact; ++s) mx = fmaxf(mx, p[s * (hd + 2) + hd]);
    float l = 0.f;
    for (u32 s = 0; s < nact; ++s) l += p[s * (hd + 2) + hd + 1] * expf(p[s * (hd + 2) + hd] - mx);
    const float inv = 1.0f / l;
    for (u32 d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.f;
        for (u32 s = 0; s < nact; ++s) o += p[s * (hd + 2) + d] * expf(p[s * (hd + 2) + hd] - mx);
        ((float*)a.out)[h * hd + d] = o * inv;
    }
}

// y = x / rms(x) * w over n values (y may be x). One block.
extern "C" __global__ void rms_norm(u64 x, u64 w, u64 y, u32 n, float eps) {
    __shared__ float sh[32];
    const float* xp = (const float*)x;
    float ss = 0.f;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) ss += xp[i] * xp[i];
    ss = block_sum(ss, sh);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
        ((float*)y)[i] = xp[i] * inv * ((const float*)w)[i];
    }
}

// x += y / rms(y) * w over n values (gemma3's post-attention and post-FFN norms). One block.
extern "C" __global__ void rms_norm_add(u64 x, u64 y, u64 w, u32 n, float eps) {
    __shared__ float sh[32];
    const float* yp = (const float*)y;
    float ss = 0.f;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) ss += yp[i] * yp[i];
    ss = block_sum(ss, sh);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    float* xp = (float*)x;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
        xp[i] = xp[i] + yp[i] * inv * ((const float*)w)[i];
    }
}
