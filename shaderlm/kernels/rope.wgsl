// RoPE helpers. The including kernel has a uniform `p` with `rope_dim`, and binds
// inv_freq: rotations per position for each pair, in turns (divided by 2 pi).
// NEOX rotates pairs (i, i + rd/2), normal mode pairs (2i, 2i+1) - llama.cpp's two RoPE types.

fn pair_index(i: u32) -> vec2<u32> {
#if NEOX
    return vec2<u32>(i, i + p.rope_dim / 2u);
#else
    return vec2<u32>(2u * i, 2u * i + 1u);
#endif
}

// (cos, sin) of pair i at position pos; reduced in turns first so sin/cos see a small argument
fn rope_cs(i: u32, pos: u32) -> vec2<f32> {
    let turns = f32(pos) * inv_freq[i];
    let a = (turns - floor(turns)) * 6.283185307179586;
    return vec2<f32>(cos(a), sin(a));
}
