// The fifth bits of Q5_0 and Q5_1 (bit 4 of element e is bit e of the block's word qh; the low 4 bits
// as Q4_0's nibbles: element e < 16 the low nibble of byte e, else the high nibble of byte e - 16).

// 4 bits h3..h0 -> bit 4 of bytes 3..0 (the multiply places copies of h at bits 0, 7, 14, 21;
// no copies overlap, so no carries).
fn q5_hbits(h: u32) -> u32 {
    return ((h * 0x00204081u) & 0x01010101u) << 4u;
}

#if WIDE
// sum_e q_e x_e over a block's 32 5-bit quants (q: its 4 words of nibbles) and x (x_chunk's 8 vec4s)
fn q5_dot(q: vec4<u32>, qh: u32, xr: array<vec4<f32>, 8>) -> f32 {
    let hl = vec4<u32>(q5_hbits(qh & 15u), q5_hbits((qh >> 4u) & 15u), q5_hbits((qh >> 8u) & 15u),
                       q5_hbits((qh >> 12u) & 15u));
    let hh = vec4<u32>(q5_hbits((qh >> 16u) & 15u), q5_hbits((qh >> 20u) & 15u), q5_hbits((qh >> 24u) & 15u),
                       q5_hbits(qh >> 28u));
    return dot_u8(nib_hi(q, 0u, hl, 4u, 0x01010101u), xr[0], xr[1], xr[2], xr[3])
         + dot_u8(nib_hi(q, 4u, hh, 4u, 0x01010101u), xr[4], xr[5], xr[6], xr[7]);
}
#endif
