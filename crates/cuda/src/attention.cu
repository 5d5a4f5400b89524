// Scaled dot-product attention, forward and backward (the reference is ferrite-cpu
// attention.rs): q [b, hq, lq, d], k [b, hkv, lk, d], v [b, hkv, lk, dv], g (upstream gradient)
// [b, hq, lq, dv]; query head h reads kv head h / (hq / hkv). With causal, query i sees keys
// j <= max(0, i + lk - lq), as the CPU does (a query before the first key still sees key 0);
// With a key-padding mask (AttnDims.mask, bool [b, lk], null for none) key j of batch row b is
// hidden from every query where mask[b, j] (key_masked). A query left with no key (lk == 0,
// or every key it sees masked) gets a NaN row forward; backward its dq row is zero and it adds
// nothing to dk and dv (its statistics are written as (0, 0, 0) and never divided by). Inputs
// are read through their strides (AttnDims, elements, per dim b, h, l, last). The forward's
// output is stored [b, lq, hq, dv] (a query's heads side by side, as an output projection
// reads them; `Op::Attention`); the gradients are contiguous.
// f16/bf16/f32 compute in f32 (the tensor-core forward rounds probabilities to the input type
// for P V), f64 in f64.

struct AttnDims {
    u32 b, hq, hkv, lq, lk, d, dv, causal;
    i64 sq[4], sk[4], sv[4], sg[4];
    const u8* mask;  // key-padding mask [b, lk] (nonzero = padding), or null
    i64 sm[2];       // its strides (elements)
    u32 gq, gk;      // head slots a token of the dq and of the dk/dv gradient rows hold
};

// The backward's gradients are stored [b, l, heads, cols] (token-major, as the forward's
// output; `heads` is a.gq or a.gk: the heads, or three times them where dq, dk and dv share
// rows, [b, l, 3, h, cols], each pointer at its slot): the offset of row i of (batch bi, head
// h) with `len` rows.
__device__ __forceinline__ u64 grad_row(u32 bi, u32 h, u64 i, u32 heads, u32 len, u32 cols) {
    return (((u64)bi * len + i) * heads + h) * cols;
}

// Whether key j (< lk) of batch row bi is padding.
__device__ __forceinline__ bool key_masked(const AttnDims& a, u32 bi, i64 j) {
    return a.mask != nullptr && a.mask[bi * a.sm[0] + j * a.sm[1]] != 0;
}

// Number of keys query i sees (keys 0 .. visible - 1).
__device__ __forceinline__ i64 visible_keys(const AttnDims& a, u32 i) {
    if (!a.causal) return a.lk;
    const i64 last = (i64)i + (i64)a.lk - (i64)a.lq;
    const i64 v = (last > 0 ? last : 0) + 1;
    return v > (i64)a.lk ? (i64)a.lk : v;
}

template <typename A> __device__ __forceinline__ A nan_of();
template <> __device__ __forceinline__ float nan_of<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double nan_of<double>() { return __longlong_as_double(0x7ff8000000000000LL); }

template <typename A> __device__ __forceinline__ A fmax_nan(A a, A b) { return (b > a || m_isnan(b)) ? b : a; }

// sum_t a[t * sa] * b[t * sb] over t < n, in order.
template <typename T>
__device__ __forceinline__ typename Num<T>::A dot_strided(const T* a, i64 sa, const T* b, i64 sb, u32 n) {
    typename Num<T>::A s = 0;
    for (u32 t = 0; t < n; ++t) s += Num<T>::load(a[t * sa]) * Num<T>::load(b[t * sb]);
    return s;
}

// ---- row kernels (any dtype and head size): one warp per query or key row ----
//
// Each lane takes one key (or query) of a tile of 32 and computes its full dot products; the
// output columns are spread over the lanes (column c = c0 + lane + 32 t, t < 8), the tile's
// probabilities broadcast by shuffles. Columns beyond 256 are done in further passes that
// recompute the scores. Block: W = blockDim.x / 32 warps, one row each.

#define ROW_COLS 256

// Query rows. Rows of one (batch, kv head) are numbered hg * lq + i over the hq / hkv query
// heads that share it; block x covers W of them: blockIdx.x = bkv * bpb + (row / W) with
// bpb = ceil(group * lq / W).
// mode 0: o[b, h, i, :] = softmax(q k^T scale) v, NaN where no key is visible.
// mode 1: stats[3 row] = (max score m, sum of exp(s - m) l, D = sum_c g[c] o[c]) for the
//         backward kernels (row = (b * hq + h) * lq + i); zeros where no key is visible.
// mode 2: lse[row] = m + log(l) (f32; +inf where no key is visible), `Op::Attention`'s second
//         output for the kernel families that do not write it with the output.
template <typename T>
__device__ void attn_rows_body(const AttnDims& a, typename Num<T>::A scale, const T* q, const T* k, const T* v,
                               const T* g, T* o, typename Num<T>::A* stats, u32 mode, float* lse) {
    typedef typename Num<T>::A A;
    const u32 lane = threadIdx.x & 31, W = blockDim.x >> 5;
    const u32 group = a.hq / a.hkv;
    const u64 per = (u64)group * a.lq;
    const u64 bpb = (per + W - 1) / W;
    const u64 bkv = blockIdx.x / bpb;
    const u64 rr = (blockIdx.x % bpb) * W + (threadIdx.x >> 5);
    if (rr >= per) return;
    const u32 bi = (u32)(bkv / a.hkv), kvh = (u32)(bkv % a.hkv);
    const u32 h = kvh * group + (u32)(rr / a.lq), i = (u32)(rr % a.lq);
    const u64 orow = ((u64)bi * a.hq + h) * a.lq + i;
    const T* qr = q + bi * a.sq[0] + h * a.sq[1] + i * a.sq[2];
    const T* gr = g + bi * a.sg[0] + h * a.sg[1] + i * a.sg[2];
    const T* kb = k + bi * a.sk[0] + kvh * a.sk[1];
    const T* vb = v + bi * a.sv[0] + kvh * a.sv[1];
    const i64 vis = visible_keys(a, i);
    if (mode != 0) {
        A m = neg_inf<A>(), l = 0, dsum = 0;
        for (i64 j0 = 0; j0 < vis; j0 += 32) {
            const i64 j = j0 + lane;
            A s = neg_inf<A>(), dp = 0;
            if (j < vis && !key_masked(a, bi, j)) {
                s = dot_strided(qr, a.sq[3], kb + j * a.sk[2], a.sk[3], a.d) * scale;
                if (mode == 1) dp = dot_strided(gr, a.sg[3], vb + j * a.sv[2], a.sv[3], a.dv);
            }
            const A mn = fmax_nan(m, warp_max(s));
            const A ref = mn == neg_inf<A>() ? (A)0 : mn;
            const A al = m_exp(m - ref), p = m_exp(s - ref);
            l = l * al + warp_sum(p);
            dsum = dsum * al + warp_sum(p * dp);
            m = mn;
        }
        if (lane == 0 && mode == 2) lse[orow] = l > 0 ? (float)(m + log(l)) : -neg_inf<float>();
        if (lane == 0 && mode == 1) {
            stats[3 * orow] = l > 0 ? m : (A)0;
            stats[3 * orow + 1] = l;
            stats[3 * orow + 2] = l > 0 ? dsum / l : (A)0;
        }
        return;
    }
    T* orw = o + (((u64)bi * a.lq + i) * a.hq + h) * a.dv;
    if (vis == 0) {
        for (u32 c = lane; c < a.dv; c += 32) orw[c] = Num<T>::store(nan_of<A>());
        return;
    }
    for (u32 c0 = 0; c0 < a.dv; c0 += ROW_COLS) {
        A m = neg_inf<A>(), l = 0, acc[8];
#pragma unroll
        for (int t = 0; t < 8; ++t) acc[t] = 0;
        for (i64 j0 = 0; j0 < vis; j0 += 32) {
            const i64 j = j0 + lane;
            const A s = j < vis && !key_masked(a, bi, j)
                            ? dot_strided(qr, a.sq[3], kb + j * a.sk[2], a.sk[3], a.d) * scale
                            : neg_inf<A>();
            const A mn = fmax_nan(m, warp_max(s));
            const A ref = mn == neg_inf<A>() ? (A)0 : mn;
            const A al = m_exp(m - ref), p = m_exp(s - ref);
            l = l * al + warp_sum(p);
#pragma unroll
            for (int t = 0; t < 8; ++t) acc[t] *= al;
            const u32 cnt = (u32)(vis - j0 < 32 ? vis - j0 : 32);
            for (u32 u = 0; u < cnt; ++u) {
                const A pu = __shfl_sync(0xffffffffu, p, u);
                const T* vr = vb + (j0 + u) * a.sv[2];
#pragma unroll
                for (int t = 0; t < 8; ++t) {
                    const u32 c = c0 + lane + 32 * t;
                    if (c < a.dv) acc[t] += pu * Num<T>::load(vr[c * a.sv[3]]);
                }
            }
            m = mn;
        }
        const A inv = l > 0 ? (A)1 / l : nan_of<A>();  // every visible key masked: NaN
#pragma unroll
        for (int t = 0; t < 8; ++t) {
            const u32 c = c0 + lane + 32 * t;
            if (c < a.dv) orw[c] = Num<T>::store(acc[t] * inv);
        }
    }
}

