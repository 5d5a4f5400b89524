// Ops along one axis: cumsum and sort.
//
// Rows: the host walks the shape without the axis with `rw` (an Idx; operand 0 the input,
// operand 1 the contiguous output(s), offsets included; rw.n rows). Element r of a row is at
// input offset + r * sx and output offset + r * sy.

__device__ __forceinline__ u64 gtid() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 gstride() { return (u64)gridDim.x * blockDim.x; }

// ---- cumsum ----
// Accumulates f16/bf16/f32 in f32, f64 in f64, integers in their unsigned type of at least
// their width (wrapping; truncated on store).

template <typename T> struct SumA { typedef typename Num<T>::A A; };
template <> struct SumA<i32> { typedef u32 A; };
template <> struct SumA<u32> { typedef u32 A; };
template <> struct SumA<u8> { typedef u32 A; };
template <> struct SumA<i64> { typedef u64 A; };

template <typename T> __device__ __forceinline__ typename SumA<T>::A acc_load(T v) {
    return (typename SumA<T>::A)Num<T>::load(v);
}
template <typename T> __device__ __forceinline__ T acc_store(typename SumA<T>::A a) {
    if constexpr (IsFloat<T>::v) return Num<T>::store(a);
    else return (T)a;
}

// Exclusive prefix of `v` over the block's threads in thread order, plus `carry`; adds the
// block's total to `carry`. blockDim.x a multiple of 32; every thread must call (3 barriers).
template <typename A>
__device__ __forceinline__ A block_scan_excl(A v, A* sh, A& carry) {
    u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    A incl = v;
    for (int d = 1; d < 32; d <<= 1) {
        A u = __shfl_up_sync(0xffffffffu, incl, d);
        if (lane >= (u32)d) incl = incl + u;
    }
    A excl = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) excl = (A)0;
    if (lane == 31) sh[w] = incl;
    __syncthreads();
    if (w == 0) {
        A t = lane < nw ? sh[lane] : (A)0;
        for (int d = 1; d < 32; d <<= 1) {
            A u = __shfl_up_sync(0xffffffffu, t, d);
            if (lane >= (u32)d) t = t + u;
        }
        if (lane < nw) sh[lane] = t;
    }
    __syncthreads();
    A pre = (w > 0 ? carry + sh[w - 1] : carry) + excl;
    carry = carry + sh[nw - 1];
    __syncthreads();
    return pre;
}

// Long rows are split into S chunks of `chunk` elements: a first pass (`cumsum_tot_*`) writes
// each chunk's total to `tot`, and the scan pass starts each chunk from the sum of the totals
// before it. With S == 1 there is no first pass and `tot` is unused.

// Block mode: one block (blockDim.x a multiple of 32, at most 1024) per (row, chunk) pair,
// b = row * S + c, grid-stride; tot[b].
template <typename T>
__device__ void cumsum_tot_block_impl(Idx rw, const T* __restrict__ x, u64 L, i64 sx, u64 chunk,
                                      u64 S, typename SumA<T>::A* __restrict__ tot) {
    typedef typename SumA<T>::A A;
    __shared__ A sh[32];
    for (u64 b = blockIdx.x; b < rw.n * S; b += gridDim.x) {
        u64 row = b / S, c = b - row * S;
        u64 r0 = c * chunk, r1 = r0 + chunk < L ? r0 + chunk : L;
        i64 o[2];
        idx_offsets<2>(rw, row, o);
        A v = (A)0;
#pragma unroll 4
        for (u64 r = r0 + threadIdx.x; r < r1; r += blockDim.x) v = v + acc_load(x[o[0] + (i64)r * sx]);
        v = block_sum(v, sh);
        if (threadIdx.x == 0) tot[b] = v;
    }
}

