"""Every bad model of tests/bad_models.py, given to `shaderlm run --model BAD -n 2 hi`, ends with exactly one
line on stderr, ``shaderlm: error: ...`` naming the file and the problem, and a non-zero exit code: no
traceback, no hang, never exit 0 with whatever the model produced.

Most cases run in this process, through shaderlm.cli.main (the same code `python -m shaderlm` runs, with
fd-level capture so that what a native library writes to stderr counts too); the ones marked ``isolate``
(they may hang, abort, or allocate without bound) run as real subprocesses under a memory limit and a
timeout, started in the background when the module starts so that their waiting overlaps the rest.

    python tests/bad_models.py OUTDIR --run     # the same cases, every one as a subprocess, with a summary
"""
from __future__ import annotations

import signal
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest

try:
    import bad_models as bm
except ImportError:  # tests/ imported as a package
    from tests import bad_models as bm

ISOLATED_JOBS = 3               # subprocesses at once (each under bm.MEMORY_LIMIT of address space)

# in-process cases first, subprocess ones last (their results are ready by then)
CASES = [c for c in bm.CASES if not c.isolate] + [c for c in bm.CASES if c.isolate]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, request):
    """{case name: --model path} for every selected case, and {case name: future Outcome} of the isolated ones."""
    chosen = {item.callspec.params["case"].name for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec") and "case" in item.callspec.params}
    cases = [c for c in CASES if c.name in chosen]
    root = str(tmp_path_factory.mktemp("bad_models"))
    paths = bm.write_corpus(root, cases)
    isolated = [c for c in cases if c.isolate]
    waiting = [c for c in isolated if c.idle_wait]       # blocked on a FIFO: no CPU, no memory, all at once
    busy = ThreadPoolExecutor(ISOLATED_JOBS)
    idle = ThreadPoolExecutor(max(1, len(waiting)))
    futures = {c.name: (idle if c.idle_wait else busy).submit(bm.run_subprocess, c, paths[c.name])
               for c in isolated}
    yield paths, futures
    for f in futures.values():
        f.cancel()
    for ex in (busy, idle):
        ex.shutdown(wait=True)  # a running one ends within its own timeout


class _Hang(BaseException):
    pass


def run_in_process(case, path, capfd) -> bm.Outcome:
    """shaderlm.cli.main on the case, as the command line would run it: warnings shown as Python's default
    filters show them (once, on stderr), a SIGALRM watchdog in place of the subprocess timeout."""
    from shaderlm.cli import main

    fired = []

    def alarm(signum, frame):
        fired.append(True)
        raise _Hang()

    capfd.readouterr()
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, bm.TIMEOUT)
    t0 = time.perf_counter()
    extra = ""
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.resetwarnings()
            warnings.simplefilter("default")
            for cat in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", cat)
            try:
                rc = main(bm.cli_argv(case, path))
            except SystemExit as e:
                rc = e.code if isinstance(e.code, int) else 1
            except _Hang:
                rc = None
            except BaseException as e:  # noqa: BLE001 - main let something through: the CLI would print a traceback
                rc = 1
                extra = f"Traceback (most recent call last):\n  (in process)\n{type(e).__name__}: {e}\n"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    seconds = time.perf_counter() - t0
    cap = capfd.readouterr()
    shown = "".join(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught)
    if fired:
        rc = None
    return bm.Outcome(rc, cap.out, cap.err + shown + extra, seconds)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_model_is_one_clear_error(case, corpus, capfd):
    paths, futures = corpus
    path = paths[case.name]
    if case.isolate:
        outcome = futures[case.name].result()
    else:
        outcome = run_in_process(case, path, capfd)
    bad = bm.problems(case, path, outcome)
    assert not bad, (f"{case.name} ({case.change}): {'; '.join(bad)}\n"
                     f"rc={outcome.rc}, {outcome.seconds:.1f} s, stderr ends: {bm.tail(outcome)}")
