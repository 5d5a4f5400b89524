// Token sampling on the device, after a step's logits (`sample_rows`): the CPU sampler's
// operations (ferrite_llm::sampler) in its order, one workgroup of SW threads per logit row
// (SW = 256, or 1024 where the adapter allows it: the host rewrites the constant; the draws
// are the same for either, every sum being exact).
// The twin of the CUDA kernel set's sample.cu. WGSL has no u64: 64-bit values (keys,
// fixed-point masses, the random numbers) are vec2<u32>, x the low word and y the high word.
//
// 1. penalties over the last `last_n` entries of the sampler's token history, in place on the
//    logits (one thread per window entry; the first occurrence of a token applies the update
//    with its count, as the CPU's per-token loop);
// 2. greedy (temperature 0): the argmax (lowest id on ties; NaN and -inf never win), done;
// 3. s = logit * inv_t (f32, as the CPU); a candidate has a finite logit and a finite s
//    (tested on their bits);
// 4. every candidate gets a composite key K = (order-preserving bits of s) << 32 | ~id, so
//    that descending K is the CPU's order (s descending, id ascending) and keys are unique;
//    its weight w = exp(s - max) in f32 (the one difference from the CPU, which computes it in
//    f64) and a fixed-point mass q = round(w * 2^40), stored in `qs` (integer sums are exact
//    and order-free: the result does not depend on the order of atomics);
// 5. top-k: the k-th largest key by a radix select on K (8 bits per pass, histograms of
//    counts in workgroup memory, stopping once the selected bin holds a single key);
// 6. top-p: among the top-k, the key at which the mass in descending key order first reaches
//    ceil(top_p * mass of the top-k) (computed exactly from top_p's mantissa), by the same
//    radix select on mass histograms;
// 7. min-p: q >= round(min_p * 2^40) (w is the probability relative to the top one);
// 8. one draw: r = a counter-based random u64 (SplitMix64 of seed and draw counter, as
//    sample.cu), target = the high 64 bits of r * Q for the kept mass Q, found in index order
//    (each thread sums a contiguous segment of ids; the thread whose segment holds the target
//    walks it).
// Then the token goes to toks[slot], is appended to the history, and the draw counter
// advances.
//
// Sampler state (`st`, u32 words, at the row's offset o):
//   [0] 1 / temperature (f32 bits; 1 when greedy), [1] top_p, [2] min_p, [3] repeat,
//   [4] presence, [5] frequency (f32 bits), [6] top_k (0: all), [7] last_n, [8] 1: greedy,
//   [9] history length (tokens appended so far, the prompt's included), [10] R: history ring
//   size, [11] unused, [12..14] seed, [14..16] draw counter (u64, low word first),
//   [16..16 + R] the ring: history token h at [16 + h % R] (R = 0 where no penalty applies).
//
// params (`p`): [0] vocab n, [1] rows, then per row i at [2 + 3i]: its sampler's offset o in
// `st`, its logit row (logits[row * n..]), the slot of its token in `toks`. Workgroup i uses
// qs[i * n..(i + 1) * n] as its masses.

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> st: array<u32>;
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> qs: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> toks: array<u32>;

// Threads of a workgroup: a power of two, at least the 256 bins of a radix pass.
const SW: u32 = 256u;
const NONE: u32 = 0xffffffffu;
// Words of a sampler's state before its history ring.
const HEAD: u32 = 16u;

// A sampler's settings and counters (words 0..16 of its state).
struct Cfg {
    inv_t: f32,
    top_p: f32,
    min_p: f32,
    repeat: f32,
    presence: f32,
    frequency: f32,
    top_k: u32,
    last_n: u32,
    greedy: u32,
    hist_len: u32,
    ring: u32,
    pad: u32,
    seed: vec2<u32>,
    step: vec2<u32>,
}

var<workgroup> wcfg: Cfg;
// Radix select: per-bin counts, masses (low and high words), and the id of a key in the bin
// (read only where the bin holds one key).
var<workgroup> hc: array<atomic<u32>, 256>;
var<workgroup> hql: array<atomic<u32>, 256>;
var<workgroup> hqh: array<atomic<u32>, 256>;
var<workgroup> hid: array<atomic<u32>, 256>;
// Scans and sums of u64 values; the argmax's values and ids.
var<workgroup> scan: array<vec2<u32>, SW>;
var<workgroup> redf: array<f32, SW>;
var<workgroup> redi: array<u32, SW>;
// Radix select state: key prefix so far, the quantity above it, the selected bin, whether the
// bin holds a single key (then the result), the result.
var<workgroup> w_prefix: vec2<u32>;
var<workgroup> w_above: vec2<u32>;
var<workgroup> w_bin: u32;
var<workgroup> w_acc: vec2<u32>;
var<workgroup> w_done: u32;
var<workgroup> w_key: vec2<u32>;
// Largest s, its id, the number of candidates; the drawn token.
var<workgroup> w_m: f32;
var<workgroup> w_best: u32;
var<workgroup> w_n: u32;
var<workgroup> w_token: u32;

