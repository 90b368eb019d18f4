// Q6_K: 256 6-bit quants, x = (d * sc[e / 16]) * (q - 32), sc int8.
// GGUF block (210 B): ql[128], qh[64], scales[16] (int8), d (f16) at byte 208. GPU: the first
// 208 bytes = 52 words (ql 0..31, qh 32..47, scales 48..51); d split off.
// Element order: two halves h (128 elements each, ql[64h..], qh[32h..]); within a half, group
// g4 = 0..3 of 32 elements, l = 0..31:
//   low 4 bits:  g4 0: ql[l] & 15, 1: ql[l+32] & 15, 2: ql[l] >> 4, 3: ql[l+32] >> 4
//   high 2 bits: (qh[l] >> 2*g4) & 3
const QK: u32 = 256u;
const QW: u32 = 52u;

fn dq8(blk: u32, j: u32) -> V8 {
    let o = blk * 52u;
    let g = j >> 2u;                 // 32-element group 0..7
    let h = g >> 2u;                 // half
    let q4 = (j & 3u) * 2u;          // word within a 32-byte run
    let lw = o + h * 16u + (g & 1u) * 8u + q4;
    let lsh = (g & 2u) * 2u;         // 0 or 4
    let hw = o + 32u + h * 8u + q4;
    let hsh = (g & 3u) * 2u;
    let sw = w[o + 48u + (j >> 3u)];
    let sc = f32(bitcast<i32>(sw << (24u - ((j >> 1u) & 3u) * 8u)) >> 24u);
    let dl = split_d(blk) * sc;
    let qa = ((w[lw] >> lsh) & 0x0F0F0F0Fu) | (((w[hw] >> hsh) & 0x03030303u) << 4u);
    let qb = ((w[lw + 1u] >> lsh) & 0x0F0F0F0Fu) | (((w[hw + 1u] >> hsh) & 0x03030303u) << 4u);
    return V8((u8x4(qa) - 32.0) * dl, (u8x4(qb) - 32.0) * dl);
}
