// Prefill GEMM: y[t, row] (+)= sum_k W[row, k] * x[t, k] for a tile of 64 rows x 64 tokens per
// workgroup. Each K step of 32 dequantizes the 64x32 weight tile once into workgroup memory (one
// dq8 per thread) next to the 64x32 activation tile; each thread then accumulates a 4x4 block.
// Needs K % 32 == 0 (true of every quantized type; F16/F32 rows of other lengths use matmul.wgsl).
#include quant_common
#include {{QUANT}}
#include state
#include epilogue

struct P { k: u32, rows: u32, row0: u32, dbase: u32, y_stride: u32, x_stride: u32, first_from_state: u32, _b: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#if BIAS
@group(0) @binding(5) var<storage, read> bias: array<f32>;
#endif

var<workgroup> ws: array<vec4<f32>, 512>;   // [k][row / 4], 32 x 64 floats
var<workgroup> xs: array<vec4<f32>, 512>;   // [k][token / 4]

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let first = select(0u, st.out_row0, p.first_from_state != 0u);
    let n = st.n - first;
    let r_base = wid.x * 64u;
    let t_base = wid.y * 64u;
    if (t_base >= n) { return; }
    let bpr = p.k / QK;
    let gpb = QK / 8u;
    let xs4 = p.x_stride / 4u;
    // loader role: one row (or token) and one 8-wide k group
    let lr = li / 4u;
    let lj = li % 4u;
    // compute role: 4 rows x 4 tokens
    let cr = (li % 16u) * 4u;
    let ct = (li / 16u) * 4u;
    var acc: array<vec4<f32>, 4>;       // acc[i] = row cr+i, tokens ct..ct+3
    for (var k0 = 0u; k0 < p.k; k0 += 32u) {
        let g = k0 / 8u + lj;
        var v = V8(vec4<f32>(0.0), vec4<f32>(0.0));
        if (r_base + lr < p.rows) { v = dq8((r_base + lr) * bpr + g / gpb, g % gpb); }
        var a = vec4<f32>(0.0);
        var b = vec4<f32>(0.0);
        if (t_base + lr < n) {
            let xi = (t_base + lr) * xs4 + g * 2u;
            a = x[xi];
            b = x[xi + 1u];
        }
        // element (k = 8 lj + e, row lr) lives in ws[k * 16 + lr / 4][lr % 4]
        let o = lj * 8u * 16u + lr / 4u;
        let c = lr % 4u;
        ws[o][c] = v.a.x; ws[o + 16u][c] = v.a.y; ws[o + 32u][c] = v.a.z; ws[o + 48u][c] = v.a.w;
        ws[o + 64u][c] = v.b.x; ws[o + 80u][c] = v.b.y; ws[o + 96u][c] = v.b.z; ws[o + 112u][c] = v.b.w;
        xs[o][c] = a.x; xs[o + 16u][c] = a.y; xs[o + 32u][c] = a.z; xs[o + 48u][c] = a.w;
        xs[o + 64u][c] = b.x; xs[o + 80u][c] = b.y; xs[o + 96u][c] = b.z; xs[o + 112u][c] = b.w;
        workgroupBarrier();
        for (var k = 0u; k < 32u; k++) {
            let wr = ws[k * 16u + cr / 4u];
            let xt = xs[k * 16u + ct / 4u];
            acc[0] += wr.x * xt;
            acc[1] += wr.y * xt;
            acc[2] += wr.z * xt;
            acc[3] += wr.w * xt;
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < 4u; i++) {
        let row = r_base + cr + i;
        if (row >= p.rows) { continue; }
        for (var j = 0u; j < 4u; j++) {
            let t = t_base + ct + j;
            if (t < n) {
                write_y(t * p.y_stride + p.row0 + row, p.row0 + row, acc[i][j]);
            }
        }
    }
}