// dq[b, h, i, :] = sum_j p_j (dp_j - D) scale k_j with p_j = exp(s_j - m) / l, dp_j = g . v_j
// (m, l, D from attn_rows mode 1). Rows and grid as attn_rows; zeros where no key is visible.
template <typename T>
__device__ void attn_dq_body(const AttnDims& a, typename Num<T>::A scale, const T* q, const T* k, const T* v,
                             const T* g, const typename Num<T>::A* stats, T* dq) {
    typedef typename Num<T>::A A;
    const u32 lane = threadIdx.x & 31, W = blockDim.x >> 5;
    const u32 group = a.hq / a.hkv;
    const u64 per = (u64)group * a.lq;
    const u64 bpb = (per + W - 1) / W;
    const u64 bkv = blockIdx.x / bpb;
    const u64 rr = (blockIdx.x % bpb) * W + (threadIdx.x >> 5);
    if (rr >= per) return;
    const u32 bi = (u32)(bkv / a.hkv), kvh = (u32)(bkv % a.hkv);
    const u32 h = kvh * group + (u32)(rr / a.lq), i = (u32)(rr % a.lq);
    const u64 orow = ((u64)bi * a.hq + h) * a.lq + i;
    const T* qr = q + bi * a.sq[0] + h * a.sq[1] + i * a.sq[2];
    const T* gr = g + bi * a.sg[0] + h * a.sg[1] + i * a.sg[2];
    const T* kb = k + bi * a.sk[0] + kvh * a.sk[1];
    const T* vb = v + bi * a.sv[0] + kvh * a.sv[1];
    const i64 vis = visible_keys(a, i);
    const A m = stats[3 * orow], l = stats[3 * orow + 1], D = stats[3 * orow + 2];
    T* dr = dq + grad_row(bi, h, i, a.gq, a.lq, a.d);
    for (u32 c0 = 0; c0 < a.d; c0 += ROW_COLS) {
        A acc[8];
#pragma unroll
        for (int t = 0; t < 8; ++t) acc[t] = 0;
        for (i64 j0 = 0; j0 < vis; j0 += 32) {
            const i64 j = j0 + lane;
            A ds = 0;
            if (j < vis && !key_masked(a, bi, j)) {
                const A s = dot_strided(qr, a.sq[3], kb + j * a.sk[2], a.sk[3], a.d) * scale;
                const A p = m_exp(s - m) / l;
                const A dp = dot_strided(gr, a.sg[3], vb + j * a.sv[2], a.sv[3], a.dv);
                ds = p * (dp - D) * scale;
            }
            const u32 cnt = (u32)(vis - j0 < 32 ? vis - j0 : 32);
            for (u32 u = 0; u < cnt; ++u) {
                const A du = __shfl_sync(0xffffffffu, ds, u);
                const T* kr = kb + (j0 + u) * a.sk[2];
#pragma unroll
                for (int t = 0; t < 8; ++t) {
                    const u32 c = c0 + lane + 32 * t;
                    if (c < a.d) acc[t] += du * Num<T>::load(kr[c * a.sk[3]]);
                }
            }
        }
#pragma unroll
        for (int t = 0; t < 8; ++t) {
            const u32 c = c0 + lane + 32 * t;
            if (c < a.d) dr[c] = Num<T>::store(acc[t]);
        }
    }
}

// Key rows j of (batch, kv head): dv[j] = sum over the group's query heads and the queries i
// that see j of p_ij g_i; dk[j] = sum of p_ij (dp_ij - D_i) scale q_i. blockIdx.x = bkv * bpb +
// (j / W) with bpb = ceil(lk / W). Each output row is written by one warp: no atomics.
template <typename T>
__device__ void attn_dkv_body(const AttnDims& a, typename Num<T>::A scale, const T* q, const T* k, const T* v,
                              const T* g, const typename Num<T>::A* stats, T* dk, T* dvo) {
    typedef typename Num<T>::A A;
    const u32 lane = threadIdx.x & 31, W = blockDim.x >> 5;
    const u32 group = a.hq / a.hkv;
    const u64 bpb = ((u64)a.lk + W - 1) / W;
    const u64 bkv = blockIdx.x / bpb;
    const u64 jj = (blockIdx.x % bpb) * W + (threadIdx.x >> 5);
    if (jj >= a.lk) return;
    const u32 j = (u32)jj;
    const u32 bi = (u32)(bkv / a.hkv), kvh = (u32)(bkv % a.hkv);
    const T* kr = k + bi * a.sk[0] + kvh * a.sk[1] + j * a.sk[2];
    const T* vr = v + bi * a.sv[0] + kvh * a.sv[1] + j * a.sv[2];
    // First query that sees key j (every query sees key 0); none when j is masked.
    i64 i_first = 0;
    if (a.causal && j > 0) {
        const i64 f = (i64)j + (i64)a.lq - (i64)a.lk;
        i_first = f > 0 ? f : 0;
    }
    if (key_masked(a, bi, j)) i_first = a.lq;
    const u32 cols = a.d > a.dv ? a.d : a.dv;
    for (u32 c0 = 0; c0 < cols; c0 += ROW_COLS) {
        A ak[8], av[8];
#pragma unroll
        for (int t = 0; t < 8; ++t) ak[t] = av[t] = 0;
        for (u32 hg = 0; hg < group; ++hg) {
            const u32 h = kvh * group + hg;
            const T* qh = q + bi * a.sq[0] + h * a.sq[1];
            const T* gh = g + bi * a.sg[0] + h * a.sg[1];
            const u64 row0 = ((u64)bi * a.hq + h) * a.lq;
            for (i64 i0 = i_first; i0 < (i64)a.lq; i0 += 32) {
                const i64 i = i0 + lane;
                A p = 0, ds = 0;
                if (i < (i64)a.lq) {
                    const A* st = stats + 3 * (row0 + i);
                    const A s = dot_strided(qh + i * a.sq[2], a.sq[3], kr, a.sk[3], a.d) * scale;
                    p = m_exp(s - st[0]) / st[1];
                    const A dp = dot_strided(gh + i * a.sg[2], a.sg[3], vr, a.sv[3], a.dv);
                    ds = p * (dp - st[2]) * scale;
                }
                const u32 cnt = (u32)((i64)a.lq - i0 < 32 ? (i64)a.lq - i0 : 32);
                for (u32 u = 0; u < cnt; ++u) {
                    const A pu = __shfl_sync(0xffffffffu, p, u), du = __shfl_sync(0xffffffffu, ds, u);
                    const T* qi = qh + (i0 + u) * a.sq[2];
                    const T* gi = gh + (i0 + u) * a.sg[2];
#pragma unroll
                    for (int t = 0; t < 8; ++t) {
                        const u32 c = c0 + lane + 32 * t;
                        if (c < a.dv) av[t] += pu * Num<T>::load(gi[c * a.sg[3]]);
                        if (c < a.d) ak[t] += du * Num<T>::load(qi[c * a.sq[3]]);
                    }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < 8; ++t) {
            const u32 c = c0 + lane + 32 * t;
            if (c < a.d) dk[grad_row(bi, kvh, j, a.gk, a.lk, a.d) + c] = Num<T>::store(ak[t]);
            if (c < a.dv) dvo[grad_row(bi, kvh, j, a.gk, a.lk, a.dv) + c] = Num<T>::store(av[t]);
        }
    }
}

// ---- tiled kernels on CUDA cores (f32/f16/bf16, f32 arithmetic) ----
//
// A block of 256 threads (16 x 16: tx = tid % 16, ty = tid / 16) works on 64 x 64 tiles held
// in shared memory as f32, row-major with a row stride `ld` (host-chosen, `tile_ld`): a
// multiple of 4 whose quarter is odd (conflict-free float4 reads across 16 rows), >= AT_PS.
// In a 64 x 64 product thread (ty, tx) owns rows ty + 16 e and columns tx + 16 f (e, f < 4);
// in a 64 x (64 NC) accumulation it owns rows ty + 16 e and columns 64 qq + 4 tx + (0..3).
// Scores are kept in log2 units: sl2 = scale * log2(e). Query tiles are numbered from the last
// one (the most work under a causal mask comes first): blockIdx.x = yy * (b * hq) + bh.

#define AT_BM 64
#define AT_BN 64
#define AT_PS 68

extern __shared__ __align__(16) unsigned char at_smem[];

__device__ __forceinline__ float f4c(const float4& v, int c) { return c == 0 ? v.x : (c == 1 ? v.y : (c == 2 ? v.z : v.w)); }

// Rows [r0, r0 + 64) of an operand (row stride rs, column stride cs) into dst [64][ld] as f32,
// columns [0, width); zero past `rows` rows or `cols` columns. All 256 threads take part.
template <typename T>
__device__ __forceinline__ void tile_load(float* dst, u32 ld, u32 width, const T* base, i64 rs, i64 cs, i64 r0,
                                          i64 rows, u32 cols) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (u32 r = warp; r < 64; r += 8) {
        const i64 row = r0 + r;
        const bool ok = row < rows;
        const T* src = base + row * rs;
        for (u32 c = lane; c < width; c += 32) dst[r * ld + c] = (ok && c < cols) ? Num<T>::load(src[c * cs]) : 0.f;
    }
}

// s[e][f] += sum over k < kpad (a multiple of 4) of A[ty + 16 e][k] * B[tx + 16 f][k].
__device__ __forceinline__ void tile_dot(float (&s)[4][4], const float* A, u32 lda, const float* B, u32 ldb, u32 kpad) {
    const u32 tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
#pragma unroll 2
    for (u32 kk = 0; kk < kpad; kk += 4) {
        float4 x[4], y[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) x[e] = *(const float4*)&A[(ty + 16 * e) * lda + kk];
#pragma unroll
        for (int f = 0; f < 4; ++f) y[f] = *(const float4*)&B[(tx + 16 * f) * ldb + kk];
#pragma unroll
        for (int e = 0; e < 4; ++e)
#pragma unroll
            for (int f = 0; f < 4; ++f) {
                float t = s[e][f];
                t = fmaf(x[e].x, y[f].x, t);
                t = fmaf(x[e].y, y[f].y, t);
                t = fmaf(x[e].z, y[f].z, t);
                t = fmaf(x[e].w, y[f].w, t);
                s[e][f] = t;
            }
    }
}

// acc[e][qq][c] += sum over j < 64 of P[ty + 16 e][j] * M[j][64 qq + 4 tx + c]; P has row
// stride AT_PS, M row stride ldm (>= 64 NC, 16-byte aligned rows).
template <int NC>
__device__ __forceinline__ void tile_acc(float (&acc)[4][NC][4], const float* P, const float* M, u32 ldm) {
    const u32 tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
#pragma unroll 2
    for (u32 jj = 0; jj < 64; jj += 4) {
        float4 p[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) p[e] = *(const float4*)&P[(ty + 16 * e) * AT_PS + jj];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
#pragma unroll
            for (int qq = 0; qq < NC; ++qq) {
                const float4 m = *(const float4*)&M[(jj + u) * ldm + qq * 64 + tx * 4];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const float pe = f4c(p[e], u);
                    acc[e][qq][0] = fmaf(pe, m.x, acc[e][qq][0]);
                    acc[e][qq][1] = fmaf(pe, m.y, acc[e][qq][1]);
                    acc[e][qq][2] = fmaf(pe, m.z, acc[e][qq][2]);
                    acc[e][qq][3] = fmaf(pe, m.w, acc[e][qq][3]);
                }
            }
        }
    }
}

