// MXFP4: 32 FP4 (e2m1) values times a power of two, x = 2^(e - 128) * kv[q] with kv the e2m1 values
// doubled (0 1 2 3 4 6 8 12, bit 3 the sign) and e an E8M0 byte. GGUF block (17 B): e, qs[16];
// elements 0-15 are the low nibbles of qs[0..15], 16-31 the high nibbles (as Q4_0). GPU: qs as 4
// words; the e bytes split off (4 a word).
const QK: u32 = 32u;
const QW: u32 = 4u;

// A word of 4 indices (bytes 0..15) -> the word of their values (int8 bytes), in arithmetic on all
// four bytes at once rather than a table lookup: the magnitude m (0..7) maps to m + (m - 4 where
// m >= 4) + (2 where m == 7), i.e. 0 1 2 3 4 6 8 12; a negative byte is (0x80 - v) ^ 0x80, which
// borrows nothing from its neighbours (v <= 12).
fn kv_bytes(v: u32) -> u32 {
    let m = v & 0x07070707u;
    let a = m & 0x03030303u;
    let h = (m >> 2u) & 0x01010101u;                  // m >= 4
    let top = h & a & (a >> 1u) & 0x01010101u;        // m == 7
    let mag = m + (a & (h | (h << 1u))) + (top << 1u);
    let neg = ((v >> 3u) & 0x01010101u) * 0xFFu;      // 0xFF in each negative byte
    return (mag & ~neg) | (((0x80808080u - mag) ^ 0x80808080u) & neg);
}

// 2^(e - 128) of block blk as f32 bits: exponent field e - 1, or for e < 2 the subnormals 2^-128 and
// 2^-127 (which a GPU may flush to zero; no real weights come near them).
fn block_d(blk: u32) -> f32 {
    let e = (word(p.dbase + (blk >> 2u)) >> ((blk & 3u) * 8u)) & 255u;
    return bitcast<f32>(select(0x00200000u << e, (e - 1u) << 23u, e >= 2u));
}

#include quant/table4_32
