// Blocks of 32 4-bit values in 4 words (Q4_0's layout, also Q4_1's, IQ4_NL's and MXFP4's): elements
// 0-15 are the low nibbles of the block's 16 bytes, 16-31 the high ones.

// Elements [8j, 8j+8) of block blk as two words of bytes (0..15).
fn q8w(blk: u32, j: u32) -> vec2<u32> {
    let wi = nib32_word(blk, j);
    return nib32_bytes(words2(wi), j);
}
// the first of the two words holding them (even: half a 16-byte load, which the block's groups share)
fn nib32_word(blk: u32, j: u32) -> u32 { return blk * 4u + (j & 1u) * 2u; }
// their nibbles in those words q as bytes
fn nib32_bytes(q: vec2<u32>, j: u32) -> vec2<u32> { return (q >> vec2<u32>((j >> 1u) * 4u)) & vec2<u32>(0x0F0F0F0Fu); }