// Block mode scan: the chunk goes in steps of SCAN_K * blockDim.x elements; thread t scans
// SCAN_K consecutive ones, then thread totals are scanned across the block, carrying the
// running total to the next step. The chunk starts from the sum of tot[row * S + k], k < c.
#define SCAN_K 4
template <typename T>
__device__ void cumsum_block_impl(Idx rw, const T* __restrict__ x, T* __restrict__ y, u64 L,
                                  i64 sx, i64 sy, u64 chunk, u64 S,
                                  const typename SumA<T>::A* __restrict__ tot) {
    typedef typename SumA<T>::A A;
    __shared__ A sh[32];
    __shared__ A shc[32];
    for (u64 b = blockIdx.x; b < rw.n * S; b += gridDim.x) {
        u64 row = b / S, c = b - row * S;
        u64 r0 = c * chunk, r1 = r0 + chunk < L ? r0 + chunk : L;
        i64 o[2];
        idx_offsets<2>(rw, row, o);
        A carry = (A)0;
        if (c > 0) {
            A t = (A)0;
            for (u64 k = threadIdx.x; k < c; k += blockDim.x) t = t + tot[row * S + k];
            carry = block_sum(t, shc);
        }
        for (u64 base = r0; base < r1; base += (u64)SCAN_K * blockDim.x) {
            u64 r = base + (u64)threadIdx.x * SCAN_K;
            A v[SCAN_K];
#pragma unroll
            for (int i = 0; i < SCAN_K; ++i)
                v[i] = r + i < r1 ? acc_load(x[o[0] + (i64)(r + i) * sx]) : (A)0;
#pragma unroll
            for (int i = 1; i < SCAN_K; ++i) v[i] = v[i - 1] + v[i];
            A pre = block_scan_excl(v[SCAN_K - 1], sh, carry);
#pragma unroll
            for (int i = 0; i < SCAN_K; ++i)
                if (r + i < r1) y[o[1] + (i64)(r + i) * sy] = acc_store<T>(pre + v[i]);
        }
    }
}

// Seq mode: one thread per (chunk, row) pair, e = c * rows + row (rows fastest: consecutive
// rows are consecutive in memory when the axis is not innermost, so accesses coalesce),
// grid-stride; sequential along the chunk. tot[e].
template <typename T>
__device__ void cumsum_tot_seq_impl(Idx rw, const T* __restrict__ x, u64 L, i64 sx, u64 chunk,
                                    u64 S, typename SumA<T>::A* __restrict__ tot) {
    typedef typename SumA<T>::A A;
    for (u64 e = gtid(); e < S * rw.n; e += gstride()) {
        u64 c = e / rw.n, row = e - c * rw.n;
        u64 r0 = c * chunk, r1 = r0 + chunk < L ? r0 + chunk : L;
        i64 o[2];
        idx_offsets<2>(rw, row, o);
        A acc = (A)0;
#pragma unroll 4
        for (u64 r = r0; r < r1; ++r) acc = acc + acc_load(x[o[0] + (i64)r * sx]);
        tot[e] = acc;
    }
}

// Seq mode, second pass: tot[c * rows + row] becomes the sum of the totals of chunks k < c
// (an exclusive scan along c). One block per row, grid-stride.
template <typename A>
__device__ void cumsum_carry_impl(A* tot, u64 rows, u64 S) {
    __shared__ A sh[32];
    for (u64 row = blockIdx.x; row < rows; row += gridDim.x) {
        A carry = (A)0;
        for (u64 base = 0; base < S; base += blockDim.x) {
            u64 k = base + threadIdx.x;
            A v = k < S ? tot[k * rows + row] : (A)0;
            A pre = block_scan_excl(v, sh, carry);
            if (k < S) tot[k * rows + row] = pre;
        }
    }
}

// Seq mode scan: starts chunk c from tot[e] (the second pass's prefix) when S > 1.
template <typename T>
__device__ void cumsum_seq_impl(Idx rw, const T* __restrict__ x, T* __restrict__ y, u64 L,
                                i64 sx, i64 sy, u64 chunk, u64 S,
                                const typename SumA<T>::A* __restrict__ tot) {
    typedef typename SumA<T>::A A;
    for (u64 e = gtid(); e < S * rw.n; e += gstride()) {
        u64 c = e / rw.n, row = e - c * rw.n;
        u64 r0 = c * chunk, r1 = r0 + chunk < L ? r0 + chunk : L;
        i64 o[2];
        idx_offsets<2>(rw, row, o);
        A acc = S > 1 ? tot[e] : (A)0;
#pragma unroll 4
        for (u64 r = r0; r < r1; ++r) {
            acc = acc + acc_load(x[o[0] + (i64)r * sx]);
            y[o[1] + (i64)r * sy] = acc_store<T>(acc);
        }
    }
}

