"""What one dispatch costs on this adapter when it does (almost) nothing: the floor under every kernel
of a decode step, and what a chain of dependent loads or a barrier adds to it. A chain of N
dispatches of a probe kernel in one compute pass, timed from the CPU (submit to readback, / N):
  dependent    each dispatch reads and writes the same buffer (wgpu puts a barrier between them)
  independent  each writes its own buffer and reads a shared read-only one (no barrier needed)

    python bench/dispatch_floor.py [-n 2000]
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
@group(0) @binding(0) var<storage, read> src: array<u32>;
@group(0) @binding(1) var<storage, read_write> dst: array<u32>;
@compute @workgroup_size(WG)
fn main(@builtin(local_invocation_index) li: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    // CHAIN dependent loads (each index comes from the previous load; src[i] = i + 1 wraps to 0)
    var i = 0u;
    for (var k = 0u; k < CHAIN; k++) { i = src[i & 1023u]; }
    var v = i;
    BODY
    if (li == 0u) { dst[wid.x] = dst[wid.x] + v + 1u; }
}
"""
PROBES = [  # name, workgroups, workgroup size, dependent loads, extra body
    ("1 wg, 1 load", 1, 32, 0, ""),
    ("1 wg, 1+2 loads", 1, 32, 2, ""),
    ("1 wg, 1+4 loads", 1, 32, 4, ""),
    ("1 wg, 1+8 loads", 1, 32, 8, ""),
    ("256 wg x 128", 256, 128, 0, ""),
    ("4096 wg x 128", 4096, 128, 0, ""),
    ("256 wg x 128 +sg+barrier", 256, 128, 0,
     "v = v + subgroupAdd(li); workgroupBarrier(); v = v + subgroupAdd(v);"),
]


def chain(dev, pipe, bgs, n, groups=1):
    enc = dev.encoder()
    cp = enc.begin_compute_pass()
    cp.set_pipeline(pipe)
    for i in range(n):
        cp.set_bind_group(0, bgs[i % len(bgs)])
        cp.dispatch_workgroups(groups)
    cp.end()
    return enc.finish()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=2000)
    ap.add_argument("-r", type=int, default=5)
    a = ap.parse_args()
    dev = get_device()
    src = dev.upload((np.arange(1024, dtype=np.uint32) + 1) % 1024)
    shared = dev.buffer(4 * 4096)
    own = [dev.buffer(4 * 4096) for _ in range(64)]
    print(f"device: {dev.name}")
    for name, groups, wg, chain_len, body in PROBES:
        code = KERNEL.replace("WG", str(wg)).replace("CHAIN", f"{chain_len}u").replace("BODY", body)
        pipe = dev.compile(code)
        dep = [dev.bind_group(pipe, [src, shared])]
        ind = [dev.bind_group(pipe, [src, b]) for b in own]
        for kind, bgs in (("dependent", dep), ("independent", ind)):
            times = []
            for r in range(a.r + 1):
                cb = chain(dev, pipe, bgs, a.n, groups)
                t0 = time.perf_counter()
                dev.submit([cb])
                dev.read(shared, np.uint32, 0, 16)
                if r:
                    times.append((time.perf_counter() - t0) / a.n)
            print(f"{name:>26} {kind:>12}: {np.median(times) * 1e6:6.2f} us per dispatch")


if __name__ == "__main__":
    main()
