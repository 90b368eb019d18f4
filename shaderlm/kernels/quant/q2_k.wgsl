// Q2_K: 256 2-bit quants in 16 sub-blocks of 16; x = (d * sc[s]) * q - (dmin * mn[s]), sc and mn the
// low and high nibbles of scales[s]. GGUF block (84 B): scales[16], qs[64], d, dmin (f16).
// Element e = 128h + 32g + l (half h, g = 0..3, l = 0..31): (qs[32h + l] >> 2g) & 3, sub-block e / 16.
// GPU: scales and qs = 20 words (5 x 16 B); the d|dmin word split off.
const QK: u32 = 256u;
const QW: u32 = 20u;

// Elements [8j, 8j+8) of block blk as two words of bytes q (0..3).
fn q8w(blk: u32, j: u32) -> vec2<u32> {
    let wi = blk * 20u + 4u + (j >> 4u) * 8u + (j & 3u) * 2u;
    let sh = ((j >> 2u) & 3u) * 2u;
    return vec2<u32>((word(wi) >> sh) & 0x03030303u, (word(wi + 1u) >> sh) & 0x03030303u);
}

// (d * sc, dmin * mn) of elements [8j, 8j+8) (sub-block j / 2, scales byte j / 2).
fn k2_sub(blk: u32, j: u32) -> vec2<f32> {
    let b = (word(blk * 20u + (j >> 3u)) >> (((j >> 1u) & 3u) * 8u)) & 255u;
    return unpack2x16float(word(p.dbase + blk)) * vec2<f32>(f32(b & 15u), f32(b >> 4u));
}

fn dq8(blk: u32, j: u32) -> V8 {
    let sm = k2_sub(blk, j);
    let q = q8w(blk, j);
    return V8(u8x4(q.x) * sm.x - sm.y, u8x4(q.y) * sm.x - sm.y);
}

fn iq8(blk: u32, j: u32) -> IQ8 {
    let sm = k2_sub(blk, j);
    return IQ8(q8w(blk, j), sm.x, -sm.y);
}

#if WIDE
// Chunk c (0..3): half hh = c >> 1, l = 16m .. 16m + 16 with m = c & 1: qs[32hh + l] (vec4 1 + 2hh + m)
// holds runs g = 0..3 (bits 2g) at elements 128hh + 16m + 32g, sub-blocks 8hh + m + 2g: byte
// m + 2 (g & 1) of scales word 2hh + (g >> 1) (vec4 0). As Q6_K's chunks.
#include quant/runs4
struct CW { sc: vec4<u32>, q: vec4<u32>, dm: u32 }
fn chunk_load(blk: u32, c: u32) -> CW {
    return CW(w[blk * 5u], w[blk * 5u + 1u + c], word(p.dbase + blk));
}
fn k2_bits(q: vec4<u32>, g: u32) -> vec4<u32> { return (q >> vec4<u32>(2u * g)) & vec4<u32>(0x03030303u); }
// Chunk c's runs' dots t and x sums xs (runs 0..3) times their sub-blocks' d * sc and dmin * mn.
fn k2_scaled(cw: CW, c: u32, t: vec4<f32>, xs: vec4<f32>) -> f32 {
    let m = (c & 1u) * 8u;
    let s01 = vec2<u32>(select(cw.sc.x, cw.sc.z, c >= 2u)) >> vec2<u32>(m, m + 16u);
    let s23 = vec2<u32>(select(cw.sc.y, cw.sc.w, c >= 2u)) >> vec2<u32>(m, m + 16u);
    let b = vec4<u32>(s01, s23) & vec4<u32>(255u);
    let dm = unpack2x16float(cw.dm);
    return dm.x * dot(vec4<f32>(b & vec4<u32>(15u)), t) - dm.y * dot(vec4<f32>(b >> vec4<u32>(4u)), xs);
}
#if !INT_DOT
fn chunk_dot(cw: CW, c: u32, xr: array<vec4<f32>, 16>) -> f32 {
    let t = vec4<f32>(dot_u8(k2_bits(cw.q, 0u), xr[0], xr[1], xr[2], xr[3]),
                      dot_u8(k2_bits(cw.q, 1u), xr[4], xr[5], xr[6], xr[7]),
                      dot_u8(k2_bits(cw.q, 2u), xr[8], xr[9], xr[10], xr[11]),
                      dot_u8(k2_bits(cw.q, 3u), xr[12], xr[13], xr[14], xr[15]));
    let xs = vec4<f32>(hsum(xr[0] + xr[1] + xr[2] + xr[3]), hsum(xr[4] + xr[5] + xr[6] + xr[7]),
                       hsum(xr[8] + xr[9] + xr[10] + xr[11]), hsum(xr[12] + xr[13] + xr[14] + xr[15]));
    return k2_scaled(cw, c, t, xs);
}
#else
fn x_quant(xr: array<vec4<f32>, 16>) -> XQ4 { return xq4(xr); }
fn chunk_dot(cw: CW, c: u32, xq: XQ4) -> f32 {
    let t = vec4<f32>(rdot(k2_bits(cw.q, 0u), xq.r0), rdot(k2_bits(cw.q, 1u), xq.r1),
                      rdot(k2_bits(cw.q, 2u), xq.r2), rdot(k2_bits(cw.q, 3u), xq.r3));
    return k2_scaled(cw, c, t, vec4<f32>(xq.r0.s, xq.r1.s, xq.r2.s, xq.r3.s));
}
#endif
#endif
