// Attention and its backward, one workgroup per query row (b, h, i), f32 arithmetic; the
// probabilities go through a scratch buffer [rows, lk] (memory O(rows lk); a tiled flash
// kernel is the fast path still to come). q [b, hq, lq, d], k [b, hkv, lk, d],
// v [b, hkv, lk, dv], all contiguous; query head h reads kv head h / (hq / hkv). With causal,
// query i sees keys j < min(lk, max(i + lk - lq, 0) + 1) (the CPU's rule: at least key 0).
// With AM, XM is a key-padding mask [b, lk] (nonzero = padding): masked keys get probability
// 0; a query left with no key gets a NaN row forward and zero gradients backward.
// P: [rows, hq, hkv, lq, lk, d, dv, causal, scale, q_off, k_off, v_off, g_off, mask_off].

#if AF
@group(0) @binding(1) var<storage, read_write> Y0: array<u32>;
@group(0) @binding(2) var<storage, read_write> PS: array<f32>;
@group(0) @binding(3) var<storage, read> XQ: array<u32>;
@group(0) @binding(4) var<storage, read> XK: array<u32>;
@group(0) @binding(5) var<storage, read> XV: array<u32>;
#if AM
@group(0) @binding(6) var<storage, read> XM: array<u32>;
#if AL
@group(0) @binding(7) var<storage, read_write> YL: array<f32>;
#endif
#else
#if AL
@group(0) @binding(6) var<storage, read_write> YL: array<f32>;
#endif
#endif
#endif
#if AB
@group(0) @binding(1) var<storage, read_write> Y0: array<u32>;
@group(0) @binding(2) var<storage, read_write> PS: array<f32>;
@group(0) @binding(3) var<storage, read_write> DS: array<f32>;
@group(0) @binding(4) var<storage, read> XQ: array<u32>;
@group(0) @binding(5) var<storage, read> XK: array<u32>;
@group(0) @binding(6) var<storage, read> XV: array<u32>;
@group(0) @binding(7) var<storage, read> XG: array<u32>;
#if AM
@group(0) @binding(8) var<storage, read> XM: array<u32>;
#endif
#endif
#if AK
@group(0) @binding(1) var<storage, read_write> Y0: array<u32>;
@group(0) @binding(2) var<storage, read_write> Y1: array<u32>;
@group(0) @binding(3) var<storage, read> XQ: array<u32>;
@group(0) @binding(4) var<storage, read> PS: array<f32>;
@group(0) @binding(5) var<storage, read> DS: array<f32>;
@group(0) @binding(6) var<storage, read> XG: array<u32>;
#endif

var<workgroup> red: array<f32, 256>;

fn wg_sum(v: f32, t: u32) -> f32 {
    red[t] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) { red[t] += red[t + s]; }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn wg_max(v: f32, t: u32) -> f32 {
    red[t] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) { red[t] = max(red[t], red[t + s]); }
        workgroupBarrier();
    }
    let r = red[0];
    workgroupBarrier();
    return r;
}

fn ld(w: u32) -> f32 {
    return f32(bitcast<T>(w));
}

fn st(v: f32) -> u32 {
    return bitcast<u32>(fit_T(T(v)));
}

// Keys visible to query i.
fn visible(i: u32) -> u32 {
    let lq = P[3];
    let lk = P[4];
    if (P[7] == 0u) { return lk; }
    var first = 0u;
    if (i + lk > lq) { first = i + lk - lq; }
    return min(lk, first + 1u);
}

// Whether key j is padding for query row `row` (of q's rows).
#if AM
fn masked(row: u32, j: u32) -> bool {
    let b = row / (P[3] * P[1]);
    return XM[P[13] + b * P[4] + j] != 0u;
}
#else
fn masked(row: u32, j: u32) -> bool {
    return false;
}
#endif

// Word offset of kv row j for query row `row` (of q's rows), from the start of k (width w).
fn kv_row(row: u32, j: u32, w: u32) -> u32 {
    let lq = P[3];
    let h = (row / lq) % P[1];
    let b = row / (lq * P[1]);
    let kh = h / (P[1] / P[2]);
    return ((b * P[2] + kh) * P[4] + j) * w;
}

