// Reductions: sum, max, min, argmax, argmin (op codes in ReduceOp order: 0..4).
//
// The host views the input as `nout` outputs, each reducing one run of R elements: output o
// starts at the storage offset the kept walk `ko` gives (an Idx over the kept dims, operand 0,
// offset included; ko.n = nout) and its elements lie at stride rs. Output y is contiguous:
// T for sum/max/min, u32 for argmax/argmin.
//
// Accumulation: f16/bf16/f32 sum in f32, f64 in f64, integers in their unsigned type of at
// least their width (wrapping; truncated on store, which equals wrapping in the dtype).
// Max/min propagate NaN; arg ops return the first index of the extreme, NaN counting as it.
//
// Split reductions (gridDim.y = S > 1): block row y handles elements [y*chunk, (y+1)*chunk)
// of every run and writes its partial state to pv/pi[y * nout + o]; reduce_fin combines them.

template <bool C, typename A, typename B> struct Pick { typedef A t; };
template <typename A, typename B> struct Pick<false, A, B> { typedef B t; };

template <typename T> struct SumA { typedef typename Num<T>::A A; };
template <> struct SumA<i32> { typedef u32 A; };
template <> struct SumA<u32> { typedef u32 A; };
template <> struct SumA<u8> { typedef u32 A; };
template <> struct SumA<i64> { typedef u64 A; };

template <typename T> struct CmpA { typedef typename Num<T>::A A; };
template <> struct CmpA<u8> { typedef u32 A; };

template <typename A> __device__ __forceinline__ A lowest();
template <> __device__ __forceinline__ float lowest<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double lowest<double>() { return __longlong_as_double(0xfff0000000000000ULL); }
template <> __device__ __forceinline__ i32 lowest<i32>() { return (i32)0x80000000; }
template <> __device__ __forceinline__ i64 lowest<i64>() { return (i64)0x8000000000000000ULL; }
template <> __device__ __forceinline__ u32 lowest<u32>() { return 0u; }

