// Decode GEMV: y[t, row] (+)= sum_k W[row, k] * x[t, k] for GROUPS x ROWS rows per workgroup.
// Tokens: single-stream decode runs one; a batch of NB tokens (a serving step) runs NT tokens a
// workgroup in TG token groups, the groups of the same rows next to each other in the grid so that
// the later ones find the weights in L2; every token's arithmetic is the same as when it runs alone,
// so a sequence's results do not depend on its batch. Grid z also counts tokens (NT x TG each: tests
// and tools run a few tokens on one grid; the grid has exactly the tokens, so NB is then unbounded).
// Each thread takes one chunk (32 or 64 elements, one or a few 16-byte loads) of the rows' K at a time,
// strided by the workgroup, so every lane is busy whatever the chunk count (the workgroup size is
// picked per matrix in ops.py). The chunk's x runs are loaded once into registers and reused for all
// ROWS rows, whose independent weight loads are then in flight together. With several row groups
// (HOIST, gemv_rows.wgsl) a lane's chunks are the same for every group, so their x is loaded and
// converted once per workgroup. Partial sums: subgroup reductions (a subgroupAdd per row, or SG_BFLY:
// the rows' sums in one butterfly, gemv_rows.wgsl), then one workgroup-memory pass over the subgroups
// (subgroups of 4 lanes or more).
// Fused variants, as matmul.wgsl: NORM (RMSNorm of x: the dots use x * w and are scaled by the
// norm's 1/rms at the end; the sum of squares comes from the same x loads, since the workgroup's
// chunks cover the row exactly once, and rides along the partial-sum reduction, so the norm adds no
// step to the kernel), GLU (virtual row r = glu_act(gate row r . x, up row rows + r . x)), and with
// EXPERTS each expert's own bias (E_BIAS) before it.
// Per-row values live in separate variables (#unroll): indexing a local array with a loop counter
// put it in local memory on NVIDIA.
#include quant_common
#include {{QUANT}}
#if DUAL
#include quant_common as B_
#include {{QUANT_B}} as B_
#endif
#include reduce
#include activation
#include epilogue

// The shape is compiled in: no parameter load stands between launch and the weight loads, and the
// compiler knows the loop's trip count. (A model has a handful of distinct shapes.)
struct P { k: u32, rows: u32, row0: u32, dbase: u32, y_stride: u32, eps: f32 }
const p = P({{K}}u, {{NROWS}}u, {{ROW0}}u, {{DBASE}}u, {{Y_STRIDE}}u, {{EPS}});
@group(0) @binding(2) var<storage, read> w: array<vec4<u32>>;
#if DUAL
// DUAL: a second weight of another type over the same x (Q4_K_M's Q6_K V after its Q4_K Q and K):
// its row groups follow the first's in the grid, and write after its rows.
const B_p = P({{K}}u, {{NROWS_B}}u, {{ROW0_B}}u, {{DBASE_B}}u, {{Y_STRIDE}}u, {{EPS}});
@group(0) @binding(7) var<storage, read> B_w: array<vec4<u32>>;
#endif
@group(0) @binding(3) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
#if BIAS
@group(0) @binding(5) var<storage, read> bias: array<f32>;
#endif
#if E_BIAS
// E_BIAS (EXPERTS): per-expert biases laid out as the weight rows (GLU: each expert's [gate; up]),
// added to the row sums before the activation and the routing weight (write_y adds none)
@group(0) @binding(5) var<storage, read> bias: array<f32>;
#endif
#if NORM
@group(0) @binding(6) var<storage, read> nw: array<vec4<f32>>;
#endif
#if EXPERTS
// EXPERTS: w holds E experts' matrices one after another (EROWS rows each: GLU's gate and up rows
// together), and a "token" is one of a token's ESLOTS picked experts: its id in e_ids, its x the
// token's row. EXPERT_SUM: a token's picked experts' rows are one row of ESLOTS x K (its h rows,
// t * ESLOTS + j, are consecutive in x), each chunk weighted by its expert's e_wts: the reduction
// sums the weighted experts, and all the workgroup's lanes share the ESLOTS short rows.
@group(0) @binding(8) var<storage, read> e_ids: array<u32>;
@group(0) @binding(9) var<storage, read> e_wts: array<f32>;
const ESLOTS: u32 = {{ESLOTS}}u;
const EROWS: u32 = {{EROWS}}u;
var<private> e_row0: u32;        // the current expert's first weight row
var<private> e_slot0: u32;       // EXPERT_SUM: the token's first slot
#endif
#if EXPERT_SUM
const VSLOTS: u32 = ESLOTS;      // rows of this many experts in one
#else
const VSLOTS: u32 = 1u;
#endif

