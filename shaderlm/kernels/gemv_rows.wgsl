// The row groups of one decode-GEMV workgroup (gemv.wgsl): GROUPS groups of ROWS rows from rbase0, of
// the NT tokens from t0 (a batch: each weight chunk loaded once for all of them, each token's
// arithmetic exactly as when it runs alone), reduced and written. A function so that gemv.wgsl's DUAL
// variant can include it a second time as B_rows, over a second weight of another type
// (`#include gemv_rows as B_` renames the decoder and its w / p).
// Two ways through a row's chunks:
//   GROUPS == 1: the workgroup strides over them, STEPS chunk steps per trip, each chunk's x loaded
//     and converted (x24 / int8) for its ROWS rows.
//   HOIST (GROUPS > 1, WG x STEPS >= the chunks of a row): each lane's STEPS chunks are fixed, so
//     their x is loaded and converted once and reused for every row group; the conversion (about
//     10 operations per x element for x24) is then paid once per GROUPS x ROWS rows instead of ROWS,
//     and each group's weight loads are issued a group ahead.
fn rows(rbase0: u32, t0: u32, li: u32, lane: u32, sg: u32, nsg: u32, sgsize: u32) {
#unroll NT j
    let xrow$j = x_row(t0 + $ju, $ju);
    ss$j = 0.0;
#end
    let chunks = VSLOTS * (p.k / WQK * CPB);     // a row's chunks (CPB per wide block; EXPERT_SUM: its experts')
#if HOIST
    // HOIST: each lane's STEPS chunks (hc) are the same for every group, so their x is converted once,
    // before the groups. A step past the row's end reads x as zeros (x_on).
    // PF (a tuned choice): the first group's weights are loaded before that, and each group loads the
    // next group's before its own dots, so a lane has loads in flight while it computes. The last
    // group reloads its own rows (from cache): skipping that load in a uniform branch lost. The
    // tuner leaves it off for some keys (it holds twice the weight registers).
#unroll STEPS u
    let hc$u = min(li + $uu * {{WG}}u, chunks - 1u);
#if PF
#unroll ROWS
    var pw$u_$i = row_chunk(rbase0 + $iu, 0u, hc$u);
#if GLU
    var pu$u_$i = row_chunk(rbase0 + $iu, p.rows, hc$u);
#endif
#end
#endif
#end
#unroll STEPS u
    x_on = select(0.0, 1.0, li + $uu * {{WG}}u < chunks);
#unroll NT j
#if INT_DOT
    let xs$u_$j = x_quant(x_chunk(xrow$j, hc$u / CPB, hc$u % CPB));
#else
    let xs$u_$j = x_chunk(xrow$j, hc$u / CPB, hc$u % CPB);
#endif
#end
#end
#endif
    for (var gi = 0u; gi < {{GROUPS}}u; gi++) {
#unroll ROWS
#unroll NT j
    var acc$i_$j = 0.0;
#if GLU
    var up$i_$j = 0.0;
#endif
#end
#end
#if HOIST
#if PF
    let nbase = rbase0 + min(gi + 1u, {{GROUPS}}u - 1u) * {{ROWS}}u;     // the next group's first row
#else
    let rbase = rbase0 + gi * {{ROWS}}u;
#endif
#unroll STEPS u
#unroll ROWS
#if PF
    let cw$u_$i = pw$u_$i;
    pw$u_$i = row_chunk(nbase + $iu, 0u, hc$u);
#if GLU
    let cu$u_$i = pu$u_$i;
    pu$u_$i = row_chunk(nbase + $iu, p.rows, hc$u);
#endif
#else
    let cw$u_$i = row_chunk(rbase + $iu, 0u, hc$u);
#if GLU
    let cu$u_$i = row_chunk(rbase + $iu, p.rows, hc$u);
#endif
#endif
#end
#end
#unroll STEPS u
    if (li + $uu * {{WG}}u < chunks) {
#unroll ROWS
#unroll NT j
        acc$i_$j += chunk_dot(cw$u_$i, hc$u % CPB, xs$u_$j) * chunk_weight(hc$u);
#if GLU
        up$i_$j += chunk_dot(cu$u_$i, hc$u % CPB, xs$u_$j);
#endif
#end
#end
    }
#end
#else
    // GROUPS == 1: STEPS chunk steps per trip, strided by the workgroup: every weight load of all of
    // them is issued before any arithmetic, so STEPS x ROWS loads per lane are in flight together
    // whatever the compiler's scheduling. A step past the row's end (when STEPS x WG does not divide
    // the chunks) loads the last chunk again and adds nothing.
    for (var c0 = li; c0 < chunks; c0 += {{WG}}u * {{STEPS}}u) {
#unroll STEPS u
        let c$u = min(c0 + $uu * {{WG}}u, chunks - 1u);
        let b$u = c$u / CPB;
        let cc$u = c$u % CPB;
#unroll ROWS
        let cw$u_$i = row_chunk(rbase0 + $iu, 0u, c$u);
#if GLU
        let cu$u_$i = row_chunk(rbase0 + $iu, p.rows, c$u);
#endif
#end
#end
        // then each step's x (from L1/L2, loaded late to keep its registers short-lived) converted
        // for these ROWS rows, and the dots
#unroll STEPS u
        if (c0 + $uu * {{WG}}u < chunks) {
#unroll NT j
#if INT_DOT
            let xs$j = x_quant(x_chunk(xrow$j, b$u, cc$u));   // x as integer digits (x24, or int8)
#else
            let xs$j = x_chunk(xrow$j, b$u, cc$u);
#endif
#unroll ROWS
            acc$i_$j += chunk_dot(cw$u_$i, cc$u, xs$j) * chunk_weight(c$u);
#if GLU
            up$i_$j += chunk_dot(cu$u_$i, cc$u, xs$j);
#endif
#end
#end
        }
#end
    }
#endif
    // each row's partial sums, per token, into part (the workgroup's row rr, token j at
    // part[(rr * NT + j) * NPART]: one per subgroup, the up rows' from NPART / 2)
    let r0 = gi * {{ROWS}}u;
#unroll NT j
#if SG_BFLY
    if (sgsize == SGC) {
        bfly_rows(r0, $ju, lane, sg, {{BF_ARGS_$j}});
    } else {
#endif
#if SUBGROUPS
#unroll ROWS
    let a$i_$j = subgroupAdd(acc$i_$j);
    if (lane == 0u) { part[((r0 + $iu) * NT + $ju) * NPART + sg] = a$i_$j; }
#if GLU
    let u$i_$j = subgroupAdd(up$i_$j);
    if (lane == 0u) { part[((r0 + $iu) * NT + $ju) * NPART + NPART / 2u + sg] = u$i_$j; }
#endif
#end
#else
#unroll ROWS
    let a$i_$j = wg_sum(acc$i_$j);
    if (li == 0u) { part[((r0 + $iu) * NT + $ju) * NPART] = a$i_$j; }
#if GLU
    let u$i_$j = wg_sum(up$i_$j);
    if (li == 0u) { part[((r0 + $iu) * NT + $ju) * NPART + NPART / 2u] = u$i_$j; }
#endif
#end
#endif
#if SG_BFLY
    }
#endif
#end
    }
#if NORM
#unroll NT j
#if SUBGROUPS
    let q$j = subgroupAdd(ss$j);
    if (lane == 0u) { norm_part[$ju * NPART + sg] = q$j; }
#else
    let q$j = wg_sum(ss$j);
    if (li == 0u) { norm_part[$ju * NPART] = q$j; }
#endif
#end
#endif
    workgroupBarrier();
    // the outputs: (row, token) pairs, each written by one thread
    for (var o = li; o < {{GROUPS}}u * {{ROWS}}u * NT; o += {{WG}}u) {
        let rr = o / NT;
        let j = o % NT;
        if (rbase0 + rr < p.rows && t0 + j < NB) { row_out(rr, rbase0 + rr, t0 + j, j, nsg); }
    }
}

