// cast: every dtype pair, with Rust `as` semantics (ferrite-cpu cast.rs): floats go through
// f64, integers through i64; float to int truncates toward zero, saturates, NaN gives 0;
// int to narrower int wraps; nonzero gives true. Input strided (Idx), output contiguous.

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
