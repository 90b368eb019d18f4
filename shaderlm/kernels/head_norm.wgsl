// Per-head RMSNorm of Q and K in place in the qkv rows (Qwen3, Gemma 3 "QK norm"), before RoPE:
// q[t, h] = q[t, h] / sqrt(mean(q[t, h]^2) + eps) * qw, likewise k with kw. V is left alone.
// qkv rows: [q (n_heads*hd) | k (n_kv*hd) | v (n_kv*hd)]. One workgroup per (head, token):
// x = 0..n_heads-1 query heads, then the n_kv key heads; y = token. Any hd (strided loops).
#include reduce
#include state

struct P { n_heads: u32, n_kv: u32, hd: u32, eps: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read_write> qkv: array<f32>;
@group(0) @binding(3) var<storage, read> qw: array<f32>;
@group(0) @binding(4) var<storage, read> kw: array<f32>;

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    red_lane = li;
    let t = wid.y;
    let h = wid.x;
    if (t >= st.n || h >= p.n_heads + p.n_kv) { return; }
    let base = t * (p.n_heads + 2u * p.n_kv) * p.hd + h * p.hd;   // K heads follow the Q heads
    var ss = 0.0;
    for (var i = li; i < p.hd; i += {{WG}}u) { let v = qkv[base + i]; ss += v * v; }
    let r = inverseSqrt(wg_sum(ss) / f32(p.hd) + p.eps);
    let is_q = h < p.n_heads;
    for (var i = li; i < p.hd; i += {{WG}}u) {
        let w = select(kw[i], qw[i], is_q);
        qkv[base + i] = qkv[base + i] * r * w;
    }
}
