// The decode GEMV's chunks of a 256-element super-block as Q6_K, Q3_K and Q2_K take them: chunk c
// (0..3) is half c >> 1, quarter c & 1 of it, and its x is 4 runs of 4 vec4s, 32 elements apart.
const WQK: u32 = QK;          // elements per wide block
const CPB: u32 = 4u;
fn x_chunk(r: XRow, b: u32, c: u32) -> array<vec4<f32>, 16> {
    let o = b * 64u + (c >> 1u) * 32u + (c & 1u) * 4u;
    return x_runs4(r, o, o + 8u, o + 16u, o + 24u);
}