template <int NC> __device__ __forceinline__ void zero_acc(float (&acc)[4][NC][4]) {
#pragma unroll
    for (int e = 0; e < 4; ++e)
#pragma unroll
        for (int qq = 0; qq < NC; ++qq)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[e][qq][c] = 0.f;
}

// Writes acc rows (r0 + ty + 16 e < rows) into out (row stride ld), columns < cols.
template <typename T, int NC>
__device__ __forceinline__ void tile_store(T* out, u64 ld, u64 r0, u64 rows, u32 cols, const float (&acc)[4][NC][4]) {
    const u32 tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const u64 r = r0 + ty + 16 * e;
        if (r >= rows) continue;
#pragma unroll
        for (int qq = 0; qq < NC; ++qq)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const u32 col = qq * 64 + tx * 4 + c;
                if (col < cols) out[r * ld + col] = Num<T>::store(acc[e][qq][c]);
            }
    }
}

// Forward, d and dv <= 256: 64 query rows of one (batch, head) per block, held in shared
// memory; the visible keys walked in tiles of 64 (K and V tiles in shared memory) with an
// online softmax (running max and sum per row, 16 lanes sharing a row) and the output rows
// accumulated in registers. Shared memory (floats): Q [64][ld], K [64][ld] (then reused for
// the probability tile [64][AT_PS]), V [64][64 DVC].
// With STATS (the backward's first step) it writes no output but stats[3 row] = (max score in
// log2 units, sum of 2^(s - max), D = sum_c g[c] o[c]) for row = (b * hq + h) * lq + i.
template <typename T, int DVC, bool STATS>
__device__ void attn_fwd_body(const AttnDims& a, u32 ld, float sl2, const T* __restrict__ q, const T* __restrict__ k,
                              const T* __restrict__ v, T* __restrict__ o, const T* __restrict__ g, float* stats) {
    constexpr u32 VW = DVC * 64;
    float* Qs = (float*)at_smem;
    float* Ks = Qs + AT_BM * ld;
    float* Ps = Ks;
    float* Vs = Ks + AT_BN * ld;
    const u32 tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    const u32 nbh = a.b * a.hq;
    const u32 tiles = (a.lq + AT_BM - 1) / AT_BM;
    const u32 bh = blockIdx.x % nbh, tile = tiles - 1 - blockIdx.x / nbh;
    const u32 bi = bh / a.hq, h = bh % a.hq, kvh = h / (a.hq / a.hkv);
    const u32 i0 = tile * AT_BM;
    const u32 dpad = (a.d + 3) & ~3u;
    const T* qb = q + bi * a.sq[0] + h * a.sq[1];
    const T* kb = k + bi * a.sk[0] + kvh * a.sk[1];
    const T* vb = v + bi * a.sv[0] + kvh * a.sv[1];

    tile_load(Qs, ld, ld, qb, a.sq[2], a.sq[3], i0, a.lq, a.d);
    // Keys this block needs: those its last query sees.
    const u32 il = i0 + AT_BM - 1 < a.lq - 1 ? i0 + AT_BM - 1 : a.lq - 1;
    const i64 jend = visible_keys(a, il);
    i64 lim[4];  // last key each owned row sees
    float m[4], l[4], acc[4][DVC][4];
    zero_acc(acc);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        lim[e] = visible_keys(a, i0 + ty + 16 * e) - 1;
        m[e] = neg_inf<float>();
        l[e] = 0.f;
    }

    for (i64 j0 = 0; j0 < jend; j0 += AT_BN) {
        __syncthreads();  // Q is stored; the previous tile's reads of P and V are done
        tile_load(Ks, ld, ld, kb, a.sk[2], a.sk[3], j0, a.lk, a.d);
        tile_load(Vs, VW, VW, vb, a.sv[2], a.sv[3], j0, a.lk, a.dv);
        __syncthreads();

        float s[4][4] = {};
        tile_dot(s, Qs, ld, Ks, ld, dpad);
        bool km[4];  // this thread's keys j0 + tx + 16 f that are padding
#pragma unroll
        for (int f = 0; f < 4; ++f) km[f] = j0 + tx + 16 * f < a.lk && key_masked(a, bi, j0 + tx + 16 * f);

        // Online softmax over this tile, per owned row (16 lanes share a row).
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float mx = neg_inf<float>();
#pragma unroll
            for (int f = 0; f < 4; ++f) {
                const i64 j = j0 + tx + 16 * f;
                s[e][f] = j <= lim[e] && !km[f] ? s[e][f] * sl2 : neg_inf<float>();
                mx = fmaxf(mx, s[e][f]);
            }
#pragma unroll
            for (int sh = 1; sh < 16; sh <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, sh));
            const float mn = fmaxf(m[e], mx);
            const float ref = mn == neg_inf<float>() ? 0.f : mn;
            const float al = exp2f(m[e] - ref);
            m[e] = mn;
            l[e] *= al;
#pragma unroll
            for (int qq = 0; qq < DVC; ++qq)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[e][qq][c] *= al;
#pragma unroll
            for (int f = 0; f < 4; ++f) {
                s[e][f] = exp2f(s[e][f] - ref);
                l[e] += s[e][f];
            }
        }
        __syncthreads();  // every score is computed: K's space takes the probabilities
#pragma unroll
        for (int e = 0; e < 4; ++e)
#pragma unroll
            for (int f = 0; f < 4; ++f) Ps[(ty + 16 * e) * AT_PS + tx + 16 * f] = s[e][f];
        __syncthreads();
        tile_acc(acc, Ps, Vs, VW);
    }

#pragma unroll
    for (int e = 0; e < 4; ++e) {
        float lt = l[e];
#pragma unroll
        for (int sh = 1; sh < 16; sh <<= 1) lt += __shfl_xor_sync(0xffffffffu, lt, sh);
        const u32 i = i0 + ty + 16 * e;
        // No visible unmasked key: the softmax of an empty row, NaN like the CPU (the
        // statistics get D = 0 instead: such a row has no gradient).
        const float inv = lt > 0.f ? 1.f / lt : (STATS ? 0.f : nan_of<float>());
#pragma unroll
        for (int qq = 0; qq < DVC; ++qq)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[e][qq][c] *= inv;
        if constexpr (STATS) {
            const bool ok = i < a.lq;
            const T* gr = g + bi * a.sg[0] + h * a.sg[1] + (ok ? i : 0) * a.sg[2];
            float dsum = 0.f;
#pragma unroll
            for (int qq = 0; qq < DVC; ++qq)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const u32 col = qq * 64 + tx * 4 + c;
                    if (ok && col < a.dv) dsum += Num<T>::load(gr[col * a.sg[3]]) * acc[e][qq][c];
                }
#pragma unroll
            for (int sh = 1; sh < 16; sh <<= 1) dsum += __shfl_xor_sync(0xffffffffu, dsum, sh);
            if (ok && tx == 0) {
                float* st = stats + 3 * ((u64)bh * a.lq + i);
                st[0] = lt > 0.f ? m[e] : 0.f;
                st[1] = lt;
                st[2] = dsum;
            }
        }
    }
    if constexpr (!STATS) tile_store<T, DVC>(o + ((u64)bi * a.lq * a.hq + h) * a.dv, (u64)a.hq * a.dv, i0, a.lq, a.dv, acc);
}

// Backward, dq, d and dv <= 128 (stats from attn_fwd_body<STATS>): per 64 query rows of one
// (batch, head), for each visible key tile: S = Q K^T, P = 2^(S sl2 - max) / sum,
// dP = G V^T, dS = P (dP - D) scale, dQ += dS K. Shared memory (floats): Q [64][ldq],
// K [64][ldq], G [64][ldv], V [64][ldv] (then reused for dS [64][AT_PS]); ldq >= 64 DC,
// ldv >= 64 and >= AT_PS. Grid as the forward.
template <typename T, int DC>
__device__ void attn_bdq_body(const AttnDims& a, u32 ldq, u32 ldv, float sl2, float scale, const T* __restrict__ q,
                              const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ g,
                              const float* __restrict__ stats, T* __restrict__ dq) {
    float* Qs = (float*)at_smem;
    float* Ks = Qs + 64 * ldq;
    float* Gs = Ks + 64 * ldq;
    float* Vs = Gs + 64 * ldv;
    float* Ds = Vs;
    const u32 tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const u32 nbh = a.b * a.hq;
    const u32 tiles = (a.lq + AT_BM - 1) / AT_BM;
    const u32 bh = blockIdx.x % nbh, tile = tiles - 1 - blockIdx.x / nbh;
    const u32 bi = bh / a.hq, h = bh % a.hq, kvh = h / (a.hq / a.hkv);
    const u32 i0 = tile * AT_BM;
    const u32 dpad = (a.d + 3) & ~3u, dvpad = (a.dv + 3) & ~3u;
    const T* kb = k + bi * a.sk[0] + kvh * a.sk[1];
    const T* vb = v + bi * a.sv[0] + kvh * a.sv[1];
    tile_load(Qs, ldq, ldq, q + bi * a.sq[0] + h * a.sq[1], a.sq[2], a.sq[3], i0, a.lq, a.d);
    tile_load(Gs, ldv, ldv, g + bi * a.sg[0] + h * a.sg[1], a.sg[2], a.sg[3], i0, a.lq, a.dv);
    i64 lim[4];
    float mx[4], il[4], dd[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        const u32 i = i0 + ty + 16 * e;
        lim[e] = visible_keys(a, i) - 1;
        const bool ok = i < a.lq;
        const float* st = stats + 3 * ((u64)bh * a.lq + (ok ? i : 0));
        mx[e] = ok ? st[0] : 0.f;
        il[e] = ok ? 1.f / st[1] : 0.f;
        dd[e] = ok ? st[2] : 0.f;
    }
    const u32 last = i0 + AT_BM - 1 < a.lq - 1 ? i0 + AT_BM - 1 : a.lq - 1;
    const i64 jend = visible_keys(a, last);
    float acc[4][DC][4];
    zero_acc(acc);
    for (i64 j0 = 0; j0 < jend; j0 += AT_BN) {
        __syncthreads();  // Q and G are stored; the previous tile's reads of dS and K are done
        tile_load(Ks, ldq, ldq, kb, a.sk[2], a.sk[3], j0, a.lk, a.d);
        tile_load(Vs, ldv, ldv, vb, a.sv[2], a.sv[3], j0, a.lk, a.dv);
        __syncthreads();
        float s[4][4] = {}, dp[4][4] = {};
        tile_dot(s, Qs, ldq, Ks, ldq, dpad);
        tile_dot(dp, Gs, ldv, Vs, ldv, dvpad);
        bool km[4];  // this thread's keys j0 + tx + 16 f that are padding
#pragma unroll
        for (int f = 0; f < 4; ++f) km[f] = j0 + tx + 16 * f < a.lk && key_masked(a, bi, j0 + tx + 16 * f);
#pragma unroll
        for (int e = 0; e < 4; ++e)
#pragma unroll
            for (int f = 0; f < 4; ++f) {
                const i64 j = j0 + tx + 16 * f;
                const float p = j <= lim[e] && !km[f] ? exp2f(s[e][f] * sl2 - mx[e]) * il[e] : 0.f;
                s[e][f] = p * (dp[e][f] - dd[e]) * scale;
            }
        __syncthreads();  // every product is computed: V's space takes dS
#pragma unroll
        for (int e = 0; e < 4; ++e)
#pragma unroll
            for (int f = 0; f < 4; ++f) Ds[(ty + 16 * e) * AT_PS + tx + 16 * f] = s[e][f];
        __syncthreads();
        tile_acc(acc, Ds, Ks, ldq);
    }
    tile_store<T, DC>(dq + grad_row(bi, h, 0, a.gq, a.lq, a.d), (u64)a.gq * a.d, i0, a.lq, a.d, acc);
}

