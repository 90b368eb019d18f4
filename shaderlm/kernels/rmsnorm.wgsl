// y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, one workgroup per batch row.
// GATHER: y[t] from x[src[t]] (the last rows of a prompt pass's sequences, for their LM head).
#include reduce
#include state

struct P { dim: u32, first_from_state: u32, eps: f32, _a: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#if GATHER
@group(0) @binding(5) var<storage, read> src: array<u32>;
#endif

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    red_lane = li;
    let t = wid.x;
#if GATHER
    let xo = src[t] * p.dim;
#else
    let first = select(0u, st.out_row0, p.first_from_state != 0u);
    if (first + t >= st.n) { return; }
    let xo = (first + t) * p.dim;
#endif
    var ss = 0.0;
    for (var i = li; i < p.dim; i += {{WG}}u) { let v = x[xo + i]; ss += v * v; }
    let r = inverseSqrt(wg_sum(ss) / f32(p.dim) + p.eps);
    let yo = t * p.dim;
    for (var i = li; i < p.dim; i += {{WG}}u) { y[yo + i] = x[xo + i] * r * w[i]; }
}
