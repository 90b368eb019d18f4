// Prefill GEMM on tensor cores (subgroup matrices: int8 16x16x32 products into i32; Dawn offers them):
// y[t, row] (+)= W[row] . x[t]. Scales per 32 elements would have to be applied to every 16x16 product
// through workgroup memory (the matrices are opaque), so instead both sides take one integer grid for a
// whole row: W[row] = rw[row] WX with |WX| <= LIM (rw from dequant.wgsl's ROW_MAX at load), x[t] = xd[t] XX
// (quantize_q8.wgsl's TOKEN), 16 bits each, as two int8 digits X = 256 hi + lo. A row's sum is then
// integer to the end: C = 65536 hi.hi + 256 (hi.lo + lo.hi) (lo.lo, under 2^-16 of C, is dropped), in
// two i32 accumulators over all of K, and y = rw[row] xd[t] C: about as exact as f32 x and weights.
// A workgroup: BM rows x BN tokens (gemm.TC_TILE; TC_BATCH_TILE for a decode batch of 64 rows or fewer), WG / 32
// subgroups of 32 rows x NJ 16 tokens (2 x NJ products of 16 x 16, three each 32 of K); K steps of 64
// in one workgroup buffer, the next step's words loaded into registers while this one multiplies (two
// barriers a step: as many a 64 of K as two buffers of 32 took, with twice the time for the loads to
// land). Each weight is decoded and rounded to its digits as it is staged: a thread takes EW runs of 8
// of a row, and up to XV of x's XN vec4s of digits. W4 (the types with raw8): a run's words in 16-byte
// loads, decoded when staged; other types decode (dq8) as they load.
// PARTIALS: K in SPLIT slices, one a grid z (a matrix of few tiles would leave most of the GPU idle); a
// slice's results go to y as partials [slice][token][row] for matmul_split.wgsl to add in order.
// EMULATE (tests on adapters without subgroup matrices): the matrix operations in plain WGSL (below).
#if !EMULATE
enable subgroups;
enable chromium_experimental_subgroup_matrix;
diagnostic(off, chromium.subgroup_matrix_uniformity);
#endif
#include quant_common
#include {{QUANT}}
#include state
#include epilogue
#include tc_digits

// plane: words a digit plane of xq; part_tokens: tokens a slice of the partials
struct P { k: u32, rows: u32, row0: u32, dbase: u32, y_stride: u32, first_from_state: u32, plane: u32, part_tokens: u32 }
@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> st: State;
@group(0) @binding(2) var<storage, read> w: array<WeightWord>;      // vec4s with W4 (the types with raw8)
@group(0) @binding(3) var<storage, read> rw: array<f32>;            // a row's max |W|
@group(0) @binding(4) var<storage, read> xq: array<vec4<u32>>;      // [digit][token][k / 16]
@group(0) @binding(5) var<storage, read> xd: array<f32>;            // a token's grid step
@group(0) @binding(6) var<storage, read_write> y: array<f32>;
#if BIAS
@group(0) @binding(7) var<storage, read> bias: array<f32>;
#endif

const WG: u32 = {{WG}}u;
const BM: u32 = {{BM}}u;         // rows a workgroup (gemm.TC_TILE)
const BN: u32 = {{BN}}u;
const SPLIT: u32 = {{SPLIT}}u;   // slices of K (grid z)
const NJ: u32 = {{NJ}}u;         // 16-token products a subgroup: its 16 NJ tokens
const TPR: u32 = WG / BM;        // threads a row's 64 weights (2 or 4): EW runs of 8 each
const RS: u32 = {{RS}}u;         // bytes a staged row of 64: 80, the 16 more keep a product's rows on distinct banks
const RW: u32 = RS / 4u;
const KS: u32 = {{KS}}u;         // elements of K a step: KS / 32 products a pair of fragments
const XPT: u32 = KS / 16u;       // x's vec4s a token's digit a step
const XN: u32 = 2u * XPT * BN;   // x's vec4s a K step: [digit][token][vec4]
// [digit][row or token][RW words]; after the loop, the subgroups' sums (256 words each in both)
var<workgroup> ws: array<i32, {{WSW}}u>;    // max(2 BM RW, 8 WG)
var<workgroup> xs: array<i32, {{XS}}u>;     // max(2 BN RW, 8 WG)

