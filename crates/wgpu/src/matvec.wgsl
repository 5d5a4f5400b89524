// Quantized matrix products and the embedding lookup over GGUF blocks (`quant.wgsl`, with
// `head`, `pair`, `ipair`, BLOCK_BYTES, UNITS (32-value units per block), MINS, ROWS, NORM,
// OPW and Q8 prepended by `matvec_source` of qmatrix.rs).
//
// matvec: y[r][n0 + o] (+)= sum_k W[o][k] * x[r][k] (+ bias[n0 + o]) for the output rows o of
// one matrix chunk and the activation rows r of the step. A workgroup of 128 threads (four
// subgroups of LANES = 32) takes OUTS = 4 * OPW output rows, OPW (1, 2, or 4 with Q8) per
// subgroup, and ROWS activation rows, so each weight unit is dequantized once for ROWS rows
// and each activation load serves OPW output rows; workgroups are numbered (output group, row group)
// with the row group fastest, so the row groups of one weight tile run side by side.
// - Four lanes share a 32-value unit, each taking its head (scales) and one pair of vec4
//   values (no per-value arrays); eight units lie side by side, so a subgroup's activation
//   loads cover whole 128-byte spans and its weight loads consecutive bytes.
// - A lane takes four units at once (their loads issued together) and adds them to each
//   sum as ((u0 + u1) + (u2 + u3)), then the remaining units one by one.
// - The lanes' sums meet in workgroup memory and are added in two steps (`quad`): four lanes
//   into one, spread over the workgroup's threads, then eight by the thread that stores the
//   output. Neither the grouping nor that order depends on ROWS or OPW, so a row's result
//   does not depend on its batch.
//
// NORM: x is RMS-normed on the fly (no launch of its own): y = inv_rms(x[r]) * sum_k W[o][k] *
// (nw[k] * x[r][k]), the norm weights folded into each pair and each row's sum of squares
// summed alongside by subgroup 0's lanes (the only ones that do), then added as the sums are.
//
// Q8 (the q8 precision): x is 8-bit, quantized by `quantize_q8.wgsl` and bound as
// words at binding 5, each row `k / 4` words of four signed bytes and then `k / 32` f32 block
// scales; each pair's products are two `dot4I8Packed` of its weight bytes (`ipair`) against
// the activation words, scaled once per pair, the units grouped and added in the order of the
// f32 path. With NORM the norm weights are in those bytes already and the row's 1 / rms is
// applied here, from the blocks' sums of squares that `quantize_q8` wrote after all rows.
//
// params: [0] R activation rows, [1] K columns, [2] n output rows in the chunk, [3] n0 first
// output column in y, [4] y row stride, [5] weight bytes per row, [6] flags (1: add to y,
// 2: add the bias, 4: rows are gate/up pairs, the gated unit in the epilogue (8: tanh-GELU,
// else SiLU)), [7] x row stride (f32, a multiple of 4), [8] first output column of the
// matrix in y (its row o of chunk row n0 lands in column [8] + n0 + o), [9] the norm's
// epsilon (f32 bits; NORM).

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> bias: array<f32>;
@group(0) @binding(5) var<storage, read> sdata: array<u32>;
@group(0) @binding(6) var<storage, read> nw: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> prev: array<u32>;

const WG: u32 = 128u;
const LANES: u32 = 32u;
const OUTS: u32 = (WG / LANES) * OPW;
// Lanes per unit (one pair each) and units side by side: lane l takes pair l % PAIRS of
// units l / PAIRS, l / PAIRS + STEP, ...
const PAIRS: u32 = 4u;
const STEP: u32 = LANES / PAIRS;

// A pair with its head and (NORM) the norm weights of its values, already folded into v.
struct Unit {
    h: Head,
    v: Pair,
    nl: vec4<f32>,
    nh: vec4<f32>,
}

