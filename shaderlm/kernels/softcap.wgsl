// Final logit soft-capping (when the config has one): v = cap * tanh(v / cap), in place
// over the logit rows of this batch (rows [st.out_row0, st.n), stored from row 0; ROWS: p.rows of them).
#include state

struct P { vocab: u32, stride: u32, cap: f32, rows: u32 }     // stride: floats between logit rows
@group(0) @binding(0) var<uniform> p: P;
#if !ROWS
@group(0) @binding(1) var<storage, read> st: State;
#endif
@group(0) @binding(2) var<storage, read_write> logits: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    let t = gid.y;
#if ROWS
    if (i >= p.vocab || t >= p.rows) { return; }
#else
    if (i >= p.vocab || t + st.out_row0 >= st.n) { return; }
#endif
    let o = t * p.stride + i;
    logits[o] = p.cap * tanh(clamp(logits[o] / p.cap, -15.0, 15.0));
}
