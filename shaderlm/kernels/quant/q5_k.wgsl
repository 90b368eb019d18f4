// Q5_K: 256 elements in 8 sub-blocks of 32; x = (d * sc[s]) * q - (dmin * mn[s]), q 5-bit.
// GGUF block (176 B, word aligned): d, dmin (f16), scales[12], qh[32], qs[128]. GPU words:
//   0..3: d, dmin and the 6-bit scales/mins, regrouped as Q4_K's (k4_pair, k4_dmin)
//   4..11: qh: bit 4 of element l of sub-block s is bit s of qh[l] (all 8 sub-blocks share qh)
//   12..43: qs, as Q4_K: sub-blocks 2c / 2c+1 = low / high nibbles of qs[32c .. 32c+32).
const QK: u32 = 256u;
const QW: u32 = 44u;

// Elements [8j, 8j+8) of block blk as two words of bytes q (0..31).
fn q8w(blk: u32, j: u32) -> vec2<u32> {
    let wi = k5_low_word(blk, j);
    let hw = k5_high_word(blk, j);
    return k5_bytes(words2(wi), words2(hw), j);
}
// the first of the two words holding their low 4 bits, and of the two holding their fifth bits (both
// even: half a 16-byte load)
fn k5_low_word(blk: u32, j: u32) -> u32 { return blk * 44u + 12u + (j >> 3u) * 8u + (j & 3u) * 2u; }
fn k5_high_word(blk: u32, j: u32) -> u32 { return blk * 44u + 4u + (j & 3u) * 2u; }
// their bytes from those words: sub-block s = j >> 2 in the low (s even) or high nibbles, its fifth bit bit s
fn k5_bytes(q: vec2<u32>, qh: vec2<u32>, j: u32) -> vec2<u32> {
    let s = j >> 2u;
    return ((q >> vec2<u32>((s & 1u) * 4u)) & vec2<u32>(0x0F0F0F0Fu))
         | (((qh >> vec2<u32>(s)) & vec2<u32>(0x01010101u)) << vec2<u32>(4u));
}

fn dq8(blk: u32, j: u32) -> V8 { return k4_values(q8w(blk, j), k4_sub_scales(blk * 44u, j >> 2u)); }

#if W4
// Loads where w is vec4s (W4; the tensor-core GEMM): the block's header, and run j's words of low bits
// and of fifth bits, each half a 16-byte load.
struct Raw8 { h: vec4<u32>, q: vec2<u32>, qh: vec2<u32> }
fn raw8(blk: u32, j: u32) -> Raw8 {
    return Raw8(w[blk * 11u], words2(k5_low_word(blk, j)), words2(k5_high_word(blk, j)));
}
fn dq8_raw(r: Raw8, j: u32) -> V8 { return k4_values(k5_bytes(r.q, r.qh, j), k4_scales(r.h, j >> 2u)); }
#endif

fn iq8(blk: u32, j: u32) -> IQ8 {
    let sm = k4_sub_scales(blk * 44u, j >> 2u);
    return IQ8(q8w(blk, j), sm.x, -sm.y);
}

#if WIDE
// Chunks as Q4_K's (qs at vec4 3 + c); the fifth bits of l = 16 (c & 1) .. +16 are qh vec4 1 + (c & 1),
// bit s of each byte for sub-block s.
const WQK: u32 = QK;          // elements per wide block
const CPB: u32 = 8u;
fn x_chunk(r: XRow, b: u32, c: u32) -> array<vec4<f32>, 8> { return k4_x_chunk(r, b, c); }
struct CW { h: vec4<u32>, qh: vec4<u32>, q: vec4<u32> }
fn chunk_load(blk: u32, c: u32) -> CW {
    return CW(w[blk * 11u], w[blk * 11u + 1u + (c & 1u)], w[blk * 11u + 3u + c]);
}
fn chunk_dot(cw: CW, c: u32, xr: array<vec4<f32>, 8>) -> f32 {
    let h = cw.h;
    let qh = cw.qh;
    let q = cw.q;
    let sc = k4_chunk_scales(h, c);
    let s0 = (c >> 1u) * 2u;
    let lo = dot_u8(nib_hi(q, 0u, qh, s0, 0x01010101u), xr[0], xr[1], xr[2], xr[3]);
    let hi = dot_u8(nib_hi(q, 4u, qh, s0 + 1u, 0x01010101u), xr[4], xr[5], xr[6], xr[7]);
    let xa = hsum(xr[0] + xr[1] + xr[2] + xr[3]);
    let xb = hsum(xr[4] + xr[5] + xr[6] + xr[7]);
    return sc.x * lo + sc.y * hi - (sc.z * xa + sc.w * xb);
}
#endif