// Backward, dk and dv, d and dv <= 128: per 64 key rows of one (batch, kv head), for each
// query head of its group and each query tile that sees a key of the block:
// S^T = K Q^T, P^T = 2^(S^T sl2 - max_i) / sum_i, dP^T = V G^T, dS^T = P^T (dP^T - D_i) scale,
// dV += P^T G, dK += dS^T Q. Shared memory (floats): K [64][ldq], V [64][ldv], Q [64][ldq],
// G [64][ldv], P^T and dS^T [64][AT_PS] each, the query tile's stats [64][3].
// Grid: blockIdx.x = key tile * (b * hkv) + (b * hkv index), the first key tiles (seen by the
// most queries) first. Each dk/dv row is written by one block: no atomics.
template <typename T, int DC, int DVC>
__device__ void attn_bdkv_body(const AttnDims& a, u32 ldq, u32 ldv, float sl2, float scale, const T* __restrict__ q,
                               const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ g,
                               const float* __restrict__ stats, T* __restrict__ dk, T* __restrict__ dvo) {
    float* Ks = (float*)at_smem;
    float* Vs = Ks + 64 * ldq;
    float* Qs = Vs + 64 * ldv;
    float* Gs = Qs + 64 * ldq;
    float* Pt = Gs + 64 * ldv;
    float* Dt = Pt + 64 * AT_PS;
    float* St = Dt + 64 * AT_PS;
    const u32 tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const u32 nbkv = a.b * a.hkv, group = a.hq / a.hkv;
    const u32 bkv = blockIdx.x % nbkv, j0 = (blockIdx.x / nbkv) * AT_BN;
    const u32 bi = bkv / a.hkv, kvh = bkv % a.hkv;
    const u32 dpad = (a.d + 3) & ~3u, dvpad = (a.dv + 3) & ~3u;
    tile_load(Ks, ldq, ldq, k + bi * a.sk[0] + kvh * a.sk[1], a.sk[2], a.sk[3], j0, a.lk, a.d);
    tile_load(Vs, ldv, ldv, v + bi * a.sv[0] + kvh * a.sv[1], a.sv[2], a.sv[3], j0, a.lk, a.dv);
    // First query that sees a key of this block (every query sees key 0).
    i64 first = 0;
    if (a.causal && j0 > 0) {
        const i64 f = (i64)j0 + a.lq - a.lk;
        first = f > 0 ? f : 0;
    }
    bool km[4];  // this thread's keys j0 + ty + 16 e that are padding (no query sees them)
#pragma unroll
    for (int e = 0; e < 4; ++e) km[e] = j0 + ty + 16 * e < a.lk && key_masked(a, bi, j0 + ty + 16 * e);
    float ak[4][DC][4], av[4][DVC][4];
    zero_acc(ak);
    zero_acc(av);
    for (u32 hg = 0; hg < group; ++hg) {
        const u32 h = kvh * group + hg;
        const u64 row0 = ((u64)bi * a.hq + h) * a.lq;
        const T* qh = q + bi * a.sq[0] + h * a.sq[1];
        const T* gh = g + bi * a.sg[0] + h * a.sg[1];
        for (i64 i0 = (first / AT_BM) * AT_BM; i0 < (i64)a.lq; i0 += AT_BM) {
            __syncthreads();  // the previous tile's reads of Q, G, P^T, dS^T and stats are done
            tile_load(Qs, ldq, ldq, qh, a.sq[2], a.sq[3], i0, a.lq, a.d);
            tile_load(Gs, ldv, ldv, gh, a.sg[2], a.sg[3], i0, a.lq, a.dv);
            for (u32 r = threadIdx.x; r < 64; r += blockDim.x) {
                const bool ok = i0 + r < a.lq;
                const float* st = stats + 3 * (row0 + (ok ? i0 + r : 0));
                St[3 * r] = ok ? st[0] : 0.f;
                St[3 * r + 1] = ok ? 1.f / st[1] : 0.f;
                St[3 * r + 2] = ok ? st[2] : 0.f;
            }
            __syncthreads();
            float s[4][4] = {}, dp[4][4] = {};
            tile_dot(s, Ks, ldq, Qs, ldq, dpad);
            tile_dot(dp, Vs, ldv, Gs, ldv, dvpad);
#pragma unroll
            for (int f = 0; f < 4; ++f) {
                const u32 r = tx + 16 * f;
                const i64 i = i0 + r;
                const i64 lim = i < (i64)a.lq ? visible_keys(a, (u32)i) - 1 : -1;
                const float smax = St[3 * r], sinv = St[3 * r + 1], dd = St[3 * r + 2];
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const i64 j = (i64)j0 + ty + 16 * e;
                    const float p = j <= lim && !km[e] ? exp2f(s[e][f] * sl2 - smax) * sinv : 0.f;
                    Pt[(ty + 16 * e) * AT_PS + r] = p;
                    Dt[(ty + 16 * e) * AT_PS + r] = p * (dp[e][f] - dd) * scale;
                }
            }
            __syncthreads();
            tile_acc(av, Pt, Gs, ldv);
            tile_acc(ak, Dt, Qs, ldq);
        }
    }
    tile_store<T, DC>(dk + grad_row(bi, kvh, 0, a.gk, a.lk, a.d), (u64)a.gk * a.d, j0, a.lk, a.d, ak);
    tile_store<T, DVC>(dvo + grad_row(bi, kvh, 0, a.gk, a.lk, a.dv), (u64)a.gk * a.dv, j0, a.lk, a.dv, av);
}

// ---- tensor-core forward (f16/bf16, d == dv in {64, 96, 128, 256}) ----
//
// FlashAttention-2 style on mma.sync m16n8k16 (f32 accumulation): a block of 4 warps owns 64
// query rows of one (batch, head), 16 per warp, its Q fragments in registers (d <= 128; wider
// heads reload them from shared memory per key tile); K and V tiles of
// 64 keys stream through shared memory with cp.async, double-buffered. Per tile a warp
// computes S = Q K^T (16 x 64, f32), masks it, updates the running max and sum of its rows
// (online softmax in log2 units, rows shared by the 4 lanes of a quad), turns the
// probabilities into A fragments (T precision) and accumulates O += P V (16 x D, f32).
// Requires unit last-dim strides, 16-byte aligned rows (all other strides multiples of 8
// elements). Shared memory: Q [64][D + 8], K and V [2][64][D + 8] (T elements; the +8 makes
// ldmatrix conflict-free). Grid and tile order as the FMA kernel above; blockDim 128.

