"""Can the last workgroup of a dispatch see every other workgroup's writes? The pattern a fused kernel
would lean on: each workgroup writes its part, storageBarrier() (naga: a device-scope release), one
atomicAdd on a counter; the workgroup that sees count == groups - 1 reads one value of each part and
finishes the job (no workgroup waits for another, so it cannot deadlock). Caution (bench/NOTES.md, round 11):
a fused attention + o kernel that passed its partials this way, with plain stores and loads, once read
a stale partial at 512 workgroups; through atomicStore / atomicLoad it never did. A chain of N dependent dispatches, each
writing values unique to its iteration, checked on the CPU; and the chain's cost per dispatch
against the same kernel without the counter.

    python bench/last_group.py [-n 2000] [--groups 512]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from shaderlm.gpu.device import get_device   # noqa: E402

KERNEL = """
@group(0) @binding(0) var<storage, read_write> parts: array<u32>;
@group(0) @binding(1) var<storage, read_write> counter: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read_write> results: array<u32>;
@group(0) @binding(3) var<storage, read_write> iter: array<u32>;
var<workgroup> last: u32;
const G: u32 = GROUPSu;
@compute @workgroup_size(256)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    let it = iter[0];
    parts[wid.x * 256u + li] = it * 7919u + wid.x * 256u + li;
#if COUNTER
    storageBarrier();
    if (li == 0u) { last = select(0u, 1u, atomicAdd(&counter[0], 1u) == G - 1u); }
    let is_last = workgroupUniformLoad(&last);
    if (is_last == 1u) {
        storageBarrier();
        var s = 0u;
        for (var g = li; g < G; g += 256u) { s += parts[g * 256u + g % 256u]; }   // one per group
        last = 0u;
        workgroupBarrier();
        atomicAdd(&counter[1], s);   // workgroup sum through an atomic: any order, same total
        storageBarrier();
        if (li == 0u) {
            results[it] = atomicLoad(&counter[1]);
            atomicStore(&counter[1], 0u);
            atomicStore(&counter[0], 0u);
            iter[0] = it + 1u;
        }
    }
#else
    if (wid.x == 0u && li == 0u) { iter[0] = it + 1u; }
    if (wid.x == G) { atomicStore(&counter[0], 0u); results[0] = 0u; }   // never: keeps the bindings
#endif
}
"""


def run(dev, groups, n, counter):
    code = KERNEL.replace("GROUPS", str(groups))
    head, rest = code.split("#if COUNTER\n")
    with_counter, without = rest.split("#else\n")
    without, tail = without.split("#endif\n")
    code = head + (with_counter if counter else without) + tail
    pipe = dev.compile(code)
    parts = dev.buffer(groups * 256 * 4)
    cnt = dev.upload(np.zeros(4, np.uint32))
    results = dev.upload(np.zeros(n, np.uint32))
    it = dev.upload(np.zeros(4, np.uint32))
    bg = dev.bind_group(pipe, [parts, cnt, results, it])
    enc = dev.encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pipe)
    cp.set_bind_group(0, bg)
    for _ in range(n):
        cp.dispatch_workgroups(groups)
    cp.end()
    cb = enc.finish()
    t0 = time.perf_counter()
    dev.submit([cb])
    got = dev.read(results, np.uint32)[:n]
    dt = (time.perf_counter() - t0) / n
    g = np.arange(groups, dtype=np.uint64)
    want = ((np.arange(n, dtype=np.uint64) * 7919 * groups + (g * 256 + g % 256).sum()) % 2**32).astype(np.uint32)
    return dt, (int((got != want).sum()) if counter else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("--groups", default="32,128,512,2048")
    a = ap.parse_args()
    dev = get_device()
    print(f"device: {dev.name}")
    for g in (int(v) for v in a.groups.split(",")):
        for counter in (False, True, False, True):   # each twice, the first warming the clocks
            dt, bad = run(dev, g, a.n, counter)
            kind = "last-group sum" if counter else "plain"
            print(f"{g:5d} groups {kind:>15}: {dt * 1e6:6.2f} us per dispatch"
                  + ("" if bad is None else f", {bad} of {a.n} sums wrong"))


if __name__ == "__main__":
    main()
