// RoPE, the paged KV cache and causal attention, in one kernel.
//
// Cache layout (keys `kc`, values `vc`, f32, read as vec4s: head_dim is a multiple of 4):
// [block][layer][kv_head][16 slots][head_dim].
// sdata (u32): per batch row r, at [rows_at + 3r]: its position, the index in sdata of its
// sequence's block table (entry i: the block of positions 16i..16i + 16), and the position
// of its sequence's first row in this step. Keys from that position on are this step's rows:
// read from the q|k|v rows (rotated on the way, `step_k4`), not from the cache, which this
// dispatch writes them into.
// trig (f32): cos then sin of the rows' angles, [rows][rope_dim / 2] each, at [cos_at] and
// [sin_at] (global or local angles, by the layer).
//
// params: [0] rows, [1] n_head, [2] n_kv_head, [3] head_dim, [4] rope_dim, [5] neox (1: pairs
// (i, i + rope_dim/2), 0: (2i, 2i + 1)), [6] cos_at, [7] sin_at, [8] layer, [9] n_layer,
// [10] rows_at, [11] window (0: none; else keys in (pos - window, pos]), [12] scale (f32 bits),
// [13] row stride of the q|k|v rows (`qkv`, [rows][q | k | v]),
// [14] first column of q, [15] of k, [16] of v, [17] S: splits per (row, head) in the grid
// (attention, attn_merge).
//
// Splits: a row whose window holds `len` keys takes ns = min(ceil(len / SPLIT_KEYS), MAX_SPLITS)
// workgroups per head, split i taking keys [lo + i * per, lo + (i + 1) * per) with
// per = ceil(len / ns); a row of one split writes its output, the others write partial
// (values, max, sum) to `part` ([row][head][S][head_dim + 2]) and attn_merge combines them
// in split order. ns depends on the row's position alone, so a row's result does not depend
// on its batch.

@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> sdata: array<u32>;
@group(0) @binding(2) var<storage, read> trig: array<f32>;
@group(0) @binding(3) var<storage, read> qkv: array<f32>;
@group(0) @binding(6) var<storage, read_write> kc: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read_write> vc: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> out: array<f32>;
@group(0) @binding(9) var<storage, read_write> part: array<f32>;

const BS: u32 = 16u;
const WG: u32 = 64u;
const NEG: f32 = -3.0e38;
// Marks a key of this step in `kb` (or-ed with its row).
const STEP: u32 = 0x80000000u;

// Row r's position, block table index and its sequence's first position in this step.
fn row_info(r: u32) -> vec3<u32> {
    let b = p[10] + 3u * r;
    return vec3<u32>(sdata[b], sdata[b + 1u], sdata[b + 2u]);
}

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

// Index (in vec4s) of the first 4 values of slot `slot` of kv head g of block blk.
fn cache_index4(blk: u32, g: u32, slot: u32) -> u32 {
    return (((blk * p[9] + p[8]) * p[2] + g) * BS + slot) * (p[3] / 4u);
}

// Dims d..d + 4 of kv head g's key of step row r, rotated: what the cache holds for it.
fn step_k4(r: u32, g: u32, d: u32) -> vec4<f32> {
    let k0 = r * p[13] + p[15] + g * p[3];
    let r0 = rot_of(d, r);
    let r1 = rot_of(d + 1u, r);
    let r2 = rot_of(d + 2u, r);
    let r3 = rot_of(d + 3u, r);
    return vec4<f32>(
        apply_rot(qkv[k0 + d], qkv[k0 + r0.partner], r0),
        apply_rot(qkv[k0 + d + 1u], qkv[k0 + r1.partner], r1),
        apply_rot(qkv[k0 + d + 2u], qkv[k0 + r2.partner], r2),
        apply_rot(qkv[k0 + d + 3u], qkv[k0 + r3.partner], r3),
    );
}

// Dims d..d + 4 of kv head g's value of step row r.
fn step_v4(r: u32, g: u32, d: u32) -> vec4<f32> {
    let v0 = r * p[13] + p[16] + g * p[3] + d;
    return vec4<f32>(qkv[v0], qkv[v0 + 1u], qkv[v0 + 2u], qkv[v0 + 3u]);
}