// Pair w of 32-value unit u of the row whose blocks start at byte `base`, with its head.
fn unit_at(base: u32, u: u32, w: u32) -> Unit {
    let a = base + (u / UNITS) * BLOCK_BYTES;
    let s = u % UNITS;
    let h = head(a, s);
    let v = pair(a, s, h, w);
    if (NORM) {
        let nl = nw[u * 8u + w];
        let nh = nw[u * 8u + w + 4u];
        return Unit(h, Pair(v.lo * nl, v.hi * nh), nl, nh);
    }
    return Unit(h, v, vec4<f32>(1.0), vec4<f32>(1.0));
}

// A pair's products with one row's activations xl (values 4w..4w+4 of the unit) and xh
// (16+4w..): scales and mins applied once per pair.
fn unit_dot(q: Unit, xl: vec4<f32>, xh: vec4<f32>) -> f32 {
    var v = q.h.d.x * dot(q.v.lo, xl) + q.h.d.y * dot(q.v.hi, xh);
    if (MINS) {
        v += q.h.m.x * dot(xl, q.nl) + q.h.m.y * dot(xh, q.nh);
    }
    return v;
}

// A row's sum of squares over one pair's activations (NORM).
fn squares(xl: vec4<f32>, xh: vec4<f32>) -> f32 {
    return dot(xl, xl) + dot(xh, xh);
}

// Q8: a pair as two words of four signed bytes (values 4w.. and 16 + 4w..), with its head.
struct IUnit {
    h: Head,
    lo: u32,
    hi: u32,
}

fn iunit_at(base: u32, u: u32, w: u32) -> IUnit {
    let a = base + (u / UNITS) * BLOCK_BYTES;
    let s = u % UNITS;
    let h = head(a, s);
    let v = ipair(a, s, h, w);
    return IUnit(h, v.x, v.y);
}

const ONES: u32 = 0x01010101u;

// A pair's products with one row's quantized activations (words xl, xh of a block of scale
// d): integer dots, then the pair's scales (and mins, through the activations' sums).
fn unit_q8(q: IUnit, xl: u32, xh: u32, d: f32) -> f32 {
    var v = q.h.d.x * f32(dot4I8Packed(q.lo, xl)) + q.h.d.y * f32(dot4I8Packed(q.hi, xh));
    if (MINS) {
        v += q.h.m.x * f32(dot4I8Packed(xl, ONES)) + q.h.m.y * f32(dot4I8Packed(xh, ONES));
    }
    return d * v;
}

// Four units STEP apart of one output row, for a lane's loads issued together.
struct Four {
    u0: IUnit,
    u1: IUnit,
    u2: IUnit,
    u3: IUnit,
}

fn four_at(base: u32, u: u32, w: u32) -> Four {
    return Four(iunit_at(base, u, w), iunit_at(base, u + STEP, w), iunit_at(base, u + 2u * STEP, w),
                iunit_at(base, u + 3u * STEP, w));
}

// Their products with one row's activation words (lo, hi of each unit) and block scales,
// added as ((u0 + u1) + (u2 + u3)).
fn four_q8(f: Four, xl: vec4<u32>, xh: vec4<u32>, d: vec4<f32>) -> f32 {
    return (unit_q8(f.u0, xl.x, xh.x, d.x) + unit_q8(f.u1, xl.y, xh.y, d.y))
        + (unit_q8(f.u2, xl.z, xh.z, d.z) + unit_q8(f.u3, xl.w, xh.w, d.w));
}

