// Decode GEMV: y[t, row] (+)= sum_k W[row, k] * x[t, k] for ROWS rows per workgroup, token t = z.
// (Decode runs one token; a few tokens on one grid are for tests and tools: the grid has exactly
// the batch's tokens, so the kernel reads no token count.)
// Each thread takes one chunk (CE elements, one or a few 16-byte loads) of the rows' K at a time,
// strided by the workgroup, so every lane is busy whatever the chunk count (the workgroup size is
// picked per matrix in ops.py). The chunk's x runs are loaded once into registers and reused for all
// ROWS rows, whose independent weight loads are then in flight together. Partial sums: subgroup
// reductions, then one workgroup-memory pass over the subgroups (any subgroup size).
// Fused variants, as matmul.wgsl: NORM (RMSNorm of x: the dots use x * w and are scaled by the
// norm's 1/rms at the end; the sum of squares comes from the same x loads, since the workgroup's
// chunks cover the row exactly once, and rides along the partial-sum reduction, so the norm adds no
// step to the kernel), GLU (virtual row r = act(gate row r . x) * (up row rows + r . x)).
// Per-row values live in separate variables (#unroll): indexing a local array with a loop counter
// put it in local memory on NVIDIA.
#include quant_common
#include {{QUANT}}
#include reduce
#include activation

// The shape is compiled in: no parameter load stands between launch and the weight loads, and the
// compiler knows the loop's trip count. (A model has a handful of distinct shapes.)
struct P { k: u32, rows: u32, row0: u32, dbase: u32, y_stride: u32, eps: f32 }
const p = P({{K}}u, {{NROWS}}u, {{ROW0}}u, {{DBASE}}u, {{Y_STRIDE}}u, {{EPS}});
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#if BIAS
@group(0) @binding(5) var<storage, read> bias: array<f32>;
#endif
#if NORM
@group(0) @binding(6) var<storage, read> nw: array<vec4<f32>>;
#endif

const NPART: u32 = {{WG}}u;                      // room for every subgroup's partial sums (x2 with GLU)
var<workgroup> part: array<f32, {{ROWS}} * {{WG}}>;
var<workgroup> norm_part: array<f32, {{WG}}>;

// Where a token's x row starts (vec4s): passed down rather than kept in a private variable, to leave
// the compiler nothing to spill. With NORM, xv returns x * norm weight, and each x vec4 loaded
// (exactly once per workgroup pass) adds its squares to the calling thread's `ss`.
struct XRow { base: u32 }
var<private> ss: f32;
fn xv(xrow: XRow, i: u32) -> vec4<f32> {
    let v = x[xrow.base + i];
#if NORM
    ss += dot(v, v);
    return v * nw[i];
#else
    return v;
#endif
}
fn x_runs2(r: XRow, a: u32, b: u32) -> array<vec4<f32>, 8> {
    return array<vec4<f32>, 8>(xv(r, a), xv(r, a + 1u), xv(r, a + 2u), xv(r, a + 3u),
                               xv(r, b), xv(r, b + 1u), xv(r, b + 2u), xv(r, b + 3u));
}
fn x_runs4(r: XRow, a: u32, b: u32, c: u32, d: u32) -> array<vec4<f32>, 16> {
    return array<vec4<f32>, 16>(xv(r, a), xv(r, a + 1u), xv(r, a + 2u), xv(r, a + 3u),
                                xv(r, b), xv(r, b + 1u), xv(r, b + 2u), xv(r, b + 3u),
                                xv(r, c), xv(r, c + 1u), xv(r, c + 2u), xv(r, c + 3u),
                                xv(r, d), xv(r, d + 1u), xv(r, d + 2u), xv(r, d + 3u));
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32,
#if SUBGROUPS
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_id) sg: u32,
        @builtin(num_subgroups) nsg: u32
#endif
        ) {
    red_lane = li;
    let rbase = (wid.x + wid.y * nwg.x) * {{ROWS}}u;
    let t = wid.z;
    if (rbase >= p.rows) { return; }     // uniform over the workgroup
    let xrow = XRow(t * (p.k / 4u));
    ss = 0.0;
    let bpr = p.k / WQK;          // wide blocks per row
    let chunks = bpr * CPB;
    let last = p.rows - 1u;       // rows past the end recompute the last row (result unused)
#unroll ROWS
    var acc$i = 0.0;
    let blk$i = min(rbase + $iu, last) * bpr;
#if GLU
    var up$i = 0.0;
    let ublk$i = (min(rbase + $iu, last) + p.rows) * bpr;
#endif
#end
    for (var c = li; c < chunks; c += {{WG}}u) {
        let b = c / CPB;
        let cc = c % CPB;
        // every load of the step first (weights of all rows, then x), then the arithmetic: the
        // loads are then all in flight together whatever the compiler's scheduling
#unroll ROWS
        let cw$i = chunk_load(blk$i + b, cc);
#if GLU
        let cu$i = chunk_load(ublk$i + b, cc);
#endif
#end
        let xr = x_chunk(xrow, b, cc);
#unroll ROWS
        acc$i += chunk_dot(cw$i, cc, xr);
#if GLU
        up$i += chunk_dot(cu$i, cc, xr);
#endif
#end
    }
#if SUBGROUPS
#unroll ROWS
    acc$i = subgroupAdd(acc$i);
    if (lane == 0u) { part[$iu * NPART + sg] = acc$i; }
#if GLU
    up$i = subgroupAdd(up$i);
    if (lane == 0u) { part[$iu * NPART + nsg + sg] = up$i; }
#endif
#end
#if NORM
    ss = subgroupAdd(ss);
    if (lane == 0u) { norm_part[sg] = ss; }
#endif
    workgroupBarrier();
    if (li >= {{ROWS}}u || rbase + li >= p.rows) { return; }
    var s = 0.0;
    for (var i = 0u; i < nsg; i++) { s += part[li * NPART + i]; }
#if GLU
    var su = 0.0;
    for (var i = 0u; i < nsg; i++) { su += part[li * NPART + nsg + i]; }
#endif
#if NORM
    var sq = 0.0;
    for (var i = 0u; i < nsg; i++) { sq += norm_part[i]; }
#endif
#else
#unroll ROWS
    acc$i = wg_sum(acc$i);
    if (li == 0u) { part[$iu * NPART] = acc$i; }
#if GLU
    up$i = wg_sum(up$i);
    if (li == 0u) { part[$iu * NPART + 1u] = up$i; }
#endif
#end
#if NORM
    let sq = wg_sum(ss);
#endif
    workgroupBarrier();
    if (li >= {{ROWS}}u || rbase + li >= p.rows) { return; }
    var s = part[li * NPART];
#if GLU
    let su = part[li * NPART + 1u];
#endif
#endif
#if NORM
    let scale = inverseSqrt(sq / f32(p.k) + p.eps);
    s *= scale;
#if GLU
    let su_n = su * scale;
#endif
#else
#if GLU
    let su_n = su;
#endif
#endif
#if GLU
    s = act(s) * su_n;
#endif
    let row = p.row0 + rbase + li;
    let o = t * p.y_stride + row;
#if BIAS
    s += bias[row];
#endif
#if ACCUMULATE
    y[o] += s;
#else
    y[o] = s;
#endif
}
