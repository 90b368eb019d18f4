// The int8 GEMM for a few tokens (a decode batch's rows): y[t, row] (+)= sum_k W[row, k] * x[t, k],
// x in int8 runs (quantize_q8.wgsl: words xq, scales xd, sums xs), the weights as their bytes q (value
// d * q + m, the type's iq8). Unlike matmul_q8 nothing is staged in workgroup memory: a thread decodes a
// run of 32 of each of its R rows into registers once and dots it with every token's run (x is small and
// stays in the caches). L threads share R rows, taking runs lane, lane + L, ... of K; their partial sums
// are added in lane order through workgroup memory at the end. TS such groups share the same rows, each
// taking NT of the tokens (fewer registers a thread; each decodes the rows' runs, from L1 after the
// first). A token's arithmetic depends on K and L alone, not on the batch, R, TS or the other tokens.
// The folds are matmul_q8's, per run of 32 (RUN32) or each half:
//   acc = fma(m_w, d_x * sum q_x, acc); acc = fma(f32(isum), d_w * d_x, acc)
#include quant_common
#include {{QUANT}}
#include state
#include epilogue

#include q8_bindings

#if !RAW32
// run `sub` of block blk from iq8's groups of 8 (decoders with raw32 load its words a trip ahead instead)
fn iq32(blk: u32, sub: u32) -> IQ32 {
    let g0 = iq8(blk, 4u * sub);
    let g1 = iq8(blk, 4u * sub + 1u);
    let g2 = iq8(blk, 4u * sub + 2u);
    let g3 = iq8(blk, 4u * sub + 3u);
    return IQ32(vec4<u32>(g0.q, g1.q), vec4<u32>(g2.q, g3.q), vec2<f32>(g0.d, g2.d), vec2<f32>(g0.m, g2.m));
}
#endif

const R: u32 = {{R}}u;            // rows a thread
const L: u32 = {{L}}u;            // threads sharing rows (across K)
const TS: u32 = {{TS}}u;          // groups of L threads sharing rows (across tokens)
const NT: u32 = {{NT}}u;          // tokens a thread: TS x NT at least the batch's
const WG: u32 = {{WG}}u;          // threads a workgroup
const BM: u32 = WG / (L * TS) * R;     // rows a workgroup (WG a multiple of L x TS)
const RPB: u32 = QK / 32u;             // runs of 32 a block

// [row of the workgroup][token (TS x NT)][lane]
var<workgroup> part: array<f32, {{PART}}>;

// see matmul_q8.wgsl: integer sums start at the bits of RND, a subtract makes them floats
const SUM0: i32 = 0x4B400000;
fn i2f(v: i32) -> f32 { return bitcast<f32>(v) - RND; }

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let first = select(0u, st.out_row0, p.first_from_state != 0u);
    let m = min(st.n - first, p.max_tokens);            // every index below stays in the host's buffers
                                                        // (kernels.UNCHECKED: compiled without checks)
    let lane = li % L;
    let t0 = (li / L) % TS * NT;                        // this thread's first token
    let r_base = (wid.x + wid.y * nwg.x) * BM;          // grid_1d: y past the per-dimension limit
    let r0 = r_base + li / (L * TS) * R;
    let nb = p.k / 32u;
    let bpr = p.k / QK;
#unroll R r
#unroll NT t
    var a$r_$t = 0.0;
#end
#end
    // loop-invariant row bases: each row's first block, each token's first x block
#unroll R r
    let w$r = min(r0 + $ru, p.rows - 1u) * bpr;
#end
#unroll NT t
    let x$t = min(t0 + $tu, m - 1u) * nb;
#end
    // L is a multiple of a block's runs: a thread takes the same run `sub` of every block it visits
    let sub = lane % RPB;
    let step = L / RPB;
    var blk = lane / RPB;
#if RAW32
    // each row's raw run of the thread's next block is loaded a trip ahead: its latency hides behind this
    // trip's dots (clamped blocks past the end: loads stay unconditional)
#unroll R r
    var n$r = raw32(w$r + min(blk, bpr - 1u), sub);
#end
#endif
    for (; blk < bpr; blk += step) {
        let run = blk * RPB + sub;
#if RAW32
#unroll R r
        let g$r = dq32(n$r, sub);
        n$r = raw32(w$r + min(blk + step, bpr - 1u), sub);
#end
#else
#unroll R r
        let g$r = iq32(w$r + blk, sub);
#end
#endif
#unroll NT t
        {
            let xb = x$t + run;
            let x0 = xq[2u * xb];
            let x1 = xq[2u * xb + 1u];
            let d = xd[xb];
#if MINS
            let s = xs[xb];
#endif
#unroll R r
            {
#if RUN32
                let v = i2f(SUM0 + dot4I8Packed(g$r.a.x, x0.x) + dot4I8Packed(g$r.a.y, x0.y)
                            + dot4I8Packed(g$r.a.z, x0.z) + dot4I8Packed(g$r.a.w, x0.w)
                            + dot4I8Packed(g$r.b.x, x1.x) + dot4I8Packed(g$r.b.y, x1.y)
                            + dot4I8Packed(g$r.b.z, x1.z) + dot4I8Packed(g$r.b.w, x1.w));
#if MINS
                a$r_$t = fma(g$r.m.x, s.x + s.y, a$r_$t);
#endif
                a$r_$t = fma(v, g$r.d.x * d.x, a$r_$t);
#else
                let v0 = i2f(SUM0 + dot4I8Packed(g$r.a.x, x0.x) + dot4I8Packed(g$r.a.y, x0.y)
                             + dot4I8Packed(g$r.a.z, x0.z) + dot4I8Packed(g$r.a.w, x0.w));
                let v1 = i2f(SUM0 + dot4I8Packed(g$r.b.x, x1.x) + dot4I8Packed(g$r.b.y, x1.y)
                             + dot4I8Packed(g$r.b.z, x1.z) + dot4I8Packed(g$r.b.w, x1.w));
#if MINS
                a$r_$t = fma(g$r.m.x, s.x, a$r_$t);
#endif
                a$r_$t = fma(v0, g$r.d.x * d.x, a$r_$t);
#if MINS
                a$r_$t = fma(g$r.m.y, s.y, a$r_$t);
#endif
                a$r_$t = fma(v1, g$r.d.y * d.y, a$r_$t);
#endif
            }
#end
        }
#end
    }
    let row_l = li / (L * TS) * R;
#unroll R r
#unroll NT t
    part[((row_l + $ru) * TS * NT + t0 + $tu) * L + lane] = a$r_$t;
#end
#end
    workgroupBarrier();
    for (var o = li; o < BM * TS * NT; o += WG) {
        var s = 0.0;
        for (var l = 0u; l < L; l++) {
            s += part[o * L + l];
        }
        let row = r_base + o / (TS * NT);
        let t = o % (TS * NT);
        if (row < p.rows && t < m) {
            let yr = p.row0 + row;
            write_y(t * p.y_stride + yr, yr, s);
        }
    }
}
