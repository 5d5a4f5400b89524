// Fused row ops over the last axis (the reference is ferrite-cpu norm.rs): softmax and
// log_softmax, layer_norm, rms_norm, their backward kernels, and RoPE.
//
// Row layout: `rows` rows of `n` elements; input row r starts at x + r * xs (elements) and has
// unit inner stride; outputs are contiguous (row r at y + r * n). weight / bias are contiguous
// [n]. `vec` (checked by the host): every row start and vector is 16-byte aligned and
// n * sizeof(T) % 16 == 0, so a chunk moves as one 16-byte load or store.
//
// A row is cut into chunks of V = 16 / sizeof(T) elements; chunk c belongs to thread c % P of
// the P threads that own the row. Three launch shapes per op (the host picks by row length):
//   _w  a warp, or a power-of-two group of G of its lanes, per row (`warp_group`); blockDim
//       256; chunks cached in registers, at most E_WARP per lane (n <= G * E_WARP * V)
//   _b  one block of P threads per row (P a multiple of 32, <= 512; registers capped so two
//       such blocks fit an SM); chunks cached in registers, at most E per thread
//       (n <= P * E * V)
//   _l  one block of P threads per row (P a multiple of 32, <= 1024), any n: each pass
//       re-reads the row from memory
// All three walk the rows grid-stride. The f32 layer norm and its backward of rows of 129 to
// 1024 elements have their own warp-per-row kernels (`_r{E}`: `ln_rows_body`,
// `ln_bwd_rows_body`). f16/bf16 compute in f32; f32 in f32; f64 in f64.
// Register budget (mirrored in norm.rs): E_WARP chunks per lane in _w; in _b, E_FWD chunks for
// one-input ops and E_BWD chunks per input for two-input ops.
#define E_WARP 4
#define E_FWD 8
#define E_BWD 4

// ---- 16-byte chunks ----

struct __align__(16) W4 { u32 w[4]; };

// Element i of a chunk, as its compute type, and back; pack: a whole chunk from V values.
template <typename T> struct Pk;
template <> struct Pk<float> {
    static constexpr int V = 4;
    static __device__ __forceinline__ float get(const W4& r, int i) { return __uint_as_float(r.w[i]); }
    static __device__ __forceinline__ void put(W4& r, int i, float x) { r.w[i] = __float_as_uint(x); }
    static __device__ __forceinline__ W4 pack(const float (&o)[4]) {
        W4 r;
#pragma unroll
        for (int i = 0; i < 4; ++i) r.w[i] = __float_as_uint(o[i]);
        return r;
    }
};
template <> struct Pk<double> {
    static constexpr int V = 2;
    static __device__ __forceinline__ double get(const W4& r, int i) {
        return __longlong_as_double((i64)(((u64)r.w[2 * i + 1] << 32) | (u64)r.w[2 * i]));
    }
    static __device__ __forceinline__ void put(W4& r, int i, double x) {
        u64 b = (u64)__double_as_longlong(x);
        r.w[2 * i] = (u32)b;
        r.w[2 * i + 1] = (u32)(b >> 32);
    }
    static __device__ __forceinline__ W4 pack(const double (&o)[2]) {
        W4 r;
        put(r, 0, o[0]);
        put(r, 1, o[1]);
        return r;
    }
};
__device__ __forceinline__ u32 half_bits(const W4& r, int i) { return (r.w[i >> 1] >> ((i & 1) * 16)) & 0xffffu; }
__device__ __forceinline__ void set_half_bits(W4& r, int i, u32 h) {
    const u32 s = (i & 1) * 16;
    r.w[i >> 1] = (r.w[i >> 1] & ~(0xffffu << s)) | (h << s);
}
template <> struct Pk<f16> {
    static constexpr int V = 8;
    static __device__ __forceinline__ float get(const W4& r, int i) {
        f16 h;
        h.x = (unsigned short)half_bits(r, i);
        return f16_to_f32(h);
    }
    static __device__ __forceinline__ void put(W4& r, int i, float x) { set_half_bits(r, i, f32_to_f16(x).x); }
    static __device__ __forceinline__ W4 pack(const float (&o)[8]) {
        W4 r;
#pragma unroll
        for (int i = 0; i < 4; ++i) asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r.w[i]) : "f"(o[2 * i + 1]), "f"(o[2 * i]));
        return r;
    }
};
template <> struct Pk<bf16> {
    static constexpr int V = 8;
    static __device__ __forceinline__ float get(const W4& r, int i) { return __uint_as_float(half_bits(r, i) << 16); }
    static __device__ __forceinline__ void put(W4& r, int i, float x) { set_half_bits(r, i, f32_to_bf16(x).x); }
    static __device__ __forceinline__ W4 pack(const float (&o)[8]) {
        W4 r;
#pragma unroll
        for (int i = 0; i < 4; ++i) asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r.w[i]) : "f"(o[2 * i + 1]), "f"(o[2 * i]));
        return r;
    }
};

__device__ __forceinline__ W4 w4_zero() {
    W4 r;
    r.w[0] = r.w[1] = r.w[2] = r.w[3] = 0;
    return r;
}

// Chunk c of a row of n elements (elements past n read as 0).
template <typename T>
__device__ __forceinline__ W4 load_chunk(const T* __restrict__ row, u32 c, u32 n, bool vec) {
    constexpr int V = Pk<T>::V;
    if (vec) return *(const W4*)(row + (u64)c * V);
    W4 r = w4_zero();
#pragma unroll
    for (int v = 0; v < V; ++v) {
        const u32 i = c * V + v;
        if (i < n) Pk<T>::put(r, v, Num<T>::load(row[i]));
    }
    return r;
}

// Writes values o of chunk c (those that lie in the row).
template <typename T>
__device__ __forceinline__ void store_vals(T* __restrict__ row, u32 c, u32 n, bool vec,
                                           const typename Num<T>::A (&o)[Pk<T>::V]) {
    constexpr int V = Pk<T>::V;
    if (vec) {
        *(W4*)(row + (u64)c * V) = Pk<T>::pack(o);
        return;
    }
#pragma unroll
    for (int v = 0; v < V; ++v) {
        const u32 i = c * V + v;
        if (i < n) row[i] = Num<T>::store(o[v]);
    }
}

// ---- the threads of one row ----

// Threads per row in warp mode: a power of two <= 32 giving each about two chunks (several
// short rows share a warp). The host mirrors this rule (norm.rs, `warp_group`).
__device__ __forceinline__ u32 warp_group(u32 nc) {
    u32 g = 1;
    while (g < 32 && 2 * g < nc) g <<= 1;
    return g;
}

