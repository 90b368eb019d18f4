"""A ceiling for a persistent decode step: can one dispatch per token, with grid barriers between the
phases, stream an 8B step's weights faster than the chain of dispatches we run now?

Round 13 (`kernel_chain.py --stream`) put the current structure's ceiling at 482 tok/s on 8B
Q4_K_M: every GEMV replaced by a pure stream, 5 dependent dispatches a layer. Round 12
(`grid_barrier.py`) measured one phase size at a time and found a persistent kernel 2-4 us a phase
ahead. This script models the whole token instead: 32 layers of [QKV 15.2 MB, attention, o 9.4 MB,
gate+up 66.1 MB, down 48.2 MB] and the 431 MB head (4,876 MB, our byte count for 8B Q4_K_M), each
weight phase a pure stream over its own region of a 1.9 GB buffer (so L2 never holds a phase's
bytes), each reading the previous phase's output x in full (atomicLoad unless :plainx, checked
against what its writer stored) and writing its own. Attention is modelled by the first 32 workgroups walking a chain
of CHAIN dependent loads (each address taken from the last load), the rest of the grid idle.

Variants (--modes; `chain` is on unless --no-chain):
  chain        one dispatch per phase, one trip of U vec4 loads per thread (every workgroup reads
               the whole x, so this grid of thousands of workgroups pays for x far more than a GEMV)
  chainG       one dispatch per phase on the persistent variants' grid (G workgroups): the same
               work as persist, with dispatch boundaries instead of grid barriers
  persist      one dispatch per token: G resident workgroups of WG lanes loop over the phases,
               separated by a grid barrier (an atomic count; lane 0 spins, then workgroupBarrier)
  +pre         each phase's first trip of U loads a lane is issued before its barrier wait, so the
               DRAM is busy while the grid waits for the last phase's stragglers
  +force       the same, with the wait made to depend on the prefetched words, so the compiler cannot
               sink the loads past the spin
and suffixes: :alu (each loaded vec4 dotted as the x24 GEMV dots a Q4_K chunk: 24 dot4I8Packed, the
nibble masks, the low nibbles against one x run's three digit words and the high ones against
another's, so a phase carries a GEMV's arithmetic and x registers, not just its loads; :alu1 uses
one run's digits for both, the first version measured), :plainx (x through
plain loads and stores, a region a phase, instead of atomics), :nox (x not read) and :nobar (no
barrier wait: wrong x, counted as bad reads; timing only).

A persistent grid must be resident all at once (WebGPU does not promise it): a wait that spins
past its limit raises an abort flag, every wait then gives up, and the row reports the timeouts.
Not on lavapipe (llvmpipe ends loops after 65,535 trips).

    python bench/persistent_step.py [--groups 132,264] [--wg 256,512] [--unroll 4,8] [--chain 6]\
        [--modes chainG,persist,persist+force] [--no-chain]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from grid_barrier import grid_wait, timed_median, timed_run  # noqa: E402
from shaderlm.bench import peak_read_gbs          # noqa: E402
from shaderlm.gpu.device import get_device        # noqa: E402

# 8B Q4_K_M (Llama 3.1 shapes): MB of weights a phase, and the x values each phase reads and writes
LAYER = [("qkv", 15.24, 4096, 6144), ("attn", 0.0, 6144, 4096), ("o", 9.44, 4096, 4096),
         ("gate_up", 66.06, 4096, 14336), ("down", 48.17, 14336, 4096)]
HEAD = ("head", 431.0, 4096, 128256)
ISSUE_GB = 5.30     # issue #3's bytes a token for 8B Q4_K_M (the whole file, token_embd included)
XMAX = 131072
XREG = 16384        # x slots a phase with plain x (a region each; the head's output, last, runs past)
BUF = 1_900_000_000
ATT_GROUPS, ATT_ROWS = 32, 128       # query heads, output values a head


def phase_table(layers: int, buf: int):
    """(offset in vec4, vec4 count, x in, x out) per phase; regions laid end to end, wrapping."""
    rows, off, total = [], 0, 0
    for _, mb, xin, xout in LAYER * layers + [HEAD]:
        n = min(int(mb * 1e6) // 16, buf // 16)          # lavapipe's small bindings cap the head
        n_region = n or 32768          # attention: a 0.5 MB KV region for its chain of loads
        if off + n_region > buf // 16:
            off = 0
        rows.append((off, n, xin, xout))
        off += n_region
        total += n * 16
    return np.array(rows, np.uint32), total


def kernel(wg: int, unroll: int, prefetch: bool, chain: int, xmode: str = "atomic", barrier: bool = True,
           force: bool = False, alu: int = 0) -> str:
    """xmode: atomic (x through atomicLoad/atomicStore, two slots), plain (plain loads and stores, a
    region per phase so no L1 line of an earlier phase is read), none (x not read; timing only)."""
    U = unroll
    if xmode == "atomic":
        xdecl, ld, st = "array<atomic<u32>>", "atomicLoad(&xbuf[{}])", "atomicStore(&xbuf[{}], {})"
        xin, xout = f"(lp & 1u) * {XMAX}u", f"((lp + 1u) & 1u) * {XMAX}u"
    else:
        xdecl, ld, st = "array<u32>", "xbuf[{}]", "xbuf[{}] = {}"
        xin, xout = f"lp * {XREG}u", f"(lp + 1u) * {XREG}u"
    rd = (lambda idx: ld.format(idx)) if xmode != "none" else (lambda idx: "0u")
    wr = lambda idx, v: st.format(idx, v)                               # noqa: E731
    force_dep = ("select(0u, 1u, (" + " ^ ".join(f"f{u}.x ^ f{u}.w" for u in range(unroll)) + ") == 0x9E3779B9u)"
                 if force else "0u")
    loads = lambda base, dst: "\n".join(                              # noqa: E731
        f"    {dst}{u} = wts[min({base} + {u}u * stride, last)];" for u in range(U))
    # each loaded vec4 XORed into acc, or with alu dotted as a Q4_K chunk is in the x24 GEMV (its
    # low and high nibbles, each with three dot4I8Packed a word against x digits, combined in f32)
    hi_digits = "xd0, xd1, xd2" if alu == 1 else "xe0, xe1, xe2"
    fold = ((lambda v, c: f"fs += select(0.0, q4k_x24({v}, xd0, xd1, xd2, {hi_digits}), {c});") if alu else
            (lambda v, c: f"acc ^= select(vec4<u32>(0u), {v}, {c});"))
    use = lambda base, src: "\n".join(                                 # noqa: E731
        "        " + fold(f"{src}{u}", f"{base} + {u}u * stride < end") for u in range(U))
    decl = "\n".join(f"    var f{u} = vec4<u32>(0u);" for u in range(U))
    first = loads("ph.x + gt", "f")
    return f"""
