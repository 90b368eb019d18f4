// Q8_0 for gemv.wgsl: main region 32 int8 per block (two vec4), d split off. One part per block.
const QK: u32 = 32u;
const PPB: u32 = 1u;

fn part_x(part: u32, i: u32) -> u32 { return 4u * i; }

fn part_dot(blk: u32, part: u32, xs: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    let q0 = w4[blk * 2u];
    let q1 = w4[blk * 2u + 1u];
    var s = 0.0;
    for (var i = 0u; i < 4u; i++) {
        s += dot(i8x4(q0[i]), (*xs)[i]) + dot(i8x4(q1[i]), (*xs)[i + 4u]);
    }
    return split_d(blk) * s;
}
