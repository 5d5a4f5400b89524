// Batch norm and group norm over x [n, c, s] (s: product of the trailing dims), contiguous.
// One block per statistic: a channel (batch norm) or a (sample, group) segment (group norm).
// Two-pass statistics in A (f32 for f16/bf16/f32, f64 for f64); variances are biased.

#define NORM_BLOCK 256

template <typename T>
__device__ void bn_fwd_impl(i64 n, i64 c, i64 s, double eps, const T* x, const T* w, const T* b,
                            T* y, T* mean_out, T* var_out) {
    typedef typename Num<T>::A A;
    __shared__ A sh[32];
    i64 ch = blockIdx.x, m = n * s;
    A acc = (A)0;
    for (i64 i = threadIdx.x; i < m; i += blockDim.x) acc += Num<T>::load(x[((i / s) * c + ch) * s + i % s]);
    A mean = block_sum(acc, sh) / (A)m;
    acc = (A)0;
    for (i64 i = threadIdx.x; i < m; i += blockDim.x) {
        A d = Num<T>::load(x[((i / s) * c + ch) * s + i % s]) - mean;
        acc += d * d;
    }
    A var = block_sum(acc, sh) / (A)m;
    A inv = (A)1 / m_sqrt(var + (A)eps);
    A wv = Num<T>::load(w[ch]), bv = Num<T>::load(b[ch]);
    for (i64 i = threadIdx.x; i < m; i += blockDim.x) {
        i64 at = ((i / s) * c + ch) * s + i % s;
        y[at] = Num<T>::store((Num<T>::load(x[at]) - mean) * inv * wv + bv);
    }
    if (threadIdx.x == 0) {
        mean_out[ch] = Num<T>::store(mean);
        var_out[ch] = Num<T>::store(var);
    }
}

template <typename T>
__device__ void bn_bwd_impl(i64 n, i64 c, i64 s, double eps, const T* x, const T* w, const T* g,
                            T* dx, T* dw, T* db) {
    typedef typename Num<T>::A A;
    __shared__ A sh[32];
    i64 ch = blockIdx.x, m = n * s;
    A acc = (A)0;
    for (i64 i = threadIdx.x; i < m; i += blockDim.x) acc += Num<T>::load(x[((i / s) * c + ch) * s + i % s]);
    A mean = block_sum(acc, sh) / (A)m;
    acc = (A)0;
    for (i64 i = threadIdx.x; i < m; i += blockDim.x) {
        A d = Num<T>::load(x[((i / s) * c + ch) * s + i % s]) - mean;
        acc += d * d;
    }
    A inv = (A)1 / m_sqrt(block_sum(acc, sh) / (A)m + (A)eps);
    A sg = (A)0, sgx = (A)0;
    for (i64 i = threadIdx.x; i < m; i += blockDim.x) {
        i64 at = ((i / s) * c + ch) * s + i % s;
        A gv = Num<T>::load(g[at]);
        sg += gv;
        sgx += gv * (Num<T>::load(x[at]) - mean) * inv;
    }
    sg = block_sum(sg, sh);
    sgx = block_sum(sgx, sh);
    A k = Num<T>::load(w[ch]) * inv / (A)m;
    for (i64 i = threadIdx.x; i < m; i += blockDim.x) {
        i64 at = ((i / s) * c + ch) * s + i % s;
        A xh = (Num<T>::load(x[at]) - mean) * inv;
        dx[at] = Num<T>::store(k * ((A)m * Num<T>::load(g[at]) - sg - xh * sgx));
    }
    if (threadIdx.x == 0) {
        dw[ch] = Num<T>::store(sgx);
        db[ch] = Num<T>::store(sg);
    }
}

// Segment seg = (sample, group): elements seg * len .. (seg + 1) * len, len = c / groups * s.
template <typename T>
__device__ void gn_fwd_impl(i64 c, i64 s, i64 groups, double eps, const T* x, const T* w, const T* b, T* y) {
    typedef typename Num<T>::A A;
    __shared__ A sh[32];
    i64 seg = blockIdx.x, cg = c / groups, len = cg * s, base = seg * len, c0 = (seg % groups) * cg;
    A acc = (A)0;
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) acc += Num<T>::load(x[base + j]);
    A mean = block_sum(acc, sh) / (A)len;
    acc = (A)0;
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
        A d = Num<T>::load(x[base + j]) - mean;
        acc += d * d;
    }
    A inv = (A)1 / m_sqrt(block_sum(acc, sh) / (A)len + (A)eps);
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
        i64 ch = c0 + j / s;
        y[base + j] = Num<T>::store((Num<T>::load(x[base + j]) - mean) * inv * Num<T>::load(w[ch]) + Num<T>::load(b[ch]));
    }
}

