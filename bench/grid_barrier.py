"""Could one persistent dispatch beat a chain of dependent dispatches? The question behind a decode
"megakernel". A decode step is a chain of about 5 dependent GEMVs a layer, and each dispatch costs
about 6 us beyond its bytes on the H200 (bench/NOTES.md, round 4): the barrier between dispatches,
then a GPU that starts with no loads in flight. A persistent kernel keeps G workgroups resident and
separates the phases with a grid barrier (one atomic counter). Because a GEMV's weights do not
depend on its input, each workgroup can issue its first loads of phase k+1 *before* it waits for
phase k to finish everywhere (PREFETCH).

Each phase models a GEMV: it streams a fresh segment of S bytes (distinct regions of a 1 GB buffer,
so L2 does not help), after reading the previous phase's 4,096-value output x, which every
workgroup needs in full (through atomicLoad: cross-workgroup data within a dispatch must go through
atomics, round 11), and writes the next x. Every x read is checked against the value its writer
stored, so the grid barrier's ordering is tested too. Variants, per phase:
  chain G       one dispatch per phase, G workgroups (the same grid as the persistent kernels)
  chain full    one dispatch per phase, one trip of U loads per thread (stream_chain.py's shape)
  persist       one dispatch, G resident workgroups, grid barriers between phases
  persist+pre   the same, with each phase's first trip loaded before its barrier wait
A persistent kernel needs all G workgroups resident at once (WebGPU does not promise it): a wait
that spins past its limit is counted, and the row reports it. The wait is `grid_wait`'s, shared
with persistent_step.py and persistent_gemv.py (its two nested loops keep llvmpipe, which ends any
one loop after 65,535 trips, from quitting early: `--mb 1 --groups 1,2 --total-mb 8` runs there).

    python bench/grid_barrier.py [--mb 9.4,33,66] [--groups 132,264,528] [--total-mb 1000]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from shaderlm.gpu.device import get_device   # noqa: E402

XN = 4096            # x values per phase (a GEMV's input, 16 KB)
WG = 256


def kernel(unroll: int, prefetch: bool) -> str:
    first = "\n".join(f"    let f{u} = wts[min(base + gt + {u}u * stride, last)];" for u in range(unroll))
    use_first = "\n".join(f"        acc ^= select(vec4<u32>(0u), f{u}, base + gt + {u}u * stride < end);"
                          for u in range(unroll))
    trip = "\n".join(f"            acc ^= select(vec4<u32>(0u), wts[min(i + {u}u * stride, last)], "
                     f"i + {u}u * stride < end);" for u in range(unroll))
    xread = "\n".join(f"        {{ let j = li + {r * WG}u; let v = atomicLoad(&xbuf[xin + j]); "
                      f"bad += select(1u, 0u, v == xval(p, j)); xs ^= v; }}" for r in range(XN // WG))
    load_first = f"""    let base = p * prm.seg;
    let end = base + prm.seg;
    let last = end - 1u;
{first}"""
    return f"""
struct Params {{ phase0: u32, nphases: u32, seg: u32, limit: u32 }}
@group(0) @binding(0) var<storage, read> wts: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> xbuf: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read_write> sync: array<atomic<u32>>;   // count, bad x reads, timeouts, abort
@group(0) @binding(3) var<uniform> prm: Params;
@group(0) @binding(4) var<storage, read_write> sink: array<u32>;

fn xval(p: u32, i: u32) -> u32 {{ return p * 2654435761u + i * 40503u + 1u; }}

@compute @workgroup_size({WG})
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {{
    let groups = nwg.x;
    let gt = wid.x * {WG}u + li;
    let stride = groups * {WG}u;
    var acc = vec4<u32>(0u);
    var bad = 0u;
    for (var k = 0u; k < prm.nphases; k++) {{
    let p = prm.phase0 + k;
{load_first if prefetch else ""}
    if (k > 0u) {{
        // grid barrier: every workgroup has counted phase k - 1 done
{grid_wait("groups * k")}
    }}
{"" if prefetch else load_first}
    {{
        let xin = (p & 1u) * {XN}u;
        var xs = 0u;
{xread}
        acc.x ^= xs;
{use_first}
        for (var i = base + gt + {unroll}u * stride; i < end; i += {unroll}u * stride) {{
{trip}
        }}
    }}
    // the next x (its value checked by the readers; acc keeps every load alive)
    for (var j = gt; j < {XN}u; j += stride) {{
        let v = xval(p + 1u, j);
        atomicStore(&xbuf[((p + 1u) & 1u) * {XN}u + j], select(v, acc.y, acc.x == 0xDEADBEEFu && acc.z == 7u));
    }}
    storageBarrier();
    workgroupBarrier();
    if (li == 0u) {{ atomicAdd(&sync[0], 1u); }}
    }}
    if (bad > 0u) {{ atomicAdd(&sync[1], bad); }}
    sink[gt] = acc.x ^ acc.y ^ acc.z ^ acc.w;
}}
"""


def grid_wait(target: str) -> str:
    """WGSL for a persistent kernel's grid barrier (persistent_step.py, persistent_gemv.py): lane 0
    spins until the count sync[0] reaches `target` (an expression); past prm.limit spins it counts a
    timeout (sync[2]) and raises the abort flag (sync[3]), which ends every other wait at once, so a
    grid that is not co-resident reports itself instead of hanging. Then the workgroup follows."""
    return f"""        if (li == 0u) {{
            var n = 0u;
            var done = false;
            // two nested loops: llvmpipe ends any one loop after 65,535 trips
            loop {{
                for (var m = 0u; m < 1024u; m++) {{
                    if (atomicLoad(&sync[0]) >= {target}) {{ done = true; break; }}
                    if (atomicLoad(&sync[3]) != 0u) {{ done = true; break; }}
                }}
                if (done) {{ break; }}
                n += 1024u;
                if (n > prm.limit) {{ atomicAdd(&sync[2], 1u); atomicStore(&sync[3], 1u); break; }}
            }}
        }}
        workgroupBarrier();
        storageBarrier();   // the acquire side: other workgroups' stores before their count are visible"""


