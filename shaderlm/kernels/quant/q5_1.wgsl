// Q5_1: 32 5-bit quants, x = d * q + m. GGUF block (24 B): d, m (f16), qh (u32), qs[16].
// Low 4 bits as Q4_1 (element e < 16: low nibble of qs[e], else high nibble of qs[e-16]);
// bit 4 of element e is bit e of qh. GPU: qs as 4 words (16 B); [d|m, qh] (2 words) split off.
const QK: u32 = 32u;
const QW: u32 = 4u;

#include quant/q5_bits

// Elements [8j, 8j+8) of block blk as two words of bytes q (0..31).
fn q8w(blk: u32, j: u32) -> vec2<u32> {
    let qh = word(p.dbase + blk * 2u + 1u) >> (j * 8u);
    let wi = blk * 4u + (j & 1u) * 2u;
    let sh = (j >> 1u) * 4u;
    return vec2<u32>(((word(wi) >> sh) & 0x0F0F0F0Fu) | q5_hbits(qh & 15u),
                     ((word(wi + 1u) >> sh) & 0x0F0F0F0Fu) | q5_hbits((qh >> 4u) & 15u));
}

fn dq8(blk: u32, j: u32) -> V8 {
    let dm = unpack2x16float(word(p.dbase + blk * 2u));
    let q = q8w(blk, j);
    return V8(u8x4(q.x) * dm.x + dm.y, u8x4(q.y) * dm.x + dm.y);
}

fn iq8(blk: u32, j: u32) -> IQ8 {
    let dm = unpack2x16float(word(p.dbase + blk * 2u));
    return IQ8(q8w(blk, j), dm.x, dm.y);
}

#if WIDE
const WQK: u32 = QK;          // elements per wide block
const CPB: u32 = 1u;
fn x_chunk(r: XRow, b: u32, c: u32) -> array<vec4<f32>, 8> { return x_runs2(r, b * 8u, b * 8u + 4u); }
struct CW { q: vec4<u32>, dm: u32, qh: u32 }
fn chunk_load(blk: u32, c: u32) -> CW { return CW(w[blk], word(p.dbase + blk * 2u), word(p.dbase + blk * 2u + 1u)); }
fn chunk_dot(cw: CW, c: u32, xr: array<vec4<f32>, 8>) -> f32 {
    let q = cw.q;
    let dm = unpack2x16float(cw.dm);
    let s = q5_dot(q, cw.qh, xr);
    let xs = hsum(xr[0] + xr[1] + xr[2] + xr[3] + xr[4] + xr[5] + xr[6] + xr[7]);
    return dm.x * s + dm.y * xs;
}
#endif
