// Causal grouped-query attention for a prompt chunk, tiled as flash attention: a workgroup takes BQ
// consecutive queries of one head and walks the keys they can see BK at a time. Each key tile (the
// cache's f16 K and V, converted to f32) is loaded into workgroup memory once for all BQ queries: K
// first, then V into the same buffer once the scores are taken. Scores go through an online softmax
// (running max and sum per query row; the output rescaled as the max grows); keys outside a query's
// causal range or sliding window weigh zero, and tiles wholly before the window are never visited.
// Both products are blocked in registers, so that each workgroup load feeds several multiply-adds
// (the kernel is bound by those loads otherwise):
//   scores: a thread takes SR (2) query rows x SK keys, loading SR q quads and SK K vec4s a step of 4 dims;
//   output: a thread takes PR (4) query rows x OV vec4s of the head, a vec4 of weights (the tile's
//   weights are stored key-major) and OV V vec4s a key.
// q is held as f16 pairs (as K is in the cache), which leaves room for these tiles.
// Threads scoring a row keep its running max (the tile's from their partial maxima in workgroup
// memory); threads summing a row's output keep its running sum. Needs BQ * BK = SR WG SK, BQ * H4 =
// PR WG OV and BK * H4 a multiple of WG (ops.prefill_attention_tile_ok).
// PAGED: the cache rows of a paged KV cache (paged.wgsl), for the sequence in st.seq.
// RAGGED (a prompt pass over several sequences, batch_rows.wgsl): grid z is the sequence, whose rows,
// slot and first position its table entry gives; its queries are tiled from its first row, as a pass
// of that sequence alone would tile them.
// SINKS (gpt-oss): each head's learned logit joins the softmax's denominator and weighs no value.
#include state
#include kv_rows
#if RAGGED
#include batch_rows
#endif

struct P { n_heads: u32, n_kv: u32, hd: u32, window: u32, scale: f32, softcap: f32, rope_dim: u32, zero: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> qkv: array<f32>;
@group(0) @binding(3) var<storage, read> kc: array<u32>;
@group(0) @binding(4) var<storage, read> vc: array<u32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
#if SINKS
@group(0) @binding(9) var<storage, read> sinks: array<f32>;
#endif

const WG: u32 = {{WG}}u;
const BQ: u32 = {{BQ}}u;          // queries a workgroup
const BK: u32 = {{BK}}u;          // keys a tile
const HD: u32 = {{HD}}u;
const H4: u32 = HD / 4u;          // vec4s of a head
const SR: u32 = {{SR}}u;          // query rows a thread scores
const SK: u32 = {{SK}}u;          // keys a thread scores: BQ BK / (SR WG)
const SKT: u32 = BK / SK;         // threads across a tile's keys
const PR: u32 = {{PR}}u;          // query rows of a thread's output (a vec4 of weights)
const OV: u32 = {{OV}}u;          // vec4s of a thread's output rows: H4 BQ / (PR WG)
const OVT: u32 = H4 / OV;         // threads across a head
const LD: u32 = {{LD}}u;          // vec4s of K (and of V) a thread loads a tile: BK H4 / WG
const QS: u32 = H4 + 1u;          // a query's stride in qs (f16 quads): rows a warp scores on distinct banks
const KS: u32 = H4 + 1u;          // a key's stride in kv (vec4s): likewise for its keys
const PS: u32 = BQ + 4u;          // a key's stride in pw (floats)
const MASKED: f32 = -3.0e38;

var<workgroup> qs: array<vec2<u32>, BQ * QS>;    // [query][dim / 4] as f16 quads, scaled
var<workgroup> kv: array<vec4<f32>, BK * KS>;    // [key][dim / 4]: the tile's K, then its V
var<workgroup> pw: array<f32, BK * PS>;          // [key][query]: the tile's softmax weights
var<workgroup> pm: array<f32, SKT * BQ>;         // [thread across the keys][query]: partial maxima
var<workgroup> rs: array<f32, BQ>;               // [query]: the tile's rescale, at the end the max

// A thread's share of a key tile (LD vec4s of K and of V, f16 pairs as loaded), in registers: the next
// tile's loads are in flight while this one is scored and weighed.
struct Tile {
#unroll LD c
    k$c: vec2<u32>,
    v$c: vec2<u32>,
#end
}

fn f16x4(w: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));
}

