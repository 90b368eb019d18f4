"""Long fuzzing campaigns: every target for N inputs or T seconds, then a table of the outcomes.

    python fuzz/campaign.py --runs 200000 [--targets gguf_file,hf_folder] [--jobs 2] [--out DIR]
    python fuzz/campaign.py --seconds 600
    python fuzz/campaign.py --table                 the table of what DIR holds (several campaigns add up)

DIR (default /tmp/shaderlm-fuzz) holds corpus/<target> (seeded by corpus.py, grown by every
campaign), findings/<target> and stats/<target>. A target keeps going past findings: each distinct one
(exception type and where it was raised) is saved once as findings/<target>/finding-*.bin, its input,
with the traceback in the .txt beside it; `python fuzz/<target>.py FILE` replays an input. A hang or a
memory blow-up ends the process instead (libFuzzer's timeout-* or oom-* file, same folder): the
campaign starts the target again for what is left.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from corpus import TARGETS, write_corpus  # noqa: E402

LIMITS = ["-timeout=5", "-rss_limit_mb=2048", "-malloc_limit_mb=2048"]
MAX_RESTARTS = 50


def run_target(target: str, out: str, runs: int, seconds: float, extra: list[str]) -> None:
    corpus = os.path.join(out, "corpus", target)
    if not os.path.isdir(corpus):
        write_corpus(os.path.join(out, "corpus"), [target])
    findings, stats = (os.path.join(out, d, target) for d in ("findings", "stats"))
    os.makedirs(findings, exist_ok=True)
    os.makedirs(stats, exist_ok=True)
    t0, done = time.monotonic(), 0
    for _ in range(MAX_RESTARTS):
        left = seconds - (time.monotonic() - t0) if seconds else runs - done
        if left < 1:
            break
        n = len(glob.glob(os.path.join(stats, "run-*.json")))
        stat = os.path.join(stats, f"run-{n:03d}.json")
        budget = f"-max_total_time={int(left)}" if seconds else f"-runs={int(left)}"
        cmd = [sys.executable, os.path.join(HERE, f"{target}.py"), budget, *LIMITS, f"-artifact_prefix={findings}/",
               *extra, corpus]
        env = dict(os.environ, FUZZ_FINDINGS=findings, FUZZ_STATS=stat)
        start = time.monotonic()
        with open(os.path.join(stats, "log.txt"), "a") as log:
            rc = subprocess.call(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=HERE)
        with open(stat + ".run", "w") as f:
            json.dump({"rc": rc, "seconds": time.monotonic() - start}, f)
        done += sum(_load(stat).get("outcomes", {}).values())
        if rc == 0:
            break
        print(f"{target}: the fuzzer stopped (exit {rc}); restarting", file=sys.stderr)


def _load(path: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def table(out: str) -> str:
    rows = [("target", "inputs", "accepted", "project error", "finding", "seconds")]
    listed = []
    for target in TARGETS:
        stats = os.path.join(out, "stats", target)
        if not os.path.isdir(stats):
            continue
        outcomes, per_sig, secs = Counter(), Counter(), 0.0
        for path in sorted(glob.glob(os.path.join(stats, "run-*.json"))):
            s = _load(path)
            outcomes.update(s.get("outcomes", {}))
            per_sig.update(s.get("findings", {}))
            secs += _load(path + ".run").get("seconds", 0.0)
        folder = os.path.join(out, "findings", target)
        saved = {}
        for txt in glob.glob(os.path.join(folder, "finding-*.txt")):
            with open(txt, encoding="utf-8") as f:
                saved[f.readline().strip()] = txt[:-4] + ".bin"
        listed += [f"{target}: {sig}  x{n:,}  {saved.get(sig, '?')}" for sig, n in per_sig.most_common()]
        # what ended a process: libFuzzer's own artifacts (timeout-*, oom-*, crash-*), by kind
        names = [os.path.basename(p) for p in glob.glob(os.path.join(folder, "*-*"))]
        kinds = Counter(n.split("-")[0] for n in names if not n.startswith("finding-"))
        listed += [f"{target}: {kind} (libFuzzer)  x{n}  {os.path.join(folder, kind)}-*" for kind, n in kinds.items()]
        rows.append((target, f"{sum(outcomes.values()):,}", f"{outcomes['accepted']:,}",
                     f"{outcomes['project_error']:,}", f"{outcomes['finding'] + sum(kinds.values()):,}", f"{secs:,.0f}"))
    total = [sum(int(r[i].replace(",", "")) for r in rows[1:]) for i in range(1, 6)]
    rows.append(("all", *(f"{x:,}" for x in total)))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    return "\n".join(lines + ["", "findings (distinct; reproducer):"] + (listed or ["none"]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=0, help="inputs per target")
    p.add_argument("--seconds", type=float, default=0, help="seconds per target")
    p.add_argument("--targets", default=",".join(TARGETS), help="comma-separated, of: " + ", ".join(TARGETS))
    p.add_argument("--jobs", type=int, default=1, help="targets run side by side")
    p.add_argument("--out", default="/tmp/shaderlm-fuzz")
    p.add_argument("--table", action="store_true", help="only print the table of what --out holds")
    p.add_argument("libfuzzer", nargs="*", help="more libFuzzer flags (after --), e.g. -seed=1")
    a = p.parse_args()
    if not a.table:
        if not (a.runs or a.seconds):
            p.error("give --runs or --seconds")
        targets = [t for t in a.targets.split(",") if t]
        unknown = set(targets) - set(TARGETS)
        if unknown:
            p.error(f"unknown targets {sorted(unknown)}")
        with ThreadPoolExecutor(a.jobs) as ex:
            list(ex.map(lambda t: run_target(t, a.out, a.runs, a.seconds, a.libfuzzer), targets))
    print(table(a.out))


if __name__ == "__main__":
    main()
