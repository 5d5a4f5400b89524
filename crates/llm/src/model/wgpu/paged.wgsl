// RoPE, the paged KV cache and causal attention.
//
// Cache layout (keys `kc`, values `vc`, f32): [block][layer][kv_head][16 slots][head_dim].
// sdata (u32): per batch row r, at [rows_at + 2r]: its position and the index in sdata of its
// sequence's block table (entry i: the block of positions 16i..16i + 16).
// trig (f32): cos then sin of the rows' angles, [rows][rope_dim / 2] each, at [cos_at] and
// [sin_at] (global or local angles, by the layer).
//
// params: [0] rows, [1] n_head, [2] n_kv_head, [3] head_dim, [4] rope_dim, [5] neox (1: pairs
// (i, i + rope_dim/2), 0: (2i, 2i + 1)), [6] cos_at, [7] sin_at, [8] layer, [9] n_layer,
// [10] rows_at, [11] window (0: none; else keys in (pos - window, pos]), [12] scale (f32 bits),
// [13] row stride of q, k and v (one [rows][q | k | v] buffer, bound as q, kin and vin),
// [14] first column of q, [15] of k, [16] of v, [17] S: splits per (row, head) in the grid
// (attention, attn_merge).
//
// Splits: a row whose window holds `len` keys takes ns = min(ceil(len / AWG), MAX_SPLITS)
// workgroups per head, split i taking keys [lo + i * per, lo + (i + 1) * per) with
// per = ceil(len / ns); a row of one split writes its output, the others write partial
// (values, max, sum) to `part` ([row][head][S][head_dim + 2]) and attn_merge combines them
// in split order. ns depends on the row's position alone, so a row's result does not depend
// on its batch.

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> sdata: array<u32>;
@group(0) @binding(2) var<storage, read> trig: array<f32>;
@group(0) @binding(3) var<storage, read> q: array<f32>;
@group(0) @binding(4) var<storage, read> kin: array<f32>;
@group(0) @binding(5) var<storage, read> vin: array<f32>;
@group(0) @binding(6) var<storage, read_write> kc: array<f32>;
@group(0) @binding(7) var<storage, read_write> vc: array<f32>;
@group(0) @binding(8) var<storage, read_write> out: array<f32>;
@group(0) @binding(9) var<storage, read_write> part: array<f32>;

const BS: u32 = 16u;
const WG: u32 = 64u;
const NEG: f32 = -3.0e38;

// How element d of a head of trig row r rotates: its partner's index, cos, sin, and whether it
// is the pair's first element; `on` false past rope_dim (kept as is).
struct Rot {
    partner: u32,
    c: f32,
    s: f32,
    first: bool,
    on: bool,
}

fn rot_of(d: u32, r: u32) -> Rot {
    let rd = p[4];
    if (d >= rd) {
        return Rot(d, 1.0, 0.0, true, false);
    }
    let half = rd / 2u;
    var i: u32;
    var partner: u32;
    var first: bool;
    if (p[5] == 1u) {
        i = d % half;
        first = d < half;
        partner = select(d - half, d + half, first);
    } else {
        i = d / 2u;
        first = (d % 2u) == 0u;
        partner = select(d - 1u, d + 1u, first);
    }
    return Rot(partner, trig[p[6] + r * half + i], trig[p[7] + r * half + i], first, true);
}

// v rotated with its partner o (the CPU's x0 * c - x1 * s, x0 * s + x1 * c).
fn apply_rot(v: f32, o: f32, rt: Rot) -> f32 {
    if (!rt.on) {
        return v;
    }
    if (rt.first) {
        return v * rt.c - o * rt.s;
    }
    return o * rt.s + v * rt.c;
}

fn cache_index(blk: u32, g: u32, slot: u32) -> u32 {
    let nkv = p[2];
    let hd = p[3];
    return (((blk * p[9] + p[8]) * nkv + g) * BS + slot) * hd;
}

