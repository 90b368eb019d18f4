// Activations for the 8-bit prefill GEMM (matmul_q8.wgsl): each run of a token's row of x (16 elements,
// or 32 with RUN32) becomes int8 values q = round(127 x / max|x|), its scale d = max|x| / 127, and each
// 16 elements' d * sum(q) (for the weights' offset terms). A thread per 32-element block (4 words a
// half); with RUN32 both halves get the block's scale.
#include state

struct P { k: u32, first_from_state: u32, rows_per_token: u32, _b: u32 }   // rows_per_token: 0 reads as 1
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> xq: array<vec4<u32>>;     // [token][block][2]
@group(0) @binding(4) var<storage, read_write> xd: array<vec2<f32>>;     // [token][block]: per half
@group(0) @binding(5) var<storage, read_write> xs: array<vec2<f32>>;     // [token][block]

const ONES: u32 = 0x01010101u;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let first = select(0u, st.out_row0, p.first_from_state != 0u);
    let nb = p.k / 32u;
    let t = gid.y;
    if (gid.x >= nb || t >= (st.n - first) * max(p.rows_per_token, 1u)) { return; }
    let b = t * nb + gid.x;
    let o = b * 8u;
    var v: array<vec4<f32>, 8>;
    var m0 = vec4<f32>(0.0);
    var m1 = vec4<f32>(0.0);
    for (var i = 0u; i < 4u; i++) {
        v[i] = x[o + i];
        v[i + 4u] = x[o + i + 4u];
        m0 = max(m0, abs(v[i]));
        m1 = max(m1, abs(v[i + 4u]));
    }
    var a0 = max(max(m0.x, m0.y), max(m0.z, m0.w));
    var a1 = max(max(m1.x, m1.y), max(m1.z, m1.w));
#if RUN32
    a0 = max(a0, a1);
    a1 = a0;
#endif
    let inv0 = select(1.0 / a0, 0.0, a0 == 0.0);
    let inv1 = select(1.0 / a1, 0.0, a1 == 0.0);
    var q: array<u32, 8>;
    for (var i = 0u; i < 4u; i++) {       // round(127 * x / max|x|)
        q[i] = pack4x8snorm(v[i] * inv0);
        q[i + 4u] = pack4x8snorm(v[i + 4u] * inv1);
    }
    let d = vec2<f32>(a0, a1) / 127.0;
    let lo = dot4I8Packed(q[0], ONES) + dot4I8Packed(q[1], ONES) + dot4I8Packed(q[2], ONES) + dot4I8Packed(q[3], ONES);
    let hi = dot4I8Packed(q[4], ONES) + dot4I8Packed(q[5], ONES) + dot4I8Packed(q[6], ONES) + dot4I8Packed(q[7], ONES);
    xq[b * 2u] = vec4<u32>(q[0], q[1], q[2], q[3]);
    xq[b * 2u + 1u] = vec4<u32>(q[4], q[5], q[6], q[7]);
    xd[b] = d;
    xs[b] = d * vec2<f32>(f32(lo), f32(hi));
}
