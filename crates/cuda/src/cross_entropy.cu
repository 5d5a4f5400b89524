// Fused cross-entropy over class indices (the reference is ferrite-cpu cross_entropy.rs).
// One block per row (grid-stride over rows). The forward reads each row once (an online max
// and sum of exponentials per thread, 16-byte loads when the row allows), writing per row
// (loss, lse) in the accumulator type A (f32 for 16-bit logits); the backward reads the row
// once more and writes dlogits (in T), using the saved lse.
// Probabilities are never stored. A target outside [0, c) that is not ignore_index raises
// FAULT_CROSS_ENTROPY and its row yields 0. With label smoothing the kernels also read the
// class weights and `wsum` (their sum as A: f64 for f64 logits, else f32; a device scalar the
// host computed).

#define FAULT_CROSS_ENTROPY 5u

// exp as the kernels compute it: for 16-bit logits the hardware approximation (ex2.approx;
// its error is far below their rounding), else the libm exp of A.
template <typename T> struct CeExp {
    static __device__ __forceinline__ typename Num<T>::A f(typename Num<T>::A x) { return m_exp(x); }
};
template <> struct CeExp<f16> { static __device__ __forceinline__ float f(float x) { return __expf(x); } };
template <> struct CeExp<bf16> { static __device__ __forceinline__ float f(float x) { return __expf(x); } };

// 16-byte chunks each thread has in flight per loop trip.
#define CE_UNROLL 4

// One thread's online (max m, Σ exp(v - m)) over the values v of one chunk: the chunk's max
// first, one rescale, then a term per value (v == m counts 1, so a +inf max gives 1, not NaN;
// a NaN value makes s NaN). With smoothing, sw += w[j] v (w from `wrow`, j = the chunk's first
// column + e).
template <typename T, int V>
__device__ __forceinline__ void ce_chunk(const T* v16, typename Num<T>::A& m, typename Num<T>::A& s,
                                         bool smooth, const T* __restrict__ wrow,
                                         typename Num<T>::A& sw) {
    typedef typename Num<T>::A A;
    A v[V];
    A cm = m;
#pragma unroll
    for (int e = 0; e < V; e++) {
        v[e] = Num<T>::load(v16[e]);
        cm = v[e] > cm ? v[e] : cm;
    }
    if (cm > m) {
        s *= CeExp<T>::f(m - cm);
        m = cm;
    }
#pragma unroll
    for (int e = 0; e < V; e++) s += (v[e] == m) ? (A)1 : CeExp<T>::f(v[e] - m);
    if (smooth) {
#pragma unroll
        for (int e = 0; e < V; e++) sw += Num<T>::load(wrow[e]) * v[e];
    }
}

template <typename T, typename I>
__device__ void ce_fwd_impl(const T* __restrict__ x, u64 n, u32 c, const I* __restrict__ tgt,
                            const T* __restrict__ w, const void* wsum, i64 ignore, double eps,
                            u32 vec16, typename Num<T>::A* __restrict__ out, ErrFlag* err) {
    typedef typename Num<T>::A A;
    __shared__ A sh[32];
    const int V = 16 / sizeof(T);
    const bool smooth = eps > 0.0;
    for (u64 r = blockIdx.x; r < n; r += gridDim.x) {
        const T* row = x + r * c;
        A m = neg_inf<A>(), s = (A)0, sw = (A)0;
        if (vec16) {
            const Vec16<T>* rv = (const Vec16<T>*)row;
            const u32 nv = c / V, bd = blockDim.x;
            for (u32 k0 = threadIdx.x; k0 < nv; k0 += CE_UNROLL * bd) {
                Vec16<T> ch[CE_UNROLL];
#pragma unroll
                for (int u = 0; u < CE_UNROLL; u++)
                    if (k0 + u * bd < nv) ch[u] = rv[k0 + u * bd];
#pragma unroll
                for (int u = 0; u < CE_UNROLL; u++) {
                    u32 k = k0 + u * bd;
                    if (k < nv) ce_chunk<T, V>(ch[u].v, m, s, smooth, w + (u64)k * V, sw);
                }
            }
        } else {
            for (u32 j = threadIdx.x; j < c; j += blockDim.x)
                ce_chunk<T, 1>(row + j, m, s, smooth, w + j, sw);
        }
        // A NaN value made s NaN: carry it into the row max, as the CPU's max does.
        if (m_isnan(s)) m = s;
        A M = block_max(m, sh);
        // The CPU's rule: shift by 0 when the row max is infinite.
        A shift = (M == -neg_inf<A>() || M == neg_inf<A>()) ? (A)0 : M;
        A part = (m == neg_inf<A>()) ? (A)0 : s * m_exp(m - shift);
        // A +inf in the row: the CPU's unshifted sum is +inf there (NaN stays NaN).
        if (M == -neg_inf<A>()) part = (m == M) ? M : (A)0;
        A S = block_sum(part, sh);
        A SW = smooth ? block_sum(sw, sh) : (A)0;
        if (threadIdx.x == 0) {
            A l = m_log(S) + shift;
            i64 t = (i64)tgt[r];
            A loss = (A)0, wt = (A)0;
            if (t != ignore) {
                if (t < 0 || t >= (i64)c) {
                    raise_fault(err, FAULT_CROSS_ENTROPY, t, (i64)c);
                } else {
                    A xt = Num<T>::load(row[t]);
                    wt = Num<T>::load(w[t]);
                    loss = ((A)1 - (A)eps) * wt * (l - xt);
                    if (smooth) loss += (A)eps / (A)c * (*(const A*)wsum * l - SW);
                }
            }
            out[3 * r] = loss;
            out[3 * r + 1] = l;
            out[3 * r + 2] = wt;
        }
        __syncthreads();
    }
}

