// Log-probabilities for the serving engine's requests that ask for them: after a batched step's
// sampler, for batch row b (its sequence in slot s), the log-probability of the token just sampled
// and the TOPN most likely tokens with theirs, of the model's distribution (temperature 1), into
// slot s's stretch of `out` at the new token's position: 1 + 2 * TOPN floats (ids as float bits),
// most likely first, lowest id first on ties; only the first top_logprobs of the slot's settings are
// written (each is a pass over the logits). One workgroup per row.
#include reduce
#include sampling

const HIST: u32 = {{HIST}}u;
const TOPN: u32 = {{TOPN}}u;
#include batch_rows
struct P { vocab: u32, n4: u32, _a: u32, _b: u32 }     // n4: vec4s a logits row
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> settings: array<Sampling>;     // per slot
@group(0) @binding(2) var<storage, read> logits: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> tokens: array<u32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

const WG: u32 = {{WG}}u;
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> wg_top: u32;

// (v, i) comes before (w, j) in the ranking: larger value, then lower id
fn before(v: f32, i: u32, w: f32, j: u32) -> bool { return v > w || (v == w && i < j); }

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    red_lane = li;
    let s = rows[wid.x];
    if (s == NONE) { return; }
    let base = wid.x * p.n4;
    // log-sum-exp in one pass: each thread's running max and its sum rescaled to it
    var mt = -3.4e38;
    var et = 0.0;
    for (var j = li; j < p.n4; j += WG) {
        let v = logits[base + j];
        for (var c = 0u; c < 4u; c++) {
            if (4u * j + c < p.vocab) {
                let mn = max(mt, v[c]);
                et = et * exp(mt - mn) + exp(v[c] - mn);
                mt = mn;
            }
        }
    }
    let m = wg_max(mt);
    let lse = m + log(wg_sum(et * exp(mt - m)));
    let pos = seq_pos[s];
    let o = (s * HIST + pos) * (1u + 2u * TOPN);
    if (li == 0u) {
        let t = tokens[s * HIST + pos];
        out[o] = logits[base + t / 4u][t % 4u] - lse;
    }
    // the slot's top_logprobs best, one at a time: each the best that ranks after the last one found
    if (li == 0u) { wg_top = settings[s].top_logprobs; }
    let top = min(workgroupUniformLoad(&wg_top), TOPN);
    var pv = 3.4e38;
    var pi = 0u;
    for (var n = 0u; n < top; n++) {
        var bv = -3.4e38;
        var bi = NONE;
        for (var j = li; j < p.n4; j += WG) {
            let v = logits[base + j];
            for (var c = 0u; c < 4u; c++) {
                let i = 4u * j + c;
                if (i < p.vocab && before(pv, pi, v[c], i) && before(v[c], i, bv, bi)) { bv = v[c]; bi = i; }
            }
        }
        best_v[li] = bv;
        best_i[li] = bi;
        workgroupBarrier();
        for (var h = WG / 2u; h > 0u; h = h >> 1u) {
            if (li < h && before(best_v[li + h], best_i[li + h], best_v[li], best_i[li])) {
                best_v[li] = best_v[li + h];
                best_i[li] = best_i[li + h];
            }
            workgroupBarrier();
        }
        pv = best_v[0];
        pi = best_i[0];
        workgroupBarrier();
        if (li == 0u) {
            out[o + 1u + 2u * n] = bitcast<f32>(pi);
            out[o + 2u + 2u * n] = pv - lse;
        }
    }
}