#define CUMSUM_KERNELS(S, T) \
extern "C" __global__ void cumsum_tot_block_##S(Idx rw, const T* x, u64 L, i64 sx, u64 chunk, u64 S_, typename SumA<T>::A* tot) { \
    cumsum_tot_block_impl<T>(rw, x, L, sx, chunk, S_, tot); } \
extern "C" __global__ void cumsum_block_##S(Idx rw, const T* x, T* y, u64 L, i64 sx, i64 sy, u64 chunk, u64 S_, const typename SumA<T>::A* tot) { \
    cumsum_block_impl<T>(rw, x, y, L, sx, sy, chunk, S_, tot); } \
extern "C" __global__ void cumsum_tot_seq_##S(Idx rw, const T* x, u64 L, i64 sx, u64 chunk, u64 S_, typename SumA<T>::A* tot) { \
    cumsum_tot_seq_impl<T>(rw, x, L, sx, chunk, S_, tot); } \
extern "C" __global__ void cumsum_seq_##S(Idx rw, const T* x, T* y, u64 L, i64 sx, i64 sy, u64 chunk, u64 S_, const typename SumA<T>::A* tot) { \
    cumsum_seq_impl<T>(rw, x, y, L, sx, sy, chunk, S_, tot); }
FOR_NUMERIC(CUMSUM_KERNELS)

// Named by accumulator type (`SumA<T>::A`).
extern "C" __global__ void cumsum_carry_f32(float* tot, u64 rows, u64 S) { cumsum_carry_impl<float>(tot, rows, S); }
extern "C" __global__ void cumsum_carry_f64(double* tot, u64 rows, u64 S) { cumsum_carry_impl<double>(tot, rows, S); }
extern "C" __global__ void cumsum_carry_u32(u32* tot, u64 rows, u64 S) { cumsum_carry_impl<u32>(tot, rows, S); }
extern "C" __global__ void cumsum_carry_u64(u64* tot, u64 rows, u64 S) { cumsum_carry_impl<u64>(tot, rows, S); }

// ---- sort ----
// Stable sort along the axis: each element becomes a composite (key, index) that compares as
// the pair; keys map the value order (NaN above everything, -0 equal to +0) to unsigned
// integer order and are complemented for descending order, so ties keep index order either
// way, as the CPU's stable sort does. Values are then read back from the input at the sorted
// indices (bit-exact). Composite: u64 (key << 32 | index) for dtypes up to 32 bits, K64 for
// 64-bit dtypes.

struct K64 { u64 k; u32 i; u32 pad; };

__device__ __forceinline__ bool lt(u64 a, u64 b) { return a < b; }
__device__ __forceinline__ bool lt(const K64& a, const K64& b) {
    return a.k < b.k || (a.k == b.k && a.i < b.i);
}