template <typename A> __device__ __forceinline__ A highest();
template <> __device__ __forceinline__ float highest<float>() { return __int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double highest<double>() { return __longlong_as_double(0x7ff0000000000000ULL); }
template <> __device__ __forceinline__ i32 highest<i32>() { return 0x7fffffff; }
template <> __device__ __forceinline__ i64 highest<i64>() { return 0x7fffffffffffffffLL; }
template <> __device__ __forceinline__ u32 highest<u32>() { return 0xffffffffu; }

template <typename A> __device__ __forceinline__ bool is_nan(A x) {
    if constexpr (IsFloat<A>::v) return x != x;
    else return false;
}

// A partial result: value and (arg ops) the index it came from; i == RED_NONE marks "no element".
#define RED_NONE 0xffffffffu
template <typename A> struct St { A v; u32 i; };

template <typename T, int OP> struct Red {
    typedef typename Pick<OP == 0, typename SumA<T>::A, typename CmpA<T>::A>::t A;
    typedef St<A> S;
    static constexpr int CODE = OP;
    static constexpr bool ARG = OP >= 3;
    static constexpr bool MIN = OP == 2 || OP == 4;

    static __device__ __forceinline__ S ident() {
        S s;
        s.i = RED_NONE;
        if constexpr (OP == 0) s.v = (A)0;
        else if constexpr (MIN) s.v = highest<A>();
        else s.v = lowest<A>();
        return s;
    }
    static __device__ __forceinline__ S leaf(T x, u32 i) {
        S s;
        s.v = (A)Num<T>::load(x);
        s.i = i;
        return s;
    }
    // Order-independent for arg ops (ties go to the lower index), so any tree shape gives the
    // CPU's answer.
    static __device__ __forceinline__ S comb(S a, S b) {
        if constexpr (OP == 0) {
            a.v = a.v + b.v;
            return a;
        } else if constexpr (!ARG) {
            if (is_nan(a.v)) return a;
            if (is_nan(b.v)) return b;
            return (MIN ? (b.v < a.v) : (b.v > a.v)) ? b : a;
        } else {
            if (b.i == RED_NONE) return a;
            if (a.i == RED_NONE) return b;
            bool an = is_nan(a.v), bn = is_nan(b.v);
            if (an || bn) {
                if (an && bn) return b.i < a.i ? b : a;
                return an ? a : b;
            }
            if (MIN ? (b.v < a.v) : (b.v > a.v)) return b;
            return (b.v == a.v && b.i < a.i) ? b : a;
        }
    }
    static __device__ __forceinline__ void store(void* y, u64 o, S s) {
        if constexpr (ARG) ((u32*)y)[o] = s.i;
        else if constexpr (IsFloat<T>::v) ((T*)y)[o] = Num<T>::store(s.v);
        else ((T*)y)[o] = (T)s.v;
    }
    // The result of output o: final (no split) or the partial of block row blockIdx.y.
    static __device__ __forceinline__ void emit(void* y, A* pv, u32* pi, u64 nout, u64 o, S s) {
        if (gridDim.y == 1) {
            store(y, o, s);
        } else {
            u64 k = (u64)blockIdx.y * nout + o;
            pv[k] = s.v;
            if constexpr (ARG) pi[k] = s.i;
        }
    }
};

template <typename A> __device__ __forceinline__ St<A> shfl_down(St<A> s, int o) {
    s.v = __shfl_down_sync(0xffffffffu, s.v, o);
    s.i = __shfl_down_sync(0xffffffffu, s.i, o);
    return s;
}

// Lane 0 gets the warp's result.
template <typename Rd> __device__ __forceinline__ typename Rd::S warp_reduce(typename Rd::S s) {
    for (int o = 16; o > 0; o >>= 1) s = Rd::comb(s, shfl_down(s, o));
    return s;
}

// Thread 0 gets the block's result (blockDim.x a multiple of 32; every thread must call).
template <typename Rd>
__device__ typename Rd::S block_reduce(typename Rd::S s, typename Rd::S* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    s = warp_reduce<Rd>(s);
    if (lane == 0) sh[w] = s;
    __syncthreads();
    if (w == 0) {
        s = lane < nw ? sh[lane] : Rd::ident();
        s = warp_reduce<Rd>(s);
    }
    __syncthreads();
    return s;
}

// Elements [r0, r1) of the contiguous run at p, read by nt threads (t = this thread's rank,
// nt >= 16 / sizeof(T)): scalar head up to 16-byte alignment, 16-byte loads (four in flight), scalar tail.
template <typename Rd, typename T>
__device__ __forceinline__ typename Rd::S range_reduce(const T* __restrict__ p, u64 r0, u64 r1,
                                                       u32 t, u32 nt) {
    constexpr u32 V = 16 / sizeof(T);
    typename Rd::S s = Rd::ident();
    u64 h = ((16 - ((u64)(p + r0) & 15)) & 15) / sizeof(T);
    if (h > r1 - r0) h = r1 - r0;
    if (t < h) s = Rd::comb(s, Rd::leaf(p[r0 + t], (u32)(r0 + t)));
    u64 a = r0 + h;
    u64 np = (r1 - a) / V;
    const Vec16<T>* qp = (const Vec16<T>*)(p + a);
    u64 k = t;
    // U 16-byte loads in flight per thread: 4 for sums (bound by bandwidth alone), 2 for the
    // compare ops (more work per element; half the code, which NVRTC compiles at first use).
    constexpr u32 U = Rd::CODE == 0 ? 4 : 2;
    for (; k + (U - 1) * (u64)nt < np; k += U * (u64)nt) {
        Vec16<T> q[U];
#pragma unroll
        for (u32 u = 0; u < U; ++u) q[u] = qp[k + u * nt];
#pragma unroll
        for (u32 u = 0; u < U; ++u) {
            u64 b = a + (k + u * nt) * V;
#pragma unroll
            for (u32 j = 0; j < V; ++j) s = Rd::comb(s, Rd::leaf(q[u].v[j], (u32)(b + j)));
        }
    }
    for (; k < np; k += nt) {
        Vec16<T> q0 = qp[k];
        u64 b = a + k * V;
#pragma unroll
        for (u32 j = 0; j < V; ++j) s = Rd::comb(s, Rd::leaf(q0.v[j], (u32)(b + j)));
    }
    u64 tail = a + np * V + t;
    if (tail < r1) s = Rd::comb(s, Rd::leaf(p[tail], (u32)tail));
    return s;
}

// Runs with rs == 1. 1-D blocks of 256 threads, grid-stride over outputs. group != 0: each
// group of `group` lanes (a power of two, 16 / sizeof(T) <= group <= 32) reduces its own
// outputs, blockDim.x / group per block; group == 0: the whole block reduces one output at a
// time.
template <typename T, int OP>
__device__ void reduce_row_impl(Idx ko, const T* __restrict__ x, u64 R, u64 chunk, u32 group,
                                void* y, void* pv, u32* pi) {
    typedef Red<T, OP> Rd;
    typedef typename Rd::S S;
    __shared__ S sh[32];
    u64 nout = ko.n;
    u64 c0 = (u64)blockIdx.y * chunk;
    u64 c1 = c0 + chunk < R ? c0 + chunk : R;
    typename Rd::A* pa = (typename Rd::A*)pv;
    if (group) {
        // Warp-uniform loop: lanes past the last output reduce nothing but join the shuffles.
        u32 lane = threadIdx.x & 31, t = lane & (group - 1);
        u64 per_warp = 32 / group, per_block = blockDim.x / group;
        u64 first = (u64)blockIdx.x * per_block + (threadIdx.x >> 5) * per_warp;
        for (u64 ob = first; ob < nout; ob += (u64)gridDim.x * per_block) {
            u64 o = ob + lane / group;
            S s = Rd::ident();
            if (o < nout) {
                i64 off[1];
                idx_offsets<1>(ko, o, off);
                s = range_reduce<Rd>(x + off[0], c0, c1, t, group);
            }
            for (u32 d = group >> 1; d > 0; d >>= 1) s = Rd::comb(s, shfl_down(s, d));
            if (t == 0 && o < nout) Rd::emit(y, pa, pi, nout, o, s);
        }
    } else {
        for (u64 o = blockIdx.x; o < nout; o += gridDim.x) {
            i64 off[1];
            idx_offsets<1>(ko, o, off);
            S s = range_reduce<Rd>(x + off[0], c0, c1, threadIdx.x, blockDim.x);
            s = block_reduce<Rd>(s, sh);
            if (threadIdx.x == 0) Rd::emit(y, pa, pi, nout, o, s);
        }
    }
}

// Runs of any stride. Block (bx, by), bx * by <= 256, both powers of two: threadIdx.x
// over bx consecutive outputs (grid-stride), threadIdx.y over the run's elements
// c0 + ty, c0 + ty + by, ...; the by partials are combined through shared memory.
template <typename T, int OP>
__device__ void reduce_col_impl(Idx ko, const T* __restrict__ x, u64 R, i64 rs, u64 chunk,
                                void* y, void* pv, u32* pi) {
    typedef Red<T, OP> Rd;
    typedef typename Rd::S S;
    __shared__ S sh[256];
    u64 nout = ko.n;
    u64 c0 = (u64)blockIdx.y * chunk;
    u64 c1 = c0 + chunk < R ? c0 + chunk : R;
    u32 tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
    typename Rd::A* pa = (typename Rd::A*)pv;
    for (u64 ob = (u64)blockIdx.x * bx; ob < nout; ob += (u64)gridDim.x * bx) {
        u64 o = ob + tx;
        S s = Rd::ident();
        if (o < nout) {
            i64 off[1];
            idx_offsets<1>(ko, o, off);
            const T* p = x + off[0];
            u64 r = c0 + ty;
            for (; r + 3 * (u64)by < c1; r += 4 * (u64)by) {
                T v0 = p[(i64)r * rs], v1 = p[(i64)(r + by) * rs];
                T v2 = p[(i64)(r + 2 * by) * rs], v3 = p[(i64)(r + 3 * by) * rs];
                s = Rd::comb(s, Rd::leaf(v0, (u32)r));
                s = Rd::comb(s, Rd::leaf(v1, (u32)(r + by)));
                s = Rd::comb(s, Rd::leaf(v2, (u32)(r + 2 * by)));
                s = Rd::comb(s, Rd::leaf(v3, (u32)(r + 3 * by)));
            }
            for (; r < c1; r += by) s = Rd::comb(s, Rd::leaf(p[(i64)r * rs], (u32)r));
        }
        if (by > 1) {
            sh[ty * bx + tx] = s;
            __syncthreads();
            for (u32 hlf = by >> 1; hlf > 0; hlf >>= 1) {
                if (ty < hlf) {
                    s = Rd::comb(s, sh[(ty + hlf) * bx + tx]);
                    sh[ty * bx + tx] = s;
                }
                __syncthreads();
            }
        }
        if (ty == 0 && o < nout) Rd::emit(y, pa, pi, nout, o, s);
    }
}

// Second pass of a split reduction: y[o] from the S partials pv/pi[k * nout + o]. One block
// (blockDim.x a multiple of 32) per output, grid-stride.
template <typename T, int OP>
__device__ void reduce_fin_impl(u64 nout, u64 S, const void* pv, const u32* pi, void* y) {
    typedef Red<T, OP> Rd;
    typedef typename Rd::S St_;
    __shared__ St_ sh[32];
    const typename Rd::A* pa = (const typename Rd::A*)pv;
    for (u64 o = blockIdx.x; o < nout; o += gridDim.x) {
        St_ s = Rd::ident();
        for (u64 k = threadIdx.x; k < S; k += blockDim.x) {
            St_ e;
            e.v = pa[k * nout + o];
            e.i = 0u;
            if constexpr (Rd::ARG) e.i = pi[k * nout + o];
            s = Rd::comb(s, e);
        }
        s = block_reduce<Rd>(s, sh);
        if (threadIdx.x == 0) Rd::store(y, o, s);
    }
}

#define RED_OP(S, T, NAME, OP) \
extern "C" __global__ void reduce_row_##NAME##_##S(Idx ko, const T* x, u64 R, u64 chunk, u32 group, void* y, void* pv, u32* pi) { \
    reduce_row_impl<T, OP>(ko, x, R, chunk, group, y, pv, pi); } \
