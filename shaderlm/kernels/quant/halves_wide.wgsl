// WIDE part shared by F16 and BF16 (each defines half2(word) -> its two values): a wide block is 32
// values (4 vec4 words), one chunk, two x runs.
const WQK: u32 = 32u;
const CPB: u32 = 1u;
fn x_chunk(r: XRow, b: u32, c: u32) -> array<vec4<f32>, 8> { return x_runs2(r, b * 8u, b * 8u + 4u); }
fn dot8(q: vec4<u32>, x0: vec4<f32>, x1: vec4<f32>) -> f32 {
    return dot(vec4<f32>(half2(q.x), half2(q.y)), x0) + dot(vec4<f32>(half2(q.z), half2(q.w)), x1);
}
struct CW { a: vec4<u32>, b: vec4<u32>, c: vec4<u32>, d: vec4<u32> }
fn chunk_load(blk: u32, c: u32) -> CW { return CW(w[blk * 4u], w[blk * 4u + 1u], w[blk * 4u + 2u], w[blk * 4u + 3u]); }
fn chunk_dot(cw: CW, c: u32, xr: array<vec4<f32>, 8>) -> f32 {
    return dot8(cw.a, xr[0], xr[1]) + dot8(cw.b, xr[2], xr[3]) + dot8(cw.c, xr[4], xr[5]) + dot8(cw.d, xr[6], xr[7]);
}