#if AF
@compute @workgroup_size(256)
fn attention(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = group_id(wid, nwg);
    if (row >= P[0]) { return; }
    let t = lid.x;
    let d = P[5];
    let dv = P[6];
    let lk = P[4];
    let vis = visible(row % P[3]);
    let qb = P[9] + row * d;
    let pb = row * lk;
    var m = -3.4028235e38;
    for (var j = t; j < vis; j += WG) {
        if (masked(row, j)) { continue; }
        let kb = P[10] + kv_row(row, j, d);
        var s = 0.0;
        for (var c = 0u; c < d; c++) { s += ld(XQ[qb + c]) * ld(XK[kb + c]); }
        s *= pf(8u);
        PS[pb + j] = s;
        m = max(m, s);
    }
    m = wg_max(m, t);
    var sum = 0.0;
    for (var j = t; j < vis; j += WG) {
        var e = 0.0;
        if (!masked(row, j)) { e = exp(PS[pb + j] - m); }
        PS[pb + j] = e;
        sum += e;
    }
    sum = wg_sum(sum, t);
    storageBarrier();
    // No unmasked key: NaN (built at run time: a constant NaN is a shader-creation error).
    let nan = bitcast<f32>(0x7fc00000u + min(P[0], 0u));
#if AL
    // lse: +inf where no key is visible (built at run time, as the NaN).
    if (t == 0u) { YL[row] = select(bitcast<f32>(0x7f800000u + min(P[0], 0u)), m + log(sum), sum > 0.0); }
#endif
    // The output is stored [b, lq, hq, dv] (query row `row` is (b, h, i)).
    let orow = ((row / (P[3] * P[1])) * P[3] + row % P[3]) * P[1] + (row / P[3]) % P[1];
    for (var c = t; c < dv; c += WG) {
        var acc = 0.0;
        for (var j = 0u; j < vis; j++) {
            acc += PS[pb + j] * ld(XV[P[11] + kv_row(row, j, dv) + c]);
        }
        Y0[orow * dv + c] = st(select(nan, acc / sum, sum > 0.0));
    }
}
#endif

#if AB
// Per query row: probabilities p (PS), ds = p (dp - sum(p dp)) scale (DS), dq = ds k.
@compute @workgroup_size(256)
fn attention_backward_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                           @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = group_id(wid, nwg);
    if (row >= P[0]) { return; }
    let t = lid.x;
    let d = P[5];
    let dv = P[6];
    let lk = P[4];
    let vis = visible(row % P[3]);
    let qb = P[9] + row * d;
    let gb = P[12] + row * dv;
    let pb = row * lk;
    var m = -3.4028235e38;
    for (var j = t; j < lk; j += WG) {
        var s = -3.4028235e38;
        if (j < vis && !masked(row, j)) {
            let kb = P[10] + kv_row(row, j, d);
            s = 0.0;
            for (var c = 0u; c < d; c++) { s += ld(XQ[qb + c]) * ld(XK[kb + c]); }
            s *= pf(8u);
        }
        PS[pb + j] = s;
        m = max(m, s);
    }
    m = wg_max(m, t);
    var sum = 0.0;
    for (var j = t; j < lk; j += WG) {
        var e = 0.0;
        if (j < vis && !masked(row, j)) { e = exp(PS[pb + j] - m); }
        PS[pb + j] = e;
        sum += e;
    }
    sum = wg_sum(sum, t);
    var pdp = 0.0;
    for (var j = t; j < lk; j += WG) {
        // A query with no unmasked key has p = 0 everywhere: no gradient.
        let p = select(0.0, PS[pb + j] / sum, sum > 0.0);
        PS[pb + j] = p;
        var dp = 0.0;
        if (j < vis) {
            let vb = P[11] + kv_row(row, j, dv);
            for (var c = 0u; c < dv; c++) { dp += ld(XG[gb + c]) * ld(XV[vb + c]); }
        }
        DS[pb + j] = dp;
        pdp += p * dp;
    }
    pdp = wg_sum(pdp, t);
    for (var j = t; j < lk; j += WG) {
        DS[pb + j] = PS[pb + j] * (DS[pb + j] - pdp) * pf(8u);
    }
    storageBarrier();
    workgroupBarrier();
    for (var c = t; c < d; c += WG) {
        var acc = 0.0;
        for (var j = 0u; j < vis; j++) {
            acc += DS[pb + j] * ld(XK[P[10] + kv_row(row, j, d) + c]);
        }
        Y0[row * d + c] = st(acc);
    }
}
#endif

#if AK
// dk = sum over the group's query rows of ds q, dv = sum of p g: one thread per element of
// a kv row ([b, hkv, lk] rows of max(d, dv) threads). Y0: dk, Y1: dv.
@compute @workgroup_size(256)
fn attention_backward_keys(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                           @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = thread_id(wid, lid, nwg);
    let d = P[5];
    let dv = P[6];
    let width = max(d, dv);
    let hq = P[1];
    let hkv = P[2];
    let lq = P[3];
    let lk = P[4];
    let kvrows = (P[0] / (lq * hq)) * hkv * lk;
    if (e >= kvrows * width) { return; }
    let c = e % width;
    let kr = e / width;
    let j = kr % lk;
    let kh = (kr / lk) % hkv;
    let b = kr / (lk * hkv);
    let group = hq / hkv;
    var dk = 0.0;
    var dvv = 0.0;
    for (var hg = 0u; hg < group; hg++) {
        let h = kh * group + hg;
        for (var i = 0u; i < lq; i++) {
            let row = (b * hq + h) * lq + i;
            if (j >= visible(i)) { continue; }
            if (c < d) { dk += DS[row * lk + j] * ld(XQ[P[9] + row * d + c]); }
            if (c < dv) { dvv += PS[row * lk + j] * ld(XG[P[12] + row * dv + c]); }
        }
    }
    if (c < d) { Y0[kr * d + c] = st(dk); }
    if (c < dv) { Y1[kr * dv + c] = st(dvv); }
}
#endif