// ---- u64 arithmetic on vec2<u32> (x low, y high) ----

fn add64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let lo = a.x + b.x;
    return vec2<u32>(lo, a.y + b.y + select(0u, 1u, lo < a.x));
}

fn sub64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    return vec2<u32>(a.x - b.x, a.y - b.y - select(0u, 1u, a.x < b.x));
}

fn lt64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return a.y < b.y || (a.y == b.y && a.x < b.x);
}

fn ge64(a: vec2<u32>, b: vec2<u32>) -> bool {
    return !lt64(a, b);
}

// The full 64-bit product of two u32.
fn mul32(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    return vec2<u32>((p00 & 0xffffu) | (mid << 16u), a1 * b1 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u));
}

// a * b mod 2^64.
fn mul64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let l = mul32(a.x, b.x);
    return vec2<u32>(l.x, l.y + a.x * b.y + a.y * b.x);
}

// The high 64 bits of the 128-bit product a * b.
fn mulhi64(a: vec2<u32>, b: vec2<u32>) -> vec2<u32> {
    let ll = mul32(a.x, b.x);
    let lh = mul32(a.x, b.y);
    let hl = mul32(a.y, b.x);
    let hh = mul32(a.y, b.y);
    // Bits 32..63 of the product and their carries into bit 64.
    let mid = add64(add64(vec2<u32>(ll.y, 0u), vec2<u32>(lh.x, 0u)), vec2<u32>(hl.x, 0u));
    return add64(add64(add64(hh, vec2<u32>(lh.y, 0u)), vec2<u32>(hl.y, 0u)), vec2<u32>(mid.y, 0u));
}

// a >> s for 0 < s < 32.
fn shr64(a: vec2<u32>, s: u32) -> vec2<u32> {
    return vec2<u32>((a.x >> s) | (a.y << (32u - s)), a.y >> s);
}

// SplitMix64's output function.
fn mix64(z0: vec2<u32>) -> vec2<u32> {
    var z = mul64(z0 ^ shr64(z0, 30u), vec2<u32>(0x1CE4E5B9u, 0xBF58476Du));
    z = mul64(z ^ shr64(z, 27u), vec2<u32>(0x133111EBu, 0x94D049BBu));
    return z ^ shr64(z, 31u);
}

// ceil(f * q) for f in (0, 1), exactly: f = m * 2^-sh with m its 24-bit mantissa, so the
// product is the 96-bit q * m shifted right by sh, rounded up.
fn frac_ceil(q: vec2<u32>, f: f32) -> vec2<u32> {
    let b = bitcast<u32>(f);
    let e = (b >> 23u) & 0xffu;
    var m = b & 0x7fffffu;
    var sh = 149u;
    if (e != 0u) {
        m |= 0x800000u;
        sh = 150u - e;
    }
    let lo = mul32(q.x, m);
    let hi = mul32(q.y, m);
    var w0 = lo.x;
    var w1 = lo.y + hi.x;
    var w2 = hi.y + select(0u, 1u, w1 < lo.y);
    var rest = 0u;
    for (; sh >= 32u; sh -= 32u) {
        rest |= w0;
        w0 = w1;
        w1 = w2;
        w2 = 0u;
    }
    if (sh > 0u) {
        rest |= w0 & ((1u << sh) - 1u);
        w0 = (w0 >> sh) | (w1 << (32u - sh));
        w1 = (w1 >> sh) | (w2 << (32u - sh));
    }
    return add64(vec2<u32>(w0, w1), vec2<u32>(select(0u, 1u, rest != 0u), 0u));
}

// ---- candidates, keys, masses ----

fn finite(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}

// Order-preserving bits of an f32 (larger float, larger u32).
fn fkey(f: f32) -> u32 {
    let b = bitcast<u32>(f);
    return select(b | 0x80000000u, ~b, (b & 0x80000000u) != 0u);
}

fn key(s: f32, i: u32) -> vec2<u32> {
    return vec2<u32>(~i, fkey(s));
}