// The matrix operations: 16 x 32 int8 tiles of W (row-major) from ws and of x (a token's 32 bytes
// together) from xs, offsets and strides in bytes; 16 x 16 i32 sums, stored column-major into ws / xs.
#if EMULATE
// Each of a subgroup's 32 invocations holds its share, as the hardware does: row lane % 16 of W's tile,
// tokens 8 (lane / 16) .. + 8 of x's, and those 8 sums; the products by dot4I8Packed. Every index is a
// constant (#unroll, vectors): lavapipe ran loops over private arrays many times slower.
var<private> lane: u32;
struct LM { a: vec4<u32>, b: vec4<u32> }              // the row's 32 bytes
struct RM {                                           // 8 tokens' 32 bytes
#unroll 8 n
    a$n: vec4<u32>,
    b$n: vec4<u32>,
#end
}
struct CM { lo: vec4<i32>, hi: vec4<i32> }            // the sums of tokens 0-3 and 4-7
// 4 words from ws, or with `from_x` from xs (naga passes no workgroup pointers)
fn words(o: u32, from_x: bool) -> vec4<u32> {
    if (from_x) { return vec4<u32>(u32(xs[o]), u32(xs[o + 1u]), u32(xs[o + 2u]), u32(xs[o + 3u])); }
    return vec4<u32>(u32(ws[o]), u32(ws[o + 1u]), u32(ws[o + 2u]), u32(ws[o + 3u]));
}
fn load_w(off: u32) -> LM {
    let o = (off + (lane % 16u) * RS) / 4u;
    return LM(words(o, false), words(o + 4u, false));
}
fn load_x(off: u32) -> RM {
    let o = (off + 8u * (lane / 16u) * RS) / 4u;
    return RM(
#unroll 8 n
        words(o + $nu * RW, true), words(o + $nu * RW + 4u, true),
#end
    );
}
fn dot32(a: LM, xa: vec4<u32>, xb: vec4<u32>) -> i32 {
    return dot4I8Packed(a.a.x, xa.x) + dot4I8Packed(a.a.y, xa.y) + dot4I8Packed(a.a.z, xa.z) + dot4I8Packed(a.a.w, xa.w)
         + dot4I8Packed(a.b.x, xb.x) + dot4I8Packed(a.b.y, xb.y) + dot4I8Packed(a.b.z, xb.z) + dot4I8Packed(a.b.w, xb.w);
}
fn mma(a: LM, b: RM, c: CM) -> CM {
    return CM(c.lo + vec4<i32>(dot32(a, b.a0, b.b0), dot32(a, b.a1, b.b1), dot32(a, b.a2, b.b2), dot32(a, b.a3, b.b3)),
              c.hi + vec4<i32>(dot32(a, b.a4, b.b4), dot32(a, b.a5, b.b5), dot32(a, b.a6, b.b6), dot32(a, b.a7, b.b7)));
}
// token n's sum at o + (8 (lane / 16) + n) 16 + lane % 16 (column-major), into xs with `into_x`
fn store_sums(o: u32, c: CM, into_x: bool) {
    let b = o + 128u * (lane / 16u) + lane % 16u;
#unroll 8 n
    let v$n = select(c.lo, c.hi, $nu >= 4u)[$nu % 4u];
    if (into_x) { xs[b + 16u * $nu] = v$n; } else { ws[b + 16u * $nu] = v$n; }
#end
}
fn store_w(o: u32, c: CM) { store_sums(o, c, false); }
fn store_x(o: u32, c: CM) { store_sums(o, c, true); }
#else
alias LM = subgroup_matrix_left<i8, 32, 16>;
alias RM = subgroup_matrix_right<i8, 16, 32>;
alias CM = subgroup_matrix_result<i32, 16, 16>;
fn load_w(off: u32) -> LM { return subgroupMatrixLoad<LM>(&ws, off, false, RS); }
fn load_x(off: u32) -> RM { return subgroupMatrixLoad<RM>(&xs, off, true, RS); }
fn mma(a: LM, b: RM, c: CM) -> CM { return subgroupMatrixMultiplyAccumulate(a, b, c); }
fn store_w(o: u32, c: CM) { subgroupMatrixStore(&ws, o, c, true, 16u); }
fn store_x(o: u32, c: CM) { subgroupMatrixStore(&xs, o, c, true, 16u); }
#endif

