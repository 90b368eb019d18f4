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


@pytest.mark.parametrize("flags,want", [([], (None, None)), (["--exact"], (False, True)),
                                        (["--int8-act"], (True, None)), (["--exact-prefill"], (None, True))])
def test_precision_flags_reach_the_model(tiny_gguf, monkeypatch, capsys, flags, want):
    """--exact asks for both exact paths, the other flags for one each; unset ones are left to the adapter."""
    import shaderlm
    seen = []
    real = shaderlm.load
    monkeypatch.setattr(shaderlm, "load", lambda *a, **kw: seen.append(kw) or real(*a, **kw))
    assert main(["run", "-m", tiny_gguf, "--raw", "-n", "2", "--ctx", "64", *flags, "hi"]) == 0
    assert [(kw["int8_act"], kw["exact_prefill"]) for kw in seen] == [want]


@pytest.mark.parametrize("flags,want", [([], None), (["--batch-invariant"], 0)])
def test_batch_invariant_reaches_the_engine(tiny_gguf, monkeypatch, flags, want):
    """serve --batch-invariant asks the engine for no GEMM steps (gemm_rows 0); without it, the default."""
    import shaderlm
    seen = []

    def fake(*a, **kw):
        seen.append(kw)
        raise KeyboardInterrupt                  # stop before serving: main ends quietly on it
    monkeypatch.setattr(shaderlm, "serve_engine", fake)
    main(["serve", "-m", tiny_gguf, *flags])
    assert [kw["gemm_rows"] for kw in seen] == [want]


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


class _Panic(BaseException):
    """What a Rust panic inside `tokenizers` raises: a BaseException, not an Exception."""


@pytest.mark.parametrize("error", [ZeroDivisionError("division by zero"), _Panic("called `Option::unwrap()`"),
                                   MemoryError()])
def test_any_error_is_one_line_and_verbose_shows_where(tiny_gguf, monkeypatch, capsys, error):
    """Errors that are not the project's own (bugs of ours) still end in one line naming the command
    and the model, exit 1; --verbose adds the traceback."""
    def fail(*a, **kw):
        raise error
    monkeypatch.setattr("shaderlm.cli._load", fail)
    assert main(["run", "-m", tiny_gguf, "hi"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("shaderlm: error:"), err
    assert (tiny_gguf in err) and ("out of memory" if isinstance(error, MemoryError) else type(error).__name__) in err
    assert main(["run", "-m", tiny_gguf, "--verbose", "hi"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("shaderlm: error:")


# ---- first contact: what a new user types -------------------------------------------------------
@pytest.mark.parametrize("argv,flag", [
    (["run", "-n", "0", "hi"], "-n"), (["run", "-n", "-3", "hi"], "-n"), (["run", "--temp", "-1", "hi"], "--temp"),
    (["run", "--top-p", "5", "hi"], "--top-p"), (["run", "--top-p", "0", "hi"], "--top-p"),
    (["run", "--top-k", "-5", "hi"], "--top-k"), (["run", "-c", "0", "hi"], "--ctx-size"),
    (["run", "--temp", "nan", "hi"], "--temp"), (["run", "-s", "x", "hi"], "--seed"),
])
def test_bad_flag_values_are_refused_by_name(capsys, argv, flag):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert flag in capsys.readouterr().err


def test_missing_text_file_is_one_line(capsys):
    assert main(["perplexity", "-f", "/nonexistent/wiki.txt"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("shaderlm: error: cannot read /nonexistent/wiki.txt") and "\n" not in err


def test_version_and_python_m(capsys):
    import subprocess
    import sys

    from shaderlm import __version__
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"shaderlm {__version__}"
    out = subprocess.run([sys.executable, "-m", "shaderlm", "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"shaderlm {__version__}"


def test_synth_subcommand(tmp_path, capsys):
    out = tmp_path / "x.gguf"
    assert main(["synth", "--preset", "tiny", "--out", str(out), "-q"]) == 0
    assert out.stat().st_size > 0


def test_prompt_flag_file_and_seed(tiny_gguf, tmp_path, capsys):
    """-p and -f give the prompt as the positional argument does; a given seed repeats a sampled run."""
    f = tmp_path / "p.txt"
    f.write_text("the quick brown")
    runs = []
    for argv in (["-p", "the quick brown"], ["-f", str(f)], ["the quick brown"]):
        assert main(["run", "-m", tiny_gguf, "--raw", "-n", "6", "--temp", "0.9", "-s", "5", *argv]) == 0
        runs.append(capsys.readouterr().out)
    assert runs[0] == runs[1] == runs[2]


def test_output_closed_early_is_quiet(tiny_gguf):
    """`shaderlm run ... | head -c 3`: the reader leaves, the run ends without a traceback."""
    import subprocess
    import sys
    cmd = [sys.executable, "-m", "shaderlm", "run", "-m", tiny_gguf, "--raw", "-n", "40", "the quick brown"]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.read(3)
    p.stdout.close()
    err = p.stderr.read().decode()
    p.wait(timeout=120)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
