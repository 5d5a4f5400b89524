// Convolution helpers and max pooling. Convolutions are im2col + cuBLASLt matmul (conv.rs):
// im2col writes the column matrix of x in a layout given by strides, col2im gathers a column
// matrix back into image pixels (the adjoint, without atomics: each thread sums the taps
// that read its pixel). wgrad_small/wgrad_sum compute the weight gradient of a small filter
// directly. Inputs are contiguous; f16/bf16 accumulate in f32.

// x [n, c, h, w] with w [o, c/g, kh, kw] -> y [n, o, oh, ow]; all in elements.
struct ConvGeo {
    i64 n, c, h, w, oh, ow, kh, kw;
    i64 s0, s1, p0, p1, d0, d1;
    i64 cg;   // channels per group
};

// cols[nn, g, k, p] at nn * sn + g * sg + k * sk + p, k = (c' kh + ki) kw + kj, p = i ow + j.
template <typename T>
__device__ void im2col_impl(ConvGeo g, const T* x, T* cols, i64 sn, i64 sg, i64 sk) {
    u64 total = (u64)(g.n * g.c * g.kh * g.kw * g.oh * g.ow);
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        u64 t = i;
        i64 oj = (i64)(t % g.ow); t /= g.ow;
        i64 oi = (i64)(t % g.oh); t /= g.oh;
        i64 kj = (i64)(t % g.kw); t /= g.kw;
        i64 ki = (i64)(t % g.kh); t /= g.kh;
        i64 c = (i64)(t % g.c);
        i64 nn = (i64)(t / g.c);
        i64 grp = c / g.cg, cl = c - grp * g.cg;
        i64 ih = oi * g.s0 - g.p0 + ki * g.d0;
        i64 iw = oj * g.s1 - g.p1 + kj * g.d1;
        T v;
        if (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w) v = x[((nn * g.c + c) * g.h + ih) * g.w + iw];
        else v = Num<T>::store((typename Num<T>::A)0);
        i64 k = (cl * g.kh + ki) * g.kw + kj;
        cols[nn * sn + grp * sg + k * sk + oi * g.ow + oj] = v;
    }
}

// dx[nn, c, ih, iw] = sum of cols entries whose tap reads (ih, iw).
template <typename T>
__device__ void col2im_impl(ConvGeo g, const T* cols, T* dx, i64 sn, i64 sg, i64 sk) {
    typedef typename Num<T>::A A;
    u64 total = (u64)(g.n * g.c * g.h * g.w);
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        u64 t = i;
        i64 iw = (i64)(t % g.w); t /= g.w;
        i64 ih = (i64)(t % g.h); t /= g.h;
        i64 c = (i64)(t % g.c);
        i64 nn = (i64)(t / g.c);
        i64 grp = c / g.cg, cl = c - grp * g.cg;
        A acc = (A)0;
        for (i64 ki = 0; ki < g.kh; ++ki) {
            i64 a = ih + g.p0 - ki * g.d0;
            if (a < 0 || a % g.s0 != 0) continue;
            i64 oi = a / g.s0;
            if (oi >= g.oh) continue;
            for (i64 kj = 0; kj < g.kw; ++kj) {
                i64 b = iw + g.p1 - kj * g.d1;
                if (b < 0 || b % g.s1 != 0) continue;
                i64 oj = b / g.s1;
                if (oj >= g.ow) continue;
                i64 k = (cl * g.kh + ki) * g.kw + kj;
                acc += Num<T>::load(cols[nn * sn + grp * sg + k * sk + oi * g.ow + oj]);
            }
        }
        dx[i] = Num<T>::store(acc);
    }
}

struct PoolGeo {
    i64 planes, h, w, oh, ow;
    i64 k0, k1, s0, s1, p0, p1, d0, d1;
    i64 adaptive;   // nonzero: PyTorch's adaptive windows (the fields above but sizes unused)
};

