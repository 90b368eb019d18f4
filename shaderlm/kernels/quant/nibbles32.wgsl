// Blocks of 32 4-bit values in 4 words (Q4_0's layout, also Q4_1's, IQ4_NL's and MXFP4's): elements
// 0-15 are the low nibbles of the block's 16 bytes, 16-31 the high ones.

// Elements [8j, 8j+8) of block blk as two words of bytes (0..15).
fn q8w(blk: u32, j: u32) -> vec2<u32> {
    let wi = blk * 4u + (j & 1u) * 2u;
    let sh = (j >> 1u) * 4u;
    return vec2<u32>((word(wi) >> sh) & 0x0F0F0F0Fu, (word(wi + 1u) >> sh) & 0x0F0F0F0Fu);
}
