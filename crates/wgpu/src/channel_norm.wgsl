// Batch norm (statistics per channel over every other axis) and group norm (per sample and
// group of channels), and their backward, over a contiguous x [n, c, s] (s: the spatial
// elements). A *segment* is what one set of statistics covers: channel c (batch) or sample
// and group (group). One workgroup per segment; f32 arithmetic.
// P: [segs, len, group_mode, c, s, groups, eps, x_off, w_off, b_off (g_off in backward)].

@group(0) @binding(1) var<storage, read_write> Y0: array<u32>;
#if CN
@group(0) @binding(2) var<storage, read_write> Y1: array<u32>;
@group(0) @binding(3) var<storage, read_write> Y2: array<u32>;
@group(0) @binding(4) var<storage, read> X0: array<u32>;
@group(0) @binding(5) var<storage, read> X1: array<u32>;
@group(0) @binding(6) var<storage, read> X2: array<u32>;
#endif
#if CNB
@group(0) @binding(2) var<storage, read_write> S1: array<f32>;
@group(0) @binding(3) var<storage, read> X0: array<u32>;
@group(0) @binding(4) var<storage, read> X1: array<u32>;
@group(0) @binding(5) var<storage, read> X2: array<u32>;
#endif
#if CNC
@group(0) @binding(2) var<storage, read_write> Y1: array<u32>;
@group(0) @binding(3) var<storage, read> X0: array<u32>;
@group(0) @binding(4) var<storage, read> S1: array<f32>;
@group(0) @binding(5) var<storage, read> X2: array<u32>;
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

fn ld(w: u32) -> f32 {
    return f32(bitcast<T>(w));
}

fn st(v: f32) -> u32 {
    return bitcast<u32>(fit_T(T(v)));
}

// Offset (from x's start) of element e of segment k.
fn addr(k: u32, e: u32) -> u32 {
    let c = P[3];
    let s = P[4];
    if (P[2] == 0u) {
        return (e / s) * c * s + k * s + e % s;
    }
    let g = P[5];
    let cg = c / g;
    return (k / g) * c * s + (k % g) * cg * s + e;
}

// Channel of element e of segment k.
fn channel(k: u32, e: u32) -> u32 {
    if (P[2] == 0u) { return k; }
    let cg = P[3] / P[5];
    return (k % P[5]) * cg + e / P[4];
}

#if CN
// Y0: y, Y1 / Y2: each segment's mean and biased variance.
@compute @workgroup_size(256)
fn channel_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = group_id(wid, nwg);
    if (k >= P[0]) { return; }
    let len = P[1];
    let t = lid.x;
    var s = 0.0;
    for (var e = t; e < len; e += WG) { s += ld(X0[P[7] + addr(k, e)]); }
    let mu = wg_sum(s, t) / f32(max(len, 1u));
    var q = 0.0;
    for (var e = t; e < len; e += WG) {
        let d = ld(X0[P[7] + addr(k, e)]) - mu;
        q += d * d;
    }
    let var_ = wg_sum(q, t) / f32(max(len, 1u));
    let r = inverseSqrt(var_ + pf(6u));
    for (var e = t; e < len; e += WG) {
        let a = addr(k, e);
        let ch = channel(k, e);
        Y0[a] = st((ld(X0[P[7] + a]) - mu) * r * ld(X1[P[8] + ch]) + ld(X2[P[9] + ch]));
    }
    if (t == 0u) {
        Y1[k] = st(mu);
        Y2[k] = st(var_);
    }
}
#endif

#if CNB
// dx = rstd (gw - mean(gw) - xhat mean(gw xhat)), gw = g w[channel]; S1 gets (mean, rstd).
@compute @workgroup_size(256)
fn channel_norm_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                         @builtin(num_workgroups) nwg: vec3<u32>) {
    let k = group_id(wid, nwg);
    if (k >= P[0]) { return; }
    let len = P[1];
    let fl = f32(max(len, 1u));
    let t = lid.x;
    var s = 0.0;
    for (var e = t; e < len; e += WG) { s += ld(X0[P[7] + addr(k, e)]); }
    let mu = wg_sum(s, t) / fl;
    var q = 0.0;
    for (var e = t; e < len; e += WG) {
        let d = ld(X0[P[7] + addr(k, e)]) - mu;
        q += d * d;
    }
    let r = inverseSqrt(wg_sum(q, t) / fl + pf(6u));
    var sg = 0.0;
    var sgx = 0.0;
    for (var e = t; e < len; e += WG) {
        let a = addr(k, e);
        let gw = ld(X2[P[9] + a]) * ld(X1[P[8] + channel(k, e)]);
        sg += gw;
        sgx += gw * (ld(X0[P[7] + a]) - mu) * r;
    }
    let mg = wg_sum(sg, t) / fl;
    let mgx = wg_sum(sgx, t) / fl;
    for (var e = t; e < len; e += WG) {
        let a = addr(k, e);
        let gw = ld(X2[P[9] + a]) * ld(X1[P[8] + channel(k, e)]);
        let xh = (ld(X0[P[7] + a]) - mu) * r;
        Y0[a] = st(r * (gw - mg - xh * mgx));
    }
    if (t == 0u) {
        S1[2u * k] = mu;
        S1[2u * k + 1u] = r;
    }
}
#endif

#if CNC
// dweight (Y0) and dbias (Y1) per channel from the segment statistics S1.
// P: [channels, n, group_mode, c, s, groups, eps, x_off, 0, g_off].
@compute @workgroup_size(256)
fn channel_norm_params(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>) {
    let ch = thread_id(wid, lid, nwg);
    let c = P[3];
    if (ch >= c) { return; }
    let s = P[4];
    let cg = c / P[5];
    var dw = 0.0;
    var db = 0.0;
    for (var n = 0u; n < P[1]; n++) {
        let seg = select(ch, n * P[5] + ch / cg, P[2] != 0u);
        let mu = S1[2u * seg];
        let r = S1[2u * seg + 1u];
        for (var i = 0u; i < s; i++) {
            let a = (n * c + ch) * s + i;
            let g = ld(X2[P[9] + a]);
            dw += g * (ld(X0[P[7] + a]) - mu) * r;
            db += g;
        }
    }
    Y0[ch] = st(dw);
    Y1[ch] = st(db);
}
#endif