template <typename T> struct Mma;
template <> struct Mma<f16> {
    static __device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    // (lo, hi) as two halves, lo in the low 16 bits.
    static __device__ __forceinline__ u32 pack(float lo, float hi) {
        u32 r;
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};
template <> struct Mma<bf16> {
    static __device__ __forceinline__ void mma(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
    static __device__ __forceinline__ u32 pack(float lo, float hi) {
        u32 r;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
        return r;
    }
};

__device__ __forceinline__ u32 smem_addr(const void* p) { return (u32)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void cp_async16(u32 dst, const void* src, u32 bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N)); }
__device__ __forceinline__ void ldsm_x4(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32 (&r)[4], u32 addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Rows [r0, r0 + 64) of a [rows, D] operand (row stride rs elements) into a [64][D + 8] tile;
// rows past `rows` are zero-filled. All 128 threads issue copies.
template <typename T, int D>
__device__ __forceinline__ void mma_load_tile(T* dst, const T* base, i64 rs, i64 r0, i64 rows) {
    constexpr int CPR = D / 8, LD = D + 8;
    for (int c = threadIdx.x; c < 64 * CPR; c += 128) {
        const int r = c / CPR, cc = c % CPR;
        const bool ok = r0 + r < rows;
        const T* src = ok ? base + (r0 + r) * rs + cc * 8 : base;
        cp_async16(smem_addr(dst + r * LD + cc * 8), src, ok ? 16 : 0);
    }
}

// With STATS (the tensor-core backward's first step) it writes no output but, per query row,
// float2 stats (lse, D): lse = max + log2(sum of 2^(s - max)) over the row's scores s in log2
// units (so p = 2^(s - lse); +inf for a row that sees no key, whose p are then 0) and
// D = sum_c g[c] o[c].
// Without STATS, `stats` (when not null) gets each row's lse in natural-log units, f32
// (`Op::Attention`'s second output).
template <typename T, int D, bool STATS, typename TC>
__device__ void attn_mma_body(const AttnDims& a, float sl2, const T* __restrict__ q, const T* __restrict__ k,
                              const T* __restrict__ v, T* __restrict__ o, const T* __restrict__ g = nullptr,
                              float* __restrict__ stats = nullptr) {
    constexpr int DT = D / 8, TL = TC::TILE;
    T* Qs = TC::smem();
    T* Ks = Qs + TL;       // [2][TILE]
    T* Vs = Ks + 2 * TL;   // [2][TILE]
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gr = lane >> 2, tq = lane & 3;
    const u32 nbh = a.b * a.hq;
    const u32 tiles = (a.lq + AT_BM - 1) / AT_BM;
    const u32 bh = blockIdx.x % nbh, tile = tiles - 1 - blockIdx.x / nbh;
    const u32 bi = bh / a.hq, h = bh % a.hq, kvh = h / (a.hq / a.hkv);
    const u32 i0 = tile * AT_BM;
    const T* qb = q + bi * a.sq[0] + h * a.sq[1];
    const T* kb = k + bi * a.sk[0] + kvh * a.sk[1];
    const T* vb = v + bi * a.sv[0] + kvh * a.sv[1];

    const u32 il = i0 + AT_BM - 1 < a.lq - 1 ? i0 + AT_BM - 1 : a.lq - 1;
    const i64 ntiles = (visible_keys(a, il) + AT_BN - 1) / AT_BN;
    TC::load(Qs, qb, a.sq[2], i0, a.lq);
    cp_async_commit();
    if (ntiles > 0) {
        TC::load(Ks, kb, a.sk[2], 0, a.lk);
        TC::load(Vs, vb, a.sv[2], 0, a.lk);
    }
    cp_async_commit();

    // This thread's rows (of its warp's 16): gr and gr + 8.
    const u32 row0 = i0 + warp * 16 + gr;
    const i64 lim[2] = {visible_keys(a, row0) - 1, visible_keys(a, row0 + 8) - 1};
    const i64 wvis = visible_keys(a, i0 + warp * 16);  // keys the warp's first (fewest-key) row sees
    float m[2] = {neg_inf<float>(), neg_inf<float>()}, l[2] = {0.f, 0.f};
    float acc[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[dt][e] = 0.f;

    cp_async_wait<1>();  // Q has landed (K/V tile 0 may still be in flight)
    TC::landed();
    __syncthreads();
    typename TC::AFrag qf;
    TC::frag(qf, Qs, warp * 16);

    for (i64 t = 0; t < ntiles; ++t) {
        const int buf = (int)(t & 1);
        const T* Kc = Ks + buf * TL;
        const T* Vc = Vs + buf * TL;
        if (t + 1 < ntiles) {
            TC::load(Ks + (buf ^ 1) * TL, kb, a.sk[2], (t + 1) * AT_BN, a.lk);
            TC::load(Vs + (buf ^ 1) * TL, vb, a.sv[2], (t + 1) * AT_BN, a.lk);
        }
        cp_async_commit();
        cp_async_wait<1>();  // tile t has landed
        TC::landed();
        __syncthreads();

        float s[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
        TC::rows64(s, qf, Qs, warp * 16, Kc);
        TC::template wait<0>(s);

        const i64 j0 = t * AT_BN;
        if (a.mask == nullptr && j0 + AT_BN <= wvis) {
            // Every row of the warp sees all 64 keys: scale only.
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] *= sl2;
        } else {
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const i64 j = j0 + nt * 8 + tq * 2 + c;
                    const bool km = j < a.lk && key_masked(a, bi, j);
#pragma unroll
                    for (int rr = 0; rr < 2; ++rr) {
                        float& x = s[nt][rr * 2 + c];
                        x = j <= lim[rr] && !km ? x * sl2 : neg_inf<float>();
                    }
                }
        }
#pragma unroll
        for (int rr = 0; rr < 2; ++rr) {
            float mx = neg_inf<float>();
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int c = 0; c < 2; ++c) mx = fmaxf(mx, s[nt][rr * 2 + c]);
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mn = fmaxf(m[rr], mx);
            const float ref = mn == neg_inf<float>() ? 0.f : mn;
            const float al = ex2(m[rr] - ref);
            m[rr] = mn;
            l[rr] *= al;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt) {
                acc[dt][rr * 2] *= al;
                acc[dt][rr * 2 + 1] *= al;
            }
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    float& x = s[nt][rr * 2 + c];
                    x = ex2(x - ref);
                    l[rr] += x;
                }
        }

        TC::p_rows(acc, s, Vc);
        TC::template wait<0>(acc);
        __syncthreads();  // every warp is done with this buffer before it is refilled
    }

#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        float lt = l[rr];
        lt += __shfl_xor_sync(0xffffffffu, lt, 1);
        lt += __shfl_xor_sync(0xffffffffu, lt, 2);
        const u32 i = row0 + rr * 8;
        if constexpr (STATS) {
            // D = sum_c g[c] o[c] over the quad's columns; rows with no visible key get D = 0.
            const bool ok = i < a.lq;
            const float inv = lt > 0.f ? 1.f / lt : 0.f;
            const T* grw = g + bi * a.sg[0] + h * a.sg[1] + (ok ? i : 0) * a.sg[2];
            float dsum = 0.f;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt)
#pragma unroll
                for (int c = 0; c < 2; ++c)
                    if (ok) dsum += Num<T>::load(grw[(dt * 8 + tq * 2 + c) * a.sg[3]]) * (acc[dt][rr * 2 + c] * inv);
            dsum += __shfl_xor_sync(0xffffffffu, dsum, 1);
            dsum += __shfl_xor_sync(0xffffffffu, dsum, 2);
            if (ok && tq == 0)
                ((float2*)stats)[(u64)bh * a.lq + i] = make_float2(lt > 0.f ? m[rr] + log2f(lt) : -neg_inf<float>(), dsum);
        } else {
            if (i >= a.lq) continue;
            if (stats != nullptr && tq == 0)
                stats[(u64)bh * a.lq + i] = lt > 0.f ? (m[rr] + log2f(lt)) * 0.69314718f : -neg_inf<float>();
            const float inv = lt > 0.f ? 1.f / lt : nan_of<float>();  // no visible unmasked key
            T* orw = o + (((u64)bi * a.lq + i) * a.hq + h) * a.dv;
#pragma unroll
            for (int dt = 0; dt < DT; ++dt)
                *(u32*)(orw + dt * 8 + tq * 2) = Mma<T>::pack(acc[dt][rr * 2] * inv, acc[dt][rr * 2 + 1] * inv);
        }
    }
}

// ---- tensor-core backward (f16/bf16, d == dv in {64, 96, 128}) ----
//
// FlashAttention-2's backward on mma.sync m16n8k16, split in two kernels so that every output
// row is written by one block (no atomics: the same bits on every run), after the statistics
// pass (attn_mma_body<STATS>). Probabilities P and dS = P (dP - D) scale are rounded to T for
// the products that read them; every sum is f32. Same input requirements, grid order and
// shared-memory row padding as the tensor-core forward; blockDim 128 (4 warps x 16 rows).
// Heads up to 64 keep a warp's fixed A fragments in registers; wider heads reread them from
// shared memory (registers would spill).

// A fragments (16 rows x 16 columns from row m0, column k0) of a [rows][LD] tile.
template <typename T, int LD>
__device__ __forceinline__ void frag_a(u32 (&r)[4], const T* base, u32 m0, u32 k0) {
    const u32 lane = threadIdx.x & 31;
    ldsm_x4(r, smem_addr(base + (m0 + (lane & 15)) * LD + k0 + (lane >> 4) * 8));
}
// B fragments of two n-tiles (n0 .. n0 + 15) x 16 k (from k0) of a tile stored [n][k]:
// (r[0], r[1]) for n0 .. n0 + 7, (r[2], r[3]) for n0 + 8 .. n0 + 15.
template <typename T, int LD>
__device__ __forceinline__ void frag_b_nk(u32 (&r)[4], const T* base, u32 n0, u32 k0) {
    const u32 lane = threadIdx.x & 31;
    ldsm_x4(r, smem_addr(base + (n0 + ((lane >> 4) << 3) + (lane & 7)) * LD + k0 + ((lane >> 3) & 1) * 8));
}
// The same from a tile stored [k][n] (transposed by ldmatrix).
template <typename T, int LD>
__device__ __forceinline__ void frag_b_kn(u32 (&r)[4], const T* base, u32 k0, u32 n0) {
    const u32 lane = threadIdx.x & 31;
    ldsm_x4_t(r, smem_addr(base + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + n0 + (lane >> 4) * 8));
}
// C (16 x 64) += A (16 x D, fragments af or rows m0.. of As) times the 64 rows of Bs ([n][k]).
template <typename T, int D, bool REG>
__device__ __forceinline__ void mma_rows64(float (&c)[8][4], const u32 (&af)[REG ? D / 16 : 1][4], const T* As,
                                           u32 m0, const T* Bs) {
    constexpr int LD = D + 8;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        u32 a[4];
        if (REG) {
#pragma unroll
            for (int e = 0; e < 4; ++e) a[e] = af[REG ? kk : 0][e];
        } else {
            frag_a<T, LD>(a, As, m0, kk * 16);
        }
#pragma unroll
        for (int np = 0; np < 4; ++np) {
            u32 b[4];
            frag_b_nk<T, LD>(b, Bs, np * 16, kk * 16);
            Mma<T>::mma(c[2 * np], a, b[0], b[1]);
            Mma<T>::mma(c[2 * np + 1], a, b[2], b[3]);
        }
    }
}
// acc (16 x D) += P (16 x 64, C-fragment values in p) times Bs (64 rows [k][n], n < D).
template <typename T, int D>
__device__ __forceinline__ void mma_p_rows(float (&acc)[D / 8][4], const float (&p)[8][4], const T* Bs) {
    constexpr int LD = D + 8;
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
        const u32 pa[4] = {Mma<T>::pack(p[2 * kk][0], p[2 * kk][1]), Mma<T>::pack(p[2 * kk][2], p[2 * kk][3]),
                           Mma<T>::pack(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                           Mma<T>::pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
            u32 b[4];
            frag_b_kn<T, LD>(b, Bs, kk * 16, dp * 16);
            Mma<T>::mma(acc[2 * dp], pa, b[0], b[1]);
            Mma<T>::mma(acc[2 * dp + 1], pa, b[2], b[3]);
        }
    }
}
template <int D> __device__ __forceinline__ void scale_acc(float (&acc)[D / 8][4], float scale) {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[dt][e] *= scale;
}
// Writes a warp's 16 x D accumulator rows r0 + gr, r0 + gr + 8 (< rows) to out (row stride ld).
template <typename T, int D>
__device__ __forceinline__ void mma_store_rows(T* out, const float (&acc)[D / 8][4], u32 r0, u32 rows, u64 ld) {
    const u32 lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const u32 r = r0 + gr + rr * 8;
        if (r >= rows) continue;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt)
            *(u32*)(out + (u64)r * ld + dt * 8 + tq * 2) = Mma<T>::pack(acc[dt][rr * 2], acc[dt][rr * 2 + 1]);
    }
}