// Per row, room for the partial sums of WG / 4 subgroups, and as many for GLU's up rows: subgroups
// of 4 lanes or more (Device.has_subgroups requires it)
const NPART: u32 = {{WG}}u / 2u;
const NT: u32 = {{NT}}u;             // tokens a workgroup computes
const TG: u32 = {{TG}}u;             // token groups in the grid
const NB: u32 = {{NB}}u;             // tokens in the batch (rows of x and y)
var<workgroup> part: array<f32, {{GROUPS}} * {{ROWS}} * NT * NPART>;
var<workgroup> norm_part: array<f32, NT * NPART>;

// Where a token's x row starts (vec4s), and which of the workgroup's tokens it is: passed down rather
// than kept in a private variable, to leave the compiler nothing to spill. With NORM, xv returns
// x * norm weight, and each x vec4 loaded (exactly once per workgroup pass) adds its squares to
// the calling thread's sum for that token (ss0, ss1, ..). A token past the batch reads the last
// one's row (computed, not written).
struct XRow { base: u32, j: u32 }
fn x_row(t: u32, j: u32) -> XRow {
#if EXPERT_SUM
    return XRow(min(t, NB - 1u) * ESLOTS * (p.k / 4u), j);
#else
#if EXPERTS
    return XRow(min(t, NB - 1u) / ESLOTS * (p.k / 4u), j);
#else
    return XRow(min(t, NB - 1u) * (p.k / 4u), j);
#endif
#endif
}
fn expert_row0() -> u32 {
#if EXPERTS
    return e_row0;
#else
    return 0u;
#endif
}
#if SG_BFLY
const BFN: u32 = {{BFN}}u;       // the row sums a group reduces together (gemv_rows.wgsl), a power of 2
const SGC: u32 = {{SGC}}u;       // the adapter's probed subgroup size: the butterfly's masks as constants
#endif
#unroll NT j
var<private> ss$j: f32;
#end
var<private> x_on: f32;          // HOIST: 0 reads x as zeros (a lane's chunk step past the row's end)
fn xv(xrow: XRow, i: u32) -> vec4<f32> {
#if HOIST
    let v = x[xrow.base + i] * x_on;
#else
    let v = x[xrow.base + i];
#endif
#if NORM
#if MULTI
    let q = dot(v, v);
#unroll NT j
    if (xrow.j == $ju) { ss$j += q; }
#end
#else
    ss0 += dot(v, v);
#endif
    return v * nw[i];
#else
    return v;
#endif
}

#include gemv_rows
#if DUAL
#include gemv_rows as B_
#endif

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32,
#if SUBGROUPS
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_id) sg: u32,
        @builtin(num_subgroups) nsg: u32, @builtin(subgroup_size) sgsize: u32
#endif
        ) {
#if !SUBGROUPS
    let lane = 0u; let sg = 0u; let nsg = 1u; let sgsize = 1u;
#endif
    red_lane = li;
    let wg_i = wid.x + wid.y * nwg.x;        // workgroup; the branches below are uniform per workgroup
    let g = wg_i / TG;                       // its row group
    let t0 = (wid.z * TG + wg_i % TG) * NT;  // its first token
    let per = {{GROUPS}}u * {{ROWS}}u;       // rows per workgroup
    let wgs = (p.rows + per - 1u) / per;
#if EXPERT_SUM
    e_slot0 = min(t0, NB - 1u) * ESLOTS;
#else
#if EXPERTS
    e_row0 = e_ids[min(t0, NB - 1u)] * EROWS;
#endif
#endif
    if (g < wgs) {
        rows(g * per, t0, li, lane, sg, nsg, sgsize);
    }
#if DUAL
    else if ((g - wgs) * per < B_p.rows) {
        B_rows((g - wgs) * per, t0, li, lane, sg, nsg, sgsize);
    }
#endif
}
