"""Short, deterministic runs of the fuzz targets (fuzz/, atheris): each target runs a fixed number of
inputs from its seed corpus with a fixed seed, and must find nothing: every input either loads or
raises ShaderLMError, in time and memory. Long campaigns: python fuzz/campaign.py (fuzz/README.md)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("atheris")

FUZZ = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fuzz")
# inputs per target: the whole file takes about 40 s on two cores
RUNS = {"safetensors_file": 3000, "hf_folder": 1200, "gguf_file": 1000, "gguf_metadata": 500}
LIMITS = ["-timeout=5", "-rss_limit_mb=2048", "-malloc_limit_mb=2048"]
DETERMINISTIC = ["-seed=1", "-reload=0"]          # libFuzzer re-reads its corpus every second by default
ENV = dict(os.environ, PYTHONHASHSEED="0")


def fuzz(script, tmp_path, *flags) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run a target; its exit and the artifacts libFuzzer wrote (crash-*, timeout-*, oom-*)."""
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    r = subprocess.run([sys.executable, script, *DETERMINISTIC, *LIMITS, f"-artifact_prefix={artifacts}/", *flags],
                       capture_output=True, text=True, timeout=600, env=ENV)
    return r, sorted(os.listdir(artifacts))


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    out = tmp_path_factory.mktemp("fuzz-seeds")
    subprocess.run([sys.executable, os.path.join(FUZZ, "corpus.py"), str(out)], check=True, env=ENV)
    return out


@pytest.mark.parametrize("target", RUNS)
def test_target_finds_nothing(target, seeds, tmp_path):
    corpus = shutil.copytree(seeds / target, tmp_path / "corpus")      # libFuzzer adds to its corpus
    r, found = fuzz(os.path.join(FUZZ, f"{target}.py"), tmp_path, f"-runs={RUNS[target]}", str(corpus))
    assert r.returncode == 0 and not found, f"{target}: exit {r.returncode}, {found}\n{r.stderr[-4000:]}"


@pytest.mark.parametrize("raised, finding", [("ModelFormatError", False), ("ValueError", True)])
def test_only_project_errors_pass(raised, finding, tmp_path):
    """The rule itself: a ShaderLMError is an answer, any other exception a finding."""
    script = tmp_path / "target.py"
    script.write_text(f"import sys\nsys.path.insert(0, {FUZZ!r})\nimport harness\n"
                      f"from shaderlm.errors import ModelFormatError\n\n"
                      f"def one(data):\n    raise {raised}('bad input')\n\nharness.fuzz(one)\n")
    r, found = fuzz(str(script), tmp_path, "-runs=20")
    assert (r.returncode != 0, bool(found)) == (finding, finding), r.stderr[-2000:]
