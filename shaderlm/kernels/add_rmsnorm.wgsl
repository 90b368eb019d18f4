// Gemma's post-norms: x[t] += rmsnorm(y[t]) * w  (a block output normalized before the residual add).
// NEXT: also xn[t] = rmsnorm(x[t]) * w2 with the updated x (the following pre-norm), saving a dispatch.
// One workgroup per batch row; each thread re-reads only the x elements it wrote itself.
#include reduce
#include state

struct P { dim: u32, _a: u32, eps: f32, _b: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> x: array<f32>;
#if NEXT
@group(0) @binding(5) var<storage, read> w2: array<f32>;
@group(0) @binding(6) var<storage, read_write> xn: array<f32>;
#endif

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    red_lane = li;
    let t = wid.x;
    if (t >= st.n) { return; }
    let o = t * p.dim;
    var ss = 0.0;
    for (var i = li; i < p.dim; i += {{WG}}u) { let v = y[o + i]; ss += v * v; }
    let r = inverseSqrt(wg_sum(ss) / f32(p.dim) + p.eps);
    var ss2 = 0.0;
    for (var i = li; i < p.dim; i += {{WG}}u) {
        let v = x[o + i] + y[o + i] * r * w[i];
        x[o + i] = v;
        ss2 += v * v;
    }
#if NEXT
    let r2 = inverseSqrt(wg_sum(ss2) / f32(p.dim) + p.eps);
    for (var i = li; i < p.dim; i += {{WG}}u) { xn[o + i] = x[o + i] * r2 * w2[i]; }
#endif
}
