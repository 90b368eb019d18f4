// Picks the next token from row 0 of the logits, writes it after the batch in the token buffer and
// advances the state to the next single-token step. One workgroup.
//   temperature == 0: argmax (lowest id on ties).
//   otherwise: logits / T, keep the top_k largest (0 = all) and then the smallest top set whose
//   probability reaches top_p (1 = all), ties at either threshold staying in, and draw from what is
//   left, walking the kept ids in ascending order, with a uniform from hash(seed, position).
// Top-k's threshold is the k-th largest key, a byte at a time (a radix select: 4 passes over the
// logits). When at most C logits reach it, these survivors are copied into workgroup memory in id
// order (a counting pass, then only the threads whose ranges hold any read them again) and the rest
// runs there: 5 passes and a bit. Otherwise (top_k 0, or more than C survivors) the max is an argmax
// pass, top-p's threshold a bisection with a pass per bit (33) and the draw 2 passes.
// Every pass over the logits reads them as vec4s, U loads per thread issued before any is used: the
// pass that read one logit per loop trip waited an L2 round trip for each (at a 128k vocabulary, a
// large share of a small model's decode step).
// BATCH (a serving step, or a paged prefill's last token): one workgroup per batch row b, which
// samples from logits row b with its sequence's own settings and seed, writes the token after the
// sequence's position in its stretch of HIST tokens and advances that position.
// LOGPROBS (with BATCH, for the serving engine's requests that ask): then the log-probability of the
// token drawn and the slot's top_logprobs most likely tokens with theirs, of the model's distribution
// (temperature 1), into the slot's stretch of `lp_out` at the new token's position: 1 + 2 * TOPN floats
// (ids as float bits), most likely first, lowest id first on ties. The log-sum-exp comes from the
// row's PARTS partials (logsumexp.wgsl, the dispatch before); the most likely are top-k's radix
// select and compaction, then ranked among themselves, so any number of them costs the same few passes.
#include reduce
#include state

#include sampling
#if BATCH
const HIST: u32 = {{HIST}}u;
const NONE: u32 = 0xFFFFFFFFu;
@group(0) @binding(0) var<storage, read> params: array<Sampling>;     // per slot
@group(0) @binding(10) var<storage, read> rows: array<u32>;
@group(0) @binding(11) var<storage, read_write> seq_pos: array<u32>;
var<private> p: Sampling;
var<private> row_base: u32;          // logits row b's first vec4
#if LOGPROBS
const TOPN: u32 = {{TOPN}}u;
const PARTS: u32 = {{PARTS}}u;
@group(0) @binding(4) var<storage, read_write> lp_out: array<f32>;
@group(0) @binding(5) var<storage, read> lse_parts: array<vec2<f32>>;   // (max, sum of exp(v - max)) a part
#endif
#else
@group(0) @binding(0) var<uniform> p: Sampling;
@group(0) @binding(1) var<storage, read_write> st: State;
const row_base = 0u;
#endif
// a row of the logits as vec4s (rows of whole vec4s); lanes past vocab are masked
@group(0) @binding(2) var<storage, read> logits: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> tokens: array<u32>;

