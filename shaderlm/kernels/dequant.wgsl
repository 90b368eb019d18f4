// Dequantize rows of a weight tensor to f32 (tests, and any op that wants plain floats).
// out[r * K + k] for rows [0, n_rows) of this chunk; one thread per 8-element group.
#include quant_common
#include {{QUANT}}

struct P { k: u32, n_rows: u32, dbase: u32, _pad: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<vec4<f32>>;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let groups_per_row = p.k / 8u;
    let g = gid.x + gid.y * nwg.x * 256u;
    if (g >= groups_per_row * p.n_rows) { return; }
    let row = g / groups_per_row;
    let gi = g % groups_per_row;
    let blocks_per_row = p.k / QK;
    let v = dq8(row * blocks_per_row + gi / (QK / 8u), gi % (QK / 8u));
    out[g * 2u] = v.a;
    out[g * 2u + 1u] = v.b;
}