// rope_store: one thread per (row, kv head, dim): k rotated and v into the row's cache slot.
@compute @workgroup_size(64)
fn rope_store(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let i = (wid.x + wid.y * nwg.x) * WG + t;
    let nkv = p[2];
    let hd = p[3];
    if (i >= p[0] * nkv * hd) {
        return;
    }
    let r = i / (nkv * hd);
    let g = (i / hd) % nkv;
    let d = i % hd;
    let pos = sdata[p[10] + 2u * r];
    let tab = sdata[p[10] + 2u * r + 1u];
    let blk = sdata[tab + pos / BS];
    let ci = cache_index(blk, g, pos % BS) + d;
    let k0 = r * p[13] + p[15] + g * hd;
    let rt = rot_of(d, r);
    kc[ci] = apply_rot(kin[k0 + d], kin[k0 + rt.partner], rt);
    vc[ci] = vin[r * p[13] + p[16] + g * hd + d];
}

// attention's workgroup: AWG threads, AWG keys per tile.
const AWG: u32 = 256u;
// Most workgroups one (row, head) is split over (`MAX_SPLITS` in wgpu.rs).
const MAX_SPLITS: u32 = 8u;

// The first key of row r's window and its number of keys.
fn window_of(r: u32) -> vec2<u32> {
    let pos = sdata[p[10] + 2u * r];
    let window = p[11];
    var lo = 0u;
    if (window > 0u && pos + 1u > window) {
        lo = pos + 1u - window;
    }
    return vec2<u32>(lo, pos + 1u - lo);
}

fn splits_of(len: u32) -> u32 {
    return min((len + AWG - 1u) / AWG, MAX_SPLITS);
}

var<workgroup> qs: array<f32, 256>;
var<workgroup> sc: array<f32, AWG>;
var<workgroup> kb: array<u32, AWG>;
var<workgroup> cm: array<f32, AWG>;
var<workgroup> cl: array<f32, AWG>;
var<workgroup> ca: array<vec4<f32>, AWG>;

// Values d..d + 4 of the cache row at `base` (zeros past head_dim).
fn v4(base: u32, d: u32, hd: u32) -> vec4<f32> {
    let i = base + d;
    return vec4<f32>(
        vc[i],
        select(0.0, vc[i + 1u], d + 1u < hd),
        select(0.0, vc[i + 2u], d + 2u < hd),
        select(0.0, vc[i + 3u], d + 3u < hd),
    );
}

