// Q3_K: 256 3-bit quants in 16 sub-blocks of 16; x = (d * (sc[s] - 32)) * (q - 4), sc 6-bit.
// GGUF block (110 B): hmask[32], qs[64], scales[12], d (f16). Element e = 128h + 32g + l (half h,
// g = 0..3, l = 0..31): low 2 bits (qs[32h + l] >> 2g) & 3, bit 2 (hmask[l] >> (4h + g)) & 1 (the
// same bit e >> 5), sub-block e / 16. Scale s: low 4 bits the nibble s >> 3 of scales[s & 7], high 2
// bits (scales[8 + (s & 3)] >> 2 (s >> 2)) & 3.
// GPU: hmask and qs = 24 words (6 x 16 B); scales and d (14 B) split off, so block b's field starts
// at byte 14b of the field array: on a word for even b, two bytes into one for odd b.
const QK: u32 = 256u;
const QW: u32 = 24u;

// Elements [8j, 8j+8) of block blk as two words of bytes q (0..7).
fn q8w(blk: u32, j: u32) -> vec2<u32> {
    let o = blk * 24u;
    let lw = o + 8u + (j >> 4u) * 8u + (j & 3u) * 2u;
    let lsh = ((j >> 2u) & 3u) * 2u;
    let hw = o + (j & 3u) * 2u;
    let hsh = j >> 2u;
    return vec2<u32>(((word(lw) >> lsh) & 0x03030303u) | (((word(hw) >> hsh) & 0x01010101u) << 2u),
                     ((word(lw + 1u) >> lsh) & 0x03030303u) | (((word(hw + 1u) >> hsh) & 0x01010101u) << 2u));
}

// The 4 words from the one where block blk's field starts (the last one only for d).
fn k3_words(blk: u32) -> vec4<u32> {
    let i = p.dbase + (blk * 7u) / 2u;
    return vec4<u32>(word(i), word(i + 1u), word(i + 2u), word(i + 3u));
}
// Those words shifted to the field's start (odd: the field starts at byte 2): the 12 scale bytes in
// x, y, z and d in the low half of w.
fn k3_align(f: vec4<u32>, odd: bool) -> vec4<u32> {
    return select(f, (f >> vec4<u32>(16u)) | (vec4<u32>(f.y, f.z, f.w, 0u) << vec4<u32>(16u)), odd);
}
// Sub-block s's scale sc - 32 from the aligned field f.
fn k3_scale(f: vec4<u32>, s: u32) -> f32 {
    let lo = (select(f.x, f.y, (s & 4u) != 0u) >> ((s & 3u) * 8u + (s >> 3u) * 4u)) & 15u;
    let hi = (f.z >> ((s & 3u) * 8u + (s >> 2u) * 2u)) & 3u;
    return f32(i32(lo | (hi << 4u)) - 32);
}

// d * (sc - 32) of elements [8j, 8j+8) (sub-block j / 2).
fn k3_d(blk: u32, j: u32) -> f32 {
    let f = k3_align(k3_words(blk), (blk & 1u) == 1u);
    return unpack2x16float(f.w).x * k3_scale(f, j >> 1u);
}

fn dq8(blk: u32, j: u32) -> V8 {
    let dl = k3_d(blk, j);
    let q = q8w(blk, j);
    return V8((u8x4(q.x) - 4.0) * dl, (u8x4(q.y) - 4.0) * dl);
}

fn iq8(blk: u32, j: u32) -> IQ8 {
    let dl = k3_d(blk, j);
    return IQ8(signed_bytes(q8w(blk, j), 4u), dl, 0.0);
}

#if WIDE
// Chunk c (0..3): half hh = c >> 1, l = 16m .. 16m + 16 with m = c & 1: qs[32hh + l] (vec4 2 + 2hh + m)
// and hmask[l] (vec4 m) hold runs g = 0..3 (qs bits 2g, hmask bit 4hh + g) at elements
// 128hh + 16m + 32g, sub-blocks 8hh + m + 2g. As Q6_K's chunks.
#include quant/runs4
struct CW { q: vec4<u32>, hm: vec4<u32>, f: vec4<u32>, odd: u32 }
fn chunk_load(blk: u32, c: u32) -> CW {
    return CW(w[blk * 6u + 2u + c], w[blk * 6u + (c & 1u)], k3_words(blk), blk & 1u);
}
// Run g's quants as bytes 0..7.
fn k3_bits(cw: CW, c: u32, g: u32) -> vec4<u32> {
    return ((cw.q >> vec4<u32>(2u * g)) & vec4<u32>(0x03030303u))
         | (((cw.hm >> vec4<u32>((c >> 1u) * 4u + g)) & vec4<u32>(0x01010101u)) << vec4<u32>(2u));
}
// Chunk c's four run dots t (each over q - 4) times their sub-blocks' scales, times d.
fn k3_scaled(cw: CW, c: u32, t: vec4<f32>) -> f32 {
    let f = k3_align(cw.f, cw.odd == 1u);
    let s = (c >> 1u) * 8u + (c & 1u);
    let sc = vec4<f32>(k3_scale(f, s), k3_scale(f, s + 2u), k3_scale(f, s + 4u), k3_scale(f, s + 6u));
    return unpack2x16float(f.w).x * dot(sc, t);
}
#if !INT_DOT
fn chunk_dot(cw: CW, c: u32, xr: array<vec4<f32>, 16>) -> f32 {
    let t0 = dot_u8(k3_bits(cw, c, 0u), xr[0], xr[1], xr[2], xr[3]) - 4.0 * hsum(xr[0] + xr[1] + xr[2] + xr[3]);
    let t1 = dot_u8(k3_bits(cw, c, 1u), xr[4], xr[5], xr[6], xr[7]) - 4.0 * hsum(xr[4] + xr[5] + xr[6] + xr[7]);
    let t2 = dot_u8(k3_bits(cw, c, 2u), xr[8], xr[9], xr[10], xr[11]) - 4.0 * hsum(xr[8] + xr[9] + xr[10] + xr[11]);
    let t3 = dot_u8(k3_bits(cw, c, 3u), xr[12], xr[13], xr[14], xr[15]) - 4.0 * hsum(xr[12] + xr[13] + xr[14] + xr[15]);
    return k3_scaled(cw, c, vec4<f32>(t0, t1, t2, t3));
}
#else
fn x_quant(xr: array<vec4<f32>, 16>) -> XQ4 { return xq4(xr); }
fn chunk_dot(cw: CW, c: u32, xq: XQ4) -> f32 {
    let t0 = rdot(k3_bits(cw, c, 0u), xq.r0) - 4.0 * xq.r0.s;
    let t1 = rdot(k3_bits(cw, c, 1u), xq.r1) - 4.0 * xq.r1.s;
    let t2 = rdot(k3_bits(cw, c, 2u), xq.r2) - 4.0 * xq.r2.s;
    let t3 = rdot(k3_bits(cw, c, 3u), xq.r3) - 4.0 * xq.r3.s;
    return k3_scaled(cw, c, vec4<f32>(t0, t1, t2, t3));
}
#endif
#endif
