"""What every target shares: the rule it checks, its scratch files and its tallies.

The rule: given any input, a reader or loader either succeeds or raises ShaderLMError. Anything else
(another exception, a BaseException such as the PanicException of a Rust library) is a finding; hangs
and memory blow-ups are libFuzzer's to catch (-timeout, -rss_limit_mb).

By default a finding ends the run as libFuzzer expects (the exception propagates, a crash-* file is
written): the test suite's short runs. With FUZZ_FINDINGS=<folder>, a long campaign keeps going and
each distinct finding (exception type and where it was raised) is saved there once, with its input and
traceback. With FUZZ_STATS=<file>, the tallies are written there as JSON (every second and at exit).
"""
from __future__ import annotations

import atexit
import ctypes
import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter

import atheris

# coverage of the readers only: tracing the writers too (gguf's, shaderlm.synth) halves the speed
with atheris.instrument_imports(include=["shaderlm", "gguf"],
                                exclude=["gguf.gguf_writer", "gguf.quants", "shaderlm.synth", "shaderlm.convert"]):
    import gguf  # noqa: F401
    import shaderlm.formats.safetensors  # noqa: F401
    import shaderlm.formats.tokenizer  # noqa: F401
    import shaderlm.models.loading  # noqa: F401
    import shaderlm.synth  # noqa: F401

import shaderlm
from shaderlm.errors import ShaderLMError

# readers warn about odd but usable inputs; printing those would drown libFuzzer's log
warnings.simplefilter("ignore")
logging.disable(logging.WARNING)

FINDINGS = os.environ.get("FUZZ_FINDINGS")
STATS = os.environ.get("FUZZ_STATS")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(shaderlm.__file__)))    # the tree under test

tally: Counter = Counter()          # accepted / project_error / finding
seen: Counter = Counter()           # finding signature -> count
_last_flush = [0.0]
_rendered: set = set()
SCRATCH = tempfile.mkdtemp(prefix="shaderlm-fuzz-")


def scratch(name: str) -> str:
    return os.path.join(SCRATCH, name)


def write(path: str, data: bytes) -> None:
    """Replace the file at `path` with `data`. A new inode each time: a map of the old file that is still
    alive must not see it shrink (a SIGBUS, not a finding)."""
    tmp = path + ".new"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def use_tokenizer(tok) -> None:
    """What the first request does with a tokenizer: render the chat template, encode a prompt, decode
    the ids. Each template is rendered once per process: compiling it would take half of each input's time."""
    template = tok.chat_template or tok.default_chat_template()
    if template not in _rendered:
        tok.apply_chat_template([{"role": "user", "content": "Hello world!"}])
        _rendered.add(template)
    tok.decode(tok.encode("<|im_start|>user\nHello world! 42 é<|im_end|>\n"))


def each(*steps) -> None:
    """Run every step: a project error in one does not hide a finding in the next (raised at the end)."""
    first = None
    for step in steps:
        try:
            step()
        except ShaderLMError as e:
            first = first or e
    if first is not None:
        raise first


def signature(e: BaseException) -> str:
    """The exception type, the innermost project frame (where a check is missing) and the innermost frame."""
    frames = traceback.extract_tb(e.__traceback__)
    ours = [f for f in frames if f.filename.startswith(_ROOT) and "/fuzz/" not in f.filename]

    def at(f):
        return f"{os.path.relpath(f.filename, _ROOT) if f.filename.startswith(_ROOT) else f.filename}:{f.lineno}"
    where = at(ours[-1]) if ours else "?"
    inner = at(frames[-1]) if frames else "?"
    return f"{type(e).__name__} at {where}" + (f" (raised in {inner})" if inner != where else "")


def _record(e: BaseException, data: bytes) -> None:
    sig = signature(e)
    seen[sig] += 1
    if seen[sig] > 1:
        return
    stem = os.path.join(FINDINGS, "finding-" + hashlib.sha1(sig.encode()).hexdigest()[:12])
    with open(stem + ".bin", "wb") as f:
        f.write(data)
    with open(stem + ".txt", "w", encoding="utf-8") as f:
        f.write(sig + "\n\n" + "".join(traceback.format_exception(e)))


def flush(force: bool = False) -> None:
    now = time.monotonic()
    if STATS and (force or now - _last_flush[0] > 1.0):
        _last_flush[0] = now
        with open(STATS + ".new", "w") as f:
            json.dump({"outcomes": dict(tally), "findings": dict(seen)}, f)
        os.replace(STATS + ".new", STATS)


def guarded(target):
    """TestOneInput for libFuzzer: runs `target(data)` and applies the rule."""
    def one(data: bytes) -> None:
        try:
            target(data)
        except ShaderLMError:
            tally["project_error"] += 1
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - the point: anything but ShaderLMError is a finding
            tally["finding"] += 1
            if not FINDINGS:
                raise
            _record(e, data)
        else:
            tally["accepted"] += 1
        flush()
    return one


def _exit(_=None) -> None:
    flush(force=True)
    shutil.rmtree(SCRATCH, ignore_errors=True)


atexit.register(_exit)           # a process that imports a target without fuzzing (a replay script)
_c_exit = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_exit)


def fuzz(target, mutator=None) -> None:
    """Hand `target` to libFuzzer with the command line's flags (a corpus folder, -runs=, -seed=, ...)."""
    # libFuzzer ends the process with exit(), which skips Python's atexit: register with the C library
    # (here only: after a normal interpreter exit, calling into Python would crash)
    ctypes.CDLL(None).__cxa_atexit(_c_exit, None, None)
    if FINDINGS:
        os.makedirs(FINDINGS, exist_ok=True)
    kw = {"custom_mutator": mutator} if mutator else {}
    # seeds that add no coverage (a valid tokenizer.json covers what a valid config.json does) would be
    # dropped, and the structure-aware mutators with them
    argv = sys.argv + ["-keep_seed=1"] * (not any(a.startswith("-keep_seed=") for a in sys.argv))
    atheris.Setup(argv, guarded(target), **kw)
    atheris.Fuzz()