// One thread per output: the first maximum of the window (NaN wins) and its index in the plane.
template <typename T>
__device__ void max_pool2d_impl(PoolGeo g, const T* x, T* y, u32* idx) {
    typedef typename Num<T>::A A;
    u64 total = (u64)(g.planes * g.oh * g.ow);
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        u64 t = i;
        i64 oj = (i64)(t % g.ow); t /= g.ow;
        i64 oi = (i64)(t % g.oh);
        i64 pl = (i64)(t / g.oh);
        const T* src = x + pl * g.h * g.w;
        A best = neg_inf<A>();
        i64 at = -1;
        // Window rows r0 + a d0 for a < k0 (likewise columns); adaptive windows are dense.
        i64 r0 = oi * g.s0 - g.p0, c0 = oj * g.s1 - g.p1, k0 = g.k0, k1 = g.k1, d0 = g.d0, d1 = g.d1;
        if (g.adaptive) {
            r0 = oi * g.h / g.oh;
            c0 = oj * g.w / g.ow;
            k0 = ((oi + 1) * g.h + g.oh - 1) / g.oh - r0;
            k1 = ((oj + 1) * g.w + g.ow - 1) / g.ow - c0;
            d0 = 1;
            d1 = 1;
        }
        for (i64 a = 0; a < k0; ++a) {
            i64 ih = r0 + a * d0;
            if (ih < 0 || ih >= g.h) continue;
            for (i64 b = 0; b < k1; ++b) {
                i64 iw = c0 + b * d1;
                if (iw < 0 || iw >= g.w) continue;
                A v = Num<T>::load(src[ih * g.w + iw]);
                if (at < 0 || v > best || (m_isnan(v) && !m_isnan(best))) {
                    best = v;
                    at = ih * g.w + iw;
                }
            }
        }
        y[i] = Num<T>::store(best);
        idx[i] = (u32)(at < 0 ? 0 : at);
    }
}


