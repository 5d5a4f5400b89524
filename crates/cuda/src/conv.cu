// Convolution helpers and max pooling. Convolutions are im2col + cuBLASLt matmul (conv.rs):
// im2col writes the column matrix of x in a layout given by strides, col2im gathers a column
// matrix back into image pixels (the adjoint, without atomics: each thread sums the taps
// that read its pixel). conv_small (forward) and wgrad_small/wgrad_sum (weight gradient)
// compute small filters directly. Inputs are contiguous; f16/bf16 accumulate in f32.

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
// not depend on scheduling. Each block stages R = 2^lg_r positions at a time in shared memory
// (the host makes a block's range one or a few stages, so its loads are in flight together),
// position-major: gy of every o (sg[j o_total + o]) and the tap of every (c, ki, kj)
// (sx[j c kh kw + ck]), so the threads of a warp (consecutive w) read consecutive banks.
// Thread t owns outputs t + q blockDim.x, q < WG_PER. Contract (conv.rs `small_filter`):
// o_total cg kh kw <= WG_PER blockDim.x; c kh kw <= WG_CK; R <= WG_RMAX and <= blockDim.x;
// (o_total + c kh kw) R A fits the shared memory; len a multiple of R; x and gy contiguous
// with fewer than 2^31 elements (32-bit indices).
#define WG_RMAX 256
#define WG_U 8
#define WG_PER 4
#define WG_CK 512
template <typename T>
__device__ void wgrad_small_impl(ConvGeo g, i64 o_total_, const T* x, const T* gy,
                                 typename Num<T>::A* part, i64 len, u32 lg_r) {
    typedef typename Num<T>::A A;
    extern __shared__ __align__(16) unsigned char wg_smem[];
    const int o_total = (int)o_total_, kw = (int)g.kw, kk = (int)(g.kh * g.kw);
    const int K = (int)g.cg * kk, CK = (int)g.c * kk, W = o_total * K;
    const int H = (int)g.h, Wd = (int)g.w, OH = (int)g.oh, OW = (int)g.ow, pix = OH * OW;
    const int og = o_total / (int)(g.c / g.cg);
    const int R = 1 << lg_r;
    A* sg = (A*)wg_smem;
    A* sx = sg + o_total * R;
    // Per staged position: its image's offsets into x and gy, and its top-left tap; -1: none.
    __shared__ int s_x[WG_RMAX], s_g[WG_RMAX], s_ih[WG_RMAX], s_iw[WG_RMAX];
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
    for (int r = r0; r < r1; r += R) {
        if (threadIdx.x < R) {
            int rr = r + threadIdx.x, nn = rr / pix, p = rr - nn * pix, oi = p / OW, oj = p - oi * OW;
            bool in = rr < r1;
            s_x[threadIdx.x] = in ? nn * (int)g.c * H * Wd : -1;
            s_g[threadIdx.x] = in ? nn * o_total * pix + p : -1;
            s_ih[threadIdx.x] = oi * (int)g.s0 - (int)g.p0;
            s_iw[threadIdx.x] = oj * (int)g.s1 - (int)g.p1;
        }
        __syncthreads();
        // WG_U loads in flight together, then their stores.
        const int bd = blockDim.x;
        for (int i0 = threadIdx.x; i0 < o_total * R; i0 += WG_U * bd) {
            A v[WG_U];
#pragma unroll
            for (int u = 0; u < WG_U; ++u) {
                const int i = i0 + u * bd, o = i >> lg_r, j = i & (R - 1);
                v[u] = (i < o_total * R && s_g[j] >= 0) ? Num<T>::load(gy[s_g[j] + o * pix]) : (A)0;
            }
#pragma unroll
            for (int u = 0; u < WG_U; ++u) {
                const int i = i0 + u * bd;
                if (i < o_total * R) sg[(i & (R - 1)) * o_total + (i >> lg_r)] = v[u];
            }
        }
        for (int i0 = threadIdx.x; i0 < CK * R; i0 += WG_U * bd) {
            A v[WG_U];
#pragma unroll
            for (int u = 0; u < WG_U; ++u) {
                const int i = i0 + u * bd, ck = i < CK * R ? i >> lg_r : 0, j = i & (R - 1);
                const int ih = s_ih[j] + s_ki[ck], iw = s_iw[j] + s_kj[ck];
                v[u] = (i < CK * R && s_x[j] >= 0 && ih >= 0 && ih < H && iw >= 0 && iw < Wd)
                           ? Num<T>::load(x[s_x[j] + s_c[ck] + ih * Wd + iw])
                           : (A)0;
            }
#pragma unroll
            for (int u = 0; u < WG_U; ++u) {
                const int i = i0 + u * bd;
                if (i < CK * R) sx[(i & (R - 1)) * CK + (i >> lg_r)] = v[u];
            }
        }
        __syncthreads();
#pragma unroll
        for (int q = 0; q < WG_PER; ++q) {
            if (threadIdx.x + q * blockDim.x < W) {
                A a = acc[q];
#pragma unroll 8
                for (int j = 0; j < R; ++j) a += sg[j * o_total + orow[q]] * sx[j * CK + xrow[q]];
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

// Forward of a small filter (one group) over many positions: y[nn, o, oi, oj] = the sum over
// (c, ki, kj) of w[o, c, ki, kj] x[nn, c, oi s0 - p0 + ki d0, oj s1 - p1 + kj d1]. The
// weights are staged in shared memory (A; every lane of a warp reads the same one: a
// broadcast); one thread per output position computes every filter's output (o_total <=
// WF_O accumulators) from the taps it reads once, WF_U at a time. Contract (conv.rs
// `small_forward`): one group; o_total <= WF_O; c kh kw <= WF_TAPS; o_total c kh kw A fits
// the shared memory; x and y contiguous with fewer than 2^31 elements (32-bit indices).
#define WF_O 16
#define WF_TAPS 64
#define WF_U 8
template <typename T>
__device__ void conv_small_impl(ConvGeo g, i64 o_total_, const T* x, const T* w, T* y) {
    typedef typename Num<T>::A A;
    extern __shared__ __align__(16) unsigned char wf_smem[];
    A* sw = (A*)wf_smem;
    // Per tap (c, ki, kj): the channel's offset and the tap's offsets from the top-left.
    __shared__ int s_c[WF_TAPS], s_ki[WF_TAPS], s_kj[WF_TAPS];
    const int o_total = (int)o_total_, kw = (int)g.kw, kk = (int)(g.kh * g.kw);
    const int CK = (int)g.c * kk, H = (int)g.h, Wd = (int)g.w, OW = (int)g.ow;
    const int pix = (int)g.oh * OW, total = (int)g.n * pix;
    for (int i = threadIdx.x; i < o_total * CK; i += blockDim.x) sw[i] = Num<T>::load(w[i]);
    for (int ck = threadIdx.x; ck < CK; ck += blockDim.x) {
        int c = ck / kk, t = ck - c * kk, ki = t / kw;
        s_c[ck] = c * H * Wd;
        s_ki[ck] = ki * (int)g.d0;
        s_kj[ck] = (t - ki * kw) * (int)g.d1;
    }
    __syncthreads();
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < total; r += gridDim.x * blockDim.x) {
        const int nn = r / pix, p = r - nn * pix, oi = p / OW, oj = p - oi * OW;
        const int ih0 = oi * (int)g.s0 - (int)g.p0, iw0 = oj * (int)g.s1 - (int)g.p1;
        const T* xb = x + nn * (int)g.c * H * Wd;
        A acc[WF_O];
#pragma unroll
        for (int o = 0; o < WF_O; ++o) acc[o] = (A)0;
        // WF_U taps at a time: their loads in flight together, then their products.
        for (int ck0 = 0; ck0 < CK; ck0 += WF_U) {
            A v[WF_U];
#pragma unroll
            for (int u = 0; u < WF_U; ++u) {
                const int ck = ck0 + u, ih = ih0 + s_ki[ck < CK ? ck : 0], iw = iw0 + s_kj[ck < CK ? ck : 0];
                v[u] = (ck < CK && ih >= 0 && ih < H && iw >= 0 && iw < Wd) ? Num<T>::load(xb[s_c[ck] + ih * Wd + iw]) : (A)0;
            }
#pragma unroll
            for (int u = 0; u < WF_U; ++u) {
                if (ck0 + u >= CK) break;
#pragma unroll
                for (int o = 0; o < WF_O; ++o)
                    if (o < o_total) acc[o] += sw[o * CK + ck0 + u] * v[u];
            }
        }
        T* yb = y + nn * o_total * pix + p;
#pragma unroll
        for (int o = 0; o < WF_O; ++o)
            if (o < o_total) yb[o * pix] = Num<T>::store(acc[o]);
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
    extern "C" __global__ void wgrad_small_##S(ConvGeo g, i64 o_total, const T* x, const T* gy, Num<T>::A* part, i64 len, u32 lg_r) { wgrad_small_impl<T>(g, o_total, x, gy, part, len, lg_r); } \
    extern "C" __global__ void conv_small_##S(ConvGeo g, i64 o_total, const T* x, const T* w, T* y) { conv_small_impl<T>(g, o_total, x, w, y); } \
    extern "C" __global__ void wgrad_sum_##S(const Num<T>::A* part, i64 blocks, i64 w, T* dw) { wgrad_sum_impl<T>(part, blocks, w, dw); }
FOR_FLOATS(CONV_KERNELS)
