// Fused cross-entropy over class indices (the reference is ferrite-cpu cross_entropy.rs).
// One block per row (grid-stride over rows). The forward reads each row once (an online max
// and sum of exponentials per thread, 16-byte loads when the row allows), writing per row
// (loss, lse); the backward reads the row once more and writes dlogits, using the saved lse.
// Probabilities are never stored. A target outside [0, c) that is not ignore_index raises
// FAULT_CROSS_ENTROPY and its row yields 0. With label smoothing the kernels also read the
// class weights and `wsum` (their sum as A: f64 for f64 logits, else f32; a device scalar the
// host computed).

#define FAULT_CROSS_ENTROPY 5u

// Loads of V elements (16 bytes) of T, as A.
template <typename T, int V> struct Vec16 { T v[V]; };

template <typename T, typename I>
__device__ void ce_fwd_impl(const T* __restrict__ x, u64 n, u32 c, const I* __restrict__ tgt,
                            const T* __restrict__ w, const void* wsum, i64 ignore, double eps,
                            u32 vec16, T* __restrict__ out, ErrFlag* err) {
    typedef typename Num<T>::A A;
    __shared__ A sh[32];
    const int V = 16 / sizeof(T);
    for (u64 r = blockIdx.x; r < n; r += gridDim.x) {
        const T* row = x + r * c;
        A m = neg_inf<A>(), s = (A)0, sw = (A)0;
        if (vec16) {
            const Vec16<T, V>* rv = (const Vec16<T, V>*)row;
            for (u32 k = threadIdx.x; k < c / V; k += blockDim.x) {
                Vec16<T, V> chunk = rv[k];
#pragma unroll
                for (int e = 0; e < V; e++) {
                    A v = Num<T>::load(chunk.v[e]);
                    if (v > m) { s = s * m_exp(m - v) + (A)1; m = v; }
                    else if (v > neg_inf<A>()) s += m_exp(v - m);
                    else if (m_isnan(v)) { m = v; s = v; }
                    if (eps > 0.0) sw += Num<T>::load(w[k * V + e]) * v;
                }
            }
        } else {
            for (u32 j = threadIdx.x; j < c; j += blockDim.x) {
                A v = Num<T>::load(row[j]);
                if (v > m) { s = s * m_exp(m - v) + (A)1; m = v; }
                else if (v > neg_inf<A>()) s += m_exp(v - m);
                else if (m_isnan(v)) { m = v; s = v; }
                if (eps > 0.0) sw += Num<T>::load(w[j]) * v;
            }
        }
        A M = block_max(m, sh);
        // The CPU's rule: shift by 0 when the row max is infinite.
        A shift = (M == -neg_inf<A>() || M == neg_inf<A>()) ? (A)0 : M;
        A part = (m == neg_inf<A>()) ? (A)0 : s * m_exp(m - shift);
        // A +inf in the row: the CPU's unshifted sum is +inf there (NaN stays NaN).
        if (M == -neg_inf<A>()) part = (m == M) ? M : (A)0;
        A S = block_sum(part, sh);
        A SW = (eps > 0.0) ? block_sum(sw, sh) : (A)0;
        if (threadIdx.x == 0) {
            A l = m_log(S) + shift;
            i64 t = (i64)tgt[r];
            A loss = (A)0;
            if (t != ignore) {
                if (t < 0 || t >= (i64)c) {
                    raise_fault(err, FAULT_CROSS_ENTROPY, t, (i64)c);
                } else {
                    A xt = Num<T>::load(row[t]);
                    A wt = Num<T>::load(w[t]);
                    loss = ((A)1 - (A)eps) * wt * (l - xt);
                    if (eps > 0.0) loss += (A)eps / (A)c * (*(const A*)wsum * l - SW);
                }
            }
            out[2 * r] = Num<T>::store(loss);
            out[2 * r + 1] = Num<T>::store(l);
        }
        __syncthreads();
    }
}

template <typename T, typename I>
__device__ void ce_bwd_impl(const T* __restrict__ x, u64 n, u32 c, const I* __restrict__ tgt,
                            const T* __restrict__ w, const void* wsum, i64 ignore, double eps,
                            const T* __restrict__ saved, const T* __restrict__ g, u32 vec16,
                            T* __restrict__ dx, ErrFlag* err) {
    typedef typename Num<T>::A A;
    const int V = 16 / sizeof(T);
    for (u64 r = blockIdx.x; r < n; r += gridDim.x) {
        const T* row = x + r * c;
        T* drow = dx + r * c;
        i64 t = (i64)tgt[r];
        bool skip = (t == ignore);
        if (!skip && (t < 0 || t >= (i64)c)) {
            if (threadIdx.x == 0) raise_fault(err, FAULT_CROSS_ENTROPY, t, (i64)c);
            skip = true;
        }
        A gi = skip ? (A)0 : Num<T>::load(g[2 * r]);
        A l = Num<T>::load(saved[2 * r + 1]);
        A a = skip ? (A)0 : ((A)1 - (A)eps) * Num<T>::load(w[t]);
        A es = (A)eps / (A)c;
        A coef = a + ((eps > 0.0) ? es * *(const A*)wsum : (A)0);
        if (vec16) {
            const Vec16<T, V>* rv = (const Vec16<T, V>*)row;
            Vec16<T, V>* dv = (Vec16<T, V>*)drow;
            for (u32 k = threadIdx.x; k < c / V; k += blockDim.x) {
                Vec16<T, V> chunk = rv[k], o;
#pragma unroll
                for (int e = 0; e < V; e++) {
                    u32 j = k * V + e;
                    A d = m_exp(Num<T>::load(chunk.v[e]) - l) * coef;
                    if (eps > 0.0) d -= es * Num<T>::load(w[j]);
                    if ((i64)j == t) d -= a;
                    o.v[e] = Num<T>::store(skip ? (A)0 : gi * d);
                }
                dv[k] = o;
            }
        } else {
            for (u32 j = threadIdx.x; j < c; j += blockDim.x) {
                A d = m_exp(Num<T>::load(row[j]) - l) * coef;
                if (eps > 0.0) d -= es * Num<T>::load(w[j]);
                if ((i64)j == t) d -= a;
                drow[j] = Num<T>::store(skip ? (A)0 : gi * d);
            }
        }
    }
}

#define CE_KERNELS(S, T, IS, I)                                                                 \
extern "C" __global__ void __launch_bounds__(1024) ce_fwd_##S##_##IS(const T* x, u64 n, u32 c, \
    const I* tgt, const T* w, const void* wsum, i64 ignore, double eps, u32 vec16, T* out,      \
    ErrFlag* err) {                                                                             \
    ce_fwd_impl<T, I>(x, n, c, tgt, w, wsum, ignore, eps, vec16, out, err); }                   \
extern "C" __global__ void __launch_bounds__(1024) ce_bwd_##S##_##IS(const T* x, u64 n, u32 c, \
    const I* tgt, const T* w, const void* wsum, i64 ignore, double eps, const T* saved,        \
    const T* g, u32 vec16, T* dx, ErrFlag* err) {                                               \
    ce_bwd_impl<T, I>(x, n, c, tgt, w, wsum, ignore, eps, saved, g, vec16, dx, err); }

#define CE_FOR_INDEX(S, T) CE_KERNELS(S, T, i32, i32) CE_KERNELS(S, T, i64, i64)               \
    CE_KERNELS(S, T, u32, u32) CE_KERNELS(S, T, u8, u8)
FOR_FLOATS(CE_FOR_INDEX)
