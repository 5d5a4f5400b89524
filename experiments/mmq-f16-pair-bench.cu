// Standalone benchmark of the prefill's product kernel (a machine with an NVIDIA GPU and nvcc;
// not part of the build). For SmolLM2-135M's four product shapes (q/k/v 960 x 576, attention
// output 576 x 576, gate/up 3072 x 576, down 576 x 1536) at 512 input rows, random Q4_1
// weights in split rows: the two-level int8 kernel `mmq2_q4_1_n2` of crates/cuda/src/matvec.cu
// (with its split-K sums, the launch arguments `with_mma_tiles` makes) against an f16-pair
// kernel (`mmh`: each input the sum of two f16, four mma.m16n8k16 a 32-element unit on the
// weights' exact 4-bit quants, f32 sums scaled per unit: the idea of
// experiments/f16x2-prefill.patch), each checked against an f64 product.
//
// From the repository root:
//   nvcc -O3 -std=c++17 -arch=sm_90a experiments/mmq-f16-pair-bench.cu -o /tmp/mmqb
//   /tmp/mmqb        per shape: microseconds a launch (int8, f16 pair, f16 pair with
//                    separate hi/lo chains), the input quantization, max error / rms
//   /tmp/mmqb 3 x y  the int8 kernel's sweep: 8-row input tiles a block (2, 4, 8) x K splits
// (nvcc takes about three minutes: it compiles every kernel of matvec.cu.) Results:
// docs/benchmarks.md, "Where SmolLM2's GPU prefill time goes".
#include "../crates/cuda/src/common.cuh"
#include "../crates/cuda/src/quant.cuh"
#include "../crates/cuda/src/matvec.cu"

// ---- input format H2: per row, units of H2U bytes; a row scale 2^-e applied before ----
// unit: for t in 0..4: 32 bytes at 32 t: hi [x4t, x4t+2, x4t+1, x4t+3, x16+4t, x16+4t+2,
// x16+4t+1, x16+4t+3] (f16), then lo the same; then at 128: f32 s = sum(hi + lo) (scaled), f32
// rs = 2^e (the row's scale back), 8 bytes pad.
#define H2U 144

__device__ __forceinline__ u32 f2h_bits(float f) { return f32_to_f16(f).x; }
__device__ __forceinline__ float h_bits2f(u32 b) { f16 h; h.x = (unsigned short)b; return f16_to_f32(h); }

// one block (128 threads) per row
extern "C" __global__ void __launch_bounds__(128) quantize_h2(u64 x, u64 norm, float eps, u32 cols, u64 out) {
    __shared__ float red[32];
    pdl_wait();
    pdl_launch();
    x += (u64)blockIdx.y * cols * 4;
    out += (u64)blockIdx.y * (cols >> 5) * H2U;
    const float* xf = (const float*)x;
    const float* g = (const float*)norm;
    float inv = 1.0f;
    if (norm) {
        float ss = 0.f;
        for (u32 i = threadIdx.x; i < (cols >> 2); i += blockDim.x) {
            const F4 v = ((const F4*)x)[i];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        ss = block_sum(ss, red);
        inv = 1.0f / sqrtf(ss / (float)cols + eps);
    }
    float amax = 0.f;
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = xf[i];
        if (norm) v = v * inv * g[i];
        amax = fmaxf(amax, fabsf(v));
    }
    amax = block_max(amax, red);
    // scale: amax * 2^-e in [2^12, 2^13)
    int e = 0;
    if (amax > 0.f) e = (int)((__float_as_uint(amax) >> 23) & 255) - 127 - 12;
    const float sc = __uint_as_float((u32)(127 - e) << 23);  // 2^-e
    const float rs = __uint_as_float((u32)(127 + e) << 23);  // 2^e
    const u32 lane = threadIdx.x & 31, warps = blockDim.x >> 5;
    for (u32 u = threadIdx.x >> 5; u < (cols >> 5); u += warps) {
        float v = xf[32 * u + lane];
        if (norm) v = v * inv * g[32 * u + lane];
        v *= sc;
        const u32 hb = f2h_bits(v);
        const float hv = h_bits2f(hb);
        const u32 lb = f2h_bits(v - hv);
        float s = hv + h_bits2f(lb);
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        // element lane -> (t, slot): i = lane & 15, half = lane >> 4; t = i >> 2, k = i & 3
        const u32 i = lane & 15, hf = lane >> 4, t = i >> 2, k = i & 3;
        const u32 slot = hf * 4 + (k == 0 ? 0 : k == 1 ? 2 : k == 2 ? 1 : 3);
        unsigned short* o16 = (unsigned short*)((u8*)out + (u64)u * H2U + 32 * t);
        o16[slot] = (unsigned short)hb;
        o16[8 + slot] = (unsigned short)lb;
        if (lane == 0) {
            float* f = (float*)((u8*)out + (u64)u * H2U + 128);
            f[0] = s;
            f[1] = rs;
        }
    }
}

