// Activations for the 8-bit prefill GEMM (matmul_q8.wgsl): each run of a token's row of x (16 elements,
// or 32 with RUN32) becomes int8 values q = round(127 x / max|x|), its scale d = max|x| / 127, and each
// 16 elements' d * sum(q) (for the weights' offset terms). A thread per 32-element block (4 words a
// half; q8_block.wgsl's arithmetic); with RUN32 both halves get the block's scale.
// TOKEN (for the tensor-core GEMM, matmul_tc.wgsl): instead, each token's whole row on one 16-bit grid
// (tc_digits.wgsl), hi digits in plane 0 and lo in plane 1, and the token's grid step max|x| / LIM.
// A workgroup a token: one pass for the max, one to round.
// Fused inputs (a dispatch fewer before the GEMM): NORM, x RMS-normed by the weight nw first (for the
// int8 blocks, its squares summed block by block, so its 1 / rms may differ from rmsnorm.wgsl's in the
// last bit; for TOKEN, with rmsnorm.wgsl's arithmetic, every workgroup summing its token's whole row);
// GLU, x the gated activation of gu's [gate | up] rows (glu.wgsl's, the same values), k the FFN width.
#include state
#if REDUCE
#include reduce
#endif
#if GLU
#include activation
#endif

struct P { k: u32, first_from_state: u32, rows_per_token: u32, plane: u32 }   // rows_per_token: 0 reads as 1;
// plane: TOKEN's words a digit plane
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;          // GLU: [gate | up] rows
#if TOKEN
@group(0) @binding(3) var<storage, read_write> xq: array<u32>;           // [digit][token][k / 4]
@group(0) @binding(4) var<storage, read_write> xd: array<f32>;           // [token]
#else
@group(0) @binding(3) var<storage, read_write> xq: array<vec4<u32>>;     // [token][block][2]
@group(0) @binding(4) var<storage, read_write> xd: array<vec2<f32>>;     // [token][block]: per half
@group(0) @binding(5) var<storage, read_write> xs: array<vec2<f32>>;     // [token][block]
#endif
#if NORM
@group(0) @binding(6) var<storage, read> nw: array<vec4<f32>>;
struct N { eps: f32, _a: u32, _b: u32, _c: u32 }
@group(0) @binding(7) var<uniform> pn: N;
#endif

// x's vec4 i of token t's row (the block's value before rounding)
fn xin(t: u32, i: u32, r: f32) -> vec4<f32> {
#if GLU
    let g = x[t * 2u * p.k / 4u + i];
    let u = x[t * 2u * p.k / 4u + p.k / 4u + i];
    return vec4<f32>(glu_act(g.x, u.x), glu_act(g.y, u.y), glu_act(g.z, u.z), glu_act(g.w, u.w));
#else
#if NORM
    return x[t * p.k / 4u + i] * r * nw[i];
#else
    return x[t * p.k / 4u + i];
#endif
#endif
}

// the token's 1 / rms (NORM; rmsnorm.wgsl's sum of squares: lane li takes elements li, li + WG, ..)
fn row_norm(t: u32, li: u32) -> f32 {
#if NORM
    var ss = 0.0;
    for (var i = li; i < p.k; i += {{WG}}u) { let v = x[(t * p.k + i) / 4u][i % 4u]; ss += v * v; }
    return inverseSqrt(wg_sum(ss) / f32(p.k) + pn.eps);
#else
    return 1.0;
#endif
}

#if TOKEN
#include tc_digits

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let first = select(0u, st.out_row0, p.first_from_state != 0u);
    let t = wid.y;
    if (t >= st.n - first) { return; }      // the whole workgroup
    red_lane = li;
    let r = row_norm(t, li);
    var m = 0.0;
    for (var i = li; i < p.k / 4u; i += {{WG}}u) {
        let a = abs(xin(t, i, r));
        m = max(m, max(max(a.x, a.y), max(a.z, a.w)));
    }
    m = wg_max(m);
    let inv = select(LIM / m, 0.0, m == 0.0);
    for (var i = li; i < p.k / 4u; i += {{WG}}u) {
        let d = digits(xin(t, i, r), inv);
        xq[t * p.k / 4u + i] = d.x;
        xq[p.plane + t * p.k / 4u + i] = d.y;
    }
    if (li == 0u) { xd[t] = m / LIM; }
}
#else
#include q8_block

#if NORM
// NORM: a workgroup a token's row, a thread BPT of its blocks (li, li + WG, ..): their values and norm
// weights loaded once, the squares summed from them (a thread's blocks, then the workgroup's tree),
// then scaled and rounded from registers: one pass over x, its loads all issued before the reduction.
@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let first = select(0u, st.out_row0, p.first_from_state != 0u);
    let nb = p.k / 32u;
    let t = wid.y;
    if (t >= st.n - first) { return; }      // the whole workgroup
    red_lane = li;
    var ss = 0.0;
#unroll BPT b
    let blk$b = min(li + $bu * {{WG}}u, nb - 1u);
    var v$b: array<vec4<f32>, 8>;
    var w$b: array<vec4<f32>, 8>;
    var s$b = 0.0;
    for (var i = 0u; i < 8u; i++) {
        v$b[i] = x[t * p.k / 4u + blk$b * 8u + i];
        w$b[i] = nw[blk$b * 8u + i];
        s$b += dot(v$b[i], v$b[i]);
    }
    ss += select(0.0, s$b, li + $bu * {{WG}}u < nb);
#end
    let r = inverseSqrt(wg_sum(ss) / f32(p.k) + pn.eps);
#unroll BPT b
    if (li + $bu * {{WG}}u < nb) {
        for (var i = 0u; i < 8u; i++) {
            v$b[i] = v$b[i] * r * w$b[i];
        }
        round_block(t * nb + blk$b, v$b);
    }
#end
}
#else
@compute @workgroup_size({{WG}})
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let first = select(0u, st.out_row0, p.first_from_state != 0u);
    let nb = p.k / 32u;
    let t = wid.y;
    if (t >= (st.n - first) * max(p.rows_per_token, 1u)) { return; }      // the whole workgroup
    if (gid.x >= nb) { return; }
    var v: array<vec4<f32>, 8>;
    for (var i = 0u; i < 8u; i++) {
        v[i] = xin(t, gid.x * 8u + i, 1.0);
    }
    round_block(t * nb + gid.x, v);
}
#endif
#endif
