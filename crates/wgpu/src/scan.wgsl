// Along-axis scans over a contiguous x viewed as [outer, len, inner] (from word P[4]).
// P: [lines = outer * inner, len, inner, descending, x_off].

@group(0) @binding(1) var<storage, read_write> Y0: array<u32>;
#if SORT
@group(0) @binding(2) var<storage, read_write> Y1: array<u32>;
@group(0) @binding(3) var<storage, read> X0: array<u32>;
#else
@group(0) @binding(2) var<storage, read> X0: array<u32>;
#endif

fn elem(line: u32, k: u32) -> u32 {
    let inner = P[2];
    return (line / inner) * P[1] * inner + k * inner + line % inner;
}

#if T_F
alias A = f32;
#else
alias A = T;
#endif

#if !SORT
// Inclusive prefix sum, one thread per line (f32 running sums for floats).
@compute @workgroup_size(256)
fn cumsum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let line = thread_id(wid, lid, nwg);
    if (line >= P[0]) { return; }
    var acc = A(0);
    for (var k = 0u; k < P[1]; k++) {
        let e = elem(line, k);
        acc += A(bitcast<T>(X0[P[4] + e]));
        Y0[e] = bitcast<u32>(fit_T(T(acc)));
    }
}
#else
#if T_F
fn is_nan(x: T) -> bool {
    return x != x;
}
#else
fn is_nan(x: T) -> bool {
    return false;
}
#endif

// a strictly before b in ascending order, NaN largest.
fn less(a: T, b: T) -> bool {
    if (is_nan(a)) { return false; }
    if (is_nan(b)) { return true; }
    return a < b;
}

// Stable sort by rank: one thread per element counts the elements that precede it.
// Y0: values, Y1: u32 positions along the axis.
@compute @workgroup_size(256)
fn sort(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = thread_id(wid, lid, nwg);
    let len = P[1];
    if (t >= P[0] * len) { return; }
    let line = t / len;
    let k = t % len;
    let desc = P[3] != 0u;
    let v = bitcast<T>(X0[P[4] + elem(line, k)]);
    var rank = 0u;
    for (var j = 0u; j < len; j++) {
        if (j == k) { continue; }
        let w = bitcast<T>(X0[P[4] + elem(line, j)]);
        var before = select(less(w, v), less(v, w), desc);
        let tie = !less(w, v) && !less(v, w);
        if (tie && j < k) { before = true; }
        if (before) { rank++; }
    }
    let out = elem(line, rank);
    Y0[out] = bitcast<u32>(v);
    Y1[out] = k;
}
#endif