struct Prm {{ t0: u32, nph: u32, g0: u32, limit: u32, wait: u32, ntoken: u32 }}
@group(0) @binding(0) var<storage, read> wts: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> xbuf: {xdecl};
@group(0) @binding(2) var<storage, read_write> sync: array<atomic<u32>>;   // count, bad x, timeouts, abort
@group(0) @binding(3) var<uniform> prm: Prm;
@group(0) @binding(4) var<storage, read_write> sink: array<u32>;
@group(0) @binding(5) var<storage, read> table: array<vec4<u32>>;

fn xval(p: u32, i: u32) -> u32 {{ return p * 2654435761u + i * 40503u + 1u; }}

fn idot(a: vec4<u32>, b: vec4<u32>) -> i32 {{
    return dot4I8Packed(a.x, b.x) + dot4I8Packed(a.y, b.y) + dot4I8Packed(a.z, b.z) + dot4I8Packed(a.w, b.w);
}}
// as the GEMV: the low nibbles against one x run's three digit words, the high ones against another's
fn q4k_x24(v: vec4<u32>, d0: vec4<u32>, d1: vec4<u32>, d2: vec4<u32>, e0: vec4<u32>, e1: vec4<u32>,
           e2: vec4<u32>) -> f32 {{
    let lo = v & vec4<u32>(0x0F0F0F0Fu);
    let hi = (v >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu);
    return 0.5 * (65536.0 * f32(idot(lo, d2)) + f32(256 * idot(lo, d1) + idot(lo, d0)))
         - 0.25 * (65536.0 * f32(idot(hi, e2)) + f32(256 * idot(hi, e1) + idot(hi, e0)));
}}

