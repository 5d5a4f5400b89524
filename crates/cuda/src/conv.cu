// Convolution helpers and max pooling. Convolutions are im2col + cuBLASLt matmul (conv.rs):
// im2col writes the column matrix of x in a layout given by strides, col2im gathers a column
// matrix back into image pixels (the adjoint, without atomics: each thread sums the taps
// that read its pixel). Inputs are contiguous; f16/bf16 accumulate in f32.

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

#define CONV_KERNELS(S, T) \
    extern "C" __global__ void im2col_##S(ConvGeo g, const T* x, T* cols, i64 sn, i64 sg, i64 sk) { im2col_impl<T>(g, x, cols, sn, sg, sk); } \
    extern "C" __global__ void col2im_##S(ConvGeo g, const T* cols, T* dx, i64 sn, i64 sg, i64 sk) { col2im_impl<T>(g, cols, dx, sn, sg, sk); } \
    extern "C" __global__ void max_pool2d_##S(PoolGeo g, const T* x, T* y, u32* idx) { max_pool2d_impl<T>(g, x, y, idx); }
FOR_FLOATS(CONV_KERNELS)
