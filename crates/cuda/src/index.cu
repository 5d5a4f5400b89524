// Index ops: index_select, gather, scatter_add, cat. Outputs are contiguous; every other
// operand is strided (offsets in elements, inside the Idx or added by the host). Index values
// of any integer dtype are checked on the device: an index outside [0, size) is never read
// through; it raises a fault (reported by the host at its next wait) and yields 0 (skipped for
// scatter_add). Kernels that only move data are instantiated by word size (1 to 16 bytes; the
// host moves contiguous rows as wider words when sizes and offsets allow).

__device__ __forceinline__ u64 gtid() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 gstride() { return (u64)gridDim.x * blockDim.x; }

// Fault codes (device.rs `fault`).
#define FAULT_INDEX_SELECT 1u
#define FAULT_GATHER 2u
#define FAULT_SCATTER_ADD 3u

// y [outer, n, inner] (the output's shape, row-major). `xw` walks the output's shape with x's
// strides, 0 along the axis (x's offset included); element e takes index j = (e / inner) % n,
// idx[j * ist] (idx points at its first element), and reads x[xw(e) + idx[j] * sa].
template <typename W, typename I>
__device__ void index_select_impl(Idx xw, const W* __restrict__ x, const I* __restrict__ idx,
                                  i64 ist, u64 n, u64 inner, i64 sa, i64 size, W* __restrict__ y,
                                  ErrFlag* err) {
    for (u64 e = gtid(); e < xw.n; e += gstride()) {
        u64 j = (e / inner) % n;
        i64 v = (i64)idx[(i64)j * ist];
        if (v < 0 || v >= size) {
            raise_fault(err, FAULT_INDEX_SELECT, v, size);
            y[e] = W{};
            continue;
        }
        i64 o[1];
        idx_offsets<1>(xw, e, o);
        y[e] = x[o[0] + v * sa];
    }
}

// y has the index's shape. `w` walks it with operand 0 x's strides (0 along the axis, x's
// offset included) and operand 1 the index's strides (its offset included).
template <typename W, typename I>
__device__ void gather_impl(Idx w, const W* __restrict__ x, const I* __restrict__ idx, i64 sa,
                            i64 size, W* __restrict__ y, ErrFlag* err) {
    for (u64 e = gtid(); e < w.n; e += gstride()) {
        i64 o[2];
        idx_offsets<2>(w, e, o);
        i64 v = (i64)idx[o[1]];
        if (v < 0 || v >= size) {
            raise_fault(err, FAULT_GATHER, v, size);
            y[e] = W{};
            continue;
        }
        y[e] = x[o[0] + v * sa];
    }
}