// The words of chunk c of row r (past the end: the last row, recomputed, its result unused) of the
// weight, or with `up` = p.rows of GLU's up half.
fn row_chunk(r: u32, up: u32, c: u32) -> CW {
#if EXPERT_SUM
    let per = p.k / WQK * CPB;
    let e = e_ids[e_slot0 + c / per];
    let ce = c % per;
    return chunk_load((e * EROWS + min(r, p.rows - 1u)) * (p.k / WQK) + ce / CPB, ce % CPB);
#else
    return chunk_load((expert_row0() + min(r, p.rows - 1u) + up) * (p.k / WQK) + c / CPB, c % CPB);
#endif
}

// EXPERT_SUM: the routing weight of chunk c's expert (else 1)
fn chunk_weight(c: u32) -> f32 {
#if EXPERT_SUM
    return e_wts[e_slot0 + c / (p.k / WQK * CPB)];
#else
    return 1.0;
#endif
}

// The workgroup's row rr (row_i of the weight) for token t (its j-th) from its partial sums: the
// norm's scale, an expert's bias (E_BIAS), the activation, the write.
fn row_out(rr: u32, row_i: u32, t: u32, j: u32, nsg: u32) {
#if SUBGROUPS
    let np = nsg;
#else
    let np = 1u;
#endif
    let pr = (rr * NT + j) * NPART;
    var s = 0.0;
    for (var i = 0u; i < np; i++) { s += part[pr + i]; }
#if GLU
    var su = 0.0;
    for (var i = 0u; i < np; i++) { su += part[pr + NPART / 2u + i]; }
#endif
#if NORM
    var sq = 0.0;
    for (var i = 0u; i < np; i++) { sq += norm_part[j * NPART + i]; }
    let scale = inverseSqrt(sq / f32(p.k) + p.eps);
    s *= scale;
#if GLU
    su *= scale;
#endif
#endif
#if E_BIAS
#if EXPERT_SUM
    for (var k = 0u; k < ESLOTS; k++) { s += e_wts[e_slot0 + k] * bias[e_ids[e_slot0 + k] * EROWS + row_i]; }
#else
    s += bias[expert_row0() + row_i];
#endif
#if GLU
    su += bias[expert_row0() + p.rows + row_i];
#endif
#endif
#if GLU
    s = glu_act(s, su);
#endif
    let row = p.row0 + row_i;
    write_y(t * p.y_stride + row, row, s);
}