// Value vec4 v4 of the key `kb` names: a cache slot (its first vec4) or STEP | a step row.
fn value4(b: u32, g: u32, v4: u32) -> vec4<f32> {
    if (b >= STEP) {
        return step_v4(b - STEP, g, 4u * v4);
    }
    return vc[b + v4];
}

// attention's workgroup: AWG threads.
const AWG: u32 = 256u;
// Keys per tile; lanes that score one key together (KL, each a vec4 of every 16); keys
// scored at once (AWG / KL); the stride of a key's partial sums in `ps` (padded against
// bank conflicts).
const TILE: u32 = 128u;
const KL: u32 = 16u;
const KPASS: u32 = 16u;
const PS: u32 = 17u;
// Keys per split (ATTN_SPLIT_KEYS in paged.rs) and most workgroups one (row, head) is split
// over (`MAX_SPLITS` in paged.rs).
const SPLIT_KEYS: u32 = 256u;
const MAX_SPLITS: u32 = 8u;

// The first key of row r's window and its number of keys.
fn window_of(r: u32) -> vec2<u32> {
    let pos = sdata[p[10] + 3u * r];
    let window = p[11];
    var lo = 0u;
    if (window > 0u && pos + 1u > window) {
        lo = pos + 1u - window;
    }
    return vec2<u32>(lo, pos + 1u - lo);
}

fn splits_of(len: u32) -> u32 {
    return min((len + SPLIT_KEYS - 1u) / SPLIT_KEYS, MAX_SPLITS);
}

// q of the (row, head), rotated (head_dim / 4 vec4s).
var<workgroup> qs: array<vec4<f32>, 64>;
// The tile's partial dot products, [key][KL] at stride PS; after the last tile, the groups'
// (values, max, sum) for the final merge: values at [0, 4 * AWG), max at [4 * AWG + g],
// sum at [5 * AWG + g].
var<workgroup> ps: array<f32, 2176>;
var<workgroup> sc: array<f32, TILE>;
var<workgroup> kb: array<u32, TILE>;

