"""WGSL sources and the small preprocessor that specialises them.

Directives (each on its own line):
  #include NAME        inline kernels/NAME.wgsl (once per kernel; NAME may use {{DEFINE}})
  #if SYMBOL / #if !SYMBOL / #else / #endif   keep lines by a define's truthiness (nestable)
and `{{NAME}}` anywhere is replaced by str(define).
"""
from __future__ import annotations

import re
from pathlib import Path

KERNEL_DIR = Path(__file__).parent
_SUB = re.compile(r"\{\{(\w+)\}\}")


def load_wgsl(name: str, defines: dict) -> str:
    return _SUB.sub(lambda m: _value(defines, m.group(1), name), _expand(name, defines, set()))


def _value(defines, key, kernel):
    if key not in defines:
        raise KeyError(f"kernel {kernel}: no value for {{{{{key}}}}}")
    v = defines[key]
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _expand(name: str, defines: dict, included: set) -> str:
    if name in included:
        return ""
    included.add(name)
    lines = (KERNEL_DIR / f"{name}.wgsl").read_text().splitlines()
    out, stack = [], []          # stack of (this branch active, any branch taken)
    for line in lines:
        s = line.strip()
        active = all(a for a, _ in stack)
        if s.startswith("#if "):
            sym = s[4:].strip()
            neg = sym.startswith("!")
            val = bool(defines.get(sym.lstrip("!")))
            val = not val if neg else val
            stack.append((val, val))
        elif s == "#else":
            a, taken = stack.pop()
            stack.append((not taken, True))
        elif s == "#endif":
            stack.pop()
        elif not active:
            continue
        elif s.startswith("#include "):
            inc = _SUB.sub(lambda m: _value(defines, m.group(1), name), s[9:].strip())
            out.append(_expand(inc, defines, included))
        else:
            out.append(line)
    if stack:
        raise ValueError(f"kernel {name}: unterminated #if")
    return "\n".join(out)
