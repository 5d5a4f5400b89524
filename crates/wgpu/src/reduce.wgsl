// Row reductions: X0 holds `rows` contiguous rows of `m` elements (from word `off`); Y gets one
// value per row (or per chunk of a row in the first pass of a two-pass sum/max/min).
// P: [rows, m, op, off, chunk]: op 0 sum, 1 max, 2 min, 3 argmax, 4 argmin; a workgroup
// reduces `chunk` elements of its row (chunk = m in one pass). Max and min propagate NaN;
// argmax/argmin give the first extreme, NaN counting as the extreme.
// T: input words; O: output words (f32 partials for floats in the first pass).
// V4: `off`, `m` and `chunk` are multiples of 4 and X0 is read a vec4 at a time.
// SG (sums only, where the adapter has subgroups): each subgroup adds its threads' sums with
// subgroupAdd, then thread 0 adds the subgroups' sums in order; otherwise a tree in workgroup
// memory.

@group(0) @binding(1) var<storage, read_write> Y: array<u32>;
#if V4
@group(0) @binding(2) var<storage, read> X0: array<vec4<u32>>;
#else
@group(0) @binding(2) var<storage, read> X0: array<u32>;
#endif

#if T_F
alias A = f32;
fn is_nan(x: A) -> bool {
    return x != x;
}
#else
alias A = T;
fn is_nan(x: A) -> bool {
    return false;
}
#endif

var<workgroup> sv: array<A, 256>;
var<workgroup> si: array<u32, 256>;

// Whether (a, ia) beats (b, ib) for op (1 max / 3 argmax, 2 min / 4 argmin); ib == invalid
// marks an empty slot.
fn better(op: u32, a: A, ia: u32, b: A, ib: u32) -> bool {
    if (ia == 0xffffffffu) { return false; }
    if (ib == 0xffffffffu) { return true; }
    let na = is_nan(a);
    let nb = is_nan(b);
    if (na || nb) {
        return na && (!nb || ia < ib);
    }
    let mx = op == 1u || op == 3u;
    if (a == b) { return ia < ib; }
    return select((a < b), (a > b), mx);
}

// Folds element j (value v) into (acc, idx).
fn fold(op: u32, v: A, j: u32, acc: ptr<function, A>, idx: ptr<function, u32>) {
    if (op == 0u) {
        *acc += v;
    } else if (better(op, v, j, *acc, *idx)) {
        *acc = v;
        *idx = j;
    }
}

@compute @workgroup_size(256)
fn reduce(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
#if SG
          @builtin(subgroup_invocation_id) sgi: u32, @builtin(subgroup_id) sid: u32,
          @builtin(num_subgroups) nsg: u32,
#endif
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let rows = P[0];
    let m = P[1];
    let op = P[2];
    let chunk = P[4];
    let chunks = (m + chunk - 1u) / max(chunk, 1u);
    let g = group_id(wid, nwg);
    let total = rows * max(chunks, 1u);
    if (g >= total) { return; }
    let row = g / max(chunks, 1u);
    let c = g % max(chunks, 1u);
    let begin = c * chunk;
    let end = min(begin + chunk, m);
    let base = P[3] + row * m;
    let t = lid.x;
    var acc = A(0);
    var idx = 0xffffffffu;
#if V4
    for (var j = begin + 4u * t; j < end; j += 4u * WG) {
        let v = bitcast<vec4<T>>(X0[(base + j) / 4u]);
        fold(op, A(v.x), j, &acc, &idx);
        fold(op, A(v.y), j + 1u, &acc, &idx);
        fold(op, A(v.z), j + 2u, &acc, &idx);
        fold(op, A(v.w), j + 3u, &acc, &idx);
    }
#else
    for (var j = begin + t; j < end; j += WG) {
        fold(op, A(bitcast<T>(X0[base + j])), j, &acc, &idx);
    }
#endif
#if SG
    let s = subgroupAdd(acc);
    if (sgi == 0u) {
        sv[sid] = s;
    }
    workgroupBarrier();
    if (t == 0u) {
        var sum = A(0);
        for (var k = 0u; k < nsg; k++) {
            sum += sv[k];
        }
        Y[g] = bitcast<u32>(fit_O(O(sum)));
    }
#else
    sv[t] = acc;
    si[t] = idx;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (t < s) {
            if (op == 0u) {
                sv[t] += sv[t + s];
            } else if (better(op, sv[t + s], si[t + s], sv[t], si[t])) {
                sv[t] = sv[t + s];
                si[t] = si[t + s];
            }
        }
        workgroupBarrier();
    }
    if (t == 0u) {
        if (op >= 3u) {
            Y[g] = select(si[0], 0u, si[0] == 0xffffffffu);
        } else {
            Y[g] = bitcast<u32>(fit_O(O(sv[0])));
        }
    }
#endif
}
