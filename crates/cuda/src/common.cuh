// Shared by every kernel source (prepended before NVRTC compiles it). No system headers:
// NVRTC ships without them, so half types and conversions are defined here with PTX.

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef int i32;
typedef unsigned char u8;

// IEEE half and bfloat16, stored as their bit patterns (same layout as the `half` crate).
struct __align__(2) f16 { unsigned short x; };
struct __align__(2) bf16 { unsigned short x; };

__device__ __forceinline__ float f16_to_f32(f16 h) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.x)); return f;
}
__device__ __forceinline__ f16 f32_to_f16(float f) {
    f16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.x) : "f"(f)); return h;
}
__device__ __forceinline__ f16 f64_to_f16(double f) {
    f16 h; asm("cvt.rn.f16.f64 %0, %1;" : "=h"(h.x) : "d"(f)); return h;
}
__device__ __forceinline__ float bf16_to_f32(bf16 h) {
    return __uint_as_float(((u32)h.x) << 16);
}
__device__ __forceinline__ bf16 f32_to_bf16(float f) {
    bf16 h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.x) : "f"(f)); return h;
}

// Num<T>: the type arithmetic runs in (A), and loads/stores between T and A.
// Half types compute in f32; everything else in itself.
template <typename T> struct Num {
    typedef T A;
    static __device__ __forceinline__ A load(T v) { return v; }
    static __device__ __forceinline__ T store(A v) { return v; }
};
template <> struct Num<f16> {
    typedef float A;
    static __device__ __forceinline__ float load(f16 v) { return f16_to_f32(v); }
    static __device__ __forceinline__ f16 store(float v) { return f32_to_f16(v); }
};
template <> struct Num<bf16> {
    typedef float A;
    static __device__ __forceinline__ float load(bf16 v) { return bf16_to_f32(v); }
    static __device__ __forceinline__ bf16 store(float v) { return f32_to_bf16(v); }
};

// 16 bytes of T, aligned so that one load or store moves them (ld/st.global.v4).
template <typename T> struct __align__(16) Vec16 { T v[16 / sizeof(T)]; };

template <typename T> struct IsFloat { static constexpr bool v = false; };
template <> struct IsFloat<float> { static constexpr bool v = true; };
template <> struct IsFloat<double> { static constexpr bool v = true; };
template <> struct IsFloat<f16> { static constexpr bool v = true; };
template <> struct IsFloat<bf16> { static constexpr bool v = true; };

// Rust `as` conversions from f64 / i64 (casts, fill, arange).
template <typename D> __device__ __forceinline__ D sat(double f, double lo, double hi) {
    if (f != f) return (D)0;
    if (f <= lo) return (D)lo;
    if (f >= hi) return (D)hi;
    return (D)f;
}

template <typename D> __device__ __forceinline__ D from_double(double f);
template <> __device__ __forceinline__ float from_double<float>(double f) { return (float)f; }
template <> __device__ __forceinline__ double from_double<double>(double f) { return f; }
template <> __device__ __forceinline__ f16 from_double<f16>(double f) { return f64_to_f16(f); }
template <> __device__ __forceinline__ bf16 from_double<bf16>(double f) { return f32_to_bf16((float)f); }
template <> __device__ __forceinline__ i32 from_double<i32>(double f) { return sat<i32>(f, -2147483648.0, 2147483647.0); }
template <> __device__ __forceinline__ u32 from_double<u32>(double f) { return sat<u32>(f, 0.0, 4294967295.0); }
template <> __device__ __forceinline__ u8 from_double<u8>(double f) { return sat<u8>(f, 0.0, 255.0); }
template <> __device__ __forceinline__ i64 from_double<i64>(double f) {
    if (f != f) return 0;
    if (f <= -9223372036854775808.0) return (i64)0x8000000000000000ULL;
    if (f >= 9223372036854775808.0) return 0x7fffffffffffffffLL;
    return (i64)f;
}

template <typename D> __device__ __forceinline__ D from_int(i64 i) {
    if constexpr (IsFloat<D>::v) return from_double<D>((double)i);
    else return (D)i;
}

// Math on float and double by overload (NVRTC without headers has no std::).
#define MATH1(NAME, F, D) \
    __device__ __forceinline__ float NAME(float x) { return F(x); } \
    __device__ __forceinline__ double NAME(double x) { return D(x); }
