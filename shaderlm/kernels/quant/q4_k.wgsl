// Q4_K: 256 elements in 8 sub-blocks of 32; x = (d * sc[s]) * q - (dmin * mn[s]).
// GGUF block (144 B, word aligned): d, dmin (f16), scales[12], qs[128]. GPU words:
//   0: d | dmin << 16     1..3: scales (6-bit sc/mn, packed; see k4_scale_min)
//   4..35: qs. Sub-blocks 2c and 2c+1 share qs[32c .. 32c+32) (words 4+8c .. 4+8c+8):
//   2c in the low nibbles, 2c+1 in the high nibbles.
const QK: u32 = 256u;
const QW: u32 = 36u;

fn dq8(blk: u32, j: u32) -> V8 {
    let o = blk * 36u;
    let dm = unpack2x16float(w[o]);
    let s = j >> 2u;
    let sm = k4_scale_min(w[o + 1u], w[o + 2u], w[o + 3u], s);
    let dl = dm.x * f32(sm.x);
    let ml = dm.y * f32(sm.y);
    let wi = o + 4u + (s >> 1u) * 8u + (j & 3u) * 2u;
    let sh = (s & 1u) * 4u;
    return V8(u8x4((w[wi] >> sh) & 0x0F0F0F0Fu) * dl - ml,
              u8x4((w[wi + 1u] >> sh) & 0x0F0F0F0Fu) * dl - ml);
}
