// Elementwise ops: unary, binary, comparisons, where, strided copy.
// `_c` kernels: contiguous operands, n elements, 16-byte vector loads when every pointer is
// 16-byte aligned (grid-stride over packs, scalar tail). `_s` kernels: strided operands
// described by an Idx (output contiguous, one thread per element, grid-stride). `binary_r`: one
// operand contiguous, the other one row of m elements repeated over the rows (a bias added to
// every row), vector loads when m is a multiple of the pack and every pointer is aligned.
// `binary_k`: one operand contiguous, the other one value per run of consecutive elements (a
// per-channel bias over [n, c, h, w]).
// Op codes follow the order of UnaryOp::ALL / BinaryOp::ALL / CmpOp::ALL in ferrite-core.

template <typename T> struct Uns { typedef T t; };
template <> struct Uns<i32> { typedef u32 t; };
template <> struct Uns<i64> { typedef u64 t; };

template <typename T> __device__ __forceinline__ T wadd(T a, T b) { typedef typename Uns<T>::t U; return (T)((U)a + (U)b); }
template <typename T> __device__ __forceinline__ T wsub(T a, T b) { typedef typename Uns<T>::t U; return (T)((U)a - (U)b); }
template <typename T> __device__ __forceinline__ T wmul(T a, T b) { typedef typename Uns<T>::t U; return (T)((U)a * (U)b); }
template <typename T> __device__ __forceinline__ T wneg(T a) { typedef typename Uns<T>::t U; return (T)((U)0 - (U)a); }

template <typename A> __device__ __forceinline__ A unary_float(u32 op, A x) {
    const A one = (A)1, zero = (A)0;
    switch (op) {
    case 0: return -x;                                   // neg
    case 1: return m_fabs(x);                            // abs
    case 2: return x > zero ? one : (x < zero ? -one : x * zero); // sign (NaN, ±0 kept)
    case 3: return m_exp(x);
    case 4: return m_log(x);
    case 5: return m_sqrt(x);
    case 6: return one / m_sqrt(x);                      // rsqrt
    case 7: return one / x;                              // recip
    case 8: return x * x;                                // square
    case 9: return m_sin(x);
    case 10: return m_cos(x);
    case 11: return m_tanh(x);
    case 12: return one / (one + m_exp(-x));             // sigmoid
    case 13: return x > zero ? x : zero;                 // relu
    case 14: return (A)0.5 * x * (one + m_erf(x * (A)0.70710678118654752440)); // gelu (erf)
    case 15: {                                           // gelu (tanh)
        const A c = (A)0.79788456080286535588, k = (A)0.044715;
        return (A)0.5 * x * (one + m_tanh(c * (x + k * x * x * x)));
    }
    case 16: return x / (one + m_exp(-x));               // silu
    case 17: return m_floor(x);
    case 18: return m_ceil(x);
    case 19: return m_round(x);                          // half away from zero
    }
    return x;
}

template <typename I> __device__ __forceinline__ I unary_int(u32 op, I x) {
    const I zero = (I)0;
    switch (op) {
    case 0: return wneg(x);
    case 1: return x < zero ? wneg(x) : x;
    case 2: return x > zero ? (I)1 : (x < zero ? wneg((I)1) : zero);
    case 8: return wmul(x, x);
    case 13: return x > zero ? x : zero;
    }
    return x;                                            // floor, ceil, round
}

template <typename T> __device__ __forceinline__ T unary_apply(u32 op, T v) {
    if constexpr (IsFloat<T>::v) {
        return Num<T>::store(unary_float(op, Num<T>::load(v)));
    } else {
        return unary_int(op, v);
    }
}

