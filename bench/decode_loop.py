"""Where the decode loop loses time against the GPU's own step time. The same 128 decode steps from
a one-token prompt, several ways, each timed from the first submit to the last token id read back:
  generate k=8      the Generator's loop (8 tokens a submit, 2 batches in flight, token ids read back)
  queued 8 x N      N command buffers of 8 steps all submitted up front, one readback at the end
  one buffer        all steps in one command buffer
  k=8 map_sync      the same loop reading back with wgpu-py's map_sync instead of by submission index
                    (gpu/backend.py's IndexedSubmission, the default with wgpu-native)

    python bench/decode_loop.py -m model.gguf [-n 128] [-r 5]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import shaderlm                                      # noqa: E402
from shaderlm.engine.generate import Generator, Sampling  # noqa: E402


def queued(model, n, per):
    gen, net = model.generator, model.net
    gen.reset()
    gen._prefill([1], 0, sample=True)
    gen._read_tokens(1, 1)
    net.set_state(1, 1, 0)      # the sampler advances the position on the GPU from here
    cbs = [net.plan_decode.record(1, repeat=min(per, n - s)) for s in range(0, n, per)]
    t0 = time.perf_counter()
    model.device.submit(cbs)
    gen._read_tokens(n, 1)
    return n / (time.perf_counter() - t0)


def looped(model, n, k, wait_one=True):
    gen, dev = Generator(model.net, k), model.device
    saved = dev.indexed
    if not wait_one:            # the Device falls back to map_sync without its IndexedSubmission
        dev.indexed = None
    try:
        list(gen.generate([1], n, Sampling(), keep_history=False))
    finally:
        dev.indexed = saved
    s = gen.stats      # as `shaderlm bench` counts it: the first token's time is the prompt's
    return (s.decode_tokens - 1) / s.decode_s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", action="append")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=5)
    a = ap.parse_args()
    for path in a.model or [None]:
        model = shaderlm.load(path, ctx=a.n + 16, progress=False)
        ways = [("generate k=8", lambda: looped(model, a.n, 8)),
                ("k=8 map_sync", lambda: looped(model, a.n, 8, wait_one=False)),
                (f"queued 8 x {a.n // 8}", lambda: queued(model, a.n, 8)),
                ("one buffer", lambda: queued(model, a.n, a.n))]
        res = {name: [] for name, _ in ways}
        for r in range(a.r + 1):            # interleaved; the first round warms up
            for name, fn in ways:
                v = fn()
                if r:
                    res[name].append(v)
        print(f"{os.path.basename(model.path)} on {model.device.name}, {a.n} decode steps")
        for name, vals in res.items():
            print(f"{name:>16}: {statistics.median(vals):8.1f} tok/s  (min {min(vals):.1f}, max {max(vals):.1f})")


if __name__ == "__main__":
    main()
