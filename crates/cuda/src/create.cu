// Creation ops: fill, arange and the counter-based random tensors (Philox4x32-10, as in
// ferrite-core rng.rs: element i uses counter (i lo, i hi, 0, 0), key (seed lo, seed hi)).
// Random values are computed in f32 with explicit round-to-nearest ops (no FMA contraction),
// so uniform values equal the CPU's bit for bit; normal values go through the device's
// logf/sqrtf/cosf and agree to a few ulp.

template <typename W>
__device__ void fill_impl(u64 n, W v, W* y) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) y[i] = v;
}
extern "C" __global__ void fill_b1(u64 n, u8 v, u8* y) { fill_impl(n, v, y); }
extern "C" __global__ void fill_b2(u64 n, unsigned short v, unsigned short* y) { fill_impl(n, v, y); }
extern "C" __global__ void fill_b4(u64 n, u32 v, u32* y) { fill_impl(n, v, y); }
extern "C" __global__ void fill_b8(u64 n, u64 v, u64* y) { fill_impl(n, v, y); }

template <typename D>
__device__ void arange_impl(u64 n, double start, double step, D* y) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        double v = start + (double)i * step;
        y[i] = from_double<D>(v);
    }
}
#define ARANGE(S, T) extern "C" __global__ void arange_##S(u64 n, double start, double step, T* y) { arange_impl<T>(n, start, step, y); }
FOR_NUMERIC(ARANGE)
extern "C" __global__ void arange_bool(u64 n, double start, double step, u8* y) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        y[i] = (start + (double)i * step) != 0.0;
}

__device__ __forceinline__ void philox(u32 c[4], u32 k0, u32 k1) {
    const u32 M0 = 0xD2511F53u, M1 = 0xCD9E8D57u, W0 = 0x9E3779B9u, W1 = 0xBB67AE85u;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r > 0) { k0 += W0; k1 += W1; }
        u32 hi0 = __umulhi(M0, c[0]), lo0 = M0 * c[0];
        u32 hi1 = __umulhi(M1, c[2]), lo1 = M1 * c[2];
        u32 n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
    }
}

__device__ __forceinline__ float unit_f32(u32 w) { return __fmul_rn((float)(w >> 8), 1.0f / 16777216.0f); }

template <typename T> __device__ __forceinline__ T store_f32(float v) {
    if constexpr (sizeof(T) == 8) return (T)(double)v;
    else return Num<T>::store(v);
}

template <typename T>
__device__ void rand_impl(u64 n, u64 seed, float a, float b, int normal, T* y) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        u32 c[4] = {(u32)i, (u32)(i >> 32), 0u, 0u};
        philox(c, (u32)seed, (u32)(seed >> 32));
        float v;
        if (!normal) {
            v = __fadd_rn(a, __fmul_rn(__fsub_rn(b, a), unit_f32(c[0])));   // low + (high - low) u
        } else {
            float u1 = __fsub_rn(1.0f, unit_f32(c[0]));
            float u2 = unit_f32(c[1]);
            float r = sqrtf(__fmul_rn(-2.0f, logf(u1)));
            float z = __fmul_rn(__fmul_rn(b, r), cosf(__fmul_rn(6.28318548202514648f, u2)));
            v = __fadd_rn(a, z);                                            // mean + std r cos(2 pi u2)
        }
        y[i] = store_f32<T>(v);
    }
}
#define RAND(S, T) extern "C" __global__ void rand_##S(u64 n, u64 seed, float a, float b, int normal, T* y) { rand_impl<T>(n, seed, a, b, normal, y); }
FOR_FLOATS(RAND)
