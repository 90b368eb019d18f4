"""`shaderlm bench` and `shaderlm profile` run end to end (on lavapipe in CI) and report sane rows."""
from __future__ import annotations

import json

from shaderlm.cli import main


def test_bench_json(tiny_gguf, capsys):
    assert main(["bench", "-m", tiny_gguf, "-p", "8", "-n", "4", "-r", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["test"]: r for r in out["results"]}
    assert set(rows) == {"pp8", "tg4"}
    for r in rows.values():
        assert len(r["runs"]) == 2 and r["tps"] > 0
    tg, pp = rows["tg4"], rows["pp8"]
    # bytes per decode token: every weight matrix once; the tied embedding is the LM head
    assert 0 < tg["bytes"] <= tg["size"] and tg["dispatches"] > 0
    # a prompt's run lasts until its first token: the time to first token is the median run's
    assert "ttft_ms" not in tg and abs(pp["ttft_ms"] - 1000 * 8 / pp["tps"]) < 1e-6


def test_bench_depth(tiny_gguf, capsys):
    """-d fills the KV cache before each test (llama-bench's depth): rows are named for it, and the
    cache holds keys at the positions before the timed tokens, which no other step writes."""
    import numpy as np

    import shaderlm
    from shaderlm.bench import bench_gen, bench_prompt
    assert main(["bench", "-m", tiny_gguf, "-p", "4", "-n", "2", "-d", "0", "-d", "9", "-r", "1", "--json"]) == 0
    rows = {r["test"] for r in json.loads(capsys.readouterr().out)["results"]}
    assert rows == {"pp4", "tg2", "pp4 @ d9", "tg2 @ d9"}
    for depth_run in (lambda m: bench_prompt(m, 4, 1, depth=9), lambda m: bench_gen(m, 2, 1, depth=9)):
        model = shaderlm.load(tiny_gguf, ctx=32, progress=False)
        net = model.net
        depth_run(model)
        k0 = model.device.read(net.k_cache[0], np.uint16).reshape(net.ctx, -1)
        assert (k0[:9] != 0).any(axis=1).all()              # the depth's keys
        assert not (k0[15:] != 0).any()                      # nothing past depth + prompt / generated
    assert main(["bench", "-m", tiny_gguf, "-p", "4", "-n", "2", "-d", "100000", "-r", "1"]) == 1
    assert "do not fit" in capsys.readouterr().err


def test_bench_batches(tiny_gguf, capsys, monkeypatch):
    """-B: aggregate decode of several sequences at once, a row a batch size; rows whose steps ran on
    the int8 batch GEMMs (SHADERLM_GEMM_ROWS) say so."""
    monkeypatch.setenv("SHADERLM_GEMM_ROWS", "3")
    monkeypatch.setenv("SHADERLM_EXACT_PREFILL", "0")
    assert main(["bench", "-m", tiny_gguf, "-p", "4", "-n", "3", "-B", "1,3", "-r", "1", "--json"]) == 0
    rows = {r["test"]: r for r in json.loads(capsys.readouterr().out)["results"]}
    assert set(rows) == {"pp4+tg3 x1", "pp4+tg3 x3 gemm"}
    assert all(r["tps"] > 0 and len(r["runs"]) == 1 for r in rows.values())


def test_bench_peak_and_table(tiny_gguf, capsys):
    assert main(["bench", "-m", tiny_gguf, "-p", "4", "-n", "2", "-r", "1", "--peak"]) == 0
    out = capsys.readouterr().out
    assert "peak streaming read" in out and "tg2" in out and "%peak" in out and "TTFT ms" in out


def test_profile(tiny_gguf, capsys):
    assert main(["profile", "-m", tiny_gguf, "--context", "5", "--prefill", "6", "-r", "1"]) == 0
    out = capsys.readouterr().out
    assert "decode step at position 5" in out and "prefill of 6 tokens" in out
    assert "matmul" in out and "attention" in out


def test_profile_batch(tiny_gguf, capsys):
    """profile -B: the serving engine's decode step of a few sequences, on the batch kernels (paged
    attention, the batch sampler), its dispatches' times adding up to the printed total."""
    assert main(["profile", "-m", tiny_gguf, "--context", "5", "-r", "1", "-B", "1,3"]) == 0
    out = capsys.readouterr().out
    for b, rows in ((1, 1), (3, 3)):
        head = next(line for line in out.splitlines() if line.startswith(f"serving decode step of {b} sequences"))
        assert f"at position 6 ({rows} rows" in head
    table = out.split("serving decode step of 3 sequences")[1].splitlines()[2:]
    kernels = {line.split("|")[0].strip(): float(line.split("|")[2]) for line in table if "|" in line}
    assert any(k.startswith("attention") for k in kernels) and "sample" in kernels, kernels
    total = float(out.split("serving decode step of 3 sequences")[1].split("GPU ")[1].split(" us")[0])
    assert abs(sum(kernels.values()) - total) < 0.01 * total + 1.0


def test_dispatch_times_from_pass_timestamps(monkeypatch):
    """Where timestamps go only at a pass's start and end (Dawn), each dispatch runs in a pass of its own:
    the times come back in plan order, a read of 128 MiB taking longer than one of 64 KiB around it."""
    import numpy as np
    import pytest

    from shaderlm.gpu.device import get_device
    from shaderlm.gpu.plan import Dispatch, Plan
    from shaderlm.gpu.profiler import time_dispatches
    from shaderlm.kernels import pipeline
    dev = get_device()
    if not dev.has_timestamps:
        pytest.skip("no timestamp queries on this adapter")
    monkeypatch.setattr(dev, "features", dev.features - {"timestamp-query-inside-passes"})
    pipe = pipeline(dev, "peak_read", UNROLL=4)
    out = dev.buffer(64 * 256 * 4)
    reads = [dev.buffer(size) for size in (1 << 16, min(1 << 27, dev.max_binding), 1 << 16)]
    plan = Plan(dev, [Dispatch(pipe, dev.bind_group(pipe, [src, out]), (64, 1, 1), label="peak_read") for src in reads])
    times = time_dispatches(dev, plan)
    assert len(times) == 3 and all(np.isfinite(times)) and min(times) > 0
    assert times[1] > 3 * max(times[0], times[2]), times
