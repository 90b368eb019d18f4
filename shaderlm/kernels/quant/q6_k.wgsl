// Q6_K: 256 6-bit quants, x = (d * sc[e / 16]) * (q - 32), sc int8.
// GGUF block (210 B): ql[128], qh[64], scales[16] (int8), d (f16) at byte 208. GPU: the first
// 208 bytes = 52 words (ql 0..31, qh 32..47, scales 48..51); d split off.
// Element order: two halves h (128 elements each, ql[64h..], qh[32h..]); within a half, group
// g4 = 0..3 of 32 elements, l = 0..31:
//   low 4 bits:  g4 0: ql[l] & 15, 1: ql[l+32] & 15, 2: ql[l] >> 4, 3: ql[l+32] >> 4
//   high 2 bits: (qh[l] >> 2*g4) & 3
const QK: u32 = 256u;
const QW: u32 = 52u;

// Elements [8j, 8j+8) of block blk as two words of bytes q (0..63).
fn q8w(blk: u32, j: u32) -> vec2<u32> {
    let lw = k6_low_word(blk, j);
    let hw = k6_high_word(blk, j);
    return k6_bytes(words2(lw), words2(hw), j);
}
// the first of the two words holding elements [8j, 8j+8)'s low 4 bits (even: half a 16-byte load)
fn k6_low_word(blk: u32, j: u32) -> u32 {
    let g = j >> 2u;                 // 32-element group 0..7 (half g >> 2)
    return blk * 52u + (g >> 2u) * 16u + (g & 1u) * 8u + (j & 3u) * 2u;
}
// ... their high 2 bits, and their scale
fn k6_high_word(blk: u32, j: u32) -> u32 { return blk * 52u + 32u + (j >> 4u) * 8u + (j & 3u) * 2u; }
fn k6_scale_word(blk: u32, j: u32) -> u32 { return blk * 52u + 48u + (j >> 3u); }
// elements [8j, 8j+8) as bytes from the words of their low bits l and high bits h
fn k6_bytes(l: vec2<u32>, h: vec2<u32>, j: u32) -> vec2<u32> {
    let g = j >> 2u;
    return ((l >> vec2<u32>((g & 2u) * 2u)) & vec2<u32>(0x0F0F0F0Fu))
         | (((h >> vec2<u32>((g & 3u) * 2u)) & vec2<u32>(0x03030303u)) << vec2<u32>(4u));
}

// d times the int8 scale of elements [8j, 8j+8) (one per 16 elements), from the scale word sw holding it
fn k6_scale(d: f32, sw: u32, j: u32) -> f32 {
    return d * f32(bitcast<i32>(sw << (24u - ((j >> 1u) & 3u) * 8u)) >> 24u);
}
fn k6_d(blk: u32, j: u32) -> f32 { return k6_scale(split_d(blk), word(k6_scale_word(blk, j)), j); }

fn k6_values(q: vec2<u32>, dl: f32) -> V8 { return V8((u8x4(q.x) - 32.0) * dl, (u8x4(q.y) - 32.0) * dl); }
fn dq8(blk: u32, j: u32) -> V8 { return k6_values(q8w(blk, j), k6_d(blk, j)); }

#if W4
// Loads where w is vec4s (W4, the tensor-core GEMM): the words of elements [8j, 8j+8)'s low and high bits,
// each half a 16-byte load, and their scale word from the block's last vec4 (a warp spans rows there, so
// each load touches a line a row).
struct Raw8 { l: vec2<u32>, h: vec2<u32>, sw: u32, d: f32 }
fn raw8(blk: u32, j: u32) -> Raw8 {
    return Raw8(words2(k6_low_word(blk, j)), words2(k6_high_word(blk, j)), word(k6_scale_word(blk, j)), split_d(blk));
}
fn dq8_raw(r: Raw8, j: u32) -> V8 { return k6_values(k6_bytes(r.l, r.h, j), k6_scale(r.d, r.sw, j)); }
#endif

// For the integer dots (the int8 GEMMs, the GEMVs with int8 x): elements as signed bytes 4 (q - 32), their
// scale over 4 (exact), so a run's dot needs no offset term. A byte holds q in its top six bits with the
// top bit flipped (4 q - 128): the low 4 bits of words l (at bit lsh) to bits 2..5, the high 2 bits of
// words h (at bit hsh) to bits 6..7; a few operations a word where q - 32 from k6_bytes takes seven.
fn k6_signed4(l: vec4<u32>, lsh: u32, h: vec4<u32>, hsh: u32) -> vec4<u32> {
    return (((l >> vec4<u32>(lsh)) << vec4<u32>(2u)) & vec4<u32>(0x3C3C3C3Cu))
         | (((h << vec4<u32>(6u - hsh)) & vec4<u32>(0xC0C0C0C0u)) ^ vec4<u32>(0x80808080u));
}
#if RAW32
// Run g (0..7, 32 elements) of block blk as iq8 gives it, in two steps: raw32 loads its words (16-byte loads:
// its low bits' 32 bytes, its high bits' 32, the scales' vec4) and d, dq32 makes them bytes and scales.
struct Raw32 { la: vec4<u32>, lb: vec4<u32>, ha: vec4<u32>, hb: vec4<u32>, sc: vec4<u32>, d: f32 }
fn raw32(blk: u32, g: u32) -> Raw32 {
    let lo = blk * 13u + (g >> 2u) * 4u + (g & 1u) * 2u;
    let hi = blk * 13u + 8u + (g >> 2u) * 2u;
    return Raw32(w[lo], w[lo + 1u], w[hi], w[hi + 1u], w[blk * 13u + 12u], split_d(blk));
}
fn dq32(r: Raw32, g: u32) -> IQ32 {
    let sw = word_of(r.sc, g >> 1u);
    let j = 4u * g;
    let lsh = (g & 2u) * 2u;
    let hsh = (g & 3u) * 2u;
    return IQ32(k6_signed4(r.la, lsh, r.ha, hsh), k6_signed4(r.lb, lsh, r.hb, hsh),
                0.25 * vec2<f32>(k6_scale(r.d, sw, j), k6_scale(r.d, sw, j + 2u)), vec2<f32>(0.0));
}
#endif

