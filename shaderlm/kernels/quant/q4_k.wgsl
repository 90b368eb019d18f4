// Q4_K: 256 elements in 8 sub-blocks of 32; x = (d * sc[s]) * q - (dmin * mn[s]).
// GGUF block (144 B, word aligned): d, dmin (f16), scales[12], qs[128]. GPU words:
//   0..3: d, dmin and the 6-bit scales/mins, regrouped per sub-block pair (k4_pair, k4_dmin)
//   4..35: qs. Sub-blocks 2c and 2c+1 share qs[32c .. 32c+32) (words 4+8c .. 4+8c+8):
//   2c in the low nibbles, 2c+1 in the high nibbles.
const QK: u32 = 256u;
const QW: u32 = 36u;

// Elements [8j, 8j+8) of block blk as two words of bytes q (0..15).
fn q8w(blk: u32, j: u32) -> vec2<u32> {
    let wi = k4_run_word(blk, j);
    return k4_nibbles(words2(wi), j >> 2u);
}
// the first of the two words holding run j's nibbles
fn k4_run_word(blk: u32, j: u32) -> u32 { return blk * 36u + 4u + (j >> 3u) * 8u + (j & 3u) * 2u; }
// sub-block s's nibbles of its pair's words q (s even: the low ones)
fn k4_nibbles(q: vec2<u32>, s: u32) -> vec2<u32> { return (q >> vec2<u32>((s & 1u) * 4u)) & vec2<u32>(0x0F0F0F0Fu); }

fn dq8(blk: u32, j: u32) -> V8 { return k4_values(q8w(blk, j), k4_sub_scales(blk * 36u, j >> 2u)); }

#if W4
// Loads where w is vec4s (W4): run j's header and its two words of nibbles, a 16-byte load each (the
// GEMMs' rows are scattered across a warp, so each load instruction touches a line a row).
struct Raw8 { h: vec4<u32>, q: vec2<u32> }
fn raw8(blk: u32, j: u32) -> Raw8 {
    return Raw8(w[blk * 9u], words2(k4_run_word(blk, j)));
}
fn dq8_raw(r: Raw8, j: u32) -> V8 { return k4_values(k4_nibbles(r.q, j >> 2u), k4_scales(r.h, j >> 2u)); }
#endif

#if RAW32
// Sub-block s of block blk as iq8 gives it, in two steps: raw32 loads its words (three 16-byte loads: the
// header and the pair's 32 bytes), dq32 makes them bytes and (d, m).
struct Raw32 { h: vec4<u32>, a: vec4<u32>, b: vec4<u32> }
fn raw32(blk: u32, s: u32) -> Raw32 {
    let o = blk * 9u + 1u + (s >> 1u) * 2u;
    return Raw32(w[blk * 9u], w[o], w[o + 1u]);
}
fn dq32(r: Raw32, s: u32) -> IQ32 {
    let sm = k4_scales(r.h, s);
    let sh = vec4<u32>((s & 1u) * 4u);
    return IQ32((r.a >> sh) & vec4<u32>(0x0F0F0F0Fu), (r.b >> sh) & vec4<u32>(0x0F0F0F0Fu), vec2<f32>(sm.x),
                vec2<f32>(-sm.y));
}
#endif

fn iq8(blk: u32, j: u32) -> IQ8 {
#if W4
    let r = raw8(blk, j);
    let sm = k4_scales(r.h, j >> 2u);
    return IQ8(k4_nibbles(r.q, j >> 2u), sm.x, -sm.y);
#else
    let sm = k4_sub_scales(blk * 36u, j >> 2u);
    return IQ8(q8w(blk, j), sm.x, -sm.y);
#endif
}

#if WIDE
// Chunk c (0..7) = qs bytes [16c, 16c+16): l = 16 (c & 1) .. +16 of sub-blocks s0 = 2 (c >> 1)
// (low nibbles) and s0 + 1 (high nibbles); both sub-blocks' scales from the block's first vec4.
const WQK: u32 = QK;          // elements per wide block
const CPB: u32 = 8u;
fn x_chunk(r: XRow, b: u32, c: u32) -> array<vec4<f32>, 8> { return k4_x_chunk(r, b, c); }
struct CW { h: vec4<u32>, q: vec4<u32> }
fn chunk_load(blk: u32, c: u32) -> CW { return CW(w[blk * 9u], w[blk * 9u + 1u + c]); }
#if !INT_DOT
fn chunk_dot(cw: CW, c: u32, xr: array<vec4<f32>, 8>) -> f32 {
    let h = cw.h;
    let q = cw.q;
    let sc = k4_chunk_scales(h, c);
    let lo = dot_u8(nib(q, 0u), xr[0], xr[1], xr[2], xr[3]);
    let hi = dot_u8(nib(q, 4u), xr[4], xr[5], xr[6], xr[7]);
    let xa = hsum(xr[0] + xr[1] + xr[2] + xr[3]);
    let xb = hsum(xr[4] + xr[5] + xr[6] + xr[7]);
    return sc.x * lo + sc.y * hi - (sc.z * xa + sc.w * xb);
}
#else
fn x_quant(xr: array<vec4<f32>, 8>) -> XQ2 { return xq2(xr); }
fn chunk_dot(cw: CW, c: u32, xq: XQ2) -> f32 {
    let sc = k4_chunk_scales(cw.h, c);
    let lo = rdot(nib(cw.q, 0u), xq.lo);
    let hi = rdot(nib(cw.q, 4u), xq.hi);
    return sc.x * lo + sc.y * hi - (sc.z * xq.lo.s + sc.w * xq.hi.s);
}
#endif
#endif
