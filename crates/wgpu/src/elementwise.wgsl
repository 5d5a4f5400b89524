// Elementwise kernels over strided inputs, writing a contiguous output.
// Words: T is the element type of the inputs (S for cast's source); booleans are u32 0/1.
// P: [n, op, layout of X0, layout of X1, layout of X2] (layouts as in common.wgsl).
// V4 (unary and binary over contiguous inputs at offsets that are multiples of 4): a thread
// per 4 elements, one vec4 load per input; P: [ceil(n / 4), op, offset of X0 / 4, offset of
// X1 / 4]. The last vec4 may run past n into the buffers' padding (buffers are whole 16-byte
// multiples, see pool.rs); its extra outputs land in Y's padding.

#if V4
@group(0) @binding(1) var<storage, read_write> Y: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read> X0: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> X1: array<vec4<u32>>;
#else
@group(0) @binding(1) var<storage, read_write> Y: array<u32>;
@group(0) @binding(2) var<storage, read> X0: array<u32>;
@group(0) @binding(3) var<storage, read> X1: array<u32>;
#endif
// Integer division reports division by zero in the device error word (see `errors.rs`).
#if DIV_CHECK
@group(0) @binding(4) var<storage, read_write> ERR: atomic<u32>;
#else
@group(0) @binding(4) var<storage, read> X2: array<u32>;
#endif

#if T_F
// erf with |error| < 1.2e-7 (Numerical Recipes' erfc Chebyshev fit).
fn erf_(x: f32) -> f32 {
    let z = abs(x);
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t * exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
        + t * (-0.82215223 + t * 0.17087277)))))))));
    return select(r - 1.0, 1.0 - r, x >= 0.0);
}

fn tanh_(x: f32) -> f32 {
    // Clamped: some drivers compute tanh through exp and overflow to NaN.
    return tanh(clamp(x, -20.0, 20.0));
}

fn sigmoid_(x: f32) -> f32 {
    return 1.0 / (1.0 + exp(-x));
}

fn unary_op(op: u32, x: f32) -> f32 {
    switch op {
        case 0u: { return -x; }
        case 1u: { return abs(x); }
        case 2u: { return select(select(0.0, -1.0, x < 0.0), 1.0, x > 0.0) + select(0.0, x, x != x); }
        case 3u: { return exp(x); }
        case 4u: { return log(x); }
        case 5u: { return sqrt(x); }
        case 6u: { return 1.0 / sqrt(x); }
        case 7u: { return 1.0 / x; }
        case 8u: { return x * x; }
        case 9u: { return sin(x); }
        case 10u: { return cos(x); }
        case 11u: { return tanh_(x); }
        case 12u: { return sigmoid_(x); }
        case 13u: { return select(0.0, x, x > 0.0); }
        case 14u: { return 0.5 * x * (1.0 + erf_(x * 0.70710678118654752)); }
        case 15u: { return 0.5 * x * (1.0 + tanh_(0.79788456080286536 * (x + 0.044715 * x * x * x))); }
        case 16u: { return x * sigmoid_(x); }
        case 17u: { return floor(x); }
        case 18u: { return ceil(x); }
        default: {
            // Round half away from zero.
            let r = trunc(x);
            return select(r, r + sign(x), abs(x - r) >= 0.5);
        }
    }
}

fn pow_(a: f32, b: f32) -> f32 {
    if (b == 0.0) { return 1.0; }
    if (a < 0.0) {
        if (floor(b) != b) { return bitcast<f32>(0x7fc00000u); }
        let m = pow(-a, b);
        return select(m, -m, floor(b * 0.5) * 2.0 != b);
    }
    if (a == 0.0) { return select(0.0, bitcast<f32>(0x7f800000u), b < 0.0); }
    return pow(a, b);
}

fn binary_op(op: u32, a: f32, b: f32) -> f32 {
    switch op {
        case 0u: { return a + b; }
        case 1u: { return a - b; }
        case 2u: { return a * b; }
        case 3u: { return a / b; }
        case 4u: { return pow_(a, b); }
        // NaN-propagating, as NumPy's maximum / minimum.
        case 5u: { return select(b, a, a != a || a > b); }
        case 6u: { return select(b, a, a != a || a < b); }
        // Activation derivatives, (x, g) -> g f'(x).
        case 7u: {
            let cdf = 0.5 * (1.0 + erf_(a * 0.70710678118654752));
            return b * (cdf + a * exp(-0.5 * a * a) * 0.39894228040143268);
        }
        case 8u: {
            let t = tanh_(0.79788456080286536 * (a + 0.044715 * a * a * a));
            return b * (0.5 * (1.0 + t)
                + 0.5 * a * (1.0 - t * t) * 0.79788456080286536 * (1.0 + 3.0 * 0.044715 * a * a));
        }
        case 9u: {
            let s = sigmoid_(a);
            return b * s * (1.0 + a * (1.0 - s));
        }
        default: { return select(0.0, b, a > 0.0); }
    }
}
#else
fn unary_op(op: u32, x: T) -> T {
    switch op {
#if T_I
        case 0u: { return -x; }
        case 1u: { return abs(x); }
        case 2u: { return select(select(T(0), T(-1), x < T(0)), T(1), x > T(0)); }
#else
        case 0u: { return T(0) - x; }
        case 1u: { return x; }
        case 2u: { return select(T(0), T(1), x > T(0)); }
#endif
        case 8u: { return x * x; }
        case 13u: { return select(T(0), x, x > T(0)); }
        default: { return x; }
    }
}

