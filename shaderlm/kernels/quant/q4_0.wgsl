// Q4_0: 32 4-bit quants, x = d * (q - 8). GGUF block (18 B): d (f16), qs[16]; elements 0-15 are the
// low nibbles of qs[0..15], 16-31 the high nibbles. GPU: qs as 4 words; d split off.
const QK: u32 = 32u;
const QW: u32 = 4u;

fn dq8(blk: u32, j: u32) -> V8 {
    let d = split_d(blk);
    let wi = blk * 4u + (j & 1u) * 2u;
    let sh = (j >> 1u) * 4u;
    return V8((u8x4((w[wi] >> sh) & 0x0F0F0F0Fu) - 8.0) * d,
              (u8x4((w[wi + 1u] >> sh) & 0x0F0F0F0Fu) - 8.0) * d);
}
