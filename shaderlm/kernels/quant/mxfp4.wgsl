// MXFP4: 32 FP4 (e2m1) values times a power of two, x = 2^(e - 128) * kv[q] with kv the e2m1 values
// doubled (0 1 2 3 4 6 8 12, bit 3 the sign) and e an E8M0 byte. GGUF block (17 B): e, qs[16];
// elements 0-15 are the low nibbles of qs[0..15], 16-31 the high nibbles (as Q4_0). GPU: qs as 4
// words; the e bytes split off (4 a word). The table as bytes, 4 a word: KV0..KV3.
const QK: u32 = 32u;
const QW: u32 = 4u;
const KV0: u32 = 0x03020100u;
const KV1: u32 = 0x0C080604u;
const KV2: u32 = 0xFDFEFF00u;
const KV3: u32 = 0xF4F8FAFCu;

#include quant/table4

// 2^(e - 128) of block blk as f32 bits: exponent field e - 1, or for e < 2 the subnormals 2^-128 and
// 2^-127 (which a GPU may flush to zero; no real weights come near them).
fn mx_d(blk: u32) -> f32 {
    let e = (word(p.dbase + (blk >> 2u)) >> ((blk & 3u) * 8u)) & 255u;
    return bitcast<f32>(select(0x00200000u << e, (e - 1u) << 23u, e >= 2u));
}

// Elements [8j, 8j+8) of block blk as two words of indices (0..15).
fn q8w(blk: u32, j: u32) -> vec2<u32> {
    let wi = blk * 4u + (j & 1u) * 2u;
    let sh = (j >> 1u) * 4u;
    return vec2<u32>((word(wi) >> sh) & 0x0F0F0F0Fu, (word(wi + 1u) >> sh) & 0x0F0F0F0Fu);
}

fn dq8(blk: u32, j: u32) -> V8 {
    let d = mx_d(blk);
    let q = q8w(blk, j);
    return V8(i8x4(kv_bytes(q.x)) * d, i8x4(kv_bytes(q.y)) * d);
}

// The doubled e2m1 values as signed bytes, d = 2^(e - 128).
fn iq8(blk: u32, j: u32) -> IQ8 {
    let q = q8w(blk, j);
    return IQ8(vec2<u32>(kv_bytes(q.x), kv_bytes(q.y)), mx_d(blk), 0.0);
}

#if WIDE
const WQK: u32 = QK;          // elements per wide block
const CPB: u32 = 1u;
fn x_chunk(r: XRow, b: u32, c: u32) -> array<vec4<f32>, 8> { return x_runs2(r, b * 8u, b * 8u + 4u); }
struct CW { q: vec4<u32>, d: f32 }
fn chunk_load(blk: u32, c: u32) -> CW { return CW(w[blk], mx_d(blk)); }
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