// Q8: this lane's products over the row's units, grouped as the f32 loop groups them, for
// the subgroup's OPW output rows (1, 2 or 4) whose weights start at bases .x, .y, .z, .w.
fn products_q8(lane: u32, units: u32, r0: u32, rows: u32, k: u32, base: vec4<u32>,
               acc: ptr<function, array<f32, ROWS>>, acc2: ptr<function, array<f32, ROWS>>,
               acc3: ptr<function, array<f32, ROWS>>, acc4: ptr<function, array<f32, ROWS>>) {
    let w = lane % PAIRS;
    let rs = k / 4u + units;
    var u = lane / PAIRS;
    for (; u + 3u * STEP < units; u += 4u * STEP) {
        // Rows o + 1.. (OPW > 1), loaded beside row o's (unused and dropped where OPW = 1).
        let fa = four_at(base.x, u, w);
        let fb = four_at(base.y, u, w);
        let fc = four_at(base.z, u, w);
        let fe = four_at(base.w, u, w);
        for (var r = 0u; r < ROWS; r++) {
            let xr = min(r0 + r, rows - 1u) * rs;
            let xi = xr + u * 8u + w;
            let s8 = STEP * 8u;
            let xl = vec4<u32>(sdata[xi], sdata[xi + s8], sdata[xi + 2u * s8], sdata[xi + 3u * s8]);
            let xh = vec4<u32>(sdata[xi + 4u], sdata[xi + s8 + 4u], sdata[xi + 2u * s8 + 4u],
                               sdata[xi + 3u * s8 + 4u]);
            let di = xr + k / 4u + u;
            let d = bitcast<vec4<f32>>(vec4<u32>(sdata[di], sdata[di + STEP], sdata[di + 2u * STEP],
                                                 sdata[di + 3u * STEP]));
            (*acc)[r] += four_q8(fa, xl, xh, d);
            if (OPW >= 2u) {
                (*acc2)[r] += four_q8(fb, xl, xh, d);
            }
            if (OPW == 4u) {
                (*acc3)[r] += four_q8(fc, xl, xh, d);
                (*acc4)[r] += four_q8(fe, xl, xh, d);
            }
        }
    }
    for (; u < units; u += STEP) {
        let q = iunit_at(base.x, u, w);
        let b = iunit_at(base.y, u, w);
        let c = iunit_at(base.z, u, w);
        let e = iunit_at(base.w, u, w);
        for (var r = 0u; r < ROWS; r++) {
            let xr = min(r0 + r, rows - 1u) * rs;
            let xi = xr + u * 8u + w;
            let xl = sdata[xi];
            let xh = sdata[xi + 4u];
            let d = bitcast<f32>(sdata[xr + k / 4u + u]);
            (*acc)[r] += unit_q8(q, xl, xh, d);
            if (OPW >= 2u) {
                (*acc2)[r] += unit_q8(b, xl, xh, d);
            }
            if (OPW == 4u) {
                (*acc3)[r] += unit_q8(c, xl, xh, d);
                (*acc4)[r] += unit_q8(e, xl, xh, d);
            }
        }
    }
}

// Q8 with NORM: blocks l, l + LANES, ... of the blocks' sums of squares starting at sdata[b],
// four loads at a time.
fn block_squares(b: u32, l: u32, units: u32) -> f32 {
    var s = 0.0;
    var i = l;
    for (; i + 3u * LANES < units; i += 4u * LANES) {
        let a0 = bitcast<f32>(sdata[b + i]);
        let a1 = bitcast<f32>(sdata[b + i + LANES]);
        let a2 = bitcast<f32>(sdata[b + i + 2u * LANES]);
        let a3 = bitcast<f32>(sdata[b + i + 3u * LANES]);
        s += (a0 + a1) + (a2 + a3);
    }
    for (; i < units; i += LANES) {
        s += bitcast<f32>(sdata[b + i]);
    }
    return s;
}

// Lane partial sums, [thread][output of the subgroup][row], and subgroup 0's sums of
// squares, [lane][row] (NORM; with Q8, every thread's share of them).
var<workgroup> red: array<f32, WG * OPW * ROWS>;
var<workgroup> ssq: array<f32, LANES * ROWS>;

// The lanes' sums in two steps: lane l < 8 of every (output, row) takes ((l + l8) + (l16 +
// l24)) (l8: lane l + 8, ...), and (NORM) so do subgroup 0's sums of squares; after a barrier
// the thread that needs a sum adds lanes 0..8 as a balanced tree (`lane_sum`, `inv_rms`).
fn quad(t: u32) {
    let st = 8u * OPW * ROWS;
    for (var e = t; e < OUTS * ROWS * 8u; e += WG) {
        let l = e % 8u;
        let r = (e / 8u) % ROWS;
        let i = e / (8u * ROWS);
        let a = (((i / OPW) * LANES + l) * OPW + i % OPW) * ROWS + r;
        red[a] = (red[a] + red[a + st]) + (red[a + 2u * st] + red[a + 3u * st]);
    }
    if (NORM) {
        let sq = 8u * ROWS;
        for (var a = t; a < sq; a += WG) {
            ssq[a] = (ssq[a] + ssq[a + sq]) + (ssq[a + 2u * sq] + ssq[a + 3u * sq]);
        }
    }
}