// Wrapping integer adds and float adds; f16/bf16 and u8 through a CAS loop on the containing
// 32-bit word (the allocator rounds buffers to 512 bytes, so the word is always in bounds).
__device__ __forceinline__ void atomic_add(float* p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double* p, double v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(u32* p, u32 v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(i32* p, i32 v) { atomicAdd((u32*)p, (u32)v); }
__device__ __forceinline__ void atomic_add(i64* p, i64 v) { atomicAdd((u64*)p, (u64)v); }

template <typename F>
__device__ __forceinline__ void cas_word(void* p, u32 bits, F f) {
    u32* wp = (u32*)((u64)p & ~3ULL);
    u32 sh = (u32)((u64)p & 3ULL) * 8u;
    u32 mask = ((1u << bits) - 1u) << sh;
    u32 old = *wp, assumed;
    do {
        assumed = old;
        u32 cur = (assumed & mask) >> sh;
        u32 nw = (assumed & ~mask) | ((f(cur) << sh) & mask);
        old = atomicCAS(wp, assumed, nw);
    } while (old != assumed);
}
__device__ __forceinline__ void atomic_add(u8* p, u8 v) {
    cas_word(p, 8, [v](u32 c) { return (c + (u32)v) & 0xffu; });
}
__device__ __forceinline__ void atomic_add(f16* p, f16 v) {
    cas_word(p, 16, [v](u32 c) {
        f16 h;
        h.x = (unsigned short)c;
        return (u32)f32_to_f16(f16_to_f32(h) + f16_to_f32(v)).x;
    });
}
__device__ __forceinline__ void atomic_add(bf16* p, bf16 v) {
    cas_word(p, 16, [v](u32 c) {
        bf16 h;
        h.x = (unsigned short)c;
        return (u32)f32_to_bf16(bf16_to_f32(h) + bf16_to_f32(v)).x;
    });
}

// y (contiguous, base's shape) already holds base. `w` walks the index's shape with operand 0
// y's strides (0 along the axis), 1 the index's and 2 src's strides (offsets included).
template <typename T, typename I>
__device__ void scatter_add_impl(Idx w, T* y, const I* __restrict__ idx,
                                 const T* __restrict__ src, i64 sa, i64 size, ErrFlag* err) {
    for (u64 e = gtid(); e < w.n; e += gstride()) {
        i64 o[3];
        idx_offsets<3>(w, e, o);
        i64 v = (i64)idx[o[1]];
        if (v < 0 || v >= size) {
            raise_fault(err, FAULT_SCATTER_ADD, v, size);
            continue;
        }
        atomic_add(y + o[0] + v * sa, src[o[2]]);
    }
}

// cat: up to CAT_MAX inputs copied into their slabs of y in one launch. Input p covers
// elements [end[p - 1], end[p]) of the launch (end[-1] = 0); `w[p]` walks its shape with
// operand 0 its strides and operand 1 y's strides (offset of the slab included).
#define CAT_MAX 8
struct CatArgs {
    Idx w[CAT_MAX];
    u64 x[CAT_MAX];
    u64 end[CAT_MAX];
    u32 count;
};
template <typename W>
__device__ void cat_copy_impl(const CatArgs& a, W* __restrict__ y) {
    const u64 n = a.end[a.count - 1];
    for (u64 e = gtid(); e < n; e += gstride()) {
        u32 p = 0;
        while (e >= a.end[p]) ++p;
        i64 o[2];
        idx_offsets<2>(a.w[p], e - (p ? a.end[p - 1] : 0), o);
        y[o[1]] = ((const W*)a.x[p])[o[0]];
    }
}
#define MOVE_BY_INDEX(S, W, IS, I) \
extern "C" __global__ void index_select_##S##_##IS(Idx xw, const W* x, const I* idx, i64 ist, u64 n, u64 inner, i64 sa, i64 size, W* y, ErrFlag* err) { \
    index_select_impl<W, I>(xw, x, idx, ist, n, inner, sa, size, y, err); } \
extern "C" __global__ void gather_##S##_##IS(Idx w, const W* x, const I* idx, i64 sa, i64 size, W* y, ErrFlag* err) { \
    gather_impl<W, I>(w, x, idx, sa, size, y, err); }
#define MOVE_BY_WIDTH(S, W) \
MOVE_BY_INDEX(S, W, i32, i32) MOVE_BY_INDEX(S, W, i64, i64) MOVE_BY_INDEX(S, W, u32, u32) MOVE_BY_INDEX(S, W, u8, u8) \
extern "C" __global__ void cat_copy_##S(const CatArgs a, W* y) { cat_copy_impl<W>(a, y); }
MOVE_BY_WIDTH(b1, u8)
MOVE_BY_WIDTH(b2, unsigned short)
MOVE_BY_WIDTH(b4, u32)
MOVE_BY_WIDTH(b8, u64)
MOVE_BY_WIDTH(b16, uint4)

#define SCATTER_BY_INDEX(S, T, IS, I) \
extern "C" __global__ void scatter_add_##S##_##IS(Idx w, T* y, const I* idx, const T* src, i64 sa, i64 size, ErrFlag* err) { \
    scatter_add_impl<T, I>(w, y, idx, src, sa, size, err); }
#define SCATTER_KERNELS(S, T) \
SCATTER_BY_INDEX(S, T, i32, i32) SCATTER_BY_INDEX(S, T, i64, i64) SCATTER_BY_INDEX(S, T, u32, u32) SCATTER_BY_INDEX(S, T, u8, u8)
FOR_NUMERIC(SCATTER_KERNELS)