template <typename T> __device__ __forceinline__ T binary_apply(u32 op, T a, T b, ErrFlag* err) {
    if constexpr (IsFloat<T>::v) {
        typedef typename Num<T>::A A;
        A x = Num<T>::load(a), y = Num<T>::load(b), r;
        switch (op) {
        case 0: r = x + y; break;
        case 1: r = x - y; break;
        case 2: r = x * y; break;
        case 3: r = x / y; break;
        case 4: r = m_pow(x, y); break;
        case 5: r = (m_isnan(x) || x > y) ? x : y; break;   // maximum, NaN-propagating
        case 6: r = (m_isnan(x) || x < y) ? x : y; break;   // minimum
        case 7: {                                           // gelu_backward (x, g)
            const A cdf = (A)0.5 * ((A)1 + m_erf(x * (A)0.70710678118654752440));
            const A pdf = m_exp((A)-0.5 * x * x) * (A)0.39894228040143267794;
            r = y * (cdf + x * pdf);
            break;
        }
        case 8: {                                           // gelu_tanh_backward (x, g)
            const A c = (A)0.79788456080286535588, k = (A)0.044715, one = (A)1, h = (A)0.5;
            const A t = m_tanh(c * (x + k * x * x * x));
            r = y * (h * (one + t) + h * x * (one - t * t) * c * (one + (A)3 * k * x * x));
            break;
        }
        case 9: {                                           // silu_backward (x, g)
            const A s = (A)1 / ((A)1 + m_exp(-x));
            r = y * s * ((A)1 + x * ((A)1 - s));
            break;
        }
        default: r = x > (A)0 ? y : (A)0; break;            // relu_backward (x, g)
        }
        return Num<T>::store(r);
    } else {
        switch (op) {
        case 0: return wadd(a, b);
        case 1: return wsub(a, b);
        case 2: return wmul(a, b);
        case 3:
            if (b == (T)0) { raise_fault(err, 4, 0, 0); return (T)0; }
            if constexpr ((T)-1 < (T)0) { if (b == (T)-1) return wneg(a); }
            return a / b;
        case 5: return a > b ? a : b;
        case 6: return a < b ? a : b;
        }
        return a;
    }
}

template <typename T> __device__ __forceinline__ u8 cmp_apply(u32 op, T a, T b) {
    typedef typename Num<T>::A A;
    A x = Num<T>::load(a), y = Num<T>::load(b);
    switch (op) {
    case 0: return x == y;
    case 1: return x != y;
    case 2: return x < y;
    case 3: return x <= y;
    case 4: return x > y;
    }
    return x >= y;
}

template <typename T, int V> struct __align__(16) Pack { T v[V]; };

__device__ __forceinline__ bool aligned16(const void* p) { return (((u64)p) & 15) == 0; }

__device__ __forceinline__ u64 gtid() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 gstride() { return (u64)gridDim.x * blockDim.x; }

// The op of a `_c`/`_r` loop: a compile-time constant (`OpK`, so the op's switch folds away
// for the transcendental activations, whose per-element branch would cost as much as their
// math) or the kernel's argument (`OpV`).
template <u32 K> struct OpK { static constexpr u32 v = K; };
struct OpV { u32 v; };

template <typename T, typename O>
__device__ __forceinline__ void unary_c_loop(O op, u64 n, const T* x, T* y) {
    constexpr int V = 16 / sizeof(T);
    u64 start = 0;
    if (aligned16(x) && aligned16(y)) {
        u64 np = n / V;
        const Pack<T, V>* xp = (const Pack<T, V>*)x;
        Pack<T, V>* yp = (Pack<T, V>*)y;
        for (u64 i = gtid(); i < np; i += gstride()) {
            Pack<T, V> p = xp[i];
#pragma unroll
            for (int j = 0; j < V; ++j) p.v[j] = unary_apply(op.v, p.v[j]);
            yp[i] = p;
        }
        start = np * V;
    }
    for (u64 i = start + gtid(); i < n; i += gstride()) y[i] = unary_apply(op.v, x[i]);
}

template <typename T>
__device__ void unary_c_impl(u32 op, u64 n, const T* x, T* y) {
    if constexpr (IsFloat<T>::v) {
        switch (op) {
        case 14: unary_c_loop(OpK<14>(), n, x, y); return;   // gelu
        case 15: unary_c_loop(OpK<15>(), n, x, y); return;   // gelu_tanh
        case 16: unary_c_loop(OpK<16>(), n, x, y); return;   // silu
        }
    }
    unary_c_loop(OpV{op}, n, x, y);
}

template <typename T>
__device__ void unary_s_impl(u32 op, Idx ix, const T* x, T* y) {
    for (u64 i = gtid(); i < ix.n; i += gstride()) {
        i64 o[1];
        idx_offsets<1>(ix, i, o);
        y[i] = unary_apply(op, x[o[0]]);
    }
}

