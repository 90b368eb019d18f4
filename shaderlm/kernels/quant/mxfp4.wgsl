// MXFP4: 32 FP4 (e2m1) values times a power of two, x = 2^(e - 128) * kv[q] with kv the e2m1 values
// doubled (0 1 2 3 4 6 8 12, bit 3 the sign) and e an E8M0 byte. GGUF block (17 B): e, qs[16];
// elements 0-15 are the low nibbles of qs[0..15], 16-31 the high nibbles (as Q4_0). GPU: qs as 4
// words; the e bytes split off (4 a word). The table as bytes, 4 a word: KV0..KV3.
const QK: u32 = 32u;
const QW: u32 = 4u;
const KV0: u32 = 0x03020100u;
const KV1: u32 = 0x0C080604u;
const KV2: u32 = 0xFDFEFF00u;
const KV3: u32 = 0xF4F8FAFCu;

// 2^(e - 128) of block blk as f32 bits: exponent field e - 1, or for e < 2 the subnormals 2^-128 and
// 2^-127 (which a GPU may flush to zero; no real weights come near them).
fn block_d(blk: u32) -> f32 {
    let e = (word(p.dbase + (blk >> 2u)) >> ((blk & 3u) * 8u)) & 255u;
    return bitcast<f32>(select(0x00200000u << e, (e - 1u) << 23u, e >= 2u));
}

#include quant/table4_32