@compute @workgroup_size({wg})
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {{
    let groups = nwg.x;
    let gt = wid.x * {wg}u + li;
    let stride = groups * {wg}u;
    var acc = vec4<u32>(0u);
    var bad = 0u;
    var fs = 0.0;
    let xd0 = vec4<u32>(gt * 2654435761u, gt ^ 0x5bd1e995u, gt * 40503u, gt + 0x9E3779B9u);
    let xd1 = xd0.yzwx ^ vec4<u32>(0x01010101u);
    let xd2 = xd0.zwxy ^ vec4<u32>(0x80808080u);
    let xe0 = xd0.wxyz + vec4<u32>(0x01020304u);
    let xe1 = xd1.wxyz + vec4<u32>(0x05060708u);
    let xe2 = xd2.wxyz + vec4<u32>(0x090A0B0Cu);
{decl}
    for (var k = 0u; k < prm.nph; k++) {{
    let lp = prm.t0 + k;                      // the phase's index in the token
    let ph = table[lp];
    let end = ph.x + ph.y;
    let last = max(end, 1u) - 1u;
{first if prefetch else ""}
    // with force, the wait depends on the prefetched words (never in practice: 1 in 2^32), so the
    // compiler must issue their loads before it spins instead of sinking them to their first use
    let dep = {force_dep};
    if (prm.wait != 0u && {'true' if barrier else 'false'}) {{
{grid_wait("groups * (prm.g0 + k) + dep")}
    }}
{"" if prefetch else first}
    let xin = {xin};
    let xout = {xout};
    let check = lp > 0u && {'true' if xmode != 'none' else 'false'};
    if (ph.y == 0u) {{
        // attention: a head per workgroup (several if the grid is smaller) reads its q, k, v and walks a chain of dependent loads
        for (var h = wid.x; h < {ATT_GROUPS}u; h += groups) {{
            for (var j = li; j < 384u; j += {wg}u) {{
                let jj = h * 128u + j;
                let v = {rd('xin + jj')};
                bad += select(1u, 0u, v == xval(lp, jj) || !check);
                acc.x ^= v;
            }}
            var idx = ph.x + h * 1024u + li;
            for (var c = 0u; c < {chain}u; c++) {{
                let v = wts[idx];
                acc ^= v;
                idx = ph.x + ((v.x + (c + 1u) * 977u + h * 1024u + li) & 32767u);
            }}
            for (var j = li; j < {ATT_ROWS}u; j += {wg}u) {{
                let jj = h * {ATT_ROWS}u + j;
                {wr('xout + jj', 'select(xval(lp + 1u, jj), acc.y, acc.x == 0xDEADBEEFu && acc.z == 7u)')};
            }}
        }}
    }} else {{
        var xs = 0u;
        for (var j = li; j < ph.z; j += {wg}u) {{
            let v = {rd('xin + j')};
            bad += select(1u, 0u, v == xval(lp, j) || !check);
            xs ^= v;
        }}
        acc.x ^= xs;
        let base = ph.x + gt;
{use("base", "f")}
        for (var i = base + {U}u * stride; i < end; i += {U}u * stride) {{
{chr(10).join("            " + fold(f"wts[min(i + {u}u * stride, last)]", f"i + {u}u * stride < end") for u in range(U))}
        }}
        acc.w ^= bitcast<u32>(fs);
        for (var j = gt; j < ph.w; j += stride) {{
            {wr('xout + j', 'select(xval(lp + 1u, j), acc.y, acc.x == 0xDEADBEEFu && acc.z == 7u)')};
        }}
    }}
    storageBarrier();
    workgroupBarrier();
    if (li == 0u && prm.wait != 0u) {{ atomicAdd(&sync[0], 1u); }}
    }}
    if (bad > 0u) {{ atomicAdd(&sync[1], bad); }}
    sink[gt] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}}