template <typename T, typename O>
__device__ __forceinline__ void binary_c_loop(O op, u64 n, const T* a, const T* b, T* y, ErrFlag* err) {
    constexpr int V = 16 / sizeof(T);
    u64 start = 0;
    if (aligned16(a) && aligned16(b) && aligned16(y)) {
        u64 np = n / V;
        const Pack<T, V>* ap = (const Pack<T, V>*)a;
        const Pack<T, V>* bp = (const Pack<T, V>*)b;
        Pack<T, V>* yp = (Pack<T, V>*)y;
        for (u64 i = gtid(); i < np; i += gstride()) {
            Pack<T, V> p = ap[i], q = bp[i];
#pragma unroll
            for (int j = 0; j < V; ++j) p.v[j] = binary_apply(op.v, p.v[j], q.v[j], err);
            yp[i] = p;
        }
        start = np * V;
    }
    for (u64 i = start + gtid(); i < n; i += gstride()) y[i] = binary_apply(op.v, a[i], b[i], err);
}

template <typename T>
__device__ void binary_c_impl(u32 op, u64 n, const T* a, const T* b, T* y, ErrFlag* err) {
    if constexpr (IsFloat<T>::v) {
        switch (op) {
        case 0: binary_c_loop(OpK<0>(), n, a, b, y, err); return;   // add
        case 7: binary_c_loop(OpK<7>(), n, a, b, y, err); return;   // gelu_backward
        case 8: binary_c_loop(OpK<8>(), n, a, b, y, err); return;   // gelu_tanh_backward
        case 9: binary_c_loop(OpK<9>(), n, a, b, y, err); return;   // silu_backward
        }
    }
    binary_c_loop(OpV{op}, n, a, b, y, err);
}

template <typename T>
__device__ void binary_s_impl(u32 op, Idx ix, const T* a, const T* b, T* y, ErrFlag* err) {
    for (u64 i = gtid(); i < ix.n; i += gstride()) {
        i64 o[2];
        idx_offsets<2>(ix, i, o);
        y[i] = binary_apply(op, a[o[0]], b[o[1]], err);
    }
}

// y[i] = a[i] op row[i % m] (row_b) or row[i % m] op b[i] (!row_b), i < n (a multiple of m).
template <typename T, typename O>
__device__ __forceinline__ void binary_r_loop(O op, u64 n, u64 m, const T* a, const T* b, T* y, u32 row_b, ErrFlag* err) {
    constexpr int V = 16 / sizeof(T);
    const T* full = row_b ? a : b;
    const T* row = row_b ? b : a;
    if (m % V == 0 && aligned16(a) && aligned16(b) && aligned16(y)) {
        const u64 np = n / V, mp = m / V;
        const Pack<T, V>* fp = (const Pack<T, V>*)full;
        const Pack<T, V>* rp = (const Pack<T, V>*)row;
        Pack<T, V>* yp = (Pack<T, V>*)y;
        // i % mp kept incrementally: the grid-stride step is fixed, and a 64-bit remainder
        // per pack would cost more than the pack's memory traffic.
        const u64 step = gstride() % mp;
        u64 k = gtid() % mp;
        for (u64 i = gtid(); i < np; i += gstride()) {
            Pack<T, V> f = fp[i];
            const Pack<T, V> r = rp[k];
            k += step;
            if (k >= mp) k -= mp;
#pragma unroll
            for (int j = 0; j < V; ++j)
                f.v[j] = row_b ? binary_apply(op.v, f.v[j], r.v[j], err) : binary_apply(op.v, r.v[j], f.v[j], err);
            yp[i] = f;
        }
        return;
    }
    const u64 step = gstride() % m;
    u64 k = gtid() % m;
    for (u64 i = gtid(); i < n; i += gstride()) {
        const T r = row[k];
        k += step;
        if (k >= m) k -= m;
        y[i] = row_b ? binary_apply(op.v, full[i], r, err) : binary_apply(op.v, r, full[i], err);
    }
}

template <typename T>
__device__ void binary_r_impl(u32 op, u64 n, u64 m, const T* a, const T* b, T* y, u32 row_b, ErrFlag* err) {
    if (IsFloat<T>::v && op == 0) binary_r_loop(OpK<0>(), n, m, a, b, y, row_b, err);   // a bias added
    else binary_r_loop(OpV{op}, n, m, a, b, y, row_b, err);
}

