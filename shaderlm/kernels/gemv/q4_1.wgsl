// Q4_1 for gemv.wgsl: 5 words per block [d|m][qs 16 B] (not 16-byte aligned: word loads).
// x = d q + m; low nibbles are elements 0..15, high 16..31. One part per block.
const QK: u32 = 32u;
const PPB: u32 = 1u;

fn part_x(part: u32, i: u32) -> u32 { return 4u * i; }

fn part_dot(blk: u32, part: u32, xs: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    let o = blk * 5u;
    let dm = unpack2x16float(w[o]);
    var s = 0.0; var sx = 0.0;
    for (var i = 0u; i < 4u; i++) {
        let q = w[o + 1u + i];
        let a = (*xs)[i];
        let b = (*xs)[i + 4u];
        s += dot(u8x4(q & 0x0F0F0F0Fu), a) + dot(u8x4((q >> 4u) & 0x0F0F0F0Fu), b);
        sx += a.x + a.y + a.z + a.w + b.x + b.y + b.z + b.w;
    }
    return dm.x * s + dm.y * sx;
}
