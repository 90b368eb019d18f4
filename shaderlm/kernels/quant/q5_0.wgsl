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

fn dq8(blk: u32, j: u32) -> V8 {
    let o = blk * 5u;
    let d = split_d(blk);
    let qh = word(o) >> (j * 8u);
    let wi = o + 1u + (j & 1u) * 2u;
    let sh = (j >> 1u) * 4u;
    let qa = ((word(wi) >> sh) & 0x0F0F0F0Fu) | q5_hbits(qh & 15u);
    let qb = ((word(wi + 1u) >> sh) & 0x0F0F0F0Fu) | q5_hbits((qh >> 4u) & 15u);
    return V8((u8x4(qa) - 16.0) * d, (u8x4(qb) - 16.0) * d);
}
