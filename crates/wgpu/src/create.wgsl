// Tensors made from nothing: fill, arange, and Philox4x32-10 random numbers (the stream of
// ferrite-core's rng.rs: element i uses counter (i, 0, 0, 0) and key (seed lo, seed hi)).
// P: [n, mode, a, b, seed lo, seed hi]; a and b are f32 bits (value; start, step; low, high;
// mean, std). `fill` writes raw bits P[2] (already in the output's word type).

@group(0) @binding(1) var<storage, read_write> Y: array<u32>;

@compute @workgroup_size(256)
fn fill(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_id(wid, lid, nwg);
    if (i >= P[0]) { return; }
    Y[i] = P[2];
}

@compute @workgroup_size(256)
fn arange(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_id(wid, lid, nwg);
    if (i >= P[0]) { return; }
#if T_F
    Y[i] = bitcast<u32>(fit_T(pf(2u) + f32(i) * pf(3u)));
#else
    // Integer start and step (as i32 bits).
    Y[i] = bitcast<u32>(fit_T(T(pi(2u) + i32(i) * pi(3u))));
#endif
}

#if T_F
// High and low words of a * b.
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu;
    let a1 = a >> 16u;
    let b0 = b & 0xffffu;
    let b1 = b >> 16u;
    let p00 = a0 * b0;
    let p01 = a0 * b1;
    let p10 = a1 * b0;
    let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    let hi = p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
    let lo = (mid << 16u) | (p00 & 0xffffu);
    return vec2<u32>(hi, lo);
}

fn philox(counter: vec4<u32>, key: vec2<u32>) -> vec4<u32> {
    var c = counter;
    var k = key;
    for (var r = 0u; r < 10u; r++) {
        if (r > 0u) {
            k = vec2<u32>(k.x + 0x9E3779B9u, k.y + 0xBB67AE85u);
        }
        let p0 = mul_wide(0xD2511F53u, c.x);
        let p1 = mul_wide(0xCD9E8D57u, c.z);
        c = vec4<u32>(p1.x ^ c.y ^ k.x, p1.y, p0.x ^ c.w ^ k.y, p0.y);
    }
    return c;
}

fn unit(w: u32) -> f32 {
    return f32(w >> 8u) * (1.0 / 16777216.0);
}

@compute @workgroup_size(256)
fn rand(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_id(wid, lid, nwg);
    if (i >= P[0]) { return; }
    let w = philox(vec4<u32>(i, 0u, 0u, 0u), vec2<u32>(P[4], P[5]));
    var v: f32;
    if (P[1] == 0u) {
        v = pf(2u) + (pf(3u) - pf(2u)) * unit(w.x);
    } else {
        let u1 = 1.0 - unit(w.x);
        let u2 = unit(w.y);
        v = pf(2u) + pf(3u) * sqrt(-2.0 * log(u1)) * cos(6.2831853071795865 * u2);
    }
    Y[i] = bitcast<u32>(fit_T(v));
}
#endif