#if !W4
// Types without 16-byte loads of their own: a run decoded as it is loaded.
struct Raw8 { v: V8 }
fn raw8(blk: u32, j: u32) -> Raw8 { return Raw8(dq8(blk, j)); }
fn dq8_raw(r: Raw8, j: u32) -> V8 { return r.v; }
#endif

// A thread's share of a K step as loaded: EW runs of 8 weights of one row (raw8: as few loads as its
// type allows, decoded by dq8_raw as they are staged) and XV vec4s of x's digits.
struct Stage {
#unroll EW e
    w$e: Raw8,
#end
#unroll XV e
    x$e: vec4<u32>,
#end
}

// the first element of K a thread's runs cover in a K step
fn stage_k(li: u32, step: u32) -> u32 { return step * KS + (li % TPR) * 8u * {{EW}}u; }
// where it loads them: with TAIL (K an odd multiple of 32) the last step's second half is past K, and
// those loads stay in the row (their digits are staged as zeros)
fn load_k(li: u32, step: u32) -> u32 {
#if TAIL
    return min(stage_k(li, step), p.k - 8u * {{EW}}u);
#else
    return stage_k(li, step);
#endif
}
// x's vec4 v of a token's K step, and whether it is within K
fn x_vec4(step: u32, v: u32) -> u32 {
#if TAIL
    return min(step * XPT + v, p.k / 16u - 1u);
#else
    return step * XPT + v;
#endif
}
#if TAIL
fn in_k(step: u32, v: u32) -> bool { return (step * XPT + v) * 16u < p.k; }
#endif

fn load_stage(li: u32, step: u32, r_base: u32, t_base: u32, m: u32) -> Stage {
    var s: Stage;
    let kk = load_k(li, step);
    let blk = min(r_base + li / TPR, p.rows - 1u) * (p.k / QK) + kk / QK;
#unroll EW e
    s.w$e = raw8(blk, (kk % QK) / 8u + $eu);
#end
#unroll XV e
    {
        let i = li + $eu * WG;                 // [digit][token][vec4 of the token's KS bytes]
        if (XN % WG == 0u || i < XN) {
            s.x$e = xq[(i / (XPT * BN)) * (p.plane / 4u) + min(t_base + (i % (XPT * BN)) / XPT, m - 1u) * (p.k / 16u)
                       + x_vec4(step, i % XPT)];
        }
    }
#end
    return s;
}

fn put4(o: u32, v: vec4<u32>, into_x: bool) {
    if (into_x) {
        xs[o] = i32(v.x); xs[o + 1u] = i32(v.y); xs[o + 2u] = i32(v.z); xs[o + 3u] = i32(v.w);
    } else {
        ws[o] = i32(v.x); ws[o + 1u] = i32(v.y); ws[o + 2u] = i32(v.z); ws[o + 3u] = i32(v.w);
    }
}