__device__ __forceinline__ void hmma(u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1, float* c) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
    u32 r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
    u32 r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
__device__ __forceinline__ u32 lop_or(u32 a, u32 m, u32 o) { return (a & m) | o; }

// nibbles of w (byte i: elem 4t+i low, elem 16+4t+i high) as f16 pairs:
// r[0] = (e0, e2), r[1] = (e1, e3), r[2] = (e16, e18), r[3] = (e17, e19) (offsets from 4t)
__device__ __forceinline__ void nib_h2(u32 w, u32* r) {
    const u32 w8 = w >> 8;
    r[0] = hsub2(lop_or(w, 0x000f000fu, 0x64006400u), 0x64006400u);
    r[1] = hsub2(lop_or(w8, 0x000f000fu, 0x64006400u), 0x64006400u);
    // (1024 + 16 q) / 16 - 64
    r[2] = hfma2(lop_or(w, 0x00f000f0u, 0x64006400u), 0x2c002c00u, 0xd400d400u);
    r[3] = hfma2(lop_or(w8, 0x00f000f0u, 0x64006400u), 0x2c002c00u, 0xd400d400u);
}

// Q4_1 only (experiment); same tiling, staging and split-K as mmq_run.
template <int NT, bool TWO>
__device__ __forceinline__ void mmh_run(const MvArgs& a) {
    constexpr int F = FMT_Q4_1;
    extern __shared__ __align__(16) u8 smem[];
    constexpr u32 XS = MQ_KU * H2U + 16, XU = H2U, XP = XU / 16;
    constexpr u32 XB = 8 * NT * XS, WB = mq_wbytes<F>(), QS = mq_qs<F>();
    constexpr u32 SQ = sp_q<F>(), SH = sp_h<F>(), SQH = sp_qh<F>();
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const u32 groups = mv_groups(a), ks_n = max(a.chunk, 1u);
    const u32 grp = blockIdx.x % groups, ks = (blockIdx.x / groups) % ks_n, tb = blockIdx.x / groups / ks_n;
    const u32 tile = tb * MQ_W + warp;
    const bool live = tile < a.tiles;
    const bool glu = a.mode >= MV_GLU_SILU;
    const u32 row0 = grp * a.rpg;
    const u32 nb = min((u32)(8 * NT), a.nrows - row0);
    const u32 units = a.cols >> 5;
    const u32 per = ((units + ks_n - 1) / ks_n + MQ_KU - 1) / MQ_KU * MQ_KU;
    const u32 ub = min(units, ks * per), ue = min(units, ub + per);
    const u32 su = ue - ub;
    const u32 stages = (su + MQ_KU - 1) / MQ_KU;
    MvSeg sa;
    u32 r0;
    tile_of(a, glu, live ? tile : 0, &sa, &r0);
    const MvSeg sb = a.seg[1];
    float acc[2][NT][4];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[m][j][e] = 0.f;
    const u64 xbase = a.x + (u64)row0 * a.xstride + (u64)ub * XU;
    auto stage_in = [&](u32 st) {
        u8* xd = smem + (st & 1) * XB;
        const u32 n = nb * MQ_KU * XP;
        for (u32 i = threadIdx.x; i < n; i += blockDim.x) {
            const u32 r = i / (MQ_KU * XP), rem = i % (MQ_KU * XP), uu = rem / XP, p = rem % XP;
            const u32 u = st * MQ_KU + uu;
            if (u < su) cp16(xd + r * XS + uu * XU + p * 16, xbase + (u64)r * a.xstride + (u64)u * XU + p * 16);
        }
        u8* wd = smem + 2 * XB + ((st & 1) * MQ_W + warp) * WB;
        const u32 u0 = ub + st * MQ_KU;
        constexpr u32 QP = MQ_KU * SQ / 16;
        for (u32 i = lane; i < 32 * QP; i += 32) {
            const u32 lr = i / QP, p = i % QP;
            const bool up = glu && lr >= 16;
            const MvSeg& s = up ? sb : sa;
            const u32 row = min(r0 + (up ? lr - 16 : lr), s.rows - 1);
            const u64 rp = s.w + (u64)row * s.row_bytes;
            if (u0 + (p * 16) / SQ < ue) cp16(wd + lr * QS + p * 16, rp + (u64)u0 * SQ + p * 16);
        }
        constexpr u32 HP = MQ_KU * SH / 8;
        for (u32 i = lane; i < 32 * HP; i += 32) {
            const u32 lr = i / HP, p = i % HP;
            const bool up = glu && lr >= 16;
            const MvSeg& s = up ? sb : sa;
            const u32 row = min(r0 + (up ? lr - 16 : lr), s.rows - 1);
            const u64 rp = s.w + (u64)row * s.row_bytes;
            if (u0 + p * 8 / SH < ue)
                cp8(wd + 32 * QS + lr * MQ_KU * SH + p * 8, rp + (u64)units * (SQ + SQH) + (u64)u0 * SH + p * 8);
        }
        cp_commit();
    };
    auto comp = [&](u32 st, auto full) {
        const u8* x = smem + (st & 1) * XB;
        const u8* wq = smem + 2 * XB + ((st & 1) * MQ_W + warp) * WB;
        const u8* wh = wq + 32 * QS;
#pragma unroll
        for (int uu = 0; uu < MQ_KU; ++uu) {
            if (!decltype(full)::value && st * MQ_KU + uu >= su) break;
            u32 af[2][2][4];  // [m][h: row g, g + 8][r0..r3]
            float dw[2][2], mw[2][2];
#pragma unroll
            for (int m = 0; m < 2; ++m) {
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const u32 lr = 16 * m + g + 8 * h;
                    nib_h2(*(const u32*)(wq + lr * QS + uu * SQ + 4 * t), af[m][h]);
                    const u32 hw = *(const u32*)(wh + lr * MQ_KU * 4 + uu * 4);
                    dw[m][h] = h2f(hw & 0xffffu);
                    mw[m][h] = h2f(hw >> 16);
                }
            }
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                const u8* xr = x + (8 * j + g) * XS + uu * XU + 32 * t;
                const U4 hi = *(const U4*)xr, lo = *(const U4*)(xr + 16);
                const float s0 = *(const float*)(x + (8 * j + 2 * t) * XS + uu * XU + 128);
                const float s1 = *(const float*)(x + (8 * j + 2 * t + 1) * XS + uu * XU + 128);
#pragma unroll
                for (int m = 0; m < 2; ++m) {
                    float c[4] = {0.f, 0.f, 0.f, 0.f}, l[4] = {0.f, 0.f, 0.f, 0.f};
                    hmma(af[m][0][0], af[m][1][0], af[m][0][1], af[m][1][1], hi.x, hi.y, c);
                    hmma(af[m][0][2], af[m][1][2], af[m][0][3], af[m][1][3], hi.z, hi.w, c);
                    hmma(af[m][0][0], af[m][1][0], af[m][0][1], af[m][1][1], lo.x, lo.y, TWO ? l : c);
                    hmma(af[m][0][2], af[m][1][2], af[m][0][3], af[m][1][3], lo.z, lo.w, TWO ? l : c);
                    if (TWO) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) c[e] += l[e];
                    }
                    acc[m][j][0] = fmaf(dw[m][0], c[0], fmaf(mw[m][0], s0, acc[m][j][0]));
                    acc[m][j][1] = fmaf(dw[m][0], c[1], fmaf(mw[m][0], s1, acc[m][j][1]));
                    acc[m][j][2] = fmaf(dw[m][1], c[2], fmaf(mw[m][1], s0, acc[m][j][2]));
                    acc[m][j][3] = fmaf(dw[m][1], c[3], fmaf(mw[m][1], s1, acc[m][j][3]));
                }
            }
        }
    };
    pdl_wait();
    pdl_launch();
    if (stages) stage_in(0);
    for (u32 st = 0; st < stages; ++st) {
        if (st + 1 < stages) {
            stage_in(st + 1);
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        if ((st + 1) * MQ_KU <= su)
            comp(st, BoolK<true>{});
        else
            comp(st, BoolK<false>{});
        __syncthreads();
    }
    if (!live) return;
#pragma unroll
    for (int m = 0; m < 2; ++m) {
        if (ks_n == 1 && glu && m == 1) break;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const u32 row = r0 + (glu ? 0u : 16u * m) + g + 8u * h;
            if (row >= sa.rows) continue;
            const u32 p = glu ? row + (u32)m * sa.rows : mq_prow(a, glu, tile, row);
#pragma unroll
            for (int j = 0; j < NT; ++j) {
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const u32 col = 8 * j + 2 * t + e;
                    if (col >= nb) continue;
                    const float rs = *(const float*)(a.x + (u64)(row0 + col) * a.xstride + 132);
                    const float v = acc[m][j][2 * h + e] * rs;
                    if (ks_n > 1) {
                        ((float*)a.argmax)[((u64)ks * a.nrows + row0 + col) * a.stride + p] = v;
                    } else {
                        const float u = glu ? acc[1][j][2 * h + e] * rs : 0.f;
                        mv_epilogue(a, sa, sb, row, v, u, a.out + (u64)(row0 + col) * a.ostride);
                    }
                }
            }
        }
    }
}
// mmh_1: one accumulator chain of four mma a unit; mmh_2: hi and lo chains apart, added;
// _b4: at most 128 registers (4 blocks a multiprocessor).
extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmh_1(const MvArgs a) { mmh_run<2, false>(a); }
extern "C" __global__ void __launch_bounds__(MQ_W * 32) mmh_2(const MvArgs a) { mmh_run<2, true>(a); }
extern "C" __global__ void __launch_bounds__(MQ_W * 32, 4) mmh_1_b4(const MvArgs a) { mmh_run<2, false>(a); }
extern "C" __global__ void __launch_bounds__(MQ_W * 32, 4) mmh_2_b4(const MvArgs a) { mmh_run<2, true>(a); }