extern "C" __global__ void reduce_col_##NAME##_##S(Idx ko, const T* x, u64 R, i64 rs, u64 chunk, void* y, void* pv, u32* pi) { \
    reduce_col_impl<T, OP>(ko, x, R, rs, chunk, y, pv, pi); } \
extern "C" __global__ void reduce_fin_##NAME##_##S(u64 nout, u64 S_, const void* pv, const u32* pi, void* y) { \
    reduce_fin_impl<T, OP>(nout, S_, pv, pi, y); }
#define RED_KERNELS(S, T) \
    RED_OP(S, T, sum, 0) RED_OP(S, T, max, 1) RED_OP(S, T, min, 2) RED_OP(S, T, argmax, 3) RED_OP(S, T, argmin, 4)
FOR_NUMERIC(RED_KERNELS)

// Float sums over runs of stride rs whose nout outputs are contiguous from x (a bias
// gradient: the rows of [R, nout] summed): a thread sums V = 16 / sizeof(T) consecutive
// outputs with 16-byte loads (x 16-byte aligned, rs and nout multiples of V). Block (bx, by),
// bx * by <= 256, both powers of two: threadIdx.x over packs of outputs, threadIdx.y over the
// run (elements c0 + ty, c0 + ty + by, ...), the by partials combined by a tree in shared
// memory; split runs (gridDim.y > 1) write f32 partials for reduce_fin as reduce_col does.
// With O not void (`reduce_colv_cast`), each word read is also written to xc converted to O
// (rows of nout, contiguous): a cast and the column sums in one pass over x.
template <typename O, int V> struct __align__(sizeof(O) * V) VecN { O v[V]; };
template <typename X> struct IsVoid { static constexpr bool v = false; };
template <> struct IsVoid<void> { static constexpr bool v = true; };
template <typename T, typename O = void>
__device__ void reduce_colv_impl(u64 nout, const T* __restrict__ x, u64 R, u64 rs, u64 chunk, T* y, float* pv, O* xc = nullptr) {
    constexpr int V = 16 / sizeof(T);
    __shared__ float sh[256 * V];
    const u64 c0 = (u64)blockIdx.y * chunk;
    const u64 c1 = c0 + chunk < R ? c0 + chunk : R;
    const u32 tx = threadIdx.x, ty = threadIdx.y, bx = blockDim.x, by = blockDim.y;
    const u64 np = nout / V;
    for (u64 pb = (u64)blockIdx.x * bx; pb < np; pb += (u64)gridDim.x * bx) {
        const u64 p = pb + tx;
        float s[V];
#pragma unroll
        for (int v = 0; v < V; ++v) s[v] = 0.f;
        if (p < np) {
            const T* q = x + p * V;
            u64 r = c0 + ty;
            for (; r + 3 * (u64)by < c1; r += 4 * (u64)by) {
                Vec16<T> a[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) a[u] = *(const Vec16<T>*)(q + (r + u * (u64)by) * rs);
#pragma unroll
                for (int u = 0; u < 4; ++u)
#pragma unroll
                    for (int v = 0; v < V; ++v) s[v] += (float)Num<T>::load(a[u].v[v]);
                if constexpr (!IsVoid<O>::v) {
#pragma unroll
                    for (int u = 0; u < 4; ++u) {
                        VecN<O, V> c;
#pragma unroll
                        for (int v = 0; v < V; ++v) c.v[v] = Num<O>::store((float)Num<T>::load(a[u].v[v]));
                        *(VecN<O, V>*)(xc + (r + u * (u64)by) * nout + p * V) = c;
                    }
                }
            }
            for (; r < c1; r += by) {
                const Vec16<T> a = *(const Vec16<T>*)(q + r * rs);
#pragma unroll
                for (int v = 0; v < V; ++v) s[v] += (float)Num<T>::load(a.v[v]);
                if constexpr (!IsVoid<O>::v) {
                    VecN<O, V> c;
#pragma unroll
                    for (int v = 0; v < V; ++v) c.v[v] = Num<O>::store((float)Num<T>::load(a.v[v]));
                    *(VecN<O, V>*)(xc + r * nout + p * V) = c;
                }
            }
        }
        if (by > 1) {
            // A tree over ty (by is a power of two): log2(by) rounds.
#pragma unroll
            for (int v = 0; v < V; ++v) sh[(ty * bx + tx) * V + v] = s[v];
            __syncthreads();
            for (u32 h = by >> 1; h > 0; h >>= 1) {
                if (ty < h) {
#pragma unroll
                    for (int v = 0; v < V; ++v) {
                        s[v] += sh[((ty + h) * bx + tx) * V + v];
                        sh[(ty * bx + tx) * V + v] = s[v];
                    }
                }
                __syncthreads();
            }
        }
        if (ty == 0 && p < np) {
#pragma unroll
            for (int v = 0; v < V; ++v) {
                if (gridDim.y == 1) y[p * V + v] = Num<T>::store(s[v]);
                else pv[(u64)blockIdx.y * nout + p * V + v] = s[v];
            }
        }
    }
}

#define COLV(S, T) \
extern "C" __global__ void __launch_bounds__(256) reduce_colv_sum_##S(u64 nout, const T* x, u64 R, u64 rs, u64 chunk, T* y, float* pv) { \
    reduce_colv_impl<T>(nout, x, R, rs, chunk, y, pv); }
COLV(f32, float) COLV(f16, f16) COLV(bf16, bf16)
// An f32 matrix's column sums and its copy in a 16-bit type (`Op::CastColSums`).
#define COLV_CAST(S, O) \
extern "C" __global__ void __launch_bounds__(256) reduce_colv_cast_sum_f32_##S(u64 nout, const float* x, u64 R, u64 rs, u64 chunk, float* y, float* pv, O* xc) { \
    reduce_colv_impl<float, O>(nout, x, R, rs, chunk, y, pv, xc); }
COLV_CAST(f16, f16) COLV_CAST(bf16, bf16)