fn iq8(blk: u32, j: u32) -> IQ8 {
    let l = words2(k6_low_word(blk, j));
    let h = words2(k6_high_word(blk, j));
    let g = j >> 2u;
    let q = k6_signed4(vec4<u32>(l, l), (g & 2u) * 2u, vec4<u32>(h, h), (g & 3u) * 2u).xy;
    return IQ8(q, 0.25 * k6_d(blk, j), 0.0);
}

#if WIDE
// Chunk c (0..3): half hh = c >> 1, l = 16m .. 16m + 16 with m = c & 1: ql[64hh + l] (vec4 4hh + m),
// ql[64hh + 32 + l] (4hh + 2 + m), qh[32hh + l] (8 + 2hh + m); x runs r = 0..3 at 128hh + 16m + 32r,
// scale bytes 8hh + m + 2r: byte m + 2 (r & 1) of scale word 2hh + (r >> 1) (vec4 12).
#include quant/runs4
fn i8_at(v: u32, byte: u32) -> f32 { return f32(bitcast<i32>(v << (24u - byte * 8u)) >> 24u); }
struct CW { la: vec4<u32>, lb: vec4<u32>, qh: vec4<u32>, sc: vec4<u32>, d: f32 }
fn chunk_load(blk: u32, c: u32) -> CW {
    let o = blk * 13u + (c >> 1u) * 4u + (c & 1u);
    return CW(w[o], w[o + 2u], w[blk * 13u + 8u + (c >> 1u) * 2u + (c & 1u)], w[blk * 13u + 12u], split_d(blk));
}
// Chunk c's four run dots t (runs 0..3, each over q - 32) times their int8 scales, times d.
fn k6_scaled(cw: CW, c: u32, t: vec4<f32>) -> f32 {
    let hh = c >> 1u;
    let m = c & 1u;
    let s01 = select(cw.sc.x, cw.sc.z, hh == 1u);
    let s23 = select(cw.sc.y, cw.sc.w, hh == 1u);
    return cw.d * (i8_at(s01, m) * t.x + i8_at(s01, m + 2u) * t.y + i8_at(s23, m) * t.z + i8_at(s23, m + 2u) * t.w);
}
const K6H: u32 = 0x03030303u;      // the 2 high bits' mask in qh's bytes
#if !INT_DOT
fn chunk_dot(cw: CW, c: u32, xr: array<vec4<f32>, 16>) -> f32 {
    let t0 = dot_u8(nib_hi(cw.la, 0u, cw.qh, 0u, K6H), xr[0], xr[1], xr[2], xr[3]) - 32.0 * hsum(xr[0] + xr[1] + xr[2] + xr[3]);
    let t1 = dot_u8(nib_hi(cw.lb, 0u, cw.qh, 2u, K6H), xr[4], xr[5], xr[6], xr[7]) - 32.0 * hsum(xr[4] + xr[5] + xr[6] + xr[7]);
    let t2 = dot_u8(nib_hi(cw.la, 4u, cw.qh, 4u, K6H), xr[8], xr[9], xr[10], xr[11]) - 32.0 * hsum(xr[8] + xr[9] + xr[10] + xr[11]);
    let t3 = dot_u8(nib_hi(cw.lb, 4u, cw.qh, 6u, K6H), xr[12], xr[13], xr[14], xr[15]) - 32.0 * hsum(xr[12] + xr[13] + xr[14] + xr[15]);
    return k6_scaled(cw, c, vec4<f32>(t0, t1, t2, t3));
}
#else
fn x_quant(xr: array<vec4<f32>, 16>) -> XQ4 { return xq4(xr); }
#if X24
fn chunk_dot(cw: CW, c: u32, xq: XQ4) -> f32 {
    let t0 = rdot(nib_hi(cw.la, 0u, cw.qh, 0u, K6H), xq.r0) - 32.0 * xq.r0.s;
    let t1 = rdot(nib_hi(cw.lb, 0u, cw.qh, 2u, K6H), xq.r1) - 32.0 * xq.r1.s;
    let t2 = rdot(nib_hi(cw.la, 4u, cw.qh, 4u, K6H), xq.r2) - 32.0 * xq.r2.s;
    let t3 = rdot(nib_hi(cw.lb, 4u, cw.qh, 6u, K6H), xq.r3) - 32.0 * xq.r3.s;
    return k6_scaled(cw, c, vec4<f32>(t0, t1, t2, t3));
}
#else
// int8 x: the weights as k6_signed4's bytes, the 4 in d. X24's digits would outgrow f32 with them.
fn chunk_dot(cw: CW, c: u32, xq: XQ4) -> f32 {
    let t0 = rdot(k6_signed4(cw.la, 0u, cw.qh, 0u), xq.r0);
    let t1 = rdot(k6_signed4(cw.lb, 0u, cw.qh, 2u), xq.r1);
    let t2 = rdot(k6_signed4(cw.la, 4u, cw.qh, 4u), xq.r2);
    let t3 = rdot(k6_signed4(cw.lb, 4u, cw.qh, 6u), xq.r3);
    return k6_scaled(CW(cw.la, cw.lb, cw.qh, cw.sc, 0.25 * cw.d), c, vec4<f32>(t0, t1, t2, t3));
}
#endif
#endif
#endif
