// BF16: a "block" is 8 bfloat16 (4 words, element 2i in the low half); bf16 -> f32 is a 16-bit
// shift, exact. j is always 0 (QK / 8 == 1).
const QK: u32 = 8u;
const QW: u32 = 4u;

fn bf16x2(v: u32) -> vec2<f32> {
    return bitcast<vec2<f32>>(vec2<u32>(v << 16u, v & 0xFFFF0000u));
}

fn dq8(blk: u32, j: u32) -> V8 {
    let o = blk * 4u;
    return V8(vec4<f32>(bf16x2(word(o)), bf16x2(word(o + 1u))),
              vec4<f32>(bf16x2(word(o + 2u)), bf16x2(word(o + 3u))));
}

#if WIDE
// A wide block is 32 values (4 vec4 words), one chunk, two x runs.
const WQK: u32 = 32u;
const CE: u32 = 32u;
const CPB: u32 = 1u;
fn x_chunk(r: XRow, b: u32, c: u32) -> array<vec4<f32>, 8> { return x_runs2(r, b * 8u, b * 8u + 4u); }
fn dot8(q: vec4<u32>, x0: vec4<f32>, x1: vec4<f32>) -> f32 {
    return dot(vec4<f32>(bf16x2(q.x), bf16x2(q.y)), x0) + dot(vec4<f32>(bf16x2(q.z), bf16x2(q.w)), x1);
}
struct CW { a: vec4<u32>, b: vec4<u32>, c: vec4<u32>, d: vec4<u32> }
fn chunk_load(blk: u32, c: u32) -> CW { return CW(w[blk * 4u], w[blk * 4u + 1u], w[blk * 4u + 2u], w[blk * 4u + 3u]); }
fn chunk_dot(cw: CW, c: u32, xr: array<vec4<f32>, 8>) -> f32 {
    return dot8(cw.a, xr[0], xr[1]) + dot8(cw.b, xr[2], xr[3]) + dot8(cw.c, xr[4], xr[5]) + dot8(cw.d, xr[6], xr[7]);
}
#endif
