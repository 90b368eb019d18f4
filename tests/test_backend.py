"""The WebGPU implementation (gpu/backend.py): SHADERLM_WEBGPU / --backend names it; unset, wgpu-native,
or Dawn where only Dawn finds an adapter."""
from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from shaderlm.errors import DeviceError
from shaderlm.gpu import backend


def _fake(name: str, adapters) -> types.ModuleType:
    m = types.ModuleType(name)
    m.gpu = types.SimpleNamespace(enumerate_adapters_sync=lambda: list(adapters))
    return m


@pytest.fixture
def choose(monkeypatch):
    """choose(env, native adapters, dawn adapters or None if not installed) -> (chosen, native, dawn)."""
    def run(env, native, dawn):
        nat = _fake("wgpu", native)
        dwn = None if dawn is None else _fake("wgpudawn", dawn)
        monkeypatch.setattr(backend, "_chosen", None)
        monkeypatch.setattr(backend, "_native", nat)
        monkeypatch.setitem(sys.modules, "wgpudawn", dwn)       # None: not installed
        if env is None:
            monkeypatch.delenv("SHADERLM_WEBGPU", raising=False)
        else:
            monkeypatch.setenv("SHADERLM_WEBGPU", env)
        return backend.webgpu(), nat, dwn
    return run


def test_wgpu_native_where_it_finds_an_adapter(choose):
    chosen, nat, _ = choose(None, ["gpu"], ["gpu"])
    assert chosen is nat


def test_dawn_where_only_dawn_finds_one(choose):
    chosen, _, dawn = choose(None, [], ["gpu"])
    assert chosen is dawn


@pytest.mark.parametrize("dawn", [[], None], ids=["no adapter", "not installed"])
def test_wgpu_native_where_dawn_finds_none_either(choose, dawn):
    chosen, nat, _ = choose(None, [], dawn)
    assert chosen is nat


def test_named_dawn_is_taken_even_beside_a_native_adapter(choose):
    chosen, _, dawn = choose("dawn", ["gpu"], ["gpu"])
    assert chosen is dawn


def test_named_package_not_installed_is_one_clear_error(choose):
    with pytest.raises(DeviceError, match=r"'wgpudawn' .*not installed \(`pip install wgpudawn`\)"):
        choose("dawn", ["gpu"], None)


def test_backend_flag_reaches_dawn():
    """`shaderlm --backend dawn info` runs on Dawn: its adapter, or Dawn's own word that it has none
    (Debian 12's lavapipe is too old for it: one line, no traceback)."""
    pytest.importorskip("wgpudawn")
    env = {k: v for k, v in os.environ.items() if k != "SHADERLM_WEBGPU"}
    r = subprocess.run([sys.executable, "-m", "shaderlm", "--backend", "dawn", "info"], capture_output=True,
                       text=True, env=env, timeout=120)
    if r.returncode == 0:
        assert r.stdout.startswith("WebGPU: wgpudawn ")
    else:
        errors = [line for line in r.stderr.splitlines() if line.startswith("shaderlm: error:")]
        assert errors and "no WebGPU adapter found" in errors[0] and "Dawn" in errors[0], r.stderr[-2000:]
        assert "Traceback" not in r.stderr
