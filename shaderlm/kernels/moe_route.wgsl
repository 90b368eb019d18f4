// Mixture-of-experts routing from the router's logits, a workgroup a token: the RK experts with the
// largest logits (ties: the lower expert id; NaN and -inf count as -FLT_MAX), weighted by the softmax over the
// RK picked (RNORM: the picked probabilities renormalised) or over all RE experts, into route_ids /
// route_wts[t * RK + j], j by decreasing logit.
// With subgroups (SG_PICK), RK rounds of a subgroup max: each lane keeps the best of its strided
// experts not yet taken, the subgroup's max wins (ties: the lowest id), and its lane marks it taken;
// every subgroup does the same work, so no barrier follows the load. Without, each thread ranks its
// experts by counting those that beat them (RE reads of workgroup memory a thread).
// Either way one thread then writes the picks and their weights, summing in the same order.
const RE: u32 = {{E}}u;
const RK: u32 = {{K}}u;
const RWG: u32 = {{WG}}u;

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> route_ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> route_wts: array<f32>;

const R_NEG: f32 = -0x1.fffffep+127f;      // -FLT_MAX, exactly (Tint refuses a literal past it)
const NONE: u32 = 0xffffffffu;
var<workgroup> r_vals: array<f32, RE>;
var<workgroup> r_picked: array<u32, RK>;

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32
#if SG_PICK
        , @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) sgsize: u32
#endif
        ) {
    let t = wid.x;
    for (var i = li; i < RE; i += RWG) {
        let v = logits[t * RE + i];
        r_vals[i] = select(R_NEG, v, v > R_NEG);          // NaN and -inf: the lowest value
    }
    workgroupBarrier();
#if SG_PICK
    var taken = 0u;                           // bit c: this lane's c-th expert (lane + c * sgsize)
    for (var j = 0u; j < RK; j++) {
        var bv = R_NEG;
        var bi = NONE;
        var c = 0u;
        for (var i = lane; i < RE; i += sgsize) {
            let v = r_vals[i];
            if ((taken & (1u << c)) == 0u && (bi == NONE || v > bv)) { bv = v; bi = i; }
            c++;
        }
        let m = subgroupMax(bv);              // a lane with nothing left offers R_NEG, and is not picked
        let win = subgroupMin(select(NONE, bi, bi != NONE && bv == m));
        if (win % sgsize == lane) { taken |= 1u << (win / sgsize); }
        if (li == 0u) { r_picked[j] = win; }
    }
#else
    for (var i = li; i < RE; i += RWG) {
        let v = r_vals[i];
        var rank = 0u;
        for (var f = 0u; f < RE; f++) {
            let u = r_vals[f];
            rank += select(0u, 1u, u > v || (u == v && f < i));
        }
        if (rank < RK) { r_picked[rank] = i; }
    }
    workgroupBarrier();
#endif
    if (li == 0u) {
        let mx = r_vals[r_picked[0]];
        var s = 0.0;
#if RNORM
        for (var j = 0u; j < RK; j++) { s += exp(r_vals[r_picked[j]] - mx); }
#else
        for (var i = 0u; i < RE; i++) { s += exp(r_vals[i] - mx); }
#endif
        for (var j = 0u; j < RK; j++) {
            route_ids[t * RK + j] = r_picked[j];
            route_wts[t * RK + j] = exp(r_vals[r_picked[j]] - mx) / s;
        }
    }
}