const WG: u32 = {{WG}}u;          // at least 256 (WebGPU's minimum limit): a thread per radix bin
const U: u32 = {{U}}u;            // vec4 loads in flight per thread in a pass
const_assert WG >= 256u;
const C: u32 = 2u * WG;           // survivors held in workgroup memory (12 KiB at WG 512, 15 in all)
var<workgroup> hist: array<atomic<u32>, 256>;   // the radix select's counts per byte value
var<workgroup> picked: vec3<u32>;               // the radix select's bin and counts
var<workgroup> top_p_max: atomic<u32>;          // top-p's threshold over the survivors
var<workgroup> chosen: atomic<u32>;             // the drawn token
// the survivors in id order: ids, logits and draw weights (argmax's ids and values where there are none)
var<workgroup> kid: array<u32, C>;
var<workgroup> kv: array<f32, C>;
var<workgroup> kw: array<f32, C>;

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
fn at(j: u32) -> vec4<f32> { return logits[row_base + min(j, n4() - 1u)]; }
// which of those are tokens: j's lanes below vocab (a clamped j past the end has none)
fn live(j: u32) -> vec4<bool> {
    return vec4<u32>(4u * j) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(p.vocab);
}
// which lanes are live (ok) with keys in [lo, hi]; kept at threshold k: key >= k
fn within(v: vec4<f32>, ok: vec4<bool>, lo: u32, hi: u32) -> vec4<bool> {
    let key = okey(v);
    return ok & (key >= vec4<u32>(lo)) & (key <= vec4<u32>(hi));
}
fn kept(v: vec4<f32>, ok: vec4<bool>, k: u32) -> vec4<bool> { return within(v, ok, k, 0xFFFFFFFFu); }
// each lane's weight in the draw: exp((v - m) / T) where kept, else 0
fn weight(v: vec4<f32>, ok: vec4<bool>, k: u32, m: f32) -> vec4<f32> {
    return select(vec4<f32>(0.0), exp((v - vec4<f32>(m)) / p.temperature), kept(v, ok, k));
}
// survivor i's key, and its weight where kept at threshold k
fn key1(i: u32) -> u32 { return okey(vec4<f32>(kv[i])).x; }
fn weight1(i: u32, k: u32) -> f32 { return select(0.0, kw[i], key1(i) >= k); }

// The U vec4s one thread reads in a trip of a strided pass from b (j = b + u * WG + li), loaded
// before any is used.
fn strided(b: u32, li: u32) -> array<vec4<f32>, U> {
    return array<vec4<f32>, U>(
#unroll U u
        at(b + $uu * WG + li),
#end
    );
}

// A thread's contiguous range of vec4s, [lo, hi): its share in id order (compaction and the draw).
fn range(li: u32) -> vec2<u32> {
    let per = (n4() + WG - 1u) / WG;
    return vec2<u32>(min(li * per, n4()), min(li * per + per, n4()));
}
// The vec4s j0 .. j0 + U of a range ending at hi, loaded before any is used (those at or past hi
// repeat hi - 1: in_range masks them).
fn chunk(j0: u32, hi: u32) -> array<vec4<f32>, U> {
    return array<vec4<f32>, U>(
#unroll U u
        at(min(j0 + $uu, hi - 1u)),
#end
    );
}
fn in_range(j: u32, hi: u32) -> vec4<bool> { return live(j) & vec4<bool>(j < hi); }

// The draw weights of the vec4s j0 .. j0 + U of a range ending at hi.
fn chunk_weights(j0: u32, hi: u32, k: u32, m: f32) -> array<vec4<f32>, U> {
    let v = chunk(j0, hi);
    return array<vec4<f32>, U>(
#unroll U u
        weight(v[$u], in_range(j0 + $uu, hi), k, m),
#end
    );
}

// Inclusive scan of v over the threads: (the sum before this thread, through it, total). In reduce's
// red_buf, free between its reductions: workgroup memory is tight.
fn scan(li: u32, v: f32) -> vec3<f32> {
    red_buf[li] = v;
    workgroupBarrier();
    for (var off = 1u; off < WG; off = off << 1u) {
        let add = select(0.0, red_buf[max(li, off) - off], li >= off);
        workgroupBarrier();
        red_buf[li] += add;
        workgroupBarrier();
    }
    let r = vec3<f32>(select(0.0, red_buf[max(li, 1u) - 1u], li > 0u), red_buf[li], red_buf[WG - 1u]);
    workgroupBarrier();
    return r;
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
    kv[li] = bv;
    kid[li] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s >> 1u) {
        if (li < s) {
            let ov = kv[li + s];
            let oi = kid[li + s];
            if (ov > kv[li] || (ov == kv[li] && oi < kid[li])) { kv[li] = ov; kid[li] = oi; }
        }
        workgroupBarrier();
    }
    let r = kid[0];
    workgroupBarrier();
    return min(r, p.vocab - 1u);
}