// This thread's place: t of the P threads of its row; rows are walked by a loop uniform
// over the warp (block) from `first` by `step`, this thread's row being base + sub. In warp
// mode lanes of a row are G consecutive lanes; in block mode G is 32 (whole warps).
struct Grp {
    u32 t, P, G, sub;
    u64 first, step;
};
template <bool BLOCK>
__device__ __forceinline__ Grp grp_make(u32 nc) {
    Grp g;
    if constexpr (BLOCK) {
        g.t = threadIdx.x;
        g.P = blockDim.x;
        g.G = 32;
        g.sub = 0;
        g.first = blockIdx.x;
        g.step = gridDim.x;
    } else {
        const u32 G = warp_group(nc), lane = threadIdx.x & 31, rpw = 32 / G;
        g.t = lane % G;
        g.P = G;
        g.G = G;
        g.sub = lane / G;
        g.first = ((u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * rpw;
        g.step = (u64)gridDim.x * (blockDim.x >> 5) * rpw;
    }
    return g;
}

template <typename A> __device__ __forceinline__ A sub_sum(A v, u32 G) {
    for (u32 o = G >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename A> __device__ __forceinline__ A max_nan(A a, A b) { return (b > a || m_isnan(b)) ? b : a; }
template <typename A> __device__ __forceinline__ A sub_max(A v, u32 G) {
    for (u32 o = G >> 1; o > 0; o >>= 1) v = max_nan(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Calls f(k, c) for each chunk c of this thread (k: its slot in the register cache).
template <int E, bool CACHED, typename F>
__device__ __forceinline__ void each_chunk(u32 t, u32 P, u32 nc, F&& f) {
    if constexpr (CACHED) {
#pragma unroll
        for (int k = 0; k < E; ++k) {
            const u32 c = k * P + t;
            if (c < nc) f(k, c);
        }
    } else {
        for (u32 c = t; c < nc; c += P) f(0, c);
    }
}

// f32 rows with a 16-bit partner (a layer norm's bf16 output, or its gradient): chunk c of
// the partner covers the same 4 elements as the f32 chunk, 8 bytes (`vec`: 8-byte aligned).
// Loads widen it into an f32 chunk; stores round 4 f32 values into it.
template <typename G>
__device__ __forceinline__ W4 load_chunk_narrow(const G* __restrict__ row, u32 c, u32 n, bool vec) {
    W4 r = w4_zero();
    if (vec) {
        const uint2 u = *(const uint2*)(row + (u64)c * 4);
#pragma unroll
        for (int v = 0; v < 4; ++v) {
            G h;
            h.x = (unsigned short)(((v < 2 ? u.x : u.y) >> ((v & 1) * 16)) & 0xffffu);
            r.w[v] = __float_as_uint(Num<G>::load(h));
        }
        return r;
    }
#pragma unroll
    for (int v = 0; v < 4; ++v) {
        const u32 i = c * 4 + v;
        if (i < n) r.w[v] = __float_as_uint(Num<G>::load(row[i]));
    }
    return r;
}

template <typename G>
__device__ __forceinline__ void store_narrow(G* __restrict__ row, u32 c, u32 n, bool vec, const float (&o)[4]) {
    if (vec) {
        uint2 u;
        u.x = (u32)Num<G>::store(o[0]).x | ((u32)Num<G>::store(o[1]).x << 16);
        u.y = (u32)Num<G>::store(o[2]).x | ((u32)Num<G>::store(o[3]).x << 16);
        *(uint2*)(row + (u64)c * 4) = u;
        return;
    }
#pragma unroll
    for (int v = 0; v < 4; ++v) {
        const u32 i = c * 4 + v;
        if (i < n) row[i] = Num<G>::store(o[v]);
    }
}

// Chunk c of a row of G as T's chunk (G == T, or a 16-bit G of f32 T).
template <typename T, typename G>
__device__ __forceinline__ W4 load_as(const G* __restrict__ row, u32 c, u32 n, bool vec) {
    if constexpr (sizeof(G) == sizeof(T)) return load_chunk(row, c, n, vec);
    else return load_chunk_narrow(row, c, n, vec);
}

// Values o of T's chunk c written to a row of Y (Y == T, or a 16-bit Y of f32 T).
template <typename T, typename Y>
__device__ __forceinline__ void store_as(Y* __restrict__ row, u32 c, u32 n, bool vec,
                                         const typename Num<T>::A (&o)[Pk<T>::V]) {
    if constexpr (sizeof(Y) == sizeof(T)) store_vals(row, c, n, vec, o);
    else store_narrow(row, c, n, vec, o);
}

// o (T's chunk of a dx row) plus the same chunk ac of acc's row, o first rounded to T: what
// storing dx and adding acc to it in a separate op would give.
template <typename T>
__device__ __forceinline__ void add_acc(typename Num<T>::A (&o)[Pk<T>::V], const W4& ac) {
    typedef typename Num<T>::A A;
#pragma unroll
    for (int v = 0; v < Pk<T>::V; ++v) o[v] = (A)Num<T>::load(Num<T>::store(o[v])) + Pk<T>::get(ac, v);
}

// Column sums of a norm's weight gradient (dw += g xhat) and, for a layer norm, of its
// bias gradient (db += g) over one thread's rows, in the warp-shaped row kernels (a thread
// keeps the same E chunks of columns for all its rows). The host passes `part` to those only.
template <typename A, int E, int V>
struct ColSums {
    A w[E][V], b[E][V];
    __device__ __forceinline__ void zero() {
#pragma unroll
        for (int k = 0; k < E; ++k)
#pragma unroll
            for (int v = 0; v < V; ++v) w[k][v] = b[k][v] = (A)0;
    }
    __device__ __forceinline__ void add(int k, int v, A gv, A xhat) {
        w[k][v] += gv * xhat;
        b[k][v] += gv;
    }
    // The block's sums into part[(blockIdx.x * K + j) * n + col] (j 0: dw, 1: db with K = 2),
    // for the warp-shaped kernels: the block's row groups meet in dynamic shared memory
    // ([groups][K][n] values) and are added in group order. All threads of the block call it.
    __device__ void store(u32 K, u32 n, u32 nc, const Grp& gp, A* __restrict__ part) const {
        extern __shared__ __align__(16) unsigned char col_sums_sh[];
        A* sh = (A*)col_sums_sh;
        const u32 groups = blockDim.x / gp.G;
        A* mine = sh + (u64)(threadIdx.x / gp.G) * K * n;
        each_chunk<E, true>(gp.t, gp.P, nc, [&](int k, u32 ci) {
#pragma unroll
            for (int v = 0; v < V; ++v) {
                const u32 col = ci * V + v;
                if (col < n) {
                    mine[col] = w[k][v];
                    if (K > 1) mine[n + col] = b[k][v];
                }
            }
        });
        __syncthreads();
        A* out = part + (u64)blockIdx.x * K * n;
        for (u32 c = threadIdx.x; c < K * n; c += blockDim.x) {
            A a = 0;
            for (u32 q = 0; q < groups; ++q) a += sh[(u64)q * K * n + c];
            out[c] = a;
        }
    }
};

// One input row (elements of G, read as T's chunks): its chunks held in registers (CACHED)
// or re-read at each use.
template <typename T, int E, bool CACHED, typename G = T>
struct RowIn {
    const G* p;
    u32 n;
    bool vec;
    W4 c[CACHED ? E : 1];
    __device__ __forceinline__ void init(const G* row, u32 n_, bool vec_, u32 t, u32 P, u32 nc) {
        p = row;
        n = n_;
        vec = vec_;
        if constexpr (CACHED) {
            each_chunk<E, true>(t, P, nc, [&](int k, u32 ci) { c[k] = load_as<T>(p, ci, n, vec); });
        }
    }
    __device__ __forceinline__ W4 at(int k, u32 ci) const {
        if constexpr (CACHED) return c[k];
        else return load_as<T>(p, ci, n, vec);
    }
};

// Sums K values over the row's threads; every thread gets the totals. In block mode all
// threads of the block must call it (it synchronizes).
template <bool BLOCK, int K, typename A>
__device__ __forceinline__ void grp_sum(A (&v)[K], u32 G) {
#pragma unroll
    for (int k = 0; k < K; ++k) v[k] = sub_sum(v[k], G);
    if constexpr (BLOCK) {
        __shared__ A sh[K][32];
        const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
        __syncthreads();  // the previous use of sh is over
        if (lane == 0) {
#pragma unroll
            for (int k = 0; k < K; ++k) sh[k][w] = v[k];
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < K; ++k) v[k] = warp_sum(lane < nw ? sh[k][lane] : (A)0);
    }
}

template <typename A> __device__ __forceinline__ A pos_inf() { return -neg_inf<A>(); }
template <typename A> __device__ __forceinline__ bool finite(A x) { return m_fabs(x) < pos_inf<A>(); }
// exp for the row kernels: one ex2 (relative error ~1e-6 in f32; results below 2^-126 flush
// to 0); f64 exact.
__device__ __forceinline__ float fexp(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
}
__device__ __forceinline__ double fexp(double x) { return exp(x); }

// The shift softmax subtracts: the row max, or 0 when that is infinite (the CPU's rule).
template <typename A> __device__ __forceinline__ A max_shift(A m) { return finite(m) || m_isnan(m) ? m : (A)0; }

// Max over the row's threads (NaN wins); every thread gets it. Block mode as grp_sum.
template <bool BLOCK, typename A>
__device__ __forceinline__ void grp_max(A& v, u32 G) {
    v = sub_max(v, G);
    if constexpr (BLOCK) {
        __shared__ A sh[32];
        const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
        __syncthreads();
        if (lane == 0) sh[w] = v;
        __syncthreads();
        v = warp_max(lane < nw ? sh[lane] : neg_inf<A>());
    }
}

// Softmax partial state: max m and sum s of exp(x - m). Infinite or NaN maxima carry the sum
// the CPU's formula gives (0 for -inf, +inf for +inf, NaN for NaN).
template <typename A>
__device__ __forceinline__ void ms_merge(A& m, A& s, A m2, A s2) {
    const A mm = max_nan(m, m2);
    if (finite(mm)) s = s * fexp(m - mm) + s2 * fexp(m2 - mm);
    else s = (mm == neg_inf<A>()) ? (A)0 : mm;
    m = mm;
}

template <bool BLOCK, typename A>
__device__ __forceinline__ void grp_ms(A& m, A& s, u32 G) {
    for (u32 o = G >> 1; o > 0; o >>= 1) {
        const A m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        ms_merge(m, s, m2, s2);
    }
    if constexpr (BLOCK) {
        __shared__ A shm[32], shs[32];
        const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
        __syncthreads();
        if (lane == 0) {
            shm[w] = m;
            shs[w] = s;
        }
        __syncthreads();
        m = lane < nw ? shm[lane] : neg_inf<A>();
        s = lane < nw ? shs[lane] : (A)0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const A m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
            ms_merge(m, s, m2, s2);
        }
    }
}

// Common start of a row kernel body; then `for (ROWS) { ... }` walks this thread's rows: r
// (clamped to the last row for threads of a warp with no row left: they compute on it but
// store nothing, !live) so that every lane takes part in the shuffles.
#define ROW_SETUP                                                   \
    typedef typename Num<T>::A A;                                   \
    constexpr int V = Pk<T>::V;                                     \
    const u32 nc = (n + V - 1) / V;                                 \
    const Grp gp = grp_make<BLOCK>(nc);                             \
    const u32 t = gp.t, P = gp.P, G = gp.G;                         \
    const bool vec = vec_ != 0;
#define ROWS u64 rb = gp.first; rb < rows; rb += gp.step
#define ROW_AT                                                      \
    const bool live = rb + gp.sub < rows;                           \
    const u64 r = live ? rb + gp.sub : rows - 1;

// ---- forward ----

// y = softmax(x) (or log_softmax with logm) over each row, shifted by the row max (by 0 when
// the max is infinite, as the CPU does). A cached row takes the CPU's two steps (max, then
// the shifted sum); a re-read row merges per-chunk (max, sum) pairs in one pass.
template <typename T, bool BLOCK, int E, bool CACHED>
__device__ void softmax_body(u64 rows, u32 n, const T* x, u64 xs, T* y, u32 vec_, u32 logm) {
    ROW_SETUP
    for (ROWS) {
        ROW_AT
        RowIn<T, E, CACHED> xr;
        xr.init(x + r * xs, n, vec, t, P, nc);
        A m = neg_inf<A>(), s = 0;
        if constexpr (CACHED) {
            each_chunk<E, true>(t, P, nc, [&](int k, u32 ci) {
                const W4 c = xr.at(k, ci);
#pragma unroll
                for (int v = 0; v < V; ++v)
                    if (ci * V + v < n) m = max_nan(m, Pk<T>::get(c, v));
            });
            grp_max<BLOCK>(m, G);
            const A sh = max_shift(m);
            A sm[1] = {0};
            each_chunk<E, true>(t, P, nc, [&](int k, u32 ci) {
                const W4 c = xr.at(k, ci);
#pragma unroll
                for (int v = 0; v < V; ++v)
                    if (ci * V + v < n) sm[0] += fexp(Pk<T>::get(c, v) - sh);
            });
            grp_sum<BLOCK>(sm, G);
            s = sm[0];
        } else {
            each_chunk<E, false>(t, P, nc, [&](int k, u32 ci) {
                const W4 c = xr.at(k, ci);
                A cm = neg_inf<A>(), cs = 0;
#pragma unroll
                for (int v = 0; v < V; ++v)
                    if (ci * V + v < n) cm = max_nan(cm, Pk<T>::get(c, v));
                if (finite(cm)) {
#pragma unroll
                    for (int v = 0; v < V; ++v)
                        if (ci * V + v < n) cs += fexp(Pk<T>::get(c, v) - cm);
                } else {
                    cs = (cm == neg_inf<A>()) ? (A)0 : cm;
                }
                ms_merge(m, s, cm, cs);
            });
            grp_ms<BLOCK>(m, s, G);
        }
        const A sh = max_shift(m);
        const A ls = m_log(s), inv = (A)1 / s;
        T* yr = y + r * n;
        each_chunk<E, CACHED>(t, P, nc, [&](int k, u32 ci) {
            const W4 c = xr.at(k, ci);
            A o[V];
#pragma unroll
            for (int v = 0; v < V; ++v) {
                const A a = Pk<T>::get(c, v);
                o[v] = logm ? a - sh - ls : fexp(a - sh) * inv;
            }
            if (live) store_vals(yr, ci, n, vec, o);
        });
    }
}

// y = x / sqrt(mean(x^2) + eps) * w.
template <typename T, bool BLOCK, int E, bool CACHED>
__device__ void rms_body(u64 rows, u32 n, const T* x, u64 xs, const T* w, T* y, u32 vec_, typename Num<T>::A eps) {
    ROW_SETUP
    for (ROWS) {
        ROW_AT
        RowIn<T, E, CACHED> xr;
        xr.init(x + r * xs, n, vec, t, P, nc);
        A ss[1] = {0};
        each_chunk<E, CACHED>(t, P, nc, [&](int k, u32 ci) {
            const W4 c = xr.at(k, ci);
#pragma unroll
            for (int v = 0; v < V; ++v) {
                const A a = Pk<T>::get(c, v);
                ss[0] += a * a;
            }
        });
        grp_sum<BLOCK>(ss, G);
        const A rr = (A)1 / m_sqrt(ss[0] / (A)n + eps);
        T* yr = y + r * n;
        each_chunk<E, CACHED>(t, P, nc, [&](int k, u32 ci) {
            const W4 c = xr.at(k, ci), wc = load_chunk(w, ci, n, vec);
            A o[V];
#pragma unroll
            for (int v = 0; v < V; ++v) o[v] = Pk<T>::get(c, v) * rr * Pk<T>::get(wc, v);
            if (live) store_vals(yr, ci, n, vec, o);
        });
    }
}

// y = (x - mean) / sqrt(var + eps) * w + b, variance by two passes over the row.
template <typename T, typename Y, bool BLOCK, int E, bool CACHED>
__device__ void ln_body_y(u64 rows, u32 n, const T* x, u64 xs, const T* w, const T* b, Y* y, u32 vec_, typename Num<T>::A eps) {
    ROW_SETUP
    for (ROWS) {
        ROW_AT
        RowIn<T, E, CACHED> xr;
        xr.init(x + r * xs, n, vec, t, P, nc);
        A s1[1] = {0};
        each_chunk<E, CACHED>(t, P, nc, [&](int k, u32 ci) {
            const W4 c = xr.at(k, ci);
#pragma unroll
            for (int v = 0; v < V; ++v) s1[0] += Pk<T>::get(c, v);
        });
        grp_sum<BLOCK>(s1, G);
        const A mean = s1[0] / (A)n;
        A s2[1] = {0};
        each_chunk<E, CACHED>(t, P, nc, [&](int k, u32 ci) {
            const W4 c = xr.at(k, ci);
#pragma unroll
            for (int v = 0; v < V; ++v) {
                if (ci * V + v < n) {
                    const A d = Pk<T>::get(c, v) - mean;
                    s2[0] += d * d;
                }
            }
        });
        grp_sum<BLOCK>(s2, G);
        const A rr = (A)1 / m_sqrt(s2[0] / (A)n + eps);
        Y* yr = y + r * n;
        each_chunk<E, CACHED>(t, P, nc, [&](int k, u32 ci) {
            const W4 c = xr.at(k, ci), wc = load_chunk(w, ci, n, vec), bc = load_chunk(b, ci, n, vec);
            A o[V];
#pragma unroll
            for (int v = 0; v < V; ++v)
                o[v] = (Pk<T>::get(c, v) - mean) * rr * Pk<T>::get(wc, v) + Pk<T>::get(bc, v);
            if (live) store_as<T>(yr, ci, n, vec, o);
        });
    }
}

template <typename T, bool BLOCK, int E, bool CACHED>
__device__ void ln_body(u64 rows, u32 n, const T* x, u64 xs, const T* w, const T* b, T* y, u32 vec_, typename Num<T>::A eps) {
    ln_body_y<T, T, BLOCK, E, CACHED>(rows, n, x, xs, w, b, y, vec_, eps);
}
// f32 x, bf16 / f16 y.
template <typename T, bool BLOCK, int E, bool CACHED>
__device__ void ln_body_obf16(u64 rows, u32 n, const T* x, u64 xs, const T* w, const T* b, bf16* y, u32 vec_, typename Num<T>::A eps) {
    ln_body_y<T, bf16, BLOCK, E, CACHED>(rows, n, x, xs, w, b, y, vec_, eps);
}
template <typename T, bool BLOCK, int E, bool CACHED>
__device__ void ln_body_of16(u64 rows, u32 n, const T* x, u64 xs, const T* w, const T* b, f16* y, u32 vec_, typename Num<T>::A eps) {
    ln_body_y<T, f16, BLOCK, E, CACHED>(rows, n, x, xs, w, b, y, vec_, eps);
}

// ---- backward ----

// dx from y = softmax(x) and g = dL/dy: y (g - sum(g y)); with logm (y = log_softmax(x)):
// g - exp(y) sum(g).
template <typename T, bool BLOCK, int E, bool CACHED>
__device__ void softmax_bwd_body(u64 rows, u32 n, const T* y, u64 ys, const T* g, u64 gs, T* dx, u32 vec_, u32 logm) {
    ROW_SETUP
    for (ROWS) {
        ROW_AT
        RowIn<T, E, CACHED> yr, gr;
        yr.init(y + r * ys, n, vec, t, P, nc);
        gr.init(g + r * gs, n, vec, t, P, nc);
        A s[1] = {0};
        each_chunk<E, CACHED>(t, P, nc, [&](int k, u32 ci) {
            const W4 yc = yr.at(k, ci), gc = gr.at(k, ci);
#pragma unroll
            for (int v = 0; v < V; ++v) s[0] += logm ? Pk<T>::get(gc, v) : Pk<T>::get(gc, v) * Pk<T>::get(yc, v);
        });
        grp_sum<BLOCK>(s, G);
        T* dr = dx + r * n;
        each_chunk<E, CACHED>(t, P, nc, [&](int k, u32 ci) {
            const W4 yc = yr.at(k, ci), gc = gr.at(k, ci);
            A o[V];
#pragma unroll
            for (int v = 0; v < V; ++v) {
                const A yv = Pk<T>::get(yc, v), gv = Pk<T>::get(gc, v);
                o[v] = logm ? gv - fexp(yv) * s[0] : yv * (gv - s[0]);
            }
            if (live) store_vals(dr, ci, n, vec, o);
        });
    }
}

// dx of rms_norm: xhat = x r, r = 1 / sqrt(mean(x^2) + eps); dx = (g w - xhat mean(g w xhat)) r.
// Writes stats[2 row] = 0, stats[2 row + 1] = r for the weight-gradient kernels, or with
// `part` (warp shape) its block's weight sums there (`ColSums`). dx += acc where acc is given.
template <typename T, bool BLOCK, int E, bool CACHED>
__device__ void rms_bwd_body(u64 rows, u32 n, const T* x, u64 xs, const T* w, const T* g, u64 gs, T* dx,
                             const T* acc, u64 as_, typename Num<T>::A* stats, typename Num<T>::A* part, u32 vec_,
                             typename Num<T>::A eps) {
    ROW_SETUP
    constexpr bool SUMS = CACHED && !BLOCK;  // `part` is null otherwise
    ColSums<A, SUMS ? E : 1, V> cs;
    cs.zero();
    for (ROWS) {
        ROW_AT
        RowIn<T, E, CACHED> xr, gr, ar;
        xr.init(x + r * xs, n, vec, t, P, nc);
        gr.init(g + r * gs, n, vec, t, P, nc);
        if (acc != nullptr) ar.init(acc + r * as_, n, vec, t, P, nc);
        A s[2] = {0, 0};  // sum x^2, sum g w x
        each_chunk<E, CACHED>(t, P, nc, [&](int k, u32 ci) {
            const W4 xc = xr.at(k, ci), gc = gr.at(k, ci), wc = load_chunk(w, ci, n, vec);
#pragma unroll
            for (int v = 0; v < V; ++v) {
                const A xv = Pk<T>::get(xc, v);
                s[0] += xv * xv;
                s[1] += Pk<T>::get(gc, v) * Pk<T>::get(wc, v) * xv;
            }
        });
        grp_sum<BLOCK>(s, G);
        const A rr = (A)1 / m_sqrt(s[0] / (A)n + eps);
        const A dot = s[1] * rr / (A)n;
        if (t == 0 && live && part == nullptr) {
            stats[2 * r] = 0;
            stats[2 * r + 1] = rr;
        }
        T* dr = dx + r * n;
        each_chunk<E, CACHED>(t, P, nc, [&](int k, u32 ci) {
            const W4 xc = xr.at(k, ci), gc = gr.at(k, ci), wc = load_chunk(w, ci, n, vec);
            A o[V];
#pragma unroll
            for (int v = 0; v < V; ++v) {
                const A xhat = Pk<T>::get(xc, v) * rr;
                o[v] = (Pk<T>::get(gc, v) * Pk<T>::get(wc, v) - xhat * dot) * rr;
                if constexpr (SUMS) {
                    if (part != nullptr && live) cs.add(k, v, Pk<T>::get(gc, v), xhat);
                }
            }
            if (acc != nullptr) add_acc<T>(o, ar.at(k, ci));
            if (live) store_vals(dr, ci, n, vec, o);
        });
    }
    if constexpr (SUMS) {
        if (part != nullptr) cs.store(1, n, nc, gp, part);
    }
}

// dx of layer_norm: xhat = (x - mean) r; dx = r (g w - mean(g w) - xhat mean(g w xhat)).
// Writes stats[2 row] = mean, stats[2 row + 1] = r, or with `part` (warp shape) its block's
// weight and bias sums there (`ColSums`). dx += acc where acc is given.
template <typename T, typename GT, bool BLOCK, int E, bool CACHED>
__device__ void ln_bwd_body_g(u64 rows, u32 n, const T* x, u64 xs, const T* w, const GT* g, u64 gs, T* dx,
                              const T* acc, u64 as_, typename Num<T>::A* stats, typename Num<T>::A* part,
                              u32 vec_, typename Num<T>::A eps) {
    ROW_SETUP
    constexpr bool SUMS = CACHED && !BLOCK;  // `part` is null otherwise
    ColSums<A, SUMS ? E : 1, V> cs;
    cs.zero();
    for (ROWS) {
        ROW_AT
        RowIn<T, E, CACHED> xr, ar;
        RowIn<T, E, CACHED, GT> gr;
        xr.init(x + r * xs, n, vec, t, P, nc);
        gr.init(g + r * gs, n, vec, t, P, nc);
        if (acc != nullptr) ar.init(acc + r * as_, n, vec, t, P, nc);
        A s1[1] = {0};
        each_chunk<E, CACHED>(t, P, nc, [&](int k, u32 ci) {
            const W4 xc = xr.at(k, ci);
#pragma unroll
            for (int v = 0; v < V; ++v) s1[0] += Pk<T>::get(xc, v);
        });
        grp_sum<BLOCK>(s1, G);
        const A mean = s1[0] / (A)n;
        A s[3] = {0, 0, 0};  // sum (x - mean)^2, sum g w, sum g w (x - mean)
        each_chunk<E, CACHED>(t, P, nc, [&](int k, u32 ci) {
            const W4 xc = xr.at(k, ci), gc = gr.at(k, ci), wc = load_chunk(w, ci, n, vec);
#pragma unroll
            for (int v = 0; v < V; ++v) {
                if (ci * V + v < n) {
                    const A d = Pk<T>::get(xc, v) - mean, gw = Pk<T>::get(gc, v) * Pk<T>::get(wc, v);
                    s[0] += d * d;
                    s[1] += gw;
                    s[2] += gw * d;
                }
            }
        });
        grp_sum<BLOCK>(s, G);
        const A rr = (A)1 / m_sqrt(s[0] / (A)n + eps);
        const A m1 = s[1] / (A)n, m2 = s[2] * rr / (A)n;
        if (t == 0 && live && part == nullptr) {
            stats[2 * r] = mean;
            stats[2 * r + 1] = rr;
        }
        T* dr = dx + r * n;
        each_chunk<E, CACHED>(t, P, nc, [&](int k, u32 ci) {
            const W4 xc = xr.at(k, ci), gc = gr.at(k, ci), wc = load_chunk(w, ci, n, vec);
            A o[V];
#pragma unroll
            for (int v = 0; v < V; ++v) {
                const A xhat = (Pk<T>::get(xc, v) - mean) * rr;
                o[v] = (Pk<T>::get(gc, v) * Pk<T>::get(wc, v) - m1 - xhat * m2) * rr;
                if constexpr (SUMS) {
                    if (part != nullptr && live) cs.add(k, v, Pk<T>::get(gc, v), xhat);
                }
            }
            if (acc != nullptr) add_acc<T>(o, ar.at(k, ci));
            if (live) store_vals(dr, ci, n, vec, o);
        });
    }
    if constexpr (SUMS) {
        if (part != nullptr) cs.store(2, n, nc, gp, part);
    }
}

template <typename T, bool BLOCK, int E, bool CACHED>
__device__ void ln_bwd_body(u64 rows, u32 n, const T* x, u64 xs, const T* w, const T* g, u64 gs, T* dx,
                            const T* acc, u64 as_, typename Num<T>::A* stats, typename Num<T>::A* part, u32 vec_,
                            typename Num<T>::A eps) {
    ln_bwd_body_g<T, T, BLOCK, E, CACHED>(rows, n, x, xs, w, g, gs, dx, acc, as_, stats, part, vec_, eps);
}
// f32 x, bf16 / f16 g.
template <typename T, bool BLOCK, int E, bool CACHED>
__device__ void ln_bwd_body_gbf16(u64 rows, u32 n, const T* x, u64 xs, const T* w, const bf16* g, u64 gs, T* dx,
                                  const T* acc, u64 as_, typename Num<T>::A* stats,
                                  typename Num<T>::A* part, u32 vec_, typename Num<T>::A eps) {
    ln_bwd_body_g<T, bf16, BLOCK, E, CACHED>(rows, n, x, xs, w, g, gs, dx, acc, as_, stats, part, vec_, eps);
}
template <typename T, bool BLOCK, int E, bool CACHED>
__device__ void ln_bwd_body_gf16(u64 rows, u32 n, const T* x, u64 xs, const T* w, const f16* g, u64 gs, T* dx,
                                 const T* acc, u64 as_, typename Num<T>::A* stats,
                                 typename Num<T>::A* part, u32 vec_, typename Num<T>::A eps) {
    ln_bwd_body_g<T, f16, BLOCK, E, CACHED>(rows, n, x, xs, w, g, gs, dx, acc, as_, stats, part, vec_, eps);
}

// ---- layer_norm of f32 rows of 129 to 1024 elements ----

// A warp per f32 row: lane t holds chunks t, t + 32, ... (at most E of them, those below nc)
// of the row at `row`, each a 16-byte load.
template <int E>
__device__ __forceinline__ void lane_chunks(W4 (&c)[E], const float* row, u32 lane, u32 nc) {
#pragma unroll
    for (int k = 0; k < E; ++k)
        if (k * 32 + lane < nc) c[k] = *(const W4*)(row + (u64)(k * 32 + lane) * 4);
}

// The mean of the n-element row whose chunks the warp's lanes hold (`lane_chunks`).
template <int E>
__device__ __forceinline__ float lane_mean(const W4 (&c)[E], u32 lane, u32 nc, u32 n) {
    float s = 0.f;
#pragma unroll
    for (int k = 0; k < E; ++k)
        if (k * 32 + lane < nc)
#pragma unroll
            for (int v = 0; v < 4; ++v) s += __uint_as_float(c[k].w[v]);
    return warp_sum(s) / (float)n;
}

// y = (x - mean) r w + b as `ln_body_y` computes it, written as Y (f32, or the 16-bit output
// of an autocast product's input), for f32 rows of n <= 128 E elements with `vec`: a warp per
// row, lane t holding chunks t, t + 32, ... in registers, the warp's next row loaded while it
// works on this one. Block 256.
template <typename Y, int E>
__device__ void ln_rows_body(u64 rows, u32 n, const float* x, u64 xs, const float* w, const float* b, Y* y,
                             float eps) {
    const u32 lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    const u32 nc = n >> 2;
    const u64 step = (u64)gridDim.x * nw;
    W4 xc[E];
    u64 r = (u64)blockIdx.x * nw + (threadIdx.x >> 5);
    if (r < rows) lane_chunks(xc, x + r * xs, lane, nc);
    for (; r < rows; r += step) {
        W4 xn[E];
        if (r + step < rows) lane_chunks(xn, x + (r + step) * xs, lane, nc);
        const float mean = lane_mean(xc, lane, nc, n);
        float s2 = 0.f;
#pragma unroll
        for (int k = 0; k < E; ++k)
            if (k * 32 + lane < nc)
#pragma unroll
                for (int v = 0; v < 4; ++v) {
                    const float d = __uint_as_float(xc[k].w[v]) - mean;
                    s2 += d * d;
                }
        const float rr = 1.f / sqrtf(warp_sum(s2) / (float)n + eps);
        Y* yr = y + r * n;
#pragma unroll
        for (int k = 0; k < E; ++k) {
            const u32 c = k * 32 + lane;
            if (c < nc) {
                const W4 wc = *(const W4*)(w + (u64)c * 4), bc = *(const W4*)(b + (u64)c * 4);
                float o[4];
#pragma unroll
                for (int v = 0; v < 4; ++v)
                    o[v] = (__uint_as_float(xc[k].w[v]) - mean) * rr * __uint_as_float(wc.w[v]) +
                           __uint_as_float(bc.w[v]);
                store_as<float>(yr, c, n, true, o);
            }
        }
#pragma unroll
        for (int k = 0; k < E; ++k) xc[k] = xn[k];
    }
}

// ---- layer_norm backward of f32 rows of 129 to 1024 elements ----

// One 4-element chunk of a gradient row of G: 16 bytes of f32, 8 of f16 / bf16 (kept packed).
template <typename G> struct GChunk;
template <> struct GChunk<float> {
    typedef W4 R;
    static __device__ __forceinline__ R load(const float* row, u32 c) { return *(const W4*)(row + (u64)c * 4); }
    static __device__ __forceinline__ float get(const R& r, int v) { return __uint_as_float(r.w[v]); }
};
template <typename H> struct GChunkHalf {
    typedef uint2 R;
    static __device__ __forceinline__ R load(const H* row, u32 c) { return *(const uint2*)(row + (u64)c * 4); }
    static __device__ __forceinline__ float get(const R& r, int v) {
        H h;
        h.x = (unsigned short)(((v < 2 ? r.x : r.y) >> ((v & 1) * 16)) & 0xffffu);
        return Num<H>::load(h);
    }
};
template <> struct GChunk<bf16> : GChunkHalf<bf16> {};
template <> struct GChunk<f16> : GChunkHalf<f16> {};

// dx of layer_norm as `ln_bwd_body_g` computes it, and the block's weight and bias sums, for
// f32 rows of n <= 128 E elements with `vec` (the host checks both): a warp per row, lane t
// holding chunks t, t + 32, ... of x and g in registers. With PF the warp loads its next
// row's x and g before working on this one (a second row's loads in flight); the wide rows
// (E > 4) have no registers for that. dw and db are summed in registers over the warp's rows,
// then over the block's warps in warp order through shared memory, into
// part[(blockIdx.x * 2 + j) * n + col] (j 0: dw, 1: db) for `norm_dw_final`. Block 256.
template <typename G, int E>
__device__ void ln_bwd_rows_body(u64 rows, u32 n, const float* x, u64 xs, const float* w, const G* g, u64 gs,
                                 float* dx, const float* acc, u64 as_, float* part, float eps) {
    constexpr bool PF = E <= 4;
    typedef typename GChunk<G>::R R;
    const u32 lane = threadIdx.x & 31, wib = threadIdx.x >> 5, nw = blockDim.x >> 5;
    const u32 nc = n >> 2;
    const u64 step = (u64)gridDim.x * nw;
    float sw[E][4], sb[E][4];
#pragma unroll
    for (int k = 0; k < E; ++k)
#pragma unroll
        for (int v = 0; v < 4; ++v) sw[k][v] = sb[k][v] = 0.f;
    W4 xc[E];
    R gc[E];
    auto load_row = [&](u64 row, W4 (&xa)[E], R (&ga)[E]) {
        lane_chunks(xa, x + row * xs, lane, nc);
#pragma unroll
        for (int k = 0; k < E; ++k)
            if (k * 32 + lane < nc) ga[k] = GChunk<G>::load(g + row * gs, k * 32 + lane);
    };
    u64 r = (u64)blockIdx.x * nw + wib;
    if (r < rows) load_row(r, xc, gc);
    for (; r < rows; r += step) {
        W4 ac[E];
        if (acc != nullptr) lane_chunks(ac, acc + r * as_, lane, nc);
        W4 xn[PF ? E : 1];
        R gn[PF ? E : 1];
        if constexpr (PF) {
            if (r + step < rows) load_row(r + step, xn, gn);
        }
        const float mean = lane_mean(xc, lane, nc, n);
        float q[3] = {0.f, 0.f, 0.f};  // sum (x - mean)^2, sum g w, sum g w (x - mean)
#pragma unroll
        for (int k = 0; k < E; ++k) {
            const u32 c = k * 32 + lane;
            if (c < nc) {
                const W4 wc = *(const W4*)(w + (u64)c * 4);
#pragma unroll
                for (int v = 0; v < 4; ++v) {
                    const float d = __uint_as_float(xc[k].w[v]) - mean;
                    const float gw = GChunk<G>::get(gc[k], v) * __uint_as_float(wc.w[v]);
                    q[0] += d * d;
                    q[1] += gw;
                    q[2] += gw * d;
                }
            }
        }
#pragma unroll
        for (int j = 0; j < 3; ++j) q[j] = warp_sum(q[j]);
        const float rr = 1.f / sqrtf(q[0] / (float)n + eps);
        const float m1 = q[1] / (float)n, m2 = q[2] * rr / (float)n;
        float* dr = dx + r * n;
#pragma unroll
        for (int k = 0; k < E; ++k) {
            const u32 c = k * 32 + lane;
            if (c < nc) {
                const W4 wc = *(const W4*)(w + (u64)c * 4);
                float o[4];
#pragma unroll
                for (int v = 0; v < 4; ++v) {
                    const float gv = GChunk<G>::get(gc[k], v);
                    const float xhat = (__uint_as_float(xc[k].w[v]) - mean) * rr;
                    o[v] = (gv * __uint_as_float(wc.w[v]) - m1 - xhat * m2) * rr;
                    sw[k][v] += gv * xhat;
                    sb[k][v] += gv;
                    if (acc != nullptr) o[v] += __uint_as_float(ac[k].w[v]);
                }
                *(W4*)(dr + (u64)c * 4) = Pk<float>::pack(o);
            }
        }
        if constexpr (PF) {
#pragma unroll
            for (int k = 0; k < E; ++k) {
                xc[k] = xn[k];
                gc[k] = gn[k];
            }
        } else {
            if (r + step < rows) load_row(r + step, xc, gc);
        }
    }
    __shared__ float sh[2][1024];
    for (u32 q = 0; q < nw; ++q) {
        if (wib == q) {
#pragma unroll
            for (int k = 0; k < E; ++k) {
                const u32 c = k * 32 + lane;
                if (c < nc)
#pragma unroll
                    for (int v = 0; v < 4; ++v) {
                        const u32 col = c * 4 + v;
                        sh[0][col] = (q == 0 ? 0.f : sh[0][col]) + sw[k][v];
                        sh[1][col] = (q == 0 ? 0.f : sh[1][col]) + sb[k][v];
                    }
            }
        }
        __syncthreads();
    }
    float* out = part + (u64)blockIdx.x * 2 * n;
    for (u32 col = threadIdx.x; col < n; col += blockDim.x) {
        out[col] = sh[0][col];
        out[n + col] = sh[1][col];
    }
}

// Weight (and bias) gradients, stage 1: column sums over one chunk of rows, no atomics.
// part[(chunk * K + 0) * n + col] = sum_r g[r, col] (x[r, col] - stats[2r]) stats[2r + 1];
// with bias (K = 2) also part[(chunk * 2 + 1) * n + col] = sum_r g[r, col].
// Block (32, 8): 32 columns x 8 row lanes; grid (ceil(n / 32), chunks); chunk c covers rows
// [c * rpc, min(rows, (c + 1) * rpc)).
template <typename T, typename G>
__device__ void norm_dw_part_body(u64 rows, u32 n, u64 rpc, const T* x, u64 xs, const G* g, u64 gs,
                                  const typename Num<T>::A* stats, u32 bias, typename Num<T>::A* part) {
    typedef typename Num<T>::A A;
    __shared__ A sh[2][8][33];
    const u32 tx = threadIdx.x, ty = threadIdx.y;
    const u32 col = blockIdx.x * 32 + tx;
    const u64 r0 = (u64)blockIdx.y * rpc;
    const u64 r1 = r0 + rpc < rows ? r0 + rpc : rows;
    A dw = 0, db = 0;
    if (col < n) {
#pragma unroll 4
        for (u64 r = r0 + ty; r < r1; r += 8) {
            const A gv = (A)Num<G>::load(g[r * gs + col]);
            dw += gv * ((Num<T>::load(x[r * xs + col]) - stats[2 * r]) * stats[2 * r + 1]);
            db += gv;
        }
    }
    sh[0][ty][tx] = dw;
    sh[1][ty][tx] = db;
    __syncthreads();
    if (ty == 0 && col < n) {
        A a = 0, b = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            a += sh[0][k][tx];
            b += sh[1][k][tx];
        }
        const u64 K = bias ? 2 : 1;
        part[((u64)blockIdx.y * K) * n + col] = a;
        if (bias) part[((u64)blockIdx.y * K + 1) * n + col] = b;
    }
}

// Stage 2: dw[col] (blockIdx.y 0) or db[col] (blockIdx.y 1, with bias) = the sum over the
// chunks of stage 1 (or of the fused row kernel's blocks). Block (32, L), L ≤ 32: 32 columns
// x L lanes over the chunks (lane ty: chunks ty, ty + L, ... into four running sums),
// combined in a fixed order through shared memory; grid (ceil(n / 32), 1 + bias).
template <typename T>
__device__ void norm_dw_final_body(u32 n, u32 chunks, u32 bias, const typename Num<T>::A* part, T* dw, T* db) {
    typedef typename Num<T>::A A;
    __shared__ A sh[32][33];
    const u32 tx = threadIdx.x, ty = threadIdx.y, L = blockDim.y, which = blockIdx.y;
    const u32 col = blockIdx.x * 32 + tx;
    const u64 K = bias ? 2 : 1;
    A a[4] = {0, 0, 0, 0};
    if (col < n) {
        u32 c = ty;
        for (; c + 3 * L < chunks; c += 4 * L)
#pragma unroll
            for (int u = 0; u < 4; ++u) a[u] += part[((u64)(c + u * L) * K + which) * n + col];
#pragma unroll
        for (int u = 0; u < 3; ++u)
            if (c + u * L < chunks) a[u] += part[((u64)(c + u * L) * K + which) * n + col];
    }
    sh[ty][tx] = (a[0] + a[1]) + (a[2] + a[3]);
    __syncthreads();
    if (ty == 0 && col < n) {
        A t = 0;
        for (u32 k = 0; k < L; ++k) t += sh[k][tx];
        if (which == 0) dw[col] = Num<T>::store(t);
        else db[col] = Num<T>::store(t);
    }
}

// ---- RoPE ----

// x rows of d = 2h elements (row r at x + r * xs, unit inner stride), position r % l;
// cos, sin [l, h] with row strides css, sns and unit inner stride; y contiguous. Pair k is (2k, 2k + 1) when inter, else (k, k + h):
// (a, b) -> (a cos - b sin, a sin + b cos). Block (bx, by): threadIdx.x over pairs
// (blockIdx.y * bx + threadIdx.x), threadIdx.y over rows, grid-stride over rows along x.
template <typename T>
__device__ void rope_body(u64 rows, u32 h, u32 l, const T* x, u64 xs, const T* cs, u64 css, const T* sn, u64 sns,
                          T* y, u32 inter) {
    typedef typename Num<T>::A A;
    const u32 k = blockIdx.y * blockDim.x + threadIdx.x;
    if (k >= h) return;
    const u32 ia = inter ? 2 * k : k, ib = inter ? 2 * k + 1 : k + h;
    for (u64 r = (u64)blockIdx.x * blockDim.y + threadIdx.y; r < rows; r += (u64)gridDim.x * blockDim.y) {
        const u64 p = r % l;
        const A a = Num<T>::load(x[r * xs + ia]), b = Num<T>::load(x[r * xs + ib]);
        const A c = Num<T>::load(cs[p * css + k]), s = Num<T>::load(sn[p * sns + k]);
        T* yr = y + r * (2 * (u64)h);
        yr[ia] = Num<T>::store(a * c - b * s);
        yr[ib] = Num<T>::store(a * s + b * c);
    }
}

// ---- entry points ----

#define ROW_KERNELS(S, T, NAME, BODY, E, PARAMS, ARGS)                                             \
    extern "C" __global__ void __launch_bounds__(256) NAME##_w_##S PARAMS { BODY<T, false, E_WARP, true> ARGS; } \
    extern "C" __global__ void __launch_bounds__(512, 2) NAME##_b_##S PARAMS { BODY<T, true, E, true> ARGS; } \
    extern "C" __global__ void __launch_bounds__(1024) NAME##_l_##S PARAMS { BODY<T, true, 1, false> ARGS; }

#define NORM_KERNELS(S, T)                                                                          \
    ROW_KERNELS(S, T, softmax, softmax_body, E_FWD,                                                 \
        (u64 rows, u32 n, const T* x, u64 xs, T* y, u32 vec, u32 logm),                            \
        (rows, n, x, xs, y, vec, logm))                                                             \
    ROW_KERNELS(S, T, rms_norm, rms_body, E_FWD,                                                    \
        (u64 rows, u32 n, const T* x, u64 xs, const T* w, T* y, u32 vec, Num<T>::A eps),           \
        (rows, n, x, xs, w, y, vec, eps))                                                           \
    ROW_KERNELS(S, T, layer_norm, ln_body, E_FWD,                                                   \
        (u64 rows, u32 n, const T* x, u64 xs, const T* w, const T* b, T* y, u32 vec, Num<T>::A eps), \
        (rows, n, x, xs, w, b, y, vec, eps))                                                        \
    ROW_KERNELS(S, T, softmax_bwd, softmax_bwd_body, E_BWD,                                         \
        (u64 rows, u32 n, const T* y, u64 ys, const T* g, u64 gs, T* dx, u32 vec, u32 logm),       \
        (rows, n, y, ys, g, gs, dx, vec, logm))                                                     \
    ROW_KERNELS(S, T, rms_norm_bwd, rms_bwd_body, E_BWD,                                            \
        (u64 rows, u32 n, const T* x, u64 xs, const T* w, const T* g, u64 gs, T* dx,               \
         const T* acc, u64 as_, Num<T>::A* stats, Num<T>::A* part, u32 vec, Num<T>::A eps),         \
        (rows, n, x, xs, w, g, gs, dx, acc, as_, stats, part, vec, eps))                           \
    ROW_KERNELS(S, T, layer_norm_bwd, ln_bwd_body, E_BWD,                                           \
        (u64 rows, u32 n, const T* x, u64 xs, const T* w, const T* g, u64 gs, T* dx,               \
         const T* acc, u64 as_, Num<T>::A* stats, Num<T>::A* part, u32 vec, Num<T>::A eps),         \
        (rows, n, x, xs, w, g, gs, dx, acc, as_, stats, part, vec, eps))                           \
    extern "C" __global__ void __launch_bounds__(256) norm_dw_part_##S(u64 rows, u32 n, u64 rpc,   \
        const T* x, u64 xs, const T* g, u64 gs, const Num<T>::A* stats, u32 bias, Num<T>::A* part) { \
        norm_dw_part_body<T, T>(rows, n, rpc, x, xs, g, gs, stats, bias, part);                    \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(1024) norm_dw_final_##S(u32 n, u32 chunks, u32 bias, \
        const Num<T>::A* part, T* dw, T* db) {                                                      \
        norm_dw_final_body<T>(n, chunks, bias, part, dw, db);                                      \
    }                                                                                               \
    extern "C" __global__ void __launch_bounds__(256) rope_##S(u64 rows, u32 h, u32 l, const T* x, \
        u64 xs, const T* cs, u64 css, const T* sn, u64 sns, T* y, u32 inter) {                      \
        rope_body<T>(rows, h, l, x, xs, cs, css, sn, sns, y, inter);                               \
    }
FOR_FLOATS(NORM_KERNELS)

// f32 layer norms with a 16-bit output (`layer_norm_o{bf16,f16}_*_f32`) or gradient
// (`layer_norm_bwd_g{bf16,f16}_*_f32`, `norm_dw_part_g{bf16,f16}_f32`).
#define LN_HALF_KERNELS(H, HT)                                                                     \
    ROW_KERNELS(f32, float, layer_norm_o##H, ln_body_o##H, E_FWD,                                  \
        (u64 rows, u32 n, const float* x, u64 xs, const float* w, const float* b, HT* y, u32 vec, float eps), \
        (rows, n, x, xs, w, b, y, vec, eps))                                                       \
    ROW_KERNELS(f32, float, layer_norm_bwd_g##H, ln_bwd_body_g##H, E_BWD,                          \
        (u64 rows, u32 n, const float* x, u64 xs, const float* w, const HT* g, u64 gs, float* dx,  \
         const float* acc, u64 as_, float* stats, float* part, u32 vec, float eps),                \
        (rows, n, x, xs, w, g, gs, dx, acc, as_, stats, part, vec, eps))                          \
    extern "C" __global__ void __launch_bounds__(256) norm_dw_part_g##H##_f32(u64 rows, u32 n, u64 rpc, \
        const float* x, u64 xs, const HT* g, u64 gs, const float* stats, u32 bias, float* part) {  \
        norm_dw_part_body<float, HT>(rows, n, rpc, x, xs, g, gs, stats, bias, part);               \
    }
LN_HALF_KERNELS(bf16, bf16)
LN_HALF_KERNELS(f16, f16)

// f32 layer norm backward, a warp per row of 129 to 1024 elements
// (`layer_norm_bwd{,_gbf16,_gf16}_r{E}_f32`, n <= 128 E; `ln_bwd_rows_body`). The parameters
// are the other backward kernels'; `stats` and `vec` are unused (the host checked `vec`).
#define LN_ROWS_KERNEL(GS, GT, E)                                                                  \
    extern "C" __global__ void __launch_bounds__(256, 2) layer_norm_bwd##GS##_r##E##_f32(          \
        u64 rows, u32 n, const float* x, u64 xs, const float* w, const GT* g, u64 gs, float* dx,   \
        const float* acc, u64 as_, float*, float* part, u32, float eps) {                         \
        ln_bwd_rows_body<GT, E>(rows, n, x, xs, w, g, gs, dx, acc, as_, part, eps);               \
    }
