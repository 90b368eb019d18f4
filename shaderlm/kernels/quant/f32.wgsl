// F32: a "block" is 8 plain floats.
const QK: u32 = 8u;
const QW: u32 = 8u;

fn dq8(blk: u32, j: u32) -> V8 {
    let o = blk * 8u;
    return V8(bitcast<vec4<f32>>(vec4<u32>(w[o], w[o + 1u], w[o + 2u], w[o + 3u])),
              bitcast<vec4<f32>>(vec4<u32>(w[o + 4u], w[o + 5u], w[o + 6u], w[o + 7u])));
}
