// Cast from S words to T words, element by element over a strided input (P: [n, 0, layout]).
// Floats to integers truncate toward zero and saturate (at i32's range for i64, which is stored
// as i32), NaN becomes 0; integers to narrower integers wrap; nonzero becomes true.

@group(0) @binding(1) var<storage, read_write> Y: array<u32>;
@group(0) @binding(2) var<storage, read> X0: array<u32>;

fn convert(x: S) -> T {
#if T_BOOL
    return select(0u, 1u, x != S(0));
#else
#if S_F
#if T_F
    return x;
#else
    if (x != x) { return T(0); }
#if T_I
    return i32(clamp(trunc(x), -2147483648.0, 2147483520.0));
#else
#if T_U8
    return u32(clamp(trunc(x), 0.0, 255.0));
#else
    return u32(clamp(trunc(x), 0.0, 4294967040.0));
#endif
#endif
#endif
#else
    return T(x);
#endif
#endif
}

@compute @workgroup_size(256)
fn cast_(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_id(wid, lid, nwg);
    if (i >= P[0]) { return; }
    Y[i] = bitcast<u32>(fit_T(convert(bitcast<S>(X0[strided(2u, i)]))));
}
