// Picks the next token from row 0 of the logits, writes it after the batch in the token buffer and
// advances the state to the next single-token step. One workgroup.
//   temperature == 0: argmax (lowest id on ties).
//   otherwise: logits / T, keep the top_k largest (0 = all) and then the smallest top set whose
//   probability reaches top_p (1 = all), both found by bisection on the float order (ties at a
//   threshold stay in), and draw from what is left with a uniform from hash(seed, position).
// Every pass over the logits reads them as vec4s, U loads per thread issued before any is used: the
// pass that read one logit per loop trip waited an L2 round trip for each (about 150 us a token at a
// 128k vocabulary on the H200, where the decode step of Llama 3.2 1B takes about 1,000 us).
#include reduce
#include state

struct P { vocab: u32, top_k: u32, temperature: f32, top_p: f32, seed: u32, _a: u32, _b: u32, _c: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read_write> st: State;
// row 0 of the logits as vec4s (Device buffers are whole vec4s); lanes past vocab are masked
@group(0) @binding(2) var<storage, read> logits: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> tokens: array<u32>;

const WG: u32 = {{WG}}u;
const U: u32 = {{U}}u;            // vec4 loads in flight per thread in a pass
var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> part: array<f32, WG>;
var<workgroup> chosen: atomic<u32>;

fn okey(f: vec4<f32>) -> vec4<u32> {        // order-preserving map of floats onto u32
    let b = bitcast<vec4<u32>>(f);
    return select(~b, b | vec4<u32>(0x80000000u), f >= vec4<f32>(0.0));
}

fn pcg(v: u32) -> u32 {
    let s = v * 747796405u + 2891336453u;
    let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (w >> 22u) ^ w;
}

fn n4() -> u32 { return (p.vocab + 3u) / 4u; }
// logits[4j .. 4j+4), the index clamped so that every load is unconditional
fn at(j: u32) -> vec4<f32> { return logits[min(j, n4() - 1u)]; }
// which of those are tokens: j's lanes below vocab (a clamped j past the end has none)
fn live(j: u32) -> vec4<bool> {
    return vec4<u32>(4u * j) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(p.vocab);
}
// which lanes are kept at threshold k: live (ok) with key >= k
fn kept(v: vec4<f32>, ok: vec4<bool>, k: u32) -> vec4<bool> { return ok & (okey(v) >= vec4<u32>(k)); }
// each lane's weight in the draw: exp((v - m) / T) where kept, else 0
fn weight(v: vec4<f32>, ok: vec4<bool>, k: u32, m: f32) -> vec4<f32> {
    return select(vec4<f32>(0.0), exp((v - vec4<f32>(m)) / p.temperature), kept(v, ok, k));
}

// The U vec4s one thread reads in a trip of a strided pass from b (j = b + u * WG + li), loaded
// before any is used.
fn strided(b: u32, li: u32) -> array<vec4<f32>, U> {
    return array<vec4<f32>, U>(
#unroll U u
        at(b + $uu * WG + li),
#end
    );
}

// The draw weights of a thread's chunk vec4s j0 .. j0 + U (those at or past hi weigh 0).
fn chunk_weights(j0: u32, hi: u32, k: u32, m: f32) -> array<vec4<f32>, U> {
    let v = array<vec4<f32>, U>(
#unroll U u
        at(min(j0 + $uu, hi - 1u)),
#end
    );
    return array<vec4<f32>, U>(
#unroll U u
        weight(v[$u], live(j0 + $uu) & vec4<bool>(j0 + $uu < hi), k, m),
#end
    );
}

fn argmax(li: u32) -> u32 {
    var bv = -3.4e38;
    var bi = 0xFFFFFFFFu;
    // a thread's j rise with u and with the trips: strict > keeps the lowest id of equal values
    for (var b = 0u; b < n4(); b += WG * U) {
        let v = strided(b, li);
#unroll U u
        let j$u = b + $uu * WG + li;
        let ok$u = live(j$u);
#unroll 4 c
        let g$u$c = ok$u[$c] && v[$u][$c] > bv;
        bv = select(bv, v[$u][$c], g$u$c);
        bi = select(bi, 4u * j$u + $cu, g$u$c);
#end
#end
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

// Over the live logits with key >= k: their number (mass false) or their unnormalised probability
// mass (mass true).
fn tally(li: u32, k: u32, m: f32, mass: bool) -> f32 {
    var c = vec4<f32>(0.0);
    for (var b = 0u; b < n4(); b += WG * U) {
        let v = strided(b, li);
#unroll U u
        let ok$u = live(b + $uu * WG + li);
        if (mass) {
            c += weight(v[$u], ok$u, k, m);
        } else {
            c += select(vec4<f32>(0.0), vec4<f32>(1.0), kept(v[$u], ok$u, k));
        }
#end
    }
    return wg_sum(c.x + c.y + c.z + c.w);
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
        let m = at(am / 4u)[am % 4u];
        // top-k threshold: the largest key with at least k logits at or above it
        var tk = 0u;
        if (p.top_k > 0u && p.top_k < p.vocab) {
            for (var b = 31; b >= 0; b--) {
                let c = tk | (1u << u32(b));
                if (tally(li, c, m, false) >= f32(p.top_k)) { tk = c; }
            }
        }
        // top-p threshold over what top-k kept
        // (searched from 0: the answer need not share tk's bits; mass at tk always reaches `need`)
        var tp = tk;
        if (p.top_p < 1.0) {
            let need = p.top_p * tally(li, tk, m, true);
            tp = 0u;
            for (var b = 31; b >= 0; b--) {
                let c = tp | (1u << u32(b));
                if (tally(li, c, m, true) >= need) { tp = c; }
            }
            tp = max(tp, tk);
        }
        // draw: contiguous chunks of vec4s per thread, an inclusive scan of their masses over the
        // threads, and the thread whose range holds the goal walks its chunk
        let chunk = (n4() + WG - 1u) / WG;
        let lo = li * chunk;
        let hi = min(lo + chunk, n4());
        var s4 = vec4<f32>(0.0);
        for (var j0 = lo; j0 < hi; j0 += U) {
            let w = chunk_weights(j0, hi, tp, m);
#unroll U u
            s4 += w[$u];
#end
        }
        let s = s4.x + s4.y + s4.z + s4.w;
        part[li] = s;
        if (li == 0u) { atomicStore(&chosen, 0xFFFFFFFFu); }
        workgroupBarrier();
        for (var off = 1u; off < WG; off = off << 1u) {
            let add = select(0.0, part[max(li, off) - off], li >= off);
            workgroupBarrier();
            part[li] += add;
            workgroupBarrier();
        }
        // thread li owns [before, after): the previous thread's inclusive sum to its own, so the
        // ranges tile [0, total) exactly
        let after = part[li];
        let before = select(0.0, part[max(li, 1u) - 1u], li > 0u);
        let total = part[WG - 1u];
        let u = f32(pcg(pcg(p.seed) ^ (pos * 2654435761u)) >> 8u) / 16777216.0;
        let goal = u * total;
        if (s > 0.0 && goal >= before && (goal < after || after >= total)) {
            var acc = before;
            var last = 4u * lo;
            var found = false;
            for (var j0 = lo; j0 < hi; j0 += U) {
                let w = chunk_weights(j0, hi, tp, m);
#unroll U u
#unroll 4 c
                if (!found && w[$u][$c] > 0.0) {
                    last = 4u * (j0 + $uu) + $cu;
                    acc += w[$u][$c];
                    found = acc > goal;
                }
#end
#end
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
