// Decode GEMV for the common quant types: y[row] (+)= W[row] . x, one subgroup per R rows.
// A block is cut into PPB parts of 32 elements; each lane takes whole parts (16-byte loads where
// the layout allows), loads the 32 matching x values once and uses them for all R rows, so weights
// stream with several loads in flight per lane and x is read once per R rows. f32 accumulation,
// one subgroupAdd per row. The per-type part decoders are in gemv/<type>.wgsl.
// Fusions as in matmul.wgsl: NORM (RMSNorm of x on the fly), GLU (rows [0, rows) gate and
// [rows, 2 rows) up; writes act(gate) * up), BIAS, ACCUMULATE, first_from_state (LM head row).
#include quant_common
#include gemv/{{QTYPE}}
#include reduce
#include state

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
@group(0) @binding(7) var<storage, read> w4: array<vec4<u32>>;   // the same weights, 16-byte view
var<private> w_dbase: u32;

const R: u32 = {{R}}u;
#if GLU
const RR: u32 = 2u * R;
#else
const RR: u32 = R;
#endif

fn act(g: f32) -> f32 {
#if ACT_GELU
    return 0.5 * g * (1.0 + tanh(clamp(0.7978845608028654 * (g + 0.044715 * g * g * g), -15.0, 15.0)));
#else
    return g / (1.0 + exp(-g));
#endif
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) lanes: u32,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32) {
    red_lane = li;
    w_dbase = p.dbase;
    _ = w[0];                                    // both views stay bound whichever one a type reads
    _ = w4[0];
    let first = select(0u, st.out_row0, p.first_from_state != 0u);
    let t = wid.y;                               // token (x and y rows counted from `first`)
    if (first + t >= st.n) { return; }
    let xb = t * (p.x_stride / 4u);
    let nb = p.k / QK;
    let parts = nb * PPB;
#if NORM
    var ss = 0.0;
    for (var i = li; i < p.k / 4u; i += {{WG}}u) { let v = x[xb + i]; ss += dot(v, v); }
    let nscale = inverseSqrt(wg_sum(ss) / f32(p.k) + p.eps);
#endif
    for (var r0 = (wid.x * nsg + sg) * R; r0 < p.rows; r0 += nwg.x * nsg * R) {
        var acc: array<f32, RR>;
        for (var pi = lane; pi < parts; pi += lanes) {
            let b = pi / PPB;
            let part = pi % PPB;
            var xs: array<vec4<f32>, 8>;
            for (var i = 0u; i < 8u; i++) {
                let e = (b * QK + part_x(part, i)) / 4u;
#if NORM
                xs[i] = x[xb + e] * nw[e] * nscale;
#else
                xs[i] = x[xb + e];
#endif
            }
            for (var r = 0u; r < R; r++) {
                let row = min(r0 + r, p.rows - 1u);
                acc[r] += part_dot(row * nb + b, part, &xs);
#if GLU
                acc[R + r] += part_dot((row + p.rows) * nb + b, part, &xs);
#endif
            }
        }
        for (var r = 0u; r < R; r++) {
            var s = subgroupAdd(acc[r]);
#if GLU
            s = act(s) * subgroupAdd(acc[R + r]);
#endif
            let row = r0 + r;
            if (lane == 0u && row < p.rows) {
                let o = t * p.y_stride + p.row0 + row;
#if BIAS
                s += bias[p.row0 + row];
#endif
#if ACCUMULATE
                y[o] += s;
#else
                y[o] = s;
#endif
            }
        }
    }
}
