// Gated FFN activation: out[t, i] = glu_act(gate[t, i], up[t, i]) (activation.wgsl); gu rows are
// [gate (ffn) | up (ffn)].
#include state
#include activation

struct P { ffn: u32, rows_per_token: u32, _b: u32, _c: u32 }     // rows_per_token: 0 reads as 1
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> gu: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
    if (i >= p.ffn || t >= st.n * max(p.rows_per_token, 1u)) { return; }
    let g = gu[t * 2u * p.ffn + i];
    let u = gu[t * 2u * p.ffn + p.ffn + i];
    out[t * p.ffn + i] = glu_act(g, u);
}
