// Decode attention for one new token, one workgroup per query head (and per split of its keys, below);
// needs subgroups. Fuses rope_store's work: rotates q and the new K, rounds the new K/V to f16 as the
// cache holds them, and the first head of each KV group stores them.
// Each subgroup walks its own share of the keys (sg, sg + nsg, ...), UNROLL keys at a time; lanes own
// pairs of head dimensions, so K and V rows are read coalesced and a score is one subgroupAdd.
// Every load is unconditional (indices clamped, unused values dropped by select) and issued before
// any use: a load inside an `if` whose value is used in the same `if` waited a whole memory round
// trip per key on NVIDIA. Each subgroup
// keeps an online softmax (m, l, acc) and the subgroups are merged through workgroup memory at the end.
// SPLIT: a head's keys are also split over up to SPLITS workgroups (grid y), at least MINK keys each,
// so a long context keeps many workgroups busy instead of one per head walking every key. Each writes
// its partial softmax (through atomics: cross-workgroup data in one dispatch) and the last of a head's
// splits to finish, found by an atomic count, merges them. With one split busy, nothing changes.
// BATCH (a serving step): grid z is the batch row; each row has its own sequence, position, q, K/V
// and output rows; PAGED: its cache rows are in its pages of the pool (paged.wgsl). VAPART: the new V
// rows come from vnew ([row][n_kv x hd]), which their own GEMM wrote, not from qkv.
// SINKS (gpt-oss): each head's learned logit joins the softmax's denominator and weighs no value:
// applied once, where the last partials are merged (never in a split's partial).
#include state
#if PAGED
#include paged
#endif
#if BATCH
#include batch_rows
#endif

