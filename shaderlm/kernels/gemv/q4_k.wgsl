// Q4_K for gemv.wgsl. Block (144 B = 9 x vec4): [d|dmin, scales 12 B][qs 128 B]. Part p (8 per
// block) is one 16-byte qs chunk: its low nibbles are 16 elements of sub-block 2c, its high nibbles
// 16 of sub-block 2c+1 (c = p / 2), at offset 16 * (p % 2) within each sub-block.
const QK: u32 = 256u;
const PPB: u32 = 8u;

fn part_x(part: u32, i: u32) -> u32 {
    let c = part >> 1u;
    return 64u * c + select(0u, 32u, i >= 4u) + 16u * (part & 1u) + 4u * (i & 3u);
}

fn scale_min(s: u32, a: u32, b: u32, c: u32) -> vec2<f32> {
    let sh = 8u * (s & 3u);
    if (s < 4u) { return vec2<f32>(f32((a >> sh) & 63u), f32((b >> sh) & 63u)); }
    return vec2<f32>(f32(((c >> sh) & 15u) | ((a >> (sh + 2u)) & 0x30u)),
                     f32(((c >> (sh + 4u)) & 15u) | ((b >> (sh + 2u)) & 0x30u)));
}

fn part_dot(blk: u32, part: u32, xs: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    let hdr = w4[blk * 9u];
    let q = w4[blk * 9u + 1u + part];
    let dm = unpack2x16float(hdr.x);
    let c = part >> 1u;
    let lo = scale_min(2u * c, hdr.y, hdr.z, hdr.w);
    let hi = scale_min(2u * c + 1u, hdr.y, hdr.z, hdr.w);
    var s0 = 0.0; var s1 = 0.0; var x0 = 0.0; var x1 = 0.0;
    for (var i = 0u; i < 4u; i++) {
        let wv = q[i];
        let a = (*xs)[i];
        let b = (*xs)[i + 4u];
        s0 += dot(u8x4(wv & 0x0F0F0F0Fu), a);
        s1 += dot(u8x4((wv >> 4u) & 0x0F0F0F0Fu), b);
        x0 += a.x + a.y + a.z + a.w;
        x1 += b.x + b.y + b.z + b.w;
    }
    return dm.x * (lo.x * s0 + hi.x * s1) - dm.y * (lo.y * x0 + hi.y * x1);
}
