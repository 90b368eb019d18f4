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

// Dimension d in its pair: (pair index, the other dimension of the pair, 1 if d is the pair's first
// dimension); a dimension past rope_dim is not rotated and is its own partner (pair 0, first).
// Derived from pair_index, so both layouts come from one place.
fn dim_pair(d: u32) -> vec3<u32> {
    let dr = min(d, p.rope_dim - 1u);
#if NEOX
    let i = dr % (p.rope_dim / 2u);
#else
    let i = dr / 2u;
#endif
    let ix = pair_index(i);
    let first = dr == ix.x;
    return select(vec3<u32>(i, select(ix.x, ix.y, first), u32(first)), vec3<u32>(0u, d, 1u), d >= p.rope_dim);
}

// (cos, sin) of pair i at position pos; reduced in turns first so sin/cos see a small argument
fn rope_cs(i: u32, pos: u32) -> vec2<f32> { return rope_cs_f(inv_freq[i], pos); }
fn rope_cs_f(turns_per_pos: f32, pos: u32) -> vec2<f32> {
    let turns = f32(pos) * turns_per_pos;
    let a = (turns - floor(turns)) * 6.283185307179586;
    return vec2<f32>(cos(a), sin(a));
}
