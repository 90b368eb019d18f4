"""Real Q4_K / Q6_K GEMV phases in a persistent dispatch, against the engine's tuned GEMV dispatches.

`persistent_step.py` put a persistent decode step at the 60% target's edge with modelled arithmetic.
This takes the next step with the engine's own decoders (quant_common + quant/q4_k or q6_k, x24
integer dots, the k4-regrouped headers): L layers of two GEMVs, A (ROWS_A x 4,096 Q4_K, a gate-like
matrix) then B (4,096 x 14,336, a down-like one: Q4_K, or with --type-b Q6_K as in Q4_K_M files),
each layer's weights distinct.
- persistent (the lean kernel): one dispatch for all 2L phases, G workgroups of WG lanes, a grid
  barrier between the phases (each phase's first chunk loaded before the wait, the wait made to
  depend on it). A lane keeps one chunk of x for the whole phase (converted to x24 digits once), so
  a workgroup is WG / (a row's chunks) slots; a slot walks the rows it is given, --rows a trip, the
  next trip's chunks loaded before this trip's dots; the trip's sums (a subgroupAdd a row, or with
  --bfly one butterfly for all its rows) go to workgroup memory and each row is summed at the phase's
  end. --type-b Q6_Kh splits each Q6_K chunk in two (Q6_HALF: half the x digits a lane), so wide
  workgroups fit in the registers; --loads-only drops the dots (a bound).
- the same kernel as a dispatch per phase (no barrier): what the barrier saves, on this GEMV code.
- the engine: ops.gemv dispatches with tuned-like shapes (A 128x2/8, B 224x2x2/8, x24, butterfly,
  prefetch), chained the same way.
With --gemv-rows the phases are gemv_rows.wgsl's row groups instead (the engine's GEMV code, A and B
each with its own shape through `#include gemv_rows as B_ with ...`), against the engine on the same
shapes and on tuned-like ones. Both results are checked against each other after one layer (same
weights, same x). A grid that is not co-resident times out (the abort flag) and shows as nan.
With --ticket the same gemv_rows phases run as one *ticketed* dispatch of the engine's own grid
(kernel_ticket: a workgroup's role comes from an atomic ticket, so it waits only on workgroups that
have started, and no co-residency is assumed), every layer's outputs checked against the engine's.
Every variant is timed 20 repeats a submit, as the engine's dispatches are (round 17 timed the
persistent rows one repeat a submit, which added 8-20 us a phase: bench/NOTES.md round 18).

    python bench/persistent_gemv.py [--layers 8] [--groups 132] [--wg 512] [--rows 1] [--small]
    python bench/persistent_gemv.py --wg 896 --rows 4 --bfly [--type-b Q6_K|Q6_Kh --tuned-b 224,2,1,8,1,1,1]
    python bench/persistent_gemv.py --gemv-rows --groups 264 --wg 128 --steps-b 4 --groups-a 28 --groups-b 8
    python bench/persistent_gemv.py --ticket --wg 128 --groups-a 28 --steps-b 4 --groups-b 8 [--variants ...]
    python bench/persistent_gemv.py --small --ticket --wg 32 --steps-b 1 --groups-a 4 --groups-b 2   (lavapipe)
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from grid_barrier import grid_wait, timed_median, timed_run   # noqa: E402
from kernel_chain import timed                      # noqa: E402
from shaderlm.gpu.device import get_device          # noqa: E402
from shaderlm.gpu.plan import Plan                   # noqa: E402
from shaderlm.gpu.weights import upload_weight       # noqa: E402
from shaderlm.kernels import expand_wgsl             # noqa: E402
from shaderlm.kernels import ops                     # noqa: E402
from shaderlm.formats.quants import QUANT_TYPES      # noqa: E402
from shaderlm.synth import _random_quant_rows        # noqa: E402

QK = 256                              # elements a block (Q4_K, Q6_K)
# the lean kernel's weight types: the GGUF type, chunks a GEMV chunk is split into (so a block has
# QuantType.wide's chunks times that), the decoder functions' prefix (the B_ decoder's by default), a
# loaded chunk's words that the grid wait is made to depend on, and x's scale (for --loads-only)
TYPES = {"Q4_K": dict(gguf="Q4_K", halves=1, key="cw.h.x ^ cw.q.y ^ cw.q.w", xd="xs.lo.d"),
         "Q6_K": dict(gguf="Q6_K", halves=1, key="cw.la.x ^ cw.lb.y ^ cw.qh.w", xd="xs.r0.d"),
         # Q6_K in half chunks (Q6_HALF below): 32 elements a lane, so half the x digits in registers
         "Q6_Kh": dict(gguf="Q6_K", halves=2, key="cw.l.x ^ cw.qh.y", xd="xs.lo.d", fn="H_")}

# Q6_K's chunk c (quant/q6_k.wgsl: runs 0..3 of 16 elements, 0 and 2 from ql word la, 1 and 3 from lb)
# split in two: half s of chunk c takes runs s and s + 2, from la (s = 0) or lb (s = 1), with qh's bits
# 2s and 4 + 2s. A lane then holds two x runs (28 words of x24 digits) instead of four (56). The same
# loads from DRAM; qh and the scales are loaded by both halves (the second from L1).
Q6_HALF = """
fn H_x_chunk(r: XRow, b: u32, hc: u32) -> array<vec4<f32>, 8> {
    let c = hc >> 1u;
    let o = b * 64u + (c >> 1u) * 32u + (c & 1u) * 4u + (hc & 1u) * 8u;
    return x_runs2(r, o, o + 16u);
}
fn H_x_quant(xr: array<vec4<f32>, 8>) -> B_XQ2 { return B_xq2(xr); }
struct HW { l: vec4<u32>, qh: vec4<u32>, sc: vec4<u32>, d: f32 }
fn H_chunk_load(blk: u32, hc: u32) -> HW {
    let c = hc >> 1u;
    let o = blk * 13u + (c >> 1u) * 4u + (c & 1u);
    return HW(B_w[o + (hc & 1u) * 2u], B_w[blk * 13u + 8u + (c >> 1u) * 2u + (c & 1u)], B_w[blk * 13u + 12u],
              B_split_d(blk));
}
fn H_chunk_dot(cw: HW, hc: u32, xq: B_XQ2) -> f32 {
    let c = hc >> 1u;
    let s = hc & 1u;
    let tl = B_rdot(B_nib_hi(cw.l, 0u, cw.qh, 2u * s, B_K6H), xq.lo) - 32.0 * xq.lo.s;
    let th = B_rdot(B_nib_hi(cw.l, 4u, cw.qh, 4u + 2u * s, B_K6H), xq.hi) - 32.0 * xq.hi.s;
    let s01 = select(cw.sc.x, cw.sc.z, (c >> 1u) == 1u);
    let s23 = select(cw.sc.y, cw.sc.w, (c >> 1u) == 1u);
    return cw.d * (B_i8_at(s01, (c & 1u) + 2u * s) * tl + B_i8_at(s23, (c & 1u) + 2u * s) * th);
}"""


# every kernel's declarations after its decoders (see header)
DECLS = """struct Prm { p0: u32, nph: u32, wait: u32, limit: u32 }
@group(0) @binding(0) var<storage, read> w: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read> B_w: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> act: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> sync: array<atomic<u32>>;   // count, -, timeouts, abort
@group(0) @binding(4) var<uniform> prm: Prm;
struct XRow { base: u32 }"""


def header(type_b: str = "Q4_K") -> str:
    """What every kernel here starts with: A's Q4_K decoder and B's (type_b's, prefixed B_, on its own
    binding), the activations `act` (each phase's x and output at their offsets), the grid barrier's
    counters and the phase range."""
    return f"""#include quant_common
#include quant/q4_k
#include quant_common as B_
#include {QUANT_TYPES[type_b].kernel} as B_
""" + DECLS


def random_matrix(rng, qtype: str, rows: int, k: int) -> np.ndarray:
    """GGUF bytes of a rows x k matrix of random valid blocks (synth's, weights of std 0.02)."""
    return _random_quant_rows(qtype, rows, k, 0.02, rng.bit_generator, rng).reshape(-1)


def ab_runs(steps: list, mb_a: float, mb_b: float) -> tuple:
    """A chain of alternating A and B phases as three timed runs: (run, steps, MB a phase)."""
    return (("A+B", steps, (mb_a + mb_b) / 2), ("A", steps[0::2], mb_a), ("B", steps[1::2], mb_b))


def print_rows(rows: list, errs: bool = False):
    """The timing table: rows of (round, variant, run, us a phase, MB a phase, timeouts, max rel err),
    one line a (variant, run) with both rounds."""
    print("| variant | run | us a phase (2 rounds) | GB/s | timeouts |" + " max rel err |" * errs)
    print("|---|---|---|---|---|" + "---|" * errs)
    for v, run in dict.fromkeys((r[1], r[2]) for r in rows):
        got = [r for r in rows if (r[1], r[2]) == (v, run)]
        print(f"| {v} | {run} | {' / '.join(f'{r[3]:.2f}' for r in got)} | "
              f"{got[0][4] * 1e3 / min(r[3] for r in got):.0f} | {sum(r[5] for r in got)} |"
              + f" {got[0][6]:.1e} |" * errs)


def time_phases(dev, pipe, steps: list, sync, nph: int, reset) -> tuple[float, int]:
    """us a phase and timed-out waits: `steps` (timed_run's) 20 repeats a submit, as the engine's rows
    are (one repeat a submit added 8-20 us a phase: NOTES round 18), the median of 5, `reset` before
    each run (the random layers would otherwise grow x without bound); one dispatch runs all nph."""
    dt, _, t = timed_median(lambda: timed_run(dev, pipe, steps, sync, 20), len(steps) if len(steps) > 1 else nph,
                            5, 0.3, before=reset)
    return dt * 1e6, t


def shape_arg(text: str) -> tuple:
    """--tuned-a / --tuned-b: an ops.gemv shape, its numbers joined by commas."""
    return tuple(int(v) for v in text.split(","))


def butterfly(vals: list[str], sgs: int) -> str:
    """WGSL reducing len(vals) (a power of two, R) per-lane values over the subgroup at once, as
    gemv_rows.wgsl's bfly_rows does: each step pairs two values with one shuffle, halving them, then
    xor-shuffles finish (R - 1 + log2(sgs / R) shuffles, against 5 R for a subgroupAdd each). Lane l
    ends with the sum of value l / (sgs / R) in `z`."""
    out, m, n = [], sgs // 2, 0
    while len(vals) > 1:
        half = len(vals) // 2
        new = []
        for i in range(half):
            out.append(f"        let f{n}_{i} = bf_pair({vals[i]}, {vals[i + half]}, {m}u, lane);")
            new.append(f"f{n}_{i}")
        vals, m, n = new, m // 2, n + 1
    out.append(f"        var z = {vals[0]};")
    while m >= 1:
        out.append(f"        z += subgroupShuffleXor(z, {m}u);")
        m //= 2
    return "\n".join(out)


def kernel(wg: int, groups: int, ra: int, ka: int, rb: int, kb: int, sgs: int, nrows: int = 1,
           bfly: bool = False, type_b: str = "Q4_K", dbase_b: int = 0, loads_only: bool = False) -> str:
    """nrows: rows a lane-slot takes a trip (their chunks loaded together, a trip ahead). bfly: the
    trip's rows reduced by one butterfly (`butterfly`) instead of a subgroupAdd each. loads_only (a
    bound, wrong results): each dot replaced by a bit of its loaded words plus x's scale, so the loads
    and x's conversion stay and the dot arithmetic goes."""
    R = nrows
    assert not bfly or (R & (R - 1) == 0 and R <= sgs), R
    phases = []
    for P, qt, rows, k, xin, xout in (("", "Q4_K", ra, ka, 0, ka), ("B_", type_b, rb, kb, ka, 0)):
        cpb = QUANT_TYPES[TYPES[qt]["gguf"]].wide[1] * TYPES[qt]["halves"]
        chunks = k // QK * cpb
        assert chunks <= wg and chunks % sgs == 0, (chunks, wg, sgs)
        slots = wg // chunks
        trips = -(-rows // (groups * slots * R))
        phases.append(dict(P=P, qt=qt, F=TYPES[qt].get("fn", P), cpb=cpb, key=TYPES[qt]["key"], rows=rows,
                           blocks=k // QK, chunks=chunks, slots=slots, trips=trips, parts=chunks // sgs,
                           xin=xin // 4, xout=xout))
    part_n = max(ph["trips"] * ph["slots"] * R * ph["parts"] for ph in phases)
    body = []
    for i, ph in enumerate(phases):
        P, nxt = ph["P"], phases[1 - i]
        S, C, last = ph["slots"], ph["chunks"], ph["rows"] - 1
        row = lambda t, r: f"min(((({t}) * {groups}u + g) * {S}u + slot) * {R}u + {r}u, {last}u)"   # noqa: E731
        F = ph["F"]
        xd = TYPES[ph["qt"]]["xd"]
        dot = (lambda r: f"(f32(({ph['key'].replace('cw.', f'cw{r}.')}) & 1u) + {xd})") if loads_only else \
            (lambda r: f"{F}chunk_dot(cw{r}, cc, xs)")
        load = "\n".join(f"    var cur{r} = {F}chunk_load((base + {row('0u', r)}) * {ph['blocks']}u + b, cc);"
                         for r in range(R))
        step = "\n".join(f"""        let cw{r} = cur{r};
        cur{r} = {F}chunk_load((base + {row('t + 1u', r)}) * {ph['blocks']}u + b, cc);""" for r in range(R))
        if bfly and R > 1:
            per = sgs // R
            dots = "\n".join(f"        let s{r} = {dot(r)};" for r in range(R))
            dots += "\n" + butterfly([f"s{r}" for r in range(R)], sgs) + f"""
        if (on && lane % {per}u == 0u) {{ part[((t * {S}u + slot) * {R}u + lane / {per}u) * {ph["parts"]}u + c / {sgs}u] = z; }}"""
        else:
            dots = "\n".join(f"""        let s{r} = subgroupAdd({dot(r)});
        if (lane == 0u && on) {{ part[((t * {S}u + slot) * {R}u + {r}u) * {ph["parts"]}u + c / {sgs}u] = s{r}; }}"""
                              for r in range(R))
        body.append(f"""
fn {P}phase(layer: u32, g: u32, li: u32, lane: u32) {{
    let slot = li / {C}u;
    let c = min(li % {C}u, {C - 1}u);
    let on = slot < {S}u;
    let b = c / {ph["cpb"]}u;
    let cc = c % {ph["cpb"]}u;
    let base = layer * {ph["rows"]}u;
    let xs = {F}x_quant({F}x_chunk(XRow({ph["xin"]}u), b, cc));
{load}
    for (var t = 0u; t < {ph["trips"]}u; t++) {{
{step}
{dots}
    }}
    workgroupBarrier();
    for (var r = li; r < {ph["trips"] * S * R}u; r += {wg}u) {{
        let row = (r / {S * R}u * {groups}u + g) * {S * R}u + r % {S * R}u;
        var s = 0.0;
        for (var q = 0u; q < {ph["parts"]}u; q++) {{ s += part[r * {ph["parts"]}u + q]; }}
        if (row < {ph["rows"]}u) {{ act[({ph["xout"]}u + row) >> 2u][row & 3u] = s; }}
    }}
    workgroupBarrier();
}}
// the first chunk of the phase after this one, for the barrier wait to depend on
fn {P}first_of_next(layer: u32, g: u32, li: u32) -> u32 {{
    let slot = li / {nxt["chunks"]}u;
    let c = min(li % {nxt["chunks"]}u, {nxt["chunks"] - 1}u);
    let cw = {nxt["F"]}chunk_load((layer * {nxt["rows"]}u + min((g * {nxt["slots"]}u + slot) * {R}u, {nxt["rows"] - 1}u))
                            * {nxt["blocks"]}u + c / {nxt["cpb"]}u, c % {nxt["cpb"]}u);
    return {nxt["key"]};
}}""")
    return f"""
{header(TYPES[type_b]["gguf"])}
{Q6_HALF if type_b == "Q6_Kh" else ""}
struct P {{ dbase: u32 }}
const p = P(0u);
const B_p = P({dbase_b}u);
fn xv(r: XRow, i: u32) -> vec4<f32> {{ return act[r.base + i]; }}
fn bf_pair(a: f32, b: f32, m: u32, lane: u32) -> f32 {{
    let hi = (lane & m) != 0u;
    return select(a, b, hi) + subgroupShuffleXor(select(b, a, hi), m);
}}
var<workgroup> part: array<f32, {part_n}>;
{"".join(body)}

@compute @workgroup_size({wg})
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32) {{
    let g = wid.x;
    for (var k = 0u; k < prm.nph; k++) {{
        let ph = prm.p0 + k;
        if (k > 0u && prm.wait != 0u) {{
            // the next phase's first chunk is loaded before the wait, which depends on it
            var pre = 0u;
            if ((ph & 1u) == 0u) {{ pre = B_first_of_next(ph / 2u, g, li); }} else {{ pre = first_of_next(ph / 2u, g, li); }}
            let dep = select(0u, 1u, pre == 0x9E3779B9u);
{grid_wait(f"{groups}u * ph + dep")}
        }}
        if ((ph & 1u) == 0u) {{ phase(ph / 2u, g, li, lane); }} else {{ B_phase(ph / 2u, g, li, lane); }}
        storageBarrier();
        workgroupBarrier();
        if (li == 0u) {{ atomicAdd(&sync[0], 1u); }}
    }}
}}
"""


def rows_setup(dev, wg: int, groups_a: int, ka: int, rows_a: int, kb: int, rows_b: int, row0_b: int,
               part_rows: int) -> tuple[dict, str]:
    """What both gemv_rows kernels share: A's shape as gemv.wgsl defines (2 rows, one chunk step,
    groups_a row groups, HOIST, PF, x24 and the engine's butterfly; B's include overrides its own),
    and the WGSL after header(): both phases' constant params (rows_a / rows_b over every layer, B's
    outputs from row0_b), the row groups' workgroup memory and the private values gemv_rows reads."""
    defines = dict(WIDE=True, INT_DOT=True, X24=True, SUBGROUPS=True, WG=wg, ROWS=2, STEPS=1, GROUPS=groups_a,
                   HOIST=True, PF=True, GLU=False, NORM=False, **ops._bfly_defines(dev, 2, False, 1))
    wgsl = f"""#include reduce
struct P {{ k: u32, rows: u32, row0: u32, dbase: u32, y_stride: u32, eps: f32 }}
const p = P({ka}u, {rows_a}u, 0u, 0u, 0u, 0.0);
const B_p = P({kb}u, {rows_b}u, {row0_b}u, 0u, 0u, 0.0);
const NPART: u32 = {wg}u / 2u;
var<workgroup> part: array<f32, {part_rows} * NPART>;
var<workgroup> norm_part: array<f32, {wg}>;
const BFN: u32 = 2u;
const SGC: u32 = {dev.subgroup_size}u;
var<private> ss: f32;
var<private> x_on: f32;"""
    return defines, wgsl


def kernel_rows(dev, wg: int, groups: int, ra: int, ka: int, rb: int, kb: int, steps_b: int,
                ta: int, layers: int, groups_a: int = 8, groups_b: int = 8) -> tuple[str, dict]:
    """The same two phases with gemv_rows.wgsl's row groups (the engine's GEMV code: HOIST, PF and the
    butterfly, 2 rows x groups_a / groups_b a workgroup pass), A with 1 chunk step a lane and B with steps_b,
    each workgroup of the resident grid taking row groups g, g + G, ... `act` holds B's x (A's
    output) from 0 and A's x (B's output) from ta * ka; rows() finds them through its token index."""
    per_a, per_b = 2 * groups_a, 2 * groups_b
    defines, shared = rows_setup(dev, wg, groups_a, ka, layers * ra, kb, layers * rb, ta * ka, max(per_a, per_b))
    src = f"""
{header()}
{shared}
var<private> y_shift: u32;     // the phase's first row in its weight (its layer's): outputs start at 0
fn xv(xrow: XRow, i: u32) -> vec4<f32> {{ return act[xrow.base + i] * x_on; }}
fn write_y(o: u32, row: u32, s: f32) {{ let j = o - y_shift; act[j >> 2u][j & 3u] = s; }}
#include gemv_rows
#include gemv_rows as B_ with STEPS={steps_b},GROUPS={groups_b}

@compute @workgroup_size({wg})
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_id) sg: u32,
        @builtin(num_subgroups) nsg: u32, @builtin(subgroup_size) sgsize: u32) {{
    red_lane = li;
    let g = wid.x;
    for (var k = 0u; k < prm.nph; k++) {{
        let ph = prm.p0 + k;
        if (k > 0u && prm.wait != 0u) {{
{grid_wait(f"{groups}u * ph")}
        }}
        if ((ph & 1u) == 0u) {{
            y_shift = ph / 2u * {ra}u;
            for (var blk = g; blk < {-(-ra // per_a)}u; blk += {groups}u) {{ rows(y_shift + blk * {per_a}u, {ta}u, li, lane, sg, nsg, sgsize); workgroupBarrier(); }}
        }} else {{
            y_shift = ph / 2u * {rb}u;
            for (var blk = g; blk < {-(-rb // per_b)}u; blk += {groups}u) {{ B_rows(y_shift + blk * {per_b}u, 0u, li, lane, sg, nsg, sgsize); workgroupBarrier(); }}
        }}
        storageBarrier();
        workgroupBarrier();
        if (li == 0u) {{ atomicAdd(&sync[0], 1u); }}
    }}
}}
"""
    return src, defines


def kernel_ticket(dev, wg: int, ra: int, ka: int, rb: int, kb: int, layers: int, steps_b: int, groups_a: int,
                  groups_b: int, options: str = "") -> tuple[str, dict, int, int]:
    """The same two gemv_rows phases as one *ticketed* dispatch of every workgroup of every phase: a
    workgroup takes a ticket (an atomic count) as it starts, and the ticket, not its id, says which
    phase and row block it runs. A phase's workgroups wait until every workgroup of the phases before
    has counted itself done. They wait only on smaller tickets, which have all started, so no
    co-residency is assumed (unlike the persistent grid), and the grid is the engine's own (a
    workgroup a row block, as many resident as fit). Each layer's activations have their own region
    of `act` (X_l, Y_l, X_l+1, ...), so no SM has read a line of x before it is written. `options`
    (words joined by '+'): "xatom", x read and written through atomics as well. With prm.wait = 0 it is a dispatch a
    phase, ids for tickets: the same kernel without the waits; with prm.wait = 2 one dispatch that
    waits, ids for tickets (safe only if the GPU starts workgroups in id order).
    groups_b = 1 makes B a plain shape (no HOIST or PF: the workgroup strides over a row's chunks,
    steps_b at a time), so the kernel needs fewer registers than a HOIST B.
    Diagnostics, for a dispatch a phase only: "nowait" leaves out the wait and the count, "xro" reads
    x from a read-only binding of its own (binding 5, a copy).
    Returns the source, its defines, and A's and B's workgroups a layer."""
    opts = set(options.split("+"))
    xatom = "xatom" in opts
    per_a, per_b = 2 * groups_a, 2 * groups_b
    defines, shared = rows_setup(dev, wg, groups_a, ka, layers * ra, kb, layers * rb, 0, max(per_a, per_b))
    na, nb = -(-ra // per_a), -(-rb // per_b)
    b_plain = groups_b == 1          # B strides over its row's chunks (no HOIST, no PF): fewer registers
    head = header()
    if xatom:
        head = head.replace("var<storage, read_write> act: array<vec4<f32>>",
                                "var<storage, read_write> act: array<atomic<u32>>")
        xv = ("let j = (x_off + xrow.base + i) * 4u;\n    return vec4<f32>(bitcast<f32>(atomicLoad(&act[j])), "
              "bitcast<f32>(atomicLoad(&act[j + 1u])),\n        bitcast<f32>(atomicLoad(&act[j + 2u])), "
              "bitcast<f32>(atomicLoad(&act[j + 3u]))) * x_on;")
        wy = "atomicStore(&act[y_off + o], bitcast<u32>(s));"
    else:
        xv = "return act[x_off + xrow.base + i] * x_on;"
        if "xro" in opts:
            head += "\n@group(0) @binding(5) var<storage, read> xr: array<vec4<f32>>;"
            xv = "return xr[x_off + xrow.base + i] * x_on;"
        wy = "let j = y_off + o;\n    act[j >> 2u][j & 3u] = s;"
    wait_body = "" if "nowait" in opts else f"""    let li = red_lane;
{grid_wait("need")}"""
    count_done = "" if "nowait" in opts else """    storageBarrier();
    workgroupBarrier();
    if (li == 0u) { atomicAdd(&sync[0], 1u); }"""
    src = f"""
{head}
{shared}
var<workgroup> ticket: u32;
var<private> x_off: u32;           // this layer's x (vec4s) and output (floats) in act
var<private> y_off: u32;           // (less the phase's first row in its weight: its layer's)
var<private> need: u32;            // workgroups of the phases before this one
fn xv(xrow: XRow, i: u32) -> vec4<f32> {{
    {xv}
}}
fn write_y(o: u32, row: u32, s: f32) {{
    {wy}
}}
// wait until every workgroup of the phases before has counted itself done
fn phase_wait() {{
{wait_body}
}}
#include gemv_rows
#include gemv_rows as B_ with STEPS={steps_b},GROUPS={groups_b}{",HOIST=0,PF=0" if b_plain else ""}

@compute @workgroup_size({wg})
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(subgroup_invocation_id) lane: u32, @builtin(subgroup_id) sg: u32,
        @builtin(num_subgroups) nsg: u32, @builtin(subgroup_size) sgsize: u32) {{
    red_lane = li;
    var t = prm.p0 / 2u * {na + nb}u + (prm.p0 & 1u) * {na}u + wid.x;
    if (prm.wait == 1u) {{
        if (li == 0u) {{ ticket = atomicAdd(&sync[4], 1u); }}
        t = workgroupUniformLoad(&ticket);
    }}
    let layer = t / {na + nb}u;
    let r = t % {na + nb}u;
    let is_b = r >= {na}u;
    need = select(0u, layer * {na + nb}u + select(0u, {na}u, is_b), prm.wait != 0u);
    let x0 = layer * {ka + kb}u + select(0u, {ka}u, is_b);
    x_off = x0 / 4u;
    let row0 = layer * select({ra}u, {rb}u, is_b);
    y_off = x0 + select({ka}u, {kb}u, is_b) - row0;
    x_on = 1.0;                     // (a HOIST phase sets its own; a plain one reads x whole)
    phase_wait();
    if (is_b) {{ B_rows(row0 + (r - {na}u) * {per_b}u, 0u, li, lane, sg, nsg, sgsize); }}
    else {{ rows(row0 + r * {per_a}u, 0u, li, lane, sg, nsg, sgsize); }}
{count_done}
}}
"""
    return src, defines, na, nb


def run_ticket(a, dev, ra, ka, rb, kb, raw_a, raw_b, wa, wb, x0):
    """--ticket: each of --variants (kernel_ticket's options joined by '+': xatom, and the
    diagnostics nowait, xro) as one ticketed dispatch, one with ids for tickets and a
    dispatch a phase, against the engine's dispatches on the same shapes; every layer's outputs
    checked against the engine's. A nowait variant runs a dispatch a phase only, A's and B's apart."""
    L, WG = a.layers, a.wg
    # the engine, same shapes, chained through buffers of its own a layer; and round 17's tuned-like shapes
    xs = [dev.upload(x0)] + [dev.buffer(ka * 4) for _ in range(L)]
    ys = [dev.buffer(kb * 4) for _ in range(L)]
    eng, tuned = [], []
    for layer in range(L):
        la = upload_weight(dev, f"A{layer}", "Q4_K", (ra, ka), raw_a[layer])
        lb = upload_weight(dev, f"B{layer}", "Q4_K", (rb, kb), raw_b[layer])
        eng += ops.gemv(dev, la, xs[layer], ys[layer], y_stride=ra, shape=(WG, 2, 1, a.groups_a, 1, 1, 1))
        eng += ops.gemv(dev, lb, ys[layer], xs[layer + 1], y_stride=rb,
                        shape=(WG, 2, a.steps_b, a.groups_b, 1, 1, int(a.groups_b > 1)))
        if not a.small:
            tuned += ops.gemv(dev, la, xs[layer], ys[layer], y_stride=ra, shape=shape_arg(a.tuned_a))
            tuned += ops.gemv(dev, lb, ys[layer], xs[layer + 1], y_stride=rb, shape=shape_arg(a.tuned_b))
    Plan(dev, eng).run(1)
    ref = [dev.read(b, np.float32) for pair in zip(ys, xs[1:]) for b in pair]
    mb_a, mb_b = wa.nbytes / L / 1e6, wb.nbytes / L / 1e6
    rows = []                    # (round, variant, run, us a phase, MB a phase, timeouts, max rel err)

    def engine_rows(rnd):
        for name, ds in (("engine, these shapes", eng), (f"engine, {a.tuned_a} and {a.tuned_b}", tuned)):
            if ds:
                for run, part, mb in ab_runs(ds, mb_a, mb_b):
                    rows.append((rnd, name, run, timed(dev, Plan(dev, part), 20, xs[0]) / len(part) * 1e6, mb, 0, 0.0))

    act_n = L * (ka + kb) + ka
    act = dev.buffer(act_n * 4)
    sync = dev.upload(np.zeros(8, np.uint32))
    limit = 2_000_000

    def act0():
        v = np.zeros(act_n, np.float32)
        v[:ka] = x0
        return v
    for variant in a.variants.split(","):
        src, defines, na, nb = kernel_ticket(dev, WG, ra, ka, rb, kb, L, a.steps_b, a.groups_a, a.groups_b, variant)
        pipe = dev.compile(expand_wgsl(src, defines), "ticket_gemv")
        extra = [dev.upload(act0())] if "xro" in variant else []

        def bg(p0, nph, wait):
            return dev.bind_group(pipe, [wa.chunks[0].buffer, wb.chunks[0].buffer, act, sync,
                                         dev.uniform(p0, nph, wait, limit)] + extra)
        per_phase = [(bg(q, 1, 0), nb if q & 1 else na) for q in range(2 * L)]
        if "nowait" in variant:
            runs = [("A", per_phase[0::2], mb_a), ("B", per_phase[1::2], mb_b)]
        else:
            runs = [("one dispatch", [(bg(0, 2 * L, 1), L * (na + nb))], (mb_a + mb_b) / 2),
                    ("one dispatch, ids as tickets", [(bg(0, 2 * L, 2), L * (na + nb))], (mb_a + mb_b) / 2),
                    ("a dispatch a phase", per_phase, (mb_a + mb_b) / 2)]
        for run, st, mb in runs:
            dev.write(act, act0())
            _, _, tout = timed_run(dev, pipe, st, sync)
            got = dev.read(act, np.float32)
            errs = []
            for layer in range(L if "nowait" not in variant else 0):
                o = layer * (ka + kb)
                for r_, g_ in ((ref[2 * layer], got[o + ka:o + ka + kb]),
                               (ref[2 * layer + 1], got[o + ka + kb:o + 2 * ka + kb])):
                    if np.isfinite(r_).all():      # random layers grow x: the last ones overflow
                        errs.append(float(np.abs(g_ - r_).max() / max(np.abs(r_).max(), 1e-30)))
            if errs:
                print(f"{variant}, {run}: rel err a phase against the engine "
                      f"{' '.join(f'{e:.1e}' for e in errs)}, timeouts {tout}", flush=True)
            for rnd in range(2):
                us, t = time_phases(dev, pipe, st, sync, 2 * L, lambda: dev.write(act, act0()))
                rows.append((rnd, variant, run, us, mb, t, max(errs) if errs else float("nan")))
    for rnd in range(2):
        engine_rows(rnd)
    print(f"\nA {WG}x2/{a.groups_a} ({na} workgroups, {mb_a:.1f} MB), B {WG}x2x{a.steps_b}/{a.groups_b} "
          f"({nb} workgroups, {mb_b:.1f} MB)")
    print_rows(rows, errs=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--groups", type=int, default=132)
    ap.add_argument("--wg", type=int, default=512)
    ap.add_argument("--small", action="store_true", help="small shapes (lavapipe)")
    ap.add_argument("--rows", type=int, default=1, help="rows a lane-slot takes a trip")
    ap.add_argument("--bfly", action="store_true", help="a trip's rows reduced by one butterfly")
    ap.add_argument("--loads-only", action="store_true", help="the lean kernel's dots replaced by a bit of "
                    "their words (a bound; wrong results)")
    ap.add_argument("--type-b", default="Q4_K", choices=sorted(TYPES), help="B's weight type (the lean kernel)")
    ap.add_argument("--tuned-a", default="128,2,1,8,1,1,1", help="the engine's A shape to compare with")
    ap.add_argument("--tuned-b", default="224,2,2,8,1,1,1", help="the engine's B shape to compare with")
    ap.add_argument("--gemv-rows", action="store_true", help="the phases through gemv_rows.wgsl (the engine's code)")
    ap.add_argument("--steps-b", type=int, default=2, help="--gemv-rows: B's chunk steps a lane")
    ap.add_argument("--groups-a", type=int, default=8, help="--gemv-rows: A's row groups a workgroup pass")
    ap.add_argument("--groups-b", type=int, default=8, help="--gemv-rows: B's row groups a workgroup pass")
    ap.add_argument("--ticket", action="store_true", help="the ticketed dispatch (kernel_ticket), with --wg, "
                    "--steps-b, --groups-a, --groups-b")
    ap.add_argument("--square", type=int, default=0, help="A and B both N x N (an o-like 4,096: 9.4 MB phases)")
    ap.add_argument("--variants", default="ticket",
                    help="--ticket: kernel_ticket options joined by '+' (xatom; nowait, xro)")
    a = ap.parse_args()
    dev = get_device()
    sgs = dev.subgroup_size
    ra, ka, rb, kb = (1024, 512, 512, 1024) if a.small else (14336, 4096, 4096, 14336)   # rb = ka, ra = kb
    if a.square:
        ra = ka = rb = kb = a.square
    L, G, WG = a.layers, a.groups, a.wg
    print(f"device: {dev.name}, subgroups {sgs}; A {ra}x{ka}, B {rb}x{kb} Q4_K, {L} layers, {G} x {WG}, "
          f"{a.rows} rows a trip{', butterfly' if a.bfly else ''}")
    rng = np.random.default_rng(0)
    raw_a = [random_matrix(rng, "Q4_K", ra, ka) for _ in range(L)]
    tb = a.type_b
    assert tb == "Q4_K" or not (a.ticket or a.gemv_rows), "--type-b: the lean kernel only"
    qb = TYPES[tb]["gguf"]
    raw_b = [random_matrix(rng, qb, rb, kb) for _ in range(L)]
    wa = upload_weight(dev, "A", "Q4_K", (L * ra, ka), np.concatenate(raw_a))
    wb = upload_weight(dev, "B", qb, (L * rb, kb), np.concatenate(raw_b))
    x0 = rng.standard_normal(ka).astype(np.float32)
    if a.ticket:
        return run_ticket(a, dev, ra, ka, rb, kb, raw_a, raw_b, wa, wb, x0)

    # persistent kernel (and the same kernel a dispatch per phase); act: A's x at xa_off, B's at xb_off
    if a.gemv_rows:
        ta = -(-kb // ka)
        src, defines = kernel_rows(dev, WG, G, ra, ka, rb, kb, a.steps_b, ta, L, a.groups_a, a.groups_b)
        xa_off, xb_off = ta * ka, 0
    else:
        src = kernel(WG, G, ra, ka, rb, kb, sgs, a.rows, a.bfly, tb, wb.chunks[0].dbase, a.loads_only)
        defines = dict(WIDE=True, INT_DOT=True, X24=True, SUBGROUPS=True)
        xa_off, xb_off = 0, ka
    pipe = dev.compile(expand_wgsl(src, defines), "persistent_gemv")
    act_n = max(xa_off + ka, xb_off + kb)
    act = dev.buffer(act_n * 4)

    def act0():
        v = np.zeros(act_n, np.float32)
        v[xa_off:xa_off + ka] = x0
        return v
    sync = dev.upload(np.zeros(4, np.uint32))
    limit = 200_000

    def steps(per_phase: bool, nph: int):
        if per_phase:
            return [(dev.bind_group(pipe, [wa.chunks[0].buffer, wb.chunks[0].buffer, act, sync,
                                           dev.uniform(ph, 1, 0, limit)]), G) for ph in range(nph)]
        return [(dev.bind_group(pipe, [wa.chunks[0].buffer, wb.chunks[0].buffer, act, sync,
                                       dev.uniform(0, nph, 1, limit)]), G)]

    # correctness: one layer from x0, persistent against the engine
    dev.write(act, act0())
    _, _, tout = timed_run(dev, pipe, steps(False, 2), sync)
    got = dev.read(act, np.float32)
    xa, xb = dev.upload(x0), dev.buffer(kb * 4)
    ya = dev.buffer(rb * 4)
    eng, tuned = [], []                # the engine on the persistent kernel's shapes, and on tuned-like ones
    tuned_a = None if a.small else shape_arg(a.tuned_a)
    tuned_b = None if a.small else shape_arg(a.tuned_b)
    for layer in range(L):
        la = upload_weight(dev, f"A{layer}", "Q4_K", (ra, ka), raw_a[layer])
        lb = upload_weight(dev, f"B{layer}", qb, (rb, kb), raw_b[layer])
        if a.gemv_rows:
            eng += ops.gemv(dev, la, xa, xb, y_stride=ra, shape=(WG, 2, 1, a.groups_a, 1, 1, 1))
            eng += ops.gemv(dev, lb, xb, ya, y_stride=rb, shape=(WG, 2, a.steps_b, a.groups_b, 1, 1, 1))
        tuned += ops.gemv(dev, la, xa, xb, y_stride=ra, shape=tuned_a)
        tuned += ops.gemv(dev, lb, xb, ya, y_stride=rb, shape=tuned_b)
    eng = eng or tuned              # the correctness check's engine run
    plan1 = Plan(dev, eng[:2])
    plan1.run(1)
    ref_b, ref_a = dev.read(xb, np.float32), dev.read(ya, np.float32)
    err_b = np.abs(got[xb_off:xb_off + ra] - ref_b).max() / np.abs(ref_b).max()
    err_a = np.abs(got[xa_off:xa_off + rb] - ref_a).max() / np.abs(ref_a).max()
    print(f"one layer, persistent vs engine: max rel err A {err_b:.2e}, B {err_a:.2e}, timeouts {tout}")

    mb_a, mb_b = wa.nbytes / L / 1e6, wb.nbytes / L / 1e6
    rows = []                       # (round, variant, run, us a phase, MB a phase, timeouts, -)
    chain, per_phase = steps(False, 2 * L), steps(True, 2 * L)
    for rnd in range(2):
        for name, (run, st, mb) in [("persistent", ("A+B", chain, (mb_a + mb_b) / 2))] + \
                [("a dispatch a phase", r) for r in ab_runs(per_phase, mb_a, mb_b)]:
            # (the A-only and B-only runs read stale x: timing only)
            us, t = time_phases(dev, pipe, st, sync, 2 * L, lambda: dev.write(act, act0()))
            rows.append((rnd, name, run, us, mb, t, 0.0))
        engines = [("engine GEMVs, these shapes", eng)] if a.gemv_rows else []
        for name, ds in engines + [("engine GEMVs, tuned-like shapes", tuned)]:
            for run, part, mb in ab_runs(ds, mb_a, mb_b):
                rows.append((rnd, name, run, timed(dev, Plan(dev, part), 20, xb) / len(part) * 1e6, mb, 0, 0.0))
    print(f"\nA {mb_a:.1f} MB, B {mb_b:.1f} MB ({tb}) a phase; engine shapes A {tuned_a}, B {tuned_b}")
    print_rows(rows)

if __name__ == "__main__":
    main()
