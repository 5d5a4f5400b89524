#line 1 "sample.cu"
// Token sampling on the device, the last kernel of the decode step (after the output product):
// the CPU sampler's operations (crate::sampler) in its order, with one block of SP_T threads.
//
// 1. penalties over the last `last_n` entries of the device history, in place on the logits
//    (one thread per window entry; the first occurrence of a token applies the update with its
//    count, as the CPU's per-token loop);
// 2. greedy (temperature 0): the argmax (lowest id on ties), done;
// 3. s = logit * inv_t (f32, as the CPU); non-finite logits are left out;
// 4. every candidate gets a composite key K = (order-preserving bits of s) << 32 | ~id, so
//    that descending K is the CPU's order (logit descending, id ascending) and keys are unique;
//    its weight w = exp(s - max) in f64 (the CPU's numerator) and a fixed-point mass
//    q = round(w * 2^40) (u64: integer sums are exact and order-free, so the result does not
//    depend on the order of atomics);
// 5. top-k: the k-th largest key by a radix select on K (8 bits per pass, histograms of counts
//    in shared memory, stopping once the selected bin holds a single key);
// 6. top-p: among the top-k, the key at which the mass in descending order first reaches
//    ceil(top_p * mass of the top-k), by the same radix select on mass histograms;
// 7. min-p: w >= min_p (w is the probability relative to the top one);
// 8. one draw: r = a counter-based random u64 (SplitMix64 of seed and step), target =
//    mulhi(r, Q) for the kept mass Q, found in index order (each warp sums a contiguous
//    segment; the warp whose segment holds the target walks it 32 at a time).
// Then the token goes to out[0], is appended to the history, and the step counter advances.

#define SP_T 1024
#define SP_W (SP_T / 32)
#define SP_QSCALE 1099511627776.0  // 2^40

// Layout of `SampleParams` in sample.rs.
struct SampleParams {
    float inv_t;
    float top_p;
    float min_p;
    float repeat;
    float presence;
    float frequency;
    u32 top_k;
    u32 last_n;
    u32 greedy;    // temperature 0: the argmax after the penalties
    u32 hist_len;  // tokens in the history (advanced here)
    u32 hist_cap;
    u32 pad;
    u64 seed;
    u64 step;  // draws so far (advanced here)
};


