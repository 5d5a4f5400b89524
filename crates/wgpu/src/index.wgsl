// Indexing: index_select, gather, scatter_add. Index words are I (i32 for i32/i64, u32 for
// u32/u8); an index outside [0, axis length) sets the device error word (errors.rs) and its
// element reads 0. T: element words (f32 sums for floats in scatter_add).

@group(0) @binding(1) var<storage, read_write> Y: array<u32>;
@group(0) @binding(2) var<storage, read> X0: array<u32>;
@group(0) @binding(3) var<storage, read> X1: array<u32>;
#if SCATTER
@group(0) @binding(4) var<storage, read> X2: array<u32>;
@group(0) @binding(5) var<storage, read_write> ERR: atomic<u32>;
#else
@group(0) @binding(4) var<storage, read_write> ERR: atomic<u32>;
#endif

// Index value at word i, and whether it lies in [0, len).
fn index_at(i: u32, len: u32) -> vec2<u32> {
    let raw = bitcast<I>(X1[i]);
#if I_I
    let ok = raw >= 0 && u32(raw) < len;
#else
    let ok = raw < len;
#endif
    return vec2<u32>(u32(raw), select(0u, 1u, ok));
}

#if !SCATTER
// P: [n, outer, len, nidx, inner, x_off, idx_off, code]. x contiguous [outer, len, inner],
// y [outer, nidx, inner].
@compute @workgroup_size(256)
fn index_select(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_id(wid, lid, nwg);
    if (i >= P[0]) { return; }
    let inner = P[4];
    let nidx = P[3];
    let o = i / (nidx * inner);
    let j = (i / inner) % nidx;
    let r = i % inner;
    let ix = index_at(P[6] + j, P[2]);
    if (ix.y == 0u) {
        atomicMax(&ERR, P[7]);
        Y[i] = 0u;
        return;
    }
    Y[i] = X0[P[5] + (o * P[2] + ix.x) * inner + r];
}

// P: [n, rank, axis, len, idx_off, code, x_off, dims[rank] (the index's), x_strides[rank]].
// The index is contiguous; y has its shape.
@compute @workgroup_size(256)
fn gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_id(wid, lid, nwg);
    if (i >= P[0]) { return; }
    let rank = P[1];
    let axis = P[2];
    let ix = index_at(P[4] + i, P[3]);
    if (ix.y == 0u) {
        atomicMax(&ERR, P[5]);
        Y[i] = 0u;
        return;
    }
    var off = P[6];
    var rem = i;
    for (var d = rank; d > 0u; d--) {
        let size = P[6u + d];
        let c = rem % size;
        rem /= size;
        off += select(c, ix.x, d - 1u == axis) * P[6u + rank + d];
    }
    Y[i] = X0[off];
}
#else
#if T_F
alias A = f32;
#else
alias A = T;
#endif

// P: [n, rank, axis, len, idx_off, code, base_off, src_off, dims[rank] (base's),
//     idx_dims[rank], base_strides[rank], src_strides[rank]]. The index is contiguous; y has
// base's shape. Each output element sums, in index order, the src elements whose index along
// `axis` names it (deterministic, no atomics).
@compute @workgroup_size(256)
fn scatter_add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = thread_id(wid, lid, nwg);
    if (i >= P[0]) { return; }
    let rank = P[1];
    let axis = P[2];
    var c: array<u32, 8>;
    var rem = i;
    var base_off = P[6];
    var inside = true;
    for (var d = rank; d > 0u; d--) {
        let size = P[7u + d];
        c[d - 1u] = rem % size;
        rem /= size;
        base_off += c[d - 1u] * P[7u + 2u * rank + d];
        if (d - 1u != axis && c[d - 1u] >= P[7u + rank + d]) { inside = false; }
    }
    var acc = A(bitcast<T>(X0[base_off]));
    if (inside) {
        let nj = P[8u + rank + axis];
        for (var j = 0u; j < nj; j++) {
            var ioff = 0u;
            var soff = P[7];
            var stride = 1u;
            for (var d = rank; d > 0u; d--) {
                let cd = select(c[d - 1u], j, d - 1u == axis);
                ioff += cd * stride;
                stride *= P[7u + rank + d];
                soff += cd * P[7u + 3u * rank + d];
            }
            let ix = index_at(P[4] + ioff, P[3]);
            if (ix.y == 0u) {
                if (c[axis] == 0u) { atomicMax(&ERR, P[5]); }
                continue;
            }
            if (ix.x == c[axis]) {
                acc += A(bitcast<T>(X2[soff]));
            }
        }
    }
    Y[i] = bitcast<u32>(fit_T(T(acc)));
}
#endif