// binary_k: one operand contiguous, the other one value per run of `inner` consecutive
// elements, the values cycling with period m (a per-channel bias over [n, c, h, w]: m = c,
// inner = h w); vector loads when inner is a multiple of the pack and the pointers are aligned.
template <typename T>
__device__ void binary_k_impl(u32 op, u64 n, u64 m, u64 inner, const T* a, const T* b, T* y, u32 col_b, ErrFlag* err) {
    constexpr int V = 16 / sizeof(T);
    const T* full = col_b ? a : b;
    const T* col = col_b ? b : a;
    if (inner % V == 0 && aligned16(full) && aligned16(y)) {
        const u64 np = n / V, ip = inner / V;
        const Pack<T, V>* fp = (const Pack<T, V>*)full;
        Pack<T, V>* yp = (Pack<T, V>*)y;
        for (u64 i = gtid(); i < np; i += gstride()) {
            Pack<T, V> f = fp[i];
            const T c = col[np <= 0xffffffffull ? ((u32)i / (u32)ip) % (u32)m : (i / ip) % m];
#pragma unroll
            for (int j = 0; j < V; ++j)
                f.v[j] = col_b ? binary_apply(op, f.v[j], c, err) : binary_apply(op, c, f.v[j], err);
            yp[i] = f;
        }
        return;
    }
    for (u64 i = gtid(); i < n; i += gstride()) {
        const T c = col[n <= 0xffffffffull ? ((u32)i / (u32)inner) % (u32)m : (i / inner) % m];
        y[i] = col_b ? binary_apply(op, full[i], c, err) : binary_apply(op, c, full[i], err);
    }
}

template <typename T>
__device__ void cmp_s_impl(u32 op, Idx ix, const T* a, const T* b, u8* y) {
    for (u64 i = gtid(); i < ix.n; i += gstride()) {
        i64 o[2];
        idx_offsets<2>(ix, i, o);
        y[i] = cmp_apply(op, a[o[0]], b[o[1]]);
    }
}

#define EW_KERNELS(S, T) \
extern "C" __global__ void unary_c_##S(u32 op, u64 n, const T* x, T* y) { unary_c_impl<T>(op, n, x, y); } \
extern "C" __global__ void unary_s_##S(u32 op, Idx ix, const T* x, T* y) { unary_s_impl<T>(op, ix, x, y); } \
extern "C" __global__ void binary_c_##S(u32 op, u64 n, const T* a, const T* b, T* y, ErrFlag* err) { binary_c_impl<T>(op, n, a, b, y, err); } \
extern "C" __global__ void binary_s_##S(u32 op, Idx ix, const T* a, const T* b, T* y, ErrFlag* err) { binary_s_impl<T>(op, ix, a, b, y, err); } \
extern "C" __global__ void binary_r_##S(u32 op, u64 n, u64 m, const T* a, const T* b, T* y, u32 row_b, ErrFlag* err) { binary_r_impl<T>(op, n, m, a, b, y, row_b, err); } \
extern "C" __global__ void binary_k_##S(u32 op, u64 n, u64 m, u64 inner, const T* a, const T* b, T* y, u32 col_b, ErrFlag* err) { binary_k_impl<T>(op, n, m, inner, a, b, y, col_b, err); }
FOR_NUMERIC(EW_KERNELS)

#define CMP_KERNELS(S, T) \
extern "C" __global__ void cmp_s_##S(u32 op, Idx ix, const T* a, const T* b, u8* y) { cmp_s_impl<T>(op, ix, a, b, y); }
FOR_ALL(CMP_KERNELS)

// Dtype-agnostic moves, by element size.
template <typename W>
__device__ void copy_s_impl(Idx ix, const W* x, W* y) {
    for (u64 i = gtid(); i < ix.n; i += gstride()) {
        i64 o[1];
        idx_offsets<1>(ix, i, o);
        y[i] = x[o[0]];
    }
}

template <typename W>
__device__ void where_s_impl(Idx ix, const u8* c, const W* a, const W* b, W* y) {
    for (u64 i = gtid(); i < ix.n; i += gstride()) {
        i64 o[3];
        idx_offsets<3>(ix, i, o);
        y[i] = c[o[0]] ? a[o[1]] : b[o[2]];
    }
}

#define MOVE_KERNELS(S, W) \
extern "C" __global__ void copy_s_##S(Idx ix, const W* x, W* y) { copy_s_impl<W>(ix, x, y); } \
extern "C" __global__ void where_s_##S(Idx ix, const u8* c, const W* a, const W* b, W* y) { where_s_impl<W>(ix, c, a, b, y); }
MOVE_KERNELS(b1, u8)
MOVE_KERNELS(b2, unsigned short)
MOVE_KERNELS(b4, u32)
MOVE_KERNELS(b8, u64)
// 16-byte units: copies whose innermost dim is contiguous and 16-byte aligned (Idx::in_packs).
MOVE_KERNELS(b16, uint4)