// Weight gradient of a small filter over a long reduction: dw[o, c', ki, kj] =
// sum over r = (nn oh + oi) ow + oj of gy[nn, o, oi, oj] x[nn, c, ih, iw], c = group(o) cg + c'.
// Block b sums r in [b len, (b + 1) len) into part[b, w] (w = (o cg + c') kh kw + ki kw + kj,
// dw's own order); wgrad_sum then adds the blocks' sums in a fixed order, so the result does
// not depend on scheduling. Each block stages WG_R positions at a time in shared memory,
// position-major: gy of every o (sg[j o_total + o]) and the tap of every (c, ki, kj)
// (sx[j c kh kw + ck]), so the threads of a warp (consecutive w) read consecutive banks.
// Thread t owns outputs t + q blockDim.x, q < WG_PER. Contract (conv.rs `small_filter`):
// o_total cg kh kw <= WG_PER blockDim.x; c kh kw <= WG_CK; (o_total + c kh kw) WG_R A fits
// the shared memory; x and gy contiguous with fewer than 2^31 elements (32-bit indices).
#define WG_R 32
#define WG_PER 4
#define WG_CK 512
template <typename T>
__device__ void wgrad_small_impl(ConvGeo g, i64 o_total_, const T* x, const T* gy,
                                 typename Num<T>::A* part, i64 len) {
    typedef typename Num<T>::A A;
    extern __shared__ __align__(16) unsigned char wg_smem[];
    const int o_total = (int)o_total_, kw = (int)g.kw, kk = (int)(g.kh * g.kw);
    const int K = (int)g.cg * kk, CK = (int)g.c * kk, W = o_total * K;
    const int H = (int)g.h, Wd = (int)g.w, OH = (int)g.oh, OW = (int)g.ow, pix = OH * OW;
    const int og = o_total / (int)(g.c / g.cg);
    A* sg = (A*)wg_smem;
    A* sx = sg + o_total * WG_R;
    // Per staged position: its image's offsets into x and gy, and its top-left tap; -1: none.
    __shared__ int s_x[WG_R], s_g[WG_R], s_ih[WG_R], s_iw[WG_R];
    // Per tap (c, ki, kj): the channel's offset and the tap's offsets from the top-left.
    __shared__ int s_c[WG_CK], s_ki[WG_CK], s_kj[WG_CK];
    for (int ck = threadIdx.x; ck < CK; ck += blockDim.x) {
        int c = ck / kk, t = ck - c * kk, ki = t / kw;
        s_c[ck] = c * H * Wd;
        s_ki[ck] = ki * (int)g.d0;
        s_kj[ck] = (t - ki * kw) * (int)g.d1;
    }
    const int r0 = (int)(blockIdx.x * len), r1 = (int)min((i64)g.n * pix, r0 + len);
    A acc[WG_PER];
    int xrow[WG_PER], orow[WG_PER];
#pragma unroll
    for (int q = 0; q < WG_PER; ++q) {
        acc[q] = (A)0;
        int w = threadIdx.x + q * blockDim.x;
        int o = w / K;
        orow[q] = o;
        xrow[q] = (o / og) * K + (w - o * K);
    }
    for (int r = r0; r < r1; r += WG_R) {
        if (threadIdx.x < WG_R) {
            int rr = r + threadIdx.x, nn = rr / pix, p = rr - nn * pix, oi = p / OW, oj = p - oi * OW;
            bool in = rr < r1;
            s_x[threadIdx.x] = in ? nn * (int)g.c * H * Wd : -1;
            s_g[threadIdx.x] = in ? nn * o_total * pix + p : -1;
            s_ih[threadIdx.x] = oi * (int)g.s0 - (int)g.p0;
            s_iw[threadIdx.x] = oj * (int)g.s1 - (int)g.p1;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < o_total * WG_R; i += blockDim.x) {
            int o = i / WG_R, j = i % WG_R;
            A v = (A)0;
            if (s_g[j] >= 0) v = Num<T>::load(gy[s_g[j] + o * pix]);
            sg[j * o_total + o] = v;
        }
        for (int i = threadIdx.x; i < CK * WG_R; i += blockDim.x) {
            int ck = i / WG_R, j = i % WG_R;
            int ih = s_ih[j] + s_ki[ck], iw = s_iw[j] + s_kj[ck];
            A v = (A)0;
            if (s_x[j] >= 0 && ih >= 0 && ih < H && iw >= 0 && iw < Wd)
                v = Num<T>::load(x[s_x[j] + s_c[ck] + ih * Wd + iw]);
            sx[j * CK + ck] = v;
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < WG_PER; ++q) {
            if (threadIdx.x + q * blockDim.x < W) {
                A a = acc[q];
#pragma unroll 8
                for (int j = 0; j < WG_R; ++j) a += sg[j * o_total + orow[q]] * sx[j * CK + xrow[q]];
                acc[q] = a;
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int q = 0; q < WG_PER; ++q) {
        int w = threadIdx.x + q * blockDim.x;
        if (w < W) part[(i64)blockIdx.x * W + w] = acc[q];
    }
}

// dw[w] = the sum over wgrad_small's blocks of part[b, w]: block w's threads add strided
// slices, then a tree in shared memory (a fixed order). 256 threads a block.
template <typename T>
__device__ void wgrad_sum_impl(const typename Num<T>::A* part, i64 blocks, i64 W, T* dw) {
    typedef typename Num<T>::A A;
    __shared__ A s[256];
    const i64 w = blockIdx.x;
    A a = (A)0;
    for (i64 b = threadIdx.x; b < blocks; b += blockDim.x) a += part[b * W + w];
    s[threadIdx.x] = a;
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h /= 2) {
        if (threadIdx.x < h) s[threadIdx.x] += s[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0) dw[w] = Num<T>::store(s[0]);
}

#define CONV_KERNELS(S, T) \
    extern "C" __global__ void im2col_##S(ConvGeo g, const T* x, T* cols, i64 sn, i64 sg, i64 sk) { im2col_impl<T>(g, x, cols, sn, sg, sk); } \
    extern "C" __global__ void col2im_##S(ConvGeo g, const T* cols, T* dx, i64 sn, i64 sg, i64 sk) { col2im_impl<T>(g, cols, dx, sn, sg, sk); } \
    extern "C" __global__ void max_pool2d_##S(PoolGeo g, const T* x, T* y, u32* idx) { max_pool2d_impl<T>(g, x, y, idx); } \
    extern "C" __global__ void wgrad_small_##S(ConvGeo g, i64 o_total, const T* x, const T* gy, Num<T>::A* part, i64 len) { wgrad_small_impl<T>(g, o_total, x, gy, part, len); } \
    extern "C" __global__ void wgrad_sum_##S(const Num<T>::A* part, i64 blocks, i64 w, T* dw) { wgrad_sum_impl<T>(part, blocks, w, dw); }
FOR_FLOATS(CONV_KERNELS)