// reference: out[r][n] = sum_k w[n][k] x[r][k] in f64 (split Q4_1 rows)
extern "C" __global__ void ref_q4_1(u64 w, u32 row_bytes, u32 n_rows, u32 cols, const float* x, double* out) {
    const u32 n = blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (n >= n_rows) return;
    const u32 units = cols / 32;
    const u8* rp = (const u8*)(w + (u64)n * row_bytes);
    double s = 0;
    for (u32 u = 0; u < units; ++u) {
        const u32 hw = *(const u32*)(rp + units * 16 + 4 * u);
        const double d = h2f(hw & 0xffff), m = h2f(hw >> 16);
        for (u32 j = 0; j < 16; ++j) {
            const u8 b = rp[16 * u + j];
            s += (d * (b & 15) + m) * (double)x[(u64)r * cols + 32 * u + j];
            s += (d * (b >> 4) + m) * (double)x[(u64)r * cols + 32 * u + 16 + j];
        }
    }
    out[(u64)r * n_rows + n] = s;
}

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cmath>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e_ = (x); if (e_ != cudaSuccess) { printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)

static unsigned short f2h_host(float f) {
    u32 b; memcpy(&b, &f, 4);
    u32 s = (b >> 16) & 0x8000; int e = (int)((b >> 23) & 255) - 127 + 15; u32 m = b & 0x7fffff;
    if (e <= 0) return s;
    u32 r = (e << 10) | (m >> 13); if ((m >> 12) & 1) r++;
    return s | r;
}
static u64 rng = 88172645463325252ull;
static double urand() { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return (rng >> 11) * (1.0 / 9007199254740992.0); }

