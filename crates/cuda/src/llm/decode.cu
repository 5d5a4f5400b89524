#line 1 "decode.cu"
// The per-token kernels around the matrix products (quant.cuh in front): the attention step
// (RoPE, KV append, decode attention split over the KV length, and the merge of the splits,
// in one kernel) and RMS norms.
// The KV cache of a layer is f16 [n_kv_head][ctx][head_dim] for keys and for values (one
// head's keys contiguous); the position comes from the device parameter block u32 [token, pos],
// so one captured graph serves every position.

#define HD_MAX 512
#define AT_T 128
#define AT_TILE 128   // keys per tile: one per thread for the scores
#define AT_GMAX 8     // query heads per block (heads sharing a KV head; more go to more blocks)

// Layout of `AttnArgs` in decode.rs.
struct AttnArgs {
    u64 qkv;        // f32 [nh*hd | nkv*hd | nkv*hd]: this token's q, k, v before RoPE
    u64 kc, vc;     // f16 [nkv][ctx][hd] of this layer: k (rotated) and v stored at pos
    u64 params;     // u32 [token, pos]: keys 0..=pos are attended
    u64 part;       // f32 [nh][maxsplit][hd + 2]: unnormalized output, then max and sum of exps
    u64 count;      // u32 [nkv * ngrp]: split blocks done; 0 before and after each step
    u64 out;        // f32 [nh * hd]
    u64 inv_freq;   // f32 [rope_dim / 2]: angle of pair i = (pos * pos_scale) * inv_freq[i]
    u64 qnorm;      // f32 [hd]: per-head RMS norm of q before RoPE (gemma3), or 0
    u64 knorm;      // same for k
    u32 nh, nkv, hd, ctx;
    u32 maxsplit;   // gridDim.y
    u32 window;     // sliding window: keys in (pos - window, pos]; 0: all
    u32 ngrp;       // blocks per KV head (gridDim.x = nkv * ngrp)
    u32 rope_dim;
    u32 neox;       // pairs (i, i + rope_dim/2) if 1, (2i, 2i + 1) if 0
    u32 pad;
    float scale;    // multiplies q.k
    float pos_scale;
    float eps;      // of the q/k norms
    float pad2;
};

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

// Heads x[h * hd + d] (h < nheads) in shared memory: RMS norm of each head with weight w (if
// not null), then RoPE at `pos`, as the CPU model (norm, then rotation of the first rope_dim
// values). Called by all threads of the block; `tmp` holds nheads floats.
__device__ void norm_rope(float* x, u32 nheads, u32 hd, const float* w, float eps, u32 pos,
                          float pos_scale, const float* inv, u32 rope_dim, u32 neox, float* tmp) {
    if (w) head_norms(x, nheads, hd, w, eps, tmp);
    const float p = (float)pos * pos_scale;
    rope_heads(x, nheads, hd, rope_dim, neox, [&](u32 j) { return rope_cs(p, inv, j); });
}

