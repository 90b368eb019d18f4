"""Where wgpu puts barriers in a serving step, and why. wgpu-core issues one before a dispatch wherever a
buffer's use changes or a writable binding is used again (even by dispatches that touch disjoint rows), and
a Vulkan barrier waits for all the work before it: a barrier that no data needs serializes two kernels that
could overlap. This lists a decode step's dispatches with the buffers each reads and writes (the access
from its WGSL) and, at each barrier, its cause: RAW / WAR (a real dependency) or writable bindings alone in
both (WAW: real only where the later kernel reads what the earlier wrote, as an accumulation does).

    SHADERLM_FUSE=1 SHADERLM_EXACT_PREFILL=0 python scripts/plan_barriers.py MODEL [--rows 16]

Runs on any adapter (lavapipe included): it builds the plan and runs nothing. The two settings give a CPU
adapter the plan a GPU gets (the fused step; from 8 rows the int8 GEMMs).
"""
from __future__ import annotations

import argparse
import re

import shaderlm
from shaderlm.kernels import compiled, load_wgsl
from shaderlm.models.serving import Serving


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--rows", type=int, default=16, help="the step's sequences")
    a = ap.parse_args()
    m = shaderlm.load(a.model, progress=False, ctx=256, batch=a.rows)
    dev = m.net.dev
    with dev.recording_bindings() as bound:
        plan = Serving(m.net, slots=a.rows, seq_ctx=128, tokens_per_submit=1).decode_plan(a.rows)
    access = {id(pipe): {int(b): mode for b, mode in re.findall(
        r"@binding\((\d+)\)\s*var<storage,\s*(read_write|read)>", load_wgsl(kernel, dict(defines)))}
        for (kernel, defines), pipe in compiled(dev).items()}
    names = {id(v): k for k, v in vars(m.net).items() if hasattr(v, "usage") and hasattr(v, "size")}
    used, since, barriers, waw = {}, [], 0, 0      # buffer -> "w" / "r" since the last barrier
    for d in plan.dispatches:
        modes, reads, writes = access.get(id(d.pipeline), {}), set(), set()
        for i, b in bound.get(id(d.bind_group), {}).items():
            if i in modes:
                (writes if modes[i] == "read_write" else reads).add(id(b))
                names.setdefault(id(b), getattr(b, "label", "") or f"buffer {len(names)}")
        if any(b in used and (used[b] == "w" or b in writes) for b in reads | writes):
            barriers += 1
            kinds = {"RAW": {b for b in reads if any(b in w for _, w in since)},
                     "WAR": {b for b in writes if any(b in r for r, _ in since)}}
            if not any(kinds.values()):
                waw += 1
                kinds = {"WAW": {b for b in writes if any(b in w for _, w in since)}}
            print("  -- barrier: " + "; ".join(f"{k} {', '.join(sorted(names[b] for b in v))}"
                                              for k, v in kinds.items() if v))
            used, since = {}, []
        used.update({b: "r" for b in reads if b not in used} | {b: "w" for b in writes})
        since.append((reads, writes))
        print(f"{d.label:24} reads {', '.join(sorted(names[b] for b in reads))}; "
              f"writes {', '.join(sorted(names[b] for b in writes))}")
    print(f"{len(plan.dispatches)} dispatches, {barriers} barriers, {waw} of them WAW alone")


if __name__ == "__main__":
    main()
