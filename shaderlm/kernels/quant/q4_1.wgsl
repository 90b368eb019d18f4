// Q4_1: 32 4-bit quants, x = d*q + m. GGUF block (20 B): d, m (f16), qs[16]; elements 0-15 are the
// low nibbles of qs[0..15], 16-31 the high nibbles. GPU: qs as 4 words (16 B); the d|m word split off.
const QK: u32 = 32u;
const QW: u32 = 4u;

#include quant/nibbles32

fn q4_1_dm(blk: u32) -> vec2<f32> { return unpack2x16float(word(p.dbase + blk)); }     // (d, m)
fn q4_1_values(q: vec2<u32>, dm: vec2<f32>) -> V8 { return V8(u8x4(q.x) * dm.x + dm.y, u8x4(q.y) * dm.x + dm.y); }
fn dq8(blk: u32, j: u32) -> V8 { return q4_1_values(q8w(blk, j), q4_1_dm(blk)); }

fn iq8(blk: u32, j: u32) -> IQ8 {
    let dm = q4_1_dm(blk);
    return IQ8(q8w(blk, j), dm.x, dm.y);
}

#if W4
// Loads where w is vec4s (W4; the tensor-core GEMM): group j's two words of nibbles, half a 16-byte load
// (the block's groups share it), and the block's d and m.
struct Raw8 { q: vec2<u32>, dm: vec2<f32> }
fn raw8(blk: u32, j: u32) -> Raw8 { return Raw8(words2(nib32_word(blk, j)), q4_1_dm(blk)); }
fn dq8_raw(r: Raw8, j: u32) -> V8 { return q4_1_values(nib32_bytes(r.q, j), r.dm); }
#endif

#if WIDE
const WQK: u32 = QK;          // elements per wide block
const CPB: u32 = 1u;
fn x_chunk(r: XRow, b: u32, c: u32) -> array<vec4<f32>, 8> { return x_runs2(r, b * 8u, b * 8u + 4u); }
struct CW { q: vec4<u32>, dm: u32 }
fn chunk_load(blk: u32, c: u32) -> CW { return CW(w[blk], word(p.dbase + blk)); }
#if !INT_DOT
fn chunk_dot(cw: CW, c: u32, xr: array<vec4<f32>, 8>) -> f32 {
    let q = cw.q;
    let dm = unpack2x16float(cw.dm);
    let s = dot_u8(nib(q, 0u), xr[0], xr[1], xr[2], xr[3]) + dot_u8(nib(q, 4u), xr[4], xr[5], xr[6], xr[7]);
    let xs = hsum(xr[0] + xr[1] + xr[2] + xr[3] + xr[4] + xr[5] + xr[6] + xr[7]);
    return dm.x * s + dm.y * xs;
}
#else
fn x_quant(xr: array<vec4<f32>, 8>) -> XQ2 { return xq2(xr); }
fn chunk_dot(cw: CW, c: u32, xq: XQ2) -> f32 {
    let dm = unpack2x16float(cw.dm);
    let s = rdot(nib(cw.q, 0u), xq.lo) + rdot(nib(cw.q, 4u), xq.hi);
    return dm.x * s + dm.y * (xq.lo.s + xq.hi.s);
}
#endif
#endif