// Counts, in `hist`, the live keys whose bits under `mask` equal `key` by their byte at `shift`.
fn histogram(li: u32, key: u32, mask: u32, shift: u32) {
    if (li < 256u) { atomicStore(&hist[li], 0u); }
    workgroupBarrier();
    for (var b = 0u; b < n4(); b += WG * U) {
        let v = strided(b, li);
#unroll U u
        let k$u = okey(v[$u]);
        let in$u = live(b + $uu * WG + li) & ((k$u & vec4<u32>(mask)) == vec4<u32>(key));
#unroll 4 c
        if (in$u[$c]) { atomicAdd(&hist[(k$u[$c] >> shift) & 255u], 1u); }
#end
#end
    }
    workgroupBarrier();
}

// Top-k's threshold, the key of the k-th largest live logit (the largest key that at least k keys
// reach), most significant byte first; and the number of keys that reach it (k and the ties with the
// k-th). Each byte: thread t takes bin 255 - t, a scan counts the keys in the bins above and through
// it, and the one thread where the count from the top reaches k picks its bin. Once that count is
// exactly k, every key with the bits picked so far is kept: those bits (the rest 0) are as good a
// threshold, and the later passes are skipped.
fn top_k_key(li: u32, top_k: u32) -> vec2<u32> {
    var key = 0u;
    var mask = 0u;         // the bits picked so far
    var above = 0u;        // keys greater than every key with those bits
    var r = vec3<u32>();
    for (var s = 24; s >= 0; s -= 8) {
        histogram(li, key, mask, u32(s));
        let bin = 255u - min(li, 255u);
        let c = scan(li, select(0.0, f32(atomicLoad(&hist[bin])), li < 256u));  // counts < 2^24: exact
        let before = above + u32(c.x);
        let through = above + u32(c.y);
        if (li < 256u && before < top_k && through >= top_k) { picked = vec3<u32>(bin, before, through); }
        r = workgroupUniformLoad(&picked);
        key |= r.x << u32(s);
        mask |= 0xFFu << u32(s);
        above = r.y;
        if (r.z == top_k) { break; }
    }
    return vec2<u32>(key, r.z);
}

// Copies the live logits with keys in [lo, hi] into kid / kv from `base` in id order, at most `cap` of
// them: each thread counts them in its range, a scan gives each its offset, and the threads that have
// any read their range again to write them. Returns how many it copied.
fn compact(li: u32, lo: u32, hi: u32, base: u32, cap: u32) -> u32 {
    let r = range(li);
    var c = 0u;
    for (var j0 = r.x; j0 < r.y; j0 += U) {
        let v = chunk(j0, r.y);
#unroll U u
        c += dot(select(vec4<u32>(0u), vec4<u32>(1u), within(v[$u], in_range(j0 + $uu, r.y), lo, hi)), vec4<u32>(1u));
#end
    }
    let sums = scan(li, f32(c));                 // counts < 2^24: exact
    var o = u32(sums.x);
    if (c > 0u && o < cap) {
        for (var j0 = r.x; j0 < r.y; j0 += U) {
            let v = chunk(j0, r.y);
#unroll U u
            let ok$u = within(v[$u], in_range(j0 + $uu, r.y), lo, hi);
#unroll 4 c
            if (ok$u[$c] && o < cap) {
                kid[base + o] = 4u * (j0 + $uu) + $cu;
                kv[base + o] = v[$u][$c];
                o++;
            }
#end
#end
        }
    }
    workgroupBarrier();
    return min(u32(sums.z), cap);
}

// The unnormalised probability mass of the live logits with key >= k.
fn tally(li: u32, k: u32, m: f32) -> f32 {
    var c = vec4<f32>(0.0);
    for (var b = 0u; b < n4(); b += WG * U) {
        let v = strided(b, li);
#unroll U u
        c += weight(v[$u], live(b + $uu * WG + li), k, m);
#end
    }
    return wg_sum(c.x + c.y + c.z + c.w);
}