// round(w * 2^40) for w in [0, 1] (exact from the f32: x < 2^41 has a 24-bit mantissa).
fn mass(w: f32) -> vec2<u32> {
    let x = round(w * 1099511627776.0);
    let hi = floor(x * 2.3283064365386963e-10);
    return vec2<u32>(u32(x - hi * 4294967296.0), u32(hi));
}

// Byte `shift / 8` of a key.
fn byte_at(k: vec2<u32>, shift: u32) -> u32 {
    if (shift >= 32u) {
        return (k.y >> (shift - 32u)) & 255u;
    }
    return (k.x >> shift) & 255u;
}

// The bits of a key above byte `shift / 8`.
fn above_mask(shift: u32) -> vec2<u32> {
    let s = shift + 8u;
    if (s >= 64u) {
        return vec2<u32>(0u, 0u);
    }
    if (s >= 32u) {
        return vec2<u32>(0u, 0xffffffffu << (s - 32u));
    }
    return vec2<u32>(0xffffffffu << s, 0xffffffffu);
}

// ---- workgroup scans ----

// Inclusive prefix sum over the threads (thread t's value v; t ascending); scan[SW - 1] holds
// the total until the next call.
fn scan_incl(t: u32, v: vec2<u32>) -> vec2<u32> {
    workgroupBarrier();
    scan[t] = v;
    workgroupBarrier();
    var acc = v;
    for (var o = 1u; o < SW; o <<= 1u) {
        var add = vec2<u32>(0u, 0u);
        if (t >= o) {
            add = scan[t - o];
        }
        workgroupBarrier();
        acc = add64(acc, add);
        scan[t] = acc;
        workgroupBarrier();
    }
    return acc;
}

// The key, among candidates of the row (logits at `lrow`, masses at `qb`) with key >= kfloor,
// at which the quantity summed in descending key order first reaches `goal` (>= 1): the
// count of keys, or (`by_mass`) their masses. A radix select: per pass one byte of the keys
// under the prefix selected so far goes into 256 bins, and the bin where the running sum
// reaches the goal extends the prefix.
fn select_key(
    t: u32,
    lrow: u32,
    qb: u32,
    n: u32,
    inv_t: f32,
    kfloor: vec2<u32>,
    goal: vec2<u32>,
    by_mass: bool,
) -> vec2<u32> {
    if (t == 0u) {
        w_prefix = vec2<u32>(0u, 0u);
        w_above = vec2<u32>(0u, 0u);
    }
    for (var pass_i = 0u; pass_i < 8u; pass_i++) {
        let shift = 56u - 8u * pass_i;
        if (t < 256u) {
            atomicStore(&hc[t], 0u);
            atomicStore(&hql[t], 0u);
            atomicStore(&hqh[t], 0u);
        }
        if (t == 0u) {
            w_bin = NONE;
        }
        workgroupBarrier();
        let prefix = w_prefix;
        let hm = above_mask(shift);
        for (var i = t; i < n; i += SW) {
            let l = logits[lrow + i];
            let s = l * inv_t;
            if (!(finite(l) && finite(s))) {
                continue;
            }
            let k = key(s, i);
            if (lt64(k, kfloor) || any((k & hm) != prefix)) {
                continue;
            }
            let b = byte_at(k, shift);
            atomicAdd(&hc[b], 1u);
            atomicStore(&hid[b], i);
            if (by_mass) {
                let q = qs[qb + i];
                let old = atomicAdd(&hql[b], q.x);
                atomicAdd(&hqh[b], q.y + select(0u, 1u, old + q.x < old));
            }
        }
        workgroupBarrier();
        // Thread t < 256 holds bin 255 - t: the scan runs in descending key order (threads
        // past the bins add nothing).
        let b = 255u - min(t, 255u);
        var v = vec2<u32>(0u, 0u);
        if (t < 256u) {
            v = vec2<u32>(atomicLoad(&hc[b]), 0u);
            if (by_mass) {
                v = vec2<u32>(atomicLoad(&hql[b]), atomicLoad(&hqh[b]));
            }
        }
        let incl = scan_incl(t, v);
        let need = sub64(goal, w_above);
        let excl = sub64(incl, v);
        if (t < 256u && ge64(incl, need) && lt64(excl, need)) {
            w_bin = b;
            w_acc = excl;
        }
        workgroupBarrier();
        if (t == 0u) {
            if (w_bin == NONE) {
                // Never with exact sums; kept safe: the smallest non-empty bin.
                var lowest = 0u;
                for (var j = 255u; j > 0u; j--) {
                    if (atomicLoad(&hc[j]) > 0u) {
                        lowest = j;
                    }
                }
                var acc = vec2<u32>(0u, 0u);
                for (var j = 255u; j > lowest; j--) {
                    var bv = vec2<u32>(atomicLoad(&hc[j]), 0u);
                    if (by_mass) {
                        bv = vec2<u32>(atomicLoad(&hql[j]), atomicLoad(&hqh[j]));
                    }
                    acc = add64(acc, bv);
                }
                w_bin = lowest;
                w_acc = acc;
            }
            w_above = add64(w_above, w_acc);
            if (shift >= 32u) {
                w_prefix.y |= w_bin << (shift - 32u);
            } else {
                w_prefix.x |= w_bin << shift;
            }
            let one = atomicLoad(&hc[w_bin]) <= 1u;
            w_done = select(0u, 1u, one || shift == 0u);
            if (one || shift == 0u) {
                // The bin's one key (keys are unique: at the last byte every bin holds one).
                let i = atomicLoad(&hid[w_bin]);
                w_key = key(logits[lrow + i] * inv_t, i);
            }
        }
        if (workgroupUniformLoad(&w_done) != 0u) {
            break;
        }
    }
    return workgroupUniformLoad(&w_key);
}