// ---- tile policies: how the tensor-core kernels hold a 64-row operand tile in shared memory
// and multiply with it ----
//
// The bodies above and below are written once against a policy TC:
//   TC::TILE                 elements of one 64-row tile; TC::smem() the first tile
//   TC::load(dst, ...)       cp.async of rows [r0, r0 + 64) of a [rows, D] operand (zero past rows)
//   TC::landed()             after cp_async_wait, before the __syncthreads that publishes tiles
//   TC::AFrag, TC::frag      a warp's A operand kept across a walk (where the policy keeps one)
//   TC::rows64(c, af, As, m0, Bs)   c (the warp's 16 rows x 64) += As rows m0.. times Bs^T
//                                   (As, Bs tiles stored [row][D]: a product over D)
//   TC::p_rows(acc, p, Bs)   acc (16 x D) += P (the warp's 16 x 64, C-fragment values) times Bs
//                            (a tile stored [64][D]: a product over its 64 rows)
//   TC::wait<N>(c)           the products may run on after they are issued: wait<N> returns
//                            once at most the N issued last are still running, with c (one
//                            finished product's accumulators) ready to read; TC::held(c)
//                            marks another finished one's. Shared memory a product reads
//                            stays unchanged until its wait.
// Both products leave their results in the mma.sync m16n8 C-fragment layout: thread (gr, tq)
// of warp w holds rows 16 w + gr and + 8, columns 8 n + 2 tq and + 1.

// mma.sync m16n8k16 (sm_80+): tiles [64][D + 8] (rows padded so ldmatrix is conflict-free);
// with REG the A fragments of a warp's 16 rows stay in registers for the whole walk.
template <typename T, int D, bool REG> struct SyncTC {
    static constexpr int TILE = 64 * (D + 8);
    typedef u32 AFrag[REG ? D / 16 : 1][4];
    static __device__ __forceinline__ T* smem() { return (T*)at_smem; }
    static __device__ __forceinline__ void load(T* dst, const T* base, i64 rs, i64 r0, i64 rows) {
        mma_load_tile<T, D>(dst, base, rs, r0, rows);
    }
    static __device__ __forceinline__ void landed() {}
    static __device__ __forceinline__ void frag(AFrag& f, const T* As, u32 m0) {
        if (!REG) return;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) frag_a<T, D + 8>(f[REG ? kk : 0], As, m0, kk * 16);
    }
    static __device__ __forceinline__ void rows64(float (&c)[8][4], const AFrag& af, const T* As, u32 m0,
                                                  const T* Bs) {
        mma_rows64<T, D, REG>(c, af, As, m0, Bs);
    }
    static __device__ __forceinline__ void p_rows(float (&acc)[D / 8][4], const float (&p)[8][4], const T* Bs) {
        mma_p_rows<T, D>(acc, p, Bs);
    }
    template <int N, int R> static __device__ __forceinline__ void wait(float (&)[R][4]) {}
    template <int R> static __device__ __forceinline__ void held(float (&)[R][4]) {}
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// wgmma (sm_90a), D = 64: the block's four warps are one warpgroup and each product is one
// m64n64k16 chain over the whole tile (warp w's accumulator rows are the tile's rows 16 w..).
// Tiles are [64][64] with 128-byte rows in the 128-byte swizzle (16-byte chunk c of row r at
// chunk c ^ (r % 8)), 1024-byte aligned: K-major for the products over D (A and B both read
// from shared memory, 32 bytes a k-step), N-major for the products over the 64 rows (A, the
// probabilities, from registers; B read transposed, 2,048 bytes a k-step). Each product waits
// for its wgmma group before returning; tiles written by cp.async reach the async proxy that
// wgmma reads through fence.proxy.async (`landed`).
template <typename T> struct Wg;
// The 32 f32 accumulators of m64n64 as asm operands %0 .. %31 (the C-fragment order).
#define WG_D "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "  \
             "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_C(c)                                                                                         \
    "+f"(c[0][0]), "+f"(c[0][1]), "+f"(c[0][2]), "+f"(c[0][3]), "+f"(c[1][0]), "+f"(c[1][1]), "+f"(c[1][2]), "+f"(c[1][3]),             \
    "+f"(c[2][0]), "+f"(c[2][1]), "+f"(c[2][2]), "+f"(c[2][3]), "+f"(c[3][0]), "+f"(c[3][1]), "+f"(c[3][2]), "+f"(c[3][3]),            \
    "+f"(c[4][0]), "+f"(c[4][1]), "+f"(c[4][2]), "+f"(c[4][3]), "+f"(c[5][0]), "+f"(c[5][1]), "+f"(c[5][2]), "+f"(c[5][3]),        \
    "+f"(c[6][0]), "+f"(c[6][1]), "+f"(c[6][2]), "+f"(c[6][3]), "+f"(c[7][0]), "+f"(c[7][1]), "+f"(c[7][2]), "+f"(c[7][3])
#define WG_TYPE(T, PT)                                                                                  \
    template <> struct Wg<T> {                                                                          \
        /* c += A B, A and B from descriptors (K-major) */                                               \
        static __device__ __forceinline__ void ss(float (&c)[8][4], u64 da, u64 db) {                   \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                  \
                         "wgmma.mma_async.sync.aligned.m64n64k16.f32." PT "." PT " " WG_D               \
                         ", %32, %33, p, 1, 1, 0, 0;\n}\n"                                              \
                         : WG_C(c)                                                                      \
                         : "l"(da), "l"(db), "r"(1));                                                   \
        }                                                                                               \
        /* c += A B, A from registers (the A-fragment layout of mma.sync m16n8k16), B transposed */    \
        static __device__ __forceinline__ void rs(float (&c)[8][4], const u32 (&a)[4], u64 db) {        \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                  \
                         "wgmma.mma_async.sync.aligned.m64n64k16.f32." PT "." PT " " WG_D               \
                         ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"                                \
                         : WG_C(c)                                                                      \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));                \
        }                                                                                               \
    };
WG_TYPE(f16, "f16")
WG_TYPE(bf16, "bf16")

// Shared-memory matrix descriptor of a swizzled tile: start address, 8-row groups 1,024 bytes
// apart, 128-byte swizzle (the leading offset is unused by this layout).
__device__ __forceinline__ u64 wg_desc(const void* p) {
    return (u64)((smem_addr(p) & 0x3FFFF) >> 4) | ((u64)1 << 16) | ((u64)(1024 >> 4) << 32) | ((u64)1 << 62);
}
// Keeps the compiler from moving reads or writes of the accumulators across a wgmma's issue
// and wait.
__device__ __forceinline__ void wg_hold(float (&c)[8][4]) {
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(c[i][e])::"memory");
}
__device__ __forceinline__ void wg_issue() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

template <typename T> struct WgTC {
    static constexpr int TILE = 64 * 64;
    typedef u32 AFrag[1][1];
    static __device__ __forceinline__ T* smem() {
        return (T*)(((unsigned long long)at_smem + 1023) & ~1023ull);  // a kernel asks 1 KiB more
    }
    static __device__ __forceinline__ void load(T* dst, const T* base, i64 rs, i64 r0, i64 rows) {
        const u32 d0 = smem_addr(dst);
        for (int c = threadIdx.x; c < 64 * 8; c += 128) {
            const int r = c >> 3, cc = c & 7;
            const bool ok = r0 + r < rows;
            const T* src = ok ? base + (r0 + r) * rs + cc * 8 : base;
            cp_async16(d0 + r * 128 + ((cc ^ (r & 7)) << 4), src, ok ? 16 : 0);
        }
    }
    static __device__ __forceinline__ void landed() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
    static __device__ __forceinline__ void frag(AFrag&, const T*, u32) {}
    static __device__ __forceinline__ void rows64(float (&c)[8][4], const AFrag&, const T* As, u32, const T* Bs) {
        const u64 da = wg_desc(As), db = wg_desc(Bs);
        wg_hold(c);
        wg_issue();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) Wg<T>::ss(c, da + 2 * kk, db + 2 * kk);
        wg_commit();
    }
    static __device__ __forceinline__ void p_rows(float (&acc)[8][4], const float (&p)[8][4], const T* Bs) {
        const u64 db = wg_desc(Bs);
        u32 pa[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
            pa[kk][0] = Mma<T>::pack(p[2 * kk][0], p[2 * kk][1]);
            pa[kk][1] = Mma<T>::pack(p[2 * kk][2], p[2 * kk][3]);
            pa[kk][2] = Mma<T>::pack(p[2 * kk + 1][0], p[2 * kk + 1][1]);
            pa[kk][3] = Mma<T>::pack(p[2 * kk + 1][2], p[2 * kk + 1][3]);
        }
        wg_hold(acc);
        wg_issue();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) Wg<T>::rs(acc, pa[kk], db + kk * (2048 >> 4));
        wg_commit();
    }
    template <int N> static __device__ __forceinline__ void wait(float (&c)[8][4]) {
        asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
        wg_hold(c);
    }
    static __device__ __forceinline__ void held(float (&c)[8][4]) { wg_hold(c); }
};
#endif