fn binary_op(op: u32, a: T, b: T) -> T {
    switch op {
        case 0u: { return a + b; }
        case 1u: { return a - b; }
        case 2u: { return a * b; }
        case 3u: {
#if DIV_CHECK
            if (b == T(0)) { atomicMax(&ERR, 2u); return T(0); }
#endif
            return a / b;
        }
        case 5u: { return max(a, b); }
        default: { return min(a, b); }
    }
}
#endif

fn cmp_op(op: u32, a: T, b: T) -> bool {
    switch op {
        case 0u: { return a == b; }
        case 1u: { return a != b; }
        case 2u: { return a < b; }
        case 3u: { return a <= b; }
        case 4u: { return a > b; }
        default: { return a >= b; }
    }
}

#if V4
fn st4(i: u32, v: vec4<T>) {
    Y[i] = vec4<u32>(bitcast<u32>(fit_T(v.x)), bitcast<u32>(fit_T(v.y)), bitcast<u32>(fit_T(v.z)),
                     bitcast<u32>(fit_T(v.w)));
}

@compute @workgroup_size(256)
fn unary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
         @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_id(wid, lid, nwg);
    if (i >= P[0]) { return; }
    let op = P[1];
    let x = bitcast<vec4<T>>(X0[P[2] + i]);
    st4(i, vec4<T>(unary_op(op, x.x), unary_op(op, x.y), unary_op(op, x.z), unary_op(op, x.w)));
}

@compute @workgroup_size(256)
fn binary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_id(wid, lid, nwg);
    if (i >= P[0]) { return; }
    let op = P[1];
    let a = bitcast<vec4<T>>(X0[P[2] + i]);
    let b = bitcast<vec4<T>>(X1[P[3] + i]);
    st4(i, vec4<T>(binary_op(op, a.x, b.x), binary_op(op, a.y, b.y), binary_op(op, a.z, b.z),
                   binary_op(op, a.w, b.w)));
}
#else
fn st(i: u32, v: T) {
    Y[i] = bitcast<u32>(fit_T(v));
}

@compute @workgroup_size(256)
fn unary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
         @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_id(wid, lid, nwg);
    if (i >= P[0]) { return; }
    st(i, unary_op(P[1], bitcast<T>(X0[strided(2u, i)])));
}

@compute @workgroup_size(256)
fn binary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_id(wid, lid, nwg);
    if (i >= P[0]) { return; }
    let a = bitcast<T>(X0[strided(2u, i)]);
    let b = bitcast<T>(X1[strided(2u + layout_len(2u), i)]);
    st(i, binary_op(P[1], a, b));
}

#if !DIV_CHECK
@compute @workgroup_size(256)
fn cmp(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
       @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_id(wid, lid, nwg);
    if (i >= P[0]) { return; }
    let a = bitcast<T>(X0[strided(2u, i)]);
    let b = bitcast<T>(X1[strided(2u + layout_len(2u), i)]);
    Y[i] = select(0u, 1u, cmp_op(P[1], a, b));
}

// X0: condition (u32 0/1 words of any integer or bool dtype), X1: a, X2: b.
@compute @workgroup_size(256)
fn where_(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_id(wid, lid, nwg);
    if (i >= P[0]) { return; }
    let l1 = 2u + layout_len(2u);
    let l2 = l1 + layout_len(l1);
    let c = X0[strided(2u, i)];
    let w = select(X2[strided(l2, i)], X1[strided(l1, i)], c != 0u);
    Y[i] = w;
}

// A strided copy: X0 (layout at 2) into Y at the strided destination layout after it.
@compute @workgroup_size(256)
fn copy(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_id(wid, lid, nwg);
    if (i >= P[0]) { return; }
    Y[strided(2u + layout_len(2u), i)] = X0[strided(2u, i)];
}
#endif
#endif
