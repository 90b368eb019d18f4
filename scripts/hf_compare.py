"""tests/test_hf.py's comparison with Hugging Face transformers, split in two so that it runs on a
machine without torch (a GPU box): `save` builds the tiny random models of test_hf.CASES (F16
folders, and their GGUF conversions), runs transformers on them and stores its logits and greedy
tokens; `check` loads each source with shaderlm on this machine's adapter and compares.

    python scripts/hf_compare.py save DIR [--cases qwen3moe,mixtral,gpt_oss]     # needs torch
    python scripts/hf_compare.py check DIR                                         # prints a table

The tolerances are test_hf.py's: logits within 2e-3 x max |reference logit|; greedy tokens equal to
transformers' own greedy run up to its first near-tie (top-1/top-2 margin under that tolerance).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

GREEDY = 12


def save(args):
    import zlib

    import test_hf as th
    from shaderlm.convert import write_gguf

    tr = _tr()
    cases = args.cases.split(",") if args.cases else list(th.CASES)
    os.makedirs(args.dir, exist_ok=True)
    meta = {"cases": {}, "prompts": th._prompts(), "ctx": th.CTX}
    for case in cases:
        folder = th.build_hf_model(tr, os.path.join(args.dir, case), case, seed=zlib.crc32(case.encode()) % 1000)
        gguf16 = write_gguf(folder, os.path.join(args.dir, f"{case}-F16.gguf"), "F16")
        gguf8 = write_gguf(folder, os.path.join(args.dir, f"{case}-Q8_0.gguf"), "Q8_0")
        refs = {}
        for quant in (None, "Q8_0"):
            model = th.reference(tr, folder, quant)
            refs[quant or "F16"] = [th.ref_logits(tr, model, ids).astype(np.float32) for ids in meta["prompts"]]
        model = th.reference(tr, folder)
        prompt = meta["prompts"][1]
        ids, margins = list(prompt), []
        for _ in range(GREEDY):                     # transformers' own greedy run, with its margins
            row = th.ref_logits(tr, model, ids)[-1]
            top2 = np.sort(row)[-2:]
            margins.append(float(top2[1] - top2[0]))
            ids.append(int(row.argmax()))
        np.savez(os.path.join(args.dir, f"{case}.npz"), **{f"{q}_{i}": v for q, vs in refs.items()
                                                          for i, v in enumerate(vs)})
        meta["cases"][case] = {"sources": {"hf": [case, {}, "F16"], "gguf-F16": [os.path.basename(gguf16), {}, "F16"],
                                           "gguf-Q8_0": [os.path.basename(gguf8), {}, "Q8_0"],
                                           "hf-quantize-q8_0": [case, {"quantize": "q8_0"}, "Q8_0"]},
                               "greedy": ids[len(prompt):], "margins": margins}
        print(f"saved {case}", file=sys.stderr)
    with open(os.path.join(args.dir, "meta.json"), "w") as f:
        json.dump(meta, f)


def _tr():
    import torch
    import transformers
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    return torch, transformers


def check(args):
    import shaderlm
    from neartie import first_divergence

    with open(os.path.join(args.dir, "meta.json")) as f:
        meta = json.load(f)
    rel_tol, failed = 2e-3, 0
    print("| arch | source | max error / max logit | greedy | int8 prefill (not exact) |")
    print("|---|---|---|---|---|")
    for case, c in meta["cases"].items():
        refs = np.load(os.path.join(args.dir, f"{case}.npz"))
        ctx = meta["ctx"].get(case, 64)
        for source, (path, kw, ref) in c["sources"].items():
            # the exact paths (f32 prompts, 24-bit decode activations): GPUs default to int8 ones, not exact
            # (the int8 prompt path's error in the last column)
            m = shaderlm.load(os.path.join(args.dir, path), progress=False, ctx=ctx, exact_prefill=True,
                              int8_act=False, **kw)
            m8 = shaderlm.load(os.path.join(args.dir, path), progress=False, ctx=ctx, exact_prefill=False, **kw)
            worst = worst8 = 0.0
            for i, ids in enumerate(meta["prompts"]):
                want = refs[f"{ref}_{i}"]
                worst = max(worst, float(np.abs(m.logits(ids) - want).max() / np.abs(want).max()))
                worst8 = max(worst8, float(np.abs(m8.logits(ids) - want).max() / np.abs(want).max()))
            greedy = "-"
            if source == "hf":
                prompt = meta["prompts"][1]
                got = m.generate_tokens(prompt, GREEDY, temperature=0.0, stop_at_eos=False)
                scale = max(float(np.abs(refs[f"F16_{i}"]).max()) for i in range(len(meta["prompts"])))
                bad = first_divergence(c["greedy"], c["margins"], got, rel_tol * scale)
                greedy = "ok" if bad is None else f"DIVERGES: {bad}"
                failed += bad is not None
            ok = worst <= rel_tol
            failed += not ok
            print(f"| {case} | {source} | {worst:.2e}{'' if ok else ' FAIL'} | {greedy} | {worst8:.2e} |")
    print(f"{'FAILED ' + str(failed) if failed else 'all within tolerance'} on {m.device.name}")
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["save", "check"])
    ap.add_argument("dir")
    ap.add_argument("--cases", default="", help="comma-separated test_hf.CASES names (default all)")
    args = ap.parse_args()
    return save(args) or 0 if args.what == "save" else check(args)


if __name__ == "__main__":
    sys.exit(main())
