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
fn half2(v: u32) -> vec2<f32> { return bf16x2(v); }
#include quant/halves_wide
#endif