def timed_run(dev, pipe, steps, sync, reps: int = 1):
    """One command buffer: `reps` times the sync counters (the whole buffer) cleared, then each (bind
    group, workgroups) of `steps` dispatched in order. Seconds a repeat from submit to the counters'
    readback, bad x reads, timed-out waits (of the last repeat). The submit and readback take 0.1-0.3
    ms on the H200: compare short runs with `kernel_chain.timed`'s at its 20 repeats."""
    enc = dev.encoder()
    for _ in range(reps):
        enc.clear_buffer(sync)
        cp = enc.begin_compute_pass()
        cp.set_pipeline(pipe)
        for bg, g in steps:
            cp.set_bind_group(0, bg)
            cp.dispatch_workgroups(g)
        cp.end()
    cb = enc.finish()
    t0 = time.perf_counter()
    dev.submit([cb])
    s = dev.read(sync, np.uint32)
    return (time.perf_counter() - t0) / reps, int(s[1]), int(s[2])


def timed_median(once, per: int, reps: int = 5, warm_s: float = 0.3, before=lambda: None):
    """`once` (timed_run) run for warm_s, then reps times, each after `before`: the median seconds
    divided by `per`, and the bad x reads and timed-out waits over the timed runs. A timeout while
    warming up ends it at once: (nan, 0, timeouts)."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warm_s:
        before()
        _, _, tout = once()
        if tout:
            return float("nan"), 0, tout
    ts, bad, tout = [], 0, 0
    for _ in range(reps):
        before()
        dt, b, t = once()
        ts.append(dt / per)
        bad, tout = bad + b, tout + t
    return statistics.median(ts), bad, tout


def run_variant(dev, wts, seg_vec4, phases, groups, unroll, mode, reps=5):
    """Seconds per phase (median of reps) and (bad x reads, timed-out waits) over all runs."""
    prefetch = mode == "persist+pre"
    pipe = dev.compile(kernel(unroll, prefetch))
    x0 = np.array([(0 * 2654435761 + i * 40503 + 1) % 2**32 for i in range(XN)] + [0] * XN, np.uint32)
    xbuf = dev.upload(x0)
    sync = dev.upload(np.zeros(4, np.uint32))
    sink = dev.buffer(max(groups, seg_vec4 // (WG * unroll) + 1) * WG * 4)
    limit = 2_000_000
    if mode.startswith("persist"):
        prm = dev.uniform(0, phases, seg_vec4, limit)
        steps = [(dev.bind_group(pipe, [wts, xbuf, sync, prm, sink]), groups)]
    else:
        g = groups if mode == "chain G" else max(1, -(-seg_vec4 // (WG * unroll)))
        steps = [(dev.bind_group(pipe, [wts, xbuf, sync, dev.uniform(p, 1, seg_vec4, limit), sink]), g)
                 for p in range(phases)]

    # x holds phase 0's values only at the start: restore it before each run
    return timed_median(lambda: timed_run(dev, pipe, steps, sync), phases, reps, 0.3,
                        before=lambda: dev.write(xbuf, x0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", default="9.4,33,66")
    ap.add_argument("--groups", default="132,264,528")
    ap.add_argument("--unroll", type=int, default=4)
    ap.add_argument("--total-mb", type=int, default=1000)
    a = ap.parse_args()
    dev = get_device()
    print(f"device: {dev.name}")
    total = a.total_mb * 10**6 // 16 * 16
    wts = dev.buffer(total)
    rows = []
    for mb in (float(v) for v in a.mb.split(",")):
        seg = int(mb * 1e6) // 16
        phases = total // 16 // seg
        for g in (int(v) for v in a.groups.split(",")):
            modes = ["chain G", "persist", "persist+pre"] + (["chain full"] if g == int(a.groups.split(",")[0]) else [])
            for mode in modes:
                dt, bad, tout = run_variant(dev, wts, seg, phases, g, a.unroll, mode)
                us = dt * 1e6
                rows.append((mb, "-" if mode == "chain full" else g, mode, us, seg * 16 / us / 1e3, bad, tout))
                print(f"  {mb:6.1f} MB  G={rows[-1][1]!s:>4}  {mode:<12} {us:8.2f} us  {rows[-1][4]:6.0f} GB/s"
                      f"  bad x {bad}  timeouts {tout}", flush=True)
    print("\n| MB a phase | groups | variant | us a phase | GB/s | bad x reads | timed-out waits |")
    print("|---|---|---|---|---|---|---|")
    for mb, g, mode, us, gbs, bad, tout in rows:
        print(f"| {mb} | {g} | {mode} | {us:.2f} | {gbs:.0f} | {bad} | {tout} |")


if __name__ == "__main__":
    main()
