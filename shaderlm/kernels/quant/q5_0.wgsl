// Q5_0: 32 5-bit quants, x = d * (q - 16). GGUF block (22 B): d (f16), qh (u32), qs[16].
// Low 4 bits as Q4_0 (element e < 16: low nibble of qs[e], else high nibble of qs[e-16]);
// bit 4 of element e is bit e of qh. GPU: [qh, qs0..qs3] = 5 words; d split off.
const QK: u32 = 32u;
const QW: u32 = 5u;

#include quant/q5_bits

// Elements [8j, 8j+8) of block blk as two words of bytes q (0..31).
fn q8w(blk: u32, j: u32) -> vec2<u32> {
    let o = blk * 5u;
    let qh = word(o) >> (j * 8u);
    let wi = o + 1u + (j & 1u) * 2u;
    let sh = (j >> 1u) * 4u;
    return vec2<u32>(((word(wi) >> sh) & 0x0F0F0F0Fu) | q5_hbits(qh & 15u),
                     ((word(wi + 1u) >> sh) & 0x0F0F0F0Fu) | q5_hbits((qh >> 4u) & 15u));
}

fn dq8(blk: u32, j: u32) -> V8 {
    let d = split_d(blk);
    let q = q8w(blk, j);
    return V8((u8x4(q.x) - 16.0) * d, (u8x4(q.y) - 16.0) * d);
}

fn iq8(blk: u32, j: u32) -> IQ8 {
    let d = split_d(blk);
    return IQ8(signed_bytes(q8w(blk, j), 16u), d, 0.0);
}

#if WIDE
const WQK: u32 = QK;          // elements per wide block
const CPB: u32 = 1u;
fn x_chunk(r: XRow, b: u32, c: u32) -> array<vec4<f32>, 8> { return x_runs2(r, b * 8u, b * 8u + 4u); }
// A block's 5 words (from word 5 blk) start at word s = blk & 3 of a vec4 and end in the next: both vec4s
// are loaded, and the shifting left to chunk_dot so that a lane's loads of all its rows go out together.
// ds: d's f16 bits with s above them (s needs no field of its own).
struct CW { a: vec4<u32>, b: vec4<u32>, ds: u32 }
fn chunk_load(blk: u32, c: u32) -> CW {
    let o = (blk * 5u) >> 2u;
    let v = word(p.dbase + (blk >> 1u));
    return CW(w[o], w[o + 1u], (select(v, v >> 16u, (blk & 1u) == 1u) & 0xFFFFu) | ((blk & 3u) << 16u));
}
fn chunk_dot(cw: CW, c: u32, xr: array<vec4<f32>, 8>) -> f32 {
    // the 8 loaded words shifted by s: by 2, then by 1 (selects: no dynamically indexed vector)
    let s = cw.ds >> 16u;
    let t = select(cw.a, vec4<u32>(cw.a.zw, cw.b.xy), s >= 2u);
    let u = select(cw.b.xy, cw.b.zw, s >= 2u);
    let odd = (s & 1u) == 1u;
    let qh = select(t.x, t.y, odd);
    let q = select(vec4<u32>(t.yzw, u.x), vec4<u32>(t.zw, u), odd);
    let sq = q5_dot(q, qh, xr);
    let xs = hsum(xr[0] + xr[1] + xr[2] + xr[3] + xr[4] + xr[5] + xr[6] + xr[7]);
    return unpack2x16float(cw.ds).x * (sq - 16.0 * xs);      // the low half: d
}
#endif
