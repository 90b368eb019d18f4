// A mixture of experts' output into the residual stream: x[t] += sum_j w[t, j] * (y[t * K + j] + b[e_j])
// over each token's K picked experts (weights and ids from moe_route.wgsl, y from the experts' down GEMM,
// b their down biases with EXPERT_BIAS), the slots summed in order.
#include state

const K: u32 = {{K}}u;
struct P { dim: u32, _a: u32, _b: u32, _c: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> y: array<f32>;
@group(0) @binding(3) var<storage, read> wts: array<f32>;
@group(0) @binding(4) var<storage, read_write> x: array<f32>;
#if EXPERT_BIAS
@group(0) @binding(5) var<storage, read> ids: array<u32>;
@group(0) @binding(6) var<storage, read> bias: array<f32>;
#endif

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (i >= p.dim || t >= st.n) { return; }
    var s = 0.0;
    for (var j = 0u; j < K; j++) {
        var v = y[(t * K + j) * p.dim + i];
#if EXPERT_BIAS
        v += bias[ids[t * K + j] * p.dim + i];
#endif
        s += wts[t * K + j] * v;
    }
    x[t * p.dim + i] += s;
}