// dq, per 64 query rows of one (batch, head), for each visible key tile: S = Q K^T,
// dP = G V^T, P = 2^(S sl2 - lse), dS = P (dP - D), dQ += dS K, then dQ *= scale. Shared
// memory (T): Q, G [64][D + 8], K and V [2][64][D + 8] (double-buffered by cp.async). Grid as
// the forward. Tiles whose 64 keys every row of a warp sees skip the masks.
template <typename T, int D, typename TC>
__device__ void attn_mma_bdq_body(const AttnDims& a, float sl2, float scale, const T* __restrict__ q,
                                  const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ g,
                                  const float* __restrict__ stats, T* __restrict__ dq) {
    constexpr int DT = D / 8, TL = TC::TILE;
    T* Qs = TC::smem();
    T* Gs = Qs + TL;
    T* Ks = Gs + TL;      // [2][TILE]
    T* Vs = Ks + 2 * TL;  // [2][TILE]
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gr = lane >> 2, tq = lane & 3;
    const u32 nbh = a.b * a.hq;
    const u32 tiles = (a.lq + AT_BM - 1) / AT_BM;
    const u32 bh = blockIdx.x % nbh, tile = tiles - 1 - blockIdx.x / nbh;
    const u32 bi = bh / a.hq, h = bh % a.hq, kvh = h / (a.hq / a.hkv);
    const u32 i0 = tile * AT_BM;
    const T* kb = k + bi * a.sk[0] + kvh * a.sk[1];
    const T* vb = v + bi * a.sv[0] + kvh * a.sv[1];

    const u32 il = i0 + AT_BM - 1 < a.lq - 1 ? i0 + AT_BM - 1 : a.lq - 1;
    const i64 ntiles = (visible_keys(a, il) + AT_BN - 1) / AT_BN;
    TC::load(Qs, q + bi * a.sq[0] + h * a.sq[1], a.sq[2], i0, a.lq);
    TC::load(Gs, g + bi * a.sg[0] + h * a.sg[1], a.sg[2], i0, a.lq);
    cp_async_commit();
    if (ntiles > 0) {
        TC::load(Ks, kb, a.sk[2], 0, a.lk);
        TC::load(Vs, vb, a.sv[2], 0, a.lk);
    }
    cp_async_commit();

    const u32 row0 = i0 + warp * 16 + gr;
    const i64 wvis = visible_keys(a, i0 + warp * 16);  // keys the warp's first (fewest-key) row sees
    i64 lim[2];
    float lse[2], dd[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
        const u32 i = row0 + rr * 8;
        const bool ok = i < a.lq;
        const float2 st = ok ? ((const float2*)stats)[(u64)bh * a.lq + i] : make_float2(-neg_inf<float>(), 0.f);
        lim[rr] = ok ? visible_keys(a, i) - 1 : -1;
        lse[rr] = st.x;
        dd[rr] = st.y;
    }
    float acc[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[dt][e] = 0.f;

    cp_async_wait<1>();  // Q and G have landed
    TC::landed();
    __syncthreads();
    typename TC::AFrag qf, gf;
    TC::frag(qf, Qs, warp * 16);
    TC::frag(gf, Gs, warp * 16);

    for (i64 t = 0; t < ntiles; ++t) {
        const int buf = (int)(t & 1);
        const T* Kc = Ks + buf * TL;
        const T* Vc = Vs + buf * TL;
        if (t + 1 < ntiles) {
            TC::load(Ks + (buf ^ 1) * TL, kb, a.sk[2], (t + 1) * AT_BN, a.lk);
            TC::load(Vs + (buf ^ 1) * TL, vb, a.sv[2], (t + 1) * AT_BN, a.lk);
        }
        cp_async_commit();
        cp_async_wait<1>();  // tile t has landed
        TC::landed();
        __syncthreads();

        float s[8][4], dp[8][4];
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
        TC::rows64(s, qf, Qs, warp * 16, Kc);
        TC::rows64(dp, gf, Gs, warp * 16, Vc);
        TC::template wait<1>(s);  // P while dP is still running

        const i64 j0 = t * AT_BN;
        if (a.mask == nullptr && j0 + AT_BN <= wvis) {
            // Every row of the warp sees all 64 keys: no mask.
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[nt][e] = ex2(fmaf(s[nt][e], sl2, -lse[e >> 1]));
        } else {
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const i64 j = j0 + nt * 8 + tq * 2 + c;
                    const bool km = j < a.lk && key_masked(a, bi, j);
#pragma unroll
                    for (int rr = 0; rr < 2; ++rr) {
                        float& x = s[nt][rr * 2 + c];
                        x = j <= lim[rr] && !km ? ex2(fmaf(x, sl2, -lse[rr])) : 0.f;
                    }
                }
        }
        TC::template wait<0>(dp);
        // dS / scale (the scale is applied to dq once, at the end).
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] *= dp[nt][e] - dd[e >> 1];
        TC::p_rows(acc, s, Kc);
        TC::template wait<0>(acc);
        __syncthreads();  // every warp is done with this buffer before it is refilled
    }
    scale_acc<D>(acc, scale);
    mma_store_rows<T, D>(dq + grad_row(bi, h, 0, a.gq, a.lq, D), acc, i0 + warp * 16, a.lq, (u64)a.gq * D);
}

// dk and dv, per 64 key rows of one (batch, kv head), for each query head of its group and each
// query tile that sees a key of the block: S^T = K Q^T, dP^T = V G^T, P^T from the query rows'
// statistics, dS^T = P^T (dP^T - D), dV += P^T G, dK += dS^T Q, then dK *= scale. Shared
// memory: K, V [64][D + 8] (T), Q and G [2][64][D + 8] (T, double-buffered by cp.async), then
// the query tiles' statistics [2][64] (float2: lse, D). Grid as attn_bdkv_body. Query tiles
// whose first query sees all 16 keys of a warp skip the masks there.
template <typename T, int D, typename TC>
__device__ void attn_mma_bdkv_body(const AttnDims& a, float sl2, float scale, const T* __restrict__ q,
                                   const T* __restrict__ k, const T* __restrict__ v, const T* __restrict__ g,
                                   const float* __restrict__ stats, T* __restrict__ dk, T* __restrict__ dvo) {
    constexpr int DT = D / 8, TL = TC::TILE;
    T* Ks = TC::smem();
    T* Vs = Ks + TL;
    T* Qs = Vs + TL;      // [2][TILE]
    T* Gs = Qs + 2 * TL;  // [2][TILE]
    float2* St = (float2*)(Gs + 2 * TL);  // [2][64] (lse, D)
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gr = lane >> 2, tq = lane & 3;
    const u32 nbkv = a.b * a.hkv, group = a.hq / a.hkv;
    const u32 bkv = blockIdx.x % nbkv, j0 = (blockIdx.x / nbkv) * AT_BN;
    const u32 bi = bkv / a.hkv, kvh = bkv % a.hkv;
    TC::load(Ks, k + bi * a.sk[0] + kvh * a.sk[1], a.sk[2], j0, a.lk);
    TC::load(Vs, v + bi * a.sv[0] + kvh * a.sv[1], a.sv[2], j0, a.lk);
    cp_async_commit();
    // First query that sees a key of this block (every query sees key 0).
    i64 first = 0;
    if (a.causal && j0 > 0) {
        const i64 f = (i64)j0 + a.lq - a.lk;
        first = f > 0 ? f : 0;
    }
    const u32 qt0 = (u32)(first / AT_BM), nqt = (a.lq + AT_BM - 1) / AT_BM - qt0;
    const u32 items = group * nqt;  // (query head of the group, query tile), in that order
    // Loads item `it`'s Q and G tiles (cp.async) and its statistics into buffer `buf`.
    auto load_item = [&](u32 it, int buf) {
        const u32 h = kvh * group + it / nqt, i0 = (qt0 + it % nqt) * AT_BM;
        TC::load(Qs + buf * TL, q + bi * a.sq[0] + h * a.sq[1], a.sq[2], i0, a.lq);
        TC::load(Gs + buf * TL, g + bi * a.sg[0] + h * a.sg[1], a.sg[2], i0, a.lq);
        const u64 row0 = ((u64)bi * a.hq + h) * a.lq;
        for (u32 r = threadIdx.x; r < 64; r += blockDim.x)
            St[buf * 64 + r] = i0 + r < a.lq ? ((const float2*)stats)[row0 + i0 + r] : make_float2(-neg_inf<float>(), 0.f);
    };
    if (items > 0) load_item(0, 0);
    cp_async_commit();

    const u32 key0 = j0 + warp * 16 + gr;  // this thread's keys: key0 and key0 + 8
    const i64 wlast = (i64)j0 + warp * 16 + 15;  // the warp's last key
    bool km[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) km[rr] = key0 + rr * 8 < a.lk && key_masked(a, bi, key0 + rr * 8);
    float ak[DT][4], av[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt)
#pragma unroll
        for (int e = 0; e < 4; ++e) ak[dt][e] = av[dt][e] = 0.f;

    cp_async_wait<1>();  // K and V have landed
    TC::landed();
    __syncthreads();
    typename TC::AFrag kf, vf;
    TC::frag(kf, Ks, warp * 16);
    TC::frag(vf, Vs, warp * 16);

    for (u32 it = 0; it < items; ++it) {
        const int buf = (int)(it & 1);
        const T* Qc = Qs + buf * TL;
        const T* Gc = Gs + buf * TL;
        const float2* Sc = St + buf * 64;
        if (it + 1 < items) load_item(it + 1, buf ^ 1);
        cp_async_commit();
        cp_async_wait<1>();  // item it has landed
        TC::landed();
        __syncthreads();
        const u32 i0 = (qt0 + it % nqt) * AT_BM;

        float s[8][4], dp[8][4];  // rows: this warp's 16 keys; columns: the tile's 64 queries
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
        TC::rows64(s, kf, Ks, warp * 16, Qc);
        TC::rows64(dp, vf, Vs, warp * 16, Gc);
        TC::template wait<1>(s);  // P^T while dP^T is still running
        // P^T and dS^T / scale (the scale is applied to dk once, at the end). Rows past lq
        // have lse = +inf: p = 0.
        if (a.mask == nullptr && wlast < a.lk && wlast < visible_keys(a, i0)) {
            // The tile's first (fewest-key) query sees all 16 keys of the warp: no mask.
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const float l = Sc[nt * 8 + tq * 2 + c].x;
#pragma unroll
                    for (int rr = 0; rr < 2; ++rr) s[nt][rr * 2 + c] = ex2(fmaf(s[nt][rr * 2 + c], sl2, -l));
                }
        } else {
#pragma unroll
            for (int nt = 0; nt < 8; ++nt)
#pragma unroll
                for (int c = 0; c < 2; ++c) {
                    const u32 r = nt * 8 + tq * 2 + c;
                    const u32 i = i0 + r;
                    const i64 lim = i < a.lq ? visible_keys(a, i) - 1 : -1;
                    const float l = Sc[r].x;
#pragma unroll
                    for (int rr = 0; rr < 2; ++rr) {
                        const i64 j = (i64)key0 + rr * 8;
                        float& x = s[nt][rr * 2 + c];
                        x = j <= lim && !km[rr] ? ex2(fmaf(x, sl2, -l)) : 0.f;
                    }
                }
        }
        TC::template wait<0>(dp);
#pragma unroll
        for (int nt = 0; nt < 8; ++nt)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
                const float d = Sc[nt * 8 + tq * 2 + c].y;
#pragma unroll
                for (int rr = 0; rr < 2; ++rr) dp[nt][rr * 2 + c] = s[nt][rr * 2 + c] * (dp[nt][rr * 2 + c] - d);
            }
        TC::p_rows(av, s, Gc);
        TC::p_rows(ak, dp, Qc);
        TC::template wait<0>(av);
        TC::held(ak);
        __syncthreads();  // every warp is done with this buffer before it is refilled
    }
    const u64 kr0 = grad_row(bi, kvh, 0, a.gk, a.lk, D), ld = (u64)a.gk * D;
    scale_acc<D>(ak, scale);
    mma_store_rows<T, D>(dk + kr0, ak, j0 + warp * 16, a.lk, ld);
    mma_store_rows<T, D>(dvo + kr0, av, j0 + warp * 16, a.lk, ld);
}

