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
from shaderlm.options import shader_checks


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


# ---- wgpu-native's runtime checks (SHADERLM_SHADER_CHECKS) ----

_IDS = """
import json, sys
import numpy as np
import shaderlm
ids = [int(i) for i in np.random.default_rng(1).integers(3, 290, 40)]
out = {}
for path in sys.argv[1:]:
    m = shaderlm.load(path, progress=False)
    out[path] = m.generate_tokens(ids, max_tokens=12, stop_at_eos=False)
print(json.dumps(out))
"""


@pytest.mark.skipif(os.environ.get("SHADERLM_WEBGPU") not in (None, "", "wgpu"), reason="wgpu-native's checks")
@pytest.mark.parametrize("paths", [{}, {"SHADERLM_FUSE": "1", "SHADERLM_EXACT_PREFILL": "0",
                                                                 "SHADERLM_INT8_ACT": "1"}],
                         ids=["adapter's paths", "GPU paths"])
def test_every_runtime_check_mode_gives_the_same_tokens(synth_gguf, paths):
    """Leaving out every check changes no result (the default leaves out only loop bounding): a kernel
    that relied on one (an index past its array, clamped or zeroed by it) would show here. A prompt
    batch then decode steps, dense and mixture-of-experts (Qwen3-30B-A3B's 128 experts, 8 a token), on
    the kernels this adapter takes and on those GPUs take (fused decode, int8 activations)."""
    models = [synth_gguf(preset="tiny", arch="llama", quant="Q4_K_M", seed=3),
              synth_gguf(preset="tiny", arch="qwen3moe", quant="Q4_K_M", seed=3, n_experts=128, n_experts_used=8)]
    runs = {}
    for mode in ("all", "none"):
        env = dict(os.environ, SHADERLM_SHADER_CHECKS=mode, SHADERLM_TUNE="0", **paths)
        r = subprocess.run([sys.executable, "-c", _IDS, *models], capture_output=True, text=True, env=env,
                           timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        runs[mode] = r.stdout
    assert runs["none"] == runs["all"]


def test_runtime_check_modes_reach_wgpu_native(monkeypatch):
    """Each mode compiles with its flags (wgpuDeviceCreateShaderModuleTrusted's runtimeChecks)."""
    api = backend.native_api()
    if api is None:
        pytest.skip("not on wgpu-native")
    ffi, lib, libf = api
    from shaderlm.gpu.device import get_device
    device = get_device().device
    seen = []

    class Spy:
        def __getattr__(self, name):
            return getattr(libf, name)

        def wgpuDeviceCreateShaderModuleTrusted(self, dev, desc, checks):
            seen.append(checks)
            return libf.wgpuDeviceCreateShaderModuleTrusted(dev, desc, checks)
    monkeypatch.setattr(backend, "native_api", lambda: (ffi, lib, Spy()))
    code = "@compute @workgroup_size(1) fn main() {}"
    for mode in ("all", "bounds", "none"):
        backend.shader_module(device, code, f"empty {mode}", mode)
    monkeypatch.delenv("SHADERLM_SHADER_CHECKS", raising=False)
    backend.shader_module(device, code, "empty default", shader_checks())
    bounds, loops = lib.WGPUShaderRuntimeChecks_BoundsChecks, lib.WGPUShaderRuntimeChecks_ForceLoopBounding
    assert seen == [bounds | loops, bounds, 0, bounds]


def test_a_bad_runtime_check_mode_is_one_clear_error(tiny_gguf):
    env = dict(os.environ, SHADERLM_SHADER_CHECKS="sometimes")
    r = subprocess.run([sys.executable, "-m", "shaderlm", "run", "-m", tiny_gguf, "-n", "2", "hi"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "SHADERLM_SHADER_CHECKS='sometimes': expected one of bounds, all, none" in r.stderr


def test_clamped_kernels_leave_out_only_the_default_bounds_checks(monkeypatch):
    """A kernel compiled as `clamped` (kernels.UNCHECKED) runs without wgpu-native's default bounds
    checks, but keeps every check under SHADERLM_SHADER_CHECKS=all; other kernels take the device's."""
    from shaderlm.gpu import device as device_mod
    from shaderlm.gpu.device import get_device
    dev = get_device()
    seen = []
    real = device_mod.shader_module
    def spy(d, code, label, checks):
        seen.append(checks)
        return real(d, code, label, checks)
    monkeypatch.setattr(device_mod, "shader_module", spy)
    code = "@compute @workgroup_size(1) fn main() {}"
    for mode in ("bounds", "all", "none"):
        monkeypatch.setattr(dev, "shader_checks", mode)
        dev.compile(code, f"clamped {mode}", clamped=True)
        dev.compile(code, f"plain {mode}")
    assert seen == ["none", "bounds", "all", "all", "none", "none"]