#define LN_ROWS_KERNELS(GS, GT) \
    LN_ROWS_KERNEL(GS, GT, 2) LN_ROWS_KERNEL(GS, GT, 3) LN_ROWS_KERNEL(GS, GT, 4) \
    LN_ROWS_KERNEL(GS, GT, 6) LN_ROWS_KERNEL(GS, GT, 8)
LN_ROWS_KERNELS(, float)
LN_ROWS_KERNELS(_gbf16, bf16)
LN_ROWS_KERNELS(_gf16, f16)

// f32 layer norm, a warp per row of 129 to 1024 elements (`layer_norm{,_obf16,_of16}_r{E}_f32`,
// n <= 128 E; `ln_rows_body`). The parameters are the other layer norm kernels'; `vec` is
// unused (the host checked it).
#define LN_FWD_ROWS_KERNEL(YS, YT, E)                                                              \
    extern "C" __global__ void __launch_bounds__(256) layer_norm##YS##_r##E##_f32(                 \
        u64 rows, u32 n, const float* x, u64 xs, const float* w, const float* b, YT* y, u32,       \
        float eps) {                                                                               \
        ln_rows_body<YT, E>(rows, n, x, xs, w, b, y, eps);                                         \
    }
#define LN_FWD_ROWS_KERNELS(YS, YT) \
    LN_FWD_ROWS_KERNEL(YS, YT, 2) LN_FWD_ROWS_KERNEL(YS, YT, 3) LN_FWD_ROWS_KERNEL(YS, YT, 4) \
    LN_FWD_ROWS_KERNEL(YS, YT, 6) LN_FWD_ROWS_KERNEL(YS, YT, 8)
LN_FWD_ROWS_KERNELS(, float)
LN_FWD_ROWS_KERNELS(_obf16, bf16)
LN_FWD_ROWS_KERNELS(_of16, f16)