fn store_stage(li: u32, step: u32, s: Stage, inv: f32) {
    let o = (li / TPR) * RW + (li % TPR) * 2u * {{EW}}u;
    let j0 = load_k(li, step) % QK / 8u;
#if TAIL
    let wi = select(0.0, inv, stage_k(li, step) < p.k);
#else
    let wi = inv;
#endif
#unroll EW e
    {
        let v = dq8_raw(s.w$e, j0 + $eu);
        let d0 = digits(v.a, wi);              // (hi, lo) words of the run's first 4 weights
        let d1 = digits(v.b, wi);
        ws[o + $eu * 2u] = i32(d0.x);
        ws[o + $eu * 2u + 1u] = i32(d1.x);
        ws[o + BM * RW + $eu * 2u] = i32(d0.y);
        ws[o + BM * RW + $eu * 2u + 1u] = i32(d1.y);
    }
#end
#unroll XV e
    {
        let i = li + $eu * WG;
        if (XN % WG == 0u || i < XN) {
#if TAIL
            let x = select(vec4<u32>(0u), s.x$e, in_k(step, i % XPT));
#else
            let x = s.x$e;
#endif
            put4((i / (XPT * BN)) * BN * RW + ((i % (XPT * BN)) / XPT) * RW + (i % XPT) * 4u, x, true);
        }
    }
#end
}

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let first = select(0u, st.out_row0, p.first_from_state != 0u);
    let m = st.n - first;
    let r_base = wid.x * BM;
    let t_base = wid.y * BN;
    if (t_base >= m) { return; }             // the whole workgroup
    let sg = li / 32u;
#if EMULATE
    lane = li % 32u;
#endif
    let r0 = (sg % (BM / 32u)) * 32u;
    let c0 = (sg / (BM / 32u)) * 16u * NJ;
    let mw = rw[min(r_base + li / TPR, p.rows - 1u)];
    let inv = select(LIM / mw, 0.0, mw == 0.0);
    let steps = (p.k / SPLIT + KS - 1u) / KS;     // this workgroup's K steps: all, or its slice's
    let step0 = wid.z * steps;
#unroll 2 i
#unroll NJ j
    var h$i$j = CM();
    var c$i$j = CM();
#end
#end
    var cur = load_stage(li, step0, r_base, t_base, m);
    for (var s = 0u; s < steps; s++) {
        store_stage(li, step0 + s, cur, inv);
        workgroupBarrier();
        cur = load_stage(li, step0 + min(s + 1u, steps - 1u), r_base, t_base, m);
#unroll KU u
        {                                   // the step's KU = KS / 32 products' worth
#unroll 2 i
            let ah$i = load_w((r0 + $i * 16u) * RS + $u * 32u);
            let al$i = load_w((BM + r0 + $i * 16u) * RS + $u * 32u);
#end
#unroll NJ j
            let bh$j = load_x((c0 + $j * 16u) * RS + $u * 32u);
            let bl$j = load_x((BN + c0 + $j * 16u) * RS + $u * 32u);
#end
#unroll 2 i
#unroll NJ j
            h$i$j = mma(ah$i, bh$j, h$i$j);
            c$i$j = mma(ah$i, bl$j, c$i$j);
            c$i$j = mma(al$i, bh$j, c$i$j);
#end
#end
        }
#end
        workgroupBarrier();
    }
    // Each 16 x 16 pair of sums through workgroup memory (ws and xs; column-major: token n's 16 rows
    // together), then lane l takes row l % 16 of tokens l / 16, l / 16 + 2, ..
    let l = li % 32u;
    let o = sg * 256u;
#unroll 2 i
#unroll NJ j
    store_w(o, h$i$j);
    store_x(o, c$i$j);
    workgroupBarrier();
    {
        let row = r_base + r0 + $i * 16u + l % 16u;
        let sw = rw[min(row, p.rows - 1u)] / LIM;
        for (var e = 0u; e < 8u; e++) {
            let n = l / 16u + 2u * e;
            let t = t_base + c0 + $j * 16u + n;
            let sum = 65536.0 * f32(ws[o + n * 16u + l % 16u]) + 256.0 * f32(xs[o + n * 16u + l % 16u]);
            if (row < p.rows && t < m) {
#if PARTIALS
                y[(wid.z * p.part_tokens + t) * p.rows + row] = sw * xd[t] * sum;
#else
                write_y(t * p.y_stride + p.row0 + row, p.row0 + row, sw * xd[t] * sum);
#endif
            }
        }
    }
    workgroupBarrier();
#end
#end
}
