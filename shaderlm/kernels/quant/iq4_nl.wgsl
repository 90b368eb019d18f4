// IQ4_NL: 32 4-bit indices into a non-linear table of 16 int8 values, x = d * kv[q]. GGUF block
// (18 B): d (f16), qs[16]; elements 0-15 are the low nibbles of qs[0..15], 16-31 the high nibbles
// (as Q4_0). GPU: qs as 4 words; d split off. The table's values as bytes, 4 a word (KV0..KV3):
// kv = -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113.
const QK: u32 = 32u;
const QW: u32 = 4u;
const KV0: u32 = 0xBFAD9881u;
const KV1: u32 = 0xF6EADDCFu;
const KV2: u32 = 0x26190D01u;
const KV3: u32 = 0x71594535u;

fn block_d(blk: u32) -> f32 { return split_d(blk); }

#include quant/table4
#include quant/table4_32
