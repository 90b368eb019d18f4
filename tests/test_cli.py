"""The command line on a tiny synthetic model: perplexity against a NumPy computation over the
reference logits, run/stdin, info, and clear one-line errors."""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

from shaderlm.cli import main
from shaderlm.formats.tokenizer import Tokenizer

from reference import reference_logits

TEXT = ("the quick brown fox jumps over the lazy dog. " * 12 + "pack my box with five dozen liquor jugs. " * 10)


def test_perplexity_matches_reference(tiny_gguf, tmp_path, capsys):
    f = tmp_path / "t.txt"
    f.write_text(TEXT)
    ctx, chunks = 32, 3
    assert main(["perplexity", "-m", tiny_gguf, "-f", str(f), "--ctx", str(ctx), "--chunks", str(chunks)]) == 0
    out = capsys.readouterr().out
    m = re.search(r"^Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)$", out.strip().splitlines()[-1])
    assert m, out
    # llama-perplexity's method: BOS at chunk start when the model adds BOS, score the second half
    tok = Tokenizer.from_gguf(tiny_gguf)
    ids = tok.encode(TEXT, add_bos=False)
    nll, n = 0.0, 0
    for c in range(chunks):
        chunk = ids[c * ctx:(c + 1) * ctx]
        if tok.add_bos:
            chunk = [tok.bos_id] + chunk[1:]
        lg = reference_logits(tiny_gguf, chunk).astype(np.float64)
        for j in range(ctx // 2, ctx - 1):
            row = lg[j]
            nll -= row[chunk[j + 1]] - row.max() - math.log(np.exp(row - row.max()).sum())
            n += 1
    assert float(m.group(1)) == pytest.approx(math.exp(nll / n), rel=2e-3)


def test_run_reads_stdin_and_prints_stats(tiny_gguf, monkeypatch, capsys):
    import io
    monkeypatch.setattr("sys.stdin", io.StringIO("the quick brown"))
    assert main(["run", "-m", tiny_gguf, "--raw", "-n", "5", "--ctx", "64"]) == 0
    cap = capsys.readouterr()
    assert cap.out.endswith("\n")
    assert re.search(r"decode: \d+ tok, [0-9.]+ tok/s \| \d+ dispatches/token", cap.err), cap.err


def test_info(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "max-storage-buffer-binding-size" in out and "using:" in out


@pytest.mark.parametrize("argv,msg", [
    (["run", "-m", "/nonexistent/model.gguf", "hi"], "no such file"),
    (["perplexity", "-m", "{tiny}", "-f", "{short}", "--ctx", "64"], "need at least"),
    (["run", "-m", "{tiny}", "--ctx", "16", "--raw", "{long}"], "does not fit the context"),
])
def test_errors_are_one_line(tiny_gguf, tmp_path, capsys, argv, msg):
    short = tmp_path / "short.txt"
    short.write_text("the dog")
    argv = [a.format(tiny=tiny_gguf, short=short, long="the quick brown fox " * 20) for a in argv]
    assert main(argv) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("shaderlm: error:") and msg in err and "Traceback" not in err, err
