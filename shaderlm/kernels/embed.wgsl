// x[t] = scale * dequant(token_embd[tokens[st.tok + t]]) for the rows held by this chunk.
// BATCH (a serving step): row t feeds its sequence's next token, at slot s's position in the token
// buffer's s-th stretch of HIST tokens; a padding row gets zeros.
#include quant_common
#include {{QUANT}}
#include state
#if BATCH
const HIST: u32 = {{HIST}}u;
#include batch_rows
#endif

struct P { dim: u32, row0: u32, rows: u32, dbase: u32, scale: f32, _a: u32, _b: u32, _c: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> tokens: array<u32>;
@group(0) @binding(3) var<storage, read> w: array<u32>;
@group(0) @binding(4) var<storage, read_write> x: array<vec4<f32>>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let t = wid.x;
    if (t >= st.n) { return; }
#if BATCH
    let s = row_slot(t);
    if (s == NONE) {
        for (var i = li; i < p.dim / 4u; i += 64u) { x[(t * p.dim) / 4u + i] = vec4<f32>(0.0); }
        return;
    }
    let id = tokens[s * HIST + row_pos(t, s)];
#else
    let id = tokens[st.tok + t];
#endif
    if (id < p.row0 || id >= p.row0 + p.rows) { return; }
    let r = id - p.row0;
    let gpb = QK / 8u;
    for (var g = li; g < p.dim / 8u; g += 64u) {
        let v = dq8(r * (p.dim / QK) + g / gpb, g % gpb);
        x[(t * p.dim) / 4u + g * 2u] = v.a * p.scale;
        x[(t * p.dim) / 4u + g * 2u + 1u] = v.b * p.scale;
    }
}
