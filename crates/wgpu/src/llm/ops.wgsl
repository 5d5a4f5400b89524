// Row-wise kernels of the LLM kernel set: RMS norms, the gated unit, greedy argmax.
// One workgroup of RW = 256 threads per row (norms, argmax: a 4096-wide row is 16 values per
// thread); sums meet in workgroup memory. The gated unit: a thread per value.

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> dst: array<f32>;
@group(0) @binding(3) var<storage, read> nw: array<f32>;
@group(0) @binding(4) var<storage, read> sdata: array<u32>;
@group(0) @binding(5) var<storage, read_write> toks: array<u32>;

const RW: u32 = 256u;

var<workgroup> red: array<f32, RW>;
var<workgroup> redi: array<u32, RW>;

fn group_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

// Sum of the RW threads' `v` (every thread gets it).
fn wg_sum(t: u32, v: f32) -> f32 {
    red[t] = v;
    workgroupBarrier();
    for (var st = RW / 2u; st > 0u; st >>= 1u) {
        if (t < st) {
            red[t] += red[t + st];
        }
        workgroupBarrier();
    }
    let s = red[0];
    workgroupBarrier();
    return s;
}

// rms_norm: for each of the P pieces of n values: dst[piece] (=|+=) src[piece'] / rms * w.
// params: [0] n, [1] P pieces, [2] eps (f32 bits), [3] 1: add to dst, [4] 1: piece i of src
// is row sdata[[5] + i] (gathering the logit rows).
@compute @workgroup_size(256)
fn rms_norm(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let piece = group_index(wid, nwg);
    let n = p[0];
    if (piece >= p[1]) {
        return;
    }
    var sr = piece;
    if (p[4] == 1u) {
        sr = sdata[p[5] + piece];
    }
    let s0 = sr * n;
    let d0 = piece * n;
    var ss = 0.0;
    for (var i = t; i < n; i += RW) {
        let v = src[s0 + i];
        ss += v * v;
    }
    let inv = 1.0 / sqrt(wg_sum(t, ss) / f32(n) + bitcast<f32>(p[2]));
    for (var i = t; i < n; i += RW) {
        let v = src[s0 + i] * inv * nw[i];
        if (p[3] == 1u) {
            dst[d0 + i] += v;
        } else {
            dst[d0 + i] = v;
        }
    }
}

// rms_norm_inplace: each of the P pieces of n values of dst, normed in place (head norms):
// piece i is head i % H of row i / H, at dst[(i / H) * stride + first + (i % H) * n].
// params: [0] n, [1] P, [2] eps (f32 bits), [3] H heads per row, [4] row stride, [5] first.
@compute @workgroup_size(256)
fn rms_norm_inplace(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let piece = group_index(wid, nwg);
    let n = p[0];
    if (piece >= p[1]) {
        return;
    }
    let d0 = (piece / p[3]) * p[4] + p[5] + (piece % p[3]) * n;
    var ss = 0.0;
    for (var i = t; i < n; i += RW) {
        let v = dst[d0 + i];
        ss += v * v;
    }
    let inv = 1.0 / sqrt(wg_sum(t, ss) / f32(n) + bitcast<f32>(p[2]));
    for (var i = t; i < n; i += RW) {
        dst[d0 + i] = dst[d0 + i] * inv * nw[i];
    }
}

// glu: dst[i] = act(dst[i]) * src[i] for i < [0]; [1] 0: SiLU, 1: tanh-GELU.
@compute @workgroup_size(64)
fn glu(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let i = group_index(wid, nwg) * 64u + t;
    if (i >= p[0]) {
        return;
    }
    let g = dst[i];
    var a: f32;
    if (p[1] == 0u) {
        a = g / (1.0 + exp(-g));
    } else {
        // tanh saturates to +-1 in f32 beyond 9; clamping keeps every implementation finite.
        let z = clamp(0.7978846 * (g + 0.044715 * g * g * g), -15.0, 15.0);
        a = 0.5 * g * (1.0 + tanh(z));
    }
    dst[i] = a * src[i];
}

const NONE: u32 = 0xffffffffu;

// Whether candidate (v, j) beats (w, k) in argmax: j set, and k unset, v larger, or v equal at
// a lower index.
fn beats(v: f32, j: u32, w: f32, k: u32) -> bool {
    return j != NONE && (k == NONE || v > w || (v == w && j < k));
}

// argmax: toks[r] = the index of the largest value of row r of src (n = [0] values; the
// lowest index on ties; NaN never wins).
@compute @workgroup_size(256)
fn argmax(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let r = group_index(wid, nwg);
    let n = p[0];
    if (r >= p[1]) {
        return;
    }
    // Four chains a thread (values t, t + RW, t + 2 RW, t + 3 RW, then 4 RW on), so four
    // loads are in flight; each chain keeps its first largest value, and the chains and then
    // the threads meet by `beats` (larger, or equal at a lower index): the same answer in any
    // order of meeting.
    let row = r * n;
    var b0 = -3.4e38;
    var b1 = -3.4e38;
    var b2 = -3.4e38;
    var b3 = -3.4e38;
    var i0 = NONE;
    var i1 = NONE;
    var i2 = NONE;
    var i3 = NONE;
    var i = t;
    for (; i + 3u * RW < n; i += 4u * RW) {
        let v0 = src[row + i];
        let v1 = src[row + i + RW];
        let v2 = src[row + i + 2u * RW];
        let v3 = src[row + i + 3u * RW];
        if (v0 > b0 || (i0 == NONE && v0 == b0)) {
            b0 = v0;
            i0 = i;
        }
        if (v1 > b1 || (i1 == NONE && v1 == b1)) {
            b1 = v1;
            i1 = i + RW;
        }
        if (v2 > b2 || (i2 == NONE && v2 == b2)) {
            b2 = v2;
            i2 = i + 2u * RW;
        }
        if (v3 > b3 || (i3 == NONE && v3 == b3)) {
            b3 = v3;
            i3 = i + 3u * RW;
        }
    }
    for (; i < n; i += RW) {
        let v = src[row + i];
        if (v > b0 || (i0 == NONE && v == b0)) {
            b0 = v;
            i0 = i;
        }
    }
    if (beats(b1, i1, b0, i0)) {
        b0 = b1;
        i0 = i1;
    }
    if (beats(b2, i2, b0, i0)) {
        b0 = b2;
        i0 = i2;
    }
    if (beats(b3, i3, b0, i0)) {
        b0 = b3;
        i0 = i3;
    }
    red[t] = b0;
    redi[t] = i0;
    workgroupBarrier();
    for (var st = RW / 2u; st > 0u; st >>= 1u) {
        if (t < st && beats(red[t + st], redi[t + st], red[t], redi[t])) {
            red[t] = red[t + st];
            redi[t] = redi[t + st];
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        toks[r] = select(redi[0], 0u, redi[0] == NONE);
    }
}