fn load_tile(li: u32, seq: u32, kvh: u32, k0: u32, last: u32) -> Tile {
    var t: Tile;
#unroll LD c
    {
        let i = li + $cu * WG;
        let r = ((kv_at(seq, min(k0 + i / H4, last)) * p.n_kv + kvh) * H4 + i % H4) * 2u;
        t.k$c = vec2<u32>(kc[r], kc[r + 1u]);
        t.v$c = vec2<u32>(vc[r], vc[r + 1u]);
    }
#end
    return t;
}

fn store_k(li: u32, t: Tile) {
#unroll LD c
    {
        let i = li + $cu * WG;
        kv[(i / H4) * KS + i % H4] = f16x4(t.k$c);
    }
#end
}

fn store_v(li: u32, t: Tile, k0: u32, last: u32) {
#unroll LD c
    {
        let i = li + $cu * WG;
        // unwritten rows could hold NaNs, and 0 * NaN is NaN
        kv[(i / H4) * KS + i % H4] = select(vec4<f32>(0.0), f16x4(t.v$c), k0 + i / H4 <= last);
    }
#end
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let h = wid.x;
#if RAGGED
    let e = 4u * wid.z;                           // (first row, rows, slot, first position)
    let tq = wid.y * BQ;
    if (tq >= rows[e + 1u]) { return; }
    let t0 = rows[e] + tq;
    let seq = rows[e + 2u];
    let nq = min(BQ, rows[e + 1u] - tq);          // queries of this tile in the sequence
    let pos0 = rows[e + 3u] + tq;                 // the first query's position
#else
    let t0 = wid.y * BQ;
    if (t0 >= st.n) { return; }
    let seq = st.seq;
    let nq = min(BQ, st.n - t0);                  // queries of this tile in the batch
    let pos0 = st.pos + t0;                       // the first query's position
#endif
    let kvh = h / (p.n_heads / p.n_kv);
    let last = pos0 + nq - 1u;                    // the last query's: no key past it is visible
    let stride = (p.n_heads + 2u * p.n_kv) * HD;
    for (var i = li; i < BQ * H4; i += WG) {
        let o = (t0 + min(i / H4, nq - 1u)) * stride + h * HD + (i % H4) * 4u;
        let v = vec4<f32>(qkv[o], qkv[o + 1u], qkv[o + 2u], qkv[o + 3u]) * p.scale;
        qs[(i / H4) * QS + i % H4] = vec2<u32>(pack2x16float(v.xy), pack2x16float(v.zw));
    }
    // scoring: rows sq, sq + 1 and keys sk, sk + SKT, ..; a warp's threads on distinct keys first
    let sk = li % SKT;
    let sq = (li / SKT) * SR;
    // output: rows oq .. oq + 3, head vec4s ov, ov + OVT, ..
    let ov = li % OVT;
    let oq = (li / OVT) * PR;
    // the scored rows' running maxima, kept alike by each of their threads; the output rows' sums
    var row_m = vec2<f32>(MASKED);
    var row_l = vec4<f32>(0.0);
    // keys before the first query's window start are visible to no query of the tile
    var k_lo = 0u;
    if (p.window > 0u && pos0 + 1u > p.window) { k_lo = pos0 + 1u - p.window; }
    var acc: array<vec4<f32>, PR * OV>;
    var tile = load_tile(li, seq, kvh, k_lo, last);
    for (var k0 = k_lo; k0 <= last; k0 += BK) {
        workgroupBarrier();                       // the last tile's readers are done
        store_k(li, tile);
        workgroupBarrier();
        let next = load_tile(li, seq, kvh, k0 + BK, last);  // (past the end: clamped, unused)
#unroll SK e
        var a$e = vec2<f32>(0.0);
#end
        for (var j = 0u; j < H4; j++) {
            let qa = f16x4(qs[sq * QS + j]);
            let qb = f16x4(qs[(sq + 1u) * QS + j]);
#unroll SK e
            {
                let kj = kv[(sk + $eu * SKT) * KS + j];
                a$e += vec2<f32>(dot(qa, kj), dot(qb, kj));
            }
#end
        }
        var s: array<vec2<f32>, SK>;
        var mx = vec2<f32>(MASKED);
#unroll SK e
        {
            var d = a$e;
            if (p.softcap > 0.0) { d = p.softcap * tanh(clamp(d / p.softcap, vec2<f32>(-15.0), vec2<f32>(15.0))); }
            let key = k0 + sk + $eu * SKT;
            let qp = pos0 + sq;
            let seen = vec2<bool>(sq < nq && key <= qp && (p.window == 0u || key + p.window > qp),
                                  sq + 1u < nq && key <= qp + 1u && (p.window == 0u || key + p.window > qp + 1u));
            s[$e] = select(vec2<f32>(MASKED), d, seen);
            mx = max(mx, s[$e]);
        }
#end
        pm[sk * BQ + sq] = mx.x;
        pm[sk * BQ + sq + 1u] = mx.y;
        workgroupBarrier();                       // the scores are taken: V replaces K
        store_v(li, tile, k0, last);
        var m = row_m;
        for (var j = 0u; j < SKT; j++) { m = max(m, vec2<f32>(pm[j * BQ + sq], pm[j * BQ + sq + 1u])); }
        if (sk == 0u) {                           // this tile's rescale of the rows' outputs
            rs[sq] = select(1.0, exp(row_m.x - m.x), row_m.x > MASKED);
            rs[sq + 1u] = select(1.0, exp(row_m.y - m.y), row_m.y > MASKED);
        }
        row_m = m;
#unroll SK e
        {
            let w = select(vec2<f32>(0.0), exp(s[$e] - m), s[$e] > vec2<f32>(MASKED));
            let o = (sk + $eu * SKT) * PS + sq;
            pw[o] = w.x;
            pw[o + 1u] = w.y;
        }
#end
        workgroupBarrier();
        let c = vec4<f32>(rs[oq], rs[oq + 1u], rs[oq + 2u], rs[oq + 3u]);
        row_l *= c;
#unroll 4 r
#unroll OV o
        acc[$r * OV + $o] *= c[$r];
#end
#end
        for (var kj = 0u; kj < BK; kj++) {
            let w = vec4<f32>(pw[kj * PS + oq], pw[kj * PS + oq + 1u], pw[kj * PS + oq + 2u], pw[kj * PS + oq + 3u]);
            row_l += w;
#unroll OV o
            {
                let v = kv[kj * KS + ov + $ou * OVT];
#unroll 4 r
                acc[$r * OV + $o] += w[$r] * v;
#end
            }
#end
        }
        tile = next;
    }
#if SINKS
    workgroupBarrier();
    if (sk == 0u) {
        rs[sq] = row_m.x;
        rs[sq + 1u] = row_m.y;
    }
    workgroupBarrier();
#endif
#unroll 4 r
    if (oq + $ru < nq) {
#if SINKS
        // the sink's term in the denominator, rescaled to the larger of the row's max and the sink;
        // the output by the same factor
        let rm = rs[oq + $ru];
        let mf = max(rm, sinks[h]);
        let keep = exp(rm - mf);
        let inv = keep / (row_l[$r] * keep + exp(sinks[h] - mf));
#else
        let inv = 1.0 / row_l[$r];
#endif
        let o = ((t0 + oq + $ru) * p.n_heads + h) * HD;
#unroll OV v
        {
            let d = (ov + $vu * OVT) * 4u;
            let x = acc[$r * OV + $v] * inv;
            out[o + d] = x.x; out[o + d + 1u] = x.y; out[o + d + 2u] = x.z; out[o + d + 3u] = x.w;
        }
#end
    }
#end
}
