// y[t, row] (+)= sum_k W[row, k] * x[t, k] for one row-chunk of a quantized weight, TT tokens per
// workgroup row tile. One lane group (a subgroup, or the workgroup without subgroups) per row; lanes
// stride over 8-element groups of K, dequantizing in registers; f32 accumulation.
#include quant_common
#include {{QUANT}}
#include reduce
#include state

// first_from_state: the batch is rows [st.out_row0, st.n) (the LM head computing only the last
// logits); x and y rows are then counted from st.out_row0.
struct P { k: u32, rows: u32, row0: u32, dbase: u32, y_stride: u32, x_stride: u32, first_from_state: u32, _b: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#if BIAS
@group(0) @binding(5) var<storage, read> bias: array<f32>;
#endif
var<private> w_dbase: u32;

const TT: u32 = {{TT}}u;

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
    red_lane = li;
#endif
    w_dbase = p.dbase;
    let first = select(0u, st.out_row0, p.first_from_state != 0u);
    let n = st.n - first;
    let t0 = wid.y * TT;
    if (t0 >= n) { return; }
    let groups = p.k / 8u;
    let bpr = p.k / QK;          // blocks per row
    let gpb = QK / 8u;           // 8-groups per block
    let xs = p.x_stride / 4u;    // x row stride: floats -> vec4
    let xbase = t0 * xs;
    for (var row = wid.x * nsg + sg; row < p.rows; row += nwg.x * nsg) {
        var acc: array<f32, TT>;
        for (var g = lane; g < groups; g += lanes) {
            let v = dq8(row * bpr + g / gpb, g % gpb);
            for (var t = 0u; t < TT; t++) {
                let xi = xbase + t * xs + g * 2u;
                acc[t] += dot(v.a, x[xi]) + dot(v.b, x[xi + 1u]);
            }
        }
        for (var t = 0u; t < TT; t++) {
            let s = lane_sum(acc[t]);
            if (lane == 0u && t0 + t < n) {
                let o = (t0 + t) * p.y_stride + p.row0 + row;
#if BIAS
                let b = bias[p.row0 + row];
#else
                let b = 0.0;
#endif
#if ACCUMULATE
                y[o] += s + b;
#else
                y[o] = s + b;
#endif
            }
        }
    }
}
