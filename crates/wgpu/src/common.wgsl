// Shared by every kernel. Binding 0 holds the dispatch's parameter words (sizes, strides, op
// codes, f32 scalars as bits); bindings 1.. are its tensors, one 32-bit word per element.
// Workgroups are 256 threads along x; a dispatch of more than 65535 groups spreads over y.
@group(0) @binding(0) var<storage, read> P: array<u32>;

const WG: u32 = 256u;

// Linear thread index over the 2-D grid of 1-D workgroups.
fn thread_id(wid: vec3<u32>, lid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return (wid.x + wid.y * nwg.x) * WG + lid.x;
}

// Linear workgroup index.
fn group_id(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

fn pf(i: u32) -> f32 {
    return bitcast<f32>(P[i]);
}

fn pi(i: u32) -> i32 {
    return bitcast<i32>(P[i]);
}

// A strided layout stored in P at `at`: rank, offset, dims[rank], strides[rank] (in elements).
// Returns the storage index of the layout's row-major element `i`.
// `i` must be below the layout's element count, so the outermost dim needs no division
// (a contiguous layout, coalesced to rank 1, costs one multiply-add).
fn strided(at: u32, i: u32) -> u32 {
    let rank = P[at];
    var off = P[at + 1u];
    var rem = i;
    for (var k = rank; k > 1u; k--) {
        let d = P[at + 1u + k];
        off += (rem % d) * P[at + 1u + rank + k];
        rem /= d;
    }
    if (rank > 0u) {
        off += rem * P[at + 2u + rank];
    }
    return off;
}

// Words a strided layout takes in P.
fn layout_len(at: u32) -> u32 {
    return 2u + 2u * P[at];
}
