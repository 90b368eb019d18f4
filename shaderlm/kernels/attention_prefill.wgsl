// Causal grouped-query attention for a prompt chunk, tiled as flash attention: a workgroup takes BQ
// consecutive queries of one head and walks the keys they can see BK at a time. Each key tile (the
// cache's f16 K and V, converted to f32) is loaded into workgroup memory once for all BQ queries, so
// the cache is read once per query tile rather than once per query. Scores go through an online softmax
// (running max m and sum l per query row; the output rescaled as m grows); keys outside a query's
// causal range or sliding window weigh zero, and tiles wholly before the window are never visited.
// Every thread of a query row keeps the row's running max and sum itself (from the row's partial maxima
// in workgroup memory), so a tile takes four barriers. Needs BQ * BK >= 256, BQ * HD >= 1024 and BK * HD
// a multiple of 1024 (ops.prefill_attention_tile).
// PAGED: the cache rows of a paged KV cache (paged.wgsl), for the sequence in st.seq.
// SINKS (gpt-oss): each head's learned logit joins the softmax's denominator and weighs no value.
#include state
#include kv_rows

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

const WG: u32 = 256u;
const BQ: u32 = {{BQ}}u;          // queries a workgroup
const BK: u32 = {{BK}}u;          // keys a tile
const HD: u32 = {{HD}}u;
const H4: u32 = HD / 4u;          // vec4s of a head
const TPR: u32 = WG / BQ;         // threads a query row
const KPT: u32 = {{KPT}}u;        // keys a thread scores: BK / TPR
const OV: u32 = {{OV}}u;          // output vec4s a thread: H4 / TPR
const LD: u32 = {{LD}}u;          // vec4s of K (and of V) a thread loads a tile: BK H4 / WG
const KS: u32 = H4 + 1u;          // a key's stride in ks (vec4s): threads scoring different keys hit different banks
const QS: u32 = H4 + 1u;          // a query's stride in qs (vec4s): a subgroup's query rows on different banks
const SS: u32 = BK + 1u;          // a query's stride in sc: the same for its weights
const MASKED: f32 = -3.0e38;

// A thread scores KPT keys of one query row (each q vec4 loaded once for them) and accumulates OV
// vec4s of that row's output, so every workgroup load feeds several multiply-adds. K and V are
// converted from f16 once as they are loaded.
var<workgroup> qs: array<vec4<f32>, {{BQ_QS}}>;   // [query][dim / 4], QS apart, scaled
var<workgroup> ks: array<vec4<f32>, {{BK_KS}}>;   // [key][dim / 4], KS apart
var<workgroup> vs: array<vec4<f32>, {{BK_H4}}>;   // [key][dim / 4]
var<workgroup> sc: array<f32, {{BQ_SS}}>;         // [query][key], SS apart: softmax weights
var<workgroup> pm: array<f32, WG>;                // [thread of a row][query]: partial row maxima

// A thread's share of a key tile (LD vec4s of K and of V, f16 pairs as loaded), in registers: the next
// tile's loads are in flight while this one is scored.
struct Tile {
#unroll LD c
    k$c: vec2<u32>,
    v$c: vec2<u32>,
#end
}