MATH1(m_exp, expf, exp)
MATH1(m_log, logf, log)
MATH1(m_sqrt, sqrtf, sqrt)
MATH1(m_sin, sinf, sin)
MATH1(m_cos, cosf, cos)
MATH1(m_tanh, tanhf, tanh)
MATH1(m_erf, erff, erf)
MATH1(m_floor, floorf, floor)
MATH1(m_ceil, ceilf, ceil)
MATH1(m_round, roundf, round)
MATH1(m_fabs, fabsf, fabs)
__device__ __forceinline__ float m_pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double m_pow(double a, double b) { return pow(a, b); }
__device__ __forceinline__ bool m_isnan(float x) { return x != x; }
__device__ __forceinline__ bool m_isnan(double x) { return x != x; }

template <typename A> __device__ __forceinline__ A neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double neg_inf<double>() { return __longlong_as_double(0xfff0000000000000ULL); }

// Strided index walk over up to MAX_DIMS dims (after the host coalesced contiguous dims),
// for up to 3 operands sharing one shape. Strides and offsets are in elements.
#define MAX_DIMS 8
struct Idx {
    u32 rank;
    u64 n;
    u64 dims[MAX_DIMS];
    i64 st[3][MAX_DIMS];
    i64 off[3];
};

template <int K>
__device__ __forceinline__ void idx_offsets(const Idx& ix, u64 i, i64* o) {
    if (ix.rank <= 1) {
        for (int k = 0; k < K; ++k) o[k] = ix.off[k] + (ix.rank ? (i64)i * ix.st[k][0] : 0);
        return;
    }
    for (int k = 0; k < K; ++k) o[k] = ix.off[k];
    if (ix.n <= 0xffffffffull) {
        // 32-bit division: a 64-bit one is a long subroutine, run per element and dim.
        u32 j = (u32)i;
        for (int d = (int)ix.rank - 1; d >= 0; --d) {
            const u32 dim = (u32)ix.dims[d];
            const u32 q = j / dim;
            const u32 r = j - q * dim;
            for (int k = 0; k < K; ++k) o[k] += (i64)r * ix.st[k][d];
            j = q;
        }
        return;
    }
    for (int d = (int)ix.rank - 1; d >= 0; --d) {
        u64 dim = ix.dims[d];
        u64 q = i / dim;
        u64 r = i - q * dim;
        for (int k = 0; k < K; ++k) o[k] += (i64)r * ix.st[k][d];
        i = q;
    }
}

// Device-side faults (bad index, integer division by zero) are recorded here, in host-mapped
// memory, and reported by the host at its next wait as an error naming the op.
struct ErrFlag {
    u32 code;   // 0: none; otherwise the fault code the host maps to an op name
    u32 pad;
    i64 a;      // e.g. the bad index
    i64 b;      // e.g. the axis size
};

__device__ __forceinline__ void raise_fault(ErrFlag* f, u32 code, i64 a, i64 b) {
    if (atomicCAS(&f->code, 0u, code) == 0u) {
        f->a = a;
        f->b = b;
        __threadfence_system();
    }
}

// Block-wide reductions over blockDim.x threads (a multiple of 32, at most 1024).
// `sh` needs 32 slots. All threads get the result.
template <typename A>
__device__ __forceinline__ A warp_sum(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
template <typename A>
__device__ __forceinline__ A warp_max(A v) {
    for (int o = 16; o > 0; o >>= 1) {
        A w = __shfl_xor_sync(0xffffffffu, v, o);
        v = (w > v || m_isnan(w)) ? w : v;
    }
    return v;
}
template <typename A>
__device__ A block_sum(A v, A* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = (threadIdx.x < (unsigned)nw) ? sh[threadIdx.x] : (A)0;
    if (w == 0) v = warp_sum(v);
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    return sh[0];
}
template <typename A>
__device__ A block_max(A v, A* sh) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    v = (threadIdx.x < (unsigned)nw) ? sh[threadIdx.x] : neg_inf<A>();
    if (w == 0) v = warp_max(v);
    if (threadIdx.x == 0) sh[0] = v;
    __syncthreads();
    return sh[0];
}

// Instantiates a template kernel body `NAME##_impl<T>` as extern "C" NAME_<dtype> for the
// float dtypes, with parameter list PARAMS(T) and argument list ARGS.
#define FOR_FLOATS(M) M(f32, float) M(f16, f16) M(bf16, bf16) M(f64, double)
#define FOR_INTS(M) M(i32, i32) M(i64, i64) M(u32, u32) M(u8, u8)
#define FOR_NUMERIC(M) FOR_FLOATS(M) FOR_INTS(M)
#define FOR_ALL(M) FOR_NUMERIC(M) M(bool, u8)
