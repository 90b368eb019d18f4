// F16: a "block" is 8 plain halves (4 words, two per word, element 2i in the low half).
// unpack2x16float needs no shader-f16 feature. j is always 0 (QK / 8 == 1).
const QK: u32 = 8u;
const QW: u32 = 4u;

fn dq8(blk: u32, j: u32) -> V8 {
    let o = blk * 4u;
    return V8(vec4<f32>(unpack2x16float(word(o)), unpack2x16float(word(o + 1u))),
              vec4<f32>(unpack2x16float(word(o + 2u)), unpack2x16float(word(o + 3u))));
}

#if WIDE
fn half2(v: u32) -> vec2<f32> { return unpack2x16float(v); }
#include quant/halves_wide
#endif
