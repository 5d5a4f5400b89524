// Direct 2-d convolutions and max pooling, one thread per output element, f32 sums.
// Geometry P: [total, n, c, h, w, o, kh, kw, oh, ow, sh, sw, ph, pw, dh, dw, groups,
//              x_off, w_off] (+ pooling fields, see max_pool). x [n, c, h, w],
// weight [o, c/groups, kh, kw], y [n, o, oh, ow], all contiguous.

@group(0) @binding(1) var<storage, read_write> Y0: array<u32>;
#if POOL
@group(0) @binding(2) var<storage, read_write> Y1: array<u32>;
@group(0) @binding(3) var<storage, read> X0: array<u32>;
#else
@group(0) @binding(2) var<storage, read> X0: array<u32>;
@group(0) @binding(3) var<storage, read> X1: array<u32>;
#endif

fn ld0(i: u32) -> f32 {
    return f32(bitcast<T>(X0[i]));
}

#if !POOL
fn ld1(i: u32) -> f32 {
    return f32(bitcast<T>(X1[i]));
}

// y[n, o, i, j] = sum over (c', di, dj) of w[o, c', di, dj] x[n, g cg + c', ...].
// X0: x, X1: weight.
@compute @workgroup_size(256)
fn conv2d(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = thread_id(wid, lid, nwg);
    if (e >= P[0]) { return; }
    let c = P[2]; let h = P[3 + 0]; let w = P[4];
    let o = P[5]; let kh = P[6]; let kw = P[7]; let oh = P[8]; let ow = P[9];
    let cg = c / P[16];
    let og = o / P[16];
    let j = e % ow;
    let i = (e / ow) % oh;
    let oc = (e / (ow * oh)) % o;
    let n = e / (ow * oh * o);
    let g = oc / og;
    var acc = 0.0;
    for (var ci = 0u; ci < cg; ci++) {
        let xc = P[17] + (n * c + g * cg + ci) * h * w;
        let wc = P[18] + (oc * cg + ci) * kh * kw;
        for (var di = 0u; di < kh; di++) {
            let y = i32(i * P[10] + di * P[14]) - i32(P[12]);
            if (y < 0 || y >= i32(h)) { continue; }
            for (var dj = 0u; dj < kw; dj++) {
                let x = i32(j * P[11] + dj * P[15]) - i32(P[13]);
                if (x < 0 || x >= i32(w)) { continue; }
                acc += ld1(wc + di * kw + dj) * ld0(xc + u32(y) * w + u32(x));
            }
        }
    }
    Y0[e] = bitcast<u32>(fit_T(T(acc)));
}

// The adjoint in the input: X0: g [n, o, oh, ow], X1: weight; y [n, c, h, w].
@compute @workgroup_size(256)
fn conv_transpose2d(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                    @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = thread_id(wid, lid, nwg);
    if (e >= P[0]) { return; }
    let c = P[2]; let h = P[3]; let w = P[4];
    let o = P[5]; let kh = P[6]; let kw = P[7]; let oh = P[8]; let ow = P[9];
    let cg = c / P[16];
    let og = o / P[16];
    let xx = e % w;
    let yy = (e / w) % h;
    let ci = (e / (w * h)) % c;
    let n = e / (w * h * c);
    let g = ci / cg;
    var acc = 0.0;
    for (var k = 0u; k < og; k++) {
        let oc = g * og + k;
        let gb = P[17] + (n * o + oc) * oh * ow;
        let wb = P[18] + (oc * cg + (ci - g * cg)) * kh * kw;
        for (var di = 0u; di < kh; di++) {
            let ty = i32(yy + P[12]) - i32(di * P[14]);
            if (ty < 0 || ty % i32(P[10]) != 0) { continue; }
            let i = u32(ty) / P[10];
            if (i >= oh) { continue; }
            for (var dj = 0u; dj < kw; dj++) {
                let tx = i32(xx + P[13]) - i32(dj * P[15]);
                if (tx < 0 || tx % i32(P[11]) != 0) { continue; }
                let j = u32(tx) / P[11];
                if (j >= ow) { continue; }
                acc += ld1(wb + di * kw + dj) * ld0(gb + i * ow + j);
            }
        }
    }
    Y0[e] = bitcast<u32>(fit_T(T(acc)));
}

