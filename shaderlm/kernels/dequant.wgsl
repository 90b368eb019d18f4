// Dequantize rows of a weight tensor to f32 (tests, and any op that wants plain floats).
// out[r * K + k] for rows [0, n_rows) of this chunk; one thread per 8-element group (W4: through the
// type's raw8 and dq8_raw, the tensor-core GEMM's loads).
// ROW_MAX: instead out[r] = max |W[r]| (the tensor-core GEMM's grid, matmul_tc.wgsl); a workgroup a row.
#include quant_common
#include {{QUANT}}

struct P { k: u32, n_rows: u32, dbase: u32, _pad: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> w: array<WeightWord>;      // vec4s with W4 (tests: raw8's loads)
#if ROW_MAX
#include reduce
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.n_rows) { return; }        // the whole workgroup
    red_lane = li;
    var m = 0.0;
    for (var g = li; g < p.k / 8u; g += {{WG}}u) {
        let v = dq8(row * (p.k / QK) + g / (QK / 8u), g % (QK / 8u));
        let a = max(abs(v.a), abs(v.b));
        m = max(m, max(max(a.x, a.y), max(a.z, a.w)));
    }
    m = wg_max(m);
    if (li == 0u) { out[row] = m; }
}
#else
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let groups_per_row = p.k / 8u;
    let g = gid.x + gid.y * nwg.x * 256u;
    if (g >= groups_per_row * p.n_rows) { return; }
    let row = g / groups_per_row;
    let gi = g % groups_per_row;
    let blocks_per_row = p.k / QK;
    let blk = row * blocks_per_row + gi / (QK / 8u);
#if W4
    let v = dq8_raw(raw8(blk, gi % (QK / 8u)), gi % (QK / 8u));
#else
    let v = dq8(blk, gi % (QK / 8u));
#endif
    out[g * 2u] = v.a;
    out[g * 2u + 1u] = v.b;
}
#endif
