// A block of 32 4-bit indices into a table of 16 signed bytes times the block's scale (IQ4_NL,
// MXFP4): the decoder that includes this provides kv_bytes (quant/table4, or its own) and
// block_d(blk). Elements 0-15 are the low nibbles of the block's 16 bytes, 16-31 the high ones (as Q4_0).
#include quant/nibble_values

#include quant/nibbles32

fn dq8(blk: u32, j: u32) -> V8 {
    let d = block_d(blk);
    let q = q8w(blk, j);
    return V8(i8x4(kv_bytes(q.x)) * d, i8x4(kv_bytes(q.y)) * d);
}

// The table values as signed bytes, d the block's scale.
fn iq8(blk: u32, j: u32) -> IQ8 {
    let q = q8w(blk, j);
    return IQ8(vec2<u32>(kv_bytes(q.x), kv_bytes(q.y)), block_d(blk), 0.0);
}

#if WIDE
const WQK: u32 = QK;          // elements per wide block
const CPB: u32 = 1u;
fn x_chunk(r: XRow, b: u32, c: u32) -> array<vec4<f32>, 8> { return x_runs2(r, b * 8u, b * 8u + 4u); }
struct CW { q: vec4<u32>, d: f32 }
fn chunk_load(blk: u32, c: u32) -> CW { return CW(w[blk], block_d(blk)); }
#if !INT_DOT
fn chunk_dot(cw: CW, c: u32, xr: array<vec4<f32>, 8>) -> f32 {
    return cw.d * (dot_i8(kv16(cw.q, 0u), xr[0], xr[1], xr[2], xr[3])
                   + dot_i8(kv16(cw.q, 4u), xr[4], xr[5], xr[6], xr[7]));
}
#else
fn x_quant(xr: array<vec4<f32>, 8>) -> XQ2 { return xq2(xr); }
fn chunk_dot(cw: CW, c: u32, xq: XQ2) -> f32 {
    return cw.d * (rdot(kv16(cw.q, 0u), xq.lo) + rdot(kv16(cw.q, 4u), xq.hi));
}
#endif
#endif
