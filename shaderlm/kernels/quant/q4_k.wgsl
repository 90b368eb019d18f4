// Q4_K: 256 elements in 8 sub-blocks of 32; x = (d * sc[s]) * q - (dmin * mn[s]).
// GGUF block (144 B, word aligned): d, dmin (f16), scales[12], qs[128]. GPU words:
//   0: d | dmin << 16     1..3: scales (6-bit sc/mn, packed; see k4_scale_min)
//   4..35: qs. Sub-blocks 2c and 2c+1 share qs[32c .. 32c+32) (words 4+8c .. 4+8c+8):
//   2c in the low nibbles, 2c+1 in the high nibbles.
const QK: u32 = 256u;
const QW: u32 = 36u;

// ggml get_scale_min_k4 on the scale words a (bytes 0-3), b (4-7), c (8-11):
//   s < 4:  sc = byte s & 63,                       mn = byte s+4 & 63
//   s >= 4: sc = (byte s+4 & 15) | (byte s-4 >> 6) << 4,   mn = (byte s+4 >> 4) | (byte s >> 6) << 4
// Returns vec2(sc, mn).
fn k4_scale_min(a: u32, b: u32, c: u32, s: u32) -> vec2<u32> {
    let sh = (s & 3u) * 8u;
    let lo = vec2<u32>((a >> sh) & 63u, (b >> sh) & 63u);
    let hi = vec2<u32>(((c >> sh) & 15u) | ((a >> (sh + 2u)) & 0x30u),
                       ((c >> (sh + 4u)) & 15u) | ((b >> (sh + 2u)) & 0x30u));
    return select(hi, lo, s < 4u);
}

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
