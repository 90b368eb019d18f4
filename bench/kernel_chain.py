"""Steady-state cost of each dispatch of a model's decode step, without timestamps in between.

Per-dispatch timestamps serialize the GPU and add their own cost; here each dispatch of the decode
plan is repeated N times in one compute pass (one submit, CPU-timed to the readback), so the number is
what the dispatch costs back to back with itself, launch and barrier included. The table groups
dispatches by label and shape; the last line times the whole decode plan the same way. The clock
starts after encoding, at the submit: these are GPU times.
--ablate also times whole steps with each group's dispatches left out (wrong results, right timing):
the step's time minus that is what the group costs where it sits, in the step.
--stream times whole steps with the weight-reading dispatches (the GEMVs) replaced by a pure stream of
the same bytes (distinct buffers, the same dependencies): the step as fast as its dispatches could
read their weights, so what kernel work on each group could still gain, and the ceiling of this
dispatch structure.

    python bench/kernel_chain.py -m model.gguf [-n 300] [--ablate] [--stream]
"""
from __future__ import annotations

import argparse
import os
import time
from collections import OrderedDict

import numpy as np

import shaderlm
from shaderlm.gpu.plan import Dispatch, Plan


def timed(dev, plan, n, sync_buf):
    """GPU seconds per repeat of `plan` (encoding done before the clock starts)."""
    def encoded(k):
        enc = dev.encoder()
        cp = enc.begin_compute_pass()
        for _ in range(k):
            plan.encode(cp, 1)
        cp.end()
        return enc.finish()
    dev.submit([encoded(2)])
    dev.read(sync_buf, np.uint32, 0, 16)
    cb = encoded(n)
    t0 = time.perf_counter()
    dev.submit([cb])
    dev.read(sync_buf, np.uint32, 0, 16)
    return (time.perf_counter() - t0) / n


# A pure stream of a weight's bytes standing in for a GEMV: each thread XORs V vec4 loads (unconditional,
# clamped: a guarded load cost a memory round trip on NVIDIA), a grid-stride apart. The model's
# activation buffers are bound read-write, so the stream waits for (and is waited on by) its
# neighbours as the GEMV it replaces would; the store to them never happens for real data.
STREAM_WGSL = """
@group(0) @binding(0) var<storage, read> src: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<storage, read_write> a0: array<u32>;
@group(0) @binding(3) var<storage, read_write> a1: array<u32>;
@group(0) @binding(4) var<storage, read_write> a2: array<u32>;
@group(0) @binding(5) var<storage, read_write> a3: array<u32>;
@group(0) @binding(6) var<storage, read_write> a4: array<u32>;
@group(0) @binding(7) var<storage, read_write> a5: array<u32>;
@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let n = arrayLength(&src);
    let stride = nwg.x * nwg.y * 256u;
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    var acc = vec4<u32>(0u);
    for (var u = 0u; u < VU; u++) { acc ^= src[min(i + u * stride, n - 1u)]; }
    let r = acc.x ^ acc.y ^ acc.z ^ acc.w;
    if (r == 0x9E3779B9u && li == 7u) { a0[0] = r; a1[0] = r; a2[0] = r; a3[0] = r; a4[0] = r; a5[0] = r; }
    out[i] = r;
}
"""


HEAVY = 1 << 20      # --stream replaces the dispatches reading this many bytes or more


