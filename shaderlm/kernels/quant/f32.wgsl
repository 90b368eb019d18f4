// F32: a "block" is 8 plain floats.
const QK: u32 = 8u;
const QW: u32 = 8u;

fn dq8(blk: u32, j: u32) -> V8 {
    let o = blk * 8u;
    return V8(bitcast<vec4<f32>>(vec4<u32>(word(o), word(o + 1u), word(o + 2u), word(o + 3u))),
              bitcast<vec4<f32>>(vec4<u32>(word(o + 4u), word(o + 5u), word(o + 6u), word(o + 7u))));
}
