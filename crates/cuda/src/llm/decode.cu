#line 1 "decode.cu"
// RMS norms of whole rows (quant.cuh in front).

// y = x / rms(x) * w over n values (y may be x). One block per row of n values.
extern "C" __global__ void rms_norm(u64 x, u64 w, u64 y, u32 n, float eps) {
    __shared__ float sh[32];
    pdl_wait();
    pdl_launch();
    x += (u64)blockIdx.x * n * 4;
    y += (u64)blockIdx.x * n * 4;
    const float* xp = (const float*)x;
    float ss = 0.f;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) ss += xp[i] * xp[i];
    ss = block_sum(ss, sh);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
        ((float*)y)[i] = xp[i] * inv * ((const float*)w)[i];
    }
}

// x += y / rms(y) * w over n values (gemma3's post-attention and post-FFN norms). One block
// per row of n values.
extern "C" __global__ void rms_norm_add(u64 x, u64 y, u64 w, u32 n, float eps) {
    __shared__ float sh[32];
    pdl_wait();
    pdl_launch();
    x += (u64)blockIdx.x * n * 4;
    y += (u64)blockIdx.x * n * 4;
    const float* yp = (const float*)y;
    float ss = 0.f;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) ss += yp[i] * yp[i];
    ss = block_sum(ss, sh);
    const float inv = 1.0f / sqrtf(ss / (float)n + eps);
    float* xp = (float*)x;
    for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
        xp[i] = xp[i] + yp[i] * inv * ((const float*)w)[i];
    }
}
