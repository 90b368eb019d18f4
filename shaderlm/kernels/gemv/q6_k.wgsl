// Q6_K for gemv.wgsl. Main region per block: ql[128] qh[64] scales[16] (52 words); d split off.
// Part p (8 per block): half h = p / 4, l0 = 8 (p % 4); it holds elements h*128 + 32g + l0 .. +8
// for g = 0..3: low/high nibbles of ql[64h + l] and ql[64h + 32 + l], 2 bits each from qh[32h + l].
const QK: u32 = 256u;
const PPB: u32 = 8u;

fn part_x(part: u32, i: u32) -> u32 {
    return 128u * (part >> 2u) + 32u * (i >> 1u) + 8u * (part & 3u) + 4u * (i & 1u);
}

fn part_dot(blk: u32, part: u32, xs: ptr<function, array<vec4<f32>, 8>>) -> f32 {
    let h = part >> 2u;
    let l0 = 8u * (part & 3u);
    let o = blk * 52u;
    let qa = o + (64u * h + l0) / 4u;             // ql[64h + l0 ..]
    let qb = qa + 8u;                             // ql[64h + 32 + l0 ..]
    let qh = o + 32u + (32u * h + l0) / 4u;       // qh[32h + l0 ..]
    let sc = scales6(blk, h, l0);
    var acc = 0.0;
    for (var j = 0u; j < 2u; j++) {
        let la = w[qa + j];
        let lb = w[qb + j];
        let hb = w[qh + j];
        let q0 = (la & 0x0F0F0F0Fu) | ((hb & 0x03030303u) << 4u);
        let q1 = (lb & 0x0F0F0F0Fu) | (((hb >> 2u) & 0x03030303u) << 4u);
        let q2 = ((la >> 4u) & 0x0F0F0F0Fu) | (((hb >> 4u) & 0x03030303u) << 4u);
        let q3 = ((lb >> 4u) & 0x0F0F0F0Fu) | (((hb >> 6u) & 0x03030303u) << 4u);
        let v = vec4<f32>(dot(u8x4(q0) - 32.0, (*xs)[j]), dot(u8x4(q1) - 32.0, (*xs)[2u + j]),
                          dot(u8x4(q2) - 32.0, (*xs)[4u + j]), dot(u8x4(q3) - 32.0, (*xs)[6u + j]));
        acc += dot(v, sc);
    }
    return split_d(blk) * acc;
}

// the int8 scales of groups g = 0..3 for this part: scales[8h + 2g + l0/16]
fn scales6(blk: u32, h: u32, l0: u32) -> vec4<f32> {
    let o = blk * 52u + 48u + 2u * h;          // scales[8h ..] starts at word 48 + 2h
    let s = l0 >> 4u;                         // 0 or 1
    let w0 = w[o];
    let w1 = w[o + 1u];
    // scales[8h + s], [8h + 2 + s], [8h + 4 + s], [8h + 6 + s]
    let b0 = (w0 >> (8u * s)) & 255u;
    let b1 = (w0 >> (8u * (2u + s))) & 255u;
    let b2 = (w1 >> (8u * s)) & 255u;
    let b3 = (w1 >> (8u * (2u + s))) & 255u;
    return i8x4(b0 | (b1 << 8u) | (b2 << 16u) | (b3 << 24u));
}
