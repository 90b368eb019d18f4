// Q4_0: 32 4-bit quants, x = d * (q - 8). GGUF block (18 B): d (f16), qs[16]; elements 0-15 are the
// low nibbles of qs[0..15], 16-31 the high nibbles. GPU: qs as 4 words; d split off.
const QK: u32 = 32u;
const QW: u32 = 4u;

#include quant/nibbles32

fn dq8(blk: u32, j: u32) -> V8 {
    let d = split_d(blk);
    let q = q8w(blk, j);
    return V8((u8x4(q.x) - 8.0) * d, (u8x4(q.y) - 8.0) * d);
}

fn iq8(blk: u32, j: u32) -> IQ8 {
    let d = split_d(blk);
    return IQ8(signed_bytes(q8w(blk, j), 8u), d, 0.0);
}

#if W4
// Loads where w is vec4s (W4; the tensor-core GEMM: QuantType.raw8_int8 is off): run j's two words of
// nibbles in one 16-byte load (the block's runs share it) and the block's scale.
struct Raw8 { q: vec2<u32>, d: f32 }
fn raw8(blk: u32, j: u32) -> Raw8 { return Raw8(words2(nib32_word(blk, j)), split_d(blk)); }
fn dq8_raw(r: Raw8, j: u32) -> V8 {
    let q = nib32_bytes(r.q, j);
    return V8((u8x4(q.x) - 8.0) * r.d, (u8x4(q.y) - 8.0) * r.d);
}
#endif

#if WIDE
const WQK: u32 = QK;          // elements per wide block
const CPB: u32 = 1u;
fn x_chunk(r: XRow, b: u32, c: u32) -> array<vec4<f32>, 8> { return x_runs2(r, b * 8u, b * 8u + 4u); }
struct CW { q: vec4<u32>, d: f32 }
fn chunk_load(blk: u32, c: u32) -> CW { return CW(w[blk], split_d(blk)); }
#if !INT_DOT
fn chunk_dot(cw: CW, c: u32, xr: array<vec4<f32>, 8>) -> f32 {
    let q = cw.q;
    let s = dot_u8(nib(q, 0u), xr[0], xr[1], xr[2], xr[3]) + dot_u8(nib(q, 4u), xr[4], xr[5], xr[6], xr[7]);
    let xs = hsum(xr[0] + xr[1] + xr[2] + xr[3] + xr[4] + xr[5] + xr[6] + xr[7]);
    return cw.d * (s - 8.0 * xs);
}
#else
fn x_quant(xr: array<vec4<f32>, 8>) -> XQ2 { return xq2(xr); }
fn chunk_dot(cw: CW, c: u32, xq: XQ2) -> f32 {
    let s = rdot(nib(cw.q, 0u), xq.lo) + rdot(nib(cw.q, 4u), xq.hi);
    return cw.d * (s - 8.0 * (xq.lo.s + xq.hi.s));
}
#endif
#endif