// 1 / rms of row r (NORM), after `quad`.
fn inv_rms(r: u32, k: u32) -> f32 {
    let s = ROWS;
    let v = ((ssq[r] + ssq[r + s]) + (ssq[r + 2u * s] + ssq[r + 3u * s]))
        + ((ssq[r + 4u * s] + ssq[r + 5u * s]) + (ssq[r + 6u * s] + ssq[r + 7u * s]));
    return 1.0 / sqrt(v / f32(k) + bitcast<f32>(p[9]));
}

// Sum over the lanes of output i (of this workgroup) for row r, after `quad`.
fn lane_sum(i: u32, r: u32) -> f32 {
    let b = ((i / OPW) * LANES * OPW + i % OPW) * ROWS + r;
    let s = OPW * ROWS;
    return ((red[b] + red[b + s]) + (red[b + 2u * s] + red[b + 3u * s]))
        + ((red[b + 4u * s] + red[b + 5u * s]) + (red[b + 6u * s] + red[b + 7u * s]));
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
    // This subgroup's output rows o and (OPW = 2) o + 1; a row past n is computed from row
    // n - 1 and never stored.
    let o = og * OUTS + (t / LANES) * OPW;
    var acc: array<f32, ROWS>;
    var acc2: array<f32, ROWS>;
    var ss: array<f32, ROWS>;
    for (var r = 0u; r < ROWS; r++) {
        acc[r] = 0.0;
        acc2[r] = 0.0;
        ss[r] = 0.0;
    }
    let units = k / 32u;
    let xs = p[7] / 4u;
    let base = o * p[5];
    let base2 = min(o + 1u, n - 1u) * p[5];
    // Output rows o + 2, o + 3 (OPW = 4, Q8 only).
    var acc3: array<f32, ROWS>;
    var acc4: array<f32, ROWS>;
    if (Q8) {
        if (o < n) {
            let last = n - 1u;
            let bases = vec4<u32>(o, min(o + 1u, last), min(o + 2u, last), min(o + 3u, last)) * p[5];
            products_q8(lane, units, r0, rows, k, bases, &acc, &acc2, &acc3, &acc4);
        }
        if (NORM) {
            // The rows' sums of squares from the blocks' (after all rows' words and scales):
            // entry [l][r] of `ssq` takes blocks l, l + LANES, ... of row r, whichever
            // thread adds them (the threads share the rows' entries).
            let sq0 = rows * (k / 4u + units);
            for (var e = t; e < LANES * ROWS; e += WG) {
                let r = e / LANES;
                ssq[(e % LANES) * ROWS + r] = block_squares(sq0 + min(r0 + r, rows - 1u) * units,
                                                            e % LANES, units);
            }
        }
    } else if (o < n) {
        let w = lane % PAIRS;
        var u = lane / PAIRS;
        // Four units a lane at once (STEP apart), their loads issued together; with OPW = 2
        // (ROWS = 1) each activation load serves both output rows.
        for (; u + 3u * STEP < units; u += 4u * STEP) {
            let q0 = unit_at(base, u, w);
            let q1 = unit_at(base, u + STEP, w);
            let q2 = unit_at(base, u + 2u * STEP, w);
            let q3 = unit_at(base, u + 3u * STEP, w);
            // Row o + 1's units (OPW = 2), loaded here beside row o's, not inside the `if`
            // below, from where a driver may issue them only after row o's sums. Unused
            // (and dropped by the compiler) where OPW = 1.
            let b0 = unit_at(base2, u, w);
            let b1 = unit_at(base2, u + STEP, w);
            let b2 = unit_at(base2, u + 2u * STEP, w);
            let b3 = unit_at(base2, u + 3u * STEP, w);
            for (var r = 0u; r < ROWS; r++) {
                let xi = min(r0 + r, rows - 1u) * xs + u * 8u + w;
                let xa = x[xi];
                let xb = x[xi + 4u];
                let xc = x[xi + STEP * 8u];
                let xd = x[xi + STEP * 8u + 4u];
                let xe = x[xi + STEP * 16u];
                let xf = x[xi + STEP * 16u + 4u];
                let xg = x[xi + STEP * 24u];
                let xh = x[xi + STEP * 24u + 4u];
                acc[r] += (unit_dot(q0, xa, xb) + unit_dot(q1, xc, xd))
                    + (unit_dot(q2, xe, xf) + unit_dot(q3, xg, xh));
                if (OPW == 2u) {
                    acc2[r] += (unit_dot(b0, xa, xb) + unit_dot(b1, xc, xd))
                        + (unit_dot(b2, xe, xf) + unit_dot(b3, xg, xh));
                }
                if (NORM && t < LANES) {
                    ss[r] += (squares(xa, xb) + squares(xc, xd))
                        + (squares(xe, xf) + squares(xg, xh));
                }
            }
        }
        for (; u < units; u += STEP) {
            let q = unit_at(base, u, w);
            let b = unit_at(base2, u, w);
            for (var r = 0u; r < ROWS; r++) {
                let xi = min(r0 + r, rows - 1u) * xs + u * 8u + w;
                let xa = x[xi];
                let xb = x[xi + 4u];
                acc[r] += unit_dot(q, xa, xb);
                if (OPW == 2u) {
                    acc2[r] += unit_dot(b, xa, xb);
                }
                if (NORM && t < LANES) {
                    ss[r] += squares(xa, xb);
                }
            }
        }
    }
    for (var r = 0u; r < ROWS; r++) {
        red[t * OPW * ROWS + r] = acc[r];
        if (OPW >= 2u) {
            red[(t * OPW + 1u) * ROWS + r] = acc2[r];
        }
        if (OPW == 4u) {
            red[(t * OPW + 2u) * ROWS + r] = acc3[r];
            red[(t * OPW + 3u) * ROWS + r] = acc4[r];
        }
        if (NORM && !Q8 && t < LANES) {
            ssq[t * ROWS + r] = ss[r];
        }
    }
    workgroupBarrier();
    quad(t);
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
            var gv = lane_sum(2u * i, r);
            var uv = lane_sum(2u * i + 1u, r);
            if (NORM) {
                let inv = inv_rms(r, k);
                gv *= inv;
                uv *= inv;
            }
            y[row * p[4] + p[8] + (p[3] + oo) / 2u] = glu_act(gv, (flags & 8u) != 0u) * uv;
        }
        return;
    }
    let i = t / ROWS;
    let oo = og * OUTS + i;
    if (i < OUTS && row < rows && oo < n) {
        var v = lane_sum(i, r);
        if (NORM) {
            v *= inv_rms(r, k);
        }
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

// SiLU, or tanh-GELU with `gelu` (as the LLM kernel set's glu in its ops.wgsl).
fn glu_act(g: f32, gelu: bool) -> f32 {
    if (!gelu) {
        return g / (1.0 + exp(-g));
    }
    let z = clamp(0.7978846 * (g + 0.044715 * g * g * g), -15.0, 15.0);
    return 0.5 * g * (1.0 + tanh(z));
}

// embed: y[r][:] = row tokens[r] of the embedding matrix * scale, for the rows whose token
// lies in this chunk (rows c0..c0 + n of the matrix). One thread per 32-value unit. A token
// of 0xffffffff (PREV_TOKEN of model/step.rs) is the previous step's pick of row r, prev[r].
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
    var tok = sdata[p[5] + r];
    if (tok == 0xffffffffu) {
        tok = prev[r];
    }
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
        let lo = (h.d.x * v.lo + h.m.x) * scale;
        let hi = (h.d.y * v.hi + h.m.y) * scale;
        for (var j = 0u; j < 4u; j++) {
            y[y0 + 4u * w + j] = lo[j];
            y[y0 + 16u + 4u * w + j] = hi[j];
        }
    }
}