// attention: one workgroup of AWG threads per (row, head, split): q rotated into workgroup
// memory, then the split's keys through the row's block table in tiles of TILE keys (this
// step's keys from the q|k|v rows). The last split of each kv group's first head also writes
// the row's key (rotated) and value into its cache slot.
// - Scores: KL lanes take one key, each lane a vec4 of every KL (so a key's row is read by
//   consecutive lanes: 16-byte loads side by side), KPASS keys at once, TILE / KPASS passes;
//   thread t < TILE then sums key t's KL partials in lane order.
// - Values: groups of T = head_dim / 4 lanes (a vec4 of output each) take the tile's keys
//   g, g + groups, ...; each group rescales its running (max, sum, values) once per tile to
//   the tile's max over its keys, then adds its keys in order, four loads in flight.
// - At the end the groups' (max, sum, values) are merged in group order.
// Three barriers per tile; the order of every sum depends on the row alone.
@compute @workgroup_size(256)
fn attention(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) t: u32,
) {
    let gs = wid.x + wid.y * nwg.x;
    let nh = p[1];
    let hd = p[3];
    let hd4 = hd / 4u;
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
    let group = nh / p[2];
    let g = h / group;
    let info = row_info(r);
    let pos = info.x;
    let tab = info.y;
    let first = info.z;
    if (h % group == 0u && split == ns - 1u) {
        let base = cache_index4(sdata[tab + pos / BS], g, pos % BS);
        for (var d4 = t; d4 < hd4; d4 += AWG) {
            kc[base + d4] = step_k4(r, g, 4u * d4);
            vc[base + d4] = step_v4(r, g, 4u * d4);
        }
    }
    let h0 = r * nh * hd + h * hd;
    let q0 = r * p[13] + p[14] + h * hd;
    for (var d4 = t; d4 < hd4; d4 += AWG) {
        let d = 4u * d4;
        let r0 = rot_of(d, r);
        let r1 = rot_of(d + 1u, r);
        let r2 = rot_of(d + 2u, r);
        let r3 = rot_of(d + 3u, r);
        qs[d4] = vec4<f32>(
            apply_rot(qkv[q0 + d], qkv[q0 + r0.partner], r0),
            apply_rot(qkv[q0 + d + 1u], qkv[q0 + r1.partner], r1),
            apply_rot(qkv[q0 + d + 2u], qkv[q0 + r2.partner], r2),
            apply_rot(qkv[q0 + d + 3u], qkv[q0 + r3.partner], r3),
        );
    }
    let scale = bitcast<f32>(p[12]);
    let lane = t % KL;
    let kk = t / KL;
    let ng = AWG / hd4;
    let grp = t / hd4;
    let v4 = t % hd4;
    workgroupBarrier();
    var m = NEG;
    var l = 0.0;
    var acc = vec4<f32>(0.0);
    for (var t0 = k0; t0 < k1; t0 += TILE) {
        let cnt = min(TILE, k1 - t0);
        for (var i = 0u; i < TILE / KPASS; i++) {
            let jt = i * KPASS + kk;
            var pd = 0.0;
            if (jt < cnt) {
                let j = t0 + jt;
                var b: u32;
                if (j >= first) {
                    b = STEP | (r + j - pos);
                    for (var v = lane; v < hd4; v += KL) {
                        pd += dot(qs[v], step_k4(r + j - pos, g, 4u * v));
                    }
                } else {
                    b = cache_index4(sdata[tab + j / BS], g, j % BS);
                    for (var v = lane; v < hd4; v += KL) {
                        pd += dot(qs[v], kc[b + v]);
                    }
                }
                if (lane == 0u) {
                    kb[jt] = b;
                }
            }
            ps[jt * PS + lane] = pd;
        }
        workgroupBarrier();
        if (t < TILE) {
            var s = NEG;
            if (t < cnt) {
                var dt = 0.0;
                for (var x = 0u; x < KL; x++) {
                    dt += ps[t * PS + x];
                }
                s = dt * scale;
            }
            sc[t] = s;
        }
        workgroupBarrier();
        if (grp < ng) {
            var mx = m;
            for (var jj = grp; jj < cnt; jj += ng) {
                mx = max(mx, sc[jj]);
            }
            let c = exp(m - mx);
            acc *= c;
            l *= c;
            m = mx;
            var jj = grp;
            for (; jj + 3u * ng < cnt; jj += 4u * ng) {
                let v0 = value4(kb[jj], g, v4);
                let v1 = value4(kb[jj + ng], g, v4);
                let v2 = value4(kb[jj + 2u * ng], g, v4);
                let v3 = value4(kb[jj + 3u * ng], g, v4);
                let p0 = exp(sc[jj] - m);
                let p1 = exp(sc[jj + ng] - m);
                let p2 = exp(sc[jj + 2u * ng] - m);
                let p3 = exp(sc[jj + 3u * ng] - m);
                acc += p0 * v0;
                acc += p1 * v1;
                acc += p2 * v2;
                acc += p3 * v3;
                l += p0;
                l += p1;
                l += p2;
                l += p3;
            }
            for (; jj < cnt; jj += ng) {
                let pj = exp(sc[jj] - m);
                acc += pj * value4(kb[jj], g, v4);
                l += pj;
            }
        }
        workgroupBarrier();
    }
    if (grp < ng) {
        if (v4 == 0u) {
            ps[4u * AWG + grp] = m;
            ps[5u * AWG + grp] = l;
        }
        ps[4u * t] = acc.x;
        ps[4u * t + 1u] = acc.y;
        ps[4u * t + 2u] = acc.z;
        ps[4u * t + 3u] = acc.w;
    }
    workgroupBarrier();
    if (t < hd4) {
        var mm = NEG;
        for (var k = 0u; k < ng; k++) {
            mm = max(mm, ps[4u * AWG + k]);
        }
        var ll = 0.0;
        var aa = vec4<f32>(0.0);
        for (var k = 0u; k < ng; k++) {
            let c = exp(ps[4u * AWG + k] - mm);
            ll += ps[5u * AWG + k] * c;
            let b = 4u * (k * hd4 + t);
            aa += vec4<f32>(ps[b], ps[b + 1u], ps[b + 2u], ps[b + 3u]) * c;
        }
        let d = 4u * t;
        if (ns == 1u) {
            out[h0 + d] = aa.x / ll;
            out[h0 + d + 1u] = aa.y / ll;
            out[h0 + d + 2u] = aa.z / ll;
            out[h0 + d + 3u] = aa.w / ll;
        } else {
            let pb = gs * (hd + 2u);
            part[pb + d] = aa.x;
            part[pb + d + 1u] = aa.y;
            part[pb + d + 2u] = aa.z;
            part[pb + d + 3u] = aa.w;
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
