// Causal grouped-query attention over the f16 KV cache, one workgroup per (query head, batch row).
// Keys are taken WG at a time: each thread scores one key, the tile's softmax weights go to
// workgroup memory, and each thread accumulates the output for its pairs of head dimensions,
// rescaling as the running maximum grows (online softmax), so any context length fits.
#include reduce
#include state

struct P { n_heads: u32, n_kv: u32, hd: u32, window: u32, scale: f32, softcap: f32, _a: u32, _b: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;
@group(0) @binding(3) var<storage, read> kc: array<u32>;
@group(0) @binding(4) var<storage, read> vc: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

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
    let qpos = st.pos + t;
    let qo = t * (p.n_heads + 2u * p.n_kv) * hd + h * hd;
    for (var i = li; i < hd; i += {{WG}}u) { q[i] = qkv[qo + i] * p.scale; }
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
            let ko = (key * p.n_kv + kvh) * half_hd;
            var d = 0.0;
            for (var j = 0u; j < half_hd; j++) {
                let kk = unpack2x16float(kc[ko + j]);
                d += q[2u * j] * kk.x + q[2u * j + 1u] * kk.y;
            }
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
                    a += pw[kk] * unpack2x16float(vc[((k0 + kk) * p.n_kv + kvh) * half_hd + j]);
                }
                acc[c] = a;
            }
        }
        m = m_new;
        workgroupBarrier();
    }
    let oo = t * p.n_heads * hd + h * hd;
    for (var c = 0u; c < PAIRS; c++) {
        let j = li + c * {{WG}}u;
        if (j < half_hd) {
            out[oo + 2u * j] = acc[c].x / l;
            out[oo + 2u * j + 1u] = acc[c].y / l;
        }
    }
}