// The tensor-core backward's statistics from the forward's saved output and lse (instead of
// attn_mma_body<STATS>): per query row (b, h, i), stats = (lse log2(e), D = sum_c g[c] o[c]);
// o as the forward wrote it (storage [b, lq, hq, dv]), lse f32 [b, hq, lq] (+inf for a row
// with no key), g through its strides. Eight lanes a row, 16 bytes (8 elements) a load: the
// tensor-core path's rows are 16-byte aligned with dv a multiple of 8.
template <typename T>
__device__ void attn_delta_body(const AttnDims& a, const T* __restrict__ o, const float* __restrict__ lse,
                                const T* __restrict__ g, float2* __restrict__ stats) {
    const u32 sub = threadIdx.x & 7;
    const u64 row = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 3;
    const bool ok = row < (u64)a.b * a.hq * a.lq;
    float dsum = 0.f;
    if (ok) {
        const u32 i = (u32)(row % a.lq), h = (u32)((row / a.lq) % a.hq), bi = (u32)(row / ((u64)a.lq * a.hq));
        const T* orw = o + (((u64)bi * a.lq + i) * a.hq + h) * a.dv;
        const T* grw = g + bi * a.sg[0] + h * a.sg[1] + i * a.sg[2];
        for (u32 c = sub * 8; c < a.dv; c += 64) {
            const uint4 ov = *(const uint4*)(orw + c), gv = *(const uint4*)(grw + c);
            const T* op = (const T*)&ov;
            const T* gp = (const T*)&gv;
#pragma unroll
            for (int e = 0; e < 8; ++e) dsum += Num<T>::load(gp[e]) * Num<T>::load(op[e]);
        }
    }
    dsum += __shfl_xor_sync(0xffffffffu, dsum, 1);
    dsum += __shfl_xor_sync(0xffffffffu, dsum, 2);
    dsum += __shfl_xor_sync(0xffffffffu, dsum, 4);
    if (ok && sub == 0) {
        const float l = lse[row];
        // A row with no key: o is NaN, lse +inf; its D is never used with a nonzero p.
        stats[row] = make_float2(l * 1.44269504f, l == -neg_inf<float>() ? 0.f : dsum);
    }
}

// ---- entry points ----

#define ATTN_ROW_KERNELS(S, T)                                                                          \
    extern "C" __global__ void attn_rows_##S(AttnDims a, Num<T>::A scale, const T* q, const T* k,      \
                                             const T* v, const T* g, T* o, Num<T>::A* stats, u32 mode,  \
                                             float* lse) {                                              \
        attn_rows_body<T>(a, scale, q, k, v, g, o, stats, mode, lse);                                  \
    }                                                                                                   \
    extern "C" __global__ void attn_dq_##S(AttnDims a, Num<T>::A scale, const T* q, const T* k,        \
                                           const T* v, const T* g, const Num<T>::A* stats, T* dq) {    \
        attn_dq_body<T>(a, scale, q, k, v, g, stats, dq);                                              \
    }                                                                                                   \
    extern "C" __global__ void attn_dkv_##S(AttnDims a, Num<T>::A scale, const T* q, const T* k,       \
                                            const T* v, const T* g, const Num<T>::A* stats, T* dk,     \
                                            T* dv) {                                                    \
        attn_dkv_body<T>(a, scale, q, k, v, g, stats, dk, dv);                                         \
    }
FOR_FLOATS(ATTN_ROW_KERNELS)

#define ATTN_FWD_TILE(S, T, N)                                                                          \
    extern "C" __global__ void __launch_bounds__(256) attn_fwd##N##_##S(AttnDims a, u32 ld, float sl2,  \
        const T* q, const T* k, const T* v, T* o) {                                                     \
        attn_fwd_body<T, N, false>(a, ld, sl2, q, k, v, o, nullptr, nullptr);                           \
    }
#define ATTN_BWD_TILE(S, T, N)                                                                          \
    extern "C" __global__ void __launch_bounds__(256) attn_fwds##N##_##S(AttnDims a, u32 ld, float sl2, \
        const T* q, const T* k, const T* v, const T* g, float* stats) {                                 \
        attn_fwd_body<T, N, true>(a, ld, sl2, q, k, v, nullptr, g, stats);                              \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(256) attn_bdq##N##_##S(AttnDims a, u32 ldq, u32 ldv,   \
        float sl2, float scale, const T* q, const T* k, const T* v, const T* g, const float* stats,     \
        T* dq) { attn_bdq_body<T, N>(a, ldq, ldv, sl2, scale, q, k, v, g, stats, dq); }
#define ATTN_BDKV_TILE(S, T, N, M)                                                                      \
    extern "C" __global__ void __launch_bounds__(256) attn_bdkv##N##M##_##S(AttnDims a, u32 ldq,        \
        u32 ldv, float sl2, float scale, const T* q, const T* k, const T* v, const T* g,                \
        const float* stats, T* dk, T* dv) {                                                             \
        attn_bdkv_body<T, N, M>(a, ldq, ldv, sl2, scale, q, k, v, g, stats, dk, dv);                    \
    }
#define ATTN_TILE_KERNELS(S, T)                                                                         \
    ATTN_FWD_TILE(S, T, 1) ATTN_FWD_TILE(S, T, 2) ATTN_FWD_TILE(S, T, 4)                                \
    ATTN_BWD_TILE(S, T, 1) ATTN_BWD_TILE(S, T, 2)                                                       \
    ATTN_BDKV_TILE(S, T, 1, 1) ATTN_BDKV_TILE(S, T, 1, 2) ATTN_BDKV_TILE(S, T, 2, 1)                    \
    ATTN_BDKV_TILE(S, T, 2, 2)
ATTN_TILE_KERNELS(f32, float)
ATTN_TILE_KERNELS(f16, f16)
ATTN_TILE_KERNELS(bf16, bf16)

// Minimum blocks a multiprocessor (__launch_bounds__): 64-wide heads fit four forward blocks
// (128 registers) and three backward blocks (168); wider heads keep the compiler's choice.
#define ATTN_MMA_FWD(S, T, D, MB)                                                                       \
    extern "C" __global__ void __launch_bounds__(128, MB) attn_mma##D##_##S(AttnDims a, float sl2,      \
        const T* q, const T* k, const T* v, T* o, float* lse) {                                         \
        attn_mma_body<T, D, false, SyncTC<T, D, (D <= 128)>>(a, sl2, q, k, v, o, nullptr, lse);                                   \
    }
#define ATTN_MMA_BWD(S, T, D, MBS, MB)                                                                  \
    extern "C" __global__ void __launch_bounds__(128, MBS) attn_mmas##D##_##S(AttnDims a, float sl2,    \
        const T* q, const T* k, const T* v, const T* g, float* stats) {                                 \
        attn_mma_body<T, D, true, SyncTC<T, D, (D <= 128)>>(a, sl2, q, k, v, nullptr, g, stats);                                  \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(128, MB) attn_mmadq##D##_##S(AttnDims a, float sl2,    \
        float scale, const T* q, const T* k, const T* v, const T* g, const float* stats, T* dq) {       \
        attn_mma_bdq_body<T, D, SyncTC<T, D, (D <= 64)>>(a, sl2, scale, q, k, v, g, stats, dq);                                  \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(128, MB) attn_mmadkv##D##_##S(AttnDims a, float sl2,   \
        float scale, const T* q, const T* k, const T* v, const T* g, const float* stats, T* dk,         \
        T* dv) { attn_mma_bdkv_body<T, D, SyncTC<T, D, (D <= 64)>>(a, sl2, scale, q, k, v, g, stats, dk, dv); }
#define ATTN_MMA_KERNELS(S, T)                                                                          \
    ATTN_MMA_FWD(S, T, 64, 4) ATTN_MMA_FWD(S, T, 96, 1) ATTN_MMA_FWD(S, T, 128, 1)                     \
    ATTN_MMA_FWD(S, T, 256, 1) ATTN_MMA_BWD(S, T, 64, 4, 3) ATTN_MMA_BWD(S, T, 96, 1, 1)               \
    ATTN_MMA_BWD(S, T, 128, 1, 1)                                                                       \
    extern "C" __global__ void attn_delta_##S(AttnDims a, const T* o, const float* lse, const T* g,     \
                                              float2* stats) {                                          \
        attn_delta_body<T>(a, o, lse, g, stats);                                                        \
    }
ATTN_MMA_KERNELS(f16, f16)
ATTN_MMA_KERNELS(bf16, bf16)

// wgmma kernels for 64-wide heads (sm_90a builds only): the same bodies on WgTC, with the
// mma.sync kernels' block counts.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATTN_WG_KERNELS(S, T)                                                                           \
    extern "C" __global__ void __launch_bounds__(128, 4) attn_wg64_##S(AttnDims a, float sl2, const T* q, \
        const T* k, const T* v, T* o, float* lse) {                                                     \
        attn_mma_body<T, 64, false, WgTC<T>>(a, sl2, q, k, v, o, nullptr, lse);                         \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(128, 4) attn_wgs64_##S(AttnDims a, float sl2,          \
        const T* q, const T* k, const T* v, const T* g, float* stats) {                                 \
        attn_mma_body<T, 64, true, WgTC<T>>(a, sl2, q, k, v, nullptr, g, stats);                        \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(128, 3) attn_wgdq64_##S(AttnDims a, float sl2,         \
        float scale, const T* q, const T* k, const T* v, const T* g, const float* stats, T* dq) {       \
        attn_mma_bdq_body<T, 64, WgTC<T>>(a, sl2, scale, q, k, v, g, stats, dq);                        \
    }                                                                                                   \
    extern "C" __global__ void __launch_bounds__(128, 3) attn_wgdkv64_##S(AttnDims a, float sl2,        \
        float scale, const T* q, const T* k, const T* v, const T* g, const float* stats, T* dk,         \
        T* dv) { attn_mma_bdkv_body<T, 64, WgTC<T>>(a, sl2, scale, q, k, v, g, stats, dk, dv); }
ATTN_WG_KERNELS(f16, f16)
ATTN_WG_KERNELS(bf16, bf16)
#endif
