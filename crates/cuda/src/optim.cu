// Fused multi-tensor optimizer updates and the multi-tensor sum of squares (ferrite_core::optim;
// launchers in optim.rs). Like PyTorch's multi_tensor_apply: a launch covers up to MT_MAX
// tensors, whose addresses and sizes travel by value in the kernel parameters (TensorList),
// and each block takes one CHUNK-element chunk of one tensor. The learning rate, step count
// gradient sum of squares and the optional gradient scale (gs: a loss scaler's 1 / scale,
// null for none) are read from device scalars, so a captured update replays
// with the values of the moment.
//
// Arithmetic mirrors the composed reference op for op (ferrite-train `update`) with explicitly
// rounded operations (__fadd_rn, ...), which the compiler may not contract into FMAs: an f32
// update equals the composed one on CUDA bit for bit (LAMB's norms apart: f64 here).

#define MT_MAX 48
#define CHUNK 16384
#define THREADS 256
#define ILP 4

struct TensorList {
    u64 w[MT_MAX];
    u64 g[MT_MAX];
    u64 s[3][MT_MAX];
    u64 n[MT_MAX];
    u64 first;             // bit t: tensor t's first update
    u32 chunk0[MT_MAX + 1]; // launch-local index of each tensor's first chunk; [count] = total
    u32 count;             // tensors in this launch
    u32 gchunk0;           // global index of this launch's first chunk (partial sums)
    u32 pad;
};

// Rule ids and hyperparameters (optim.rs `hyper`): h[] holds, per rule,
// 0 SGD: momentum, dampening, weight_decay          flags: 1 nesterov
// 1 Adam: beta1, beta2, eps, weight_decay           flags: 1 amsgrad, 2 decoupled
// 2 RMSprop: alpha, eps, weight_decay, momentum     flags: 1 centered
// 3 Adagrad: lr_decay, weight_decay, eps
// 4 Lion: beta1, beta2, weight_decay
// 5 LAMB: beta1, beta2, eps, weight_decay
// clip_kind: 0 none, 1 by norm (clip = max norm), 2 by value (clip = v).
struct Hyper {
    double h[4];
    double clip;
    u32 rule;
    u32 flags;
    u32 clip_kind;
    u32 pad;
};

