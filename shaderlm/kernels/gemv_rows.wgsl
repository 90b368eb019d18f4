// One row group of the decode GEMV (gemv.wgsl): rows [rbase, rbase + ROWS) of token t, reduced and
// written. A function so that gemv.wgsl's DUAL variant can include it a second time as B_rows, over a
// second weight of another type (`#include gemv_rows as B_` renames the decoder and its w / p).
fn rows(rbase: u32, t: u32, li: u32, lane: u32, sg: u32, nsg: u32) {
    let xrow = XRow(t * (p.k / 4u));
    ss = 0.0;
    let bpr = p.k / WQK;          // wide blocks per row
    let chunks = bpr * CPB;
    let last = p.rows - 1u;       // rows past the end recompute the last row (result unused)
#unroll ROWS
    var acc$i = 0.0;
    let blk$i = min(rbase + $iu, last) * bpr;
#if GLU
    var up$i = 0.0;
    let ublk$i = (min(rbase + $iu, last) + p.rows) * bpr;
#endif
#end
    // STEPS chunk steps per trip (strided by the workgroup): every weight load of all of them is
    // issued before any arithmetic, so STEPS x ROWS loads per lane are in flight together whatever the
    // compiler's scheduling. A step past the row's end (when STEPS x WG does not divide the chunks)
    // loads the last chunk again and adds nothing.
    for (var c0 = li; c0 < chunks; c0 += {{WG}}u * {{STEPS}}u) {
#unroll STEPS u
        let c$u = min(c0 + $uu * {{WG}}u, chunks - 1u);
        let b$u = c$u / CPB;
        let cc$u = c$u % CPB;
#unroll ROWS
        let cw$u_$i = chunk_load(blk$i + b$u, cc$u);
#if GLU
        let cu$u_$i = chunk_load(ublk$i + b$u, cc$u);
#endif
#end
#end
        // then each step's x (from L1/L2: loaded late, to keep its registers short-lived) and dots
#unroll STEPS u
        if (c0 + $uu * {{WG}}u < chunks) {
            let xr = x_chunk(xrow, b$u, cc$u);
#if INT_DOT
            let xs = x_quant(xr);        // x as integer digits (x24, or int8); chunk_dot takes those
#else
            let xs = xr;
#endif
#unroll ROWS
            acc$i += chunk_dot(cw$u_$i, cc$u, xs);
#if GLU
            up$i += chunk_dot(cu$u_$i, cc$u, xs);
#endif
#end
        }
#end
    }
#if SUBGROUPS
#unroll ROWS
    acc$i = subgroupAdd(acc$i);
    if (lane == 0u) { part[$iu * NPART + sg] = acc$i; }
#if GLU
    up$i = subgroupAdd(up$i);
    if (lane == 0u) { part[$iu * NPART + nsg + sg] = up$i; }
#endif
#end
#if NORM
    ss = subgroupAdd(ss);
    if (lane == 0u) { norm_part[sg] = ss; }
#endif
    workgroupBarrier();
    if (li >= {{ROWS}}u || rbase + li >= p.rows) { return; }
    var s = 0.0;
    for (var i = 0u; i < nsg; i++) { s += part[li * NPART + i]; }
#if GLU
    var su = 0.0;
    for (var i = 0u; i < nsg; i++) { su += part[li * NPART + nsg + i]; }
#endif
#if NORM
    var sq = 0.0;
    for (var i = 0u; i < nsg; i++) { sq += norm_part[i]; }
#endif
#else
#unroll ROWS
    acc$i = wg_sum(acc$i);
    if (li == 0u) { part[$iu * NPART] = acc$i; }
#if GLU
    up$i = wg_sum(up$i);
    if (li == 0u) { part[$iu * NPART + 1u] = up$i; }
#endif
#end
#if NORM
    let sq = wg_sum(ss);
#endif
    workgroupBarrier();
    if (li >= {{ROWS}}u || rbase + li >= p.rows) { return; }
    var s = part[li * NPART];
#if GLU
    let su = part[li * NPART + 1u];
#endif
#endif
#if NORM
    let scale = inverseSqrt(sq / f32(p.k) + p.eps);
    s *= scale;
#if GLU
    let su_n = su * scale;
#endif
#else
#if GLU
    let su_n = su;
#endif
#endif
#if GLU
    s = act(s) * su_n;
#endif
    let row = p.row0 + rbase + li;
    write_y(t * p.y_stride + row, row, s);
}
