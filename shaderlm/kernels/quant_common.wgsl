// Shared by the quant/*.wgsl decoders. The including kernel declares:
//   @binding(..) var<storage, read> w: array<u32>;   the weight words (one row-chunk of a tensor)
//   var<private> w_dbase: u32;                        first word of the split-off f16 scale array
// Each decoder defines QK (elements per block), QW (u32 words per block in the main region) and
//   fn dq8(blk: u32, j: u32) -> V8   elements [8j, 8j+8) of block `blk`, in GGUF element order.

struct V8 { a: vec4<f32>, b: vec4<f32> }

fn u8x4(v: u32) -> vec4<f32> {
    return vec4<f32>(f32(v & 255u), f32((v >> 8u) & 255u), f32((v >> 16u) & 255u), f32(v >> 24u));
}

fn i8x4(v: u32) -> vec4<f32> {
    return vec4<f32>(f32(bitcast<i32>(v << 24u) >> 24u), f32(bitcast<i32>(v << 16u) >> 24u),
                     f32(bitcast<i32>(v << 8u) >> 24u), f32(bitcast<i32>(v) >> 24u));
}

// Scale of block `blk` from the split f16 array (two halves per word).
fn split_d(blk: u32) -> f32 {
    return unpack2x16float(w[w_dbase + (blk >> 1u)])[blk & 1u];
}

// Byte `i` of the word stream starting at word `base`.
fn byte_at(base: u32, i: u32) -> u32 {
    return (w[base + (i >> 2u)] >> ((i & 3u) * 8u)) & 255u;
}

// Q4_K / Q5_K packed 6-bit scales and mins.
// ggml get_scale_min_k4 on the scale words a (bytes 0-3), b (4-7), c (8-11):
//   s < 4:  sc = byte s & 63,                       mn = byte s+4 & 63
//   s >= 4: sc = (byte s+4 & 15) | (byte s-4 >> 6) << 4,   mn = (byte s+4 >> 4) | (byte s >> 6) << 4
// Returns vec2(sc, mn).
fn k4_scale_min(a: u32, b: u32, c: u32, s: u32) -> vec2<u32> {
    let sh = (s & 3u) * 8u;
    let lo = vec2<u32>((a >> sh) & 63u, (b >> sh) & 63u);
    let hi = vec2<u32>(((c >> sh) & 15u) | ((a >> (sh + 2u)) & 0x30u),
                       ((c >> (sh + 4u)) & 15u) | ((b >> (sh + 2u)) & 0x30u));
    return select(hi, lo, s < 4u);
}
