// y[t, row] (+)= sum_k W[row, k] * x[t, k] for one row-chunk of a quantized weight: the decode GEMV
// (TT tokens per pass; prefill uses matmul_tiled.wgsl). One lane group (a subgroup, or the
// workgroup without subgroups) per row; lanes stride over 8-element groups of K, dequantizing in
// registers; f32 accumulation.
// Fused variants (decode, where each dispatch costs more than its arithmetic):
//   NORM: x is the residual stream; RMSNorm(x) * nw is applied on the fly (each workgroup
//         recomputes the token's sum of squares: K floats, cheap next to the weight rows).
//   GLU:  rows [0, rows) are gate, [rows, 2 rows) up; writes glu_act(gate . x, up . x) (activation.wgsl).
#include quant_common
#include {{QUANT}}
#include reduce
#include activation
#include epilogue
#include state

// first_from_state: the batch is rows [st.out_row0, st.n) (the LM head computing only the last
// logits); x and y rows are then counted from st.out_row0.
struct P { k: u32, rows: u32, row0: u32, dbase: u32, y_stride: u32, x_stride: u32, first_from_state: u32,
           eps: f32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#if BIAS
@group(0) @binding(5) var<storage, read> bias: array<f32>;
#endif
#if NORM
@group(0) @binding(6) var<storage, read> nw: array<vec4<f32>>;
#endif

const TT: u32 = {{TT}}u;
var<private> nscale: array<f32, TT>;

fn xv(xi: u32, g: u32, t: u32) -> vec4<f32> {
#if NORM
    return x[xi] * nw[g] * nscale[t];
#else
    return x[xi];
#endif
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32,
#if SUBGROUPS
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) lanes: u32,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32
#endif
        ) {
#if !SUBGROUPS
    let lane = li; let lanes = {{WG}}u; let sg = 0u; let nsg = 1u;
#endif
    red_lane = li;
    let first = select(0u, st.out_row0, p.first_from_state != 0u);
    let n = st.n - first;
    let t0 = wid.y * TT;
    if (t0 >= n) { return; }
    let groups = p.k / 8u;
    let bpr = p.k / QK;          // blocks per row
    let gpb = QK / 8u;           // 8-groups per block
    let xs = p.x_stride / 4u;    // x row stride: floats -> vec4
    let xbase = t0 * xs;
#if NORM
    for (var t = 0u; t < TT; t++) {
        var ss = 0.0;
        if (t0 + t < n) {
            for (var i = li; i < p.k / 4u; i += {{WG}}u) { let v = x[xbase + t * xs + i]; ss += dot(v, v); }
        }
        nscale[t] = inverseSqrt(wg_sum(ss) / f32(p.k) + p.eps);
    }
#endif
    for (var row = wid.x * nsg + sg; row < p.rows; row += nwg.x * nsg) {
        // zeroed by hand: naga hoists a loop body's `var` to the function's start, so its implicit zero
        // would not come back on the next row
        var acc: array<f32, TT>;
#if GLU
        var acc2: array<f32, TT>;
#endif
        for (var t = 0u; t < TT; t++) {
            acc[t] = 0.0;
#if GLU
            acc2[t] = 0.0;
#endif
        }
        for (var g = lane; g < groups; g += lanes) {
            let v = dq8(row * bpr + g / gpb, g % gpb);
#if GLU
            let u = dq8((row + p.rows) * bpr + g / gpb, g % gpb);
#endif
            for (var t = 0u; t < TT; t++) {
                let xi = xbase + t * xs + g * 2u;
                let xa = xv(xi, g * 2u, t);
                let xb = xv(xi + 1u, g * 2u + 1u, t);
                acc[t] += dot(v.a, xa) + dot(v.b, xb);
#if GLU
                acc2[t] += dot(u.a, xa) + dot(u.b, xb);
#endif
            }
        }
        for (var t = 0u; t < TT; t++) {
            var s = lane_sum(acc[t]);
#if GLU
            s = glu_act(s, lane_sum(acc2[t]));
#endif
            if (lane == 0u && t0 + t < n) {
                write_y((t0 + t) * p.y_stride + p.row0 + row, p.row0 + row, s);
            }
        }
    }
}