struct Shape { const char* name; u32 n, k; };

static u32 force_ks = 0;
int main(int argc, char** argv) {
    const u32 R = 512;
    int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    Shape shapes[] = {{"qkv", 960, 576}, {"wo", 576, 576}, {"gu", 3072, 576}, {"down", 576, 1536}};
    const int blk_target = argc > 1 ? atoi(argv[1]) : 3;
    CK(cudaFuncSetAttribute(mmq2_q4_1_n2, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000));
    CK(cudaFuncSetAttribute(mmq2_q4_1_n4, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000));
    CK(cudaFuncSetAttribute(mmq2_q4_1_n8, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000));
    CK(cudaFuncSetAttribute(mmh_1, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000));
    CK(cudaFuncSetAttribute(mmh_2, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000));
    CK(cudaFuncSetAttribute(mmh_1_b4, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000));
    CK(cudaFuncSetAttribute(mmh_2_b4, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000));
    if (argc <= 3)
        printf("%-5s %8s %8s %8s %8s %8s %11s | max error / rms: %8s %8s\n", "shape", "int8", "f16p", "f16p-2", "f16p-b4",
               "f16p-2b4", "quant i8/f16p", "int8", "f16p");
    for (auto& sh : shapes) {
        const u32 N = sh.n, K = sh.k, units = K / 32, row_bytes = (units * 20 + 15) / 16 * 16;
        std::vector<u8> w((size_t)N * row_bytes);
        for (u32 n = 0; n < N; ++n) {
            u8* rp = &w[(size_t)n * row_bytes];
            for (u32 i = 0; i < units * 16; ++i) rp[i] = (u8)(urand() * 256);
            for (u32 u = 0; u < units; ++u) {
                const float d = 0.002f + 0.01f * urand();
                const float m = -d * (7.0f + 2.0f * urand());
                const unsigned short hd = f2h_host(d), hm = f2h_host(m);
                memcpy(rp + units * 16 + 4 * u, &hd, 2);
                memcpy(rp + units * 16 + 4 * u + 2, &hm, 2);
            }
        }
        std::vector<float> x((size_t)R * K);
        for (auto& v : x) { double z = (urand() - 0.5) * 4; if (urand() < 0.01) z *= 20; v = (float)z; }
        u8 *dw, *dq2, *dh2; float *dx, *dout, *dpart; double* dref;
        CK(cudaMalloc(&dw, w.size() + 64));
        CK(cudaMemcpy(dw, w.data(), w.size(), cudaMemcpyHostToDevice));
        CK(cudaMalloc(&dx, x.size() * 4));
        CK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
        CK(cudaMalloc(&dq2, (size_t)R * units * Q8X2U));
        CK(cudaMalloc(&dh2, (size_t)R * units * H2U));
        CK(cudaMalloc(&dout, (size_t)R * N * 4));
        CK(cudaMalloc(&dpart, (size_t)8 * R * N * 4));
        CK(cudaMalloc(&dref, (size_t)R * N * 8));
        ref_q4_1<<<dim3((N + 127) / 128, R), 128>>>((u64)dw, row_bytes, N, K, dx, dref);
        CK(cudaGetLastError());
        std::vector<double> ref((size_t)R * N);
        CK(cudaMemcpy(ref.data(), dref, ref.size() * 8, cudaMemcpyDeviceToHost));
        double rms = 0; for (double v : ref) rms += v * v; rms = sqrt(rms / ref.size());

        // launch args as with_mma_tiles
        auto mk = [&](u32 nt, u64 xin, u32 xstride) {
            MvArgs a; memset(&a, 0, sizeof a);
            a.seg[0].w = (u64)dw; a.seg[0].fmt = FMT_Q4_1 | FMT_SPLIT; a.seg[0].rows = N; a.seg[0].row_bytes = row_bytes;
            a.seg[0].blocks = (N + 31) / 32;
            a.nseg = 1; a.mode = MV_STORE; a.cols = K; a.rpb = 32; a.tiles = a.seg[0].blocks;
            const u32 blocks = (a.tiles + MQ_W - 1) / MQ_W * ((R + 8 * nt - 1) / (8 * nt));
            const u32 stages = (units + 3) / 4;
            u32 ks = (blk_target * sms + blocks - 1) / blocks;
            ks = std::min(std::max(ks, 1u), 8u); ks = std::min(ks, std::max(stages / 2, 1u));
            if (force_ks) ks = force_ks;
            a.chunk = ks; a.rpg = 8 * nt;
            if (ks > 1) { a.stride = N; a.argmax = (u64)dpart; }
            a.x = xin; a.xstride = xstride; a.out = (u64)dout; a.ostride = N * 4; a.nrows = R;
            return a;
        };
        // kernel k: 0 int8 (nt 8-row input tiles a block), 1 mmh_1, 2 mmh_2, 3 mmh_1_b4, 4 mmh_2_b4
        auto run = [&](int k, u32 nt) {
            const bool h = k > 0;
            if (h) nt = 2;
            MvArgs a = mk(nt, h ? (u64)dh2 : (u64)dq2, units * (h ? H2U : Q8X2U));
            const u32 groups = (R + a.rpg - 1) / a.rpg;
            const u32 grid = (a.tiles + MQ_W - 1) / MQ_W * a.chunk * groups;
            const u32 xb = 8 * nt * (MQ_KU * (h ? H2U : Q8X2U) + 16);
            const u32 wb = 32 * (MQ_KU * 16 + 16 + MQ_KU * 4);
            const u32 smem = 2 * xb + 2 * MQ_W * wb;
            if (k == 0 && nt == 2) mmq2_q4_1_n2<<<grid, 128, smem>>>(a);
            else if (k == 0 && nt == 4) mmq2_q4_1_n4<<<grid, 128, smem>>>(a);
            else if (k == 0) mmq2_q4_1_n8<<<grid, 128, smem>>>(a);
            else if (k == 1) mmh_1<<<grid, 128, smem>>>(a);
            else if (k == 2) mmh_2<<<grid, 128, smem>>>(a);
            else if (k == 3) mmh_1_b4<<<grid, 128, smem>>>(a);
            else mmh_2_b4<<<grid, 128, smem>>>(a);
            if (a.chunk > 1) mmq_reduce<<<(R * N + 255) / 256, 256>>>(a);
        };
        auto quant = [&](bool h) {
            if (h) quantize_h2<<<dim3(1, R), 128>>>((u64)dx, 0, 0.f, K, (u64)dh2);
            else quantize_q8x2<<<dim3((units + 7) / 8, R), 256>>>((u64)dx, 0, 0.f, K, (u64)dq2);
        };
        auto err = [&]() {
            std::vector<float> o((size_t)R * N);
            CK(cudaMemcpy(o.data(), dout, o.size() * 4, cudaMemcpyDeviceToHost));
            double mx = 0; for (size_t i = 0; i < o.size(); ++i) mx = std::max(mx, fabs(o[i] - ref[i]));
            return mx / rms;
        };
        auto timeit = [&](auto f) {
            cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
            for (int i = 0; i < 20; ++i) f();
            std::vector<float> ts;
            for (int rep = 0; rep < 7; ++rep) {
                cudaEventRecord(e0);
                for (int i = 0; i < 50; ++i) f();
                cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
                float ms; cudaEventElapsedTime(&ms, e0, e1); ts.push_back(ms * 1000 / 50);
            }
            std::sort(ts.begin(), ts.end());
            return ts[3];
        };
        auto check = [&](int k) {
            CK(cudaMemset(dout, 0xff, (size_t)R * N * 4));
            run(k, 2);
            CK(cudaDeviceSynchronize());
            CK(cudaGetLastError());
            return err();
        };
        quant(false);
        const double eq = check(0);
        quant(true);
        double eh = 0;
        for (int k = 1; k <= 4; ++k) eh = std::max(eh, check(k));
        if (argc > 3) {
            printf("%-5s", sh.name);
            for (u32 nt : {2u, 4u, 8u})
                for (u32 k : {1u, 2u, 3u, 4u}) {
                    if (k > (units + 3) / 4) continue;
                    force_ks = k;
                    printf(" n%u/k%u %.1f", nt, k, timeit([&] { run(0, nt); }));
                }
            force_ks = 0;
            printf("\n");
        } else {
            float t[5];
            for (int k = 0; k <= 4; ++k) t[k] = timeit([&] { run(k, 2); });
            const float qq = timeit([&] { quant(false); }), qh = timeit([&] { quant(true); });
            printf("%-5s %8.2f %8.2f %8.2f %8.2f %8.2f %5.1f/%5.1f | %8.2e %8.2e (int8 K splits %u)\n", sh.name, t[0], t[1],
                   t[2], t[3], t[4], qq, qh, eq, eh, mk(2, 0, 0).chunk);
        }
        cudaFree(dw); cudaFree(dx); cudaFree(dq2); cudaFree(dh2); cudaFree(dout); cudaFree(dpart); cudaFree(dref);
    }
    return 0;
}
