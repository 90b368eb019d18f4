// IQ4_XS: 256 4-bit indices into IQ4_NL's table in 8 sub-blocks of 32, x = (d * (sc[s] - 32)) * kv[q],
// sc 6-bit. GGUF block (136 B): d (f16), scales_h (u16), scales_l[4], qs[128]. Sub-block s: qs[16s ..
// 16s + 16], elements 0-15 the low nibbles, 16-31 the high ones (as IQ4_NL); sc[s] = nibble s & 1 of
// scales_l[s >> 1] | bits 2s, 2s + 1 of scales_h << 4. GPU: qs as 32 words (8 x 16 B); the two
// header words (d | scales_h << 16, scales_l) split off.
const QK: u32 = 256u;
const QW: u32 = 32u;
const KV0: u32 = 0xBFAD9881u;    // the table as bytes (iq4_nl.wgsl)
const KV1: u32 = 0xF6EADDCFu;
const KV2: u32 = 0x26190D01u;
const KV3: u32 = 0x71594535u;

#include quant/table4

// Elements [8j, 8j+8) of block blk as two words of indices (0..15).
fn q8w(blk: u32, j: u32) -> vec2<u32> {
    let wi = blk * 32u + (j >> 2u) * 4u + (j & 1u) * 2u;
    let sh = ((j >> 1u) & 1u) * 4u;
    return vec2<u32>((word(wi) >> sh) & 0x0F0F0F0Fu, (word(wi + 1u) >> sh) & 0x0F0F0F0Fu);
}

// d * (sc - 32) of sub-block s from the header words h (d | scales_h << 16) and l (scales_l).
fn x4_dl(h: u32, l: u32, s: u32) -> f32 {
    let sc = ((l >> (4u * s)) & 15u) | (((h >> (16u + 2u * s)) & 3u) << 4u);
    return unpack2x16float(h).x * f32(i32(sc) - 32);
}

fn x4_d(blk: u32, j: u32) -> f32 {
    return x4_dl(word(p.dbase + blk * 2u), word(p.dbase + blk * 2u + 1u), j >> 2u);
}

fn dq8(blk: u32, j: u32) -> V8 {
    let dl = x4_d(blk, j);
    let q = q8w(blk, j);
    return V8(i8x4(kv_bytes(q.x)) * dl, i8x4(kv_bytes(q.y)) * dl);
}

// The table values as signed bytes, d the sub-block's scale.
fn iq8(blk: u32, j: u32) -> IQ8 {
    let q = q8w(blk, j);
    return IQ8(vec2<u32>(kv_bytes(q.x), kv_bytes(q.y)), x4_d(blk, j), 0.0);
}

#if WIDE
// Chunk c (0..7) = sub-block c: qs vec4 c, x elements 32c .. 32c + 32.
const WQK: u32 = QK;          // elements per wide block
const CPB: u32 = 8u;
fn x_chunk(r: XRow, b: u32, c: u32) -> array<vec4<f32>, 8> {
    return x_runs2(r, b * 64u + c * 8u, b * 64u + c * 8u + 4u);
}
struct CW { q: vec4<u32>, h: u32, l: u32 }
fn chunk_load(blk: u32, c: u32) -> CW {
    return CW(w[blk * 8u + c], word(p.dbase + blk * 2u), word(p.dbase + blk * 2u + 1u));
}
#if !INT_DOT
fn chunk_dot(cw: CW, c: u32, xr: array<vec4<f32>, 8>) -> f32 {
    return x4_dl(cw.h, cw.l, c) * (dot_i8(kv16(cw.q, 0u), xr[0], xr[1], xr[2], xr[3])
                                   + dot_i8(kv16(cw.q, 4u), xr[4], xr[5], xr[6], xr[7]));
}
#else
fn x_quant(xr: array<vec4<f32>, 8>) -> XQ2 { return xq2(xr); }
fn chunk_dot(cw: CW, c: u32, xq: XQ2) -> f32 {
    return x4_dl(cw.h, cw.l, c) * (rdot(kv16(cw.q, 0u), xq.lo) + rdot(kv16(cw.q, 4u), xq.hi));
}
#endif
#endif