fn kv_pair(w: vec2<u32>) -> vec4<f32> {
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

fn store_tile(li: u32, t: Tile, k0: u32, last: u32) {
#unroll LD c
    {
        let i = li + $cu * WG;
        ks[(i / H4) * KS + i % H4] = kv_pair(t.k$c);
        // unwritten rows could hold NaNs, and 0 * NaN is NaN
        vs[i] = select(vec4<f32>(0.0), kv_pair(t.v$c), k0 + i / H4 <= last);
    }
#end
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let h = wid.x;
    let t0 = wid.y * BQ;
    if (t0 >= st.n) { return; }
    let kvh = h / (p.n_heads / p.n_kv);
    let seq = st.seq;
    let nq = min(BQ, st.n - t0);                  // queries of this tile in the batch
    let pos0 = st.pos + t0;                       // the first query's position
    let last = pos0 + nq - 1u;                    // the last query's: no key past it is visible
    let stride = (p.n_heads + 2u * p.n_kv) * HD;
    for (var i = li; i < BQ * H4; i += WG) {
        let o = (t0 + min(i / H4, nq - 1u)) * stride + h * HD + (i % H4) * 4u;
        qs[(i / H4) * QS + i % H4] = vec4<f32>(qkv[o], qkv[o + 1u], qkv[o + 2u], qkv[o + 3u]) * p.scale;
    }
    let qi = li / TPR;                            // this thread's query row
    let lane = li % TPR;
    let qpos = pos0 + qi;
    // the row's running max and sum, kept alike by each of its threads
    var row_m = MASKED;
    var row_l = 0.0;
    // keys before the first query's window start are visible to no query of the tile
    var k_lo = 0u;
    if (p.window > 0u && pos0 + 1u > p.window) { k_lo = pos0 + 1u - p.window; }
    var acc: array<vec4<f32>, OV>;
    var tile = load_tile(li, seq, kvh, k_lo, last);
    for (var k0 = k_lo; k0 <= last; k0 += BK) {
        workgroupBarrier();                       // the last tile's readers are done
        store_tile(li, tile, k0, last);
        workgroupBarrier();
        tile = load_tile(li, seq, kvh, k0 + BK, last);      // (past the end: clamped, unused)
#unroll KPT e
        var d$e = 0.0;
#end
        for (var j = 0u; j < H4; j++) {
            let qv = qs[qi * QS + j];
#unroll KPT e
            d$e += dot(qv, ks[(lane + $eu * TPR) * KS + j]);
#end
        }
        var s: array<f32, KPT>;
        var mx = MASKED;
#unroll KPT e
        {
            let kj = lane + $eu * TPR;
            var d = d$e;
            if (p.softcap > 0.0) { d = p.softcap * tanh(clamp(d / p.softcap, -15.0, 15.0)); }
            let key = k0 + kj;
            let visible = qi < nq && key <= qpos && (p.window == 0u || key + p.window > qpos);
            s[$e] = select(MASKED, d, visible);
            mx = max(mx, s[$e]);
        }
#end
        pm[lane * BQ + qi] = mx;
        workgroupBarrier();
        var m = row_m;
        for (var j = 0u; j < TPR; j++) { m = max(m, pm[j * BQ + qi]); }
        let c = select(1.0, exp(row_m - m), row_m > MASKED);     // this tile's rescale of the row's output
        row_m = m;
#unroll KPT e
        sc[qi * SS + lane + $eu * TPR] = select(0.0, exp(s[$e] - m), s[$e] > MASKED);
#end
        workgroupBarrier();
#unroll OV o
        acc[$o] *= c;
#end
        var l = 0.0;
        for (var kj = 0u; kj < BK; kj++) {
            let w = sc[qi * SS + kj];
            l += w;
#unroll OV o
            acc[$o] += w * vs[kj * H4 + lane + $ou * TPR];
#end
        }
        row_l = row_l * c + l;
    }
    if (qi < nq) {
#if SINKS
        // the sink's term in the denominator, rescaled to the larger of the row's max and the sink;
        // the output by the same factor
        let mf = max(row_m, sinks[h]);
        let keep = exp(row_m - mf);
        let inv = keep / (row_l * keep + exp(sinks[h] - mf));
#else
        let inv = 1.0 / row_l;
#endif
        let o = ((t0 + qi) * p.n_heads + h) * HD;
#unroll OV o
        {
            let d = (lane + $ou * TPR) * 4u;
            let v = acc[$o] * inv;
            out[o + d] = v.x; out[o + d + 1u] = v.y; out[o + d + 2u] = v.z; out[o + d + 3u] = v.w;
        }
#end
    }
}