// Candidate i's mass where it is kept (a candidate, key >= kfloor, mass >= qmin), else 0.
fn kept(lrow: u32, qb: u32, i: u32, inv_t: f32, kfloor: vec2<u32>, qmin: vec2<u32>) -> vec2<u32> {
    let q = qs[qb + i];
    if (lt64(q, qmin)) {
        return vec2<u32>(0u, 0u);
    }
    if (kfloor.x != 0u || kfloor.y != 0u) {
        let l = logits[lrow + i];
        let s = l * inv_t;
        if (lt64(key(s, i), kfloor)) {
            return vec2<u32>(0u, 0u);
        }
    }
    return q;
}

// sample_rows: workgroup r draws the token of row r of the params' table (see the header).
@compute @workgroup_size(SW)
fn sample_rows(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let r = wid.x + wid.y * nwg.x;
    let n = p[0];
    if (r >= p[1]) {
        return;
    }
    let o = p[2u + 3u * r];
    let lrow = p[3u + 3u * r] * n;
    let slot = p[4u + 3u * r];
    let qb = r * n;
    if (t == 0u) {
        var c: Cfg;
        c.inv_t = bitcast<f32>(st[o]);
        c.top_p = bitcast<f32>(st[o + 1u]);
        c.min_p = bitcast<f32>(st[o + 2u]);
        c.repeat = bitcast<f32>(st[o + 3u]);
        c.presence = bitcast<f32>(st[o + 4u]);
        c.frequency = bitcast<f32>(st[o + 5u]);
        c.top_k = st[o + 6u];
        c.last_n = st[o + 7u];
        c.greedy = st[o + 8u];
        c.hist_len = st[o + 9u];
        c.ring = st[o + 10u];
        c.pad = 0u;
        c.seed = vec2<u32>(st[o + 12u], st[o + 13u]);
        c.step = vec2<u32>(st[o + 14u], st[o + 15u]);
        wcfg = c;
    }
    let c = workgroupUniformLoad(&wcfg);

    // 1. Penalties.
    let wn = min(min(c.hist_len, c.last_n), c.ring);
    let pen = wn > 0u && (c.repeat != 1.0 || c.presence != 0.0 || c.frequency != 0.0);
    if (pen) {
        let w0 = c.hist_len - wn;
        let ring = o + HEAD;
        for (var j = t; j < wn; j += SW) {
            let tok = st[ring + (w0 + j) % c.ring];
            if (tok >= n) {
                continue;
            }
            var first = true;
            var cnt = 0u;
            for (var e = 0u; e < wn; e++) {
                if (st[ring + (w0 + e) % c.ring] == tok) {
                    if (e < j) {
                        first = false;
                    }
                    cnt += 1u;
                }
            }
            if (!first) {
                continue;
            }
            var l = logits[lrow + tok];
            if (l > 0.0) {
                l = l / c.repeat;
            } else {
                l = l * c.repeat;
            }
            l -= f32(cnt) * c.frequency + c.presence;
            logits[lrow + tok] = l;
        }
    }
    storageBarrier();

    // 2./3. The largest s (lowest id on ties) and the number of candidates.
    let greedy = c.greedy != 0u;
    let inv_t = select(c.inv_t, 1.0, greedy);
    var bv = 0.0;
    var bi = NONE;
    var cnt = 0u;
    for (var i = t; i < n; i += SW) {
        let l = logits[lrow + i];
        let s = l * inv_t;
        var ok = finite(l) && finite(s);
        if (greedy) {
            // The CPU's argmax: +inf may win; NaN and -inf never do.
            let b = bitcast<u32>(l);
            ok = (b & 0x7fffffffu) <= 0x7f800000u && b != 0xff800000u;
        }
        if (!ok) {
            continue;
        }
        cnt += 1u;
        if (bi == NONE || s > bv) {
            bv = s;
            bi = i;
        }
    }
    redf[t] = bv;
    redi[t] = bi;
    scan[t] = vec2<u32>(cnt, 0u);
    workgroupBarrier();
    for (var o2 = SW / 2u; o2 > 0u; o2 >>= 1u) {
        if (t < o2) {
            let ov = redf[t + o2];
            let oi = redi[t + o2];
            let mi = redi[t];
            if (oi != NONE && (mi == NONE || ov > redf[t] || (ov == redf[t] && oi < mi))) {
                redf[t] = ov;
                redi[t] = oi;
            }
            scan[t].x += scan[t + o2].x;
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        w_m = redf[0];
        w_best = select(redi[0], 0u, redi[0] == NONE);
        w_n = scan[0].x;
        w_token = w_best;
    }
    let n_cand = workgroupUniformLoad(&w_n);

    if (!greedy && n_cand > 1u) {
        let m = w_m;
        // 4. Fixed-point masses.
        for (var i = t; i < n; i += SW) {
            let l = logits[lrow + i];
            let s = l * inv_t;
            var q = vec2<u32>(0u, 0u);
            if (finite(l) && finite(s)) {
                q = mass(exp(s - m));
            }
            qs[qb + i] = q;
        }
        storageBarrier();
        // 5. Top-k.
        var cut_k = vec2<u32>(0u, 0u);
        if (c.top_k > 0u && c.top_k < n_cand) {
            cut_k = select_key(t, lrow, qb, n, inv_t, cut_k, vec2<u32>(c.top_k, 0u), false);
        }
        // 6. Top-p.
        var cut_p = vec2<u32>(0u, 0u);
        if (c.top_p < 1.0) {
            var part = vec2<u32>(0u, 0u);
            for (var i = t; i < n; i += SW) {
                part = add64(part, kept(lrow, qb, i, inv_t, cut_k, vec2<u32>(0u, 0u)));
            }
            scan_incl(t, part);
            let qk = scan[SW - 1u];
            var goal = frac_ceil(qk, c.top_p);
            if (lt64(goal, vec2<u32>(1u, 0u))) {
                goal = vec2<u32>(1u, 0u);
            }
            if (lt64(qk, goal)) {
                goal = qk;
            }
            cut_p = select_key(t, lrow, qb, n, inv_t, cut_k, goal, true);
        }
        let kfloor = select(cut_k, cut_p, lt64(cut_k, cut_p));
        // 7. Min-p.
        let qmin = mass(c.min_p);
        // 8. The draw: each thread's contiguous segment of ids, in thread order.
        let seg = (n + SW - 1u) / SW;
        let s0 = min(n, t * seg);
        let s1 = min(n, s0 + seg);
        var v = vec2<u32>(0u, 0u);
        for (var i = s0; i < s1; i++) {
            v = add64(v, kept(lrow, qb, i, inv_t, kfloor, qmin));
        }
        let incl = scan_incl(t, v);
        let total = scan[SW - 1u];
        let golden = vec2<u32>(0x7F4A7C15u, 0x9E3779B9u);
        let salt = add64(mul64(c.step, vec2<u32>(0xD192ED03u, 0xD1B54A32u)), vec2<u32>(1u, 0u));
        let rnd = mix64(mix64(add64(c.seed, golden)) ^ salt);
        // Uniform in [0, total).
        let goal = mulhi64(rnd, total);
        var acc = sub64(incl, v);
        if (ge64(goal, acc) && lt64(goal, incl)) {
            for (var i = s0; i < s1; i++) {
                let k = kept(lrow, qb, i, inv_t, kfloor, qmin);
                acc = add64(acc, k);
                if (lt64(goal, acc)) {
                    w_token = i;
                    break;
                }
            }
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        let tok = w_token;
        toks[slot] = tok;
        if (c.ring > 0u) {
            st[o + HEAD + c.hist_len % c.ring] = tok;
        }
        st[o + 9u] = c.hist_len + 1u;
        let step = add64(c.step, vec2<u32>(1u, 0u));
        st[o + 14u] = step.x;
        st[o + 15u] = step.y;
    }
}