// Top-p's threshold over what top-k kept (tk): the largest key whose mass (the logits' at or above
// it) reaches top_p of tk's, by bisection over the whole vocabulary. Searched from 0: the answer
// need not share tk's bits; the mass at tk always reaches `need`.
fn top_p_key(li: u32, tk: u32, m: f32, top_p: f32) -> u32 {
    if (top_p >= 1.0) { return tk; }
    let need = top_p * tally(li, tk, m);
    var t = 0u;
    for (var b = 31; b >= 0; b--) {
        let c = t | (1u << u32(b));
        if (tally(li, c, m) >= need) { t = c; }
    }
    return max(t, tk);
}

// The survivors' draw weights into kw; returns the largest logit's index, which is its lowest id
// (found by every thread: the survivors are in id order).
fn weigh(li: u32, n: u32) -> u32 {
    var i = 0u;
    for (var j = 1u; j < n; j++) {
        if (kv[j] > kv[i]) { i = j; }
    }
    for (var j = li; j < n; j += WG) { kw[j] = weight(vec4<f32>(kv[j]), vec4<bool>(true), 0u, kv[i]).x; }
    workgroupBarrier();
    return i;
}

// Top-p's threshold over the n survivors (all with key >= tk): the bisection's answer is one of their
// keys, the largest whose mass (the survivors' at or above it) reaches top_p of theirs. Each thread
// finds the masses at its survivors' keys by reading all n weights (the same address in every thread:
// a broadcast), and the largest that qualifies wins: no reduction's barriers, O(n) per thread. top_p
// 0 puts it past every key, as the bisection does: nothing is kept and the draw falls back to the argmax.
fn top_p_survivors(li: u32, tk: u32, n: u32, top_p: f32) -> u32 {
    if (top_p >= 1.0) { return tk; }
    if (li == 0u) { atomicStore(&top_p_max, select(tk, 0xFFFFFFFFu, top_p <= 0.0)); }
    workgroupBarrier();
    var total = 0.0;
    for (var j = 0u; j < n; j++) { total += kw[j]; }
    for (var i = li; i < n; i += WG) {
        let k = key1(i);
        var mass = 0.0;
        for (var j = 0u; j < n; j++) { mass += weight1(j, k); }
        if (mass >= top_p * total) { atomicMax(&top_p_max, k); }
    }
    workgroupBarrier();
    return atomicLoad(&top_p_max);
}