__device__ __forceinline__ float r_add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float r_sub(float a, float b) { return __fsub_rn(a, b); }
__device__ __forceinline__ float r_mul(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ float r_div(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ float r_sqrt(float a) { return __fsqrt_rn(a); }
__device__ __forceinline__ double r_add(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ double r_sub(double a, double b) { return __dsub_rn(a, b); }
__device__ __forceinline__ double r_mul(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ double r_div(double a, double b) { return __ddiv_rn(a, b); }
__device__ __forceinline__ double r_sqrt(double a) { return __dsqrt_rn(a); }

// Per-launch constants, rounded to the compute type A as the composed ops round scalars.
template <typename A> struct K {
    A lr, wd, decay, a, oma, b, omb, mom, damp1, eps, step_size, bc2_sqrt, bc1, bc2, clr, coef, clipv, unscale;
    bool has_coef, has_clipv, has_unscale, skip;
    u32 rule, flags;
    bool has_mom;
};

template <typename A>
__device__ K<A> consts(const Hyper& hp, const double* lr_p, const double* step_p, const double* sq_p, const double* gs_p) {
    K<A> k;
    double lr = *lr_p, step = *step_p, sq = *sq_p;
    double inv = gs_p ? *gs_p : 1.0;
    k.has_unscale = gs_p != 0;
    k.unscale = (A)inv;
    double norm = sqrt(sq) * inv;
    k.skip = !(norm - norm == 0.0); // not finite
    k.rule = hp.rule;
    k.flags = hp.flags;
    k.has_coef = hp.clip_kind == 1;
    k.has_clipv = hp.clip_kind == 2;
    double c = hp.clip / (norm + 1e-6);
    k.coef = (A)(c < 1.0 ? c : 1.0);
    k.clipv = (A)hp.clip;
    k.lr = (A)lr;
    A z = (A)0;
    k.wd = z; k.decay = (A)1; k.a = z; k.oma = z; k.b = z; k.omb = z; k.mom = z; k.damp1 = z;
    k.eps = z; k.step_size = z; k.bc2_sqrt = z; k.bc1 = z; k.bc2 = z; k.clr = z;
    k.has_mom = false;
    const double* h = hp.h;
    switch (hp.rule) {
    case 0:
        k.mom = (A)h[0]; k.damp1 = (A)(1.0 - h[1]); k.wd = (A)h[2]; k.has_mom = h[0] != 0.0;
        break;
    case 1: {
        k.oma = (A)(1.0 - h[0]); k.b = (A)h[1]; k.omb = (A)(1.0 - h[1]); k.eps = (A)h[2];
        k.wd = (A)h[3]; k.decay = (A)(lr * -h[3] + 1.0);
        double bc1 = -pow(h[0], step) + 1.0, bc2 = -pow(h[1], step) + 1.0;
        k.step_size = (A)(lr / bc1);
        k.bc2_sqrt = (A)sqrt(bc2);
        break;
    }
    case 2:
        k.a = (A)h[0]; k.oma = (A)(1.0 - h[0]); k.eps = (A)h[1]; k.wd = (A)h[2]; k.mom = (A)h[3];
        k.has_mom = h[3] > 0.0;
        break;
    case 3:
        k.wd = (A)h[1]; k.eps = (A)h[2]; k.clr = (A)(lr / ((step + -1.0) * h[0] + 1.0));
        break;
    case 4:
        k.a = (A)h[0]; k.oma = (A)(1.0 - h[0]); k.b = (A)h[1]; k.omb = (A)(1.0 - h[1]);
        k.wd = (A)h[2]; k.decay = (A)(lr * -h[2] + 1.0);
        break;
    default:
        k.a = (A)h[0]; k.oma = (A)(1.0 - h[0]); k.b = (A)h[1]; k.omb = (A)(1.0 - h[1]);
        k.eps = (A)h[2]; k.wd = (A)h[3];
        k.bc1 = (A)(-pow(h[0], step) + 1.0);
        k.bc2 = (A)(-pow(h[1], step) + 1.0);
        break;
    }
    return k;
}

template <typename A> __device__ __forceinline__ A clip_grad(const K<A>& k, A g) {
    if (k.has_unscale) g = r_mul(g, k.unscale);
    if (k.has_coef) g = r_mul(g, k.coef);
    if (k.has_clipv) {
        g = (m_isnan(g) || g > -k.clipv) ? g : -k.clipv;
        g = (m_isnan(g) || g < k.clipv) ? g : k.clipv;
    }
    return g;
}

template <typename A> __device__ __forceinline__ A sign_of(A v) {
    return v > (A)0 ? (A)1 : (v < (A)0 ? (A)-1 : r_mul(v, (A)0));
}

template <typename A> __device__ __forceinline__ A lamb_r(const K<A>& k, A w, A m, A v) {
    A r = r_div(r_div(m, k.bc1), r_add(r_sqrt(r_div(v, k.bc2)), k.eps));
    if (k.wd != (A)0) r = r_add(r, r_mul(w, k.wd));
    return r;
}

// One element of every rule but LAMB: returns the new parameter, updates s[0..3].
template <typename A> __device__ __forceinline__ A elem(const K<A>& k, A w, A g, A* s, bool first) {
    g = clip_grad(k, g);
    A z = (A)0;
    switch (k.rule) {
    case 0: {
        A d = g;
        if (k.wd != z) d = r_add(d, r_mul(w, k.wd));
        if (k.has_mom) {
            A buf = first ? d : r_add(r_mul(s[0], k.mom), r_mul(d, k.damp1));
            d = (k.flags & 1) ? r_add(d, r_mul(buf, k.mom)) : buf;
            s[0] = buf;
        }
        return r_sub(w, r_mul(d, k.lr));
    }
    case 1: {
        A w0 = w;
        if (k.wd != z) {
            if (k.flags & 2) w0 = r_mul(w, k.decay);
            else g = r_add(g, r_mul(w, k.wd));
        }
        A m = r_add(s[0], r_mul(r_sub(g, s[0]), k.oma));
        A v = r_add(r_mul(s[1], k.b), r_mul(r_mul(g, g), k.omb));
        A vmax = v;
        if (k.flags & 1) {
            A x = s[2];
            vmax = (m_isnan(x) || x > v) ? x : v;
            s[2] = vmax;
        }
        s[0] = m;
        s[1] = v;
        A denom = r_add(r_div(r_sqrt(vmax), k.bc2_sqrt), k.eps);
        return r_sub(w0, r_mul(r_div(m, denom), k.step_size));
    }
    case 2: {
        if (k.wd != z) g = r_add(g, r_mul(w, k.wd));
        A sq = r_add(r_mul(s[0], k.a), r_mul(r_mul(g, g), k.oma));
        s[0] = sq;
        int gi = k.has_mom ? 2 : 1;
        A avg;
        if (k.flags & 1) {
            A ga = r_add(s[gi], r_mul(r_sub(g, s[gi]), k.oma));
            s[gi] = ga;
            avg = r_add(r_sqrt(r_sub(sq, r_mul(ga, ga))), k.eps);
        } else {
            avg = r_add(r_sqrt(sq), k.eps);
        }
        A upd = r_div(g, avg);
        if (k.has_mom) {
            A buf = r_add(r_mul(s[1], k.mom), upd);
            s[1] = buf;
            return r_sub(w, r_mul(buf, k.lr));
        }
        return r_sub(w, r_mul(upd, k.lr));
    }
    case 3: {
        if (k.wd != z) g = r_add(g, r_mul(w, k.wd));
        A sum = r_add(s[0], r_mul(g, g));
        s[0] = sum;
        A sd = r_add(r_sqrt(sum), k.eps);
        return r_sub(w, r_mul(r_div(g, sd), k.clr));
    }
    default: { // 4: Lion
        A w0 = k.wd != z ? r_mul(w, k.decay) : w;
        A m = s[0];
        A upd = sign_of(r_add(r_mul(m, k.a), r_mul(g, k.oma)));
        s[0] = r_add(r_mul(m, k.b), r_mul(g, k.omb));
        return r_sub(w0, r_mul(upd, k.lr));
    }
    }
}

// The tensor of this block (largest t with chunk0[t] <= blockIdx.x) and its element range.
__device__ __forceinline__ void locate(const TensorList& tl, u32* t_out, u64* lo, u64* hi) {
    u32 lo_t = 0, hi_t = tl.count; // chunk0[lo_t] <= b < chunk0[hi_t]
    u32 b = blockIdx.x;
    while (hi_t - lo_t > 1) {
        u32 mid = (lo_t + hi_t) >> 1;
        if (tl.chunk0[mid] <= b) lo_t = mid; else hi_t = mid;
    }
    u64 c = b - tl.chunk0[lo_t];
    *t_out = lo_t;
    *lo = c * CHUNK;
    u64 e = *lo + CHUNK;
    *hi = e < tl.n[lo_t] ? e : tl.n[lo_t];
}

template <typename T>
__device__ void fused_update_impl(TensorList tl, Hyper hp, const double* lr, const double* step, const double* sq, const double* gs) {
    typedef typename Num<T>::A A;
    K<A> k = consts<A>(hp, lr, step, sq, gs);
    if (k.skip) return;
    u32 t; u64 lo, hi;
    locate(tl, &t, &lo, &hi);
    T* w = (T*)tl.w[t];
    const T* g = (const T*)tl.g[t];
    T* s0 = (T*)tl.s[0][t];
    T* s1 = (T*)tl.s[1][t];
    T* s2 = (T*)tl.s[2][t];
    bool first = (tl.first >> t) & 1;
    for (u64 base = lo + threadIdx.x; base < hi; base += (u64)THREADS * ILP) {
        A wv[ILP], gv[ILP], sv[ILP][3];
#pragma unroll
        for (int j = 0; j < ILP; j++) {
            u64 i = base + (u64)j * THREADS;
            if (i < hi) {
                wv[j] = Num<T>::load(w[i]);
                gv[j] = Num<T>::load(g[i]);
                sv[j][0] = s0 ? Num<T>::load(s0[i]) : (A)0;
                sv[j][1] = s1 ? Num<T>::load(s1[i]) : (A)0;
                sv[j][2] = s2 ? Num<T>::load(s2[i]) : (A)0;
            }
        }
#pragma unroll
        for (int j = 0; j < ILP; j++) {
            u64 i = base + (u64)j * THREADS;
            if (i < hi) {
                A nw = elem(k, wv[j], gv[j], sv[j], first);
                w[i] = Num<T>::store(nw);
                if (s0) s0[i] = Num<T>::store(sv[j][0]);
                if (s1) s1[i] = Num<T>::store(sv[j][1]);
                if (s2) s2[i] = Num<T>::store(sv[j][2]);
            }
        }
    }
}

// LAMB pass 1: new moments (stored), and this chunk's sums of w² and r² in part[2 c], [2 c + 1].
template <typename T>
__device__ void lamb_moments_impl(TensorList tl, Hyper hp, const double* lr, const double* step, const double* sq, const double* gs, double* part) {
    typedef typename Num<T>::A A;
    __shared__ double sh[32];
    K<A> k = consts<A>(hp, lr, step, sq, gs);
    if (k.skip) return;
    u32 t; u64 lo, hi;
    locate(tl, &t, &lo, &hi);
    T* w = (T*)tl.w[t];
    const T* g = (const T*)tl.g[t];
    T* m = (T*)tl.s[0][t];
    T* v = (T*)tl.s[1][t];
    double ww = 0.0, rr = 0.0;
    for (u64 i = lo + threadIdx.x; i < hi; i += THREADS) {
        A x = Num<T>::load(w[i]);
        A gi = clip_grad(k, Num<T>::load(g[i]));
        T m1 = Num<T>::store(r_add(r_mul(Num<T>::load(m[i]), k.a), r_mul(gi, k.oma)));
        T v1 = Num<T>::store(r_add(r_mul(Num<T>::load(v[i]), k.b), r_mul(r_mul(gi, gi), k.omb)));
        m[i] = m1;
        v[i] = v1;
        A r = lamb_r(k, x, Num<T>::load(m1), Num<T>::load(v1));
        ww += (double)x * (double)x;
        rr += (double)r * (double)r;
    }
    ww = block_sum(ww, sh);
    rr = block_sum(rr, sh);
    if (threadIdx.x == 0) {
        u64 c = (u64)tl.gchunk0 + blockIdx.x;
        part[2 * c] = ww;
        part[2 * c + 1] = rr;
    }
}

// LAMB pass 2: the tensor's norms from its chunks' sums (fixed order), then
// w -= r × (trust × lr) with r recomputed from the stored moments.
template <typename T>
__device__ void lamb_apply_impl(TensorList tl, Hyper hp, const double* lr, const double* step, const double* sq, const double* gs, const double* part) {
    typedef typename Num<T>::A A;
    __shared__ double sh[32];
    K<A> k = consts<A>(hp, lr, step, sq, gs);
    if (k.skip) return;
    u32 t; u64 lo, hi;
    locate(tl, &t, &lo, &hi);
    u64 c0 = (u64)tl.gchunk0 + tl.chunk0[t], c1 = (u64)tl.gchunk0 + tl.chunk0[t + 1];
    double ww = 0.0, rr = 0.0;
    for (u64 c = c0 + threadIdx.x; c < c1; c += THREADS) {
        ww += part[2 * c];
        rr += part[2 * c + 1];
    }
    ww = block_sum(ww, sh);
    rr = block_sum(rr, sh);
    double wn = sqrt(ww), rn = sqrt(rr);
    double trust = (wn > 0.0 && rn > 0.0) ? wn / rn : 1.0;
    A tlr = r_mul((A)trust, k.lr);
    T* w = (T*)tl.w[t];
    const T* m = (const T*)tl.s[0][t];
    const T* v = (const T*)tl.s[1][t];
    for (u64 i = lo + threadIdx.x; i < hi; i += THREADS) {
        A x = Num<T>::load(w[i]);
        A r = lamb_r(k, x, Num<T>::load(m[i]), Num<T>::load(v[i]));
        w[i] = Num<T>::store(r_sub(x, r_mul(r, tlr)));
    }
}

// Sum of squares: part[gchunk0 + blockIdx.x] = this chunk's sum (f64).
template <typename T>
__device__ void sum_squares_impl(TensorList tl, double* part) {
    __shared__ double sh[32];
    u32 t; u64 lo, hi;
    locate(tl, &t, &lo, &hi);
    const T* x = (const T*)tl.w[t];
    double acc = 0.0;
    for (u64 i = lo + threadIdx.x; i < hi; i += THREADS) {
        double v = (double)Num<T>::load(x[i]);
        acc += v * v;
    }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) part[(u64)tl.gchunk0 + blockIdx.x] = acc;
}

// The sum of part[0..n] in an order fixed by n and the block size, on every thread of one
// block.
__device__ double sum_parts(const double* part, u64 n) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (u64 i = threadIdx.x; i < n; i += blockDim.x) acc += part[i];
    return block_sum(acc, sh);
}

// out[0] = the sum of part[0..n], in an order fixed by n (one block).
extern "C" __global__ void sum_squares_finish(const double* part, u64 n, double* out) {
    const double acc = sum_parts(part, n);
    if (threadIdx.x == 0) out[0] = acc;
}

// ferrite_core::optim::StepScalars: the gradients' sum of squares, then on one thread the
// step's norm, finiteness and counters. Launches after the first (more than SS_GROUPS groups)
// only add to their group counters, reading `finite` from the first.
#define SS_GROUPS 16
#define SS_THREADS 1024
struct StepScalarArgs {
    double* sq;
    const double* scale;  // null: none
    double* norm;
    double* steps;
    double* first;        // null: not tracked
    u8* finite;
    double* groups[SS_GROUPS];
    u32 ngroups;
    u32 groups_only;
};

// Thread 0, after the block has the sum of squares `ss` (ignored for groups_only).
__device__ void step_scalars_tail(const StepScalarArgs& a, double ss) {
    if (threadIdx.x != 0) return;
    bool fin;
    if (a.groups_only) {
        fin = *a.finite != 0;
    } else {
        *a.sq = ss;
        double n = sqrt(ss);
        if (a.scale) n = n * *a.scale;
        *a.norm = n;
        fin = n - n == 0.0;
        const double st = *a.steps + 1.0;
        *a.steps = st;
        if (a.first && !fin && *a.first == 0.0) *a.first = st;
        *a.finite = fin;
    }
    if (fin)
        for (u32 i = 0; i < a.ngroups; ++i) *a.groups[i] = *a.groups[i] + 1.0;
}

// One block (SS_THREADS): the partial sums part[0..n] (sum_squares_*) added in an order fixed
// by n, then the scalars.
extern "C" __global__ void __launch_bounds__(SS_THREADS) step_scalars(const double* part, u64 n, StepScalarArgs a) {
    step_scalars_tail(a, sum_parts(part, a.groups_only ? 0 : n));
}

// One block (SS_THREADS) for a few small gradients of one dtype: their sum of squares (each
// thread strides through every tensor in turn: an order fixed by the sizes), then the scalars.
template <typename T>
__device__ void step_scalars_small_impl(const TensorList& tl, const StepScalarArgs& a) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (u32 t = 0; t < tl.count; ++t) {
        const T* x = (const T*)tl.w[t];
        for (u64 i = threadIdx.x; i < tl.n[t]; i += blockDim.x) {
            double v = (double)Num<T>::load(x[i]);
            acc += v * v;
        }
    }
    acc = block_sum(acc, sh);
    step_scalars_tail(a, acc);
}

#define OPTIM_KERNELS(S, T) \
extern "C" __global__ void __launch_bounds__(THREADS) fused_update_##S(TensorList tl, Hyper hp, const double* lr, const double* step, const double* sq, const double* gs) { fused_update_impl<T>(tl, hp, lr, step, sq, gs); } \
extern "C" __global__ void __launch_bounds__(THREADS) lamb_moments_##S(TensorList tl, Hyper hp, const double* lr, const double* step, const double* sq, const double* gs, double* part) { lamb_moments_impl<T>(tl, hp, lr, step, sq, gs, part); } \
extern "C" __global__ void __launch_bounds__(THREADS) lamb_apply_##S(TensorList tl, Hyper hp, const double* lr, const double* step, const double* sq, const double* gs, const double* part) { lamb_apply_impl<T>(tl, hp, lr, step, sq, gs, part); } \
extern "C" __global__ void __launch_bounds__(THREADS) sum_squares_##S(TensorList tl, double* part) { sum_squares_impl<T>(tl, part); } \
extern "C" __global__ void __launch_bounds__(SS_THREADS) step_scalars_small_##S(TensorList tl, StepScalarArgs a) { step_scalars_small_impl<T>(tl, a); }
FOR_FLOATS(OPTIM_KERNELS)
