// Causal grouped-query attention over the f16 KV cache, one workgroup per (query head, batch row).
// Keys are taken WG at a time: each thread scores one key, the tile's softmax weights go to
// workgroup memory, and each thread accumulates the output for its pairs of head dimensions,
// rescaling as the running maximum grows (online softmax), so any context length fits.
// ROPE (decode, one token): also does rope_store's work - rotates q, takes the new token's K/V from
// qkv (rotated, rounded to f16 like the cache) and the first head of each KV group stores them -
// saving a dispatch per layer.
// PAGED / BATCH: the cache rows of a paged KV cache, and per batch row its own sequence and position
// (paged.wgsl, batch_rows.wgsl).
// SINKS (gpt-oss): each head's learned logit joins the softmax's denominator and weighs no value.
#include reduce
#include state
#include kv_rows
#if BATCH
#include batch_rows
#endif

// zero: always 0; XORed into packed halves so drivers cannot fold pack/unpack into a no-op
// (seen on NVIDIA: the new K/V kept f32 precision while the cache held f16)
struct P { n_heads: u32, n_kv: u32, hd: u32, window: u32, scale: f32, softcap: f32, rope_dim: u32, zero: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
#if ROPE
@group(0) @binding(3) var<storage, read_write> kc: array<u32>;
@group(0) @binding(4) var<storage, read_write> vc: array<u32>;
@group(0) @binding(6) var<storage, read> inv_freq: array<f32>;
var<workgroup> kcur: array<f32, {{HD}}>;
var<workgroup> vcur: array<f32, {{HD}}>;

#include rope
#else
@group(0) @binding(3) var<storage, read> kc: array<u32>;
@group(0) @binding(4) var<storage, read> vc: array<u32>;
#endif

#if SINKS
@group(0) @binding(9) var<storage, read> sinks: array<f32>;
#endif

const PAIRS: u32 = {{PAIRS}}u;          // head-dim pairs per thread: ceil(hd / 2 / WG)
var<workgroup> q: array<f32, {{HD}}>;
var<workgroup> pw: array<f32, {{WG}}>;

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    red_lane = li;
    let h = wid.x;
    let t = wid.y;
    if (t >= st.n) { return; }
    let hd = p.hd;
    let half_hd = hd / 2u;
    let kvh = h / (p.n_heads / p.n_kv);
#if BATCH
    let seq = row_slot(t);
    if (seq == NONE) { return; }
    let qpos = row_pos(t, seq);
#else
    let seq = st.seq;
    let qpos = st.pos + t;
#endif
    let qo = t * (p.n_heads + 2u * p.n_kv) * hd + h * hd;
    for (var i = li; i < hd; i += {{WG}}u) { q[i] = qkv[qo + i] * p.scale; }
#if ROPE
    let ko = t * (p.n_heads + 2u * p.n_kv) * hd + (p.n_heads + kvh) * hd;
    let vo = ko + p.n_kv * hd;
    for (var i = li; i < hd; i += {{WG}}u) { kcur[i] = qkv[ko + i]; vcur[i] = qkv[vo + i]; }
    workgroupBarrier();
    for (var i = li; i < p.rope_dim / 2u; i += {{WG}}u) {
        let cs = rope_cs(i, qpos);
        let ix = pair_index(i);
        let q0 = q[ix.x]; let q1 = q[ix.y];
        q[ix.x] = q0 * cs.x - q1 * cs.y; q[ix.y] = q0 * cs.y + q1 * cs.x;
        let k0 = kcur[ix.x]; let k1 = kcur[ix.y];
        kcur[ix.x] = k0 * cs.x - k1 * cs.y; kcur[ix.y] = k0 * cs.y + k1 * cs.x;
    }
    workgroupBarrier();
    // round the new K/V to f16 exactly as the cache holds them; one head per KV group stores them
    for (var j = li; j < half_hd; j += {{WG}}u) {
        let kp = pack2x16float(vec2<f32>(kcur[2u * j], kcur[2u * j + 1u]));
        let vp = pack2x16float(vec2<f32>(vcur[2u * j], vcur[2u * j + 1u]));
        let kr = unpack2x16float(kp ^ p.zero); let vr = unpack2x16float(vp ^ p.zero);
        kcur[2u * j] = kr.x; kcur[2u * j + 1u] = kr.y; vcur[2u * j] = vr.x; vcur[2u * j + 1u] = vr.y;
        if (h % (p.n_heads / p.n_kv) == 0u) {
            kc[(kv_at(seq, qpos) * p.n_kv + kvh) * half_hd + j] = kp;
            vc[(kv_at(seq, qpos) * p.n_kv + kvh) * half_hd + j] = vp;
        }
    }
#endif
    workgroupBarrier();
    // keys in [k_lo, qpos]; a sliding window keeps the last `window` positions
    var k_lo = 0u;
    if (p.window > 0u && qpos + 1u > p.window) { k_lo = qpos + 1u - p.window; }
    var m = -3.0e38;
    var l = 0.0;
    var acc: array<vec2<f32>, PAIRS>;
    for (var k0 = k_lo; k0 <= qpos; k0 += {{WG}}u) {
        let key = k0 + li;
        var s = -3.0e38;
        if (key <= qpos) {
            let kco = (kv_at(seq, key) * p.n_kv + kvh) * half_hd;
            var d = 0.0;
#if ROPE
            if (key == qpos) {
                for (var j = 0u; j < hd; j++) { d += q[j] * kcur[j]; }
            } else {
#endif
            for (var j = 0u; j < half_hd; j++) {
                let kk = unpack2x16float(kc[kco + j]);
                d += q[2u * j] * kk.x + q[2u * j + 1u] * kk.y;
            }
#if ROPE
            }
#endif
            if (p.softcap > 0.0) { d = p.softcap * tanh(clamp(d / p.softcap, -15.0, 15.0)); }
            s = d;
        }
        let m_new = max(m, wg_max(s));
        let e = select(0.0, exp(s - m_new), key <= qpos);
        let corr = exp(m - m_new);
        l = l * corr + wg_sum(e);
        pw[li] = e;
        workgroupBarrier();
        let nk = min({{WG}}u, qpos + 1u - k0);
        for (var c = 0u; c < PAIRS; c++) {
            let j = li + c * {{WG}}u;
            if (j < half_hd) {
                var a = acc[c] * corr;
                for (var kk = 0u; kk < nk; kk++) {
#if ROPE
                    if (k0 + kk == qpos) {
                        a += pw[kk] * vec2<f32>(vcur[2u * j], vcur[2u * j + 1u]);
                        continue;
                    }
#endif
                    a += pw[kk] * unpack2x16float(vc[(kv_at(seq, k0 + kk) * p.n_kv + kvh) * half_hd + j]);
                }
                acc[c] = a;
            }
        }
        m = m_new;
        workgroupBarrier();
    }
#if SINKS
    // the sink's term in the denominator, both sums rescaled to the larger of the running max and
    // the sink (a sink far above the scores cannot overflow)
    let mf = max(m, sinks[h]);
    let keep = exp(m - mf);
    l = l * keep + exp(sinks[h] - mf);
    for (var c = 0u; c < PAIRS; c++) { acc[c] *= keep; }
#endif
    let oo = t * p.n_heads * hd + h * hd;
    for (var c = 0u; c < PAIRS; c++) {
        let j = li + c * {{WG}}u;
        if (j < half_hd) {
            out[oo + 2u * j] = acc[c].x / l;
            out[oo + 2u * j + 1u] = acc[c].y / l;
        }
    }
}
