// Decode attention for one new token, one workgroup per query head; needs subgroups.
// Fuses rope_store's work: rotates q and the new K, rounds the new K/V to f16 as the cache holds
// them, and the first head of each KV group stores them.
// Each subgroup walks its own share of the keys (sg, sg + nsg, ...), UNROLL keys at a time so their
// loads are in flight together; lanes own pairs of head dimensions, so K and V rows are read
// coalesced and a score is one subgroupAdd. Each subgroup keeps an online softmax (m, l, acc) and
// the subgroups are merged through workgroup memory at the end.
#include state

// zero: always 0; XORed into packed halves so drivers cannot fold pack/unpack into a no-op
// (seen on NVIDIA: the new K/V kept f32 precision while the cache held f16)
struct P { n_heads: u32, n_kv: u32, hd: u32, window: u32, scale: f32, softcap: f32, rope_dim: u32, zero: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;
@group(0) @binding(3) var<storage, read_write> kc: array<u32>;
@group(0) @binding(4) var<storage, read_write> vc: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read> inv_freq: array<f32>;

const HD: u32 = {{HD}}u;
const PAIRS: u32 = {{PAIRS}}u;        // head-dim pairs per lane: ceil(HD / 2 / smallest subgroup)
const MAXSG: u32 = {{MAXSG}}u;        // subgroups per workgroup at the smallest subgroup size
const UNROLL: u32 = 4u;
var<workgroup> qs: array<f32, HD>;
var<workgroup> kcur: array<f32, HD>;
var<workgroup> vcur: array<f32, HD>;
var<workgroup> sg_m: array<f32, MAXSG>;
var<workgroup> sg_l: array<f32, MAXSG>;
var<workgroup> sg_acc: array<vec2<f32>, MAXSG * HD / 2u>;

#include rope

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) lanes: u32,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32) {
    let h = wid.x;
    let hd = p.hd;
    let half_hd = hd / 2u;
    let kvh = h / (p.n_heads / p.n_kv);
    let qpos = st.pos;
    let ko = (p.n_heads + kvh) * hd;
    for (var i = li; i < hd; i += {{WG}}u) {
        qs[i] = qkv[h * hd + i] * p.scale;
        kcur[i] = qkv[ko + i];
        vcur[i] = qkv[ko + p.n_kv * hd + i];
    }
    workgroupBarrier();
    for (var i = li; i < p.rope_dim / 2u; i += {{WG}}u) {
        let cs = rope_cs(i, qpos);
        let ix = pair_index(i);
        let q0 = qs[ix.x]; let q1 = qs[ix.y];
        qs[ix.x] = q0 * cs.x - q1 * cs.y; qs[ix.y] = q0 * cs.y + q1 * cs.x;
        let k0 = kcur[ix.x]; let k1 = kcur[ix.y];
        kcur[ix.x] = k0 * cs.x - k1 * cs.y; kcur[ix.y] = k0 * cs.y + k1 * cs.x;
    }
    workgroupBarrier();
    let store = h % (p.n_heads / p.n_kv) == 0u;
    for (var j = li; j < half_hd; j += {{WG}}u) {
        let kp = pack2x16float(vec2<f32>(kcur[2u * j], kcur[2u * j + 1u]));
        let vp = pack2x16float(vec2<f32>(vcur[2u * j], vcur[2u * j + 1u]));
        if (store) {
            kc[(qpos * p.n_kv + kvh) * half_hd + j] = kp;
            vc[(qpos * p.n_kv + kvh) * half_hd + j] = vp;
        }
        let kr = unpack2x16float(kp ^ p.zero); let vr = unpack2x16float(vp ^ p.zero);
        kcur[2u * j] = kr.x; kcur[2u * j + 1u] = kr.y; vcur[2u * j] = vr.x; vcur[2u * j + 1u] = vr.y;
    }
    workgroupBarrier();

    // this lane's pairs of q
    var q: array<vec2<f32>, PAIRS>;
    for (var c = 0u; c < PAIRS; c++) {
        let j = lane + c * lanes;
        if (j < half_hd) { q[c] = vec2<f32>(qs[2u * j], qs[2u * j + 1u]); }
    }
    var k_lo = 0u;
    if (p.window > 0u && qpos + 1u > p.window) { k_lo = qpos + 1u - p.window; }
    var m = -3.0e38;
    var l = 0.0;
    var acc: array<vec2<f32>, PAIRS>;
    // keys before qpos come from the cache; qpos itself from kcur / vcur
    for (var k0 = k_lo + sg * UNROLL; k0 <= qpos; k0 += nsg * UNROLL) {
        // load K and V of UNROLL keys first, so one memory round trip serves the whole step
        var kv: array<vec2<f32>, UNROLL * PAIRS>;
        var vv: array<vec2<f32>, UNROLL * PAIRS>;
        for (var u = 0u; u < UNROLL; u++) {
            let key = k0 + u;
            let base = (min(key, qpos) * p.n_kv + kvh) * half_hd;
            for (var c = 0u; c < PAIRS; c++) {
                let j = lane + c * lanes;
                if (j < half_hd) {
                    if (key < qpos) {
                        kv[u * PAIRS + c] = unpack2x16float(kc[base + j]);
                        vv[u * PAIRS + c] = unpack2x16float(vc[base + j]);
                    } else {
                        kv[u * PAIRS + c] = vec2<f32>(kcur[2u * j], kcur[2u * j + 1u]);
                        vv[u * PAIRS + c] = vec2<f32>(vcur[2u * j], vcur[2u * j + 1u]);
                    }
                }
            }
        }
        var s: array<f32, UNROLL>;
        var mt = m;
        for (var u = 0u; u < UNROLL; u++) {
            var d = 0.0;
            for (var c = 0u; c < PAIRS; c++) { d += dot(q[c], kv[u * PAIRS + c]); }
            var sc = subgroupAdd(d);
            if (p.softcap > 0.0) { sc = p.softcap * tanh(clamp(sc / p.softcap, -15.0, 15.0)); }
            s[u] = select(-3.0e38, sc, k0 + u <= qpos);
            mt = max(mt, s[u]);
        }
        let corr = exp(m - mt);
        l *= corr;
        for (var c = 0u; c < PAIRS; c++) { acc[c] *= corr; }
        for (var u = 0u; u < UNROLL; u++) {
            let e = select(0.0, exp(s[u] - mt), k0 + u <= qpos);
            l += e;
            for (var c = 0u; c < PAIRS; c++) { acc[c] += e * vv[u * PAIRS + c]; }
        }
        m = mt;
    }
    // merge the subgroups' partial softmaxes
    if (lane == 0u) { sg_m[sg] = m; sg_l[sg] = l; }
    for (var c = 0u; c < PAIRS; c++) {
        let j = lane + c * lanes;
        if (j < half_hd) { sg_acc[sg * (HD / 2u) + j] = acc[c]; }
    }
    workgroupBarrier();
    var mg = -3.0e38;
    for (var g = 0u; g < nsg; g++) { mg = max(mg, sg_m[g]); }
    var lg = 0.0;
    for (var g = 0u; g < nsg; g++) { lg += sg_l[g] * exp(sg_m[g] - mg); }
    for (var j = li; j < half_hd; j += {{WG}}u) {
        var o = vec2<f32>(0.0);
        for (var g = 0u; g < nsg; g++) { o += sg_acc[g * (HD / 2u) + j] * exp(sg_m[g] - mg); }
        out[h * hd + 2u * j] = o.x / lg;
        out[h * hd + 2u * j + 1u] = o.y / lg;
    }
}