// attention: one workgroup of AWG threads per (row, head, split): q rotated into workgroup
// memory, then the split's keys through the row's block table in tiles of AWG, in parallel
// over positions: each thread scores one key of the tile, then the threads form AWG / T key
// groups of T = ceil(head_dim / 4) threads (4 output dims each), each group running an online
// softmax over its share of the tile's keys (keys g, g + groups, ...); at the end the groups'
// (max, sum, values) are merged in group order. Two barriers per tile; the order of every sum
// depends on the row alone.
@compute @workgroup_size(256)
fn attention(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let gs = wid.x + wid.y * nwg.x;
    let nh = p[1];
    let hd = p[3];
    let S = p[17];
    let gi = gs / S;
    let split = gs % S;
    if (gi >= p[0] * nh) {
        return;
    }
    let r = gi / nh;
    let h = gi % nh;
    let win = window_of(r);
    let ns = splits_of(win.y);
    if (split >= ns) {
        return;
    }
    let per = (win.y + ns - 1u) / ns;
    let k0 = win.x + split * per;
    let k1 = min(k0 + per, win.x + win.y);
    let g = h / (nh / p[2]);
    let h0 = r * nh * hd + h * hd;
    let q0 = r * p[13] + p[14] + h * hd;
    for (var d = t; d < hd; d += AWG) {
        let rt = rot_of(d, r);
        qs[d] = apply_rot(q[q0 + d], q[q0 + rt.partner], rt);
    }
    let tab = sdata[p[10] + 2u * r + 1u];
    let scale = bitcast<f32>(p[12]);
    let tpg = (hd + 3u) / 4u;
    let ng = AWG / tpg;
    let grp = t / tpg;
    let d4 = (t % tpg) * 4u;
    workgroupBarrier();
    var m = NEG;
    var l = 0.0;
    var acc = vec4<f32>(0.0);
    for (var t0 = k0; t0 < k1; t0 += AWG) {
        let j = t0 + t;
        var s = NEG;
        if (j < k1) {
            let base = cache_index(sdata[tab + j / BS], g, j % BS);
            kb[t] = base;
            // Four values per step: four independent loads in flight per thread.
            var dt = 0.0;
            var d = 0u;
            for (; d + 4u <= hd; d += 4u) {
                let k4 = vec4<f32>(kc[base + d], kc[base + d + 1u], kc[base + d + 2u], kc[base + d + 3u]);
                dt += dot(vec4<f32>(qs[d], qs[d + 1u], qs[d + 2u], qs[d + 3u]), k4);
            }
            for (; d < hd; d++) {
                dt += qs[d] * kc[base + d];
            }
            s = dt * scale;
        }
        sc[t] = s;
        workgroupBarrier();
        let cnt = min(AWG, k1 - t0);
        if (grp < ng) {
            for (var jj = grp; jj < cnt; jj += ng) {
                let sj = sc[jj];
                let v = v4(kb[jj], d4, hd);
                if (sj > m) {
                    let c = exp(m - sj);
                    acc = acc * c + v;
                    l = l * c + 1.0;
                    m = sj;
                } else {
                    let pj = exp(sj - m);
                    acc += pj * v;
                    l += pj;
                }
            }
        }
        workgroupBarrier();
    }
    if (grp < ng) {
        if (d4 == 0u) {
            cm[grp] = m;
            cl[grp] = l;
        }
        ca[t] = acc;
    }
    workgroupBarrier();
    if (t < tpg) {
        var mm = NEG;
        for (var k = 0u; k < ng; k++) {
            mm = max(mm, cm[k]);
        }
        var ll = 0.0;
        var aa = vec4<f32>(0.0);
        for (var k = 0u; k < ng; k++) {
            let c = exp(cm[k] - mm);
            ll += cl[k] * c;
            aa += ca[k * tpg + t] * c;
        }
        if (ns == 1u) {
            for (var i = 0u; i < 4u; i++) {
                if (d4 + i < hd) {
                    out[h0 + d4 + i] = aa[i] / ll;
                }
            }
        } else {
            let pb = gs * (hd + 2u);
            for (var i = 0u; i < 4u; i++) {
                if (d4 + i < hd) {
                    part[pb + d4 + i] = aa[i];
                }
            }
            if (t == 0u) {
                part[pb + hd] = mm;
                part[pb + hd + 1u] = ll;
            }
        }
    }
}

// attn_merge: one workgroup of 64 threads per (row, head) whose row has more than one split:
// out = sum_i exp(m_i - M) * values_i / sum_i exp(m_i - M) * l_i over its splits in order.
@compute @workgroup_size(64)
fn attn_merge(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let gi = wid.x + wid.y * nwg.x;
    let nh = p[1];
    let hd = p[3];
    let S = p[17];
    if (gi >= p[0] * nh) {
        return;
    }
    let r = gi / nh;
    let h = gi % nh;
    let ns = splits_of(window_of(r).y);
    if (ns < 2u) {
        return;
    }
    let pb = gi * S * (hd + 2u);
    var mm = NEG;
    for (var i = 0u; i < ns; i++) {
        mm = max(mm, part[pb + i * (hd + 2u) + hd]);
    }
    var ll = 0.0;
    for (var i = 0u; i < ns; i++) {
        let b = pb + i * (hd + 2u);
        ll += part[b + hd + 1u] * exp(part[b + hd] - mm);
    }
    let h0 = r * nh * hd + h * hd;
    for (var d = t; d < hd; d += WG) {
        var a = 0.0;
        for (var i = 0u; i < ns; i++) {
            let b = pb + i * (hd + 2u);
            a += part[b + d] * exp(part[b + hd] - mm);
        }
        out[h0 + d] = a / ll;
    }
}
