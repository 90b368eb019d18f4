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
    tg = rows["tg4"]
    # bytes per decode token: every weight matrix once; the tied embedding is the LM head
    assert 0 < tg["bytes"] <= tg["size"] and tg["dispatches"] > 0


def test_bench_peak_and_table(tiny_gguf, capsys):
    assert main(["bench", "-m", tiny_gguf, "-p", "4", "-n", "2", "-r", "1", "--peak"]) == 0
    out = capsys.readouterr().out
    assert "peak streaming read" in out and "tg2" in out and "%peak" in out


def test_profile(tiny_gguf, capsys):
    assert main(["profile", "-m", tiny_gguf, "--context", "5", "--prefill", "6", "-r", "1"]) == 0
    out = capsys.readouterr().out
    assert "decode step at position 5" in out and "prefill of 6 tokens" in out
    assert "matmul" in out and "attention" in out
