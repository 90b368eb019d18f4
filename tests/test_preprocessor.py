"""The WGSL preprocessor (shaderlm/kernels/wgsl.py) on small sources of its own: includes (once),
prefixed includes, conditionals, {{DEFINE}}s and #unroll, and the real kernels it specialises."""
from __future__ import annotations

import re

import pytest

from shaderlm.kernels import load_wgsl


def _files(tmp_path, **files):
    for name, text in files.items():
        (tmp_path / f"{name}.wgsl").write_text(text)
    return tmp_path


def test_includes_conditionals_defines_and_unroll(tmp_path):
    root = _files(tmp_path, common="const k: u32 = {{K}}u;\nfn f(x: u32) -> u32 { return x * k; }",
                  main="\n".join(["#include common", "#include common", "#if EXTRA", "const extra: u32 = {{N}}u;",
                                  "#else", "const missing: u32 = 0u;", "#endif", "#if !EXTRA", "const no: u32 = 1u;",
                                  "#endif", "#unroll N j", "let a$j = f($ju);", "#end"]))
    out = load_wgsl("main", dict(K=3, EXTRA=True, N=2), root)
    assert out.count("fn f(") == 1                          # included once
    assert "const k: u32 = 3u;" in out and "const extra: u32 = 2u;" in out
    assert "missing" not in out and "const no" not in out
    assert "let a0 = f(0u);" in out and "let a1 = f(1u);" in out and "a2" not in out
    assert "const missing: u32 = 0u;" in load_wgsl("main", dict(K=3, EXTRA=False, N=2), root)
    with pytest.raises(KeyError, match="K"):
        load_wgsl("main", dict(EXTRA=False, N=1), root)


def test_either_condition(tmp_path):
    root = _files(tmp_path, main="#if A || !B\nconst kept: u32 = 1u;\n#endif")
    assert "kept" in load_wgsl("main", dict(A=True, B=True), root)
    assert "kept" in load_wgsl("main", dict(A=False, B=False), root)
    assert "kept" not in load_wgsl("main", dict(A=False, B=True), root)


def test_prefixed_include_renames_what_it_declares(tmp_path):
    root = _files(tmp_path, dec="@group(0) @binding(2) var<storage, read> w: array<u32>;\n"
                                "fn load(i: u32) -> u32 { return w[i] + p.base; }",
                  main="#include dec\n#include dec as B_\nfn both(i: u32) -> u32 { return load(i) + B_load(i); }")
    out = load_wgsl("main", {}, root)
    assert re.search(r"^fn load\(", out, re.M) and re.search(r"^fn B_load\(", out, re.M)
    b_fn = out[out.index("fn B_load("):]
    b_fn = b_fn[:b_fn.index("}")]
    assert "B_w[i]" in b_fn and "B_p.base" in b_fn and not re.search(r"(?<![\w.])w\[", b_fn)


def test_gemv_dual_has_both_decoders():
    """gemv.wgsl's DUAL variant: Q4_K rows and Q6_K rows in one kernel, each through its own decoder."""
    defines = dict(QUANT="quant/q4_k", QUANT_B="quant/q6_k", DUAL=True, WIDE=True, K=256, NROWS=8, ROW0=0,
                   DBASE=0, Y_STRIDE=16, EPS=1e-5, NROWS_B=8, ROW0_B=8, DBASE_B=0, WG=32, ROWS=1, STEPS=1,
                   GROUPS=1, HOIST=False, PF=False, INT_DOT=False, X24=False, SG_BFLY=False, SUBGROUPS=False,
                   NT=1, TG=1, NB=0xFFFFFFFF, MULTI=False)
    out = load_wgsl("gemv", defines)
    assert re.search(r"^fn chunk_load\(", out, re.M) and re.search(r"^fn B_chunk_load\(", out, re.M)
