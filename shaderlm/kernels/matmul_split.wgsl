// The end of a GEMM split over K (matmul_q8.wgsl with PARTIALS): y[t, row0 + row] (+)= the SPLIT
// slices' partial sums of (t, row), added in slice order (so a token's result does not depend on how
// the work was spread), with the usual epilogue (bias, accumulate). A thread an output.
#include state
#include epilogue

struct P { rows: u32, row0: u32, y_stride: u32, part_tokens: u32, first_from_state: u32, _a: u32, _b: u32, _c: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> part: array<f32>;
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
#if BIAS
@group(0) @binding(7) var<storage, read> bias: array<f32>;
#endif

const SPLIT: u32 = {{SPLIT}}u;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let first = select(0u, st.out_row0, p.first_from_state != 0u);
    let row = gid.x;
    let t = gid.y;
    if (row >= p.rows || t >= st.n - first) { return; }
    var s = 0.0;
    for (var z = 0u; z < SPLIT; z++) {
        s += part[(z * p.part_tokens + t) * p.rows + row];
    }
    let yr = p.row0 + row;
    write_y(t * p.y_stride + yr, yr, s);
}
