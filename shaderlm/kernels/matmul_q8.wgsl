// Prefill GEMM on 8-bit integers: y[t, row] (+)= sum_k W[row, k] * x[t, k], with x rounded to int8
// per run (RUN32: 32 elements, else 16: the weight type's QuantType.iq8_run) by quantize_q8.wgsl (words xq,
// scales xd, sums xs) and the weights as their bytes q (value d * q + m, the type's iq8). A workgroup
// computes BM rows x BN tokens; each K step of 32 KB stages the weight tile (decoded once) and the
// activation tile in workgroup memory, two buffers so that the next step's global loads are in flight
// while this one computes. A thread owns TM rows x 4 TV tokens; of the WG threads, TL across the tokens
// (16, or fewer for a few tokens: a decode batch), RL across the rows. For each run it loads the run's words of
// its rows and tokens, then for each output sums their dot4I8Packed into an i32 and folds it at once:
//   acc = fma(m_w, d_x * sum q_x, acc); acc = fma(f32(isum), d_w * d_x, acc)
// (the first only with MINS: types whose runs have a min, QuantType.iq8_min).
// The sums live only that long: a register an output (its f32 accumulator), not an i32 one beside it,
// which leaves room for larger tiles. Runs of 32 halve the folds, whose instructions take issue slots
// the dots need (docs/performance.md).
// Rows and tokens of a thread are 4 apart in RL- and TL-lane strides so that workgroup loads do not conflict.
#include quant_common
#include {{QUANT}}
#include state
#include epilogue

// PARTIALS: K in SPLIT slices, one a grid z; a slice's sums go to y as partials [slice][token][row],
// part_tokens tokens a slice, for matmul_split.wgsl to add in order (the epilogue is its).
#include q8_bindings
#if EXPERTS
// EXPERTS: w holds each expert's p.rows rows one after another; a workgroup's tokens are one tile of
// moe_tiles.wgsl: pairs of one expert, listed in `pairs` from tile.y. A pair's x row is its id / XDIV
// (the token's, or the pair's own), its y row its id; the bias (per expert rows) follows the weight.
@group(0) @binding(8) var<storage, read> tiles: array<vec4<u32>>;
@group(0) @binding(9) var<storage, read> pairs: array<u32>;
const XDIV: u32 = {{XDIV}}u;
#endif
var<private> e_w0: u32;          // EXPERTS: the tile's expert's first weight row
var<private> e_p0: u32;          // EXPERTS: the tile's first index in pairs

// token t of the workgroup's tokens: its row of x, and of y
fn x_row(t: u32) -> u32 {
#if EXPERTS
    return pairs[e_p0 + t] / XDIV;
#else
    return t;
#endif
}
var<private> slice: u32;          // SPLIT: the workgroup's slice of K
fn put(t: u32, row: u32, v: f32) {
    let yr = p.row0 + row;
#if PARTIALS
    y[(slice * p.max_tokens + t) * p.rows + row] = v;
#else
#if EXPERTS
    write_y(pairs[e_p0 + t] * p.y_stride + yr, e_w0 + row, v);
#else
    write_y(t * p.y_stride + yr, yr, v);
#endif
#endif
}

const TL: u32 = {{TL}}u;          // threads across the tokens
const WG: u32 = {{WG}}u;          // threads a workgroup
const RL: u32 = WG / TL;          // threads across the rows
const BM: u32 = {{BM}}u;          // rows a workgroup: RL TM
const BN: u32 = {{BN}}u;          // tokens a workgroup: 4 TL TV
const RV: u32 = BM / 4u;          // vec4s across the rows
const TW: u32 = BN / 4u;          // vec4s across the tokens
const KB: u32 = {{KB}}u;          // 32-element blocks a K step
const SPLIT: u32 = {{SPLIT}}u;    // slices of K (grid z)
const NS: u32 = 2u * KB;          // 16-element groups a K step (x's and the weights' scales)
#if RUN32
const GS: u32 = 2u;               // groups a run of x
#else
const GS: u32 = 1u;
#endif
const GW: u32 = 4u;               // words a group

// [buffer][word k][row / 4] and [buffer][group][row / 4]; [buffer][word k][token / 4], [buffer][token / 4]
var<workgroup> wq: array<array<vec4<u32>, {{WQ}}>, 2>;
var<workgroup> wd: array<array<vec4<f32>, {{WS}}>, 2>;
#if MINS
var<workgroup> wm: array<array<vec4<f32>, {{WS}}>, 2>;
#endif
var<workgroup> tq: array<array<vec4<u32>, {{TQ}}>, 2>;
var<workgroup> td: array<array<vec4<f32>, {{TD}}>, 2>;
#if MINS
var<workgroup> ts: array<array<vec4<f32>, {{TS}}>, 2>;
#endif

