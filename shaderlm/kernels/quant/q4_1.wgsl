// Q4_1: 32 4-bit quants, x = d*q + m. GGUF block (20 B, word aligned): d, m (f16), qs[16];
// elements 0-15 are the low nibbles of qs[0..15], 16-31 the high nibbles.
const QK: u32 = 32u;
const QW: u32 = 5u;

fn dq8(blk: u32, j: u32) -> V8 {
    let o = blk * 5u;
    let dm = unpack2x16float(w[o]);
    let wi = o + 1u + (j & 1u) * 2u;
    let sh = (j >> 1u) * 4u;
    return V8(u8x4((w[wi] >> sh) & 0x0F0F0F0Fu) * dm.x + dm.y,
              u8x4((w[wi + 1u] >> sh) & 0x0F0F0F0Fu) * dm.x + dm.y);
}
