// Picks the next token from one row of logits, writes it after the batch in the token buffer and
// advances the state to the next single-token step. One workgroup.
//   temperature == 0: argmax (lowest id on ties).
//   otherwise: logits / T, keep the top_k largest (0 = all) and then the smallest top set whose
//   probability reaches top_p (1 = all), both found by bisection on the float order (ties at a
//   threshold stay in), and draw from what is left with a uniform from hash(seed, position).
#include reduce
#include state

struct P { vocab: u32, top_k: u32, temperature: f32, top_p: f32, seed: u32, _a: u32, _b: u32, _c: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> st: State;
@group(0) @binding(2) var<storage, read> logits: array<f32>;
@group(0) @binding(3) var<storage, read_write> tokens: array<u32>;

const WG: u32 = {{WG}}u;
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> part: array<f32, WG>;
var<workgroup> chosen: atomic<u32>;

fn okey(f: f32) -> u32 {        // order-preserving map of floats onto u32
    let b = bitcast<u32>(f);
    return select(~b, b | 0x80000000u, f >= 0.0);
}

fn pcg(v: u32) -> u32 {
    let s = v * 747796405u + 2891336453u;
    let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (w >> 22u) ^ w;
}

fn argmax(li: u32) -> u32 {
    var bv = -3.4e38;
    var bi = 0xFFFFFFFFu;
    for (var i = li; i < p.vocab; i += WG) {
        let v = logits[i];
        if (v > bv) { bv = v; bi = i; }
    }
    best_v[li] = bv;
    best_i[li] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (li < s) {
            let ov = best_v[li + s];
            let oi = best_i[li + s];
            if (ov > best_v[li] || (ov == best_v[li] && oi < best_i[li])) { best_v[li] = ov; best_i[li] = oi; }
        }
        workgroupBarrier();
    }
    let r = best_i[0];
    workgroupBarrier();
    return min(r, p.vocab - 1u);
}

// number of logits with key >= k, and their unnormalised probability mass
fn count_ge(li: u32, k: u32) -> f32 {
    var c = 0.0;
    for (var i = li; i < p.vocab; i += WG) { c += select(0.0, 1.0, okey(logits[i]) >= k); }
    return wg_sum(c);
}

fn mass_ge(li: u32, k: u32, m: f32) -> f32 {
    var c = 0.0;
    for (var i = li; i < p.vocab; i += WG) {
        let v = logits[i];
        if (okey(v) >= k) { c += exp((v - m) / p.temperature); }
    }
    return wg_sum(c);
}

@compute @workgroup_size({{WG}})
fn main(@builtin(local_invocation_index) li: u32) {
    red_lane = li;
    let pos = st.pos + st.n;            // position the new token will take
    var tok = 0u;
    if (p.temperature <= 0.0) {
        tok = argmax(li);
    } else {
        let am = argmax(li);
        let m = logits[am];
        // top-k threshold: the largest key with at least k logits at or above it
        var tk = 0u;
        if (p.top_k > 0u && p.top_k < p.vocab) {
            for (var b = 31; b >= 0; b--) {
                let c = tk | (1u << u32(b));
                if (count_ge(li, c) >= f32(p.top_k)) { tk = c; }
            }
        }
        // top-p threshold over what top-k kept
        // (searched from 0: the answer need not share tk's bits; mass at tk always reaches `need`)
        var tp = tk;
        if (p.top_p < 1.0) {
            let need = p.top_p * mass_ge(li, tk, m);
            tp = 0u;
            for (var b = 31; b >= 0; b--) {
                let c = tp | (1u << u32(b));
                if (mass_ge(li, c, m) >= need) { tp = c; }
            }
            tp = max(tp, tk);
        }
        // draw: contiguous chunks per thread, prefix over threads, the owning thread walks its chunk
        let chunk = (p.vocab + WG - 1u) / WG;
        let lo = li * chunk;
        let hi = min(lo + chunk, p.vocab);
        var s = 0.0;
        for (var i = lo; i < hi; i++) {
            let v = logits[i];
            if (okey(v) >= tp) { s += exp((v - m) / p.temperature); }
        }
        part[li] = s;
        if (li == 0u) { atomicStore(&chosen, 0xFFFFFFFFu); }
        workgroupBarrier();
        var before = 0.0;
        var total = 0.0;
        for (var j = 0u; j < WG; j++) {
            if (j < li) { before += part[j]; }
            total += part[j];
        }
        let u = f32(pcg(pcg(p.seed) ^ (pos * 2654435761u)) >> 8u) / 16777216.0;
        let goal = u * total;
        if (s > 0.0 && goal >= before && (goal < before + s || before + s >= total)) {
            var acc = before;
            var last = lo;
            for (var i = lo; i < hi; i++) {
                let v = logits[i];
                if (okey(v) >= tp) {
                    last = i;
                    acc += exp((v - m) / p.temperature);
                    if (acc > goal) { break; }
                }
            }
            atomicMin(&chosen, last);
        }
        workgroupBarrier();
        tok = atomicLoad(&chosen);
        if (tok == 0xFFFFFFFFu) { tok = am; }   // only if rounding left no owner
    }
    if (li == 0u) {
        tokens[st.tok + st.n] = tok;
        st.pos = st.pos + st.n;
        st.tok = st.tok + st.n;
        st.n = 1u;
        st.out_row0 = 0u;
    }
}