#if SG_BFLY
// SG_BFLY: the group's row sums (v0.. the ROWS rows, then GLU's up rows, zeros up to BFN) reduced over
// the subgroup together, for the adapter's probed subgroup size SGC (rows() checks the one it runs
// in). Each butterfly step pairs values a lane holds: lanes with the step's mask bit clear keep the
// first of a pair and send the second to their partner, the others the reverse, so one shuffle
// halves two values; after log2(BFN) steps each lane holds one value, index lane / (size / BFN), and
// plain xor-shuffles finish it: BFN - 1 + log2(size / BFN) shuffles in all, against BFN x log2(size)
// for a subgroupAdd per value. It wins on some matrices and loses on others, so the tuner tries each
// picked shape without it too.
fn bf_pair(a: f32, b: f32, m: u32, lane: u32) -> f32 {
    let hi = (lane & m) != 0u;
    return select(a, b, hi) + subgroupShuffleXor(select(b, a, hi), m);
}
fn bfly_rows(r0: u32, j: u32, lane: u32, sg: u32, v0: f32, v1: f32, v2: f32, v3: f32, v4: f32, v5: f32,
             v6: f32, v7: f32) {
    let h = SGC / 2u;
#if BF8
    let w0 = bf_pair(v0, v4, h, lane);
    let w1 = bf_pair(v1, v5, h, lane);
    let w2 = bf_pair(v2, v6, h, lane);
    let w3 = bf_pair(v3, v7, h, lane);
    let y0 = bf_pair(w0, w2, h / 2u, lane);
    let y1 = bf_pair(w1, w3, h / 2u, lane);
    var z = bf_pair(y0, y1, h / 4u, lane);
#endif
#if BF4
    let w0 = bf_pair(v0, v2, h, lane);
    let w1 = bf_pair(v1, v3, h, lane);
    var z = bf_pair(w0, w1, h / 2u, lane);
#endif
#if BF2
    var z = bf_pair(v0, v1, h, lane);
#endif
    let per = SGC / BFN;                 // lanes that end with the same value
#unroll BF_TAIL t
    z += subgroupShuffleXor(z, per >> ($tu + 1u));
#end
    let q = lane / per;
    if (lane % per == 0u) {
        if (q < {{ROWS}}u) {
            part[((r0 + q) * NT + j) * NPART + sg] = z;
        }
#if GLU
        else if (q < 2u * {{ROWS}}u) {
            part[((r0 + q - {{ROWS}}u) * NT + j) * NPART + NPART / 2u + sg] = z;
        }
#endif
    }
}
#endif
