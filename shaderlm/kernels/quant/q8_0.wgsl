// Q8_0: 32 int8 quants * d. GGUF block: d (f16), qs[32]. GPU: qs as 8 words; d split off.
const QK: u32 = 32u;
const QW: u32 = 8u;

// the first of elements [8j, 8j+8)'s two words (even: half a 16-byte load)
fn q8_0_word(blk: u32, j: u32) -> u32 { return blk * 8u + j * 2u; }
fn q8_0_values(q: vec2<u32>, d: f32) -> V8 { return V8(i8x4(q.x) * d, i8x4(q.y) * d); }
fn dq8(blk: u32, j: u32) -> V8 { return q8_0_values(words2(q8_0_word(blk, j)), split_d(blk)); }

fn iq8(blk: u32, j: u32) -> IQ8 { return IQ8(words2(q8_0_word(blk, j)), split_d(blk), 0.0); }

#if W4
// Loads where w is vec4s (W4; the tensor-core GEMM): elements [8j, 8j+8)'s two words, half a 16-byte
// load (two groups share it), and the block's scale.
struct Raw8 { q: vec2<u32>, d: f32 }
fn raw8(blk: u32, j: u32) -> Raw8 { return Raw8(words2(q8_0_word(blk, j)), split_d(blk)); }
fn dq8_raw(r: Raw8, j: u32) -> V8 { return q8_0_values(r.q, r.d); }
#endif

#if WIDE
const WQK: u32 = QK;          // elements per wide block
const CPB: u32 = 1u;
fn x_chunk(r: XRow, b: u32, c: u32) -> array<vec4<f32>, 8> { return x_runs2(r, b * 8u, b * 8u + 4u); }
struct CW { a: vec4<u32>, b: vec4<u32>, d: f32 }
fn chunk_load(blk: u32, c: u32) -> CW { return CW(w[blk * 2u], w[blk * 2u + 1u], split_d(blk)); }
#if !INT_DOT
fn chunk_dot(cw: CW, c: u32, xr: array<vec4<f32>, 8>) -> f32 {
    let a = cw.a;
    let b = cw.b;
    let s = dot(i8x4(a.x), xr[0]) + dot(i8x4(a.y), xr[1]) + dot(i8x4(a.z), xr[2]) + dot(i8x4(a.w), xr[3])
          + dot(i8x4(b.x), xr[4]) + dot(i8x4(b.y), xr[5]) + dot(i8x4(b.z), xr[6]) + dot(i8x4(b.w), xr[7]);
    return cw.d * s;
}
#else
fn x_quant(xr: array<vec4<f32>, 8>) -> XQ2 { return xq2(xr); }
fn chunk_dot(cw: CW, c: u32, xq: XQ2) -> f32 {
    return cw.d * (rdot(cw.a, xq.lo) + rdot(cw.b, xq.hi));
}
#endif
#endif
