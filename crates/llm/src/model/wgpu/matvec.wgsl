// Quantized matrix products and the embedding lookup over GGUF blocks (`quant.wgsl`, with
// `deq`, BLOCK_BYTES, UNITS (32-value units per block) and ROWS prepended by `wgpu.rs`).
//
// matvec: y[r][n0 + o] (+)= sum_k W[o][k] * x[r][k] (+ bias[n0 + o]) for the output rows o of
// one matrix chunk and the activation rows r of the step. A workgroup of 128 threads takes 4
// output rows (32 lanes each, striding over the row's 32-value units) and ROWS activation
// rows, so each weight unit is dequantized once for ROWS rows; workgroups are numbered
// (output group, row group) with the row group fastest, so the row groups of one weight tile
// run side by side. The lanes' sums meet in workgroup memory (no subgroup operations).
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
const OUTS: u32 = 4u;

var<workgroup> red: array<f32, WG * ROWS>;

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
            let w = deq(base + (u / UNITS) * BLOCK_BYTES, u % UNITS);
            for (var r = 0u; r < ROWS; r++) {
                let xi = min(r0 + r, rows - 1u) * xs + u * 8u;
                var s = 0.0;
                for (var j = 0u; j < 8u; j++) {
                    let wv = vec4<f32>(w[4u * j], w[4u * j + 1u], w[4u * j + 2u], w[4u * j + 3u]);
                    s += dot(wv, x[xi + j]);
                }
                acc[r] += s;
            }
        }
    }
    for (var r = 0u; r < ROWS; r++) {
        red[t * ROWS + r] = acc[r];
    }
    workgroupBarrier();
    for (var st = LANES / 2u; st > 0u; st >>= 1u) {
        if (lane < st) {
            for (var r = 0u; r < ROWS; r++) {
                red[t * ROWS + r] += red[(t + st) * ROWS + r];
            }
        }
        workgroupBarrier();
    }
    let flags = p[6];
    if ((flags & 4u) != 0u) {
        // Gated unit: output rows 2i (gate, lanes t) and 2i + 1 (up, lanes t + 32) of this
        // workgroup give y[row][[8] + (n0 + 2i) / 2] = act(gate) * up.
        if (lane == 0u && o < n && (o & 1u) == 0u) {
            for (var r = 0u; r < ROWS; r++) {
                let row = r0 + r;
                if (row < rows) {
                    let g = red[t * ROWS + r];
                    let u = red[(t + LANES) * ROWS + r];
                    y[row * p[4] + p[8] + (p[3] + o) / 2u] = glu_act(g, (flags & 8u) != 0u) * u;
                }
            }
        }
        return;
    }
    if (lane == 0u && o < n) {
        for (var r = 0u; r < ROWS; r++) {
            let row = r0 + r;
            if (row < rows) {
                var v = red[t * ROWS + r];
                if ((flags & 2u) != 0u) {
                    v += bias[p[3] + o];
                }
                let i = row * p[4] + p[8] + p[3] + o;
                if ((flags & 1u) != 0u) {
                    v += y[i];
                }
                y[i] = v;
            }
        }
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
    let w = deq((tok - p[3]) * p[4] + (u / UNITS) * BLOCK_BYTES, u % UNITS);
    let scale = bitcast<f32>(p[6]);
    for (var j = 0u; j < 32u; j++) {
        y[r * p[1] + u * 32u + j] = w[j] * scale;
    }
}