def streamed(dev, net, dispatches, which, v: int, cache: dict):
    """The plan with the dispatches in `which` (ids) replaced by streams of their bytes, V loads a thread."""
    def memo(key, make):
        if key not in cache:
            cache[key] = make()
        return cache[key]
    pipe = memo(("pipe", v), lambda: dev.compile(STREAM_WGSL.replace("VU", f"{v}u")))
    # the activations the model has (a mixture of experts has its own FFN buffers), six bindings
    names = ("x", "qkv", "attn", "gu", "h", "expert_h", "router_logits", "logit_buf")
    acts = [getattr(net, n) for n in names if hasattr(net, n)][:6]
    out = []
    for d in dispatches:
        if id(d) not in which:
            out.append(d)
            continue
        n_vec = max(1, d.bytes // 16)
        groups = -(-n_vec // (256 * v))
        gx, gy = min(groups, 32768), -(-groups // 32768)
        src = memo(("src", id(d)), lambda: dev.buffer(n_vec * 16))
        sink = memo(("out", gx * gy), lambda: dev.buffer(gx * gy * 256 * 4))
        bg = memo(("bg", id(d), v), lambda: dev.bind_group(pipe, [src, sink, *acts]))
        out.append(Dispatch(pipe, bg, (gx, gy, 1), label="stream", bytes=d.bytes))
    return Plan(dev, out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("-m", "--model", action="append", help="GGUF file (repeatable; default SmolLM2)")
    ap.add_argument("-n", type=int, default=300, help="repeats of each dispatch")
    ap.add_argument("--context", type=int, default=128, help="tokens in the cache before the step")
    ap.add_argument("--ablate", action="store_true", help="also time whole steps with each group left out")
    ap.add_argument("--stream", action="store_true", help="also time steps with the GEMVs replaced by streams")
    a = ap.parse_args()
    for path in a.model or [None]:
        model = shaderlm.load(path, ctx=a.context + 16, progress=False)
        net, dev = model.net, model.device
        ids = np.random.default_rng(0).integers(0, net.vocab_size, a.context).tolist()
        net.prefill(ids, 0, sample=True)
        net.read_tokens(len(ids), 1)
        net.set_state(len(ids), 1, 0)
        groups: "OrderedDict[tuple, list]" = OrderedDict()
        for d in net.plan_decode.dispatches:
            groups.setdefault((d.label, d.workgroups(1), d.bytes), []).append(d)
        print(f"{os.path.basename(model.path)} on {dev.name}: per-dispatch cost, each repeated {a.n}x back to back")
        print(f"{'kernel':>22} | {'grid':>16} | {'MB':>7} | {'calls':>5} | {'us':>7} | {'GB/s':>6} | {'us x calls':>10}")
        total = 0.0
        for (label, grid, nbytes), ds in groups.items():
            # the sampler advances the position: time it at the same state every time
            us = timed(dev, Plan(dev, [ds[0]]), a.n, net.state) * 1e6
            net.set_state(len(ids), 1, 0)
            total += us * len(ds)
            gbs = nbytes / (us * 1e-6) / 1e9 if nbytes else 0
            print(f"{label:>22} | {str(grid):>16} | {nbytes / 1e6:7.2f} | {len(ds):>5} | {us:7.2f} | {gbs:6.0f} | "
                  f"{us * len(ds):10.1f}")
        def step_us(plan):
            """us a whole step of `plan`, back to back; the position reset after (each step advances it)"""
            us = timed(dev, plan, 20, net.state) * 1e6
            net.set_state(len(ids), 1, 0)
            return us

        def by_group(heading, saved, plan_for, which):
            """A step per group in `which`, each timed with plan_for(that group's dispatch ids)."""
            print(f"{heading:>22} | {'grid':>16} | {'calls':>5} | {'step us':>8} | {saved:>8} | {'per call':>8}")
            for (label, grid, nbytes), ds in which:
                us = step_us(plan_for(set(map(id, ds))))
                print(f"{label:>22} | {str(grid):>16} | {len(ds):>5} | {us:8.0f} | {step - us:8.1f} | "
                      f"{(step - us) / len(ds):8.2f}")

        plan = net.plan_decode.dispatches
        step = step_us(net.plan_decode)
        print(f"sum {total:.0f} us; whole decode step back to back: {step:.0f} us (= {1e6 / step:.0f} tok/s), "
              f"{len(plan)} dispatches")
        if a.ablate:
            by_group("left out", "saved us", lambda drop: Plan(dev, [d for d in plan if id(d) not in drop]),
                     groups.items())
        if a.stream:
            cache, heavy = {}, [d for d in plan if d.bytes >= HEAVY]
            print(f"streams for the {len(heavy)} dispatches reading 1 MB or more "
                  f"({sum(d.bytes for d in heavy) / 1e6:.0f} MB):")
            best = {}
            for v in (1, 4, 16):
                best[v] = us = step_us(streamed(dev, net, plan, set(map(id, heavy)), v, cache))
                print(f"  all streamed, {v:>2} loads a thread: step {us:.0f} us (= {1e6 / us:.0f} tok/s)")
            v = min(best, key=best.get)
            by_group("streamed", "gain us", lambda only: streamed(dev, net, plan, only, v, cache),
                     [(key, ds) for key, ds in groups.items() if key[2] >= HEAVY])


if __name__ == "__main__":
    main()
