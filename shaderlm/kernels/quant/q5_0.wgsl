// Q5_0: 32 5-bit quants, x = d * (q - 16). GGUF block (22 B): d (f16), qh (u32), qs[16].
// Low 4 bits as Q4_0 (element e < 16: low nibble of qs[e], else high nibble of qs[e-16]);
// bit 4 of element e is bit e of qh. GPU: [qh, qs0..qs3] = 5 words; d split off.
const QK: u32 = 32u;
const QW: u32 = 5u;

// 4 bits h3..h0 -> bit 4 of bytes 3..0 (the multiply places copies of h at bits 0, 7, 14, 21;
// no copies overlap, so no carries).
fn q5_hbits(h: u32) -> u32 {
    return ((h * 0x00204081u) & 0x01010101u) << 4u;
}

// Elements [8j, 8j+8) of block blk as two words of bytes q (0..31).
fn q8w(blk: u32, j: u32) -> vec2<u32> {
    let o = blk * 5u;
    let qh = word(o) >> (j * 8u);
    let wi = o + 1u + (j & 1u) * 2u;
    let sh = (j >> 1u) * 4u;
    return vec2<u32>(((word(wi) >> sh) & 0x0F0F0F0Fu) | q5_hbits(qh & 15u),
                     ((word(wi + 1u) >> sh) & 0x0F0F0F0Fu) | q5_hbits((qh >> 4u) & 15u));
}

fn dq8(blk: u32, j: u32) -> V8 {
    let d = split_d(blk);
    let q = q8w(blk, j);
    return V8((u8x4(q.x) - 16.0) * d, (u8x4(q.y) - 16.0) * d);
}

fn iq8(blk: u32, j: u32) -> IQ8 {
    let d = split_d(blk);
    return IQ8(q8w(blk, j), d, -16.0 * d);
}
