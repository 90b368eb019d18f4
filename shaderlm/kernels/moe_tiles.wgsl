// Groups a prompt batch's (token, slot) pairs by expert for the experts' GEMM (matmul_q8.wgsl
// EXPERTS): `pairs` lists the pair ids (token * K + slot) expert by expert, and tiles[i] = (expert,
// its first index in pairs, count <= BN) for every run of BN pairs of one expert, then (0, 0, 0)
// up to the GEMM grid's cdiv(P, BN) + min(E, P) tiles (P = K pairs a token), which exit at once.
// One workgroup. The order of an expert's pairs does not matter: each pair's result is computed
// from its own row alone.
#include state

const E: u32 = {{E}}u;
const K: u32 = {{K}}u;
const BN: u32 = {{BN}}u;
const WG: u32 = 256u;

@group(0) @binding(0) var<storage, read> st: State;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> pairs: array<u32>;
@group(0) @binding(3) var<storage, read_write> tiles: array<vec4<u32>>;

var<workgroup> count: array<atomic<u32>, E>;
var<workgroup> start: array<u32, E>;
var<workgroup> tile0: array<u32, E>;     // each expert's first tile
var<workgroup> n_tiles: u32;

@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32) {
    let P = st.n * K;
    for (var e = li; e < E; e += WG) { atomicStore(&count[e], 0u); }
    workgroupBarrier();
    for (var q = li; q < P; q += WG) { atomicAdd(&count[min(ids[q], E - 1u)], 1u); }
    workgroupBarrier();
    if (li == 0u) {
        var s = 0u;
        var t = 0u;
        for (var e = 0u; e < E; e++) {
            let c = atomicLoad(&count[e]);
            start[e] = s;
            tile0[e] = t;
            s += c;
            t += (c + BN - 1u) / BN;
        }
        n_tiles = t;
    }
    workgroupBarrier();
    for (var e = li; e < E; e += WG) { atomicStore(&count[e], 0u); }    // now each expert's cursor
    workgroupBarrier();
    for (var q = li; q < P; q += WG) {
        let e = min(ids[q], E - 1u);
        pairs[start[e] + atomicAdd(&count[e], 1u)] = q;
    }
    let used = workgroupUniformLoad(&n_tiles);
    let grid = (P + BN - 1u) / BN + min(E, P);
    for (var ti = li; ti < grid; ti += WG) {
        var v = vec4<u32>(0u);
        if (ti < used) {
            var e = 0u;                      // the last expert whose tiles start at or before ti
            for (var f = 1u; f < E; f++) { if (tile0[f] <= ti) { e = f; } }
            let j = ti - tile0[e];
            let c = atomicLoad(&count[e]);
            v = vec4<u32>(e, start[e] + j * BN, min(BN, c - j * BN), 0u);
        }
        tiles[ti] = v;
    }
}
