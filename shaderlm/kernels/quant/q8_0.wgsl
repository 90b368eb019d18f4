// Q8_0: 32 int8 quants * d. GGUF block: d (f16), qs[32]. GPU: qs as 8 words; d split off.
const QK: u32 = 32u;
const QW: u32 = 8u;

fn dq8(blk: u32, j: u32) -> V8 {
    let d = split_d(blk);
    let o = blk * 8u + j * 2u;
    return V8(i8x4(w[o]) * d, i8x4(w[o + 1u]) * d);
}
