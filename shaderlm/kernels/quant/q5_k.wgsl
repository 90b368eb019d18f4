// Q5_K: 256 elements in 8 sub-blocks of 32; x = (d * sc[s]) * q - (dmin * mn[s]), q 5-bit.
// GGUF block (176 B, word aligned): d, dmin (f16), scales[12], qh[32], qs[128]. GPU words:
//   0: d | dmin << 16     1..3: scales (packed exactly as Q4_K; see k4_scale_min)
//   4..11: qh: bit 4 of element l of sub-block s is bit s of qh[l] (all 8 sub-blocks share qh)
//   12..43: qs, as Q4_K: sub-blocks 2c / 2c+1 = low / high nibbles of qs[32c .. 32c+32).
const QK: u32 = 256u;
const QW: u32 = 44u;

fn dq8(blk: u32, j: u32) -> V8 {
    let o = blk * 44u;
    let dm = unpack2x16float(w[o]);
    let s = j >> 2u;
    let sm = k4_scale_min(w[o + 1u], w[o + 2u], w[o + 3u], s);
    let dl = dm.x * f32(sm.x);
    let ml = dm.y * f32(sm.y);
    let hw = o + 4u + (j & 3u) * 2u;
    let wi = o + 12u + (s >> 1u) * 8u + (j & 3u) * 2u;
    let sh = (s & 1u) * 4u;
    let qa = ((w[wi] >> sh) & 0x0F0F0F0Fu) | (((w[hw] >> s) & 0x01010101u) << 4u);
    let qb = ((w[wi + 1u] >> sh) & 0x0F0F0F0Fu) | (((w[hw + 1u] >> s) & 0x01010101u) << 4u);
    return V8(u8x4(qa) * dl - ml, u8x4(qb) * dl - ml);
}
