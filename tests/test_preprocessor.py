"""The WGSL preprocessor (shaderlm/kernels/__init__.py) on source text: includes, prefixed includes,
conditionals and defines, as bench/persistent_gemv.py uses it to build a kernel from the decoders."""
from __future__ import annotations

import re

from shaderlm.kernels import expand_wgsl, load_wgsl


def test_expand_text_includes_prefixes_and_defines():
    text = "\n".join([
        "#include quant_common",
        "#include quant/q4_k",
        "#include quant_common as B_",
        "#include quant/q4_k as B_",
        "#if EXTRA",
        "const extra: u32 = {{N}}u;",
        "#else",
        "const missing: u32 = 0u;",
        "#endif",
    ])
    out = expand_wgsl(text, dict(WIDE=True, INT_DOT=True, X24=True, EXTRA=True, N=7))
    assert "const extra: u32 = 7u;" in out and "missing" not in out
    # both decoders present, the second under its prefix and reading its own binding
    assert re.search(r"^fn chunk_load\(", out, re.M) and re.search(r"^fn B_chunk_load\(", out, re.M)
    b_part = out[out.index("fn B_chunk_load("):]
    b_fn = b_part[:b_part.index("\n}")]
    assert "B_w[" in b_fn and not re.search(r"(?<![\w.])w\[", b_fn)
    # the same file through load_wgsl and through expand_wgsl gives the same text
    src = "#include quant/q4_k"
    assert expand_wgsl(src, dict(WIDE=True)).strip() == load_wgsl("quant/q4_k", dict(WIDE=True)).strip()


def test_prefixed_include_with_its_own_defines():
    """`#include NAME as P with K=V`: the copy's conditionals and {{K}} take V, the kernel's own
    include keeps the kernel's value."""
    out = expand_wgsl("#include reduce\n#include reduce as R_ with WG=64", dict(WG=128))
    assert re.search(r"^var<workgroup> red_buf: array<f32, 128>;", out, re.M)
    assert re.search(r"^var<workgroup> R_red_buf: array<f32, 64>;", out, re.M)
    assert "R_wg_sum" in out and "for (var s = 64u / 2u;" in out and "for (var s = 128u / 2u;" in out
