"""The small preprocessor that specialises the WGSL sources of this folder.

Directives (each on its own line):
  #include NAME        inline kernels/NAME.wgsl (once per kernel; NAME may use {{DEFINE}})
  #include NAME as P   inline it again with every name it declares at top level, every name declared
                       by earlier `as P` includes, and the bindings' `w` / params' `p`, prefixed by P
                       (a second quant decoder beside the first, for gemv.wgsl's DUAL)
  #if SYMBOL / #if !SYMBOL / #else / #endif   keep lines by a define's truthiness (nestable;
                       `#if A || !B`: either)
  #unroll N [v] / #end repeat the lines between N times (N a number or a define), `$v` in them
                       (default `$i`) replaced by 0, 1, ...: constant indices where a loop would
                       index an array (nestable, each level with its own variable)
and `{{NAME}}` anywhere is replaced by str(define). Conditionals apply first, then #unroll, then
#include, so a dropped block's #unroll count need not be defined.
"""
from __future__ import annotations

import re
from pathlib import Path

KERNEL_DIR = Path(__file__).parent
_SUB = re.compile(r"\{\{(\w+)\}\}")


def load_wgsl(name: str, defines: dict, root: Path = KERNEL_DIR) -> str:
    """root/NAME.wgsl (default: this folder's) with its includes, conditionals and {{DEFINE}}s
    resolved by `defines`."""
    return _substituted(_expand(root, name, defines, set(), {}), defines, name)


def sources(name: str, root: Path = KERNEL_DIR) -> list[str]:
    """The files (names as #include takes them) kernel NAME may read, whatever its defines: its own and
    every include's, through #if branches of every kind. An include named by a define ({{QUANT}}) stands
    for every decoder of quant/: the only includes named so."""
    seen, todo = set(), [name]
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        for line in (root / f"{n}.wgsl").read_text().splitlines():
            s = line.strip()
            if s.startswith("#include "):
                inc = s[9:].split(" as ")[0].strip()
                todo += ([f"quant/{f.stem}" for f in (root / "quant").glob("*.wgsl")] if "{{" in inc else [inc])
    return sorted(seen)


def _substituted(text: str, defines: dict, kernel: str) -> str:
    """Every {{NAME}} in `text` replaced by its define."""
    return _SUB.sub(lambda m: _value(defines, m.group(1), kernel), text)


def _value(defines, key, kernel):
    if key not in defines:
        raise KeyError(f"kernel {kernel}: no value for {{{{{key}}}}}")
    v = defines[key]
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    return str(v)


_DECL = re.compile(r"^(?:fn|const|struct|alias|override|var(?:<[^>]*>)?)\s+(\w+)", re.M)


def _expand(root: Path, name: str, defines: dict, included: set, prefixed: dict) -> str:
    """`prefixed`: prefix -> names declared under it so far (for `#include NAME as P`)."""
    if name in included:
        return ""
    included.add(name)
    text = (root / f"{name}.wgsl").read_text().splitlines()
    # conditionals first, so an #unroll in a dropped block needs no count
    out = []
    for line in _unroll(name, _kept(name, text, defines), defines):
        s = line.strip()
        if s.startswith("#include "):
            inc = _substituted(s[9:].strip(), defines, name)
            if " as " in inc:
                inc, prefix = (v.strip() for v in inc.split(" as "))
                out.append(_prefixed(root, inc, prefix, defines, prefixed))
            else:
                out.append(_expand(root, inc, defines, included, prefixed))
        else:
            out.append(line)
    return "\n".join(out)


def _kept(name: str, lines: list, defines: dict) -> list:
    """The lines that `#if` / `#else` / `#endif` keep, without those directives."""
    out, stack = [], []          # stack of (this branch active, any branch taken)
    for line in lines:
        s = line.strip()
        if s.startswith("#if "):
            val = any(bool(defines.get(sym.strip().lstrip("!"))) != sym.strip().startswith("!")
                      for sym in s[4:].split("||"))
            stack.append((val, val))
        elif s == "#else":
            a, taken = stack.pop()
            stack.append((not taken, True))
        elif s == "#endif":
            stack.pop()
        elif all(a for a, _ in stack):
            out.append(line)
    if stack:
        raise ValueError(f"kernel {name}: unterminated #if")
    return out


def _prefixed(root: Path, name: str, prefix: str, defines: dict, prefixed: dict) -> str:
    # its own copy, even if included plainly, with its defines already substituted
    text = _substituted(_expand(root, name, defines, set(), prefixed), defines, name)
    names = prefixed.setdefault(prefix, {"w", "p"})
    names.update(_DECL.findall(text))
    pattern = re.compile(r"(?<![.\w])(" + "|".join(sorted(names, key=len, reverse=True)) + r")\b")
    return pattern.sub(lambda m: prefix + m.group(1), text)


def _unroll(name: str, lines: list, defines: dict) -> list:
    """Expand `#unroll N [v]` ... `#end` blocks (nestable; `$v` in the body, default `$i`)."""
    out, i = [], 0
    while i < len(lines):
        s = lines[i].strip()
        if not s.startswith("#unroll "):
            out.append(lines[i])
            i += 1
            continue
        args = s.split()[1:]
        n = int(args[0]) if args[0].isdigit() else int(_value(defines, args[0], name))
        var = "$" + (args[1] if len(args) > 1 else "i")
        depth, end = 1, i + 1
        while end < len(lines) and depth:
            t = lines[end].strip()
            depth += t.startswith("#unroll ") - (t == "#end")
            end += 1
        if depth:
            raise ValueError(f"kernel {name}: #unroll without #end")
        body = _unroll(name, lines[i + 1:end - 1], defines)
        out += [line.replace(var, str(k)) for k in range(n) for line in body]
        i = end
    return out