// dlogits of one value: g (softmax · coef - smoothing term - a at the target).
template <typename T>
__device__ __forceinline__ T ce_grad(T xv, u32 j, u32 tt, typename Num<T>::A l,
                                     typename Num<T>::A coef, typename Num<T>::A a,
                                     typename Num<T>::A gi, typename Num<T>::A esw) {
    typedef typename Num<T>::A A;
    A d = CeExp<T>::f(Num<T>::load(xv) - l) * coef - esw;
    if (j == tt) d -= a;
    return Num<T>::store(gi * d);
}

template <typename T, typename I>
__device__ void ce_bwd_impl(const T* __restrict__ x, u64 n, u32 c, const I* __restrict__ tgt,
                            const T* __restrict__ w, const void* wsum, i64 ignore, double eps,
                            const typename Num<T>::A* __restrict__ saved,
                            const typename Num<T>::A* __restrict__ g, u64 g_rows, u32 vec16,
                            T* __restrict__ dx, ErrFlag* err) {
    typedef typename Num<T>::A A;
    const int V = 16 / sizeof(T);
    const bool smooth = eps > 0.0;
    for (u64 r = blockIdx.x; r < n; r += gridDim.x) {
        const T* row = x + r * c;
        T* drow = dx + r * c;
        i64 t = (i64)tgt[r];
        bool skip = (t == ignore);
        if (!skip && (t < 0 || t >= (i64)c)) {
            if (threadIdx.x == 0) raise_fault(err, FAULT_CROSS_ENTROPY, t, (i64)c);
            skip = true;
        }
        // A skipped row (ignore_index, or a bad target) is written as zeros without reading
        // its logits: every factor below is 0 and the loads yield zeros.
        A gi = (A)0, l = (A)0, a = (A)0, es = (A)0, coef = (A)0;
        u32 tt = 0xffffffffu;
        if (!skip) {
            gi = g[g_rows * r];
            l = saved[3 * r + 1];
            a = ((A)1 - (A)eps) * Num<T>::load(w[t]);
            es = (A)eps / (A)c;
            coef = a + (smooth ? es * *(const A*)wsum : (A)0);
            tt = (u32)t;
        }
        if (vec16) {
            const Vec16<T>* rv = (const Vec16<T>*)row;
            Vec16<T>* dv = (Vec16<T>*)drow;
            const u32 nv = c / V, bd = blockDim.x;
            for (u32 k0 = threadIdx.x; k0 < nv; k0 += CE_UNROLL * bd) {
                Vec16<T> ch[CE_UNROLL];
#pragma unroll
                for (int u = 0; u < CE_UNROLL; u++)
                    if (k0 + u * bd < nv) ch[u] = skip ? Vec16<T>{} : rv[k0 + u * bd];
#pragma unroll
                for (int u = 0; u < CE_UNROLL; u++) {
                    u32 k = k0 + u * bd;
                    if (k >= nv) continue;
                    Vec16<T> o;
#pragma unroll
                    for (int e = 0; e < V; e++) {
                        u32 j = k * V + e;
                        A esw = smooth ? es * Num<T>::load(w[j]) : (A)0;
                        o.v[e] = ce_grad<T>(ch[u].v[e], j, tt, l, coef, a, gi, esw);
                    }
                    dv[k] = o;
                }
            }
        } else {
            for (u32 j = threadIdx.x; j < c; j += blockDim.x) {
                A esw = smooth ? es * Num<T>::load(w[j]) : (A)0;
                drow[j] = ce_grad<T>(skip ? Num<T>::store((A)0) : row[j], j, tt, l, coef, a, gi, esw);
            }
        }
    }
}

#define CE_KERNELS(S, T, IS, I)                                                                 \
extern "C" __global__ void __launch_bounds__(1024) ce_fwd_##S##_##IS(const T* x, u64 n, u32 c, \
    const I* tgt, const T* w, const void* wsum, i64 ignore, double eps, u32 vec16,             \
    Num<T>::A* out,                                                                             \
    ErrFlag* err) {                                                                             \
    ce_fwd_impl<T, I>(x, n, c, tgt, w, wsum, ignore, eps, vec16, out, err); }                   \
extern "C" __global__ void __launch_bounds__(1024) ce_bwd_##S##_##IS(const T* x, u64 n, u32 c, \
    const I* tgt, const T* w, const void* wsum, i64 ignore, double eps,                        \
    const Num<T>::A* saved, const Num<T>::A* g, u64 g_rows, u32 vec16, T* dx, ErrFlag* err) {  \
    ce_bwd_impl<T, I>(x, n, c, tgt, w, wsum, ignore, eps, saved, g, g_rows, vec16, dx, err); }

#define CE_FOR_INDEX(S, T) CE_KERNELS(S, T, i32, i32) CE_KERNELS(S, T, i64, i64)               \
    CE_KERNELS(S, T, u32, u32) CE_KERNELS(S, T, u8, u8)
FOR_FLOATS(CE_FOR_INDEX)