// The attention step of one layer for the token at `pos`. Block (kv head g, head subgroup,
// split s) takes up to AT_GMAX query heads sharing KV head g and its chunk of keys:
// 1. its q heads, normed (gemma3) and rotated, into shared memory; the block whose chunk ends
//    at pos (the last split) also this token's k and v, which it stores into the f16 cache
//    before reading its keys;
// 2. online softmax over tiles of AT_TILE keys. Scores: one thread per key (16-byte loads),
//    all the block's heads at once. Values: hd/4 threads per key row (4 dims each),
//    AT_T / (hd/4) key slices, summed in a fixed order at the end;
// 3. one split: the normalized output. Several: unnormalized partials; the last block of the
//    head group to finish (a counter) merges them and resets the counter.
// Requires hd % 8 == 0, hd <= HD_MAX.
extern "C" __global__ void __launch_bounds__(AT_T) attn_step(const AttnArgs a) {
    __shared__ __align__(16) float qs[AT_GMAX * HD_MAX];
    __shared__ float sc[AT_GMAX][AT_TILE];
    __shared__ __align__(16) float red[AT_GMAX * 4 * AT_T];
    __shared__ __align__(16) float cur[2 * HD_MAX];
    __shared__ float m_s[AT_GMAX], l_s[AT_GMAX], alpha_s[AT_GMAX], tmp[AT_GMAX];
    __shared__ u32 last;

    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u32 hd = a.hd;
    const u32 g = blockIdx.x / a.ngrp, sub = blockIdx.x % a.ngrp;
    const u32 group = a.nh / a.nkv;
    const u32 h0 = g * group + sub * AT_GMAX;
    const u32 nhb = min((u32)AT_GMAX, group - sub * AT_GMAX);
    const u32 pos = ((const u32*)a.params)[1];  // written before the graph's first kernel
    u32 lo, chunk, nact;
    attn_range(pos, a.window, a.maxsplit, 64, &lo, &chunk, &nact);
    const u32 s = blockIdx.y;
    if (s >= nact) return;  // the whole block; touches nothing
    const u32 k0 = lo + s * chunk;
    const u32 k1 = min(k0 + chunk, pos + 1);
    const bool own = s == nact - 1;  // this chunk ends at pos
    f16* kc = (f16*)a.kc + (u64)g * a.ctx * hd;
    f16* vc = (f16*)a.vc + (u64)g * a.ctx * hd;
    const u32 tpr = hd / 4;       // threads per value row
    const u32 ks = AT_T / tpr;    // key slices
    const u32 slice = tid / tpr, dq = tid % tpr;

    pdl_wait();
    pdl_launch();

    // 1. q (and this token's k, v) normed and rotated.
    const float* qkv = (const float*)a.qkv;
    const float* inv = (const float*)a.inv_freq;
    for (u32 i = tid; i < nhb * hd; i += AT_T) qs[i] = qkv[h0 * hd + i];
    if (own) {
        for (u32 d = tid; d < hd; d += AT_T) {
            cur[d] = qkv[a.nh * hd + g * hd + d];
            cur[HD_MAX + d] = qkv[(a.nh + a.nkv) * hd + g * hd + d];
        }
    }
    if (tid < AT_GMAX) {
        m_s[tid] = neg_inf<float>();
        l_s[tid] = 0.f;
    }
    __syncthreads();
    norm_rope(qs, nhb, hd, (const float*)a.qnorm, a.eps, pos, a.pos_scale, inv, a.rope_dim, a.neox, tmp);
    if (own) {
        norm_rope(cur, 1, hd, (const float*)a.knorm, a.eps, pos, a.pos_scale, inv, a.rope_dim, a.neox,
                  tmp);
        for (u32 d = tid; d < hd; d += AT_T) {
            kc[(u64)pos * hd + d] = f32_to_f16(cur[d]);
            vc[(u64)pos * hd + d] = f32_to_f16(cur[HD_MAX + d]);
        }
        __syncthreads();  // read back below by this block
    }

    float acc[AT_GMAX][4];
#pragma unroll
    for (int h = 0; h < AT_GMAX; ++h) acc[h][0] = acc[h][1] = acc[h][2] = acc[h][3] = 0.f;

    for (u32 t0 = k0; t0 < k1; t0 += AT_TILE) {
        const u32 nt = min((u32)AT_TILE, k1 - t0);
        if (tid < nt) {
            const U4* krow = (const U4*)(kc + (u64)(t0 + tid) * hd);
            float d[AT_GMAX];
#pragma unroll
            for (int h = 0; h < AT_GMAX; ++h) d[h] = 0.f;
#pragma unroll 8
            for (u32 c = 0; c < hd / 8; ++c) {
                float kf[8];
                unpack8(krow[c], kf);
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
    float* out = (float*)a.out;
    if (nact == 1) {
        for (u32 i = tid; i < nhb * hd; i += AT_T) {
            const u32 h = i / hd, d = i % hd;
            float o = 0.f;
            for (u32 sl = 0; sl < ks; ++sl) o += red[(sl * AT_GMAX + h) * hd + d];
            out[(h0 + h) * hd + d] = o / l_s[h];
        }
        return;
    }
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
    __threadfence();
    __syncthreads();
    u32* count = (u32*)a.count + blockIdx.x;
    if (tid == 0) last = atomicAdd(count, 1u) == nact - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // The last split block of this head group merges the nact partials.
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

// y = x / rms(x) * w over n values (y may be x). One block per row of n values.
extern "C" __global__ void rms_norm(u64 x, u64 w, u64 y, u32 n, float eps) {
    __shared__ float sh[32];
    pdl_wait();
    pdl_launch();
    x += (u64)blockIdx.x * n * 4;
    y += (u64)blockIdx.x * n * 4;
    const float* xp = (const float*)x;
    float ss = 0.f;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) ss += xp[i] * xp[i];
    ss = block_sum(ss, sh);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
        ((float*)y)[i] = xp[i] * inv * ((const float*)w)[i];
    }
}

// x += y / rms(y) * w over n values (gemma3's post-attention and post-FFN norms). One block
// per row of n values.
extern "C" __global__ void rms_norm_add(u64 x, u64 y, u64 w, u32 n, float eps) {
    __shared__ float sh[32];
    pdl_wait();
    pdl_launch();
    x += (u64)blockIdx.x * n * 4;
    y += (u64)blockIdx.x * n * 4;
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