// What one thread loads for a K step: weight groups (row, 8 elements) and activation vec4s.
struct Tile {
#unroll LW e
    w$e: IQ8,
#end
#unroll XL e
    x$e: vec4<u32>,
#end
    d: vec2<f32>,
#if MINS
    s: vec2<f32>,
#endif
}

fn load_tile(li: u32, step: u32, r_base: u32, t_base: u32, m: u32) -> Tile {
    var t: Tile;
    let bpr = p.k / QK;
    let k0 = step * 32u * KB;
    // loads are unconditional (clamped indices, results zeroed): a load under an `if` waits for its value
#unroll LW e
    {
        let i = li + $eu * WG;
        let row = r_base + i / (4u * KB);
        let kk = k0 + (i % (4u * KB)) * 8u;
        let v = iq8((e_w0 + min(row, p.rows - 1u)) * bpr + kk / QK, (kk % QK) / 8u);
        let ok = row < p.rows;
        t.w$e = IQ8(v.q, select(0.0, v.d, ok), select(0.0, v.m, ok));
    }
#end
    let nb = p.k / 32u;
#unroll XL e
    {
        let i = li + $eu * WG;
        let tok = x_row(min(t_base + i / (2u * KB), m - 1u));
        t.x$e = xq[(tok * nb + step * KB) * 2u + i % (2u * KB)];
    }
#end
    let tok = t_base + li % BN;
    let b = x_row(min(tok, m - 1u)) * nb + step * KB + min(li / BN, KB - 1u);
    let ok = tok < m;
    t.d = select(vec2<f32>(0.0), xd[b], ok);
#if MINS
    t.s = select(vec2<f32>(0.0), xs[b], ok);
#endif
    return t;
}

fn store_tile(li: u32, buf: u32, t: Tile) {
#unroll LW e
    {
        let i = li + $eu * WG;
        let r = i / (4u * KB);
        let j = i % (4u * KB);
        wq[buf][2u * j * RV + r / 4u][r % 4u] = t.w$e.q.x;
        wq[buf][(2u * j + 1u) * RV + r / 4u][r % 4u] = t.w$e.q.y;
        if (j % 2u == 0u) {
            let g = j / 2u;
            wd[buf][g * RV + r / 4u][r % 4u] = t.w$e.d;
#if MINS
            wm[buf][g * RV + r / 4u][r % 4u] = t.w$e.m;
#endif
        }
    }
#end
#unroll XL e
    {
        let i = li + $eu * WG;
        if (i < 2u * KB * BN) {
            let tok = i / (2u * KB);
            let k4 = (i % (2u * KB)) * 4u;
            let v = t.x$e;
            tq[buf][k4 * TW + tok / 4u][tok % 4u] = v.x;
            tq[buf][(k4 + 1u) * TW + tok / 4u][tok % 4u] = v.y;
            tq[buf][(k4 + 2u) * TW + tok / 4u][tok % 4u] = v.z;
            tq[buf][(k4 + 3u) * TW + tok / 4u][tok % 4u] = v.w;
        }
    }
#end
    if (li < KB * BN) {
        let tok = li % BN;
        let g = 2u * (li / BN);
        td[buf][g * TW + tok / 4u][tok % 4u] = t.d.x;
        td[buf][(g + 1u) * TW + tok / 4u][tok % 4u] = t.d.y;
#if MINS
        ts[buf][g * TW + tok / 4u][tok % 4u] = t.s.x;
        ts[buf][(g + 1u) * TW + tok / 4u][tok % 4u] = t.s.y;
#endif
    }
}

// The integer sums start at the bits of RND = 1.5 * 2^23 (SUM0), so that a sum s below 2^22 in
// magnitude reads as the float RND + s exactly, and a subtract gives s: no integer instruction beside the
// dots (their pipe is the busy one), none of the conversions (quarter rate on NVIDIA). A scale group's
// sums stay below 16 * 128 * 128 = 2^18.
const SUM0 = vec4<i32>(0x4B400000);
fn i2f(v: vec4<i32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(v) - vec4<f32>(RND);
}

