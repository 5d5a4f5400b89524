// Row kernels over contiguous [rows, n] data, one workgroup per row, f32 arithmetic:
// softmax / log-softmax and their backward, layer / RMS norm and their backward, RoPE, and
// the fused cross entropy and its backward. Each define (SM, SMB, LN, LNB, LNC, ROPE, CE,
// CEB) compiles one entry point with its bindings. T: element words; I: target words.

#if SM
@group(0) @binding(1) var<storage, read_write> Y0: array<u32>;
@group(0) @binding(2) var<storage, read> X0: array<u32>;
#endif
#if SMB
@group(0) @binding(1) var<storage, read_write> Y0: array<u32>;
@group(0) @binding(2) var<storage, read> X0: array<u32>;
@group(0) @binding(3) var<storage, read> X1: array<u32>;
#endif
#if LN
@group(0) @binding(1) var<storage, read_write> Y0: array<u32>;
@group(0) @binding(2) var<storage, read> X0: array<u32>;
@group(0) @binding(3) var<storage, read> X1: array<u32>;
@group(0) @binding(4) var<storage, read> X2: array<u32>;
#endif
#if LNB
@group(0) @binding(1) var<storage, read_write> Y0: array<u32>;
@group(0) @binding(2) var<storage, read_write> Y1: array<f32>;
@group(0) @binding(3) var<storage, read> X0: array<u32>;
@group(0) @binding(4) var<storage, read> X1: array<u32>;
@group(0) @binding(5) var<storage, read> X2: array<u32>;
#endif
#if LNC
@group(0) @binding(1) var<storage, read_write> Y0: array<u32>;
@group(0) @binding(2) var<storage, read_write> Y1: array<u32>;
@group(0) @binding(3) var<storage, read> X0: array<u32>;
@group(0) @binding(4) var<storage, read> S: array<f32>;
@group(0) @binding(5) var<storage, read> X2: array<u32>;
#endif
#if ROPE
@group(0) @binding(1) var<storage, read_write> Y0: array<u32>;
@group(0) @binding(2) var<storage, read> X0: array<u32>;
@group(0) @binding(3) var<storage, read> X1: array<u32>;
@group(0) @binding(4) var<storage, read> X2: array<u32>;
#endif
#if CE
@group(0) @binding(1) var<storage, read_write> Y0: array<u32>;
@group(0) @binding(2) var<storage, read> X0: array<u32>;
@group(0) @binding(3) var<storage, read> X1: array<u32>;
@group(0) @binding(4) var<storage, read> X2: array<u32>;
@group(0) @binding(5) var<storage, read_write> ERR: atomic<u32>;
#endif
#if CEB
@group(0) @binding(1) var<storage, read_write> Y0: array<u32>;
@group(0) @binding(2) var<storage, read> X0: array<u32>;
@group(0) @binding(3) var<storage, read> X1: array<u32>;
@group(0) @binding(4) var<storage, read> X2: array<u32>;
@group(0) @binding(5) var<storage, read> X3: array<u32>;
@group(0) @binding(6) var<storage, read> X4: array<u32>;
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

// Max that propagates NaN.
fn nmax(a: f32, b: f32) -> f32 {
    return select(b, a, a != a || a > b);
}

fn wg_max(v: f32, t: u32) -> f32 {
    red[t] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) { red[t] = nmax(red[t], red[t + s]); }
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

const NEG_INF: f32 = -3.4028235e38;

#if SM
// P: [rows, n, log, x_off].
@compute @workgroup_size(256)
fn softmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = group_id(wid, nwg);
    if (row >= P[0]) { return; }
    let n = P[1];
    let t = lid.x;
    let base = P[3] + row * n;
    var m = NEG_INF;
    for (var j = t; j < n; j += WG) { m = nmax(m, ld(X0[base + j])); }
    m = wg_max(m, t);
    var s = 0.0;
    for (var j = t; j < n; j += WG) { s += exp(ld(X0[base + j]) - m); }
    s = wg_sum(s, t);
    let ls = log(s);
    for (var j = t; j < n; j += WG) {
        let z = ld(X0[base + j]) - m;
        Y0[row * n + j] = st(select(exp(z) / s, z - ls, P[2] != 0u));
    }
}
#endif

