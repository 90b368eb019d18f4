// Decode attention for one new token, one workgroup per query head; needs subgroups.
// Fuses rope_store's work: rotates q and the new K, rounds the new K/V to f16 as the cache holds
// them, and the first head of each KV group stores them. One barrier in all (the final merge).
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
const UNROLL: u32 = {{UNROLL}}u;
var<workgroup> sg_m: array<f32, MAXSG>;
var<workgroup> sg_l: array<f32, MAXSG>;
var<workgroup> sg_acc: array<vec2<f32>, MAXSG * HD / 2u>;

#include rope

// Dimension d of the head starting at qkv[base], rotated by RoPE at position pos. Each lane reads
// its dims and their rotation partners straight from qkv, so no workgroup staging (and no barrier)
// comes before the key loop.
fn rotated(base: u32, d: u32, pos: u32) -> f32 {
    let v = qkv[base + d];
    if (d >= p.rope_dim) { return v; }
    let pr = dim_pair(d);
    let cs = rope_cs(pr.x, pos);
    let other = qkv[base + pr.y];
    return select(other * cs.y + v * cs.x, v * cs.x - other * cs.y, pr.z == 1u);
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) lanes: u32,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32) {
    let h = wid.x;
    let hd = p.hd;
    let half_hd = hd / 2u;
    let kvh = h / (p.n_heads / p.n_kv);
    let qpos = st.pos;
    let qo = h * hd;
    let ko = (p.n_heads + kvh) * hd;
    let vo = ko + p.n_kv * hd;
    let store = sg == 0u && h % (p.n_heads / p.n_kv) == 0u;
    // this lane's pairs of q, and of the new token's K and V as the f16 cache holds them (every
    // subgroup has them in registers; the first head of each KV group stores them). Per-pair values
    // are separate variables (#unroll): arrays indexed by a loop counter went to local memory on NVIDIA.
#unroll PAIRS c
    let j$c = lane + $cu * lanes;
    var q$c = vec2<f32>(0.0);
    var kcur$c = vec2<f32>(0.0);
    var vcur$c = vec2<f32>(0.0);
    if (j$c < half_hd) {
        q$c = vec2<f32>(rotated(qo, 2u * j$c, qpos), rotated(qo, 2u * j$c + 1u, qpos)) * p.scale;
        let kp = pack2x16float(vec2<f32>(rotated(ko, 2u * j$c, qpos), rotated(ko, 2u * j$c + 1u, qpos)));
        let vp = pack2x16float(vec2<f32>(qkv[vo + 2u * j$c], qkv[vo + 2u * j$c + 1u]));
        if (store) {
            kc[(qpos * p.n_kv + kvh) * half_hd + j$c] = kp;
            vc[(qpos * p.n_kv + kvh) * half_hd + j$c] = vp;
        }
        kcur$c = unpack2x16float(kp ^ p.zero);
        vcur$c = unpack2x16float(vp ^ p.zero);
    }
    var acc$c = vec2<f32>(0.0);
#end
    var k_lo = 0u;
    if (p.window > 0u && qpos + 1u > p.window) { k_lo = qpos + 1u - p.window; }
    var m = -3.0e38;
    var l = 0.0;
    // keys before qpos come from the cache; qpos itself from kcur / vcur
    for (var k0 = k_lo + sg * UNROLL; k0 <= qpos; k0 += nsg * UNROLL) {
        // load K and V of UNROLL keys first, so one memory round trip serves the whole step
#unroll UNROLL u
        let key$u = k0 + $uu;
        let base$u = (min(key$u, qpos) * p.n_kv + kvh) * half_hd;
#unroll PAIRS c
        var kv$u$c = kcur$c;
        var vv$u$c = vcur$c;
        if (j$c < half_hd && key$u < qpos) {
            kv$u$c = unpack2x16float(kc[base$u + j$c]);
            vv$u$c = unpack2x16float(vc[base$u + j$c]);
        }
#end
#end
        var mt = m;
#unroll UNROLL u
        var d$u = 0.0;
#unroll PAIRS c
        d$u += dot(q$c, kv$u$c);
#end
        var s$u = subgroupAdd(d$u);
        if (p.softcap > 0.0) { s$u = p.softcap * tanh(clamp(s$u / p.softcap, -15.0, 15.0)); }
        s$u = select(-3.0e38, s$u, key$u <= qpos);
        mt = max(mt, s$u);
#end
        let corr = exp(m - mt);
        l *= corr;
#unroll PAIRS c
        acc$c *= corr;
#end
#unroll UNROLL u
        let e$u = select(0.0, exp(s$u - mt), key$u <= qpos);
        l += e$u;
#unroll PAIRS c
        acc$c += e$u * vv$u$c;
#end
#end
        m = mt;
    }
    // merge the subgroups' partial softmaxes
    if (lane == 0u) { sg_m[sg] = m; sg_l[sg] = l; }
#unroll PAIRS c
    if (j$c < half_hd) { sg_acc[sg * (HD / 2u) + j$c] = acc$c; }
#end
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
