"""Peak RAM while loading a Hugging Face folder of 1-2 GB.

    python scripts/peak_ram_hf.py write DIR          # a synthetic Llama-3.2-1B-shaped folder, 8 layers, BF16,
                                                      # two safetensors shards + index: about 1.5 GB
    python scripts/peak_ram_hf.py load DIR [--quantize q8_0] [--ctx 256]
    python scripts/peak_ram_hf.py scan DIR           # the loader alone: every tensor read as the GPU
                                                      # upload reads it, no GPU

Each mode runs in its own process and reports the process's peak resident set (ru_maxrss; VmHWM),
the folder's size, and for `load` the bytes shaderlm allocated in GPU buffers (on lavapipe, a software
Vulkan, those buffers live in this process's RAM, so they are part of its RSS): the model's weights
as uploaded, the KV cache, and the activations.  "Peak minus GPU buffers" is what loading itself costs.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def rss_now() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def folder_bytes(d: str) -> int:
    return sum(os.path.getsize(os.path.join(d, n)) for n in os.listdir(d) if n.endswith(".safetensors"))


def gb(n: int) -> str:
    return f"{n / 1e9:.3f} GB"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["write", "load", "scan"])
    ap.add_argument("dir")
    ap.add_argument("--quantize", default=None)
    ap.add_argument("--ctx", type=int, default=256)
    a = ap.parse_args()
    if a.mode == "write":
        from shaderlm.synth import write_synthetic_hf
        t = time.time()
        write_synthetic_hf(a.dir, preset="llama-3.2-1b", dtype="BF16", shard_bytes=1 << 30, n_layers=8)
        print(f"wrote {a.dir}: {gb(folder_bytes(a.dir))} of safetensors in {time.time() - t:.0f} s")
        return
    size = folder_bytes(a.dir)
    base = rss_now()
    if a.mode == "scan":
        import numpy as np

        from shaderlm.formats.hf import HFCheckpoint
        ck = HFCheckpoint(a.dir, quantize=a.quantize)
        for t in ck.tensors.values():
            np.asarray(t.data).max()            # touch every page, as the upload's copy does
            ck.release(t)
        print(f"scan: {len(ck.tensors)} tensors, {gb(size)} of safetensors; RSS at start {gb(base)}, "
              f"peak RSS {gb(peak_rss())} (peak - start {gb(peak_rss() - base)})")
        return
    import shaderlm
    t = time.time()
    m = shaderlm.load(a.dir, progress=False, ctx=a.ctx, quantize=a.quantize)
    el = time.time() - t
    net, c = m.net, m.config
    kv = 2 * c.n_layers * net.ctx * c.kv_dim * 2
    act = net.batch * 4 * (3 * c.dim + c.q_dim + 2 * c.kv_dim + c.q_dim + 3 * c.ffn_dim) + \
        net.logit_rows * c.vocab_size * 4
    gpu = net.weight_bytes + kv + act
    peak = peak_rss()
    print(f"load: {a.dir} ({gb(size)} of safetensors, quantize={a.quantize}) in {el:.0f} s on {m.device.name}")
    print(f"  RSS before loading {gb(base)}; peak RSS {gb(peak)}; RSS after {gb(rss_now())}")
    print(f"  GPU buffers: weights {gb(net.weight_bytes)} + KV cache {gb(kv)} + activations/logits {gb(act)} "
          f"= {gb(gpu)}")
    print(f"  peak - before - GPU buffers = {gb(peak - base - gpu)} "
          f"({(peak - base - gpu) / size:.2f} x the folder); peak / folder = {peak / size:.2f}")


if __name__ == "__main__":
    main()