fn i4(a: u32, b: vec4<u32>) -> vec4<i32> {
    return vec4<i32>(dot4I8Packed(a, b.x), dot4I8Packed(a, b.y), dot4I8Packed(a, b.z), dot4I8Packed(a, b.w));
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
#if EXPERTS
    let tile = tiles[wid.y];
    let m = tile.z;
    if (m == 0u) { return; }
    e_w0 = tile.x * p.rows;
    e_p0 = tile.y;
    let t_base = 0u;
#else
    let first = select(0u, st.out_row0, p.first_from_state != 0u);
    let m = min(st.n - first, p.max_tokens);       // every index below stays in the host's buffers
    let t_base = wid.y * BN;                       // (kernels.UNCHECKED: compiled without checks)
    if (t_base >= m) { return; }
#endif
    let r_base = wid.x * BM;
    let tr = li % RL;
    let tc = li / RL;
    // this workgroup's K steps: all, or its slice's
    slice = wid.z;
    let steps = p.k / (32u * KB * SPLIT);
    let step0 = slice * steps;
#unroll RG g
#unroll 4 c
#unroll TV h
    var a$g$c$h = vec4<f32>(0.0);
#end
#end
#end
    // a thread whose tokens all lie past the tile's m (an expert's tile half full, a prompt's last
    // tile) skips the dots; a subgroup's threads span few tc (32 / RL), so whole subgroups skip
    let dots = t_base + 4u * tc < m;
    store_tile(li, 0u, load_tile(li, step0, r_base, t_base, m));
    workgroupBarrier();
    for (var step = 0u; step < steps; step++) {
        let buf = step & 1u;
        // the next step's loads (the last step reloads its own, unused)
        let next = load_tile(li, step0 + min(step + 1u, steps - 1u), r_base, t_base, m);
        for (var g = 0u; g < NS && dots; g += GS) {
#unroll RG r
            let d$r = wd[buf][g * RV + tr + $ru * RL];
#if MINS
            let o$r = wm[buf][g * RV + tr + $ru * RL];
#endif
#end
#unroll TV h
            let xd$h = td[buf][g * TW + tc + $hu * TL];
#if MINS
#if RUN32
            let xs$h = ts[buf][g * TW + tc + $hu * TL] + ts[buf][(g + 1u) * TW + tc + $hu * TL];
#else
            let xs$h = ts[buf][g * TW + tc + $hu * TL];
#endif
#endif
#end
#if RUN32
            // a run's 8 words: those of a row vec4, then of each token vec4 in turn
#unroll RG r
            {
#unroll 8 k
                let w$k = wq[buf][(g * GW + $ku) * RV + tr + $ru * RL];
#end
#unroll TV h
                {
#unroll 8 k
                    let x$k = tq[buf][(g * GW + $ku) * TW + tc + $hu * TL];
#end
#unroll 4 c
                    let s$c = i2f(SUM0 + i4(w0[$c], x0) + i4(w1[$c], x1) + i4(w2[$c], x2) + i4(w3[$c], x3)
                                  + i4(w4[$c], x4) + i4(w5[$c], x5) + i4(w6[$c], x6) + i4(w7[$c], x7));
#if MINS
                    a$r$c$h = fma(vec4<f32>(o$r[$c]), xs$h, a$r$c$h);
#endif
                    a$r$c$h = fma(s$c, d$r[$c] * xd$h, a$r$c$h);
#end
                }
#end
            }
#end
#else
            // a run's 4 words of every row and token at once
#unroll 4 k
#unroll RG r
            let w$r_$k = wq[buf][(g * GW + $ku) * RV + tr + $ru * RL];
#end
#unroll TV h
            let x$h_$k = tq[buf][(g * GW + $ku) * TW + tc + $hu * TL];
#end
#end
#unroll RG r
#unroll 4 c
#unroll TV h
            let s$r$c$h = i2f(SUM0 + i4(w$r_0[$c], x$h_0) + i4(w$r_1[$c], x$h_1) + i4(w$r_2[$c], x$h_2)
                              + i4(w$r_3[$c], x$h_3));
#if MINS
            a$r$c$h = fma(vec4<f32>(o$r[$c]), xs$h, a$r$c$h);
#endif
            a$r$c$h = fma(s$r$c$h, d$r[$c] * xd$h, a$r$c$h);
#end
#end
#end
#endif
        }
        store_tile(li, buf ^ 1u, next);
        workgroupBarrier();
    }
#unroll RG g
#unroll 4 c
#unroll TV h
    {
        let row = r_base + (tr + $gu * RL) * 4u + $cu;
        let t = t_base + (tc + $hu * TL) * 4u;
        if (row < p.rows) {
            if (t < m) { put(t, row, a$g$c$h.x); }
            if (t + 1u < m) { put(t + 1u, row, a$g$c$h.y); }
            if (t + 2u < m) { put(t + 2u, row, a$g$c$h.z); }
            if (t + 3u < m) { put(t + 3u, row, a$g$c$h.w); }
        }
    }
#end
#end
#end
}
