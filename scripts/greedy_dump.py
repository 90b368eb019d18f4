"""Greedy continuations of fixed prompts on this machine's adapter, with the top-1/top-2 logit margin
at every step, as JSON: for comparing adapters (lavapipe vs a GPU) under the near-tie rule.

    python scripts/greedy_dump.py [--model PATH] [--tokens 32] > out.json
    python scripts/greedy_dump.py --compare a.json b.json [--tol 0.1]
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that reverses a string.",
    "List three primary colors.",
    "Explain photosynthesis in one sentence.",
    "Once upon a time, in a small village,",
]


def dump(args):
    import shaderlm
    m = shaderlm.load(args.model, progress=False)
    out = {"device": m.device.name, "model": m.path, "runs": []}
    for i, p in enumerate(PROMPTS):
        ids = m.encode_prompt(p, raw=(i == len(PROMPTS) - 1))
        gen = m.generate_tokens(ids, args.tokens, temperature=0.0, stop_at_eos=False)
        logits = m.logits(ids + gen)[len(ids) - 1:len(ids) - 1 + len(gen)]
        top2 = np.sort(logits, axis=1)[:, -2:]
        out["runs"].append({"prompt": p, "prompt_ids": ids, "tokens": gen,
                            "argmax": logits.argmax(1).tolist(),
                            "margins": (top2[:, 1] - top2[:, 0]).tolist(),
                            "text": m.tokenizer.decode(gen)})
    json.dump(out, sys.stdout, indent=1)


def compare(a_path, b_path, tol):
    a, b = json.load(open(a_path)), json.load(open(b_path))
    ok = True
    for ra, rb in zip(a["runs"], b["runs"]):
        same = 0
        verdict = "identical"
        for i, (x, y) in enumerate(zip(ra["tokens"], rb["tokens"])):
            margin = min(ra["margins"][i], rb["margins"][i])
            if x != y:
                verdict = (f"near-tie at step {i} (margin {margin:.3f} <= {tol})" if margin <= tol
                           else f"DIFFERENT at step {i} (margin {margin:.3f})")
                ok = ok and margin <= tol
                break
            same += 1
        print(f"{same:3d}/{len(ra['tokens'])} identical, {verdict}: {ra['prompt'][:40]!r}")
    print(f"{a['device']} vs {b['device']}: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--compare", nargs=2)
    ap.add_argument("--tol", type=float, default=0.1)
    a = ap.parse_args()
    sys.exit(compare(*a.compare, a.tol) if a.compare else dump(a))
