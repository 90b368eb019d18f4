// Mixture-of-experts routing from the router's logits, a workgroup a token: the RK experts with the
// largest logits (ties: the lower expert id; NaN counts as -inf), weighted by the softmax over the RK
// picked (RNORM: the picked probabilities renormalised) or over all RE experts, into route_ids /
// route_wts[t * RK + j], j by decreasing logit. Each thread ranks its experts by counting those that
// beat them (RE reads of workgroup memory, no barrier in the loop): a rank under RK is that expert's slot.
const RE: u32 = {{E}}u;
const RK: u32 = {{K}}u;
const RWG: u32 = {{WG}}u;

@group(0) @binding(0) var<storage, read> logits: array<f32>;
@group(0) @binding(1) var<storage, read_write> route_ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> route_wts: array<f32>;

const R_NEG: f32 = -0x1.fffffep+127f;      // -FLT_MAX, exactly (Tint refuses a literal past it)
var<workgroup> r_vals: array<f32, RE>;
var<workgroup> r_picked: array<u32, RK>;
var<workgroup> r_total: f32;

fn route_token(t: u32, li: u32) {
    for (var i = li; i < RE; i += RWG) {
        let v = logits[t * RE + i];
        r_vals[i] = select(R_NEG, v, v == v);
    }
    workgroupBarrier();
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
    let mx = r_vals[r_picked[0]];
    if (li == 0u) {
        var s = 0.0;
#if RNORM
        for (var j = 0u; j < RK; j++) { s += exp(r_vals[r_picked[j]] - mx); }
#else
        for (var i = 0u; i < RE; i++) { s += exp(r_vals[i] - mx); }
#endif
        r_total = s;
    }
    workgroupBarrier();
    for (var j = li; j < RK; j += RWG) {
        route_ids[t * RK + j] = r_picked[j];
        route_wts[t * RK + j] = exp(r_vals[r_picked[j]] - mx) / r_total;
    }
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    route_token(wid.x, li);
}
