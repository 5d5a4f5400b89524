// Quantized matrix products and the embedding lookup over GGUF blocks (`quant.wgsl`, with
// `head`, `pair`, BLOCK_BYTES, UNITS (32-value units per block) and ROWS prepended by
// `wgpu.rs`).
//
// matvec: y[r][n0 + o] (+)= sum_k W[o][k] * x[r][k] (+ bias[n0 + o]) for the output rows o of
// one matrix chunk and the activation rows r of the step. A workgroup of 128 threads takes
// OUTS = 4 output rows (LANES = 32 threads each, striding over the row's 32-value units) and
// ROWS activation rows, so each weight unit is dequantized once for ROWS rows; workgroups are numbered
// (output group, row group) with the row group fastest, so the row groups of one weight tile
// run side by side. A unit is read as its head (scales) and four pairs of vec4 values, each
// multiplied into the accumulators at once (no per-value arrays). The lanes' sums meet in
// workgroup memory after one barrier and are added in lane order by one thread per (output,
// row): the same order whatever ROWS is, so a row's result does not depend on its batch.
//
// params: [0] R activation rows, [1] K columns, [2] n output rows in the chunk, [3] n0 first
// output column in y, [4] y row stride, [5] weight bytes per row, [6] flags (1: add to y,
// 2: add the bias, 4: rows are gate/up pairs, the gated unit in the epilogue (8: tanh-GELU,
// else SiLU)), [7] x row stride (f32, a multiple of 4), [8] first output column of the
// matrix in y (its row o of chunk row n0 lands in column [8] + n0 + o).

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read> sdata: array<u32>;

const WG: u32 = 128u;
const LANES: u32 = 32u;
const OUTS: u32 = WG / LANES;

// Lane partial sums, [thread][row].
var<workgroup> red: array<f32, WG * ROWS>;

// Sum over the lanes of output o (of this workgroup) for row r, in lane order.
fn lane_sum(o: u32, r: u32) -> f32 {
    var v = 0.0;
    for (var l = 0u; l < LANES; l++) {
        v += red[(o * LANES + l) * ROWS + r];
    }
    return v;
}

@compute @workgroup_size(128)
fn matvec(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let rows = p[0];
    let k = p[1];
    let n = p[2];
    let g = wid.x + wid.y * nwg.x;
    let nrg = (rows + ROWS - 1u) / ROWS;
    let og = g / nrg;
    let r0 = (g % nrg) * ROWS;
    let lane = t % LANES;
    let o = og * OUTS + t / LANES;
    var acc: array<f32, ROWS>;
    for (var r = 0u; r < ROWS; r++) {
        acc[r] = 0.0;
    }
    if (o < n) {
        let units = k / 32u;
        let base = o * p[5];
        let xs = p[7] / 4u;
        for (var u = lane; u < units; u += LANES) {
            let a = base + (u / UNITS) * BLOCK_BYTES;
            let s = u % UNITS;
            let h = head(a, s);
            for (var w = 0u; w < 4u; w++) {
                let v = pair(a, s, h, w);
                for (var r = 0u; r < ROWS; r++) {
                    let xi = min(r0 + r, rows - 1u) * xs + u * 8u + w;
                    acc[r] += dot(v.lo, x[xi]) + dot(v.hi, x[xi + 4u]);
                }
            }
        }
    }
    for (var r = 0u; r < ROWS; r++) {
        red[t * ROWS + r] = acc[r];
    }
    workgroupBarrier();
    let flags = p[6];
    let r = t % ROWS;
    let row = r0 + r;
    if ((flags & 4u) != 0u) {
        // Gated unit: output rows 2i (gate) and 2i + 1 (up) of this workgroup give
        // y[row][[8] + (n0 + o) / 2] = act(gate) * up, o = og * OUTS + 2i.
        let i = t / ROWS;
        let oo = og * OUTS + 2u * i;
        if (i < OUTS / 2u && row < rows && oo < n) {
            let gv = lane_sum(2u * i, r);
            let uv = lane_sum(2u * i + 1u, r);
            y[row * p[4] + p[8] + (p[3] + oo) / 2u] = glu_act(gv, (flags & 8u) != 0u) * uv;
        }
        return;
    }
    let i = t / ROWS;
    let oo = og * OUTS + i;
    if (i < OUTS && row < rows && oo < n) {
        var v = lane_sum(i, r);
        if ((flags & 2u) != 0u) {
            v += bias[p[3] + oo];
        }
        let yi = row * p[4] + p[8] + p[3] + oo;
        if ((flags & 1u) != 0u) {
            v += y[yi];
        }
        y[yi] = v;
    }
}

// SiLU, or tanh-GELU with `gelu` (as ops.wgsl's glu).
fn glu_act(g: f32, gelu: bool) -> f32 {
    if (!gelu) {
        return g / (1.0 + exp(-g));
    }
    let z = clamp(0.7978846 * (g + 0.044715 * g * g * g), -15.0, 15.0);
    return 0.5 * g * (1.0 + tanh(z));
}

// embed: y[r][:] = row tokens[r] of the embedding matrix * scale, for the rows whose token
// lies in this chunk (rows c0..c0 + n of the matrix). One thread per 32-value unit.
// params: [0] R rows, [1] K columns (d_model), [2] n rows in the chunk, [3] c0 first row of
// the chunk, [4] weight bytes per row, [5] offset of the tokens in sdata, [6] scale (f32 bits).
@compute @workgroup_size(64)
fn embed(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let i = (wid.x + wid.y * nwg.x) * 64u + t;
    let units = p[1] / 32u;
    if (i >= p[0] * units) {
        return;
    }
    let r = i / units;
    let u = i % units;
    let tok = sdata[p[5] + r];
    if (tok < p[3] || tok >= p[3] + p[2]) {
        return;
    }
    let a = (tok - p[3]) * p[4] + (u / UNITS) * BLOCK_BYTES;
    let s = u % UNITS;
    let h = head(a, s);
    let scale = bitcast<f32>(p[6]);
    let y0 = r * p[1] + u * 32u;
    for (var w = 0u; w < 4u; w++) {
        let v = pair(a, s, h, w);
        for (var j = 0u; j < 4u; j++) {
            y[y0 + 4u * w + j] = v.lo[j] * scale;
            y[y0 + 16u + 4u * w + j] = v.hi[j] * scale;
        }
    }
}