__device__ __forceinline__ u32 key_of(float x) {
    if (x != x) return 0xffffffffu;
    u32 b = x == 0.0f ? 0u : __float_as_uint(x);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ u32 key16(u32 h, u32 inf) {
    if ((h & 0x7fffu) > inf) return 0xffffu;
    if ((h & 0x7fffu) == 0u) h = 0u;
    return (h & 0x8000u) ? (~h & 0xffffu) : (h | 0x8000u);
}
__device__ __forceinline__ u32 key_of(f16 x) { return key16(x.x, 0x7c00u); }
__device__ __forceinline__ u32 key_of(bf16 x) { return key16(x.x, 0x7f80u); }
__device__ __forceinline__ u32 key_of(i32 x) { return (u32)x ^ 0x80000000u; }
__device__ __forceinline__ u32 key_of(u32 x) { return x; }
__device__ __forceinline__ u32 key_of(u8 x) { return x; }
__device__ __forceinline__ u64 key_of(double x) {
    if (x != x) return 0xffffffffffffffffULL;
    u64 b = x == 0.0 ? 0ULL : (u64)__double_as_longlong(x);
    return (b & 0x8000000000000000ULL) ? ~b : (b | 0x8000000000000000ULL);
}
__device__ __forceinline__ u64 key_of(i64 x) { return (u64)x ^ 0x8000000000000000ULL; }

template <typename T, bool WIDE = (sizeof(T) == 8)> struct Comp {
    typedef u64 C;
    static __device__ __forceinline__ C make(T x, u32 i, u32 desc) {
        u32 k = key_of(x);
        if (desc) k = ~k;
        return ((u64)k << 32) | i;
    }
    static __device__ __forceinline__ u32 index(C c) { return (u32)c; }
    static __device__ __forceinline__ C pad() { return 0xffffffffffffffffULL; }
};
template <typename T> struct Comp<T, true> {
    typedef K64 C;
    static __device__ __forceinline__ C make(T x, u32 i, u32 desc) {
        C c;
        c.k = key_of(x);
        if (desc) c.k = ~c.k;
        c.i = i;
        c.pad = 0u;
        return c;
    }
    static __device__ __forceinline__ u32 index(C c) { return c.i; }
    static __device__ __forceinline__ C pad() {
        C c;
        c.k = 0xffffffffffffffffULL;
        c.i = 0xffffffffu;
        c.pad = 0u;
        return c;
    }
};

// Dynamic shared memory of the sorting kernels: n composites (n a power of two).
extern __shared__ u64 sort_smem[];

// Ascending bitonic sort of s[0, n) by the whole block (n a power of two >= 2); ends with a
// barrier. Composites are distinct (indices differ; padding sits above every real one).
template <typename C>
__device__ void bitonic(C* s, u32 n) {
    for (u32 k = 2; k <= n; k <<= 1) {
        for (u32 j = k >> 1; j > 0; j >>= 1) {
            for (u32 t = threadIdx.x; t < (n >> 1); t += blockDim.x) {
                u32 i = ((t & ~(j - 1)) << 1) | (t & (j - 1));
                u32 l = i + j;
                C a = s[i], b = s[l];
                bool up = (i & k) == 0;
                if (up ? lt(b, a) : lt(a, b)) {
                    s[i] = b;
                    s[l] = a;
                }
            }
            __syncthreads();
        }
    }
}

// Rows of L <= n2 elements: one block per row (grid-stride), sorted in shared memory
// (n2 composites), outputs written directly.
template <typename T>
__device__ void sort_small_impl(Idx rw, const T* __restrict__ x, u32 L, i64 sx, i64 sy, u32 n2,
                                u32 desc, T* __restrict__ yv, u32* __restrict__ yi) {
    typedef Comp<T> P;
    typedef typename P::C C;
    C* s = (C*)sort_smem;
    for (u64 row = blockIdx.x; row < rw.n; row += gridDim.x) {
        i64 o[2];
        idx_offsets<2>(rw, row, o);
        for (u32 t = threadIdx.x; t < n2; t += blockDim.x)
            s[t] = t < L ? P::make(x[o[0] + (i64)t * sx], t, desc) : P::pad();
        __syncthreads();
        bitonic(s, n2);
        for (u32 t = threadIdx.x; t < L; t += blockDim.x) {
            u32 i = P::index(s[t]);
            yv[o[1] + (i64)t * sy] = x[o[0] + (i64)i * sx];
            yi[o[1] + (i64)t * sy] = i;
        }
        __syncthreads();
    }
}

// Long rows, first pass: tiles of `tile` elements (a power of two) sorted in shared memory,
// written as composites to buf[row * L + position]. Blocks walk (row, tile) pairs.
template <typename T>
__device__ void sort_tiles_impl(Idx rw, const T* __restrict__ x, u64 L, i64 sx, u32 tile,
                                u32 desc, void* buf) {
    typedef Comp<T> P;
    typedef typename P::C C;
    C* s = (C*)sort_smem;
    C* out = (C*)buf;
    u64 tiles = (L + tile - 1) / tile;
    for (u64 b = blockIdx.x; b < rw.n * tiles; b += gridDim.x) {
        u64 row = b / tiles, start = (b - row * tiles) * tile;
        u64 cnt = L - start < tile ? L - start : tile;
        i64 o[2];
        idx_offsets<2>(rw, row, o);
        for (u32 t = threadIdx.x; t < tile; t += blockDim.x)
            s[t] = t < cnt ? P::make(x[o[0] + (i64)(start + t) * sx], (u32)(start + t), desc)
                           : P::pad();
        __syncthreads();
        bitonic(s, tile);
        for (u32 t = threadIdx.x; t < cnt; t += blockDim.x) out[row * L + start + t] = s[t];
        __syncthreads();
    }
}

// Long rows, merge pass: sorted runs of w composites (per row of L) merged pairwise into runs
// of 2w, src -> dst. Each element's new place is its place in its run plus the number of
// elements of the partner run below it (binary search; composites are distinct).
template <typename C>
__device__ void sort_merge_impl(const C* __restrict__ src, C* __restrict__ dst, u64 rows, u64 L,
                                u64 w) {
    u64 n = rows * L;
    for (u64 e = gtid(); e < n; e += gstride()) {
        u64 row = e / L, p = e - row * L;
        const C* rs = src + row * L;
        C me = rs[p];
        u64 run = p / w, base = (run & ~1ULL) * w, lo, hi;
        if (run & 1) {
            lo = base;
            hi = base + w;
        } else {
            lo = base + w;
            hi = base + 2 * w < L ? base + 2 * w : L;
            if (lo >= L) {
                dst[e] = me;
                continue;
            }
        }
        u64 first = lo;
        while (lo < hi) {
            u64 mid = (lo + hi) >> 1;
            if (lt(rs[mid], me)) lo = mid + 1;
            else hi = mid;
        }
        dst[row * L + base + (p - run * w) + (lo - first)] = me;
    }
}

// Long rows, last pass: composites in buf to the value and index outputs.
template <typename T>
__device__ void sort_out_impl(Idx rw, const T* __restrict__ x, u64 L, i64 sx, i64 sy,
                              const void* buf, T* __restrict__ yv, u32* __restrict__ yi) {
    typedef Comp<T> P;
    typedef typename P::C C;
    const C* in = (const C*)buf;
    for (u64 e = gtid(); e < rw.n * L; e += gstride()) {
        u64 row = e / L, p = e - row * L;
        i64 o[2];
        idx_offsets<2>(rw, row, o);
        u32 i = P::index(in[e]);
        yv[o[1] + (i64)p * sy] = x[o[0] + (i64)i * sx];
        yi[o[1] + (i64)p * sy] = i;
    }
}

#define SORT_KERNELS(S, T) \
extern "C" __global__ void sort_small_##S(Idx rw, const T* x, u32 L, i64 sx, i64 sy, u32 n2, u32 desc, T* yv, u32* yi) { \
    sort_small_impl<T>(rw, x, L, sx, sy, n2, desc, yv, yi); } \
extern "C" __global__ void sort_tiles_##S(Idx rw, const T* x, u64 L, i64 sx, u32 tile, u32 desc, void* buf) { \
    sort_tiles_impl<T>(rw, x, L, sx, tile, desc, buf); } \
extern "C" __global__ void sort_out_##S(Idx rw, const T* x, u64 L, i64 sx, i64 sy, const void* buf, T* yv, u32* yi) { \
    sort_out_impl<T>(rw, x, L, sx, sy, buf, yv, yi); }
FOR_ALL(SORT_KERNELS)

extern "C" __global__ void sort_merge_c8(const u64* src, u64* dst, u64 rows, u64 L, u64 w) {
    sort_merge_impl<u64>(src, dst, rows, L, w);
}
extern "C" __global__ void sort_merge_c16(const K64* src, K64* dst, u64 rows, u64 L, u64 w) {
    sort_merge_impl<K64>(src, dst, rows, L, w);
}
