"""NVIDIA machine code of our WGSL kernels, read from the driver's shader disk cache: what the compiler made
of a kernel (instruction mix, registers, spills), which Vulkan does not report.

    __GL_SHADER_DISK_CACHE_PATH=/tmp/nvc __GL_SHADER_DISK_CACHE_SKIP_CLEANUP=1 shaderlm bench -m FILE ...
    python scripts/nvidia_sass.py /tmp/nvc OUTDIR [--nvdisasm PATH]

The cache holds .toc/.bin pairs: a 32-byte header, then 24-byte entries whose last two words are an
object's offset in the .bin and its size; an object is a 36-byte header (its last word the unpacked
size) and zstd-packed data holding an "NVuc" archive, whose section table (32-byte rows: type, length,
offset) has the machine code as type 1. `nvdisasm --binary SM90` (CUDA's, or the one in Triton's wheel)
reads that. Needs `zstandard`. Writes OUTDIR/objectN.sass and prints a line per kernel: instructions,
the highest register, spill instructions and the commonest opcodes.
"""
from __future__ import annotations

import argparse
import collections
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

CODE_SECTION = 1


def code_sections(cache: Path):
    """(name, machine code) of every object in the cache folder's .toc/.bin pairs."""
    import zstandard
    for toc in sorted(cache.rglob("*.toc")):
        t, b = toc.read_bytes(), toc.with_suffix(".bin").read_bytes()
        for i in range((len(t) - 32) // 24):
            off, size = struct.unpack_from("<2I", t, 32 + 24 * i + 16)
            unpacked = struct.unpack_from("<I", b, off + 32)[0]
            packed = b[off + 36: off + 32 + size]
            data = zstandard.ZstdDecompressor().decompress(packed, max_output_size=unpacked) \
                if packed[:4] == b"\x28\xb5\x2f\xfd" else packed
            start = data.find(b"NVuc")
            if start < 0:
                continue
            nvuc = data[start:]
            for s in range(struct.unpack_from("<I", nvuc, 8)[0] & 0xFFFF):
                kind, length, where = struct.unpack_from("<3I", nvuc, 32 + 32 * s)
                if kind == CODE_SECTION and length:
                    yield f"{toc.stem}.{i}", nvuc[where: where + length]


def summary(sass: str) -> str:
    ops, top = collections.Counter(), -1
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)(.*);", line)
        if m:
            ops[m.group(1).split(".")[0]] += 1
            top = max([top] + [int(r) for r in re.findall(r"\bR(\d+)\b", m.group(2))])
    spills = ops["LDL"] + ops["STL"]
    common = ", ".join(f"{k} {v}" for k, v in ops.most_common(10))
    return f"{sum(ops.values())} instructions, registers R0-R{top}, {spills} spill instructions; {common}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cache", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--nvdisasm", default=shutil.which("nvdisasm") or "nvdisasm")
    ap.add_argument("--arch", default="SM90")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    for n, (name, code) in enumerate(code_sections(a.cache)):
        raw = a.out / f"object{n}.bin"
        raw.write_bytes(code)
        r = subprocess.run([a.nvdisasm, "--binary", a.arch, str(raw)], capture_output=True, text=True)
        if r.returncode:
            print(f"object{n} ({name}): nvdisasm failed: {r.stderr.strip()}", file=sys.stderr)
            continue
        (a.out / f"object{n}.sass").write_text(r.stdout)
        print(f"object{n} ({name}, {len(code)} bytes): {summary(r.stdout)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