#if SMB
// P: [rows, n, log, y_off, g_off]. dx = y (g - sum(g y)), or with log: g - exp(y) sum(g).
@compute @workgroup_size(256)
fn softmax_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                    @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = group_id(wid, nwg);
    if (row >= P[0]) { return; }
    let n = P[1];
    let t = lid.x;
    let yb = P[3] + row * n;
    let gb = P[4] + row * n;
    let lg = P[2] != 0u;
    var s = 0.0;
    for (var j = t; j < n; j += WG) {
        let g = ld(X1[gb + j]);
        s += select(g * ld(X0[yb + j]), g, lg);
    }
    s = wg_sum(s, t);
    for (var j = t; j < n; j += WG) {
        let y = ld(X0[yb + j]);
        let g = ld(X1[gb + j]);
        Y0[row * n + j] = st(select(y * (g - s), g - exp(y) * s, lg));
    }
}
#endif

#if LN
// P: [rows, n, rms, eps, x_off, w_off, b_off]. X1: weight, X2: bias (unused with rms).
@compute @workgroup_size(256)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = group_id(wid, nwg);
    if (row >= P[0]) { return; }
    let n = P[1];
    let t = lid.x;
    let rms = P[2] != 0u;
    let base = P[4] + row * n;
    var mu = 0.0;
    if (!rms) {
        var s = 0.0;
        for (var j = t; j < n; j += WG) { s += ld(X0[base + j]); }
        mu = wg_sum(s, t) / f32(n);
    }
    var q = 0.0;
    for (var j = t; j < n; j += WG) {
        let d = ld(X0[base + j]) - mu;
        q += d * d;
    }
    let r = inverseSqrt(wg_sum(q, t) / f32(n) + pf(3u));
    for (var j = t; j < n; j += WG) {
        var y = (ld(X0[base + j]) - mu) * r * ld(X1[P[5] + j]);
        if (!rms) { y += ld(X2[P[6] + j]); }
        Y0[row * n + j] = st(y);
    }
}
#endif

#if LNB
// dx of layer / RMS norm; Y1 gets each row's (mean, rstd) for the column pass.
// P: [rows, n, rms, eps, x_off, w_off, g_off].
@compute @workgroup_size(256)
fn norm_backward_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                      @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = group_id(wid, nwg);
    if (row >= P[0]) { return; }
    let n = P[1];
    let t = lid.x;
    let rms = P[2] != 0u;
    let xb = P[4] + row * n;
    let gb = P[6] + row * n;
    var mu = 0.0;
    if (!rms) {
        var s = 0.0;
        for (var j = t; j < n; j += WG) { s += ld(X0[xb + j]); }
        mu = wg_sum(s, t) / f32(n);
    }
    var q = 0.0;
    for (var j = t; j < n; j += WG) {
        let d = ld(X0[xb + j]) - mu;
        q += d * d;
    }
    let r = inverseSqrt(wg_sum(q, t) / f32(n) + pf(3u));
    // xhat = (x - mu) r; gw = g w; dx = r (gw - mean(gw) - xhat mean(gw xhat)) (no mean(gw)
    // term for rms).
    var sg = 0.0;
    var sgx = 0.0;
    for (var j = t; j < n; j += WG) {
        let gw = ld(X2[gb + j]) * ld(X1[P[5] + j]);
        sg += gw;
        sgx += gw * (ld(X0[xb + j]) - mu) * r;
    }
    let mg = select(wg_sum(sg, t) / f32(n), 0.0, rms);
    let mgx = wg_sum(sgx, t) / f32(n);
    for (var j = t; j < n; j += WG) {
        let gw = ld(X2[gb + j]) * ld(X1[P[5] + j]);
        let xh = (ld(X0[xb + j]) - mu) * r;
        Y0[row * n + j] = st(r * (gw - mg - xh * mgx));
    }
    if (t == 0u) {
        Y1[2u * row] = mu;
        Y1[2u * row + 1u] = r;
    }
}
#endif

#if LNC
// dweight (Y0) and dbias (Y1) per column from the row statistics S.
// P: [rows, n, rms, x_off, g_off].
@compute @workgroup_size(256)
fn norm_backward_cols(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                      @builtin(num_workgroups) nwg: vec3<u32>) {
    let j = thread_id(wid, lid, nwg);
    let n = P[1];
    if (j >= n) { return; }
    var dw = 0.0;
    var db = 0.0;
    for (var r = 0u; r < P[0]; r++) {
        let g = ld(X2[P[4] + r * n + j]);
        dw += g * (ld(X0[P[3] + r * n + j]) - S[2u * r]) * S[2u * r + 1u];
        db += g;
    }
    Y0[j] = st(dw);
    Y1[j] = st(db);
}
#endif

