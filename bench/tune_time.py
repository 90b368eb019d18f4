"""Where a model's first-load tuning spends its time: building the candidate plans (compiling their
kernels) against timing them.

    python bench/tune_time.py model.gguf

Loads without tuning, then runs `Model.tune(force=True)` with autotune's two phases clocked.
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import shaderlm                          # noqa: E402
from shaderlm.gpu import autotune        # noqa: E402


def clocked(spent: dict, name: str, f):
    def run(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            spent[name] += time.perf_counter() - t
    return run


def main():
    spent = {"plans": 0.0, "timer": 0.0}
    autotune._plans = clocked(spent, "plans", autotune._plans)
    autotune._timer = clocked(spent, "timer", autotune._timer)
    t = time.perf_counter()
    model = shaderlm.load(sys.argv[1], progress=False, tune=False)
    print(f"load {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    model.tune(force=True)
    print(f"tune {time.perf_counter() - t:.1f} s: building candidate plans {spent['plans']:.1f} s, "
          f"timing {spent['timer']:.1f} s")


if __name__ == "__main__":
    main()
