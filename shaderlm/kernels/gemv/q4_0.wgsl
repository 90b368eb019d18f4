// Q4_0 for gemv.wgsl: main region 16 B of qs per block (one vec4), d split off. x = d (q - 8).
// Low nibbles are elements 0..15, high nibbles 16..31. One part per block.
const QK: u32 = 32u;
const PPB: u32 = 1u;

fn part_x(part: u32, i: u32) -> u32 { return 4u * i; }

fn part_dot(blk: u32, part: u32, xs: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    let q = w4[blk];
    var s = 0.0; var sx = 0.0;
    for (var i = 0u; i < 4u; i++) {
        let a = (*xs)[i];
        let b = (*xs)[i + 4u];
        s += dot(u8x4(q[i] & 0x0F0F0F0Fu), a) + dot(u8x4((q[i] >> 4u) & 0x0F0F0F0Fu), b);
        sx += a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w;
    }
    return split_d(blk) * (s - 8.0 * sx);
}