"""


def run_variant(dev, wts, table, tbuf, mode, groups, wg, unroll, chain, per=0, tokens=16, reps=5):
    """Seconds a token (median of reps), and bad x reads and timed-out waits over all runs. Persistent
    modes run `per` phases a dispatch (0: the whole token)."""
    xmode = "plain" if "plainx" in mode else "none" if "nox" in mode else "atomic"
    pipe = dev.compile(kernel(wg, unroll, "+pre" in mode or "+force" in mode, chain, xmode, "nobar" not in mode,
                              "+force" in mode, 1 if ":alu1" in mode else 2 if ":alu" in mode else 0), label=mode)
    nph = len(table)
    per = per or nph
    xbuf = dev.buffer(max(2 * XMAX, (nph + 1) * XREG + XMAX) * 4)
    sync = dev.upload(np.zeros(4, np.uint32))
    limit = 200_000
    if mode.startswith("chain"):
        grids = ([max(1, -(-int(n) // (wg * unroll))) if n else ATT_GROUPS for _, n, _, _ in table]
                 if mode == "chain" else [groups] * nph)
        sink = dev.buffer(max(grids) * wg * 4)
        steps = [(dev.bind_group(pipe, [wts, xbuf, sync, dev.uniform(p, 1, 0, limit, 0, 0), sink, tbuf]), g)
                 for p, g in enumerate(grids)] * tokens
    else:
        sink = dev.buffer(groups * wg * 4)
        steps = [(dev.bind_group(pipe, [wts, xbuf, sync, dev.uniform(p0, min(per, nph - p0), t * nph + p0, limit, 1, 0),
                                        sink, tbuf]), groups)
                 for t in range(tokens) for p0 in range(0, nph, per)]

    return timed_median(lambda: timed_run(dev, pipe, steps, sync), tokens, reps, 0.5)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", default="132,264")
    ap.add_argument("--wg", default="256,512")
    ap.add_argument("--unroll", default="4,8")
    ap.add_argument("--chain", default="6", help="dependent loads in the attention phase (comma list)")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--modes", default="chainG,persist,persist+force",
                    help="chainG, or persist[+pre|+force] (+force: the wait depends on the prefetched words) with any of :plainx (plain x loads, a region a phase), :nox (no x read), "
                         ":nobar (no barrier wait; wrong x, timing only), :alu (each vec4 dotted as a Q4_K x24 chunk)")
    ap.add_argument("--no-chain", dest="with_chain", action="store_false")
    ap.add_argument("--per-dispatch", type=int, default=0,
                    help="persistent modes: phases a dispatch (5: a dispatch a layer; 0: one a token)")
    a = ap.parse_args()
    dev = get_device()
    print(f"device: {dev.name}")
    peak = peak_read_gbs(dev)
    print(f"peak read: {peak:.0f} GB/s")
    buf = min(BUF, dev.max_binding) // (1 << 26) * (1 << 26)
    table, total = phase_table(a.layers, buf)
    tbuf = dev.upload(table.reshape(-1))
    wts = dev.buffer(buf)
    chunk = np.random.default_rng(0).integers(0, 2**32, 1 << 24, dtype=np.uint32)   # 64 MB, not zeros
    for off in range(0, buf, chunk.nbytes):
        dev.write(wts, chunk, off)
    print(f"{len(table)} phases, {total / 1e6:.1f} MB a token")
    rows = []
    for ch in (int(v) for v in a.chain.split(",")):
        for wg in (int(v) for v in a.wg.split(",")):
            for u in (int(v) for v in a.unroll.split(",")):
                variants = ([("chain", 0)] if a.with_chain else []) + [
                    (m, g) for g in (int(v) for v in a.groups.split(",")) for m in a.modes.split(",")]
                for mode, g in variants:
                    dt, bad, tout = run_variant(dev, wts, table, tbuf, mode, g, wg, u, ch, a.per_dispatch)
                    us = dt * 1e6
                    tps = 1e6 / us if us == us else float("nan")
                    pct = total * tps / 1e9 / peak * 100 if us == us else float("nan")
                    rows.append((ch, wg, u, mode, g or "-", us, tps, pct, bad, tout))
                    print(f"  chain {ch} wg {wg} u {u} {mode:<12} G={g or '-':>4} {us:8.1f} us/token "
                          f"{tps:7.1f} tok/s {pct:5.1f}% peak  bad x {bad} timeouts {tout}", flush=True)
    print(f"\npeak {peak:.0f} GB/s; {total / 1e6:.1f} MB a token; 60% of it is "
          f"{0.6 * peak / ISSUE_GB:.0f} tok/s by the issue's {ISSUE_GB} GB")
    print("| attn chain | WG | vec4 a trip | variant | G | us a token | tok/s | % peak (our bytes) | bad x | timeouts |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for ch, wg, u, mode, g, us, tps, pct, bad, tout in rows:
        print(f"| {ch} | {wg} | {u} | {mode} | {g} | {us:.1f} | {tps:.1f} | {pct:.1f} | {bad} | {tout} |")


if __name__ == "__main__":
    main()