// zero: always 0; XORed into packed halves so drivers cannot fold pack/unpack into a no-op
// (seen on NVIDIA: the new K/V kept f32 precision while the cache held f16)
struct P { n_heads: u32, n_kv: u32, hd: u32, window: u32, scale: f32, softcap: f32, rope_dim: u32, zero: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;
@group(0) @binding(3) var<storage, read_write> kc: array<u32>;
@group(0) @binding(4) var<storage, read_write> vc: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read> inv_freq: array<f32>;
#if SINKS
@group(0) @binding(9) var<storage, read> sinks: array<f32>;
#endif
#if VAPART
@group(0) @binding(18) var<storage, read> vnew: array<f32>;
#endif
#if HEAD_NORM
// HEAD_NORM (Qwen3): q and the new K RMS-normed per head (weights qn, kn) before RoPE, here rather
// than in a dispatch of their own: every subgroup holds its head's whole q and k in registers.
@group(0) @binding(13) var<storage, read> qn: array<f32>;
@group(0) @binding(14) var<storage, read> kn: array<f32>;
const HN_EPS: f32 = {{HN_EPS}};
#endif
#if Q8OUT
// Q8OUT (a decode batch whose o projection is an int8 GEMM): each head's output also rounded into that
// GEMM's x blocks (quantize_q8.wgsl's layout and arithmetic, q8_block.wgsl), its x pass a dispatch
// fewer. A head's HD values are blocks h * HD / 32 .. of the batch's rows (HD a multiple of 32).
@group(0) @binding(15) var<storage, read_write> xq: array<vec4<u32>>;
@group(0) @binding(16) var<storage, read_write> xd: array<vec2<f32>>;
@group(0) @binding(17) var<storage, read_write> xs: array<vec2<f32>>;
var<workgroup> head_out: array<vec2<f32>, HD / 2u>;
#include q8_block

// head h's output pairs (in head_out) as its HD / 32 blocks, a thread each (every thread calls this)
fn round_head(li: u32, h: u32) {
    workgroupBarrier();
    if (li < HD / 32u) {
        var v: array<vec4<f32>, 8>;
        for (var i = 0u; i < 8u; i++) {
            v[i] = vec4<f32>(head_out[li * 16u + 2u * i], head_out[li * 16u + 2u * i + 1u]);
        }
        round_block(h * (HD / 32u) + li, v);
    }
}
#endif
#if SPLIT
// per (head, split): m, l, then the hd unnormalised output values, as f32 bits
@group(0) @binding(7) var<storage, read_write> part: array<atomic<u32>>;
@group(0) @binding(8) var<storage, read_write> done: array<atomic<u32>>;   // splits finished, per head
var<workgroup> is_last: u32;
#endif

const HD: u32 = {{HD}}u;
const PAIRS: u32 = {{PAIRS}}u;        // head-dim pairs per lane: ceil(HD / 2 / smallest subgroup)
const UNROLL: u32 = {{UNROLL}}u;
const SPLITS: u32 = {{SPLITS}}u;
const MINK: u32 = {{MINK}}u;
const MERGE: u32 = {{MERGE}}u;        // partials merged in workgroup memory: subgroups (at the smallest size), or splits
var<workgroup> sg_m: array<f32, MERGE>;
var<workgroup> sg_l: array<f32, MERGE>;
var<workgroup> sg_acc: array<vec2<f32>, MERGE * HD / 2u>;
var<workgroup> sg_w: array<f32, MERGE>;

#include rope

// Dimension d (v its value, other its RoPE partner's, f its pair's inv_freq) rotated to position pos.
fn rotated(d: u32, v: f32, other: f32, f: f32, first: bool, pos: u32) -> f32 {
    let cs = rope_cs_f(f, pos);
    return select(select(other * cs.y + v * cs.x, v * cs.x - other * cs.y, first), v, d >= p.rope_dim);
}

// First word of key `key`'s row for KV head kvh of the sequence in slot s; keys past qpos read
// qpos's row (loaded, unused).
fn slot(s: u32, key: u32, qpos: u32, kvh: u32, half_hd: u32) -> u32 {
#if PAGED
    return (kv_row(s, min(key, qpos)) * p.n_kv + kvh) * half_hd;
#else
    return (min(key, qpos) * p.n_kv + kvh) * half_hd;
#endif
}

// Merging n partial softmaxes held in sg_m / sg_l / sg_acc: their largest m, returned, with each
// one's weight against it in sg_w (every thread calls this: a barrier; the weights are computed once,
// a thread each, rather than in every output thread's loop); then
// the sum of their l so weighted, and output pair j (not yet divided by that sum).
fn merge_weights(li: u32, n: u32) -> f32 {
    var mg = -3.0e38;
    for (var g = 0u; g < n; g++) { mg = max(mg, sg_m[g]); }
    if (li < n) { sg_w[li] = exp(sg_m[li] - mg); }
    workgroupBarrier();
    return mg;
}
fn merged_sum(n: u32) -> f32 {
    var lg = 0.0;
    for (var g = 0u; g < n; g++) { lg += sg_l[g] * sg_w[g]; }
    return lg;
}
fn merged_out(n: u32, j: u32) -> vec2<f32> {
    var o = vec2<f32>(0.0);
    for (var g = 0u; g < n; g++) { o += sg_acc[g * (HD / 2u) + j] * sg_w[g]; }
    return o;
}
#if SINKS
// The merged softmax (max m, sum l) with head `head`'s sink in its denominator: (the factor the
// merged output and sum take, rescaled to the larger of m and the sink, and the new sum)
fn with_sink(head: u32, m: f32, l: f32) -> vec2<f32> {
    let mf = max(m, sinks[head]);
    let keep = exp(m - mf);
    return vec2<f32>(keep, l * keep + exp(sinks[head] - mf));
}
#endif

// Output row h: the n merged partials (largest m, weighted sum l) divided by l (SINKS: with head
// `head`'s sink), and with Q8OUT also rounded for the int8 GEMM after (every thread calls this)
fn write_head(li: u32, h: u32, head: u32, n: u32, m: f32, l: f32) {
    let hd = p.hd;
#if SINKS
    let sw = with_sink(head, m, l);
#endif
    for (var j = li; j < hd / 2u; j += {{WG}}u) {
#if SINKS
        let o = merged_out(n, j) * sw.x / sw.y;
#else
        let o = merged_out(n, j) / l;
#endif
        out[h * hd + 2u * j] = o.x;
        out[h * hd + 2u * j + 1u] = o.y;
#if Q8OUT
        head_out[j] = o;
#endif
    }
#if Q8OUT
    round_head(li, h);
#endif
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_size) lanes: u32,
        @builtin(subgroup_id) sg: u32, @builtin(num_subgroups) nsg: u32) {
    let split = wid.y;
    let hd = p.hd;
    let half_hd = hd / 2u;
#if BATCH
    let b = wid.z;                   // batch row
    let seq = row_slot(b);
    if (seq == NONE) { return; }
    let qpos = row_pos(b, seq);
#else
    let b = 0u;
    let seq = st.seq;
    let qpos = st.pos;
#endif
    let h = b * p.n_heads + wid.x;   // the head's index over the batch: its output row, partials and count
    let kvh = wid.x / (p.n_heads / p.n_kv);
    let qo = b * (p.n_heads + 2u * p.n_kv) * hd + wid.x * hd;
    let ko = b * (p.n_heads + 2u * p.n_kv) * hd + (p.n_heads + kvh) * hd;
#if VAPART
    let vo = (b * p.n_kv + kvh) * hd;
#else
    let vo = ko + p.n_kv * hd;
#endif
    let store = sg == 0u && wid.x % (p.n_heads / p.n_kv) == 0u && split == 0u;
    var k_lo = 0u;
    if (p.window > 0u && qpos + 1u > p.window) { k_lo = qpos + 1u - p.window; }
    // splits busy at this position; the others leave before any other load (early in a sequence
    // most of the grid)
    let nk = qpos + 1u - k_lo;
    let n_split = min(SPLITS, (nk + MINK - 1u) / MINK);
    if (split >= n_split) { return; }
    // this workgroup's keys: [k_begin, k_end)
    let per = (nk + n_split - 1u) / n_split;
    let k_begin = k_lo + split * per;
    let k_end = max(min(k_begin + per, qpos + 1u), k_begin);     // empty for a split past the keys
    // this lane's head-dimension pairs (lanes past the head load a valid pair, unused)
#unroll PAIRS c
    let j$c = lane + $cu * lanes;
    let jj$c = min(j$c, half_hd - 1u);
#end
    // the first trip's K/V words, loaded before q and the new K are read and rotated: after the new
    // K's store, the compiler could not move them above it. Each trip then loads the next trip's.
#unroll UNROLL u
#unroll PAIRS c
    var nkw$u$c = kc[slot(seq, k_begin + sg * UNROLL + $uu, qpos, kvh, half_hd) + jj$c];
    var nvw$u$c = vc[slot(seq, k_begin + sg * UNROLL + $uu, qpos, kvh, half_hd) + jj$c];
#end
#end
    // this lane's pairs of q, and of the new token's K and V as the f16 cache holds them (every
    // subgroup has them in registers; the first head of each KV group stores them). Per-pair values
    // are separate variables (#unroll): arrays indexed by a loop counter went to local memory on NVIDIA.
#unroll PAIRS c
    let d$c = 2u * jj$c;
    let pa$c = dim_pair(d$c);
    let pb$c = dim_pair(d$c + 1u);
    // all loads first (see the top)
    let fa$c = inv_freq[pa$c.x];
    let fb$c = inv_freq[pb$c.x];
    var qa$c = qkv[qo + d$c];
    var qb$c = qkv[qo + d$c + 1u];
    var qpa$c = qkv[qo + pa$c.y];
    var qpb$c = qkv[qo + pb$c.y];
    var ka$c = qkv[ko + d$c];
    var kb$c = qkv[ko + d$c + 1u];
    var kpa$c = qkv[ko + pa$c.y];
    var kpb$c = qkv[ko + pb$c.y];
#if VAPART
    let vcur_f$c = vec2<f32>(vnew[vo + d$c], vnew[vo + d$c + 1u]);
#else
    let vcur_f$c = vec2<f32>(qkv[vo + d$c], qkv[vo + d$c + 1u]);
#endif
#end
#if HEAD_NORM
    var ssq = 0.0;
    var ssk = 0.0;
#unroll PAIRS c
    if (j$c < half_hd) {
        ssq += qa$c * qa$c + qb$c * qb$c;
        ssk += ka$c * ka$c + kb$c * kb$c;
    }
#end
    let rq = inverseSqrt(subgroupAdd(ssq) / f32(hd) + HN_EPS);
    let rk = inverseSqrt(subgroupAdd(ssk) / f32(hd) + HN_EPS);
#unroll PAIRS c
    qa$c *= rq * qn[d$c];
    qb$c *= rq * qn[d$c + 1u];
    qpa$c *= rq * qn[pa$c.y];
    qpb$c *= rq * qn[pb$c.y];
    ka$c *= rk * kn[d$c];
    kb$c *= rk * kn[d$c + 1u];
    kpa$c *= rk * kn[pa$c.y];
    kpb$c *= rk * kn[pb$c.y];
#end
#endif
#unroll PAIRS c
    let live$c = j$c < half_hd;
    let q$c = select(vec2<f32>(0.0), p.scale * vec2<f32>(rotated(d$c, qa$c, qpa$c, fa$c, pa$c.z == 1u, qpos),
                     rotated(d$c + 1u, qb$c, qpb$c, fb$c, pb$c.z == 1u, qpos)), live$c);
    let kp$c = pack2x16float(vec2<f32>(rotated(d$c, ka$c, kpa$c, fa$c, pa$c.z == 1u, qpos),
                                       rotated(d$c + 1u, kb$c, kpb$c, fb$c, pb$c.z == 1u, qpos)));
    let vp$c = pack2x16float(vcur_f$c);
    if (store && live$c) {
        kc[slot(seq, qpos, qpos, kvh, half_hd) + j$c] = kp$c;
        vc[slot(seq, qpos, qpos, kvh, half_hd) + j$c] = vp$c;
    }
    let kcur$c = unpack2x16float(kp$c ^ p.zero);
    let vcur$c = unpack2x16float(vp$c ^ p.zero);
    var acc$c = vec2<f32>(0.0);
#end
    var m = -3.0e38;
    var l = 0.0;
    // keys before qpos come from the cache; qpos itself from kcur / vcur
    for (var k0 = k_begin + sg * UNROLL; k0 < k_end; k0 += nsg * UNROLL) {
        // this trip's K and V words (loaded a trip ahead), and the next trip's: one memory round trip
        // serves a whole step of UNROLL keys, and overlaps the step before
#unroll UNROLL u
        let key$u = k0 + $uu;
#unroll PAIRS c
        let kw$u$c = nkw$u$c;
        let vw$u$c = nvw$u$c;
        nkw$u$c = kc[slot(seq, key$u + nsg * UNROLL, qpos, kvh, half_hd) + jj$c];
        nvw$u$c = vc[slot(seq, key$u + nsg * UNROLL, qpos, kvh, half_hd) + jj$c];
#end
#end
#unroll UNROLL u
#unroll PAIRS c
        let kv$u$c = select(kcur$c, unpack2x16float(kw$u$c), key$u < qpos);
        let vv$u$c = select(vcur$c, unpack2x16float(vw$u$c), key$u < qpos);
#end
#end
        var mt = m;
#unroll UNROLL u
        var d$u = 0.0;
#unroll PAIRS c
        d$u += dot(q$c, kv$u$c);
#end
        var s$u = subgroupAdd(d$u);
        if (p.softcap > 0.0) { s$u = p.softcap * tanh(clamp(s$u / p.softcap, -15.0, 15.0)); }
        s$u = select(-3.0e38, s$u, key$u < k_end);
        mt = max(mt, s$u);
#end
        let corr = exp(m - mt);
        l *= corr;
#unroll PAIRS c
        acc$c *= corr;
#end
#unroll UNROLL u
        let e$u = select(0.0, exp(s$u - mt), key$u < k_end);
        l += e$u;
#unroll PAIRS c
        acc$c += e$u * vv$u$c;
#end
#end
        m = mt;
    }
    // merge the subgroups' partial softmaxes
    if (lane == 0u) { sg_m[sg] = m; sg_l[sg] = l; }
#unroll PAIRS c
    if (j$c < half_hd) { sg_acc[sg * (HD / 2u) + j$c] = acc$c; }
#end
    workgroupBarrier();
    // only the subgroups that had keys (early in a sequence most have none; theirs would add zeros)
    let busy = min(nsg, (k_end - k_begin + UNROLL - 1u) / UNROLL);
    let mg = merge_weights(li, busy);
    let lg = merged_sum(busy);
#if SPLIT
    if (n_split > 1u) {
        // this split's partial (output not yet divided by l), then count it done
        let base = (h * SPLITS + split) * (2u + hd);
        if (li == 0u) {
            atomicStore(&part[base], bitcast<u32>(mg));
            atomicStore(&part[base + 1u], bitcast<u32>(lg));
        }
        for (var j = li; j < half_hd; j += {{WG}}u) {
            let o = merged_out(busy, j);
            atomicStore(&part[base + 2u + 2u * j], bitcast<u32>(o.x));
            atomicStore(&part[base + 3u + 2u * j], bitcast<u32>(o.y));
        }
        storageBarrier();
        if (li == 0u) { is_last = u32(atomicAdd(&done[h], 1u) == n_split - 1u); }
        if (workgroupUniformLoad(&is_last) == 0u) { return; }
        storageBarrier();
        // the last of head h's splits: every split's partial into workgroup memory, a word or two per
        // thread (one round trip; a thread looping over the splits waited one per load), then merged
        // as the subgroups' were
        let b0 = h * SPLITS * (2u + hd);
        for (var i = li; i < n_split * (half_hd + 1u); i += {{WG}}u) {
            let t = i / (half_hd + 1u);
            let j = i % (half_hd + 1u);
            let bt = b0 + t * (2u + hd);
            if (j == half_hd) {
                sg_m[t] = bitcast<f32>(atomicLoad(&part[bt]));
                sg_l[t] = bitcast<f32>(atomicLoad(&part[bt + 1u]));
            } else {
                sg_acc[t * (HD / 2u) + j] = vec2<f32>(bitcast<f32>(atomicLoad(&part[bt + 2u + 2u * j])),
                                                      bitcast<f32>(atomicLoad(&part[bt + 3u + 2u * j])));
            }
        }
        workgroupBarrier();
        let gm = merge_weights(li, n_split);
        if (li == 0u) { atomicStore(&done[h], 0u); }      // ready for the next dispatch
        write_head(li, h, wid.x, n_split, gm, merged_sum(n_split));
        return;
    }
#endif
    write_head(li, h, wid.x, busy, mg, lg);
}
