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
    var best = -3.4e38;
    var bi = 0xffffffffu;
    for (var i = t; i < n; i += RW) {
        let v = src[r * n + i];
        if (v > best || (bi == 0xffffffffu && v == best)) {
            best = v;
            bi = i;
        }
    }
    red[t] = best;
    redi[t] = bi;
    workgroupBarrier();
    for (var st = RW / 2u; st > 0u; st >>= 1u) {
        if (t < st) {
            let v = red[t + st];
            let j = redi[t + st];
            if (j != 0xffffffffu && (redi[t] == 0xffffffffu || v > red[t] || (v == red[t] && j < redi[t]))) {
                red[t] = v;
                redi[t] = j;
            }
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        toks[r] = select(redi[0], 0u, redi[0] == 0xffffffffu);
    }
}