#if ROPE
// P: [pairs, l, d, interleaved, x_off, cos_off, sin_off]: one thread per rotated pair of
// x [rows, d] where row r sits at position r % l.
@compute @workgroup_size(256)
fn rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let q = thread_id(wid, lid, nwg);
    if (q >= P[0]) { return; }
    let d = P[2];
    let h = d / 2u;
    let row = q / h;
    let i = q % h;
    let pos = row % P[1];
    var ia = i;
    var ib = i + h;
    if (P[3] != 0u) {
        ia = 2u * i;
        ib = 2u * i + 1u;
    }
    let a = ld(X0[P[4] + row * d + ia]);
    let b = ld(X0[P[4] + row * d + ib]);
    let c = ld(X1[P[5] + pos * h + i]);
    let s = ld(X2[P[6] + pos * h + i]);
    Y0[row * d + ia] = st(a * c - b * s);
    Y0[row * d + ib] = st(a * s + b * c);
}
#endif

#if CET
// The target of a row, or -1 when ignored; rows with a bad target set `bad`.
// P (shared head): [rows, c, eps, ignore, has_ignore, x_off, t_off, w_off, code].
fn row_target(row: u32) -> i32 {
    let raw = bitcast<I>(X1[P[6] + row]);
#if I_I
    let t = raw;
#else
    let t = i32(min(raw, 0x7fffffffu));
#endif
    if (P[4] != 0u && t == pi(3u)) { return -1; }
    return t;
}
#endif

#if CE
@compute @workgroup_size(256)
fn cross_entropy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                 @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = group_id(wid, nwg);
    if (row >= P[0]) { return; }
    let c = P[1];
    let t = lid.x;
    let xb = P[5] + row * c;
    var m = NEG_INF;
    for (var j = t; j < c; j += WG) { m = nmax(m, ld(X0[xb + j])); }
    m = wg_max(m, t);
    var s = 0.0;
    for (var j = t; j < c; j += WG) { s += exp(ld(X0[xb + j]) - m); }
    let lse = m + log(wg_sum(s, t));
    let eps = pf(2u);
    var sm = 0.0;
    for (var j = t; j < c; j += WG) { sm += ld(X2[P[7] + j]) * (lse - ld(X0[xb + j])); }
    sm = wg_sum(sm, t);
    if (t == 0u) {
        let tg = row_target(row);
        var loss = 0.0;
        var wt = 0.0;
        if (tg >= 0 && u32(tg) < c) {
            let ut = u32(tg);
            wt = ld(X2[P[7] + ut]);
            loss = (1.0 - eps) * wt * (lse - ld(X0[xb + ut])) + eps / f32(c) * sm;
        } else if (tg != -1) {
            atomicMax(&ERR, P[8]);
        }
        // (loss, lse, w[t]) in f32, the logits' accumulator type.
        Y0[3u * row] = bitcast<u32>(loss);
        Y0[3u * row + 1u] = bitcast<u32>(lse);
        Y0[3u * row + 2u] = bitcast<u32>(wt);
    }
}
#endif

#if CEB
// X3: the forward output [rows, 3] (its lse), X4: g [rows, 3], both f32. P: head, then out_off,
// g_off.
@compute @workgroup_size(256)
fn cross_entropy_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                          @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = group_id(wid, nwg);
    if (row >= P[0]) { return; }
    let c = P[1];
    let t = lid.x;
    let xb = P[5] + row * c;
    let eps = pf(2u);
    var sw = 0.0;
    for (var j = t; j < c; j += WG) { sw += ld(X2[P[7] + j]); }
    sw = wg_sum(sw, t);
    let tg = row_target(row);
    let ok = tg >= 0 && u32(tg) < c;
    let lse = bitcast<f32>(X3[P[9] + 3u * row + 1u]);
    let g = bitcast<f32>(X4[P[10] + 3u * row]);
    var wt = 0.0;
    if (ok) { wt = ld(X2[P[7] + u32(tg)]); }
    for (var j = t; j < c; j += WG) {
        var d = 0.0;
        if (ok) {
            let p = exp(ld(X0[xb + j]) - lse);
            let onehot = select(0.0, 1.0, j == u32(tg));
            d = g * ((1.0 - eps) * wt * (p - onehot) + eps / f32(c) * (p * sw - ld(X2[P[7] + j])));
        }
        Y0[row * c + j] = st(d);
    }
}
#endif