// The draw over the tokens with key >= k (the n survivors, or the whole vocabulary when n > C): each
// thread sums the weights of a contiguous range in id order, a scan places the ranges in [0, total),
// and the thread whose range holds u * total walks it to the token where the running sum passes the
// goal. `am`, the largest logit's id, only if nothing has weight (top_p 0) or rounding left no owner.
fn draw(li: u32, pos: u32, k: u32, m: f32, am: u32, n: u32) -> u32 {
    let full = n > C;
    let per = (n + WG - 1u) / WG;
    let r = select(vec2<u32>(min(li * per, n), min(li * per + per, n)), range(li), full);
    var s = 0.0;
    if (full) {
        var s4 = vec4<f32>(0.0);
        for (var j0 = r.x; j0 < r.y; j0 += U) {
            let w = chunk_weights(j0, r.y, k, m);
#unroll U u
            s4 += w[$u];
#end
        }
        s = s4.x + s4.y + s4.z + s4.w;
    } else {
        for (var i = r.x; i < r.y; i++) { s += weight1(i, k); }
    }
    if (li == 0u) { atomicStore(&chosen, 0xFFFFFFFFu); }
    // thread li owns [before, after): the previous thread's inclusive sum to its own, so the ranges
    // tile [0, total) exactly
    let sums = scan(li, s);
    let goal = f32(pcg(pcg(p.seed) ^ (pos * 2654435761u)) >> 8u) / 16777216.0 * sums.z;
    if (s > 0.0 && goal >= sums.x && (goal < sums.y || sums.y >= sums.z)) {
        var acc = sums.x;
        var last = 0u;
        if (full) {
            var found = false;
            for (var j0 = r.x; j0 < r.y; j0 += U) {
                let w = chunk_weights(j0, r.y, k, m);
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
        } else {
            for (var i = r.x; i < r.y && acc <= goal; i++) {
                let w = weight1(i, k);
                if (w > 0.0) { last = kid[i]; acc += w; }
            }
        }
        atomicMin(&chosen, last);
    }
    workgroupBarrier();
    let tok = atomicLoad(&chosen);
    return select(tok, am, tok == 0xFFFFFFFFu);
}

#if LOGPROBS
// The log-sum-exp of batch row b at temperature 1, from its parts' (max, sum of exp(v - max)).
fn log_sum_exp(li: u32, b: u32) -> f32 {
    var m = -3.4e38;
    for (var i = li; i < PARTS; i += WG) { m = max(m, lse_parts[b * PARTS + i].x); }
    let mx = wg_max(m);
    var s = 0.0;
    for (var i = li; i < PARTS; i += WG) {
        let q = lse_parts[b * PARTS + i];
        s += q.y * exp(q.x - mx);
    }
    return mx + log(wg_sum(s));
}
// The `top` most likely tokens and their log-probabilities into lp_out from o: the top-th largest
// key by top_k_key, the keys above it and then as many of its ties as are left (lowest ids first)
// compacted, each placed by its rank among them.
fn top_logprobs(li: u32, top: u32, o: u32, lse: f32) {
    let k = top_k_key(li, top).x;
    let above = compact(li, k + 1u, 0xFFFFFFFFu, 0u, top);
    let n = above + compact(li, k, k, above, top - above);
    if (li < n) {
        var r = 0u;
        for (var j = 0u; j < n; j++) {
            r += u32(kv[j] > kv[li] || (kv[j] == kv[li] && kid[j] < kid[li]));
        }
        lp_out[o + 2u * r] = bitcast<f32>(kid[li]);
        lp_out[o + 2u * r + 1u] = kv[li] - lse;
    }
}
#endif
@compute @workgroup_size({{WG}})
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    red_lane = li;
#if BATCH
    let s = rows[wid.x];
    if (s == NONE) { return; }
    let prm = params[s];             // read here, not from p: a private variable is not uniform to Tint
    p = prm;
    row_base = wid.x * n4();
    let pos = seq_pos[s] + 1u;          // position the new token will take
#else
    let prm = p;
    let pos = st.pos + st.n;            // position the new token will take
#endif
    var tok = 0u;
    var am = 0u;                        // the largest logit's id
    if (prm.temperature <= 0.0) {
        tok = argmax(li);
        am = tok;
    } else {
        var tk = 0u;                    // top-k threshold key (0: every logit)
        var n = C + 1u;                 // how many reach it, where known; over C: not compacted
        if (prm.top_k > 0u && prm.top_k < prm.vocab) {
            let t = top_k_key(li, prm.top_k);
            tk = t.x;
            n = t.y;
        }
        var m = 0.0;                    // the largest logit
        var tp = 0u;                    // top-p threshold key
        if (n <= C) {
            compact(li, tk, 0xFFFFFFFFu, 0u, C);
            let i = weigh(li, n);
            am = kid[i];
            m = kv[i];
            tp = top_p_survivors(li, tk, n, prm.top_p);
        } else {
            am = argmax(li);
            m = at(am / 4u)[am % 4u];
            tp = top_p_key(li, tk, m, prm.top_p);
        }
        tok = draw(li, pos, tp, m, am, n);
    }
#if BATCH
    if (li == 0u) {
        tokens[s * HIST + pos] = tok;
        seq_pos[s] = pos;
    }
#if LOGPROBS
    let lse = log_sum_exp(li, wid.x);
    let o = (s * HIST + pos) * (1u + 2u * TOPN);
    if (li == 0u) { lp_out[o] = at(tok / 4u)[tok % 4u] - lse; }
    let top = min(min(prm.top_logprobs, TOPN), prm.vocab);
    if (top > 0u) { top_logprobs(li, top, o + 1u, lse); }
#endif
#else
    if (li == 0u) {
        tokens[st.tok + st.n] = tok;
        st.pos = st.pos + st.n;
        st.tok = st.tok + st.n;
        st.n = 1u;
        st.out_row0 = 0u;
    }
#endif
}