__device__ __forceinline__ u32 sp_fkey(float f) {
    u32 b = __float_as_uint(f);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ u64 sp_mix(u64 z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// Sum over the block (every thread gets it). `red` holds SP_W values.
template <typename T>
__device__ __forceinline__ T sp_sum(T v, T* red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    T s = 0;
    for (int w = 0; w < SP_W; ++w) s += red[w];  // fixed order: deterministic
    return s;
}

struct SpState {
    u64 cut_k;     // kept: K >= cut_k (top-k), 0 = all
    u64 cut_p;     // and K >= cut_p (top-p), 0 = all
    float m;        // largest s
    u32 n;          // candidates (finite s)
    u32 best;       // argmax id
    u64 sel;       // radix select: result
    u64 prefix;
    u64 above;
    u32 bin;
    u32 single;
    u32 warp_hit;
    u64 resid;
    u32 token;
};

__device__ __forceinline__ bool sp_cand(const float* logits, u32 i, float inv_t, float& s) {
    const float l = logits[i];
    s = l * inv_t;
    return isfinite(l) && isfinite(s);
}

__device__ __forceinline__ u64 sp_key(float s, u32 i) {
    return ((u64)sp_fkey(s) << 32) | (u64)(~i);
}

// The key (among candidates with K >= kfloor) at which the quantity summed in descending key
// order first reaches `target` (count, or fixed-point mass when `mass`).
__device__ u64 sp_select(const float* logits, const u64* q, u32 n, float inv_t, u64 kfloor,
                          u64 target, bool mass, SpState& st, u32* hc, u64* hq) {
    const u32 tid = threadIdx.x, lane = tid & 31;
    if (tid == 0) {
        st.prefix = 0;
        st.above = 0;
        st.single = 0;
    }
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (u32 b = tid; b < 256; b += SP_T) {
            hc[b] = 0;
            hq[b] = 0;
        }
        __syncthreads();
        const u64 prefix = st.prefix;
        const u64 hmask = shift == 56 ? 0ull : (~0ull << (shift + 8));
        for (u32 i = tid; i < n; i += SP_T) {
            float s;
            if (!sp_cand(logits, i, inv_t, s)) continue;
            const u64 k = sp_key(s, i);
            if (k < kfloor || (k & hmask) != prefix) continue;
            const u32 b = (u32)(k >> shift) & 255u;
            atomicAdd(&hc[b], 1u);
            if (mass) atomicAdd(&hq[b], q[i]);
        }
        __syncthreads();
        if (tid < 32) {
            // lane l covers bins 255 - 8l ... 248 - 8l (descending).
            u64 mine = 0;
            for (int j = 0; j < 8; ++j) {
                const u32 b = 255 - 8 * lane - j;
                mine += mass ? hq[b] : (u64)hc[b];
            }
            u64 incl = mine;
            for (int o = 1; o < 32; o <<= 1) {
                const u64 t = __shfl_up_sync(0xffffffffu, incl, o);
                if ((int)lane >= o) incl += t;
            }
            const u64 need = target - st.above;  // >= 1
            const unsigned hit = __ballot_sync(0xffffffffu, incl >= need);
            if (hit) {
                const u32 l = __ffs(hit) - 1;
                if (lane == l) {
                    u64 acc = incl - mine;
                    u32 chosen = 255 - 8 * l - 7;
                    for (int j = 0; j < 8; ++j) {
                        const u32 b = 255 - 8 * l - j;
                        const u64 v = mass ? hq[b] : (u64)hc[b];
                        if (acc + v >= need && hc[b] > 0) {
                            chosen = b;
                            break;
                        }
                        acc += v;
                    }
                    st.above += acc;
                    st.bin = chosen;
                }
            } else if (lane == 0) {
                // Rounding left the target past the total: the smallest non-empty bin.
                u64 acc = 0;
                u32 chosen = 0;
                for (int b = 255; b >= 0; --b) {
                    if (hc[b] > 0) chosen = (u32)b;
                }
                for (u32 b = 255; b > chosen; --b) acc += mass ? hq[b] : (u64)hc[b];
                st.above += acc;
                st.bin = chosen;
            }
            __syncwarp();
            if (lane == 0) {
                st.prefix |= (u64)st.bin << shift;
                st.single = hc[st.bin] <= 1 ? 1u : 0u;
            }
        }
        __syncthreads();
        if (st.single || shift == 0) {
            if (shift == 0) {
                st.sel = st.prefix;
            } else {
                // One key under the prefix: find it.
                const u64 pm = ~0ull << shift;
                const u64 p = st.prefix;
                for (u32 i = tid; i < n; i += SP_T) {
                    float s;
                    if (!sp_cand(logits, i, inv_t, s)) continue;
                    const u64 k = sp_key(s, i);
                    if (k >= kfloor && (k & pm) == p) st.sel = k;
                }
            }
            __syncthreads();
            return st.sel;
        }
        __syncthreads();
    }
    return st.sel;  // not reached
}

// The sampler of one block of SP_T threads: `sp` its settings and counters, `hist` its token
// history (u32 [hist_cap]), `logits` f32 [n] (penalized in place), `q` u64 [n] scratch; the
// token goes to `*out`, is appended to the history, and the draw counter advances.
__device__ __forceinline__ void sp_run(SampleParams* sp, u32* hist, float* logits, u32 n, u64* q, u32* out) {
    __shared__ SpState st;
    __shared__ u32 hc[256];
    __shared__ u64 hq[256];
    __shared__ u64 red[SP_W];
    __shared__ float redf[SP_W];
    __shared__ u32 redi[SP_W];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    // 1. Penalties.
    const u32 hl = sp->hist_len;
    const u32 wn = min(hl, sp->last_n);
    const bool pen = wn > 0 && (sp->repeat != 1.0f || sp->presence != 0.0f || sp->frequency != 0.0f);
    if (pen) {
        const u32* w = hist + (hl - wn);
        for (u32 j = tid; j < wn; j += SP_T) {
            const u32 t = w[j];
            if (t >= n) continue;
            bool first = true;
            u32 c = 0;
            for (u32 e = 0; e < wn; ++e) {
                if (w[e] == t) {
                    if (e < j) first = false;
                    ++c;
                }
            }
            if (!first) continue;
            float l = logits[t];
            if (l > 0.0f) {
                l /= sp->repeat;
            } else {
                l *= sp->repeat;
            }
            l -= (float)c * sp->frequency + sp->presence;
            logits[t] = l;
        }
        __syncthreads();
    }

    // 2./3. Largest s (argmax, lowest id on ties) and the candidate count.
    const bool greedy = sp->greedy != 0;
    const float inv_t = greedy ? 1.0f : sp->inv_t;
    float bv = neg_inf<float>();
    u32 bi = 0xffffffffu, cnt = 0;
    for (u32 i = tid; i < n; i += SP_T) {
        const float l = logits[i];
        const float s = l * inv_t;
        const bool ok = greedy ? !(isnan(l) || l == neg_inf<float>()) : (isfinite(l) && isfinite(s));
        if (!ok) continue;
        ++cnt;
        if (s > bv || bi == 0xffffffffu) {
            bv = s;
            bi = i;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const u32 oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (oi != 0xffffffffu && (bi == 0xffffffffu || ov > bv || (ov == bv && oi < bi))) {
            bv = ov;
            bi = oi;
        }
    }
    if (lane == 0) {
        redf[warp] = bv;
        redi[warp] = bi;
    }
    const u32 total = sp_sum<u32>(cnt, hc);  // syncs: redf/redi visible after it
    if (tid == 0) {
        float v = neg_inf<float>();
        u32 id = 0xffffffffu;
        for (int w = 0; w < SP_W; ++w) {
            if (redi[w] != 0xffffffffu && (id == 0xffffffffu || redf[w] > v || (redf[w] == v && redi[w] < id))) {
                v = redf[w];
                id = redi[w];
            }
        }
        st.m = v;
        st.best = id == 0xffffffffu ? 0u : id;
        st.n = total;
        st.token = st.best;
    }
    __syncthreads();

    if (!greedy && st.n > 1) {
        const float m = st.m;
        const double md = (double)m;
        // 4. Fixed-point masses.
        for (u32 i = tid; i < n; i += SP_T) {
            float s;
            u64 v = 0;
            if (sp_cand(logits, i, inv_t, s)) v = (u64)__double2ll_rn(exp((double)s - md) * SP_QSCALE);
            q[i] = v;
        }
        __syncthreads();
        // 5. Top-k.
        u64 cut_k = 0;
        const u32 k = sp->top_k;
        if (k > 0 && k < st.n) cut_k = sp_select(logits, q, n, inv_t, 0, k, false, st, hc, hq);
        // 6. Top-p.
        u64 cut_p = 0;
        if (sp->top_p < 1.0f) {
            u64 part = 0;
            for (u32 i = tid; i < n; i += SP_T) {
                float s;
                if (sp_cand(logits, i, inv_t, s) && sp_key(s, i) >= cut_k) part += q[i];
            }
            const u64 qk = sp_sum<u64>(part, red);
            u64 target = (u64)ceil((double)sp->top_p * (double)qk);
            if (target < 1) target = 1;
            if (target > qk) target = qk;
            cut_p = sp_select(logits, q, n, inv_t, cut_k, target, true, st, hc, hq);
        }
        const u64 kfloor = cut_k > cut_p ? cut_k : cut_p;
        const double min_p = (double)sp->min_p;
        // 7./8. The kept mass, per warp over a contiguous segment of ids.
        const u32 seg = (n + SP_W - 1) / SP_W;
        const u32 s0 = warp * seg, s1 = min(n, s0 + seg);
        auto kept = [&](u32 i) -> u64 {
            float s;
            if (!sp_cand(logits, i, inv_t, s) || sp_key(s, i) < kfloor) return 0;
            if (min_p > 0.0 && exp((double)s - md) < min_p) return 0;
            return q[i];
        };
        u64 wsum = 0;
        for (u32 i = s0 + lane; i < s1; i += 32) wsum += kept(i);
        for (int o = 16; o > 0; o >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, o);
        __syncthreads();
        if (lane == 0) red[warp] = wsum;
        __syncthreads();
        if (tid == 0) {
            u64 tot = 0;
            for (int w = 0; w < SP_W; ++w) tot += red[w];
            const u64 r = sp_mix(sp_mix(sp->seed + 0x9E3779B97F4A7C15ull) ^ (sp->step * 0xD1B54A32D192ED03ull + 1));
            const u64 target = __umul64hi(r, tot);  // uniform in [0, tot)
            u64 acc = 0;
            st.warp_hit = 0xffffffffu;
            for (int w = 0; w < SP_W; ++w) {
                if (target < acc + red[w]) {
                    st.warp_hit = (u32)w;
                    st.resid = target - acc;
                    break;
                }
                acc += red[w];
            }
        }
        __syncthreads();
        if (warp == st.warp_hit) {
            u64 r = st.resid;
            for (u32 c = s0; c < s1; c += 32) {
                const u32 i = c + lane;
                const u64 v = i < s1 ? kept(i) : 0;
                u64 incl = v;
                for (int o = 1; o < 32; o <<= 1) {
                    const u64 t = __shfl_up_sync(0xffffffffu, incl, o);
                    if ((int)lane >= o) incl += t;
                }
                const u64 csum = __shfl_sync(0xffffffffu, incl, 31);
                if (r < csum) {
                    const unsigned hit = __ballot_sync(0xffffffffu, r < incl);
                    if (lane == (u32)(__ffs(hit) - 1)) st.token = i;
                    break;
                }
                r -= csum;
            }
        }
        __syncthreads();
    }
    if (tid == 0) {
        const u32 tok = st.token;
        *out = tok;
        if (hl < sp->hist_cap) {
            hist[hl] = tok;
            sp->hist_len = hl + 1;
        }
        sp->step += 1;
    }
}

// The samplers of several logit rows (the engine's step), one block each: `table` holds a
// SpRow per block (its sampler state and scratch, its logit row, where its token goes, and a
// second place for it, host memory the host reads, or 0).
struct SpRow {
    u64 sp, hist, logits, q, out, mail;
};
extern "C" __global__ void __launch_bounds__(SP_T) sample_rows(u64 table, u32 n) {
    pdl_wait();
    pdl_launch();
    const SpRow r = ((const SpRow*)table)[blockIdx.x];
    sp_run((SampleParams*)r.sp, (u32*)r.hist, (float*)r.logits, n, (u64*)r.q, (u32*)r.out);
    if (r.mail && threadIdx.x == 0) *(volatile u32*)r.mail = *(volatile u32*)r.out;
}
