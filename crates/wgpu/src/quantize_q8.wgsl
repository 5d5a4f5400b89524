// The 8-bit activations of the quantized products (Q8 of matvec.wgsl).
//
// quantize_q8: row r of src (n values, at src[r * stride..]) as 32-value blocks of signed
// bytes for the Q8 products (matvec.wgsl): xq row r is n / 4 words of four bytes (value
// 4i + j in byte j of word i), then n / 32 block scales (f32 bits). A block's scale d =
// max|v| / 127 and q = v / d rounded half away from zero: the CPU's `quantize_q8`. A
// workgroup takes QB = 64 blocks of one row, four threads a block (eight values each).
// With the RMS norm ([2] = 1, weights nw) the values quantized are src * nw, without the
// row's 1 / rms: a block's bytes do not change when all its values are scaled, so the product
// that reads them applies 1 / rms after its sums, from each block's sum of squares of src,
// written after all the rows' words and scales (at rows * (n / 4 + n / 32) + r * n / 32 +
// block). No sum over the whole row here: a normed input costs what a plain one does.
// params: [0] n (a multiple of 32), [1] rows, [2] 1: RMS norm, [3] src row stride (f32),
// [4] workgroups per row.

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read_write> xq: array<u32>;
@group(0) @binding(2) var<storage, read> src: array<f32>;
@group(0) @binding(3) var<storage, read> nw: array<f32>;

var<workgroup> red: array<f32, 256>;
var<workgroup> redi: array<u32, 256>;

const QB: u32 = 64u;

@compute @workgroup_size(256)
fn quantize_q8(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let g = wid.x + wid.y * nwg.x;
    let row = g / p[4];
    let n = p[0];
    if (row >= p[1]) {
        return;
    }
    let norm = p[2] == 1u;
    let s0 = row * p[3];
    let blocks = n / 32u;
    let b = (g % p[4]) * QB + t / 4u;
    let j = t % 4u;
    let i0 = b * 32u + 8u * j;
    var v: array<f32, 8>;
    var m = 0.0;
    var sq = 0.0;
    if (b < blocks) {
        for (var i = 0u; i < 8u; i++) {
            var e = src[s0 + i0 + i];
            if (norm) {
                sq += e * e;
                e = e * nw[i0 + i];
            }
            v[i] = e;
            m = max(m, abs(e));
        }
    }
    // The block's four maxima (and the threads' sums of squares) meet in workgroup memory.
    red[t] = m;
    redi[t] = bitcast<u32>(sq);
    workgroupBarrier();
    let q0 = t & ~3u;
    m = max(max(red[q0], red[q0 + 1u]), max(red[q0 + 2u], red[q0 + 3u]));
    let rw = n / 4u + blocks;
    if (b >= blocks) {
        return;
    }
    let d = m / 127.0;
    let id = select(0.0, 1.0 / d, d != 0.0);
    let o0 = row * rw;
    for (var w = 0u; w < 2u; w++) {
        var word = 0u;
        for (var k = 0u; k < 4u; k++) {
            let r = v[4u * w + k] * id;
            let q = i32(r + select(-0.5, 0.5, r >= 0.0));
            word |= (bitcast<u32>(q) & 255u) << (8u * k);
        }
        xq[o0 + b * 8u + 2u * j + w] = word;
    }
    if (j == 0u) {
        xq[o0 + n / 4u + b] = bitcast<u32>(d);
        if (norm) {
            let s = (bitcast<f32>(redi[q0]) + bitcast<f32>(redi[q0 + 1u]))
                + (bitcast<f32>(redi[q0 + 2u]) + bitcast<f32>(redi[q0 + 3u]));
            xq[p[1] * rw + row * blocks + b] = bitcast<u32>(s);
        }
    }
}
