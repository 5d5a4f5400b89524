// cast: every dtype pair, with Rust `as` semantics (ferrite-cpu cast.rs): floats go through
// f64, integers through i64; float to int truncates toward zero, saturates, NaN gives 0;
// int to narrower int wraps; nonzero gives true. Input strided (Idx), output contiguous.
// `cast_c`: contiguous input between f32, f16 and bf16, 8 elements a step (the same
// round-to-nearest-even conversions as through f64: every f16 and bf16 value is an f32).

template <typename S, typename D, bool TO_BOOL>
__device__ void cast_impl(Idx ix, const S* x, D* y) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < ix.n; i += (u64)gridDim.x * blockDim.x) {
        i64 o[1];
        idx_offsets<1>(ix, i, o);
        S v = x[o[0]];
        if constexpr (IsFloat<S>::v) {
            double f = (double)Num<S>::load(v);
            if constexpr (TO_BOOL) y[i] = (D)(f != 0.0);
            else y[i] = from_double<D>(f);
        } else {
            i64 k = (i64)v;
            if constexpr (TO_BOOL) y[i] = (D)(k != 0);
            else y[i] = from_int<D>(k);
        }
    }
}

#define CAST_TO(S, ST, D, DT) \
extern "C" __global__ void cast_##S##_##D(Idx ix, const ST* x, DT* y) { cast_impl<ST, DT, false>(ix, x, y); }
#define CAST_FROM(S, ST) \
CAST_TO(S, ST, f32, float) CAST_TO(S, ST, f16, f16) CAST_TO(S, ST, bf16, bf16) CAST_TO(S, ST, f64, double) \
CAST_TO(S, ST, i32, i32) CAST_TO(S, ST, i64, i64) CAST_TO(S, ST, u32, u32) CAST_TO(S, ST, u8, u8) \
extern "C" __global__ void cast_##S##_bool(Idx ix, const ST* x, u8* y) { cast_impl<ST, u8, true>(ix, x, y); }
FOR_ALL(CAST_FROM)

template <typename S, typename D>
__device__ void cast_c_impl(u64 n, const S* x, D* y) {
    struct __align__(16) PS { S v[8]; };
    struct __align__(16) PD { D v[8]; };
    const u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x, step = (u64)gridDim.x * blockDim.x;
    u64 start = 0;
    if (((u64)x & 15) == 0 && ((u64)y & 15) == 0) {
        const u64 np = n / 8;
        for (u64 i = t; i < np; i += step) {
            const PS a = ((const PS*)x)[i];
            PD b;
#pragma unroll
            for (int j = 0; j < 8; ++j) b.v[j] = Num<D>::store((float)Num<S>::load(a.v[j]));
            ((PD*)y)[i] = b;
        }
        start = np * 8;
    }
    for (u64 i = start + t; i < n; i += step) y[i] = Num<D>::store((float)Num<S>::load(x[i]));
}

#define CAST_C(S, ST, D, DT) \
extern "C" __global__ void cast_c_##S##_##D(u64 n, const ST* x, DT* y) { cast_c_impl<ST, DT>(n, x, y); }
CAST_C(f32, float, f16, f16) CAST_C(f32, float, bf16, bf16) CAST_C(f16, f16, f32, float)
CAST_C(bf16, bf16, f32, float) CAST_C(f16, f16, bf16, bf16) CAST_C(bf16, bf16, f16, f16)

// cast_each: up to CE_MAX contiguous tensors of one dtype pair among f32, f16 and bf16 in one
// launch (`Op::CastEach`), their addresses and sizes passed by value in the kernel parameters
// (CastList; a captured launch keeps them) as the optimizers' tensor lists are. Block b casts
// elements [(b - block0[t]) CE_CHUNK, ...) of tensor t, block0[t] <= b < block0[t + 1]; 256
// threads, 8 elements a thread a step (16-byte loads where both addresses are aligned).
#define CE_MAX 64
#define CE_CHUNK 8192
struct CastList {
    u64 x[CE_MAX];
    u64 y[CE_MAX];
    u64 n[CE_MAX];
    u32 block0[CE_MAX + 1];
    u32 count;
};

template <typename S, typename D>
__device__ void cast_each_impl(const CastList& l) {
    struct __align__(16) PS { S v[8]; };
    struct __align__(16) PD { D v[8]; };
    const u32 b = blockIdx.x;
    u32 t = 0;
    while (t + 1 < l.count && l.block0[t + 1] <= b) ++t;
    const u64 start = (u64)(b - l.block0[t]) * CE_CHUNK;
    const u64 end = start + CE_CHUNK < l.n[t] ? start + CE_CHUNK : l.n[t];
    const S* x = (const S*)l.x[t];
    D* y = (D*)l.y[t];
    u64 tail = start;
    if (((l.x[t] | l.y[t]) & 15) == 0) {
        const u64 vend = start + (end - start) / 8 * 8;
        for (u64 i = start + (u64)threadIdx.x * 8; i < vend; i += (u64)blockDim.x * 8) {
            const PS a = *(const PS*)(x + i);
            PD o;
#pragma unroll
            for (int j = 0; j < 8; ++j) o.v[j] = Num<D>::store((float)Num<S>::load(a.v[j]));
            *(PD*)(y + i) = o;
        }
        tail = vend;
    }
    for (u64 i = tail + threadIdx.x; i < end; i += blockDim.x) y[i] = Num<D>::store((float)Num<S>::load(x[i]));
}

#define CAST_EACH(S, ST, D, DT) \
extern "C" __global__ void __launch_bounds__(256) cast_each_##S##_##D(CastList l) { cast_each_impl<ST, DT>(l); }
CAST_EACH(f32, float, f16, f16) CAST_EACH(f32, float, bf16, bf16) CAST_EACH(f16, f16, f32, float)
CAST_EACH(bf16, bf16, f32, float) CAST_EACH(f16, f16, bf16, bf16) CAST_EACH(bf16, bf16, f16, f16)
