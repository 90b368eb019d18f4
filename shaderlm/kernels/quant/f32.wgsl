// F32: a "block" is 8 plain floats.
const QK: u32 = 8u;
const QW: u32 = 8u;

fn dq8(blk: u32, j: u32) -> V8 {
    let o = blk * 8u;
    return V8(bitcast<vec4<f32>>(vec4<u32>(word(o), word(o + 1u), word(o + 2u), word(o + 3u))),
              bitcast<vec4<f32>>(vec4<u32>(word(o + 4u), word(o + 5u), word(o + 6u), word(o + 7u))));
}

#if WIDE
// A wide block is 32 floats (8 vec4 words, w[8b .. 8b + 7]), one chunk: x's vec4s 8b .. 8b + 7 in two runs.
const WQK: u32 = 32u;
const CPB: u32 = 1u;
fn x_chunk(r: XRow, b: u32, c: u32) -> array<vec4<f32>, 8> { return x_runs2(r, b * 8u, b * 8u + 4u); }
struct CW { q0: vec4<u32>, q1: vec4<u32>, q2: vec4<u32>, q3: vec4<u32>,
            q4: vec4<u32>, q5: vec4<u32>, q6: vec4<u32>, q7: vec4<u32> }
fn chunk_load(blk: u32, c: u32) -> CW {
    let o = blk * 8u;
    return CW(w[o], w[o + 1u], w[o + 2u], w[o + 3u], w[o + 4u], w[o + 5u], w[o + 6u], w[o + 7u]);
}
fn fdot(q: vec4<u32>, x: vec4<f32>) -> f32 { return dot(bitcast<vec4<f32>>(q), x); }
fn chunk_dot(cw: CW, c: u32, xr: array<vec4<f32>, 8>) -> f32 {
    return fdot(cw.q0, xr[0]) + fdot(cw.q1, xr[1]) + fdot(cw.q2, xr[2]) + fdot(cw.q3, xr[3])
         + fdot(cw.q4, xr[4]) + fdot(cw.q5, xr[5]) + fdot(cw.q6, xr[6]) + fdot(cw.q7, xr[7]);
}
#endif