// dx per segment; stats[2 seg] = mean, stats[2 seg + 1] = 1 / sqrt(var + eps) for gn_bwd_dw.
template <typename T>
__device__ void gn_bwd_dx_impl(i64 c, i64 s, i64 groups, double eps, const T* x, const T* w, const T* g,
                               T* dx, typename Num<T>::A* stats) {
    typedef typename Num<T>::A A;
    __shared__ A sh[32];
    i64 seg = blockIdx.x, cg = c / groups, len = cg * s, base = seg * len, c0 = (seg % groups) * cg;
    A acc = (A)0;
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) acc += Num<T>::load(x[base + j]);
    A mean = block_sum(acc, sh) / (A)len;
    acc = (A)0;
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
        A d = Num<T>::load(x[base + j]) - mean;
        acc += d * d;
    }
    A inv = (A)1 / m_sqrt(block_sum(acc, sh) / (A)len + (A)eps);
    A sgw = (A)0, sgwx = (A)0;
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
        A gw = Num<T>::load(g[base + j]) * Num<T>::load(w[c0 + j / s]);
        sgw += gw;
        sgwx += gw * (Num<T>::load(x[base + j]) - mean) * inv;
    }
    sgw = block_sum(sgw, sh);
    sgwx = block_sum(sgwx, sh);
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
        A gw = Num<T>::load(g[base + j]) * Num<T>::load(w[c0 + j / s]);
        A xh = (Num<T>::load(x[base + j]) - mean) * inv;
        dx[base + j] = Num<T>::store(inv / (A)len * ((A)len * gw - sgw - xh * sgwx));
    }
    if (threadIdx.x == 0) {
        stats[2 * seg] = mean;
        stats[2 * seg + 1] = inv;
    }
}

// One block per channel: dw = sum of g * xhat, db = sum of g over samples and positions.
template <typename T>
__device__ void gn_bwd_dw_impl(i64 n, i64 c, i64 s, i64 groups, const T* x, const T* g,
                               const typename Num<T>::A* stats, T* dw, T* db) {
    typedef typename Num<T>::A A;
    __shared__ A sh[32];
    i64 ch = blockIdx.x, m = n * s, cg = c / groups;
    A sgx = (A)0, sg = (A)0;
    for (i64 i = threadIdx.x; i < m; i += blockDim.x) {
        i64 ni = i / s, at = (ni * c + ch) * s + i % s, seg = ni * groups + ch / cg;
        A gv = Num<T>::load(g[at]);
        sg += gv;
        sgx += gv * (Num<T>::load(x[at]) - stats[2 * seg]) * stats[2 * seg + 1];
    }
    sgx = block_sum(sgx, sh);
    sg = block_sum(sg, sh);
    if (threadIdx.x == 0) {
        dw[ch] = Num<T>::store(sgx);
        db[ch] = Num<T>::store(sg);
    }
}

#define NORM_KERNELS(S, T) \
    extern "C" __global__ void bn_fwd_##S(i64 n, i64 c, i64 s, double eps, const T* x, const T* w, const T* b, T* y, T* mean, T* var) { bn_fwd_impl<T>(n, c, s, eps, x, w, b, y, mean, var); } \
    extern "C" __global__ void bn_bwd_##S(i64 n, i64 c, i64 s, double eps, const T* x, const T* w, const T* g, T* dx, T* dw, T* db) { bn_bwd_impl<T>(n, c, s, eps, x, w, g, dx, dw, db); } \
    extern "C" __global__ void gn_fwd_##S(i64 c, i64 s, i64 groups, double eps, const T* x, const T* w, const T* b, T* y) { gn_fwd_impl<T>(c, s, groups, eps, x, w, b, y); } \
    extern "C" __global__ void gn_bwd_dx_##S(i64 c, i64 s, i64 groups, double eps, const T* x, const T* w, const T* g, T* dx, Num<T>::A* stats) { gn_bwd_dx_impl<T>(c, s, groups, eps, x, w, g, dx, stats); } \
    extern "C" __global__ void gn_bwd_dw_##S(i64 n, i64 c, i64 s, i64 groups, const T* x, const T* g, const Num<T>::A* stats, T* dw, T* db) { gn_bwd_dw_impl<T>(n, c, s, groups, x, g, stats, dw, db); }
FOR_FLOATS(NORM_KERNELS)
