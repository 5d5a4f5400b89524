// Batched matmul y[b] = a[b] @ b[b], f32 accumulation: a [m, k] and b [k, n] read through
// strides (transposed and broadcast views need no copy), y contiguous [batch.., m, n].
// A workgroup computes a 64x64 tile of y, 16x16 threads of 4x4 each, stepping k by 16 through
// workgroup memory.
// P: [m, n, k, batch, sa_m, sa_k, sb_k, sb_n, a_off, b_off, rank, dims[rank],
//     a_strides[rank], b_strides[rank]] (the batch dims and each input's strides over them).

@group(0) @binding(1) var<storage, read_write> Y: array<u32>;
@group(0) @binding(2) var<storage, read> XA: array<u32>;
@group(0) @binding(3) var<storage, read> XB: array<u32>;

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 16u;

var<workgroup> As: array<f32, 1024>; // [TK][TM]
var<workgroup> Bs: array<f32, 1024>; // [TK][TN]

@compute @workgroup_size(256)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let m = P[0];
    let n = P[1];
    let k = P[2];
    let tiles_m = (m + TM - 1u) / TM;
    let tiles_n = (n + TN - 1u) / TN;
    let g = group_id(wid, nwg);
    if (g >= tiles_m * tiles_n * P[3]) { return; }
    let batch = g / (tiles_m * tiles_n);
    let tile = g % (tiles_m * tiles_n);
    let row0 = (tile / tiles_n) * TM;
    let col0 = (tile % tiles_n) * TN;
    // Batch offsets of a and b.
    let rank = P[10];
    var a_base = P[8];
    var b_base = P[9];
    var rem = batch;
    for (var d = rank; d > 0u; d--) {
        let size = P[10u + d];
        let idx = rem % size;
        rem /= size;
        a_base += idx * P[10u + rank + d];
        b_base += idx * P[10u + 2u * rank + d];
    }
    let sa_m = P[4];
    let sa_k = P[5];
    let sb_k = P[6];
    let sb_n = P[7];
    let t = lid.x;
    let tr = (t / 16u) * 4u;
    let tc = (t % 16u) * 4u;
    var acc: array<array<f32, 4>, 4>;
    for (var k0 = 0u; k0 < k; k0 += TK) {
        // Each thread loads 4 elements of each tile.
        for (var q = 0u; q < 4u; q++) {
            let e = t + q * WG;
            // A tile element e: kk = e % TK, i = e / TK (consecutive threads walk k).
            let ai = e / TK;
            let ak = e % TK;
            let gr = row0 + ai;
            let gk = k0 + ak;
            var av = 0.0;
            if (gr < m && gk < k) {
                av = f32(bitcast<T>(XA[a_base + gr * sa_m + gk * sa_k]));
            }
            As[ak * TM + ai] = av;
            // B tile element e: j = e % TN, kk = e / TN (consecutive threads walk n).
            let bj = e % TN;
            let bk = e / TN;
            let gc = col0 + bj;
            let gk2 = k0 + bk;
            var bv = 0.0;
            if (gc < n && gk2 < k) {
                bv = f32(bitcast<T>(XB[b_base + gk2 * sb_k + gc * sb_n]));
            }
            Bs[bk * TN + bj] = bv;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < TK; kk++) {
            var a4: array<f32, 4>;
            var b4: array<f32, 4>;
            for (var i = 0u; i < 4u; i++) {
                a4[i] = As[kk * TM + tr + i];
                b4[i] = Bs[kk * TN + tc + i];
            }
            for (var i = 0u; i < 4u; i++) {
                for (var j = 0u; j < 4u; j++) {
                    acc[i][j] = fma(a4[i], b4[j], acc[i][j]);
                }
            }
        }
        workgroupBarrier();
    }
    let y_base = batch * m * n;
    for (var i = 0u; i < 4u; i++) {
        let r = row0 + tr + i;
        if (r >= m) { continue; }
        for (var j = 0u; j < 4u; j++) {
            let c = col0 + tc + j;
            if (c < n) {
                Y[y_base + r * n + c] = bitcast<u32>(fit_T(T(acc[i][j])));
            }
        }
    }
}