// The weight gradient: X0: x, X1: g [n, o, oh, ow]; y: dw [o, c/groups, kh, kw].
@compute @workgroup_size(256)
fn conv2d_backward_weight(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                          @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = thread_id(wid, lid, nwg);
    if (e >= P[0]) { return; }
    let nb = P[1]; let c = P[2]; let h = P[3]; let w = P[4];
    let o = P[5]; let kh = P[6]; let kw = P[7]; let oh = P[8]; let ow = P[9];
    let cg = c / P[16];
    let og = o / P[16];
    let dj = e % kw;
    let di = (e / kw) % kh;
    let ci = (e / (kw * kh)) % cg;
    let oc = e / (kw * kh * cg);
    let g = oc / og;
    var acc = 0.0;
    for (var n = 0u; n < nb; n++) {
        let xc = P[17] + (n * c + g * cg + ci) * h * w;
        let gb = P[18] + (n * o + oc) * oh * ow;
        for (var i = 0u; i < oh; i++) {
            let y = i32(i * P[10] + di * P[14]) - i32(P[12]);
            if (y < 0 || y >= i32(h)) { continue; }
            for (var j = 0u; j < ow; j++) {
                let x = i32(j * P[11] + dj * P[15]) - i32(P[13]);
                if (x < 0 || x >= i32(w)) { continue; }
                acc += ld1(gb + i * ow + j) * ld0(xc + u32(y) * w + u32(x));
            }
        }
    }
    Y0[e] = bitcast<u32>(fit_T(T(acc)));
}
#else
// Max pooling: Y0 values, Y1 u32 positions (row * w + col in the plane) of the first
// maximum; padding never wins, NaN counts as the maximum.
// P: [total, nc, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw, adaptive, x_off]. Adaptive
// windows: rows floor(i h / oh) .. ceil((i + 1) h / oh), likewise columns.
@compute @workgroup_size(256)
fn max_pool2d(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let e = thread_id(wid, lid, nwg);
    if (e >= P[0]) { return; }
    let h = P[2]; let w = P[3]; let oh = P[4]; let ow = P[5];
    let j = e % ow;
    let i = (e / ow) % oh;
    let plane = e / (ow * oh);
    let base = P[15] + plane * h * w;
    var best = 0.0;
    var at = 0xffffffffu;
    var r0: i32; var r1: i32; var rs: i32;
    var c0: i32; var c1: i32; var cs: i32;
    if (P[14] != 0u) {
        r0 = i32((i * h) / oh); r1 = i32(((i + 1u) * h + oh - 1u) / oh); rs = 1;
        c0 = i32((j * w) / ow); c1 = i32(((j + 1u) * w + ow - 1u) / ow); cs = 1;
    } else {
        r0 = i32(i * P[8]) - i32(P[10]); r1 = r0 + i32((P[6] - 1u) * P[12]) + 1; rs = i32(P[12]);
        c0 = i32(j * P[9]) - i32(P[11]); c1 = c0 + i32((P[7] - 1u) * P[13]) + 1; cs = i32(P[13]);
    }
    for (var y = r0; y < r1; y += rs) {
        if (y < 0 || y >= i32(h)) { continue; }
        for (var x = c0; x < c1; x += cs) {
            if (x < 0 || x >= i32(w)) { continue; }
            let pos = u32(y) * w + u32(x);
            let v = ld0(base + pos);
            let best_nan = at != 0xffffffffu && best != best;
            if (!best_nan && (at == 0xffffffffu || v != v || v > best)) {
                best = v;
                at = pos;
            }
        }
    }
    Y0[e] = bitcast<u32>(fit_T(T(best)));
    Y1[e] = select(at, 0u, at == 0xffffffffu);
}
#endif
